//! Signature shares, Shoup's proof of correctness, and share verification.
//!
//! The proof shows log_v(v_i) = log_ṽ(x̃_i) where ṽ = x^{4Δ} and x̃_i = x_i^2 (Shoup, Section 2):
//! v' = v^r, x' = ṽ^r, c = SHA-256(v, ṽ, v_i, x̃_i, v', x'), z = s_i c + r, with r < 2^{|N|+512}.
//!
//! r is derived, not drawn: r = the first |N|+512 bits of SHA-512(tag, counter, s_i, i, key
//! fingerprint, x) for counter = 0, 1, .... Since s_i is secret and uniform, r is as good as a
//! random value to anyone without s_i (the same reasoning as RFC 6979), and signing needs no RNG
//! and is reproducible. Distinct messages give independent r; the same message gives the same
//! proof, which reveals nothing new.

use crypto_bigint::{BoxedUint, ConcatenatingMul, Resize};
use num_bigint::BigUint;
use num_integer::Integer;
use num_traits::{One, Zero};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};
use zeroize::Zeroizing;

use crate::exp;
use crate::util::{self, from_boxed, precision, to_boxed, to_fixed_be};
use crate::{CombineError, Error, KeyShare, Message, PublicKey, ShareError};

/// Bits of the proof challenge c (SHA-256).
const CHALLENGE_BITS: u32 = 256;
const CHALLENGE_BYTES: usize = 32;

/// A proof of correctness of one signature share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareProof {
    #[serde(with = "util::serde_hex")]
    pub c: BigUint,
    #[serde(with = "util::serde_hex")]
    pub z: BigUint,
}

/// One player's signature share x_i = x^{2Δ s_i} mod N, optionally with its proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignatureShare {
    /// 1-based player index.
    pub index: u16,
    #[serde(with = "util::serde_hex")]
    pub value: BigUint,
    pub proof: Option<ShareProof>,
}

/// Longest exponent of v: the nonce r (at its limb-rounded precision) or a proof's z field.
pub(crate) fn v_exponent_bits(pk: &PublicKey) -> u32 {
    (8 * proof_z_bytes(pk) as u32).max(precision(pk.bits + 2 * CHALLENGE_BITS))
}

fn proof_z_bytes(pk: &PublicKey) -> usize {
    // z = s_i c + r < 2^{|N| - 2 + 256} + 2^{|N| + 512} < 2^{|N| + 513}.
    ((pk.bits + 2 * CHALLENGE_BITS + 1) as usize).div_ceil(8)
}

impl PublicKey {
    /// The fixed-base table of v, covering exponents as long as a proof's z.
    pub(crate) fn v_table(&self) -> Option<&exp::FixedBase> {
        self.v_table.get_or_init(|| exp::FixedBase::new(&self.v, &self.params, v_exponent_bits(self))).as_ref()
    }
}

impl SignatureShare {
    /// Wire form: index (u16 BE) | x_i (|N| bytes) | flag (0 or 1) | [c (32 bytes) | z].
    pub fn to_bytes(&self, pk: &PublicKey) -> Result<Vec<u8>, ShareError> {
        let mut out = self.index.to_be_bytes().to_vec();
        out.extend(to_fixed_be(&self.value, pk.bytes).ok_or(ShareError::OutOfRange { index: self.index })?);
        match &self.proof {
            None => out.push(0),
            Some(proof) => {
                out.push(1);
                let bad = ShareError::BadProof { index: self.index };
                out.extend(to_fixed_be(&proof.c, CHALLENGE_BYTES).ok_or(bad.clone())?);
                out.extend(to_fixed_be(&proof.z, proof_z_bytes(pk)).ok_or(bad)?);
            }
        }
        Ok(out)
    }

