//! Deciding, before ordering, what a client's DNS message is.
//!
//! The wrapper does not interpret requests beyond this: every message that passes is
//! ordered and handed to named byte for byte (TSIG-signed updates stay verifiable by
//! named). Parsing uses hickory-proto only.

use hickory_proto::op::{Header, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

/// What the executor must do with an ordered request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Changes nothing: only the replica that owes the answer executes it.
    Read,
    /// A zone transfer (AXFR/IXFR): a read whose answer may be many messages (TCP only).
    Transfer,
    /// A dynamic update: every replica executes it.
    Write,
}

/// The classifier's verdict on one client message.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Order it and execute it as this kind.
    Order(Kind),
    /// Answer at once with these bytes, without ordering (REFUSED, FORMERR).
    Answer(Vec<u8>),
    /// Ignore silently (responses, runts): answering could feed a reflection loop.
    Drop(&'static str),
}

/// Record types an update must not touch: changing them would make named start
/// timer-driven signing that no ordering controls (../shared/DESIGN.md section 4).
/// Keys change only through the dealer.
const FORBIDDEN_UPDATE_TYPES: [RecordType; 4] =
    [RecordType::DNSKEY, RecordType::CDS, RecordType::CDNSKEY, RecordType::NSEC3PARAM];
/// BIND's private signing-state type.
const BIND_PRIVATE_TYPE: u16 = 65534;

pub fn classify(bytes: &[u8], transport_is_tcp: bool) -> Verdict {
    let header = match Header::read(&mut BinDecoder::new(bytes)) {
        Ok(h) => h,
        Err(_) => return Verdict::Drop("shorter than a DNS header"),
    };
    if header.metadata.message_type == MessageType::Response {
        return Verdict::Drop("a response, not a request");
    }
    let message = match Message::from_vec(bytes) {
        Ok(m) => m,
        Err(_) => return Verdict::Answer(error_answer(&header, None, ResponseCode::FormErr)),
    };
    match message.metadata.op_code {
        OpCode::Update => classify_update(&header, &message),
        OpCode::Query => {
            let transfer = message
                .queries
                .iter()
                .any(|q| matches!(q.query_type(), RecordType::AXFR | RecordType::IXFR));
            if transfer && !transport_is_tcp {
                // RFC 5936: AXFR over UDP is not a thing; IXFR over UDP named answers
                // with a single SOA, which is a plain read.
                if message.queries.iter().any(|q| q.query_type() == RecordType::AXFR) {
                    return Verdict::Answer(error_answer(&header, Some(&message), ResponseCode::FormErr));
                }
                return Verdict::Order(Kind::Read);
            }
            Verdict::Order(if transfer { Kind::Transfer } else { Kind::Read })
        }
        // NOTIFY, STATUS and unknown opcodes cannot change a primary's zone; named
        // answers them (NOTIMP, or an ignored NOTIFY) on the gateway alone.
        _ => Verdict::Order(Kind::Read),
    }
}

/// The pre-ordering authentication filter (crate::auth), against the local clock: an
/// update that cannot pass, or a transfer without a transfer key, is answered here as
/// named would answer it, without being ordered. Execution re-checks every ordered
/// update against the batch's agreed time, and that check decides.
pub fn precheck(verdict: Verdict, bytes: &[u8], auth: Option<&crate::auth::Authenticator>) -> Verdict {
    let Some(auth) = auth else { return verdict };
    let transfer = match verdict {
        Verdict::Order(Kind::Write) => false,
        Verdict::Order(Kind::Transfer) => true,
        Verdict::Order(Kind::Read) if crate::auth::is_transfer_query(bytes) => true,
        _ => return verdict,
    };
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    match auth.precheck(bytes, transfer, now_s) {
        Some(answer) => Verdict::Answer(answer),
        None => verdict,
    }
}

fn classify_update(header: &Header, message: &Message) -> Verdict {
    // RFC 2136: the zone section holds exactly one zone.
    let Some(zone) = message.queries.first().map(|q| q.name().clone()) else {
        return Verdict::Answer(error_answer(header, Some(message), ResponseCode::FormErr));
    };
    for record in &message.authorities {
        let rtype = record.record_type();
        let forbidden = FORBIDDEN_UPDATE_TYPES.contains(&rtype)
            || u16::from(rtype) == BIND_PRIVATE_TYPE
            // "delete all RRsets at a name" at the apex would take DNSKEY with it.
            || (rtype == RecordType::ANY && is_apex(&record.name, &zone));
        if forbidden {
            return Verdict::Answer(error_answer(header, Some(message), ResponseCode::Refused));
        }
    }
    Verdict::Order(Kind::Write)
}

