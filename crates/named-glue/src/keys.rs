//! The zone's DNSKEY and its BIND key files.
//!
//! named finds a zone's keys in its key-directory as
//! `K<zone>.+<alg>+<tag>.key` (the DNSKEY record) and `.private`. For a key
//! held by the remote signer the `.private` file carries no key material,
//! only `External:` (as dnssec-importkey writes it) and the timing metadata;
//! BIND 9.18 then takes the public key from the `.key` file, and the patch
//! makes such a key count as private while SDNS_SIGNER_SOCKET is set.
//! Publish and Activate lie in the past, so named signs with the key at once.
//!
//! Algorithms: RSA (5, 7, 8, 10; RFC 3110 public key), ECDSA P-256 with SHA-256 (13,
//! RFC 6605: the point's x || y, 64 bytes) and Ed25519 (15, RFC 8080: the 32-byte
//! public key). BIND 9.18 parses External `.private` files of all of them; the key tag
//! (RFC 4034 appendix B) and the DS digest do not depend on the algorithm.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use hickory_proto::rr::Name;

use crate::time::format_timestamp;

/// DNSSEC algorithm numbers the glue knows.
pub const ALG_RSASHA1: u8 = 5;
pub const ALG_NSEC3RSASHA1: u8 = 7;
pub const ALG_RSASHA256: u8 = 8;
pub const ALG_RSASHA512: u8 = 10;
pub const ALG_ECDSAP256SHA256: u8 = 13;
pub const ALG_ED25519: u8 = 15;
/// Length of an ECDSA P-256 public key in a DNSKEY (x || y) and of its signature (r || s).
pub const ECDSAP256_KEY_LEN: usize = 64;
/// Length of an Ed25519 public key in a DNSKEY.
pub const ED25519_KEY_LEN: usize = 32;
/// Signature length of both algorithm 13 (r || s) and algorithm 15 (RFC 8032).
pub const EC_SIGNATURE_LEN: usize = 64;
/// Zone key with the SEP bit: one key signs everything (a CSK).
pub const FLAGS_KSK: u16 = 257;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error("RSA exponent of {0} bytes (without leading zeros) is out of range")]
    BadExponent(usize),
    #[error("RSA modulus of {0} bytes is out of range (64..=512)")]
    BadModulus(usize),
    #[error("algorithm {0} is not an RSA algorithm")]
    NotRsa(u8),
    #[error("DNSSEC algorithm {0} is not supported (5, 7, 8, 10, 13 and 15 are)")]
    UnsupportedAlgorithm(u8),
    #[error("a public key of algorithm {algorithm} has {expected} bytes, not {len}")]
    BadPublicKey { algorithm: u8, len: usize, expected: usize },
    #[error("io on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let first = b.iter().position(|&x| x != 0).unwrap_or(b.len());
    b.get(first..).unwrap_or_default()
}

/// RFC 3110 section 2 encoding of an RSA public key: exponent length (one
/// byte, or zero then two bytes), exponent, modulus; big-endian, no leading
/// zeros.
pub fn rsa_public_key_rfc3110(exponent: &[u8], modulus: &[u8]) -> Result<Vec<u8>, KeyError> {
    let e = strip_zeros(exponent);
    let n = strip_zeros(modulus);
    if e.is_empty() || e.len() > 4096 {
        return Err(KeyError::BadExponent(e.len()));
    }
    if n.len() < 64 || n.len() > 512 {
        return Err(KeyError::BadModulus(n.len()));
    }
    let mut out = Vec::with_capacity(3 + e.len() + n.len());
    if let Ok(len) = u8::try_from(e.len()) {
        out.push(len);
    } else {
        out.push(0);
        out.extend_from_slice(&(e.len() as u16).to_be_bytes());
    }
    out.extend_from_slice(e);
    out.extend_from_slice(n);
    Ok(out)
}

// Part of this module's key API, defined with the wire arithmetic so that the execution
// core has it without a runtime.
pub use dnswire::dnssec::key_tag;

