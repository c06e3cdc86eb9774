//! Performs what the execution core (`exec`) decides, against the local named.
//!
//! This is the thin tokio side: it hands delivered batches (with the reply handles this
//! gateway holds) to the core, carries out its commands, and reports their results as
//! events. It decides nothing itself and never waits on a client: answers are handed to
//! bounded per-connection queues that drop when full. Writes and the installation of a
//! zone signed in the background wait for named however long it takes (retrying while it restarts) rather than give up
//! on a local timer, since giving up would make this replica differ from the others.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bft::{Batch, Digest};
use named_glue::forward::Forwarder;
use named_glue::signer::SignatureTimes;
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use crate::client::reply::{Delivery, ReplyTo};
use crate::config::Settings;
use crate::execution::pending::Pending;
pub use crate::execution::zoneset::Background;
use crate::execution::zoneset::{zone_by_apex, ZoneHost, ZoneMap};
use crate::ops::metrics::Metrics;
use crate::reads::read::{Lookup, ReadCache};
use crate::statexfer::{canonical_zone_name, write_zone_files, DigestedRecords, Install, Snapshot, SnapshotStore, SnapshotZone};
use crate::zone::{Finish, ZoneError, ZoneMaintenance};
use exec::state::serial_before;
use exec::zone_plan::zone_digest_of;
use exec::ExecState;
use exec::{Command, Delivered, Event, ExecCore, Item, Resume, UpdateGate, WriteIntent};

/// How long the later messages of a zone transfer may wait for room in the client's
/// queue (the transfer runs in a task of its own; the executor does not wait for it).
/// Pause between attempts while named does not answer a write.
const WRITE_RETRY_MAX: Duration = Duration::from_secs(2);
/// Attempts at reading the zone for a checkpoint digest before reporting it unavailable.
const DIGEST_ATTEMPTS: u32 = 10;

pub struct Executor<G: UpdateGate> {
    id: u16,
    core: ExecCore<ReplyTo, G>,
    /// Reads (their own timeouts: a read that fails gets SERVFAIL and changes nothing).
    named: Forwarder,
    /// Writes: long per-read timeout; on failure the write is sent again once named answers.
    writes: Forwarder,
    pending: Arc<Pending>,
    times: watch::Sender<Option<SignatureTimes>>,
    checkpoints: mpsc::Sender<(u64, Digest)>,
    metrics: Arc<Metrics>,
    /// Every served zone's whole-zone operations, background signing and last signing time,
    /// by the execution state's zone index; changed with the zone set.
    zones: ZoneMap,
    /// Makes the replica serve a changed zone set (`None`: a replica that cannot, which
    /// stops executing at a change).
    host: Option<Arc<dyn ZoneHost>>,
    /// Where the execution state is persisted after every batch that changed it.
    state_file: PathBuf,
    /// named's answers to reads, emptied around every write and signing (`crate::reads::read_cache`).
    cache: Arc<ReadCache>,
    /// The last zone digests (one per zone), the cache epoch they were computed at, and the
    /// records they were computed from (a checkpoint's snapshot when the digests are reused).
    last_digest: Arc<Mutex<Option<LastDigest>>>,
    /// Where the snapshot of every checkpoint is kept for peers that need state transfer.
    snapshots: Option<SnapshotStore>,
    /// The records each pending checkpoint digest was computed from.
    digested: DigestedRecords,
    /// The ordering's delivery base of each checkpoint batch taken but not yet digested: the
    /// certified digest covers its deduplication table, and the snapshot carries it.
    bases: OrderingBases,
    /// The tasks the running batch's commands started: aborted when a transferred state
    /// replaces what that batch was doing (see [`Executor::preempt`]).
    tasks: CommandTasks,
    /// Verified snapshots to install (from state transfer).
    installs: Option<mpsc::Receiver<Install>>,
    /// This replica's own state digest at each recent checkpoint, to compare with the
    /// certified one (`crate::statexfer::watch_divergence`).
    own_digests: OwnDigests,
    /// The checkpoint at which this replica's state was found to differ from the certified
    /// one (0: never). Until a transferred state after it is installed, no batch is executed:
    /// executing on a diverged state would only spread the difference.
    diverged_at: Option<watch::Receiver<u64>>,
    /// The executed position, for reads that wait for it (`crate::reads::vouched`): published as
    /// soon as a batch's last write is answered by named, before the state is persisted.
    executed: watch::Sender<u64>,
    /// The write this replica's named has not answered for `ABANDON_CLAIM_AFTER`: the
    /// claimer task (`run::requests`) orders `Op::Stuck` for it while it is set.
    stuck: watch::Sender<Option<(u64, u32)>>,
    /// Signatures the write signing socket returned so far: while they move, the running
    /// write makes progress (a large update waits for many) and is not claimed stuck.
    signatures: Arc<AtomicU64>,
    /// Committed batches waiting behind a stuck write past which it is claimed stuck after
    /// `ABANDON_CLAIM_HURRIED` rather than `ABANDON_CLAIM_AFTER`: half the ordering's
    /// watermark window, so that the claims still find room in the log (nothing past the
    /// window is ordered until a checkpoint after the stuck write is certified).
    claim_backlog: usize,
    /// Test hook (`replica.test_fail_writes_naming`, test clusters only): writes with a
    /// record of this owner name are never sent to named; the forwarder's transient failure
    /// is reported for them instead, as if named timed out on them at every replica.
    fail_writes_naming: Option<hickory_proto::rr::Name>,
    /// The task sending the running write to named, aborted when the write is abandoned.
    write_task: Mutex<Option<((u64, u32), tokio::task::AbortHandle)>>,
}

/// The executor's own settings.
#[derive(Clone, Debug)]
pub struct ExecutorConfig {
    pub id: u16,
    /// Where the execution state is persisted (`exec.state` in the state directory).
    pub state_file: PathBuf,
    /// See [`Executor::claim_backlog`].
    pub claim_backlog: usize,
    /// See [`Executor::fail_writes_naming`].
    pub fail_writes_naming: Option<hickory_proto::rr::Name>,
}

impl From<&Settings> for ExecutorConfig {
    fn from(s: &Settings) -> ExecutorConfig {
        ExecutorConfig {
            id: s.id,
            state_file: s.state_dir.join("exec.state"),
            // Half the watermark window (four checkpoint intervals, `bft::Config::from`).
            claim_backlog: usize::try_from(s.ordering.checkpoint_interval.get().saturating_mul(2)).unwrap_or(usize::MAX).max(1),
            fail_writes_naming: s.test.fail_writes_naming.clone(),
        }
    }
}

/// The execution core's settings: the agreed-time parameters every replica must share, and
/// the sign-zone verifiers (one per zone, from the cluster CA).
pub fn exec_config(s: &Settings, sign_zone_verifiers: Vec<exec::SignZoneVerifier>) -> exec::ExecConfig {
    exec::ExecConfig {
        id: s.id,
        faults: s.faults,
        validity_s: s.signing.validity_s,
        resign_after_s: s.signing.resign_after_s,
        slice_interval_s: s.signing.resign_slice_interval_s.get(),
        slice_rrsets: s.signing.resign_slice_rrsets.get(),
        sign_zone_interval_s: s.signing.sign_zone_interval_s,
        sign_zone_window_s: s.signing.sign_zone_window_s.get(),
        sign_zone_verifiers,
        max_reads_in_flight: MAX_READS_IN_FLIGHT,
    }
}

/// Reads executing at once at this gateway.
const MAX_READS_IN_FLIGHT: usize = 64;

