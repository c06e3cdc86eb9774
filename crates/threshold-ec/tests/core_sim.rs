//! A seeded simulation of n = 4 and 7 `EcSignerCore`s (Ed25519 and ECDSA P-256) over a network
//! that loses, delays (so reorders), duplicates and partitions messages, with jobs finishing in
//! any order and named Byzantine peers: silent, garbage bytes, wrong shares, equivocating
//! commitments, forged and replayed final signatures, a flood of early messages for many
//! digests, and cores that corrupt their own shares (`--corrupt`). Asserted: every honest replica that requested gets `Done` with the same bytes, which
//! the standard verifier accepts (and which equal an all-honest run's for the same data); no
//! honest replica is ever reported; liars whose lie a replica provably saw are reported; the
//! early stash and the session table stay within their bounds under flooding.
//!
//! Seeds follow the workspace's convention (crates/testkit): `SIM_SEEDS=N` runs N seeds per
//! campaign, `SIM_SEED=S` replays one, and a failure prints the line that replays it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};

use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use testkit::Noise;
use threshold_ec::{deal, digest_of, Algorithm, Digest, EcJobDone, EcLimits, EcOutput, EcRequestError, EcSignMessage, EcSignerCore, KeyShare, PublicKey};

type Dealt = (Arc<PublicKey>, Arc<Vec<KeyShare>>);
/// Per (algorithm, n), computed once per test binary.
type Cache<T> = OnceLock<Mutex<BTreeMap<(u8, u16), T>>>;

/// One key per (algorithm, n), dealt once per test binary from a fixed seed.
fn keys(alg: Algorithm, n: u16) -> Dealt {
    static CACHE: Cache<Dealt> = OnceLock::new();
    let mut map = CACHE.get_or_init(Default::default).lock().unwrap();
    map.entry((alg.number(), n))
        .or_insert_with(|| {
            let mut rng = ChaCha20Rng::seed_from_u64(u64::from(alg.number()) << 16 | u64::from(n));
            let (pk, shares) = deal(alg, n, (n - 1) / 3, &mut rng).unwrap();
            (Arc::new(pk), Arc::new(shares))
        })
        .clone()
}

/// The standard verifiers, independent of the crate's own checks.
fn standard_verify(pk: &PublicKey, data: &[u8], signature: &[u8]) -> bool {
    let Ok(signature) = <[u8; 64]>::try_from(signature) else { return false };
    match pk.algorithm() {
        Algorithm::Ed25519 => {
            let key = ed25519_dalek::VerifyingKey::from_bytes(pk.dnskey_public_key().try_into().unwrap()).unwrap();
            key.verify_strict(data, &ed25519_dalek::Signature::from_bytes(&signature)).is_ok()
        }
        Algorithm::EcdsaP256Sha256 => {
            use p256::ecdsa::signature::Verifier as _;
            let mut sec1 = vec![4u8];
            sec1.extend(pk.dnskey_public_key());
            let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1).unwrap();
            let Ok(signature) = p256::ecdsa::Signature::from_slice(&signature) else { return false };
            key.verify(data, &signature).is_ok()
        }
    }
}

/// r ‖ (q − s): the twin the standard ECDSA verifier accepts as well.
fn ecdsa_twin(signature: &[u8]) -> Vec<u8> {
    use p256::elliptic_curve::PrimeField;
    let s: [u8; 32] = signature[32..64].try_into().unwrap();
    let s = p256::Scalar::from_repr(s.into()).unwrap();
    let mut out = signature[..32].to_vec();
    out.extend_from_slice(&(-s).to_repr());
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    Honest,
    /// Sends nothing.
    Silent,
    /// Every message replaced by noise of another length (or with an unknown tag).
    Garbage,
    /// Shares off by one bit (ECDSA: μ and σ), proofs left as they were.
    WrongShares,
    /// Commitments with two points swapped (valid points, wrong sets) to odd-numbered peers,
    /// the honest ones to the others.
    Equivocate,
    /// Honest rounds, but final signatures that are noise, another digest's signature, or the
    /// ECDSA twin −s, early and late.
    ForgedFinals,
    /// Honest rounds, plus well-framed rounds and finals for many digests nobody asked for.
    Flooder,
    /// The core's own fault injection (`EcSignerCore::with_corrupt`, what `--corrupt` sets):
    /// its shares go out corrupted by the core, nothing rewritten on the wire.
    Corrupt,
}

const FAULTY: [Behaviour; 6] =
    [Behaviour::Silent, Behaviour::Garbage, Behaviour::WrongShares, Behaviour::Equivocate, Behaviour::ForgedFinals, Behaviour::Flooder];

