//! Vouched reads: PBFT's read-only optimisation inside the cluster, for ordinary clients in
//! ordered mode (`cluster.vouched_reads`, on by default).
//!
//! The gateway (the replica a client asked, which that client trusts) answers a plain query
//! without ordering it when 2t+1 replicas, itself included, give the same answer; otherwise
//! it orders the read as before. Each read is probed at every peer on the mesh's reads
//! channel (`mesh::CHANNEL_READS`, messages in `crate::vouch`; batched: the UDP listener
//! sends the probes of the datagrams it took in one turn as one message); a replica answers a
//! probe only after its executor has executed up to its *read barrier* at the probe's arrival
//! (the highest seq it has sent a commit for, or delivered), and vouches with the digest of its
//! answer (`crate::vouch::answer_digest`); the gateway answers its own copy after executing up
//! to its barrier at the read's arrival, and tallies the vouches (`crate::vouch::Tally`).
//!
//! Why this is linearizable (docs/DETERMINISM.md, "Vouched reads", says it at length): a write
//! W at seq s was acknowledged only after it committed, i.e. after 2t+1 replicas had sent a
//! commit for s. Every replica whose answer counts (the gateway and 2t peers that match it)
//! took its barrier after the read began, hence after W's acknowledgement; the 2t+1 of them
//! and the 2t+1 committers share at least t+1 replicas, so at least one honest replica whose
//! barrier was at or past s, whose answer reflects W. Every counted answer is the gateway's
//! own (equal digests), and every honest answer comes from an executed, committed prefix of the
//! log, so the client gets an answer that reflects W and nothing that was not ordered.
//! The barrier is the one the ordering driver publishes (`ReplicaHandle::read_barrier`) after
//! feeding each turn's inputs and before sending any of their messages, so a replica that has
//! sent a commit for s already shows a barrier of at least s to a probe.
//! A Byzantine peer can only withhold or spoil its vouch: the client is sent the gateway's own
//! bytes, never a peer's. Without 2t+1 matches (a lagging or lying peer, a silent one, a
//! budget exceeded) the read falls back to ordering after the gateway's vouch timeout, or at
//! once when 2t+1 has become impossible.
//!
//! The vouch timeout ([`VouchClock`]) follows the load: a read ordered after all costs an
//! ordering round at every replica (about 50 ms under the load at which vouches get slow), far
//! more than waiting a little longer. The gateway waits 4 times the 95th percentile of the
//! waits (own answer in, to 2t+1 matching) of its recently vouched reads, never less than
//! `cluster.vouch_timeout_ms` (the fixed timeout of before) and never more than
//! `cluster.vouch_timeout_max_ms`. What a Byzantine peer can do to it:
//! - no read waits for its vouches longer than the cap, whatever any peer sends or withholds;
//! - only reads 2t+1 replicas vouched for teach the clock: a withheld or spoilt vouch either
//!   makes a read fall back or leaves the read to the honest peers. A read that timed out is
//!   ordered all the same, and still teaches if 2t+1 vouches match within the cap, with the
//!   wait they took: a clock that saw only the reads vouched in time could never rise when
//!   every vouch takes longer than the floor. A read that failed (2t+1 out of reach) teaches
//!   nothing;
//! - a vouched read's wait is the arrival of its 2t-th matching vouch. At least 2t of the n-1
//!   peers are honest, so while they give the gateway's answer in time, that vouch comes no
//!   later than the 2t-th honest one: a slow liar cannot make a wait longer than the honest
//!   peers alone make it; a quick one can make it shorter, and the timeout never goes below
//!   the floor;
//! - only where fewer than 2t honest peers match in time (one lags, or answered otherwise as it
//!   raced a write) does a liar's vouch decide the wait, anywhere up to the current deadline.
//!   To move the percentile it must decide more than 5 % of a window's vouched reads, and all
//!   it buys is the cap: the reads it could delay anyway, by withholding, wait at most that
//!   before they are ordered;
//! - a window period (1 s) with nothing vouched moves the timeout halfway back to the floor,
//!   which never raises it.
//!
//! The timeout is the gateway's own: it decides whether a read is answered as vouched or
//! ordered, never what any replica executes or answers, and the argument above holds whenever
//! the 2t+1 matching answers come.
//!
//! Cost: an unloaded read is a handful of task wake-ups. The listener takes the read, answers
//! its own copy from the read cache when its barrier is already executed, and queues the probe
//! on the mesh; a peer's probe is answered in the mesh's reader task (`Mesh::handle_inline`)
//! from the cache's digests when its barrier is executed, and so are the vouches at the gateway,
//! which sends its client the answer from there. Only what must wait (a barrier not executed
//! yet, a cache miss that goes to named) gets a task of its own. A miss's query to named is
//! sent before that task exists, in the call that took the read (the peer's reader task; at
//! the gateway, the listener, just after its probes are out), so named works on it while the
//! task is scheduled and the probes travel; the digest the read cache computes when it keeps
//! named's answer is the one vouched for (computed once).
//!
//! Nothing here makes the executor wait: the gateway and the peers wait for the executed
//! position on a watch channel and answer from the read cache or named, as local reads do.
//! What a peer can make this replica hold is bounded: a probe is at most 256 reads and 256 KiB
//! (`crate::vouch::decode_read_wire`), what waits is refused beyond a byte budget per peer,
//! and a probe whose barrier is not executed within [`PROBE_WAIT`] is dropped (its gateway has
//! long fallen back).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use named_glue::forward::Forwarder;
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use crate::classify::Kind;
use crate::metrics::Metrics;
use crate::read::{Fill, Keyed, ReadCache};
use crate::reply::ClientRequest;
pub use crate::vouch::Fault;
use crate::vouch::{decode_read_wire, encode_vouch, ProbeBatch, ReadWire, Tally, Verdict};

/// Reads awaiting their vouches at this gateway; beyond, reads are ordered directly.
const MAX_WAITING: usize = 4096;
/// Timeouts queued at most (one per read whose own answer is in; a decided read's stays until
/// it is due); beyond, the read due first is ordered at once.
const MAX_DEADLINES: usize = 4 * MAX_WAITING;
/// Timed-out reads kept for their late vouches at most (see `VouchedReads::late`); beyond,
/// the oldest is forgotten.
const MAX_LATE: usize = MAX_WAITING;
/// Vouched reads per learning window of the [`VouchClock`] (a window also closes after
/// [`WINDOW_PERIOD`] with fewer).
const WINDOW: usize = 256;
/// A learning window closes after this long whatever it holds; one in which nothing was
/// vouched moves the timeout halfway back to its floor.
const WINDOW_PERIOD: Duration = Duration::from_secs(1);
/// The timeout is [`MARGIN`] times this percentile of a window's waits.
const PERCENTILE: usize = 95;
const MARGIN: u64 = 4;
/// Bytes of a peer's probes this replica holds at once; beyond, its probes are dropped.
const PEER_BUDGET: usize = 1 << 20;
/// A probe whose barrier this replica has not executed within this time is dropped.
pub const PROBE_WAIT: Duration = Duration::from_secs(1);
/// The longest a gateway waits for its own executor to reach its barrier before ordering the
/// read instead.
const OWN_WAIT: Duration = Duration::from_secs(1);

/// Where probes and vouches go: the mesh's reads channel, or a test's capture.
pub trait ReadsOutbound: Send + Sync + 'static {
    fn send(&self, to: u16, message: Vec<u8>);
    fn broadcast(&self, message: Vec<u8>);
}

impl ReadsOutbound for mesh::MeshSender {
    fn send(&self, to: u16, message: Vec<u8>) {
        if let Err(e) = mesh::MeshSender::send(self, to, mesh::CHANNEL_READS, Bytes::from(message)) {
            tracing::debug!(to, error = %e, "vouch not sent");
        }
    }

