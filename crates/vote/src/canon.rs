//! What two replicas' answers must share to count as the same answer.
//!
//! Honest replicas hold byte-identical zones and sign identically, but their messages may still
//! differ in ways that carry no data: the message id (each replica gets its own), the order of
//! records, TTLs (a cache in between would decrement them), EDNS options such as cookies or
//! NSID, and transaction signatures (TSIG, SIG(0)) made with each server's own clock. The
//! canonical form keeps everything else: response code, opcode, the AA flag, the question, and
//! each section as a set of RRsets, each RRset a set of RDATA in DNSSEC canonical form. RRSIGs
//! are RDATA like any other, so signatures are compared as data.

use std::collections::{BTreeMap, BTreeSet};

use hickory_proto::op::Message;
use hickory_proto::rr::{Record, RecordType};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};

/// (owner name in lower-case wire form, type, class).
pub type RrSetKey = (Vec<u8>, u16, u16);

/// One section: each RRset's RDATA as a set.
pub type Section = BTreeMap<RrSetKey, BTreeSet<Vec<u8>>>;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Canonical {
    pub rcode: u16,
    pub opcode: u8,
    pub authoritative: bool,
    pub question: BTreeSet<RrSetKey>,
    pub answer: Section,
    pub authority: Section,
    pub additional: Section,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CanonError {
    #[error("cannot encode a record of {0}: {1}")]
    Encode(String, String),
}

/// The canonical form of a response.
pub fn canonical(message: &Message) -> Result<Canonical, CanonError> {
    let mut question = BTreeSet::new();
    for q in &message.queries {
        question.insert((owner(q.name())?, u16::from(q.query_type()), u16::from(q.query_class())));
    }
    Ok(Canonical {
        // hickory merges EDNS's high rcode bits into the header's on decoding.
        rcode: u16::from(message.metadata.response_code),
        opcode: u8::from(message.metadata.op_code),
        authoritative: message.metadata.authoritative,
        question,
        answer: section(&message.answers)?,
        authority: section(&message.authorities)?,
        additional: section(message.additionals.iter().filter(|r| !is_transaction_signature(r)))?,
    })
}

/// SIG(0) (a SIG record at the end of the additional section) signs the transaction, not data.
/// TSIG and OPT never reach `additionals`: hickory keeps them in `signature` and `edns`.
fn is_transaction_signature(record: &Record) -> bool {
    matches!(record.record_type(), RecordType::SIG | RecordType::TSIG | RecordType::OPT)
}

fn section<'a>(records: impl IntoIterator<Item = &'a Record>) -> Result<Section, CanonError> {
    let mut out = Section::new();
    for r in records {
        let key = (owner(&r.name)?, u16::from(r.record_type()), u16::from(r.dns_class));
        out.entry(key).or_default().insert(rdata_bytes(r)?);
    }
    Ok(out)
}

fn owner(name: &hickory_proto::rr::Name) -> Result<Vec<u8>, CanonError> {
    name.to_lowercase().to_bytes().map_err(|e| CanonError::Encode(name.to_string(), e.to_string()))
}

fn rdata_bytes(r: &Record) -> Result<Vec<u8>, CanonError> {
    let mut buf = Vec::new();
    let mut encoder = BinEncoder::new(&mut buf);
    encoder.set_canonical_form(true);
    r.data.emit(&mut encoder).map_err(|e| CanonError::Encode(r.name.to_string(), e.to_string()))?;
    Ok(buf)
}