struct Replica {
    core: EcSignerCore,
    behaviour: Behaviour,
    done: BTreeMap<Digest, Vec<u8>>,
    /// Peers this replica reported, with the first reason.
    reported: BTreeMap<u16, &'static str>,
    failed: Vec<String>,
}

enum Event {
    Deliver { from: u16, to: u16, message: EcSignMessage },
    Job { at: u16, done: EcJobDone },
    Request { at: u16, item: usize },
}

struct Sim {
    alg: Algorithm,
    n: u16,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    noise: Noise,
    replicas: Vec<Replica>,
    items: Vec<Vec<u8>>,
    limits: EcLimits,
    /// (isolated replica, from, until): its links carry nothing meanwhile.
    partition: Option<(u16, u64, u64)>,
    /// Messages from garbage senders and forgers delivered to honest replicas: (to, from,
    /// message), judged after the run (a forger's replay may happen to be the right bytes).
    suspicious: Vec<(u16, u16, EcSignMessage)>,
}

/// Small bounds, so that the flooder meets them.
fn sim_limits() -> EcLimits {
    EcLimits {
        max_sessions: 16,
        early_digests: 48,
        early_per_peer: 8,
        early_bytes: 256 << 10,
        finals_cache: 64,
        retry_after_us: 200_000,
        ..EcLimits::default()
    }
}

impl Sim {
    fn new(alg: Algorithm, n: u16, behaviours: &[Behaviour], items: Vec<Vec<u8>>, seed: u64) -> Sim {
        let (pk, shares) = keys(alg, n);
        let limits = sim_limits();
        let replicas = (0..n)
            .map(|i| Replica {
                core: EcSignerCore::new(i, pk.clone(), Arc::new(shares[usize::from(i)].clone()), limits.clone())
                    .unwrap()
                    .with_corrupt(behaviours[usize::from(i)] == Behaviour::Corrupt),
                behaviour: behaviours[usize::from(i)],
                done: BTreeMap::new(),
                reported: BTreeMap::new(),
                failed: Vec::new(),
            })
            .collect();
        let mut sim =
            Sim { alg, n, now: 0, seq: 0, queue: BTreeMap::new(), noise: Noise::new(seed), replicas, items, limits, partition: None, suspicious: Vec::new() };
        for at in 0..n {
            for item in 0..sim.items.len() {
                // Most requests within 30 ms, some much later (a replica behind the others).
                let late = if sim.noise.below(4) == 0 { 300_000 + sim.noise.below(1_200_000) } else { 0 };
                let when = sim.noise.below(30_000) + late;
                sim.schedule(when, Event::Request { at, item });
            }
        }
        if sim.noise.below(2) == 0 {
            let from = sim.noise.below(200_000);
            sim.partition = Some((sim.noise.below(u64::from(n)) as u16, from, from + 200_000 + sim.noise.below(1_300_000)));
        }
        sim
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((at, self.seq), event);
    }

    fn honest(&self, i: u16) -> bool {
        self.replicas[usize::from(i)].behaviour == Behaviour::Honest
    }

    fn cut(&self, a: u16, b: u16) -> bool {
        self.partition.is_some_and(|(p, from, until)| (a == p || b == p) && (from..until).contains(&self.now))
    }

    /// Loss 5 %, duplication 3 %, delays 0.1–5 ms with one in twenty up to 100 ms.
    fn transmit(&mut self, from: u16, to: u16, message: EcSignMessage) {
        let copies = if self.noise.below(100) < 3 { 2 } else { 1 };
        for _ in 0..copies {
            if self.noise.below(100) < 5 {
                continue;
            }
            let delay = if self.noise.below(20) == 0 { self.noise.below(100_000) } else { 100 + self.noise.below(4_900) };
            self.schedule(self.now + delay, Event::Deliver { from, to, message: message.clone() });
        }
    }

