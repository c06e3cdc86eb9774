//! The replica state machine: events in (`submit`, `handle_message`, `handle_timeout`,
//! `checkpoint`), actions out (`poll_action`), one wake-up time (`poll_timeout`: the earliest
//! deadline in its timer table, [`Timers`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::budget::Rule;
use crate::codec::{new_view_digest, request_digest, view_change_digest};
use crate::decide::{decide, search};
use crate::message::{CheckpointClaim, Message, NewView, PrePreparedEntry, PreparedEntry, StatusReport, ViewChange};
use crate::persist::{fold_state_digest, meta_record, slot_record, table_digest, Meta, Persist, PersistedState, RestoreError, SlotRecord, Transferred};
use crate::types::{
    duration_us, Batch, CheckpointError, ClientEntry, Config, ConfigError, DeliveryBase, Digest, OriginBudgets, Proposal, ReplicaId, Request, RequestKey,
    StateTransferError, SubmitError, Time, DEDUP_WINDOW, REQUEST_OVERHEAD,
};

/// Something the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Send `message` to replica `to` (never this replica).
    Send { to: ReplicaId, message: Message },
    /// Send `message` to every other replica.
    Broadcast { message: Message },
    /// Execute this batch; batches come in strict sequence order.
    Deliver(Batch),
    /// The batches after `last_delivered` are garbage-collected on at least f+1 replicas: the
    /// application must obtain the state of `checkpoint` from its peers (out of band) — the core
    /// cannot continue delivering until then. Emitted once per checkpoint.
    NeedStateTransfer { last_delivered: u64, checkpoint: CheckpointClaim },
    /// Make this durable before carrying out any action polled after it (see
    /// [`crate::Persist`]); a driver that cannot must stop the replica rather than go on.
    Persist(Persist),
}

/// A snapshot of the replica's progress.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// Current view (the target view while a view change is under way).
    pub view: u64,
    pub view_changing: bool,
    pub primary: ReplicaId,
    pub is_primary: bool,
    pub last_delivered: u64,
    /// See [`Replica::read_barrier`].
    pub read_barrier: u64,
    /// Agreed time of the last delivered batch.
    pub last_time: Time,
    pub stable_checkpoint: u64,
    /// The stable checkpoint itself (2f+1 replicas certified its state digest): a replica
    /// whose own digest for it differs has diverged.
    pub stable_claim: CheckpointClaim,
    /// Requests known to this replica and not yet delivered.
    pub pending_requests: usize,
    /// Protocol violations observed per peer (index = replica id).
    pub misbehaviour: Vec<u64>,
    /// The latest protocol violation seen: the peer and what it did.
    pub last_misbehaviour: Option<(ReplicaId, &'static str)>,
    /// Protocol violations per (peer, what it did), for attribution in logs and metrics.
    /// Bounded: the kinds are the core's fixed reasons.
    pub faults: BTreeMap<(ReplicaId, &'static str), u64>,
    /// The last time this replica's own request timer made it suspect a primary (not a view
    /// change it joined or one that failed): what it waited for and against what timeout.
    pub last_suspicion: Option<Suspicion>,
}

/// What a replica's request timer saw when it suspected a primary: enough for a log line to
/// tell a primary that did not order from a timeout that was too tight for the moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Suspicion {
    /// The view whose primary was suspected.
    pub view: u64,
    pub at: Time,
    /// Requests awaited then (own and other origins').
    pub awaited: usize,
    /// How long the oldest of them had been known here.
    pub oldest_wait: std::time::Duration,
    /// Whether the oldest was this replica's own request.
    pub oldest_own: bool,
    /// The request timeout in force (see [`Replica::current_request_timeout`]).
    pub timeout: std::time::Duration,
    /// The ordering latency estimate the timeout adapts to (a quarter of it, at most).
    pub observed: std::time::Duration,
}

/// A gap between inputs of this many retransmit intervals is a pause (see `Replica::observe`):
/// ticks come every interval while the process runs.
const RESUME_INTERVALS: u64 = 4;
/// Most checkpoint votes remembered per peer (its latest ones).
const VOTES_PER_PEER: usize = 4;
/// Most digests remembered per seq in the Q set.
const PRE_PREPARED_PER_SEQ: usize = 4;
/// View changes remembered per peer (its highest views), so a new view can still be checked
/// after its sender moved on.
const VIEW_CHANGES_PER_PEER: usize = 2;
/// Most committed batches pushed to a lagging peer per status report. The byte cap
/// ([`PUSH_BATCHES_OF_BYTES`]) is what bounds a status spammer's cost; at 16 the count alone
/// held a laggard to 32 batches/s at the default interval, slower than a loaded cluster orders.
const PUSH_BURST: u64 = 64;
/// Most proposal bytes pushed to a lagging peer per status report, in units of
/// `batch_max_bytes` (at least one batch always goes).
const PUSH_BATCHES_OF_BYTES: usize = 4;
/// A primary looks this many batches' worth of queued requests ahead to share a batch fairly.
const FAIR_SCAN: usize = 4;
/// `Holds` claims kept per claimer for requests not held yet (see `early_holds`): a few
/// batches' worth, since a claim overtakes its request only by the difference of two links.
const EARLY_HOLDS_PER_PEER: usize = 4096;
/// What one kept early claim is charged in [`Replica::held_bytes`] (key, digest, claimer and
/// the two index entries).
const EARLY_HOLD_BYTES: usize = 128;
/// Most slots whose messages are retransmitted per tick.
const RETRANSMIT_SLOTS: usize = 32;
/// Checkpoints asked for by state transfer that may still be installed.
const TRANSFER_CLAIMS: usize = 4;
/// View-change timeouts stop doubling after this many failed views.
const MAX_BACKOFF_SHIFT: u32 = 5;
/// A backup suspects the primary no sooner than this many times the slowest recent ordering
/// latency it observed (see [`Config::min_request_timeout`]).
const LATENCY_FACTOR: u64 = 4;
/// The observed ordering latency decays by 1/this per delivered batch with a request this
/// replica awaited, so one slow moment does not keep the timeout long for good.
const LATENCY_DECAY: u64 = 8;
/// Records appended to the log before a new snapshot replaces it, in windows of slots (three
/// records per batch in the normal case, a new snapshot at every stable checkpoint).
const RECORDS_PER_WINDOW: u64 = 8;
/// Windows of committed batches below the delivery base kept in a snapshot to serve laggards.
const RETAINED_WINDOWS: u64 = 2;

/// Where the replica stands in the view protocol. What exists in one phase only lives in
/// its variant, so a view change without its own message, a pending new view outside a view
/// change and the like cannot be represented. Transitions: [`Replica::start_view_change`]
/// (to `ViewChanging`, from either phase) and [`Replica::install_new_view`] (to `Normal`);
/// [`Replica::restore`] resumes the persisted one.
#[derive(Clone, Debug)]
enum Phase {
    /// Ordering requests in `view`.
    Normal {
        view: u64,
        /// The new view that installed `view` (none in view 0, which starts without one):
        /// sent to a peer that reports an older view or still changing to this one.
        new_view: Option<NewView>,
        /// When `view` began here (installed, or this replica started): requests learned
        /// before it waited through a view change, which says nothing about its primary.
        began: Time,
        /// The view change this replica sent for a later view and withdrew from, back in
        /// `view` because f+1 peers went on ordering in it (see [`Replica::try_rejoin`]). It
        /// votes for nothing in `view` (that view change stays a true account of what it
        /// prepared) and sends that same one again if it moves to that view; it delivers what
        /// 2f+1 others commit.
        withdrawn: Option<ViewChange>,
    },
    /// Changing to `own.view` (the target view).
    ViewChanging {
        /// The view change this replica sent for the target view, retransmitted every tick.
        own: ViewChange,
        /// The last view this replica ordered in: the view-change timeout doubles per view
        /// tried since.
        last_normal_view: u64,
        /// The target view's new view from its primary, held until this replica holds every
        /// view change it names and can check its decision.
        pending_new_view: Option<NewView>,
        /// When this replica began changing to the target view.
        since: Time,
    },
}

impl Phase {
    /// The current view, or the target view while changing.
    fn view(&self) -> u64 {
        match self {
            Phase::Normal { view, .. } => *view,
            Phase::ViewChanging { own, .. } => own.view,
        }
    }

    fn is_changing(&self) -> bool {
        matches!(self, Phase::ViewChanging { .. })
    }

    /// The view this replica orders in, if it is not changing views.
    fn ordering_view(&self) -> Option<u64> {
        match self {
            Phase::Normal { view, .. } => Some(*view),
            Phase::ViewChanging { .. } => None,
        }
    }

    /// The view change this replica withdrew from while back in its last view, if any.
    fn withdrawn(&self) -> Option<&ViewChange> {
        match self {
            Phase::Normal { withdrawn, .. } => withdrawn.as_ref(),
            Phase::ViewChanging { .. } => None,
        }
    }
}

/// What a deadline in [`Timers`] is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Every `retransmit_interval`: the status report and retransmissions. Always armed.
    Tick,
    /// A request this replica knows was not ordered in time: suspect the primary. Armed
    /// only while a request is awaited and no view change is under way.
    Request,
    /// The view change under way did not install in time: try the next view. Armed only
    /// while changing views, once a quorum asks for this view or a later one.
    ViewChange,
    /// The primary's next batch: its oldest unproposed request has waited `batch_delay`, or
    /// a parked origin's balance is back. Derived from the queue and the clock, so it is
    /// re-armed after every input (see [`Replica::arm_batch_timer`]).
    Batch,
    /// A backup sent `Holds` claims less than `batch_delay` ago: later ones are gathered until
    /// it fires (or a batch's count of them gathered), then go in one message.
    Holds,
}

impl Timer {
    /// Every kind, in the order [`Replica::handle_timeout`] fires them when several are due.
    const ALL: [Timer; 5] = [Timer::Tick, Timer::Request, Timer::ViewChange, Timer::Batch, Timer::Holds];
}

/// Every deadline the replica keeps, one per [`Timer`] kind; the next wake-up is the earliest.
#[derive(Clone, Debug, Default)]
struct Timers([Option<Time>; Timer::ALL.len()]);

impl Timers {
    fn get(&self, timer: Timer) -> Option<Time> {
        self.0[timer as usize]
    }

    fn is_armed(&self, timer: Timer) -> bool {
        self.get(timer).is_some()
    }

    fn set(&mut self, timer: Timer, at: Option<Time>) {
        self.0[timer as usize] = at;
    }

    fn arm(&mut self, timer: Timer, at: Time) {
        self.set(timer, Some(at));
    }

    /// Arms `timer` unless it already runs (a running timer keeps its earlier deadline).
    fn arm_if_idle(&mut self, timer: Timer, at: Time) {
        if !self.is_armed(timer) {
            self.arm(timer, at);
        }
    }

    fn cancel(&mut self, timer: Timer) {
        self.set(timer, None);
    }

    /// Disarms `timer` and says so if it was due at `now`.
    fn take_due(&mut self, timer: Timer, now: Time) -> bool {
        let due = self.get(timer).is_some_and(|at| at <= now);
        if due {
            self.cancel(timer);
        }
        due
    }

    fn next(&self) -> Option<Time> {
        self.0.iter().flatten().min().copied()
    }
}

#[derive(Clone, Debug)]
struct Accepted {
    view: u64,
    digest: Digest,
    proposal: Proposal,
    /// When this replica accepted it (retransmissions wait a full interval).
    at: Time,
}

#[derive(Clone, Debug, Default)]
struct Slot {
    /// The pre-prepare accepted in `accepted.view`.
    accepted: Option<Accepted>,
    /// Latest (view, digest) each replica prepared.
    prepares: BTreeMap<ReplicaId, (u64, Digest)>,
    /// Latest (view, digest) each replica committed.
    commits: BTreeMap<ReplicaId, (u64, Digest)>,
    /// Highest-view prepared certificate held.
    prepared: Option<Accepted>,
    /// Q set: digests accepted and the highest view each was accepted in.
    pre_prepared: Vec<(Digest, u64)>,
    sent_commit_view: Option<u64>,
    /// Committed (locally or via f+1 fetched copies); never changes once set.
    committed: Option<(Digest, Proposal)>,
    /// Fetched copies: sender -> digest, with the bodies by digest.
    fetched: BTreeMap<ReplicaId, Digest>,
    fetched_bodies: BTreeMap<Digest, Proposal>,
    /// The view in which this slot's primary was blamed for equivocating (blamed once).
    equivocation_blamed: Option<u64>,
    /// A pre-prepare of the current view not yet vouched for (see [`Replica::vouched`]):
    /// neither prepared nor reported until it is.
    waiting: Option<Accepted>,
    /// A pre-prepare of the current view this replica keeps without voting for it: its time
    /// was beyond `max_clock_skew` of our clock, or this replica withdrew from a view change
    /// (see [`Phase::Normal`]). Never prepared nor reported in a view change; delivered once
    /// 2f+1 replicas commit it (see [`Replica::check_committed`]).
    unvoted: Option<Accepted>,
}

#[derive(Clone, Debug)]
struct Awaited {
    request: Request,
    since: Time,
    own: bool,
    /// Another origin's request: its [`request_digest`] (zero for an own request).
    digest: Digest,
    /// Another origin's request: the replicas known to hold it from its origin (the origin
    /// itself, and the senders of matching [`Message::Holds`]), by increasing id. A primary
    /// proposes it once there are 2f of them (see [`Replica::proposable`]).
    holders: Vec<ReplicaId>,
}

#[derive(Clone, Copy, Debug)]
struct ClientRecord {
    high: u64,
    /// Bit i set: number `high - i` was delivered.
    mask: u128,
    last_seq: u64,
}

