//! What a replica keeps across a restart, and its encoding.
//!
//! A replica must never contradict, after a restart, what it said before it: the view it moved
//! to, the pre-prepares it accepted (and so prepared), the certificates it reported in view
//! changes, the batches it committed. The core therefore emits [`Action::Persist`] ahead of every
//! action queued after its durable state changed; the driver writes it (and makes it durable)
//! before it sends or delivers anything else. See docs/RELIABILITY.md, "Restart".
//!
//! Storage is a snapshot plus an append-only log of records:
//! - a *snapshot* (rewritten when the stable checkpoint or the delivery base moves, about once per
//!   checkpoint interval) holds everything: the view and view-change state, the stable
//!   checkpoint and who certified it, the *delivery base* (the request deduplication table as
//!   it stood after a checkpoint batch this replica delivered, with the log digest and agreed
//!   time there), the committed batches delivered after that base, and every slot's durable part;
//! - *records* appended in between carry what changed: a slot's durable part (the pre-prepare
//!   accepted, the prepared certificate, the Q set, whether a commit was sent, the committed
//!   batch) or the view state. A later record for the same slot replaces an earlier one.
//!
//! Restoring replays the committed batches from the delivery base through the same delivery
//! code, so the deduplication table, log digest and agreed times come out as they were; the
//! application skips the batches it had already executed.
//!
//! [`Action::Persist`]: crate::Action::Persist

use std::collections::BTreeMap;

use crate::codec::{put_len, put_u64, write_checkpoint, write_new_view, write_proposal, write_view_change, DecodeError, Reader};
use crate::message::{CheckpointClaim, NewView, ViewChange};
use crate::types::{ClientEntry, DeliveryBase, Digest, Limits, OriginBudgets, Proposal, ReplicaId, Time};

const SNAPSHOT_MAGIC: &[u8; 16] = b"sdns-bft-state-1";
const TAG_META: u8 = 1;
const TAG_SLOT: u8 = 2;

/// What the driver must make durable before carrying out any action polled after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Persist {
    /// Replace the stored state with this snapshot; the log starts again, empty, for `generation`.
    /// Must be atomic (temporary file, fsync, rename, fsync of the directory).
    Snapshot { generation: u64, bytes: Vec<u8> },
    /// Append these records to the log of `generation` and make them durable (one fsync).
    /// A record torn by a crash was never acted upon and is dropped on restore.
    Append { generation: u64, records: Vec<Vec<u8>> },
}

impl DeliveryBase {
    pub fn genesis() -> DeliveryBase {
        DeliveryBase { seq: 0, time: Time(0), log_digest: [0; 32], clients: Vec::new(), budgets: OriginBudgets::default() }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        write_base(&mut out, self);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<DeliveryBase, DecodeError> {
        let mut reader = reader(bytes);
        let base = read_base(&mut reader)?;
        finish(&reader)?;
        Ok(base)
    }
}

/// The state digest a checkpoint certifies: the application's digest at that checkpoint
/// together with the ordering's deduplication table and per-origin budget there. PBFT counts the table of client
/// replies and timestamps as part of the checkpointed state; here it is what keeps a replica
/// that installed a transferred checkpoint from delivering again a request delivered in the
/// part of the log it skipped. [`crate::Replica::checkpoint`] folds its own table in, so the
/// application passes only its own digest there.
pub fn checkpoint_state_digest(application: &Digest, base: &DeliveryBase) -> Digest {
    fold_state_digest(application, &table_digest(&base.clients, &base.budgets))
}

/// The digest of the deduplication table, in the order given (the core's is sorted by origin
/// and client), so two tables have the same digest only if they are the same list, and of the
/// per-origin budget.
pub(crate) fn table_digest(clients: &[ClientEntry], budgets: &OriginBudgets) -> Digest {
    use sha2::{Digest as _, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(b"sdns bft deduplication table v2");
    hasher.update(budgets.clock.0.to_le_bytes());
    hasher.update((budgets.balances.len() as u64).to_le_bytes());
    for (origin, balance) in &budgets.balances {
        hasher.update(origin.to_le_bytes());
        hasher.update(balance.to_le_bytes());
    }
    hasher.update((clients.len() as u64).to_le_bytes());
    for entry in clients {
        hasher.update(entry.origin.to_le_bytes());
        hasher.update(entry.client.to_le_bytes());
        hasher.update(entry.high.to_le_bytes());
        hasher.update(entry.mask.to_le_bytes());
        hasher.update(entry.last_seq.to_le_bytes());
    }
    hasher.finalize().into()
}

/// Domain-separated from the application's own digests and from the table's.
pub(crate) fn fold_state_digest(application: &Digest, table: &Digest) -> Digest {
    use sha2::{Digest as _, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(b"sdns bft checkpoint state v1");
    hasher.update(application);
    hasher.update(table);
    hasher.finalize().into()
}

/// What the application hands the ordering after installing a transferred checkpoint
/// ([`crate::Replica::state_transferred`]): the certified claim, the application's own digest
/// of the installed state, and the ordering's delivery base at that checkpoint as the peer's
/// snapshot carried it. The core checks that the two digests fold into the certified one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transferred {
    pub claim: CheckpointClaim,
    pub application_digest: Digest,
    pub base: DeliveryBase,
}

/// Why a [`Transferred`] cannot be the state its claim certifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferMismatch {
    /// The delivery base is not at the claim's seq, time or log digest.
    Position,
    /// The application's digest and the base's table do not fold into the certified digest.
    StateDigest,
}

impl TransferMismatch {
    pub fn as_str(self) -> &'static str {
        match self {
            TransferMismatch::Position => "position, time or log digest",
            TransferMismatch::StateDigest => "state digest",
        }
    }
}