/// A zone's public signing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneKey {
    /// Zone apex, lower case, fully qualified.
    pub zone: Name,
    pub algorithm: u8,
    pub flags: u16,
    /// The DNSKEY public key field (RFC 3110 for RSA, x || y for ECDSA, the key for Ed25519).
    pub public_key: Vec<u8>,
    pub ttl: u32,
}

/// Paths of the written key files.
#[derive(Debug, Clone)]
pub struct KeyFiles {
    pub key: PathBuf,
    pub private: PathBuf,
}

impl ZoneKey {
    /// An RSA zone key (flags 257) from the raw big-endian modulus and
    /// public exponent.
    pub fn rsa(zone: &Name, algorithm: u8, exponent: &[u8], modulus: &[u8], ttl: u32) -> Result<Self, KeyError> {
        if !is_rsa(algorithm) {
            return Err(KeyError::NotRsa(algorithm));
        }
        Self::from_dnskey_field(zone, algorithm, rsa_public_key_rfc3110(exponent, modulus)?, ttl)
    }

    /// An ECDSA P-256 / SHA-256 zone key (algorithm 13, flags 257) from the point's
    /// affine coordinates x || y, 32 bytes each, big-endian (RFC 6605 section 4; SEC 1's
    /// uncompressed form without its leading 0x04). Whether the point lies on the curve
    /// is checked by named when it loads the key.
    pub fn ecdsa_p256(zone: &Name, xy: &[u8], ttl: u32) -> Result<Self, KeyError> {
        Self::from_dnskey_field(zone, ALG_ECDSAP256SHA256, xy.to_vec(), ttl)
    }

    /// An Ed25519 zone key (algorithm 15, flags 257) from its 32-byte public key
    /// (RFC 8080 section 3, the RFC 8032 encoding).
    pub fn ed25519(zone: &Name, public: &[u8], ttl: u32) -> Result<Self, KeyError> {
        Self::from_dnskey_field(zone, ALG_ED25519, public.to_vec(), ttl)
    }

    /// A zone key (flags 257) from the DNSKEY public key field as it is on the wire,
    /// checked against the algorithm's form.
    pub fn from_dnskey_field(zone: &Name, algorithm: u8, public_key: Vec<u8>, ttl: u32) -> Result<Self, KeyError> {
        let expected = match algorithm {
            ALG_ECDSAP256SHA256 => Some(ECDSAP256_KEY_LEN),
            ALG_ED25519 => Some(ED25519_KEY_LEN),
            a if is_rsa(a) => None,
            a => return Err(KeyError::UnsupportedAlgorithm(a)),
        };
        if let Some(expected) = expected.filter(|&e| e != public_key.len()) {
            return Err(KeyError::BadPublicKey { algorithm, len: public_key.len(), expected });
        }
        if expected.is_none() {
            rsa_modulus_len(&public_key).ok_or(KeyError::BadModulus(0))?;
        }
        let mut zone = zone.to_lowercase();
        zone.set_fqdn(true);
        Ok(ZoneKey { zone, algorithm, flags: FLAGS_KSK, public_key, ttl })
    }

    /// The length of this key's signatures, which named insists on: the modulus length for
    /// RSA, 64 bytes for ECDSA P-256 (r || s) and Ed25519.
    pub fn signature_len(&self) -> usize {
        match self.algorithm {
            ALG_ECDSAP256SHA256 | ALG_ED25519 => EC_SIGNATURE_LEN,
            _ => rsa_modulus_len(&self.public_key).unwrap_or(0),
        }
    }

    /// The DS record (digest type 2, SHA-256) for the parent or a trust anchor, in zone-file form.
    pub fn ds_record(&self) -> String {
        let digest: String = self.ds_digest().iter().map(|b| format!("{b:02X}")).collect();
        format!("{} IN DS {} {} {} {digest}", self.zone_text(), self.key_tag(), self.algorithm, dnswire::dnssec::DS_DIGEST_SHA256)
    }

