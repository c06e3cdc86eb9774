//! Seeded, deterministic simulation of the threshold-signing protocols between
//! replicas (BASIC, OPT-PROOF, OPT-TE) with Byzantine peers, loss and reordering.
//!
//! Share computations (`Output::Compute`) finish after a seeded random delay in `run`, so they
//! complete out of order as on a worker pool; the hand-driven tests run them at once.
//!
//! Seeds follow the workspace's convention (crates/testkit): `SIM_SEEDS=N` runs N seeds per
//! campaign, `SIM_SEED=S` replays one, and a failure prints the line that replays it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoup_rsa::{KeyShare, PublicKey};
use threshold::{Job, Keys, Limits, Output, Protocol, SignMessage, SignerCore};

const ALG: u8 = 8;

/// One key per (n, k), made once per test binary: key generation is the slow part.
fn keys(n: u16) -> (Arc<PublicKey>, Vec<Arc<KeyShare>>) {
    keys_k(n, (n - 1) / 3 + 1)
}

fn keys_k(n: u16, k: u16) -> (Arc<PublicKey>, Vec<Arc<KeyShare>>) {
    type Dealt = (Arc<PublicKey>, Vec<Arc<KeyShare>>);
    static CACHE: OnceLock<std::sync::Mutex<BTreeMap<(u16, u16), Dealt>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = cache.lock().unwrap();
    map.entry((n, k))
        .or_insert_with(|| {
            let mut rng = ChaCha8Rng::seed_from_u64(u64::from(n) << 16 | u64::from(k));
            let (pk, shares) = shoup_rsa::generate_insecure(512, n, k, &mut rng, &mut |_| {}).unwrap();
            (Arc::new(pk), shares.into_iter().map(Arc::new).collect())
        })
        .clone()
}

/// What a faulty replica does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Honest,
    /// The paper's corrupted replica: every bit of its shares inverted.
    CorruptShares,
    /// Sends nothing at all.
    Silent,
    /// Sends forged final signatures and shares claiming another replica's index.
    Forger,
}

struct Sim {
    rng: ChaCha8Rng,
    cores: Vec<SignerCore>,
    faults: Vec<Fault>,
    /// In flight: (deliver at step, from, to, message).
    queue: Vec<(u64, u16, u16, SignMessage)>,
    done: Vec<BTreeMap<[u8; 32], Vec<u8>>>,
    blamed: Vec<BTreeSet<u16>>,
    now_us: u64,
    loss_per_mille: u32,
    /// Share computations in flight: (finish at, replica, job); `None` runs them at once.
    jobs: Option<Vec<(u64, u16, Job)>>,
    /// Replicas that are stopped: whatever is sent to them is lost.
    down: BTreeSet<u16>,
    /// Retry messages each replica sent, and share jobs each one was asked to run.
    retries_sent: Vec<u64>,
    share_jobs: Vec<u64>,
    /// Named asks through `request_shared` (a whole-zone signing) instead of `request`.
    shared: bool,
}

impl Sim {
    fn new(seed: u64, n: u16, protocol: Protocol, faults: Vec<Fault>, loss_per_mille: u32) -> Sim {
        Sim::with_keys(seed, n, keys(n), protocol, faults, loss_per_mille)
    }

    fn with_keys(seed: u64, n: u16, dealt: (Arc<PublicKey>, Vec<Arc<KeyShare>>), protocol: Protocol, faults: Vec<Fault>, loss_per_mille: u32) -> Sim {
        let (pk, shares) = dealt;
        let cores = (0..n)
            .map(|i| {
                let keys = Keys::new(pk.clone(), shares[usize::from(i)].clone()).unwrap();
                let corrupt = faults[usize::from(i)] == Fault::CorruptShares;
                let limits = Limits { retry_after_us: 50_000, ..Limits::default() };
                SignerCore::new(i, n, protocol, corrupt, keys, limits)
            })
            .collect();
        Sim {
            rng: ChaCha8Rng::seed_from_u64(seed),
            cores,
            faults,
            queue: Vec::new(),
            done: vec![BTreeMap::new(); usize::from(n)],
            blamed: vec![BTreeSet::new(); usize::from(n)],
            now_us: 0,
            loss_per_mille,
            jobs: None,
            down: BTreeSet::new(),
            retries_sent: vec![0; usize::from(n)],
            share_jobs: vec![0; usize::from(n)],
            shared: false,
        }
    }

    fn n(&self) -> u16 {
        self.cores.len() as u16
    }

