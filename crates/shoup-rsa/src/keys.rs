//! Public key, key shares and the trusted dealer.

use std::fmt;
use std::sync::{mpsc, Arc, OnceLock};

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use num_bigint::{BigInt, BigUint, Sign};
use num_integer::Integer;
use num_traits::{One, Zero};
use rand_chacha::ChaCha20Rng;
use rand_core::{CryptoRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroize;

use crate::exp::FixedBase;
use crate::prime::{self, Event};
pub use crate::util::MAX_PLAYERS;
use crate::util::{self, from_boxed, precision, to_boxed, to_fixed_be};
use crate::Error;

/// The public exponent (prime, larger than any player count, so gcd(e, 4Δ²) = 1).
pub const PUBLIC_EXPONENT: u32 = 65537;
pub const MIN_MODULUS_BITS: u32 = 1024;
pub const MAX_MODULUS_BITS: u32 = 4096;
pub const DEFAULT_MODULUS_BITS: u32 = 2048;
/// Smallest modulus accepted by the test-only path.
#[cfg(any(test, feature = "insecure-small-keys"))]
pub const INSECURE_MIN_MODULUS_BITS: u32 = 512;

const PUBLIC_FORMAT: &str = "shoup-rsa-public/1";
const SHARE_FORMAT: &str = "shoup-rsa-share/1";

/// The default threshold k = t + 1 with t = floor((n - 1) / 3).
pub fn default_threshold(players: u16) -> u16 {
    players.saturating_sub(1) / 3 + 1
}

/// The number of faults t = floor((n - 1) / 3) tolerated by n players.
pub fn max_faults(players: u16) -> u16 {
    players.saturating_sub(1) / 3
}

/// Key generation progress, for a terminal indicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Progress {
    /// A sieved candidate for prime `prime` (0 or 1) failed a primality test.
    Candidate {
        prime: u8,
    },
    /// Candidate q passed its Fermat test; p = 2q + 1 is being tested.
    Promising {
        prime: u8,
    },
    /// Safe prime `prime` found.
    PrimeFound {
        prime: u8,
    },
    /// Both primes found; computing shares and verification keys.
    Dealing,
    Done,
}

/// A progress callback that prints dots to stderr in the style of `openssl genrsa` when stderr
/// is a terminal, and does nothing otherwise: '.' per 32 rejected candidates, '+' per promising
/// candidate, '*' per prime found.
pub fn stderr_progress() -> impl FnMut(Progress) {
    use std::io::{IsTerminal, Write};
    let enabled = std::io::stderr().is_terminal();
    let mut rejected: u64 = 0;
    move |event| {
        if !enabled {
            return;
        }
        let mark = match event {
            Progress::Candidate { .. } => {
                rejected += 1;
                if !rejected.is_multiple_of(32) {
                    return;
                }
                "."
            }
            Progress::Promising { .. } => "+",
            Progress::PrimeFound { .. } => "*",
            Progress::Dealing => " dealing",
            Progress::Done => " done\n",
        };
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(mark.as_bytes());
        let _ = err.flush();
    }
}

/// The threshold public key: N, e, players n, threshold k, verification base v and keys v_i.
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "PublicKeyRepr", into = "PublicKeyRepr")]
pub struct PublicKey {
    pub(crate) n: BigUint,
    pub(crate) e: u32,
    pub(crate) players: u16,
    pub(crate) threshold: u16,
    pub(crate) v: BigUint,
    pub(crate) vks: Vec<BigUint>,
    // Derived, recomputed on load.
    pub(crate) bits: u32,
    pub(crate) bytes: usize,
    pub(crate) delta: BigUint,
    /// a, b with a * 4Δ² + b * e = 1.
    pub(crate) euclid_a: BigInt,
    pub(crate) euclid_b: BigInt,
    pub(crate) params: BoxedMontyParams,
    pub(crate) fingerprint: [u8; 32],
    /// Powers of v for proofs and their verification, built on first use (about 7 MB and
    /// 27,000 multiplications for a 2048-bit key) and shared by clones.
    pub(crate) v_table: Arc<OnceLock<Option<FixedBase>>>,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicKey")
            .field("bits", &self.bits)
            .field("players", &self.players)
            .field("threshold", &self.threshold)
            .field("fingerprint", &util::hex_encode(&self.fingerprint))
            .finish_non_exhaustive()
    }
}

