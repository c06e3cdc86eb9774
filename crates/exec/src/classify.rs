//! Deciding, before ordering, what a client's DNS message is.
//!
//! The wrapper does not interpret requests beyond this: every message that passes is
//! ordered and handed to named byte for byte (TSIG-signed updates stay verifiable by
//! named). The message is only walked (`dnswire::rrwire`), never fully decoded:
//! where the classifier cannot tell, named decides, so a replica answers whatever
//! its named would answer for the same bytes. A query that does not parse goes to
//! named as a read (named answers FORMERR, or stays silent, as it does directly);
//! an UPDATE is always a write, parsed or not, and the update authentication decides
//! it ([`precheck`] before ordering, the execution core's gate after): one that cannot
//! be read carries no signature, so it is answered FORMERR and never reaches named.
//! Updates of the zone's key material (DNSKEY, CDS, CDNSKEY, NSEC3PARAM,
//! BIND's private type 65534, and "delete everything" at the apex) are refused by
//! named's own update-policy, which named-glue writes with those denials: named
//! signs that REFUSED with the request's TSIG key, as any other answer.

use dnswire::rrwire::{RawHeader, RawMessage, TYPE_AXFR, TYPE_IXFR};

/// What the executor must do with an ordered request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Changes nothing: only the replica that owes the answer executes it.
    Read,
    /// A zone transfer (AXFR/IXFR over TCP): a read whose answer may be many messages.
    Transfer,
    /// A dynamic update: every replica executes it.
    Write,
}

/// The classifier's verdict on one client message.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Order it and execute it as this kind.
    Order(Kind),
    /// Answer at once with these bytes, without ordering.
    Answer(Vec<u8>),
    /// Ignore silently (responses, runts), as named does: answering could feed a
    /// reflection loop.
    Drop(&'static str),
}

const OPCODE_UPDATE: u8 = 5;
const OPCODE_QUERY: u8 = 0;

pub fn classify(bytes: &[u8], transport_is_tcp: bool) -> Verdict {
    let Ok(header) = RawHeader::parse(bytes) else {
        return Verdict::Drop("shorter than a DNS header");
    };
    if header.is_response() {
        return Verdict::Drop("a response, not a request");
    }
    match header.opcode() {
        OPCODE_UPDATE => Verdict::Order(Kind::Write),
        OPCODE_QUERY if transport_is_tcp => {
            // Only a question named can read makes a transfer; anything else it
            // answers in one message.
            let transfer = RawMessage::parse(bytes).is_ok_and(|m| m.questions.iter().any(|q| q.qtype == TYPE_AXFR || q.qtype == TYPE_IXFR));
            Verdict::Order(if transfer { Kind::Transfer } else { Kind::Read })
        }
        // Over UDP named answers AXFR and IXFR in one datagram (an error, or the
        // single SOA of RFC 1995), so they execute as plain reads; they need the rights
        // of a transfer all the same (`transfer_rights`). NOTIFY, STATUS and unknown
        // opcodes cannot change a primary's zone; named answers them (NOTIMP, or an
        // ignored NOTIFY) on the gateway alone.
        _ => Verdict::Order(Kind::Read),
    }
}

/// Whether a request needs what a zone transfer needs (a transfer key, or an address
/// `allow_transfer` lists): a transfer over TCP, and a query whose first question asks
/// for AXFR or IXFR over UDP (an IXFR over UDP can carry the zone's changes, RFC 1995 2).
/// Reads the first question's type only, without allocating: it runs on every read.
pub fn transfer_rights(verdict: &Verdict, bytes: &[u8]) -> bool {
    match verdict {
        Verdict::Order(Kind::Transfer) => true,
        Verdict::Order(Kind::Read) => {
            let Ok(header) = RawHeader::parse(bytes) else { return false };
            if header.opcode() != OPCODE_QUERY || header.qdcount == 0 {
                return false;
            }
            first_qtype(bytes).is_some_and(|t| t == TYPE_AXFR || t == TYPE_IXFR)
        }
        _ => false,
    }
}

