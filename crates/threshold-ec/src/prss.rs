//! Pseudorandom secret sharing (Cramer, Damgård and Ishai, TCC 2005) over a curve's scalars:
//! shares of a random value and of zero that every replica computes alone from its keys ρ_T
//! and the session's hash h, with no message (docs/DETERMINISM.md, "The construction").
//!
//! A set T of t replicas is a bitmask (bit i − 1 for replica i); the sets are enumerated in
//! ascending bitmask order, which the dealer, the key files and every session share.

use ff::{Field, PrimeField};
use group::Group;
use sha2::{Digest as _, Sha512};

use crate::curve::Curve;

/// Every t-subset of {1..n}, ascending as bitmasks.
pub fn subsets(n: u16, t: u16) -> Vec<u32> {
    (0u32..(1u32 << n)).filter(|m| m.count_ones() == u32::from(t)).collect()
}

/// Whether replica `i` (1-based) is a member of `set`.
pub fn contains(set: u32, i: u16) -> bool {
    (1..=32).contains(&i) && set & (1u32 << (i - 1)) != 0
}

/// The members of `set`, ascending.
pub fn members(set: u32) -> Vec<u16> {
    (1u16..=32).filter(|&i| contains(set, i)).collect()
}

/// f_T(i): the degree-t polynomial with f_T(0) = 1 and f_T(j) = 0 for j in T, at i.
pub(crate) fn f_t<F: PrimeField>(set: u32, i: u16) -> F {
    let x = F::from(u64::from(i));
    let (mut num, mut den) = (F::ONE, F::ONE);
    for j in members(set) {
        let xj = F::from(u64::from(j));
        num *= xj - x;
        den *= xj;
    }
    // Members are 1..=32, never 0 mod the order: den is invertible.
    num * Option::<F>::from(den.invert()).unwrap_or(F::ZERO)
}

/// What a PRSS value is for. Each label is its own independent pseudorandom sharing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Label {
    /// The nonce k (both algorithms).
    K,
    /// Ed25519 presignatures' second nonce k′ (R = R₁ + ρ·R₂, src/presign).
    K2,
    /// ECDSA's multiplicative mask a, and its Pedersen blinder b.
    A,
    B,
    /// ECDSA's zero sharings z1 (μ round) and z2 (σ round), and their Pedersen blinders.
    Z1,
    Y1,
    Z2,
    Y2,
}

impl Label {
    fn tag(self) -> &'static [u8] {
        match self {
            Label::K => b"k",
            Label::K2 => b"k2",
            Label::A => b"a",
            Label::B => b"b",
            Label::Z1 => b"z1",
            Label::Y1 => b"y1",
            Label::Z2 => b"z2",
            Label::Y2 => b"y2",
        }
    }
}

/// F(ρ, label, h, ℓ): SHA-512 over fixed-length fields (so the encoding is injective), reduced
/// wide. The curve's name separates the two algorithms even under one ρ.
pub(crate) fn prf<C: Curve>(rho: &[u8; 32], label: Label, h: &[u8; 32], l: u16) -> C::Scalar {
    let tag = label.tag();
    let out: [u8; 64] = Sha512::new()
        .chain_update(b"sdns threshold-ec PRSS v1\0")
        .chain_update(C::NAME)
        .chain_update([0u8, tag.len() as u8])
        .chain_update(tag)
        .chain_update(rho)
        .chain_update(h)
        .chain_update(l.to_be_bytes())
        .finalize()
        .into();
    C::scalar_from_wide(&out)
}

/// Replica i's share of the random value Σ_T F(ρ_T, label, h, 0) (degree t). The sessions
/// compute it together with their commitments, with f_T(i) from the key; this is the
/// definition they are tested against.
#[cfg(test)]
pub(crate) fn random_share<C: Curve>(keys: &[(u32, [u8; 32])], i: u16, label: Label, h: &[u8; 32]) -> C::Scalar {
    keys.iter().map(|(set, rho)| prf::<C>(rho, label, h, 0) * f_t::<C::Scalar>(*set, i)).sum()
}