impl PartialEq for PublicKey {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
    }
}
impl Eq for PublicKey {}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PublicKeyRepr {
    format: String,
    modulus_bits: u32,
    #[serde(with = "util::serde_hex")]
    modulus: BigUint,
    public_exponent: u32,
    players: u16,
    threshold: u16,
    #[serde(with = "util::serde_hex")]
    verification_base: BigUint,
    verification_keys: Vec<String>,
}

impl From<PublicKey> for PublicKeyRepr {
    fn from(pk: PublicKey) -> Self {
        PublicKeyRepr {
            format: PUBLIC_FORMAT.to_string(),
            modulus_bits: pk.bits,
            verification_keys: pk.vks.iter().map(util::big_to_hex).collect(),
            modulus: pk.n,
            public_exponent: pk.e,
            players: pk.players,
            threshold: pk.threshold,
            verification_base: pk.v,
        }
    }
}

impl TryFrom<PublicKeyRepr> for PublicKey {
    type Error = Error;
    fn try_from(repr: PublicKeyRepr) -> Result<Self, Error> {
        if repr.format != PUBLIC_FORMAT {
            return Err(Error::InvalidKey(format!("format {:?}, expected {PUBLIC_FORMAT:?}", repr.format)));
        }
        let vks = repr
            .verification_keys
            .iter()
            .map(|h| util::hex_to_big(h))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::InvalidKey("verification key is not hex".into()))?;
        let pk = PublicKey::from_parts(repr.modulus, repr.public_exponent, repr.players, repr.threshold, repr.verification_base, vks)?;
        if pk.bits != repr.modulus_bits {
            return Err(Error::InvalidKey("modulus_bits does not match the modulus".into()));
        }
        Ok(pk)
    }
}

fn min_bits() -> u32 {
    #[cfg(any(test, feature = "insecure-small-keys"))]
    return INSECURE_MIN_MODULUS_BITS;
    #[cfg(not(any(test, feature = "insecure-small-keys")))]
    return MIN_MODULUS_BITS;
}

fn check_players(players: u16, threshold: u16) -> Result<(), Error> {
    if players == 0 || players > MAX_PLAYERS {
        return Err(Error::Players(players));
    }
    if threshold == 0 || threshold > players {
        return Err(Error::Threshold { threshold, players });
    }
    Ok(())
}

/// Extended Euclid: returns (g, a, b) with a*x + b*y = g.
pub(crate) fn ext_gcd(x: &BigInt, y: &BigInt) -> (BigInt, BigInt, BigInt) {
    let (mut old_r, mut r) = (x.clone(), y.clone());
    let (mut old_s, mut s) = (BigInt::one(), BigInt::zero());
    let (mut old_t, mut t) = (BigInt::zero(), BigInt::one());
    while !r.is_zero() {
        let quotient = &old_r / &r;
        let next_r = &old_r - &quotient * &r;
        old_r = std::mem::replace(&mut r, next_r);
        let next_s = &old_s - &quotient * &s;
        old_s = std::mem::replace(&mut s, next_s);
        let next_t = &old_t - &quotient * &t;
        old_t = std::mem::replace(&mut t, next_t);
    }
    (old_r, old_s, old_t)
}

fn factorial(n: u16) -> BigUint {
    (1..=u32::from(n)).fold(BigUint::one(), |acc, i| acc * i)
}

