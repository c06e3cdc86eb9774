//! Requests ordered per second by the core alone: n replicas in one thread, messages passed in
//! memory (encoded and decoded, as a transport would), no faults, default batching. Also prints
//! the latency of one request in message delays (rounds of the in-memory network).
//!
//! Under attack (`order_under_attack`, Aardvark's lesson): n = 4 with one Byzantine replica in
//! each mode against the fault-free cluster in the same run; requests are submitted at honest
//! replica 1 and the figure is ordered requests per second until every honest replica
//! delivered them all. Idle rounds jump the clock (timeouts, view changes) without costing
//! wall time; the number of view changes is printed per mode.
//!
//! Run: `CARGO_TARGET_DIR=/work/target-bft cargo bench -p bft --bench order`

use std::collections::VecDeque;

use bft::{Action, Config, Message, Proposal, Replica, ReplicaId, Request, StatusReport, Time};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const REQUESTS: u64 = 4096;
const PAYLOAD_BYTES: usize = 64;

/// What the Byzantine replica (if any) does to its outgoing messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    FaultFree,
    /// Replica 0, the first primary, sends nothing at all.
    Silent,
    /// Replica 0 sends no pre-prepares or new views and poisons its view changes.
    Poisoner,
    /// Replica 3 relays forged requests of replica 1's client with huge numbers.
    ForgedRelays,
    /// Replica 3 sends two max-size requests of its own and a max-size batch with each message.
    Flooder,
    /// Replica 3 sends four status reports claiming it delivered nothing with each message.
    StatusSpammer,
}

const MODES: [Mode; 6] = [Mode::FaultFree, Mode::Silent, Mode::Poisoner, Mode::ForgedRelays, Mode::Flooder, Mode::StatusSpammer];

impl Mode {
    fn byzantine(self) -> Option<usize> {
        match self {
            Mode::FaultFree => None,
            Mode::Silent | Mode::Poisoner => Some(0),
            Mode::ForgedRelays | Mode::Flooder | Mode::StatusSpammer => Some(3),
        }
    }

    /// The messages replica `me` really sends in place of `message`.
    fn rewrite(self, me: ReplicaId, counter: &mut u64, config: &Config, message: Message) -> Vec<Message> {
        let mut out = Vec::new();
        match (self, message) {
            (Mode::Silent, _) => {}
            (Mode::Poisoner, Message::PrePrepare { .. } | Message::NewView { .. }) => {}
            (Mode::Poisoner, Message::ViewChange(mut vc)) => {
                // The well-formed variant: not refused, so the new primary must search around it.
                bft::actors::poison_view_change(&mut vc, me, config.watermark_window, config.checkpoint_interval, false);
                out.push(Message::ViewChange(vc));
            }
            (Mode::ForgedRelays, message) => {
                *counter += 1;
                let request = Request { origin: 1, client: 1, number: u64::MAX - *counter, payload: vec![0xf0; 8] };
                out.push(message);
                out.push(Message::Request { sender: me, request });
            }
            (Mode::Flooder, message) => {
                out.push(message);
                let payload_bytes = config.max_request_bytes - 24;
                for _ in 0..2 {
                    *counter += 1;
                    let request = Request { origin: me, client: 1_000 + *counter, number: 1, payload: vec![0xf2; payload_bytes] };
                    out.push(Message::Request { sender: me, request });
                }
                let count = config.batch_max_bytes / config.max_request_bytes;
                let requests = (0..count).map(|i| Request { origin: me, client: 9, number: i as u64 + 1, payload: vec![3; payload_bytes] }).collect();
                out.push(Message::Committed { sender: me, seq: *counter % 64 + 1, proposal: Proposal { time: Time(3), requests } });
            }
            (Mode::StatusSpammer, message) => {
                out.push(message);
                let report = StatusReport { sender: me, view: 0, view_changing: true, last_delivered: 0, stable_seq: 0, oldest_retained: 1 };
                out.extend(std::iter::repeat_n(Message::Status(report), 4));
            }
            (_, message) => out.push(message),
        }
        out
    }
}