    fn broadcast(&self, message: Vec<u8>) {
        if let Err(e) = mesh::MeshSender::broadcast(self, mesh::CHANNEL_READS, Bytes::from(message)) {
            tracing::debug!(error = %e, "read probe not sent");
        }
    }
}

pub struct VouchedReads {
    n: u16,
    t: u16,
    named: Forwarder,
    cache: Arc<ReadCache>,
    metrics: Arc<Metrics>,
    /// How long a gateway waits for vouches once its own answer is in, learnt from its
    /// vouched reads; `timeout_us` is its current value, read without the lock.
    clock: Mutex<VouchClock>,
    timeout_us: AtomicU64,
    /// The ordering core's read barrier, published by its driver.
    barrier: watch::Receiver<u64>,
    /// The executor's executed position.
    executed: watch::Receiver<u64>,
    out: Arc<dyn ReadsOutbound>,
    fault: Fault,
    /// Reads this gateway is collecting vouches for.
    waiting: Mutex<HashMap<u64, Waiting>>,
    /// When reads whose own answer is in fall back, earliest first (the timeout varies, so
    /// a read queued later may be due sooner).
    deadlines: Mutex<BinaryHeap<Reverse<(Instant, u64)>>>,
    deadline_added: Notify,
    next_id: AtomicU64,
    /// Reads to order after all (the gateway's loop orders them).
    fallback: mpsc::Sender<ClientRequest>,
    /// Bytes of each peer's probes held now.
    held: Mutex<HashMap<u16, usize>>,
    /// Reads ordered after all because their vouches did not come in time, kept until the
    /// cap has passed: if 2t+1 still match by then, the wait they took teaches the clock. A
    /// clock that learnt only from reads vouched in time could never rise above the floor
    /// when every vouch takes longer than that.
    late: Mutex<LateReads>,
}

/// Timed-out reads whose vouches may still come: (tally, own answer in) by read id, and the
/// ids in the order they timed out.
#[derive(Default)]
struct LateReads {
    reads: HashMap<u64, (Tally, Instant)>,
    order: VecDeque<(Instant, u64)>,
}

impl LateReads {
    /// Forgets the reads whose own answer came in before `since`, and the oldest beyond
    /// [`MAX_LATE`].
    fn prune(&mut self, since: Instant) {
        while let Some(&(at, id)) = self.order.front() {
            if at >= since && self.order.len() <= MAX_LATE {
                break;
            }
            self.order.pop_front();
            self.reads.remove(&id);
        }
    }
}

struct Waiting {
    tally: Tally,
    request: ClientRequest,
    /// The gateway's own answer, once in, and since when.
    answer: Option<Vec<u8>>,
    own_at: Option<Instant>,
}

/// What [`VouchedReads::start`] is wired to.
pub struct Wiring {
    /// Probes and vouches out (the mesh's reads channel).
    pub out: Arc<dyn ReadsOutbound>,
    pub barrier: watch::Receiver<u64>,
    pub executed: watch::Receiver<u64>,
    pub fallback: mpsc::Sender<ClientRequest>,
    pub fault: Fault,
}

/// What a listener gathers in one turn for the vouched path ([`VouchedReads::take`]): the
/// probes, sent as one message, and the gateway's own queries to named, begun once the probes
/// are out ([`VouchedReads::send_probes`]).
#[derive(Debug, Default)]
pub struct VouchTurn {
    probes: ProbeBatch,
    own: Vec<OwnFetch>,
}

impl VouchTurn {
    /// Nothing gathered (or all of it sent).
    pub fn is_empty(&self) -> bool {
        self.probes.is_empty() && self.own.is_empty()
    }
}

/// A read the gateway's cache missed with its barrier executed: named is asked for it once
/// the probes are out.
#[derive(Debug)]
struct OwnFetch {
    id: u64,
    tcp: bool,
    message: Vec<u8>,
    fill: Option<Fill>,
}

/// A peer's read this replica must wait for (its barrier, or named) before vouching.
struct Deferred {
    id: u64,
    tcp: bool,
    message: Vec<u8>,
    key: Vec<u8>,
}

impl Deferred {
    /// What it counts against its peer's budget while held.
    fn held(&self) -> usize {
        self.message.len() + self.key.len() + 64
    }
}