impl PublicKey {
    /// Validates the parts and precomputes Δ, the Euclid coefficients and Montgomery parameters.
    pub(crate) fn from_parts(n: BigUint, e: u32, players: u16, threshold: u16, v: BigUint, vks: Vec<BigUint>) -> Result<Self, Error> {
        let bits = n.bits() as u32;
        if bits < min_bits() || bits > MAX_MODULUS_BITS || !bits.is_multiple_of(2) {
            return Err(Error::ModulusBits { bits, min: min_bits(), max: MAX_MODULUS_BITS });
        }
        if n.is_even() {
            return Err(Error::InvalidKey("modulus is even".into()));
        }
        if e != PUBLIC_EXPONENT {
            return Err(Error::InvalidKey(format!("public exponent {e}, expected {PUBLIC_EXPONENT}")));
        }
        check_players(players, threshold)?;
        if vks.len() != usize::from(players) {
            return Err(Error::InvalidKey(format!("{} verification keys for {players} players", vks.len())));
        }
        let in_group = |x: &BigUint| !x.is_zero() && !x.is_one() && x < &n && x.gcd(&n).is_one();
        if !in_group(&v) || !vks.iter().all(|x| !x.is_zero() && x < &n) {
            return Err(Error::InvalidKey("verification value not in Z_N*".into()));
        }
        let delta = factorial(players);
        let e_prime = BigInt::from(4u32) * BigInt::from(delta.clone()) * BigInt::from(delta.clone());
        let (g, euclid_a, euclid_b) = ext_gcd(&e_prime, &BigInt::from(e));
        if !g.is_one() {
            return Err(Error::InvalidKey("gcd(4 delta^2, e) != 1".into()));
        }
        let prec = precision(bits);
        let boxed_n = to_boxed(&n, prec).ok_or_else(|| Error::InvalidKey("modulus".into()))?;
        let odd: Option<Odd<BoxedUint>> = Odd::new(boxed_n).into();
        let odd = odd.ok_or_else(|| Error::InvalidKey("modulus is even".into()))?;
        let params = BoxedMontyParams::new_vartime(odd);
        let bytes = bits.div_ceil(8) as usize;
        let mut pk =
            PublicKey { n, e, players, threshold, v, vks, bits, bytes, delta, euclid_a, euclid_b, params, fingerprint: [0; 32], v_table: Arc::default() };
        pk.fingerprint = pk.compute_fingerprint();
        Ok(pk)
    }

    fn compute_fingerprint(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"shoup-rsa public key v1\0");
        let put = |h: &mut Sha256, x: &BigUint| {
            // Every value is < N, so the fixed width always fits.
            h.update(to_fixed_be(x, self.bytes).unwrap_or_default());
        };
        h.update((self.bits).to_be_bytes());
        put(&mut h, &self.n);
        h.update(self.e.to_be_bytes());
        h.update(self.players.to_be_bytes());
        h.update(self.threshold.to_be_bytes());
        put(&mut h, &self.v);
        for vk in &self.vks {
            put(&mut h, vk);
        }
        h.finalize().into()
    }

    pub fn modulus(&self) -> &BigUint {
        &self.n
    }
    pub fn public_exponent(&self) -> u32 {
        self.e
    }
    pub fn modulus_bits(&self) -> u32 {
        self.bits
    }
    /// |N| in bytes: the length of a signature and of an encoded message.
    pub fn modulus_bytes(&self) -> usize {
        self.bytes
    }
    pub fn players(&self) -> u16 {
        self.players
    }
    pub fn threshold(&self) -> u16 {
        self.threshold
    }
    /// t = floor((n - 1) / 3).
    pub fn max_faults(&self) -> u16 {
        max_faults(self.players)
    }
    pub fn verification_base(&self) -> &BigUint {
        &self.v
    }
    /// v_i for 1-based index i.
    pub fn verification_key(&self, index: u16) -> Option<&BigUint> {
        self.vks.get(usize::from(index).checked_sub(1)?)
    }
    /// SHA-256 over every public value; key shares carry it.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }
    pub(crate) fn precision(&self) -> u32 {
        precision(self.bits)
    }
}

