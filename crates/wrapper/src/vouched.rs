//! Vouched reads: PBFT's read-only optimisation inside the cluster, for ordinary clients in
//! ordered mode (`cluster.vouched_reads`, on by default).
//!
//! The gateway (the replica a client asked, which that client trusts) answers a plain query
//! without ordering it when 2t+1 replicas, itself included, give the same answer; otherwise
//! it orders the read as before. Each read is probed at every peer ([`bft::Message::ReadProbe`],
//! batched: one message per flush of the outbox); a replica answers a probe only after its
//! executor has executed up to its *read barrier* at the probe's arrival (the highest seq it
//! has sent a commit for, or delivered), and vouches with the digest of its answer
//! (`crate::vouch::answer_digest`); the gateway answers its own copy after executing up to
//! its barrier at the read's arrival, and tallies the vouches (`crate::vouch::Tally`).
//!
//! Why this is linearizable (docs/DETERMINISM.md, "Vouched reads", says it at length): a write
//! W at seq s was acknowledged only after it committed, i.e. after 2t+1 replicas had sent a
//! commit for s. Every replica whose answer counts (the gateway and 2t peers that match it)
//! took its barrier after the read began, hence after W's acknowledgement; the 2t+1 of them
//! and the 2t+1 committers share at least t+1 replicas, so at least one honest replica whose
//! barrier was at or past s, whose answer reflects W. Every counted answer is the gateway's
//! own (equal digests), and every honest answer comes from an executed, committed prefix of the
//! log, so the client gets an answer that reflects W and nothing that was not ordered.
//! A Byzantine peer can only withhold or spoil its vouch: the client is sent the gateway's own
//! bytes, never a peer's. Without 2t+1 matches (a lagging or lying peer, a silent one, a
//! budget exceeded) the read falls back to ordering after `cluster.vouch_timeout_ms`, or at
//! once when 2t+1 has become impossible.
//!
//! Nothing here makes the executor wait: the gateway and the peers wait for the executed
//! position on a watch channel in tasks of their own and answer from the read cache or named,
//! as local reads do. What a peer can make this replica hold is bounded: probes are refused
//! beyond a byte budget per peer, and a probe whose barrier is not executed within
//! [`PROBE_WAIT`] is dropped (its gateway has long fallen back).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bft::transport::{ReadIn, ReadOut};
use bft::{MAX_READ_PROBES, MAX_READ_PROBE_BYTES, MAX_READ_PROBE_REQUEST};
use named_glue::forward::Forwarder;
use tokio::sync::{mpsc, watch};

use crate::classify::Kind;
use crate::metrics::Metrics;
use crate::read::ReadCache;
use crate::reply::ClientRequest;
use crate::vouch::{answer_digest, parse_probe_request, probe_request, Tally, Verdict};

/// Reads awaiting their vouches at this gateway; beyond, reads are ordered directly.
const MAX_WAITING: usize = 4096;
/// Bytes of a peer's probes this replica holds at once; beyond, its probes are dropped.
const PEER_BUDGET: usize = 1 << 20;
/// A probe whose barrier this replica has not executed within this time is dropped.
pub const PROBE_WAIT: Duration = Duration::from_secs(1);
/// The longest a gateway waits for its own executor to reach its barrier before ordering the
/// read instead.
const OWN_WAIT: Duration = Duration::from_secs(1);
/// Probes and vouches queued for the outbox flushers.
const OUTBOX: usize = 8192;

pub struct VouchedReads {
    n: u16,
    t: u16,
    named: Forwarder,
    cache: Arc<ReadCache>,
    metrics: Arc<Metrics>,
    /// How long a gateway waits for vouches once its own answer is in.
    timeout: Duration,
    /// The ordering core's read barrier, published by its driver.
    barrier: watch::Receiver<u64>,
    /// The executor's executed position.
    executed: watch::Receiver<u64>,
    probes: mpsc::Sender<(u64, Vec<u8>)>,
    vouches: mpsc::Sender<(u16, u64, [u8; 32])>,
    /// Reads this gateway is collecting vouches for.
    waiting: Mutex<HashMap<u64, Waiting>>,
    next_id: AtomicU64,
    /// Reads to order after all (the gateway's loop orders them).
    fallback: mpsc::Sender<ClientRequest>,
    /// Bytes of each peer's probes held now.
    held: Mutex<HashMap<u16, usize>>,
}

