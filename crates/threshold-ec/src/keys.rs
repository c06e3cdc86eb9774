//! The trusted dealer, the public key and the replicas' key shares with their file form.

use std::fmt;

use ff::Field;
use rand_core::{CryptoRng, RngCore};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use zeroize::Zeroize;

use crate::curve::{lagrange, Curve, Ed25519, P256};
use crate::prss::{contains, members, subsets};
use crate::Error;

/// The DNSKEY flags sdns signs with (one key, SEP bit set): the key tag in the session hash h
/// is computed with them.
pub const FLAGS_KSK: u16 = 257;

/// The DNSSEC algorithms of this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub enum Algorithm {
    /// RFC 6605: ECDSA over P-256 with SHA-256.
    EcdsaP256Sha256 = 13,
    /// RFC 8080 / RFC 8032: Ed25519.
    Ed25519 = 15,
}

impl Algorithm {
    pub fn number(self) -> u8 {
        self as u8
    }

    /// Length of the DNSKEY public key field (and of the signature: both are 64 bytes).
    pub fn public_key_len(self) -> usize {
        match self {
            Algorithm::EcdsaP256Sha256 => 64,
            Algorithm::Ed25519 => 32,
        }
    }

    fn point_len(self) -> usize {
        match self {
            Algorithm::EcdsaP256Sha256 => P256::POINT_LEN,
            Algorithm::Ed25519 => Ed25519::POINT_LEN,
        }
    }
}

impl TryFrom<u8> for Algorithm {
    type Error = Error;
    fn try_from(n: u8) -> Result<Self, Error> {
        match n {
            13 => Ok(Algorithm::EcdsaP256Sha256),
            15 => Ok(Algorithm::Ed25519),
            other => Err(Error::Algorithm(other)),
        }
    }
}

impl From<Algorithm> for u8 {
    fn from(a: Algorithm) -> u8 {
        a.number()
    }
}

/// The public side: what the DNSKEY carries, and the verification points X_i = x_i·G that
/// individual shares are checked against.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PublicKeyFile", into = "PublicKeyFile")]
pub struct PublicKey {
    alg: Algorithm,
    n: u16,
    t: u16,
    key: Vec<u8>,
    /// X_i for i = 1..=n, in the curve's point encoding (Ed25519 32 bytes, P-256 33 compressed).
    verification: Vec<Vec<u8>>,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicKey").field("alg", &self.alg).field("n", &self.n).field("t", &self.t).field("key", &hex(&self.key)).finish_non_exhaustive()
    }
}

impl PublicKey {
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// n, the number of replicas.
    pub fn players(&self) -> u16 {
        self.n
    }

    /// t, the number of faulty replicas tolerated (n ≥ 3t+1).
    pub fn threshold(&self) -> u16 {
        self.t
    }

    /// The DNSKEY public key field: P-256 x‖y (64 bytes, RFC 6605), Ed25519 32 bytes (RFC 8080).
    pub fn dnskey_public_key(&self) -> &[u8] {
        &self.key
    }

    /// X_i of replica `index` (1-based), in the curve's point encoding.
    pub fn verification_point(&self, index: u16) -> Option<&[u8]> {
        self.verification.get(usize::from(index).checked_sub(1)?).map(Vec::as_slice)
    }

    /// DNSKEY RDATA: flags, protocol 3, algorithm, public key (RFC 4034 2.1).
    pub fn dnskey_rdata(&self, flags: u16) -> Vec<u8> {
        let mut rdata = flags.to_be_bytes().to_vec();
        rdata.extend([3, self.alg.number()]);
        rdata.extend(&self.key);
        rdata
    }

    /// RFC 4034 Appendix B key tag of the DNSKEY with `flags`.
    pub fn key_tag(&self, flags: u16) -> u16 {
        let mut acc: u32 = 0;
        for (i, b) in self.dnskey_rdata(flags).iter().enumerate() {
            acc += if i % 2 == 0 { u32::from(*b) << 8 } else { u32::from(*b) };
        }
        acc += (acc >> 16) & 0xffff;
        (acc & 0xffff) as u16
    }

    /// Y as a curve point (validated at construction, so decoding cannot fail here).
    pub(crate) fn y_ed(&self) -> Option<curve25519_dalek::EdwardsPoint> {
        Ed25519::point_from_bytes(&self.key)
    }

