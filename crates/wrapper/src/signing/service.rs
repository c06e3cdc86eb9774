//! The signing core under tokio: named's requests come in through named-glue's
//! signing socket (as `Signer::sign`), peers' messages through mesh channel 1.
//!
//! The core's jobs (this replica's shares, combinations with their proof checks) run on the
//! blocking thread pool, at most `workers` at once (one per core by default), so the shares of
//! different signing sessions are computed in parallel and the loop never waits on one.
//! Outstanding jobs are bounded by the core's session limit (at most three per session).
//!
//! Each zone has its own core (its key share, its session limits, so a zone being signed
//! whole cannot take another zone's sessions), RSA's or EC's as the zone's key is
//! (`zone_core`); the worker pool is shared, jobs taking their turn in the order they were
//! made. A request from named names its key by signer, algorithm
//! and key tag, and only a configured zone's own triple is signed, with that zone's key.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hickory_proto::rr::Name;
use mesh::{MeshSender, CHANNEL_SIGNING};
use named_glue::signer::{SignError, SignFuture, SignRequest, Signer};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::split::JobTimes;
use super::wire::{SignEnvelope, WireFormat, ZoneMessage};
use super::zone_core::{self, ZoneCore, ZoneJob, ZoneJobDone, ZoneOutput};
use super::Digest;
use crate::faults::byzantine::SigningFault;
use crate::ops::metrics::Metrics;

enum Command {
    /// `shared`: a whole-zone signing's request, which every replica makes at about the same
    /// time (`SignerCore::request_shared`).
    Sign { zone: u16, algorithm: u8, data: Vec<u8>, shared: bool, reply: oneshot::Sender<Result<Vec<u8>, SignError>> },
    /// The zone set changed (`ThresholdSigner::set_zone`): zone `zone` gets this core (`None`
    /// when this replica holds no share of its key), or goes.
    Zone { zone: u16, core: Option<Option<ZoneCore>> },
}

/// A zone's key as named's signing requests name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneSigningKey {
    /// The zone apex (the RRSIG signer name), absolute.
    pub signer: Name,
    pub algorithm: u8,
    pub key_tag: u16,
}

/// named-glue's `Signer`, backed by the task that runs the threshold protocol.
pub struct ThresholdSigner {
    commands: mpsc::Sender<Command>,
    /// By zone index (the execution state's stable index); changed with the zone set.
    keys: std::sync::RwLock<BTreeMap<u16, ZoneSigningKey>>,
}

impl ThresholdSigner {
    /// The zone whose key the request names: its signer name, algorithm and key tag must
    /// all be that zone's (a request naming zone A with B's key tag is no zone's).
    fn zone_of(&self, request: &SignRequest) -> Option<u16> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.iter().find(|(_, k)| k.key_tag == request.key_tag && k.algorithm == request.algorithm && k.signer == request.signer).map(|(i, _)| *i)
    }

    /// Zone `zone` is signed with `key` from now on, by `core` (`None`: this replica holds
    /// no share of the key, so it answers the zone's requests with an error and takes no
    /// part in its sessions); `None` for both: the zone was removed.
    pub async fn set_zone(&self, zone: u16, key: Option<ZoneSigningKey>, core: Option<ZoneCore>) {
        let present = key.is_some();
        match key {
            Some(key) => self.keys.write().unwrap_or_else(|e| e.into_inner()).insert(zone, key),
            None => self.keys.write().unwrap_or_else(|e| e.into_inner()).remove(&zone),
        };
        let core = present.then_some(core);
        // The loop ends only with the replica.
        let _ = self.commands.send(Command::Zone { zone, core }).await;
    }
}

impl Signer for ThresholdSigner {
    fn sign(&self, request: SignRequest) -> SignFuture {
        self.sign_as(request, false)
    }
}

impl ThresholdSigner {
    fn sign_as(&self, request: SignRequest, shared: bool) -> SignFuture {
        let commands = self.commands.clone();
        let zone = self.zone_of(&request);
        Box::pin(async move {
            let Some(zone) = zone else {
                return Err(SignError::UnknownKey { algorithm: request.algorithm, key_tag: request.key_tag });
            };
            let (reply, answer) = oneshot::channel();
            commands
                .send(Command::Sign { zone, algorithm: request.algorithm, data: request.data, shared, reply })
                .await
                .map_err(|_| SignError::ShuttingDown)?;
            answer.await.map_err(|_| SignError::ShuttingDown)?
        })
    }
}