/// Replica i's share of zero on a degree-2t polynomial (the definition, as above).
#[cfg(test)]
pub(crate) fn zero_share<C: Curve>(keys: &[(u32, [u8; 32])], t: u16, i: u16, label: Label, h: &[u8; 32]) -> C::Scalar {
    let x = C::Scalar::from(u64::from(i));
    keys.iter()
        .map(|(set, rho)| {
            let mut power = C::Scalar::ONE;
            let mut inner = C::Scalar::ZERO;
            for l in 1..=t {
                power *= x;
                inner += prf::<C>(rho, label, h, l) * power;
            }
            inner * f_t::<C::Scalar>(*set, i)
        })
        .sum()
}

/// The commitment to replica j's share of a random value, from the per-set commitments
/// V_T = F(ρ_T, ·)·G (or Pedersen commitments): Σ_{T ∌ j} f_T(j)·V_T.
pub(crate) fn random_commitment<C: Curve>(sets: &[(u32, C::Point)], j: u16) -> C::Point {
    sets.iter().filter(|(set, _)| !contains(*set, j)).map(|(set, v)| *v * f_t::<C::Scalar>(*set, j)).sum()
}

/// The commitment to replica j's share of zero from per-set commitments V_{T,ℓ}, ℓ = 1..=t.
pub(crate) fn zero_commitment<C: Curve>(sets: &[(u32, Vec<C::Point>)], j: u16) -> C::Point {
    let x = C::Scalar::from(u64::from(j));
    sets.iter()
        .filter(|(set, _)| !contains(*set, j))
        .map(|(set, vs)| {
            let mut power = C::Scalar::ONE;
            let mut inner = C::Point::identity();
            for v in vs {
                power *= x;
                inner += *v * power;
            }
            inner * f_t::<C::Scalar>(*set, j)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::curve::{interpolate, on_one_polynomial, P256};

    /// Keys for every set, each handed to the replicas outside it.
    fn keys(n: u16, t: u16) -> Vec<Vec<(u32, [u8; 32])>> {
        let sets = subsets(n, t);
        (1..=n).map(|i| sets.iter().enumerate().filter(|(_, s)| !contains(**s, i)).map(|(k, s)| (*s, [k as u8 + 1; 32])).collect()).collect()
    }

    #[test]
    fn subsets_are_all_t_sets_in_a_fixed_order() {
        assert_eq!(subsets(4, 1), vec![0b0001, 0b0010, 0b0100, 0b1000]);
        assert_eq!(subsets(7, 2).len(), 21);
        assert_eq!(subsets(3, 0), vec![0]);
        assert_eq!(members(0b1010), vec![2, 4]);
    }

    #[test]
    fn shares_interpolate_to_the_sum_and_to_zero() {
        let h = [5u8; 32];
        for (n, t) in [(4u16, 1u16), (7, 2), (10, 3)] {
            let keys = keys(n, t);
            let u: Vec<(u16, p256::Scalar)> = (1..=n).map(|i| (i, random_share::<P256>(&keys[usize::from(i) - 1], i, Label::K, &h))).collect();
            let z: Vec<(u16, p256::Scalar)> = (1..=n).map(|i| (i, zero_share::<P256>(&keys[usize::from(i) - 1], t, i, Label::Z1, &h))).collect();
            assert!(on_one_polynomial(&u, usize::from(t)), "degree t");
            assert!(on_one_polynomial(&z, usize::from(2 * t)), "degree 2t");
            assert!(!on_one_polynomial(&z[..usize::from(2 * t) + 1], usize::from(2 * t) - 1) || t == 0, "not lower");
            let expected: p256::Scalar = subsets(n, t).iter().enumerate().map(|(k, _)| prf::<P256>(&[k as u8 + 1; 32], Label::K, &h, 0)).sum();
            assert_eq!(interpolate(&u[..usize::from(t) + 1], p256::Scalar::ZERO), expected);
            assert_eq!(interpolate(&z[usize::from(t)..], p256::Scalar::ZERO), p256::Scalar::ZERO);
        }
    }
}