/// The answer to hand on, built from the messages that agreed: the first one's records, each
/// RRset's TTL lowered to the smallest any of them gave (a faulty replica in the quorum cannot
/// make data live longer than an honest one said).
pub fn merge_agreeing(agreeing: &[&Message]) -> Option<Message> {
    let first = agreeing.first()?;
    let mut min_ttl: BTreeMap<(usize, RrSetKey), u32> = BTreeMap::new();
    for m in agreeing {
        for (i, records) in [&m.answers, &m.authorities, &m.additionals].into_iter().enumerate() {
            for r in records.iter() {
                let Ok(name) = owner(&r.name) else { continue };
                let key = (i, (name, u16::from(r.record_type()), u16::from(r.dns_class)));
                let ttl = min_ttl.entry(key).or_insert(r.ttl);
                *ttl = (*ttl).min(r.ttl);
            }
        }
    }
    let mut out = (*first).clone();
    for (i, records) in [&mut out.answers, &mut out.authorities, &mut out.additionals].into_iter().enumerate() {
        for r in records.iter_mut() {
            let Ok(name) = owner(&r.name) else { continue };
            if let Some(ttl) = min_ttl.get(&(i, (name, u16::from(r.record_type()), u16::from(r.dns_class)))) {
                r.ttl = *ttl;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns, MessageType, OpCode, Query, ResponseCode};
    use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
    use hickory_proto::rr::rdata::{A, NS};
    use hickory_proto::rr::{Name, RData};
    use proptest::prelude::*;
    use std::str::FromStr;

    fn name(s: &str) -> Name {
        Name::from_str(s).unwrap()
    }

    fn a(owner: &str, ttl: u32, ip: [u8; 4]) -> Record {
        Record::from_rdata(name(owner), ttl, RData::A(A::new(ip[0], ip[1], ip[2], ip[3])))
    }

    fn response(id: u16, answers: Vec<Record>) -> Message {
        let mut m = Message::new(id, MessageType::Response, OpCode::Query);
        m.metadata.authoritative = true;
        m.add_query(Query::query(name("www.example.test."), RecordType::A));
        m.add_answers(answers);
        m.add_authority(Record::from_rdata(name("example.test."), 300, RData::NS(NS(name("ns1.example.test.")))));
        m
    }

    /// What a replica sends, parsed back as the client sees it.
    fn wire(m: &Message) -> Message {
        Message::from_vec(&m.to_vec().unwrap()).unwrap()
    }

    #[test]
    fn ids_order_ttls_case_and_edns_options_do_not_matter() {
        let one = response(1, vec![a("www.example.test.", 300, [192, 0, 2, 1]), a("www.example.test.", 300, [192, 0, 2, 2])]);
        let mut two = response(2, vec![a("WWW.Example.TEST.", 17, [192, 0, 2, 2]), a("www.example.test.", 299, [192, 0, 2, 1])]);
        let mut edns = Edns::new();
        edns.options_mut().insert(EdnsOption::Unknown(u16::from(EdnsCode::Cookie), vec![1, 2, 3, 4, 5, 6, 7, 8]));
        two.set_edns(edns);
        assert_eq!(canonical(&wire(&one)).unwrap(), canonical(&wire(&two)).unwrap());
    }

    #[test]
    fn data_rcode_and_authority_do_matter() {
        let honest = canonical(&wire(&response(1, vec![a("www.example.test.", 300, [192, 0, 2, 1])]))).unwrap();
        let wrong_address = canonical(&wire(&response(1, vec![a("www.example.test.", 300, [6, 6, 6, 6])]))).unwrap();
        let extra_record =
            canonical(&wire(&response(1, vec![a("www.example.test.", 300, [192, 0, 2, 1]), a("www.example.test.", 300, [6, 6, 6, 6])]))).unwrap();
        let withheld = canonical(&wire(&response(1, vec![]))).unwrap();
        let mut nx = response(1, vec![]);
        nx.metadata.response_code = ResponseCode::NXDomain;
        let nxdomain = canonical(&wire(&nx)).unwrap();
        let mut not_aa = response(1, vec![a("www.example.test.", 300, [192, 0, 2, 1])]);
        not_aa.metadata.authoritative = false;
        let not_authoritative = canonical(&wire(&not_aa)).unwrap();
        for (what, other) in
            [("wrong address", wrong_address), ("extra record", extra_record), ("withheld", withheld), ("nxdomain", nxdomain), ("not aa", not_authoritative)]
        {
            assert_ne!(honest, other, "{what}");
        }
    }

    #[test]
    fn merged_answer_takes_the_smallest_ttl() {
        let low = wire(&response(1, vec![a("www.example.test.", 60, [192, 0, 2, 1])]));
        let high = wire(&response(2, vec![a("www.example.test.", 86_400, [192, 0, 2, 1])]));
        let merged = merge_agreeing(&[&high, &low]).unwrap();
        assert_eq!(merged.answers[0].ttl, 60);
        assert_eq!(merged.metadata.id, 2, "the first message is the template");
        assert!(merge_agreeing(&[]).is_none());
    }

    proptest! {
        /// Any permutation and any TTLs of the same records give the same canonical form; changing
        /// one address byte never does.
        #[test]
        fn permutations_agree_and_changes_disagree(
            ips in proptest::collection::btree_set(any::<[u8; 4]>(), 1..8),
            ttls in proptest::collection::vec(any::<u32>(), 8),
            rotate in 0usize..8,
            flip in any::<u8>().prop_filter("a change", |b| *b != 0),
        ) {
            let ips: Vec<[u8; 4]> = ips.into_iter().collect();
            let records: Vec<Record> = ips.iter().map(|ip| a("www.example.test.", 300, *ip)).collect();
            let mut shuffled: Vec<Record> = ips.iter().zip(&ttls).map(|(ip, ttl)| a("www.example.test.", *ttl & 0x7fff_ffff, *ip)).collect();
            let len = shuffled.len();
            shuffled.rotate_left(rotate % len);
            let base = canonical(&wire(&response(1, records))).unwrap();
            prop_assert_eq!(&base, &canonical(&wire(&response(9, shuffled))).unwrap());
            let mut changed = ips.clone();
            changed[0][3] ^= flip;
            // A change that lands on another address of the set removes one record: still a change.
            let changed: Vec<Record> = changed.iter().map(|ip| a("www.example.test.", 300, *ip)).collect();
            prop_assert_ne!(&base, &canonical(&wire(&response(1, changed))).unwrap());
        }
    }
}
