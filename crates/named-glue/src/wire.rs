//! The signing-socket wire format between the patched named and the glue.
//!
//! One request and one reply, each a single unix datagram. All integers are
//! big-endian (network order).
//!
//! Request (named -> glue), 22 bytes of header plus variable parts:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `"SDNQ"` |
//! | 4 | 1 | version, 1 |
//! | 5 | 1 | DNSSEC algorithm number (8 = RSASHA256, 13 = ECDSAP256SHA256, 15 = ED25519, ...) |
//! | 6 | 2 | key tag |
//! | 8 | 8 | request id (random, echoed in the reply) |
//! | 16 | 2 | signer name length L (1..=255) |
//! | 18 | L | signer name, uncompressed wire form, lower case |
//! | 18+L | 4 | data length D (19..=[`MAX_DATA_LEN`]) |
//! | 22+L | D | to-be-signed data, RFC 4034 section 3.1.8.1 |
//!
//! The data is the RRSIG rdata without the signature (18 fixed bytes: type
//! covered, algorithm, labels, original TTL, expiration at offset 8,
//! inception at offset 12, key tag; then the signer name) followed by the
//! canonical RRset, exactly the bytes named would feed to its digest.
//!
//! Reply (glue -> named), 26 bytes of header plus the signature:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `"SDNR"` |
//! | 4 | 1 | version, 1 |
//! | 5 | 1 | status, see [`Status`] (0 = ok) |
//! | 6 | 2 | reserved, 0 |
//! | 8 | 8 | request id of the request answered |
//! | 16 | 4 | inception used (seconds since the epoch, RFC 4034 serial time) |
//! | 20 | 4 | expiration used |
//! | 24 | 2 | signature length S (0 unless status is ok) |
//! | 26 | S | signature |
//!
//! named accepts a reply only if the id matches, the status is 0, S equals
//! the key's signature size and the datagram is exactly 26 + S bytes long.
//!
//! The signature is the RRSIG's signature field as it goes on the wire: for RSA
//! (RFC 3110, 5702) the PKCS#1 v1.5 signature, as long as the modulus; for ECDSA
//! P-256 (algorithm 13, RFC 6605) r || s, each 32 bytes big-endian, over the SHA-256
//! of the data (not DER); for Ed25519 (algorithm 15, RFC 8080) the 64-byte RFC 8032
//! signature of the data itself. S is 64 for both of the latter.

use hickory_proto::rr::Name;
use hickory_proto::serialize::binary::{BinDecodable, BinEncodable};

pub const REQUEST_MAGIC: [u8; 4] = *b"SDNQ";
pub const REPLY_MAGIC: [u8; 4] = *b"SDNR";
pub const VERSION: u8 = 1;
/// Largest to-be-signed data the patched named sends (a 64 KiB RRset plus
/// its RRSIG header fits); matches `REMOTE_DATA_MAX` in the C patch.
pub const MAX_DATA_LEN: usize = 192 * 1024;
/// Largest signature a reply may carry (8192-bit RSA); matches the C side.
pub const MAX_SIGNATURE_LEN: usize = 1024;
/// Largest request datagram.
pub const MAX_REQUEST_LEN: usize = 22 + 255 + MAX_DATA_LEN;
const REQUEST_HEADER_LEN: usize = 18;
const REPLY_HEADER_LEN: usize = 26;
/// Fixed part of the RRSIG rdata at the start of the to-be-signed data.
pub const RRSIG_FIXED_LEN: usize = 18;
/// Offset of the expiration in the to-be-signed data.
pub const EXPIRATION_OFFSET: usize = 8;
/// Offset of the inception in the to-be-signed data.
pub const INCEPTION_OFFSET: usize = 12;

/// Why a datagram is not a valid request or reply.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    #[error("datagram of {len} bytes is shorter than the {need}-byte header")]
    Short { len: usize, need: usize },
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unsupported version {0}")]
    BadVersion(u8),
    #[error("signer name length {0} is not in 1..=255")]
    BadNameLength(usize),
    #[error("signer name is not a valid uncompressed wire name: {0}")]
    BadName(String),
    #[error("to-be-signed data length {0} is out of range")]
    BadDataLength(usize),
    #[error("signature length {0} is out of range")]
    BadSignatureLength(usize),
    #[error("declared lengths add up to {declared} bytes but the datagram has {actual}")]
    LengthMismatch { declared: usize, actual: usize },
    #[error("reserved field is {0}, expected 0")]
    BadReserved(u16),
    #[error("a non-ok reply must not carry a signature")]
    SignatureOnError,
}

