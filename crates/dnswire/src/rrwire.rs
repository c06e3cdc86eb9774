//! DNS messages read as wire bytes, for what must not depend on a full decoder.
//!
//! Zone transfers and checkpoint digests must work for every record named
//! accepts, including rdata hickory-proto refuses (a NAPTR whose flag byte is
//! 0xff, say). This reader only walks the message: names are decompressed,
//! and a record's rdata is kept as bytes, with the embedded names of the types
//! that RFC 3597 section 4 lets a server compress (NS, MD, MF, CNAME, SOA, MB,
//! MG, MR, PTR, MINFO, MX) decompressed and lowercased, so the result is the
//! record's canonical form (RFC 4034 section 6.2 for those types) whatever
//! compression named chose. Every other rdata is taken as its raw bytes.

/// Compression pointers followed for one name; a longer chain is a loop.
const MAX_POINTERS: usize = 64;
/// Records read from one message (a 64 KiB message cannot hold more).
const MAX_RECORDS: usize = 65_535 / 11;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    #[error("message ends inside {0}")]
    Short(&'static str),
    #[error("bad name at offset {0}: {1}")]
    BadName(usize, &'static str),
    #[error("rdata of type {rtype} does not match its length")]
    BadRdata { rtype: u16 },
    #[error("{0} bytes after the last record")]
    Trailing(usize),
    #[error("too many records")]
    TooManyRecords,
    #[error("{0} signature records; at most one, and it must be the last record")]
    MisplacedSignature(usize),
}

/// The fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawHeader {
    pub id: u16,
    pub flags: u16,
    pub qdcount: u16,
    pub ancount: u16,
    pub nscount: u16,
    pub arcount: u16,
}

impl RawHeader {
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        let h = bytes.get(..12).ok_or(WireError::Short("the header"))?;
        let w = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
        Ok(RawHeader { id: w(0), flags: w(2), qdcount: w(4), ancount: w(6), nscount: w(8), arcount: w(10) })
    }
    pub fn is_response(&self) -> bool {
        self.flags & 0x8000 != 0
    }
    pub fn opcode(&self) -> u8 {
        ((self.flags >> 11) & 0x0f) as u8
    }
    pub fn truncated(&self) -> bool {
        self.flags & 0x0200 != 0
    }
    /// The 4-bit header rcode (without EDNS's extension).
    pub fn rcode(&self) -> u8 {
        (self.flags & 0x000f) as u8
    }
}

/// One question: the name in uncompressed wire form (case kept), type and class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawQuestion {
    pub name: Vec<u8>,
    pub qtype: u16,
    pub qclass: u16,
    /// The question's bytes as they stand in the message (possibly compressed).
    pub span: std::ops::Range<usize>,
}

/// One resource record in canonical form (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRecord {
    /// Owner name, uncompressed and lowercased.
    pub owner: Vec<u8>,
    pub rtype: u16,
    pub class: u16,
    pub ttl: u32,
    pub rdata: Vec<u8>,
    /// The record's bytes as they stand in the message.
    pub span: std::ops::Range<usize>,
}

impl RawRecord {
    /// owner | type | class | ttl | rdlength | rdata, all uncompressed.
    pub fn to_wire(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.owner.len() + 10 + self.rdata.len());
        out.extend_from_slice(&self.owner);
        out.extend_from_slice(&self.rtype.to_be_bytes());
        out.extend_from_slice(&self.class.to_be_bytes());
        out.extend_from_slice(&self.ttl.to_be_bytes());
        // rdata came from a u16-length field, decompression can only grow it to
        // at most 255 bytes per name; clamp rather than panic on the impossible.
        out.extend_from_slice(&u16::try_from(self.rdata.len()).unwrap_or(u16::MAX).to_be_bytes());
        out.extend_from_slice(&self.rdata);
        out
    }

    /// The serial of an SOA record (canonical rdata: two names, then serial).
    pub fn soa_serial(&self) -> Option<u32> {
        if self.rtype != TYPE_SOA {
            return None;
        }
        soa_rdata_serial(&self.rdata)
    }
}

