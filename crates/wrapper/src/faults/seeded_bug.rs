//! Seeded bugs: deliberate faults that make a replica wrong in ways the ordering cannot see,
//! so that the history checker (`scripts/nemesis/campaign.py --seeded-bug`) can be shown to
//! catch them. Switched on only by the environment (`SDNS_SEEDED_BUG=skip-write@ID` or
//! `early-read@ID`, ID the replica that has it), never by a configuration file, and announced
//! at start-up: no operator turns one on by accident.
//!
//! - `skip-write`: the replica answers one client write (the `SKIPPED_WRITE`-th it executes)
//!   NOERROR without giving it to its named, as a replica that loses a write would; its zone
//!   then differs until a later write or a repair covers it.
//! - `early-read`: the replica answers reads from its named at once, before its read barrier
//!   is executed or vouched, as a replica that skipped the barrier would.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    SkipWrite,
    EarlyRead,
}

/// The executed client write that `skip-write` loses: late enough that its name has history.
const SKIPPED_WRITE: u64 = 20;

fn parse(value: &str) -> Option<(Bug, u16)> {
    let (bug, replica) = value.split_once('@')?;
    let bug = match bug {
        "skip-write" => Bug::SkipWrite,
        "early-read" => Bug::EarlyRead,
        _ => return None,
    };
    Some((bug, replica.parse().ok()?))
}

fn seeded() -> Option<(Bug, u16)> {
    static SEEDED: OnceLock<Option<(Bug, u16)>> = OnceLock::new();
    *SEEDED.get_or_init(|| std::env::var("SDNS_SEEDED_BUG").ok().and_then(|v| parse(&v)))
}

/// The bug replica `id` runs with, if any (announced once by the caller).
pub fn active(id: u16) -> Option<Bug> {
    seeded().filter(|(_, r)| *r == id).map(|(bug, _)| bug)
}

/// Whether replica `id` loses this client write (counts the writes it executes).
pub fn skip_this_write(id: u16) -> bool {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    active(id) == Some(Bug::SkipWrite) && WRITES.fetch_add(1, Ordering::Relaxed) + 1 == SKIPPED_WRITE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_two_named_bugs_at_a_replica_parse() {
        assert_eq!(parse("skip-write@2"), Some((Bug::SkipWrite, 2)));
        assert_eq!(parse("early-read@0"), Some((Bug::EarlyRead, 0)));
        for bad in ["", "skip-write", "skip-write@", "skip-write@x", "lose-all@1", "early-read@70000"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