fn is_apex(name: &Name, zone: &Name) -> bool {
    name.to_lowercase() == zone.to_lowercase()
}

/// An answer carrying only the request's id, opcode and (when it parsed) question.
fn error_answer(header: &Header, message: Option<&Message>, code: ResponseCode) -> Vec<u8> {
    let meta = &header.metadata;
    let mut answer = Message::error_msg(meta.id, meta.op_code, code);
    answer.metadata.recursion_desired = meta.recursion_desired;
    if let Some(m) = message {
        answer.add_queries(m.queries.iter().cloned());
    }
    // Encoding a header plus at most the request's own question cannot fail; if it
    // ever did, fall back to the bare header, which is always encodable.
    answer.to_vec().unwrap_or_else(|_| {
        Message::error_msg(meta.id, meta.op_code, code).to_vec().unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::{rdata::A, DNSClass, RData, Record, RecordSet};
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

    fn rcode_of(bytes: &[u8]) -> (u16, ResponseCode) {
        let m = Message::from_vec(bytes).unwrap();
        assert_eq!(m.metadata.message_type, MessageType::Response);
        (m.metadata.id, m.metadata.response_code)
    }

    #[test]
    fn queries_are_reads_and_transfers_need_tcp() {
        assert_eq!(classify(&query("www.example.test.", RecordType::A), false), Verdict::Order(Kind::Read));
        assert_eq!(classify(&query("example.test.", RecordType::AXFR), true), Verdict::Order(Kind::Transfer));
        match classify(&query("example.test.", RecordType::AXFR), false) {
            Verdict::Answer(a) => assert_eq!(rcode_of(&a), (0x1234, ResponseCode::FormErr)),
            v => panic!("AXFR over UDP must be answered FORMERR, got {v:?}"),
        }
    }

    #[test]
    fn plain_updates_are_writes() {
        let mut rrset = RecordSet::new(Name::from_str("host.example.test.").unwrap(), RecordType::A, 300);
        rrset.add_rdata(RData::A(A::new(192, 0, 2, 1)));
        let m = hickory_proto::op::update_message::create(rrset, zone(), false);
        assert_eq!(classify(&m.to_vec().unwrap(), false), Verdict::Order(Kind::Write));
    }

    #[test]
    fn key_changing_updates_are_refused_before_ordering() {
        for rtype in [RecordType::DNSKEY, RecordType::CDS, RecordType::CDNSKEY, RecordType::NSEC3PARAM, RecordType::Unknown(65534)] {
            let r = Record::update0(zone(), 0, rtype);
            match classify(&update_with(r), false) {
                Verdict::Answer(a) => assert_eq!(rcode_of(&a), (0x4321, ResponseCode::Refused), "{rtype}"),
                v => panic!("update of {rtype} must be refused, got {v:?}"),
            }
        }
        let mut apex_any = Record::update0(zone(), 0, RecordType::ANY);
        apex_any.dns_class = DNSClass::ANY;
        assert!(matches!(classify(&update_with(apex_any), false), Verdict::Answer(_)));
        let mut other_any = Record::update0(Name::from_str("h.example.test.").unwrap(), 0, RecordType::ANY);
        other_any.dns_class = DNSClass::ANY;
        assert_eq!(classify(&update_with(other_any), false), Verdict::Order(Kind::Write));
    }

    #[test]
    fn garbage_never_panics_and_gets_formerr_or_drop() {
        assert!(matches!(classify(&[], false), Verdict::Drop(_)));
        assert!(matches!(classify(&[0u8; 5], false), Verdict::Drop(_)));
        // A header claiming one question that is not there.
        let mut bytes = query("a.example.test.", RecordType::A);
        bytes.truncate(14);
        match classify(&bytes, false) {
            Verdict::Answer(a) => assert_eq!(rcode_of(&a), (0x1234, ResponseCode::FormErr)),
            v => panic!("truncated question must give FORMERR, got {v:?}"),
        }
        // Responses are dropped, never answered.
        let mut resp = Message::from_vec(&query("a.example.test.", RecordType::A)).unwrap();
        resp.metadata.message_type = MessageType::Response;
        assert!(matches!(classify(&resp.to_vec().unwrap(), false), Verdict::Drop(_)));
        // Random bytes: no panic whatever they are.
        let mut state = 0x9e3779b97f4a7c15u64;
        for len in 0..600 {
            let buf: Vec<u8> = (0..len).map(|_| { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state as u8 }).collect();
            let _ = classify(&buf, len % 2 == 0);
        }
    }
}
