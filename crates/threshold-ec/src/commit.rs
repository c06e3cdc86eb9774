//! The commitment round's bookkeeping, the same for both algorithms: for every t-set T the
//! n − t holders of ρ_T each report the bytes of T's commitments; the bytes t+1 holders agree
//! on are accepted (at least t+1 holders are honest, and t liars cannot reach t+1), and a
//! holder that reported anything else is a liar.
//!
//! Bytes are compared, not points: an honest report is the canonical encoding, so a different
//! encoding of the same point is a lie too, and nothing is decoded until it is accepted.

use std::collections::{BTreeMap, BTreeSet};

use crate::prss::{contains, subsets};

pub(crate) struct CommitTable {
    t: u16,
    sets: Vec<u32>,
    reports: Vec<BTreeMap<Vec<u8>, BTreeSet<u16>>>,
    accepted: Vec<Option<Vec<u8>>>,
    missing: usize,
}

impl CommitTable {
    pub(crate) fn new(n: u16, t: u16) -> CommitTable {
        let sets = subsets(n, t);
        let count = sets.len();
        CommitTable { t, sets, reports: vec![BTreeMap::new(); count], accepted: vec![None; count], missing: count }
    }

    /// The sets `from` holds keys for, in order: what its report must cover.
    pub(crate) fn held_by(&self, from: u16) -> usize {
        self.sets.iter().filter(|s| !contains(**s, from)).count()
    }

    /// Records `from`'s report (one bundle per set it holds, in order; the caller checked the
    /// count) and returns the holders newly shown to have lied, `from` or earlier reporters.
    pub(crate) fn add(&mut self, from: u16, bundles: Vec<Vec<u8>>) -> BTreeSet<u16> {
        let mut liars = BTreeSet::new();
        let held: Vec<usize> = (0..self.sets.len()).filter(|&k| !contains(self.sets[k], from)).collect();
        for (k, bundle) in held.into_iter().zip(bundles) {
            if let Some(accepted) = &self.accepted[k] {
                if *accepted != bundle {
                    liars.insert(from);
                }
                continue;
            }
            let reporters = self.reports[k].entry(bundle.clone()).or_default();
            reporters.insert(from);
            if reporters.len() > usize::from(self.t) {
                for (other, who) in std::mem::take(&mut self.reports[k]) {
                    if other != bundle {
                        liars.extend(who);
                    }
                }
                self.accepted[k] = Some(bundle);
                self.missing -= 1;
            }
        }
        liars
    }

    pub(crate) fn complete(&self) -> bool {
        self.missing == 0
    }

    /// (T, accepted bytes) for every set, once [`CommitTable::complete`].
    pub(crate) fn accepted(&self) -> Option<Vec<(u32, &[u8])>> {
        self.sets.iter().zip(&self.accepted).map(|(s, a)| a.as_deref().map(|a| (*s, a))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_plus_one_matching_reports_win_and_everyone_else_is_a_liar() {
        // n = 4, t = 1: sets {1},{2},{3},{4}; replica 1 holds {2},{3},{4}.
        let mut table = CommitTable::new(4, 1);
        let honest = |k: u8| vec![k; 3];
        let report =
            |from: u16, lie: bool| -> Vec<Vec<u8>> { (1u8..=4).filter(|&k| u16::from(k) != from).map(|k| if lie { vec![99; 3] } else { honest(k) }).collect() };
        assert!(table.add(2, report(2, true)).is_empty(), "a lone report proves nothing");
        assert!(!table.complete());
        assert_eq!(table.add(1, report(1, false)), BTreeSet::new());
        assert_eq!(table.add(3, report(3, false)), BTreeSet::from([2]));
        assert!(!table.complete(), "set {{3}} has only replica 1's and 2's reports; 2 lied");
        // Replica 4's reports settle {1} and {3}, where 2 lied as well.
        assert_eq!(table.add(4, report(4, false)), BTreeSet::from([2]));
        assert!(table.complete());
        let accepted = table.accepted().unwrap();
        assert_eq!(accepted.len(), 4);
        assert!(accepted.iter().enumerate().all(|(k, (_, b))| *b == honest(k as u8 + 1).as_slice()));
        assert_eq!(table.held_by(1), 3);
    }
}