    pub(crate) fn y_p256(&self) -> Option<p256::ProjectivePoint> {
        p256_from_xy(&self.key)
    }

    /// h = SHA-256(algorithm ‖ key tag ‖ data): what the nonce is derived from. The key tag is
    /// the DNSKEY's with [`FLAGS_KSK`], the flags sdns signs with; it only separates keys (the
    /// ρ_T are per key anyway), so any fixed choice works as long as every replica makes it.
    pub(crate) fn session_hash(&self, data: &[u8]) -> [u8; 32] {
        Sha256::new().chain_update([self.alg.number()]).chain_update(self.key_tag(FLAGS_KSK).to_be_bytes()).chain_update(data).finalize().into()
    }

    pub(crate) fn verification_points<C: Curve>(&self) -> Option<Vec<C::Point>> {
        self.verification.iter().map(|b| C::point_from_bytes(b)).collect()
    }

    /// Sizes, ranges, decodable points, and X_1..X_n on one degree-t polynomial through Y.
    pub fn validate(&self) -> Result<(), Error> {
        check_sizes(self.n, self.t)?;
        if self.key.len() != self.alg.public_key_len() {
            return Err(Error::Malformed("public key length"));
        }
        if self.verification.len() != usize::from(self.n) || self.verification.iter().any(|x| x.len() != self.alg.point_len()) {
            return Err(Error::Malformed("verification points: count or length"));
        }
        match self.alg {
            Algorithm::Ed25519 => check_points::<Ed25519>(self.y_ed(), self.verification_points::<Ed25519>(), self.t),
            Algorithm::EcdsaP256Sha256 => check_points::<P256>(self.y_p256(), self.verification_points::<P256>(), self.t),
        }
    }
}

fn check_sizes(n: u16, t: u16) -> Result<(), Error> {
    if n == 0 || n > MAX_PLAYERS {
        return Err(Error::Players { players: n, max: MAX_PLAYERS });
    }
    let need = 3 * u32::from(t) + 1;
    if u32::from(n) < need {
        return Err(Error::Threshold { threshold: t, players: n, need });
    }
    Ok(())
}

fn check_points<C: Curve>(y: Option<C::Point>, xs: Option<Vec<C::Point>>, t: u16) -> Result<(), Error> {
    let y = y.ok_or(Error::Malformed("public key is not a valid point"))?;
    let xs = xs.ok_or(Error::Malformed("a verification point is not a valid point"))?;
    let base: Vec<u16> = (1..=t + 1).collect();
    let at = |z: C::Scalar| -> C::Point { base.iter().map(|&j| xs[usize::from(j) - 1] * lagrange(&base, j, z)).sum() };
    if at(C::Scalar::ZERO) != y {
        return Err(Error::VerificationPoints);
    }
    for j in (t + 2)..=(xs.len() as u16) {
        if at(C::Scalar::from(u64::from(j))) != xs[usize::from(j) - 1] {
            return Err(Error::VerificationPoints);
        }
    }
    Ok(())
}

/// P-256 DNSKEY form (x‖y, 64 bytes) to a point.
pub(crate) fn p256_from_xy(xy: &[u8]) -> Option<p256::ProjectivePoint> {
    use p256::elliptic_curve::sec1::FromEncodedPoint;
    if xy.len() != 64 {
        return None;
    }
    let mut sec1 = vec![4u8];
    sec1.extend(xy);
    let encoded = p256::EncodedPoint::from_bytes(&sec1).ok()?;
    let affine: Option<p256::AffinePoint> = Option::from(p256::AffinePoint::from_encoded_point(&encoded));
    affine.map(p256::ProjectivePoint::from)
}

pub(crate) fn p256_to_xy(p: &p256::ProjectivePoint) -> Vec<u8> {
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    p.to_affine().to_encoded_point(false).as_bytes().get(1..).unwrap_or_default().to_vec()
}

/// One replica's secret: x_i and the PRSS keys ρ_T of every t-set T it is not in. Debug prints
/// no secret; the secret bytes are wiped on drop.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "KeyShareFile", into = "KeyShareFile")]
pub struct KeyShare {
    alg: Algorithm,
    n: u16,
    t: u16,
    index: u16,
    /// The DNSKEY public key this share belongs to.
    key: Vec<u8>,
    /// x_i in the curve's scalar encoding (canonical).
    secret: [u8; 32],
    /// (T, ρ_T) for every t-set T ∌ index, in [`subsets`] order.
    prss: Vec<(u32, [u8; 32])>,
}

