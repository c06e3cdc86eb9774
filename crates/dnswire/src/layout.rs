//! Where a request's records start, found by walking its bytes: enough to find its
//! signature record (TSIG or SIG(0)) and the byte ranges their MACs cover, which are
//! defined over the exact bytes sent.

use crate::rrwire::{self, WireError};

pub use crate::rrwire::TYPE_TSIG;
pub const TYPE_SIG: u16 = 24;
pub const CLASS_ANY: u16 = 255;
pub const HEADER_LEN: usize = 12;

/// One resource record's position in a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordAt {
    /// Offset of the owner name (where the record starts).
    pub start: usize,
    /// Owner name, lower case, uncompressed wire form.
    pub owner: Vec<u8>,
    pub rtype: u16,
    pub class: u16,
    pub ttl: u32,
    /// Offset and length of the rdata.
    pub rdata: usize,
    pub rdlen: usize,
}

/// A parsed request: header fields, where the question section ends, and its last
/// additional record if that is a TSIG or a SIG(0).
#[derive(Debug, Clone)]
pub struct Layout {
    pub id: u16,
    pub flags: u16,
    pub qdcount: u16,
    pub arcount: u16,
    /// End of the question (zone) section.
    pub question_end: usize,
    /// The signature record (TSIG or SIG), when the last additional record is one.
    pub signature: Option<RecordAt>,
}

pub fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

pub fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes([*b.get(at)?, *b.get(at + 1)?, *b.get(at + 2)?, *b.get(at + 3)?]))
}

/// Reads the name at `at`; returns it lower-cased and uncompressed, and the offset
/// just after it in the message. Compression as [`rrwire::read_name`] allows it.
pub fn read_name(msg: &[u8], at: usize) -> Result<(Vec<u8>, usize), WireError> {
    let (mut name, next) = rrwire::read_name(msg, at)?;
    rrwire::lowercase_name(&mut name);
    Ok((name, next))
}

fn read_record(msg: &[u8], at: usize) -> Result<(RecordAt, usize), WireError> {
    let (owner, pos) = read_name(msg, at)?;
    let fixed = msg.get(pos..pos + 10).ok_or(WireError::Short("a record header"))?;
    let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
    let class = u16::from_be_bytes([fixed[2], fixed[3]]);
    let ttl = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
    let rdlen = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
    let rdata = pos + 10;
    if rdata + rdlen > msg.len() {
        return Err(WireError::Short("rdata"));
    }
    Ok((RecordAt { start: at, owner, rtype, class, ttl, rdata, rdlen }, rdata + rdlen))
}

/// Walks the whole message. A TSIG or SIG(0) anywhere but last is an error
/// (RFC 8945 5.1, RFC 2931 3), as is more than one.
pub fn layout(msg: &[u8]) -> Result<Layout, WireError> {
    if msg.len() < HEADER_LEN {
        return Err(WireError::Short("the header"));
    }
    let count = |i: usize| u16_at(msg, 4 + 2 * i).unwrap_or(0);
    let (qdcount, ancount, nscount, arcount) = (count(0), count(1), count(2), count(3));
    let mut pos = HEADER_LEN;
    for _ in 0..qdcount {
        let (_, p) = rrwire::read_name(msg, pos)?;
        pos = p + 4;
        if pos > msg.len() {
            return Err(WireError::Short("a question"));
        }
    }
    let question_end = pos;
    let total = usize::from(ancount) + usize::from(nscount) + usize::from(arcount);
    let mut signatures = 0;
    let mut last = None;
    for i in 0..total {
        let (rec, p) = read_record(msg, pos)?;
        pos = p;
        let is_sig = rec.rtype == TYPE_TSIG || (rec.rtype == TYPE_SIG && sig0_covered(msg, &rec));
        if is_sig {
            signatures += 1;
            if i + 1 != total || i < total - usize::from(arcount) {
                return Err(WireError::MisplacedSignature(signatures));
            }
            last = Some(rec);
        }
    }
    Ok(Layout { id: u16_at(msg, 0).unwrap_or(0), flags: u16_at(msg, 2).unwrap_or(0), qdcount, arcount, question_end, signature: last })
}

/// A SIG record is a SIG(0) when it covers type 0 (RFC 2931 3.1).
fn sig0_covered(msg: &[u8], rec: &RecordAt) -> bool {
    rec.rdlen >= 2 && u16_at(msg, rec.rdata) == Some(0)
}

/// Presentation name (`a.b.`) to lower-case wire form.
pub fn name_to_wire(name: &str) -> Option<Vec<u8>> {
    let name = name.trim_end_matches('.');
    let mut out = Vec::new();
    if !name.is_empty() {
        for label in name.split('.') {
            if label.is_empty() || label.len() > 63 {
                return None;
            }
            out.push(label.len() as u8);
            out.extend(label.bytes().map(|b| b.to_ascii_lowercase()));
        }
    }
    out.push(0);
    (out.len() <= 255).then_some(out)
}

/// Wire name to presentation form with the trailing dot (for logs and errors).
pub fn wire_to_text(wire: &[u8]) -> String {
    let mut out = String::new();
    let mut pos = 0;
    while let Some(&len) = wire.get(pos) {
        if len == 0 {
            break;
        }
        let label = wire.get(pos + 1..pos + 1 + usize::from(len)).unwrap_or_default();
        out.push_str(&String::from_utf8_lossy(label));
        out.push('.');
        pos += 1 + usize::from(len);
    }
    if out.is_empty() {
        out.push('.');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lowercased_and_pointers_go_backwards_only() {
        // "A" at 0, then a pointer to 0 at 3.
        let msg = [1, b'A', 0, 0xc0, 0];
        assert_eq!(read_name(&msg, 0).unwrap(), (vec![1, b'a', 0], 3));
        assert_eq!(read_name(&msg, 3).unwrap(), (vec![1, b'a', 0], 5));
        // A pointer to itself, and one forward: BIND refuses both, so do we.
        assert!(matches!(read_name(&[0xc0, 0], 0), Err(WireError::BadName(0, _))));
        assert!(matches!(read_name(&[0xc0, 2, 0], 0), Err(WireError::BadName(0, _))));
        assert!(read_name(&[3, b'a'], 0).is_err());
        assert!(read_name(&[0x80], 0).is_err());
    }

    #[test]
    fn name_conversion() {
        assert_eq!(name_to_wire("Ab.c.").unwrap(), vec![2, b'a', b'b', 1, b'c', 0]);
        assert_eq!(name_to_wire(".").unwrap(), vec![0]);
        assert!(name_to_wire("a..b").is_none());
        assert_eq!(wire_to_text(&[2, b'a', b'b', 0]), "ab.");
    }

    #[test]
    fn a_signature_must_be_the_last_record() {
        let key = crate::tsig::Key::new("k.", crate::tsig::Algorithm::HmacSha256, b"0123456789abcdef").unwrap();
        let mut msg = vec![0, 1, 0x28, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        msg.extend_from_slice(&[4, b't', b'e', b's', b't', 0, 0, 6, 0, 1]);
        let signed = crate::tsig::sign(&msg, &key, 1, 300, 0, vec![], None);
        let l = layout(&signed).unwrap();
        assert_eq!(l.signature.as_ref().map(|r| r.rtype), Some(TYPE_TSIG));
        assert_eq!(l.question_end, msg.len());
        // The same TSIG twice: the first is not last.
        let sig = &signed[msg.len()..];
        let mut twice = signed.clone();
        twice.extend_from_slice(sig);
        twice[11] = 2;
        assert_eq!(layout(&twice).unwrap_err(), WireError::MisplacedSignature(1));
    }
}
