//! Byzantine behaviours, one module each. A Byzantine node runs an honest [`bft::Replica`] and
//! rewrites what it sends; the harness always delivers with the node's true channel id.

use bft::{Message, ReplicaId};

use crate::cluster::SimRng;

/// What a faulty node does; `Twins` is handled by the harness (two replicas, one identity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    Equivocator,
    Nuller,
    Conflicter,
    Impersonator,
    Replayer,
    Twins,
    Poisoner,
    ForgedRelays,
    Flooder,
    StatusSpammer,
    HostilePrimary,
    BudgetHog,
}

pub const ALL: [Behaviour; 12] = [
    Behaviour::Equivocator,
    Behaviour::Nuller,
    Behaviour::Conflicter,
    Behaviour::Impersonator,
    Behaviour::Replayer,
    Behaviour::Twins,
    Behaviour::Poisoner,
    Behaviour::ForgedRelays,
    Behaviour::Flooder,
    Behaviour::StatusSpammer,
    Behaviour::HostilePrimary,
    Behaviour::BudgetHog,
];

/// Rewrites one outgoing message addressed to `to`; returns what is really sent.
pub fn rewrite(
    behaviour: Behaviour,
    state: &mut ByzantineState,
    rng: &mut SimRng,
    me: ReplicaId,
    n: u16,
    to: ReplicaId,
    message: Message,
) -> Vec<(ReplicaId, Message)> {
    match behaviour {
        Behaviour::Equivocator => equivocator::rewrite(to, message),
        Behaviour::Nuller => nuller::rewrite(to, message),
        Behaviour::Conflicter => conflicter::rewrite(rng, to, message),
        Behaviour::Impersonator => impersonator::rewrite(rng, me, n, to, message),
        Behaviour::Replayer => replayer::rewrite(state, rng, n, me, to, message),
        Behaviour::Twins => vec![(to, message)],
        Behaviour::Poisoner => poisoner::rewrite(me, n, to, message),
        Behaviour::ForgedRelays => forged_relays::rewrite(state, rng, me, n, to, message),
        Behaviour::Flooder => flooder::rewrite(state, rng, me, n, to, message),
        Behaviour::StatusSpammer => status_spammer::rewrite(me, to, message),
        Behaviour::HostilePrimary => hostile::rewrite(state, rng, me, n, to, message),
        Behaviour::BudgetHog => budget_hog::rewrite(state, me, n, to, message),
    }
}

/// Memory some behaviours keep between messages (bounded).
#[derive(Default)]
pub struct ByzantineState {
    history: Vec<Message>,
    /// Next made-up request number.
    counter: u64,
    /// The hostile primary: each other origin's latest (client, number) it proposed.
    seen: std::collections::BTreeMap<ReplicaId, (u64, u64)>,
    /// The hostile primary: the batch drawn for (view, seq), sent to every backup unless it
    /// equivocates.
    hostile_last: Option<(u64, u64, bft::Proposal)>,
    /// The budget hog: the batches it sent per (view, seq), the latest few (a retransmitted
    /// pre-prepare goes out as it first did).
    hogged: std::collections::BTreeMap<(u64, u64), bft::Proposal>,
}

/// Budget hog: as primary, fills every pre-prepare up to the batch limits with requests of its
/// own origin, keeping the honest ones in it (`bft::actors::hog_batch`), the same batch to
/// every backup. Its origin is the primary, so only the per-origin budget of the log refuses
/// such a batch: the log must carry no more of its bytes than the budget allows, and honest
/// requests must still be delivered.
pub mod budget_hog {
    use bft::{Message, ReplicaId};

    use super::ByzantineState;
    use crate::cluster::sim_config;

    /// The client its own requests go under.
    pub const CLIENT: u64 = 0xb0d6;

    pub fn rewrite(state: &mut ByzantineState, me: ReplicaId, n: u16, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        let Message::PrePrepare { sender, view, seq, mut proposal } = message else { return vec![(to, message)] };
        match state.hogged.get(&(view, seq)) {
            Some(hogged) => proposal = hogged.clone(),
            None => {
                let config = sim_config(n, me);
                let limits = (config.batch_max_requests, config.batch_max_bytes, config.max_request_bytes);
                bft::actors::hog_batch(&mut proposal, me, CLIENT, &mut state.counter, limits);
                state.hogged.insert((view, seq), proposal.clone());
                while state.hogged.len() > 2 * config.watermark_window as usize {
                    state.hogged.pop_first();
                }
            }
        }
        vec![(to, Message::PrePrepare { sender, view, seq, proposal })]
    }
}

