//! The two groups behind one small trait, so that Shamir sharing, PRSS and commitment checks
//! are written once. Encodings are each algorithm's own: Ed25519 scalars little-endian and
//! points as RFC 8032's 32 bytes; P-256 scalars big-endian (RFC 6605's r and s) and points as
//! 33-byte compressed SEC1.

use std::sync::OnceLock;

use ff::PrimeField;
use group::{Group, GroupEncoding};
use sha2::{Digest as _, Sha256};

pub(crate) trait Curve: 'static {
    type Scalar: PrimeField + zeroize::Zeroize;
    type Point: Group<Scalar = Self::Scalar>;
    /// Length of [`Curve::point_to_bytes`].
    const POINT_LEN: usize;
    /// Domain separation of everything hashed for this curve.
    const NAME: &'static [u8];

    /// k·G in constant time (k is secret whenever this is called on a share).
    fn mul_base(k: &Self::Scalar) -> Self::Point;
    /// A 64-byte hash output reduced mod the group order: the bias is about 2^-256.
    fn scalar_from_wide(bytes: &[u8; 64]) -> Self::Scalar;
    fn scalar_to_bytes(s: &Self::Scalar) -> [u8; 32];
    /// Canonical encodings only (below the order): a peer's scalar is never reduced silently.
    fn scalar_from_bytes(bytes: &[u8; 32]) -> Option<Self::Scalar>;
    fn point_to_bytes(p: &Self::Point) -> Vec<u8>;
    /// Canonical encodings of points in the prime-order group only; anything else is `None`.
    fn point_from_bytes(bytes: &[u8]) -> Option<Self::Point>;
}

pub(crate) struct Ed25519;

impl Curve for Ed25519 {
    type Scalar = curve25519_dalek::Scalar;
    type Point = curve25519_dalek::EdwardsPoint;
    const POINT_LEN: usize = 32;
    const NAME: &'static [u8] = b"Ed25519";

    fn mul_base(k: &Self::Scalar) -> Self::Point {
        curve25519_dalek::EdwardsPoint::mul_base(k)
    }

    fn scalar_from_wide(bytes: &[u8; 64]) -> Self::Scalar {
        curve25519_dalek::Scalar::from_bytes_mod_order_wide(bytes)
    }

    fn scalar_to_bytes(s: &Self::Scalar) -> [u8; 32] {
        s.to_bytes()
    }

    fn scalar_from_bytes(bytes: &[u8; 32]) -> Option<Self::Scalar> {
        Option::from(curve25519_dalek::Scalar::from_canonical_bytes(*bytes))
    }

    fn point_to_bytes(p: &Self::Point) -> Vec<u8> {
        p.compress().to_bytes().to_vec()
    }

    fn point_from_bytes(bytes: &[u8]) -> Option<Self::Point> {
        let bytes: [u8; 32] = bytes.try_into().ok()?;
        let p = curve25519_dalek::edwards::CompressedEdwardsY(bytes).decompress()?;
        // Honest points are multiples of the base point: no torsion, one encoding.
        (p.is_torsion_free() && p.compress().to_bytes() == bytes).then_some(p)
    }
}

pub(crate) struct P256;

impl Curve for P256 {
    type Scalar = p256::Scalar;
    type Point = p256::ProjectivePoint;
    const POINT_LEN: usize = 33;
    const NAME: &'static [u8] = b"P-256";

    fn mul_base(k: &Self::Scalar) -> Self::Point {
        g_table().mul(k)
    }

    fn scalar_from_wide(bytes: &[u8; 64]) -> Self::Scalar {
        use p256::elliptic_curve::bigint::U256;
        use p256::elliptic_curve::ops::Reduce;
        // hi·2^256 + lo, each half reduced exactly (2^256 < 2q, so one subtraction suffices).
        let (mut hi, mut lo) = ([0u8; 32], [0u8; 32]);
        hi.copy_from_slice(&bytes[..32]);
        lo.copy_from_slice(&bytes[32..]);
        let hi = <p256::Scalar as Reduce<U256>>::reduce_bytes(&hi.into());
        let lo = <p256::Scalar as Reduce<U256>>::reduce_bytes(&lo.into());
        let two_256 = p256::Scalar::from(1u64 << 32).square().square().square();
        hi * two_256 + lo
    }

    fn scalar_to_bytes(s: &Self::Scalar) -> [u8; 32] {
        s.to_repr().into()
    }

    fn scalar_from_bytes(bytes: &[u8; 32]) -> Option<Self::Scalar> {
        Option::from(p256::Scalar::from_repr((*bytes).into()))
    }

    fn point_to_bytes(p: &Self::Point) -> Vec<u8> {
        p.to_bytes().to_vec()
    }

    fn point_from_bytes(bytes: &[u8]) -> Option<Self::Point> {
        let bytes: [u8; 33] = bytes.try_into().ok()?;
        let p: Option<p256::ProjectivePoint> = Option::from(p256::ProjectivePoint::from_bytes(&bytes.into()));
        // The identity's stand-in encoding (33 zero bytes) is no honest point.
        p.filter(|p| !bool::from(p.is_identity()))
    }
}

