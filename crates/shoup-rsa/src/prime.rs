//! Safe prime generation: p = 2q + 1 with p and q prime.
//!
//! Candidates q are sieved in windows by all odd primes below 2^16, striking both q ≡ 0 and
//! 2q + 1 ≡ 0 (mod r) at once, so only pairs where neither has a small factor reach a modular
//! exponentiation. A survivor gets a base-2 Fermat test on q, then on p, then Miller-Rabin on q.
//! Once q is prime, p's base-2 Fermat test is a proof (Pocklington with a = 2: q | p - 1,
//! q > sqrt(p), 2^(p-1) ≡ 1 and gcd(2^2 - 1, p) = 1 because the sieve removed p ≡ 0 mod 3).

use std::sync::OnceLock;

use num_bigint::BigUint;
use num_integer::Integer;
use num_traits::One;
use rand_core::Rng;

use crate::Error;

/// Sieve by the odd primes below 2^22 (about 295,000): each doubling of ln(limit) halves the
/// number of exponentiations per safe prime twice over, since both q and 2q+1 are sieved.
const SIEVE_LIMIT: u32 = 1 << 22;
const WINDOW: usize = 1 << 16;
const WINDOWS_PER_START: u64 = 64;
/// Miller-Rabin rounds with random bases on q (error below 2^-100 for random candidates).
const MR_ROUNDS: usize = 24;
/// Bound on sieve windows per prime (each window covers 2^16 candidates).
pub(crate) const MAX_WINDOWS: u64 = 1 << 16;

/// What a prime search reports (sent from worker threads to the caller's callback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A sieve survivor failed the test on q or p.
    Rejected,
    /// q passed its Fermat test and p is being tested.
    QPassed,
    Found,
}

fn small_primes() -> &'static [u32] {
    static PRIMES: OnceLock<Vec<u32>> = OnceLock::new();
    PRIMES.get_or_init(|| {
        let limit = SIEVE_LIMIT as usize;
        let mut composite = vec![false; limit];
        let mut primes = Vec::new();
        for i in 2..limit {
            if !composite[i] {
                if i > 2 {
                    primes.push(i as u32);
                }
                let mut j = i * i;
                while j < limit {
                    composite[j] = true;
                    j += i;
                }
            }
        }
        primes
    })
}

fn random_bits(rng: &mut (impl Rng + ?Sized), bits: u32) -> BigUint {
    let mut bytes = vec![0u8; bits.div_ceil(8) as usize];
    rng.fill_bytes(&mut bytes);
    let excess = bytes.len() as u32 * 8 - bits;
    if let Some(first) = bytes.first_mut() {
        *first &= 0xff >> excess;
    }
    BigUint::from_bytes_be(&bytes)
}

/// Uniform in [2, n - 2] (n > 4), for Miller-Rabin bases.
fn random_base(rng: &mut (impl Rng + ?Sized), n: &BigUint) -> BigUint {
    let bits = n.bits() as u32;
    let three = BigUint::from(3u32);
    loop {
        let a = random_bits(rng, bits);
        if a >= BigUint::from(2u32) && a <= n - &three {
            return a;
        }
    }
}

fn fermat_base2(n: &BigUint) -> bool {
    BigUint::from(2u32).modpow(&(n - 1u32), n).is_one()
}

pub(crate) fn miller_rabin(n: &BigUint, rounds: usize, rng: &mut (impl Rng + ?Sized)) -> bool {
    if n < &BigUint::from(5u32) {
        return n == &BigUint::from(2u32) || n == &BigUint::from(3u32);
    }
    if n.is_even() {
        return false;
    }
    let n_minus_1 = n - 1u32;
    let s = n_minus_1.trailing_zeros().unwrap_or(0);
    let d = &n_minus_1 >> s;
    'rounds: for _ in 0..rounds {
        let a = random_base(rng, n);
        let mut x = a.modpow(&d, n);
        if x.is_one() || x == n_minus_1 {
            continue;
        }
        for _ in 1..s {
            x = (&x * &x) % n;
            if x == n_minus_1 {
                continue 'rounds;
            }
        }
        return false;
    }
    true
}

/// x mod r for x given as big-endian u32 digits.
fn rem_small(digits_be: &[u32], r: u32) -> u32 {
    let r = u64::from(r);
    digits_be.iter().fold(0u64, |rem, &d| ((rem << 32) | u64::from(d)) % r) as u32
}

