//! Vouched reads: PBFT's read-only optimisation inside the cluster, for ordinary clients in
//! ordered mode (`cluster.vouched_reads`, on by default).
//!
//! The gateway (the replica a client asked, which that client trusts) answers a plain query
//! without ordering it once 2t of its peers have told it how far their logs reach, and its own
//! answer reflects the log at least that far; otherwise it orders the read as before. This is
//! the read index of Raft's linearizable reads, made Byzantine: the gateway asks for *positions*,
//! never for answers, so a read costs its peers no work on named and no answer crosses the mesh.
//!
//! - The gateway probes its peers in rounds on the mesh's reads channel
//!   (`mesh::CHANNEL_READS`, messages in `crate::vouch`): the UDP listener sends one probe for
//!   all the datagrams it took in one turn. A probe carries the round's number only.
//! - A peer answers at once, in the mesh's reader task, with its *read barrier* as the probe
//!   arrived: the highest seq its ordering core has sent a commit for, or delivered. It looks at
//!   nothing else: no cache, no named, no wait for its executor.
//! - The gateway takes its own barrier as the read arrives, and its own answer (read cache,
//!   else named) once it has executed that far, noting the executed position the answer
//!   reflects. With 2t peers' barriers in, the read needs an answer reflecting the largest of
//!   its own barrier and those 2t peers' smallest ([`crate::vouch::Barriers::required`]). An
//!   answer that reflects it goes to the client; one taken before is taken again once the
//!   gateway has executed that far (at most once per read; an answer of a later position
//!   needs no further check).
//!
//! Why this is linearizable (docs/DETERMINISM.md, "Vouched reads", says it at length): a write
//! W at seq s was acknowledged only after it committed, i.e. after 2t+1 replicas had sent a
//! commit for s, each showing a barrier of at least s from then on. The gateway and the 2t
//! peers whose barriers count took theirs after the read began (a probe round is sent after
//! every read it covers was taken); these 2t+1 replicas and the 2t+1 committers share at least
//! t+1, so one honest replica among them, maybe the gateway, showed a barrier of at least s,
//! and the required position is at least s: the answer reflects W. It reflects nothing that
//! was not ordered, since the gateway executes only committed batches.
//! The barrier is the one the ordering driver publishes (`ReplicaHandle::read_barrier`) after
//! feeding each turn's inputs and before sending any of their messages, so a replica that has
//! sent a commit for s already shows a barrier of at least s to a probe.
//!
//! What a Byzantine peer can do: a barrier too low changes nothing (an honest committer is
//! among any 2t+1); one too high, or none, can only make the read wait: taking the 2t smallest
//! leaves up to t made-up barriers out once every peer has answered, and no read waits past
//! the vouch timeout before it is ordered after all. The client is sent the gateway's own
//! bytes, never anything a peer gave.
//!
//! The vouch timeout ([`VouchClock`]) follows the load: a read ordered after all costs an
//! ordering round at every replica (about 50 ms under the load at which vouches get slow), far
//! more than waiting a little longer. The gateway waits 4 times the 95th percentile of the
//! waits (own answer in, to the read decided) of its recently vouched reads, never less than
//! `cluster.vouch_timeout_ms` and never more than `cluster.vouch_timeout_max_ms`. What a
//! Byzantine peer can do to it:
//! - no read waits for its peers longer than the cap, whatever any peer sends or withholds;
//! - only vouched reads teach the clock: a withheld barrier or one far ahead either makes a
//!   read fall back or leaves the read to the honest peers. A read that timed out is ordered all
//!   the same, and still teaches if its round's barriers decide it within the cap, with the
//!   wait they took: a clock that saw only the reads vouched in time could never rise when
//!   every answer takes longer than the floor. A read whose own answer proved behind teaches
//!   nothing once timed out;
//! - a vouched read's wait ends with the 2t-th barrier that lets it pass. At least 2t of the
//!   n-1 peers are honest, so a slow liar cannot make a wait longer than the honest peers alone
//!   make it, and a quick one can make it shorter, never below the floor; only where an honest
//!   peer is ahead of the gateway's answer and the others are slow does a liar decide the wait,
//!   up to the current deadline, and all it buys is the cap;
//! - a window period (1 s) with nothing vouched moves the timeout halfway back to the floor,
//!   which never raises it.
//!
//! The timeout is the gateway's own: it decides whether a read is answered as vouched or
//! ordered, never what any replica executes or answers.
//!
//! Cost: a peer answers a round with one 17-byte message, whatever the round holds; the
//! gateway answers from its read cache when its barrier is executed, and a miss's query to
//! named is sent in the call that took the read, just after the round's probe is out, so named
//! works on it while the probe travels. Only what must wait (a barrier not executed yet, a
//! miss's answer from named) gets a task of its own.
//!
//! Nothing here makes the executor wait: the gateway waits for the executed position on a watch
//! channel and answers from the read cache or named, as local reads do. What a peer can make
//! this replica hold: nothing as a peer (a probe is answered within the call), and as a gateway
//! one entry per peer per open round, within [`MAX_WAITING`] reads.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use exec::classify::Kind;
use named_glue::forward::Forwarder;
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::read::{Fill, Keyed, ReadCache};
use crate::reply::ClientRequest;
pub use crate::vouch::Fault;
use crate::vouch::{decode_read_wire, verdict, Barriers, ReadWire, Verdict};

