//! Requests ordered per second by the core alone: n replicas in one thread, messages passed in
//! memory (encoded and decoded, as a transport would), no faults, default batching. Also prints
//! the latency of one request in message delays (rounds of the in-memory network).
//!
//! Run: `CARGO_TARGET_DIR=/work/target-bft cargo bench -p bft --bench order`

use std::collections::VecDeque;

use bft::{Action, Config, Message, Replica, ReplicaId, Request, Time};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const REQUESTS: u64 = 4096;
const PAYLOAD_BYTES: usize = 64;

struct Network {
    replicas: Vec<Replica>,
    queue: VecDeque<(ReplicaId, ReplicaId, Vec<u8>)>,
    delivered: Vec<u64>,
}

impl Network {
    fn new(n: u16) -> Network {
        let replicas = (0..n).map(|id| Replica::new(Config::new(n, id), Time(1)).expect("valid config")).collect();
        Network { replicas, queue: VecDeque::new(), delivered: vec![0; usize::from(n)] }
    }

    fn drain(&mut self, index: usize) {
        let n = self.replicas.len();
        while let Some(action) = self.replicas[index].poll_action() {
            match action {
                Action::Send { to, message } => self.queue.push_back((index as ReplicaId, to, message.encode())),
                Action::Broadcast { message } => {
                    let bytes = message.encode();
                    for to in (0..n).filter(|to| *to != index) {
                        self.queue.push_back((index as ReplicaId, to as ReplicaId, bytes.clone()));
                    }
                }
                Action::Deliver(batch) => {
                    self.delivered[index] += batch.requests.len() as u64;
                    if batch.checkpoint_due {
                        let _ = self.replicas[index].checkpoint(batch.seq, [1; 32]);
                    }
                }
                _ => {}
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
        eprintln!(
            "n={n}: latency {} message delays when submitted at the primary, {} at a backup",
            latency_rounds(n, 0),
            latency_rounds(n, 1)
        );
    }
    let mut group = c.benchmark_group("order");
    group.throughput(Throughput::Elements(REQUESTS));
    group.sample_size(10);
    for n in [1u16, 4, 7] {
        group.bench_function(format!("n={n}"), |b| {
            b.iter_batched(|| Network::new(n), |mut network| order_all(&mut network), BatchSize::LargeInput)
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