/// The signer of background whole-zone signings: the same threshold signer, each
/// signature counted for the signing's progress. Every replica asks for every signature of
/// the zone, so these are shared sessions: k designated replicas make the shares and one
/// combines for all (docs/ARCHITECTURE.md, "Shared signing").
pub struct Counting {
    pub inner: Arc<ThresholdSigner>,
    pub metrics: Arc<Metrics>,
}

impl Signer for Counting {
    fn sign(&self, request: SignRequest) -> SignFuture {
        let (signing, metrics) = (self.inner.sign_as(request, true), self.metrics.clone());
        Box::pin(async move {
            let signature = signing.await?;
            metrics.inc_zone_signed();
            Ok(signature)
        })
    }
}

/// The signer of ordered writes (and re-signing slices): the same threshold signer, each
/// signature it returns counted in `done`, so that the executor's claim that a write is stuck
/// (`crate::execution::executor`) waits while a long update still gets its signatures.
pub struct Progressing {
    pub inner: Arc<ThresholdSigner>,
    pub done: Arc<std::sync::atomic::AtomicU64>,
}

impl Signer for Progressing {
    fn sign(&self, request: SignRequest) -> SignFuture {
        let (signing, done) = (self.inner.sign_as(request, false), self.done.clone());
        Box::pin(async move {
            let signature = signing.await?;
            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(signature)
        })
    }
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Share computations and combinations running at once: one per core.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Starts the task with one core per zone, by zone index (`None`: no share of that zone's
/// key here); returns the `Signer` to hand to named-glue's `SigningService` and the task (it
/// runs as long as the mesh and a signer are there: an earlier end is a failure).
pub fn spawn(
    zones: Vec<(u16, ZoneSigningKey, Option<ZoneCore>)>,
    mesh: MeshSender,
    incoming: mpsc::Receiver<(u16, Bytes)>,
    metrics: Arc<Metrics>,
    fault: SigningFault,
) -> (Arc<ThresholdSigner>, JoinHandle<()>) {
    let (commands, rx) = mpsc::channel(1024);
    let keys = zones.iter().map(|(i, key, _)| (*i, key.clone())).collect();
    let cores = zones.into_iter().map(|(i, _, core)| (i, core)).collect();
    let task = tokio::spawn(run(cores, mesh, incoming, rx, metrics, default_workers(), fault));
    (Arc::new(ThresholdSigner { commands, keys: std::sync::RwLock::new(keys) }), task)
}

/// When a job ran on its worker (the wait for a worker is not in it).
struct Ran {
    digest: Digest,
    combination: bool,
    start: Instant,
    end: Instant,
}

struct Waiter {
    reply: oneshot::Sender<Result<Vec<u8>, SignError>>,
    since: Instant,
}

/// Each zone's core by index; `None`: the zone is served without a share of its key here.
type Cores = BTreeMap<u16, Option<ZoneCore>>;

async fn run(
    mut cores: Cores,
    mesh: MeshSender,
    mut incoming: mpsc::Receiver<(u16, Bytes)>,
    mut commands: mpsc::Receiver<Command>,
    metrics: Arc<Metrics>,
    workers: usize,
    fault: SigningFault,
) {
    let mut garbage = Garbage { state: 0x2545_f491_4f6c_dd1d };
    let mut waiters: HashMap<(u16, Digest), Vec<Waiter>> = HashMap::new();
    let permits = Arc::new(Semaphore::new(workers.max(1)));
    // Finished jobs with their zone index; a job's task waits for room here, the loop never does.
    let (done_tx, mut done_rx) = mpsc::channel::<(u16, ZoneJobDone, Ran)>(1024);
    // When each session's jobs ran, for the split of its signatures' time (Table 3).
    let mut job_times: HashMap<(u16, Digest), JobTimes> = HashMap::new();
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    let mut shared_seen = (0u64, 0u64);
    loop {
        let timer = cores.values().flatten().filter_map(ZoneCore::poll_timeout).min().map(|t| Duration::from_micros(t.saturating_sub(now_us())));
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { return };
                take_command(command, &mut cores, &mut waiters, &metrics);
            }
            message = incoming.recv() => {
                let Some((from, bytes)) = message else { return };
                match SignEnvelope::decode(&bytes) {
                    Ok(SignEnvelope { zone, message }) => match cores.get_mut(&zone) {
                        // A zone served without a share here: its peers' sessions go on without it.
                        Some(None) => {}
                        Some(Some(core)) => {
                            if core.handle_message(now_us(), from, message).is_err() {
                                // An RSA message for an EC zone or the reverse: no honest replica sends one.
                                debug!(peer = from, zone, "signing message of the other kind of key than the zone's");
                                metrics.add_bad_share(from);
                            }
                        }
                        None => {
                            // Dealt for other zones than ours: an operator error or a lie.
                            debug!(peer = from, zone, "signing message for a zone index this replica does not serve");
                            metrics.add_bad_share(from);
                        }
                    },
                    Err(e) => {
                        debug!(peer = from, error = %e, "undecodable signing message");
                        metrics.add_bad_share(from);
                    }
                }
            }
            done = done_rx.recv() => {
                // done_tx lives in this function, so the channel never closes.
                if let Some((zone, done, ran)) = done {
                    let times = job_times.entry((zone, ran.digest)).or_default();
                    if ran.combination { times.combine_ran(ran.start, ran.end) } else { times.share_ran(ran.start, ran.end) }
                    if let Some(Some(core)) = cores.get_mut(&zone) {
                        core.job_done(done);
                    }
                }
            }
            _ = async { tokio::time::sleep(timer.unwrap_or(Duration::from_secs(3600))).await }, if timer.is_some() => {
                let now = now_us();
                for core in cores.values_mut().flatten().filter(|c| c.poll_timeout().is_some_and(|t| t <= now)) {
                    core.handle_timeout(now);
                }
            }
            _ = sweep.tick() => {
                // Nobody waits for these any more (the signing service went away); stop
                // working on them.
                waiters.retain(|(zone, digest), ws| {
                    ws.retain(|w| !w.reply.is_closed());
                    if ws.is_empty() {
                        if let Some(Some(core)) = cores.get_mut(zone) {
                            core.abandon(digest);
                        }
                        false
                    } else {
                        true
                    }
                });
                // Sessions no request here waits for (a peer's, or finished): their job times
                // are of no use after a while.
                job_times.retain(|key, t| waiters.contains_key(key) || t.last.is_some_and(|l| l.elapsed() < Duration::from_secs(60)));
            }
        }
        // Zone index order: every zone's outputs, the same way on every pass.
        for (&zone, core) in cores.iter_mut() {
            let Some(core) = core else { continue };
            while let Some(out) = core.poll_output() {
                match out {
                    ZoneOutput::Broadcast { .. } | ZoneOutput::Send { .. } if fault == SigningFault::Silent => {}
                    ZoneOutput::Broadcast { message } => {
                        let message = garbage.apply(fault, message);
                        if let Err(e) = mesh.broadcast(CHANNEL_SIGNING, Bytes::from(SignEnvelope { zone, message }.encode())) {
                            warn!(error = %e, "signing broadcast not sent");
                        }
                    }
                    ZoneOutput::Send { to, message } => {
                        let message = garbage.apply(fault, message);
                        if let Err(e) = mesh.send(to, CHANNEL_SIGNING, Bytes::from(SignEnvelope { zone, message }.encode())) {
                            debug!(to, error = %e, "signing message not sent");
                        }
                    }
                    ZoneOutput::Done { digest, signature } => {
                        let times = job_times.remove(&(zone, digest)).unwrap_or_default();
                        let done = Instant::now();
                        for w in waiters.remove(&(zone, digest)).unwrap_or_default() {
                            metrics.observe_signing_us(done.saturating_duration_since(w.since).as_micros() as u64);
                            metrics.observe_signing_split(times.split(w.since, done));
                            let _ = w.reply.send(Ok(signature.clone()));
                        }
                    }
                    ZoneOutput::Misbehaved { peer, what } => {
                        warn!(peer, what, zone, "peer misbehaved in threshold signing");
                        metrics.add_bad_share(peer);
                    }
                    ZoneOutput::Compute(job) => spawn_job(zone, job, permits.clone(), done_tx.clone()),
                    ZoneOutput::Failed { digest, reason } => {
                        job_times.remove(&(zone, digest));
                        warn!(reason, zone, "this replica's signature share could not be computed");
                        for w in waiters.remove(&(zone, digest)).unwrap_or_default() {
                            let _ = w.reply.send(Err(SignError::Failed(reason.clone())));
                        }
                    }
                }
            }
        }
        let now = cores.values().flatten().map(ZoneCore::shared_counts).fold((0, 0), |(spared, fallbacks), s| (spared + s.0, fallbacks + s.1));
        if now != shared_seen {
            // A removed zone's core takes its counts with it.
            metrics.add_shared_signing(now.0.saturating_sub(shared_seen.0), now.1.saturating_sub(shared_seen.1));
            shared_seen = now;
        }
    }
}

