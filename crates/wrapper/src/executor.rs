//! Performs what the execution core (`crate::exec`) decides, against the local named.
//!
//! This is the thin tokio side: it hands delivered batches (with the reply handles this
//! gateway holds) to the core, carries out its commands, and reports their results as
//! events. It decides nothing itself and never waits on a client: answers are handed to
//! bounded per-connection queues that drop when full. Writes and whole-zone signings
//! wait for named however long it takes (retrying while it restarts) rather than give up
//! on a local timer, since giving up would make this replica differ from the others.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bft::{Batch, Digest};
use named_glue::forward::Forwarder;
use named_glue::signer::SignatureTimes;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::classify::{classify, Verdict};
use crate::envelope::Op;
use crate::exec::{Command, Delivered, Event, ExecCore, Item, UpdateGate};
use crate::listener::{Delivery, ReplyTo};
use crate::metrics::Metrics;
use crate::pending::Pending;
use crate::read::{Lookup, ReadCache};
use crate::statexfer::{write_zone_files, DigestedRecords, Install, Snapshot, SnapshotStore};
use crate::zone::{zone_digest_of, ZoneError, ZoneMaintenance};

/// How long the later messages of a zone transfer may wait for room in the client's
/// queue (the transfer runs in a task of its own; the executor does not wait for it).
/// Pause between attempts while named does not answer a write.
const WRITE_RETRY_MAX: Duration = Duration::from_secs(2);
/// Attempts at reading the zone for a checkpoint digest before reporting it unavailable.
const DIGEST_ATTEMPTS: u32 = 10;

pub struct Executor<G: UpdateGate> {
    pub id: u16,
    pub core: ExecCore<ReplyTo, G>,
    /// Reads (their own timeouts: a read that fails gets SERVFAIL and changes nothing).
    pub named: Forwarder,
    /// Writes: long per-read timeout; on failure the write is sent again once named answers.
    pub writes: Forwarder,
    pub pending: Arc<Pending>,
    pub times: watch::Sender<Option<SignatureTimes>>,
    pub checkpoints: mpsc::Sender<(u64, Digest)>,
    pub metrics: Arc<Metrics>,
    pub maintenance: Arc<ZoneMaintenance>,
    /// Where the execution state is persisted after every batch.
    pub state_file: PathBuf,
    /// The state's last signing time, shared with the re-sign timer.
    pub last_signed: Arc<AtomicU64>,
    /// named's answers to reads, emptied around every write and signing (`crate::read_cache`).
    pub cache: Arc<ReadCache>,
    /// The last zone digest, the cache epoch it was computed at, and the records it was
    /// computed from (a checkpoint's snapshot when the digest is reused).
    pub last_digest: Arc<Mutex<Option<(u64, [u8; 32], Arc<Vec<Vec<u8>>>)>>>,
    /// Where the snapshot of every checkpoint is kept for peers that need state transfer.
    pub snapshots: Option<SnapshotStore>,
    /// The records each pending checkpoint digest was computed from.
    pub digested: DigestedRecords,
    /// Verified snapshots to install (from state transfer).
    pub installs: Option<mpsc::Receiver<Install>>,
    /// This replica's own state digest at each recent checkpoint, to compare with the
    /// certified one (`crate::statexfer::watch_divergence`).
    pub own_digests: OwnDigests,
    /// The checkpoint at which this replica's state was found to differ from the certified
    /// one (0: never). Until a transferred state after it is installed, no batch is executed:
    /// executing on a diverged state would only spread the difference.
    pub diverged_at: Option<watch::Receiver<u64>>,
}