impl Drop for KeyShare {
    fn drop(&mut self) {
        self.secret.zeroize();
        for (_, rho) in &mut self.prss {
            rho.zeroize();
        }
    }
}

impl fmt::Debug for KeyShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyShare")
            .field("alg", &self.alg)
            .field("index", &self.index)
            .field("n", &self.n)
            .field("t", &self.t)
            .field("secret", &"<redacted>")
            .field("prss_keys", &self.prss.len())
            .finish_non_exhaustive()
    }
}

impl KeyShare {
    /// The 1-based replica index i (also its evaluation point).
    pub fn index(&self) -> u16 {
        self.index
    }

    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// Checks that this share belongs to `pk` and that x_i·G = X_i.
    pub fn check(&self, pk: &PublicKey) -> Result<(), Error> {
        if self.alg != pk.alg || self.n != pk.n || self.t != pk.t || self.key != pk.key {
            return Err(Error::KeyMismatch);
        }
        let xi = pk.verification_point(self.index).ok_or(Error::Index { index: self.index, players: pk.n })?;
        let ok = match self.alg {
            Algorithm::Ed25519 => self.secret_scalar::<Ed25519>().map(|s| Ed25519::point_to_bytes(&Ed25519::mul_base(&s)) == xi),
            Algorithm::EcdsaP256Sha256 => self.secret_scalar::<P256>().map(|s| P256::point_to_bytes(&P256::mul_base(&s)) == xi),
        };
        if ok != Some(true) {
            return Err(Error::ShareInconsistent { index: self.index });
        }
        Ok(())
    }

    pub(crate) fn secret_scalar<C: Curve>(&self) -> Option<C::Scalar> {
        C::scalar_from_bytes(&self.secret)
    }

    pub(crate) fn prss_keys(&self) -> &[(u32, [u8; 32])] {
        &self.prss
    }

    fn validate(&self) -> Result<(), Error> {
        check_sizes(self.n, self.t)?;
        if self.index == 0 || self.index > self.n {
            return Err(Error::Index { index: self.index, players: self.n });
        }
        if self.key.len() != self.alg.public_key_len() {
            return Err(Error::Malformed("public key length"));
        }
        let canonical = match self.alg {
            Algorithm::Ed25519 => self.secret_scalar::<Ed25519>().is_some(),
            Algorithm::EcdsaP256Sha256 => self.secret_scalar::<P256>().is_some(),
        };
        if !canonical {
            return Err(Error::Malformed("secret is not a canonical scalar"));
        }
        let expected: Vec<u32> = subsets(self.n, self.t).into_iter().filter(|s| !contains(*s, self.index)).collect();
        if self.prss.iter().map(|(s, _)| *s).ne(expected) {
            return Err(Error::Malformed("PRSS keys: not exactly the t-sets without this replica, in order"));
        }
        Ok(())
    }
}

/// The most replicas a key may have: each holds C(n−1, t) PRSS keys and computes that many
/// base-point multiplications per signature (docs/DETERMINISM.md, "Costs and limits").
pub const MAX_PLAYERS: u16 = 16;

/// The trusted dealer: x as a degree-t Shamir sharing over replicas 1..=n, and a fresh 32-byte
/// ρ_T for every t-set T, given to the n − t replicas outside T. `rng` is the only randomness
/// in this crate (OsRng in `sdns keygen`; signing needs none).
pub fn deal(alg: Algorithm, n: u16, t: u16, rng: &mut (impl RngCore + CryptoRng)) -> Result<(PublicKey, Vec<KeyShare>), Error> {
    check_sizes(n, t)?;
    let (key, verification, mut secrets) = match alg {
        Algorithm::Ed25519 => {
            let (y, xs, secrets) = share_secret::<Ed25519>(n, t, rng);
            (Ed25519::point_to_bytes(&y), xs.iter().map(Ed25519::point_to_bytes).collect::<Vec<_>>(), secrets)
        }
        Algorithm::EcdsaP256Sha256 => {
            let (y, xs, secrets) = share_secret::<P256>(n, t, rng);
            (p256_to_xy(&y), xs.iter().map(P256::point_to_bytes).collect(), secrets)
        }
    };
    let sets = subsets(n, t);
    let mut rhos: Vec<[u8; 32]> = sets
        .iter()
        .map(|_| {
            let mut rho = [0u8; 32];
            rng.fill_bytes(&mut rho);
            rho
        })
        .collect();
    let pk = PublicKey { alg, n, t, key, verification };
    let shares = (1..=n)
        .map(|i| KeyShare {
            alg,
            n,
            t,
            index: i,
            key: pk.key.clone(),
            secret: secrets[usize::from(i) - 1],
            prss: sets.iter().zip(&rhos).filter(|(s, _)| !contains(**s, i)).map(|(s, rho)| (*s, *rho)).collect(),
        })
        .collect();
    secrets.zeroize();
    rhos.zeroize();
    Ok((pk, shares))
}

