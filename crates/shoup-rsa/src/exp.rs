//! Modular exponentiation backends, measured side by side in `benches/shoup.rs`.
//!
//! - Secret exponents (s_i, the proof nonce r): OpenSSL's `BN_mod_exp_mont_consttime` (fixed
//!   window, cache-timing-resistant table gathers, Montgomery multiplication in assembly),
//!   reached through the `openssl` crate's `BN_FLG_CONSTTIME` flag. It runs about 3x faster than
//!   crypto-bigint's constant-time `pow` on 2048-bit moduli. OpenSSL loops over every limb the
//!   exponent occupies (`p->top * 64` bits), so its running time reveals at most whether the
//!   top 64-bit limb of the secret is zero: for s_i, uniform below p'q' (|N| - 2 bits), that is
//!   a 2^-62 event fixed per key, and r is |N| + 512 bits drawn from a hash.
//! - Public exponents: OpenSSL's ordinary `BN_mod_exp`.
//! - Powers of the fixed verification base v: [`FixedBase`], a table of v^{d 2^{6j}} on the
//!   key's crypto-bigint Montgomery parameters. v^r then costs one multiplication per 6-bit
//!   digit of r and no squaring. Secret digits select their entry by scanning the whole column
//!   with masks (constant time); public digits index it directly.

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::BoxedUint;
use num_bigint::BigUint;
use openssl::bn::{BigNum, BigNumContext};
use zeroize::Zeroizing;

use crate::util::{from_boxed, to_boxed};
use crate::Error;

fn backend(e: openssl::error::ErrorStack) -> Error {
    Error::Backend(e.to_string())
}

/// A BigNum holding secret material: wiped before it is freed (the openssl crate's drop only
/// frees).
struct SecretBn(BigNum);

impl Drop for SecretBn {
    fn drop(&mut self) {
        self.0.clear();
    }
}

fn bn(value: &BigUint) -> Result<BigNum, Error> {
    BigNum::from_slice(&value.to_bytes_be()).map_err(backend)
}

fn big(value: &BigNum) -> BigUint {
    BigUint::from_bytes_be(&value.to_vec())
}

/// base^secret mod n in constant time in `secret` (see module docs).
pub(crate) fn pow_secret(base: &BigUint, secret: &BoxedUint, n: &BigUint) -> Result<BigUint, Error> {
    let bytes = Zeroizing::new(secret.to_be_bytes());
    let mut exponent = SecretBn(BigNum::from_slice(&bytes).map_err(backend)?);
    exponent.0.set_const_time();
    let mut modulus = bn(n)?;
    modulus.set_const_time();
    let mut ctx = BigNumContext::new().map_err(backend)?;
    let mut out = SecretBn(BigNum::new().map_err(backend)?);
    let base = bn(base)?;
    out.0.mod_exp(&base, &exponent.0, &modulus, &mut ctx).map_err(backend)?;
    Ok(big(&out.0))
}

/// base^exponent mod n for a public exponent (variable time).
pub(crate) fn pow_public(base: &BigUint, exponent: &BigUint, n: &BigUint) -> Result<BigUint, Error> {
    let mut ctx = BigNumContext::new().map_err(backend)?;
    let mut out = BigNum::new().map_err(backend)?;
    let (base, exponent, n) = (bn(base)?, bn(exponent)?, bn(n)?);
    out.mod_exp(&base, &exponent, &n, &mut ctx).map_err(backend)?;
    Ok(big(&out))
}

/// The public arithmetic of a combination on OpenSSL's variable-time Montgomery code (every
/// input is public: the shares, their Lagrange coefficients, a, b and the message), about 3x
/// faster per multiplication than crypto-bigint's: ∏ bases[j]^exponents[j] · ∏ over the
/// negative ones inverted, that is numerator / denominator with one inversion. `None` when
/// a base is not below n or the denominator has no inverse (a share outside Z_N*).
pub(crate) fn public_product(terms: &[(&BigUint, &BigUint, bool)], n: &BigUint) -> Result<Option<BigUint>, Error> {
    let mut ctx = BigNumContext::new().map_err(backend)?;
    let modulus = bn(n)?;
    let mut numerator = BigNum::from_u32(1).map_err(backend)?;
    let mut denominator = BigNum::from_u32(1).map_err(backend)?;
    let mut term = BigNum::new().map_err(backend)?;
    let mut product = BigNum::new().map_err(backend)?;
    for &(base, exponent, negative) in terms {
        if base >= n {
            return Ok(None);
        }
        let (base, exponent) = (bn(base)?, bn(exponent)?);
        term.mod_exp(&base, &exponent, &modulus, &mut ctx).map_err(backend)?;
        let into = if negative { &mut denominator } else { &mut numerator };
        product.mod_mul(into, &term, &modulus, &mut ctx).map_err(backend)?;
        std::mem::swap(into, &mut product);
    }
    let mut inverse = BigNum::new().map_err(backend)?;
    if inverse.mod_inverse(&denominator, &modulus, &mut ctx).is_err() {
        return Ok(None);
    }
    product.mod_mul(&numerator, &inverse, &modulus, &mut ctx).map_err(backend)?;
    Ok(Some(big(&product)))
}

/// 6-bit digits: 428 multiplications for a 2560-bit exponent (4-bit digits: 642), for a
/// column scan of 64 entries (vectorised masks, cheap next to a multiplication) and a 7 MB
/// table for a 2048-bit key.
const WINDOW: u32 = 6;
const ENTRIES: usize = 1 << WINDOW;