/// One PBFT replica. See the crate docs for the driving loop.
#[derive(Debug)]
pub struct Replica {
    config: Config,
    now: Time,
    /// Normal operation in a view, or a view change and its data (see [`Phase`]).
    phase: Phase,
    slots: BTreeMap<u64, Slot>,
    last_delivered: u64,
    /// Highest seq this replica ever sent a commit for (see [`Replica::read_barrier`]).
    commit_high: u64,
    last_time: Time,
    stable: CheckpointClaim,
    own_checkpoints: BTreeMap<u64, CheckpointClaim>,
    /// Delivered checkpoint seqs awaiting the application's digest: (time, log digest,
    /// deduplication table digest).
    checkpoint_times: BTreeMap<u64, (Time, Digest, Digest)>,
    /// Hash chain over delivered (seq, proposal digest).
    log_digest: Digest,
    checkpoint_votes: BTreeMap<ReplicaId, Vec<CheckpointClaim>>,
    retained: BTreeMap<u64, Proposal>,
    awaited: BTreeMap<RequestKey, Awaited>,
    /// Requests the primary has not proposed yet, in arrival order, with their sizes.
    fresh: VecDeque<(RequestKey, usize)>,
    /// Sum of the sizes in `fresh` (stale entries included until popped).
    fresh_bytes: usize,
    /// The per-origin budget rule (`max_origin_bytes_per_sec`, see [`crate::budget`]).
    rule: Rule,
    /// The per-origin budget after the last delivered batch (a function of the log).
    budgets: OriginBudgets,
    /// The proposer's budget after its last proposal: (view, next seq, budget). Derived from
    /// the log ([`Replica::projected_budgets`]) when the key no longer matches.
    proposer_budgets: Option<(u64, u64, OriginBudgets)>,
    /// Fresh requests of origins over their rate, in arrival order, until their balance is
    /// back to half the bucket.
    parked: BTreeMap<ReplicaId, VecDeque<(RequestKey, usize)>>,
    proposed: BTreeSet<RequestKey>,
    /// Seqs whose slot holds a waiting (not yet vouched) pre-prepare.
    waiting: BTreeSet<u64>,
    /// `Holds` claims not yet sent to the primary (see [`Timer::Holds`]).
    holds_out: Vec<(RequestKey, Digest)>,
    /// `Holds` claims of requests this replica did not hold yet when they came: the origin
    /// sends a request to every replica at once, so a backup's claim often overtakes it.
    /// Applied when the request arrives; at most [`EARLY_HOLDS_PER_PEER`] per claimer, oldest
    /// dropped first (see [`Replica::keep_early_holds`]).
    early_holds: BTreeMap<RequestKey, Vec<(ReplicaId, Digest)>>,
    /// Each claimer's entries in `early_holds`, oldest first (entries already applied are
    /// skipped when popped).
    early_holds_order: BTreeMap<ReplicaId, VecDeque<RequestKey>>,
    clients: BTreeMap<(ReplicaId, u64), ClientRecord>,
    /// (origin, seq of last delivery, client): each origin's pairs, oldest first.
    clients_by_age: BTreeSet<(ReplicaId, u64, u64)>,
    /// Pairs remembered per origin.
    clients_per_origin: BTreeMap<ReplicaId, usize>,
    /// Own requests in `awaited`.
    own_pending: usize,
    /// Charged bytes of other origins' requests in `awaited`, per origin.
    relayed_bytes: BTreeMap<ReplicaId, usize>,
    /// When each peer was last sent batches or a new view in answer to its status.
    last_push: BTreeMap<ReplicaId, Time>,
    next_seq: u64,
    last_proposed_time: Time,
    /// View changes by (sender, view); the latest [`VIEW_CHANGES_PER_PEER`] views per sender.
    view_changes: BTreeMap<(ReplicaId, u64), (ViewChange, Digest)>,
    /// A second, different view change from the same sender for the same view (equivocation):
    /// kept so a new view that used that version can still be checked.
    alternate_view_changes: BTreeMap<(ReplicaId, u64), (ViewChange, Digest)>,
    relayed_new_views: BTreeMap<ReplicaId, (Digest, NewView)>,
    /// Every deadline this replica keeps (see [`Timer`]).
    timers: Timers,
    /// Slowest recent ordering latency (a request learned in the current view, until its
    /// delivery), decaying per delivered batch that carries such a request: the adaptive
    /// request timeout follows it.
    order_latency_us: u64,
    /// View changes in a row without progress since: each doubles the floor of
    /// the request timeout, so a cluster that is slow for reasons a view change cannot cure
    /// (executors behind their checkpoints) backs off to `request_timeout`.
    suspicions: u32,
    /// Each peer's latest status report, and when it arrived.
    peer_status: BTreeMap<ReplicaId, (StatusReport, Time)>,
    /// This replica started, or resumed after a pause (its clock jumped): reports older than
    /// this say nothing about its peers now, and it suspects no primary before 2f fresh ones.
    reports_needed_after: Time,
    state_transfer_requested: u64,
    /// The latest checkpoints this replica asked the application to fetch (newest last): a
    /// transfer that took long may install one of these after the stable checkpoint moved on.
    transfer_claims: VecDeque<CheckpointClaim>,
    /// The checkpoint the current view started from (see [`Replica::low_watermark`]).
    view_anchor: CheckpointClaim,
    actions: VecDeque<Action>,
    misbehaviour: Vec<u64>,
    last_misbehaviour: Option<(ReplicaId, &'static str)>,
    faults: BTreeMap<(ReplicaId, &'static str), u64>,
    /// Who certified `stable` (persisted for the record).
    stable_voters: Vec<ReplicaId>,
    /// Persistence: slots whose durable part changed since the last [`Action::Persist`].
    dirty_slots: BTreeSet<u64>,
    dirty_meta: bool,
    snapshot_due: bool,
    generation: u64,
    records_since_snapshot: u64,
    /// Delivery bases captured at delivered checkpoints; the first is the durable one (the
    /// latest snapshot's), and committed batches after it stay in `retained`.
    bases: BTreeMap<u64, DeliveryBase>,
    /// See [`Status::last_suspicion`] (diagnostics only: nothing decides on it).
    last_suspicion: Option<Suspicion>,
}

impl Replica {
    /// A replica at view 0 with an empty log.
    pub fn new(config: Config, now: Time) -> Result<Replica, ConfigError> {
        config.validate()?;
        let n = usize::from(config.n);
        // The first status report goes out at once: peers answer a replica that just
        // started (with what it missed, or the view they are in), and it hears from them
        // before it may suspect a primary (see `reports_needed_after`).
        let mut timers = Timers::default();
        timers.arm(Timer::Tick, now);
        let rule = Rule::new(&config);
        let mut replica = Replica {
            now,
            phase: Phase::Normal { view: 0, new_view: None, began: now, withdrawn: None },
            slots: BTreeMap::new(),
            last_delivered: 0,
            commit_high: 0,
            last_time: Time(0),
            stable: CheckpointClaim::genesis(),
            own_checkpoints: BTreeMap::new(),
            checkpoint_times: BTreeMap::new(),
            log_digest: [0; 32],
            checkpoint_votes: BTreeMap::new(),
            retained: BTreeMap::new(),
            awaited: BTreeMap::new(),
            fresh: VecDeque::new(),
            fresh_bytes: 0,
            rule,
            budgets: OriginBudgets::default(),
            proposer_budgets: None,
            parked: BTreeMap::new(),
            proposed: BTreeSet::new(),
            waiting: BTreeSet::new(),
            holds_out: Vec::new(),
            early_holds: BTreeMap::new(),
            early_holds_order: BTreeMap::new(),
            clients: BTreeMap::new(),
            clients_by_age: BTreeSet::new(),
            clients_per_origin: BTreeMap::new(),
            own_pending: 0,
            relayed_bytes: BTreeMap::new(),
            last_push: BTreeMap::new(),
            next_seq: 1,
            last_proposed_time: Time(0),
            view_changes: BTreeMap::new(),
            alternate_view_changes: BTreeMap::new(),
            relayed_new_views: BTreeMap::new(),
            timers,
            order_latency_us: 0,
            suspicions: 0,
            peer_status: BTreeMap::new(),
            reports_needed_after: now,
            state_transfer_requested: 0,
            transfer_claims: VecDeque::new(),
            view_anchor: CheckpointClaim::genesis(),
            actions: VecDeque::new(),
            misbehaviour: vec![0; n],
            last_misbehaviour: None,
            faults: BTreeMap::new(),
            stable_voters: Vec::new(),
            dirty_slots: BTreeSet::new(),
            dirty_meta: false,
            // The first action makes the empty state durable, so a restart always finds one.
            snapshot_due: config.persist,
            generation: 0,
            records_since_snapshot: 0,
            bases: BTreeMap::from([(0, DeliveryBase::genesis())]),
            last_suspicion: None,
            config,
        };
        replica.arm_batch_timer();
        Ok(replica)
    }

    /// A replica resuming from what it persisted (snapshot plus records, see
    /// [`crate::PersistedState`]) or from a checkpoint installed by state transfer
    /// ([`PersistedState::from_checkpoint`]). It keeps its view and every promise it made, and
    /// delivers again, from the delivery base, the committed batches it holds: the application
    /// skips those it had executed (their `seq` is at or below its executed position).
    pub fn restore(config: Config, now: Time, state: PersistedState) -> Result<Replica, RestoreError> {
        let mut replica = Replica::new(config, now)?;
        let PersistedState { generation, meta, base, delivered, slots } = state;
        let interval = replica.config.checkpoint_interval;
        let n = replica.config.n;
        let id = replica.config.id;
        if meta.stable.seq % interval != 0 || base.seq % interval != 0 {
            return Err(RestoreError::Config("checkpoint interval"));
        }
        if base.seq > meta.stable.seq {
            return Err(RestoreError::Inconsistent("delivery base above the stable checkpoint"));
        }
        if meta.stable_voters.iter().any(|v| *v >= n)
            || base.clients.iter().any(|c| c.origin >= n)
            || meta.own_view_change.as_ref().is_some_and(|vc| vc.sender != id)
        {
            return Err(RestoreError::Config("replica count or id"));
        }
        if meta.view_changing && meta.last_normal_view >= meta.view {
            return Err(RestoreError::Inconsistent("view change not above the last normal view"));
        }
        replica.generation = generation;
        replica.stable = meta.stable;
        replica.stable_voters = meta.stable_voters;
        replica.view_anchor = meta.view_anchor;
        for claim in meta.own_checkpoints.into_iter().filter(|c| c.seq > meta.stable.seq && c.seq % interval == 0) {
            replica.own_checkpoints.insert(claim.seq, claim);
            replica.record_vote(id, claim);
        }
        replica.last_delivered = base.seq;
        replica.last_time = base.time;
        replica.log_digest = base.log_digest;
        if !replica.install_table(&base.clients) {
            return Err(RestoreError::Inconsistent("deduplication table"));
        }
        if !base.budgets.plausible(&replica.rule, n) {
            return Err(RestoreError::Inconsistent("per-origin budget"));
        }
        replica.budgets = base.budgets.clone();
        let base_seq = base.seq;
        replica.bases = BTreeMap::from([(base_seq, base)]);
        for (seq, record) in slots.into_iter().filter(|(seq, _)| *seq > base_seq) {
            let accepted = |(view, proposal): (u64, Proposal)| Accepted { view, digest: proposal.digest(seq), proposal, at: now };
            let slot = replica.slots.entry(seq).or_default();
            slot.accepted = record.accepted.map(accepted);
            slot.prepared = record.prepared.map(accepted);
            slot.pre_prepared = record.pre_prepared;
            slot.sent_commit_view = record.sent_commit_view;
            if record.sent_commit_view.is_some() {
                replica.commit_high = replica.commit_high.max(seq);
            }
            slot.committed = record.committed.map(|proposal| (proposal.digest(seq), proposal));
        }
        replica.retained = delivered.range(..=base_seq).map(|(s, p)| (*s, p.clone())).collect();
        replica.phase = if meta.view_changing {
            // Delivering below does not change what a view change reports (entries above the
            // stable checkpoint, own checkpoint claims), so one built now is the one to send.
            let own = match meta.own_view_change {
                Some(view_change) if view_change.view == meta.view => view_change,
                _ => replica.build_view_change(meta.view),
            };
            Phase::ViewChanging { own, last_normal_view: meta.last_normal_view, pending_new_view: None, since: now }
        } else {
            Phase::Normal { view: meta.view, new_view: meta.current_new_view, began: now, withdrawn: None }
        };
        // Deliver again from the base: rebuilds the deduplication table, log digest and times.
        loop {
            let seq = replica.last_delivered + 1;
            let committed = replica.slots.get(&seq).and_then(|slot| slot.committed.as_ref()).map(|(_, p)| p);
            let Some(proposal) = delivered.get(&seq).or(committed).cloned() else { break };
            replica.deliver(seq, proposal.digest(seq), proposal);
        }
        if let Phase::ViewChanging { own, .. } = &replica.phase {
            let view_change = own.clone();
            let digest = view_change_digest(&view_change);
            replica.store_view_change(id, view_change.clone(), digest);
            replica.broadcast(Message::ViewChange(view_change));
        } else if replica.is_primary() {
            // Never assign a sequence number again that this primary already pre-prepared.
            let view = replica.view();
            let mut next = replica.low_watermark().max(replica.last_delivered);
            let mut time = replica.last_time;
            let mut proposed = BTreeSet::new();
            for (seq, slot) in &replica.slots {
                if let Some(accepted) = slot.accepted.as_ref().filter(|a| a.view == view) {
                    next = next.max(*seq);
                    time = time.max(accepted.proposal.time);
                    proposed.extend(accepted.proposal.requests.iter().map(Request::key));
                }
            }
            replica.next_seq = next + 1;
            replica.last_proposed_time = time;
            replica.proposed = proposed;
        }
        replica.dirty_slots.clear();
        replica.dirty_meta = false;
        replica.snapshot_due = replica.config.persist;
        replica.after_step();
        Ok(replica)
    }

    /// The delivery base captured when this replica delivered checkpoint `seq`, while it is
    /// still held (from the durable base up): what a state transfer of that checkpoint carries
    /// besides the application state.
    pub fn delivery_base(&self, seq: u64) -> Option<&DeliveryBase> {
        self.bases.get(&seq)
    }

    /// Replaces the deduplication table with `clients` (a delivery base's). False, with the
    /// table left empty, when the entries cannot be an honest replica's: a pair twice, an
    /// unknown origin, or more pairs than `max_clients`.
    fn install_table(&mut self, clients: &[ClientEntry]) -> bool {
        self.clear_table();
        if clients.len() > self.config.max_clients || clients.iter().any(|entry| entry.origin >= self.config.n) {
            return false;
        }
        for entry in clients {
            let record = ClientRecord { high: entry.high, mask: entry.mask, last_seq: entry.last_seq };
            if self.clients.insert((entry.origin, entry.client), record).is_none() {
                *self.clients_per_origin.entry(entry.origin).or_default() += 1;
            }
            self.clients_by_age.insert((entry.origin, entry.last_seq, entry.client));
        }
        if self.clients.len() != clients.len() || self.clients_per_origin.values().any(|count| *count > self.clients_per_origin_cap()) {
            self.clear_table();
            return false;
        }
        true
    }

    fn clear_table(&mut self) {
        self.clients.clear();
        self.clients_by_age.clear();
        self.clients_per_origin.clear();
    }

    fn capture_base(&self) -> DeliveryBase {
        let clients = self
            .clients
            .iter()
            .map(|((origin, client), record)| ClientEntry { origin: *origin, client: *client, high: record.high, mask: record.mask, last_seq: record.last_seq })
            .collect();
        DeliveryBase { seq: self.last_delivered, time: self.last_time, log_digest: self.log_digest, clients, budgets: self.budgets.clone() }
    }

    fn meta(&self) -> Meta {
        let (view, view_changing, last_normal_view, own_view_change, current_new_view) = match &self.phase {
            // Withdrawn from a view change, a replica is still bound by it: it resumes from a
            // restart changing views with that same view change (and may come back again).
            Phase::Normal { view, withdrawn: Some(own), .. } => (own.view, true, *view, Some(own.clone()), None),
            Phase::Normal { view, new_view, withdrawn: None, .. } => (*view, false, *view, None, new_view.clone()),
            Phase::ViewChanging { own, last_normal_view, .. } => (own.view, true, *last_normal_view, Some(own.clone()), None),
        };
        Meta {
            view,
            view_changing,
            last_normal_view,
            stable: self.stable,
            stable_voters: self.stable_voters.clone(),
            own_checkpoints: self.own_checkpoints.values().copied().collect(),
            view_anchor: self.view_anchor,
            own_view_change,
            current_new_view,
        }
    }

    fn slot_record(&self, seq: u64) -> Option<SlotRecord> {
        match self.slots.get(&seq) {
            Some(slot) => Some(SlotRecord {
                seq,
                accepted: slot.accepted.as_ref().map(|a| (a.view, a.proposal.clone())),
                prepared: slot.prepared.as_ref().map(|p| (p.view, p.proposal.clone())),
                pre_prepared: slot.pre_prepared.clone(),
                sent_commit_view: slot.sent_commit_view,
                committed: slot.committed.as_ref().map(|(_, p)| p.clone()),
            }),
            // Collected right after it committed: what is left to keep is the batch.
            None => self.retained.get(&seq).map(|p| SlotRecord { seq, committed: Some(p.clone()), ..SlotRecord::default() }),
        }
    }

    fn mark_slot(&mut self, seq: u64) {
        if self.config.persist {
            self.dirty_slots.insert(seq);
        }
    }

    fn mark_meta(&mut self) {
        self.dirty_meta = self.config.persist;
    }

    /// What must become durable before the queued actions, if anything changed.
    fn take_persist(&mut self) -> Option<Persist> {
        if !self.config.persist {
            return None;
        }
        let limit = self.config.watermark_window.saturating_mul(RECORDS_PER_WINDOW).max(64);
        if self.snapshot_due || self.records_since_snapshot > limit {
            self.snapshot_due = false;
            self.dirty_meta = false;
            self.dirty_slots.clear();
            self.records_since_snapshot = 0;
            self.generation += 1;
            let state = self.persisted_state();
            return Some(Persist::Snapshot { generation: self.generation, bytes: state.encode_snapshot() });
        }
        if !self.dirty_meta && self.dirty_slots.is_empty() {
            return None;
        }
        let mut records = Vec::new();
        if std::mem::take(&mut self.dirty_meta) {
            records.push(meta_record(&self.meta()));
        }
        for seq in std::mem::take(&mut self.dirty_slots) {
            if let Some(record) = self.slot_record(seq) {
                records.push(slot_record(&record));
            }
        }
        self.records_since_snapshot = self.records_since_snapshot.saturating_add(records.len() as u64);
        (!records.is_empty()).then_some(Persist::Append { generation: self.generation, records })
    }

    fn persisted_state(&mut self) -> PersistedState {
        // The durable base: the latest captured one at or below both the stable checkpoint and
        // the last delivered batch; older ones are dropped.
        let limit = self.stable.seq.min(self.last_delivered);
        if let Some(chosen) = self.bases.range(..=limit).next_back().map(|(seq, _)| *seq) {
            self.bases = self.bases.split_off(&chosen);
        }
        let base = self.bases.values().next().cloned().unwrap_or_else(DeliveryBase::genesis);
        // Plus a tail below the base, so that peers restarted together can still serve a
        // replica that was behind them (what is older needs a state transfer).
        let tail = self.config.retained_batches.min(self.config.watermark_window.saturating_mul(RETAINED_WINDOWS));
        let first = base.seq.saturating_sub(tail).saturating_add(1);
        let delivered = self.retained.range(first..=self.last_delivered).map(|(s, p)| (*s, p.clone())).collect();
        let slots = self.slots.keys().filter_map(|seq| self.slot_record(*seq)).map(|r| (r.seq, r)).collect();
        PersistedState { generation: self.generation, meta: self.meta(), base, delivered, slots }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn id(&self) -> ReplicaId {
        self.config.id
    }

    pub fn status(&self) -> Status {
        let primary = self.primary();
        let view_changing = self.phase.is_changing();
        Status {
            view: self.view(),
            view_changing,
            primary,
            is_primary: primary == self.config.id && !view_changing,
            last_delivered: self.last_delivered,
            read_barrier: self.read_barrier(),
            last_time: self.last_time,
            stable_checkpoint: self.stable.seq,
            stable_claim: self.stable,
            pending_requests: self.awaited.len(),
            misbehaviour: self.misbehaviour.clone(),
            last_misbehaviour: self.last_misbehaviour,
            faults: self.faults.clone(),
            last_suspicion: self.last_suspicion,
        }
    }

    /// What the request timer sees now, before it suspects `view`'s primary.
    fn suspicion(&self, view: u64, now: Time) -> Suspicion {
        let oldest = self.awaited.values().min_by_key(|a| a.since.0);
        Suspicion {
            view,
            at: now,
            awaited: self.awaited.len(),
            oldest_wait: std::time::Duration::from_micros(oldest.map_or(0, |a| now.0.saturating_sub(a.since.0))),
            oldest_own: oldest.is_some_and(|a| a.own),
            timeout: self.request_timeout(),
            observed: std::time::Duration::from_micros(self.order_latency_us),
        }
    }

    /// Bytes of peer- and client-supplied data this replica holds (requests, proposals in slots,
    /// fetched and retained batches, view changes, new views), as the budgets account them:
    /// payload bytes plus fixed per-item charges. Not the allocator's figure; the documented
    /// bound ([`Replica::held_bytes_bound`]) is checked against it in the simulator.
    pub fn held_bytes(&self) -> usize {
        let mut total = self.early_holds_order.values().map(|order| order.len().saturating_mul(EARLY_HOLD_BYTES)).fold(0usize, usize::saturating_add);
        for awaited in self.awaited.values() {
            total = total.saturating_add(charge(&awaited.request));
        }
        for slot in self.slots.values() {
            let proposals = slot
                .accepted
                .iter()
                .map(|a| &a.proposal)
                .chain(slot.prepared.iter().map(|p| &p.proposal))
                .chain(slot.committed.iter().map(|(_, p)| p))
                .chain(slot.waiting.iter().map(|w| &w.proposal))
                .chain(slot.unvoted.iter().map(|u| &u.proposal))
                .chain(slot.fetched_bodies.values());
            for proposal in proposals {
                total = total.saturating_add(proposal_bytes(proposal));
            }
        }
        for proposal in self.retained.values() {
            total = total.saturating_add(proposal_bytes(proposal));
        }
        for (view_change, _) in self.view_changes.values().chain(self.alternate_view_changes.values()) {
            total = total.saturating_add(view_change_bytes(view_change));
        }
        let own_new_view = match &self.phase {
            Phase::Normal { new_view, .. } => new_view.as_ref(),
            Phase::ViewChanging { pending_new_view, .. } => pending_new_view.as_ref(),
        };
        let new_views = self.relayed_new_views.values().map(|(_, nv)| nv).chain(own_new_view);
        for new_view in new_views {
            total = total.saturating_add(new_view_bytes(new_view));
        }
        total
    }

    /// The most [`Replica::held_bytes`] can reach with this configuration whatever peers send,
    /// derived from the budgets (B = `batch_max_bytes` + 16 per proposal, L = window, n peers):
    /// own requests `max_pending_requests` x (`max_request_bytes` + overhead); others' requests
    /// (n - 1) x `max_pending_bytes_per_origin`; slots at most 2L + K, each holding an accepted,
    /// a waiting, an unvoted, a prepared and a committed proposal and one fetched body per peer: (5 + n) x B; retained
    /// batches (`retained_batches` + 2L + K) x B; view changes, three per peer (two views plus
    /// one equivocating copy), each at most 4L prepared entries of B plus its fixed parts; new
    /// views n + 2 (relayed, pending, current), each at most L proposals of B.
    pub fn held_bytes_bound(&self) -> usize {
        let c = &self.config;
        let n = usize::from(c.n);
        let window = usize::try_from(c.watermark_window).unwrap_or(usize::MAX);
        let interval = usize::try_from(c.checkpoint_interval).unwrap_or(usize::MAX);
        let retained = usize::try_from(c.retained_batches).unwrap_or(usize::MAX);
        let batch = c.batch_max_bytes.saturating_add(16);
        let own = c.max_pending_requests.saturating_mul(c.max_request_bytes.saturating_add(REQUEST_OVERHEAD));
        let others = n.saturating_sub(1).saturating_mul(c.max_pending_bytes_per_origin);
        let slot_count = window.saturating_mul(2).saturating_add(interval);
        let slots = slot_count.saturating_mul(batch.saturating_mul(5 + n));
        let retained = retained.saturating_add(slot_count).saturating_mul(batch);
        let entries = window.saturating_mul(4);
        let one_view_change = VIEW_CHANGE_FIXED
            .saturating_add(entries.saturating_mul(batch.saturating_add(ENTRY_FIXED)))
            .saturating_add(entries.saturating_mul(PRE_PREPARED_PER_SEQ).saturating_mul(ENTRY_FIXED))
            .saturating_add(self.max_checkpoint_claims().saturating_mul(ENTRY_FIXED));
        let view_changes = n.saturating_mul(VIEW_CHANGES_PER_PEER + 1).saturating_mul(one_view_change);
        let one_new_view =
            VIEW_CHANGE_FIXED.saturating_add(n.saturating_mul(ENTRY_FIXED)).saturating_add(window.saturating_mul(batch.saturating_add(ENTRY_FIXED)));
        let new_views = n.saturating_add(2).saturating_mul(one_new_view);
        let early_holds = n.saturating_mul(EARLY_HOLDS_PER_PEER).saturating_mul(EARLY_HOLD_BYTES);
        [own, others, slots, retained, view_changes, new_views, early_holds].into_iter().fold(0usize, usize::saturating_add)
    }

    /// Next action for the driver. Worth polling after every other call.
    pub fn poll_action(&mut self) -> Option<Action> {
        if let Some(persist) = self.take_persist() {
            return Some(Action::Persist(persist));
        }
        self.actions.pop_front()
    }

    /// When to call [`Replica::handle_timeout`] next: the earliest deadline in the timer
    /// table (never `None` today: the tick always runs).
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.next()
    }

    /// A request from a local client. Idempotent for a request already pending.
    pub fn submit(&mut self, now: Time, request: Request) -> Result<(), SubmitError> {
        self.observe(now);
        if request.origin != self.config.id {
            return Err(SubmitError::NotOwnOrigin { origin: request.origin, id: self.config.id });
        }
        if request.wire_size() > self.config.max_request_bytes {
            return Err(SubmitError::TooLarge { size: request.wire_size(), limit: self.config.max_request_bytes });
        }
        if self.is_delivered(&request.key()) {
            return Err(SubmitError::AlreadyDelivered);
        }
        if self.number_jump_too_far(&request.key()) {
            return Err(SubmitError::NumberTooFar);
        }
        if self.awaited.contains_key(&request.key()) {
            return Ok(());
        }
        if self.own_pending >= self.config.max_pending_requests {
            return Err(SubmitError::QueueFull { pending: self.own_pending });
        }
        self.learn_request(request, true);
        self.after_step();
        Ok(())
    }

    /// A message from peer `from`, as authenticated by the transport.
    pub fn handle_message(&mut self, now: Time, from: ReplicaId, message: Message) {
        self.observe(now);
        if from >= self.config.n || from == self.config.id {
            return;
        }
        if message.sender() != from {
            self.blame(from, "claimed sender differs from channel");
            return;
        }
        match message {
            Message::Request { request, .. } => self.on_request(from, request),
            Message::Holds { requests, .. } => self.on_holds(from, requests),
            Message::PrePrepare { view, seq, proposal, .. } => self.on_pre_prepare(from, view, seq, proposal),
            Message::Prepare { view, seq, digest, .. } => self.on_prepare(from, view, seq, digest),
            Message::Commit { view, seq, digest, .. } => self.on_commit(from, view, seq, digest),
            Message::Checkpoint { checkpoint, .. } => self.on_checkpoint(from, checkpoint),
            Message::ViewChange(view_change) => self.on_view_change(from, view_change),
            Message::NewView { new_view, .. } => self.on_new_view(from, new_view),
            Message::Status(report) => self.on_status(from, report),
            Message::Committed { seq, proposal, .. } => self.on_committed(from, seq, proposal),
        }
        self.after_step();
    }

    /// The read barrier: the highest seq for which this replica has sent a commit (it holds
    /// a prepared certificate for it), or the last delivered one if higher. A write is
    /// acknowledged to its client only after 2f+1 replicas sent a commit for its seq, so a
    /// read probe that reaches an honest one of them afterwards finds its barrier at or past
    /// that seq; answering only after executing up to the barrier, it sees the write. The
    /// vouched-read argument is in docs/DETERMINISM.md, "Vouched reads". Never decreases.
    pub fn read_barrier(&self) -> u64 {
        self.last_delivered.max(self.commit_high)
    }

    /// Fires due timers. Safe to call at any time.
    pub fn handle_timeout(&mut self, now: Time) {
        self.observe(now);
        // One kind after the other, each checked after the previous one fired (firing one
        // can cancel or re-arm another).
        for timer in Timer::ALL {
            if self.timers.take_due(timer, now) {
                self.fire(timer, now);
            }
        }
        self.after_step();
    }

    fn fire(&mut self, timer: Timer, now: Time) {
        match timer {
            Timer::Tick => {
                self.timers.arm(Timer::Tick, now.plus(self.config.retransmit_interval));
                self.tick();
            }
            Timer::Request => {
                if self.lagging() {
                    // f+1 peers delivered more: catch up first, the primary may be fine.
                    self.timers.arm(Timer::Request, now.plus(self.request_timeout()));
                } else if !self.heard_peers_since_resume() {
                    // Just started or resumed: what peers reported before says nothing about now
                    // (they may be far ahead, in another view). A lone suspicion would leave this
                    // replica waiting in a view change nobody else makes: wait for fresh reports.
                    self.timers.arm(Timer::Request, now.plus(self.config.retransmit_interval.min(self.request_timeout())));
                } else if self.is_proposing() && self.waiting.is_empty() && !self.awaited.values().any(|a| self.proposable(a)) {
                    // A primary waits on nothing it could propose: the requests it holds reached
                    // too few replicas to be vouched for (their origin's doing, or the claims
                    // are still coming). Suspecting itself would let one origin cost a view.
                    self.timers.arm(Timer::Request, now.plus(self.request_timeout()));
                } else if let Some(view) = self.phase.ordering_view() {
                    self.last_suspicion = Some(self.suspicion(view, now));
                    // Peers that have not seen these requests yet (they reach everyone only after a
                    // retransmit interval) start their own timers now, so f+1 suspicions, and with
                    // them the view change, follow one timeout later rather than two intervals.
                    self.relay_own_requests(true);
                    self.start_view_change(view + 1);
                }
            }
            Timer::ViewChange => {
                if self.phase.is_changing() {
                    self.start_view_change(self.view() + 1);
                }
            }
            // Proposing what is due is `after_step`'s, which every input ends with.
            Timer::Batch => {}
            Timer::Holds => self.flush_holds(),
        }
    }

    /// The application's state digest after executing batch `seq` (a checkpoint).
    pub fn checkpoint(&mut self, seq: u64, state_digest: Digest) -> Result<(), CheckpointError> {
        let interval = self.config.checkpoint_interval;
        if seq == 0 || seq % interval != 0 {
            return Err(CheckpointError::NotACheckpoint { seq, interval });
        }
        if seq > self.last_delivered {
            return Err(CheckpointError::NotDelivered { seq, last_delivered: self.last_delivered });
        }
        if seq <= self.stable.seq {
            // A quorum already certified this checkpoint while we caught up: nothing to add.
            return Ok(());
        }
        let Some((time, log_digest, table)) = self.checkpoint_times.remove(&seq) else {
            return Err(CheckpointError::Stale { seq });
        };
        // The certified state covers this replica's deduplication table at `seq`, so a state
        // transfer can carry it (see `state_transferred`).
        let state_digest = fold_state_digest(&state_digest, &table);
        let claim = CheckpointClaim { seq, time, log_digest, state_digest };
        self.own_checkpoints.insert(seq, claim);
        self.mark_meta();
        self.broadcast(Message::Checkpoint { sender: self.config.id, checkpoint: claim });
        self.record_vote(self.config.id, claim);
        self.check_stable();
        self.after_step();
        Ok(())
    }

    /// The application installed the state of `claim` (fetched from peers and checked against
    /// `claim.state_digest`): delivery resumes after `claim.seq`. `claim` must be the stable
    /// checkpoint or one this replica asked for with [`Action::NeedStateTransfer`].
    ///
    /// The deduplication table becomes the one `transferred.base` carries, after checking
    /// that it and the application's digest fold into the certified state digest: a request
    /// delivered in the skipped part of the log is then not delivered again. Requests this
    /// replica awaited are forgotten, since some were delivered in the skipped part: their
    /// origins retransmit the rest, its own clients retry. See docs/RELIABILITY.md,
    /// "State transfer".
    pub fn state_transferred(&mut self, transferred: Transferred) -> Result<(), StateTransferError> {
        let claim = transferred.claim;
        if claim.seq <= self.last_delivered {
            return Err(StateTransferError::NotAhead { seq: claim.seq, last_delivered: self.last_delivered });
        }
        if claim != self.stable && !self.transfer_claims.contains(&claim) {
            return Err(StateTransferError::NotCertified { seq: claim.seq, stable: self.stable.seq });
        }
        if let Err(mismatch) = transferred.check() {
            return Err(StateTransferError::BadBase { seq: claim.seq, why: mismatch.as_str() });
        }
        let base = transferred.base;
        if !self.install_table(&base.clients) {
            // Certified by 2t+1, so only a configuration unlike the cluster's gets here; the
            // table is empty now, as a replica that lost its state has it.
            return Err(StateTransferError::BadBase { seq: claim.seq, why: "deduplication table out of this replica's bounds" });
        }
        if !base.budgets.plausible(&self.rule, self.config.n) {
            return Err(StateTransferError::BadBase { seq: claim.seq, why: "per-origin budget out of this replica's bounds" });
        }
        self.budgets = base.budgets.clone();
        self.proposer_budgets = None;
        self.last_delivered = claim.seq;
        self.last_time = Time(self.last_time.0.max(claim.time.0));
        self.log_digest = claim.log_digest;
        self.checkpoint_times.retain(|seq, _| *seq > claim.seq);
        self.transfer_claims.retain(|c| c.seq > claim.seq);
        let keys: Vec<RequestKey> = self.awaited.keys().copied().collect();
        for key in &keys {
            self.forget_request(key);
        }
        self.clear_fresh();
        self.proposed.clear();
        self.timers.cancel(Timer::Request);
        if self.next_seq <= claim.seq {
            self.next_seq = claim.seq + 1;
        }
        if self.config.persist {
            // What this replica resumes from after a restart is the installed checkpoint (the
            // application's executed position is there now), not the base it had before.
            self.bases = BTreeMap::from([(claim.seq, self.capture_base())]);
            self.snapshot_due = true;
        }
        self.collect_garbage();
        // Later checkpoints may have become stable meanwhile: ask again if still behind them.
        self.check_state_transfer();
        self.after_step();
        Ok(())
    }

    // ----- requests -----

    /// The current view, or the target view while changing.
    fn view(&self) -> u64 {
        self.phase.view()
    }

    /// Whether this replica is the primary of [`Replica::view`] (whether or not it is
    /// installed yet).
    fn is_primary(&self) -> bool {
        self.primary() == self.config.id
    }

    fn primary(&self) -> ReplicaId {
        self.config.primary(self.view())
    }

    /// The primary of an installed view: the one that proposes.
    fn is_proposing(&self) -> bool {
        self.is_primary() && !self.phase.is_changing() && self.phase.withdrawn().is_none()
    }

    fn learn_request(&mut self, request: Request, own: bool) {
        let key = request.key();
        debug_assert!(!self.awaited.contains_key(&key));
        if own {
            self.own_pending += 1;
        } else {
            *self.relayed_bytes.entry(key.origin).or_default() += charge(&request);
        }
        let digest = if own { [0; 32] } else { request_digest(&request) };
        let mut holders = if own { Vec::new() } else { vec![key.origin] };
        if let Some(claims) = self.early_holds.remove(&key) {
            for (claimer, claimed) in claims {
                if !own && claimed == digest {
                    if let Err(position) = holders.binary_search(&claimer) {
                        holders.insert(position, claimer);
                    }
                }
            }
        }
        let awaited = Awaited { request: request.clone(), since: self.now, own, digest, holders };
        let proposable = self.proposable(&awaited);
        self.awaited.insert(key, awaited);
        let changing = self.phase.is_changing();
        if self.is_primary() {
            if !changing && proposable {
                self.push_fresh(key, request.wire_size());
            }
        } else if !own {
            // The primary proposes it once 2f replicas hold it, so that its backups can
            // vouch for it. At once when none went within `batch_delay`, otherwise gathered, so
            // that a burst costs a message per batch's count of requests, not one per request.
            self.holds_out.push((key, digest));
            if !self.timers.is_armed(Timer::Holds) || self.holds_out.len() >= self.config.batch_max_requests {
                self.flush_holds();
                self.timers.arm(Timer::Holds, self.now.plus(self.config.batch_delay));
            }
        } else {
            // Only the origin relays its requests: a relayed request names its sender as origin,
            // so nobody can submit (or burn the numbers of) another replica's clients. To every
            // replica at once: a backup prepares another origin's request only when it holds
            // it from that origin (see `vouched`), so none can be made up by a primary.
            self.broadcast(Message::Request { sender: self.config.id, request });
        }
        // The primary runs the timer too: a primary whose proposals cannot commit (its backups
        // moved to other views) must not wait forever.
        if !changing {
            self.timers.arm_if_idle(Timer::Request, self.now.plus(self.request_timeout()));
        }
    }

    /// Whether a primary may propose this request: its own, or another origin's that 2f
    /// replicas other than the primary hold from the origin. At least f of those are honest
    /// and hold it (f >= 1; with f = 0 nobody lies), so they prepare a batch of such requests and
    /// their f prepares vouch for it at every other backup: a Byzantine origin that gives a
    /// request to the primary alone cannot make an honest primary's batch stall.
    fn proposable(&self, awaited: &Awaited) -> bool {
        awaited.own || awaited.holders.len() >= 2 * usize::from(self.config.f)
    }

    /// `from` holds these requests from their origins (see [`Message::Holds`]): recorded for
    /// requests this replica awaits with the same payload; a request that reaches 2f holders
    /// becomes proposable. Claims of requests this replica does not hold yet are kept until
    /// the request comes (bounded per claimer; the claimer also repeats them every interval
    /// while the request waits).
    fn on_holds(&mut self, from: ReplicaId, requests: Vec<(RequestKey, Digest)>) {
        let proposing = self.is_proposing();
        for (key, digest) in requests {
            let Some(awaited) = self.awaited.get_mut(&key) else {
                if !self.is_delivered(&key) {
                    self.keep_early_holds(from, key, digest);
                }
                continue;
            };
            if awaited.own || awaited.digest != digest {
                continue;
            }
            let Err(position) = awaited.holders.binary_search(&from) else { continue };
            let before = awaited.holders.len() >= 2 * usize::from(self.config.f);
            awaited.holders.insert(position, from);
            let size = awaited.request.wire_size();
            let now = awaited.holders.len() >= 2 * usize::from(self.config.f);
            if proposing && now && !before && !self.proposed.contains(&key) {
                self.push_fresh(key, size);
            }
        }
    }

    /// Keeps `from`'s claim of a request this replica does not hold yet, within
    /// [`EARLY_HOLDS_PER_PEER`] per claimer (a Byzantine claimer only pushes out its own).
    fn keep_early_holds(&mut self, from: ReplicaId, key: RequestKey, digest: Digest) {
        let claims = self.early_holds.entry(key).or_default();
        if claims.iter().any(|(claimer, _)| *claimer == from) {
            return;
        }
        claims.push((from, digest));
        let order = self.early_holds_order.entry(from).or_default();
        order.push_back(key);
        while order.len() > EARLY_HOLDS_PER_PEER {
            let Some(old) = order.pop_front() else { break };
            if let Some(claims) = self.early_holds.get_mut(&old) {
                claims.retain(|(claimer, _)| *claimer != from);
                if claims.is_empty() {
                    self.early_holds.remove(&old);
                }
            }
        }
    }

    /// Sends the gathered `Holds` claims to the primary (dropped while no primary is installed:
    /// after the new view they all go again).
    fn flush_holds(&mut self) {
        self.timers.cancel(Timer::Holds);
        let requests = std::mem::take(&mut self.holds_out);
        if requests.is_empty() || self.is_primary() || self.phase.is_changing() {
            return;
        }
        let primary = self.primary();
        let chunk = self.config.limits().max_entries.max(1);
        for requests in requests.chunks(chunk) {
            self.send(primary, Message::Holds { sender: self.config.id, requests: requests.to_vec() });
        }
    }

    /// Tells the primary which of others' requests this replica holds: all of them after a
    /// new view (`all`), otherwise those waiting longer than an interval (a claim may have been
    /// lost or may have come before the request), bounded per tick.
    fn send_holds(&mut self, all: bool) {
        if all {
            // Everything held goes now; what was gathered is among it.
            self.holds_out.clear();
            self.timers.cancel(Timer::Holds);
        }
        if self.is_primary() {
            return;
        }
        let old = Time(self.now.0.saturating_sub(duration_us(self.config.retransmit_interval)));
        let limit = if all { usize::MAX } else { self.config.batch_max_requests.saturating_mul(FAIR_SCAN) };
        let held: Vec<(RequestKey, Digest)> =
            self.awaited.iter().filter(|(_, a)| !a.own && (all || a.since <= old)).take(limit).map(|(key, a)| (*key, a.digest)).collect();
        let primary = self.primary();
        let chunk = self.config.limits().max_entries.max(1);
        for requests in held.chunks(chunk) {
            self.send(primary, Message::Holds { sender: self.config.id, requests: requests.to_vec() });
        }
    }

    fn forget_request(&mut self, key: &RequestKey) -> bool {
        let Some(awaited) = self.awaited.remove(key) else { return false };
        if awaited.own {
            self.own_pending -= 1;
        } else if let Some(bytes) = self.relayed_bytes.get_mut(&key.origin) {
            *bytes -= charge(&awaited.request);
            if *bytes == 0 {
                self.relayed_bytes.remove(&key.origin);
            }
        }
        true
    }

    fn on_request(&mut self, from: ReplicaId, request: Request) {
        if request.origin != from {
            self.blame(from, "relayed a request of another origin");
            return;
        }
        if request.wire_size() > self.config.max_request_bytes {
            self.blame(from, "request larger than max_request_bytes");
            return;
        }
        let key = request.key();
        if self.is_delivered(&key) || self.awaited.contains_key(&key) {
            return;
        }
        if self.number_jump_too_far(&key) {
            // It would never be delivered; ordering it anyway lets one replica make the
            // cluster order empty batches as fast as it sends (an honest gateway numbers its
            // requests consecutively, so it never gets here, even at a replica far behind).
            self.blame(from, "request number jumps beyond max_number_jump");
            return;
        }
        let held = self.relayed_bytes.get(&from).copied().unwrap_or(0);
        if held.saturating_add(charge(&request)) > self.config.max_pending_bytes_per_origin {
            // Over this origin's budget: dropped, not blamed (an honest origin under load gets
            // here too); it retransmits its requests every interval.
            return;
        }
        self.learn_request(request, false);
        if !self.waiting.is_empty() {
            let seqs: Vec<u64> = self
                .waiting
                .iter()
                .copied()
                .filter(|seq| self.slots.get(seq).and_then(|slot| slot.waiting.as_ref()).is_some_and(|w| w.proposal.requests.iter().any(|r| r.key() == key)))
                .collect();
            for seq in seqs {
                self.recheck_waiting(seq);
            }
        }
    }

    /// A request whose number jumps too far above its client's highest delivered one is not
    /// delivered (see [`Config::max_number_jump`]).
    fn number_jump_too_far(&self, key: &RequestKey) -> bool {
        let high = self.clients.get(&(key.origin, key.client)).map_or(0, |record| record.high);
        key.number > high.saturating_add(self.config.max_number_jump)
    }

    /// Clients remembered per origin: an equal share of `max_clients`.
    fn clients_per_origin_cap(&self) -> usize {
        (self.config.max_clients / usize::from(self.config.n.max(1))).max(1)
    }

    fn is_delivered(&self, key: &RequestKey) -> bool {
        match self.clients.get(&(key.origin, key.client)) {
            None => false,
            Some(record) if key.number > record.high => false,
            Some(record) => {
                let behind = record.high - key.number;
                behind >= DEDUP_WINDOW || record.mask & (1u128 << behind) != 0
            }
        }
    }

    /// Marks a request delivered; returns false when it already was.
    fn mark_delivered(&mut self, key: &RequestKey, seq: u64) -> bool {
        if self.is_delivered(key) {
            return false;
        }
        let client = (key.origin, key.client);
        let record = match self.clients.get(&client) {
            Some(record) => {
                self.clients_by_age.remove(&(key.origin, record.last_seq, key.client));
                let mut record = *record;
                if key.number > record.high {
                    let shift = key.number - record.high;
                    record.mask = if shift >= 128 { 0 } else { record.mask << shift };
                    record.high = key.number;
                    record.mask |= 1;
                } else {
                    record.mask |= 1u128 << (record.high - key.number);
                }
                record.last_seq = seq;
                record
            }
            None => {
                *self.clients_per_origin.entry(key.origin).or_default() += 1;
                ClientRecord { high: key.number, mask: 1, last_seq: seq }
            }
        };
        self.clients.insert(client, record);
        self.clients_by_age.insert((key.origin, seq, key.client));
        let cap = self.clients_per_origin_cap();
        // Bounded: each pass forgets one pair of this origin.
        while self.clients_per_origin.get(&key.origin).is_some_and(|count| *count > cap) {
            let Some((origin, oldest, client)) = self.clients_by_age.range((key.origin, 0, 0)..=(key.origin, u64::MAX, u64::MAX)).next().copied() else {
                break;
            };
            self.clients_by_age.remove(&(origin, oldest, client));
            self.clients.remove(&(origin, client));
            if let Some(count) = self.clients_per_origin.get_mut(&origin) {
                *count -= 1;
            }
        }
        true
    }

    // ----- normal case -----

    /// Re-derives [`Timer::Batch`] from the queue and the clock, after anything that may
    /// have moved it.
    fn arm_batch_timer(&mut self) {
        let at = self.batch_deadline();
        self.timers.set(Timer::Batch, at);
    }

    fn batch_deadline(&self) -> Option<Time> {
        if !self.is_proposing() || self.next_seq > self.high_watermark() {
            return None;
        }
        let current = self.proposer_budgets.as_ref().is_some_and(|(view, seq, _)| (*view, *seq) == (self.view(), self.next_seq));
        if self.rule.enabled() && !current {
            // Behind the batches before its next seq (see `refresh_proposer_budgets`): nothing
            // goes until it catches up, which an input brings, so no deadline (a past one would
            // fire at once, again and again).
            return None;
        }
        let unpark = self.unpark_deadline();
        let first = self.fresh.iter().find(|(key, _)| self.awaited.contains_key(key) && !self.proposed.contains(key));
        let batch = first.and_then(|(key, _)| self.awaited.get(key)).map(|a| a.since.plus(self.config.batch_delay));
        match (batch, unpark) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Low water mark: the stable checkpoint, or the current view's starting checkpoint when
    /// that is later (vouched for by f+1 replicas, but not yet stable here).
    fn low_watermark(&self) -> u64 {
        self.stable.seq.max(self.view_anchor.seq)
    }

    fn high_watermark(&self) -> u64 {
        self.low_watermark().saturating_add(self.config.watermark_window)
    }

    fn try_propose(&mut self) {
        if !self.is_proposing() || !self.refresh_proposer_budgets() {
            return;
        }
        self.unpark();
        // Bounded by the window: each round assigns one sequence number.
        while self.next_seq <= self.high_watermark() {
            while let Some((key, _)) = self.fresh.front() {
                if self.awaited.contains_key(key) && !self.proposed.contains(key) {
                    break;
                }
                self.pop_fresh();
            }
            let Some(first) = self.fresh.front().and_then(|(key, _)| self.awaited.get(key)) else { return };
            let waited_enough = first.since.plus(self.config.batch_delay) <= self.now;
            let idle = self.next_seq <= self.last_delivered.saturating_add(1);
            // Upper bounds (stale entries count until popped): at worst a batch goes a little early.
            let (count, bytes) = (self.fresh.len(), self.fresh_bytes);
            let full = count >= self.config.batch_max_requests || bytes >= self.config.batch_max_bytes;
            if !(full || waited_enough || idle) {
                return;
            }
            if !self.propose_batch() {
                // Everything at the head belonged to origins over their rate (now parked).
                if self.fresh.is_empty() {
                    return;
                }
            }
        }
    }

    fn push_fresh(&mut self, key: RequestKey, size: usize) {
        if let Some(parked) = self.parked.get_mut(&key.origin) {
            parked.push_back((key, size));
            return;
        }
        self.fresh.push_back((key, size));
        self.fresh_bytes += size;
    }

    /// Size of the per-origin token bucket.
    fn origin_bucket(&self) -> i64 {
        self.rule.bucket()
    }

    /// The per-origin budget after the batches below `upto` that this replica knows, in
    /// sequence order: the delivered state, then each later slot's committed batch or the one
    /// it accepted in the current view. Slots it knows neither of are left out, which is never
    /// stricter (see [`OriginBudgets::apply`]): an honest primary, which knows every batch it
    /// proposed, checks at least as strictly as any backup.
    ///
    /// Also says whether it knew every one of those batches.
    fn projected_budgets(&self, upto: u64) -> (OriginBudgets, bool) {
        let mut budgets = self.budgets.clone();
        if !self.rule.enabled() {
            return (budgets, true);
        }
        let view = self.phase.ordering_view();
        let mut known = 0u64;
        let from = self.last_delivered.saturating_add(1);
        // Bounded by the window.
        for (_, slot) in self.slots.range(from..upto.max(from)) {
            let committed = slot.committed.as_ref().map(|(_, proposal)| proposal);
            let accepted = || slot.accepted.as_ref().filter(|a| Some(a.view) == view).map(|a| &a.proposal);
            if let Some(proposal) = committed.or_else(accepted) {
                budgets.apply(&self.rule, proposal);
                known += 1;
            }
        }
        (budgets, known == upto.saturating_sub(from))
    }

    /// Makes [`Replica::proposer_budgets`] the budget after this primary's last proposal;
    /// false (and none) while it does not know every batch before its next seq (a new primary
    /// behind its view's starting checkpoint): it would check more leniently than its backups,
    /// so it proposes nothing until it has caught up.
    fn refresh_proposer_budgets(&mut self) -> bool {
        if !self.is_proposing() {
            self.proposer_budgets = None;
            return false;
        }
        let key = (self.view(), self.next_seq);
        if self.proposer_budgets.as_ref().is_some_and(|(view, seq, _)| (*view, *seq) == key) {
            return true;
        }
        let (budgets, complete) = self.projected_budgets(self.next_seq);
        self.proposer_budgets = complete.then_some((key.0, key.1, budgets));
        complete
    }

    /// `origin`'s balance now, by the budget after this primary's last proposal.
    fn origin_balance(&self, origin: ReplicaId) -> i64 {
        match &self.proposer_budgets {
            Some((view, seq, budgets)) if (*view, *seq) == (self.view(), self.next_seq) => budgets.balance_at(&self.rule, origin, self.now),
            _ => self.projected_budgets(self.next_seq).0.balance_at(&self.rule, origin, self.now),
        }
    }

    /// Moves `origin`'s fresh requests aside until its balance recovers.
    fn park(&mut self, origin: ReplicaId) {
        let mut parked = VecDeque::new();
        let mut kept = VecDeque::with_capacity(self.fresh.len());
        for (key, size) in self.fresh.drain(..) {
            if key.origin == origin {
                self.fresh_bytes -= size;
                parked.push_back((key, size));
            } else {
                kept.push_back((key, size));
            }
        }
        self.fresh = kept;
        self.parked.insert(origin, parked);
    }

    /// Puts back the parked requests of origins whose balance is back to half the bucket.
    fn unpark(&mut self) {
        self.refresh_proposer_budgets();
        let half = self.origin_bucket() / 2;
        let ready: Vec<ReplicaId> = self.parked.keys().copied().filter(|o| self.origin_balance(*o) >= half).collect();
        for origin in ready {
            for (key, size) in self.parked.remove(&origin).unwrap_or_default() {
                self.push_fresh(key, size);
            }
        }
    }

    /// When the first parked origin's balance is back to half the bucket.
    fn unpark_deadline(&self) -> Option<Time> {
        let half = self.origin_bucket() / 2;
        self.parked.keys().map(|origin| Time(self.now.0.saturating_add(self.rule.refill_us(self.origin_balance(*origin), half)))).min()
    }

    fn pop_fresh(&mut self) {
        if let Some((_, size)) = self.fresh.pop_front() {
            self.fresh_bytes -= size;
        }
    }

    fn clear_fresh(&mut self) {
        self.fresh.clear();
        self.fresh_bytes = 0;
        self.parked.clear();
    }

    /// Proposes one batch; false when nothing could go (origins over their rate are parked).
    /// Each request is taken by the per-origin budget rule the backups check
    /// ([`crate::budget`]), from the budget after this primary's last proposal refilled to the
    /// new batch's time, in the order it goes into the batch.
    fn propose_batch(&mut self) -> bool {
        self.refresh_proposer_budgets();
        let rule = self.rule;
        let time = Time(self.now.0.max(self.last_proposed_time.0.saturating_add(1)).max(self.last_time.0.saturating_add(1)));
        let mut budgets = self.proposer_budgets.as_ref().map(|(_, _, budgets)| budgets.clone()).unwrap_or_default();
        budgets.advance(&rule, time);
        // Fair among origins (Aardvark's lesson): within the first entries of the queue, each
        // origin with a request there gets an equal share of the batch's bytes and count (at
        // least one request), so one origin flooding large requests cannot crowd out the
        // others' clients. Entries left over stay queued, in order, for the next batch.
        let scan = self.config.batch_max_requests.saturating_mul(FAIR_SCAN);
        let eligible = |key: &RequestKey| self.awaited.contains_key(key) && !self.proposed.contains(key);
        let origins: BTreeSet<ReplicaId> = self.fresh.iter().take(scan).filter(|(key, _)| eligible(key)).map(|(key, _)| key.origin).collect();
        let shares = origins.len().max(1);
        let byte_share = (self.config.batch_max_bytes / shares).max(1);
        let count_share = (self.config.batch_max_requests / shares).max(1);
        let mut taken: BTreeMap<ReplicaId, (usize, usize)> = BTreeMap::new();
        let mut requests = Vec::new();
        let mut bytes = 0usize;
        let mut chosen = Vec::new();
        let mut over: BTreeSet<ReplicaId> = BTreeSet::new();
        // Replicas that hold every other origin's request taken so far: 2f of them must remain,
        // so that f honest backups can prepare the whole batch (see `proposable`).
        let mut common: Option<Vec<ReplicaId>> = None;
        let needed = 2 * usize::from(self.config.f);
        for (key, _) in self.fresh.iter().take(scan) {
            if requests.len() >= self.config.batch_max_requests {
                break;
            }
            let Some(awaited) = self.awaited.get(key).filter(|_| !self.proposed.contains(key)) else { continue };
            if over.contains(&key.origin) {
                continue;
            }
            // Over its budget once this batch's share is counted: the rest of its requests wait.
            if rule.enabled() && budgets.balance(&rule, key.origin) <= 0 {
                over.insert(key.origin);
                continue;
            }
            let size = awaited.request.wire_size();
            if !requests.is_empty() && bytes + size > self.config.batch_max_bytes {
                break;
            }
            let narrowed = if awaited.own {
                None
            } else {
                let narrowed: Vec<ReplicaId> = match &common {
                    None => awaited.holders.clone(),
                    Some(common) => common.iter().copied().filter(|r| awaited.holders.binary_search(r).is_ok()).collect(),
                };
                if narrowed.len() < needed {
                    continue;
                }
                Some(narrowed)
            };
            let (origin_bytes, origin_count) = taken.entry(key.origin).or_default();
            if *origin_count > 0 && (*origin_bytes + size > byte_share || *origin_count >= count_share) {
                continue;
            }
            if narrowed.is_some() {
                common = narrowed;
            }
            *origin_bytes += size;
            *origin_count += 1;
            if rule.enabled() {
                budgets.take(&rule, &awaited.request);
            }
            bytes += size;
            requests.push(awaited.request.clone());
            chosen.push(*key);
        }
        self.proposed.extend(chosen);
        for origin in over {
            self.park(origin);
        }
        while let Some((key, _)) = self.fresh.front() {
            if self.awaited.contains_key(key) && !self.proposed.contains(key) {
                break;
            }
            self.pop_fresh();
        }
        if requests.is_empty() {
            return false;
        }
        self.last_proposed_time = time;
        let proposal = Proposal { time, requests };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.proposer_budgets = Some((self.view(), self.next_seq, budgets));
        let digest = proposal.digest(seq);
        self.broadcast(Message::PrePrepare { sender: self.config.id, view: self.view(), seq, proposal: proposal.clone() });
        self.accept_pre_prepare(seq, digest, proposal);
        true
    }

    fn in_window(&self, seq: u64) -> bool {
        seq > self.low_watermark() && seq <= self.high_watermark()
    }

    fn on_pre_prepare(&mut self, from: ReplicaId, view: u64, seq: u64, proposal: Proposal) {
        if self.phase.ordering_view() != Some(view) || !self.in_window(seq) {
            return;
        }
        if from != self.primary() {
            self.blame(from, "pre-prepare from a backup");
            return;
        }
        if !self.proposal_fits(&proposal) {
            self.blame(from, "proposal over the batch limits");
            return;
        }
        let digest = proposal.digest(seq);
        let slot = self.slots.get(&seq);
        let held = slot.and_then(|slot| [&slot.accepted, &slot.waiting, &slot.unvoted].into_iter().flatten().find(|a| a.view == view));
        if let Some(held) = held {
            if held.digest != digest {
                self.blame(from, "two pre-prepares for one seq and view");
            }
            // A waiting one is checked again when what could vouch for it arrives.
            return;
        }
        if proposal.is_null() {
            return;
        }
        if self.phase.withdrawn().is_some() || !self.time_acceptable(seq, proposal.time) {
            // This replica does not help certify it (a time it cannot vouch for, or a view it
            // withdrew from), but 2f+1 commits certify it without us: keep it to deliver then.
            let slot = self.slots.entry(seq).or_default();
            slot.unvoted = Some(Accepted { view, digest, proposal, at: self.now });
            self.check_committed(seq);
            return;
        }
        // A seq this replica delivered already (fetched) is decided: its state includes it.
        let over = if seq > self.last_delivered { self.projected_budgets(seq).0.apply(&self.rule, &proposal) } else { None };
        if let Some(origin) = over {
            // It carries more of `origin`'s requests than the log's budget allows. An honest
            // primary proposes by the same rule from every batch before this one, and this
            // replica knows a subset of those (never stricter), so the primary broke it: refuse,
            // blame, and suspect it (the request timer, so that a backup that missed what its
            // peers committed catches up rather than changing views alone).
            debug_assert!(origin < self.config.n);
            self.blame(from, "batch over the origin budget");
            self.timers.arm_if_idle(Timer::Request, self.now.plus(self.request_timeout()));
            return;
        }
        if !self.vouched(seq, view, &digest, &proposal) {
            // Some request in it is not known to come from its origin (yet): the origin sends
            // its requests to everyone at once, so it normally arrives soon. Until then the
            // batch waits, under the request timer, so a primary that made a request up is
            // replaced by a view change.
            let slot = self.slots.entry(seq).or_default();
            slot.waiting = Some(Accepted { view, digest, proposal, at: self.now });
            self.waiting.insert(seq);
            self.timers.arm_if_idle(Timer::Request, self.now.plus(self.request_timeout()));
            return;
        }
        self.accept_pre_prepare(seq, digest, proposal);
    }

    /// Whether this backup may prepare the pre-prepare `digest` at `seq` in `view`: every
    /// request in it is known to come from its origin, or f+1 replicas vouch for the whole
    /// batch (the primary by its pre-prepare plus f backups by a matching prepare; one of
    /// them is honest and prepared only what it checked). A request is known to come from its
    /// origin when the origin is the primary (the pre-prepare came from it over the
    /// authenticated link), when this replica holds the same request (key and payload)
    /// received from its origin directly or submitted by its own client, or when its key is
    /// already delivered (delivering it again is skipped, so it carries nothing).
    fn vouched(&self, seq: u64, view: u64, digest: &Digest, proposal: &Proposal) -> bool {
        let primary = self.primary();
        let claims =
            self.slots.get(&seq).map_or(0, |slot| slot.prepares.iter().filter(|(replica, vote)| **replica != primary && **vote == (view, *digest)).count());
        if claims >= usize::from(self.config.f) {
            return true;
        }
        proposal.requests.iter().all(|request| {
            request.origin == primary
                || self.awaited.get(&request.key()).is_some_and(|awaited| awaited.request == *request)
                || self.is_delivered(&request.key())
        })
    }

    /// Accepts the waiting pre-prepare at `seq` if it is vouched for now (see
    /// [`Replica::vouched`]); drops it if its view is over.
    fn recheck_waiting(&mut self, seq: u64) {
        let current = self.phase.ordering_view();
        let Some(waiting) = self.slots.get(&seq).and_then(|slot| slot.waiting.as_ref()) else {
            self.waiting.remove(&seq);
            return;
        };
        let live = current == Some(waiting.view) && self.in_window(seq);
        if live && !self.vouched(seq, waiting.view, &waiting.digest, &waiting.proposal) {
            return;
        }
        self.waiting.remove(&seq);
        let Some(waiting) = self.slots.get_mut(&seq).and_then(|slot| slot.waiting.take()) else { return };
        if live {
            self.accept_pre_prepare(seq, waiting.digest, waiting.proposal);
        }
    }

    /// Checks every waiting pre-prepare again (bounded by the window).
    fn recheck_all_waiting(&mut self) {
        let seqs: Vec<u64> = self.waiting.iter().copied().collect();
        for seq in seqs {
            self.recheck_waiting(seq);
        }
    }

    /// Forgets every waiting pre-prepare (the view they belong to is over).
    fn drop_waiting(&mut self) {
        for seq in std::mem::take(&mut self.waiting) {
            if let Some(slot) = self.slots.get_mut(&seq) {
                slot.waiting = None;
            }
        }
    }

    /// The primary's time must be near our clock and between its neighbours' times.
    fn time_acceptable(&self, seq: u64, time: Time) -> bool {
        if time.distance_us(self.now) > duration_us(self.config.max_clock_skew) {
            return false;
        }
        let known_time = |slot: &Slot| -> Option<Time> {
            if let Some((_, proposal)) = &slot.committed {
                if !proposal.is_null() {
                    return Some(proposal.time);
                }
            }
            match &slot.accepted {
                Some(accepted) if accepted.view == self.view() && !accepted.proposal.is_null() => Some(accepted.proposal.time),
                _ => None,
            }
        };
        let mut lower = if seq > self.last_delivered { self.last_time } else { Time(0) };
        let first_undelivered = self.last_delivered.saturating_add(1);
        if first_undelivered < seq {
            if let Some(time) = self.slots.range(first_undelivered..seq).rev().find_map(|(_, slot)| known_time(slot)) {
                lower = lower.max(time);
            }
        }
        if time <= lower {
            return false;
        }
        let upper = self.slots.range(seq.saturating_add(1)..).find_map(|(_, slot)| known_time(slot));
        upper.is_none_or(|upper| time < upper)
    }

    fn accept_pre_prepare(&mut self, seq: u64, digest: Digest, proposal: Proposal) {
        let view = self.view();
        let primary = self.is_primary();
        for request in &proposal.requests {
            self.proposed.insert(request.key());
        }
        self.waiting.remove(&seq);
        let slot = self.slots.entry(seq).or_default();
        slot.waiting = None;
        match slot.pre_prepared.iter_mut().find(|(d, _)| *d == digest) {
            Some(entry) => entry.1 = entry.1.max(view),
            None => {
                slot.pre_prepared.push((digest, view));
                if slot.pre_prepared.len() > PRE_PREPARED_PER_SEQ {
                    slot.pre_prepared.sort_by_key(|entry| std::cmp::Reverse(entry.1));
                    slot.pre_prepared.truncate(PRE_PREPARED_PER_SEQ);
                }
            }
        }
        slot.accepted = Some(Accepted { view, digest, proposal, at: self.now });
        self.mark_slot(seq);
        let Some(slot) = self.slots.get_mut(&seq) else { return };
        if !primary {
            slot.prepares.insert(self.config.id, (view, digest));
            self.broadcast(Message::Prepare { sender: self.config.id, view, seq, digest });
        }
        self.check_prepared(seq);
    }

    fn on_prepare(&mut self, from: ReplicaId, view: u64, seq: u64, digest: Digest) {
        if self.phase.ordering_view() != Some(view) || !self.in_window(seq) {
            return;
        }
        if from == self.primary() {
            self.blame(from, "prepare from the primary");
            return;
        }
        if !self.record_vote_in_slot(from, view, seq, digest, true) {
            return;
        }
        if self.waiting.contains(&seq) {
            self.recheck_waiting(seq);
        }
        self.check_prepared(seq);
    }

    fn on_commit(&mut self, from: ReplicaId, view: u64, seq: u64, digest: Digest) {
        if self.phase.ordering_view() != Some(view) || !self.in_window(seq) {
            return;
        }
        if !self.record_vote_in_slot(from, view, seq, digest, false) {
            return;
        }
        self.check_committed(seq);
    }

    /// Stores a prepare or commit; a second, different one in the same view is misbehaviour.
    fn record_vote_in_slot(&mut self, from: ReplicaId, view: u64, seq: u64, digest: Digest, prepare: bool) -> bool {
        let slot = self.slots.entry(seq).or_default();
        let votes = if prepare { &mut slot.prepares } else { &mut slot.commits };
        match votes.get(&from) {
            Some((old_view, old_digest)) if *old_view == view => {
                if *old_digest != digest {
                    self.blame(from, "two prepares or commits for one seq and view");
                }
                false
            }
            Some((old_view, _)) if *old_view > view => false,
            _ => {
                votes.insert(from, (view, digest));
                true
            }
        }
    }

    fn check_prepared(&mut self, seq: u64) {
        let view = self.view();
        let primary = self.primary();
        if self.primary_equivocated(seq) {
            self.blame(primary, "equivocating pre-prepares");
        }
        if self.phase.withdrawn().is_some() {
            // A prepared certificate now would be missing from the view change it sent.
            self.check_committed(seq);
            return;
        }
        let needed = self.config.quorum() - 1;
        let Some(slot) = self.slots.get_mut(&seq) else { return };
        let Some(accepted) = slot.accepted.clone() else { return };
        if accepted.view != view {
            return;
        }
        let matching = slot.prepares.iter().filter(|(replica, vote)| **replica != primary && **vote == (view, accepted.digest)).count();
        if matching < needed {
            return;
        }
        // Only a change of the slot's durable part is persisted: the prepares that keep
        // arriving after the quorum would otherwise cost an fsync each.
        let mut changed = false;
        if slot.prepared.as_ref().is_none_or(|prepared| prepared.view < view) {
            slot.prepared = Some(accepted.clone());
            changed = true;
        }
        if slot.sent_commit_view != Some(view) {
            slot.sent_commit_view = Some(view);
            slot.commits.insert(self.config.id, (view, accepted.digest));
            changed = true;
            self.commit_high = self.commit_high.max(seq);
            self.broadcast(Message::Commit { sender: self.config.id, view, seq, digest: accepted.digest });
        }
        if changed {
            self.mark_slot(seq);
        }
        self.check_committed(seq);
    }

    /// Whether f+1 backups prepared, in this view, a digest other than the pre-prepare this
    /// replica accepted for `seq`: at least one of them is honest and prepared only what the
    /// primary sent it, so the primary sent two pre-prepares (true once per slot and view).
    fn primary_equivocated(&mut self, seq: u64) -> bool {
        let (view, primary, f) = (self.view(), self.primary(), usize::from(self.config.f));
        let Some(slot) = self.slots.get_mut(&seq) else { return false };
        let Some(accepted) = slot.accepted.as_ref().filter(|a| a.view == view) else { return false };
        if slot.equivocation_blamed == Some(view) {
            return false;
        }
        let mut others: BTreeMap<Digest, usize> = BTreeMap::new();
        for (replica, (v, digest)) in &slot.prepares {
            if *replica != primary && *v == view && *digest != accepted.digest {
                *others.entry(*digest).or_default() += 1;
            }
        }
        let equivocated = others.values().any(|&count| count > f);
        if equivocated {
            slot.equivocation_blamed = Some(view);
        }
        equivocated
    }

    /// Commits `seq` locally once 2f+1 replicas committed, in this view, the batch this
    /// replica prepared, accepted, or keeps unvoted: a commit comes only from a replica that holds
    /// a prepared certificate, so f+1 honest replicas prepared it and no other batch can
    /// commit at `seq` in any view (the argument is in docs/DETERMINISM.md, "Clock skew and
    /// unvoted batches").
    fn check_committed(&mut self, seq: u64) {
        let view = self.view();
        let quorum = self.config.quorum();
        let Some(slot) = self.slots.get_mut(&seq) else { return };
        if slot.committed.is_some() {
            return;
        }
        // One digest per view among them (a second pre-prepare for the seq and view is refused).
        let Some(held) = [&slot.prepared, &slot.accepted, &slot.unvoted].into_iter().flatten().find(|held| held.view == view) else { return };
        let matching = slot.commits.values().filter(|vote| **vote == (view, held.digest)).count();
        if matching >= quorum {
            slot.committed = Some((held.digest, held.proposal.clone()));
            slot.unvoted = None;
            self.mark_slot(seq);
        }
    }

    fn try_deliver(&mut self) {
        // Bounded: at most one window of committed slots can be waiting.
        loop {
            let seq = self.last_delivered + 1;
            let Some((digest, proposal)) = self.slots.get(&seq).and_then(|slot| slot.committed.clone()) else { return };
            self.deliver(seq, digest, proposal);
        }
    }

    fn deliver(&mut self, seq: u64, digest: Digest, proposal: Proposal) {
        debug_assert_eq!(seq, self.last_delivered + 1);
        debug_assert_eq!(digest, proposal.digest(seq));
        self.log_digest = chain(self.log_digest, seq, &digest);
        let time = Time(proposal.time.0.max(self.last_time.0.saturating_add(1)));
        let mut requests = Vec::with_capacity(proposal.requests.len());
        let mut progressed = false;
        let view_began = match self.phase {
            Phase::Normal { began, .. } => Some(began),
            Phase::ViewChanging { .. } => None,
        };
        // Decays only with a batch that says how long an awaited request took: batches of
        // requests this replica never awaited (a primary's own, which its backups learn from
        // the pre-prepare) are fast and say nothing about other origins' requests, which wait
        // for 2f holders first; decaying with them brought the timeout back to its floor
        // between two such requests (issue 30, docs/LATENCY.md "Found while measuring").
        let mut decayed = false;
        for request in &proposal.requests {
            let key = request.key();
            if let Some(since) = self.awaited.get(&key).map(|awaited| awaited.since) {
                if view_began.is_some_and(|began| since >= began) {
                    if !decayed {
                        self.order_latency_us -= self.order_latency_us / LATENCY_DECAY;
                        decayed = true;
                    }
                    self.order_latency_us = self.order_latency_us.max(self.now.0.saturating_sub(since.0));
                }
            }
            if self.forget_request(&key) {
                progressed = true;
            }
            if self.number_jump_too_far(&key) {
                continue;
            }
            if self.mark_delivered(&key, seq) {
                requests.push(request.clone());
            }
        }
        // Charged whether or not a request is delivered: the rule is about what the log carries.
        self.budgets.apply(&self.rule, &proposal);
        self.last_delivered = seq;
        self.last_time = time;
        self.retained.insert(seq, proposal);
        let checkpoint_due = seq % self.config.checkpoint_interval == 0;
        let base = checkpoint_due.then(|| self.capture_base());
        if let Some(base) = base.as_ref().filter(|_| seq > self.stable.seq) {
            self.checkpoint_times.insert(seq, (time, self.log_digest, table_digest(&base.clients, &base.budgets)));
        }
        if let Some(base) = base.as_ref().filter(|_| self.config.persist) {
            self.bases.insert(seq, base.clone());
            // Caught up to a checkpoint already stable: the durable base can move up.
            self.snapshot_due |= seq <= self.stable.seq;
        }
        let changing = self.phase.is_changing();
        if progressed {
            self.timers.cancel(Timer::Request);
            if !changing {
                self.suspicions = 0;
            }
        }
        if (!self.awaited.is_empty() || !self.waiting.is_empty()) && !changing {
            self.timers.arm_if_idle(Timer::Request, self.now.plus(self.request_timeout()));
        }
        self.actions.push_back(Action::Deliver(Batch { seq, view: self.view(), time, requests, checkpoint_due, base }));
        self.collect_garbage();
    }

    // ----- checkpoints and garbage collection -----

    fn on_checkpoint(&mut self, from: ReplicaId, claim: CheckpointClaim) {
        if claim.seq == 0 || claim.seq % self.config.checkpoint_interval != 0 {
            self.blame(from, "checkpoint off the interval");
            return;
        }
        if claim.seq <= self.stable.seq {
            return;
        }
        self.record_vote(from, claim);
        self.check_stable();
    }

    fn record_vote(&mut self, from: ReplicaId, claim: CheckpointClaim) {
        let votes = self.checkpoint_votes.entry(from).or_default();
        if let Some(existing) = votes.iter().find(|vote| vote.seq == claim.seq) {
            if *existing != claim {
                self.blame(from, "conflicting checkpoint");
            }
            return;
        }
        votes.push(claim);
        votes.sort_by_key(|vote| vote.seq);
        if votes.len() > VOTES_PER_PEER {
            votes.remove(0);
        }
    }

    fn check_stable(&mut self) {
        let quorum = self.config.quorum();
        let mut counts: BTreeMap<CheckpointClaim, usize> = BTreeMap::new();
        for votes in self.checkpoint_votes.values() {
            for vote in votes {
                *counts.entry(*vote).or_default() += 1;
            }
        }
        let best = counts.into_iter().filter(|(_, count)| *count >= quorum).map(|(claim, _)| claim).max_by_key(|c| c.seq);
        if let Some(claim) = best {
            if claim.seq > self.stable.seq {
                self.stable_voters = self.checkpoint_votes.iter().filter(|(_, votes)| votes.contains(&claim)).map(|(id, _)| *id).collect();
                self.advance_stable(claim);
            }
        }
    }

    fn advance_stable(&mut self, claim: CheckpointClaim) {
        debug_assert!(claim.seq > self.stable.seq);
        self.stable = claim;
        self.snapshot_due = self.config.persist;
        for votes in self.checkpoint_votes.values_mut() {
            votes.retain(|vote| vote.seq > claim.seq);
        }
        self.own_checkpoints.retain(|seq, _| *seq > claim.seq);
        self.checkpoint_times.retain(|seq, _| *seq > claim.seq);
        self.try_anchored_fetch();
        if self.next_seq <= claim.seq {
            self.next_seq = claim.seq + 1;
        }
        self.collect_garbage();
    }

    fn collect_garbage(&mut self) {
        let keep_above = self.stable.seq.min(self.last_delivered);
        while self.slots.first_key_value().is_some_and(|(seq, _)| *seq <= keep_above) {
            self.slots.pop_first();
        }
        while self.waiting.first().is_some_and(|seq| *seq <= keep_above) {
            self.waiting.pop_first();
        }
        let mut retain_above = self.stable.seq.min(self.last_delivered).saturating_sub(self.config.retained_batches);
        if let Some(durable) = self.bases.keys().next() {
            // A restart delivers again from the durable base.
            retain_above = retain_above.min(*durable);
        }
        while self.retained.first_key_value().is_some_and(|(seq, _)| *seq <= retain_above) {
            self.retained.pop_first();
        }
    }

    // ----- status, retransmission and fetching -----

    fn tick(&mut self) {
        let report = self.report();
        self.broadcast(Message::Status(report));
        match &self.phase {
            Phase::ViewChanging { own, .. } => {
                let view_change = own.clone();
                self.broadcast(Message::ViewChange(view_change));
            }
            Phase::Normal { withdrawn: Some(_), .. } => {}
            Phase::Normal { withdrawn: None, .. } => {
                // What could vouch for a waiting pre-prepare may have come another way (a
                // delivery made its requests old news).
                self.recheck_all_waiting();
                self.retransmit_slots();
            }
        }
        self.try_rejoin();
        if let Some(claim) = self.own_checkpoints.values().next_back().copied() {
            self.broadcast(Message::Checkpoint { sender: self.config.id, checkpoint: claim });
        } else if self.stable.seq > 0 {
            // An idle cluster sends no new checkpoints: a replica that restarted or missed
            // them learns the stable one this way (certified by a quorum, so repeating it
            // vouches for nothing new), and with it that it needs state transfer.
            self.broadcast(Message::Checkpoint { sender: self.config.id, checkpoint: self.stable });
        }
        self.retransmit_requests();
    }

    fn report(&self) -> StatusReport {
        StatusReport {
            sender: self.config.id,
            view: self.view(),
            view_changing: self.phase.is_changing(),
            last_delivered: self.last_delivered,
            stable_seq: self.stable.seq,
            oldest_retained: self.retained.keys().next().copied().unwrap_or(self.last_delivered + 1),
        }
    }

    fn retransmit_slots(&mut self) {
        let view = self.view();
        let id = self.config.id;
        let primary = self.is_primary();
        let old = Time(self.now.0.saturating_sub(duration_us(self.config.retransmit_interval)));
        let mut messages = Vec::new();
        // Only slots stuck for a whole interval, and a bounded number of them per tick.
        let stuck = self
            .slots
            .range(self.last_delivered.saturating_add(1)..)
            .filter(|(_, slot)| slot.accepted.as_ref().is_some_and(|a| a.view == view))
            .take(RETRANSMIT_SLOTS);
        for (seq, slot) in stuck {
            let Some(accepted) = slot.accepted.as_ref().filter(|a| a.view == view && a.at <= old) else { continue };
            if primary {
                messages.push(Message::PrePrepare { sender: id, view, seq: *seq, proposal: accepted.proposal.clone() });
            } else {
                messages.push(Message::Prepare { sender: id, view, seq: *seq, digest: accepted.digest });
            }
            if slot.sent_commit_view == Some(view) {
                messages.push(Message::Commit { sender: id, view, seq: *seq, digest: accepted.digest });
            }
        }
        for message in messages {
            self.broadcast(message);
        }
    }

    fn retransmit_requests(&mut self) {
        if self.is_proposing() {
            return;
        }
        self.relay_own_requests(false);
        if !self.phase.is_changing() {
            self.send_holds(false);
        }
    }

    /// Own requests only, to everyone: backups then know them too and suspect a primary that
    /// does not order them. Others' requests are never relayed (their origin retransmits).
    /// `fresh`: those younger than a retransmit interval, which the periodic retransmission
    /// has not sent to everyone yet; otherwise the older ones.
    fn relay_own_requests(&mut self, fresh: bool) {
        let old = Time(self.now.0.saturating_sub(duration_us(self.config.retransmit_interval)));
        let stale: Vec<Request> = self
            .awaited
            .values()
            .filter(|awaited| awaited.own && (awaited.since <= old) != fresh)
            .take(self.config.batch_max_requests)
            .map(|awaited| awaited.request.clone())
            .collect();
        for request in stale {
            self.broadcast(Message::Request { sender: self.config.id, request });
        }
    }

    fn on_status(&mut self, from: ReplicaId, report: StatusReport) {
        // An honest replica is never changing views in view 0 (the first view change targets
        // view 1), and its stable checkpoint is always on the interval: such a report is its
        // sender's lie whatever the network reordered. Ignored, so it makes us send nothing.
        if (report.view == 0 && report.view_changing) || report.stable_seq % self.config.checkpoint_interval != 0 {
            self.blame(from, "impossible status report");
            return;
        }
        // What a status report makes us send is rate-limited per peer: at most one answer per
        // half retransmit interval (honest peers report once per interval), bounded in bytes.
        let half = std::time::Duration::from_micros(duration_us(self.config.retransmit_interval) / 2);
        let may_answer = self.last_push.get(&from).is_none_or(|last| last.plus(half) <= self.now);
        let mut answered = false;
        if may_answer && report.last_delivered < self.last_delivered {
            let first = report.last_delivered + 1;
            let last = self.last_delivered.min(report.last_delivered.saturating_add(PUSH_BURST));
            let budget = self.config.batch_max_bytes.saturating_mul(PUSH_BATCHES_OF_BYTES);
            let mut bytes = 0usize;
            let mut pushes = Vec::new();
            for (seq, proposal) in self.retained.range(first..=last) {
                let size = proposal_bytes(proposal);
                if !pushes.is_empty() && bytes.saturating_add(size) > budget {
                    break;
                }
                bytes = bytes.saturating_add(size);
                pushes.push(Message::Committed { sender: self.config.id, seq: *seq, proposal: proposal.clone() });
            }
            answered |= !pushes.is_empty();
            for message in pushes {
                self.send(from, message);
            }
        }
        if let Phase::Normal { view, new_view: Some(new_view), .. } = &self.phase {
            if may_answer && (report.view < *view || (report.view == *view && report.view_changing)) {
                let new_view = new_view.clone();
                answered = true;
                self.send(from, Message::NewView { sender: self.config.id, new_view });
            }
        }
        if answered {
            self.last_push.insert(from, self.now);
        }
        self.peer_status.insert(from, (report, self.now));
        self.check_state_transfer();
        self.try_rejoin();
    }

    /// Takes the time of an input; a jump of several retransmit intervals (the process was
    /// stopped, or the host slept) makes the peers' reports stale.
    fn observe(&mut self, now: Time) {
        let pause = duration_us(self.config.retransmit_interval).saturating_mul(RESUME_INTERVALS);
        if now.0 > self.now.0.saturating_add(pause) {
            self.reports_needed_after = now;
        }
        self.now = now;
        // The batch timer follows the clock (a parked origin's balance refills with it), also
        // on the paths that end without `after_step` (an input refused before any change).
        self.arm_batch_timer();
    }

    /// 2f peers reported since this replica started or resumed (all that may be heard from
    /// when f are silent).
    fn heard_peers_since_resume(&self) -> bool {
        let fresh = self.peer_status.values().filter(|(_, at)| *at >= self.reports_needed_after).count();
        fresh >= 2 * usize::from(self.config.f)
    }

    /// At least f+1 peers (so one honest) reported delivering beyond us.
    fn lagging(&self) -> bool {
        let ahead = self.peer_status.values().filter(|(report, _)| report.last_delivered > self.last_delivered).count();
        ahead > usize::from(self.config.f)
    }

    fn check_state_transfer(&mut self) {
        let next = self.last_delivered + 1;
        if self.stable.seq < next || self.state_transfer_requested >= self.stable.seq {
            return;
        }
        let gone = self.peer_status.values().filter(|(report, _)| report.oldest_retained > next).count();
        if gone > usize::from(self.config.f) {
            self.state_transfer_requested = self.stable.seq;
            self.transfer_claims.push_back(self.stable);
            while self.transfer_claims.len() > TRANSFER_CLAIMS {
                self.transfer_claims.pop_front();
            }
            self.actions.push_back(Action::NeedStateTransfer { last_delivered: self.last_delivered, checkpoint: self.stable });
        }
    }

    fn on_committed(&mut self, from: ReplicaId, seq: u64, proposal: Proposal) {
        if !self.proposal_fits(&proposal) {
            self.blame(from, "committed batch over the batch limits");
            return;
        }
        if seq <= self.last_delivered || seq > self.last_delivered.saturating_add(self.config.watermark_window) {
            return;
        }
        let digest = proposal.digest(seq);
        let weak = usize::from(self.config.f) + 1;
        let slot = self.slots.entry(seq).or_default();
        if slot.committed.is_some() {
            return;
        }
        slot.fetched.insert(from, digest);
        slot.fetched_bodies.insert(digest, proposal);
        let live: BTreeSet<Digest> = slot.fetched.values().copied().collect();
        slot.fetched_bodies.retain(|d, _| live.contains(d));
        if slot.fetched.values().filter(|d| **d == digest).count() >= weak {
            let body = slot.fetched_bodies.remove(&digest);
            slot.fetched.clear();
            slot.fetched_bodies.clear();
            if let Some(body) = body {
                slot.committed = Some((digest, body));
                self.mark_slot(seq);
            }
            return;
        }
        self.try_anchored_fetch();
    }

    /// Accepts a run of batches fetched from one peer when, chained onto our log, they reproduce
    /// the log digest of the stable checkpoint (certified by a quorum, or by f+1 claims in a
    /// new view): one honest holder then suffices, which f+1 matching copies cannot promise.
    fn try_anchored_fetch(&mut self) {
        let start = self.last_delivered + 1;
        let anchor = if self.stable.seq >= start { self.stable } else { self.view_anchor };
        if anchor.seq < start || anchor.seq - self.last_delivered > self.config.watermark_window {
            return;
        }
        let Some(first) = self.slots.get(&start) else { return };
        let senders: Vec<ReplicaId> = first.fetched.keys().copied().collect();
        for sender in senders {
            let mut log = self.log_digest;
            let mut complete = true;
            for seq in start..=anchor.seq {
                match self.slots.get(&seq).and_then(|slot| slot.fetched.get(&sender)) {
                    Some(digest) => log = chain(log, seq, digest),
                    None => {
                        complete = false;
                        break;
                    }
                }
            }
            if !complete || log != anchor.log_digest {
                continue;
            }
            for seq in start..=anchor.seq {
                let Some(slot) = self.slots.get_mut(&seq) else { return };
                let Some(digest) = slot.fetched.get(&sender).copied() else { return };
                let Some(body) = slot.fetched_bodies.get(&digest).cloned() else { return };
                if slot.committed.is_none() {
                    slot.committed = Some((digest, body));
                    self.mark_slot(seq);
                }
            }
            return;
        }
    }

    // ----- view changes -----

    /// To [`Phase::ViewChanging`] for `target`, from either phase (a later target replaces
    /// the view change under way, with its pending new view).
    fn start_view_change(&mut self, target: u64) {
        if target <= self.view() {
            return;
        }
        let (last_normal_view, withdrawn) = match &self.phase {
            Phase::Normal { view, withdrawn, .. } => (*view, withdrawn.clone()),
            Phase::ViewChanging { last_normal_view, .. } => (*last_normal_view, None),
        };
        // Counted however this replica came to suspect (its timer, f+1 others, a failed view).
        self.suspicions = self.suspicions.saturating_add(1);
        self.timers.cancel(Timer::Request);
        self.timers.cancel(Timer::ViewChange);
        self.clear_fresh();
        self.drop_waiting();
        // Back to a view change it withdrew from: the one it sent is still true (it voted for
        // nothing since), and another for the same view would be a second version of it.
        let view_change = match withdrawn.filter(|own| own.view >= target) {
            Some(own) => own,
            None => self.build_view_change(target),
        };
        let digest = view_change_digest(&view_change);
        self.phase = Phase::ViewChanging { own: view_change.clone(), last_normal_view, pending_new_view: None, since: self.now };
        self.mark_meta();
        self.store_view_change(self.config.id, view_change.clone(), digest);
        self.broadcast(Message::ViewChange(view_change));
        self.after_view_change_input();
    }

    fn build_view_change(&self, view: u64) -> ViewChange {
        let low = self.stable.seq;
        // Bounded like the decoder's limit (four windows); see Config::limits.
        let high = self.high_watermark().min(low.saturating_add(self.config.watermark_window.saturating_mul(4)));
        let mut prepared = Vec::new();
        let mut pre_prepared = Vec::new();
        for (seq, slot) in self.slots.range(low.saturating_add(1)..=high) {
            if let Some(certificate) = &slot.prepared {
                prepared.push(PreparedEntry { seq: *seq, view: certificate.view, proposal: certificate.proposal.clone() });
            }
            for (digest, accepted_view) in &slot.pre_prepared {
                pre_prepared.push(PrePreparedEntry { seq: *seq, view: *accepted_view, digest: *digest });
            }
        }
        ViewChange { sender: self.config.id, view, stable: self.stable, checkpoints: self.checkpoint_claims(), prepared, pre_prepared }
    }

    /// Checkpoints this replica holds above its stable one: its own, and the current view's
    /// starting checkpoint (vouched for by f+1 replicas). The highest matter most; bounded.
    fn checkpoint_claims(&self) -> Vec<CheckpointClaim> {
        let mut claims: BTreeMap<u64, CheckpointClaim> = self.own_checkpoints.clone();
        if self.view_anchor.seq > self.stable.seq {
            claims.entry(self.view_anchor.seq).or_insert(self.view_anchor);
        }
        let skip = claims.len().saturating_sub(self.max_checkpoint_claims());
        claims.into_values().skip(skip).collect()
    }

    fn max_checkpoint_claims(&self) -> usize {
        usize::try_from(self.config.watermark_window / self.config.checkpoint_interval).unwrap_or(usize::MAX).saturating_add(1)
    }

    fn view_change_valid(&self, view_change: &ViewChange) -> bool {
        let low = view_change.stable.seq;
        let interval = self.config.checkpoint_interval;
        let checkpoints_ok = view_change.checkpoints.iter().all(|c| c.seq > low && c.seq % interval == 0);
        // Honest replicas report at most four windows above their stable checkpoint.
        let top = low.saturating_add(self.config.watermark_window.saturating_mul(4));
        let prepared_ok = view_change.prepared.iter().all(|e| e.seq > low && e.seq <= top && e.view < view_change.view && self.proposal_fits(&e.proposal))
            && view_change.prepared.windows(2).all(|pair| pair[0].seq < pair[1].seq);
        let pre_prepared_ok = view_change.pre_prepared.iter().all(|e| e.seq > low && e.seq <= top && e.view < view_change.view);
        view_change.view > 0
            && low % interval == 0
            && view_change.checkpoints.len() <= self.max_checkpoint_claims()
            && view_change.checkpoints.windows(2).all(|pair| pair[0].seq < pair[1].seq)
            && checkpoints_ok
            && prepared_ok
            && pre_prepared_ok
    }

    /// An honest replica reports prepared and pre-prepared entries only up to its high water
    /// mark, `max(stable, view anchor) + L`, and names the view anchor among its checkpoint
    /// claims when it is above its stable checkpoint; so no entry lies beyond the highest
    /// checkpoint it names plus one window. A view change that claims one does (the
    /// view-change poisoner's far-ahead entries) is a lie of its sender, whatever the network did.
    fn view_change_beyond_its_window(&self, view_change: &ViewChange) -> bool {
        let top = view_change.checkpoints.iter().map(|c| c.seq).fold(view_change.stable.seq, u64::max);
        let limit = top.saturating_add(self.config.watermark_window);
        view_change.prepared.iter().any(|e| e.seq > limit) || view_change.pre_prepared.iter().any(|e| e.seq > limit)
    }

    fn on_view_change(&mut self, from: ReplicaId, view_change: ViewChange) {
        if !self.view_change_valid(&view_change) {
            self.blame(from, "malformed view change");
            return;
        }
        if self.view_change_beyond_its_window(&view_change) {
            self.blame(from, "view change claims batches beyond its checkpoints");
            return;
        }
        if view_change.view < self.view() || (view_change.view == self.view() && !self.phase.is_changing()) {
            return;
        }
        let digest = view_change_digest(&view_change);
        let key = (from, view_change.view);
        if let Some((_, existing_digest)) = self.view_changes.get(&key) {
            if *existing_digest != digest && !self.alternate_view_changes.contains_key(&key) {
                self.blame(from, "two view changes for one view");
                self.alternate_view_changes.insert(key, (view_change, digest));
                self.try_pending_new_view();
            }
            return;
        }
        self.store_view_change(from, view_change, digest);
        self.after_view_change_input();
    }

    fn store_view_change(&mut self, sender: ReplicaId, view_change: ViewChange, digest: Digest) {
        let view = view_change.view;
        self.view_changes.insert((sender, view), (view_change, digest));
        let mine = self.view();
        self.view_changes.retain(|(_, v), _| *v >= mine);
        let views: Vec<u64> = self.view_changes.range((sender, 0)..=(sender, u64::MAX)).map(|((_, v), _)| *v).collect();
        if views.len() > VIEW_CHANGES_PER_PEER {
            for old in &views[..views.len() - VIEW_CHANGES_PER_PEER] {
                self.view_changes.remove(&(sender, *old));
            }
        }
    }

    fn after_view_change_input_bookkeeping(&mut self) {
        let kept = &self.view_changes;
        self.alternate_view_changes.retain(|key, _| kept.contains_key(key));
    }

    fn after_view_change_input(&mut self) {
        self.after_view_change_input_bookkeeping();
        // Join: f+1 replicas ask for views above ours, so at least one honest replica does.
        let mut highest: BTreeMap<ReplicaId, u64> = BTreeMap::new();
        // Others only: a replica back from a view change it withdrew from holds its own.
        for (sender, view) in self.view_changes.keys().filter(|(sender, _)| *sender != self.config.id) {
            let entry = highest.entry(*sender).or_insert(*view);
            *entry = (*entry).max(*view);
        }
        let view = self.view();
        let mut higher: Vec<u64> = highest.into_values().filter(|v| *v > view).collect();
        higher.sort_unstable_by(|a, b| b.cmp(a));
        if let Some(target) = higher.get(usize::from(self.config.f)).copied() {
            self.start_view_change(target);
            return;
        }
        let Phase::ViewChanging { last_normal_view, .. } = self.phase else { return };
        // The timer runs once a quorum is at this view or beyond (Castro waits for a quorum at
        // exactly this view, which can leave replicas split across two views waiting forever
        // when a new-view cannot be checked).
        let senders: BTreeSet<ReplicaId> = self.view_changes.keys().filter(|(_, v)| *v >= view).map(|(sender, _)| *sender).collect();
        if senders.len() >= self.config.quorum() && !self.timers.is_armed(Timer::ViewChange) {
            let attempt = view.saturating_sub(last_normal_view).saturating_sub(1);
            let shift = u32::try_from(attempt).unwrap_or(MAX_BACKOFF_SHIFT).min(MAX_BACKOFF_SHIFT);
            let timeout = self.config.view_change_timeout.saturating_mul(1u32 << shift);
            self.timers.arm(Timer::ViewChange, self.now.plus(timeout));
        }
        if self.is_primary() {
            self.try_new_view();
        } else {
            self.try_pending_new_view();
        }
    }

    /// A view change that gathers no quorum leaves its replica alone in it (one whose request
    /// timer fired before its peers saw the request, over slow links at start-up, say) while
    /// its peers go on ordering; a view change needs 2f+1, so they never follow. After a
    /// view-change timeout without a quorum for its target, once f+1 peers (so one honest)
    /// reported ordering in its last view since it left, it goes back there withdrawn (see
    /// [`Phase::Normal`]): it votes for nothing, so the view change it sent stays true and
    /// counts if the others move later, and it delivers what 2f+1 others commit, its own
    /// clients' requests among them. Not for the primary of that view (its pre-prepares
    /// would be votes). It sends that same view change again when f+1 others ask for a later
    /// view, or when its request timer fires again (with the back-off of a new suspicion).
    fn try_rejoin(&mut self) {
        let Phase::ViewChanging { own, last_normal_view, pending_new_view: None, since } = &self.phase else { return };
        let (view, since) = (*last_normal_view, *since);
        let quorum_asked = self.timers.is_armed(Timer::ViewChange);
        if quorum_asked || self.now < since.plus(self.config.view_change_timeout) || self.config.primary(view) == self.config.id {
            return;
        }
        let ordering = self.peer_status.values().filter(|(report, at)| *at > since && report.view == view && !report.view_changing).count();
        if ordering <= usize::from(self.config.f) {
            return;
        }
        let own = own.clone();
        self.phase = Phase::Normal { view, new_view: None, began: self.now, withdrawn: Some(own) };
        self.restart_requests();
    }

    /// Backups suspect the primary after the adaptive timeout (see
    /// [`Config::min_request_timeout`]); the primary gives up on its own view only after four
    /// times that, so it does not abandon a view its backups are still installing (it runs the
    /// timer at all so it cannot wait forever alone in a view).
    fn request_timeout(&self) -> std::time::Duration {
        let cap = self.config.request_timeout;
        let floor = self.config.min_request_timeout.min(cap);
        let backoff = floor.saturating_mul(1u32 << self.suspicions.min(MAX_BACKOFF_SHIFT));
        let observed = std::time::Duration::from_micros(self.order_latency_us.saturating_mul(LATENCY_FACTOR));
        let timeout = backoff.max(observed).min(cap);
        if self.is_primary() {
            timeout.saturating_mul(4)
        } else {
            timeout
        }
    }

    /// The timeout after which this replica would suspect the primary now (for tests and
    /// status: it adapts, see [`Config::min_request_timeout`]).
    pub fn current_request_timeout(&self) -> std::time::Duration {
        self.request_timeout()
    }

    fn try_new_view(&mut self) {
        let view = self.view();
        let held: Vec<(&ViewChange, Digest)> = self.view_changes.values().filter(|(vc, _)| vc.view == view).map(|(vc, d)| (vc, *d)).collect();
        let Some(own) = held.iter().position(|(vc, _)| vc.sender == self.config.id) else { return };
        let set: Vec<&ViewChange> = held.iter().map(|(vc, _)| *vc).collect();
        let Some((used, (checkpoint, proposals))) = search(&self.config, &set, own) else { return };
        let view_changes = used.iter().map(|i| (held[*i].0.sender, held[*i].1)).collect();
        let new_view = NewView { view, view_changes, checkpoint, proposals };
        self.broadcast(Message::NewView { sender: self.config.id, new_view: new_view.clone() });
        self.install_new_view(new_view);
    }

    fn new_view_well_formed(&self, new_view: &NewView) -> bool {
        let low = new_view.checkpoint.seq;
        let high = low.saturating_add(self.config.watermark_window);
        new_view.view > 0
            && low % self.config.checkpoint_interval == 0
            && new_view.view_changes.len() >= self.config.quorum()
            && new_view.view_changes.iter().all(|(sender, _)| *sender < self.config.n)
            && new_view.view_changes.windows(2).all(|pair| pair[0].0 < pair[1].0)
            && new_view.proposals.iter().all(|(seq, _)| *seq > low && *seq <= high)
            && new_view.proposals.windows(2).all(|pair| pair[0].0 < pair[1].0)
            && new_view.proposals.iter().all(|(_, proposal)| self.proposal_fits(proposal))
    }

    /// Within what an honest primary proposes: a batch's count and byte limits, each request
    /// within `max_request_bytes`. Bounds what a peer can make us hold per sequence number.
    fn proposal_fits(&self, proposal: &Proposal) -> bool {
        proposal.requests.len() <= self.config.batch_max_requests
            && proposal.requests.iter().all(|r| r.wire_size() <= self.config.max_request_bytes)
            && proposal_bytes(proposal) <= self.config.batch_max_bytes.saturating_add(16)
    }

    fn on_new_view(&mut self, from: ReplicaId, new_view: NewView) {
        if !self.new_view_well_formed(&new_view) {
            self.blame(from, "malformed new view");
            return;
        }
        if new_view.view < self.view() || (new_view.view == self.view() && !self.phase.is_changing()) {
            return;
        }
        if self.phase.withdrawn().is_some_and(|own| new_view.view < own.view) {
            // It would vote there, after a view change for a later view that does not say so.
            return;
        }
        let digest = new_view_digest(&new_view);
        if self.relayed_new_views.get(&from).is_none_or(|(_, old)| old.view <= new_view.view) {
            self.relayed_new_views.insert(from, (digest, new_view.clone()));
        }
        let vouchers = self.relayed_new_views.values().filter(|(d, nv)| *d == digest && nv.view == new_view.view).count();
        if vouchers > usize::from(self.config.f) {
            self.install_new_view(new_view);
            return;
        }
        let from_primary = from == self.config.primary(new_view.view);
        if let Phase::ViewChanging { own, pending_new_view, .. } = &mut self.phase {
            if from_primary && new_view.view == own.view {
                *pending_new_view = Some(new_view);
                self.try_pending_new_view();
            }
        }
    }

    /// Installs the pending new view once every view change it names is held, if it
    /// decides what they decide; otherwise its primary is blamed and the next view tried.
    fn try_pending_new_view(&mut self) {
        let Phase::ViewChanging { pending_new_view: Some(new_view), .. } = &self.phase else { return };
        let new_view = new_view.clone();
        let mut set = Vec::with_capacity(new_view.view_changes.len());
        for (sender, digest) in &new_view.view_changes {
            let key = (*sender, new_view.view);
            let held = [self.view_changes.get(&key), self.alternate_view_changes.get(&key)];
            match held.into_iter().flatten().find(|(_, d)| d == digest) {
                Some((vc, _)) => set.push(vc),
                // Not (yet) held directly from its sender: wait for retransmission or relays.
                _ => return,
            }
        }
        let decision = decide(&self.config, &set);
        if decision.as_ref() == Some(&(new_view.checkpoint, new_view.proposals.clone())) {
            self.install_new_view(new_view);
        } else {
            let primary = self.primary();
            self.blame(primary, "new view contradicts its view changes");
            self.start_view_change(new_view.view + 1);
        }
    }

    /// To [`Phase::Normal`] in `new_view.view`, from either phase (f+1 relays may install a
    /// later view directly).
    fn install_new_view(&mut self, new_view: NewView) {
        let view = new_view.view;
        debug_assert!(view >= self.view());
        let (proposals, checkpoint) = (new_view.proposals.clone(), new_view.checkpoint);
        self.phase = Phase::Normal { view, new_view: Some(new_view), began: self.now, withdrawn: None };
        self.drop_waiting();
        self.mark_meta();
        self.timers.cancel(Timer::ViewChange);
        self.view_changes.retain(|(_, v), _| *v > view);
        self.alternate_view_changes.retain(|(_, v), _| *v > view);
        self.relayed_new_views.retain(|_, (_, nv)| nv.view > view);
        // Do not collect garbage on the strength of a new view's checkpoint: only f+1 replicas
        // vouch for it, possibly one honest, and the log below it may still be needed to decide
        // later views. It moves the window and anchors fetching instead.
        if checkpoint.seq > self.view_anchor.seq && checkpoint.seq > self.stable.seq {
            self.view_anchor = checkpoint;
        }
        self.proposed.clear();
        let primary = self.is_primary();
        let mut max_seq = self.low_watermark().max(self.last_delivered);
        let mut max_time = self.last_time;
        for (seq, proposal) in proposals {
            max_seq = max_seq.max(seq);
            max_time = max_time.max(proposal.time);
            if seq <= self.low_watermark() {
                continue;
            }
            let digest = proposal.digest(seq);
            self.accept_pre_prepare(seq, digest, proposal);
        }
        if primary {
            self.next_seq = max_seq + 1;
            self.last_proposed_time = self.last_proposed_time.max(max_time);
        }
        self.restart_requests();
    }

    /// After a view change: hand every known request to the new primary.
    fn restart_requests(&mut self) {
        self.clear_fresh();
        self.timers.cancel(Timer::Request);
        if self.awaited.is_empty() {
            return;
        }
        self.timers.arm(Timer::Request, self.now.plus(self.request_timeout()));
        if self.is_primary() {
            let mut keys: Vec<(Time, RequestKey)> = self.awaited.iter().map(|(key, a)| (a.since, *key)).collect();
            keys.sort_unstable();
            for (_, key) in keys {
                let Some(awaited) = self.awaited.get(&key).filter(|a| self.proposable(a)) else { continue };
                let size = awaited.request.wire_size();
                self.push_fresh(key, size);
            }
            return;
        }
        self.send_holds(true);
        // To everyone, not only the new primary: its backups vouch for a request only when
        // they hold it from its origin (a request this replica proposed itself as the old
        // primary never went to them).
        let requests: Vec<Request> = self.awaited.values().filter(|a| a.own).map(|a| a.request.clone()).collect();
        for request in requests {
            self.broadcast(Message::Request { sender: self.config.id, request });
        }
    }

    // ----- helpers -----

    fn blame(&mut self, peer: ReplicaId, reason: &'static str) {
        if let Some(count) = self.misbehaviour.get_mut(usize::from(peer)) {
            *count += 1;
            self.last_misbehaviour = Some((peer, reason));
            *self.faults.entry((peer, reason)).or_default() += 1;
        }
    }

    fn send(&mut self, to: ReplicaId, message: Message) {
        if to != self.config.id {
            self.actions.push_back(Action::Send { to, message });
        }
    }

    fn broadcast(&mut self, message: Message) {
        if self.config.n > 1 {
            self.actions.push_back(Action::Broadcast { message });
        }
    }

    fn after_step(&mut self) {
        self.try_deliver();
        self.try_propose();
        self.try_deliver();
        if self.fresh.len() > self.awaited.len().max(self.config.max_pending_requests).saturating_mul(2) {
            let awaited = &self.awaited;
            self.fresh.retain(|(key, _)| awaited.contains_key(key));
            self.fresh_bytes = self.fresh.iter().map(|(_, size)| size).sum();
        }
        self.arm_batch_timer();
        self.check_invariants();
    }

    fn check_invariants(&self) {
        debug_assert!(self.own_pending <= self.config.max_pending_requests);
        debug_assert_eq!(self.own_pending, self.awaited.values().filter(|a| a.own).count());
        debug_assert!(self.relayed_bytes.values().all(|b| *b <= self.config.max_pending_bytes_per_origin));
        debug_assert!(self.clients_per_origin.values().all(|c| *c <= self.clients_per_origin_cap()));
        debug_assert_eq!(self.fresh_bytes, self.fresh.iter().map(|(_, size)| size).sum::<usize>());
        debug_assert!(self.view_changes.len() <= usize::from(self.config.n) * VIEW_CHANGES_PER_PEER);
        debug_assert!(self.relayed_new_views.len() <= usize::from(self.config.n));
        debug_assert!(self.alternate_view_changes.keys().all(|key| self.view_changes.contains_key(key)));
        debug_assert!(self.checkpoint_votes.values().all(|votes| votes.len() <= VOTES_PER_PEER));
        debug_assert!(self.stable.seq % self.config.checkpoint_interval == 0);
        debug_assert!(self.clients.len() <= self.config.max_clients);
        debug_assert!(self.clients.len() == self.clients_by_age.len());
        debug_assert!(self.last_delivered == 0 || self.last_time > Time(0));
        debug_assert!(self.slots.keys().next().is_none_or(|seq| *seq > self.stable.seq.min(self.last_delivered)));
        debug_assert!(self.slots.keys().next_back().is_none_or(|seq| *seq <= self.high_watermark().max(self.last_delivered + self.config.watermark_window)));
        debug_assert!(self.slots.get(&(self.last_delivered + 1)).is_none_or(|slot| slot.committed.is_none()));
        debug_assert!(!self.is_proposing() || self.next_seq > self.last_delivered.min(self.stable.seq));
        debug_assert!(self.timers.is_armed(Timer::Tick));
        debug_assert!(self.waiting.iter().all(|seq| self.slots.get(seq).is_some_and(|slot| slot.waiting.is_some())));
        debug_assert!(!self.phase.is_changing() || !self.timers.is_armed(Timer::Request));
        debug_assert!(self.phase.is_changing() || !self.timers.is_armed(Timer::ViewChange));
        if let Phase::ViewChanging { own, last_normal_view, pending_new_view, .. } = &self.phase {
            debug_assert!(own.sender == self.config.id && *last_normal_view < own.view);
            debug_assert!(pending_new_view.as_ref().is_none_or(|nv| nv.view == own.view));
        }
        if let Phase::Normal { view, withdrawn: Some(own), .. } = &self.phase {
            debug_assert!(own.sender == self.config.id && *view < own.view && !self.is_proposing());
        }
    }
}

/// Bytes a pending request is charged against its origin's budget.
fn charge(request: &Request) -> usize {
    request.wire_size().saturating_add(REQUEST_OVERHEAD)
}

/// Bytes a proposal occupies, as accounted by [`Replica::held_bytes`].
fn proposal_bytes(proposal: &Proposal) -> usize {
    proposal.requests.iter().map(Request::wire_size).fold(16usize, usize::saturating_add)
}

/// Fixed charge of a view change or new view, and of each of its entries (beyond proposals).
const VIEW_CHANGE_FIXED: usize = 256;
const ENTRY_FIXED: usize = 64;

fn view_change_bytes(view_change: &ViewChange) -> usize {
    let entries = view_change.checkpoints.len() + view_change.pre_prepared.len() + view_change.prepared.len();
    view_change
        .prepared
        .iter()
        .map(|e| proposal_bytes(&e.proposal))
        .fold(VIEW_CHANGE_FIXED.saturating_add(entries.saturating_mul(ENTRY_FIXED)), usize::saturating_add)
}

fn new_view_bytes(new_view: &NewView) -> usize {
    let entries = new_view.view_changes.len() + new_view.proposals.len();
    new_view.proposals.iter().map(|(_, p)| proposal_bytes(p)).fold(VIEW_CHANGE_FIXED.saturating_add(entries.saturating_mul(ENTRY_FIXED)), usize::saturating_add)
}

/// One link of the log hash chain.
fn chain(log: Digest, seq: u64, digest: &Digest) -> Digest {
    use sha2::{Digest as _, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(b"sdns-bft-log-v1");
    hasher.update(log);
    hasher.update(seq.to_le_bytes());
    hasher.update(digest);
    hasher.finalize().into()
}
