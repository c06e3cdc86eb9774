//! Combining k signature shares into an RSA signature, and the paper's three strategies.
//!
//! With S the set of k indices and λ_j = Δ ∏_{j'∈S∖{j}} j'/(j'−j) (an integer), w = ∏ x_j^{2λ_j}
//! satisfies w^e = x^{4Δ²}. Since gcd(4Δ², e) = 1, a·4Δ² + b·e = 1 gives y = w^a x^b with
//! y^e = x. This holds for every x in Z_N*, whatever its Jacobi symbol, because every exponent
//! applied to x carries a factor 4.

use std::collections::HashSet;

use crypto_bigint::modular::BoxedMontyForm;
use crypto_bigint::BoxedUint;
use num_bigint::{BigInt, BigUint};
use num_traits::{One, Signed};
use serde::{Deserialize, Serialize};

use crate::exp;
use crate::keys::split_sign;
use crate::share::{check_cheap, check_structure, message_matches};
use crate::util::{from_boxed, to_boxed, to_fixed_be};
use crate::{CombineError, Message, PublicKey, ShareError, SignatureShare};

/// An RSA signature: |N| big-endian bytes, as it goes into an RRSIG.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Signature(pub Vec<u8>);

impl Signature {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// A successful combination: the signature, the indices combined, the indices known bad.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Combined {
    pub signature: Signature,
    pub used: Vec<u16>,
    /// Shares proven bad (structure, proof, or failed combination with k-1 known good shares).
    pub bad: Vec<u16>,
    /// Number of k-subsets combined.
    pub attempts: u64,
}

/// λ_{0,j}^S = Δ ∏_{j' ∈ S, j' ≠ j} j' / (j' - j), exact because Δ = n! absorbs the denominator.
pub(crate) fn lagrange(indices: &[u16], j: u16, delta: &BigUint) -> BigInt {
    let mut numerator = BigInt::from(delta.clone());
    let mut denominator = BigInt::one();
    for &other in indices.iter().filter(|&&o| o != j) {
        numerator *= i64::from(other);
        denominator *= i64::from(other) - i64::from(j);
    }
    numerator / denominator
}

/// Montgomery form of a public value below N.
pub(crate) fn monty(pk: &PublicKey, x: &BigUint) -> Option<BoxedMontyForm> {
    to_boxed(x, pk.precision()).map(|b| BoxedMontyForm::new(b, &pk.params))
}

/// base^exponent for a public exponent (time depends only on the exponent's bit length).
pub(crate) fn pow_public(base: &BoxedMontyForm, exponent: &BigUint) -> BoxedMontyForm {
    let boxed = BoxedUint::from_be_slice_vartime(&exponent.to_bytes_be());
    base.pow_bounded_exp(&boxed, exponent.bits() as u32)
}

/// Whether y^e = x, in Montgomery form.
fn is_signature(pk: &PublicKey, y: &BoxedMontyForm, x: &BigUint) -> bool {
    let e = BigUint::from(pk.e);
    from_boxed(&pow_public(y, &e).retrieve()) == *x
}

/// Combines exactly these shares (k of them, distinct, cheap-checked). Fails with
/// `Verification` when the result is not a signature on `msg`.
///
/// All public arithmetic runs on Montgomery forms with the key's cached parameters, and the
/// negative exponents (of λ_j, a, b) are gathered in one denominator: one inversion in total.
fn combine_exact(pk: &PublicKey, msg: &Message, shares: &[&SignatureShare]) -> Result<Signature, CombineError> {
    let used: Vec<u16> = shares.iter().map(|s| s.index).collect();
    let failed = || CombineError::Verification { used: used.clone() };
    // w = ∏ x_j^{2λ_j}; y = w^a x^b, so x_j's exponent is 2λ_j·a and x's is b. Every exponent
    // is small (λ_j up to Δ times a product of indices, |a| < e, |b| < 4Δ²): one modexp per
    // share and one for x, the negative ones gathered in one denominator.
    let (a_negative, a) = split_sign(&pk.euclid_a);
    let (b_negative, b) = split_sign(&pk.euclid_b);
    let mut exponents = Vec::with_capacity(shares.len() + 1);
    for share in shares {
        let lambda = lagrange(&used, share.index, &pk.delta);
        exponents.push(((lambda.magnitude() << 1u32) * &a, lambda.is_negative() != a_negative));
    }
    let mut terms: Vec<(&BigUint, &BigUint, bool)> = shares.iter().zip(&exponents).map(|(s, (e, neg))| (&s.value, e, *neg)).collect();
    terms.push((&msg.x, &b, b_negative));
    let y = exp::public_product(&terms, &pk.n).map_err(|_| failed())?.ok_or_else(failed)?;
    if exp::pow_public(&y, &BigUint::from(pk.e), &pk.n).map_err(|_| failed())? != msg.x {
        return Err(failed());
    }
    Ok(Signature(to_fixed_be(&y, pk.bytes).ok_or_else(failed)?))
}