    /// The SHA-256 DS digest over the owner's wire form and the DNSKEY rdata.
    pub fn ds_digest(&self) -> [u8; 32] {
        use hickory_proto::serialize::binary::BinEncodable;
        // The name is lower case and absolute (see the constructors); encoding a valid Name
        // cannot fail, and an empty owner would give a wrong digest rather than a panic.
        let owner = self.zone.to_bytes().unwrap_or_default();
        dnswire::dnssec::ds_sha256(&owner, &self.rdata())
    }

    /// DNSKEY rdata: flags, protocol 3, algorithm, public key.
    pub fn rdata(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.public_key.len());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.push(3);
        out.push(self.algorithm);
        out.extend_from_slice(&self.public_key);
        out
    }

    pub fn key_tag(&self) -> u16 {
        key_tag(&self.rdata())
    }

    /// Zone name in presentation form with the trailing dot.
    pub fn zone_text(&self) -> String {
        let s = self.zone.to_ascii();
        if s.ends_with('.') {
            s
        } else {
            format!("{s}.")
        }
    }

    /// `K<zone>.+<alg>+<tag>`, as BIND names the files.
    pub fn file_stem(&self) -> String {
        format!("K{}+{:03}+{:05}", self.zone_text(), self.algorithm, self.key_tag())
    }

    fn public_key_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.public_key)
    }

    /// The DNSKEY record in zone-file form.
    pub fn dnskey_record(&self) -> String {
        format!("{} {} IN DNSKEY {} 3 {} {}", self.zone_text(), self.ttl, self.flags, self.algorithm, self.public_key_base64())
    }

    /// A `trust-anchors` statement for delv -a (or a validating resolver).
    pub fn trust_anchor(&self) -> String {
        format!("trust-anchors {{\n\t\"{}\" static-key {} 3 {} \"{}\";\n}};\n", self.zone_text(), self.flags, self.algorithm, self.public_key_base64())
    }

    /// Writes the `.key` and the External `.private` file into `dir` with
    /// Created/Publish/Activate at `created` (seconds since the epoch; it
    /// must not lie in the future, or named will not sign).
    pub fn write_files(&self, dir: &Path, created: u64) -> Result<KeyFiles, KeyError> {
        let stamp = format_timestamp(created);
        let stem = self.file_stem();
        let key_path = dir.join(format!("{stem}.key"));
        let private_path = dir.join(format!("{stem}.private"));
        let key_text = format!(
            "; This is a key-signing key, keyid {tag}, for {zone}\n\
             ; Its private key is held by the sdns remote signer.\n\
             ; Created: {stamp}\n; Publish: {stamp}\n; Activate: {stamp}\n{record}\n",
            tag = self.key_tag(),
            zone = self.zone_text(),
            record = self.dnskey_record(),
        );
        let private_text = format!(
            "Private-key-format: v1.3\nAlgorithm: {alg} ({name})\nExternal:\n\
             Created: {stamp}\nPublish: {stamp}\nActivate: {stamp}\n",
            alg = self.algorithm,
            name = algorithm_name(self.algorithm),
        );
        write_file(&key_path, key_text.as_bytes(), 0o644)?;
        write_file(&private_path, private_text.as_bytes(), 0o600)?;
        Ok(KeyFiles { key: key_path, private: private_path })
    }
}

fn is_rsa(alg: u8) -> bool {
    [ALG_RSASHA1, ALG_NSEC3RSASHA1, ALG_RSASHA256, ALG_RSASHA512].contains(&alg)
}

/// The modulus length of an RFC 3110 public key field; `None` if it is malformed.
fn rsa_modulus_len(field: &[u8]) -> Option<usize> {
    let (exp_len, rest) = match field.split_first()? {
        (0, rest) => (usize::from(u16::from_be_bytes([*rest.first()?, *rest.get(1)?])), rest.get(2..)?),
        (&n, rest) => (usize::from(n), rest),
    };
    let modulus = rest.get(exp_len..)?;
    (!modulus.is_empty() && exp_len > 0).then_some(modulus.len())
}

