//! SIG(0) (RFC 2931): a request signed with the private half of a KEY record, as
//! `nsupdate -k K<name>.+<alg>+<tag>.private` sends it. BIND 9.18.28 and later no
//! longer verify these in named (CVE-2024-1975), so the wrapper does, with a bounded
//! cost: one SIG(0) record per message (the last), a size cap, a key looked up by
//! (signer, algorithm, tag) in the configured set, and at most one verification.
//!
//! Algorithms (ring): ECDSAP256SHA256 (13), ECDSAP384SHA384 (14), ED25519 (15),
//! RSASHA256 (8) and RSASHA512 (10) with moduli of 2048 bits and more.

use base64::Engine as _;
use ring::signature;

use super::wire::{self, RecordAt, CLASS_ANY};

pub const ALG_RSASHA256: u8 = 8;
pub const ALG_RSASHA512: u8 = 10;
pub const ALG_ECDSAP256SHA256: u8 = 13;
pub const ALG_ECDSAP384SHA384: u8 = 14;
pub const ALG_ED25519: u8 = 15;
/// Largest SIG(0)-signed message verified; bigger ones are refused unverified.
pub const MAX_MESSAGE: usize = 16 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyFileError {
    #[error("no KEY record in the file")]
    NoKeyRecord,
    #[error("bad KEY record: {0}")]
    Bad(String),
    #[error("algorithm {0} is not supported for SIG(0) (8, 10, 13, 14, 15 are)")]
    Algorithm(u8),
}

/// A public KEY a SIG(0) may be made with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sig0Key {
    /// The signer (the KEY's owner), lower-case wire form.
    pub signer: Vec<u8>,
    /// Presentation form, lower case, with the trailing dot.
    pub name: String,
    pub algorithm: u8,
    pub tag: u16,
    public_key: Vec<u8>,
}

impl Sig0Key {
    /// Reads a `K<name>.+<alg>+<tag>.key` file as dnssec-keygen -T KEY writes it.
    pub fn from_key_file(text: &str) -> Result<Sig0Key, KeyFileError> {
        let line = text
            .lines()
            .map(|l| l.split(';').next().unwrap_or("").trim())
            .find(|l| l.split_whitespace().any(|w| w.eq_ignore_ascii_case("KEY")))
            .ok_or(KeyFileError::NoKeyRecord)?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| w.eq_ignore_ascii_case("KEY")).ok_or(KeyFileError::NoKeyRecord)?;
        let owner = words[0];
        let num = |i: usize, what: &str| -> Result<u32, KeyFileError> {
            words.get(at + i).and_then(|w| w.parse().ok()).ok_or_else(|| KeyFileError::Bad(format!("{what} missing or not a number")))
        };
        let flags = u16::try_from(num(1, "flags")?).map_err(|_| KeyFileError::Bad("flags".into()))?;
        let protocol = u8::try_from(num(2, "protocol")?).map_err(|_| KeyFileError::Bad("protocol".into()))?;
        let algorithm = u8::try_from(num(3, "algorithm")?).map_err(|_| KeyFileError::Bad("algorithm".into()))?;
        // RFC 2535 3.1.2: the "no authentication" bit (and "no key") forbid this use.
        if flags & 0x8000 != 0 {
            return Err(KeyFileError::Bad(format!("flags {flags} forbid authentication")));
        }
        let b64: String = words.get(at + 4..).unwrap_or_default().concat();
        let public_key =
            base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()).map_err(|e| KeyFileError::Bad(format!("public key is not base64: {e}")))?;
        let signer = wire::name_to_wire(owner).ok_or_else(|| KeyFileError::Bad(format!("owner {owner:?} is not a name")))?;
        let mut rdata = flags.to_be_bytes().to_vec();
        rdata.push(protocol);
        rdata.push(algorithm);
        rdata.extend_from_slice(&public_key);
        Sig0Key::new(signer, algorithm, dnswire::dnssec::key_tag(&rdata), public_key)
    }

    fn new(signer: Vec<u8>, algorithm: u8, tag: u16, public_key: Vec<u8>) -> Result<Sig0Key, KeyFileError> {
        let ok = match algorithm {
            ALG_ECDSAP256SHA256 => public_key.len() == 64,
            ALG_ECDSAP384SHA384 => public_key.len() == 96,
            ALG_ED25519 => public_key.len() == 32,
            ALG_RSASHA256 | ALG_RSASHA512 => rsa_parts(&public_key).is_some(),
            other => return Err(KeyFileError::Algorithm(other)),
        };
        if !ok {
            return Err(KeyFileError::Bad(format!("public key of {} bytes does not fit algorithm {algorithm}", public_key.len())));
        }
        Ok(Sig0Key { name: wire::wire_to_text(&signer), signer, algorithm, tag, public_key })
    }

    fn verify(&self, data: &[u8], sig: &[u8]) -> bool {
        let ec = |alg: &'static dyn signature::VerificationAlgorithm| {
            let mut point = vec![4u8];
            point.extend_from_slice(&self.public_key);
            signature::UnparsedPublicKey::new(alg, point).verify(data, sig).is_ok()
        };
        match self.algorithm {
            ALG_ECDSAP256SHA256 => ec(&signature::ECDSA_P256_SHA256_FIXED),
            ALG_ECDSAP384SHA384 => ec(&signature::ECDSA_P384_SHA384_FIXED),
            ALG_ED25519 => signature::UnparsedPublicKey::new(&signature::ED25519, &self.public_key).verify(data, sig).is_ok(),
            ALG_RSASHA256 | ALG_RSASHA512 => {
                let Some((e, n)) = rsa_parts(&self.public_key) else { return false };
                let alg = if self.algorithm == ALG_RSASHA256 { &signature::RSA_PKCS1_2048_8192_SHA256 } else { &signature::RSA_PKCS1_2048_8192_SHA512 };
                signature::RsaPublicKeyComponents { n, e }.verify(alg, data, sig).is_ok()
            }
            _ => false,
        }
    }
}