pub const TYPE_SOA: u16 = 6;
pub const TYPE_OPT: u16 = 41;
pub const TYPE_TSIG: u16 = 250;
pub const TYPE_IXFR: u16 = 251;
pub const TYPE_AXFR: u16 = 252;

/// A whole message, every section walked.
#[derive(Debug, Clone)]
pub struct RawMessage {
    pub header: RawHeader,
    pub questions: Vec<RawQuestion>,
    pub answers: Vec<RawRecord>,
    pub authorities: Vec<RawRecord>,
    pub additionals: Vec<RawRecord>,
}

impl RawMessage {
    /// Reads every section; bytes after the last record are an error (named
    /// answers FORMERR to such a request too).
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        let header = RawHeader::parse(bytes)?;
        let total = usize::from(header.ancount) + usize::from(header.nscount) + usize::from(header.arcount);
        if total + usize::from(header.qdcount) > MAX_RECORDS {
            return Err(WireError::TooManyRecords);
        }
        let mut pos = 12;
        let mut questions = Vec::new();
        for _ in 0..header.qdcount {
            let start = pos;
            let (name, next) = read_name(bytes, pos)?;
            let f = bytes.get(next..next + 4).ok_or(WireError::Short("a question"))?;
            pos = next + 4;
            questions.push(RawQuestion { name, qtype: u16::from_be_bytes([f[0], f[1]]), qclass: u16::from_be_bytes([f[2], f[3]]), span: start..pos });
        }
        let section = |count: u16, pos: &mut usize| -> Result<Vec<RawRecord>, WireError> {
            let mut out = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let (r, next) = read_record(bytes, *pos)?;
                *pos = next;
                out.push(r);
            }
            Ok(out)
        };
        let answers = section(header.ancount, &mut pos)?;
        let authorities = section(header.nscount, &mut pos)?;
        let additionals = section(header.arcount, &mut pos)?;
        if pos != bytes.len() {
            return Err(WireError::Trailing(bytes.len() - pos));
        }
        Ok(RawMessage { header, questions, answers, authorities, additionals })
    }

    /// The OPT record, if any.
    pub fn opt(&self) -> Option<&RawRecord> {
        self.additionals.iter().find(|r| r.rtype == TYPE_OPT)
    }

    /// The TSIG record, if the message is signed (it must be the last record).
    pub fn tsig(&self) -> Option<&RawRecord> {
        self.additionals.last().filter(|r| r.rtype == TYPE_TSIG)
    }
}

/// The value of the first option `code` in an OPT record's rdata; `None` when it is
/// absent or the option list is malformed.
pub fn opt_option(rdata: &[u8], code: u16) -> Option<&[u8]> {
    let mut rest = rdata;
    while let Some(head) = rest.get(..4) {
        let (c, len) = (u16::from_be_bytes([head[0], head[1]]), usize::from(u16::from_be_bytes([head[2], head[3]])));
        let value = rest.get(4..4 + len)?;
        if c == code {
            return Some(value);
        }
        rest = &rest[4 + len..];
    }
    None
}

/// Reads a possibly compressed name at `pos`; returns it uncompressed (case
/// kept) and the offset just after it in the message.
pub fn read_name(msg: &[u8], mut pos: usize) -> Result<(Vec<u8>, usize), WireError> {
    let start = pos;
    let mut name = Vec::with_capacity(32);
    let mut end = None;
    let mut pointers = 0;
    loop {
        let len = *msg.get(pos).ok_or(WireError::Short("a name"))?;
        match len & 0xc0 {
            0x00 => {
                let len = usize::from(len);
                if len == 0 {
                    name.push(0);
                    if name.len() > 255 {
                        return Err(WireError::BadName(start, "longer than 255 bytes"));
                    }
                    return Ok((name, end.unwrap_or(pos + 1)));
                }
                let label = msg.get(pos + 1..pos + 1 + len).ok_or(WireError::Short("a label"))?;
                name.push(len as u8);
                name.extend_from_slice(label);
                if name.len() > 255 {
                    return Err(WireError::BadName(start, "longer than 255 bytes"));
                }
                pos += 1 + len;
            }
            0xc0 => {
                let low = *msg.get(pos + 1).ok_or(WireError::Short("a pointer"))?;
                let target = usize::from(u16::from_be_bytes([len & 0x3f, low]));
                if end.is_none() {
                    end = Some(pos + 2);
                }
                pointers += 1;
                // Only backwards pointers: a forward or self pointer cannot be a
                // compression of something already written, and a loop needs one.
                if target >= pos || pointers > MAX_POINTERS {
                    return Err(WireError::BadName(start, "compression loop or forward pointer"));
                }
                pos = target;
            }
            _ => return Err(WireError::BadName(start, "reserved label type")),
        }
    }
}