struct Waiting {
    tally: Tally,
    request: ClientRequest,
    /// The gateway's own answer, once in.
    answer: Option<Vec<u8>>,
}

/// The channels [`VouchedReads::start`] wires to the ordering driver and the gateway.
pub struct Wiring {
    /// To the ordering driver (`bft::transport::ReplicaHandle::reads`).
    pub out: mpsc::Sender<ReadOut>,
    /// From it (`ReplicaHandle::read_events`).
    pub events: mpsc::Receiver<ReadIn>,
    pub barrier: watch::Receiver<u64>,
    pub executed: watch::Receiver<u64>,
    pub fallback: mpsc::Sender<ClientRequest>,
}

impl VouchedReads {
    /// The vouched-read service and the task that runs its outboxes and inbox (an essential
    /// task of the replica).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        n: u16,
        t: u16,
        named: Forwarder,
        cache: Arc<ReadCache>,
        metrics: Arc<Metrics>,
        timeout: Duration,
        wiring: Wiring,
    ) -> (Arc<VouchedReads>, impl std::future::Future<Output = ()> + Send + 'static) {
        let (probes_tx, probes_rx) = mpsc::channel(OUTBOX);
        let (vouches_tx, vouches_rx) = mpsc::channel(OUTBOX);
        let service = Arc::new(VouchedReads {
            n,
            t,
            named,
            cache,
            metrics,
            timeout,
            barrier: wiring.barrier,
            executed: wiring.executed,
            probes: probes_tx,
            vouches: vouches_tx,
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            fallback: wiring.fallback,
            held: Mutex::new(HashMap::new()),
        });
        let inbox = service.clone();
        let (out, mut events) = (wiring.out, wiring.events);
        let task = async move {
            let probes = tokio::spawn(flush_probes(probes_rx, out.clone()));
            let vouches = tokio::spawn(flush_vouches(vouches_rx, out));
            while let Some(event) = events.recv().await {
                match event {
                    ReadIn::Probes { from, after, probes } => inbox.answer_probes(from, after, probes),
                    ReadIn::Vouches { from, answers } => inbox.count_vouches(from, answers),
                }
            }
            probes.abort();
            vouches.abort();
        };
        (service, task)
    }

    /// Takes a plain query (the caller checked: a read the read cache could key) onto the
    /// vouched path; hands it back when there is no room, to be ordered.
    pub fn take(self: &Arc<Self>, request: ClientRequest) -> Result<(), ClientRequest> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let probe = probe_request(&request.bytes, request.tcp);
        if probe.len() > MAX_READ_PROBE_REQUEST {
            return Err(request);
        }
        let (message, tcp) = (request.bytes.clone(), request.tcp);
        {
            let mut waiting = self.lock_waiting();
            if waiting.len() >= MAX_WAITING {
                drop(waiting);
                self.metrics.inc_dropped("vouched_reads_full");
                return Err(request);
            }
            waiting.insert(id, Waiting { tally: Tally::new(self.n, self.t), request, answer: None });
        }
        // Read after the read arrived: at or past every write acknowledged before it.
        let barrier = *self.barrier.borrow();
        if self.probes.try_send((id, probe)).is_err() {
            self.fall_back(id);
            return Ok(());
        }
        let service = self.clone();
        tokio::spawn(async move {
            let mut executed = service.executed.clone();
            // The guard the wait returns is dropped at once (it must not be held across awaits).
            let reached = tokio::time::timeout(OWN_WAIT, executed.wait_for(|e| *e >= barrier)).await.is_ok_and(|r| r.is_ok());
            if !reached {
                return service.fall_back(id);
            }
            let Some(answer) = crate::read::read_answer(&service.named, &service.cache, &message, tcp, &service.metrics).await else {
                // named stayed silent (or the read failed): let the ordered path decide.
                return service.fall_back(id);
            };
            let digest = answer_digest(&answer);
            let verdict = {
                let mut waiting = service.lock_waiting();
                let Some(w) = waiting.get_mut(&id) else { return };
                w.answer = Some(answer);
                w.tally.own(digest)
            };
            service.decide(id, verdict);
            if verdict == Verdict::Pending {
                tokio::time::sleep(service.timeout).await;
                service.fall_back(id);
            }
        });
        Ok(())
    }

    fn lock_waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Acts on a decided read (whoever removes it from the table acts, once).
    fn decide(&self, id: u64, verdict: Verdict) {
        match verdict {
            Verdict::Pending => {}
            Verdict::Failed => self.fall_back(id),
            Verdict::Vouched => {
                let Some(w) = self.lock_waiting().remove(&id) else { return };
                let Some(answer) = w.answer else { return };
                self.metrics.inc_vouched_read("vouched");
                self.metrics.inc_request(Kind::Read);
                crate::read::deliver(&w.request.reply, answer, &self.metrics);
            }
        }
    }

    /// Orders the read after all, if it is still waiting.
    fn fall_back(&self, id: u64) {
        let Some(w) = self.lock_waiting().remove(&id) else { return };
        self.metrics.inc_vouched_read("fell_back");
        if self.fallback.try_send(w.request).is_err() {
            self.metrics.inc_dropped("vouched_fallback_full");
        }
    }

    fn count_vouches(&self, from: u16, answers: Vec<(u64, [u8; 32])>) {
        for (id, digest) in answers {
            let verdict = match self.lock_waiting().get_mut(&id) {
                Some(w) => w.tally.vouch(from, digest),
                None => continue,
            };
            self.decide(id, verdict);
        }
    }

    /// A peer's probe: each read that is a plain query is answered once this replica has
    /// executed up to `after`, and vouched for; the rest is ignored (no vouch: the gateway
    /// falls back). Never queued beyond the peer's budget.
    fn answer_probes(self: &Arc<Self>, from: u16, after: u64, probes: Vec<(u64, Vec<u8>)>) {
        let reads: Vec<(u64, bool, Vec<u8>)> = probes
            .into_iter()
            .filter_map(|(id, request)| {
                let (tcp, message) = parse_probe_request(&request)?;
                // Only what a read cache could key: plain queries, never an update, a
                // transfer, a signed request (those are ordered, always).
                crate::read_cache::key(message, tcp)?;
                Some((id, tcp, message.to_vec()))
            })
            .collect();
        let bytes: usize = reads.iter().map(|(_, _, m)| m.len() + 64).sum();
        if reads.is_empty() {
            return;
        }
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            let peer = held.entry(from).or_default();
            if *peer + bytes > PEER_BUDGET {
                drop(held);
                self.metrics.inc_dropped("read_probe_budget");
                return;
            }
            *peer += bytes;
        }
        let service = self.clone();
        tokio::spawn(async move {
            let mut executed = service.executed.clone();
            let reached = tokio::time::timeout(PROBE_WAIT, executed.wait_for(|e| *e >= after)).await.is_ok_and(|r| r.is_ok());
            if reached {
                let mut misses = tokio::task::JoinSet::new();
                for (id, tcp, message) in reads {
                    // Hits at once; misses to named concurrently.
                    if let Some(answer) = service.cache.hit(&message, tcp) {
                        service.metrics.inc_read_cache(true);
                        service.vouch(from, id, &answer);
                        continue;
                    }
                    let service = service.clone();
                    misses.spawn(async move {
                        if let Some(answer) = crate::read::read_answer(&service.named, &service.cache, &message, tcp, &service.metrics).await {
                            service.vouch(from, id, &answer);
                        }
                    });
                }
                while misses.join_next().await.is_some() {}
            } else {
                service.metrics.inc_dropped("read_probe_barrier_wait");
            }
            let mut held = service.held.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(peer) = held.get_mut(&from) {
                *peer = peer.saturating_sub(bytes);
            }
        });
    }

    fn vouch(&self, to: u16, id: u64, answer: &[u8]) {
        match self.vouches.try_send((to, id, answer_digest(answer))) {
            Ok(()) => self.metrics.inc_vouches_sent(1),
            Err(_) => self.metrics.inc_dropped("vouch_outbox_full"),
        }
    }
}

