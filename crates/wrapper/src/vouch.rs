//! The sans-IO half of vouched reads (`crate::vouched`): the messages replicas exchange on the
//! mesh's reads channel, the digest replicas compare answers by, and the gateway's tally of the
//! vouches for one read.
//!
//! A probe carries, per read, the gateway's id for it, whether the client asked over TCP (which
//! decides named's truncation) and the client's DNS message. The digest of an answer covers every byte
//! the client would get except the id (each replica's copy carries its own probe's) and an EDNS
//! COOKIE option (a server cookie differs per replica and per moment); the client is sent the
//! gateway's own bytes unchanged, so what the digest leaves out never reaches it from a peer.

use std::collections::BTreeMap;

use named_glue::rrwire::{RawMessage, TYPE_OPT};
use sha2::{Digest as _, Sha256};

/// Most reads in one probe (and answers in one vouch).
pub const MAX_READ_PROBES: usize = 256;

/// Most bytes of DNS messages in one probe.
pub const MAX_READ_PROBE_BYTES: usize = 256 * 1024;

const OPTION_COOKIE: u16 = 10;

/// Fault injection in vouched reads (Byzantine modes, test clusters only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    #[default]
    None,
    /// Sends no probe and no vouch.
    Silent,
    /// Vouches with made-up digests (`wrong-vouches`).
    WrongVouches,
}

/// The first byte of a message on the reads channel.
const TAG_PROBE: u8 = 1;
const TAG_VOUCH: u8 = 2;
/// A probe's read: id (8 bytes), transport flag, length (2 bytes), then the DNS message.
const PROBE_READ_HEAD: usize = 11;
/// A vouch's answer: id (8 bytes) and digest.
const VOUCH_ANSWER: usize = 40;

