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
//!   (`mesh::CHANNEL_READS`, messages in `exec::vouch`): the UDP listener sends one probe for
//!   all the datagrams it took in one turn. A probe carries the round's number only.
//! - A peer answers at once, in the mesh's reader task, with its *read barrier* as the probe
//!   arrived: the highest seq its ordering core has sent a commit for, or delivered. It looks at
//!   nothing else: no cache, no named, no wait for its executor.
//! - The gateway takes its own barrier as the read arrives, and its own answer (read cache,
//!   else named) once it has executed that far, noting the executed position the answer
//!   reflects. With 2t peers' barriers in, the read needs an answer reflecting the largest of
//!   its own barrier and those 2t peers' smallest ([`exec::vouch::Barriers::required`]). An
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
//! The vouch timeout ([`exec::vouch_core::VouchClock`]) follows the load: a read ordered after all costs an
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
//! Shape: every decision above is `exec::vouch_core::VouchCore`'s (no IO, time as an
//! argument); this module is its driver. The core sits behind one lock that the listeners and
//! the mesh's reader tasks take for the length of a call (never across a wait), so that no read
//! or barrier waits for another task to wake up, and one task sleeps until the core's next
//! deadline. What the core decides (probes, client answers, answers to take again, reads to
//! order, the timeout's gauge) is done after the lock is released.
//!
//! Nothing here makes the executor wait: the gateway waits for the executed position on a watch
//! channel and answers from the read cache or named, as local reads do. What a peer can make
//! this replica hold: nothing as a peer (a probe is answered within the call), and as a gateway
//! one entry per peer per open round, within [`exec::vouch_core::MAX_WAITING`] reads.

use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use exec::classify::Kind;
use named_glue::forward::Forwarder;
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use crate::ops::metrics::Metrics;
use crate::reads::read::{Fill, Keyed, ReadCache};
use crate::reads::route::ClientRequest;
pub use exec::vouch::Fault;
use exec::vouch::{decode_read_wire, ReadWire};
use exec::vouch_core::{answer_probe, micros, Action, Settings, Turn, VouchCore};

/// The longest a gateway waits for its own executor to reach a read's barrier before ordering
/// the read instead.
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
    named: Forwarder,
    cache: Arc<ReadCache>,
    metrics: Arc<Metrics>,
    /// The ordering core's read barrier, published by its driver.
    barrier: watch::Receiver<u64>,
    /// The executor's executed position.
    executed: watch::Receiver<u64>,
    out: Arc<dyn ReadsOutbound>,
    fault: Fault,
    /// Reads to order after all (the gateway's loop orders them).
    fallback: mpsc::Sender<ClientRequest>,
    /// The decisions, held for the length of one call (see the module doc).
    core: Mutex<Locked>,
    /// Wakes the timer task for a deadline earlier than the one it sleeps until.
    deadline_added: Notify,
    /// Time zero of the core's clock.
    origin: Instant,
}

struct Locked {
    core: VouchCore<ClientRequest>,
    /// The deadline the timer task sleeps until, if any.
    armed: Option<u64>,
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
    turn: Turn,
    own: Vec<OwnFetch>,
}