    /// What replica `from` puts on the wire for `message` to `to`, by its behaviour.
    fn send(&mut self, from: u16, to: u16, message: EcSignMessage) {
        let behaviour = self.replicas[usize::from(from)].behaviour;
        let alg = self.alg;
        let rewritten = match (behaviour, message) {
            (Behaviour::Silent, _) => None,
            (Behaviour::Garbage, EcSignMessage::Round { digest, body }) => {
                let extra = 1 + self.noise.below(40) as usize;
                let mut bytes = self.noise.bytes(body.len() + extra);
                if self.noise.below(2) == 0 {
                    bytes[0] = 3 + (bytes[0] % 200);
                }
                Some(EcSignMessage::Round { digest, body: bytes })
            }
            (Behaviour::Garbage, EcSignMessage::Final { digest, .. }) => Some(EcSignMessage::Final { digest, signature: self.noise.bytes(63) }),
            (Behaviour::WrongShares, EcSignMessage::Round { digest, mut body }) => {
                let len = body.len();
                match (alg, body[0]) {
                    (Algorithm::Ed25519, 2) => body[1] ^= 1,
                    (Algorithm::EcdsaP256Sha256, 2) => body[1 + 31] ^= 1,
                    (Algorithm::EcdsaP256Sha256, 1) => body[len - 96 - 1] ^= 1,
                    _ => {}
                }
                Some(EcSignMessage::Round { digest, body })
            }
            (Behaviour::Equivocate, EcSignMessage::Round { digest, mut body }) if body[0] == 1 && to % 2 == 1 => {
                let (start, len) = if alg == Algorithm::Ed25519 { (1, 32) } else { (3, 33) };
                let first: Vec<u8> = body[start..start + len].to_vec();
                body.copy_within(start + len..start + 2 * len, start);
                body[start + len..start + 2 * len].copy_from_slice(&first);
                Some(EcSignMessage::Round { digest, body })
            }
            (Behaviour::ForgedFinals, EcSignMessage::Final { digest, signature }) => {
                Some(EcSignMessage::Final { digest, signature: self.forgery(from, &digest, &signature) })
            }
            (Behaviour::ForgedFinals, EcSignMessage::Round { digest, body }) => {
                // An early forged final with every first message.
                if body[0] == 1 {
                    let noise = self.noise.bytes(64);
                    let signature = self.forgery(from, &digest, &noise);
                    self.transmit(from, to, EcSignMessage::Final { digest, signature });
                }
                Some(EcSignMessage::Round { digest, body })
            }
            (Behaviour::Flooder, message) => {
                if let EcSignMessage::Round { body, .. } = &message {
                    for _ in 0..6 {
                        let mut bytes = self.noise.bytes(body.len());
                        bytes[0] = body[0];
                        let digest: Digest = self.noise.bytes(32).try_into().unwrap();
                        self.transmit(from, to, EcSignMessage::Round { digest, body: bytes });
                        let digest: Digest = self.noise.bytes(32).try_into().unwrap();
                        let signature = self.noise.bytes(64);
                        self.transmit(from, to, EcSignMessage::Final { digest, signature });
                    }
                }
                Some(message)
            }
            (_, message) => Some(message),
        };
        if let Some(message) = rewritten {
            self.transmit(from, to, message);
        }
    }

    /// A final signature that is not the session's: the ECDSA twin of a real one, another
    /// digest's signature, or noise.
    fn forgery(&mut self, from: u16, digest: &Digest, real: &[u8]) -> Vec<u8> {
        let done = &self.replicas[usize::from(from)].done;
        // Another digest's signature (never this one's, which would be no lie).
        let replay = done.iter().find(|(d, s)| *d != digest && done.get(digest) != Some(*s)).map(|(_, s)| s.clone());
        match self.noise.below(3) {
            0 if self.alg == Algorithm::EcdsaP256Sha256 && p256::ecdsa::Signature::from_slice(real).is_ok() => ecdsa_twin(real),
            1 if replay.is_some() => replay.unwrap_or_default(),
            _ => self.noise.bytes(64),
        }
    }

    fn drain(&mut self, at: u16) -> Result<(), String> {
        while let Some(output) = self.replicas[usize::from(at)].core.poll_output() {
            match output {
                EcOutput::Send { to, message } => self.send(at, to, message),
                EcOutput::Broadcast { message } => {
                    for to in (0..self.n).filter(|&to| to != at) {
                        self.send(at, to, message.clone());
                    }
                }
                EcOutput::Compute(job) => {
                    // Run now, finish later: jobs come back in any order.
                    let done = job.run();
                    let when = self.now + self.noise.below(3_000);
                    self.schedule(when, Event::Job { at, done });
                }
                EcOutput::Done { digest, signature } => {
                    let r = &mut self.replicas[usize::from(at)];
                    if let Some(earlier) = r.done.insert(digest, signature.clone()) {
                        if earlier != signature {
                            return Err(format!("replica {at} finished {digest:02x?} twice with different bytes"));
                        }
                    }
                    if r.behaviour == Behaviour::ForgedFinals {
                        // Late forgeries too, against the finals cache.
                        let forged = self.forgery(at, &digest, &signature);
                        for to in (0..self.n).filter(|&to| to != at) {
                            self.transmit(at, to, EcSignMessage::Final { digest, signature: forged.clone() });
                        }
                    }
                }
                EcOutput::Misbehaved { peer, what } => {
                    if self.honest(at) && self.honest(peer) {
                        return Err(format!("honest replica {at} reported honest {peer}: {what}"));
                    }
                    self.replicas[usize::from(at)].reported.entry(peer).or_insert(what);
                }
                EcOutput::Failed { digest, reason } => self.replicas[usize::from(at)].failed.push(format!("{digest:02x?}: {reason}")),
            }
        }
        Ok(())
    }