/// Reply status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// Signed; the reply carries the signature.
    Ok,
    /// No agreed signature times are available (no ordered request is
    /// being executed), or the signer is shutting down.
    Unavailable,
    /// The request was malformed.
    BadRequest,
    /// The signer failed (e.g. not enough signature shares in time).
    SignerFailed,
    /// A code this version does not know; treated as an error.
    Other(u8),
}

impl Status {
    pub fn code(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::Unavailable => 1,
            Status::BadRequest => 2,
            Status::SignerFailed => 3,
            Status::Other(c) => c,
        }
    }

    pub fn from_code(code: u8) -> Self {
        match code {
            0 => Status::Ok,
            1 => Status::Unavailable,
            2 => Status::BadRequest,
            3 => Status::SignerFailed,
            c => Status::Other(c),
        }
    }
}

/// A signing request from named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub algorithm: u8,
    pub key_tag: u16,
    /// The zone (signer) name as named sent it.
    pub signer: Name,
    /// RFC 4034 3.1.8.1 to-be-signed data.
    pub data: Vec<u8>,
}

/// A reply to named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub id: u64,
    pub status: Status,
    pub inception: u32,
    pub expiration: u32,
    pub signature: Vec<u8>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_be_bytes)
    }
}

fn short(len: usize, need: usize) -> WireError {
    WireError::Short { len, need }
}

impl Request {
    /// Encodes the request; fails if a field is out of the format's range.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let name = self.signer.to_bytes().map_err(|e| WireError::BadName(e.to_string()))?;
        if name.is_empty() || name.len() > 255 {
            return Err(WireError::BadNameLength(name.len()));
        }
        if self.data.len() <= RRSIG_FIXED_LEN || self.data.len() > MAX_DATA_LEN {
            return Err(WireError::BadDataLength(self.data.len()));
        }
        let mut out = Vec::with_capacity(22 + name.len() + self.data.len());
        out.extend_from_slice(&REQUEST_MAGIC);
        out.push(VERSION);
        out.push(self.algorithm);
        out.extend_from_slice(&self.key_tag.to_be_bytes());
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&(name.len() as u16).to_be_bytes());
        out.extend_from_slice(&name);
        out.extend_from_slice(&(self.data.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.data);
        Ok(out)
    }

    /// Decodes a request datagram.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let len = bytes.len();
        let mut r = Reader { bytes, at: 0 };
        let magic: [u8; 4] = r.array().ok_or(short(len, REQUEST_HEADER_LEN))?;
        if magic != REQUEST_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if len < REQUEST_HEADER_LEN {
            return Err(short(len, REQUEST_HEADER_LEN));
        }
        let version = r.u8().ok_or(short(len, REQUEST_HEADER_LEN))?;
        if version != VERSION {
            return Err(WireError::BadVersion(version));
        }
        let algorithm = r.u8().ok_or(short(len, REQUEST_HEADER_LEN))?;
        let key_tag = r.u16().ok_or(short(len, REQUEST_HEADER_LEN))?;
        let id = r.u64().ok_or(short(len, REQUEST_HEADER_LEN))?;
        let name_len = usize::from(r.u16().ok_or(short(len, REQUEST_HEADER_LEN))?);
        if name_len == 0 || name_len > 255 {
            return Err(WireError::BadNameLength(name_len));
        }
        let name_bytes = r.take(name_len).ok_or(short(len, REQUEST_HEADER_LEN + name_len + 4))?;
        let data_len = r.u32().ok_or(short(len, REQUEST_HEADER_LEN + name_len + 4))? as usize;
        if data_len <= RRSIG_FIXED_LEN || data_len > MAX_DATA_LEN {
            return Err(WireError::BadDataLength(data_len));
        }
        let declared = 22 + name_len + data_len;
        if declared != len {
            return Err(WireError::LengthMismatch { declared, actual: len });
        }
        let data = r.take(data_len).ok_or(short(len, declared))?.to_vec();
        let signer = decode_name(name_bytes)?;
        Ok(Request { id, algorithm, key_tag, signer, data })
    }

    /// Reads just the id of something that looks like a request, so that a
    /// malformed request can still get an error reply.
    pub fn peek_id(bytes: &[u8]) -> Option<u64> {
        if bytes.get(0..4)? != REQUEST_MAGIC {
            return None;
        }
        Some(u64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?))
    }
}

fn decode_name(bytes: &[u8]) -> Result<Name, WireError> {
    // Compression pointers would point outside this buffer; hickory's
    // decoder rejects them, and trailing bytes mean a wrong length.
    let mut decoder = hickory_proto::serialize::binary::BinDecoder::new(bytes);
    let name = Name::read(&mut decoder).map_err(|e| WireError::BadName(e.to_string()))?;
    if !decoder.is_empty() {
        return Err(WireError::BadName(format!("{} trailing bytes", decoder.len())));
    }
    Ok(name)
}

