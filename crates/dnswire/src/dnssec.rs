//! DNSSEC arithmetic on wire values: a DNSKEY's key tag and an RRSIG's validity window.
//!
//! Here rather than in named-glue so that the deterministic execution core (which decides
//! signature times and recognises the threshold key's signatures) needs no runtime.

/// RFC 4034 appendix B key tag of DNSKEY rdata (not for algorithm 1).
pub fn key_tag(rdata: &[u8]) -> u16 {
    let mut acc: u32 = 0;
    for (i, &b) in rdata.iter().enumerate() {
        acc = acc.wrapping_add(if i % 2 == 0 { u32::from(b) << 8 } else { u32::from(b) });
    }
    acc = acc.wrapping_add(acc >> 16);
    (acc & 0xffff) as u16
}

/// RRSIG inception and expiration, seconds since the epoch (mod 2^32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignatureTimes {
    pub inception: u32,
    pub expiration: u32,
}

impl SignatureTimes {
    /// named's own rule applied to the agreed time `t`: inception one hour
    /// back (clock skew), expiration `validity_secs` ahead.
    pub fn from_agreed(t: u32, validity_secs: u32) -> Self {
        SignatureTimes { inception: t.wrapping_sub(3600), expiration: t.wrapping_add(validity_secs) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_tag_matches_rfc4034_example_style_sum() {
        // Hand-computed: bytes 01 01 03 08 -> 0x0101 + 0x0308 = 0x0409.
        assert_eq!(key_tag(&[1, 1, 3, 8]), 0x0409);
        // Odd length and carry fold: ff ff ff -> 0xffff + 0xff00 = 0x1feff,
        // folded 0xfeff + 1 = 0xff00.
        assert_eq!(key_tag(&[0xff, 0xff, 0xff]), 0xff00);
    }
}