/// Reads awaiting their peers at this gateway; beyond, reads are ordered directly.
const MAX_WAITING: usize = 4096;
/// Timeouts queued at most (one per read whose own answer is in; a decided read's stays until
/// it is due); beyond, the read due first is ordered at once.
const MAX_DEADLINES: usize = 4 * MAX_WAITING;
/// Timed-out reads kept for their rounds' late barriers at most (see `VouchedReads::late`);
/// beyond, the oldest is forgotten.
const MAX_LATE: usize = MAX_WAITING;
/// Reads one probe round covers at most; the listener's turn starts another beyond.
const MAX_ROUND_READS: usize = 256;
/// Vouched reads per learning window of the [`VouchClock`] (a window also closes after
/// [`WINDOW_PERIOD`] with fewer).
const WINDOW: usize = 256;
/// A learning window closes after this long whatever it holds; one in which nothing was
/// vouched moves the timeout halfway back to its floor.
const WINDOW_PERIOD: Duration = Duration::from_secs(1);
/// The timeout is [`MARGIN`] times this percentile of a window's waits.
const PERCENTILE: usize = 95;
const MARGIN: u64 = 4;
/// The longest a gateway waits for its own executor to reach its barrier before ordering the
/// read instead.
const OWN_WAIT: Duration = Duration::from_secs(1);

/// Where probes and barriers go: the mesh's reads channel, or a test's capture.
pub trait ReadsOutbound: Send + Sync + 'static {
    fn send(&self, to: u16, message: Vec<u8>);
    fn broadcast(&self, message: Vec<u8>);
}