impl Reply {
    /// A successful reply.
    pub fn ok(id: u64, inception: u32, expiration: u32, signature: Vec<u8>) -> Self {
        Reply { id, status: Status::Ok, inception, expiration, signature }
    }

    /// An error reply (no signature, zero times).
    pub fn error(id: u64, status: Status) -> Self {
        debug_assert!(status != Status::Ok);
        Reply { id, status, inception: 0, expiration: 0, signature: Vec::new() }
    }

    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        if self.signature.len() > MAX_SIGNATURE_LEN {
            return Err(WireError::BadSignatureLength(self.signature.len()));
        }
        if self.status != Status::Ok && !self.signature.is_empty() {
            return Err(WireError::SignatureOnError);
        }
        let mut out = Vec::with_capacity(REPLY_HEADER_LEN + self.signature.len());
        out.extend_from_slice(&REPLY_MAGIC);
        out.push(VERSION);
        out.push(self.status.code());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.inception.to_be_bytes());
        out.extend_from_slice(&self.expiration.to_be_bytes());
        out.extend_from_slice(&(self.signature.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.signature);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let len = bytes.len();
        let mut r = Reader { bytes, at: 0 };
        let magic: [u8; 4] = r.array().ok_or(short(len, REPLY_HEADER_LEN))?;
        if magic != REPLY_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if len < REPLY_HEADER_LEN {
            return Err(short(len, REPLY_HEADER_LEN));
        }
        let err = || short(len, REPLY_HEADER_LEN);
        let version = r.u8().ok_or_else(err)?;
        if version != VERSION {
            return Err(WireError::BadVersion(version));
        }
        let status = Status::from_code(r.u8().ok_or_else(err)?);
        let reserved = r.u16().ok_or_else(err)?;
        if reserved != 0 {
            return Err(WireError::BadReserved(reserved));
        }
        let id = r.u64().ok_or_else(err)?;
        let inception = r.u32().ok_or_else(err)?;
        let expiration = r.u32().ok_or_else(err)?;
        let sig_len = usize::from(r.u16().ok_or_else(err)?);
        if sig_len > MAX_SIGNATURE_LEN {
            return Err(WireError::BadSignatureLength(sig_len));
        }
        let declared = REPLY_HEADER_LEN + sig_len;
        if declared != len {
            return Err(WireError::LengthMismatch { declared, actual: len });
        }
        if status != Status::Ok && sig_len != 0 {
            return Err(WireError::SignatureOnError);
        }
        let signature = r.take(sig_len).ok_or_else(|| short(len, declared))?.to_vec();
        Ok(Reply { id, status, inception, expiration, signature })
    }
}

/// Overwrites the expiration (offset 8) and inception (offset 12) of
/// to-be-signed data with the agreed times.
pub fn rewrite_times(data: &mut [u8], inception: u32, expiration: u32) -> Result<(), WireError> {
    if data.len() <= RRSIG_FIXED_LEN {
        return Err(WireError::BadDataLength(data.len()));
    }
    let len = data.len();
    data.get_mut(EXPIRATION_OFFSET..EXPIRATION_OFFSET + 4).ok_or(WireError::BadDataLength(len))?.copy_from_slice(&expiration.to_be_bytes());
    data.get_mut(INCEPTION_OFFSET..INCEPTION_OFFSET + 4).ok_or(WireError::BadDataLength(len))?.copy_from_slice(&inception.to_be_bytes());
    Ok(())
}

/// Reads (inception, expiration) from to-be-signed data.
pub fn read_times(data: &[u8]) -> Option<(u32, u32)> {
    let exp = u32::from_be_bytes(data.get(EXPIRATION_OFFSET..EXPIRATION_OFFSET + 4)?.try_into().ok()?);
    let inc = u32::from_be_bytes(data.get(INCEPTION_OFFSET..INCEPTION_OFFSET + 4)?.try_into().ok()?);
    Some((inc, exp))
}

