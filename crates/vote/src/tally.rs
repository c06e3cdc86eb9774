//! The quorum decision: pure, over the replies received so far.
//!
//! Each replica has one vote, its first reply. An answer is accepted once `quorum` replicas gave
//! it and no other answer can still reach `quorum` (with quorums above n/2 that is at once; the
//! a quorum of t + 1 could otherwise accept one of two results that honest replicas both gave).

use std::collections::BTreeMap;

/// One replica's reply, as far as voting is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Vote<K> {
    /// An answer, in canonical form.
    Answer(K),
    /// No usable answer: silent through every retry, or sent something that is not an answer.
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<K> {
    /// `answer` is accepted; `supporters` gave it.
    Accept { answer: K, supporters: Vec<usize> },
    /// Not decided yet: more replies could change the outcome.
    Wait,
    /// Enough replicas answered (or still may) but their answers disagree: none can reach
    /// `quorum` any more.
    NoQuorum,
    /// Fewer than `quorum` replicas answered at all.
    TooFewAnswers,
}

#[derive(Clone, Debug)]
pub struct Tally<K> {
    quorum: usize,
    votes: Vec<Option<Vote<K>>>,
}

impl<K: Ord + Clone> Tally<K> {
    /// A tally over `n` replicas; `quorum` is clamped to 1..=n.
    pub fn new(n: usize, quorum: usize) -> Tally<K> {
        Tally { quorum: quorum.clamp(1, n.max(1)), votes: vec![None; n] }
    }

    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Records replica `replica`'s vote. Later votes of the same replica, and replicas outside
    /// 0..n, are ignored.
    pub fn record(&mut self, replica: usize, vote: Vote<K>) {
        if let Some(slot @ None) = self.votes.get_mut(replica) {
            *slot = Some(vote);
        }
    }

    pub fn vote(&self, replica: usize) -> Option<&Vote<K>> {
        self.votes.get(replica).and_then(Option::as_ref)
    }

    /// Replicas that have not voted yet.
    pub fn outstanding(&self) -> usize {
        self.votes.iter().filter(|v| v.is_none()).count()
    }

    pub fn all_voted(&self) -> bool {
        self.outstanding() == 0
    }

    /// Answers grouped by content, largest group first (ties: smaller answer first, so the
    /// order never depends on arrival).
    fn groups(&self) -> Vec<(&K, Vec<usize>)> {
        let mut groups: BTreeMap<&K, Vec<usize>> = BTreeMap::new();
        for (i, v) in self.votes.iter().enumerate() {
            if let Some(Vote::Answer(k)) = v {
                groups.entry(k).or_default().push(i);
            }
        }
        let mut groups: Vec<(&K, Vec<usize>)> = groups.into_iter().collect();
        groups.sort_by_key(|g| std::cmp::Reverse(g.1.len()));
        groups
    }

