//! What both sessions do with a peer's message before looking inside it.

use std::collections::BTreeMap;

use crate::{Blame, Fault};

/// The sender's index is checked, a second message of one kind with other bytes is
/// equivocation, and the first fault of each replica is kept.
#[derive(Default)]
pub(crate) struct Intake {
    first: BTreeMap<(u16, u8), Vec<u8>>,
    pub(crate) blamed: BTreeMap<u16, Fault>,
}

impl Intake {
    /// `Ok(true)` for a new message, `Ok(false)` for a repeat of the same bytes.
    pub(crate) fn admit(&mut self, n: u16, from: u16, kind: u8, bytes: Vec<u8>) -> Result<bool, Blame> {
        if from == 0 || from > n {
            return Err(Blame { replica: from, fault: Fault::UnknownReplica });
        }
        if let Some(first) = self.first.get(&(from, kind)) {
            return if *first == bytes { Ok(false) } else { Err(self.blame(from, Fault::Equivocation)) };
        }
        self.first.insert((from, kind), bytes);
        Ok(true)
    }

    /// Records this replica's own message of a kind, so that a copy of it echoed back is a repeat.
    pub(crate) fn own(&mut self, index: u16, kind: u8, bytes: impl FnOnce() -> Vec<u8>) {
        self.first.entry((index, kind)).or_insert_with(bytes);
    }

    pub(crate) fn blame(&mut self, replica: u16, fault: Fault) -> Blame {
        self.blamed.entry(replica).or_insert(fault);
        Blame { replica, fault }
    }

    /// Blames every replica the commitment table caught lying; the error is the sender's own.
    pub(crate) fn blame_liars(&mut self, from: u16, liars: std::collections::BTreeSet<u16>) -> Result<(), Blame> {
        let mut result = Ok(());
        for liar in liars {
            let blame = self.blame(liar, Fault::LyingCommitment);
            if liar == from {
                result = Err(blame);
            }
        }
        result
    }
}
