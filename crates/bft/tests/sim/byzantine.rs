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
}

pub const ALL: [Behaviour; 6] = [
    Behaviour::Equivocator,
    Behaviour::Nuller,
    Behaviour::Conflicter,
    Behaviour::Impersonator,
    Behaviour::Replayer,
    Behaviour::Twins,
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
    }
}

/// Memory some behaviours keep between messages (bounded).
#[derive(Default)]
pub struct ByzantineState {
    history: Vec<Message>,
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

    pub fn rewrite(
        state: &mut ByzantineState,
        rng: &mut SimRng,
        n: u16,
        me: ReplicaId,
        to: ReplicaId,
        message: Message,
    ) -> Vec<(ReplicaId, Message)> {
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