/// What the executor works with, made by the other parts of the replica.
pub struct ExecutorLinks {
    pub named: Forwarder,
    pub writes: Forwarder,
    pub pending: Arc<Pending>,
    pub cache: Arc<ReadCache>,
    pub metrics: Arc<Metrics>,
    /// The signature times of the running write, for the write signing socket.
    pub times: watch::Sender<Option<SignatureTimes>>,
    pub signatures: Arc<AtomicU64>,
    pub checkpoints: mpsc::Sender<(u64, Digest)>,
    /// Every served zone's parts, by zone index (each zone's background signing has its own
    /// socket and times, since two zones' signings may run at once).
    pub zones: ZoneMap,
    /// See [`Executor::host`].
    pub host: Option<Arc<dyn ZoneHost>>,
    /// State transfer; without it no snapshot is kept and none installed.
    pub transfer: Option<TransferLinks>,
}

/// The executor's side of state transfer and checkpoint repair.
pub struct TransferLinks {
    pub snapshots: SnapshotStore,
    pub installs: mpsc::Receiver<Install>,
    pub diverged_at: watch::Receiver<u64>,
}

impl<G: UpdateGate> Executor<G> {
    pub fn new(config: ExecutorConfig, core: ExecCore<ReplyTo, G>, links: ExecutorLinks) -> Executor<G> {
        let ExecutorConfig { id, state_file, claim_backlog, fail_writes_naming } = config;
        let ExecutorLinks { named, writes, pending, cache, metrics, times, signatures, checkpoints, zones, host, transfer } = links;
        let (snapshots, installs, diverged_at) = match transfer {
            Some(t) => (Some(t.snapshots), Some(t.installs), Some(t.diverged_at)),
            None => (None, None, None),
        };
        Executor {
            id,
            core,
            named,
            writes,
            pending,
            times,
            checkpoints,
            metrics,
            zones,
            host,
            state_file,
            cache,
            last_digest: Default::default(),
            snapshots,
            digested: Default::default(),
            bases: Default::default(),
            tasks: Default::default(),
            installs,
            own_digests: Default::default(),
            diverged_at,
            executed: watch::channel(0).0,
            stuck: watch::channel(None).0,
            signatures,
            claim_backlog,
            fail_writes_naming,
            write_task: Default::default(),
        }
    }

    /// The executed position as it moves (see [`Executor::executed`]).
    pub fn executed_rx(&self) -> watch::Receiver<u64> {
        self.executed.subscribe()
    }

    /// The write this replica claims stuck, if any (see [`Executor::stuck`]).
    pub fn stuck_rx(&self) -> watch::Receiver<Option<(u64, u32)>> {
        self.stuck.subscribe()
    }

    /// This replica's own checkpoint digests, for the divergence check.
    pub fn own_digests(&self) -> OwnDigests {
        self.own_digests.clone()
    }
}

/// How long the executor waits for named's answer to one write, with no signature made for
/// it meanwhile, before it orders a claim that the write is stuck (`Op::Stuck`). Local: it
/// only decides when this replica speaks; the write is abandoned by what the log holds
/// (claims of t+1 replicas). Far above a write's usual time (tens of ms) and above the pause
/// between two of its signatures (a large update waits for many, one after another).
const ABANDON_CLAIM_AFTER: Duration = Duration::from_secs(10);
/// The same bound while the committed batches behind the write fill half the window.
const ABANDON_CLAIM_HURRIED: Duration = Duration::from_secs(2);

/// The cache epoch of the last digests, the digests (zone index order), their records.
pub type LastDigest = (u64, Vec<[u8; 32]>, Arc<Vec<Vec<Vec<u8>>>>);

/// Delivery bases of checkpoint batches by batch, the newest few.
pub type OrderingBases = Arc<Mutex<std::collections::BTreeMap<u64, bft::DeliveryBase>>>;

/// Delivery bases held: one per checkpoint batch between its delivery and its digest, and
/// those of checkpoints a restart or a transfer skipped until newer ones push them out.
const BASES_KEPT: usize = 4;

/// Own checkpoint digests by batch, the newest few.
pub type OwnDigests = Arc<Mutex<std::collections::BTreeMap<u64, Digest>>>;

/// The tasks started for the running batch's commands.
#[derive(Default)]
pub struct CommandTasks(std::sync::Mutex<Vec<tokio::task::AbortHandle>>);

impl CommandTasks {
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) -> tokio::task::AbortHandle {
        let handle = tokio::spawn(task).abort_handle();
        let mut tasks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle.clone());
        handle
    }

    fn abort_all(&self) -> usize {
        let mut tasks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let running = tasks.iter().filter(|t| !t.is_finished()).count();
        for task in tasks.drain(..) {
            task.abort();
        }
        running
    }
}

/// The executor loop's timers: how long the running batch has taken, and how long named
/// has not answered its write.
struct Watchdog {
    stall_check: tokio::time::Interval,
    /// The batch seen running at the last stall check, and since when.
    stalled: Option<(u64, std::time::Instant)>,
    stuck_check: tokio::time::Interval,
    /// The write named has not answered, and since when (for the stuck claims).
    waiting_write: Option<((u64, u32), std::time::Instant)>,
    /// The write signatures counted at the last stuck check.
    signed: u64,
}

impl Watchdog {
    fn new(signed: u64) -> Watchdog {
        let interval = |every| {
            let mut check = tokio::time::interval(every);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            check
        };
        Watchdog { stall_check: interval(STALL_WARNING), stalled: None, stuck_check: interval(Duration::from_secs(1)), waiting_write: None, signed }
    }
}

/// How often a batch that does not finish is reported (first after one to two periods).
const STALL_WARNING: Duration = Duration::from_secs(10);

/// Own digests remembered (the stable checkpoint trails the newest by about one interval).
const OWN_DIGESTS_KEPT: usize = 8;