    fn send(&mut self, from: u16, to: u16, message: SignMessage) {
        if matches!(message, SignMessage::Retry { .. }) {
            self.retries_sent[usize::from(from)] += 1;
        }
        if self.rng.next_u32() % 1000 < self.loss_per_mille || self.down.contains(&to) {
            return;
        }
        let delay = 1 + u64::from(self.rng.next_u32() % 20);
        self.queue.push((self.now_us + delay * 1000, from, to, message));
    }

    fn drain(&mut self, i: u16) {
        while let Some(out) = self.cores[usize::from(i)].poll_output() {
            match out {
                Output::Broadcast { message } => {
                    for to in (0..self.n()).filter(|&j| j != i) {
                        self.emit(i, to, message.clone());
                    }
                }
                Output::Send { to, message } => self.emit(i, to, message),
                Output::Done { digest, signature } => {
                    let prev = self.done[usize::from(i)].insert(digest, signature.clone());
                    assert!(prev.is_none() || prev.as_ref() == Some(&signature), "replica {i} finished a digest twice differently");
                }
                Output::Misbehaved { peer, .. } => {
                    self.blamed[usize::from(i)].insert(peer);
                }
                Output::Compute(job) => {
                    if job.is_share() {
                        self.share_jobs[usize::from(i)] += 1;
                    }
                    match &mut self.jobs {
                        Some(jobs) => {
                            let delay = 1 + u64::from(self.rng.next_u32() % 10);
                            jobs.push((self.now_us + delay * 1000, i, job));
                        }
                        None => self.cores[usize::from(i)].job_done(job.run()),
                    }
                }
                Output::Failed { reason, .. } => panic!("replica {i} could not compute its share: {reason}"),
            }
        }
    }

    /// Faulty replicas' traffic is rewritten here: the core stays honest, its wire does not.
    fn emit(&mut self, from: u16, to: u16, message: SignMessage) {
        match self.faults[usize::from(from)] {
            Fault::Silent => {}
            Fault::Forger => {
                let digest = *message.digest();
                let forged = SignMessage::Final { digest, signature: vec![0x5a; 64] };
                self.send(from, to, forged);
                if let SignMessage::Share { share, .. } = message {
                    // Claim to be replica (from+1) mod n by rewriting the index bytes.
                    let mut s = share;
                    let other = (from + 1) % self.n() + 1;
                    if s.len() >= 2 {
                        s[..2].copy_from_slice(&other.to_be_bytes());
                    }
                    self.send(from, to, SignMessage::Share { digest, share: s });
                }
            }
            Fault::Honest | Fault::CorruptShares => self.send(from, to, message),
        }
    }

    fn run(&mut self, requests: &[Vec<u8>], max_steps: usize) {
        let all: Vec<u16> = (0..self.n()).collect();
        self.run_askers(requests, &all, max_steps);
    }

    /// Only the named of `askers` ask (each for every request, at a random moment from now).
    fn run_askers(&mut self, requests: &[Vec<u8>], askers: &[u16], max_steps: usize) {
        self.jobs.get_or_insert_with(Vec::new);
        let mut asks: Vec<(u64, u16, usize)> = Vec::new();
        for &i in askers {
            for r in 0..requests.len() {
                asks.push((self.now_us + u64::from(self.rng.next_u32() % 40) * 1000, i, r));
            }
        }
        asks.sort();
        let mut asks = asks.into_iter().peekable();
        for _ in 0..max_steps {
            let next_msg = self.queue.iter().map(|q| q.0).min();
            let next_ask = asks.peek().map(|a| a.0);
            let next_timer = self.cores.iter().filter_map(|c| c.poll_timeout()).min();
            let next_job = self.jobs.iter().flatten().map(|j| j.0).min();
            let Some(next) = [next_msg, next_ask, next_timer, next_job].into_iter().flatten().min() else { break };
            self.now_us = self.now_us.max(next);
            if next_job == Some(next) {
                let jobs = self.jobs.as_mut().expect("set above");
                let pick = (0..jobs.len()).find(|&k| jobs[k].0 <= self.now_us).expect("one is due");
                let (_, i, job) = jobs.swap_remove(pick);
                self.cores[usize::from(i)].job_done(job.run());
                self.drain(i);
            } else if next_ask == Some(next) {
                let (_, i, r) = asks.next().unwrap();
                let core = &mut self.cores[usize::from(i)];
                if self.shared {
                    core.request_shared(self.now_us, ALG, &requests[r]).unwrap();
                } else {
                    core.request(self.now_us, ALG, &requests[r]).unwrap();
                }
                self.drain(i);
            } else if next_msg == Some(next) {
                // Deliver one of the due messages at random: reordering.
                let due: Vec<usize> = (0..self.queue.len()).filter(|&k| self.queue[k].0 <= self.now_us).collect();
                let pick = due[self.rng.next_u32() as usize % due.len()];
                let (_, from, to, message) = self.queue.swap_remove(pick);
                self.cores[usize::from(to)].handle_message(self.now_us, from, message);
                self.drain(to);
            } else {
                for i in 0..self.n() {
                    if self.cores[usize::from(i)].poll_timeout().is_some_and(|t| t <= self.now_us) {
                        self.cores[usize::from(i)].handle_timeout(self.now_us);
                        self.drain(i);
                    }
                }
            }
            let honest_done =
                askers.iter().copied().filter(|&i| self.faults[usize::from(i)] == Fault::Honest).all(|i| self.done[usize::from(i)].len() == requests.len());
            if honest_done && asks.peek().is_none() {
                return;
            }
        }
    }
}