    fn check_bounds(&self, at: u16) -> Result<(), String> {
        let core = &self.replicas[usize::from(at)].core;
        let (digests, bytes) = core.early_held();
        if digests > self.limits.early_digests || bytes > self.limits.early_bytes {
            return Err(format!("replica {at} holds {digests} early digests, {bytes} bytes"));
        }
        if core.stats().open_sessions > self.limits.max_sessions as u64 {
            return Err(format!("replica {at} has {} sessions open", core.stats().open_sessions));
        }
        Ok(())
    }

    fn all_honest_done(&self) -> bool {
        let digests: Vec<Digest> = self.items.iter().map(|d| digest_of(self.alg.number(), d)).collect();
        self.replicas.iter().filter(|r| r.behaviour == Behaviour::Honest).all(|r| digests.iter().all(|d| r.done.contains_key(d)))
    }

    /// Runs until every honest replica has every signature and the network is quiet.
    fn run(&mut self) -> Result<(), String> {
        const LIMIT_US: u64 = 30_000_000;
        loop {
            let next_event = self.queue.keys().next().map(|(at, _)| *at);
            let next_timer = self.replicas.iter().enumerate().filter_map(|(i, r)| r.core.poll_timeout().map(|t| (t, i as u16))).min();
            if self.queue.is_empty() && self.all_honest_done() {
                return Ok(());
            }
            let at = match (next_event, next_timer) {
                (Some(e), Some((t, i))) if t < e => {
                    self.now = self.now.max(t);
                    self.replicas[usize::from(i)].core.handle_timeout(self.now);
                    i
                }
                (Some(_), _) => {
                    let Some(((when, _), event)) = self.queue.pop_first() else { unreachable!() };
                    self.now = when;
                    self.deliver(event)
                }
                (None, Some((t, i))) => {
                    self.now = self.now.max(t);
                    self.replicas[usize::from(i)].core.handle_timeout(self.now);
                    i
                }
                (None, None) => return Err("nothing left to do but not every honest replica finished".into()),
            };
            if self.now > LIMIT_US {
                return Err(format!("not finished after {LIMIT_US} µs"));
            }
            self.drain(at)?;
            self.check_bounds(at)?;
        }
    }

    fn deliver(&mut self, event: Event) -> u16 {
        match event {
            Event::Deliver { from, to, message } => {
                if !self.cut(from, to) {
                    let liar = matches!(self.replicas[usize::from(from)].behaviour, Behaviour::Garbage | Behaviour::ForgedFinals);
                    if self.honest(to) && liar && !matches!(message, EcSignMessage::Retry { .. }) {
                        self.suspicious.push((to, from, message.clone()));
                    }
                    self.replicas[usize::from(to)].core.handle_message(self.now, from, message);
                }
                to
            }
            Event::Job { at, done } => {
                self.replicas[usize::from(at)].core.job_done(done);
                at
            }
            Event::Request { at, item } => {
                let data = self.items[item].clone();
                if let Err(e) = self.replicas[usize::from(at)].core.request(self.now, self.alg.number(), &data) {
                    self.replicas[usize::from(at)].failed.push(format!("request refused: {e}"));
                }
                at
            }
        }
    }
}

/// Data for a run: the first item is fixed (its signature is compared with an all-honest
/// run's), the others depend on the seed.
fn items(count: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut items = vec![b"\x00\x06\x0d\x02 fixed RRSIG prefix and RRset".to_vec()];
    items.extend((1..count).map(|k| format!("item {k} of seed {seed}").into_bytes()));
    items
}

/// The signature of the fixed item in an all-honest run: the reference bytes.
fn reference(alg: Algorithm, n: u16) -> Vec<u8> {
    static CACHE: Cache<Vec<u8>> = OnceLock::new();
    let mut map = CACHE.get_or_init(Default::default).lock().unwrap();
    map.entry((alg.number(), n))
        .or_insert_with(|| {
            let data = items(1, 0);
            let mut sim = Sim::new(alg, n, &vec![Behaviour::Honest; usize::from(n)], data.clone(), 0);
            sim.run().unwrap();
            let signature = sim.replicas[0].done[&digest_of(alg.number(), &data[0])].clone();
            assert!(standard_verify(&keys(alg, n).0, &data[0], &signature));
            signature
        })
        .clone()
}