impl<G: UpdateGate + 'static> Executor<G> {
    pub async fn run(mut self, mut batches: mpsc::UnboundedReceiver<Batch>) {
        // Unbounded, but never longer than the commands in flight: at most the core's
        // read slots plus one write, signing or digest.
        let (events_tx, mut events) = mpsc::unbounded_channel();
        // Without state transfer the branch below never fires.
        let (_no_installs, idle_installs) = mpsc::channel(1);
        let mut installs = self.installs.take().unwrap_or(idle_installs);
        let (_never_diverged, idle_diverged) = watch::channel(0u64);
        let mut diverged_at = self.diverged_at.take().unwrap_or(idle_diverged);
        // The last installed transferred state's checkpoint.
        let mut installed_at = 0u64;
        self.resume().await;
        let mut watchdog = Watchdog::new(self.signatures.load(Ordering::Relaxed));
        // Batches committed and not yet executed: taken from the ordering as they come, so
        // that the core sees the claims in them while it waits on an earlier write (they
        // waited in the channel before; the bound is the ordering's window either way).
        let mut queued: VecDeque<Batch> = VecDeque::new();
        let mut ordering_open = true;
        loop {
            let paused = *diverged_at.borrow_and_update() > installed_at;
            if self.core.is_idle() && !paused {
                if let Some(batch) = queued.pop_front() {
                    let delivered = self.resolve(batch);
                    let commands = self.core.deliver(delivered);
                    self.count_requests();
                    for command in commands {
                        self.perform(command, &events_tx).await;
                    }
                    continue;
                }
                if !ordering_open {
                    return;
                }
            }
            let commands = tokio::select! {
                biased;
                Some(event) = events.recv() => self.core.handle(event),
                _ = watchdog.stuck_check.tick() => {
                    self.check_stuck(&mut watchdog, queued.len());
                    Vec::new()
                }
                _ = watchdog.stall_check.tick() => {
                    self.check_stalled(&mut watchdog);
                    Vec::new()
                }
                Some((snapshot, ack)) = installs.recv() => {
                    let seq = snapshot.seq;
                    if !self.core.is_idle() {
                        // The batch may never finish (a write whose signature its peers, far
                        // ahead, no longer help with) and the snapshot replaces its effects.
                        self.preempt(seq, &mut events);
                    }
                    let result = self.install(snapshot).await;
                    if result.is_ok() {
                        installed_at = installed_at.max(seq);
                    }
                    // The stalled batch, if any, is gone with it.
                    watchdog.stalled = None;
                    self.metrics.update_status(|s| s.stalled = None);
                    let _ = ack.send(result);
                    Vec::new()
                }
                // A divergence found while this replica was executing: stop taking batches.
                Ok(()) = diverged_at.changed(), if !paused => Vec::new(),
                batch = batches.recv(), if ordering_open => match batch {
                    Some(batch) => {
                        let commands = self.core.committed(batch.seq, batch.requests.iter().map(|r| (r.origin, &r.payload[..])));
                        queued.push_back(batch);
                        commands
                    }
                    None => {
                        ordering_open = false;
                        Vec::new()
                    }
                },
            };
            self.count_requests();
            for command in commands {
                self.perform(command, &events_tx).await;
            }
        }
    }

    /// The client requests the core took up, by the kind it classified them as: counted
    /// there, so the log is not decoded and classified again here.
    fn count_requests(&mut self) {
        for (kind, n) in self.core.take_requests().by_kind() {
            self.metrics.add_requests(kind, n);
        }
    }

    /// Takes up where this replica left off: the executed position published, a write a
    /// crash interrupted reconciled with named, a background signing that was running
    /// resumed (or found done).
    async fn resume(&mut self) {
        let state = self.core.state().clone();
        self.publish_last_signed(&state);
        self.executed.send_replace(state.executed);
        if state.executed > 0 {
            info!(replica = self.id, last = state.executed, "resuming after executed batch");
        }
        self.reconcile_with_named().await;
        for (zone, run, times) in self.core.signing_runs() {
            info!(replica = self.id, zone, began = run.seq, "resuming the background whole-zone signing");
            self.start_background(zone, run.seq, times);
        }
    }

    /// Sets or clears the stuck claim (`Executor::stuck`): the write named has not answered
    /// for its bound, with no signature made for it meanwhile.
    fn check_stuck(&self, w: &mut Watchdog, queued: usize) {
        let now = self.core.stuck_write();
        let signatures = self.signatures.load(Ordering::Relaxed);
        let progress = std::mem::replace(&mut w.signed, signatures) != signatures;
        w.waiting_write = match (w.waiting_write, now) {
            (Some((write, since)), Some(n)) if write == n && !progress => Some((write, since)),
            (_, Some(n)) => Some((n, std::time::Instant::now())),
            (_, None) => None,
        };
        let bound = if queued >= self.claim_backlog { ABANDON_CLAIM_HURRIED } else { ABANDON_CLAIM_AFTER };
        let claim = w.waiting_write.filter(|(_, since)| since.elapsed() >= bound).map(|(write, _)| write);
        self.stuck.send_if_modified(|c| {
            let changed = *c != claim;
            *c = claim;
            changed
        });
    }

    /// A batch that does not finish holds every later one and any state install: said every
    /// STALL_WARNING while it lasts, with what it waits for.
    fn check_stalled(&self, w: &mut Watchdog) {
        match self.core.waiting_for() {
            Some((seq, what)) => match w.stalled {
                Some((at, since)) if at == seq => {
                    warn!(
                        replica = self.id,
                        seq,
                        secs = since.elapsed().as_secs(),
                        reads_in_flight = self.core.reads_in_flight(),
                        "a batch has been executing for long; waiting for {what}"
                    );
                    // The repair task fetches the certified state past a batch that does not
                    // finish (see `run::repair`, the repair task).
                    self.metrics.update_status(|s| s.stalled = Some((seq, since.elapsed().as_secs())));
                }
                _ => {
                    w.stalled = Some((seq, std::time::Instant::now()));
                    self.metrics.update_status(|s| s.stalled = None);
                }
            },
            None => {
                w.stalled = None;
                self.metrics.update_status(|s| s.stalled = None);
            }
        }
    }

    /// Abandons the running batch for a transferred state at checkpoint `seq` (at or past
    /// that batch: a replica fetches only checkpoints ahead of its execution): the batch's
    /// tasks are aborted, so a write cannot reach the named that the install restarts, and
    /// their late events are dropped (the core ignores events of batches it does not run).
    fn preempt(&mut self, seq: u64, events: &mut mpsc::UnboundedReceiver<Event>) {
        let (running, what) = self.core.waiting_for().unwrap_or((0, "nothing"));
        let aborted = self.tasks.abort_all();
        while events.try_recv().is_ok() {}
        self.core.abandon();
        warn!(replica = self.id, batch = running, checkpoint = seq, aborted, "batch abandoned for the transferred state (it waited for {what})");
    }

    /// Installs a snapshot that state transfer fetched and verified: named is stopped, its
    /// zone file replaced by the snapshot's records and its journal removed, named started
    /// again; then the execution state becomes the snapshot's and is persisted. Batches up to
    /// the snapshot's checkpoint are skipped from now on.
    async fn install(&mut self, snapshot: Snapshot) -> Result<(), String> {
        let records = snapshot.record_count();
        let Snapshot { seq, state, zones, .. } = snapshot;
        info!(replica = self.id, seq, records, zones = zones.len(), "installing the state transferred from peers");
        // The zones change under the read cache and the reused checkpoint digest: neither may
        // outlive the install (a stale digest made the next checkpoint differ).
        let change = self.cache.begin_change();
        *self.last_digest.lock().unwrap_or_else(|e| e.into_inner()) = None;
        // A snapshot with another zone set (changed at run time before its checkpoint): this
        // replica serves the snapshot's set from now on (named.conf written for it here, named
        // restarted below with the zone files).
        let mut removed = Vec::new();
        if !state.zone_set.is_empty() && !serves_exactly(&self.zones, &state.zone_set) {
            removed = self.serve(&state.zone_set, crate::catalog::serial_at(seq)).await?;
        }
        // State transfer checked the snapshot's zones against its state; this guards the pairing.
        let names: Vec<String> = self.zones.values().map(|p| canonical_zone_name(&p.maintenance.zone.to_ascii())).collect();
        if zones.len() != names.len() || zones.iter().zip(&names).any(|(z, n)| canonical_zone_name(&z.name) != *n) {
            return Err(format!(
                "the snapshot holds zones {}, this replica serves {}",
                zones.iter().map(|z| z.name.as_str()).collect::<Vec<_>>().join(", "),
                names.join(", ")
            ));
        }
        let Some(first) = self.zones.values().next() else { return Err("no zone served".into()) };
        let supervisor = first.maintenance.supervisor.clone();
        supervisor.set_ready_zone(first.maintenance.zone.clone());
        let files: Vec<_> = self
            .zones
            .values()
            .zip(zones)
            .map(|(p, z)| {
                let m = &p.maintenance;
                (m.tools.clone(), m.zone.to_ascii(), m.files.zone_file.clone(), m.files.journal.clone(), z.records)
            })
            .collect();
        // Every zone while named is stopped once: it starts again on all of them.
        let written = supervisor
            .replace_files(move || {
                remove_zone_files(&removed);
                for (tools, zone, zone_file, journal, records) in &files {
                    write_zone_files(tools, zone, zone_file, journal, records)?;
                }
                Ok::<(), std::io::Error>(())
            })
            .await
            .map_err(|e| format!("named did not come back on the transferred zones: {e}"))?;
        drop(change);
        written.map_err(|e| format!("writing the transferred zone: {e}"))?;
        self.core.install(state.clone());
        if let Ok(mut bases) = self.bases.lock() {
            bases.retain(|at, _| *at > seq);
        }
        state.store(&self.state_file).map_err(|e| e.to_string())?;
        // An intent names a write of a batch the transferred state already covers.
        let _ = std::fs::remove_file(WriteIntent::path_for(&self.state_file));
        for (zone, run, times) in self.core.signing_runs() {
            // Its zone content was not transferred: this part fails, and so will the
            // installation here (visible at the next checkpoint; another transfer repairs it).
            self.start_background(zone, run.seq, times);
        }
        self.publish_last_signed(&state);
        self.metrics.update_status(|s| s.last_executed = state.executed);
        self.executed.send_replace(state.executed);
        info!(replica = self.id, seq, "transferred state installed");
        Ok(())
    }

    /// Makes this replica's parts serve exactly `zones` (named.conf, catalog with `serial`,
    /// signing cores, each zone's tasks, through the host); named is restarted by the
    /// caller. Returns the files of the zones no longer served, to delete while named is
    /// stopped (a zone added again later starts from its dealt file, not from these).
    async fn serve(&mut self, zones: &std::collections::BTreeMap<u16, exec::ZoneEntry>, serial: u32) -> Result<Vec<(PathBuf, PathBuf)>, String> {
        let host = self.host.clone().ok_or("this replica cannot change the zones it serves")?;
        let parts = host.prepare(zones, serial, &self.zones).await?;
        let removed = self
            .zones
            .iter()
            .filter(|(i, _)| !parts.contains_key(i))
            .map(|(_, p)| (p.maintenance.files.zone_file.clone(), p.maintenance.files.journal.clone()))
            .collect();
        self.zones = parts;
        Ok(removed)
    }

    /// `Command::ChangeZoneSet`: the replica serves the zone set the log changed at `seq`
    /// (named restarted on the new named.conf, as an installed signing restarts it), then
    /// reports it. A change this replica cannot make (its host refuses, or named does not
    /// come back) leaves it serving other zones than its peers: it stops executing here
    /// (fail-stop) and says why; a restart after the operator's repair executes the batch
    /// again.
    async fn change_zone_set(
        &mut self,
        seq: u64,
        index: u16,
        change: &exec::ZoneSetChange,
        zones: std::collections::BTreeMap<u16, exec::ZoneEntry>,
        events: &mpsc::UnboundedSender<Event>,
    ) {
        let started = std::time::Instant::now();
        let action = match change.action {
            exec::ZoneSetAction::Add => "added",
            exec::ZoneSetAction::Remove => "removed",
        };
        // The zone set changes under the read cache and the reused checkpoint digest.
        let guard = self.cache.begin_change();
        *self.last_digest.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let result = match self.serve(&zones, crate::catalog::serial_at(seq)).await {
            Ok(removed) => match self.zones.values().next().map(|p| (p.maintenance.supervisor.clone(), p.maintenance.zone.clone())) {
                Some((supervisor, first)) => {
                    // A zone served before and after the change (the lowest index) tells
                    // that named is back.
                    supervisor.set_ready_zone(first);
                    supervisor
                        .replace_files(move || {
                            remove_zone_files(&removed);
                            Ok::<(), std::io::Error>(())
                        })
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("named did not come back on the changed zone set: {e}"))
                }
                None => Err("no zone left to serve".to_string()),
            },
            Err(e) => Err(e),
        };
        drop(guard);
        match result {
            Ok(()) => {
                info!(replica = self.id, seq, index, zone = %change.name, zones = self.zones.len(), ms = started.elapsed().as_millis() as u64, "zone {action}: this replica serves the changed zone set");
                let _ = events.send(Event::ZoneSetChanged { seq });
            }
            Err(e) => {
                self.metrics.inc_execute_error();
                error!(replica = self.id, seq, index, zone = %change.name, error = %e, "the zone set changed and this replica cannot serve it: execution stops here (repair and restart it)");
            }
        }
    }

    /// After a crash: does named hold the write this replica was executing (see
    /// [`WriteIntent`])? The batch then resumes at that write, recorded as applied or sent
    /// again. A zone older than an intent already executed (named's journal lost writes,
    /// as after a power loss without its sync) is reported: only a state transfer repairs it.
    async fn reconcile_with_named(&mut self) {
        let path = WriteIntent::path_for(&self.state_file);
        let intent = match WriteIntent::load(&path) {
            Ok(Some(intent)) => intent,
            Ok(None) => return,
            Err(e) => {
                warn!(replica = self.id, error = %e, "cannot read the write intent; the batch after the executed one runs from its start");
                return;
            }
        };
        let executed = self.core.state().executed;
        // Batches with reads only are not persisted, so the intent may name a batch some
        // way past the persisted position; its recorded state says where that batch began.
        if intent.seq > executed + 1 && intent.state.executed + 1 != intent.seq {
            warn!(replica = self.id, intent = intent.seq, executed, "write intent inconsistent with its own state (ignored)");
            return;
        }
        let Some(zone) = self.zones.get(&intent.zone).map(|p| p.maintenance.zone.clone()) else {
            warn!(replica = self.id, zone = intent.zone, "write intent for a zone this replica does not serve (ignored)");
            return;
        };
        let serial = soa_serial(&self.named, &zone, self.id, &self.metrics).await;
        if intent.seq <= executed {
            if serial_before(serial, intent.serial) {
                self.metrics.inc_execute_error();
                tracing::error!(
                    replica = self.id,
                    serial,
                    recorded = intent.serial,
                    seq = intent.seq,
                    "named's zone is older than what this replica executed (its journal lost writes); it needs a state transfer"
                );
            }
            return;
        }
        let applied = serial != intent.serial;
        info!(
            replica = self.id,
            seq = intent.seq,
            index = intent.index,
            serial_before = intent.serial,
            serial,
            applied,
            "resuming the batch a crash interrupted at a write"
        );
        self.core.resume_at(Resume { seq: intent.seq, index: intent.index, state: intent.state, applied });
    }

    /// Records, durably, the zone change about to go to named (item `index` of batch
    /// `seq`) with named's serial now and the state before it (`state`, [`WriteIntent`]); the change
    /// may start once this is done. Every zone change gets one, so the latest names the
    /// last change that may have reached named: a serial that moved after it is its doing.
    /// A signing or re-signing slice interrupted by a crash runs again (the same signing,
    /// or the slice's own journal), so only for a write does "applied" decide anything.
    fn intent(&self, seq: u64, index: u32, zone: u16, state: exec::ExecState) -> impl std::future::Future<Output = ()> + Send + 'static {
        let apex = self.zones.get(&zone).or(self.zones.values().next()).map(|p| p.maintenance.zone.clone()).unwrap_or_else(hickory_proto::rr::Name::root);
        let (named, path, id, metrics) = (self.named.clone(), WriteIntent::path_for(&self.state_file), self.id, self.metrics.clone());
        async move {
            let serial = soa_serial(&named, &apex, id, &metrics).await;
            let intent = WriteIntent { seq, index, zone, serial, state };
            let stored = tokio::task::spawn_blocking(move || intent.store(&path).map_err(|e| e.to_string())).await;
            if let Err(e) = stored.map_err(|e| e.to_string()).and_then(|r| r) {
                warn!(replica = id, seq, error = %e, "cannot record the zone change's intent; a crash now would run the batch again from its start");
            }
        }
    }

    /// The batch with the reply handles this gateway holds for its own requests.
    fn resolve(&self, batch: Batch) -> Delivered<ReplyTo> {
        let executed = self.core.state().executed;
        if let Some(base) = batch.base.filter(|_| batch.seq > executed) {
            if let Ok(mut bases) = self.bases.lock() {
                bases.insert(batch.seq, base);
                while bases.len() > BASES_KEPT {
                    bases.pop_first();
                }
            }
        }
        let requests = batch
            .requests
            .into_iter()
            .map(|request| {
                if batch.seq <= executed {
                    return Item { origin: request.origin, payload: request.payload, reply: None };
                }
                let mine = request.origin == self.id;
                let entry = if mine { self.pending.take(&(request.client, request.number)) } else { None };
                let reply = match entry {
                    Some(entry) if entry.matches(&request.payload) => {
                        self.metrics.observe_ordering_us(entry.arrived.elapsed().as_micros() as u64);
                        self.pending.delivered();
                        Some(entry.reply)
                    }
                    Some(_) => {
                        // Ordered under our identity but not what we submitted: a forged
                        // request. Every replica still executes it (the order is agreed); we
                        // only refuse to hand its answer to our client, who will retry.
                        warn!(
                            replica = self.id,
                            seq = batch.seq,
                            client = request.client,
                            number = request.number,
                            "delivered request differs from what this gateway submitted"
                        );
                        self.metrics.inc_dropped("forged_request");
                        None
                    }
                    None => None,
                };
                Item { origin: request.origin, payload: request.payload, reply }
            })
            .collect();
        Delivered { seq: batch.seq, time_us: batch.time.0, checkpoint_due: batch.checkpoint_due, requests }
    }

    async fn perform(&mut self, command: Command<ReplyTo>, events: &mpsc::UnboundedSender<Event>) {
        match command {
            Command::Answer { reply, bytes } => {
                if let Delivery::Dropped(why) = reply.try_send(bytes) {
                    self.metrics.inc_dropped(why);
                }
            }
            Command::Read { id, transfer, tcp, message, reply } => self.read(id, transfer, tcp, message, reply, events),
            Command::Write { seq, index, message, times } => self.write(seq, index, message, times, events),
            Command::BeginSigning { zone, seq, times } => self.begin_signing(zone, seq, times, events),
            Command::FinishSigning { zone, seq, run, times } => self.finish_signing(zone, seq, run.seq, times, events),
            Command::ResignSlice { zone, seq, times, due_before_s, max_rrsets } => self.resign_slice(zone, seq, times, due_before_s, max_rrsets, events),
            Command::DigestZone { seq } => self.digest_zones(seq, events),
            Command::ChangeZoneSet { seq, index, change, zones } => self.change_zone_set(seq, index, &change, zones, events).await,
            Command::Checkpoint { seq, digest, state } => self.checkpoint(seq, digest, state).await,
            Command::Persist(state) => self.persist(state).await,
            Command::Executed(seq) => {
                self.executed.send_replace(seq);
                self.metrics.update_status(|s| s.last_executed = seq);
                self.metrics.set_hostile_writes(self.core.hostile_writes());
            }
            Command::AbandonWrite { seq, index } => {
                // The task that keeps sending it goes; named may still hold the write if it
                // took it after all (its zone then differs at the next checkpoint, and the
                // certified state repairs it, docs/DETERMINISM.md "Abandoned writes").
                let task = self.write_task.lock().unwrap_or_else(|e| e.into_inner()).take_if(|(at, _)| *at == (seq, index));
                if let Some((_, task)) = task {
                    task.abort();
                }
                let _ = self.times.send(None);
                self.metrics.inc_execute_error();
                self.metrics.update_status(|s| s.writes_abandoned += 1);
                warn!(replica = self.id, seq, index, "write abandoned: t+1 replicas' claims that it is stuck were committed before named answered it here");
            }
        }
    }

    /// A read (or a zone transfer): from the read cache, else from named in a task.
    fn read(&self, id: u64, transfer: bool, tcp: bool, message: Vec<u8>, reply: ReplyTo, events: &mpsc::UnboundedSender<Event>) {
        let fill = match transfer {
            true => None,
            false => match self.cache.lookup(&message, tcp) {
                // Answered here: no task, no round trip to named.
                Lookup::Hit(answer) => {
                    self.metrics.inc_read_cache(true);
                    crate::reads::read::deliver(&reply, answer, &self.metrics);
                    let _ = events.send(Event::ReadDone { id });
                    return;
                }
                Lookup::Miss(fill) => fill,
            },
        };
        let (named, metrics, events, cache) = (self.named.clone(), self.metrics.clone(), events.clone(), self.cache.clone());
        self.tasks.spawn(async move {
            if transfer {
                transfer_to(named, message, reply, metrics, id, events).await;
            } else {
                crate::reads::read::forward_read(&named, &cache, fill, &message, tcp, &reply, &metrics).await;
                let _ = events.send(Event::ReadDone { id });
            }
        });
    }

    /// The intent of the zone change the core is about to make (see [`Self::intent`]), in
    /// zone `zone` unless the core names another.
    fn change_intent(&self, zone: u16) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        self.core.zone_change_at().map(|(seq, index, z, state)| self.intent(seq, index, z.unwrap_or(zone), state))
    }

    /// An ordered write, sent to named until it answers (see [`write`]).
    fn write(&self, seq: u64, index: u32, message: Vec<u8>, times: SignatureTimes, events: &mpsc::UnboundedSender<Event>) {
        let (named, metrics, events, tx) = (self.writes.clone(), self.metrics.clone(), events.clone(), self.times.clone());
        let id = self.id;
        // Begun before named can apply the write; ended once it answered.
        let change = self.cache.begin_change();
        let intent = self.change_intent(self.zone_of(&message));
        let fail = self.fail_writes_naming.as_ref().is_some_and(|name| names_owner(&message, name));
        let task = self.tasks.spawn(async move {
            if let Some(intent) = intent {
                intent.await;
            }
            let _ = tx.send(Some(times));
            let answer = if fail {
                fail_for_test(&metrics, id, seq).await
            } else if crate::faults::seeded_bug::skip_this_write(id) {
                tracing::error!(replica = id, seq, "SEEDED BUG skip-write: this write is answered NOERROR and never given to named");
                exec::answer::error_answer(&message, 0).unwrap_or_default()
            } else {
                write(&named, &message, &metrics, id, seq).await
            };
            drop(change);
            let _ = tx.send(None);
            let _ = events.send(Event::WriteAnswered { seq, index, answer });
        });
        *self.write_task.lock().unwrap_or_else(|e| e.into_inner()) = Some(((seq, index), task));
    }

    /// Keeps the zone's content and starts this replica's part of a whole-zone signing in
    /// the background. The zone does not change here.
    fn begin_signing(&self, zone: u16, seq: u64, times: SignatureTimes, events: &mpsc::UnboundedSender<Event>) {
        let Some((maintenance, background)) = self.zone_parts(zone) else {
            let _ = events.send(Event::SigningBegun { seq, result: Err(format!("no zone has index {zone}")) });
            return;
        };
        // Decided at this point of the log (replicated state), before the content is taken.
        maintenance.rollover_finished.store(self.core.rollover_finished(zone), std::sync::atomic::Ordering::Relaxed);
        let (metrics, events) = (self.metrics.clone(), events.clone());
        let id = self.id;
        self.tasks.spawn(async move {
            let result = begin_signing(&maintenance, seq).await;
            match &result {
                Ok(total) => {
                    info!(replica = id, seq, rrsets = total, "whole-zone signing begun; it runs in the background");
                    metrics.zone_signing_begun(seq, *total);
                    start_background(&maintenance, &background, &metrics, seq, times, id);
                }
                Err(e) => {
                    metrics.inc_execute_error();
                    warn!(replica = id, zone = %maintenance.zone, seq, error = %e, "sign-zone could not begin; zone left as it was");
                }
            }
            let _ = events.send(Event::SigningBegun { seq, result: result.map(|_| ()) });
        });
    }

    /// Installs the zone signed in the background (signing `run` began), once this
    /// replica's part is done, or begins another round of it.
    fn finish_signing(&self, zone: u16, seq: u64, run: u64, times: SignatureTimes, events: &mpsc::UnboundedSender<Event>) {
        let Some((maintenance, background)) = self.zone_parts(zone) else {
            let _ = events.send(Event::SigningFinished { seq, result: Err(format!("no zone has index {zone}")) });
            return;
        };
        // Another round takes the signer's input again (after a restart too).
        maintenance.rollover_finished.store(self.core.rollover_finished(zone), std::sync::atomic::Ordering::Relaxed);
        let finish = FinishTask {
            id: self.id,
            maintenance,
            background,
            metrics: self.metrics.clone(),
            cache: self.cache.clone(),
            times: self.times.clone(),
            events: events.clone(),
            intent: self.change_intent(zone).map(|i| Box::pin(i) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>),
            // Another round signs with the signing's own times (its first round's).
            run_times: self.core.signing_run(zone).map_or(times, |(_, t)| t),
        };
        self.tasks.spawn(finish.run(seq, run, times));
    }

    /// A re-signing slice of zone `zone`.
    fn resign_slice(&self, zone: u16, seq: u64, times: SignatureTimes, due_before_s: u32, max_rrsets: u32, events: &mpsc::UnboundedSender<Event>) {
        let Some((maintenance, _)) = self.zone_parts(zone) else {
            let _ = events.send(Event::SliceDone { seq, result: Err(format!("no zone has index {zone}")) });
            return;
        };
        let (metrics, events, tx, cache) = (self.metrics.clone(), events.clone(), self.times.clone(), self.cache.clone());
        let id = self.id;
        let intent = self.change_intent(zone);
        self.tasks.spawn(async move {
            if let Some(intent) = intent {
                intent.await;
            }
            let _ = tx.send(Some(times));
            let started = std::time::Instant::now();
            let result = resign_slice(&maintenance, &cache, seq, due_before_s, max_rrsets, times).await;
            let _ = tx.send(None);
            let result = match result {
                Ok(report) => {
                    if report.resigned > 0 {
                        info!(
                            replica = id,
                            seq,
                            resigned = report.resigned,
                            due = report.due,
                            read = if report.incremental { "ixfr" } else { "axfr" },
                            ms = started.elapsed().as_millis() as u64,
                            "re-signing slice"
                        );
                    }
                    metrics.observe_zone_slice(zone, report, started.elapsed());
                    Ok(report.resigned)
                }
                Err(e) => {
                    metrics.inc_execute_error();
                    warn!(replica = id, seq, error = %e, "re-signing slice failed; zone left as it was");
                    Err(e)
                }
            };
            let _ = events.send(Event::SliceDone { seq, result });
        });
    }

    /// Every zone's digest for checkpoint `seq`: the last ones again if no zone changed
    /// since, else read from named in a task.
    fn digest_zones(&self, seq: u64, events: &mpsc::UnboundedSender<Event>) {
        // The zone changes only by writes and signings, which advance the cache's epoch: at
        // the same epoch the zone, and so its digest, is the same.
        let keep = self.snapshots.is_some();
        let epoch = self.cache.quiet_epoch();
        let last = self.last_digest.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let (Some(epoch), Some((at, digests, records))) = (epoch, last) {
            if epoch == at {
                if keep {
                    remember_digested(&self.digested, seq, (*records).clone());
                }
                let _ = events.send(Event::ZoneDigest { seq, digests: Some(digests) });
                return;
            }
        }
        let zones: Vec<(u16, Arc<ZoneMaintenance>)> = self.zones.iter().map(|(i, p)| (*i, p.maintenance.clone())).collect();
        let (events, cache, last_digest, digested, metrics) =
            (events.clone(), self.cache.clone(), self.last_digest.clone(), self.digested.clone(), self.metrics.clone());
        let id = self.id;
        self.tasks.spawn(async move {
            let started = std::time::Instant::now();
            let digests = zone_digests(&zones, id).await.map(|(digests, lists)| {
                // What a checkpoint costs as the zone set grows (docs/BENCHMARKS.md, issue 28).
                metrics.checkpoint_digested(started.elapsed(), lists.len());
                for ((index, _), records) in zones.iter().zip(&lists) {
                    let serial = exec::zone_plan::soa_serial_of(records);
                    metrics.update_zone(*index, |z| z.serial = serial);
                }
                let records = Arc::new(lists);
                if keep {
                    remember_digested(&digested, seq, (*records).clone());
                }
                if let Some(before) = epoch {
                    // Kept only if no change began while the zones were read.
                    if cache.quiet_epoch() == Some(before) {
                        *last_digest.lock().unwrap_or_else(|e| e.into_inner()) = Some((before, digests.clone(), records));
                    }
                }
                digests
            });
            let _ = events.send(Event::ZoneDigest { seq, digests });
        });
    }

    /// Checkpoint `seq`: its certified digest remembered for the divergence check, its
    /// snapshot kept, the digest handed to the ordering.
    async fn checkpoint(&self, seq: u64, digest: Digest, state: ExecState) {
        let base = self.bases.lock().ok().and_then(|mut bases| {
            let base = bases.remove(&seq);
            bases.retain(|at, _| *at > seq);
            base
        });
        // The ordering folds its own table into what it certifies; this replica's copy of
        // that digest is what its divergence check and its snapshot go by.
        match base {
            Some(base) => {
                let certified = bft::checkpoint_state_digest(&digest, &base);
                if let Ok(mut own) = self.own_digests.lock() {
                    own.insert(seq, certified);
                    while own.len() > OWN_DIGESTS_KEPT {
                        own.pop_first();
                    }
                }
                self.keep_snapshot(seq, certified, base, state);
            }
            None => warn!(replica = self.id, seq, "no delivery base for this checkpoint: no snapshot kept, no divergence check"),
        }
        let _ = self.checkpoints.send((seq, digest)).await;
    }

    /// Records the execution state. Two fsyncs: off the runtime's worker threads (there are
    /// as many as cores, and the ordering and the clients need them meanwhile), but still
    /// finished before the next batch starts.
    async fn persist(&self, state: ExecState) {
        self.publish_last_signed(&state);
        let (path, executed) = (self.state_file.clone(), state.executed);
        // named holds the batch's writes: reads may go past it while it is written.
        self.executed.send_replace(executed);
        let stored = tokio::task::spawn_blocking(move || state.store(&path)).await;
        match stored {
            Ok(Ok(())) => {}
            // named holds the zone; a restart without this file re-executes from the last
            // recorded batch, which the outcome chain would then show.
            Ok(Err(e)) => warn!(replica = self.id, error = %e, "cannot record the execution state"),
            Err(e) => warn!(replica = self.id, error = %e, "cannot record the execution state"),
        }
        self.metrics.update_status(|s| s.last_executed = executed);
        self.metrics.set_hostile_writes(self.core.hostile_writes());
    }
}