impl VouchTurn {
    /// Nothing gathered (or all of it sent).
    pub fn is_empty(&self) -> bool {
        self.turn.is_empty() && self.own.is_empty()
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
    pub fn start(
        n: u16,
        t: u16,
        named: Forwarder,
        cache: Arc<ReadCache>,
        metrics: Arc<Metrics>,
        timeout: RangeInclusive<Duration>,
        wiring: Wiring,
    ) -> (Arc<VouchedReads>, impl std::future::Future<Output = ()> + Send + 'static) {
        // The core orders a read whose own answer never came once the driver's every wait for
        // it is over (the executor's, then named's): the backstop never cuts one short.
        let named_wait = (named.udp_timeout * named.udp_attempts.max(1)).max(3 * named.tcp_timeout);
        let own_wait = OWN_WAIT + named_wait + Duration::from_secs(1);
        let settings = Settings { n, t, floor: *timeout.start(), cap: *timeout.end(), own_wait, fault: wiring.fault, first_round: first_round() };
        let core = VouchCore::new(settings, 0);
        metrics.set_vouch_timeout(core.timeout());
        let service = Arc::new(VouchedReads {
            named,
            cache,
            metrics,
            barrier: wiring.barrier,
            executed: wiring.executed,
            out: wiring.out,
            fault: wiring.fault,
            fallback: wiring.fallback,
            core: Mutex::new(Locked { core, armed: None }),
            deadline_added: Notify::new(),
            origin: Instant::now(),
        });
        let task = service.clone().expire();
        (service, task)
    }

    /// Takes a client's read onto the vouched path: one the read router
    /// (`crate::reads::route`) sent here, a plain query (what the read cache could key, `key`;
    /// never an update, a transfer, a signed request) that is not a voting client's. It joins
    /// the turn's probe round, which the caller sends with [`Self::send_probes`] (at once, or
    /// after the other reads it has at hand); its own answer is taken at once when the barrier
    /// is executed and the cache has it, and when the cache misses, its query to named is
    /// begun as soon as the probe is out. Hands the request back, to be ordered, when too many
    /// reads wait already.
    pub fn take(self: &Arc<Self>, request: ClientRequest, key: Vec<u8>, out: &mut VouchTurn) -> Result<(), ClientRequest> {
        if out.turn.is_full() {
            self.send_probes(out);
        }
        // Read after the read arrived: at or past every write acknowledged before it.
        let barrier = *self.barrier.borrow();
        let executed = *self.executed.borrow();
        // A keyed request is a whole DNS message; the check keeps a wrong caller from a panic.
        if request.bytes.len() < 2 {
            return Err(request);
        }
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
        // What named is asked when the own answer is not in the cache.
        let message = if later.is_some() { request.bytes.clone() } else { Vec::new() };
        let (id, actions) = match self.with_core(|core, now| core.take(&mut out.turn, now, request, barrier, own)) {
            Ok(taken) => taken,
            Err(request) => {
                self.metrics.inc_dropped("vouched_reads_full");
                return Err(request);
            }
        };
        self.perform(actions);
        match later {
            None => {}
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
            return self.own_answer(id, None);
        }
        let at = *executed.borrow();
        let own = match self.cache.lookup_keyed(&key, [message[0], message[1]]) {
            Keyed::Hit(answer) => {
                self.metrics.inc_read_cache(true);
                Some(answer)
            }
            Keyed::Miss(fill) => crate::reads::read::forward_answer(&self.named, &self.cache, fill, &message, tcp, &self.metrics).await,
        };
        self.own_answer(id, own.map(|answer| (answer, at)));
    }

    /// The gateway's own answer to read `id` is in, reflecting the executed position it
    /// carries (`None`: named stayed silent, or the read failed: the ordered path decides).
    fn own_answer(self: &Arc<Self>, id: u64, own: Option<(Vec<u8>, u64)>) {
        let actions = self.with_core(|core, now| core.own_answer(now, id, own));
        self.perform(actions);
    }

    /// Sends the turn's probe round to every peer, one message, then begins the gateway's
    /// own queries to named for the reads its cache missed, each answered in a task of its
    /// own: named works on them while the probe travels.
    pub fn send_probes(self: &Arc<Self>, out: &mut VouchTurn) {
        if !out.turn.is_empty() {
            let probe = self.with_core(|core, _| core.end_turn(&mut out.turn));
            self.perform(probe.into_iter().collect());
        }
        for OwnFetch { id, tcp, message, fill, at } in out.own.drain(..) {
            let begun = (!tcp).then(|| self.named.start_udp(&message));
            let service = self.clone();
            tokio::spawn(async move {
                let own = crate::reads::read::vouched_answer(&service.named, &service.cache, fill, &message, tcp, begun, &service.metrics).await;
                service.own_answer(id, own.map(|answer| (answer, at)));
            });
        }
    }

    /// A message from peer `from` on the reads channel (the mesh proved the sender). Called
    /// in the mesh's reader task: it never waits.
    pub fn handle(self: &Arc<Self>, from: u16, frame: &[u8]) {
        match decode_read_wire(frame) {
            Ok(ReadWire::Probe { round }) => {
                // Taken as the probe arrives: at or past every write acknowledged before its
                // reads began.
                let Some(answer) = answer_probe(self.fault, round, *self.barrier.borrow()) else { return };
                self.metrics.inc_vouches_sent(1);
                self.out.send(from, answer.encode());
            }
            Ok(ReadWire::Barrier { round, barrier }) => {
                let actions = self.with_core(|core, now| core.barrier(now, from, round, barrier));
                self.perform(actions);
            }
            Err(why) => self.metrics.inc_dropped(why),
        }
    }

    /// How long a read whose own answer comes in now waits for its peers.
    pub fn timeout(&self) -> Duration {
        self.with_core(|core, _| core.timeout())
    }

    /// Calls the core with the time now, and wakes the timer task when the call queued a
    /// deadline earlier than the one it sleeps until.
    fn with_core<T>(&self, call: impl FnOnce(&mut VouchCore<ClientRequest>, u64) -> T) -> T {
        let mut locked = self.core.lock().unwrap_or_else(|e| e.into_inner());
        // Read under the lock, so that the core sees time only move forward.
        let now = micros(self.origin.elapsed());
        let result = call(&mut locked.core, now);
        let next = locked.core.poll_timeout();
        if next.is_some_and(|at| locked.armed.is_none_or(|armed| at < armed)) {
            locked.armed = next;
            drop(locked);
            self.deadline_added.notify_one();
        }
        result
    }

    /// Does what the core decided (never under its lock).
    fn perform(self: &Arc<Self>, actions: Vec<Action<ClientRequest>>) {
        for action in actions {
            match action {
                Action::Probe { round } => self.out.broadcast(ReadWire::Probe { round }.encode()),
                Action::Answer { request, answer } => {
                    self.metrics.inc_vouched_read("vouched");
                    self.metrics.inc_request(Kind::Read);
                    crate::reads::read::deliver(&request.reply, answer, &self.metrics);
                }
                Action::Order { request } => self.order(request),
                Action::Fetch { id, position, wait } => self.take_again(id, position, wait),
                Action::Timeout(timeout) => self.metrics.set_vouch_timeout(timeout),
            }
        }
    }

    /// Takes read `id`'s own answer again once executed up to `position`.
    fn take_again(self: &Arc<Self>, id: u64, position: u64, wait: Duration) {
        let Some((message, tcp)) = self.with_core(|core, _| core.request(id).map(|r| (r.bytes.clone(), r.tcp))) else { return };
        let Some(key) = crate::reads::read_cache::key(&message, tcp) else { return self.own_answer(id, None) };
        self.metrics.inc_vouched_read("taken_again");
        let service = self.clone();
        tokio::spawn(async move { service.answer_at(id, position, key, message, tcp, wait).await });
    }

    /// Orders the reads whose deadline passed: sleeps until the core's next one.
    async fn expire(self: Arc<Self>) {
        loop {
            let next = {
                let mut locked = self.core.lock().unwrap_or_else(|e| e.into_inner());
                locked.armed = locked.core.poll_timeout();
                locked.armed
            };
            let Some(at) = next else {
                self.deadline_added.notified().await;
                continue;
            };
            tokio::select! {
                () = tokio::time::sleep_until(self.origin + Duration::from_micros(at)) => {}
                // A deadline earlier than `at` was queued (the timeout shrank).
                () = self.deadline_added.notified() => continue,
            }
            let actions = self.with_core(|core, now| core.handle_timeout(now));
            self.perform(actions);
        }
    }

    /// Hands a read that fell back to the gateway's loop, which orders it.
    fn order(&self, request: ClientRequest) {
        self.metrics.inc_vouched_read("fell_back");
        if self.fallback.try_send(request).is_err() {
            self.metrics.inc_dropped("vouched_fallback_full");
        }
    }
}

/// Where this process numbers its probe rounds from: anywhere (`exec::vouch_core::Settings`
/// says why).
fn first_round() -> u64 {
    let mut seed = [0u8; 8];
    if getrandom::fill(&mut seed).is_ok() {
        return u64::from_be_bytes(seed);
    }
    // No OS randomness: the clock, in nanoseconds, is past any round the last process reached.
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec::vouch::WRONG_BARRIER_AHEAD;
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

    async fn client() -> (UdpSocket, crate::client::reply::ReplyTo) {
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let server = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        // A fresh socket's send readiness is known once the reactor has seen it.
        server.writable().await.unwrap();
        let reply = crate::client::reply::ReplyTo::Udp { socket: server, peer: client.local_addr().unwrap(), rrl: None, lie: false };
        (client, reply)
    }

    /// A plain query on its way, as the read router sends it on.
    fn read(bytes: Vec<u8>, tcp: bool, reply: crate::client::reply::ReplyTo) -> ClientRequest {
        ClientRequest { bytes, tcp, reply, lane: crate::reads::route::Lane::Ordered(Kind::Read) }
    }

    /// Takes one read onto the vouched path with the key the read router gives it.
    fn take_into(h: &Harness, request: ClientRequest, out: &mut VouchTurn) -> Result<(), ClientRequest> {
        let key = crate::reads::read_cache::key(&request.bytes, request.tcp).expect("a plain query");
        h.service.take(request, key, out)
    }

    /// Takes one read onto the vouched path and sends its probe.
    fn take(h: &Harness, request: ClientRequest) {
        let mut out = VouchTurn::default();
        take_into(h, request, &mut out).unwrap();
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
        let crate::reads::read::Lookup::Miss(Some(fill)) = cache.lookup(request, false) else { panic!("an empty cache misses") };
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
        take(&h, read(query(1), false, reply.clone()));
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
        take(&h, read(query(2), false, reply.clone()));
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
        take(&h, read(query(4), false, reply.clone()));
        let round = next_probe(&mut h.out).await;
        barrier(&h, 1, round, 9);
        barrier(&h, 2, round, 9);
        let ordered = tokio::time::timeout(Duration::from_secs(2), h.fallback.recv()).await.expect("fell back").unwrap();
        assert_eq!(ordered.bytes, query(4));
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 1);

        // Nobody answers: ordered after the timeout.
        take(&h, read(query(5), true, reply));
        let ordered = tokio::time::timeout(Duration::from_secs(2), h.fallback.recv()).await.expect("fell back").unwrap();
        assert!(ordered.tcp && ordered.bytes == query(5));
    }
    #[tokio::test]
    async fn gateway_answers_from_the_cache_without_named() {
        let (named, _keep) = silent_named().await;
        let mut h = harness(named, 3, 3, 2_000, Fault::None).await;
        fill(&h.cache, &query(9));
        let (c, reply) = client().await;
        take(&h, read(query(5), false, reply));
        let round = next_probe(&mut h.out).await;
        barrier(&h, 2, round, 3);
        barrier(&h, 3, round, 2);
        assert_eq!(received(&c).await, answer(5), "the cached answer with the client's id");
    }

