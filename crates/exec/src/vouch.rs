//! The sans-IO half of vouched reads (driven by the wrapper's `reads::vouched`): the messages
//! replicas exchange on the mesh's reads channel, and what the peers' answers require of the
//! gateway's own answer.
//!
//! A gateway probes its peers in rounds: one probe carries nothing but the round's number,
//! and covers every read the gateway took before sending it. A peer answers with its read
//! barrier as the probe arrived (the wrapper's `reads::vouched` says what that is). Neither
//! message carries a question or an answer: the client is sent the gateway's own answer, taken
//! at a position of the log the barriers say is recent enough ([`required`]).

use std::collections::BTreeMap;

/// Fault injection in vouched reads (Byzantine modes, test clusters only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    #[default]
    None,
    /// Sends no probe and no answer to a probe.
    Silent,
    /// Answers probes with made-up barriers (`wrong-vouches`): far ahead of its own for
    /// even rounds (the lie that could make a gateway wait), 0 for odd ones (the lie that
    /// could let a stale answer pass, were it counted alone).
    WrongVouches,
}

impl Fault {
    /// The barrier this replica sends for `round` when its own is `barrier`.
    pub fn barrier(self, round: u64, barrier: u64) -> u64 {
        match self {
            Fault::WrongVouches if round.is_multiple_of(2) => barrier.saturating_add(WRONG_BARRIER_AHEAD),
            Fault::WrongVouches => 0,
            _ => barrier,
        }
    }
}

/// How far ahead of its own barrier a [`Fault::WrongVouches`] replica claims to be.
pub const WRONG_BARRIER_AHEAD: u64 = 1 << 20;

/// The first byte of a message on the reads channel (1 and 2 were the probes and vouches of
/// the digest protocol before this one; a replica still speaking it is refused by tag).
const TAG_PROBE: u8 = 3;
const TAG_BARRIER: u8 = 4;

/// A message on the reads channel. The sender is the peer the mesh proved, never a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadWire {
    /// A gateway's probe round.
    Probe { round: u64 },
    /// The sender's read barrier as round `round`'s probe reached it.
    Barrier { round: u64, barrier: u64 },
}

impl ReadWire {
    pub fn encode(self) -> Vec<u8> {
        match self {
            ReadWire::Probe { round } => {
                let mut out = Vec::with_capacity(9);
                out.push(TAG_PROBE);
                out.extend_from_slice(&round.to_be_bytes());
                out
            }
            ReadWire::Barrier { round, barrier } => {
                let mut out = Vec::with_capacity(17);
                out.push(TAG_BARRIER);
                out.extend_from_slice(&round.to_be_bytes());
                out.extend_from_slice(&barrier.to_be_bytes());
                out
            }
        }
    }
}

/// Why a peer's message on the reads channel was refused (a metrics label).
pub type WireError = &'static str;

/// Decodes a peer's message: exactly a probe or a barrier, nothing left over.
pub fn decode_read_wire(frame: &[u8]) -> Result<ReadWire, WireError> {
    let (tag, rest) = frame.split_first().ok_or("read_message_empty")?;
    let word = |at: usize| -> Option<u64> { Some(u64::from_be_bytes(rest.get(at..at + 8)?.try_into().ok()?)) };
    match *tag {
        TAG_PROBE if rest.len() == 8 => Ok(ReadWire::Probe { round: word(0).ok_or("read_probe_length")? }),
        TAG_PROBE => Err("read_probe_length"),
        TAG_BARRIER if rest.len() == 16 => {
            let (round, barrier) = word(0).zip(word(8)).ok_or("read_barrier_length")?;
            Ok(ReadWire::Barrier { round, barrier })
        }
        TAG_BARRIER => Err("read_barrier_length"),
        _ => Err("read_message_tag"),
    }
}

/// The peers' barriers for one probe round, the first each peer sent.
#[derive(Clone, Debug)]
pub struct Barriers {
    /// Peers that may answer (n - 1).
    peers: usize,
    /// 2t: with the gateway, a quorum.
    needed: usize,
    replies: BTreeMap<u16, u64>,
    /// The largest of the 2t smallest replies (0 when t = 0), once 2t are in: what every
    /// read of the round is checked against, so it is worked out once per reply, not per read.
    peers_required: Option<u64>,
}

impl Barriers {
    /// For a cluster of `n` replicas tolerating `t` faults.
    pub fn new(n: u16, t: u16) -> Barriers {
        let needed = 2 * usize::from(t);
        Barriers { peers: usize::from(n.saturating_sub(1)), needed, replies: BTreeMap::new(), peers_required: (needed == 0).then_some(0) }
    }