/// Runs a simulation and checks everything the core promises; returns who reported whom.
fn check(alg: Algorithm, n: u16, behaviours: &[Behaviour], item_count: usize, seed: u64) -> Result<BTreeMap<u16, BTreeMap<u16, &'static str>>, String> {
    let expected = reference(alg, n);
    let data = items(item_count, seed);
    let mut sim = Sim::new(alg, n, behaviours, data.clone(), seed);
    sim.run()?;
    let pk = keys(alg, n).0;
    let mut reported = BTreeMap::new();
    for (i, r) in sim.replicas.iter().enumerate().filter(|(_, r)| r.behaviour == Behaviour::Honest) {
        if !r.failed.is_empty() {
            return Err(format!("honest replica {i} failed: {:?}", r.failed));
        }
        for (k, d) in data.iter().enumerate() {
            let signature = &r.done[&digest_of(alg.number(), d)];
            if !standard_verify(&pk, d, signature) {
                return Err(format!("replica {i}'s signature of item {k} does not verify"));
            }
            let first_honest = sim.replicas.iter().find(|r| r.behaviour == Behaviour::Honest).map(|r| &r.done[&digest_of(alg.number(), d)]);
            if Some(signature) != first_honest {
                return Err(format!("replica {i}'s signature of item {k} differs from another honest replica's"));
            }
            if k == 0 && *signature != expected {
                return Err(format!("replica {i}'s signature of the fixed item differs from the all-honest run's"));
            }
        }
        reported.insert(i as u16, r.reported.clone());
    }
    // Garbage never parses; a forger's final for a requested digest with other bytes than the
    // honest ones is a lie: whoever was handed one must have reported its sender.
    let honest_signature = |digest: &Digest| sim.replicas.iter().find(|r| r.behaviour == Behaviour::Honest).and_then(|r| r.done.get(digest));
    for (to, from, message) in &sim.suspicious {
        let provable = match (behaviours[usize::from(*from)], message) {
            (Behaviour::Garbage, _) => true,
            (_, EcSignMessage::Final { digest, signature }) => honest_signature(digest).is_some_and(|s| s != signature),
            _ => false,
        };
        if provable && !reported[to].contains_key(from) {
            return Err(format!("honest replica {to} was handed a provable lie by {from} ({message:?}) and did not report it"));
        }
    }
    Ok(reported)
}

/// Up to t faulty replicas with behaviours drawn from `seed`.
fn behaviours_for(n: u16, seed: u64) -> Vec<Behaviour> {
    Noise::new(seed ^ 0xc0de).place_faults(n, Behaviour::Honest, &FAULTY)
}

fn campaign(ci_count: u64) -> testkit::Campaign {
    testkit::Campaign::here("threshold-ec", "core_sim", ci_count)
}

fn byzantine_campaign(alg: Algorithm, n: u16, ci_count: u64, item_count: usize) {
    let c = campaign(ci_count);
    c.run(2, |seed| {
        let behaviours = behaviours_for(n, seed);
        check(alg, n, &behaviours, item_count, seed).map(|_| ()).map_err(|e| format!("{alg:?} n={n} {behaviours:?}: {e}"))
    });
}

#[test]
fn byzantine_ed25519_n4() {
    byzantine_campaign(Algorithm::Ed25519, 4, 24, 3);
}

#[test]
fn byzantine_ecdsa_n4() {
    byzantine_campaign(Algorithm::EcdsaP256Sha256, 4, 12, 3);
}

#[test]
fn byzantine_ed25519_n7() {
    byzantine_campaign(Algorithm::Ed25519, 7, 6, 2);
}

#[test]
fn byzantine_ecdsa_n7() {
    byzantine_campaign(Algorithm::EcdsaP256Sha256, 7, 2, 1);
}