fn check(seed: u64, n: u16, protocol: Protocol, faults: Vec<Fault>, loss: u32) {
    check_mode(seed, n, protocol, faults, loss, false);
}

fn check_mode(seed: u64, n: u16, protocol: Protocol, faults: Vec<Fault>, loss: u32, shared: bool) {
    let (pk, _) = keys(n);
    let requests: Vec<Vec<u8>> = (0..3).map(|r| format!("rrset {r} of seed {seed}").into_bytes()).collect();
    let mut sim = Sim::new(seed, n, protocol, faults.clone(), loss);
    sim.shared = shared;
    sim.run(&requests, 200_000);
    let ctx = format!("seed {seed} n {n} {protocol:?} faults {faults:?} loss {loss}‰ shared {shared}\n  {}", campaign(0).reproduce(seed));
    for i in 0..n {
        if faults[usize::from(i)] != Fault::Honest {
            continue;
        }
        let done = &sim.done[usize::from(i)];
        assert_eq!(done.len(), requests.len(), "honest replica {i} did not finish: {ctx}");
        for data in &requests {
            let digest = SignerCore::digest(ALG, data);
            let sig = done.get(&digest).unwrap_or_else(|| panic!("no signature for a request at {i}: {ctx}"));
            // Independent check: a standard RSA PKCS#1 v1.5 verification.
            let msg = pk.encode_message(shoup_rsa::HashAlg::Sha256, data).unwrap();
            assert!(pk.verify(&msg, &shoup_rsa::Signature(sig.clone())), "bad signature at {i}: {ctx}");
        }
        for blamed in &sim.blamed[usize::from(i)] {
            assert_ne!(faults[usize::from(*blamed)], Fault::Honest, "honest replica {i} blamed honest {blamed}: {ctx}");
        }
    }
}

/// The running test's campaign (libtest names the thread after the test).
fn campaign(ci_count: u64) -> testkit::Campaign {
    testkit::Campaign::here("threshold", "signing_sim", ci_count)
}

fn seeds(ci_count: u64) -> Vec<u64> {
    campaign(ci_count).seeds()
}

fn faults_for(n: u16, kinds: &[Fault]) -> Vec<Fault> {
    let mut f = vec![Fault::Honest; usize::from(n)];
    for (slot, kind) in kinds.iter().enumerate() {
        // Spread faulty replicas over the ids, 1 first (never only the lowest).
        f[(1 + 2 * slot) % usize::from(n)] = *kind;
    }
    f
}

#[test]
fn all_protocols_all_honest_with_loss() {
    for seed in seeds(6) {
        for n in [1u16, 4, 7] {
            for protocol in [Protocol::Basic, Protocol::OptProof, Protocol::OptTe] {
                check(seed, n, protocol, faults_for(n, &[]), 100);
            }
        }
    }
}

#[test]
fn corrupted_shares_up_to_t() {
    for seed in seeds(6) {
        for (n, kinds) in [(4u16, vec![Fault::CorruptShares]), (7, vec![Fault::CorruptShares, Fault::CorruptShares])] {
            for protocol in [Protocol::Basic, Protocol::OptProof, Protocol::OptTe] {
                check(seed, n, protocol, faults_for(n, &kinds), 50);
            }
        }
    }
}

