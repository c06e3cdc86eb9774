//! The public key as DNSSEC records: DNSKEY rdata (RFC 4034 2.1, RFC 3110 key encoding), key
//! tag (RFC 4034 Appendix B), BIND's K<zone>+<alg>+<tag>.key file and a SHA-256 DS record.

use sha2::{Digest, Sha256};

use crate::util::{base64_encode, hex_encode};
use crate::{Error, HashAlg, PublicKey};

/// DNSKEY flags of a zone-signing key.
pub const FLAGS_ZSK: u16 = 256;
/// DNSKEY flags of a key-signing key (SEP bit set).
pub const FLAGS_KSK: u16 = 257;

fn check_alg(alg: u8) -> Result<(), Error> {
    HashAlg::from_dnssec_alg(alg).map(|_| ()).ok_or(Error::Algorithm(alg))
}

/// A zone name as lower-case, dot-terminated text and canonical wire form. Plain labels only:
/// escapes (backslash) are refused rather than interpreted.
fn zone_name(zone: &str) -> Result<(String, Vec<u8>), Error> {
    let fail = |reason| Error::ZoneName { name: zone.to_string(), reason };
    let lower = zone.to_ascii_lowercase();
    let trimmed = lower.strip_suffix('.').unwrap_or(&lower);
    let mut wire = Vec::new();
    if !trimmed.is_empty() {
        for label in trimmed.split('.') {
            if label.is_empty() {
                return Err(fail("empty label"));
            }
            if label.len() > 63 {
                return Err(fail("label longer than 63 bytes"));
            }
            if !label.bytes().all(|b| b.is_ascii_graphic() && b != b'\\' && b != b'/') {
                return Err(fail("label has a character other than printable ASCII (no escapes)"));
            }
            wire.push(label.len() as u8);
            wire.extend_from_slice(label.as_bytes());
        }
    }
    wire.push(0);
    if wire.len() > 255 {
        return Err(fail("name longer than 255 bytes"));
    }
    Ok((format!("{trimmed}."), wire))
}

impl PublicKey {
    /// RFC 3110 public key field: exponent length, exponent, modulus.
    pub fn rfc3110_key(&self) -> Vec<u8> {
        let exponent = num_bigint::BigUint::from(self.e).to_bytes_be();
        let mut out = Vec::with_capacity(4 + self.bytes);
        if exponent.len() <= 255 {
            out.push(exponent.len() as u8);
        } else {
            out.push(0);
            out.extend_from_slice(&(exponent.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(&exponent);
        out.extend_from_slice(&self.n.to_bytes_be());
        out
    }

    /// DNSKEY rdata: flags, protocol 3, algorithm, public key.
    pub fn dnskey_rdata(&self, flags: u16, alg: u8) -> Result<Vec<u8>, Error> {
        check_alg(alg)?;
        let mut rdata = flags.to_be_bytes().to_vec();
        rdata.push(3);
        rdata.push(alg);
        rdata.extend(self.rfc3110_key());
        Ok(rdata)
    }

    /// The key tag of RFC 4034 Appendix B.
    pub fn key_tag(&self, flags: u16, alg: u8) -> Result<u16, Error> {
        let rdata = self.dnskey_rdata(flags, alg)?;
        let mut accumulator: u32 = 0;
        for (i, byte) in rdata.iter().enumerate() {
            accumulator += if i % 2 == 0 { u32::from(*byte) << 8 } else { u32::from(*byte) };
        }
        accumulator += (accumulator >> 16) & 0xffff;
        Ok((accumulator & 0xffff) as u16)
    }

    /// The DNSKEY record in presentation format (one line, no TTL unless given).
    pub fn dnskey_record(&self, zone: &str, flags: u16, alg: u8, ttl: Option<u32>) -> Result<String, Error> {
        let (name, _) = zone_name(zone)?;
        check_alg(alg)?;
        let ttl = ttl.map(|t| format!("{t} ")).unwrap_or_default();
        Ok(format!("{name} {ttl}IN DNSKEY {flags} 3 {alg} {}", base64_encode(&self.rfc3110_key())))
    }

    /// BIND's public key file: (file name `K<zone>+<alg>+<tag>.key`, contents).
    pub fn bind_key_file(&self, zone: &str, flags: u16, alg: u8, ttl: Option<u32>) -> Result<(String, String), Error> {
        let (name, _) = zone_name(zone)?;
        let tag = self.key_tag(flags, alg)?;
        let kind = if flags & 1 == 1 { "key-signing" } else { "zone-signing" };
        let contents = format!(
            "; This is a {kind} key, keyid {tag}, for {name}\n\
             ; Threshold RSA (Shoup): {} players, threshold {}\n{}\n",
            self.players,
            self.threshold,
            self.dnskey_record(zone, flags, alg, ttl)?
        );
        Ok((format!("K{name}+{alg:03}+{tag:05}.key"), contents))
    }

    /// The DS record (digest type 2, SHA-256) for the parent zone / trust anchor.
    pub fn ds_record(&self, zone: &str, flags: u16, alg: u8) -> Result<String, Error> {
        let (name, wire) = zone_name(zone)?;
        let rdata = self.dnskey_rdata(flags, alg)?;
        let mut h = Sha256::new();
        h.update(&wire);
        h.update(&rdata);
        let digest = hex_encode(&h.finalize()).to_ascii_uppercase();
        Ok(format!("{name} IN DS {} {alg} 2 {digest}", self.key_tag(flags, alg)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_names_are_canonicalised_or_refused() {
        let (text, wire) = zone_name("Example.COM").unwrap();
        assert_eq!(text, "example.com.");
        assert_eq!(wire, b"\x07example\x03com\x00");
        assert_eq!(zone_name(".").unwrap().1, vec![0]);
        assert!(matches!(zone_name("a..b"), Err(Error::ZoneName { .. })));
        assert!(matches!(zone_name("a\\.b"), Err(Error::ZoneName { .. })));
        assert!(matches!(zone_name(&"x".repeat(64)), Err(Error::ZoneName { .. })));
    }
}