/// A command from the signer: a signing request goes to its zone's core (or is answered
/// with why it cannot), a change of the zone set replaces a core.
fn take_command(command: Command, cores: &mut Cores, waiters: &mut HashMap<(u16, Digest), Vec<Waiter>>, metrics: &Metrics) {
    let (zone, algorithm, data, shared, reply) = match command {
        Command::Sign { zone, algorithm, data, shared, reply } => (zone, algorithm, data, shared, reply),
        Command::Zone { zone, core } => {
            set_core(cores, waiters, zone, core);
            return;
        }
    };
    // `zone` comes from ThresholdSigner::zone_of, an index of the same zones.
    let core = match cores.get_mut(&zone) {
        Some(Some(core)) => core,
        Some(None) => {
            // Served without a share of its key (docs/MULTIZONE.md): counted, so that the
            // operator sees which zone lacks its file.
            metrics.zone_signing_failed(zone);
            let _ = reply.send(Err(SignError::Failed(format!(
                "no key share for zone index {zone} at this replica (zones/<zone>/share.json missing or not of the ordered key)"
            ))));
            return;
        }
        None => {
            let _ = reply.send(Err(SignError::Failed(format!("no signer for zone index {zone}"))));
            return;
        }
    };
    match core.request(now_us(), algorithm, &data, shared) {
        Ok(digest) => waiters.entry((zone, digest)).or_default().push(Waiter { reply, since: Instant::now() }),
        Err(e) => {
            let _ = reply.send(Err(SignError::Failed(e)));
        }
    }
}