/// The serial of an SOA's rdata in canonical form (names uncompressed); `None` when cut.
pub fn soa_rdata_serial(rdata: &[u8]) -> Option<u32> {
    let after_mname = skip_plain_name(rdata, 0)?;
    let after_rname = skip_plain_name(rdata, after_mname)?;
    let s = rdata.get(after_rname..after_rname + 4)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

/// Skips an uncompressed name inside canonical rdata; the offset after it.
fn skip_plain_name(data: &[u8], mut pos: usize) -> Option<usize> {
    for _ in 0..128 {
        let len = usize::from(*data.get(pos)?);
        if len == 0 {
            return Some(pos + 1);
        }
        if len & 0xc0 != 0 {
            return None;
        }
        pos += 1 + len;
    }
    None
}

/// A record in [`RawRecord::to_wire`] form, split without copying: (owner, type, class,
/// ttl, rdata).
pub type SplitRecord<'a> = (&'a [u8], u16, u16, u32, &'a [u8]);

/// `record` ([`RawRecord::to_wire`] form) split; `None` unless it is exactly one record
/// (rdata as long as RDLENGTH says).
pub fn split_record(record: &[u8]) -> Option<SplitRecord<'_>> {
    let n = skip_plain_name(record, 0)?;
    let f = record.get(n..n + 10)?;
    let rdata = record.get(n + 10..)?;
    if rdata.len() != usize::from(u16::from_be_bytes([f[8], f[9]])) {
        return None;
    }
    Some((&record[..n], u16::from_be_bytes([f[0], f[1]]), u16::from_be_bytes([f[2], f[3]]), u32::from_be_bytes([f[4], f[5], f[6], f[7]]), rdata))
}

/// Lower-cases the ASCII letters of an uncompressed wire name.
pub fn lowercase_name(name: &mut [u8]) {
    // Label length bytes are below 64, never in 'A'..='Z' (65..=90).
    let mut i = 0;
    while i < name.len() {
        let len = usize::from(name[i]);
        let end = (i + 1 + len).min(name.len());
        name[i + 1..end].make_ascii_lowercase();
        i = end;
        if len == 0 {
            break;
        }
    }
}

/// How the rdata of a compressible type is laid out: `N` a name, `F(k)` k fixed bytes.
#[derive(Clone, Copy)]
enum Part {
    N,
    F(usize),
}

/// RFC 3597 section 4: the types whose rdata names a server may compress.
fn compressible_layout(rtype: u16) -> Option<&'static [Part]> {
    use Part::*;
    Some(match rtype {
        // NS, MD, MF, CNAME, MB, MG, MR, PTR
        2 | 3 | 4 | 5 | 7 | 8 | 9 | 12 => &[N],
        // SOA: mname rname serial refresh retry expire minimum
        6 => &[N, N, F(20)],
        // MINFO: rmailbx emailbx
        14 => &[N, N],
        // MX: preference exchange
        15 => &[F(2), N],
        _ => return None,
    })
}

fn read_record(msg: &[u8], pos: usize) -> Result<(RawRecord, usize), WireError> {
    read_record_as(msg, pos, true)
}

/// The record at `pos` of `msg` with its owner and the names of compressible rdata
/// decompressed but their case kept (what a zone-file writer needs; comparisons want
/// the lowercased form [`RawMessage::parse`] gives), and where the next one begins.
pub fn read_record_case_kept(msg: &[u8], pos: usize) -> Result<(RawRecord, usize), WireError> {
    read_record_as(msg, pos, false)
}