/// Every behaviour by t = 2 replicas of n = 7 at once, and (for the lies only some receivers
/// can see: wrong shares, equivocation) reported by some honest replica in some seed.
#[test]
fn each_behaviour_by_t_replicas() {
    for alg in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
        for behaviour in FAULTY {
            let mut behaviours = vec![Behaviour::Honest; 7];
            behaviours[1] = behaviour;
            behaviours[4] = behaviour;
            let mut named = BTreeSet::new();
            let seeds = campaign(4).seeds_divided(if alg == Algorithm::Ed25519 { 2 } else { 4 });
            for &seed in &seeds {
                let reported =
                    check(alg, 7, &behaviours, 1, seed).unwrap_or_else(|e| panic!("{alg:?} {behaviour:?} seed {seed}: {e}\n  {}", campaign(4).reproduce(seed)));
                named.extend(reported.values().flat_map(|r| r.keys().copied()));
            }
            if matches!(behaviour, Behaviour::WrongShares | Behaviour::Equivocate | Behaviour::Garbage) && seeds.len() > 1 {
                assert!(named.contains(&1) || named.contains(&4), "{alg:?} {behaviour:?}: no honest replica named a liar in {seeds:?}");
            }
        }
    }
}

/// t replicas whose cores corrupt their own shares (the paper's fault injection, as `--corrupt`
/// sets it): every honest replica still gets the all-honest run's signatures (`check`), no
/// honest replica is reported, and every corrupted replica is named by an honest one for a
/// share that fails its check (not as a malformed message: the corruption keeps the framing
/// and the scalars canonical, so it is the share check or proof that catches it).
#[test]
fn corrupt_replicas_are_named_and_the_signatures_are_the_honest_ones() {
    for alg in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
        for (n, corrupt) in [(4u16, &[2u16][..]), (7, &[1, 4])] {
            let mut behaviours = vec![Behaviour::Honest; usize::from(n)];
            corrupt.iter().for_each(|&c| behaviours[usize::from(c)] = Behaviour::Corrupt);
            let c = campaign(8);
            let mut named = BTreeSet::new();
            for seed in c.seeds_divided(if n == 7 { 4 } else { 1 }) {
                let reported = check(alg, n, &behaviours, 2, seed).unwrap_or_else(|e| panic!("{alg:?} n={n} seed {seed}: {e}\n  {}", c.reproduce(seed)));
                for (by, peers) in reported {
                    for (peer, what) in peers {
                        assert!(corrupt.contains(&peer), "{alg:?} n={n} seed {seed}: {by} reported {peer}");
                        assert_eq!(what, "signature share fails its check", "{alg:?} n={n} seed {seed}: {by} on {peer}");
                        named.insert(peer);
                    }
                }
            }
            assert_eq!(named.into_iter().collect::<Vec<_>>(), corrupt, "{alg:?} n={n}: corrupted replicas named by some honest replica");
        }
    }
}

fn core(alg: Algorithm, me: u16, limits: EcLimits) -> EcSignerCore {
    let (pk, shares) = keys(alg, 4);
    EcSignerCore::new(me, pk, Arc::new(shares[usize::from(me)].clone()), limits).unwrap()
}

fn outputs(core: &mut EcSignerCore) -> Vec<EcOutput> {
    std::iter::from_fn(|| core.poll_output()).collect()
}

#[test]
fn requests_are_refused_beyond_the_session_bound_and_for_another_algorithm() {
    let mut c = core(Algorithm::Ed25519, 0, EcLimits { max_sessions: 2, ..EcLimits::default() });
    assert_eq!(c.request(0, 13, b"x"), Err(EcRequestError::WrongAlgorithm { expected: 15, got: 13 }));
    let a = c.request(0, 15, b"a").unwrap();
    assert_eq!(c.request(0, 15, b"a"), Ok(a), "the same data joins its session");
    c.request(0, 15, b"b").unwrap();
    assert_eq!(c.request(0, 15, b"c"), Err(EcRequestError::TooManySessions(2)));
    c.abandon(&a);
    c.request(0, 15, b"c").unwrap();
    // The abandoned session's job comes back and is ignored.
    let jobs: Vec<_> = outputs(&mut c).into_iter().filter_map(|o| if let EcOutput::Compute(j) = o { Some(j) } else { None }).collect();
    assert_eq!(jobs.len(), 3);
    for job in jobs {
        let digest = *job.digest();
        c.job_done(job.run());
        let out = outputs(&mut c);
        assert_eq!(out.is_empty(), digest == a, "{out:?}");
    }
}

#[test]
fn keys_that_do_not_belong_together_are_refused() {
    let (pk, shares) = keys(Algorithm::Ed25519, 4);
    assert!(EcSignerCore::new(1, pk.clone(), Arc::new(shares[0].clone()), EcLimits::default()).is_err());
    let (other, _) = keys(Algorithm::EcdsaP256Sha256, 4);
    assert!(EcSignerCore::new(0, other, Arc::new(shares[0].clone()), EcLimits::default()).is_err());
    assert!(EcSignerCore::new(0, pk, Arc::new(shares[0].clone()), EcLimits::default()).is_ok());
}