impl Transferred {
    /// Checks that this is the state `claim` certifies: the application checks a peer's
    /// snapshot with it before installing anything, the core again before it takes the table.
    pub fn check(&self) -> Result<(), TransferMismatch> {
        let (claim, base) = (&self.claim, &self.base);
        if base.seq != claim.seq || base.time != claim.time || base.log_digest != claim.log_digest {
            return Err(TransferMismatch::Position);
        }
        if checkpoint_state_digest(&self.application_digest, base) != claim.state_digest {
            return Err(TransferMismatch::StateDigest);
        }
        Ok(())
    }
}

/// The view state: changes rarely (view changes, own checkpoints).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    pub view: u64,
    pub view_changing: bool,
    pub last_normal_view: u64,
    pub stable: CheckpointClaim,
    /// The replicas whose matching checkpoint messages made `stable` stable (informational: the
    /// messages carry no signatures, so the list proves nothing to others).
    pub stable_voters: Vec<ReplicaId>,
    pub own_checkpoints: Vec<CheckpointClaim>,
    pub view_anchor: CheckpointClaim,
    pub own_view_change: Option<ViewChange>,
    pub current_new_view: Option<NewView>,
}

impl Meta {
    pub fn genesis() -> Meta {
        Meta {
            view: 0,
            view_changing: false,
            last_normal_view: 0,
            stable: CheckpointClaim::genesis(),
            stable_voters: Vec::new(),
            own_checkpoints: Vec::new(),
            view_anchor: CheckpointClaim::genesis(),
            own_view_change: None,
            current_new_view: None,
        }
    }
}

/// The durable part of one sequence number's slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SlotRecord {
    pub seq: u64,
    /// The pre-prepare accepted (and prepared, for a backup) in this view.
    pub accepted: Option<(u64, Proposal)>,
    /// Highest-view prepared certificate.
    pub prepared: Option<(u64, Proposal)>,
    /// Q set: digest and the highest view it was accepted in.
    pub pre_prepared: Vec<(Digest, u64)>,
    pub sent_commit_view: Option<u64>,
    pub committed: Option<Proposal>,
}

/// Everything a replica restores from: a snapshot with the records appended after it applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedState {
    pub(crate) generation: u64,
    pub(crate) meta: Meta,
    pub(crate) base: DeliveryBase,
    /// Committed batches after the base that this replica delivered.
    pub(crate) delivered: BTreeMap<u64, Proposal>,
    pub(crate) slots: BTreeMap<u64, SlotRecord>,
}