fn read_record_as(msg: &[u8], pos: usize, lowercase: bool) -> Result<(RawRecord, usize), WireError> {
    let fold = |n: &mut Vec<u8>| {
        if lowercase {
            lowercase_name(n)
        }
    };
    let (mut owner, next) = read_name(msg, pos)?;
    fold(&mut owner);
    let f = msg.get(next..next + 10).ok_or(WireError::Short("a record"))?;
    let rtype = u16::from_be_bytes([f[0], f[1]]);
    let class = u16::from_be_bytes([f[2], f[3]]);
    let ttl = u32::from_be_bytes([f[4], f[5], f[6], f[7]]);
    let rdlen = usize::from(u16::from_be_bytes([f[8], f[9]]));
    let rstart = next + 10;
    let rend = rstart + rdlen;
    let raw = msg.get(rstart..rend).ok_or(WireError::Short("rdata"))?;
    let rdata = match compressible_layout(rtype) {
        // An empty rdata (an update's "delete RRset") has no names to read.
        Some(layout) if rdlen > 0 => {
            let mut out = Vec::with_capacity(rdlen);
            let mut p = rstart;
            for part in layout {
                match *part {
                    Part::N => {
                        if p >= rend {
                            return Err(WireError::BadRdata { rtype });
                        }
                        let (mut n, after) = read_name(msg, p)?;
                        fold(&mut n);
                        out.extend_from_slice(&n);
                        p = after;
                    }
                    Part::F(k) => {
                        out.extend_from_slice(msg.get(p..p + k).ok_or(WireError::BadRdata { rtype })?);
                        p += k;
                    }
                }
            }
            if p != rend {
                return Err(WireError::BadRdata { rtype });
            }
            out
        }
        _ => raw.to_vec(),
    };
    Ok((RawRecord { owner, rtype, class, ttl, rdata, span: pos..rend }, rend))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_in_wire_form_splits_back_into_its_fields() {
        let r = RawRecord { owner: b"\x03www\x07example\x00".to_vec(), rtype: 1, class: 1, ttl: 300, rdata: vec![192, 0, 2, 1], span: 0..0 };
        let wire = r.to_wire();
        assert_eq!(split_record(&wire), Some((&r.owner[..], 1, 1, 300, &r.rdata[..])));
        assert_eq!(split_record(&wire[..wire.len() - 1]), None, "rdata shorter than RDLENGTH");
        let mut long = wire.clone();
        long.push(0);
        assert_eq!(split_record(&long), None, "bytes after the rdata");
        assert_eq!(split_record(b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x01\x2c\x00\x00"), None, "a compressed owner is not wire form");
    }

    fn name(s: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for l in s.trim_end_matches('.').split('.').filter(|l| !l.is_empty()) {
            out.push(l.len() as u8);
            out.extend_from_slice(l.as_bytes());
        }
        out.push(0);
        out
    }

    fn header(id: u16, flags: u16, counts: [u16; 4]) -> Vec<u8> {
        let mut h = id.to_be_bytes().to_vec();
        h.extend_from_slice(&flags.to_be_bytes());
        for c in counts {
            h.extend_from_slice(&c.to_be_bytes());
        }
        h
    }

    fn record_head(rtype: u16, ttl: u32, rdlen: u16) -> Vec<u8> {
        let mut out = rtype.to_be_bytes().to_vec();
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&rdlen.to_be_bytes());
        out
    }

    #[test]
    fn compressed_soa_and_odd_naptr_read_canonically() {
        // Question "Example.TEST. SOA IN", an SOA answer with compressed names,
        // and a NAPTR with a 0xff flag byte that full decoders reject.
        let mut m = header(7, 0x8400, [1, 2, 0, 0]);
        m.extend(name("Example.TEST"));
        m.extend_from_slice(&[0, 6, 0, 1]);
        // SOA: owner -> pointer to 12; mname ns0.<ptr 12>; rname h.<ptr 12>
        let mut rdata = vec![3, b'N', b's', b'0', 0xc0, 12, 1, b'h', 0xc0, 12];
        rdata.extend_from_slice(&[0, 0, 0, 42]);
        rdata.extend_from_slice(&[0u8; 16]);
        m.extend_from_slice(&[0xc0, 12]);
        m.extend(record_head(6, 300, rdata.len() as u16));
        m.extend(rdata);
        let naptr = [0x00, 0x64, 0x00, 0x0a, 0x01, 0xff, 0x00, 0x00, 0x00];
        m.extend_from_slice(&[0xc0, 12]);
        m.extend(record_head(35, 300, 9));
        m.extend_from_slice(&naptr);

        let parsed = RawMessage::parse(&m).unwrap();
        assert_eq!(parsed.header.id, 7);
        assert_eq!(parsed.questions[0].name, name("Example.TEST"));
        let soa = &parsed.answers[0];
        assert_eq!(soa.owner, name("example.test"));
        assert_eq!(soa.soa_serial(), Some(42));
        let mut want = name("ns0.example.test");
        want.extend(name("h.example.test"));
        want.extend_from_slice(&[0, 0, 0, 42]);
        want.extend_from_slice(&[0u8; 16]);
        assert_eq!(soa.rdata, want);
        assert_eq!(parsed.answers[1].rdata, naptr);
        let wire = parsed.answers[1].to_wire();
        assert_eq!(&wire[wire.len() - 9..], &naptr);
    }

    #[test]
    fn loops_forward_pointers_and_overruns_are_errors() {
        let mut m = header(1, 0, [1, 0, 0, 0]);
        m.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]); // points at itself
        assert!(matches!(RawMessage::parse(&m), Err(WireError::BadName(..))));
        let mut m = header(1, 0, [1, 0, 0, 0]);
        m.extend_from_slice(&[0xc0, 14, 0, 0, 1, 0, 1]); // forward
        assert!(matches!(RawMessage::parse(&m), Err(WireError::BadName(..))));
        let mut m = header(1, 0, [1, 0, 0, 0]);
        m.extend_from_slice(&[5, b'a']);
        assert!(matches!(RawMessage::parse(&m), Err(WireError::Short(_))));
        let mut m = header(1, 0, [0, 1, 0, 0]);
        m.push(0);
        m.extend(record_head(15, 1, 3)); // MX rdata too short for its name
        m.extend_from_slice(&[0, 1, 9]);
        assert!(RawMessage::parse(&m).is_err());
        let mut m = header(1, 0, [0, 0, 0, 0]);
        m.push(0);
        assert_eq!(RawMessage::parse(&m).unwrap_err(), WireError::Trailing(1));
        // Labels summing over 255 bytes.
        let mut m = header(1, 0, [1, 0, 0, 0]);
        for _ in 0..5 {
            m.push(63);
            m.extend_from_slice(&[b'a'; 63]);
        }
        m.extend_from_slice(&[0, 0, 1, 0, 1]);
        assert!(matches!(RawMessage::parse(&m), Err(WireError::BadName(..))));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut noise = testkit::Noise::new(0x243f6a8885a308d3);
        for len in 0..2000 {
            let buf = noise.bytes(len % 300);
            let _ = RawMessage::parse(&buf);
        }
    }

    #[test]
    fn opt_options_are_found_by_code_and_malformed_lists_find_nothing() {
        let rdata = [0, 10, 0, 2, 0xaa, 0xbb, 0xfe, 0x12, 0, 3, b'a', b'b', b'c'];
        assert_eq!(opt_option(&rdata, 10), Some(&[0xaa, 0xbb][..]));
        assert_eq!(opt_option(&rdata, 0xfe12), Some(&b"abc"[..]));
        assert_eq!(opt_option(&rdata, 11), None);
        assert_eq!(opt_option(&[], 10), None);
        // The second option claims more bytes than there are.
        assert_eq!(opt_option(&rdata[..12], 0xfe12), None);
        for len in 0..rdata.len() {
            let _ = opt_option(&rdata[..len], 0xfe12);
        }
    }
}