/// RFC 3110: exponent length (1 byte, or 0 and 2 bytes), exponent, modulus.
fn rsa_parts(k: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = match *k.first()? {
        0 => (usize::from(u16::from_be_bytes([*k.get(1)?, *k.get(2)?])), k.get(3..)?),
        l => (usize::from(l), k.get(1..)?),
    };
    let (e, n) = (rest.get(..len)?, rest.get(len..)?);
    (!e.is_empty() && n.len() >= 256).then_some((e, n))
}

/// Why a SIG(0) request fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Malformed,
    TooBig,
    UnknownKey,
    /// The agreed time lies outside [inception, expiration].
    OutsideWindow,
    /// Valid for longer than the configured maximum (`[auth] sig0_max_validity_s`): the
    /// longer a signed update may be ordered, the longer a replay must be remembered.
    SpanTooLong,
    BadSignature,
}

/// The signer's identity when the SIG(0) verifies at `now_s` and is valid for at most
/// `max_span_s` (expiration less inception).
pub fn verify<'k>(msg: &[u8], rec: &RecordAt, keys: &'k [Sig0Key], now_s: u64, max_span_s: u64) -> Result<&'k Sig0Key, Failure> {
    if msg.len() > MAX_MESSAGE {
        return Err(Failure::TooBig);
    }
    // RFC 2931 3.1: owner root, class ANY, TTL 0, labels 0, original TTL 0.
    if rec.owner != [0] || rec.class != CLASS_ANY || rec.ttl != 0 {
        return Err(Failure::Malformed);
    }
    let end = rec.rdata + rec.rdlen;
    let rd = msg.get(..end).ok_or(Failure::Malformed)?;
    let fixed = rd.get(rec.rdata..rec.rdata + 18).ok_or(Failure::Malformed)?;
    let algorithm = fixed[2];
    if fixed[3] != 0 || fixed[4..8] != [0, 0, 0, 0] {
        return Err(Failure::Malformed);
    }
    let expiration = u32::from_be_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]);
    let inception = u32::from_be_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]);
    let tag = u16::from_be_bytes([fixed[16], fixed[17]]);
    // Signer names in SIG rdata are never compressed (RFC 2931 / RFC 3597).
    let signer_at = rec.rdata + 18;
    let signer_len = signer_len(rd, signer_at).ok_or(Failure::Malformed)?;
    let sig_at = signer_at + signer_len;
    let signer = rd[signer_at..sig_at].to_ascii_lowercase();
    let sig = &rd[sig_at..end];
    let key = keys.iter().find(|k| k.signer == signer && k.algorithm == algorithm && k.tag == tag).ok_or(Failure::UnknownKey)?;
    // RFC 1982 serial comparison around the given time.
    let now = now_s as u32;
    if (now.wrapping_sub(inception) as i32) < 0 || (expiration.wrapping_sub(now) as i32) < 0 {
        return Err(Failure::OutsideWindow);
    }
    // Inside the window, so expiration follows inception (serial arithmetic).
    if u64::from(expiration.wrapping_sub(inception)) > max_span_s {
        return Err(Failure::SpanTooLong);
    }
    // What is signed: the SIG rdata without the signature, then the request as it was
    // before the SIG(0) was added (ARCOUNT one less).
    let mut data = Vec::with_capacity(msg.len());
    data.extend_from_slice(&rd[rec.rdata..sig_at]);
    data.extend_from_slice(&tsig_free_header(msg));
    data.extend_from_slice(msg.get(wire::HEADER_LEN..rec.start).ok_or(Failure::Malformed)?);
    if key.verify(&data, sig) {
        Ok(key)
    } else {
        Err(Failure::BadSignature)
    }
}

fn tsig_free_header(msg: &[u8]) -> [u8; wire::HEADER_LEN] {
    let mut h = [0u8; wire::HEADER_LEN];
    h.copy_from_slice(&msg[..wire::HEADER_LEN]);
    let ar = u16::from_be_bytes([h[10], h[11]]).saturating_sub(1);
    h[10..12].copy_from_slice(&ar.to_be_bytes());
    h
}

/// Length of an uncompressed name at `at`.
fn signer_len(rd: &[u8], at: usize) -> Option<usize> {
    let mut pos = at;
    loop {
        let l = usize::from(*rd.get(pos)?);
        if l == 0 {
            return Some(pos + 1 - at);
        }
        if l & 0xc0 != 0 || pos + 1 + l - at > 255 {
            return None;
        }
        pos += 1 + l;
    }
}