#[test]
fn silent_and_forging_replicas() {
    for seed in seeds(6) {
        for (n, kinds) in [(4u16, vec![Fault::Silent]), (4, vec![Fault::Forger]), (7, vec![Fault::Forger, Fault::Silent])] {
            for protocol in [Protocol::Basic, Protocol::OptProof, Protocol::OptTe] {
                check(seed, n, protocol, faults_for(n, &kinds), 50);
            }
        }
    }
}

/// The whole matrix again with shared sessions (a whole-zone signing): designated replicas
/// that lie, corrupt their shares or stay silent only cost a fallback.
#[test]
fn shared_sessions_all_protocols_with_faults_and_loss() {
    for seed in seeds(4) {
        for (n, kinds) in [
            (1u16, vec![]),
            (4, vec![]),
            (4, vec![Fault::CorruptShares]),
            (4, vec![Fault::Silent]),
            (4, vec![Fault::Forger]),
            (7, vec![Fault::Forger, Fault::Silent]),
            (7, vec![Fault::CorruptShares, Fault::CorruptShares]),
        ] {
            for protocol in [Protocol::Basic, Protocol::OptProof, Protocol::OptTe] {
                check_mode(seed, n, protocol, faults_for(n, &kinds), 50, true);
            }
        }
    }
}

#[test]
fn shared_sessions_compute_k_shares_and_one_combination_per_signature() {
    for seed in seeds(4) {
        for n in [4u16, 7] {
            let k = u64::from((n - 1) / 3 + 1);
            let requests: Vec<Vec<u8>> = (0..24).map(|r| format!("rrset {r} of seed {seed}").into_bytes()).collect();
            let mut sim = Sim::new(seed, n, Protocol::OptTe, vec![Fault::Honest; usize::from(n)], 0);
            sim.shared = true;
            sim.run(&requests, 200_000);
            let ctx = format!("seed {seed} n {n}");
            for i in 0..usize::from(n) {
                assert_eq!(sim.done[i].len(), requests.len(), "replica {i} did not finish: {ctx}");
                assert_eq!(sim.cores[i].stats().shared_fallbacks, 0, "replica {i} fell back with every replica honest: {ctx}");
            }
            let shares: u64 = sim.share_jobs.iter().sum();
            assert_eq!(shares, k * requests.len() as u64, "k shares per signature over the cluster: {ctx}");
            let spared: u64 = sim.cores.iter().map(|c| c.stats().shares_spared).sum();
            assert_eq!(spared, (u64::from(n) - k) * requests.len() as u64, "{ctx}");
            // Every replica is designated about equally often (the start comes from the digest).
            assert!(sim.share_jobs.iter().all(|&jobs| jobs > 0), "a replica never designated: {:?} {ctx}", sim.share_jobs);
        }
    }
}

#[test]
fn a_faulty_designated_replica_is_suspected_and_passed_over() {
    // Replica 1 sends nothing, corrupts its shares, or forges. The first signatures it was
    // designated for wait for the fallback; once suspected (for what it failed to send, or
    // blamed for what it sent), it is no longer designated, so a second round of requests
    // needs no fallback at all.
    for fault in [Fault::Silent, Fault::CorruptShares, Fault::Forger] {
        for protocol in [Protocol::OptTe, Protocol::OptProof, Protocol::Basic] {
            let n = 4;
            let faults = faults_for(n, &[fault]);
            let mut sim = Sim::new(3, n, protocol, faults.clone(), 0);
            sim.shared = true;
            let ctx = format!("{fault:?} {protocol:?}");
            let first: Vec<Vec<u8>> = (0..16).map(|r| format!("first {r}").into_bytes()).collect();
            sim.run(&first, 200_000);
            let honest: Vec<usize> = (0..usize::from(n)).filter(|&i| faults[i] == Fault::Honest).collect();
            let fallbacks = |sim: &Sim| honest.iter().map(|&i| sim.cores[i].stats().shared_fallbacks).sum::<u64>();
            let after_first = fallbacks(&sim);
            let second: Vec<Vec<u8>> = (0..16).map(|r| format!("second {r}").into_bytes()).collect();
            sim.run(&second, 200_000);
            for &i in &honest {
                assert_eq!(sim.done[i].len(), first.len() + second.len(), "honest replica {i} did not finish: {ctx}");
                for blamed in &sim.blamed[i] {
                    assert_eq!(faults[usize::from(*blamed)], fault, "honest replica {i} blamed honest {blamed}: {ctx}");
                }
            }
            assert_eq!(fallbacks(&sim), after_first, "the suspected replica was designated again within its suspicion: {ctx}");
            if fault == Fault::Silent {
                assert!(after_first > 0, "no session waited for the silent replica: was it never designated? {ctx}");
            }
        }
    }
}