/// The mnemonic BIND writes after the number on a key file's `Algorithm:` line.
fn algorithm_name(alg: u8) -> &'static str {
    match alg {
        ALG_RSASHA1 => "RSASHA1",
        ALG_NSEC3RSASHA1 => "NSEC3RSASHA1",
        ALG_RSASHA256 => "RSASHA256",
        ALG_RSASHA512 => "RSASHA512",
        ALG_ECDSAP256SHA256 => "ECDSAP256SHA256",
        ALG_ED25519 => "ED25519",
        _ => "UNKNOWN",
    }
}

pub(crate) fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), KeyError> {
    let io = |source| KeyError::Io { path: path.to_path_buf(), source };
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(path).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3110_encoding() {
        let n = vec![0xc5u8; 128];
        let enc = rsa_public_key_rfc3110(&[0, 1, 0, 1], &n).unwrap();
        assert_eq!(&enc[..4], &[3, 1, 0, 1]);
        assert_eq!(enc.len(), 4 + 128);
        assert!(rsa_public_key_rfc3110(&[], &n).is_err());
        assert!(rsa_public_key_rfc3110(&[3], &[1; 10]).is_err());
        assert_eq!(rsa_modulus_len(&enc), Some(128));
        assert_eq!(rsa_modulus_len(&[0, 0, 1, 3, 7, 7]), Some(2));
        assert_eq!(rsa_modulus_len(&[3, 1, 0, 1]), None);
        assert_eq!(rsa_modulus_len(&[]), None);
    }

    fn zone() -> Name {
        Name::from_ascii("Example.TEST").unwrap()
    }

    #[test]
    fn ec_keys_have_their_algorithms_form() {
        let key = ZoneKey::ecdsa_p256(&zone(), &[7; 64], 300).unwrap();
        assert_eq!(&key.rdata()[..4], &[1, 1, 3, 13]);
        assert_eq!((key.rdata().len(), key.signature_len()), (4 + 64, 64));
        assert_eq!(key.zone_text(), "example.test.");
        assert_eq!(key.file_stem(), format!("Kexample.test.+013+{:05}", key_tag(&key.rdata())));
        let key = ZoneKey::ed25519(&zone(), &[9; 32], 300).unwrap();
        assert_eq!(&key.rdata()[..4], &[1, 1, 3, 15]);
        assert_eq!((key.rdata().len(), key.signature_len()), (4 + 32, 64));
        // SEC 1's 65-byte form (0x04 || x || y) is not the DNSKEY form.
        assert!(matches!(ZoneKey::ecdsa_p256(&zone(), &[4; 65], 300), Err(KeyError::BadPublicKey { len: 65, expected: 64, .. })));
        assert!(matches!(ZoneKey::ed25519(&zone(), &[9; 64], 300), Err(KeyError::BadPublicKey { len: 64, expected: 32, .. })));
        assert!(matches!(ZoneKey::from_dnskey_field(&zone(), 14, vec![1; 96], 300), Err(KeyError::UnsupportedAlgorithm(14))));
        let rsa = ZoneKey::rsa(&zone(), ALG_RSASHA256, &[1, 0, 1], &[0xc5; 256], 300).unwrap();
        assert_eq!(rsa.signature_len(), 256);
    }

    #[test]
    fn key_files_name_the_algorithm() {
        let dir = tempfile::tempdir().unwrap();
        for (key, name) in [
            (ZoneKey::ecdsa_p256(&zone(), &[7; 64], 300).unwrap(), "13 (ECDSAP256SHA256)"),
            (ZoneKey::ed25519(&zone(), &[9; 32], 300).unwrap(), "15 (ED25519)"),
        ] {
            let files = key.write_files(dir.path(), 1_700_000_000).unwrap();
            let private = std::fs::read_to_string(&files.private).unwrap();
            assert!(private.contains(&format!("Algorithm: {name}\nExternal:\n")), "{private}");
            let public = std::fs::read_to_string(&files.key).unwrap();
            assert!(public.contains(&key.dnskey_record()), "{public}");
            let ds = key.ds_record();
            assert!(ds.starts_with(&format!("example.test. IN DS {} {} 2 ", key.key_tag(), key.algorithm)), "{ds}");
            assert_eq!(ds.len() - ds.rfind(' ').unwrap() - 1, 64);
        }
    }
}