/// Own checkpoint digests by batch, the newest few.
pub type OwnDigests = Arc<Mutex<std::collections::BTreeMap<u64, Digest>>>;
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
        let state = self.core.state();
        self.last_signed.store(state.last_signed_s, Ordering::Relaxed);
        if state.executed > 0 {
            info!(replica = self.id, last = state.executed, "resuming after executed batch");
        }
        loop {
            let paused = *diverged_at.borrow_and_update() > installed_at;
            let commands = tokio::select! {
                biased;
                Some(event) = events.recv() => self.core.handle(event),
                Some((snapshot, ack)) = installs.recv(), if self.core.is_idle() => {
                    let seq = snapshot.seq;
                    let result = self.install(snapshot).await;
                    if result.is_ok() {
                        installed_at = installed_at.max(seq);
                    }
                    let _ = ack.send(result);
                    Vec::new()
                }
                // A divergence found while this replica was executing: stop taking batches.
                Ok(()) = diverged_at.changed(), if !paused => Vec::new(),
                batch = batches.recv(), if self.core.is_idle() && !paused => match batch {
                    Some(batch) => {
                        let delivered = self.resolve(batch);
                        self.core.deliver(delivered)
                    }
                    None => return,
                },
            };
            for command in commands {
                self.perform(command, &events_tx).await;
            }
        }
    }

    /// Installs a snapshot that state transfer fetched and verified: named is stopped, its
    /// zone file replaced by the snapshot's records and its journal removed, named started
    /// again; then the execution state becomes the snapshot's and is persisted. Batches up to
    /// the snapshot's checkpoint are skipped from now on.
    async fn install(&mut self, snapshot: Snapshot) -> Result<(), String> {
        let Snapshot { seq, state, records, .. } = snapshot;
        info!(replica = self.id, seq, records = records.len(), "installing the state transferred from peers");
        let (zone_file, journal) = (self.maintenance.conf.zone_file.clone(), self.maintenance.conf.journal.clone());
        // The zone changes under the read cache and the reused checkpoint digest: neither may
        // outlive the install (a stale digest made the next checkpoint differ).
        let change = self.cache.begin_change();
        *self.last_digest.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let written = self
            .maintenance
            .supervisor
            .replace_files(move || write_zone_files(&zone_file, &journal, &records))
            .await
            .map_err(|e| format!("named did not come back on the transferred zone: {e}"))?;
        drop(change);
        written.map_err(|e| format!("writing the transferred zone: {e}"))?;
        self.core.install(state.clone());
        state.store(&self.state_file).map_err(|e| e.to_string())?;
        self.last_signed.store(state.last_signed_s, Ordering::Relaxed);
        self.metrics.update_status(|s| s.last_executed = state.executed);
        info!(replica = self.id, seq, "transferred state installed");
        Ok(())
    }

    /// The batch with the reply handles this gateway holds for its own requests.
    fn resolve(&self, batch: Batch) -> Delivered<ReplyTo> {
        let executed = self.core.state().executed;
        let requests = batch
            .requests
            .into_iter()
            .map(|request| {
                if batch.seq <= executed {
                    return Item { origin: request.origin, payload: request.payload, reply: None };
                }
                if let Ok(Op::Dns { tcp, message }) = Op::decode(&request.payload) {
                    if let Verdict::Order(kind) = classify(&message, tcp) {
                        self.metrics.inc_request(kind);
                    }
                }
                let mine = request.origin == self.id;
                let entry = if mine { self.pending.take(&(request.client, request.number)) } else { None };
                let reply = match entry {
                    Some(entry) if entry.matches(&request.payload) => {
                        self.metrics.observe_ordering_us(entry.arrived.elapsed().as_micros() as u64);
                        Some(entry.reply)
                    }
                    Some(_) => {
                        // Ordered under our identity but not what we submitted: a forged
                        // request. Every replica still executes it (the order is agreed); we
                        // only refuse to hand its answer to our client, who will retry.
                        warn!(replica = self.id, seq = batch.seq, client = request.client, number = request.number, "delivered request differs from what this gateway submitted");
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

    async fn perform(&self, command: Command<ReplyTo>, events: &mpsc::UnboundedSender<Event>) {
        match command {
            Command::Answer { reply, bytes } => {
                if let Delivery::Dropped(why) = reply.try_send(bytes) {
                    self.metrics.inc_dropped(why);
                }
            }
            Command::Read { id, transfer, tcp, message, reply } => {
                let fill = match transfer {
                    true => None,
                    false => match self.cache.lookup(&message, tcp) {
                        // Answered here: no task, no round trip to named.
                        Lookup::Hit(answer) => {
                            self.metrics.inc_read_cache(true);
                            crate::read::deliver(&reply, answer, &self.metrics);
                            let _ = events.send(Event::ReadDone { id });
                            return;
                        }
                        Lookup::Miss(fill) => fill,
                    },
                };
                let (named, metrics, events, cache) = (self.named.clone(), self.metrics.clone(), events.clone(), self.cache.clone());
                tokio::spawn(async move {
                    if transfer {
                        transfer_to(named, message, reply, metrics, id, events).await;
                    } else {
                        crate::read::forward_read(&named, &cache, fill, &message, tcp, &reply, &metrics).await;
                        let _ = events.send(Event::ReadDone { id });
                    }
                });
            }
            Command::Write { seq, index, message, times } => {
                let (named, metrics, events, tx) = (self.writes.clone(), self.metrics.clone(), events.clone(), self.times.clone());
                let id = self.id;
                // Begun before named can apply the write; ended once it answered.
                let change = self.cache.begin_change();
                tokio::spawn(async move {
                    let _ = tx.send(Some(times));
                    let answer = write(&named, &message, &metrics, id, seq).await;
                    drop(change);
                    let _ = tx.send(None);
                    let _ = events.send(Event::WriteAnswered { seq, index, answer });
                });
            }
            Command::SignZone { seq, times } => {
                let (maintenance, metrics, events, tx) = (self.maintenance.clone(), self.metrics.clone(), events.clone(), self.times.clone());
                let id = self.id;
                let change = self.cache.begin_change();
                tokio::spawn(async move {
                    let _ = tx.send(Some(times));
                    let result = sign_zone(&maintenance, times).await;
                    drop(change);
                    let _ = tx.send(None);
                    match &result {
                        Ok(()) => info!(replica = id, seq, "zone signed with the distributed key"),
                        Err(e) => {
                            metrics.inc_execute_error();
                            warn!(replica = id, seq, error = %e, "sign-zone failed; zone left as it was");
                        }
                    }
                    let _ = events.send(Event::SignZoneDone { seq, result });
                });
            }
            Command::ResignSlice { seq, times, due_before_s, max_rrsets } => {
                let (maintenance, metrics, events, tx) = (self.maintenance.clone(), self.metrics.clone(), events.clone(), self.times.clone());
                let id = self.id;
                tokio::spawn(async move {
                    let _ = tx.send(Some(times));
                    let started = std::time::Instant::now();
                    let result = resign_slice(&maintenance, seq, due_before_s, max_rrsets, times).await;
                    let _ = tx.send(None);
                    let result = match result {
                        Ok(report) => {
                            if report.resigned > 0 {
                                info!(replica = id, seq, resigned = report.resigned, due = report.due, ms = started.elapsed().as_millis() as u64, "re-signing slice");
                            }
                            metrics.observe_slice(report, started.elapsed());
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
            Command::DigestZone { seq } => {
                // The zone changes only by writes and signings, which advance the cache's
                // epoch: at the same epoch the zone, and so its digest, is the same.
                let keep = self.snapshots.is_some();
                let epoch = self.cache.quiet_epoch();
                let last = self.last_digest.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let (Some(epoch), Some((at, digest, records))) = (epoch, last) {
                    if epoch == at {
                        if keep {
                            remember_digested(&self.digested, seq, (*records).clone());
                        }
                        let _ = events.send(Event::ZoneDigest { seq, digest: Some(digest) });
                        return;
                    }
                }
                let (maintenance, events, cache, last_digest, digested) =
                    (self.maintenance.clone(), events.clone(), self.cache.clone(), self.last_digest.clone(), self.digested.clone());
                let id = self.id;
                tokio::spawn(async move {
                    let digest = zone_digest(&maintenance, id).await.map(|(digest, records)| {
                        let records = Arc::new(records);
                        if keep {
                            remember_digested(&digested, seq, (*records).clone());
                        }
                        if let Some(before) = epoch {
                            // Kept only if no change began while the zone was read.
                            if cache.quiet_epoch() == Some(before) {
                                *last_digest.lock().unwrap_or_else(|e| e.into_inner()) = Some((before, digest, records));
                            }
                        }
                        digest
                    });
                    let _ = events.send(Event::ZoneDigest { seq, digest });
                });
            }
            Command::Checkpoint { seq, digest } => {
                if let Ok(mut own) = self.own_digests.lock() {
                    own.insert(seq, digest);
                    while own.len() > OWN_DIGESTS_KEPT {
                        own.pop_first();
                    }
                }
                self.keep_snapshot(seq, digest);
                let _ = self.checkpoints.send((seq, digest)).await;
            }
            Command::Persist(state) => {
                if let Err(e) = state.store(&self.state_file) {
                    // named holds the zone; a restart without this file re-executes from
                    // the last recorded batch, which the outcome chain would then show.
                    warn!(replica = self.id, error = %e, "cannot record the execution state");
                }
                self.last_signed.store(state.last_signed_s, Ordering::Relaxed);
                self.metrics.update_status(|s| s.last_executed = state.executed);
            }
        }
    }
}

impl<G: UpdateGate + 'static> Executor<G> {
    /// Keeps the snapshot of checkpoint `seq` (its digested records and the execution state
    /// at that position) for peers that need state transfer; written off the executor.
    fn keep_snapshot(&self, seq: u64, digest: Digest) {
        let Some(store) = self.snapshots.clone() else { return };
        let records = self.digested.lock().ok().and_then(|mut map| map.remove(&seq));
        let Some(records) = records else { return };
        let mut state = self.core.state().clone();
        state.executed = seq;
        let id = self.id;
        tokio::task::spawn_blocking(move || {
            if let Err(e) = store.save(&Snapshot { seq, digest, state, records }) {
                warn!(replica = id, seq, error = %e, "cannot keep the checkpoint snapshot");
            }
        });
    }
}

/// Sends an ordered write to named until named answers it. A write named never received
/// (named restarting) is sent once it is back; one whose answer was lost is sent again,
/// which an update's own prerequisites make safe or visibly different (its rcode goes
/// into the outcome chain).
async fn write(named: &Forwarder, message: &[u8], metrics: &Metrics, id: u16, seq: u64) -> Vec<u8> {
    let mut pause = Duration::from_millis(50);
    loop {
        match named.forward_tcp(message).await {
            Ok(answer) => return answer,
            Err(e) => {
                metrics.inc_execute_error();
                warn!(replica = id, seq, error = %e, "named did not answer an ordered write; waiting for it and sending again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(WRITE_RETRY_MAX);
            }
        }
    }
}

/// A whole-zone signing. If named does not come back on the signed zone, wait for it:
/// the zone file is already replaced, so the signing did happen.
async fn sign_zone(maintenance: &ZoneMaintenance, times: SignatureTimes) -> Result<(), String> {
    match maintenance.sign_zone(times).await {
        Ok(()) => Ok(()),
        Err(ZoneError::Restart(e)) => {
            warn!(error = %e, "named is slow to come back on the signed zone; waiting");
            while maintenance.supervisor.wait_ready().await.is_err() {}
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Keeps the records checkpoint `seq`'s digest was computed from, for its snapshot; only
/// the checkpoint being executed is waited for.
fn remember_digested(digested: &DigestedRecords, seq: u64, records: Vec<Vec<u8>>) {
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
async fn resign_slice(maintenance: &ZoneMaintenance, seq: u64, due_before_s: u32, max_rrsets: u32, times: SignatureTimes) -> Result<crate::zone::SliceReport, String> {
    let mut pause = Duration::from_millis(100);
    loop {
        match maintenance.resign_slice(seq, due_before_s, max_rrsets, times).await {
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

/// A zone transfer: named's snapshot is taken when it starts answering, so the core may
/// go on to later writes once the first message is in (`crate::transfer::relay` returns
/// then); the rest streams to the client in a task of its own.
async fn transfer_to(named: Forwarder, message: Vec<u8>, reply: ReplyTo, metrics: Arc<Metrics>, id: u64, events: mpsc::UnboundedSender<Event>) {
    crate::transfer::relay(&named, message, reply, metrics).await;
    let _ = events.send(Event::ReadDone { id });
}

/// The SERVFAIL named would give for a request (id, opcode, question, OPT kept).
pub fn servfail(request: &[u8]) -> Option<Vec<u8>> {
    crate::answer::error_answer(request, crate::answer::RCODE_SERVFAIL)
}