    /// A gateway whose executor is behind its barrier answers once it caught up.
    #[tokio::test]
    async fn gateway_answers_once_its_barrier_is_executed() {
        let mut h = harness(fake_named().await, 5, 4, 2_000, Fault::None).await;
        let (c, reply) = client().await;
        take(&h, read(query(3), false, reply));
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
        assert_ne!(first_round(), first_round());
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
        take(&h, read(query(1), false, reply.clone()));
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
        take_into(&h, read(third.clone(), false, reply), &mut out).unwrap();
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
            take_into(&h, read(query(id), false, reply.clone()), &mut out).unwrap();
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
        assert_eq!(h.service.with_core(|core, _| core.waiting()), (0, 0), "nothing left behind");
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
        take(&h, read(query(4), false, reply));
        assert!(h.out.try_recv().is_err(), "a silent replica sends no barrier and no probe");
    }

    fn gauge(m: &Metrics) -> String {
        m.render().lines().find(|l| l.starts_with("sdns_vouch_timeout_seconds{")).expect("the gauge").to_owned()
    }

    /// The gauge shows the core's timeout from the start and follows it (the learning itself
    /// is `exec::vouch_core`'s, tested there): a window of reads vouched 4.5 ms after their
    /// own answer was in raises it to 4 x 4.5 ms, on the driver's clock (paused here).
    #[tokio::test(start_paused = true)]
    async fn the_gauge_follows_the_timeout() {
        let (named, _keep) = silent_named().await;
        let mut h = harness_within(named, 0, 0, 5, 50, Fault::None).await;
        fill(&h.cache, &query(9));
        assert_eq!(gauge(&h.service.metrics), "sdns_vouch_timeout_seconds{replica=\"0\"} 0.005");
        let (reply, _answers) = crate::client::reply::ReplyTo::internal();
        for _ in 0..exec::vouch_core::WINDOW {
            take(&h, read(query(5), false, reply.clone()));
            let round = probe_round(h.out.try_recv().expect("the probe is sent within the call"));
            tokio::time::advance(Duration::from_micros(4_500)).await;
            barrier(&h, 1, round, 0);
            barrier(&h, 3, round, 0);
        }
        assert_eq!(h.service.timeout(), Duration::from_millis(18));
        assert_eq!(gauge(&h.service.metrics), "sdns_vouch_timeout_seconds{replica=\"0\"} 0.018");
        assert_eq!(outcome(&h.service.metrics, "vouched"), exec::vouch_core::WINDOW as u64);
        // Silence: ordered once the (raised) timeout passed, by the timer task.
        let start = tokio::time::Instant::now();
        take(&h, read(query(5), false, reply));
        assert_eq!(h.fallback.recv().await.unwrap().bytes, query(5));
        assert!((Duration::from_millis(18)..=Duration::from_millis(19)).contains(&start.elapsed()), "{:?}", start.elapsed());
    }
}