impl PersistedState {
    /// A replica that resumes right after checkpoint `checkpoint` (certified by a quorum), with
    /// the delivery base that goes with it: what installing a transferred state leaves behind.
    /// The replica starts in view 0 and joins the cluster's view from its peers' messages.
    pub fn from_checkpoint(checkpoint: CheckpointClaim, base: DeliveryBase) -> Result<PersistedState, RestoreError> {
        if base.seq != checkpoint.seq || base.log_digest != checkpoint.log_digest || base.time != checkpoint.time {
            return Err(RestoreError::Inconsistent("delivery base does not match the checkpoint"));
        }
        let meta = Meta { stable: checkpoint, ..Meta::genesis() };
        Ok(PersistedState { generation: 0, meta, base, delivered: BTreeMap::new(), slots: BTreeMap::new() })
    }

    /// Decodes a snapshot written from [`Persist::Snapshot`].
    pub fn decode_snapshot(bytes: &[u8]) -> Result<PersistedState, RestoreError> {
        let mut r = reader(bytes);
        for expected in SNAPSHOT_MAGIC {
            if r.byte("magic")? != *expected {
                return Err(RestoreError::Inconsistent("not an ordering snapshot"));
            }
        }
        let generation = r.u64("generation")?;
        let meta = read_meta(&mut r)?;
        let base = read_base(&mut r)?;
        let count = r.count("delivered", 2, usize::MAX)?;
        let mut delivered = BTreeMap::new();
        for _ in 0..count {
            let seq = r.u64("seq")?;
            delivered.insert(seq, r.proposal()?);
        }
        let count = r.count("slots", 5, usize::MAX)?;
        let mut slots = BTreeMap::new();
        for _ in 0..count {
            let slot = read_slot(&mut r)?;
            slots.insert(slot.seq, slot);
        }
        finish(&r)?;
        Ok(PersistedState { generation, meta, base, delivered, slots })
    }

    /// The generation of the snapshot; only records appended for it apply.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The checkpoint this replica held stable when it last persisted.
    pub fn stable_checkpoint(&self) -> CheckpointClaim {
        self.meta.stable
    }

    /// The view this replica was in.
    pub fn view(&self) -> u64 {
        self.meta.view
    }

    /// The highest batch a restored replica can deliver again without its peers: the delivery
    /// base followed by the committed batches held without gaps.
    pub fn deliverable(&self) -> u64 {
        let mut seq = self.base.seq;
        while self.delivered.contains_key(&(seq + 1)) || self.slots.get(&(seq + 1)).is_some_and(|slot| slot.committed.is_some()) {
            seq += 1;
        }
        seq
    }

    /// Applies one record appended after the snapshot (later records replace earlier ones).
    pub fn apply_record(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let mut r = reader(bytes);
        match r.byte("tag")? {
            TAG_META => self.meta = read_meta(&mut r)?,
            TAG_SLOT => {
                let slot = read_slot(&mut r)?;
                if slot.seq > self.base.seq {
                    self.slots.insert(slot.seq, slot);
                }
            }
            _ => return Err(RestoreError::Inconsistent("unknown record")),
        }
        finish(&r)?;
        Ok(())
    }

    pub(crate) fn encode_snapshot(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(SNAPSHOT_MAGIC);
        put_u64(&mut out, self.generation);
        write_meta(&mut out, &self.meta);
        write_base(&mut out, &self.base);
        put_len(&mut out, self.delivered.len());
        for (seq, proposal) in &self.delivered {
            put_u64(&mut out, *seq);
            write_proposal(&mut out, proposal);
        }
        put_len(&mut out, self.slots.len());
        for slot in self.slots.values() {
            write_slot(&mut out, slot);
        }
        out
    }
}

pub(crate) fn meta_record(meta: &Meta) -> Vec<u8> {
    let mut out = vec![TAG_META];
    write_meta(&mut out, meta);
    out
}

pub(crate) fn slot_record(slot: &SlotRecord) -> Vec<u8> {
    let mut out = vec![TAG_SLOT];
    write_slot(&mut out, slot);
    out
}