impl VouchedReads {
    /// The vouched-read service and the task that orders the reads whose vouches did not come
    /// in time (an essential task of the replica). Peers' messages come in through
    /// [`Self::handle`] (the mesh's inline handler of the reads channel).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        n: u16,
        t: u16,
        named: Forwarder,
        cache: Arc<ReadCache>,
        metrics: Arc<Metrics>,
        timeout: RangeInclusive<Duration>,
        wiring: Wiring,
    ) -> (Arc<VouchedReads>, impl std::future::Future<Output = ()> + Send + 'static) {
        let clock = VouchClock::new(*timeout.start(), *timeout.end(), Instant::now());
        metrics.set_vouch_timeout(clock.timeout());
        let service = Arc::new(VouchedReads {
            n,
            t,
            named,
            cache,
            metrics,
            timeout_us: AtomicU64::new(clock.current_us),
            clock: Mutex::new(clock),
            barrier: wiring.barrier,
            executed: wiring.executed,
            out: wiring.out,
            fault: wiring.fault,
            waiting: Mutex::new(HashMap::new()),
            deadlines: Mutex::new(BinaryHeap::new()),
            late: Mutex::new(LateReads::default()),
            deadline_added: Notify::new(),
            next_id: AtomicU64::new(0),
            fallback: wiring.fallback,
            held: Mutex::new(HashMap::new()),
        });
        let task = service.clone().expire();
        (service, task)
    }

    /// Takes a client's read onto the vouched path when it can: a plain query (what the read
    /// cache could key; never an update, a transfer, a signed request) that is not a voting
    /// client's. Its probe is added to `out`, which the caller sends with
    /// [`Self::send_probes`] (at once, or after the other reads it has at hand); its own answer
    /// is taken at once when the barrier is executed and the cache has it, and when the cache
    /// misses, its query to named is begun as soon as the probes are out. Hands the request
    /// back, to be ordered (or answered as a voting read), otherwise.
    pub fn take(self: &Arc<Self>, request: ClientRequest, out: &mut VouchTurn) -> Result<(), ClientRequest> {
        if crate::voting_read::is_voting_read(&request.bytes) {
            return Err(request);
        }
        let Some(key) = crate::read_cache::key(&request.bytes, request.tcp) else { return Err(request) };
        if !out.probes.fits(request.bytes.len()) {
            self.send_probes(out);
        }
        // Read after the read arrived: at or past every write acknowledged before it.
        let barrier = *self.barrier.borrow();
        let (tcp, dns_id) = (request.tcp, [request.bytes[0], request.bytes[1]]);
        // The own answer: from the cache (`Ok`), from named now (`Err(Some(fill))`, the
        // barrier executed and the cache missed), or once the barrier is executed (`Err(None)`).
        let own = if *self.executed.borrow() >= barrier {
            match self.cache.lookup_keyed(&key, dns_id) {
                Keyed::Hit(answer, digest) => {
                    self.metrics.inc_read_cache(true);
                    Ok((answer, digest))
                }
                Keyed::Miss(fill) => Err(Some(fill)),
            }
        } else {
            Err(None)
        };
        let (own, later) = match own {
            Ok(hit) => (Some(hit), None),
            Err(fetch) => (None, Some(fetch)),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // What named is asked when the own answer is not in the cache.
        let message = if later.is_some() { request.bytes.clone() } else { Vec::new() };
        let verdict;
        {
            let mut waiting = self.lock_waiting();
            if waiting.len() >= MAX_WAITING {
                drop(waiting);
                self.metrics.inc_dropped("vouched_reads_full");
                return Err(request);
            }
            if !out.probes.push(id, tcp, &request.bytes) {
                return Err(request);
            }
            let mut tally = Tally::new(self.n, self.t);
            let answer = own.map(|(answer, digest)| {
                tally.own(digest);
                answer
            });
            verdict = tally.verdict();
            let own_at = answer.is_some().then(Instant::now);
            waiting.insert(id, Waiting { tally, request, answer, own_at });
        }
        match later {
            // The own answer is in; the vouches are not (the probe is not even sent yet),
            // unless the gateway is its own quorum (t = 0).
            None if verdict == Verdict::Pending => self.wait_for_vouches(id),
            None => self.decide(id, verdict),
            // named is asked once the probes are out ([`Self::send_probes`]).
            Some(Some(fill)) => out.own.push(OwnFetch { id, tcp, message, fill }),
            Some(None) => {
                let service = self.clone();
                tokio::spawn(async move {
                    let mut executed = service.executed.clone();
                    // The guard the wait returns is dropped at once (it must not be held across awaits).
                    let reached = tokio::time::timeout(OWN_WAIT, executed.wait_for(|e| *e >= barrier)).await.is_ok_and(|r| r.is_ok());
                    if !reached {
                        return service.fall_back(id);
                    }
                    let own = match service.cache.lookup_keyed(&key, dns_id) {
                        Keyed::Hit(answer, digest) => {
                            service.metrics.inc_read_cache(true);
                            Some((answer, digest))
                        }
                        Keyed::Miss(fill) => crate::read::vouched_answer(&service.named, &service.cache, fill, &message, tcp, None, &service.metrics).await,
                    };
                    service.own_answer(id, own);
                });
            }
        }
        Ok(())
    }

    /// The gateway's own answer to read `id` is in (`None`: named stayed silent, or the read
    /// failed: the ordered path decides).
    fn own_answer(&self, id: u64, own: Option<(Vec<u8>, [u8; 32])>) {
        let Some((answer, digest)) = own else { return self.fall_back(id) };
        let verdict = {
            let mut waiting = self.lock_waiting();
            let Some(w) = waiting.get_mut(&id) else { return };
            w.answer = Some(answer);
            w.own_at = Some(Instant::now());
            w.tally.own(digest)
        };
        self.decide(id, verdict);
        if verdict == Verdict::Pending {
            self.wait_for_vouches(id);
        }
    }

    /// Sends the probes gathered by [`Self::take`] to every peer, one message, then begins
    /// the gateway's own queries to named for the reads its cache missed, each answered in a
    /// task of its own: named works on them while the probes travel.
    pub fn send_probes(self: &Arc<Self>, out: &mut VouchTurn) {
        if let Some(message) = out.probes.take() {
            if self.fault != Fault::Silent {
                self.out.broadcast(message);
            }
        }
        for OwnFetch { id, tcp, message, fill } in out.own.drain(..) {
            let begun = (!tcp).then(|| self.named.start_udp(&message));
            let service = self.clone();
            tokio::spawn(async move {
                let own = crate::read::vouched_answer(&service.named, &service.cache, fill, &message, tcp, begun, &service.metrics).await;
                service.own_answer(id, own);
            });
        }
    }

    /// A message from peer `from` on the reads channel (the mesh proved the sender). Called
    /// in the mesh's reader task: it never waits.
    pub fn handle(self: &Arc<Self>, from: u16, frame: &[u8]) {
        match decode_read_wire(frame) {
            Ok(ReadWire::Probe(reads)) => self.answer_probes(from, reads),
            Ok(ReadWire::Vouch(answers)) => self.count_vouches(from, &answers),
            Err(why) => self.metrics.inc_dropped(why),
        }
    }

    fn lock_waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_deadlines(&self) -> std::sync::MutexGuard<'_, BinaryHeap<Reverse<(Instant, u64)>>> {
        self.deadlines.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_clock(&self) -> std::sync::MutexGuard<'_, VouchClock> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a read whose own answer comes in now waits for its vouches.
    pub fn timeout(&self) -> Duration {
        Duration::from_micros(self.timeout_us.load(Ordering::Relaxed))
    }

    /// Publishes the clock's timeout when `changed`.
    fn publish(&self, changed: bool, clock: &VouchClock) {
        if changed {
            self.timeout_us.store(clock.current_us, Ordering::Relaxed);
            self.metrics.set_vouch_timeout(clock.timeout());
        }
    }

    /// The read's own answer is in: it falls back unless vouched within the timeout.
    fn wait_for_vouches(&self, id: u64) {
        let at = Instant::now() + self.timeout();
        let (earliest, evicted) = {
            let mut deadlines = self.lock_deadlines();
            let evicted = if deadlines.len() >= MAX_DEADLINES { deadlines.pop() } else { None };
            let earliest = deadlines.peek().is_none_or(|Reverse((first, _))| at < *first);
            deadlines.push(Reverse((at, id)));
            (earliest, evicted)
        };
        // The expiry task sleeps until the deadline that was first: wake it for an earlier one.
        if earliest {
            self.deadline_added.notify_one();
        }
        if let Some(Reverse((_, old))) = evicted {
            self.fall_back(old);
        }
    }

    /// Orders the reads whose vouches did not come in time.
    async fn expire(self: Arc<Self>) {
        loop {
            let front = self.lock_deadlines().peek().map(|Reverse((at, _))| *at);
            let Some(at) = front else {
                self.deadline_added.notified().await;
                continue;
            };
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                // A deadline earlier than `at` was queued (the timeout shrank).
                () = self.deadline_added.notified() => continue,
            }
            let now = Instant::now();
            let due: Vec<u64> = {
                let mut deadlines = self.lock_deadlines();
                let mut due = Vec::new();
                while let Some(&Reverse((at, id))) = deadlines.peek() {
                    if at > now {
                        break;
                    }
                    deadlines.pop();
                    due.push(id);
                }
                due
            };
            {
                // Time passing with nothing vouched relaxes the timeout (never raises it).
                let mut clock = self.lock_clock();
                let changed = clock.tick(now);
                self.publish(changed, &clock);
            }
            for id in due {
                self.time_out(id);
            }
        }
    }

    /// A read's vouches did not come in time: it is ordered after all, and kept for the
    /// vouches that may still come (they teach the clock, see `late`).
    fn time_out(&self, id: u64) {
        let Some(w) = self.lock_waiting().remove(&id) else { return };
        if let Some(at) = w.own_at {
            let cap = Duration::from_micros(self.lock_clock().cap_us);
            let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
            late.reads.insert(id, (w.tally, at));
            late.order.push_back((at, id));
            late.prune(Instant::now().checked_sub(cap).unwrap_or(at));
        }
        self.order(w.request);
    }

    /// Acts on a decided read (whoever removes it from the table acts, once).
    fn decide(&self, id: u64, verdict: Verdict) {
        match verdict {
            Verdict::Pending => {}
            Verdict::Failed => self.fall_back(id),
            Verdict::Vouched => {
                let Some(w) = self.lock_waiting().remove(&id) else { return };
                self.answer(w);
            }
        }
    }

    fn answer(&self, w: Waiting) {
        let Some(answer) = w.answer else { return };
        // Only reads 2t+1 replicas vouched for teach the timeout (the module doc says why).
        if let Some(at) = w.own_at {
            let now = Instant::now();
            let mut clock = self.lock_clock();
            let changed = clock.vouched(now.saturating_duration_since(at), now);
            self.publish(changed, &clock);
        }
        self.metrics.inc_vouched_read("vouched");
        self.metrics.inc_request(Kind::Read);
        crate::read::deliver(&w.request.reply, answer, &self.metrics);
    }

    /// Vouches for reads that timed out: one that 2t+1 replicas now vouched for, within the
    /// cap, teaches the clock the wait it took (a liar's late vouch can decide that only
    /// where it could have decided an in-time one, and never past the cap).
    fn count_late_vouches(&self, from: u16, answers: &[(u64, [u8; 32])]) {
        let now = Instant::now();
        let mut waits = Vec::new();
        {
            let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
            if late.reads.is_empty() {
                return;
            }
            for &(id, digest) in answers {
                let Some((tally, _)) = late.reads.get_mut(&id) else { continue };
                match tally.vouch(from, digest) {
                    Verdict::Pending => {}
                    Verdict::Failed => {
                        late.reads.remove(&id);
                    }
                    Verdict::Vouched => waits.extend(late.reads.remove(&id).map(|(_, at)| now.saturating_duration_since(at))),
                }
            }
        }
        if waits.is_empty() {
            return;
        }
        let mut clock = self.lock_clock();
        let cap = Duration::from_micros(clock.cap_us);
        let mut changed = false;
        for wait in waits.into_iter().filter(|w| *w <= cap) {
            changed |= clock.vouched(wait, now);
        }
        self.publish(changed, &clock);
    }

    /// Orders the read after all, if it is still waiting.
    fn fall_back(&self, id: u64) {
        let Some(w) = self.lock_waiting().remove(&id) else { return };
        self.order(w.request);
    }

    /// Hands a read that fell back to the gateway's loop, which orders it.
    fn order(&self, request: ClientRequest) {
        self.metrics.inc_vouched_read("fell_back");
        if self.fallback.try_send(request).is_err() {
            self.metrics.inc_dropped("vouched_fallback_full");
        }
    }

    fn count_vouches(&self, from: u16, answers: &[(u64, [u8; 32])]) {
        let (mut vouched, mut failed, mut others) = (Vec::new(), Vec::new(), Vec::new());
        {
            let mut waiting = self.lock_waiting();
            for &(id, digest) in answers {
                let Some(w) = waiting.get_mut(&id) else {
                    others.push((id, digest));
                    continue;
                };
                match w.tally.vouch(from, digest) {
                    Verdict::Pending => {}
                    Verdict::Failed => failed.push(id),
                    Verdict::Vouched => vouched.extend(waiting.remove(&id)),
                }
            }
        }
        if !others.is_empty() {
            self.count_late_vouches(from, &others);
        }
        for w in vouched {
            self.answer(w);
        }
        for id in failed {
            self.fall_back(id);
        }
    }

    /// A peer's probe: each read that is a plain query is answered once this replica has
    /// executed up to its barrier now, and vouched for; the rest is ignored (no vouch: the
    /// gateway falls back). With the barrier executed, a cached answer is vouched for here and
    /// a miss's query to named is begun here (named works on it at once), its answer awaited
    /// by a task of its own; what must wait is never held beyond the peer's budget.
    fn answer_probes(self: &Arc<Self>, from: u16, reads: Vec<(u64, bool, &[u8])>) {
        // Taken as the probe arrives: at or past every write acknowledged before its read began.
        let after = *self.barrier.borrow();
        let reached = *self.executed.borrow() >= after;
        let mut vouches = Vec::new();
        // Cache misses (barrier executed): (read, the fill named's answer may be kept with).
        let mut misses = Vec::new();
        let mut deferred = Vec::new();
        for (id, tcp, message) in reads {
            // Only what a read cache could key: plain queries, never an update, a transfer,
            // a signed request (those are ordered, always).
            let Some(key) = crate::read_cache::key(message, tcp) else { continue };
            let read = Deferred { id, tcp, message: message.to_vec(), key };
            if !reached {
                deferred.push(read);
                continue;
            }
            match self.cache.digest(&read.key) {
                Ok(digest) => {
                    self.metrics.inc_read_cache(true);
                    vouches.push((id, digest));
                }
                Err(fill) => misses.push((read, fill)),
            }
        }
        self.vouch(from, vouches);
        if misses.is_empty() && deferred.is_empty() {
            return;
        }
        let held: Vec<usize> = misses.iter().map(|(read, _)| read.held()).collect();
        let deferred_bytes: usize = deferred.iter().map(Deferred::held).sum();
        if !self.hold(from, held.iter().sum::<usize>() + deferred_bytes) {
            return;
        }
        for ((read, fill), bytes) in misses.into_iter().zip(held) {
            self.ask_named(from, read, fill, bytes);
        }
        if deferred.is_empty() {
            return;
        }
        let service = self.clone();
        tokio::spawn(async move {
            let mut executed = service.executed.clone();
            let reached = tokio::time::timeout(PROBE_WAIT, executed.wait_for(|e| *e >= after)).await.is_ok_and(|r| r.is_ok());
            if !reached {
                service.metrics.inc_dropped("read_probe_barrier_wait");
                return service.release(from, deferred_bytes);
            }
            let mut hits = Vec::new();
            let mut released = 0;
            for read in deferred {
                let bytes = read.held();
                match service.cache.digest(&read.key) {
                    Ok(digest) => {
                        service.metrics.inc_read_cache(true);
                        hits.push((read.id, digest));
                        released += bytes;
                    }
                    // Each miss keeps its bytes until named answered it.
                    Err(fill) => service.ask_named(from, read, fill, bytes),
                }
            }
            service.vouch(from, hits);
            service.release(from, released);
        });
    }

    /// Counts `bytes` more of peer `from`'s reads as held; `false` (nothing counted, the
    /// reads dropped) beyond its budget.
    fn hold(&self, from: u16, bytes: usize) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let peer = held.entry(from).or_default();
        if *peer + bytes > PEER_BUDGET {
            drop(held);
            self.metrics.inc_dropped("read_probe_budget");
            return false;
        }
        *peer += bytes;
        true
    }

    fn release(&self, from: u16, bytes: usize) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(peer) = held.get_mut(&from) {
            *peer = peer.saturating_sub(bytes);
        }
    }

    /// Asks named for a peer's read (the barrier executed, the cache missed): the query is
    /// begun here, its answer vouched for by a task of its own, which releases `bytes`.
    fn ask_named(self: &Arc<Self>, from: u16, read: Deferred, fill: Option<Fill>, bytes: usize) {
        let Deferred { id, tcp, message, .. } = read;
        let begun = (!tcp).then(|| self.named.start_udp(&message));
        let service = self.clone();
        tokio::spawn(async move {
            if let Some((_, digest)) = crate::read::vouched_answer(&service.named, &service.cache, fill, &message, tcp, begun, &service.metrics).await {
                service.vouch(from, vec![(id, digest)]);
            }
            service.release(from, bytes);
        });
    }

    fn vouch(&self, to: u16, mut answers: Vec<(u64, [u8; 32])>) {
        if answers.is_empty() || self.fault == Fault::Silent {
            return;
        }
        if self.fault == Fault::WrongVouches {
            for (_, digest) in answers.iter_mut() {
                digest[0] ^= 0xff;
            }
        }
        self.metrics.inc_vouches_sent(answers.len() as u64);
        self.out.send(to, encode_vouch(&answers));
    }
}