/// Sends the queued probes to the ordering driver, as many per message as the bounds allow:
/// under load one message carries many reads.
async fn flush_probes(mut queue: mpsc::Receiver<(u64, Vec<u8>)>, out: mpsc::Sender<ReadOut>) {
    let mut carried: Option<(u64, Vec<u8>)> = None;
    loop {
        let first = match carried.take() {
            Some(p) => p,
            None => match queue.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut bytes = first.1.len();
        let mut batch = vec![first];
        while batch.len() < MAX_READ_PROBES {
            let Ok(next) = queue.try_recv() else { break };
            if bytes + next.1.len() > MAX_READ_PROBE_BYTES {
                carried = Some(next);
                break;
            }
            bytes += next.1.len();
            batch.push(next);
        }
        if out.send(ReadOut::Probe(batch)).await.is_err() {
            return;
        }
    }
}

/// Sends the queued vouches, one message per peer per flush.
async fn flush_vouches(mut queue: mpsc::Receiver<(u16, u64, [u8; 32])>, out: mpsc::Sender<ReadOut>) {
    while let Some(first) = queue.recv().await {
        let mut by_peer: HashMap<u16, Vec<(u64, [u8; 32])>> = HashMap::new();
        let mut next = Some(first);
        let mut taken = 0usize;
        while let Some((to, id, digest)) = next.take() {
            let answers = by_peer.entry(to).or_default();
            answers.push((id, digest));
            taken += 1;
            if answers.len() >= MAX_READ_PROBES || taken >= 4 * MAX_READ_PROBES {
                break;
            }
            next = queue.try_recv().ok();
        }
        for (to, answers) in by_peer {
            if out.send(ReadOut::Vouch { to, answers }).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::net::UdpSocket;

    fn query(id: u16) -> Vec<u8> {
        let name = hickory_proto::rr::Name::from_ascii("www.example.test.").unwrap();
        named_glue::forward::build_query(id, &name, hickory_proto::rr::RecordType::A).unwrap()
    }

    /// A named stand-in that answers every query with its bytes, QR set and `tail` appended.
    async fn fake_named(tail: &'static [u8]) -> SocketAddr {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while let Ok((n, from)) = server.recv_from(&mut buf).await {
                let mut answer = buf[..n].to_vec();
                answer[2] |= 0x84;
                answer.extend_from_slice(tail);
                let _ = server.send_to(&answer, from).await;
            }
        });
        addr
    }

    struct Harness {
        service: Arc<VouchedReads>,
        out: mpsc::Receiver<ReadOut>,
        events: mpsc::Sender<ReadIn>,
        fallback: mpsc::Receiver<ClientRequest>,
        executed: watch::Sender<u64>,
        _barrier: watch::Sender<u64>,
    }

    async fn harness(barrier: u64, executed: u64, timeout_ms: u64) -> Harness {
        let named = Forwarder::new(fake_named(b"").await);
        let (out_tx, out) = mpsc::channel(64);
        let (events, events_rx) = mpsc::channel(64);
        let (barrier_tx, barrier_rx) = watch::channel(barrier);
        let (executed_tx, executed_rx) = watch::channel(executed);
        let (fallback_tx, fallback) = mpsc::channel(64);
        let wiring = Wiring { out: out_tx, events: events_rx, barrier: barrier_rx, executed: executed_rx, fallback: fallback_tx };
        let (service, task) = VouchedReads::start(4, 1, named, Arc::new(ReadCache::default()), Metrics::new(0), Duration::from_millis(timeout_ms), wiring);
        tokio::spawn(task);
        Harness { service, out, events, fallback, executed: executed_tx, _barrier: barrier_tx }
    }

    async fn client() -> (UdpSocket, crate::reply::ReplyTo) {
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let server = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let reply = crate::reply::ReplyTo::Udp { socket: server, peer: client.local_addr().unwrap(), rrl: None, lie: false };
        (client, reply)
    }

    async fn next_probe(out: &mut mpsc::Receiver<ReadOut>) -> Vec<(u64, Vec<u8>)> {
        match tokio::time::timeout(Duration::from_secs(2), out.recv()).await {
            Ok(Some(ReadOut::Probe(p))) => p,
            other => panic!("expected a probe, got {other:?}"),
        }
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
        let mut h = harness(0, 0, 200).await;
        let (c, reply) = client().await;
        h.service.take(ClientRequest { bytes: query(1), tcp: false, reply: reply.clone() }).unwrap();
        let probes = next_probe(&mut h.out).await;
        assert_eq!(probes.len(), 1);
        let (id, request) = probes[0].clone();
        assert_eq!(parse_probe_request(&request), Some((false, &query(1)[..])));
        // The peers' answers are named's for the same question (another id): they match.
        let mut peer_answer = query(77);
        peer_answer[2] |= 0x84;
        let digest = answer_digest(&peer_answer);
        h.events.send(ReadIn::Vouches { from: 1, answers: vec![(id, digest)] }).await.unwrap();
        h.events.send(ReadIn::Vouches { from: 1, answers: vec![(id, digest)] }).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(outcome(&h.service.metrics, "vouched"), 0, "one peer twice is not two");
        h.events.send(ReadIn::Vouches { from: 2, answers: vec![(id, digest)] }).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(outcome(&h.service.metrics, "vouched"), 1);
        assert!(h.fallback.try_recv().is_err());
        // The client got the gateway's own answer, its own id.
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(2), c.recv(&mut buf)).await.expect("answered").unwrap();
        let mut expected = query(1);
        expected[2] |= 0x84;
        assert_eq!(&buf[..n], &expected[..]);

        // Two wrong digests: ordered at once, long before the timeout.
        h.service.take(ClientRequest { bytes: query(2), tcp: false, reply: reply.clone() }).unwrap();
        let (id, _) = next_probe(&mut h.out).await[0].clone();
        h.events.send(ReadIn::Vouches { from: 1, answers: vec![(id, [0xee; 32])] }).await.unwrap();
        h.events.send(ReadIn::Vouches { from: 3, answers: vec![(id, [0xdd; 32])] }).await.unwrap();
        let ordered = tokio::time::timeout(Duration::from_millis(150), h.fallback.recv()).await.expect("fell back before the timeout").unwrap();
        assert_eq!(ordered.bytes, query(2));
        assert_eq!(outcome(&h.service.metrics, "fell_back"), 1);

        // Nobody vouches: ordered after the timeout.
        h.service.take(ClientRequest { bytes: query(3), tcp: true, reply }).unwrap();
        let ordered = tokio::time::timeout(Duration::from_secs(2), h.fallback.recv()).await.expect("fell back").unwrap();
        assert!(ordered.tcp && ordered.bytes == query(3));
    }

    /// A peer's probe is answered only once its barrier is executed; probes that are not
    /// plain queries are ignored.
    #[tokio::test]
    async fn peers_vouch_after_their_barrier_only() {
        let mut h = harness(0, 4, 200).await;
        let mut update = query(5);
        update[2] |= 5 << 3;
        let probes = vec![(10, probe_request(&query(5), false)), (11, probe_request(&update, false)), (12, vec![9, 9])];
        h.events.send(ReadIn::Probes { from: 2, after: 5, probes }).await.unwrap();
        let early = tokio::time::timeout(Duration::from_millis(100), h.out.recv()).await;
        assert!(early.is_err(), "vouched before executing up to the barrier: {early:?}");
        h.executed.send_replace(5);
        match tokio::time::timeout(Duration::from_secs(2), h.out.recv()).await {
            Ok(Some(ReadOut::Vouch { to: 2, answers })) => {
                assert_eq!(answers.len(), 1, "only the plain query: {answers:?}");
                assert_eq!(answers[0].0, 10);
                let mut expected = query(5);
                expected[2] |= 0x84;
                assert_eq!(answers[0].1, answer_digest(&expected));
            }
            other => panic!("expected a vouch, got {other:?}"),
        }
    }
}