#[test]
fn corrupted_replicas_are_blamed_by_opt_te() {
    // Replica 0 gets the corrupted replica 1's share before an honest one: its first
    // 2-subset fails, the next succeeds, and the bad share is named.
    let n = 4;
    let faults = vec![Fault::Honest, Fault::CorruptShares, Fault::Honest, Fault::Honest];
    let mut sim = Sim::new(7, n, Protocol::OptTe, faults, 0);
    let data = b"blame me";
    for i in 0..n {
        sim.cores[usize::from(i)].request(0, ALG, data).unwrap();
        sim.drain(i);
    }
    let share_from = |sim: &Sim, from: u16| sim.queue.iter().find(|q| q.1 == from && q.2 == 0 && matches!(q.3, SignMessage::Share { .. })).unwrap().3.clone();
    let bad = share_from(&sim, 1);
    let good = share_from(&sim, 2);
    sim.cores[0].handle_message(1, 1, bad);
    sim.drain(0);
    assert!(sim.done[0].is_empty(), "own share plus a corrupted one cannot verify");
    sim.cores[0].handle_message(2, 2, good);
    sim.drain(0);
    assert_eq!(sim.done[0].len(), 1, "an honest pair among three shares combines");
    assert_eq!(sim.blamed[0], BTreeSet::from([1]), "exactly the corrupted replica is blamed");
}

/// Once replica 0 has blamed the corrupted replica 1, OPT-TE tries the others' shares first:
/// in the next session the first subset with the honest share combines (one trial), where
/// trials in id order began with the corrupted share again (two, and a check of the rest).
#[test]
fn opt_te_tries_the_shares_of_blamed_replicas_last() {
    let n = 4;
    let faults = vec![Fault::Honest, Fault::CorruptShares, Fault::Honest, Fault::Honest];
    let mut sim = Sim::new(7, n, Protocol::OptTe, faults, 0);
    let mut trials = Vec::new();
    for (now_us, data) in [(1, &b"first"[..]), (3, &b"second"[..])] {
        let mut digest = None;
        for i in 0..n {
            let d = sim.cores[usize::from(i)].request(now_us, ALG, data).unwrap();
            digest.get_or_insert(d);
            sim.drain(i);
        }
        let share_from = |sim: &Sim, from: u16| {
            sim.queue.iter().find(|q| q.1 == from && q.2 == 0 && matches!(&q.3, SignMessage::Share { digest: d, .. } if Some(*d) == digest)).unwrap().3.clone()
        };
        let (bad, good) = (share_from(&sim, 1), share_from(&sim, 2));
        let before = sim.cores[0].stats().subsets_tried;
        sim.cores[0].handle_message(now_us, 1, bad);
        sim.drain(0);
        sim.cores[0].handle_message(now_us, 2, good);
        sim.drain(0);
        assert!(sim.done[0].contains_key(&digest.unwrap()), "{data:?} signed");
        trials.push(sim.cores[0].stats().subsets_tried - before);
    }
    // Each session: {0, 1} fails when the bad share comes first. Then the first session tries
    // {0, 1} again and {0, 2}; the second, with 1 blamed, {0, 2} alone.
    assert_eq!(trials, vec![3, 2]);
    assert_eq!(sim.blamed[0], BTreeSet::from([1]), "exactly the corrupted replica is blamed");
}

#[test]
fn no_share_for_data_not_asked_locally() {
    // Replica 1 asks for a signature nobody else's named asked for; it must not get
    // one, and no honest replica may send a share for it.
    let n = 4;
    let mut sim = Sim::new(1, n, Protocol::OptTe, vec![Fault::Honest; 4], 0);
    let digest = sim.cores[1].request(0, ALG, b"only replica 1 wants this").unwrap();
    sim.drain(1);
    for step in 0..2000u64 {
        sim.now_us += 10_000;
        let due: Vec<_> = std::mem::take(&mut sim.queue);
        for (_, from, to, message) in due {
            if from != 1 && message.digest() == &digest {
                assert!(
                    !matches!(message, SignMessage::Share { .. } | SignMessage::Final { .. }),
                    "replica {from} helped sign data it was not asked for (step {step})"
                );
            }
            sim.cores[usize::from(to)].handle_message(sim.now_us, from, message);
            sim.drain(to);
        }
        sim.cores[1].handle_timeout(sim.now_us);
        sim.drain(1);
    }
    assert!(sim.done[1].is_empty(), "one replica alone obtained a signature");
}

