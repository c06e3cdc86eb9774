//! The zone's DNSKEY and its BIND key files.
//!
//! named finds a zone's keys in its key-directory as
//! `K<zone>.+<alg>+<tag>.key` (the DNSKEY record) and `.private`. For a key
//! held by the remote signer the `.private` file carries no key material,
//! only `External:` (as dnssec-importkey writes it) and the timing metadata;
//! BIND 9.18 then takes the public key from the `.key` file, and the patch
//! makes such a key count as private while SDNS_SIGNER_SOCKET is set.
//! Publish and Activate lie in the past, so named signs with the key at once.

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
    /// The DNSKEY public key field (RFC 3110 for RSA).
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
        if ![ALG_RSASHA1, ALG_NSEC3RSASHA1, ALG_RSASHA256, ALG_RSASHA512].contains(&algorithm) {
            return Err(KeyError::NotRsa(algorithm));
        }
        let mut zone = zone.to_lowercase();
        zone.set_fqdn(true);
        Ok(ZoneKey { zone, algorithm, flags: FLAGS_KSK, public_key: rsa_public_key_rfc3110(exponent, modulus)?, ttl })
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

fn algorithm_name(alg: u8) -> &'static str {
    match alg {
        ALG_RSASHA1 => "RSASHA1",
        ALG_NSEC3RSASHA1 => "NSEC3RSASHA1",
        ALG_RSASHA256 => "RSASHA256",
        ALG_RSASHA512 => "RSASHA512",
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
    }
}
