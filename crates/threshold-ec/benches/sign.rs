//! One threshold signature made by all n replicas in one process, driven through
//! `EcSignerCore` as the signing service drives it (every replica's request, jobs and
//! messages; messages delivered in order, all replicas honest: the optimistic path, where no
//! share or proof is checked on its own), next to one single-key signature of the same
//! algorithm. After criterion's figures it prints OpenSSL's own on this machine:
//! `openssl speed -seconds 3 ecdsap256 ed25519` (skipped with SIGN_BENCH_NO_OPENSSL=1).
//!
//! One thread runs every replica, so the per-replica CPU of one signature is the
//! all-replicas time divided by n. Every iteration signs new data (the same data would be
//! answered from the finals cache).
//!
//! The `online` group is the online part of a presigned signature alone (`PresignCore`): the
//! slot's background round runs before the clock starts; timed are the record, the
//! announcements, every replica's share and the combination, all replicas in one thread.
//!
//! `cargo bench -p threshold-ec --bench sign` (add `-- --quick` for a sanity run, `-- online`
//! for the presigned group alone; OpenSSL's figures follow either way).

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, Criterion};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use threshold_ec::{deal, Algorithm, EcLimits, EcOutput, EcSignMessage, EcSignerCore, PresignCore, PresignLimits, PresignMessage, PresignOutput, Slot};

const DATA: &[u8] = b"\x00\x06\x0f\x02\x00\x00\x0e\x10 an RRSIG prefix and a canonical RRset of typical size";

/// n cores of one key in one process.
struct Cluster {
    cores: Vec<EcSignerCore>,
    alg: u8,
    counter: u64,
}

impl Cluster {
    fn new(alg: Algorithm, n: u16) -> Cluster {
        let mut rng = ChaCha20Rng::seed_from_u64(u64::from(n));
        let (pk, shares) = deal(alg, n, (n - 1) / 3, &mut rng).unwrap();
        let pk = Arc::new(pk);
        let cores = shares.into_iter().enumerate().map(|(i, s)| EcSignerCore::new(i as u16, pk.clone(), Arc::new(s), EcLimits::default()).unwrap()).collect();
        Cluster { cores, alg: alg.number(), counter: 0 }
    }

    /// Every replica asks to sign new data; runs jobs at once and delivers messages in order
    /// until every replica has the signature.
    fn sign(&mut self) -> Vec<u8> {
        self.counter += 1;
        let mut data = DATA.to_vec();
        data.extend(self.counter.to_be_bytes());
        for core in &mut self.cores {
            core.request(0, self.alg, &data).unwrap();
        }
        let n = self.cores.len();
        let mut queue: VecDeque<(usize, u16, EcSignMessage)> = VecDeque::new();
        let mut done: Vec<Option<Vec<u8>>> = vec![None; n];
        loop {
            let mut progressed = false;
            for (i, core) in self.cores.iter_mut().enumerate() {
                while let Some(output) = core.poll_output() {
                    progressed = true;
                    match output {
                        EcOutput::Send { to, message } => queue.push_back((usize::from(to), i as u16, message)),
                        EcOutput::Broadcast { message } => (0..n).filter(|&to| to != i).for_each(|to| queue.push_back((to, i as u16, message.clone()))),
                        EcOutput::Compute(job) => core.job_done(job.run()),
                        EcOutput::Done { signature, .. } => done[i] = Some(signature),
                        other => panic!("honest replicas, yet {other:?}"),
                    }
                }
            }
            if let Some((to, from, message)) = queue.pop_front() {
                self.cores[to].handle_message(0, from, message);
            } else if !progressed {
                break;
            }
        }
        let first = done[0].clone().expect("replica 0 signed");
        assert!(done.iter().all(|d| d.as_ref() == Some(&first)), "every replica has the same signature");
        first
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("sign");
    group.sample_size(20);
    for n in [4u16, 7] {
        let mut cluster = Cluster::new(Algorithm::Ed25519, n);
        group.bench_function(format!("ed25519 threshold n={n} (all replicas)"), |b| b.iter(|| cluster.sign()));
    }
    let single = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    group.bench_function("ed25519 single key (ed25519-dalek)", |b| {
        use ed25519_dalek::Signer as _;
        b.iter(|| single.sign(black_box(DATA)))
    });
    for n in [4u16, 7] {
        let mut cluster = Cluster::new(Algorithm::EcdsaP256Sha256, n);
        group.bench_function(format!("ecdsa-p256 threshold n={n} (all replicas)"), |b| b.iter(|| cluster.sign()));
    }
    let single = p256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap();
    group.bench_function("ecdsa-p256 single key (p256)", |b| {
        use p256::ecdsa::signature::Signer as _;
        b.iter(|| -> p256::ecdsa::Signature { single.sign(black_box(DATA)) })
    });
    group.finish();
}

/// OpenSSL's signatures per second on this machine, the yardstick.
fn openssl() {
    if std::env::var_os("SIGN_BENCH_NO_OPENSSL").is_some() {
        return;
    }
    println!("\nopenssl speed -seconds 3 ecdsap256 ed25519");
    match std::process::Command::new("openssl").args(["speed", "-seconds", "3", "ecdsap256", "ed25519"]).output() {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            // The summary table: the header line and the algorithms' lines.
            for line in text.lines().filter(|l| l.contains("sign/s") || l.contains("ecdsa (nistp256)") || l.contains("Ed25519")) {
                println!("{line}");
            }
        }
        Err(e) => println!("openssl not run: {e}"),
    }
}

