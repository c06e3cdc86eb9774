//! Protocol messages. Every message names its claimed sender; the core drops a message whose
//! claimed sender differs from the authenticated channel it arrived on.

use crate::types::{Digest, Proposal, ReplicaId, Request, RequestKey, Time};

/// A message between replicas. Encode with [`Message::encode`], decode with [`Message::decode`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Message {
    /// A request sent by its origin (`request.origin == sender`) to every replica.
    Request { sender: ReplicaId, request: Request },
    /// To the primary: the sender holds these requests, received directly from their origins
    /// (key and [`crate::request_digest`] of each). A primary proposes another origin's
    /// request only once 2f replicas other than itself hold it, so that its backups can check
    /// where the request came from (see the crate docs, "Protocol").
    Holds { sender: ReplicaId, requests: Vec<(RequestKey, Digest)> },
    /// The primary assigns `seq` to `proposal` in `view`.
    PrePrepare { sender: ReplicaId, view: u64, seq: u64, proposal: Proposal },
    /// A backup accepted the pre-prepare with `digest`.
    Prepare { sender: ReplicaId, view: u64, seq: u64, digest: Digest },
    /// The sender holds a prepared certificate for `digest`.
    Commit { sender: ReplicaId, view: u64, seq: u64, digest: Digest },
    /// The sender's application state after batch `seq`.
    Checkpoint { sender: ReplicaId, checkpoint: CheckpointClaim },
    /// The sender moves to `view_change.view`.
    ViewChange(ViewChange),
    /// The primary of `new_view.view` starts it; also relayed by replicas to laggards.
    NewView { sender: ReplicaId, new_view: NewView },
    /// Periodic progress report; peers answer with what the sender is missing.
    Status(StatusReport),
    /// A committed batch, sent to a replica that reported it is behind. Accepted once f+1
    /// distinct replicas sent the same one.
    Committed { sender: ReplicaId, seq: u64, proposal: Proposal },
}

/// A checkpoint: agreed time, log digest and application state digest after batch `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckpointClaim {
    pub seq: u64,
    pub time: Time,
    /// Hash chain over every committed `(seq, proposal digest)` up to `seq`: lets a replica
    /// check committed batches fetched from a single peer against a certified checkpoint.
    pub log_digest: Digest,
    pub state_digest: Digest,
}

impl CheckpointClaim {
    /// The checkpoint every replica starts from.
    pub fn genesis() -> CheckpointClaim {
        CheckpointClaim { seq: 0, time: Time(0), log_digest: [0; 32], state_digest: [0; 32] }
    }
}

/// A prepared certificate the sender holds (its highest view for `seq`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedEntry {
    pub seq: u64,
    pub view: u64,
    pub proposal: Proposal,
}

/// A pre-prepare the sender accepted: the highest view in which it accepted `digest` at `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrePreparedEntry {
    pub seq: u64,
    pub view: u64,
    pub digest: Digest,
}

/// View-change message (Castro-Liskov's MAC variant: P and Q sets, checkpoint claims C).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewChange {
    pub sender: ReplicaId,
    /// The view the sender moves to.
    pub view: u64,
    /// The sender's stable checkpoint (its low water mark).
    pub stable: CheckpointClaim,
    /// Checkpoints the sender holds above its stable one.
    pub checkpoints: Vec<CheckpointClaim>,
    /// P: prepared certificates above the stable checkpoint, by increasing seq.
    pub prepared: Vec<PreparedEntry>,
    /// Q: accepted pre-prepares above the stable checkpoint.
    pub pre_prepared: Vec<PrePreparedEntry>,
}

/// New-view message: the view-change messages used (by digest; every backup must hold each one
/// directly from its sender) and the decision computed from them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewView {
    pub view: u64,
    /// `(sender, digest of its view-change)` for each view change used, by increasing sender.
    pub view_changes: Vec<(ReplicaId, Digest)>,
    /// The checkpoint the new view starts from.
    pub checkpoint: CheckpointClaim,
    /// Re-proposals for every seq above the checkpoint up to the highest prepared one; null
    /// proposals fill gaps.
    pub proposals: Vec<(u64, Proposal)>,
}

/// Periodic progress report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusReport {
    pub sender: ReplicaId,
    /// Current view (the target view while changing views).
    pub view: u64,
    pub view_changing: bool,
    pub last_delivered: u64,
    pub stable_seq: u64,
    /// Lowest committed seq the sender can still send (last_delivered + 1 when none).
    pub oldest_retained: u64,
}

impl Message {
    /// The replica the message claims to come from.
    pub fn sender(&self) -> ReplicaId {
        match self {
            Message::Request { sender, .. }
            | Message::Holds { sender, .. }
            | Message::PrePrepare { sender, .. }
            | Message::Prepare { sender, .. }
            | Message::Commit { sender, .. }
            | Message::Checkpoint { sender, .. }
            | Message::NewView { sender, .. }
            | Message::Committed { sender, .. } => *sender,
            Message::ViewChange(view_change) => view_change.sender,
            Message::Status(status) => status.sender,
        }
    }

    /// A short name for logs and counters.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Request { .. } => "request",
            Message::Holds { .. } => "holds",
            Message::PrePrepare { .. } => "pre-prepare",
            Message::Prepare { .. } => "prepare",
            Message::Commit { .. } => "commit",
            Message::Checkpoint { .. } => "checkpoint",
            Message::ViewChange(_) => "view-change",
            Message::NewView { .. } => "new-view",
            Message::Status(_) => "status",
            Message::Committed { .. } => "committed",
        }
    }
}