    /// Peer `peer`'s barrier; `false` when it counts nothing (the peer answered this round
    /// already: one say per round, whatever it sends).
    pub fn reply(&mut self, peer: u16, barrier: u64) -> bool {
        if self.replies.len() >= self.peers || self.replies.contains_key(&peer) {
            return false;
        }
        self.replies.insert(peer, barrier);
        if self.replies.len() >= self.needed {
            let mut barriers: Vec<u64> = self.replies.values().copied().collect();
            barriers.sort_unstable();
            self.peers_required = Some(barriers.get(..self.needed).and_then(|b| b.last().copied()).unwrap_or(0));
        }
        true
    }

    /// Every peer answered: what [`Self::required`] says now, it says for good.
    pub fn complete(&self) -> bool {
        self.replies.len() >= self.peers
    }

    /// The position of the log the gateway's answer must reflect, once 2t peers answered: the
    /// largest barrier among the gateway's own (`own`, taken as the read arrived) and its 2t
    /// peers with the smallest. `None` while fewer than 2t answered.
    ///
    /// Why that is enough (docs/DETERMINISM.md, "Vouched reads"): a write at seq s that was
    /// acknowledged before the read began had been committed by 2t+1 replicas, each showing
    /// a barrier of at least s from then on. The gateway and any 2t peers are 2t+1 replicas,
    /// so they share at least t+1 with those committers, one of them honest (or the gateway
    /// itself), whose barrier, taken after the read began, is at least s: the largest of the
    /// 2t+1 is at least s. Lies do not lower it (an honest committer is always among them);
    /// taking the smallest 2t keeps up to t made-up barriers far ahead out of it once every
    /// peer answered.
    pub fn required(&self, own: u64) -> Option<u64> {
        self.peers_required.map(|peers| peers.max(own))
    }
}

/// Where one read stands at its gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not yet decided: the gateway's own answer or 2t barriers are missing.
    Pending,
    /// The own answer reflects the log up to the required position: it may go to the client.
    Vouched,
    /// The own answer was taken before the required position (given here): take it again
    /// once the gateway has executed that far.
    Behind(u64),
}