/// Hostile primary: every pre-prepare it sends is drawn once per seq (and, now and then, again
/// for one receiver: equivocation) from a grammar of hostile batches: requests under other origins (the clients and numbers it
/// saw, at every bound: just above, at and beyond the jump, 2^32 - 1 above, u64::MAX, below the
/// deduplication window, a delivered key with other bytes), duplicate and conflicting keys in
/// one batch, batches at the count and byte limits and one over, times at and just beyond the
/// clock skew, or the honest batch. Honest replicas must never deliver a request an honest
/// origin did not submit, and must go on delivering every honest request.
pub mod hostile {
    use bft::{Message, Proposal, ReplicaId, Request, Time, DEDUP_WINDOW};

    use super::ByzantineState;
    use crate::cluster::{sim_config, SimRng};

    pub fn rewrite(state: &mut ByzantineState, rng: &mut SimRng, me: ReplicaId, n: u16, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        let Message::PrePrepare { sender, view, seq, mut proposal } = message else { return vec![(to, message)] };
        for request in proposal.requests.iter().filter(|r| r.origin != me) {
            let entry = state.seen.entry(request.origin).or_insert((request.client, request.number));
            *entry = (*entry).max((request.client, request.number));
        }
        // The same hostile batch to every backup, so that one the backups accepted would be
        // delivered; now and then another one to this receiver.
        if let Some((_, _, drawn)) = state.hostile_last.as_ref().filter(|(v, s, _)| (*v, *s) == (view, seq)) {
            if !rng.chance(0.15) {
                return vec![(to, Message::PrePrepare { sender, view, seq, proposal: drawn.clone() })];
            }
        }
        let productions = rng.below(3) + 1;
        for _ in 0..productions {
            produce(state, rng, me, n, &mut proposal);
        }
        state.hostile_last = Some((view, seq, proposal.clone()));
        vec![(to, Message::PrePrepare { sender, view, seq, proposal })]
    }

    fn produce(state: &mut ByzantineState, rng: &mut SimRng, me: ReplicaId, n: u16, proposal: &mut Proposal) {
        let config = sim_config(n, me);
        let jump = config.max_number_jump;
        let payload = vec![0xf0 ^ rng.next() as u8; 8];
        match rng.below(8) {
            // A request under another origin, numbered at one of the bounds.
            0 | 1 => {
                let victim = ((u64::from(me) + 1 + rng.below(u64::from(n - 1))) % u64::from(n)) as ReplicaId;
                let (client, high) = state.seen.get(&victim).copied().unwrap_or((rng.below(3), 1));
                let numbers = [
                    high.saturating_add(1),
                    high.saturating_add(jump),
                    high.saturating_add(jump + 1),
                    high.saturating_add((1 << 32) - 1),
                    u64::MAX,
                    high.saturating_sub(DEDUP_WINDOW + 5),
                    high,
                    1,
                ];
                let number = numbers[rng.below(numbers.len() as u64) as usize];
                proposal.requests.push(Request { origin: victim, client, number, payload });
            }
            // The same key twice: the same request, or another payload under its key.
            2 => {
                if let Some(original) = proposal.requests.get(rng.below(proposal.requests.len().max(1) as u64) as usize).cloned() {
                    let mut copy = original.clone();
                    if rng.chance(0.5) {
                        copy.payload = payload;
                    }
                    let at = rng.below(proposal.requests.len() as u64 + 1) as usize;
                    proposal.requests.insert(at, copy);
                }
            }
            // At the count limit, or one over.
            3 => {
                let over = rng.chance(0.3);
                let target = config.batch_max_requests + usize::from(over);
                while proposal.requests.len() < target {
                    state.counter += 1;
                    proposal.requests.push(Request { origin: me, client: 500, number: state.counter, payload: vec![1; 8] });
                }
            }
            // At the byte limit, or one over.
            4 => {
                let over = rng.chance(0.3);
                let bytes: usize = proposal.requests.iter().map(Request::wire_size).sum();
                let room = (config.batch_max_bytes + usize::from(over)).saturating_sub(bytes);
                if room > 24 {
                    state.counter += 1;
                    let size = (room - 24).min(config.max_request_bytes - 24);
                    proposal.requests.push(Request { origin: me, client: 501, number: state.counter, payload: vec![2; size] });
                }
            }
            // A time at the skew's edge or just beyond it, either way.
            5 => {
                let skew = config.max_clock_skew.as_micros() as u64;
                let offset = if rng.chance(0.5) { skew - 1_000 } else { skew + 1_000 };
                proposal.time = if rng.chance(0.5) { Time(proposal.time.0 + offset) } else { Time(proposal.time.0.saturating_sub(offset)) };
            }
            // Reordered requests (another digest for the same content).
            6 => proposal.requests.reverse(),
            // The honest batch.
            _ => {}
        }
    }
}