/// Why a persisted state cannot be restored. The replica must not start from it (nor from
/// nothing, which would forget what it promised): the operator or a state transfer decides.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestoreError {
    #[error("persisted ordering state does not decode: {0}")]
    Decode(#[from] DecodeError),
    #[error("persisted ordering state is inconsistent: {0}")]
    Inconsistent(&'static str),
    #[error("persisted ordering state is for another configuration: {0}")]
    Config(&'static str),
    #[error(transparent)]
    BadConfig(#[from] crate::types::ConfigError),
}

fn reader(bytes: &[u8]) -> Reader<'_> {
    // Our own files: sizes are checked against the bytes present, not against message limits.
    Reader { bytes, position: 0, limits: Limits { max_message_bytes: usize::MAX, max_entries: usize::MAX / 8 } }
}

fn finish(reader: &Reader<'_>) -> Result<(), DecodeError> {
    match reader.remaining() {
        0 => Ok(()),
        n => Err(DecodeError::Trailing(n)),
    }
}

fn put_option_u64(out: &mut Vec<u8>, value: Option<u64>) {
    match value {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            put_u64(out, v);
        }
    }
}

fn read_option_u64(r: &mut Reader<'_>, field: &'static str) -> Result<Option<u64>, DecodeError> {
    Ok(if r.bool(field)? { Some(r.u64(field)?) } else { None })
}

fn write_meta(out: &mut Vec<u8>, meta: &Meta) {
    put_u64(out, meta.view);
    out.push(u8::from(meta.view_changing));
    put_u64(out, meta.last_normal_view);
    write_checkpoint(out, &meta.stable);
    put_len(out, meta.stable_voters.len());
    for voter in &meta.stable_voters {
        put_u64(out, u64::from(*voter));
    }
    put_len(out, meta.own_checkpoints.len());
    for claim in &meta.own_checkpoints {
        write_checkpoint(out, claim);
    }
    write_checkpoint(out, &meta.view_anchor);
    match &meta.own_view_change {
        None => out.push(0),
        Some(view_change) => {
            out.push(1);
            write_view_change(out, view_change);
        }
    }
    match &meta.current_new_view {
        None => out.push(0),
        Some(new_view) => {
            out.push(1);
            write_new_view(out, new_view);
        }
    }
}

fn read_meta(r: &mut Reader<'_>) -> Result<Meta, DecodeError> {
    let view = r.u64("view")?;
    let view_changing = r.bool("view_changing")?;
    let last_normal_view = r.u64("last_normal_view")?;
    let stable = r.checkpoint()?;
    let count = r.count("stable_voters", 1, usize::from(u16::MAX))?;
    let mut stable_voters = Vec::with_capacity(count);
    for _ in 0..count {
        stable_voters.push(r.replica()?);
    }
    let count = r.count("own_checkpoints", 66, usize::MAX)?;
    let mut own_checkpoints = Vec::with_capacity(count);
    for _ in 0..count {
        own_checkpoints.push(r.checkpoint()?);
    }
    let view_anchor = r.checkpoint()?;
    let own_view_change = if r.bool("own_view_change")? { Some(r.view_change()?) } else { None };
    let current_new_view = if r.bool("current_new_view")? { Some(r.new_view()?) } else { None };
    Ok(Meta { view, view_changing, last_normal_view, stable, stable_voters, own_checkpoints, view_anchor, own_view_change, current_new_view })
}

fn write_base(out: &mut Vec<u8>, base: &DeliveryBase) {
    put_u64(out, base.seq);
    put_u64(out, base.time.0);
    out.extend_from_slice(&base.log_digest);
    put_len(out, base.clients.len());
    for entry in &base.clients {
        put_u64(out, u64::from(entry.origin));
        put_u64(out, entry.client);
        put_u64(out, entry.high);
        out.extend_from_slice(&entry.mask.to_le_bytes());
        put_u64(out, entry.last_seq);
    }
    put_u64(out, base.budgets.clock.0);
    put_len(out, base.budgets.balances.len());
    for (origin, balance) in &base.budgets.balances {
        put_u64(out, u64::from(*origin));
        out.extend_from_slice(&balance.to_le_bytes());
    }
}

fn read_base(r: &mut Reader<'_>) -> Result<DeliveryBase, DecodeError> {
    let seq = r.u64("base seq")?;
    let time = Time(r.u64("base time")?);
    let log_digest = r.digest()?;
    let count = r.count("clients", 20, usize::MAX)?;
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        let origin = r.replica()?;
        let client = r.u64("client")?;
        let high = r.u64("high")?;
        let mut mask = [0u8; 16];
        for byte in &mut mask {
            *byte = r.byte("mask")?;
        }
        let last_seq = r.u64("last_seq")?;
        clients.push(ClientEntry { origin, client, high, mask: u128::from_le_bytes(mask), last_seq });
    }
    let clock = Time(r.u64("budget clock")?);
    let count = r.count("budgets", 9, usize::MAX)?;
    let mut balances = BTreeMap::new();
    for _ in 0..count {
        let origin = r.replica()?;
        let mut bytes = [0u8; 8];
        for byte in &mut bytes {
            *byte = r.byte("balance")?;
        }
        if balances.insert(origin, i64::from_le_bytes(bytes)).is_some() {
            return Err(DecodeError::OutOfRange { field: "budget origin", value: u64::from(origin) });
        }
    }
    Ok(DeliveryBase { seq, time, log_digest, clients, budgets: OriginBudgets { clock, balances } })
}

