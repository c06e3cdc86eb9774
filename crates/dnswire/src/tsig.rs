//! TSIG (RFC 8945): verifying a request's MAC against a time the caller gives (the
//! batch's agreed time at execution, the local clock only as a filter before ordering),
//! signing a request under a replica-local key for named, and signing answers.
//!
//! HMAC comes from ring (already in the tree through rustls); its `verify` compares in
//! constant time. Algorithms: hmac-sha1, hmac-sha256, hmac-sha384, hmac-sha512 (ring
//! has no SHA-224 or MD5 HMAC, so hmac-sha224 and hmac-md5 keys are refused at load).

use ring::hmac;

use crate::layout::{self as wire, RecordAt, CLASS_ANY, TYPE_TSIG};
use crate::rrwire::WireError;

/// TSIG error codes (RFC 8945 section 3 / IANA).
pub const BADSIG: u16 = 16;
pub const BADKEY: u16 = 17;
pub const BADTIME: u16 = 18;
pub const BADTRUNC: u16 = 22;
/// The fudge BIND puts in the answers it signs (DNS_TSIG_FUDGE).
pub const ANSWER_FUDGE: u16 = 300;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    HmacSha1,
    HmacSha256,
    HmacSha384,
    HmacSha512,
}

impl Algorithm {
    /// From BIND's name (`hmac-sha256`) or the wire name (`hmac-sha256.`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.trim_end_matches('.').to_ascii_lowercase().as_str() {
            "hmac-sha1" => Some(Self::HmacSha1),
            "hmac-sha256" => Some(Self::HmacSha256),
            "hmac-sha384" => Some(Self::HmacSha384),
            "hmac-sha512" => Some(Self::HmacSha512),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::HmacSha1 => "hmac-sha1",
            Self::HmacSha256 => "hmac-sha256",
            Self::HmacSha384 => "hmac-sha384",
            Self::HmacSha512 => "hmac-sha512",
        }
    }

    fn wire_name(self) -> Vec<u8> {
        // Names of known algorithms always convert.
        wire::name_to_wire(self.name()).unwrap_or_default()
    }

    fn ring(self) -> hmac::Algorithm {
        match self {
            Self::HmacSha1 => hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            Self::HmacSha256 => hmac::HMAC_SHA256,
            Self::HmacSha384 => hmac::HMAC_SHA384,
            Self::HmacSha512 => hmac::HMAC_SHA512,
        }
    }

    fn digest_len(self) -> usize {
        match self {
            Self::HmacSha1 => 20,
            Self::HmacSha256 => 32,
            Self::HmacSha384 => 48,
            Self::HmacSha512 => 64,
        }
    }
}

/// A TSIG key. The secret stays inside ring's key; nothing prints it.
#[derive(Clone)]
pub struct Key {
    /// Lower-case wire form of the key name.
    pub name_wire: Vec<u8>,
    pub name: String,
    pub algorithm: Algorithm,
    key: hmac::Key,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("name", &self.name).field("algorithm", &self.algorithm).finish_non_exhaustive()
    }
}

impl Key {
    pub fn new(name: &str, algorithm: Algorithm, secret: &[u8]) -> Option<Key> {
        let name_wire = wire::name_to_wire(name)?;
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        Some(Key { name_wire, name, algorithm, key: hmac::Key::new(algorithm.ring(), secret) })
    }
}

/// A TSIG record's fields (RFC 8945 4.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tsig {
    /// Owner (the key name), lower-case wire form.
    pub key_name: Vec<u8>,
    /// Algorithm name, lower-case wire form.
    pub algorithm: Vec<u8>,
    pub time_signed: u64,
    pub fudge: u16,
    pub mac: Vec<u8>,
    pub original_id: u16,
    pub error: u16,
    pub other: Vec<u8>,
}