/// The gateway's vouch timeout: [`MARGIN`] times the [`PERCENTILE`]th percentile of the
/// waits (own answer in, to 2t+1 matching) of its recently vouched reads, within
/// `floor..=cap` (`cluster.vouch_timeout_ms..=vouch_timeout_max_ms`). Learnt window by window
/// ([`WINDOW`] vouched reads or [`WINDOW_PERIOD`]): up at once, down by halves. Only vouched
/// reads teach it; the module doc says why a Byzantine peer cannot raise it beyond what its
/// honest peers' own waits justify, nor ever past the cap.
#[derive(Debug)]
pub struct VouchClock {
    floor_us: u64,
    cap_us: u64,
    current_us: u64,
    /// Waits (us) of the reads vouched in the open window, each at most the cap.
    window: Vec<u64>,
    opened: Instant,
}

impl VouchClock {
    pub fn new(floor: Duration, cap: Duration, now: Instant) -> VouchClock {
        let floor_us = micros(floor).max(1);
        let cap_us = micros(cap).max(floor_us);
        VouchClock { floor_us, cap_us, current_us: floor_us, window: Vec::with_capacity(WINDOW), opened: now }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_micros(self.current_us)
    }

    /// A read was vouched `wait` after the gateway's own answer was in. `true`: the timeout
    /// changed.
    pub fn vouched(&mut self, wait: Duration, now: Instant) -> bool {
        self.window.push(micros(wait).min(self.cap_us));
        if self.window.len() >= WINDOW {
            return self.close(now);
        }
        self.tick(now)
    }