#[test]
fn final_signatures_are_cached_for_replays() {
    let n = 4;
    let mut sim = Sim::new(3, n, Protocol::OptTe, vec![Fault::Honest; 4], 0);
    let requests = vec![b"replayed later".to_vec()];
    sim.run(&requests, 100_000);
    let digest = SignerCore::digest(ALG, &requests[0]);
    let first = sim.done[2][&digest].clone();
    sim.done[2].clear();
    // A replay of the same write asks again: answered from the cache, no new round.
    sim.cores[2].request(sim.now_us, ALG, &requests[0]).unwrap();
    assert!(matches!(sim.cores[2].poll_output(), Some(Output::Done { signature, .. }) if signature == first));
    assert!(sim.cores[2].poll_output().is_none(), "a cached signature needs no messages");
}

#[test]
fn same_seed_same_run() {
    let run = |seed| {
        let mut sim = Sim::new(seed, 4, Protocol::OptProof, faults_for(4, &[Fault::CorruptShares]), 100);
        sim.run(&[b"a".to_vec(), b"b".to_vec()], 100_000);
        (sim.now_us, sim.done.clone(), sim.blamed.clone())
    };
    assert_eq!(run(11), run(11));
}

#[test]
fn threshold_above_2t_plus_1_still_signs() {
    // A dealer may ask for more shares than t+1 (here k = n = 4): every protocol must
    // still gather k shares, OPT-TE included.
    for protocol in [Protocol::Basic, Protocol::OptProof, Protocol::OptTe] {
        let dealt = keys_k(4, 4);
        let pk = dealt.0.clone();
        let mut sim = Sim::with_keys(5, 4, dealt, protocol, vec![Fault::Honest; 4], 0);
        let data = b"k equals n".to_vec();
        sim.run(std::slice::from_ref(&data), 100_000);
        let digest = SignerCore::digest(ALG, &data);
        for i in 0..4 {
            let sig = sim.done[i].get(&digest).unwrap_or_else(|| panic!("{protocol:?}: replica {i} did not sign with k = n"));
            let msg = pk.encode_message(shoup_rsa::HashAlg::Sha256, &data).unwrap();
            assert!(pk.verify(&msg, &shoup_rsa::Signature(sig.clone())));
        }
    }
}

#[test]
fn early_proof_request_is_answered_when_named_asks() {
    // OPT-PROOF: replica 0 has fallen back to proofs and asks replica 2 before replica 2's
    // named has asked for the same data. Replica 2 must send its proven share as soon as
    // its named asks, without waiting for replica 0's next retry.
    let n = 4;
    let mut sim = Sim::new(9, n, Protocol::OptProof, vec![Fault::Honest; 4], 0);
    let data = b"asked early";
    let digest = SignerCore::digest(ALG, data);
    sim.cores[2].handle_message(0, 0, SignMessage::Retry { digest, proof: true });
    sim.drain(2);
    assert!(sim.queue.is_empty(), "nothing may be issued before replica 2's own named asks");
    sim.cores[2].request(1, ALG, data).unwrap();
    sim.drain(2);
    let proven_to_0 = sim.queue.iter().any(|q| {
        q.1 == 2
            && q.2 == 0
            && matches!(&q.3, SignMessage::Share { digest: d, share } if d == &digest && {
                let pk = keys(n).0;
                shoup_rsa::SignatureShare::from_bytes(&pk, share).map(|s| s.proof.is_some()).unwrap_or(false)
            })
    });
    assert!(proven_to_0, "replica 2 did not send replica 0 its proven share at once");
}

