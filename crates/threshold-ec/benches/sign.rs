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
//! `cargo bench -p threshold-ec --bench sign` (add `-- --quick` for a sanity run).

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, Criterion};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use threshold_ec::{deal, Algorithm, EcLimits, EcOutput, EcSignMessage, EcSignerCore};

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

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    openssl();
}