    /// Closes the window once its period is over. `true`: the timeout changed.
    pub fn tick(&mut self, now: Instant) -> bool {
        now.saturating_duration_since(self.opened) >= WINDOW_PERIOD && self.close(now)
    }

    fn close(&mut self, now: Instant) -> bool {
        let target = if self.window.is_empty() {
            self.floor_us
        } else {
            // Nearest rank: the smallest wait at or above PERCENTILE % of the window's.
            let rank = (self.window.len() * PERCENTILE).div_ceil(100).max(1) - 1;
            let (_, wait, _) = self.window.select_nth_unstable(rank);
            wait.saturating_mul(MARGIN).clamp(self.floor_us, self.cap_us)
        };
        self.window.clear();
        self.opened = now;
        let before = self.current_us;
        // Up at once: a read that times out costs an ordering round, far more than waiting.
        // Down by halves: one quick window does not undo what a lasting load taught.
        self.current_us = if target >= before { target } else { target + (before - target) / 2 };
        self.current_us != before
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vouch::answer_digest;
    use std::net::SocketAddr;
    use tokio::net::UdpSocket;

    fn query(id: u16) -> Vec<u8> {
        let name = hickory_proto::rr::Name::from_ascii("www.example.test.").unwrap();
        named_glue::forward::build_query(id, &name, hickory_proto::rr::RecordType::A).unwrap()
    }

    /// named's answer to `query(id)` as the fake below gives it.
    fn answer(id: u16) -> Vec<u8> {
        let mut a = query(id);
        a[2] |= 0x84;
        a
    }

    /// A named stand-in that answers every query with its bytes, QR and AA set.
    async fn fake_named() -> SocketAddr {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while let Ok((n, from)) = server.recv_from(&mut buf).await {
                let mut answer = buf[..n].to_vec();
                answer[2] |= 0x84;
                let _ = server.send_to(&answer, from).await;
            }
        });
        addr
    }

    /// A named stand-in that never answers (the socket is kept open by the returned value).
    async fn silent_named() -> (SocketAddr, UdpSocket) {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        (server.local_addr().unwrap(), server)
    }

    #[derive(Debug)]
    enum Sent {
        To(u16, Vec<u8>),
        All(Vec<u8>),
    }

    struct Capture(mpsc::UnboundedSender<Sent>);

    impl ReadsOutbound for Capture {
        fn send(&self, to: u16, message: Vec<u8>) {
            let _ = self.0.send(Sent::To(to, message));
        }
        fn broadcast(&self, message: Vec<u8>) {
            let _ = self.0.send(Sent::All(message));
        }
    }

    struct Harness {
        service: Arc<VouchedReads>,
        out: mpsc::UnboundedReceiver<Sent>,
        fallback: mpsc::Receiver<ClientRequest>,
        executed: watch::Sender<u64>,
        _barrier: watch::Sender<u64>,
        cache: Arc<ReadCache>,
    }

    /// A gateway with a fixed timeout.
    async fn harness(named: SocketAddr, barrier: u64, executed: u64, timeout_ms: u64, fault: Fault) -> Harness {
        harness_within(named, barrier, executed, timeout_ms, timeout_ms, fault).await
    }

    async fn harness_within(named: SocketAddr, barrier: u64, executed: u64, timeout_ms: u64, max_ms: u64, fault: Fault) -> Harness {
        let named = Forwarder { udp_timeout: Duration::from_millis(200), udp_attempts: 1, ..Forwarder::new(named) };
        let (out_tx, out) = mpsc::unbounded_channel();
        let (barrier_tx, barrier_rx) = watch::channel(barrier);
        let (executed_tx, executed_rx) = watch::channel(executed);
        let (fallback_tx, fallback) = mpsc::channel(64);
        let wiring = Wiring { out: Arc::new(Capture(out_tx)), barrier: barrier_rx, executed: executed_rx, fallback: fallback_tx, fault };
        let cache = Arc::new(ReadCache::default());
        let (service, task) =
            VouchedReads::start(4, 1, named, cache.clone(), Metrics::new(0), Duration::from_millis(timeout_ms)..=Duration::from_millis(max_ms), wiring);
        tokio::spawn(task);
        Harness { service, out, fallback, executed: executed_tx, _barrier: barrier_tx, cache }
    }

    async fn client() -> (UdpSocket, crate::reply::ReplyTo) {
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let server = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        // A fresh socket's send readiness is known once the reactor has seen it.
        server.writable().await.unwrap();
        let reply = crate::reply::ReplyTo::Udp { socket: server, peer: client.local_addr().unwrap(), rrl: None, lie: false };
        (client, reply)
    }

    /// Takes one read onto the vouched path and sends its probe.
    fn take(h: &Harness, request: ClientRequest) {
        let mut out = VouchTurn::default();
        h.service.take(request, &mut out).unwrap();
        h.service.send_probes(&mut out);
        assert!(out.is_empty());
    }

    async fn next_sent(out: &mut mpsc::UnboundedReceiver<Sent>) -> Sent {
        tokio::time::timeout(Duration::from_secs(2), out.recv()).await.expect("something sent").unwrap()
    }

    /// The reads of the next probe broadcast: (id, tcp, message).
    async fn next_probe(out: &mut mpsc::UnboundedReceiver<Sent>) -> Vec<(u64, bool, Vec<u8>)> {
        match next_sent(out).await {
            Sent::All(m) => match decode_read_wire(&m) {
                Ok(ReadWire::Probe(reads)) => reads.into_iter().map(|(id, tcp, m)| (id, tcp, m.to_vec())).collect(),
                other => panic!("expected a probe, got {other:?}"),
            },
            other => panic!("expected a broadcast, got {other:?}"),
        }
    }

    fn vouch_to(sent: Sent) -> (u16, Vec<(u64, [u8; 32])>) {
        match sent {
            Sent::To(to, m) => match decode_read_wire(&m) {
                Ok(ReadWire::Vouch(answers)) => (to, answers),
                other => panic!("expected a vouch, got {other:?}"),
            },
            other => panic!("expected a vouch to one peer, got {other:?}"),
        }
    }

    fn probe_of(reads: &[(u64, bool, &[u8])]) -> Vec<u8> {
        let mut batch = ProbeBatch::default();
        for (id, tcp, m) in reads {
            assert!(batch.push(*id, *tcp, m));
        }
        batch.take().unwrap()
    }

    fn fill(cache: &ReadCache, request: &[u8]) {
        let crate::read::Lookup::Miss(Some(fill)) = cache.lookup(request, false) else { panic!("an empty cache misses") };
        cache.fill(fill, &answer(u16::from_be_bytes([request[0], request[1]])));
    }

    fn outcome(m: &Metrics, outcome: &str) -> u64 {
        let text = m.render();
        text.lines()
            .find(|l| l.starts_with("sdns_vouched_reads_total") && l.contains(&format!("outcome=\"{outcome}\"")))
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or(0)
    }

    /// Two matching vouches answer the read; wrong digests from peers make it fall back at
    /// once when 2t+1 is out of reach; silence falls back after the timeout.
    #[tokio::test]
    async fn gateway_answers_when_vouched_and_orders_otherwise() {
        let mut h = harness(fake_named().await, 0, 0, 200, Fault::None).await;
        let (c, reply) = client().await;
        take(&h, ClientRequest { bytes: query(1), tcp: false, reply: reply.clone() });
        let probes = next_probe(&mut h.out).await;
        assert_eq!(probes.len(), 1);
        let (id, tcp, message) = probes[0].clone();
        assert_eq!((tcp, message), (false, query(1)));
        // The peers' answers are named's for the same question (another id): they match.
        let digest = answer_digest(&answer(77));
        h.service.handle(1, &encode_vouch(&[(id, digest)]));
        h.service.handle(1, &encode_vouch(&[(id, digest)]));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(outcome(&h.service.metrics, "vouched"), 0, "one peer twice is not two");
        h.service.handle(2, &encode_vouch(&[(id, digest)]));
        // The client got the gateway's own answer, its own id.
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(2), c.recv(&mut buf)).await.expect("answered").unwrap();
        assert_eq!(&buf[..n], &answer(1)[..]);
        assert_eq!(outcome(&h.service.metrics, "vouched"), 1);
        assert!(h.fallback.try_recv().is_err());

        // Two wrong digests: ordered at once, long before the timeout.
        take(&h, ClientRequest { bytes: query(2), tcp: false, reply: reply.clone() });
        let id = next_probe(&mut h.out).await[0].0;
        h.service.handle(1, &encode_vouch(&[(id, [0xee; 32])]));
        h.service.handle(3, &encode_vouch(&[(id, [0xdd; 32])]));
        let ordered = tokio::time::timeout(Duration::from_millis(150), h.fallback.recv()).await.expect("fell back before the timeout").unwrap();
        assert_eq!(ordered.bytes, query(2));
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 1);

        // Nobody vouches: ordered after the timeout.
        take(&h, ClientRequest { bytes: query(3), tcp: true, reply });
        let ordered = tokio::time::timeout(Duration::from_secs(2), h.fallback.recv()).await.expect("fell back").unwrap();
        assert!(ordered.tcp && ordered.bytes == query(3));
    }

    /// With its barrier executed, the gateway's own answer comes from the read cache: named
    /// (silent here) is never needed, and two vouches answer the client.
    #[tokio::test]
    async fn gateway_answers_from_the_cache_without_named() {
        let (named, _keep) = silent_named().await;
        let mut h = harness(named, 3, 3, 2_000, Fault::None).await;
        fill(&h.cache, &query(9));
        let (c, reply) = client().await;
        take(&h, ClientRequest { bytes: query(5), tcp: false, reply });
        let id = next_probe(&mut h.out).await[0].0;
        let digest = answer_digest(&answer(6));
        h.service.handle(2, &encode_vouch(&[(id, digest)]));
        h.service.handle(3, &encode_vouch(&[(id, digest)]));
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(2), c.recv(&mut buf)).await.expect("answered").unwrap();
        assert_eq!(&buf[..n], &answer(5)[..], "the cached answer with the client's id");
        // Not a plain query (an update), or a voting client's read: handed back to be ordered.
        let mut update = query(5);
        update[2] |= 5 << 3;
        let (_, reply) = client().await;
        assert!(h.service.take(ClientRequest { bytes: update, tcp: false, reply }, &mut VouchTurn::default()).is_err());
    }

    /// A peer's probe is answered only once its barrier is executed; probes that are not
    /// plain queries are ignored.
    #[tokio::test]
    async fn peers_vouch_after_their_barrier_only() {
        let mut h = harness(fake_named().await, 5, 4, 200, Fault::None).await;
        let mut update = query(5);
        update[2] |= 5 << 3;
        h.service.handle(2, &probe_of(&[(10, false, &query(5)), (11, false, &update), (12, false, &[9, 9])]));
        let early = tokio::time::timeout(Duration::from_millis(100), h.out.recv()).await;
        assert!(early.is_err(), "vouched before executing up to the barrier: {early:?}");
        h.executed.send_replace(5);
        let (to, answers) = vouch_to(next_sent(&mut h.out).await);
        assert_eq!(to, 2);
        assert_eq!(answers, vec![(10, answer_digest(&answer(5)))], "only the plain query");
    }

    /// With the barrier executed and the answer cached, a peer vouches within the call that
    /// brought the probe (no task, no named); misses go to named and are vouched for later.
    #[tokio::test]
    async fn peers_vouch_from_the_cache_at_once() {
        let mut h = harness(fake_named().await, 7, 7, 200, Fault::None).await;
        fill(&h.cache, &query(1));
        let other = {
            let name = hickory_proto::rr::Name::from_ascii("other.example.test.").unwrap();
            named_glue::forward::build_query(3, &name, hickory_proto::rr::RecordType::A).unwrap()
        };
        h.service.handle(1, &probe_of(&[(20, false, &query(2)), (21, false, &other)]));
        let (to, answers) = vouch_to(h.out.try_recv().expect("vouched for the hit within the call"));
        assert_eq!((to, answers), (1, vec![(20, answer_digest(&answer(2)))]));
        let (to, answers) = vouch_to(next_sent(&mut h.out).await);
        let mut named_answer = other.clone();
        named_answer[2] |= 0x84;
        assert_eq!((to, answers), (1, vec![(21, answer_digest(&named_answer))]));
        // Malformed messages are counted and dropped.
        h.service.handle(1, &[7, 7, 7]);
        h.service.handle(1, &[]);
        assert!(h.out.try_recv().is_err());
        assert!(h.service.metrics.render().contains("read_message_tag"));
    }

    /// With the barrier executed, named is asked for a cache miss within the call that took
    /// the read: a peer's probe in the call that brought it, the gateway's own copy in the
    /// call that sends its probes (after them). The test's runtime has one thread, so no task
    /// runs before the test awaits: named has each query before any task could have sent it.
    #[tokio::test]
    async fn misses_are_asked_of_named_within_the_call() {
        let named = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        named.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut h = harness(named.local_addr().unwrap(), 2, 2, 2_000, Fault::None).await;
        let answer_one = |named: &std::net::UdpSocket| {
            let mut buf = [0u8; 512];
            let (n, from) = named.recv_from(&mut buf).expect("named has the query");
            buf[2] |= 0x84;
            named.send_to(&buf[..n], from).unwrap();
            buf[..n].to_vec()
        };
        // The first miss finds no pooled socket: a task opens one (and then keeps it).
        h.service.handle(1, &probe_of(&[(40, false, &query(1))]));
        let other = named.try_clone().unwrap();
        let first = tokio::task::spawn_blocking(move || answer_one(&other));
        assert_eq!(vouch_to(next_sent(&mut h.out).await), (1, vec![(40, answer_digest(&first.await.unwrap()))]));
        // A peer's probe of another question: at named when the call returns.
        let other_name = |id| {
            let name = hickory_proto::rr::Name::from_ascii("other.example.test.").unwrap();
            named_glue::forward::build_query(id, &name, hickory_proto::rr::RecordType::A).unwrap()
        };
        h.service.handle(2, &probe_of(&[(41, false, &other_name(3))]));
        let answered = answer_one(&named);
        let asked = other_name(3);
        assert_eq!((&answered[..2], &answered[3..]), (&asked[..2], &asked[3..]), "the peer's question");
        assert_eq!(vouch_to(next_sent(&mut h.out).await), (2, vec![(41, answer_digest(&answered))]));
        // The gateway's own copy of a third question: the probe is out, and named has the
        // query, when send_probes returns.
        let third = {
            let name = hickory_proto::rr::Name::from_ascii("third.example.test.").unwrap();
            named_glue::forward::build_query(9, &name, hickory_proto::rr::RecordType::A).unwrap()
        };
        let (c, reply) = client().await;
        let mut out = VouchTurn::default();
        h.service.take(ClientRequest { bytes: third.clone(), tcp: false, reply }, &mut out).unwrap();
        h.service.send_probes(&mut out);
        let Sent::All(probe) = h.out.try_recv().expect("the probe went out first") else { panic!("a probe is broadcast") };
        let Ok(ReadWire::Probe(reads)) = decode_read_wire(&probe) else { panic!("a probe") };
        let id = reads[0].0;
        let answered = answer_one(&named);
        assert_eq!((&answered[..2], &answered[3..]), (&third[..2], &third[3..]), "the client's question");
        let digest = answer_digest(&answered);
        h.service.handle(1, &encode_vouch(&[(id, digest)]));
        h.service.handle(3, &encode_vouch(&[(id, digest)]));
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(5), c.recv(&mut buf)).await.expect("answered").unwrap();
        assert_eq!(&buf[..n], &answered[..]);
    }

    /// The wrong-vouches fault vouches for another digest than its answer's; the silent one
    /// sends nothing.
    #[tokio::test]
    async fn faults_spoil_or_withhold_vouches() {
        let mut h = harness(fake_named().await, 0, 0, 200, Fault::WrongVouches).await;
        fill(&h.cache, &query(1));
        h.service.handle(3, &probe_of(&[(30, false, &query(1))]));
        let (_, answers) = vouch_to(h.out.try_recv().unwrap());
        assert_eq!(answers.len(), 1);
        assert_ne!(answers[0].1, answer_digest(&answer(1)));
        let mut h = harness(fake_named().await, 0, 0, 200, Fault::Silent).await;
        fill(&h.cache, &query(1));
        h.service.handle(3, &probe_of(&[(30, false, &query(1))]));
        let (_, reply) = client().await;
        take(&h, ClientRequest { bytes: query(4), tcp: false, reply });
        assert!(h.out.try_recv().is_err(), "a silent replica sends no vouch and no probe");
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// One window of vouched reads that all waited `wait`.
    fn window_of(clock: &mut VouchClock, wait: Duration, now: Instant) {
        for _ in 0..WINDOW {
            clock.vouched(wait, now);
        }
    }

    /// Vouches that come just within the timeout (the slower ones fell back, unseen) raise it
    /// window by window, up to the cap and never past it; a few slow ones do not.
    #[test]
    fn the_timeout_grows_under_slow_vouches_up_to_the_cap() {
        let now = Instant::now();
        let mut c = VouchClock::new(ms(5), ms(50), now);
        assert_eq!(c.timeout(), ms(5));
        // Quick vouches (4 x 0.5 ms): the floor holds.
        window_of(&mut c, Duration::from_micros(500), now);
        assert_eq!(c.timeout(), ms(5));
        window_of(&mut c, Duration::from_micros(4_500), now);
        assert_eq!(c.timeout(), ms(18));
        window_of(&mut c, ms(15), now);
        assert_eq!(c.timeout(), ms(50), "4 x 15 ms, capped");
        // A vouch counted after its deadline passed (before the expiry task ran) counts as the cap.
        window_of(&mut c, ms(10_000), now);
        assert_eq!(c.timeout(), ms(50));
        // The 95th percentile, not the slowest: 12 slow reads of 256 leave it where the rest put it.
        let mut c = VouchClock::new(ms(5), ms(50), now);
        for i in 0..WINDOW {
            c.vouched(if i < 12 { ms(40) } else { ms(2) }, now);
        }
        assert_eq!(c.timeout(), ms(8));
        // A cap at the floor is a fixed timeout.
        let mut c = VouchClock::new(ms(5), ms(5), now);
        window_of(&mut c, ms(4), now);
        assert_eq!(c.timeout(), ms(5));
    }

    /// Quick vouches bring it back to the floor, by halves; a whole period with nothing vouched
    /// relaxes it too, and a window still open does not.
    #[test]
    fn the_timeout_shrinks_back_when_vouches_are_quick_again() {
        let now = Instant::now();
        let mut c = VouchClock::new(ms(5), ms(50), now);
        window_of(&mut c, ms(30), now);
        assert_eq!(c.timeout(), ms(50));
        window_of(&mut c, Duration::from_micros(100), now);
        assert_eq!(c.timeout(), Duration::from_micros(27_500), "halfway down, not at once");
        let mut windows = 1;
        while c.timeout() > ms(5) {
            let before = c.timeout();
            window_of(&mut c, Duration::from_micros(100), now);
            assert!(c.timeout() < before);
            windows += 1;
        }
        assert_eq!((c.timeout(), windows), (ms(5), 16));
        // Nothing vouched: unchanged while the period runs, then halfway back to the floor.
        window_of(&mut c, ms(10), now);
        assert_eq!(c.timeout(), ms(40));
        assert!(!c.tick(now + WINDOW_PERIOD / 2));
        assert_eq!(c.timeout(), ms(40));
        assert!(c.tick(now + WINDOW_PERIOD));
        assert_eq!(c.timeout(), Duration::from_micros(22_500));
        // A few reads vouched in a period that is over: the window closes with what it has.
        c.vouched(ms(1), now + 2 * WINDOW_PERIOD);
        c.vouched(ms(1), now + 2 * WINDOW_PERIOD);
        assert!(c.vouched(ms(1), now + 3 * WINDOW_PERIOD));
        assert!(c.timeout() < Duration::from_micros(22_500));
    }

    /// Probe id of the one read of the next broadcast (sent within the call).
    fn probe_id(h: &mut Harness) -> u64 {
        match h.out.try_recv() {
            Ok(Sent::All(m)) => match decode_read_wire(&m) {
                Ok(ReadWire::Probe(reads)) => reads[0].0,
                other => panic!("expected a probe, got {other:?}"),
            },
            other => panic!("expected a probe broadcast, got {other:?}"),
        }
    }

    /// A gateway (n = 4, t = 1) whose own answers come from its cache at once, on a paused
    /// clock: each read's own answer is in when `take` returns, and the test chooses when each
    /// vouch arrives.
    async fn learning_gateway() -> (Harness, UdpSocket, crate::reply::ReplyTo, tokio::sync::mpsc::Receiver<crate::reply::Outgoing>) {
        let (named, keep) = silent_named().await;
        let h = harness_within(named, 0, 0, 5, 50, Fault::None).await;
        fill(&h.cache, &query(9));
        let (reply, answers) = crate::reply::ReplyTo::internal();
        (h, keep, reply, answers)
    }

    /// The gateway takes read `dns_id` (a cache hit); its probe's id.
    fn read(h: &mut Harness, reply: &crate::reply::ReplyTo, dns_id: u16) -> u64 {
        take(h, ClientRequest { bytes: query(dns_id), tcp: false, reply: reply.clone() });
        probe_id(h)
    }

    fn gauge(m: &Metrics) -> String {
        m.render().lines().find(|l| l.starts_with("sdns_vouch_timeout_seconds{")).expect("the gauge").to_owned()
    }

    /// Through the service: peers that vouch just within the timeout raise it to the cap, never
    /// past it, and the gauge shows it; quick vouches bring it back to the floor.
    #[tokio::test(start_paused = true)]
    async fn slow_vouches_raise_the_timeout_to_the_cap_and_quick_ones_lower_it() {
        let (mut h, _named, reply, _answers) = learning_gateway().await;
        assert_eq!(gauge(&h.service.metrics), "sdns_vouch_timeout_seconds{replica=\"0\"} 0.005");
        let digest = answer_digest(&answer(6));
        let mut reads = 0u64;
        while h.service.timeout() < ms(50) {
            let wait = h.service.timeout() * 9 / 10;
            let id = read(&mut h, &reply, 5);
            tokio::time::advance(wait).await;
            h.service.handle(1, &encode_vouch(&[(id, digest)]));
            h.service.handle(2, &encode_vouch(&[(id, digest)]));
            reads += 1;
            assert!(h.service.timeout() <= ms(50));
            assert!(reads < 10 * WINDOW as u64, "stuck at {:?}", h.service.timeout());
        }
        assert_eq!(outcome(&h.service.metrics, "vouched"), reads);
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 0);
        assert_eq!(gauge(&h.service.metrics), "sdns_vouch_timeout_seconds{replica=\"0\"} 0.05");
        while h.service.timeout() > ms(5) {
            let id = read(&mut h, &reply, 5);
            tokio::time::advance(Duration::from_micros(200)).await;
            h.service.handle(3, &encode_vouch(&[(id, digest)]));
            h.service.handle(2, &encode_vouch(&[(id, digest)]));
            reads += 1;
            assert!(reads < 40 * WINDOW as u64, "stuck at {:?}", h.service.timeout());
        }
        assert_eq!(gauge(&h.service.metrics), "sdns_vouch_timeout_seconds{replica=\"0\"} 0.005");
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 0);
    }

    /// Reads that fall back teach nothing unless 2t+1 vouches still match: not those that
    /// time out with too few matching vouches, not those whose vouches fail at once.
    #[tokio::test(start_paused = true)]
    async fn reads_that_fall_back_do_not_move_the_timeout() {
        let (mut h, _named, reply, _answers) = learning_gateway().await;
        let digest = answer_digest(&answer(6));
        // Raised first, so that it could move either way.
        for _ in 0..WINDOW {
            let id = read(&mut h, &reply, 5);
            tokio::time::advance(Duration::from_micros(4_500)).await;
            h.service.handle(1, &encode_vouch(&[(id, digest)]));
            h.service.handle(3, &encode_vouch(&[(id, digest)]));
        }
        assert_eq!(h.service.timeout(), ms(18));
        // Timed out: one vouch only, the second after the read was ordered and for another
        // answer (2t+1 never match).
        for _ in 0..20 {
            let id = read(&mut h, &reply, 5);
            h.service.handle(1, &encode_vouch(&[(id, digest)]));
            assert_eq!(h.fallback.recv().await.unwrap().bytes, query(5));
            h.service.handle(2, &encode_vouch(&[(id, [0xdd; 32])]));
        }
        // Failed at once: two peers for another answer, then the third for the right one.
        for _ in 0..(2 * WINDOW) {
            let id = read(&mut h, &reply, 5);
            h.service.handle(1, &encode_vouch(&[(id, [0xee; 32])]));
            h.service.handle(2, &encode_vouch(&[(id, [0xdd; 32])]));
            h.service.handle(3, &encode_vouch(&[(id, digest)]));
            assert_eq!(h.fallback.try_recv().unwrap().bytes, query(5));
        }
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 20 + 2 * WINDOW as u64);
        assert_eq!(outcome(&h.service.metrics, "vouched"), WINDOW as u64);
        assert_eq!(h.service.timeout(), ms(18));
    }

    /// Every vouch takes longer than the floor: the first reads time out, and their vouches,
    /// matching late, raise the timeout above the waits, after which reads are vouched.
    #[tokio::test(start_paused = true)]
    async fn vouches_that_always_come_late_raise_the_timeout_from_the_floor() {
        let (mut h, _named, reply, _answers) = learning_gateway().await;
        let digest = answer_digest(&answer(6));
        assert_eq!(h.service.timeout(), ms(5));
        let mut timed_out = 0u64;
        while h.service.timeout() < ms(8) {
            let id = read(&mut h, &reply, 5);
            assert_eq!(h.fallback.recv().await.unwrap().bytes, query(5), "timed out at the floor");
            timed_out += 1;
            tokio::time::advance(ms(3)).await;
            h.service.handle(1, &encode_vouch(&[(id, digest)]));
            h.service.handle(2, &encode_vouch(&[(id, digest)]));
            assert!(timed_out <= WINDOW as u64, "the late vouches taught nothing: {:?}", h.service.timeout());
        }
        // 8 ms waits: 4 x 8 = 32 ms.
        assert_eq!(h.service.timeout(), ms(32));
        let id = read(&mut h, &reply, 5);
        tokio::time::advance(ms(8)).await;
        h.service.handle(1, &encode_vouch(&[(id, digest)]));
        h.service.handle(2, &encode_vouch(&[(id, digest)]));
        assert_eq!(outcome(&h.service.metrics, "vouched"), 1);
        assert_eq!(outcome(&h.service.metrics, "fell_back"), timed_out);
        // Late beyond the cap: nothing learnt from those.
        let id = read(&mut h, &reply, 5);
        assert_eq!(h.fallback.recv().await.unwrap().bytes, query(5));
        tokio::time::advance(ms(60)).await;
        h.service.handle(1, &encode_vouch(&[(id, digest)]));
        h.service.handle(2, &encode_vouch(&[(id, digest)]));
        assert_eq!(h.service.timeout(), ms(32));
    }

    /// Peer 3 is Byzantine. While the honest peers agree, its vouch never decides a read: late
    /// or never, right or wrong, the timeout follows the honest peers' waits. Where it does
    /// decide (an honest peer answered otherwise, e.g. racing a write) and it vouches as late as
    /// it can, every time, the timeout reaches the cap and stays there.
    #[tokio::test(start_paused = true)]
    async fn a_silent_or_lying_peer_cannot_raise_the_timeout_past_the_cap() {
        let (mut h, _named, reply, _answers) = learning_gateway().await;
        let digest = answer_digest(&answer(6));
        for i in 0..(3 * WINDOW) {
            let id = read(&mut h, &reply, 5);
            let deadline = h.service.timeout();
            match i % 3 {
                // Spoilt at once.
                0 => h.service.handle(3, &encode_vouch(&[(id, [0xee; 32])])),
                // Withheld (silent).
                1 => {}
                // Right, but as late as it can: it comes after the honest ones.
                _ => {}
            }
            tokio::time::advance(ms(1)).await;
            h.service.handle(1, &encode_vouch(&[(id, digest)]));
            h.service.handle(2, &encode_vouch(&[(id, digest)]));
            if i % 3 == 2 {
                tokio::time::advance(deadline - ms(2)).await;
                h.service.handle(3, &encode_vouch(&[(id, digest)]));
            }
        }
        assert_eq!(outcome(&h.service.metrics, "vouched"), 3 * WINDOW as u64);
        assert_eq!(h.service.timeout(), ms(5), "4 x the honest peers' 1 ms is below the floor");
        // Its vouch decides: honest peer 2 answered otherwise.
        for _ in 0..(4 * WINDOW) {
            let id = read(&mut h, &reply, 5);
            let deadline = h.service.timeout();
            h.service.handle(1, &encode_vouch(&[(id, digest)]));
            h.service.handle(2, &encode_vouch(&[(id, [0xdd; 32])]));
            tokio::time::advance(deadline - Duration::from_micros(1)).await;
            h.service.handle(3, &encode_vouch(&[(id, digest)]));
            assert!(h.service.timeout() <= ms(50));
        }
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 0);
        assert_eq!(h.service.timeout(), ms(50), "at the cap, not past it");
        // Silent now, where it decided: those reads fall back after at most the cap.
        let start = Instant::now();
        let id = read(&mut h, &reply, 5);
        h.service.handle(1, &encode_vouch(&[(id, digest)]));
        h.service.handle(2, &encode_vouch(&[(id, [0xdd; 32])]));
        assert_eq!(h.fallback.recv().await.unwrap().bytes, query(5));
        // tokio's timers tick by the millisecond; the clock is not on a tick here.
        assert!((ms(50)..=ms(51)).contains(&start.elapsed()), "{:?}", start.elapsed());
        assert_eq!(h.service.timeout(), ms(50));
    }

    /// The timeout varies, so a read queued later may be due sooner: it falls back at its own
    /// deadline, not after the earlier read's.
    #[tokio::test(start_paused = true)]
    async fn a_read_due_sooner_falls_back_first() {
        let (mut h, _named, reply, _answers) = learning_gateway().await;
        let set = |h: &Harness, timeout: Duration| {
            let mut clock = h.service.lock_clock();
            clock.current_us = micros(timeout);
            h.service.publish(true, &clock);
        };
        let start = Instant::now();
        set(&h, ms(50));
        read(&mut h, &reply, 1);
        set(&h, ms(5));
        read(&mut h, &reply, 2);
        assert_eq!(h.fallback.recv().await.unwrap().bytes, query(2));
        assert_eq!(start.elapsed(), ms(5));
        assert_eq!(h.fallback.recv().await.unwrap().bytes, query(1));
        assert_eq!(start.elapsed(), ms(50));
    }
}