    /// The decision now. `closed`: no more replies will come (deadline passed or all voted).
    pub fn decide(&self, closed: bool) -> Decision<K> {
        let groups = self.groups();
        let best = groups.first().map_or(0, |g| g.1.len());
        let second = groups.get(1).map_or(0, |g| g.1.len());
        let outstanding = if closed { 0 } else { self.outstanding() };
        if best >= self.quorum && second + outstanding < self.quorum {
            if let Some((answer, supporters)) = groups.first() {
                return Decision::Accept { answer: (*answer).clone(), supporters: supporters.clone() };
            }
        }
        if outstanding > 0 && best + outstanding >= self.quorum {
            return Decision::Wait;
        }
        // No answer can win any more.
        let answered: usize = groups.iter().map(|g| g.1.len()).sum();
        if answered + outstanding >= self.quorum {
            // Enough replicas answered (or still may), but they disagree.
            Decision::NoQuorum
        } else {
            Decision::TooFewAnswers
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tally(n: usize, quorum: usize, votes: &[(usize, Vote<u8>)]) -> Tally<u8> {
        let mut t = Tally::new(n, quorum);
        for (i, v) in votes {
            t.record(*i, v.clone());
        }
        t
    }

    use Vote::{Answer, Failed};

    #[test]
    fn one_liar_among_four_is_outvoted_and_named() {
        let t = tally(4, 3, &[(0, Answer(1)), (3, Answer(9)), (1, Answer(1))]);
        assert_eq!(t.decide(false), Decision::Wait);
        let t = tally(4, 3, &[(0, Answer(1)), (3, Answer(9)), (1, Answer(1)), (2, Answer(1))]);
        assert_eq!(t.decide(false), Decision::Accept { answer: 1, supporters: vec![0, 1, 2] });
    }

    #[test]
    fn a_silent_replica_does_not_stop_the_answer() {
        let t = tally(4, 3, &[(0, Answer(1)), (1, Answer(1)), (2, Answer(1))]);
        assert_eq!(t.decide(false), Decision::Accept { answer: 1, supporters: vec![0, 1, 2] });
    }

    #[test]
    fn more_than_t_faulty_gives_no_answer_rather_than_a_guess() {
        // Two liars agreeing on the same lie against two honest replicas.
        let t = tally(4, 3, &[(0, Answer(1)), (1, Answer(1)), (2, Answer(9)), (3, Answer(9))]);
        assert_eq!(t.decide(false), Decision::NoQuorum);
        // One liar and one silent replica: three answered, no three agree.
        let t = tally(4, 3, &[(0, Answer(1)), (1, Answer(1)), (2, Answer(9)), (3, Failed("timeout".into()))]);
        assert_eq!(t.decide(false), Decision::NoQuorum);
        // Two silent: not enough answers to decide anything.
        let t = tally(4, 3, &[(0, Answer(1)), (1, Answer(1)), (2, Failed("timeout".into()))]);
        assert_eq!(t.decide(false), Decision::Wait);
        assert_eq!(t.decide(true), Decision::TooFewAnswers);
    }

    #[test]
    fn small_quorum_waits_until_the_other_result_cannot_win() {
        // A quorum of t + 1 = 2 of 4: two NOERROR, one other result, one pending.
        let t = tally(4, 2, &[(0, Answer(0)), (1, Answer(0)), (2, Answer(5))]);
        assert_eq!(t.decide(false), Decision::Wait);
        assert_eq!(t.decide(true), Decision::Accept { answer: 0, supporters: vec![0, 1] });
        let t = tally(4, 2, &[(0, Answer(0)), (1, Answer(0)), (2, Answer(5)), (3, Answer(5))]);
        assert_eq!(t.decide(false), Decision::NoQuorum);
        let t = tally(4, 2, &[(0, Answer(0)), (1, Answer(0)), (2, Answer(0))]);
        assert_eq!(t.decide(false), Decision::Accept { answer: 0, supporters: vec![0, 1, 2] });
    }

    #[test]
    fn a_replica_votes_once() {
        let t = tally(4, 3, &[(0, Answer(1)), (0, Answer(2)), (0, Answer(2)), (7, Answer(2))]);
        assert_eq!(t.vote(0), Some(&Answer(1)));
        assert_eq!(t.outstanding(), 3);
    }

    proptest! {
        /// With at most t faulty replicas and every honest one answering the truth, the truth is
        /// accepted whatever the faulty ones say and in whatever order replies arrive; nothing
        /// else is ever accepted; and with n >= 3t + 1 the decision never needs the faulty ones.
        #[test]
        fn honest_majority_wins_and_nothing_else_is_accepted(
            t in 0usize..4,
            extra in 0usize..3,
            lies in proptest::collection::vec(proptest::option::of(1u8..4), 4),
            order_seed in any::<u64>(),
        ) {
            let n = 3 * t + 1 + extra;
            for quorum in [2 * t + 1, n - t] {
                let mut votes: Vec<(usize, Vote<u8>)> = (0..n).map(|i| {
                    if i < t {
                        match lies[i % lies.len()] { Some(l) => (i, Answer(l)), None => (i, Failed("silent".into())) }
                    } else {
                        (i, Answer(0))
                    }
                }).collect();
                // Deterministic shuffle.
                let mut s = order_seed | 1;
                for i in (1..votes.len()).rev() {
                    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                    votes.swap(i, (s % (i as u64 + 1)) as usize);
                }
                let mut tl = Tally::new(n, quorum);
                let mut accepted = None;
                for (i, v) in votes {
                    tl.record(i, v);
                    match tl.decide(false) {
                        Decision::Accept { answer, .. } => { accepted = Some(answer); break; }
                        Decision::Wait => {}
                        d => prop_assert!(false, "n={} t={} quorum={}: {:?}", n, t, quorum, d),
                    }
                }
                prop_assert_eq!(accepted, Some(0));
            }
        }
    }
}