/// One player's secret share s_i of the RSA exponent. Zeroized on drop.
pub struct KeyShare {
    index: u16,
    /// s_i, at the precision of N.
    pub(crate) secret: BoxedUint,
    modulus_bits: u32,
    fingerprint: [u8; 32],
}

impl Drop for KeyShare {
    fn drop(&mut self) {
        self.secret.zeroize();
    }
}

impl fmt::Debug for KeyShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyShare").field("index", &self.index).field("secret", &"<redacted>").finish_non_exhaustive()
    }
}

impl Clone for KeyShare {
    fn clone(&self) -> Self {
        KeyShare { index: self.index, secret: self.secret.clone(), modulus_bits: self.modulus_bits, fingerprint: self.fingerprint }
    }
}

impl KeyShare {
    /// The 1-based player index i.
    pub fn index(&self) -> u16 {
        self.index
    }
    /// Fingerprint of the public key this share belongs to.
    pub fn public_key_fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    /// Checks that this share belongs to `pk` (fingerprint, index) and that v^{s_i} = v_i.
    /// Costs one modular exponentiation; call it once after loading.
    pub fn validate(&self, pk: &PublicKey) -> Result<(), Error> {
        self.check_key(pk)?;
        let v = BoxedMontyForm::new(to_boxed(&pk.v, pk.precision()).ok_or(Error::KeyMismatch)?, &pk.params);
        let vi = from_boxed(&v.pow(&self.secret).retrieve());
        if Some(&vi) != pk.verification_key(self.index) {
            return Err(Error::ShareInconsistent { index: self.index });
        }
        Ok(())
    }

    pub(crate) fn check_key(&self, pk: &PublicKey) -> Result<(), Error> {
        if self.fingerprint != pk.fingerprint || self.secret.bits_precision() != pk.precision() {
            return Err(Error::KeyMismatch);
        }
        if self.index == 0 || self.index > pk.players {
            return Err(Error::ShareIndex { index: self.index, players: pk.players });
        }
        Ok(())
    }

    pub(crate) fn to_repr(&self) -> KeyShareRepr {
        let bytes = self.modulus_bits.div_ceil(8) as usize;
        let be = zeroize::Zeroizing::new(self.secret.to_be_bytes());
        // The precision is a whole number of limbs >= bytes; drop the leading zero bytes.
        let start = be.len().saturating_sub(bytes);
        KeyShareRepr {
            format: SHARE_FORMAT.to_string(),
            index: self.index,
            modulus_bits: self.modulus_bits,
            secret: util::hex_encode(&be[start..]),
            public_key_fingerprint: util::hex_encode(&self.fingerprint),
        }
    }

    pub(crate) fn from_repr(mut repr: KeyShareRepr) -> Result<Self, String> {
        let result = (|| {
            if repr.format != SHARE_FORMAT {
                return Err(format!("format {:?}, expected {SHARE_FORMAT:?}", repr.format));
            }
            if repr.modulus_bits < min_bits() || repr.modulus_bits > MAX_MODULUS_BITS {
                return Err(format!("modulus_bits {} out of range", repr.modulus_bits));
            }
            if repr.index == 0 || repr.index > MAX_PLAYERS {
                return Err(format!("index {} out of range", repr.index));
            }
            let bytes = repr.modulus_bits.div_ceil(8) as usize;
            let secret = zeroize::Zeroizing::new(util::hex_decode(&repr.secret).ok_or("secret is not hex")?);
            if secret.len() != bytes {
                return Err(format!("secret has {} bytes, expected {bytes}", secret.len()));
            }
            let fingerprint: [u8; 32] =
                util::hex_decode(&repr.public_key_fingerprint).and_then(|f| f.try_into().ok()).ok_or("public_key_fingerprint is not 32 hex bytes")?;
            let secret = BoxedUint::from_be_slice(&secret, precision(repr.modulus_bits)).map_err(|_| "secret does not fit the modulus size".to_string())?;
            Ok(KeyShare { index: repr.index, secret, modulus_bits: repr.modulus_bits, fingerprint })
        })();
        repr.secret.zeroize();
        result
    }
}