/// The task that finishes a whole-zone signing at this replica (`Command::FinishSigning`).
struct FinishTask {
    id: u16,
    maintenance: Arc<ZoneMaintenance>,
    background: Arc<Background>,
    metrics: Arc<Metrics>,
    cache: Arc<ReadCache>,
    /// The write signing socket's times (the installation's update signs with them).
    times: watch::Sender<Option<SignatureTimes>>,
    events: mpsc::UnboundedSender<Event>,
    intent: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    /// The times another round signs with.
    run_times: SignatureTimes,
}

impl FinishTask {
    async fn run(self, seq: u64, run: u64, times: SignatureTimes) {
        // This replica's part, however long it takes (t+1 others are done).
        let part = part_done(&self.background, run).await;
        let started = std::time::Instant::now();
        let result = match part {
            Ok(()) => {
                if let Some(intent) = self.intent {
                    intent.await;
                }
                let change = self.cache.begin_change();
                let _ = self.times.send(Some(times));
                let r = finish_signing(&self.maintenance, seq, run).await;
                let _ = self.times.send(None);
                drop(change);
                r
            }
            Err(e) => Err(e),
        };
        let (id, metrics) = (self.id, &self.metrics);
        let result = match result {
            Ok(Finish::Round { changed, rrsets }) => {
                info!(replica = id, seq, previous = run, changed, "another round of the whole-zone signing begun");
                metrics.zone_signing_begun(seq, rrsets);
                start_background(&self.maintenance, &self.background, metrics, seq, self.run_times, id);
                let _ = self.events.send(Event::SigningRound { seq, changed });
                return;
            }
            Ok(Finish::Installed { changed }) => Ok(changed),
            Err(e) => Err(e),
        };
        match &result {
            Ok(changed) => {
                info!(replica = id, seq, began = run, changed, ms = started.elapsed().as_millis() as u64, "zone signed with the distributed key installed")
            }
            Err(e) => {
                metrics.inc_execute_error();
                warn!(replica = id, seq, error = %e, "whole-zone signing failed; zone left as it was");
            }
        }
        metrics.zone_signing_finished(started.elapsed());
        let _ = self.events.send(Event::SigningFinished { seq, result });
    }
}