/// P-256's second generator H for Pedersen commitments: the first x = SHA-256(label ‖ counter)
/// on the curve. Nobody knows log_G H, which is what makes the commitments binding.
pub(crate) fn p256_h() -> p256::ProjectivePoint {
    static H: OnceLock<p256::ProjectivePoint> = OnceLock::new();
    *H.get_or_init(|| {
        let mut counter = 0u32;
        loop {
            let x: [u8; 32] = Sha256::new().chain_update(b"sdns threshold-ec P-256 Pedersen generator H").chain_update(counter.to_be_bytes()).finalize().into();
            let mut encoded = [2u8; 33];
            encoded[1..].copy_from_slice(&x);
            if let Some(h) = P256::point_from_bytes(&encoded) {
                return h;
            }
            counter += 1;
        }
    })
}

/// A fixed-base table for P-256 (the p256 crate has none): for each of the 64 4-bit digits
/// of a scalar, the 16 multiples 0..15 of 16^w·P as affine points, so k·P is 64 mixed
/// additions instead of 256 doublings and 64 additions. Constant time: every digit reads all
/// 16 entries of its row through conditional selection, and the complete addition formulas
/// handle the identity without a branch.
pub(crate) struct P256Table(Vec<[p256::AffinePoint; 16]>);

impl P256Table {
    pub(crate) fn new(base: &p256::ProjectivePoint) -> P256Table {
        use group::Curve as _;
        let mut points = Vec::with_capacity(64 * 16);
        let mut b = *base;
        for _ in 0..64 {
            let mut acc = p256::ProjectivePoint::IDENTITY;
            for _ in 0..16 {
                points.push(acc);
                acc += b;
            }
            b = acc;
        }
        let mut affine = vec![p256::AffinePoint::IDENTITY; points.len()];
        p256::ProjectivePoint::batch_normalize(&points, &mut affine);
        P256Table(affine.chunks_exact(16).map(|row| std::array::from_fn(|j| row[j])).collect())
    }

    pub(crate) fn mul(&self, k: &p256::Scalar) -> p256::ProjectivePoint {
        use p256::elliptic_curve::subtle::{ConditionallySelectable, ConstantTimeEq};
        let bytes: [u8; 32] = k.to_repr().into();
        let mut acc = p256::ProjectivePoint::IDENTITY;
        for (w, row) in self.0.iter().enumerate() {
            // Big-endian bytes: digit w is the low or high half of byte 31 − w/2.
            let byte = bytes[31 - w / 2];
            let digit = if w % 2 == 0 { byte & 0x0f } else { byte >> 4 };
            let mut entry = p256::AffinePoint::IDENTITY;
            for (j, point) in row.iter().enumerate().skip(1) {
                entry.conditional_assign(point, (j as u8).ct_eq(&digit));
            }
            acc += entry;
        }
        acc
    }
}

fn g_table() -> &'static P256Table {
    static G: OnceLock<P256Table> = OnceLock::new();
    G.get_or_init(|| P256Table::new(&p256::ProjectivePoint::GENERATOR))
}

fn h_table() -> &'static P256Table {
    static H: OnceLock<P256Table> = OnceLock::new();
    H.get_or_init(|| P256Table::new(&p256_h()))
}

/// The Pedersen commitment v·G + blind·H, both from fixed-base tables.
pub(crate) fn pedersen(v: &p256::Scalar, blind: &p256::Scalar) -> p256::ProjectivePoint {
    g_table().mul(v) + h_table().mul(blind)
}

/// The compressed encodings of `points` (as [`Curve::point_to_bytes`]), with one field
/// inversion for all of them instead of one each.
pub(crate) fn encode_points(points: &[p256::ProjectivePoint]) -> Vec<[u8; 33]> {
    use group::Curve as _;
    let mut affine = vec![p256::AffinePoint::IDENTITY; points.len()];
    p256::ProjectivePoint::batch_normalize(points, &mut affine);
    affine
        .iter()
        .map(|a| {
            let mut out = [0u8; 33];
            out.copy_from_slice(&a.to_bytes());
            out
        })
        .collect()
}

/// Lagrange coefficient of point `j` among `points` for evaluation at `at` (all distinct).
pub(crate) fn lagrange<F: PrimeField>(points: &[u16], j: u16, at: F) -> F {
    let xj = F::from(u64::from(j));
    let (mut num, mut den) = (F::ONE, F::ONE);
    for &m in points.iter().filter(|&&m| m != j) {
        let xm = F::from(u64::from(m));
        num *= at - xm;
        den *= xj - xm;
    }
    // Distinct points give a non-zero denominator; a zero one would be a caller bug, and 0 is
    // then the harmless answer (the result fails its check instead of panicking).
    num * Option::<F>::from(den.invert()).unwrap_or(F::ZERO)
}