/// Proposals are written once: `prepared` and `committed` usually repeat `accepted`.
fn write_slot(out: &mut Vec<u8>, slot: &SlotRecord) {
    put_u64(out, slot.seq);
    let accepted = slot.accepted.as_ref().map(|(_, p)| p);
    match &slot.accepted {
        None => out.push(0),
        Some((view, proposal)) => {
            out.push(1);
            put_u64(out, *view);
            write_proposal(out, proposal);
        }
    }
    match &slot.prepared {
        None => out.push(0),
        Some((view, proposal)) if Some(proposal) == accepted => {
            out.push(1);
            put_u64(out, *view);
        }
        Some((view, proposal)) => {
            out.push(2);
            put_u64(out, *view);
            write_proposal(out, proposal);
        }
    }
    put_len(out, slot.pre_prepared.len());
    for (digest, view) in &slot.pre_prepared {
        out.extend_from_slice(digest);
        put_u64(out, *view);
    }
    put_option_u64(out, slot.sent_commit_view);
    let prepared = slot.prepared.as_ref().map(|(_, p)| p);
    match &slot.committed {
        None => out.push(0),
        Some(proposal) if Some(proposal) == accepted => out.push(1),
        Some(proposal) if Some(proposal) == prepared => out.push(2),
        Some(proposal) => {
            out.push(3);
            write_proposal(out, proposal);
        }
    }
}

fn read_slot(r: &mut Reader<'_>) -> Result<SlotRecord, DecodeError> {
    let seq = r.u64("seq")?;
    let accepted = match r.byte("accepted")? {
        0 => None,
        1 => Some((r.u64("view")?, r.proposal()?)),
        other => return Err(DecodeError::OutOfRange { field: "accepted", value: u64::from(other) }),
    };
    let prepared = match r.byte("prepared")? {
        0 => None,
        1 => {
            let view = r.u64("view")?;
            let proposal = accepted.as_ref().map(|(_, p)| p.clone()).ok_or(DecodeError::Truncated("prepared"))?;
            Some((view, proposal))
        }
        2 => Some((r.u64("view")?, r.proposal()?)),
        other => return Err(DecodeError::OutOfRange { field: "prepared", value: u64::from(other) }),
    };
    let count = r.count("pre_prepared", 33, usize::MAX)?;
    let mut pre_prepared = Vec::with_capacity(count);
    for _ in 0..count {
        pre_prepared.push((r.digest()?, r.u64("view")?));
    }
    let sent_commit_view = read_option_u64(r, "sent_commit_view")?;
    let committed = match r.byte("committed")? {
        0 => None,
        1 => Some(accepted.as_ref().map(|(_, p)| p.clone()).ok_or(DecodeError::Truncated("committed"))?),
        2 => Some(prepared.as_ref().map(|(_, p)| p.clone()).ok_or(DecodeError::Truncated("committed"))?),
        3 => Some(r.proposal()?),
        other => return Err(DecodeError::OutOfRange { field: "committed", value: u64::from(other) }),
    };
    Ok(SlotRecord { seq, accepted, prepared, pre_prepared, sent_commit_view, committed })
}