/// A message on the reads channel, borrowed from the frame it came in. The sender is the
/// peer the mesh proved, never a field.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadWire<'a> {
    /// Reads a gateway asks its peers to vouch for: (read id, over TCP, DNS message).
    Probe(Vec<(u64, bool, &'a [u8])>),
    /// Digests of the sender's answers to reads this replica probed: (read id, digest).
    Vouch(Vec<(u64, [u8; 32])>),
}

/// Probes built up read by read, at most [`MAX_READ_PROBES`] reads and about
/// [`MAX_READ_PROBE_BYTES`] of DNS messages per message.
#[derive(Debug, Default)]
pub struct ProbeBatch {
    buf: Vec<u8>,
    reads: usize,
    bytes: usize,
}

impl ProbeBatch {
    /// Whether a read of `len` bytes still fits; an empty batch takes any DNS message.
    pub fn fits(&self, len: usize) -> bool {
        self.reads == 0 || (self.reads < MAX_READ_PROBES && self.bytes + len <= MAX_READ_PROBE_BYTES)
    }

    /// Appends one read; `false` (nothing appended) when it does not fit or is no DNS message.
    pub fn push(&mut self, id: u64, tcp: bool, message: &[u8]) -> bool {
        let Ok(len) = u16::try_from(message.len()) else { return false };
        if message.is_empty() || !self.fits(message.len()) {
            return false;
        }
        if self.buf.is_empty() {
            self.buf.push(TAG_PROBE);
        }
        self.buf.extend_from_slice(&id.to_be_bytes());
        self.buf.push(u8::from(tcp));
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(message);
        self.reads += 1;
        self.bytes += message.len();
        true
    }

    pub fn is_empty(&self) -> bool {
        self.reads == 0
    }

    /// The encoded probe, leaving the batch empty; `None` when it was.
    pub fn take(&mut self) -> Option<Vec<u8>> {
        if self.reads == 0 {
            return None;
        }
        self.reads = 0;
        self.bytes = 0;
        Some(std::mem::take(&mut self.buf))
    }
}

/// A vouch for these answers (at most [`MAX_READ_PROBES`]; more are left out).
pub fn encode_vouch(answers: &[(u64, [u8; 32])]) -> Vec<u8> {
    let answers = &answers[..answers.len().min(MAX_READ_PROBES)];
    let mut out = Vec::with_capacity(1 + answers.len() * VOUCH_ANSWER);
    out.push(TAG_VOUCH);
    for (id, digest) in answers {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(digest);
    }
    out
}

/// Why a peer's message on the reads channel was refused (a metrics label).
pub type WireError = &'static str;

/// Decodes a peer's message, within the bounds a gateway keeps to: at most
/// [`MAX_READ_PROBES`] reads or answers, [`MAX_READ_PROBE_BYTES`] of DNS messages, nothing
/// empty, nothing left over.
pub fn decode_read_wire(frame: &[u8]) -> Result<ReadWire<'_>, WireError> {
    let (tag, mut rest) = frame.split_first().ok_or("read_message_empty")?;
    match *tag {
        TAG_PROBE => {
            let mut reads = Vec::new();
            let mut bytes = 0usize;
            while !rest.is_empty() {
                let head = rest.get(..PROBE_READ_HEAD).ok_or("read_probe_truncated")?;
                let id = u64::from_be_bytes(head[..8].try_into().map_err(|_| "read_probe_truncated")?);
                let tcp = match head[8] {
                    0 => false,
                    1 => true,
                    _ => return Err("read_probe_flag"),
                };
                let len = usize::from(u16::from_be_bytes([head[9], head[10]]));
                let message = rest.get(PROBE_READ_HEAD..PROBE_READ_HEAD + len).ok_or("read_probe_truncated")?;
                bytes += len;
                if len == 0 || reads.len() >= MAX_READ_PROBES || bytes > MAX_READ_PROBE_BYTES {
                    return Err("read_probe_bounds");
                }
                reads.push((id, tcp, message));
                rest = &rest[PROBE_READ_HEAD + len..];
            }
            if reads.is_empty() {
                return Err("read_message_empty");
            }
            Ok(ReadWire::Probe(reads))
        }
        TAG_VOUCH => {
            if rest.is_empty() || rest.len() % VOUCH_ANSWER != 0 {
                return Err("read_vouch_truncated");
            }
            if rest.len() / VOUCH_ANSWER > MAX_READ_PROBES {
                return Err("read_vouch_bounds");
            }
            let answers = rest
                .chunks_exact(VOUCH_ANSWER)
                .map(|c| {
                    let (id, digest) = c.split_at(8);
                    let mut d = [0u8; 32];
                    d.copy_from_slice(digest);
                    (u64::from_be_bytes([id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]]), d)
                })
                .collect();
            Ok(ReadWire::Vouch(answers))
        }
        _ => Err("read_message_tag"),
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
    fn read_messages_round_trip() {
        let mut batch = ProbeBatch::default();
        assert!(batch.is_empty() && batch.take().is_none());
        assert!(batch.push(7, false, b"query one"));
        assert!(batch.push(u64::MAX, true, b"q2"));
        assert!(!batch.push(8, false, b""), "no empty message");
        let probe = batch.take().unwrap();
        assert!(batch.is_empty());
        assert_eq!(decode_read_wire(&probe), Ok(ReadWire::Probe(vec![(7, false, &b"query one"[..]), (u64::MAX, true, &b"q2"[..])])));
        let answers = vec![(1, A), (u64::MAX - 1, B)];
        assert_eq!(decode_read_wire(&encode_vouch(&answers)), Ok(ReadWire::Vouch(answers)));
        let many: Vec<(u64, [u8; 32])> = (0..MAX_READ_PROBES as u64 + 5).map(|i| (i, A)).collect();
        let ReadWire::Vouch(kept) = decode_read_wire(&encode_vouch(&many)).unwrap() else { panic!() };
        assert_eq!(kept.len(), MAX_READ_PROBES, "an encoder keeps to the bound");
    }

    #[test]
    fn probe_batches_keep_to_the_bounds() {
        let mut batch = ProbeBatch::default();
        for i in 0..MAX_READ_PROBES as u64 {
            assert!(batch.push(i, false, b"q"));
        }
        assert!(!batch.fits(1) && !batch.push(999, false, b"q"), "one read too many");
        let probe = batch.take().unwrap();
        let ReadWire::Probe(reads) = decode_read_wire(&probe).unwrap() else { panic!() };
        assert_eq!(reads.len(), MAX_READ_PROBES);
        let big = vec![0u8; 65_535];
        let mut batch = ProbeBatch::default();
        let mut n = 0;
        while batch.push(n, true, &big) {
            n += 1;
        }
        assert_eq!(n as usize, MAX_READ_PROBE_BYTES / big.len(), "bytes bound");
        assert!(decode_read_wire(&batch.take().unwrap()).is_ok());
        assert!(!ProbeBatch::default().push(1, false, &vec![0u8; 65_536]), "not a DNS message");
    }

    #[test]
    fn peer_messages_beyond_the_bounds_or_malformed_are_refused() {
        assert_eq!(decode_read_wire(&[]), Err("read_message_empty"));
        assert_eq!(decode_read_wire(&[TAG_PROBE]), Err("read_message_empty"));
        assert_eq!(decode_read_wire(&[TAG_VOUCH]), Err("read_vouch_truncated"));
        assert_eq!(decode_read_wire(&[9, 1, 2]), Err("read_message_tag"));
        let mut batch = ProbeBatch::default();
        batch.push(1, false, b"abc");
        let probe = batch.take().unwrap();
        for cut in 1..probe.len() {
            assert!(decode_read_wire(&probe[..cut]).is_err(), "cut at {cut}");
        }
        let mut flag = probe.clone();
        flag[9] = 2;
        assert_eq!(decode_read_wire(&flag), Err("read_probe_flag"));
        let mut zero = probe[..PROBE_READ_HEAD + 1].to_vec();
        zero[10..12].copy_from_slice(&[0, 0]);
        assert_eq!(decode_read_wire(&zero), Err("read_probe_bounds"), "an empty message");
        // Hand-made beyond the bounds: one read too many, too many bytes, too many answers.
        let mut many = vec![TAG_PROBE];
        for i in 0..=MAX_READ_PROBES as u64 {
            many.extend_from_slice(&i.to_be_bytes());
            many.extend_from_slice(&[0, 0, 1, b'q']);
        }
        assert_eq!(decode_read_wire(&many), Err("read_probe_bounds"));
        let mut bulky = vec![TAG_PROBE];
        for i in 0..(MAX_READ_PROBE_BYTES / 65_535 + 1) as u64 {
            bulky.extend_from_slice(&i.to_be_bytes());
            bulky.extend_from_slice(&[0, 0xff, 0xff]);
            bulky.extend_from_slice(&[0u8; 65_535]);
        }
        assert_eq!(decode_read_wire(&bulky), Err("read_probe_bounds"));
        let mut vouches = vec![TAG_VOUCH];
        vouches.extend(std::iter::repeat_n(0u8, (MAX_READ_PROBES + 1) * VOUCH_ANSWER));
        assert_eq!(decode_read_wire(&vouches), Err("read_vouch_bounds"));
        assert_eq!(decode_read_wire(&vouches[..VOUCH_ANSWER]), Err("read_vouch_truncated"));
    }
}