struct Network {
    replicas: Vec<Replica>,
    queue: VecDeque<(ReplicaId, ReplicaId, Vec<u8>)>,
    delivered: Vec<u64>,
    mode: Mode,
    counter: u64,
    /// Only requests of this origin count as delivered (the flooder's do not).
    origin: ReplicaId,
}

impl Network {
    fn new(n: u16) -> Network {
        Network { origin: 0, ..Network::with_mode(n, Mode::FaultFree) }
    }

    fn with_mode(n: u16, mode: Mode) -> Network {
        let config = |id| {
            let mut config = Config::new(n, id);
            // The per-origin budget bounds one origin's rate in agreed time; this measures how
            // fast the core orders, with every request from one origin and the clock still.
            config.max_origin_bytes_per_sec = 0;
            config
        };
        let replicas = (0..n).map(|id| Replica::new(config(id), Time(1)).expect("valid config")).collect();
        Network { replicas, queue: VecDeque::new(), delivered: vec![0; usize::from(n)], mode, counter: 0, origin: ORIGIN_UNDER_ATTACK }
    }

    fn honest(&self, index: usize) -> bool {
        self.mode.byzantine() != Some(index)
    }

    fn drain(&mut self, index: usize) {
        let n = self.replicas.len();
        while let Some(action) = self.replicas[index].poll_action() {
            let (targets, message): (Vec<usize>, Message) = match action {
                Action::Send { to, message } => (vec![usize::from(to)], message),
                Action::Broadcast { message } => ((0..n).filter(|to| *to != index).collect(), message),
                other => {
                    self.apply(index, other);
                    continue;
                }
            };
            let messages = if self.honest(index) {
                vec![message]
            } else {
                let config = self.replicas[index].config().clone();
                self.mode.rewrite(index as ReplicaId, &mut self.counter, &config, message)
            };
            for message in messages {
                let bytes = message.encode();
                for to in &targets {
                    self.queue.push_back((index as ReplicaId, *to as ReplicaId, bytes.clone()));
                }
            }
        }
    }

    fn apply(&mut self, index: usize, action: Action) {
        if let Action::Deliver(batch) = action {
            self.delivered[index] += batch.requests.iter().filter(|r| r.origin == self.origin).count() as u64;
            if batch.checkpoint_due {
                let _ = self.replicas[index].checkpoint(batch.seq, [1; 32]);
            }
        }
    }

    /// Delivers every queued message (one round of message delays); returns false when idle.
    fn round(&mut self, now: Time) -> bool {
        for index in 0..self.replicas.len() {
            self.drain(index);
        }
        if self.queue.is_empty() {
            return false;
        }
        let pending: Vec<_> = self.queue.drain(..).collect();
        for (from, to, bytes) in pending {
            let replica = &mut self.replicas[usize::from(to)];
            if let Ok(message) = Message::decode(&bytes, replica.config().limits()) {
                replica.handle_message(now, from, message);
            }
        }
        true
    }
}

fn request(number: u64) -> Request {
    Request { origin: 0, client: 1, number, payload: vec![0x5a; PAYLOAD_BYTES] }
}

/// Under attack, requests come from this honest replica's clients.
const ORIGIN_UNDER_ATTACK: ReplicaId = 1;