fn check_duplicates(shares: &[SignatureShare]) -> Result<(), CombineError> {
    let mut seen = HashSet::new();
    for share in shares {
        if !seen.insert(share.index) {
            return Err(CombineError::DuplicateIndex(share.index));
        }
    }
    Ok(())
}

/// Splits shares into those passing the cheap structural checks and the indices of the rest.
fn triage<'a>(pk: &PublicKey, shares: &'a [SignatureShare]) -> (Vec<&'a SignatureShare>, Vec<u16>) {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for share in shares {
        match check_cheap(pk, share) {
            Ok(()) => ok.push(share),
            Err(_) => bad.push(share.index),
        }
    }
    (ok, bad)
}

impl PublicKey {
    /// Combines the first k shares. Each defect is a typed error; use the `combine_*` strategy
    /// functions to combine in the presence of faulty players.
    pub fn combine(&self, msg: &Message, shares: &[SignatureShare]) -> Result<Signature, CombineError> {
        message_matches(self, msg)?;
        check_duplicates(shares)?;
        let k = usize::from(self.threshold);
        let chosen = shares.get(..k).ok_or(CombineError::NotEnoughShares { have: shares.len(), need: k })?;
        for share in chosen {
            check_cheap(self, share)?;
        }
        let refs: Vec<&SignatureShare> = chosen.iter().collect();
        combine_exact(self, msg, &refs).map_err(|err| {
            // Name a share outside Z_N* if there is one; the gcd is paid only on failure.
            chosen.iter().find_map(|s| check_structure(self, s).err()).map_or(err, CombineError::InvalidShare)
        })
    }

    /// Whether `signature` is a valid RSA signature (s^e = x mod N) on `msg`.
    pub fn verify(&self, msg: &Message, signature: &Signature) -> bool {
        if msg.fingerprint != self.fingerprint || signature.0.len() != self.bytes {
            return false;
        }
        let s = BigUint::from_bytes_be(&signature.0);
        s < self.n && monty(self, &s).is_some_and(|y| is_signature(self, &y, &msg.x))
    }
}

/// BASIC: verify each share's proof (in order) until k are valid, then combine those.
/// Shares without or with a failing proof, or malformed, are reported in `bad`.
pub fn combine_basic(pk: &PublicKey, msg: &Message, shares: &[SignatureShare]) -> Result<Combined, CombineError> {
    message_matches(pk, msg)?;
    check_duplicates(shares)?;
    let k = usize::from(pk.threshold);
    let mut valid = Vec::new();
    let mut bad = Vec::new();
    for share in shares {
        if valid.len() == k {
            break;
        }
        match pk.verify_share(msg, share) {
            Ok(()) => valid.push(share),
            Err(_) => bad.push(share.index),
        }
    }
    if valid.len() < k {
        return Err(CombineError::NotEnoughValidShares { valid: valid.len(), need: k, bad });
    }
    let signature = combine_exact(pk, msg, &valid)?;
    Ok(Combined { signature, used: valid.iter().map(|s| s.index).collect(), bad, attempts: 1 })
}

/// OPT-PROOF: combine the first k well-formed shares without looking at proofs and check the
/// signature. If that fails and at least k shares carry proofs, behaves like BASIC on those;
/// otherwise returns `NeedProofs` (ask the players for shares with proofs, then call again).
/// If every share carries a proof, this is BASIC.
pub fn combine_opt_proof(pk: &PublicKey, msg: &Message, shares: &[SignatureShare]) -> Result<Combined, CombineError> {
    message_matches(pk, msg)?;
    check_duplicates(shares)?;
    if !shares.is_empty() && shares.iter().all(|s| s.proof.is_some()) {
        return combine_basic(pk, msg, shares);
    }
    let k = usize::from(pk.threshold);
    let (ok, bad) = triage(pk, shares);
    let chosen = ok.get(..k).ok_or(CombineError::NotEnoughShares { have: ok.len(), need: k })?;
    match combine_exact(pk, msg, chosen) {
        Ok(signature) => Ok(Combined { signature, used: chosen.iter().map(|s| s.index).collect(), bad, attempts: 1 }),
        Err(_) => {
            let proven: Vec<SignatureShare> = shares.iter().filter(|s| s.proof.is_some()).cloned().collect();
            if proven.len() >= k {
                let mut combined = combine_basic(pk, msg, &proven)?;
                combined.bad.extend(bad);
                combined.bad.sort_unstable();
                combined.bad.dedup();
                return Ok(combined);
            }
            Err(CombineError::NeedProofs { used: chosen.iter().map(|s| s.index).collect(), bad })
        }
    }
}