/// Precomputed powers of a fixed base g: column j holds g^{d 2^{6j}} for d = 0..64, in
/// Montgomery form, as flat limbs.
pub(crate) struct FixedBase {
    params: BoxedMontyParams,
    limbs: usize,
    columns: usize,
    /// columns * ENTRIES * limbs words.
    table: Vec<u64>,
}

impl FixedBase {
    /// Table for exponents of up to `max_bits` bits. Costs 64 multiplications per 6 bits.
    pub(crate) fn new(base: &BigUint, params: &BoxedMontyParams, max_bits: u32) -> Option<FixedBase> {
        let precision = params.modulus().bits_precision();
        let limbs = (precision / 64) as usize;
        let columns = max_bits.div_ceil(WINDOW) as usize;
        let mut table = Vec::with_capacity(columns * ENTRIES * limbs);
        let mut g = BoxedMontyForm::new(to_boxed(base, precision)?, params);
        let one = BoxedMontyForm::one(params);
        for _ in 0..columns {
            let mut acc = one.clone();
            for _ in 0..ENTRIES {
                // u64::from: a no-op where a limb is 64 bits, a widening where it is 32.
                #[allow(clippy::useless_conversion)]
                table.extend(acc.as_montgomery().as_words().iter().map(|w| u64::from(*w)));
                acc *= &g;
            }
            // acc = g^64: the base of the next column.
            g = acc;
        }
        Some(FixedBase { params: params.clone(), limbs, columns, table })
    }

    /// Digit j (bits 6j..6j+6) of a little-endian word array; the same memory accesses
    /// whatever the values.
    fn digit(words: &[u64], j: usize) -> u32 {
        let bit = j * WINDOW as usize;
        let (index, shift) = (bit / 64, bit % 64);
        let low = words.get(index).copied().unwrap_or(0) >> shift;
        // The bits that spill into the next word (none when the digit fits).
        let high = match shift {
            0 => 0,
            _ => words.get(index + 1).copied().unwrap_or(0) << (64 - shift),
        };
        ((low | high) & (ENTRIES as u64 - 1)) as u32
    }

    fn entry(&self, column: usize, digit: usize) -> &[u64] {
        let start = (column * ENTRIES + digit) * self.limbs;
        &self.table[start..start + self.limbs]
    }

    fn form(&self, limbs: &[u64]) -> BoxedMontyForm {
        let words: Vec<_> = limbs.iter().map(|w| *w as crypto_bigint::Word).collect();
        BoxedMontyForm::from_montgomery(BoxedUint::from_words(words), &self.params)
    }

    /// g^exponent, constant time in `exponent` for a given table (`None` if it is too long).
    pub(crate) fn pow_secret(&self, exponent: &BoxedUint) -> Option<BoxedMontyForm> {
        #[allow(clippy::useless_conversion)] // as in `new`: limbs may be 32 bits
        let words: Zeroizing<Vec<u64>> = Zeroizing::new(exponent.as_words().iter().map(|w| u64::from(*w)).collect());
        if exponent.bits_precision() as usize > self.columns * WINDOW as usize {
            return None;
        }
        let mut acc = BoxedMontyForm::one(&self.params);
        let mut picked = Zeroizing::new(vec![0u64; self.limbs]);
        for column in 0..self.columns {
            let digit = Self::digit(&words, column);
            picked.iter_mut().for_each(|w| *w = 0);
            for d in 0..ENTRIES {
                let mask = std::hint::black_box(eq_mask(d as u32, digit));
                for (out, w) in picked.iter_mut().zip(self.entry(column, d)) {
                    *out |= w & mask;
                }
            }
            acc *= &self.form(&picked);
        }
        Some(acc)
    }

    /// g^exponent for a public exponent (`None` if it is too long).
    pub(crate) fn pow_public(&self, exponent: &BigUint) -> Option<BoxedMontyForm> {
        if exponent.bits() > (self.columns * WINDOW as usize) as u64 {
            return None;
        }
        let words = exponent.to_u64_digits();
        let mut acc = BoxedMontyForm::one(&self.params);
        for column in 0..self.columns {
            let digit = Self::digit(&words, column) as usize;
            if digit != 0 {
                acc *= &self.form(self.entry(column, digit));
            }
        }
        Some(acc)
    }
}

/// All ones when a == b, else zero, without a branch on the values.
fn eq_mask(a: u32, b: u32) -> u64 {
    let x = u64::from(a ^ b);
    ((x | x.wrapping_neg()) >> 63).wrapping_sub(1)
}

/// Montgomery form to BigUint.
pub(crate) fn retrieve(x: &BoxedMontyForm) -> BigUint {
    from_boxed(&x.retrieve())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_cross_word_boundaries() {
        // Bits 60..66 span two words.
        let words = [0xA000_0000_0000_0000u64 | 0x5, 0x3];
        assert_eq!(FixedBase::digit(&words, 0), 0x5);
        assert_eq!(FixedBase::digit(&words, 10), 0b11_1010);
        assert_eq!(FixedBase::digit(&words, 11), 0);
        assert_eq!(FixedBase::digit(&words, 40), 0);
    }

    #[test]
    fn eq_mask_is_exact() {
        for a in 0..20 {
            for b in 0..20 {
                assert_eq!(eq_mask(a, b), if a == b { u64::MAX } else { 0 });
            }
        }
    }
}