/// Submits everything at replica 1, then runs rounds until every honest replica delivered it
/// all. Returns the view changes (highest honest view) it took.
fn order_under_attack(network: &mut Network) -> u64 {
    let now = Time(2);
    for number in 1..=REQUESTS {
        let request = Request { origin: ORIGIN_UNDER_ATTACK, client: 1, number, payload: vec![0x5a; PAYLOAD_BYTES] };
        network.replicas[usize::from(ORIGIN_UNDER_ATTACK)].submit(now, request).expect("room for the requests");
    }
    let mut clock = 2;
    // Bounded: a stall shows as a panic, not a hang (10,000 idle rounds are 100 virtual seconds).
    for _ in 0..10_000_000u32 {
        let done = (0..network.replicas.len()).filter(|i| network.honest(*i)).all(|i| network.delivered[i] >= REQUESTS);
        if done {
            return (0..network.replicas.len()).filter(|i| network.honest(*i)).map(|i| network.replicas[i].status().view).max().unwrap_or(0);
        }
        clock += 1;
        if !network.round(Time(clock)) {
            clock += 10_000;
            assert!(clock < 100_000_000, "{:?}: no progress in 100 virtual seconds: {:?}", network.mode, network.delivered);
            for replica in &mut network.replicas {
                replica.handle_timeout(Time(clock));
            }
        }
    }
    panic!("{:?}: round bound reached", network.mode);
}

/// Submits everything at the primary, then runs rounds until every replica delivered it all.
fn order_all(network: &mut Network) {
    let now = Time(2);
    for number in 1..=REQUESTS {
        network.replicas[0].submit(now, request(number)).expect("room for the requests");
    }
    let mut clock = 2;
    let mut idle = 0u32;
    let mut rounds = 0u32;
    while network.delivered.iter().any(|count| *count < REQUESTS) {
        clock += 1;
        rounds += 1;
        if !network.round(Time(clock)) {
            idle += 1;
            // Idle with requests queued: let the batch delay expire.
            clock += 10_000;
            for replica in &mut network.replicas {
                replica.handle_timeout(Time(clock));
            }
        }
    }
    if std::env::var("BFT_BENCH_PROBE").is_ok() {
        eprintln!("rounds {rounds} idle {idle} delivered {:?}", network.delivered);
    }
}

/// Rounds of message delays from submission to delivery at every replica, at low load.
fn latency_rounds(n: u16, submit_at: usize) -> u32 {
    let mut network = Network::new(n);
    let origin = submit_at as ReplicaId;
    let _ = network.replicas[submit_at].submit(Time(2), Request { origin, client: 9, number: 1, payload: vec![1] });
    let mut rounds: u32 = 0;
    while network.delivered.contains(&0) && rounds < 100 {
        network.round(Time(3 + u64::from(rounds)));
        rounds += 1;
    }
    // The last round only drains the deliveries, it carries no message.
    rounds.saturating_sub(1)
}

fn bench(c: &mut Criterion) {
    if std::env::var("BFT_BENCH_PROBE").is_ok() {
        for n in [1u16, 4, 7] {
            let started = std::time::Instant::now();
            order_all(&mut Network::new(n));
            eprintln!("n={n}: {:?}", started.elapsed());
        }
        return;
    }
    for n in [4u16, 7] {
        eprintln!("n={n}: latency {} message delays when submitted at the primary, {} at a backup", latency_rounds(n, 0), latency_rounds(n, 1));
    }
    let mut group = c.benchmark_group("order");
    group.throughput(Throughput::Elements(REQUESTS));
    group.sample_size(10);
    for n in [1u16, 4, 7] {
        group.bench_function(format!("n={n}"), |b| b.iter_batched(|| Network::new(n), |mut network| order_all(&mut network), BatchSize::LargeInput));
    }
    group.finish();

    let mut group = c.benchmark_group("order_under_attack");
    group.throughput(Throughput::Elements(REQUESTS));
    group.sample_size(10);
    for mode in MODES {
        let views = order_under_attack(&mut Network::with_mode(4, mode));
        eprintln!("n=4 {mode:?}: ordered in view {views}");
        group.bench_function(format!("n=4/{mode:?}"), |b| {
            b.iter_batched(|| Network::with_mode(4, mode), |mut network| order_under_attack(&mut network), BatchSize::LargeInput)
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