impl Tsig {
    pub fn parse(msg: &[u8], rec: &RecordAt) -> Result<Tsig, WireError> {
        if rec.rtype != TYPE_TSIG {
            return Err(WireError::Short("a TSIG record"));
        }
        let end = rec.rdata + rec.rdlen;
        let rd = msg.get(..end).ok_or(WireError::Short("TSIG rdata"))?;
        let (algorithm, mut p) = wire::read_name(rd, rec.rdata)?;
        let t = rd.get(p..p + 10).ok_or(WireError::Short("TSIG rdata"))?;
        let time_signed = t[..6].iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        let fudge = u16::from_be_bytes([t[6], t[7]]);
        let mac_len = usize::from(u16::from_be_bytes([t[8], t[9]]));
        p += 10;
        let mac = rd.get(p..p + mac_len).ok_or(WireError::Short("the TSIG MAC"))?.to_vec();
        p += mac_len;
        let t = rd.get(p..p + 6).ok_or(WireError::Short("TSIG rdata"))?;
        let original_id = u16::from_be_bytes([t[0], t[1]]);
        let error = u16::from_be_bytes([t[2], t[3]]);
        let other_len = usize::from(u16::from_be_bytes([t[4], t[5]]));
        p += 6;
        let other = rd.get(p..p + other_len).ok_or(WireError::Short("TSIG other data"))?.to_vec();
        if p + other_len != end {
            return Err(WireError::Short("TSIG rdata (length mismatch)"));
        }
        Ok(Tsig { key_name: rec.owner.clone(), algorithm, time_signed, fudge, mac, original_id, error, other })
    }

    /// The TSIG variables of RFC 8945 4.3.3 (key name to other data, without the MAC).
    fn variables(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.key_name.len() + self.algorithm.len() + 24 + self.other.len());
        v.extend_from_slice(&self.key_name);
        v.extend_from_slice(&CLASS_ANY.to_be_bytes());
        v.extend_from_slice(&0u32.to_be_bytes());
        v.extend_from_slice(&self.algorithm);
        v.extend_from_slice(&self.time_signed.to_be_bytes()[2..]);
        v.extend_from_slice(&self.fudge.to_be_bytes());
        v.extend_from_slice(&self.error.to_be_bytes());
        v.extend_from_slice(&(self.other.len() as u16).to_be_bytes());
        v.extend_from_slice(&self.other);
        v
    }

    /// The record in wire form (uncompressed), to append to a message.
    fn record(&self) -> Vec<u8> {
        let mut rdata = Vec::with_capacity(self.algorithm.len() + 16 + self.mac.len() + self.other.len());
        rdata.extend_from_slice(&self.algorithm);
        rdata.extend_from_slice(&self.time_signed.to_be_bytes()[2..]);
        rdata.extend_from_slice(&self.fudge.to_be_bytes());
        rdata.extend_from_slice(&(self.mac.len() as u16).to_be_bytes());
        rdata.extend_from_slice(&self.mac);
        rdata.extend_from_slice(&self.original_id.to_be_bytes());
        rdata.extend_from_slice(&self.error.to_be_bytes());
        rdata.extend_from_slice(&(self.other.len() as u16).to_be_bytes());
        rdata.extend_from_slice(&self.other);
        let mut r = self.key_name.clone();
        r.extend_from_slice(&TYPE_TSIG.to_be_bytes());
        r.extend_from_slice(&CLASS_ANY.to_be_bytes());
        r.extend_from_slice(&0u32.to_be_bytes());
        r.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        r.extend_from_slice(&rdata);
        r
    }
}

/// The message without its last record (`sig_start` is where it begins), ARCOUNT one
/// less, and the id set to `id`.
pub fn strip(msg: &[u8], sig_start: usize, id: u16) -> Vec<u8> {
    let mut out = msg.get(..sig_start).unwrap_or(msg).to_vec();
    if out.len() >= wire::HEADER_LEN {
        out[0..2].copy_from_slice(&id.to_be_bytes());
        let ar = wire::u16_at(&out, 10).unwrap_or(0).saturating_sub(1);
        out[10..12].copy_from_slice(&ar.to_be_bytes());
    }
    out
}

fn compute_mac(key: &Key, request_mac: Option<&[u8]>, unsigned: &[u8], tsig: &Tsig) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(&key.key);
    if let Some(m) = request_mac {
        ctx.update(&(m.len() as u16).to_be_bytes());
        ctx.update(m);
    }
    ctx.update(unsigned);
    ctx.update(&tsig.variables());
    ctx.sign()
}