/// View-change poisoner: silent as primary (no pre-prepares, no new views) and, in every view
/// change it sends, claims a made-up request prepared far beyond its stable checkpoint's window
/// (backed by a made-up checkpoint claim) and another at the first seq above it, so any set that
/// contains its view change cannot decide. Every other view change it sends is blatant (the far
/// entry beyond its own claims' window: refused and blamed), the others are well-formed.
pub mod poisoner {
    use bft::{Message, ReplicaId};

    use crate::cluster::sim_config;

    pub fn rewrite(me: ReplicaId, n: u16, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        match message {
            Message::PrePrepare { .. } | Message::NewView { .. } => Vec::new(),
            Message::ViewChange(mut vc) => {
                let config = sim_config(n, me);
                let (window, interval) = (config.watermark_window, config.checkpoint_interval);
                // Both variants in every run: blatant (refused and blamed) and well-formed (left
                // out by the search), alternating with the view and the poisoner's id.
                let blatant = (vc.view + u64::from(me)) % 2 == 1;
                bft::actors::poison_view_change(&mut vc, me, window, interval, blatant);
                vec![(to, Message::ViewChange(vc))]
            }
            other => vec![(to, other)],
        }
    }
}

/// Forged relays: besides its honest traffic, relays requests naming another replica as origin
/// with huge numbers (u64::MAX and jumps), and its own requests with such numbers. Honest
/// replicas must refuse and blame the former and never deliver the latter.
pub mod forged_relays {
    use bft::{Message, ReplicaId, Request};

    use super::ByzantineState;
    use crate::cluster::SimRng;

    pub fn rewrite(state: &mut ByzantineState, rng: &mut SimRng, me: ReplicaId, n: u16, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        let mut out = vec![(to, message)];
        if rng.chance(0.3) {
            state.counter += 1;
            let victim = ((u64::from(me) + 1 + rng.below(u64::from(n - 1))) % u64::from(n)) as ReplicaId;
            let number = if rng.chance(0.5) { u64::MAX } else { (1 << 40) + state.counter };
            let client = rng.below(3);
            let forged = Request { origin: victim, client, number, payload: vec![0xf0; 8] };
            out.push((to, Message::Request { sender: me, request: forged }));
            let own = Request { origin: me, client, number, payload: vec![0xf1; 8] };
            out.push((to, Message::Request { sender: me, request: own }));
        }
        out
    }
}

/// Peer flooder: with every message, also sends requests of its own at the size limit from ever
/// new clients, committed batches at the batch limit for seqs just ahead of the receiver, and
/// now and then an oversized request. Honest replicas must hold no more than their byte budgets.
pub mod flooder {
    use bft::{Message, Proposal, ReplicaId, Request, Time};

    use super::ByzantineState;
    use crate::cluster::{sim_config, SimRng};

    pub fn rewrite(state: &mut ByzantineState, rng: &mut SimRng, me: ReplicaId, n: u16, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        let config = sim_config(n, me);
        let seq_hint = match &message {
            Message::PrePrepare { seq, .. } | Message::Prepare { seq, .. } | Message::Commit { seq, .. } => Some(*seq),
            Message::Status(report) => Some(report.last_delivered),
            _ => None,
        };
        let mut out = vec![(to, message)];
        for _ in 0..2 {
            state.counter += 1;
            let payload = vec![0xf2; config.max_request_bytes - 24];
            let request = Request { origin: me, client: 1_000 + state.counter, number: 1, payload };
            out.push((to, Message::Request { sender: me, request }));
        }
        if rng.chance(0.05) {
            state.counter += 1;
            let payload = vec![0xf3; config.max_request_bytes - 23];
            let request = Request { origin: me, client: 7, number: state.counter, payload };
            out.push((to, Message::Request { sender: me, request }));
        }
        if let Some(seq) = seq_hint {
            if rng.chance(0.5) {
                let per = config.max_request_bytes;
                let count = (config.batch_max_bytes - 16) / per;
                let requests = (0..count).map(|i| Request { origin: me, client: 9, number: i as u64 + 1, payload: vec![rng.next() as u8; per - 24] }).collect();
                let ahead = seq + 1 + rng.below(config.watermark_window);
                out.push((to, Message::Committed { sender: me, seq: ahead, proposal: Proposal { time: Time(3), requests } }));
            }
        }
        out
    }
}

/// Status spammer: with every message, also sends status reports claiming it delivered nothing
/// and is changing views in view 0, asking everyone to push it batches and new views.
pub mod status_spammer {
    use bft::{Message, ReplicaId, StatusReport};