/// Lower-case hex, for test vectors and logs.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses hex, ignoring ASCII whitespace and `#` comments to end of line.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = text.lines().map(|l| l.split('#').next().unwrap_or("")).flat_map(|l| l.bytes()).filter(|b| !b.is_ascii_whitespace()).collect();
    if digits.len() & 1 == 1 {
        return None;
    }
    digits
        .chunks(2)
        .map(|pair| {
            let s = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(s, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(name: &str) -> Vec<u8> {
        let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        from_hex(&text).unwrap_or_else(|| panic!("{path}: bad hex"))
    }

    #[test]
    fn request_vector_decodes_and_reencodes() {
        let bytes = vector("request-ok.hex");
        let req = Request::decode(&bytes).unwrap();
        assert_eq!(req.id, 0x0102_0304_0506_0708);
        assert_eq!(req.algorithm, 8);
        assert_eq!(req.key_tag, 0x4d2f);
        assert_eq!(req.signer, Name::from_ascii("example.test.").unwrap());
        assert_eq!(read_times(&req.data), Some((0x6579_6f80, 0x65a0_bc80)));
        assert_eq!(req.encode().unwrap(), bytes);
        assert_eq!(Request::peek_id(&bytes), Some(req.id));
    }

    #[test]
    fn reply_vectors_decode_and_reencode() {
        let bytes = vector("reply-ok.hex");
        let reply = Reply::decode(&bytes).unwrap();
        assert_eq!(reply.status, Status::Ok);
        assert_eq!((reply.inception, reply.expiration), (0x6579_6f80, 0x65a0_bc80));
        assert_eq!(reply.signature.len(), 128);
        assert_eq!(reply.signature[1], 10);
        assert_eq!(reply.encode().unwrap(), bytes);

        let bytes = vector("reply-error.hex");
        let reply = Reply::decode(&bytes).unwrap();
        assert_eq!(reply, Reply::error(0x0102_0304_0506_0708, Status::SignerFailed));
        assert_eq!(reply.encode().unwrap(), bytes);
    }

    #[test]
    fn invalid_reply_vectors_are_rejected() {
        type Check = fn(&WireError) -> bool;
        let cases: [(&str, Check); 5] = [
            ("reply-bad-magic.hex", |e| matches!(e, WireError::BadMagic(_))),
            ("reply-bad-version.hex", |e| matches!(e, WireError::BadVersion(2))),
            ("reply-short.hex", |e| matches!(e, WireError::LengthMismatch { declared: 154, actual: 126 })),
            ("reply-long.hex", |e| matches!(e, WireError::LengthMismatch { declared: 154, actual: 155 })),
            ("reply-short-header.hex", |e| matches!(e, WireError::Short { len: 20, need: 26 })),
        ];
        for (name, check) in cases {
            let err = Reply::decode(&vector(name)).unwrap_err();
            assert!(check(&err), "{name}: unexpected {err:?}");
        }
    }

    #[test]
    fn every_truncation_of_a_request_is_an_error() {
        let bytes = vector("request-ok.hex");
        for len in 0..bytes.len() {
            assert!(Request::decode(&bytes[..len]).is_err(), "prefix of {len} bytes accepted");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(Request::decode(&longer), Err(WireError::LengthMismatch { .. })));
    }

    #[test]
    fn bad_request_fields_are_named() {
        let bytes = vector("request-ok.hex");
        let mut bad = bytes.clone();
        bad[4] = 9;
        assert_eq!(Request::decode(&bad), Err(WireError::BadVersion(9)));
        let mut bad = bytes.clone();
        bad[16..18].copy_from_slice(&0u16.to_be_bytes());
        assert_eq!(Request::decode(&bad), Err(WireError::BadNameLength(0)));
        // A compression pointer instead of the signer's labels.
        let mut bad = bytes.clone();
        bad[18] = 0xc0;
        assert!(matches!(Request::decode(&bad), Err(WireError::BadName(_))));
    }

    #[test]
    fn rewrite_times_touches_only_offsets_8_to_16() {
        let req = Request::decode(&vector("request-ok.hex")).unwrap();
        let mut data = req.data.clone();
        rewrite_times(&mut data, 1000, 2000).unwrap();
        assert_eq!(read_times(&data), Some((1000, 2000)));
        assert_eq!(&data[..8], &req.data[..8]);
        assert_eq!(&data[16..], &req.data[16..]);
        assert!(rewrite_times(&mut [0u8; 18], 1, 2).is_err());
    }

    #[test]
    fn reply_encoding_checks_invariants() {
        let mut r = Reply::error(1, Status::Unavailable);
        r.signature = vec![1];
        assert_eq!(r.encode(), Err(WireError::SignatureOnError));
        let r = Reply::ok(1, 1, 2, vec![0; MAX_SIGNATURE_LEN + 1]);
        assert!(matches!(r.encode(), Err(WireError::BadSignatureLength(_))));
        assert_eq!(Status::from_code(200), Status::Other(200));
        assert_eq!(Status::from_code(Status::SignerFailed.code()), Status::SignerFailed);
    }
}
