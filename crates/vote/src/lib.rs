//! The voting client of sdns: the paper's strong guarantees for clients that ask every replica.
//!
//! An unmodified client asks one server and trusts it: the answer is signed but may be stale
//! or withheld (the weak goals G1'/G2' of Cachin and Samar, Section 3.4). This crate asks all n
//! replicas and accepts only an answer that enough of them gave, which yields the strong goals
//! (Section 3.3): G1, an accepted answer is correct and current; G2, an answer arrives even when
//! up to t replicas are corrupted or silent.
//!
//! - [`canon`]: what makes two answers "the same" (RRsets as sets; ids, record order, TTLs and
//!   EDNS options ignored; signatures compared as data).
//! - [`tally`]: the pure quorum decision over the replies received so far.
//! - [`net`]: one replica, one question: UDP with retries, TCP when truncated, timeouts everywhere.
//! - [`client`]: [`client::VotingClient`], the read path (a voting read answered from each
//!   replica's current state, else an ordered read) and updates.
//! - [`stub`]: a stub resolver that answers local applications by voting.
//! - [`tsig`]: TSIG signing of updates with a BIND key.
//! - [`show`]: dig-like text for an outcome.
//!
//! # Quorums (n replicas, at most t faulty, n >= 3t + 1)
//!
//! | request | replicas that must give the same answer | why |
//! | --- | --- | --- |
//! | voting read (unordered, [`VOTING_READ_OPTION`]) | 2t + 1 | PBFT's read-only optimisation: each replica answers from its current state, which may lag; 2t + 1 matching answers include t + 1 honest replicas, so any quorum of 2t + 1 that saw a completed write intersects it |
//! | ordered read (the fallback) | n - t | every honest replica answers after ordering; a replica in `reads = "local"` mode does not order, and the client cannot tell, so it asks for all the honest ones |
//! | update | n - t | t + 1 would do to trust the result (one of them is honest), but a later voting read accepts 2t + 1 answers from replicas' current states; with n - t acknowledgements every such read quorum shares an honest replica with them (n - t + 2t + 1 > n + t), so no voting read after a successful update returns the old data. PBFT's read-only optimisation asks the same of writes |
#![forbid(unsafe_code)]

pub mod canon;
pub mod client;
pub mod net;
pub mod show;
pub mod stub;
pub mod tally;
pub mod tsig;

use hickory_proto::op::{Edns, Message};
use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};

/// The EDNS option code that marks a voting read, from the range RFC 6891 reserves for local and
/// experimental use (65001-65534). named ignores options it does not know; an sdns replica answers
/// a query carrying it at once from its named's current state, without ordering it.
pub const VOTING_READ_OPTION: u16 = 65_042;

/// The option's payload: a fixed tag and version, so that another local use of the same code is
/// not mistaken for a voting read.
pub const VOTING_READ_TAG: &[u8] = b"sdns-vote/1";

/// Adds the voting-read option to a query (adding EDNS if it has none).
pub fn mark_voting_read(query: &mut Message) {
    let edns = query.edns.get_or_insert_with(Edns::new);
    edns.options_mut().insert(EdnsOption::Unknown(VOTING_READ_OPTION, VOTING_READ_TAG.to_vec()));
}

/// True if the message carries the voting-read option with the expected payload.
pub fn is_voting_read(message: &Message) -> bool {
    message.edns.as_ref().is_some_and(|edns| {
        matches!(
            edns.option(EdnsCode::Unknown(VOTING_READ_OPTION)),
            Some(EdnsOption::Unknown(VOTING_READ_OPTION, data)) if data == VOTING_READ_TAG
        )
    })
}

/// The replica set a client votes over.
#[derive(Clone, Debug)]
pub struct Replicas {
    /// Each replica's client address (UDP and TCP), in replica-id order.
    pub addrs: Vec<std::net::SocketAddr>,
    /// t, the number of faulty replicas tolerated.
    pub faults: usize,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicasError {
    #[error("no replica addresses")]
    Empty,
    #[error("{n} replicas cannot tolerate {t} faulty ones (n must be at least 3t + 1)")]
    TooManyFaults { n: usize, t: usize },
}

impl Replicas {
    /// `faults` defaults to the largest t with n >= 3t + 1.
    pub fn new(addrs: Vec<std::net::SocketAddr>, faults: Option<usize>) -> Result<Replicas, ReplicasError> {
        let n = addrs.len();
        if n == 0 {
            return Err(ReplicasError::Empty);
        }
        let t = faults.unwrap_or((n - 1) / 3);
        if n < 3 * t + 1 {
            return Err(ReplicasError::TooManyFaults { n, t });
        }
        Ok(Replicas { addrs, faults: t })
    }

    pub fn n(&self) -> usize {
        self.addrs.len()
    }

    /// Matching answers needed to accept a voting (unordered) read.
    pub fn voting_read_quorum(&self) -> usize {
        2 * self.faults + 1
    }

    /// Matching answers needed to accept an ordered read.
    pub fn ordered_read_quorum(&self) -> usize {
        self.n() - self.faults
    }

    /// Matching acknowledgements needed to report an update's result (see the table above).
    pub fn update_quorum(&self) -> usize {
        self.n() - self.faults
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    use std::str::FromStr;

    #[test]
    fn marked_queries_are_recognised_after_a_round_trip() {
        let mut q = Message::new(7, MessageType::Query, OpCode::Query);
        q.add_query(Query::query(Name::from_str("www.example.test.").unwrap(), RecordType::A));
        assert!(!is_voting_read(&q));
        mark_voting_read(&mut q);
        let back = Message::from_vec(&q.to_vec().unwrap()).unwrap();
        assert!(is_voting_read(&back));
        // The same code with another payload is someone else's option.
        let mut other = Message::new(8, MessageType::Query, OpCode::Query);
        other.edns.get_or_insert_with(Edns::new).options_mut().insert(EdnsOption::Unknown(VOTING_READ_OPTION, b"x".to_vec()));
        assert!(!is_voting_read(&Message::from_vec(&other.to_vec().unwrap()).unwrap()));
    }

    #[test]
    fn quorums_follow_n_and_t() {
        let addrs = |n: usize| (0..n).map(|i| std::net::SocketAddr::from(([127, 0, 0, 1], 5300 + i as u16))).collect::<Vec<_>>();
        let r = Replicas::new(addrs(4), None).unwrap();
        assert_eq!((r.faults, r.voting_read_quorum(), r.ordered_read_quorum(), r.update_quorum()), (1, 3, 3, 3));
        let r = Replicas::new(addrs(7), None).unwrap();
        assert_eq!((r.faults, r.voting_read_quorum(), r.ordered_read_quorum(), r.update_quorum()), (2, 5, 5, 5));
        let r = Replicas::new(addrs(5), None).unwrap();
        assert_eq!((r.faults, r.voting_read_quorum(), r.ordered_read_quorum(), r.update_quorum()), (1, 3, 4, 4));
        let r = Replicas::new(addrs(1), None).unwrap();
        assert_eq!((r.faults, r.voting_read_quorum(), r.ordered_read_quorum(), r.update_quorum()), (0, 1, 1, 1));
        assert!(matches!(Replicas::new(addrs(4), Some(2)), Err(ReplicasError::TooManyFaults { n: 4, t: 2 })));
        assert!(matches!(Replicas::new(Vec::new(), None), Err(ReplicasError::Empty)));
    }
}