#[test]
fn malformed_messages_are_reported_at_once_and_never_stashed() {
    for alg in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
        let mut c = core(alg, 0, EcLimits::default());
        for body in [vec![], vec![1, 0], vec![2; 34], vec![9; 33], vec![2; 128], vec![1; 200]] {
            c.handle_message(0, 2, EcSignMessage::Round { digest: [1; 32], body });
        }
        c.handle_message(0, 3, EcSignMessage::Final { digest: [1; 32], signature: vec![0; 65] });
        let out = outputs(&mut c);
        assert!(out.iter().all(|o| matches!(o, EcOutput::Misbehaved { peer: 2 | 3, .. })), "{out:?}");
        assert!(out.iter().any(|o| matches!(o, EcOutput::Misbehaved { peer: 3, .. })));
        assert_eq!(c.early_held(), (0, 0));
        // From itself or from beyond n: ignored (the transport names peers).
        c.handle_message(0, 0, EcSignMessage::Retry { digest: [1; 32] });
        c.handle_message(0, 9, EcSignMessage::Final { digest: [1; 32], signature: vec![0; 1] });
        assert!(outputs(&mut c).is_empty());
    }
}

#[test]
fn a_flood_of_early_messages_stays_within_its_bounds_and_spares_honest_ones() {
    let limits = EcLimits { early_digests: 20, early_per_peer: 5, ..EcLimits::default() };
    let mut c = core(Algorithm::Ed25519, 0, limits);
    // An honest peer's early final for the digest our named will ask for.
    let pk = keys(Algorithm::Ed25519, 4).0;
    let data = b"asked later";
    let digest = digest_of(15, data);
    let mut sim = Sim::new(Algorithm::Ed25519, 4, &[Behaviour::Honest; 4], vec![data.to_vec()], 1);
    sim.run().unwrap();
    let signature = sim.replicas[1].done[&digest].clone();
    c.handle_message(0, 1, EcSignMessage::Final { digest, signature: signature.clone() });
    // Replica 3 floods: 1000 digests, each with a well-framed first message and a final.
    let mut noise = Noise::new(4);
    for k in 0..1000u32 {
        let mut d = [0u8; 32];
        d[..4].copy_from_slice(&k.to_be_bytes());
        let mut body = noise.bytes(1 + 32 * 3);
        body[0] = 1;
        c.handle_message(0, 3, EcSignMessage::Round { digest: d, body });
        c.handle_message(0, 3, EcSignMessage::Final { digest: d, signature: noise.bytes(64) });
        assert!(c.early_held().0 <= 6, "{:?}", c.early_held());
    }
    assert!(c.stats().early_dropped >= 995 * 2);
    // The honest final survived the flood and ends the session without a share of ours.
    c.request(0, 15, data).unwrap();
    let mut done = None;
    while let Some(o) = c.poll_output() {
        match o {
            EcOutput::Compute(job) => c.job_done(job.run()),
            EcOutput::Done { signature, .. } => done = Some(signature),
            EcOutput::Broadcast { message: EcSignMessage::Round { .. } } => panic!("a share was made although the signature was known"),
            _ => {}
        }
    }
    assert_eq!(done, Some(signature));
    assert!(standard_verify(&pk, data, done.as_ref().unwrap()));
}

#[test]
fn retries_are_answered_from_the_finals_cache_and_other_finals_reported() {
    for alg in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
        let data = b"cached";
        let mut sim = Sim::new(alg, 4, &[Behaviour::Honest; 4], vec![data.to_vec()], 2);
        sim.run().unwrap();
        let digest = digest_of(alg.number(), data);
        // A replica that combined the signature itself (so made its own rounds).
        let me = sim.replicas.iter().position(|r| r.core.stats().finals_accepted == 0).unwrap() as u16;
        let (asker, liar) = ((me + 1) % 4, (me + 2) % 4);
        let r = &mut sim.replicas[usize::from(me)];
        let signature = r.done[&digest].clone();
        let c = &mut r.core;
        outputs(c);
        c.handle_message(0, asker, EcSignMessage::Retry { digest });
        let out = outputs(c);
        assert!(matches!(&out[0], EcOutput::Send { to, message: EcSignMessage::Final { signature: s, .. } } if *s == signature && *to == asker), "{out:?}");
        // ECDSA also resends its own rounds, for a replica that must still learn R.
        let rounds = out.iter().filter(|o| matches!(o, EcOutput::Send { message: EcSignMessage::Round { .. }, .. })).count();
        assert_eq!(rounds, if alg == Algorithm::EcdsaP256Sha256 { 2 } else { 0 });
        // The same bytes again: nothing; other bytes: a lie.
        c.handle_message(0, liar, EcSignMessage::Final { digest, signature: signature.clone() });
        assert!(outputs(c).is_empty());
        let mut other = signature.clone();
        other[40] ^= 1;
        c.handle_message(0, liar, EcSignMessage::Final { digest, signature: other });
        let out = outputs(c);
        assert!(matches!(out.as_slice(), [EcOutput::Misbehaved { peer, .. }] if *peer == liar), "{out:?}");
        // A second request for the same data is answered from the cache.
        c.request(0, alg.number(), data).unwrap();
        assert!(matches!(outputs(c).as_slice(), [EcOutput::Done { signature: s, .. }] if *s == signature));
    }
}