/// The verdict for a read whose gateway took its barrier `own_barrier` as it arrived, and its
/// own answer (if in) at executed position `own_at`.
pub fn verdict(barriers: &Barriers, own_barrier: u64, own_at: Option<u64>) -> Verdict {
    let (Some(required), Some(at)) = (barriers.required(own_barrier), own_at) else { return Verdict::Pending };
    if at >= required {
        Verdict::Vouched
    } else {
        Verdict::Behind(required)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_peers_and_the_gateway_make_the_quorum() {
        // n = 4, t = 1.
        let mut b = Barriers::new(4, 1);
        assert_eq!(verdict(&b, 5, Some(5)), Verdict::Pending, "no peer yet");
        assert!(b.reply(1, 5));
        assert_eq!(verdict(&b, 5, Some(5)), Verdict::Pending, "one peer is not 2t");
        assert!(b.reply(2, 4));
        assert_eq!(b.required(5), Some(5));
        assert_eq!(verdict(&b, 5, Some(5)), Verdict::Vouched);
        assert_eq!(verdict(&b, 5, None), Verdict::Pending, "no own answer yet");
        // A peer ahead: the gateway's answer must reflect its barrier.
        let mut b = Barriers::new(4, 1);
        b.reply(3, 9);
        b.reply(1, 6);
        assert_eq!(verdict(&b, 5, Some(6)), Verdict::Behind(9));
        assert_eq!(verdict(&b, 5, Some(9)), Verdict::Vouched);
        // A single replica is its own quorum (t = 0).
        assert_eq!(verdict(&Barriers::new(1, 0), 3, Some(3)), Verdict::Vouched);
    }

    #[test]
    fn a_lie_cannot_lower_the_required_position() {
        // t = 1: the gateway lags (barrier 4); a write at 7 was committed by peers 1, 2 and 3;
        // peer 3 is Byzantine and says 0. Whichever two peers answer first, 7 is required.
        for first in [[3, 1], [3, 2], [1, 2], [2, 3]] {
            let mut b = Barriers::new(4, 1);
            for p in first {
                b.reply(p, if p == 3 { 0 } else { 7 });
            }
            assert_eq!(b.required(4), Some(7), "{first:?}");
            assert_eq!(verdict(&b, 4, Some(4)), Verdict::Behind(7));
        }
        // n = 7, t = 2: two liars at 0 among the first four.
        let mut b = Barriers::new(7, 2);
        for (p, v) in [(1, 0), (2, 0), (3, 7), (4, 7)] {
            b.reply(p, v);
        }
        assert_eq!(b.required(2), Some(7));
    }

    #[test]
    fn a_lie_far_ahead_counts_only_until_every_peer_answered() {
        let mut b = Barriers::new(4, 1);
        b.reply(3, u64::MAX);
        b.reply(1, 5);
        assert_eq!(verdict(&b, 5, Some(5)), Verdict::Behind(u64::MAX));
        assert!(!b.complete());
        b.reply(2, 5);
        assert!(b.complete());
        assert_eq!(verdict(&b, 5, Some(5)), Verdict::Vouched, "the 2t smallest leave it out");
    }

    /// Seeded scenarios: a write at seq s committed by 2t+1 random replicas (an honest one's
    /// barrier is then at least s), up to t Byzantine replicas answering anything, honest
    /// non-committers anywhere at or below their log, answers in any order, and the gateway
    /// honest but maybe lagging. Once 2t peers answered, and at every later answer, the
    /// required position is at least s.
    #[test]
    fn seeded_scenarios_never_require_less_than_an_acknowledged_write() {
        // splitmix64: reproducible without a dependency.
        let mut state = 0x5eed_u64;
        let mut next = move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for scenario in 0..20_000u32 {
            let n = [4u16, 7, 10][(next() % 3) as usize];
            let t = (n - 1) / 3;
            let s = 10 + next() % 1000;
            // Replica 0 is the gateway; shuffle 0..n to pick committers and liars.
            let mut ids: Vec<u16> = (0..n).collect();
            for i in (1..ids.len()).rev() {
                ids.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            let committers = &ids[..usize::from(2 * t + 1)];
            let liars: Vec<u16> = ids.iter().copied().filter(|&r| r != 0).take((next() % (u64::from(t) + 1)) as usize).collect();
            let barrier_of = |r: u16, roll: u64| -> u64 {
                if committers.contains(&r) {
                    s + roll % 5
                } else {
                    roll % (s + 5)
                }
            };
            let own = barrier_of(0, next());
            let mut order: Vec<u16> = (1..n).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            let mut b = Barriers::new(n, t);
            for (k, peer) in order.into_iter().enumerate() {
                let value = if liars.contains(&peer) {
                    match next() % 3 {
                        0 => 0,
                        1 => u64::MAX,
                        _ => next(),
                    }
                } else {
                    barrier_of(peer, next())
                };
                assert!(b.reply(peer, value));
                match b.required(own) {
                    None => assert!(k + 1 < usize::from(2 * t), "scenario {scenario}: 2t answers and nothing required"),
                    Some(r) => assert!(r >= s, "scenario {scenario}: n {n}, write at {s}, required {r}; committers {committers:?}, liars {liars:?}"),
                }
            }
        }
    }

    #[test]
    fn one_say_per_peer() {
        let mut b = Barriers::new(4, 1);
        assert!(b.reply(1, 3));
        assert!(!b.reply(1, 3), "the same peer again is not a second answer");
        assert!(!b.reply(1, 0), "nor can it take back its word");
        assert_eq!(b.required(0), None);
        assert!(b.reply(2, 3));
        assert_eq!(b.required(0), Some(3));
        assert!(b.reply(3, 3));
        assert!(!b.reply(4, 0), "no more answers than peers");
    }

    proptest::proptest! {
        /// Any bytes from a peer decode without a panic, and whatever decodes is exactly the
        /// encoding of what it decoded to (nothing left over, nothing read twice).
        #[test]
        fn any_peer_frame_decodes_to_its_own_encoding_or_is_refused(
            tag in 0u8..6,
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20),
        ) {
            // Tags around the real ones and bodies around their lengths, so that the accepting
            // branches are hit often, not once in thousands of random frames.
            let frame: Vec<u8> = std::iter::once(tag).chain(body).collect();
            if let Ok(m) = decode_read_wire(&frame) {
                proptest::prop_assert_eq!(m.encode(), frame);
            }
        }
    }

    #[test]
    fn messages_round_trip_and_malformed_ones_are_refused() {
        for m in [ReadWire::Probe { round: 0 }, ReadWire::Probe { round: u64::MAX }, ReadWire::Barrier { round: 7, barrier: 1 << 40 }] {
            assert_eq!(decode_read_wire(&m.encode()), Ok(m));
        }
        assert_eq!(decode_read_wire(&[]), Err("read_message_empty"));
        assert_eq!(decode_read_wire(&[TAG_PROBE]), Err("read_probe_length"));
        assert_eq!(decode_read_wire(&[TAG_BARRIER, 0, 0]), Err("read_barrier_length"));
        assert_eq!(decode_read_wire(&[9, 1, 2]), Err("read_message_tag"));
        assert_eq!(decode_read_wire(&[1, 0, 0, 0, 0, 0, 0, 0, 1]), Err("read_message_tag"), "the digest protocol's probe");
        let probe = ReadWire::Probe { round: 1 }.encode();
        let barrier = ReadWire::Barrier { round: 1, barrier: 2 }.encode();
        for cut in 1..probe.len() {
            assert!(decode_read_wire(&probe[..cut]).is_err(), "probe cut at {cut}");
        }
        for cut in 1..barrier.len() {
            assert!(decode_read_wire(&barrier[..cut]).is_err(), "barrier cut at {cut}");
        }
        let mut long = barrier.clone();
        long.push(0);
        assert_eq!(decode_read_wire(&long), Err("read_barrier_length"), "nothing left over");
    }
}
