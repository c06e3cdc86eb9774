//! The replica's half of PBFT's read-only optimisation for voting clients.
//!
//! A voting client (`sdns query`, `sdns stub`, or any program using the `vote` crate) marks a
//! read with an EDNS option from the local/experimental range (`vote::VOTING_READ_OPTION`, with
//! the payload `vote::VOTING_READ_TAG`) and sends it to every replica. Such a read is answered at
//! once from this replica's named, without ordering: the client accepts it only if 2t + 1
//! replicas answered the same, and asks again with an ordered read otherwise. Unmodified clients
//! never send the option, so their reads keep the ordered path; named ignores the option.
//!
//! Only plain queries qualify (no transfers, updates or other opcodes): they change nothing, so
//! answering one without ordering cannot make replicas diverge. Answers in flight are bounded;
//! beyond the bound a voting read is dropped (the client retries or falls back), never queued.

use exec::classify::Kind;
use named_glue::forward::Forwarder;
use named_glue::rrwire::{opt_option, RawHeader, RawMessage, TYPE_AXFR, TYPE_IXFR};
use std::sync::Arc;
use tokio::sync::Semaphore;

use crate::client::reply::ReplyTo;
use crate::ops::metrics::Metrics;
use crate::reads::read::ReadCache;

const OPCODE_QUERY: u8 = 0;

/// Voting reads being answered at once, per replica process.
const MAX_IN_FLIGHT: usize = 128;
static IN_FLIGHT: Semaphore = Semaphore::const_new(MAX_IN_FLIGHT);

/// Called by the gateway for a request the read router put on the voting lane
/// (`crate::reads::route`): answered from the local named, without ordering.
pub fn answer_unordered(named: &Forwarder, cache: &Arc<ReadCache>, metrics: &Arc<Metrics>, message: Vec<u8>, tcp: bool, reply: ReplyTo) {
    let Ok(permit) = IN_FLIGHT.try_acquire() else {
        metrics.inc_dropped("voting_reads_full");
        return;
    };
    metrics.inc_request(Kind::Read);
    let (named, cache, metrics) = (named.clone(), cache.clone(), metrics.clone());
    tokio::spawn(async move {
        let _permit = permit;
        crate::reads::read::answer_read(&named, &cache, &message, tcp, &reply, &metrics).await;
    });
}

/// A plain query carrying the voting-read option. Walked, not decoded: the read router asks
/// it of every read it does not answer locally.
pub fn is_voting_read(bytes: &[u8]) -> bool {
    let Ok(header) = RawHeader::parse(bytes) else { return false };
    if header.is_response() || header.opcode() != OPCODE_QUERY || header.arcount == 0 {
        return false;
    }
    // A voting read's option value is in its bytes as it is; most requests with an additional
    // record carry EDNS only, and this spares them a parse.
    if !bytes.windows(vote::VOTING_READ_TAG.len()).any(|w| w == vote::VOTING_READ_TAG) {
        return false;
    }
    let Ok(message) = RawMessage::parse(bytes) else { return false };
    !message.questions.is_empty()
        && message.questions.iter().all(|q| q.qtype != TYPE_AXFR && q.qtype != TYPE_IXFR)
        && message.opt().and_then(|opt| opt_option(&opt.rdata, vote::VOTING_READ_OPTION)) == Some(vote::VOTING_READ_TAG)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, OpCode};
    use hickory_proto::rr::{Name, RecordType};
    use std::str::FromStr;

    fn query(rtype: RecordType, voting: bool) -> Vec<u8> {
        vote::client::build_query(9, &Name::from_str("www.example.test.").unwrap(), rtype, false, voting).to_vec().unwrap()
    }

    #[test]
    fn only_marked_plain_queries_skip_ordering() {
        assert!(is_voting_read(&query(RecordType::A, true)));
        assert!(!is_voting_read(&query(RecordType::A, false)));
        assert!(!is_voting_read(&query(RecordType::AXFR, true)));
        assert!(!is_voting_read(&query(RecordType::IXFR, true)));
        let mut update = Message::from_vec(&query(RecordType::SOA, true)).unwrap();
        update.metadata.op_code = OpCode::Update;
        assert!(!is_voting_read(&update.to_vec().unwrap()));
        let mut response = Message::from_vec(&query(RecordType::A, true)).unwrap();
        response.metadata.message_type = MessageType::Response;
        assert!(!is_voting_read(&response.to_vec().unwrap()));
        for len in 0..40 {
            assert!(!is_voting_read(&vec![0xffu8; len]));
        }
    }
}