/// Y = x·G, X_i = x_i·G and the encoded x_i of a fresh random degree-t polynomial.
fn share_secret<C: Curve>(n: u16, t: u16, rng: &mut (impl RngCore + CryptoRng)) -> (C::Point, Vec<C::Point>, Vec<[u8; 32]>) {
    let mut coefficients: Vec<C::Scalar> = (0..=t)
        .map(|_| loop {
            let mut wide = [0u8; 64];
            rng.fill_bytes(&mut wide);
            let c = C::scalar_from_wide(&wide);
            wide.zeroize();
            // A zero key (or leading coefficient) has probability 2^-252; draw again.
            if !bool::from(c.is_zero()) {
                break c;
            }
        })
        .collect();
    let y = C::mul_base(&coefficients[0]);
    let mut xs = Vec::new();
    let mut secrets = Vec::new();
    for i in 1..=n {
        let z = C::Scalar::from(u64::from(i));
        let mut xi = coefficients.iter().rev().fold(C::Scalar::ZERO, |acc, c| acc * z + c);
        xs.push(C::mul_base(&xi));
        secrets.push(C::scalar_to_bytes(&xi));
        xi.zeroize();
    }
    coefficients.iter_mut().for_each(Zeroize::zeroize);
    (y, xs, secrets)
}

// ---- file forms ----

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, Error> {
    if s.len() & 1 == 1 || !s.is_ascii() {
        return Err(Error::Malformed("hex string"));
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| Error::Malformed("hex string"))).collect()
}