/// Zone `zone`'s core changes with the zone set: a removed zone's waiters are told so (its
/// sessions end with its core).
fn set_core(cores: &mut Cores, waiters: &mut HashMap<(u16, Digest), Vec<Waiter>>, zone: u16, core: Option<Option<ZoneCore>>) {
    match core {
        Some(core) => {
            cores.insert(zone, core);
        }
        None => {
            cores.remove(&zone);
            waiters.retain(|(z, _), ws| {
                if *z != zone {
                    return true;
                }
                for w in ws.drain(..) {
                    let _ = w.reply.send(Err(SignError::Failed(format!("zone index {zone} was removed"))));
                }
                false
            });
        }
    }
}

/// Runs one job on the blocking pool once a worker permit is free, timing it, and hands the
/// result back to the loop.
fn spawn_job(zone: u16, job: ZoneJob, permits: Arc<Semaphore>, done_tx: mpsc::Sender<(u16, ZoneJobDone, Ran)>) {
    let (digest, combination) = (job.digest(), job.is_combination());
    tokio::spawn(async move {
        let Ok(_permit) = permits.acquire_owned().await else { return };
        let timed = move || {
            let start = Instant::now();
            let done = job.run();
            (done, Ran { digest, combination, start, end: Instant::now() })
        };
        match tokio::task::spawn_blocking(timed).await {
            Ok((done, ran)) => {
                let _ = done_tx.send((zone, done, ran)).await;
            }
            Err(e) => warn!(error = %e, "signing job panicked"),
        }
    });
}

