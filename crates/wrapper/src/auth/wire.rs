//! Just enough DNS wire walking to find a request's signature record and the byte
//! ranges a TSIG MAC or a SIG(0) covers. hickory-proto decodes messages but does not
//! say where a record starts, and both MACs are defined over the exact bytes sent.

use thiserror::Error;

pub const TYPE_SIG: u16 = 24;
pub const TYPE_TSIG: u16 = 250;
pub const CLASS_ANY: u16 = 255;
pub const HEADER_LEN: usize = 12;
/// A name has at most 255 bytes; pointer chains longer than this are loops.
const MAX_POINTERS: usize = 64;

#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    #[error("message ends inside {0}")]
    Truncated(&'static str),
    #[error("bad name: {0}")]
    BadName(&'static str),
    #[error("{0} signature records; at most one, and it must be the last record")]
    MisplacedSignature(usize),
}

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
/// just after it in the message (after the first pointer, if any).
pub fn read_name(msg: &[u8], at: usize) -> Result<(Vec<u8>, usize), WireError> {
    let mut out = Vec::new();
    let mut pos = at;
    let mut end = None;
    let mut pointers = 0;
    loop {
        let len = *msg.get(pos).ok_or(WireError::Truncated("a name"))? as usize;
        match len & 0xc0 {
            0x00 => {
                if len == 0 {
                    out.push(0);
                    return Ok((out, end.unwrap_or(pos + 1)));
                }
                let label = msg.get(pos + 1..pos + 1 + len).ok_or(WireError::Truncated("a label"))?;
                out.push(len as u8);
                out.extend(label.iter().map(u8::to_ascii_lowercase));
                if out.len() > 255 {
                    return Err(WireError::BadName("longer than 255 bytes"));
                }
                pos += 1 + len;
            }
            0xc0 => {
                let lo = *msg.get(pos + 1).ok_or(WireError::Truncated("a pointer"))? as usize;
                if end.is_none() {
                    end = Some(pos + 2);
                }
                pointers += 1;
                if pointers > MAX_POINTERS {
                    return Err(WireError::BadName("compression loop"));
                }
                pos = ((len & 0x3f) << 8) | lo;
            }
            _ => return Err(WireError::BadName("reserved label type")),
        }
    }
}

fn read_record(msg: &[u8], at: usize) -> Result<(RecordAt, usize), WireError> {
    let (owner, pos) = read_name(msg, at)?;
    let fixed = msg.get(pos..pos + 10).ok_or(WireError::Truncated("a record header"))?;
    let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
    let class = u16::from_be_bytes([fixed[2], fixed[3]]);
    let ttl = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
    let rdlen = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
    let rdata = pos + 10;
    if rdata + rdlen > msg.len() {
        return Err(WireError::Truncated("rdata"));
    }
    Ok((RecordAt { start: at, owner, rtype, class, ttl, rdata, rdlen }, rdata + rdlen))
}

/// Walks the whole message. A TSIG or SIG(0) anywhere but last is an error
/// (RFC 8945 5.1, RFC 2931 3), as is more than one.
pub fn layout(msg: &[u8]) -> Result<Layout, WireError> {
    if msg.len() < HEADER_LEN {
        return Err(WireError::Truncated("the header"));
    }
    let count = |i: usize| u16_at(msg, 4 + 2 * i).unwrap_or(0);
    let (qdcount, ancount, nscount, arcount) = (count(0), count(1), count(2), count(3));
    let mut pos = HEADER_LEN;
    for _ in 0..qdcount {
        let (_, p) = read_name(msg, pos)?;
        pos = p + 4;
        if pos > msg.len() {
            return Err(WireError::Truncated("a question"));
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
    Ok(Layout {
        id: u16_at(msg, 0).unwrap_or(0),
        flags: u16_at(msg, 2).unwrap_or(0),
        qdcount,
        arcount,
        question_end,
        signature: last,
    })
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
    fn names_follow_pointers_and_stop_loops() {
        // "a" at 0, then a pointer to 0 at 3.
        let msg = [1, b'A', 0, 0xc0, 0];
        assert_eq!(read_name(&msg, 0).unwrap(), (vec![1, b'a', 0], 3));
        assert_eq!(read_name(&msg, 3).unwrap(), (vec![1, b'a', 0], 5));
        let lp = [0xc0, 0];
        assert_eq!(read_name(&lp, 0), Err(WireError::BadName("compression loop")));
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
}