/// Signs `unsigned` (a message without TSIG, its id the one to sign) and appends
/// the TSIG record. `request_mac` is the request's MAC when signing an answer.
pub fn sign(unsigned: &[u8], key: &Key, time_signed: u64, fudge: u16, error: u16, other: Vec<u8>, request_mac: Option<&[u8]>) -> Vec<u8> {
    let mut tsig = Tsig {
        key_name: key.name_wire.clone(),
        algorithm: key.algorithm.wire_name(),
        time_signed: time_signed & 0xffff_ffff_ffff,
        fudge,
        mac: Vec::new(),
        original_id: wire::u16_at(unsigned, 0).unwrap_or(0),
        error,
        other,
    };
    tsig.mac = compute_mac(key, request_mac, unsigned, &tsig).as_ref().to_vec();
    append(unsigned, &tsig)
}

/// Appends `tsig` unchanged (an unsigned error TSIG has an empty MAC).
pub fn append(unsigned: &[u8], tsig: &Tsig) -> Vec<u8> {
    let mut out = unsigned.to_vec();
    out.extend_from_slice(&tsig.record());
    if out.len() >= wire::HEADER_LEN {
        let ar = wire::u16_at(&out, 10).unwrap_or(0).saturating_add(1);
        out[10..12].copy_from_slice(&ar.to_be_bytes());
    }
    out
}

/// Why a TSIG request fails, in RFC 8945 5.2's order of checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The MAC has an impossible length (FORMERR).
    FormErr,
    BadKey,
    BadSig,
    BadTrunc,
    /// Signed outside the fudge of the given time.
    BadTime,
}

/// Checks a request's TSIG with `key` (the caller found it by name) at time `now_s`.
pub fn verify(msg: &[u8], rec: &RecordAt, tsig: &Tsig, key: &Key, now_s: u64) -> Result<(), Failure> {
    // The class is not among the signed variables (they say ANY): any other class is a
    // malformed TSIG, as BIND's parser has it, not one that happens to verify.
    if rec.class != CLASS_ANY {
        return Err(Failure::FormErr);
    }
    if tsig.algorithm != key.algorithm.wire_name() {
        return Err(Failure::BadKey);
    }
    let full = key.algorithm.digest_len();
    let len = tsig.mac.len();
    // RFC 8945 5.2.2.1: longer than the digest, or shorter than 10 bytes and half.
    if len > full || len < (full / 2).max(10) {
        return Err(Failure::FormErr);
    }
    let unsigned = strip(msg, rec.start, tsig.original_id);
    let mut ctx = hmac::Context::with_key(&key.key);
    ctx.update(&unsigned);
    ctx.update(&tsig.variables());
    let tag = ctx.sign();
    // Constant-time comparison over the bytes the request carries.
    if !constant_time_eq(&tag.as_ref()[..len], &tsig.mac) {
        return Err(Failure::BadSig);
    }
    if len < full {
        // BIND accepts only full-length MACs unless a key says otherwise.
        return Err(Failure::BadTrunc);
    }
    if now_s.abs_diff(tsig.time_signed) > u64::from(tsig.fudge) {
        return Err(Failure::BadTime);
    }
    Ok(())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_then_verify_and_tamper() {
        let key = Key::new("k.example.", Algorithm::HmacSha256, b"0123456789abcdef").unwrap();
        // A bare update header with a zone section.
        let mut msg = vec![0x12, 0x34, 0x28, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        msg.extend_from_slice(&[4, b't', b'e', b's', b't', 0, 0, 6, 0, 1]);
        let signed = sign(&msg, &key, 1_000_000, 0, 0, vec![], None);
        let l = wire::layout(&signed).unwrap();
        let rec = l.signature.unwrap();
        let t = Tsig::parse(&signed, &rec).unwrap();
        assert_eq!(verify(&signed, &rec, &t, &key, 1_000_000), Ok(()));
        assert_eq!(verify(&signed, &rec, &t, &key, 1_000_001), Err(Failure::BadTime));
        let other = Key::new("k.example.", Algorithm::HmacSha256, b"another secret!!").unwrap();
        assert_eq!(verify(&signed, &rec, &t, &other, 1_000_000), Err(Failure::BadSig));
        let sha1 = Key::new("k.example.", Algorithm::HmacSha1, b"0123456789abcdef").unwrap();
        assert_eq!(verify(&signed, &rec, &t, &sha1, 1_000_000), Err(Failure::BadKey));
        let mut tampered = signed.clone();
        tampered[13] ^= 0x20; // "test" -> "tEst": the MAC covers the exact bytes.
        assert_eq!(verify(&tampered, &rec, &t, &key, 1_000_000), Err(Failure::BadSig));
        assert_eq!(strip(&signed, rec.start, 0x1234), msg);
    }
}