/// ECDSA's −s twin verifies under the standard verifier; a lagging replica must not take it.
#[test]
fn an_ecdsa_twin_final_is_refused_and_reported() {
    let alg = Algorithm::EcdsaP256Sha256;
    let data = b"twin";
    let mut sim = Sim::new(alg, 4, &[Behaviour::Honest; 4], vec![data.to_vec()], 3);
    sim.run().unwrap();
    let digest = digest_of(alg.number(), data);
    let signature = sim.replicas[1].done[&digest].clone();
    let twin = ecdsa_twin(&signature);
    assert!(standard_verify(&keys(alg, 4).0, data, &twin), "the twin verifies: the reason for the exact check");
    // A fresh replica 0 hears the twin from 3 (early, before its named asks), then the real
    // signature from 1 and 2: t+1 = 2 matching votes settle it, 3 is reported.
    let mut c = core(alg, 0, EcLimits::default());
    c.handle_message(0, 3, EcSignMessage::Final { digest, signature: twin.clone() });
    c.handle_message(0, 1, EcSignMessage::Final { digest, signature: signature.clone() });
    c.request(0, alg.number(), data).unwrap();
    let mut done = None;
    let mut reported = BTreeSet::new();
    let mut step = |c: &mut EcSignerCore, done: &mut Option<Vec<u8>>| {
        while let Some(o) = c.poll_output() {
            match o {
                EcOutput::Compute(job) => c.job_done(job.run()),
                EcOutput::Done { signature, .. } => *done = Some(signature),
                EcOutput::Misbehaved { peer, .. } => {
                    reported.insert(peer);
                }
                _ => {}
            }
        }
    };
    step(&mut c, &mut done);
    assert_eq!(done, None, "one vote each: not settled");
    c.handle_message(0, 2, EcSignMessage::Final { digest, signature: signature.clone() });
    step(&mut c, &mut done);
    assert_eq!(done, Some(signature));
    assert_eq!(reported, BTreeSet::from([3]));
}

#[test]
fn jobs_and_outputs_cross_threads() {
    fn send_static<T: Send + 'static>() {}
    send_static::<threshold_ec::EcJob>();
    send_static::<EcJobDone>();
    send_static::<EcSignerCore>();
}

/// ECDSA sessions wait briefly for every first message (no proof checks then) unless a peer is
/// suspected. A silent peer becomes a suspect only when a waiting session gives up on it; the
/// sessions that then do not wait must not renew the suspicion, or one slow moment would keep
/// every later session on the expensive path for good.
#[test]
fn a_silent_peer_is_suspected_for_a_while_and_waited_for_again_after() {
    let alg = Algorithm::EcdsaP256Sha256;
    let suspect_for = sim_limits().suspect_for_us;
    let mut behaviours = [Behaviour::Honest; 4];
    behaviours[3] = Behaviour::Silent;
    // One session at 0 (waits, gives up on 3), four while 3 is suspected, one after.
    let times = [0, 1_000_000, 2_000_000, 3_000_000, 4_000_000, suspect_for + 2_000_000];
    let mut sim = Sim::new(alg, 4, &behaviours, items(times.len(), 11), 11);
    sim.queue.clear();
    sim.partition = None;
    for (item, when) in times.iter().enumerate() {
        for at in 0..3 {
            sim.schedule(*when, Event::Request { at, item });
        }
    }
    sim.run().unwrap();
    for at in 0..3u16 {
        let stats = sim.replicas[usize::from(at)].core.stats();
        assert_eq!(stats.signatures, times.len() as u64);
        // The first and the last session waited; the four between did not.
        assert_eq!(stats.patient_sessions, 2, "replica {at}: {stats:?}");
    }
}