#[test]
fn a_retry_makes_only_designated_replicas_compute_shares() {
    // A shared session (whole-zone signing), n = 4, k = 2: a peer's Retry{proof} is answered
    // by a designated replica (its proven share) and ignored by the others until their own
    // session has fallen back.
    for protocol in [Protocol::OptProof, Protocol::OptTe, Protocol::Basic] {
        let n = 4;
        let mut sim = Sim::new(11, n, protocol, vec![Fault::Honest; 4], 0);
        let data = b"signed in a whole-zone signing";
        let digest = SignerCore::digest(ALG, data);
        // Designation as the core makes it with no suspects: k ids from a start the digest gives.
        let start = u16::from_be_bytes([digest[0], digest[1]]) % n;
        let (maker, idle, asker) = ((start + 1) % n, (start + 2) % n, (start + 3) % n);
        let ctx = format!("{protocol:?}: maker {maker}, not designated {idle}");
        for i in [maker, idle] {
            sim.cores[usize::from(i)].request_shared(0, ALG, data).unwrap();
            sim.drain(i);
        }
        let jobs = sim.share_jobs.clone();
        assert_eq!(jobs[usize::from(idle)], 0, "a replica not designated computes nothing: {ctx}");
        let proven_to_asker = |sim: &Sim, from: u16| {
            sim.queue.iter().any(|q| {
                q.1 == from
                    && q.2 == asker
                    && matches!(&q.3, SignMessage::Share { digest: d, share } if d == &digest && {
                        shoup_rsa::SignatureShare::from_bytes(&keys(n).0, share).map(|s| s.proof.is_some()).unwrap_or(false)
                    })
            })
        };
        for i in [maker, idle] {
            sim.cores[usize::from(i)].handle_message(1, asker, SignMessage::Retry { digest, proof: true });
            sim.drain(i);
        }
        assert_eq!(sim.share_jobs[usize::from(idle)], 0, "a peer's retry made a replica not designated compute a share: {ctx}");
        assert_eq!(sim.cores[usize::from(idle)].stats().retries_ignored, 1, "{ctx}");
        assert!(!sim.queue.iter().any(|q| q.1 == idle), "the replica not designated answered: {ctx}");
        assert!(proven_to_asker(&sim, maker), "the designated replica sends its proven share: {ctx}");
        assert_eq!(sim.cores[usize::from(maker)].stats().retries_ignored, 0, "{ctx}");
        // After its own fallback the session is an ordinary one: the share is made, and a
        // retry is answered with proof.
        let later = Limits::default().shared_fallback_us + 1;
        sim.cores[usize::from(idle)].handle_timeout(later);
        sim.drain(idle);
        assert!(sim.share_jobs[usize::from(idle)] > 0, "the fallback makes its share: {ctx}");
        sim.cores[usize::from(idle)].handle_message(later, asker, SignMessage::Retry { digest, proof: true });
        sim.drain(idle);
        assert!(proven_to_asker(&sim, idle), "after its fallback it answers with its proven share: {ctx}");
        assert_eq!(sim.cores[usize::from(idle)].stats().retries_ignored, 1, "{ctx}");
    }
}

#[test]
fn shares_of_different_sessions_are_asked_for_at_once() {
    // What lets a driver use every core: the core hands out one share job per session
    // without waiting for any of them, and takes their results in any order.
    let n = 4;
    let (pk, shares) = keys(n);
    let mut core = SignerCore::new(0, n, Protocol::OptTe, false, Keys::new(pk, shares[0].clone()).unwrap(), Limits::default());
    let requests: Vec<Vec<u8>> = (0..5).map(|r| format!("rrset {r}").into_bytes()).collect();
    for data in &requests {
        core.request(0, ALG, data).unwrap();
    }
    let mut jobs = Vec::new();
    while let Some(out) = core.poll_output() {
        match out {
            Output::Compute(job) => jobs.push(job),
            other => panic!("nothing but share jobs before a share exists: {other:?}"),
        }
    }
    assert_eq!(jobs.len(), requests.len(), "one share job per session, all at once");
    assert!(jobs.iter().all(|j| j.is_share()));
    // Finish them in reverse order: each session broadcasts its own share.
    for job in jobs.into_iter().rev() {
        let digest = job.digest;
        core.job_done(job.run());
        let sent = std::iter::from_fn(|| core.poll_output())
            .any(|out| matches!(out, Output::Broadcast { message: SignMessage::Share { digest: d, .. } } if d == digest));
        assert!(sent, "a finished share is broadcast for its own session");
    }
}