/// The on-disk form of a key share (one replica's secret only).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KeyShareRepr {
    pub(crate) format: String,
    pub(crate) index: u16,
    pub(crate) modulus_bits: u32,
    pub(crate) secret: String,
    pub(crate) public_key_fingerprint: String,
}

impl Drop for KeyShareRepr {
    fn drop(&mut self) {
        self.secret.zeroize();
    }
}

/// Generates a threshold RSA key: a `bits`-bit modulus from two safe primes (searched on two
/// threads), e = 65537, and `players` shares of which any `threshold` can sign.
/// `bits` must be even and in 1024..=4096. Deterministic for a given `rng` state.
pub fn generate<R: CryptoRng + ?Sized>(
    bits: u32,
    players: u16,
    threshold: u16,
    rng: &mut R,
    progress: &mut dyn FnMut(Progress),
) -> Result<(PublicKey, Vec<KeyShare>), Error> {
    check_modulus_bits(bits, MIN_MODULUS_BITS)?;
    generate_unchecked(bits, players, threshold, rng, progress)
}

/// Like [`generate`] but accepts moduli down to 512 bits. For tests only: such keys are weak.
#[cfg(any(test, feature = "insecure-small-keys"))]
pub fn generate_insecure<R: CryptoRng + ?Sized>(
    bits: u32,
    players: u16,
    threshold: u16,
    rng: &mut R,
    progress: &mut dyn FnMut(Progress),
) -> Result<(PublicKey, Vec<KeyShare>), Error> {
    check_modulus_bits(bits, INSECURE_MIN_MODULUS_BITS)?;
    generate_unchecked(bits, players, threshold, rng, progress)
}

/// `bits` must be even and in `min..=MAX_MODULUS_BITS`.
fn check_modulus_bits(bits: u32, min: u32) -> Result<(), Error> {
    if !(min..=MAX_MODULUS_BITS).contains(&bits) || !bits.is_multiple_of(2) {
        return Err(Error::ModulusBits { bits, min, max: MAX_MODULUS_BITS });
    }
    Ok(())
}

fn generate_unchecked<R: CryptoRng + ?Sized>(
    bits: u32,
    players: u16,
    threshold: u16,
    rng: &mut R,
    progress: &mut dyn FnMut(Progress),
) -> Result<(PublicKey, Vec<KeyShare>), Error> {
    check_players(players, threshold)?;
    let (p, q) = safe_prime_pair(bits / 2, rng, progress)?;
    progress(Progress::Dealing);
    let result = deal(&p, &q, players, threshold, rng);
    progress(Progress::Done);
    result
}

/// Two distinct safe primes of `bits` bits each, searched in parallel on two threads, each with
/// its own ChaCha20 generator seeded from `rng` (so the result does not depend on scheduling).
pub(crate) fn safe_prime_pair<R: CryptoRng + ?Sized>(bits: u32, rng: &mut R, progress: &mut dyn FnMut(Progress)) -> Result<(BigUint, BigUint), Error> {
    for _ in 0..4 {
        let mut seeds = [[0u8; 32]; 2];
        rng.fill_bytes(&mut seeds[0]);
        rng.fill_bytes(&mut seeds[1]);
        let (tx, rx) = mpsc::channel::<(u8, Event)>();
        let results = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2u8)
                .map(|which| {
                    let tx = tx.clone();
                    let seed = seeds[usize::from(which)];
                    scope.spawn(move || {
                        let mut thread_rng = ChaCha20Rng::from_seed(seed);
                        prime::safe_prime(bits, &mut thread_rng, &mut |e| {
                            let _ = tx.send((which, e));
                        })
                    })
                })
                .collect();
            drop(tx);
            for (which, event) in rx {
                progress(match event {
                    Event::Rejected => Progress::Candidate { prime: which },
                    Event::QPassed => Progress::Promising { prime: which },
                    Event::Found => Progress::PrimeFound { prime: which },
                });
            }
            handles.into_iter().map(|h| h.join().unwrap_or(Err(Error::PrimeSearchExhausted(0)))).collect::<Vec<_>>()
        });
        seeds.zeroize();
        let mut results = results.into_iter();
        let (Some(p), Some(q)) = (results.next(), results.next()) else {
            continue;
        };
        let (p, q) = (p?, q?);
        if p != q {
            return Ok((p, q));
        }
    }
    Err(Error::PrimeSearchExhausted(prime::MAX_WINDOWS))
}