/// The value at `at` of the polynomial through `shares` (degree len − 1). The Lagrange
/// denominators are inverted together (one inversion and three multiplications each, instead
/// of an inversion each). Duplicate points (a caller bug) give zero, which fails its check.
pub(crate) fn interpolate<F: PrimeField>(shares: &[(u16, F)], at: F) -> F {
    let xs: Vec<F> = shares.iter().map(|(j, _)| F::from(u64::from(*j))).collect();
    let mut nums = Vec::with_capacity(xs.len());
    let mut dens = Vec::with_capacity(xs.len());
    for (a, xa) in xs.iter().enumerate() {
        let (mut num, mut den) = (F::ONE, F::ONE);
        for (_, xb) in xs.iter().enumerate().filter(|(b, _)| *b != a) {
            num *= at - xb;
            den *= *xa - xb;
        }
        nums.push(num);
        dens.push(den);
    }
    // Montgomery's trick: prefix products, one inversion, then walk back.
    let mut prefix = Vec::with_capacity(dens.len());
    let mut acc = F::ONE;
    for d in &dens {
        prefix.push(acc);
        acc *= d;
    }
    let mut inv = Option::<F>::from(acc.invert()).unwrap_or(F::ZERO);
    let mut result = F::ZERO;
    for a in (0..shares.len()).rev() {
        let inv_a = inv * prefix[a];
        inv *= dens[a];
        result += nums[a] * inv_a * shares[a].1;
    }
    result
}

/// Whether every share lies on the polynomial of degree `degree` through the first
/// `degree + 1` of them.
pub(crate) fn on_one_polynomial<F: PrimeField>(shares: &[(u16, F)], degree: usize) -> bool {
    let Some((base, rest)) = shares.split_at_checked(degree + 1) else { return true };
    rest.iter().all(|(j, v)| interpolate(base, F::from(u64::from(*j))) == *v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_reduction_matches_the_integer_value() {
        // 2^256 + 5 as a 64-byte big-endian number.
        let mut b = [0u8; 64];
        b[31] = 1;
        b[63] = 5;
        let two_256 = p256::Scalar::from(1u64 << 32).square().square().square();
        assert_eq!(P256::scalar_from_wide(&b), two_256 + p256::Scalar::from(5u64));
        // 2^256 mod q = 2^256 - q, which is below 2^224.
        let r: [u8; 32] = P256::scalar_to_bytes(&two_256);
        assert_eq!(&r[..3], &[0, 0, 0]);
    }

    #[test]
    fn fixed_base_tables_agree_with_plain_multiplication() {
        let h = p256_h();
        let table = P256Table::new(&h);
        for k in [0u64, 1, 2, 15, 16, 255, 256, 0xdead_beef_1234_5678] {
            let k = p256::Scalar::from(k);
            assert_eq!(table.mul(&k), h * k);
            assert_eq!(P256::mul_base(&k), p256::ProjectivePoint::GENERATOR * k);
        }
        let big = -p256::Scalar::from(3u64);
        assert_eq!(table.mul(&big), h * big);
        assert_eq!(pedersen(&big, &p256::Scalar::from(7u64)), p256::ProjectivePoint::GENERATOR * big + h * p256::Scalar::from(7u64));
        let points = [h, p256::ProjectivePoint::IDENTITY, h * big];
        let encoded = encode_points(&points);
        for (p, e) in points.iter().zip(&encoded) {
            assert_eq!(P256::point_to_bytes(p), e.to_vec());
        }
    }

    #[test]
    fn second_generator_is_a_point_other_than_g() {
        let h = p256_h();
        assert_ne!(h, p256::ProjectivePoint::GENERATOR);
        assert!(!bool::from(h.is_identity()));
    }

    #[test]
    fn garbage_points_and_scalars_are_rejected() {
        assert!(P256::point_from_bytes(&[0u8; 33]).is_none());
        assert!(P256::point_from_bytes(&[9u8; 33]).is_none());
        assert!(P256::point_from_bytes(&[2u8; 32]).is_none());
        assert!(P256::scalar_from_bytes(&[0xff; 32]).is_none());
        assert!(Ed25519::scalar_from_bytes(&[0xff; 32]).is_none());
        assert!(Ed25519::point_from_bytes(&[0u8; 31]).is_none());
        // A torsion point (order 8's generator encoding is 0x26e8...; the identity y = 1 is
        // torsion-free, so test a known small-order point: y = -1).
        let mut minus_one = [0xffu8; 32];
        minus_one[0] = 0xec;
        minus_one[31] = 0x7f;
        assert!(Ed25519::point_from_bytes(&minus_one).is_none());
    }

    #[test]
    fn interpolation_recovers_a_polynomial() {
        // 3 + 2z + z^2 at 1, 2, 4.
        let f = |z: u64| p256::Scalar::from(3 + 2 * z + z * z);
        let shares = vec![(1u16, f(1)), (2, f(2)), (4, f(4))];
        assert_eq!(interpolate(&shares, p256::Scalar::ZERO), f(0));
        assert!(on_one_polynomial(&[(1, f(1)), (2, f(2)), (4, f(4)), (7, f(7))], 2));
        assert!(!on_one_polynomial(&[(1, f(1)), (2, f(2)), (4, f(4)), (7, f(6))], 2));
    }
}
