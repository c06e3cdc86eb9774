//! The sans-IO half of vouched reads (`crate::vouched`): what a read probe carries, the digest
//! replicas compare answers by, and the gateway's tally of the vouches for one read.
//!
//! A probe's request is one flag byte (bit 0: the client asked over TCP, which decides named's
//! truncation) followed by the client's DNS message. The digest of an answer covers every byte
//! the client would get except the id (each replica's copy carries its own probe's) and an EDNS
//! COOKIE option (a server cookie differs per replica and per moment); the client is sent the
//! gateway's own bytes unchanged, so what the digest leaves out never reaches it from a peer.

use std::collections::BTreeMap;

use named_glue::rrwire::{RawMessage, TYPE_OPT};
use sha2::{Digest as _, Sha256};

const OPTION_COOKIE: u16 = 10;

/// A probe's request: the transport flag and the client's DNS message.
pub fn probe_request(message: &[u8], tcp: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 1);
    out.push(u8::from(tcp));
    out.extend_from_slice(message);
    out
}

/// The transport and the DNS message of a probe's request; `None` for anything a gateway
/// does not send (an unknown flag, no message).
pub fn parse_probe_request(request: &[u8]) -> Option<(bool, &[u8])> {
    match request.split_first()? {
        (0, message) if !message.is_empty() => Some((false, message)),
        (1, message) if !message.is_empty() => Some((true, message)),
        _ => None,
    }
}

/// The digest replicas compare answers by: SHA-256 over the answer without its id, with the
/// OPT record's COOKIE options left out. An answer that does not parse is hashed as it is
/// (id aside): equal bytes still match.
pub fn answer_digest(answer: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(b"sdns vouched answer v1");
    let body = answer.get(2..).unwrap_or_default();
    let opt = RawMessage::parse(answer).ok().and_then(|m| m.additionals.iter().find(|r| r.rtype == TYPE_OPT).cloned());
    match opt {
        Some(opt) if opt.span.start >= 2 && opt.span.end <= answer.len() => {
            hash.update(&answer[2..opt.span.start]);
            hash.update(opt.ttl.to_be_bytes());
            hash.update(opt.class.to_be_bytes());
            hash.update(without_cookies(&opt.rdata));
            hash.update(&answer[opt.span.end..]);
        }
        _ => hash.update(body),
    }
    hash.finalize().into()
}

/// An OPT record's options with every COOKIE option removed; a malformed list as it is.
fn without_cookies(rdata: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rdata.len());
    let mut rest = rdata;
    while !rest.is_empty() {
        let Some(head) = rest.get(..4) else { return rdata.to_vec() };
        let (code, len) = (u16::from_be_bytes([head[0], head[1]]), usize::from(u16::from_be_bytes([head[2], head[3]])));
        let Some(option) = rest.get(..4 + len) else { return rdata.to_vec() };
        if code != OPTION_COOKIE {
            out.extend_from_slice(option);
        }
        rest = &rest[4 + len..];
    }
    out
}

/// Where the vouches for one read stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not yet decided: the gateway's own answer or enough vouches are missing.
    Pending,
    /// 2t+1 replicas, the gateway included, gave the gateway's answer: it may go to the client.
    Vouched,
    /// 2t+1 can no longer be reached (too many peers vouched for other answers): order the read.
    Failed,
}

/// The vouches for one read at its gateway. Pure: digests in, a verdict out.
#[derive(Clone, Debug)]
pub struct Tally {
    /// Peers that may vouch (n - 1).
    peers: usize,
    /// 2t + 1, the gateway included.
    quorum: usize,
    own: Option<[u8; 32]>,
    /// The first digest each peer sent; later ones from the same peer are ignored.
    vouches: BTreeMap<u16, [u8; 32]>,
}

impl Tally {
    /// For a cluster of `n` replicas tolerating `t` faults.
    pub fn new(n: u16, t: u16) -> Tally {
        Tally { peers: usize::from(n.saturating_sub(1)), quorum: 2 * usize::from(t) + 1, own: None, vouches: BTreeMap::new() }
    }

    /// The gateway's own answer's digest.
    pub fn own(&mut self, digest: [u8; 32]) -> Verdict {
        self.own = Some(digest);
        self.verdict()
    }

    /// Peer `peer`'s vouch. A second vouch from the same peer counts nothing (a peer gets one
    /// say per read, whatever it sends).
    pub fn vouch(&mut self, peer: u16, digest: [u8; 32]) -> Verdict {
        if self.vouches.len() < self.peers {
            self.vouches.entry(peer).or_insert(digest);
        }
        self.verdict()
    }

