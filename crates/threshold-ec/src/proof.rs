//! ECDSA's share proofs: knowledge of (α, β) with P1 = α·B1 and P2 = α·B2 − β·H, a
//! Chaum–Pedersen proof of equal discrete logs with a Pedersen blinding term (H is
//! [`crate::curve::p256_h`]), made non-interactive with Fiat–Shamir over the session's context.
//!
//! The μ and σ shares are each one such statement (docs/DETERMINISM.md): α is the replica's k_i
//! or x_i, B2 a Pedersen commitment, β the blinding that makes the commitments hiding. The
//! nonces are derived from the witness and the statement (as RFC 6979 and EdDSA do), so the
//! prover needs no randomness and the same statement always gets the same proof.

use ff::PrimeField;
use p256::{ProjectivePoint, Scalar};
use sha2::{Digest as _, Sha512};

use crate::curve::{encode_points, p256_h, pedersen, Curve, P256};

pub(crate) const PROOF_LEN: usize = 96;

pub(crate) struct Statement {
    pub b1: ProjectivePoint,
    pub p1: ProjectivePoint,
    pub b2: ProjectivePoint,
    pub p2: ProjectivePoint,
}

impl Statement {
    fn points(&self) -> [ProjectivePoint; 4] {
        [self.b1, self.p1, self.b2, self.p2]
    }
}

/// The challenge over the encodings of the statement's points and t1, t2 (in that order).
fn challenge(encoded: &[[u8; 33]], context: &[u8]) -> Scalar {
    let mut h = Sha512::new();
    h.update(b"sdns threshold-ec DLEQ challenge v1\0");
    h.update((context.len() as u32).to_be_bytes());
    h.update(context);
    encoded.iter().for_each(|p| h.update(p));
    P256::scalar_from_wide(&h.finalize().into())
}

/// The proof c ‖ z_α ‖ z_β (three big-endian scalars). Every statement of this crate has
/// b1 = G, and its prover knows b2 = u·G + v·H (`b2_log` = (u, v)), so t1 and t2 come from
/// the fixed-base tables: t2 = w_α·b2 − w_β·H = (w_α·u)·G + (w_α·v − w_β)·H.
pub(crate) fn prove(st: &Statement, alpha: &Scalar, beta: &Scalar, b2_log: (&Scalar, &Scalar), context: &[u8]) -> [u8; PROOF_LEN] {
    let mut encoded = encode_points(&st.points());
    let nonce = |which: u8| -> Scalar {
        let mut h = Sha512::new();
        h.update(b"sdns threshold-ec DLEQ nonce v1\0");
        h.update([which]);
        h.update(alpha.to_repr());
        h.update(beta.to_repr());
        h.update((context.len() as u32).to_be_bytes());
        h.update(context);
        encoded.iter().for_each(|p| h.update(p));
        P256::scalar_from_wide(&h.finalize().into())
    };
    let (mut w_alpha, mut w_beta) = (nonce(0), nonce(1));
    let t1 = P256::mul_base(&w_alpha);
    let (mut g_part, mut h_part) = (w_alpha * b2_log.0, w_alpha * b2_log.1 - w_beta);
    let t2 = pedersen(&g_part, &h_part);
    encoded.extend(encode_points(&[t1, t2]));
    let c = challenge(&encoded, context);
    let z_alpha = w_alpha + c * alpha;
    let z_beta = w_beta + c * beta;
    for secret in [&mut w_alpha, &mut w_beta, &mut g_part, &mut h_part] {
        zeroize::Zeroize::zeroize(secret);
    }
    let mut out = [0u8; PROOF_LEN];
    out[..32].copy_from_slice(&P256::scalar_to_bytes(&c));
    out[32..64].copy_from_slice(&P256::scalar_to_bytes(&z_alpha));
    out[64..].copy_from_slice(&P256::scalar_to_bytes(&z_beta));
    out
}

/// Whether `proof` proves `st` in `context`. Non-canonical scalars fail; nothing panics.
pub(crate) fn verify(st: &Statement, proof: &[u8; PROOF_LEN], context: &[u8]) -> bool {
    let scalar = |k: usize| -> Option<Scalar> { P256::scalar_from_bytes(proof[32 * k..32 * (k + 1)].try_into().ok()?) };
    let (Some(c), Some(z_alpha), Some(z_beta)) = (scalar(0), scalar(1), scalar(2)) else { return false };
    let t1 = st.b1 * z_alpha - st.p1 * c;
    let t2 = st.b2 * z_alpha - p256_h() * z_beta - st.p2 * c;
    let [b1, p1, b2, p2] = st.points();
    challenge(&encode_points(&[b1, p1, b2, p2, t1, t2]), context) == c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn honest_proofs_verify_and_tampered_ones_do_not() {
        let g = ProjectivePoint::GENERATOR;
        let (alpha, beta) = (Scalar::from(1234u64), Scalar::from(987u64));
        let b2 = g * Scalar::from(55u64) + p256_h() * Scalar::from(66u64);
        let st = Statement { b1: g, p1: g * alpha, b2, p2: b2 * alpha - p256_h() * beta };
        let b2_log = (Scalar::from(55u64), Scalar::from(66u64));
        let proof = prove(&st, &alpha, &beta, (&b2_log.0, &b2_log.1), b"ctx");
        assert!(verify(&st, &proof, b"ctx"));
        assert!(!verify(&st, &proof, b"other context"));
        let mut bad = proof;
        bad[40] ^= 1;
        assert!(!verify(&st, &bad, b"ctx"));
        assert!(!verify(&st, &[0xff; PROOF_LEN], b"ctx"));
        // A wrong α in P2 (a wrong share) cannot be proven.
        let wrong = Statement { p2: b2 * (alpha + Scalar::from(1u64)) - p256_h() * beta, ..st };
        assert!(!verify(&wrong, &prove(&wrong, &alpha, &beta, (&b2_log.0, &b2_log.1), b"ctx"), b"ctx"));
    }
}