impl ReadsOutbound for mesh::MeshSender {
    fn send(&self, to: u16, message: Vec<u8>) {
        if let Err(e) = mesh::MeshSender::send(self, to, mesh::CHANNEL_READS, Bytes::from(message)) {
            tracing::debug!(to, error = %e, "read barrier not sent");
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
    /// How long a gateway waits for its peers once its own answer is in, learnt from its
    /// vouched reads; `timeout_us` is its current value, read without the lock.
    clock: Mutex<VouchClock>,
    timeout_us: AtomicU64,
    /// The ordering core's read barrier, published by its driver.
    barrier: watch::Receiver<u64>,
    /// The executor's executed position.
    executed: watch::Receiver<u64>,
    out: Arc<dyn ReadsOutbound>,
    fault: Fault,
    /// Reads this gateway is deciding, and their probe rounds.
    table: Mutex<Table>,
    /// When reads whose own answer is in fall back, earliest first (the timeout varies, so
    /// a read queued later may be due sooner).
    deadlines: Mutex<BinaryHeap<Reverse<(Instant, u64)>>>,
    deadline_added: Notify,
    next_id: AtomicU64,
    next_round: AtomicU64,
    /// Reads to order after all (the gateway's loop orders them).
    fallback: mpsc::Sender<ClientRequest>,
    /// Reads ordered after all because their peers did not answer in time, kept until the
    /// cap has passed: if their round's barriers then decide them, the wait they took
    /// teaches the clock. A clock that learnt only from reads vouched in time could never rise
    /// above the floor when every answer takes longer than that.
    late: Mutex<LateReads>,
}

/// The reads being decided, by id, and the open probe rounds, by number.
#[derive(Default)]
struct Table {
    reads: HashMap<u64, Waiting>,
    rounds: HashMap<u64, Round>,
}

impl Table {
    /// Takes read `id` out (whoever does acts on it, once), and out of its round; a round
    /// with no read left is closed (its late answers find nothing).
    fn remove(&mut self, id: u64) -> Option<Waiting> {
        let w = self.reads.remove(&id)?;
        if let Some(round) = self.rounds.get_mut(&w.round) {
            round.reads.retain(|r| *r != id);
            if round.reads.is_empty() {
                self.rounds.remove(&w.round);
            }
        }
        Some(w)
    }
}

/// One probe round: its peers' barriers and the reads it covers that are still undecided.
struct Round {
    barriers: Barriers,
    reads: Vec<u64>,
}

struct Waiting {
    request: ClientRequest,
    round: u64,
    /// The gateway's barrier as the read arrived.
    barrier: u64,
    /// The gateway's own answer, once in, and the executed position it reflects.
    answer: Option<(Vec<u8>, u64)>,
    /// When the first own answer came in (the vouch timeout counts from there).
    own_at: Option<Instant>,
    /// The own answer proved behind and is being taken again.
    again: bool,
}

impl Waiting {
    fn verdict(&self, barriers: &Barriers) -> Verdict {
        verdict(barriers, self.barrier, self.answer.as_ref().map(|(_, at)| *at))
    }
}

/// Timed-out reads whose round may still decide them: by round, the round's barriers and its
/// reads, and the reads in the order they timed out.
#[derive(Default)]
struct LateReads {
    rounds: HashMap<u64, (Barriers, Vec<LateRead>)>,
    order: VecDeque<(Instant, u64, u64)>,
}

/// A timed-out read as its round's late barriers need it.
struct LateRead {
    id: u64,
    /// The gateway's barrier as the read arrived.
    barrier: u64,
    /// The executed position its own answer reflected, and when that answer came in.
    at: u64,
    own_at: Instant,
}

impl LateReads {
    /// Forgets the reads whose own answer came in before `since`, and the oldest beyond
    /// [`MAX_LATE`].
    fn prune(&mut self, since: Instant) {
        while let Some(&(at, round, id)) = self.order.front() {
            if at >= since && self.order.len() <= MAX_LATE {
                break;
            }
            self.order.pop_front();
            if let Some((_, reads)) = self.rounds.get_mut(&round) {
                reads.retain(|r| r.id != id);
                if reads.is_empty() {
                    self.rounds.remove(&round);
                }
            }
        }
    }
}

/// What [`VouchedReads::start`] is wired to.
pub struct Wiring {
    /// Probes and barriers out (the mesh's reads channel).
    pub out: Arc<dyn ReadsOutbound>,
    pub barrier: watch::Receiver<u64>,
    pub executed: watch::Receiver<u64>,
    pub fallback: mpsc::Sender<ClientRequest>,
    pub fault: Fault,
}

/// What a listener gathers in one turn for the vouched path ([`VouchedReads::take`]): one
/// probe round for its reads, and the gateway's own queries to named, begun once the probe
/// is out ([`VouchedReads::send_probes`]).
#[derive(Debug, Default)]
pub struct VouchTurn {
    round: Option<u64>,
    reads: usize,
    own: Vec<OwnFetch>,
}

impl VouchTurn {
    /// Nothing gathered (or all of it sent).
    pub fn is_empty(&self) -> bool {
        self.round.is_none() && self.own.is_empty()
    }
}

/// A read the gateway's cache missed with its barrier executed: named is asked for it once
/// the probe is out. `at`: the executed position when the cache missed.
#[derive(Debug)]
struct OwnFetch {
    id: u64,
    tcp: bool,
    message: Vec<u8>,
    fill: Option<Fill>,
    at: u64,
}

impl VouchedReads {
    /// The vouched-read service and the task that orders the reads whose peers did not
    /// answer in time (an essential task of the replica). Peers' messages come in through
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
            table: Mutex::new(Table::default()),
            deadlines: Mutex::new(BinaryHeap::new()),
            late: Mutex::new(LateReads::default()),
            deadline_added: Notify::new(),
            next_id: AtomicU64::new(0),
            next_round: AtomicU64::new(first_round()),
            fallback: wiring.fallback,
        });
        let task = service.clone().expire();
        (service, task)
    }

    /// Takes a client's read onto the vouched path when it can: a plain query (what the read
    /// cache could key; never an update, a transfer, a signed request) that is not a voting
    /// client's. It joins the turn's probe round, which the caller sends with
    /// [`Self::send_probes`] (at once, or after the other reads it has at hand); its own answer
    /// is taken at once when the barrier is executed and the cache has it, and when the cache
    /// misses, its query to named is begun as soon as the probe is out. Hands the request
    /// back, to be ordered (or answered as a voting read), otherwise.
    pub fn take(self: &Arc<Self>, request: ClientRequest, out: &mut VouchTurn) -> Result<(), ClientRequest> {
        if crate::voting_read::is_voting_read(&request.bytes) {
            return Err(request);
        }
        let Some(key) = crate::read_cache::key(&request.bytes, request.tcp) else { return Err(request) };
        if out.reads >= MAX_ROUND_READS {
            self.send_probes(out);
        }
        // Read after the read arrived: at or past every write acknowledged before it.
        let barrier = *self.barrier.borrow();
        let executed = *self.executed.borrow();
        let (tcp, dns_id) = (request.tcp, [request.bytes[0], request.bytes[1]]);
        // The own answer: from the cache (`Ok`), from named now (`Err(Some(fill))`, the
        // barrier executed and the cache missed), or once the barrier is executed (`Err(None)`).
        let own = if executed >= barrier {
            match self.cache.lookup_keyed(&key, dns_id) {
                Keyed::Hit(answer) => {
                    self.metrics.inc_read_cache(true);
                    Ok(answer)
                }
                Keyed::Miss(fill) => Err(Some(fill)),
            }
        } else {
            Err(None)
        };
        let (own, later) = match own {
            Ok(hit) => (Some((hit, executed)), None),
            Err(fetch) => (None, Some(fetch)),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let round = *out.round.get_or_insert_with(|| self.next_round.fetch_add(1, Ordering::Relaxed));
        // What named is asked when the own answer is not in the cache.
        let message = if later.is_some() { request.bytes.clone() } else { Vec::new() };
        let verdict;
        {
            let mut table = self.lock_table();
            if table.reads.len() >= MAX_WAITING {
                drop(table);
                self.metrics.inc_dropped("vouched_reads_full");
                return Err(request);
            }
            let own_at = own.is_some().then(Instant::now);
            let w = Waiting { request, round, barrier, answer: own, own_at, again: false };
            let Table { reads, rounds } = &mut *table;
            let r = rounds.entry(round).or_insert_with(|| Round { barriers: Barriers::new(self.n, self.t), reads: Vec::new() });
            verdict = w.verdict(&r.barriers);
            r.reads.push(id);
            reads.insert(id, w);
        }
        out.reads += 1;
        match later {
            // The own answer is in; the barriers are not (the probe is not even sent yet),
            // unless the gateway is its own quorum (t = 0).
            None if verdict == Verdict::Pending => self.wait_for_vouches(id),
            None => self.act(id, verdict),
            // named is asked once the probe is out ([`Self::send_probes`]).
            Some(Some(fill)) => out.own.push(OwnFetch { id, tcp, message, fill, at: executed }),
            Some(None) => {
                let service = self.clone();
                tokio::spawn(async move { service.answer_at(id, barrier, key, message, tcp, OWN_WAIT).await });
            }
        }
        Ok(())
    }

    /// The gateway's own answer to read `id` once it has executed up to `position` (waiting
    /// at most `wait`; beyond, the read is ordered): from the cache, else named.
    async fn answer_at(self: Arc<Self>, id: u64, position: u64, key: Vec<u8>, message: Vec<u8>, tcp: bool, wait: Duration) {
        let mut executed = self.executed.clone();
        // The guard the wait returns is dropped at once (it must not be held across awaits).
        let reached = tokio::time::timeout(wait, executed.wait_for(|e| *e >= position)).await.is_ok_and(|r| r.is_ok());
        if !reached {
            return self.fall_back(id);
        }
        let at = *executed.borrow();
        let own = match self.cache.lookup_keyed(&key, [message[0], message[1]]) {
            Keyed::Hit(answer) => {
                self.metrics.inc_read_cache(true);
                Some(answer)
            }
            Keyed::Miss(fill) => crate::read::forward_answer(&self.named, &self.cache, fill, &message, tcp, &self.metrics).await,
        };
        self.own_answer(id, own.map(|answer| (answer, at)));
    }

    /// The gateway's own answer to read `id` is in, reflecting the executed position it
    /// carries (`None`: named stayed silent, or the read failed: the ordered path decides).
    fn own_answer(self: &Arc<Self>, id: u64, own: Option<(Vec<u8>, u64)>) {
        let Some(own) = own else { return self.fall_back(id) };
        let (verdict, first) = {
            let mut table = self.lock_table();
            let Table { reads, rounds } = &mut *table;
            let Some(w) = reads.get_mut(&id) else { return };
            let first = w.own_at.is_none();
            w.own_at.get_or_insert_with(Instant::now);
            w.answer = Some(own);
            w.again = false;
            let Some(round) = rounds.get(&w.round) else { return };
            (w.verdict(&round.barriers), first)
        };
        if first && verdict != Verdict::Vouched {
            self.wait_for_vouches(id);
        }
        self.act(id, verdict);
    }

    /// Sends the turn's probe round to every peer, one message, then begins the gateway's
    /// own queries to named for the reads its cache missed, each answered in a task of its
    /// own: named works on them while the probe travels.
    pub fn send_probes(self: &Arc<Self>, out: &mut VouchTurn) {
        if let Some(round) = out.round.take() {
            if self.fault != Fault::Silent {
                self.out.broadcast(ReadWire::Probe { round }.encode());
            }
        }
        out.reads = 0;
        for OwnFetch { id, tcp, message, fill, at } in out.own.drain(..) {
            let begun = (!tcp).then(|| self.named.start_udp(&message));
            let service = self.clone();
            tokio::spawn(async move {
                let own = crate::read::vouched_answer(&service.named, &service.cache, fill, &message, tcp, begun, &service.metrics).await;
                service.own_answer(id, own.map(|answer| (answer, at)));
            });
        }
    }

    /// A message from peer `from` on the reads channel (the mesh proved the sender). Called
    /// in the mesh's reader task: it never waits.
    pub fn handle(self: &Arc<Self>, from: u16, frame: &[u8]) {
        match decode_read_wire(frame) {
            Ok(ReadWire::Probe { round }) => self.answer_probe(from, round),
            Ok(ReadWire::Barrier { round, barrier }) => self.count_barrier(from, round, barrier),
            Err(why) => self.metrics.inc_dropped(why),
        }
    }

    fn lock_table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_deadlines(&self) -> std::sync::MutexGuard<'_, BinaryHeap<Reverse<(Instant, u64)>>> {
        self.deadlines.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_clock(&self) -> std::sync::MutexGuard<'_, VouchClock> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_late(&self) -> std::sync::MutexGuard<'_, LateReads> {
        self.late.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a read whose own answer comes in now waits for its peers.
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

    /// The read's own answer is in: it falls back unless decided within the timeout.
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

    /// Orders the reads whose peers did not answer in time.
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

    /// A read's peers did not answer in time: it is ordered after all, and kept for the
    /// barriers that may still come (they teach the clock, see `late`).
    fn time_out(&self, id: u64) {
        let (w, barriers) = {
            let mut table = self.lock_table();
            let Some(round) = table.reads.get(&id).map(|w| w.round) else { return };
            let barriers = table.rounds.get(&round).map(|r| r.barriers.clone());
            (table.remove(id), barriers)
        };
        let Some(w) = w else { return };
        if let (Some(own_at), Some((_, at)), Some(barriers), false) = (w.own_at, &w.answer, barriers, w.again) {
            let cap = Duration::from_micros(self.lock_clock().cap_us);
            let mut late = self.lock_late();
            late.rounds.entry(w.round).or_insert_with(|| (barriers, Vec::new())).1.push(LateRead { id, barrier: w.barrier, at: *at, own_at });
            late.order.push_back((own_at, w.round, id));
            late.prune(Instant::now().checked_sub(cap).unwrap_or(own_at));
        }
        self.order(w.request);
    }

    /// Acts on a read's verdict: answers it (whoever removes it from the table acts, once),
    /// or takes its own answer again once executed far enough (once per read).
    fn act(self: &Arc<Self>, id: u64, verdict: Verdict) {
        match verdict {
            Verdict::Pending => {}
            Verdict::Vouched => {
                let Some(w) = self.lock_table().remove(id) else { return };
                self.answer(w);
            }
            Verdict::Behind(position) => {
                let again = {
                    let mut table = self.lock_table();
                    let Some(w) = table.reads.get_mut(&id) else { return };
                    if w.again {
                        return;
                    }
                    w.again = true;
                    crate::read_cache::key(&w.request.bytes, w.request.tcp).map(|key| (key, w.request.bytes.clone(), w.request.tcp))
                };
                let Some((key, message, tcp)) = again else { return self.fall_back(id) };
                // Never longer than the cap: the read's deadline orders it by then anyway.
                let wait = Duration::from_micros(self.lock_clock().cap_us);
                self.metrics.inc_vouched_read("taken_again");
                let service = self.clone();
                tokio::spawn(async move { service.answer_at(id, position, key, message, tcp, wait).await });
            }
        }
    }

    fn answer(&self, w: Waiting) {
        let Some((answer, _)) = w.answer else { return };
        // Only vouched reads teach the timeout (the module doc says why).
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

    /// A barrier for a round whose reads timed out: one it now decides as vouched, within the
    /// cap, teaches the clock the wait it took (a liar's barrier can decide that only where it
    /// could have decided an in-time one, and never past the cap).
    fn count_late_barrier(&self, from: u16, round: u64, barrier: u64) {
        let now = Instant::now();
        let mut waits = Vec::new();
        {
            let mut late = self.lock_late();
            if late.rounds.is_empty() {
                return;
            }
            let Some((barriers, reads)) = late.rounds.get_mut(&round) else { return };
            if !barriers.reply(from, barrier) {
                return;
            }
            reads.retain(|r| match verdict(barriers, r.barrier, Some(r.at)) {
                Verdict::Pending => true,
                Verdict::Vouched => {
                    waits.push(now.saturating_duration_since(r.own_at));
                    false
                }
                Verdict::Behind(_) => false,
            });
            if reads.is_empty() {
                late.rounds.remove(&round);
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
        let Some(w) = self.lock_table().remove(id) else { return };
        self.order(w.request);
    }

    /// Hands a read that fell back to the gateway's loop, which orders it.
    fn order(&self, request: ClientRequest) {
        self.metrics.inc_vouched_read("fell_back");
        if self.fallback.try_send(request).is_err() {
            self.metrics.inc_dropped("vouched_fallback_full");
        }
    }

    /// Peer `from`'s barrier for round `round`: the reads of the round it decides are acted on.
    fn count_barrier(self: &Arc<Self>, from: u16, round: u64, barrier: u64) {
        let mut decided = Vec::new();
        {
            let mut table = self.lock_table();
            let Table { reads, rounds } = &mut *table;
            if let Some(r) = rounds.get_mut(&round) {
                if r.barriers.reply(from, barrier) {
                    for id in &r.reads {
                        let Some(w) = reads.get(id) else { continue };
                        match w.verdict(&r.barriers) {
                            Verdict::Pending => {}
                            Verdict::Behind(_) if w.again => {}
                            v => decided.push((*id, v)),
                        }
                    }
                }
            }
        }
        self.count_late_barrier(from, round, barrier);
        for (id, verdict) in decided {
            self.act(id, verdict);
        }
    }

    /// A peer's probe: answered at once with this replica's barrier as it arrived.
    fn answer_probe(&self, from: u16, round: u64) {
        if self.fault == Fault::Silent {
            return;
        }
        // Taken as the probe arrives: at or past every write acknowledged before its reads began.
        let barrier = self.fault.barrier(round, *self.barrier.borrow());
        self.metrics.inc_vouches_sent(1);
        self.out.send(from, ReadWire::Barrier { round, barrier }.encode());
    }
}

/// The gateway's vouch timeout: [`MARGIN`] times the [`PERCENTILE`]th percentile of the
/// waits (own answer in, to the read decided) of its recently vouched reads, within
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

/// Where this process numbers its probe rounds from: anywhere. A peer's barrier can reach a
/// gateway that restarted since it was asked (the peer's queue outlives the connection); an
/// old round's barrier, taken before the new round's reads began, must not count for them.
fn first_round() -> u64 {
    let mut seed = [0u8; 8];
    if getrandom::fill(&mut seed).is_ok() {
        return u64::from_be_bytes(seed);
    }
    // No OS randomness: the clock, in nanoseconds, is past any round the last process reached.
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vouch::WRONG_BARRIER_AHEAD;
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

    /// The round of the next probe broadcast.
    async fn next_probe(out: &mut mpsc::UnboundedReceiver<Sent>) -> u64 {
        probe_round(next_sent(out).await)
    }

    fn probe_round(sent: Sent) -> u64 {
        match sent {
            Sent::All(m) => match decode_read_wire(&m) {
                Ok(ReadWire::Probe { round }) => round,
                other => panic!("expected a probe, got {other:?}"),
            },
            other => panic!("expected a broadcast, got {other:?}"),
        }
    }

    /// Peer `peer` says its barrier for `round` was `barrier`.
    fn barrier(h: &Harness, peer: u16, round: u64, barrier: u64) {
        h.service.handle(peer, &ReadWire::Barrier { round, barrier }.encode());
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

    async fn received(c: &UdpSocket) -> Vec<u8> {
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(2), c.recv(&mut buf)).await.expect("answered").unwrap();
        buf[..n].to_vec()
    }

    /// Two peers' barriers no further than the gateway's answer answer the read; peers ahead
    /// of it make the gateway take its answer again once it has executed that far, or order
    /// the read when it never does; silence orders it after the timeout.
    #[tokio::test]
    async fn gateway_answers_when_vouched_and_orders_otherwise() {
        let mut h = harness(fake_named().await, 0, 0, 200, Fault::None).await;
        let (c, reply) = client().await;
        take(&h, ClientRequest { bytes: query(1), tcp: false, reply: reply.clone() });
        let round = next_probe(&mut h.out).await;
        barrier(&h, 1, round, 0);
        barrier(&h, 1, round, 0);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(outcome(&h.service.metrics, "vouched"), 0, "one peer twice is not two");
        barrier(&h, 2, round, 0);
        // The client got the gateway's own answer, its own id.
        assert_eq!(received(&c).await, answer(1));
        assert_eq!(outcome(&h.service.metrics, "vouched"), 1);
        assert!(h.fallback.try_recv().is_err());

        // Two peers ahead (a write at 3 committed): answered once the gateway executed it.
        take(&h, ClientRequest { bytes: query(2), tcp: false, reply: reply.clone() });
        let round = next_probe(&mut h.out).await;
        barrier(&h, 1, round, 3);
        barrier(&h, 3, round, 3);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(outcome(&h.service.metrics, "vouched"), 1, "not answered from before the write");
        assert_eq!(outcome(&h.service.metrics, "taken_again"), 1);
        h.executed.send_replace(3);
        assert_eq!(received(&c).await, answer(2));
        assert_eq!(outcome(&h.service.metrics, "vouched"), 2);

        // Ahead, and never executed: ordered.
        take(&h, ClientRequest { bytes: query(4), tcp: false, reply: reply.clone() });
        let round = next_probe(&mut h.out).await;
        barrier(&h, 1, round, 9);
        barrier(&h, 2, round, 9);
        let ordered = tokio::time::timeout(Duration::from_secs(2), h.fallback.recv()).await.expect("fell back").unwrap();
        assert_eq!(ordered.bytes, query(4));
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 1);

        // Nobody answers: ordered after the timeout.
        take(&h, ClientRequest { bytes: query(5), tcp: true, reply });
        let ordered = tokio::time::timeout(Duration::from_secs(2), h.fallback.recv()).await.expect("fell back").unwrap();
        assert!(ordered.tcp && ordered.bytes == query(5));
    }

    /// A barrier made up far ahead holds a read only until the last peer answered: the two
    /// smallest decide. One made up far behind changes nothing.
    #[tokio::test]
    async fn a_made_up_barrier_counts_only_among_the_2t_smallest() {
        let mut h = harness(fake_named().await, 4, 4, 2_000, Fault::None).await;
        let (c, reply) = client().await;
        take(&h, ClientRequest { bytes: query(1), tcp: false, reply: reply.clone() });
        let round = next_probe(&mut h.out).await;
        barrier(&h, 3, round, u64::MAX);
        barrier(&h, 1, round, 4);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(outcome(&h.service.metrics, "vouched"), 0);
        barrier(&h, 2, round, 4);
        assert_eq!(received(&c).await, answer(1));
        // Behind: a peer says 0 while the other says 6 (a write the gateway has not executed).
        take(&h, ClientRequest { bytes: query(2), tcp: false, reply });
        let round = next_probe(&mut h.out).await;
        barrier(&h, 3, round, 0);
        barrier(&h, 2, round, 6);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(outcome(&h.service.metrics, "vouched"), 1, "the lie does not lower what the honest peer requires");
        h.executed.send_replace(6);
        assert_eq!(received(&c).await, answer(2));
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 0);
    }

    /// With its barrier executed, the gateway's own answer comes from the read cache: named
    /// (silent here) is never needed, and two peers' barriers answer the client.
    #[tokio::test]
    async fn gateway_answers_from_the_cache_without_named() {
        let (named, _keep) = silent_named().await;
        let mut h = harness(named, 3, 3, 2_000, Fault::None).await;
        fill(&h.cache, &query(9));
        let (c, reply) = client().await;
        take(&h, ClientRequest { bytes: query(5), tcp: false, reply });
        let round = next_probe(&mut h.out).await;
        barrier(&h, 2, round, 3);
        barrier(&h, 3, round, 2);
        assert_eq!(received(&c).await, answer(5), "the cached answer with the client's id");
        // Not a plain query (an update), or a voting client's read: handed back to be ordered.
        let mut update = query(5);
        update[2] |= 5 << 3;
        let (_, reply) = client().await;
        assert!(h.service.take(ClientRequest { bytes: update, tcp: false, reply }, &mut VouchTurn::default()).is_err());
    }

    /// A gateway whose executor is behind its barrier answers once it caught up.
    #[tokio::test]
    async fn gateway_answers_once_its_barrier_is_executed() {
        let mut h = harness(fake_named().await, 5, 4, 2_000, Fault::None).await;
        let (c, reply) = client().await;
        take(&h, ClientRequest { bytes: query(3), tcp: false, reply });
        let round = next_probe(&mut h.out).await;
        barrier(&h, 1, round, 5);
        barrier(&h, 2, round, 5);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(outcome(&h.service.metrics, "vouched"), 0);
        h.executed.send_replace(5);
        assert_eq!(received(&c).await, answer(3));
    }

    /// A peer answers a probe within the call, with its barrier as the probe arrived, whatever
    /// its executor has reached; malformed messages are counted and dropped.
    #[tokio::test]
    async fn peers_answer_probes_with_their_barrier_at_once() {
        let mut h = harness(fake_named().await, 7, 2, 200, Fault::None).await;
        h.service.handle(2, &ReadWire::Probe { round: 10 }.encode());
        let Ok(Sent::To(2, m)) = h.out.try_recv() else { panic!("answered within the call") };
        assert_eq!(decode_read_wire(&m), Ok(ReadWire::Barrier { round: 10, barrier: 7 }));
        h.service.handle(1, &[7, 7, 7]);
        h.service.handle(1, &[]);
        assert!(h.out.try_recv().is_err());
        assert!(h.service.metrics.render().contains("read_message_tag"));
        // A barrier for a round this gateway never sent counts nothing.
        barrier(&h, 1, 12345, 7);
        assert!(h.out.try_recv().is_err() && h.fallback.try_recv().is_err());
        // Another process (a restarted gateway) numbers its rounds elsewhere.
        let other = harness(fake_named().await, 7, 2, 200, Fault::None).await;
        let first = |h: &Harness| h.service.next_round.load(Ordering::Relaxed);
        assert_ne!(first(&h), first(&other));
    }

    /// With the barrier executed, named is asked for the gateway's own copy of a cache miss in
    /// the call that sends its probe (after it). The test's runtime has one thread, so no task
    /// runs before the test awaits: named has the query before any task could have sent it.
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
        // The first query finds no pooled socket: a task opens one (and then keeps it).
        let (c, reply) = client().await;
        take(&h, ClientRequest { bytes: query(1), tcp: false, reply: reply.clone() });
        let round = next_probe(&mut h.out).await;
        let other = named.try_clone().unwrap();
        let first = tokio::task::spawn_blocking(move || answer_one(&other)).await.unwrap();
        barrier(&h, 1, round, 2);
        barrier(&h, 3, round, 2);
        assert_eq!(received(&c).await, first);
        // Another question: the probe is out, and named has the query, when send_probes returns.
        let third = {
            let name = hickory_proto::rr::Name::from_ascii("third.example.test.").unwrap();
            named_glue::forward::build_query(9, &name, hickory_proto::rr::RecordType::A).unwrap()
        };
        let mut out = VouchTurn::default();
        h.service.take(ClientRequest { bytes: third.clone(), tcp: false, reply }, &mut out).unwrap();
        h.service.send_probes(&mut out);
        let round = probe_round(h.out.try_recv().expect("the probe went out first"));
        let answered = answer_one(&named);
        assert_eq!((&answered[..2], &answered[3..]), (&third[..2], &third[3..]), "the client's question");
        barrier(&h, 1, round, 2);
        barrier(&h, 3, round, 1);
        assert_eq!(received(&c).await, answered);
    }

    /// The reads a listener takes in one turn share one probe round, one message to the
    /// peers; each peer's single answer decides all of them.
    #[tokio::test]
    async fn one_round_per_turn() {
        let mut h = harness(fake_named().await, 1, 1, 2_000, Fault::None).await;
        fill(&h.cache, &query(1));
        let (c, reply) = client().await;
        let mut out = VouchTurn::default();
        for id in 1..=3 {
            h.service.take(ClientRequest { bytes: query(id), tcp: false, reply: reply.clone() }, &mut out).unwrap();
        }
        h.service.send_probes(&mut out);
        let round = next_probe(&mut h.out).await;
        assert!(h.out.try_recv().is_err(), "one probe for three reads");
        barrier(&h, 1, round, 1);
        barrier(&h, 2, round, 1);
        let mut got: Vec<Vec<u8>> = Vec::new();
        for _ in 1..=3 {
            got.push(received(&c).await);
        }
        got.sort();
        assert_eq!(got, (1..=3).map(answer).collect::<Vec<_>>());
        assert_eq!(outcome(&h.service.metrics, "vouched"), 3);
        let table = h.service.lock_table();
        assert!(table.rounds.is_empty() && table.reads.is_empty(), "nothing left behind");
    }

    /// The wrong-vouches fault answers with a barrier far ahead of its own or with 0; the
    /// silent one sends nothing.
    #[tokio::test]
    async fn faults_spoil_or_withhold_barriers() {
        let mut h = harness(fake_named().await, 3, 3, 200, Fault::WrongVouches).await;
        for (round, lie) in [(30, 3 + WRONG_BARRIER_AHEAD), (31, 0)] {
            h.service.handle(3, &ReadWire::Probe { round }.encode());
            let Ok(Sent::To(3, m)) = h.out.try_recv() else { panic!("answered") };
            assert_eq!(decode_read_wire(&m), Ok(ReadWire::Barrier { round, barrier: lie }));
        }
        let mut h = harness(fake_named().await, 0, 0, 200, Fault::Silent).await;
        h.service.handle(3, &ReadWire::Probe { round: 30 }.encode());
        let (_, reply) = client().await;
        take(&h, ClientRequest { bytes: query(4), tcp: false, reply });
        assert!(h.out.try_recv().is_err(), "a silent replica sends no barrier and no probe");
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

    /// A gateway (n = 4, t = 1) whose own answers come from its cache at once, on a paused
    /// clock: each read's own answer is in when `take` returns, and the test chooses when each
    /// barrier arrives.
    async fn learning_gateway() -> (Harness, UdpSocket, crate::reply::ReplyTo, tokio::sync::mpsc::Receiver<crate::reply::Outgoing>) {
        let (named, keep) = silent_named().await;
        let h = harness_within(named, 0, 0, 5, 50, Fault::None).await;
        fill(&h.cache, &query(9));
        let (reply, answers) = crate::reply::ReplyTo::internal();
        (h, keep, reply, answers)
    }

    /// The gateway takes read `dns_id` (a cache hit) in a round of its own; the round.
    fn read(h: &mut Harness, reply: &crate::reply::ReplyTo, dns_id: u16) -> u64 {
        take(h, ClientRequest { bytes: query(dns_id), tcp: false, reply: reply.clone() });
        probe_round(h.out.try_recv().expect("the probe is sent within the call"))
    }

    /// A barrier that lets the reads of `learning_gateway` pass, and one that does not.
    const NOW: u64 = 0;
    const AHEAD: u64 = 7;

    fn gauge(m: &Metrics) -> String {
        m.render().lines().find(|l| l.starts_with("sdns_vouch_timeout_seconds{")).expect("the gauge").to_owned()
    }

    /// Through the service: peers that answer just within the timeout raise it to the cap,
    /// never past it, and the gauge shows it; quick answers bring it back to the floor.
    #[tokio::test(start_paused = true)]
    async fn slow_vouches_raise_the_timeout_to_the_cap_and_quick_ones_lower_it() {
        let (mut h, _named, reply, _answers) = learning_gateway().await;
        assert_eq!(gauge(&h.service.metrics), "sdns_vouch_timeout_seconds{replica=\"0\"} 0.005");
        let mut reads = 0u64;
        while h.service.timeout() < ms(50) {
            let wait = h.service.timeout() * 9 / 10;
            let round = read(&mut h, &reply, 5);
            tokio::time::advance(wait).await;
            barrier(&h, 1, round, NOW);
            barrier(&h, 2, round, NOW);
            reads += 1;
            assert!(h.service.timeout() <= ms(50));
            assert!(reads < 10 * WINDOW as u64, "stuck at {:?}", h.service.timeout());
        }
        assert_eq!(outcome(&h.service.metrics, "vouched"), reads);
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 0);
        assert_eq!(gauge(&h.service.metrics), "sdns_vouch_timeout_seconds{replica=\"0\"} 0.05");
        while h.service.timeout() > ms(5) {
            let round = read(&mut h, &reply, 5);
            tokio::time::advance(Duration::from_micros(200)).await;
            barrier(&h, 3, round, NOW);
            barrier(&h, 2, round, NOW);
            reads += 1;
            assert!(reads < 40 * WINDOW as u64, "stuck at {:?}", h.service.timeout());
        }
        assert_eq!(gauge(&h.service.metrics), "sdns_vouch_timeout_seconds{replica=\"0\"} 0.005");
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 0);
    }

    /// Reads that fall back teach nothing unless their round's barriers still let them pass:
    /// not those that time out with too few, not those whose answer proved behind.
    #[tokio::test(start_paused = true)]
    async fn reads_that_fall_back_do_not_move_the_timeout() {
        let (mut h, _named, reply, _answers) = learning_gateway().await;
        // Raised first, so that it could move either way.
        for _ in 0..WINDOW {
            let round = read(&mut h, &reply, 5);
            tokio::time::advance(Duration::from_micros(4_500)).await;
            barrier(&h, 1, round, NOW);
            barrier(&h, 3, round, NOW);
        }
        assert_eq!(h.service.timeout(), ms(18));
        // Timed out: one barrier only, the second after the read was ordered and ahead.
        for _ in 0..20 {
            let round = read(&mut h, &reply, 5);
            barrier(&h, 1, round, NOW);
            assert_eq!(h.fallback.recv().await.unwrap().bytes, query(5));
            barrier(&h, 2, round, AHEAD);
        }
        // Behind, never caught up: two peers ahead, then, after the read was ordered, the third
        // at the gateway's position (a read whose answer proved behind is not kept to teach,
        // though the 2t smallest would now let its first answer pass). Few enough
        // that the window's period (1 s) is not over: that alone would lower the timeout.
        for _ in 0..20 {
            let round = read(&mut h, &reply, 5);
            barrier(&h, 1, round, AHEAD);
            barrier(&h, 2, round, AHEAD);
            assert_eq!(h.fallback.recv().await.unwrap().bytes, query(5));
            barrier(&h, 3, round, NOW);
        }
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 40);
        assert_eq!(outcome(&h.service.metrics, "vouched"), WINDOW as u64);
        assert_eq!(h.service.timeout(), ms(18));
    }

    /// Every peer answers later than the floor: the first reads time out, and their rounds'
    /// barriers, coming late, raise the timeout above the waits, after which reads are vouched.
    #[tokio::test(start_paused = true)]
    async fn vouches_that_always_come_late_raise_the_timeout_from_the_floor() {
        let (mut h, _named, reply, _answers) = learning_gateway().await;
        assert_eq!(h.service.timeout(), ms(5));
        let mut timed_out = 0u64;
        while h.service.timeout() < ms(8) {
            let round = read(&mut h, &reply, 5);
            assert_eq!(h.fallback.recv().await.unwrap().bytes, query(5), "timed out at the floor");
            timed_out += 1;
            tokio::time::advance(ms(3)).await;
            barrier(&h, 1, round, NOW);
            barrier(&h, 2, round, NOW);
            assert!(timed_out <= WINDOW as u64, "the late barriers taught nothing: {:?}", h.service.timeout());
        }
        // 8 ms waits: 4 x 8 = 32 ms.
        assert_eq!(h.service.timeout(), ms(32));
        let round = read(&mut h, &reply, 5);
        tokio::time::advance(ms(8)).await;
        barrier(&h, 1, round, NOW);
        barrier(&h, 2, round, NOW);
        assert_eq!(outcome(&h.service.metrics, "vouched"), 1);
        assert_eq!(outcome(&h.service.metrics, "fell_back"), timed_out);
        // Late beyond the cap: nothing learnt from those.
        let round = read(&mut h, &reply, 5);
        assert_eq!(h.fallback.recv().await.unwrap().bytes, query(5));
        tokio::time::advance(ms(60)).await;
        barrier(&h, 1, round, NOW);
        barrier(&h, 2, round, NOW);
        assert_eq!(h.service.timeout(), ms(32));
        assert!(h.service.lock_late().rounds.is_empty(), "the late reads are forgotten");
    }

    /// Peer 3 is Byzantine. While the honest peers agree, its barrier never decides a read:
    /// late or never, far ahead or not, the timeout follows the honest peers' waits. Where it
    /// does decide (an honest peer is ahead of the gateway's answer, e.g. racing a write, and
    /// the gateway does not catch up) and it answers as late as it can, every time, the
    /// timeout reaches the cap and stays there.
    #[tokio::test(start_paused = true)]
    async fn a_silent_or_lying_peer_cannot_raise_the_timeout_past_the_cap() {
        let (mut h, _named, reply, _answers) = learning_gateway().await;
        for i in 0..(3 * WINDOW) {
            let round = read(&mut h, &reply, 5);
            let deadline = h.service.timeout();
            match i % 3 {
                // Far ahead at once.
                0 => barrier(&h, 3, round, u64::MAX),
                // Withheld (silent).
                1 => {}
                // Right, but as late as it can: it comes after the honest ones.
                _ => {}
            }
            tokio::time::advance(ms(1)).await;
            barrier(&h, 1, round, NOW);
            barrier(&h, 2, round, NOW);
            if i % 3 == 2 {
                tokio::time::advance(deadline - ms(2)).await;
                barrier(&h, 3, round, NOW);
            }
        }
        assert_eq!(outcome(&h.service.metrics, "vouched"), 3 * WINDOW as u64);
        assert_eq!(h.service.timeout(), ms(5), "4 x the honest peers' 1 ms is below the floor");
        // Its barrier decides: honest peer 2 is ahead.
        for _ in 0..(4 * WINDOW) {
            let round = read(&mut h, &reply, 5);
            let deadline = h.service.timeout();
            barrier(&h, 1, round, NOW);
            barrier(&h, 2, round, AHEAD);
            tokio::time::advance(deadline - Duration::from_micros(1)).await;
            barrier(&h, 3, round, NOW);
            assert!(h.service.timeout() <= ms(50));
        }
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 0);
        assert_eq!(h.service.timeout(), ms(50), "at the cap, not past it");
        // Silent now, where it decided: those reads fall back after at most the cap.
        let start = Instant::now();
        let round = read(&mut h, &reply, 5);
        barrier(&h, 1, round, NOW);
        barrier(&h, 2, round, AHEAD);
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