    /// Parses the wire form, checking lengths and that the index belongs to `pk`.
    pub fn from_bytes(pk: &PublicKey, bytes: &[u8]) -> Result<SignatureShare, ShareError> {
        let plain = 2 + pk.bytes + 1;
        let proven = plain + CHALLENGE_BYTES + proof_z_bytes(pk);
        let flag = match bytes.len() {
            len if len == plain => 0,
            len if len == proven => 1,
            got => return Err(ShareError::WrongLength { expected: plain, got }),
        };
        if bytes[plain - 1] != flag {
            return Err(ShareError::Malformed { reason: "proof flag does not match length" });
        }
        let index = u16::from_be_bytes([bytes[0], bytes[1]]);
        if index == 0 || index > pk.players {
            return Err(ShareError::UnknownIndex { index, players: pk.players });
        }
        let value = BigUint::from_bytes_be(&bytes[2..2 + pk.bytes]);
        let proof = (flag == 1).then(|| ShareProof {
            c: BigUint::from_bytes_be(&bytes[plain..plain + CHALLENGE_BYTES]),
            z: BigUint::from_bytes_be(&bytes[plain + CHALLENGE_BYTES..]),
        });
        Ok(SignatureShare { index, value, proof })
    }
}

/// Checks index and that the value is in Z_N* (not 0, below N, coprime to N).
pub(crate) fn check_structure(pk: &PublicKey, share: &SignatureShare) -> Result<(), ShareError> {
    check_cheap(pk, share)?;
    if !share.value.gcd(&pk.n).is_one() {
        return Err(ShareError::NotInvertible { index: share.index });
    }
    Ok(())
}

/// The checks without the gcd (combination runs the gcd only when something fails).
pub(crate) fn check_cheap(pk: &PublicKey, share: &SignatureShare) -> Result<(), ShareError> {
    if share.index == 0 || share.index > pk.players {
        return Err(ShareError::UnknownIndex { index: share.index, players: pk.players });
    }
    if share.value.is_zero() || share.value >= pk.n {
        return Err(ShareError::OutOfRange { index: share.index });
    }
    Ok(())
}

fn challenge(pk: &PublicKey, values: [&BigUint; 6]) -> BigUint {
    let mut h = Sha256::new();
    h.update(b"shoup-rsa share proof v1\0");
    h.update(pk.fingerprint);
    for value in values {
        h.update(to_fixed_be(value, pk.bytes).unwrap_or_default());
    }
    BigUint::from_bytes_be(&h.finalize())
}

impl KeyShare {
    /// The signature share x_i = x^{2Δ s_i} mod N, without proof.
    pub fn sign(&self, pk: &PublicKey, msg: &Message) -> Result<SignatureShare, Error> {
        let value = self.share_value(pk, msg)?;
        Ok(SignatureShare { index: self.index(), value, proof: None })
    }

    /// The signature share with Shoup's proof of correctness (deterministic, see module docs).
    pub fn sign_with_proof(&self, pk: &PublicKey, msg: &Message) -> Result<SignatureShare, Error> {
        let value = self.share_value(pk, msg)?;
        // r reveals s_i through z; every copy is wiped on every exit path.
        let r = Zeroizing::new(self.proof_nonce(pk, msg));
        // ṽ = x^{4Δ}: public base, public exponent.
        let v_tilde = exp::pow_public(&msg.x, &(&pk.delta << 2u32), &pk.n)?;
        let x_tilde = (&value * &value) % &pk.n;
        // v' = v^r from the key's table, x' = ṽ^r: both constant time in r.
        let table = pk.v_table().ok_or(Error::KeyMismatch)?;
        let v_prime = exp::retrieve(&table.pow_secret(&r).ok_or(Error::KeyMismatch)?);
        let x_prime = exp::pow_secret(&v_tilde, &r, &pk.n)?;
        let vi = pk.verification_key(self.index()).ok_or(Error::KeyMismatch)?;
        let c = challenge(pk, [&pk.v, &v_tilde, vi, &x_tilde, &v_prime, &x_prime]);
        // z = s_i c + r over the integers, in constant time (fixed widths).
        let c_boxed = to_boxed(&c, precision(CHALLENGE_BITS)).ok_or(Error::KeyMismatch)?;
        let z_prec = precision(pk.bits + 2 * CHALLENGE_BITS + 64);
        let product = Zeroizing::new(self.secret.concatenating_mul(&c_boxed).resize_unchecked(z_prec));
        let r_wide = Zeroizing::new((&*r).resize_unchecked(z_prec));
        let z = from_boxed(&product.wrapping_add(&*r_wide));
        Ok(SignatureShare { index: self.index(), value, proof: Some(ShareProof { c, z }) })
    }

