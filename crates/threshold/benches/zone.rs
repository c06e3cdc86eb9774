//! Signing a batch of RRsets at once with 2048-bit keys: n = 4 signer cores in one process, every
//! replica asked to sign the same batch (as every replica's named is while a zone is signed),
//! messages passed in memory, and the cores' jobs (shares, combinations) run on a pool of
//! `workers` threads. The same batch on 1 and on 2 workers, in one run:
//! `cargo bench -p threshold --bench zone`.
//!
//! All four replicas share this machine's cores here, so the figure per RRset is four
//! replicas' work; the ratio between worker counts is what carries over to one replica per
//! host.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, SamplingMode};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;
use threshold::{Job, Keys, Limits, Output, Protocol, SignMessage, SignerCore};

const N: u16 = 4;
const ALG: u8 = 8;
const RRSETS: usize = 16;

fn keys() -> &'static Vec<Keys> {
    static KEYS: OnceLock<Vec<Keys>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut rng = ChaCha20Rng::seed_from_u64(13);
        let (pk, shares) = shoup_rsa::generate(2048, N, shoup_rsa::default_threshold(N), &mut rng, &mut |_| {}).unwrap();
        let pk = Arc::new(pk);
        shares.into_iter().map(|s| Keys::new(pk.clone(), Arc::new(s)).unwrap()).collect()
    })
}

fn cores(protocol: Protocol) -> Vec<SignerCore> {
    keys().iter().enumerate().map(|(i, k)| SignerCore::new(i as u16, N, protocol, false, k.clone(), Limits::default())).collect()
}

/// Runs jobs on `workers` threads; returns each result with its replica.
fn run_jobs(jobs: Vec<(usize, Job)>, workers: usize) -> Vec<(usize, threshold::JobDone)> {
    if workers <= 1 {
        return jobs.into_iter().map(|(i, job)| (i, job.run())).collect();
    }
    let mut lanes: Vec<Vec<(usize, Job)>> = (0..workers).map(|_| Vec::new()).collect();
    for (k, job) in jobs.into_iter().enumerate() {
        lanes[k % workers].push(job);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = lanes.into_iter().map(|lane| scope.spawn(move || lane.into_iter().map(|(i, job)| (i, job.run())).collect::<Vec<_>>())).collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// Every replica signs every request; returns the number of signatures made. `in_jobs` adds
/// up the wall time spent running jobs (the part a worker pool spreads over cores).
fn sign_batch(mut cores: Vec<SignerCore>, requests: &[Vec<u8>], workers: usize, in_jobs: &mut Duration) -> usize {
    for core in cores.iter_mut() {
        for data in requests {
            core.request(0, ALG, data).unwrap();
        }
    }
    let mut signed = 0;
    let mut messages: VecDeque<(usize, usize, SignMessage)> = VecDeque::new();
    loop {
        let mut jobs = Vec::new();
        for (i, core) in cores.iter_mut().enumerate() {
            while let Some(out) = core.poll_output() {
                match out {
                    Output::Broadcast { message } => messages.extend((0..N as usize).filter(|&j| j != i).map(|j| (i, j, message.clone()))),
                    Output::Send { to, message } => messages.push_back((i, usize::from(to), message)),
                    Output::Compute(job) => jobs.push((i, job)),
                    Output::Done { .. } => signed += 1,
                    Output::Failed { reason, .. } => panic!("{reason}"),
                    Output::Misbehaved { peer, what } => panic!("honest peer {peer} blamed: {what}"),
                }
            }
        }
        if jobs.is_empty() && messages.is_empty() {
            return signed;
        }
        while let Some((from, to, message)) = messages.pop_front() {
            cores[to].handle_message(0, from as u16, message);
        }
        let start = Instant::now();
        let results = run_jobs(jobs, workers);
        *in_jobs += start.elapsed();
        for (i, done) in results {
            cores[i].job_done(done);
        }
    }
}

/// One untimed pass on one thread: how much of the wall time is jobs, and the speed-up that
/// leaves for a pool of w workers (Amdahl), printed for docs/BENCHMARKS.md. Needed because
/// this shared machine's CPU share does not grow with a process's thread count.
fn parallel_fraction(protocol: Protocol) {
    let requests: Vec<Vec<u8>> = (0..RRSETS).map(|r| format!("profile rrset {r}").into_bytes()).collect();
    let mut in_jobs = Duration::ZERO;
    let start = Instant::now();
    sign_batch(cores(protocol), &requests, 1, &mut in_jobs);
    let total = start.elapsed();
    let p = in_jobs.as_secs_f64() / total.as_secs_f64();
    let bound = |w: f64| 1.0 / ((1.0 - p) + p / w);
    eprintln!(
        "{protocol:?}: {RRSETS} RRsets x {N} replicas in {total:?}, jobs {in_jobs:?} ({:.1}%): Amdahl speed-up 2 cores {:.2}x, 4 cores {:.2}x, 16 cores {:.2}x",
        100.0 * p,
        bound(2.0),
        bound(4.0),
        bound(16.0)
    );
}

fn zone(c: &mut Criterion) {
    keys();
    for protocol in [Protocol::OptTe, Protocol::Basic] {
        parallel_fraction(protocol);
    }
    for protocol in [Protocol::OptTe, Protocol::Basic] {
        let mut group = c.benchmark_group(format!("sign_{RRSETS}_rrsets_n4_{protocol:?}"));
        group.sample_size(10).sampling_mode(SamplingMode::Flat).measurement_time(Duration::from_secs(20));
        for workers in [1usize, 2] {
            let mut round = 0u64;
            group.bench_function(format!("workers_{workers}"), |b| {
                b.iter_batched(
                    || {
                        round += 1;
                        let requests: Vec<Vec<u8>> = (0..RRSETS).map(|r| format!("round {round} rrset {r}").into_bytes()).collect();
                        (cores(protocol), requests)
                    },
                    |(cores, requests)| {
                        let mut in_jobs = Duration::ZERO;
                        let signed = sign_batch(cores, &requests, workers, &mut in_jobs);
                        assert_eq!(signed, RRSETS * usize::from(N));
                        black_box(signed)
                    },
                    BatchSize::PerIteration,
                )
            });
        }
        group.finish();
    }
}

criterion_group!(benches, zone);
criterion_main!(benches);