/// Binomial coefficient, saturating.
pub fn binomial(n: u64, k: u64) -> u64 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    (0..k).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

/// Advances `combo` (strictly increasing positions below `m`) to the next k-subset in
/// lexicographic order; false when exhausted.
fn next_combination(combo: &mut [usize], m: usize) -> bool {
    let k = combo.len();
    for i in (0..k).rev() {
        if combo[i] < m - k + i {
            combo[i] += 1;
            for j in i + 1..k {
                combo[j] = combo[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

/// OPT-TE: try k-subsets (lexicographic, over the first max(2t+1, k) well-formed shares) until
/// the combination verifies; never more than C(max(2t+1, k), k) attempts (C(2t+1, t+1) for the
/// default threshold). Shares carrying a proof are
/// checked first and dropped if it fails. After a success that followed a failed attempt, each
/// remaining share is tested by one combination with k-1 shares of the successful subset, so
/// `bad` names every faulty share received. With no failed attempt nothing more is spent.
/// Returns `NeedMoreShares` when no subset works yet.
pub fn combine_opt_te(pk: &PublicKey, msg: &Message, shares: &[SignatureShare]) -> Result<Combined, CombineError> {
    message_matches(pk, msg)?;
    check_duplicates(shares)?;
    let k = usize::from(pk.threshold);
    let (mut candidates, mut bad) = triage(pk, shares);
    candidates.retain(|s| match s.proof {
        Some(_) if pk.verify_share(msg, s).is_err() => {
            bad.push(s.index);
            false
        }
        _ => true,
    });
    let window = (2 * usize::from(pk.max_faults()) + 1).max(k);
    // Hard cap, also across the restart after dropping shares outside Z_N*.
    let max_attempts = binomial(window as u64, k as u64);
    let mut attempts: u64 = 0;
    let mut gcd_checked = false;
    'search: loop {
        let m = candidates.len().min(window);
        if m < k {
            break;
        }
        let mut combo: Vec<usize> = (0..k).collect();
        while attempts < max_attempts {
            let subset: Vec<&SignatureShare> = combo.iter().map(|&i| candidates[i]).collect();
            attempts += 1;
            match combine_exact(pk, msg, &subset) {
                Ok(signature) => {
                    let used: Vec<u16> = subset.iter().map(|s| s.index).collect();
                    if attempts > 1 {
                        classify_rest(pk, msg, &subset, &candidates, &mut bad);
                    }
                    bad.sort_unstable();
                    bad.dedup();
                    return Ok(Combined { signature, used, bad, attempts });
                }
                Err(_) if !gcd_checked => {
                    // One-time full structural check: drop shares outside Z_N* and restart.
                    gcd_checked = true;
                    let before = candidates.len();
                    candidates.retain(|s| match check_structure(pk, s) {
                        Ok(()) => true,
                        Err(_) => {
                            bad.push(s.index);
                            false
                        }
                    });
                    if candidates.len() != before {
                        continue 'search;
                    }
                }
                Err(_) => {}
            }
            if !next_combination(&mut combo, m) {
                break;
            }
        }
        break;
    }
    bad.sort_unstable();
    bad.dedup();
    Err(CombineError::NeedMoreShares { have: shares.len(), need: k, attempts, bad })
}

/// Tests every candidate outside the good subset against k-1 known good shares.
fn classify_rest(pk: &PublicKey, msg: &Message, good: &[&SignatureShare], candidates: &[&SignatureShare], bad: &mut Vec<u16>) {
    let base = &good[..good.len() - 1];
    for share in candidates {
        if good.iter().any(|g| g.index == share.index) {
            continue;
        }
        let mut trial: Vec<&SignatureShare> = base.to_vec();
        trial.push(share);
        if combine_exact(pk, msg, &trial).is_err() {
            bad.push(share.index);
        }
    }
}

/// For callers that need the error type of a single share.
pub fn check_share_structure(pk: &PublicKey, share: &SignatureShare) -> Result<(), ShareError> {
    check_structure(pk, share)
}
