//! The new-view decision procedure (Castro-Liskov, MAC variant): from a set of view-change
//! messages, pick the starting checkpoint and, for every later seq, the proposal that may have
//! committed, or a null proposal. Pure and deterministic, so backups recompute it to check the
//! primary. It trusts each view change only for its own sender's claims (no relayed prepares).

use std::collections::{BTreeMap, BTreeSet};

use crate::message::{CheckpointClaim, ViewChange};
use crate::types::{Config, Digest, Proposal};

/// The outcome: the checkpoint the view starts from and the re-proposals above it.
pub(crate) type Decision = (CheckpointClaim, Vec<(u64, Proposal)>);

/// Returns `None` while the set does not yet determine every seq (wait for more view changes).
pub(crate) fn decide(config: &Config, set: &[&ViewChange]) -> Option<Decision> {
    let quorum = config.quorum();
    let weak = usize::from(config.f) + 1;
    if set.len() < quorum {
        return None;
    }
    let checkpoint = choose_checkpoint(set, quorum, weak)?;
    let low = checkpoint.seq;
    let prepared: Vec<BTreeMap<u64, (u64, Digest, &Proposal)>> =
        set.iter().map(|m| m.prepared.iter().map(|e| (e.seq, (e.view, e.proposal.digest(e.seq), &e.proposal))).collect()).collect();
    let high = prepared.iter().filter_map(|entries| entries.keys().next_back().copied()).filter(|seq| *seq > low).max().unwrap_or(low);
    if high > low.saturating_add(config.watermark_window) {
        // Someone prepared beyond this checkpoint's window, so a later checkpoint exists whose
        // holders have not all reported yet: deciding now could drop a committed batch.
        return None;
    }
    let mut proposals = Vec::new();
    for seq in low.saturating_add(1)..=high {
        let mut candidates: BTreeSet<(u64, Digest)> = BTreeSet::new();
        let mut bodies: BTreeMap<(u64, Digest), &Proposal> = BTreeMap::new();
        for entries in &prepared {
            if let Some((view, digest, proposal)) = entries.get(&seq) {
                candidates.insert((*view, *digest));
                bodies.insert((*view, *digest), proposal);
            }
        }
        let chosen = candidates.iter().rev().find(|(view, digest)| {
            let a1 = set
                .iter()
                .zip(&prepared)
                .filter(|(m, entries)| {
                    m.stable.seq < seq
                        && match entries.get(&seq) {
                            None => true,
                            Some((p_view, p_digest, _)) => *p_view < *view || (*p_view == *view && p_digest == digest),
                        }
                })
                .count();
            let a2 = set.iter().filter(|m| m.pre_prepared.iter().any(|e| e.seq == seq && e.digest == *digest && e.view >= *view)).count();
            a1 >= quorum && a2 >= weak
        });
        match chosen {
            Some(key) => {
                let proposal = bodies.get(key)?;
                proposals.push((seq, (*proposal).clone()));
            }
            None => {
                let empty = set.iter().zip(&prepared).filter(|(m, entries)| m.stable.seq < seq && !entries.contains_key(&seq)).count();
                if empty < quorum {
                    return None;
                }
                proposals.push((seq, Proposal::null()));
            }
        }
    }
    // Trailing nulls carry nothing; the new primary simply continues after the last real one.
    while proposals.last().is_some_and(|(_, proposal)| proposal.is_null()) {
        proposals.pop();
    }
    Some((checkpoint, proposals))
}

/// Most `decide` evaluations one search may spend: every subset for n <= 13, a bounded prefix of
/// them (likeliest poisoners dropped first) beyond.
pub(crate) const MAX_SEARCH: usize = 1024;

/// The new primary's search: a subset of the view changes it holds (at least a quorum, always
/// containing `own`) whose decision is determined. A Byzantine replica can make any set that
/// contains its view change undecidable (made-up prepared entries far ahead, or for seqs nobody
/// else reports), so the primary tries the whole set first, then drops up to `held - quorum`
/// others, those claiming the highest prepared seqs first. Each subset's decision is as safe as
/// any quorum's (backups recompute it from the named subset), and once the primary holds the
/// view changes of every honest replica (they retransmit), the honest subset is among those
/// tried for n <= 13. Returns the indices used, increasing, and the decision.
pub(crate) fn search(config: &Config, held: &[&ViewChange], own: usize) -> Option<(Vec<usize>, Decision)> {
    let quorum = config.quorum();
    if held.len() < quorum || own >= held.len() {
        return None;
    }
    let all: Vec<usize> = (0..held.len()).collect();
    let mut budget = MAX_SEARCH;
    if let Some(decision) = decide(config, held) {
        return Some((all, decision));
    }
    budget -= 1;
    // Drop candidates, likeliest poisoners first: highest claimed prepared seq, then sender.
    let mut candidates: Vec<usize> = all.iter().copied().filter(|i| *i != own).collect();
    candidates.sort_by_key(|i| {
        let top = held[*i].prepared.last().map_or(0, |e| e.seq);
        (std::cmp::Reverse(top), held[*i].sender)
    });
    for drop in 1..=held.len() - quorum {
        let mut combination: Vec<usize> = (0..drop).collect();
        loop {
            if budget == 0 {
                return None;
            }
            budget -= 1;
            let dropped: BTreeSet<usize> = combination.iter().map(|c| candidates[*c]).collect();
            let kept: Vec<usize> = all.iter().copied().filter(|i| !dropped.contains(i)).collect();
            let subset: Vec<&ViewChange> = kept.iter().map(|i| held[*i]).collect();
            if let Some(decision) = decide(config, &subset) {
                return Some((kept, decision));
            }
            if !next_combination(&mut combination, candidates.len()) {
                break;
            }
        }
    }
    None
}

/// Advances `c` (increasing indices below `n`) to the next combination in lexicographic order.
fn next_combination(c: &mut [usize], n: usize) -> bool {
    let k = c.len();
    for i in (0..k).rev() {
        if c[i] < n - k + i {
            c[i] += 1;
            for j in i + 1..k {
                c[j] = c[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

fn choose_checkpoint(set: &[&ViewChange], quorum: usize, weak: usize) -> Option<CheckpointClaim> {
    let mut claims: BTreeSet<CheckpointClaim> = BTreeSet::new();
    for m in set {
        claims.insert(m.stable);
        claims.extend(m.checkpoints.iter().copied());
    }
    claims
        .into_iter()
        .filter(|claim| {
            let holders = set.iter().filter(|m| m.stable == *claim || m.checkpoints.contains(claim)).count();
            let low_enough = set.iter().filter(|m| m.stable.seq <= claim.seq).count();
            holders >= weak && low_enough >= quorum
        })
        .max_by_key(|claim| claim.seq)
}