/// A misbehaving replica's rewrite of what it sends (test clusters only): garbage-shares puts
/// random bytes of the same length in place of its shares and signatures (RSA's and EC's).
/// Corrupt shares (`--corrupt`) are not made here: each signing core corrupts its own.
struct Garbage {
    state: u64,
}

impl Garbage {
    fn next(&mut self) -> u8 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state as u8
    }

    fn apply(&mut self, fault: SigningFault, message: ZoneMessage) -> ZoneMessage {
        if fault == SigningFault::Garbage {
            zone_core::rewrite(message, &mut |b: &mut [u8]| b.iter_mut().for_each(|x| *x = self.next()))
        } else {
            message
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use named_glue::signer::SignatureTimes;

    fn key(zone: &str, key_tag: u16) -> ZoneSigningKey {
        ZoneSigningKey { signer: Name::from_ascii(zone).unwrap(), algorithm: 8, key_tag }
    }

    fn request(zone: &str, algorithm: u8, key_tag: u16) -> SignRequest {
        SignRequest {
            algorithm,
            key_tag,
            signer: Name::from_ascii(zone).unwrap(),
            data: vec![1, 2, 3],
            times: SignatureTimes::from_agreed(1_700_000_000, 86_400),
        }
    }

    #[tokio::test]
    async fn each_request_goes_to_the_zone_whose_key_it_names() {
        let (commands, mut rx) = mpsc::channel(4);
        let keys = BTreeMap::from([(0, key("2.0.192.in-addr.arpa.", 111)), (1, key("example.test.", 222))]);
        let signer = ThresholdSigner { commands, keys: std::sync::RwLock::new(keys) };
        // Zone A's name with zone B's key tag, a wrong algorithm, an unknown zone: no zone's key.
        for (zone, algorithm, tag) in [("example.test.", 8, 111), ("2.0.192.in-addr.arpa.", 8, 222), ("example.test.", 10, 222), ("other.test.", 8, 222)] {
            match signer.sign(request(zone, algorithm, tag)).await {
                Err(SignError::UnknownKey { algorithm: a, key_tag }) => assert_eq!((a, key_tag), (algorithm, tag)),
                other => panic!("{zone} {algorithm} {tag}: {other:?}"),
            }
        }
        assert!(rx.try_recv().is_err(), "a refused request reached the signing task");
        // The zone's own triple (the name compared as DNS does, case aside) reaches its core.
        for (zone, tag, index) in [("Example.TEST.", 222, 1), ("2.0.192.in-addr.arpa.", 111, 0)] {
            let pending = tokio::spawn(signer.sign(request(zone, 8, tag)));
            let Some(Command::Sign { zone: got, reply, .. }) = rx.recv().await else { panic!("no command") };
            assert_eq!(got, index, "{zone}");
            let _ = reply.send(Ok(vec![index as u8]));
            assert_eq!(pending.await.unwrap().unwrap(), vec![index as u8]);
        }
        // The zone set changes: zone 1 removed, a zone added under index 5 (indices are never
        // reused), the loop told of each.
        signer.set_zone(1, None, None).await;
        assert!(matches!(rx.recv().await, Some(Command::Zone { zone: 1, core: None })));
        signer.set_zone(5, Some(key("added.test.", 333)), None).await;
        assert!(matches!(rx.recv().await, Some(Command::Zone { zone: 5, core: Some(None) })));
        match signer.sign(request("example.test.", 8, 222)).await {
            Err(SignError::UnknownKey { key_tag: 222, .. }) => {}
            other => panic!("a removed zone's key still signs: {other:?}"),
        }
        let pending = tokio::spawn(signer.sign(request("added.test.", 8, 333)));
        let Some(Command::Sign { zone: 5, reply, .. }) = rx.recv().await else { panic!("the added zone's request went elsewhere") };
        let _ = reply.send(Ok(vec![5]));
        assert_eq!(pending.await.unwrap().unwrap(), vec![5]);
    }
}