/// Replicas 0..3 sign while replica 3 is stopped (everything sent to it is lost); replica 3's
/// named asks for the same signatures seconds later, as when it replays the writes it missed.
/// Returns the simulation after replica 3 finished, and when it started asking.
fn late_joiner(seed: u64, protocol: Protocol, faults: Vec<Fault>) -> (Sim, u64, Vec<Vec<u8>>) {
    let n = 4;
    let late = 3u16;
    let requests: Vec<Vec<u8>> = (0..5).map(|r| format!("missed write {r} of seed {seed}").into_bytes()).collect();
    let mut sim = Sim::new(seed, n, protocol, faults, 0);
    // Retries far beyond anything the test waits for: finishing cannot be their doing.
    for (i, core) in sim.cores.iter_mut().enumerate() {
        let keys = keys(n);
        let k = Keys::new(keys.0.clone(), keys.1[i].clone()).unwrap();
        let corrupt = sim.faults[i] == Fault::CorruptShares;
        *core = SignerCore::new(i as u16, n, protocol, corrupt, k, Limits { retry_after_us: 60_000_000, ..Limits::default() });
    }
    sim.down.insert(late);
    let live: Vec<u16> = (0..n).filter(|&i| i != late).collect();
    sim.run_askers(&requests, &live, 100_000);
    for &i in &live {
        if sim.faults[usize::from(i)] == Fault::Honest {
            assert_eq!(sim.done[usize::from(i)].len(), requests.len(), "live replica {i} did not finish (seed {seed})");
        }
    }
    assert!(sim.queue.iter().all(|q| q.2 != late), "nothing reaches a stopped replica");
    sim.now_us += 5_000_000;
    sim.down.clear();
    let start = sim.now_us;
    sim.run_askers(&requests, &[late], 100_000);
    (sim, start, requests)
}

#[test]
fn late_replica_gets_finished_signatures_without_retrying() {
    for seed in seeds(4) {
        for protocol in [Protocol::Basic, Protocol::OptProof, Protocol::OptTe] {
            for faults in [faults_for(4, &[]), vec![Fault::Honest, Fault::Forger, Fault::Honest, Fault::Honest]] {
                let ctx = format!("seed {seed} {protocol:?} {faults:?}");
                let (sim, start, requests) = late_joiner(seed, protocol, faults.clone());
                let (pk, _) = keys(4);
                let done = &sim.done[3];
                assert_eq!(done.len(), requests.len(), "the late replica did not finish: {ctx}");
                for data in &requests {
                    let msg = pk.encode_message(shoup_rsa::HashAlg::Sha256, data).unwrap();
                    let sig = &done[&SignerCore::digest(ALG, data)];
                    assert!(pk.verify(&msg, &shoup_rsa::Signature(sig.clone())), "bad signature taken: {ctx}");
                }
                // Asks spread over 40 ms, a share job of at most 10 ms, two hops of at most
                // 20 ms: well under a second, where the first retry would be a minute away.
                assert!(sim.now_us - start < 200_000, "took {} µs: {ctx}", sim.now_us - start);
                assert_eq!(sim.retries_sent[3], 0, "the late replica had to retry: {ctx}");
                assert!(sim.cores[0].stats().late_answered > 0, "replica 0 never answered a late share: {ctx}");
                if faults[1] == Fault::Forger {
                    assert!(sim.blamed[3].iter().all(|&b| b == 1), "only the forger is blamed: {ctx}");
                }
            }
        }
    }
}

#[test]
fn finished_signature_received_while_behind_spares_the_share() {
    // Replica 3 is running but its named has not asked yet (it is replaying older writes):
    // the final signatures broadcast meanwhile are kept, and when its named asks it is done
    // at once, with no share computed and nothing sent.
    let n = 4;
    let mut sim = Sim::new(21, n, Protocol::OptTe, vec![Fault::Honest; 4], 0);
    let requests = vec![b"applied elsewhere first".to_vec()];
    sim.run_askers(&requests, &[0, 1, 2], 100_000);
    // Deliver what is still in flight (shares and finals to replica 3).
    while !sim.queue.is_empty() {
        let (_, from, to, message) = sim.queue.remove(0);
        sim.cores[usize::from(to)].handle_message(sim.now_us, from, message);
        sim.drain(to);
    }
    assert!(sim.done[3].is_empty());
    assert_eq!(sim.share_jobs[3], 0, "no share before the local named asks");
    sim.cores[3].request(sim.now_us, ALG, &requests[0]).unwrap();
    sim.drain(3);
    assert_eq!(sim.done[3].len(), 1, "the kept final signature ends the session");
    assert_eq!(sim.share_jobs[3], 0, "no share computed for a signature already held");
    assert!(sim.queue.is_empty(), "nothing sent for a signature already held");
}

#[test]
fn shares_arriving_just_after_finishing_are_not_answered() {
    // In a live cluster the last shares arrive while everyone's broadcast final is on the
    // wire: answering each with the final again would only double the traffic.
    for seed in seeds(4) {
        let mut sim = Sim::new(seed, 4, Protocol::OptTe, vec![Fault::Honest; 4], 0);
        sim.run(&[b"live".to_vec(), b"traffic".to_vec()], 100_000);
        let answered: u64 = sim.cores.iter().map(|c| c.stats().late_answered).sum();
        assert_eq!(answered, 0, "seed {seed}: live shares answered with finals");
    }
}