/// Waits for this replica's part of background signing `run`, and its outcome.
async fn part_done(background: &Background, run: u64) -> Result<(), String> {
    let mut done = background.finished.subscribe();
    loop {
        let current = done.borrow_and_update().clone();
        if let Some((s, r)) = current {
            if s == run {
                return r;
            }
        }
        if done.changed().await.is_err() {
            return Err("the background signing went away".to_string());
        }
    }
}

impl<G: UpdateGate + 'static> Executor<G> {
    /// Each zone's last signing time, for its re-sign timer.
    fn publish_last_signed(&self, state: &exec::ExecState) {
        self.metrics.set_zone_schedules(state);
        for (&zone, parts) in &self.zones {
            parts.last_signed.store(state.zone(zone).last_signed_s, Ordering::Relaxed);
        }
    }

    /// Zone `zone`'s maintenance and background signing.
    fn zone_parts(&self, zone: u16) -> Option<(Arc<ZoneMaintenance>, Arc<Background>)> {
        let parts = self.zones.get(&zone)?;
        Some((parts.maintenance.clone(), parts.background.clone()))
    }

    fn start_background(&self, zone: u16, seq: u64, times: SignatureTimes) {
        match self.zone_parts(zone) {
            Some((maintenance, background)) => start_background(&maintenance, &background, &self.metrics, seq, times, self.id),
            None => warn!(replica = self.id, zone, "a background signing for a zone this replica does not serve (ignored)"),
        }
    }

    /// The index of the zone an update names in its zone section (the core refuses one naming
    /// no served zone before it reaches named); the first zone's when it names none.
    fn zone_of(&self, message: &[u8]) -> u16 {
        let first = self.zones.keys().next().copied().unwrap_or(0);
        if self.zones.len() < 2 {
            return first;
        }
        let Ok((apex, _)) = exec::auth::wire::read_name(message, exec::auth::wire::HEADER_LEN) else { return first };
        zone_by_apex(&self.zones, &apex).unwrap_or(first)
    }

    /// Keeps the snapshot of checkpoint `seq` (its digested records, the execution state at
    /// that position and the ordering's delivery base) for peers that need state transfer;
    /// written off the executor.
    fn keep_snapshot(&self, seq: u64, digest: Digest, base: bft::DeliveryBase, state: ExecState) {
        let Some(store) = self.snapshots.clone() else { return };
        let records = self.digested.lock().ok().and_then(|mut map| map.remove(&seq));
        let Some(records) = records else { return };
        let zones =
            self.zones.values().zip(records).map(|(p, records)| SnapshotZone { name: canonical_zone_name(&p.maintenance.zone.to_ascii()), records }).collect();
        let (id, metrics) = (self.id, self.metrics.clone());
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            match store.save(&Snapshot { seq, digest, state, zones, base: base.encode() }) {
                Ok(bytes) => metrics.snapshot_kept(bytes, started.elapsed()),
                Err(e) => warn!(replica = id, seq, error = %e, "cannot keep the checkpoint snapshot"),
            }
        });
    }
}

