//! Conversions between num-bigint (public arithmetic) and crypto-bigint (constant-time secret
//! arithmetic), hex and base64 text, fixed-width big-endian encodings; the player limit that keys and
//! errors both name.

use crypto_bigint::BoxedUint;
use num_bigint::BigUint;
use zeroize::Zeroizing;

/// Largest number of players (Δ = n! stays a few thousand bits).
pub const MAX_PLAYERS: u16 = 255;

/// Limb-rounded precision (bits) of a value of `bits` bits.
pub(crate) fn precision(bits: u32) -> u32 {
    bits.div_ceil(64).max(1) * 64
}

/// `value` as exactly `len` big-endian bytes; `None` if it does not fit.
pub(crate) fn to_fixed_be(value: &BigUint, len: usize) -> Option<Vec<u8>> {
    let bytes = value.to_bytes_be();
    if bytes.len() > len {
        return None;
    }
    let mut out = vec![0u8; len];
    out[len - bytes.len()..].copy_from_slice(&bytes);
    Some(out)
}

/// Public BigUint to BoxedUint of the given precision (the value must fit; callers check).
pub(crate) fn to_boxed(value: &BigUint, bits_precision: u32) -> Option<BoxedUint> {
    let bytes = Zeroizing::new(value.to_bytes_be());
    BoxedUint::from_be_slice(&bytes, bits_precision).ok()
}

pub(crate) fn from_boxed(value: &BoxedUint) -> BigUint {
    let bytes = Zeroizing::new(value.to_be_bytes());
    BigUint::from_bytes_be(&bytes)
}

pub(crate) fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

pub(crate) fn hex_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    text.chunks_exact(2).map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?)).collect()
}

pub(crate) fn big_to_hex(value: &BigUint) -> String {
    hex_encode(&value.to_bytes_be())
}

pub(crate) fn hex_to_big(text: &str) -> Option<BigUint> {
    if text.is_empty() {
        return None;
    }
    hex_decode(text).map(|b| BigUint::from_bytes_be(&b))
}

/// Standard base64 with padding (RFC 4648), as in DNSKEY presentation format.
pub(crate) fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let group = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((group >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Serde adapter: BigUint as a lower-case hex string.
pub(crate) mod serde_hex {
    use num_bigint::BigUint;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &BigUint, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::big_to_hex(value))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BigUint, D::Error> {
        let text = String::deserialize(d)?;
        super::hex_to_big(&text).ok_or_else(|| serde::de::Error::custom("invalid hex number"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let cases = [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")];
        for (plain, encoded) in cases {
            assert_eq!(base64_encode(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn hex_round_trip_and_rejects_junk() {
        let v = BigUint::from(0x1234_5678_9abc_def0u64);
        assert_eq!(hex_to_big(&big_to_hex(&v)), Some(v));
        assert_eq!(hex_decode("0g"), None);
        assert_eq!(hex_decode("abc"), None);
        assert_eq!(hex_to_big(""), None);
    }
}
