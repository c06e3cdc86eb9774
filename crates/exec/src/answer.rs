//! Answers the wrapper makes itself (REFUSED by an address ACL, SERVFAIL when
//! named cannot be reached), shaped as named shapes its own error answers, so a
//! client cannot tell who answered: the request's id, opcode, RD and CD bits,
//! its question, and an OPT record when the request had one (named's UDP size,
//! the DO bit echoed). Built from the request's bytes with `rrwire`, so it works
//! for anything named would have parsed.
//!
//! What named adds that the wrapper cannot: a TSIG signature over the answer
//! (the wrapper holds no verified key for the request); docs/CONFORMANCE.md
//! lists that difference.

use dnswire::rrwire::{RawHeader, RawMessage, TYPE_OPT};

/// named's `edns-udp-size` default (BIND 9.18), which its OPT advertises.
pub const NAMED_EDNS_UDP_SIZE: u16 = 1232;

pub const RCODE_FORMERR: u8 = 1;
pub const RCODE_SERVFAIL: u8 = 2;
pub const RCODE_REFUSED: u8 = 5;

/// Whether the whole of `request` parses as a DNS message.
pub fn parses(request: &[u8]) -> bool {
    RawMessage::parse(request).is_ok()
}

/// The error answer named would give to `request` with `rcode`; `None` for a
/// response or a runt, which named never answers.
pub fn error_answer(request: &[u8], rcode: u8) -> Option<Vec<u8>> {
    let header = RawHeader::parse(request).ok()?;
    if header.is_response() {
        return None;
    }
    // QR, the request's opcode, RD and CD kept; AA, TC, RA, AD cleared.
    let flags = 0x8000 | (header.flags & 0x7800) | (header.flags & 0x0100) | (header.flags & 0x0010) | u16::from(rcode & 0x0f);
    let parsed = RawMessage::parse(request).ok();
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&header.id.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    let (questions, opt) = match &parsed {
        Some(m) => (m.questions.as_slice(), m.opt()),
        None => (&[][..], None),
    };
    // At most the request's own qdcount, so it fits.
    out.extend_from_slice(&u16::try_from(questions.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&u16::from(opt.is_some()).to_be_bytes());
    for q in questions {
        out.extend_from_slice(&q.name);
        out.extend_from_slice(&q.qtype.to_be_bytes());
        out.extend_from_slice(&q.qclass.to_be_bytes());
    }
    if let Some(opt) = opt {
        // Root owner, OPT, UDP size, extended rcode 0, version 0, DO echoed, no options.
        let do_bit = (opt.ttl & 0x8000) as u16;
        out.push(0);
        out.extend_from_slice(&TYPE_OPT.to_be_bytes());
        out.extend_from_slice(&NAMED_EDNS_UDP_SIZE.to_be_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&do_bit.to_be_bytes());
        out.extend_from_slice(&[0, 0]);
    }
    Some(out)
}

/// The SERVFAIL named would give for a request (id, opcode, question, OPT kept).
pub fn servfail(request: &[u8]) -> Option<Vec<u8>> {
    error_answer(request, RCODE_SERVFAIL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
    use hickory_proto::rr::{Name, RecordType};
    use std::str::FromStr;

    #[test]
    fn refusal_keeps_id_question_and_opt() {
        let mut m = Message::new(0xbeef, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_str("Www.Example.test.").unwrap(), RecordType::AAAA));
        let mut edns = Edns::new();
        edns.set_max_payload(4096);
        edns.set_dnssec_ok(true);
        m.set_edns(edns);
        let req = m.to_vec().unwrap();
        let a = error_answer(&req, RCODE_REFUSED).unwrap();
        let r = Message::from_vec(&a).unwrap();
        assert_eq!(r.metadata.id, 0xbeef);
        assert_eq!(r.metadata.message_type, MessageType::Response);
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
        assert!(r.metadata.recursion_desired && !r.metadata.authoritative);
        assert_eq!(r.queries[0].query_type(), RecordType::AAAA);
        // The question's bytes as the client wrote them.
        let question = 12..12 + "www.example.test.".len() + 1 + 4;
        assert_eq!(a[question.clone()], req[question]);
        let e = r.edns.expect("OPT echoed");
        assert_eq!(e.max_payload(), NAMED_EDNS_UDP_SIZE);
        assert!(e.flags().dnssec_ok);
        assert!(error_answer(&a, RCODE_REFUSED).is_none(), "responses are never answered");
        assert!(error_answer(&a[..5], RCODE_REFUSED).is_none());
    }

    #[test]
    fn unparseable_request_gets_a_bare_header() {
        let req = [0x12, 0x34, 0x28, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1];
        let a = error_answer(&req, RCODE_FORMERR).unwrap();
        assert_eq!(a, [0x12, 0x34, 0xa8, 0x01, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
}
