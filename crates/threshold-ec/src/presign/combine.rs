//! What a slot's presignature does with its shares: the all-n combination without checks,
//! and the steps `finish` reports to the core.

use std::collections::BTreeMap;

use ff::PrimeField;

use crate::curve::lagrange;
use crate::Error;

/// What the pre-computations of one slot return from `finish`.
pub(crate) enum Step {
    Wait,
    NeedProofs,
    Done([u8; 64]),
    Failed(Error),
}

/// Lagrange coefficients for the full set 1..=n and a degree d, computed once per key: the
/// constant from points 1..=d+1, and each further point's expected value from them, so that
/// the all-n fast path needs no inversion online.
pub(crate) struct FullSet<F> {
    n: u16,
    at_zero: Vec<F>,
    at: Vec<Vec<F>>,
}

impl<F: PrimeField> FullSet<F> {
    pub(crate) fn new(n: u16, d: u16) -> FullSet<F> {
        let base: Vec<u16> = (1..=d + 1).collect();
        let coeffs = |at: F| base.iter().map(|&j| lagrange(&base, j, at)).collect::<Vec<F>>();
        FullSet { n, at_zero: coeffs(F::ZERO), at: (d + 2..=n).map(|x| coeffs(F::from(u64::from(x)))).collect() }
    }

    /// The constant of the polynomial of degree d through all n shares, if they lie on one.
    pub(crate) fn combine(&self, shares: &BTreeMap<u16, F>) -> Option<F> {
        if shares.len() != usize::from(self.n) {
            return None;
        }
        let values: Vec<F> = shares.values().copied().collect();
        let d1 = self.at_zero.len();
        let eval = |c: &[F]| -> F { c.iter().zip(&values[..d1]).map(|(c, v)| *c * v).sum() };
        self.at.iter().zip(&values[d1..]).all(|(c, v)| eval(c) == *v).then(|| eval(&self.at_zero))
    }
}