    pub fn verdict(&self) -> Verdict {
        let Some(own) = self.own else {
            // Without the gateway's answer nothing can be matched yet; a verdict of Failed
            // here would only come from peers disagreeing among themselves, which says nothing
            // about which of them is right.
            return Verdict::Pending;
        };
        let matching = 1 + self.vouches.values().filter(|d| **d == own).count();
        let unheard = self.peers.saturating_sub(self.vouches.len());
        if matching >= self.quorum {
            Verdict::Vouched
        } else if matching + unheard < self.quorum {
            Verdict::Failed
        } else {
            Verdict::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 32] = [1; 32];
    const B: [u8; 32] = [2; 32];

    #[test]
    fn quorum_of_matching_answers_gateway_included() {
        // n = 4, t = 1: the gateway and two peers.
        let mut t = Tally::new(4, 1);
        assert_eq!(t.vouch(1, A), Verdict::Pending, "no own answer yet");
        assert_eq!(t.vouch(2, A), Verdict::Pending);
        assert_eq!(t.own(A), Verdict::Vouched);
        // The own answer last or first makes no difference.
        let mut t = Tally::new(4, 1);
        assert_eq!(t.own(A), Verdict::Pending);
        assert_eq!(t.vouch(3, A), Verdict::Pending);
        assert_eq!(t.vouch(2, A), Verdict::Vouched);
    }

    #[test]
    fn byzantine_wrong_digests_cannot_make_an_answer_pass() {
        // One liar (t = 1) among three peers: two honest matches still vouch.
        let mut t = Tally::new(4, 1);
        t.own(A);
        assert_eq!(t.vouch(1, B), Verdict::Pending);
        assert_eq!(t.vouch(2, A), Verdict::Pending);
        assert_eq!(t.vouch(3, A), Verdict::Vouched);
        // Two peers for another answer (a liar and a lagging honest one): 2t+1 is out of reach.
        let mut t = Tally::new(4, 1);
        t.own(A);
        assert_eq!(t.vouch(1, B), Verdict::Pending);
        assert_eq!(t.vouch(2, B), Verdict::Failed);
        // Peers agreeing on B among themselves never make B pass: the gateway's answer is A.
        let mut t = Tally::new(7, 2);
        t.own(A);
        for p in 1..=4 {
            t.vouch(p, B);
        }
        assert_eq!(t.verdict(), Verdict::Failed);
    }

    #[test]
    fn duplicates_from_one_peer_count_once() {
        let mut t = Tally::new(4, 1);
        t.own(A);
        assert_eq!(t.vouch(1, A), Verdict::Pending);
        assert_eq!(t.vouch(1, A), Verdict::Pending, "the same peer again is not a second vouch");
        assert_eq!(t.vouch(1, A), Verdict::Pending);
        // Nor can a peer take back its word, or turn a mismatch into a match.
        let mut t = Tally::new(4, 1);
        t.own(A);
        t.vouch(1, B);
        assert_eq!(t.vouch(1, A), Verdict::Pending);
        assert_eq!(t.vouch(2, A), Verdict::Pending);
        assert_eq!(t.vouch(3, A), Verdict::Vouched);
    }

    #[test]
    fn larger_clusters_need_2t_plus_1() {
        let mut t = Tally::new(7, 2);
        t.own(A);
        for p in 1..=3 {
            assert_eq!(t.vouch(p, A), Verdict::Pending, "{p} peers match");
        }
        assert_eq!(t.vouch(4, A), Verdict::Vouched);
        // A single replica is its own quorum (t = 0).
        assert_eq!(Tally::new(1, 0).own(A), Verdict::Vouched);
    }

    /// A response to www.example.test/A with one A record and an OPT carrying these options.
    fn answer(id: u16, options: &[u8]) -> Vec<u8> {
        let mut a = id.to_be_bytes().to_vec();
        a.extend_from_slice(&[0x84, 0, 0, 1, 0, 1, 0, 0, 0, 1]);
        a.extend_from_slice(b"\x03www\x07example\x04test\x00\x00\x01\x00\x01");
        a.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 1, 44, 0, 4, 192, 0, 2, 1]);
        a.extend_from_slice(&[0, 0, 41, 4, 208, 0, 0, 0, 0]);
        a.extend_from_slice(&(options.len() as u16).to_be_bytes());
        a.extend_from_slice(options);
        a
    }

    #[test]
    fn digest_leaves_out_the_id_and_cookies_only() {
        let cookie_a = [0, 10, 0, 16, 1, 1, 1, 1, 1, 1, 1, 1, 9, 9, 9, 9, 9, 9, 9, 9];
        let cookie_b = [0, 10, 0, 16, 1, 1, 1, 1, 1, 1, 1, 1, 7, 7, 7, 7, 7, 7, 7, 7];
        let nsid = [0, 3, 0, 2, b'n', b'1'];
        let base = answer_digest(&answer(1, &[]));
        assert_eq!(answer_digest(&answer(2, &[])), base, "id");
        assert_eq!(answer_digest(&answer(1, &cookie_a)), base, "a cookie");
        assert_eq!(answer_digest(&answer(1, &cookie_a)), answer_digest(&answer(3, &cookie_b)), "different server cookies");
        assert_ne!(answer_digest(&answer(1, &nsid)), base, "other options count");
        let mut other = answer(1, &[]);
        let at = other.len() - 12;
        other[at] = 2; // the address's last octet
        assert_ne!(answer_digest(&other), base, "the data counts");
        let mut flags = answer(1, &[]);
        flags[3] |= 3;
        assert_ne!(answer_digest(&flags), base, "flags and rcode count");
        // Unparsable bytes are hashed as they are, id aside.
        assert_eq!(answer_digest(&[0, 1, 5, 5]), answer_digest(&[9, 9, 5, 5]));
        assert_ne!(answer_digest(&[0, 1, 5, 5]), answer_digest(&[0, 1, 5, 6]));
        assert_eq!(answer_digest(&[]), answer_digest(&[7]));
    }

    #[test]
    fn probe_requests_round_trip_and_refuse_the_unknown() {
        assert_eq!(parse_probe_request(&probe_request(b"q", true)), Some((true, &b"q"[..])));
        assert_eq!(parse_probe_request(&probe_request(b"q", false)), Some((false, &b"q"[..])));
        assert_eq!(parse_probe_request(&[]), None);
        assert_eq!(parse_probe_request(&[1]), None);
        assert_eq!(parse_probe_request(&[2, 0, 0]), None);
    }
}