    /// x_i, constant time in s_i.
    fn share_value(&self, pk: &PublicKey, msg: &Message) -> Result<BigUint, Error> {
        self.check_key(pk)?;
        if msg.fingerprint != pk.fingerprint {
            return Err(Error::KeyMismatch);
        }
        // (x^{s_i})^{2Δ}: the secret exponent first, then the public one.
        let xs = exp::pow_secret(&msg.x, &self.secret, &pk.n)?;
        exp::pow_public(&xs, &(&pk.delta << 1u32), &pk.n)
    }

    /// r < 2^{|N| + 512}, derived from s_i and the message (see module docs).
    fn proof_nonce(&self, pk: &PublicKey, msg: &Message) -> BoxedUint {
        let r_bits = pk.bits + 2 * CHALLENGE_BITS;
        let r_bytes = r_bits.div_ceil(8) as usize;
        let secret = Zeroizing::new(self.secret.to_be_bytes());
        let x = to_fixed_be(&msg.x, pk.bytes).unwrap_or_default();
        let mut stream = Zeroizing::new(Vec::with_capacity(r_bytes + 64));
        let mut counter: u32 = 0;
        while stream.len() < r_bytes {
            let mut h = Sha512::new();
            h.update(b"shoup-rsa proof nonce v1\0");
            h.update(counter.to_be_bytes());
            h.update(&secret[..]);
            h.update(self.index().to_be_bytes());
            h.update(pk.fingerprint);
            h.update(&x);
            stream.extend_from_slice(&h.finalize());
            counter += 1;
        }
        stream.truncate(r_bytes);
        // r_bits is a multiple of 8 (|N| is even and a whole number of bytes is taken).
        BoxedUint::from_be_slice(&stream, precision(r_bits)).unwrap_or_else(|_| BoxedUint::zero())
    }
}

impl PublicKey {
    /// Checks a share's structure and its proof of correctness.
    pub fn verify_share(&self, msg: &Message, share: &SignatureShare) -> Result<(), ShareError> {
        check_structure(self, share)?;
        let proof = share.proof.as_ref().ok_or(ShareError::MissingProof { index: share.index })?;
        let bad = ShareError::BadProof { index: share.index };
        if msg.fingerprint != self.fingerprint || proof.c.bits() > u64::from(CHALLENGE_BITS) || proof.z.bits() > 8 * proof_z_bytes(self) as u64 {
            return Err(bad);
        }
        let vi = self.verification_key(share.index).ok_or(bad.clone())?;
        // Public data only: variable-time arithmetic. v' = v^z v_i^{-c}, x' = ṽ^z x̃_i^{-c},
        // with v^z from the key's table and one inversion for both negative powers.
        let n = &self.n;
        let pow = |b: &BigUint, e: &BigUint| exp::pow_public(b, e, n).map_err(|_| bad.clone());
        let v_tilde = pow(&msg.x, &(&self.delta << 2u32))?;
        let x_tilde = (&share.value * &share.value) % n;
        let vi_c = pow(vi, &proof.c)?;
        let xt_c = pow(&x_tilde, &proof.c)?;
        let inverse = (&vi_c * &xt_c % n).modinv(n).ok_or(bad.clone())?;
        let v_z = self.v_table().and_then(|t| t.pow_public(&proof.z)).ok_or(bad.clone())?;
        let v_prime = exp::retrieve(&v_z) * &xt_c % n * &inverse % n;
        let x_prime = pow(&v_tilde, &proof.z)? * &vi_c % n * &inverse % n;
        let c = challenge(self, [&self.v, &v_tilde, vi, &x_tilde, &v_prime, &x_prime]);
        if c != proof.c {
            return Err(bad);
        }
        Ok(())
    }
}

/// The paper's simulated fault: every bit of the share value inverted within |N| bytes. The
/// proof, if any, is kept (and no longer verifies).
pub fn corrupt(pk: &PublicKey, share: &SignatureShare) -> SignatureShare {
    let all_ones = (BigUint::one() << (8 * pk.bytes)) - 1u32;
    SignatureShare { index: share.index, value: &all_ones ^ &share.value, proof: share.proof.clone() }
}

pub(crate) fn message_matches(pk: &PublicKey, msg: &Message) -> Result<(), CombineError> {
    if msg.fingerprint != pk.fingerprint {
        return Err(CombineError::KeyMismatch);
    }
    Ok(())
}