fn random_below(rng: &mut (impl Rng + ?Sized), bound: &BigUint) -> BigUint {
    // 64 extra bits make the modulo bias negligible (< 2^-64).
    let mut bytes = vec![0u8; (bound.bits() as usize).div_ceil(8) + 8];
    rng.fill_bytes(&mut bytes);
    let value = BigUint::from_bytes_be(&bytes) % bound;
    bytes.zeroize();
    value
}

/// Splits the key given by safe primes p, q into shares (Shoup, Section 2).
pub(crate) fn deal<R: CryptoRng + ?Sized>(p: &BigUint, q: &BigUint, players: u16, threshold: u16, rng: &mut R) -> Result<(PublicKey, Vec<KeyShare>), Error> {
    check_players(players, threshold)?;
    let n = p * q;
    let m = (p >> 1u32) * (q >> 1u32);
    let e = BigInt::from(PUBLIC_EXPONENT);
    let (g, d, _) = ext_gcd(&e, &BigInt::from(m.clone()));
    if !g.is_one() {
        return Err(Error::InvalidKey("e divides p'q'".into()));
    }
    let d = d.mod_floor(&BigInt::from(m.clone()));
    let (_, d) = d.into_parts();
    // f(X) = d + a_1 X + ... + a_{k-1} X^{k-1} over Z_m.
    let mut coefficients = vec![d];
    for _ in 1..threshold {
        coefficients.push(random_below(rng, &m));
    }
    let v = loop {
        let r = random_below(rng, &n);
        if r > BigUint::one() && r.gcd(&n).is_one() {
            let v = (&r * &r) % &n;
            if !v.is_one() {
                break v;
            }
        }
    };
    let bits = n.bits() as u32;
    let prec = precision(bits);
    let secrets: Vec<BoxedUint> = (1..=players)
        .map(|i| {
            let x = BigUint::from(i);
            let s = coefficients.iter().rev().fold(BigUint::zero(), |acc, a| (acc * &x + a) % &m);
            to_boxed(&s, prec).ok_or_else(|| Error::InvalidKey("share exceeds modulus".into()))
        })
        .collect::<Result<_, _>>()?;
    drop(coefficients);
    let params = {
        let odd: Option<Odd<BoxedUint>> = Odd::new(to_boxed(&n, prec).ok_or_else(|| Error::InvalidKey("modulus".into()))?).into();
        BoxedMontyParams::new_vartime(odd.ok_or_else(|| Error::InvalidKey("modulus".into()))?)
    };
    let v_monty = BoxedMontyForm::new(to_boxed(&v, prec).ok_or_else(|| Error::InvalidKey("v".into()))?, &params);
    let vks = secrets.iter().map(|s| from_boxed(&v_monty.pow(s).retrieve())).collect();
    let pk = PublicKey::from_parts(n, PUBLIC_EXPONENT, players, threshold, v, vks)?;
    let shares =
        secrets.into_iter().zip(1..=players).map(|(secret, index)| KeyShare { index, secret, modulus_bits: bits, fingerprint: pk.fingerprint }).collect();
    Ok((pk, shares))
}

/// Signed BigInt to (is_negative, magnitude).
pub(crate) fn split_sign(x: &BigInt) -> (bool, BigUint) {
    (x.sign() == Sign::Minus, x.magnitude().clone())
}
