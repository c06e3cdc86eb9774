//! DNSSEC arithmetic on wire values: a DNSKEY's key tag and DS digest, and an RRSIG's
//! validity window.
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

/// DS digest type 2 (SHA-256, RFC 4509).
pub const DS_DIGEST_SHA256: u8 = 2;

/// RFC 4509 DS digest (type 2) of a DNSKEY: SHA-256 over the owner name in canonical wire
/// form (uncompressed, lower case: the caller's job) followed by the DNSKEY rdata. The same
/// for every DNSKEY algorithm.
pub fn ds_sha256(owner_wire: &[u8], dnskey_rdata: &[u8]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(owner_wire);
    ctx.update(dnskey_rdata);
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
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

    #[test]
    fn ds_digest_and_key_tag_match_rfc4509s_example() {
        // RFC 4509 section 2.3: dskey.example.com. DNSKEY 256 3 5 ..., key id 60485.
        let key = "AQOeiiR0GOMYkDshWoSKz9XzfwJr1AYtsmx3TGkJaNXVbfi/2pHm822aJ5iI9BMzNXxeYCmZDRD99WYwYqUSdjMmmAphXdvx\
                   egXd/M5+X7OrzKBaMbCVdFLUUh6DhweJBjEVv5f2wwjM9XzcnOf+EPbtG9DMBmADjFDc2w/rljwvFw==";
        let mut rdata = vec![1, 0, 3, 5];
        rdata.extend(base64::Engine::decode(&base64::engine::general_purpose::STANDARD, key).unwrap());
        assert_eq!(key_tag(&rdata), 60485);
        let owner = b"\x05dskey\x07example\x03com\x00";
        let hex: String = ds_sha256(owner, &rdata).iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(hex, "D4B7D520E7BB5F0F67674A0CCEB1E3E0614B93C4F9E99B8383F6A1E4469DA50A");
    }
}