/// n presigning cores of one key in one process.
struct Presigners {
    cores: Vec<PresignCore>,
    counter: u64,
}

impl Presigners {
    fn new(alg: Algorithm, n: u16) -> Presigners {
        let mut rng = ChaCha20Rng::seed_from_u64(u64::from(n));
        let (pk, shares) = deal(alg, n, (n - 1) / 3, &mut rng).unwrap();
        let pk = Arc::new(pk);
        let floor = Slot { epoch: 1, counter: 0 };
        let cores = shares
            .into_iter()
            .enumerate()
            .map(|(i, s)| PresignCore::new(i as u16, pk.clone(), Arc::new(s), PresignLimits::default(), floor, []).unwrap())
            .collect();
        Presigners { cores, counter: 0 }
    }

    /// Runs every core's outputs until quiet; returns the signatures.
    fn run(&mut self) -> Vec<[u8; 64]> {
        let n = self.cores.len();
        let mut queue: VecDeque<(usize, u16, PresignMessage)> = VecDeque::new();
        let mut done = Vec::new();
        loop {
            let mut progressed = false;
            for i in 0..n {
                while let Some(output) = self.cores[i].poll_output() {
                    progressed = true;
                    match output {
                        PresignOutput::Send { to, message } => queue.push_back((usize::from(to), i as u16, message)),
                        PresignOutput::Broadcast { message } => (0..n).filter(|&to| to != i).for_each(|to| queue.push_back((to, i as u16, message.clone()))),
                        // The durable write is the driver's; here it completes at once.
                        PresignOutput::Record { slot, .. } => self.cores[i].recorded(slot),
                        PresignOutput::Done { signature, .. } => done.push(signature),
                        PresignOutput::Ready { .. } => {}
                        other => panic!("honest replicas, yet {other:?}"),
                    }
                }
            }
            if let Some((to, from, message)) = queue.pop_front() {
                self.cores[to].handle_message(0, from, message);
            } else if !progressed {
                return done;
            }
        }
    }

    /// The background round of the next slot (not timed).
    fn prepare(&mut self) -> Slot {
        self.counter += 1;
        let slot = Slot { epoch: 1, counter: self.counter };
        for core in &mut self.cores {
            core.prepare(0, slot).unwrap();
        }
        self.run();
        assert!(self.cores.iter().all(|c| c.is_ready(slot)));
        slot
    }

    /// The online part: every replica signs new data in a ready slot.
    fn sign(&mut self, slot: Slot) -> [u8; 64] {
        let mut data = DATA.to_vec();
        data.extend(slot.counter.to_be_bytes());
        for core in &mut self.cores {
            core.sign(0, slot, &data).unwrap();
        }
        let done = self.run();
        assert!(done.len() == self.cores.len() && done.iter().all(|d| *d == done[0]), "every replica has the same signature");
        done[0]
    }
}

fn online(c: &mut Criterion) {
    let mut group = c.benchmark_group("online");
    // Every timed iteration costs an untimed background round many times longer: few, flat
    // samples of little measured time keep the run short.
    group.sample_size(10).sampling_mode(criterion::SamplingMode::Flat);
    group.warm_up_time(std::time::Duration::from_millis(10)).measurement_time(std::time::Duration::from_millis(100));
    for alg in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
        for n in [4u16, 7] {
            let mut cluster = Presigners::new(alg, n);
            let name = if alg == Algorithm::Ed25519 { "ed25519" } else { "ecdsa-p256" };
            group.bench_function(format!("{name} presigned online n={n} (all replicas)"), |b| {
                b.iter_custom(|iters| {
                    let mut total = std::time::Duration::ZERO;
                    for _ in 0..iters {
                        let slot = cluster.prepare();
                        let start = std::time::Instant::now();
                        black_box(cluster.sign(slot));
                        total += start.elapsed();
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench, online);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    openssl();
}