/// The type of the question at offset 12 (its name uncompressed, or a pointer).
fn first_qtype(bytes: &[u8]) -> Option<u16> {
    let mut at = 12;
    loop {
        let len = *bytes.get(at)?;
        match len {
            0 => {
                at += 1;
                break;
            }
            l if l & 0xc0 == 0xc0 => {
                at += 2;
                break;
            }
            l if l & 0xc0 == 0 => at += 1 + usize::from(l),
            _ => return None,
        }
    }
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

/// The pre-ordering authentication filter (crate::auth), against the local clock (`now_s`,
/// seconds since the epoch, read by the caller): an update that cannot pass, or a transfer
/// without a transfer key, is answered here as named would answer it, without being
/// ordered. Execution re-checks every ordered update against the batch's agreed time, and
/// that check decides.
pub fn precheck(verdict: Verdict, bytes: &[u8], auth: Option<&crate::auth::zones::ZoneAuth>, now_s: u64) -> Verdict {
    let Some(auth) = auth else { return verdict };
    let transfer = match verdict {
        Verdict::Order(Kind::Write) => false,
        Verdict::Order(Kind::Transfer) => true,
        Verdict::Order(Kind::Read) if transfer_rights(&verdict, bytes) => true,
        _ => return verdict,
    };
    match auth.precheck(bytes, transfer, now_s) {
        Some(answer) => Verdict::Answer(answer),
        None => verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{rdata::A, DNSClass, Name, RData, Record, RecordSet, RecordType};
    use std::str::FromStr;

    fn zone() -> Name {
        Name::from_str("example.test.").unwrap()
    }

    fn query(name: &str, rtype: RecordType) -> Vec<u8> {
        let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_str(name).unwrap(), rtype));
        m.to_vec().unwrap()
    }

    fn update_with(record: Record) -> Vec<u8> {
        let mut m = Message::new(0x4321, MessageType::Query, OpCode::Update);
        let mut q = Query::query(zone(), RecordType::SOA);
        q.set_query_class(DNSClass::IN);
        m.add_query(q);
        m.add_authority(record);
        m.to_vec().unwrap()
    }

    #[test]
    fn queries_are_reads_and_transfers_need_tcp() {
        assert_eq!(classify(&query("www.example.test.", RecordType::A), false), Verdict::Order(Kind::Read));
        assert_eq!(classify(&query("example.test.", RecordType::AXFR), true), Verdict::Order(Kind::Transfer));
        assert_eq!(classify(&query("example.test.", RecordType::IXFR), true), Verdict::Order(Kind::Transfer));
        // Over UDP named answers them in one datagram.
        assert_eq!(classify(&query("example.test.", RecordType::AXFR), false), Verdict::Order(Kind::Read));
        assert_eq!(classify(&query("example.test.", RecordType::IXFR), false), Verdict::Order(Kind::Read));
    }

    #[test]
    fn transfers_over_udp_need_transfer_rights() {
        for rtype in [RecordType::AXFR, RecordType::IXFR] {
            let q = query("example.test.", rtype);
            for tcp in [false, true] {
                assert!(transfer_rights(&classify(&q, tcp), &q), "{rtype} over tcp={tcp}");
            }
        }
        let soa = query("example.test.", RecordType::SOA);
        assert!(!transfer_rights(&classify(&soa, false), &soa));
        // A compressed question name, a runt, garbage: no panic, and only a real AXFR counts.
        let mut pointer = soa[..12].to_vec();
        pointer.extend_from_slice(&[0xc0, 12, 0, 252, 0, 1]);
        assert!(transfer_rights(&Verdict::Order(Kind::Read), &pointer));
        assert!(!transfer_rights(&Verdict::Order(Kind::Read), &soa[..14]));
        assert!(!transfer_rights(&Verdict::Order(Kind::Write), &query("example.test.", RecordType::AXFR)));
        let mut bad = soa[..12].to_vec();
        bad.extend_from_slice(&[0x80, 1, 2, 3]);
        assert!(!transfer_rights(&Verdict::Order(Kind::Read), &bad));
    }

    #[test]
    fn updates_are_writes_and_named_judges_them() {
        let mut rrset = RecordSet::new(Name::from_str("host.example.test.").unwrap(), RecordType::A, 300);
        rrset.add_rdata(RData::A(A::new(192, 0, 2, 1)));
        let m = hickory_proto::op::update_message::create(rrset, zone(), false);
        assert_eq!(classify(&m.to_vec().unwrap(), false), Verdict::Order(Kind::Write));
        // Key material: named's update-policy refuses it, every replica alike.
        let r = Record::update0(zone(), 0, RecordType::DNSKEY);
        assert_eq!(classify(&update_with(r), true), Verdict::Order(Kind::Write));
        // An UPDATE that does not even parse is still a write (the update authentication
        // answers it).
        let mut bytes = update_with(Record::update0(zone(), 0, RecordType::A));
        bytes.truncate(20);
        assert_eq!(classify(&bytes, false), Verdict::Order(Kind::Write));
    }

    #[test]
    fn what_a_decoder_rejects_goes_to_named() {
        // A NAPTR with a 0xff flag byte (named accepts it) in an update and a query's
        // additional section; a SIG record; a truncated question.
        let mut up = update_with(Record::update0(zone(), 0, RecordType::A));
        up[11] = 1; // arcount 1
        up.extend_from_slice(&[0, 0, 35, 0, 1, 0, 0, 0, 60, 0, 9, 0x00, 0x64, 0x00, 0x0a, 0x01, 0xff, 0, 0, 0]);
        assert_eq!(classify(&up, true), Verdict::Order(Kind::Write));
        let mut q = query("www.example.test.", RecordType::NAPTR);
        q[11] = 1;
        q.extend_from_slice(&[0, 0, 24, 0, 1, 0, 0, 0, 0, 0, 0]); // SIG with empty rdata
        assert_eq!(classify(&q, false), Verdict::Order(Kind::Read));
        let mut runt_q = query("a.example.test.", RecordType::A);
        runt_q.truncate(14);
        assert_eq!(classify(&runt_q, false), Verdict::Order(Kind::Read));
        assert_eq!(classify(&runt_q, true), Verdict::Order(Kind::Read));
    }

    #[test]
    fn garbage_never_panics_and_responses_and_runts_are_dropped() {
        assert!(matches!(classify(&[], false), Verdict::Drop(_)));
        assert!(matches!(classify(&[0u8; 5], false), Verdict::Drop(_)));
        let mut resp = Message::from_vec(&query("a.example.test.", RecordType::A)).unwrap();
        resp.metadata.message_type = MessageType::Response;
        assert!(matches!(classify(&resp.to_vec().unwrap(), false), Verdict::Drop(_)));
        let mut noise = testkit::Noise::new(0x9e3779b97f4a7c15);
        for len in 0..600 {
            let _ = classify(&noise.bytes(len), len % 2 == 0);
        }
    }
}