fn unhex32(s: &str) -> Result<[u8; 32], Error> {
    let mut v = unhex(s)?;
    let out = <[u8; 32]>::try_from(v.as_slice()).map_err(|_| Error::Malformed("expected 32 bytes"));
    v.zeroize();
    out
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PublicKeyFile {
    algorithm: u8,
    players: u16,
    threshold: u16,
    /// DNSKEY public key field, hex.
    public_key: String,
    /// X_1..X_n, hex.
    verification_points: Vec<String>,
}

impl From<PublicKey> for PublicKeyFile {
    fn from(pk: PublicKey) -> Self {
        PublicKeyFile {
            algorithm: pk.alg.number(),
            players: pk.n,
            threshold: pk.t,
            public_key: hex(&pk.key),
            verification_points: pk.verification.iter().map(|x| hex(x)).collect(),
        }
    }
}

impl TryFrom<PublicKeyFile> for PublicKey {
    type Error = Error;
    fn try_from(f: PublicKeyFile) -> Result<Self, Error> {
        let pk = PublicKey {
            alg: Algorithm::try_from(f.algorithm)?,
            n: f.players,
            t: f.threshold,
            key: unhex(&f.public_key)?,
            verification: f.verification_points.iter().map(|x| unhex(x)).collect::<Result<_, _>>()?,
        };
        pk.validate()?;
        Ok(pk)
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrssKeyFile {
    /// The members of T (1-based, ascending).
    set: Vec<u16>,
    key: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyShareFile {
    algorithm: u8,
    players: u16,
    threshold: u16,
    index: u16,
    public_key: String,
    secret: String,
    prss: Vec<PrssKeyFile>,
}

impl Drop for KeyShareFile {
    fn drop(&mut self) {
        self.secret.zeroize();
        for k in &mut self.prss {
            k.key.zeroize();
        }
    }
}

impl From<KeyShare> for KeyShareFile {
    fn from(s: KeyShare) -> Self {
        KeyShareFile {
            algorithm: s.alg.number(),
            players: s.n,
            threshold: s.t,
            index: s.index,
            public_key: hex(&s.key),
            secret: hex(&s.secret),
            prss: s.prss.iter().map(|(set, rho)| PrssKeyFile { set: members(*set), key: hex(rho) }).collect(),
        }
    }
}

impl TryFrom<KeyShareFile> for KeyShare {
    type Error = Error;
    fn try_from(f: KeyShareFile) -> Result<Self, Error> {
        let alg = Algorithm::try_from(f.algorithm)?;
        check_sizes(f.players, f.threshold)?;
        let mut prss = Vec::with_capacity(f.prss.len());
        for k in &f.prss {
            if k.set.iter().any(|&i| i == 0 || i > f.players) || k.set.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Error::Malformed("PRSS set: members out of range or not ascending"));
            }
            let mask = k.set.iter().fold(0u32, |m, &i| m | (1u32 << (i - 1)));
            prss.push((mask, unhex32(&k.key)?));
        }
        let share = KeyShare { alg, n: f.players, t: f.threshold, index: f.index, key: unhex(&f.public_key)?, secret: unhex32(&f.secret)?, prss };
        share.validate()?;
        Ok(share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;

    fn rng() -> rand_chacha::ChaCha20Rng {
        rand_chacha::ChaCha20Rng::seed_from_u64(1)
    }

    #[test]
    fn dealt_keys_validate_and_round_trip_through_json() {
        for alg in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
            let (pk, shares) = deal(alg, 4, 1, &mut rng()).unwrap();
            pk.validate().unwrap();
            assert_eq!(pk.dnskey_public_key().len(), alg.public_key_len());
            let pk2: PublicKey = serde_json::from_str(&serde_json::to_string(&pk).unwrap()).unwrap();
            assert_eq!(pk, pk2);
            for s in &shares {
                s.check(&pk).unwrap();
                assert_eq!(s.prss_keys().len(), 3);
                let json = serde_json::to_string(s).unwrap();
                let back: KeyShare = serde_json::from_str(&json).unwrap();
                assert_eq!(&back, s);
                let debug = format!("{s:?}");
                assert!(!debug.contains(&hex(&s.secret)) && debug.contains("redacted"), "{debug}");
            }
            assert_eq!(shares[1].check(&pk2), Ok(()));
        }
    }

    #[test]
    fn mismatched_or_tampered_keys_are_refused() {
        let (pk, shares) = deal(Algorithm::Ed25519, 4, 1, &mut rng()).unwrap();
        let (other, _) = deal(Algorithm::Ed25519, 4, 1, &mut rand_chacha::ChaCha20Rng::seed_from_u64(2)).unwrap();
        assert_eq!(shares[0].check(&other), Err(Error::KeyMismatch));
        let mut swapped = shares[0].clone();
        swapped.index = 2;
        assert_eq!(swapped.check(&pk), Err(Error::ShareInconsistent { index: 2 }));
        // A share file whose PRSS sets include its own index.
        let mut file: KeyShareFile = shares[0].clone().into();
        file.prss[0].set = vec![1];
        assert!(KeyShare::try_from(file).is_err());
        let mut file: KeyShareFile = shares[0].clone().into();
        file.index = 9;
        assert!(KeyShare::try_from(file).is_err());
        // Public key files: a moved verification point breaks the polynomial.
        let mut file: PublicKeyFile = pk.clone().into();
        file.verification_points.swap(0, 1);
        assert_eq!(PublicKey::try_from(file), Err(Error::VerificationPoints));
        assert!(deal(Algorithm::Ed25519, 3, 1, &mut rng()).is_err());
        assert!(deal(Algorithm::Ed25519, 17, 1, &mut rng()).is_err());
        assert!(serde_json::from_str::<PublicKey>("{\"algorithm\": 8}").is_err());
    }

    #[test]
    fn key_tag_follows_rfc4034_appendix_b() {
        // The same key field under flags 256 and 257 differs by exactly 1 in the sum.
        let (pk, _) = deal(Algorithm::EcdsaP256Sha256, 4, 1, &mut rng()).unwrap();
        let (a, b) = (pk.key_tag(256), pk.key_tag(257));
        assert_eq!(b, a.wrapping_add(1));
        assert_eq!(pk.dnskey_rdata(257).len(), 4 + 64);
    }
}