    pub fn rewrite(me: ReplicaId, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        let mut out = vec![(to, message)];
        let report = StatusReport { sender: me, view: 0, view_changing: true, last_delivered: 0, stable_seq: 0, oldest_retained: 1 };
        for _ in 0..4 {
            out.push((to, Message::Status(report)));
        }
        out
    }
}

/// Equivocating primary: sends a different pre-prepare (other time, other request order) to odd-numbered backups.
pub mod equivocator {
    use bft::{Message, ReplicaId, Time};

    pub fn rewrite(to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        match message {
            Message::PrePrepare { sender, view, seq, mut proposal } if to % 2 == 1 => {
                proposal.time = Time(proposal.time.0 + 1);
                proposal.requests.reverse();
                vec![(to, Message::PrePrepare { sender, view, seq, proposal })]
            }
            other => vec![(to, other)],
        }
    }
}

/// Silent primary: never sends pre-prepares or new-views, so it orders nothing; otherwise honest.
pub mod nuller {
    use bft::{Message, ReplicaId};

    pub fn rewrite(to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        match message {
            Message::PrePrepare { .. } | Message::NewView { .. } => Vec::new(),
            other => vec![(to, other)],
        }
    }
}

/// Conflicter: sends prepares and commits for a made-up digest to some replicas, the real one to others.
pub mod conflicter {
    use bft::{Message, ReplicaId};

    use crate::cluster::SimRng;

    pub fn rewrite(rng: &mut SimRng, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        let mut fake = [0u8; 32];
        fake[..8].copy_from_slice(&rng.next().to_le_bytes());
        match message {
            Message::Prepare { sender, view, seq, .. } if rng.chance(0.5) => {
                vec![(to, Message::Prepare { sender, view, seq, digest: fake })]
            }
            Message::Commit { sender, view, seq, .. } if rng.chance(0.5) => {
                vec![(to, Message::Commit { sender, view, seq, digest: fake })]
            }
            other => vec![(to, other)],
        }
    }
}

/// Impersonator: claims to be another replica in half of its messages (receivers must drop them).
pub mod impersonator {
    use bft::{Message, ReplicaId};

    use crate::cluster::SimRng;

    pub fn rewrite(rng: &mut SimRng, me: ReplicaId, n: u16, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        if !rng.chance(0.5) {
            return vec![(to, message)];
        }
        let claimed = ((u64::from(me) + 1 + rng.below(u64::from(n - 1))) % u64::from(n)) as ReplicaId;
        vec![(to, with_sender(message, claimed))]
    }

    /// The message with its claimed sender replaced.
    pub fn with_sender(message: Message, claimed: ReplicaId) -> Message {
        match message {
            Message::Request { request, .. } => Message::Request { sender: claimed, request },
            Message::PrePrepare { view, seq, proposal, .. } => Message::PrePrepare { sender: claimed, view, seq, proposal },
            Message::Prepare { view, seq, digest, .. } => Message::Prepare { sender: claimed, view, seq, digest },
            Message::Commit { view, seq, digest, .. } => Message::Commit { sender: claimed, view, seq, digest },
            Message::Checkpoint { checkpoint, .. } => Message::Checkpoint { sender: claimed, checkpoint },
            Message::ViewChange(mut view_change) => {
                view_change.sender = claimed;
                Message::ViewChange(view_change)
            }
            Message::NewView { new_view, .. } => Message::NewView { sender: claimed, new_view },
            Message::Status(mut report) => {
                report.sender = claimed;
                Message::Status(report)
            }
            Message::Committed { seq, proposal, .. } => Message::Committed { sender: claimed, seq, proposal },
            other => other,
        }
    }
}

/// Replayer: also sends one of its own old messages (stale views, seqs, checkpoints) to a random replica.
pub mod replayer {
    use bft::{Message, ReplicaId};

    use super::ByzantineState;
    use crate::cluster::SimRng;

    const HISTORY: usize = 256;

    pub fn rewrite(state: &mut ByzantineState, rng: &mut SimRng, n: u16, me: ReplicaId, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        let mut out = vec![(to, message.clone())];
        if rng.chance(0.3) && !state.history.is_empty() {
            let old = state.history[rng.below(state.history.len() as u64) as usize].clone();
            let target = rng.below(u64::from(n)) as ReplicaId;
            if target != me {
                out.push((target, old));
            }
        }
        if state.history.len() < HISTORY {
            state.history.push(message);
        } else {
            let slot = rng.below(HISTORY as u64) as usize;
            state.history[slot] = message;
        }
        out
    }
}