/// Sends an ordered write to named until named answers it. A write named never received
/// (named restarting) is sent once it is back; one whose answer was lost is sent again,
/// which an update's own prerequisites make safe or visibly different (its rcode goes
/// into the outcome chain). Only a transient failure is retried: one the bytes themselves
/// cause (the core sends none such, see `exec::gate::forwardable`) gets FORMERR at once,
/// which is a function of the bytes, so the same at every replica.
async fn write(named: &Forwarder, message: &[u8], metrics: &Metrics, id: u16, seq: u64) -> Vec<u8> {
    let mut pause = Duration::from_millis(50);
    loop {
        match named.forward_tcp(message).await {
            Ok(answer) => return answer,
            Err(e) if !e.is_transient() => {
                metrics.inc_execute_error();
                tracing::error!(replica = id, seq, error = %e, "an ordered write cannot be sent to named as it is; recorded as FORMERR");
                return exec::answer::error_answer(message, exec::answer::RCODE_FORMERR).unwrap_or_default();
            }
            Err(e) => {
                metrics.inc_execute_error();
                warn!(replica = id, seq, error = %e, "named did not answer an ordered write; waiting for it and sending again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(WRITE_RETRY_MAX);
            }
        }
    }
}

/// The test hook's write (`Executor::fail_writes_naming`): the transient failure `write`
/// retries, for ever, without sending anything to named.
async fn fail_for_test(metrics: &Metrics, id: u16, seq: u64) -> Vec<u8> {
    let mut pause = Duration::from_millis(50);
    loop {
        metrics.inc_execute_error();
        warn!(replica = id, seq, "named did not answer an ordered write; waiting for it and sending again (test hook: replica.test_fail_writes_naming)");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(WRITE_RETRY_MAX);
    }
}

/// Whether an update has a record (prerequisite or update section) owned by `name`.
fn names_owner(message: &[u8], name: &hickory_proto::rr::Name) -> bool {
    match hickory_proto::op::Message::from_vec(message) {
        Ok(m) => m.answers.iter().chain(&m.authorities).any(|r| &r.name == name),
        Err(_) => false,
    }
}

/// named's SOA serial for the zone, waiting for named however long it takes (it may be
/// starting or restarting).
async fn soa_serial(named: &Forwarder, zone: &hickory_proto::rr::Name, id: u16, metrics: &Metrics) -> u32 {
    let mut pause = Duration::from_millis(50);
    loop {
        let query = named_glue::forward::build_query(rand_id(), zone, hickory_proto::rr::RecordType::SOA);
        let answer = match query {
            Ok(query) => named.forward_udp(&query).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let serial = answer.and_then(|bytes| {
            let message = hickory_proto::op::Message::from_vec(&bytes).map_err(|e| e.to_string())?;
            message
                .answers
                .iter()
                .find_map(|r| match &r.data {
                    hickory_proto::rr::RData::SOA(soa) => Some(soa.serial),
                    _ => None,
                })
                .ok_or_else(|| format!("no SOA in named's answer (rcode {})", message.metadata.response_code))
        });
        match serial {
            Ok(serial) => return serial,
            Err(e) => {
                // named failing under a zone change is an execution error like a failed write.
                metrics.inc_execute_error();
                warn!(replica = id, error = %e, "named did not tell the zone's serial; asking again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(WRITE_RETRY_MAX);
            }
        }
    }
}

/// Keeps the zone's content for a background signing; a zone that cannot be read is
/// retried (named restarting), since giving up on a local timer would make this replica
/// differ. Returns the RRsets it will sign.
async fn begin_signing(maintenance: &ZoneMaintenance, seq: u64) -> Result<u64, String> {
    let mut pause = Duration::from_millis(100);
    loop {
        match maintenance.begin_signing(seq).await {
            Ok(total) => return Ok(total),
            Err(ZoneError::Transfer(e)) => {
                warn!(error = %e, "zone unreadable for a whole-zone signing; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(WRITE_RETRY_MAX);
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn rand_id() -> u16 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    (nanos ^ (nanos >> 16)) as u16
}

/// Runs this replica's part of background signing `seq` (signing the kept content through
/// the background socket) in a task of its own; reports on `background.finished`.
fn start_background(maintenance: &Arc<ZoneMaintenance>, background: &Arc<Background>, metrics: &Arc<Metrics>, seq: u64, times: SignatureTimes, id: u16) {
    let (maintenance, background, metrics) = (maintenance.clone(), background.clone(), metrics.clone());
    tokio::spawn(async move {
        background.times.send_replace(Some(times));
        let started = std::time::Instant::now();
        let result = maintenance.sign_in_background(seq, times).await.map_err(|e| e.to_string());
        background.times.send_replace(None);
        match &result {
            // signatures: those this round asked for (a later round's are what changed).
            Ok(()) => info!(
                replica = id,
                seq,
                ms = started.elapsed().as_millis() as u64,
                signatures = metrics.zone_signed(),
                "this replica's part of the whole-zone signing is done"
            ),
            Err(e) => warn!(replica = id, seq, error = %e, "this replica's part of the whole-zone signing failed"),
        }
        metrics.zone_signing_part_done();
        background.finished.send_replace(Some((seq, result)));
    });
}

/// Installs the zone signed in the background. named restarting, or a zone that cannot be
/// read, is waited for and the installation done again (it is journaled: the same zone
/// and the same update on top).
async fn finish_signing(maintenance: &ZoneMaintenance, seq: u64, run: u64) -> Result<Finish, String> {
    let mut pause = Duration::from_millis(100);
    loop {
        match maintenance.finish_signing(seq, run).await {
            Ok(changed) => return Ok(changed),
            Err(e @ (ZoneError::Transfer(_) | ZoneError::Restart(_))) => {
                warn!(error = %e, "installing the signed zone: named not ready; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(WRITE_RETRY_MAX);
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Whether `zones` are exactly the zone set `set` (indices and names).
fn serves_exactly(zones: &ZoneMap, set: &std::collections::BTreeMap<u16, exec::ZoneEntry>) -> bool {
    zones.len() == set.len()
        && zones.iter().zip(set).all(|((i, p), (j, e))| i == j && canonical_zone_name(&p.maintenance.zone.to_ascii()) == canonical_zone_name(&e.name))
}

/// Deletes the zone files and journals of zones no longer served (named stopped).
fn remove_zone_files(files: &[(PathBuf, PathBuf)]) {
    for (zone_file, journal) in files {
        for file in [zone_file, journal] {
            if let Err(e) = std::fs::remove_file(file) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn!(file = %file.display(), error = %e, "cannot delete a removed zone's file");
                }
            }
        }
    }
}

/// Keeps the records checkpoint `seq`'s digest was computed from, for its snapshot; only
/// the checkpoint being executed is waited for.
fn remember_digested(digested: &DigestedRecords, seq: u64, records: Vec<Vec<Vec<u8>>>) {
    if let Ok(mut map) = digested.lock() {
        map.insert(seq, records);
        while map.len() > 2 {
            map.pop_first();
        }
    }
}

/// A re-signing slice; a zone that cannot be read is retried (named restarting), since
/// giving up on a local timer would make this replica differ. named's refusal is an
/// outcome, the same on every honest replica.
async fn resign_slice(
    maintenance: &ZoneMaintenance,
    cache: &Arc<ReadCache>,
    seq: u64,
    due_before_s: u32,
    max_rrsets: u32,
    times: SignatureTimes,
) -> Result<crate::zone::SliceReport, String> {
    let mut pause = Duration::from_millis(100);
    loop {
        match maintenance.resign_slice(seq, due_before_s, max_rrsets, times, || cache.begin_change()).await {
            Ok(r) => return Ok(r),
            Err(ZoneError::Transfer(e)) => {
                warn!(error = %e, "zone unreadable for a re-signing slice; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(WRITE_RETRY_MAX);
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The digest of named's zone (see [`zone_digest_of`]) and the records it covers.
async fn zone_digest(maintenance: &ZoneMaintenance, id: u16) -> Option<([u8; 32], Vec<Vec<u8>>)> {
    let mut pause = Duration::from_millis(100);
    for attempt in 1..=DIGEST_ATTEMPTS {
        match maintenance.zone_records().await {
            Ok(mut records) => {
                let digest = zone_digest_of(&mut records);
                return Some((digest, records));
            }
            Err(e) => {
                warn!(replica = id, attempt, error = %e, "zone digest unavailable; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
    warn!(replica = id, "zone digest unavailable; this checkpoint will not match");
    None
}

/// Every zone's digest and records, in zone index order; one that cannot be read spoils
/// the checkpoint.
async fn zone_digests(zones: &[(u16, Arc<ZoneMaintenance>)], id: u16) -> Option<(Vec<[u8; 32]>, Vec<Vec<Vec<u8>>>)> {
    let (mut digests, mut lists) = (Vec::with_capacity(zones.len()), Vec::with_capacity(zones.len()));
    for (_, maintenance) in zones {
        let (digest, records) = zone_digest(maintenance, id).await?;
        digests.push(digest);
        lists.push(records);
    }
    Some((digests, lists))
}

/// A zone transfer: named's snapshot is taken when it starts answering, so the core may
/// go on to later writes once the first message is in (`crate::reads::transfer::relay` returns
/// then); the rest streams to the client in a task of its own.
async fn transfer_to(named: Forwarder, message: Vec<u8>, reply: ReplyTo, metrics: Arc<Metrics>, id: u64, events: mpsc::UnboundedSender<Event>) {
    crate::reads::transfer::relay(&named, message, reply, metrics).await;
    let _ = events.send(Event::ReadDone { id });
}