/// Returns a safe prime p of exactly `bits` bits whose two top bits are set (so the product of
/// two such primes has exactly 2*bits bits).
///
/// The search starts at a random q0 and walks windows of consecutive odd candidates upwards,
/// updating each small prime's residue incrementally, and restarts from a fresh random q0
/// every `WINDOWS_PER_START` windows.
pub(crate) fn safe_prime(bits: u32, rng: &mut (impl Rng + ?Sized), report: &mut dyn FnMut(Event)) -> Result<BigUint, Error> {
    debug_assert!(bits >= 64);
    let primes = small_primes();
    let q_bits = bits - 1;
    let mut sieve = vec![true; WINDOW];
    // 2 * WINDOW mod r: the residue step from one window to the next.
    let steps: Vec<u32> = primes.iter().map(|&r| ((2 * WINDOW as u64) % u64::from(r)) as u32).collect();
    let mut windows: u64 = 0;
    while windows < MAX_WINDOWS {
        // q0: q_bits bits, top two bits set, odd.
        let mut q0 = random_bits(rng, q_bits);
        q0 |= BigUint::from(3u32) << (q_bits - 2);
        q0 |= BigUint::one();
        let digits: Vec<u32> = q0.iter_u32_digits().rev().collect();
        let mut residues: Vec<u32> = primes.iter().map(|&r| rem_small(&digits, r)).collect();
        for window in 0..WINDOWS_PER_START {
            windows += 1;
            let base = &q0 + BigUint::from(2 * WINDOW as u64 * window);
            sieve.fill(true);
            for (&r, &res) in primes.iter().zip(&residues) {
                strike(&mut sieve, r, res);
            }
            for (res, (&r, &step)) in residues.iter_mut().zip(primes.iter().zip(&steps)) {
                *res = ((u64::from(*res) + u64::from(step)) % u64::from(r)) as u32;
            }
            for delta in (0..WINDOW).filter(|&d| sieve[d]) {
                let q = &base + BigUint::from(2 * delta as u64);
                if q.bits() as u32 != q_bits {
                    break;
                }
                if let Some(p) = test_candidate(q, rng, report) {
                    return Ok(p);
                }
            }
        }
    }
    Err(Error::PrimeSearchExhausted(MAX_WINDOWS))
}

/// Strikes the offsets delta (candidate base + 2*delta) where r divides q or 2q + 1, given
/// res = base mod r. 2^-1 mod r is (r+1)/2.
fn strike(sieve: &mut [bool], r: u32, res: u32) {
    let (r64, res) = (u64::from(r), u64::from(res));
    let inv2 = r64.div_ceil(2);
    let kill_q = ((r64 - res) % r64) * inv2 % r64;
    let kill_p = (((r64 - 1) / 2 + r64 - res) % r64) * inv2 % r64;
    for start in [kill_q, kill_p] {
        let mut delta = start as usize;
        while delta < sieve.len() {
            sieve[delta] = false;
            delta += r as usize;
        }
    }
}

/// Fermat base 2 on q, then on p = 2q + 1, then Miller-Rabin on q.
fn test_candidate(q: BigUint, rng: &mut (impl Rng + ?Sized), report: &mut dyn FnMut(Event)) -> Option<BigUint> {
    if !fermat_base2(&q) {
        report(Event::Rejected);
        return None;
    }
    report(Event::QPassed);
    let p: BigUint = (&q << 1u32) + 1u32;
    if !fermat_base2(&p) || !miller_rabin(&q, MR_ROUNDS, rng) {
        report(Event::Rejected);
        return None;
    }
    report(Event::Found);
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    #[test]
    fn miller_rabin_classifies_known_numbers() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        // 2^127 - 1 is prime; Carmichael number 561 and 2^128 + 1 are not.
        let m127 = (BigUint::one() << 127u32) - 1u32;
        assert!(miller_rabin(&m127, 20, &mut rng));
        assert!(!miller_rabin(&BigUint::from(561u32), 20, &mut rng));
        assert!(!miller_rabin(&((BigUint::one() << 128u32) + 1u32), 20, &mut rng));
        assert!(miller_rabin(&BigUint::from(65537u32), 20, &mut rng));
    }

    #[test]
    fn safe_prime_is_safe_and_has_top_bits() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let mut events = Vec::new();
        let p = safe_prime(256, &mut rng, &mut |e| events.push(e)).unwrap();
        assert_eq!(p.bits(), 256);
        assert!(p.bit(254) && p.bit(255));
        let q = (&p - 1u32) >> 1u32;
        assert!(miller_rabin(&p, 30, &mut rng));
        assert!(miller_rabin(&q, 30, &mut rng));
        assert_eq!(events.last(), Some(&Event::Found));
    }
}
