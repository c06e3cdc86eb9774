//! A seeded simulation of n = 4 and 7 `PresignCore`s (Ed25519 and ECDSA P-256): slots prepared
//! in the background, then signed, over a network that loses, delays (so reorders) and
//! duplicates messages, with durable records completing late and up to t Byzantine peers
//! (silent, garbage, wrong shares, lying commitments, announcements of other data to some
//! peers). Asserted: every honest replica gets `Done` with the same bytes, which the standard
//! verifier accepts; no honest replica is reported; no honest replica ever sends a share for a
//! slot before its record is complete, and the shares honest replicas send for one slot are
//! all for one data (also when honest callers disagree, and across a restart); a replica whose
//! share is wrong is blamed; the pool and the early stash stay within their bounds.
//!
//! Seeds: `SIM_SEEDS=N` runs N seeds per campaign, `SIM_SEED=S` replays one (crates/testkit).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use testkit::Noise;
use threshold_ec::{deal, Algorithm, KeyShare, PresignCore, PresignError, PresignLimits, PresignMessage, PresignOutput, PublicKey, Slot};

fn keys(alg: Algorithm, n: u16) -> (Arc<PublicKey>, Vec<KeyShare>) {
    let mut rng = ChaCha20Rng::seed_from_u64(u64::from(alg.number()) << 16 | u64::from(n));
    let (pk, shares) = deal(alg, n, (n - 1) / 3, &mut rng).unwrap();
    (Arc::new(pk), shares)
}

/// The standard verifiers, independent of the crate's own checks.
fn standard_verify(pk: &PublicKey, data: &[u8], signature: &[u8; 64]) -> bool {
    match pk.algorithm() {
        Algorithm::Ed25519 => {
            let key = ed25519_dalek::VerifyingKey::from_bytes(pk.dnskey_public_key().try_into().unwrap()).unwrap();
            key.verify_strict(data, &ed25519_dalek::Signature::from_bytes(signature)).is_ok()
        }
        Algorithm::EcdsaP256Sha256 => {
            use p256::ecdsa::signature::Verifier as _;
            let mut sec1 = vec![4u8];
            sec1.extend(pk.dnskey_public_key());
            let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1).unwrap();
            p256::ecdsa::Signature::from_slice(signature).is_ok_and(|s| key.verify(data, &s).is_ok())
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    Honest,
    Silent,
    /// Every message body replaced by noise.
    Garbage,
    /// Shares off by one bit; everything else honest.
    WrongShare,
    /// First-round bodies with one byte changed.
    LyingCommitments,
    /// Announces other data to odd-numbered peers.
    SplitAnnounce,
}

const FAULTY: [Behaviour; 5] = [Behaviour::Silent, Behaviour::Garbage, Behaviour::WrongShare, Behaviour::LyingCommitments, Behaviour::SplitAnnounce];

struct Replica {
    core: PresignCore,
    behaviour: Behaviour,
    done: BTreeMap<Slot, [u8; 64]>,
    reported: BTreeSet<u16>,
    conflicts: BTreeSet<Slot>,
    /// Slots whose record the driver completed (what a restart is given).
    records: BTreeMap<Slot, [u8; 32]>,
    /// Slots whose record is written but not yet reported to the core.
    pending: BTreeSet<Slot>,
}

enum Event {
    Deliver { from: u16, to: u16, message: PresignMessage },
    Recorded { at: u16, slot: Slot },
    Sign { at: u16, slot: Slot },
    Tick,
}

struct Sim {
    n: u16,
    pk: Arc<PublicKey>,
    shares: Vec<KeyShare>,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    noise: Noise,
    replicas: Vec<Replica>,
    /// The data each replica is asked to sign in each slot.
    data: BTreeMap<(u16, Slot), Vec<u8>>,
    /// (slot, data hash) of every share an honest replica put on the wire.
    honest_shares: BTreeMap<Slot, BTreeSet<[u8; 32]>>,
    limits: PresignLimits,
}

fn slot(counter: u64) -> Slot {
    Slot { epoch: 1, counter }
}

impl Sim {
    fn new(alg: Algorithm, n: u16, behaviours: &[Behaviour], seed: u64) -> Sim {
        let (pk, shares) = keys(alg, n);
        let limits = PresignLimits { max_slots: 8, max_early: 16, retry_after_us: 100_000, ..PresignLimits::default() };
        let replicas = (0..n)
            .map(|i| Replica {
                core: PresignCore::new(i, pk.clone(), Arc::new(shares[usize::from(i)].clone()), limits.clone(), slot(0), []).unwrap(),
                behaviour: behaviours[usize::from(i)],
                done: BTreeMap::new(),
                reported: BTreeSet::new(),
                conflicts: BTreeSet::new(),
                records: BTreeMap::new(),
                pending: BTreeSet::new(),
            })
            .collect();
        Sim {
            n,
            pk,
            shares,
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            noise: Noise::new(seed),
            replicas,
            data: BTreeMap::new(),
            honest_shares: BTreeMap::new(),
            limits,
        }
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((at, self.seq), event);
    }

    fn honest(&self, i: u16) -> bool {
        self.replicas[usize::from(i)].behaviour == Behaviour::Honest
    }

    /// Loss 5 %, duplication 3 %, delays 0.1–5 ms with one in twenty up to 80 ms.
    fn transmit(&mut self, from: u16, to: u16, message: PresignMessage) {
        let copies = if self.noise.below(100) < 3 { 2 } else { 1 };
        for _ in 0..copies {
            if self.noise.below(100) < 5 {
                continue;
            }
            let delay = if self.noise.below(20) == 0 { self.noise.below(80_000) } else { 100 + self.noise.below(4_900) };
            self.schedule(self.now + delay, Event::Deliver { from, to, message: message.clone() });
        }
    }

    /// What `from` puts on the wire for `message` to `to`, by its behaviour.
    fn send(&mut self, from: u16, to: u16, message: PresignMessage) {
        if self.honest(from) {
            if let PresignMessage::Share { slot, .. } = &message {
                let replica = &self.replicas[usize::from(from)];
                assert!(replica.records.contains_key(slot), "replica {from} shared slot {slot:?} before its record was complete");
                let h = replica.core.data_hash(&self.data[&(from, *slot)]);
                self.honest_shares.entry(*slot).or_default().insert(h);
            }
        }
        let rewritten = match (self.replicas[usize::from(from)].behaviour, message) {
            (Behaviour::Silent, _) => None,
            (Behaviour::Garbage, PresignMessage::Round1 { slot, body }) => Some(PresignMessage::Round1 { slot, body: self.noise.bytes(body.len()) }),
            (Behaviour::Garbage, PresignMessage::Share { slot, .. }) => Some(PresignMessage::Share { slot, share: self.noise.bytes(32).try_into().unwrap() }),
            (Behaviour::Garbage, PresignMessage::Announce { slot, .. }) => Some(PresignMessage::Announce { slot, h: self.noise.bytes(32).try_into().unwrap() }),
            (Behaviour::WrongShare, PresignMessage::Share { slot, mut share }) => {
                // The low bit: little-endian Ed25519 byte 0, big-endian P-256 byte 31.
                let k = if self.pk.algorithm() == Algorithm::Ed25519 { 0 } else { 31 };
                share[k] ^= 1;
                Some(PresignMessage::Share { slot, share })
            }
            (Behaviour::LyingCommitments, PresignMessage::Round1 { slot, mut body }) => {
                let k = self.noise.below(body.len() as u64) as usize;
                body[k] ^= 0x40;
                Some(PresignMessage::Round1 { slot, body })
            }
            (Behaviour::SplitAnnounce, PresignMessage::Announce { slot, h }) if to % 2 == 1 => {
                let mut other = h;
                other[0] ^= 1;
                Some(PresignMessage::Announce { slot, h: other })
            }
            (_, message) => Some(message),
        };
        if let Some(message) = rewritten {
            self.transmit(from, to, message);
        }
    }

    fn drain(&mut self, i: u16) {
        while let Some(output) = self.replicas[usize::from(i)].core.poll_output() {
            match output {
                PresignOutput::Send { to, message } => self.send(i, to, message),
                PresignOutput::Broadcast { message } => (0..self.n).filter(|&to| to != i).for_each(|to| self.send(i, to, message.clone())),
                PresignOutput::Record { slot, h } => {
                    // The durable write completes 0–3 ms later.
                    let replica = &mut self.replicas[usize::from(i)];
                    assert!(replica.records.get(&slot).is_none_or(|r| *r == h), "replica {i} asked to record slot {slot:?} twice");
                    replica.pending.insert(slot);
                    let when = self.now + self.noise.below(3_000);
                    self.schedule(when, Event::Recorded { at: i, slot });
                    self.replicas[usize::from(i)].records.insert(slot, h);
                }
                PresignOutput::Ready { .. } => {}
                PresignOutput::Done { slot, signature } => {
                    let previous = self.replicas[usize::from(i)].done.insert(slot, signature);
                    assert!(previous.is_none_or(|p| p == signature), "replica {i} finished slot {slot:?} twice with other bytes");
                }
                PresignOutput::Conflict { slot, .. } => {
                    self.replicas[usize::from(i)].conflicts.insert(slot);
                }
                PresignOutput::Failed { slot, error } => panic!("replica {i} failed slot {slot:?}: {error}"),
                PresignOutput::Misbehaved { peer, .. } => {
                    self.replicas[usize::from(i)].reported.insert(peer);
                }
            }
        }
    }

    fn run(&mut self, until: u64) {
        while let Some(((at, _), event)) = self.queue.pop_first() {
            if at > until {
                break;
            }
            self.now = at;
            match event {
                Event::Deliver { from, to, message } => {
                    self.replicas[usize::from(to)].core.handle_message(at, from, message);
                    self.drain(to);
                }
                Event::Recorded { at: i, slot } => {
                    let replica = &mut self.replicas[usize::from(i)];
                    if replica.pending.remove(&slot) {
                        replica.core.recorded(slot);
                    }
                    self.drain(i);
                }
                Event::Sign { at: i, slot } => {
                    let data = self.data[&(i, slot)].clone();
                    let _ = self.replicas[usize::from(i)].core.sign(at, slot, &data);
                    self.drain(i);
                }
                Event::Tick => {
                    for i in 0..self.n {
                        self.replicas[usize::from(i)].core.handle_timeout(at);
                        self.drain(i);
                    }
                    self.schedule(at + 10_000, Event::Tick);
                }
            }
        }
    }

    /// Every replica prepares `slots` (the background), then is asked to sign its data in
    /// each, at staggered times.
    fn start(&mut self, slots: &[Slot]) {
        for i in 0..self.n {
            for s in slots {
                self.replicas[usize::from(i)].core.prepare(self.now, *s).unwrap();
            }
            self.drain(i);
        }
        for i in 0..self.n {
            for s in slots {
                let when = self.now + 20_000 + self.noise.below(30_000);
                self.schedule(when, Event::Sign { at: i, slot: *s });
            }
        }
        self.schedule(self.now + 1, Event::Tick);
    }

    /// Shares honest replicas sent for one slot are for one data; no honest replica reported.
    fn safety(&self) -> Result<(), String> {
        for (slot, hs) in &self.honest_shares {
            if hs.len() > 1 {
                return Err(format!("honest shares of slot {slot:?} for {} different data", hs.len()));
            }
        }
        for (i, r) in self.replicas.iter().enumerate().filter(|(i, _)| self.honest(*i as u16)) {
            if let Some(peer) = r.reported.iter().find(|p| self.honest(**p)) {
                return Err(format!("replica {i} reported honest replica {peer}"));
            }
        }
        Ok(())
    }
}

fn check(alg: Algorithm, n: u16, behaviours: &[Behaviour], seed: u64) -> Result<(), String> {
    let mut sim = Sim::new(alg, n, behaviours, seed);
    let slots: Vec<Slot> = (1..=3).map(slot).collect();
    for i in 0..n {
        for s in &slots {
            sim.data.insert((i, *s), format!("RRSIG data of slot {}", s.counter).into_bytes());
        }
    }
    sim.start(&slots);
    sim.run(3_000_000);
    sim.safety()?;
    for s in &slots {
        let data = &sim.data[&(0, *s)];
        let mut seen: Option<[u8; 64]> = None;
        for i in (0..n).filter(|&i| sim.honest(i)) {
            let Some(signature) = sim.replicas[usize::from(i)].done.get(s) else { return Err(format!("replica {i} has no signature for {s:?}")) };
            if !standard_verify(&sim.pk, data, signature) {
                return Err(format!("replica {i}'s signature for {s:?} does not verify"));
            }
            if seen.is_some_and(|x| x != *signature) {
                return Err(format!("replicas disagree on slot {s:?}"));
            }
            seen = Some(*signature);
        }
    }
    for r in &sim.replicas {
        if r.core.early_held() > sim.limits.max_early || r.core.active() > sim.limits.max_slots {
            return Err("bounds exceeded".into());
        }
    }
    Ok(())
}

fn campaign(ci_count: u64) -> testkit::Campaign {
    testkit::Campaign::here("threshold-ec", "presign_sim", ci_count)
}

fn byzantine_campaign(alg: Algorithm, n: u16, ci_count: u64) {
    campaign(ci_count).run(2, |seed| {
        let behaviours = Noise::new(seed ^ 0x5107).place_faults(n, Behaviour::Honest, &FAULTY);
        check(alg, n, &behaviours, seed).map_err(|e| format!("{alg:?} n={n} {behaviours:?}: {e}"))
    });
}

#[test]
fn byzantine_ed25519_n4() {
    byzantine_campaign(Algorithm::Ed25519, 4, 16);
}

#[test]
fn byzantine_ecdsa_n4() {
    byzantine_campaign(Algorithm::EcdsaP256Sha256, 4, 8);
}

#[test]
fn byzantine_ed25519_n7() {
    byzantine_campaign(Algorithm::Ed25519, 7, 4);
}

#[test]
fn byzantine_ecdsa_n7() {
    byzantine_campaign(Algorithm::EcdsaP256Sha256, 7, 2);
}

/// A replica whose share is wrong is blamed (replica 0 is first in every combination that has
/// its share), and the signature completes.
#[test]
fn a_wrong_share_is_blamed() {
    for alg in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
        let mut behaviours = vec![Behaviour::Honest; 4];
        behaviours[0] = Behaviour::WrongShare;
        check(alg, 4, &behaviours, 11).unwrap();
        let mut sim = Sim::new(alg, 4, &behaviours, 11);
        let s = slot(1);
        (0..4).for_each(|i| {
            sim.data.insert((i, s), b"data".to_vec());
        });
        sim.start(&[s]);
        sim.run(2_000_000);
        sim.safety().unwrap();
        for i in 1..4usize {
            assert!(sim.replicas[i].done.contains_key(&s), "{alg:?}: replica {i} signed");
        }
        // A replica that combined before the bad share came (or lost it) had nothing to blame.
        let blaming = (1..4usize).filter(|&i| sim.replicas[i].reported.contains(&0)).count();
        assert!(blaming >= 1, "{alg:?}: the wrong share was blamed");
    }
}

/// Honest callers that disagree on a slot's data (a caller bug) never make honest replicas
/// share one slot for two data: split 2/2 nobody shares, split 3/1 the three sign and the one
/// reports a conflict; a Byzantine announcer cannot tip either.
#[test]
fn a_slot_never_carries_two_messages() {
    for alg in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
        for (split, byzantine) in [(2u16, None), (3, None), (2, Some(Behaviour::SplitAnnounce)), (3, Some(Behaviour::SplitAnnounce))] {
            for seed in 0..3 {
                let mut behaviours = vec![Behaviour::Honest; 4];
                if let Some(b) = byzantine {
                    behaviours[3] = b;
                }
                let mut sim = Sim::new(alg, 4, &behaviours, seed);
                let s = slot(7);
                for i in 0..4 {
                    sim.data.insert((i, s), if i < split { b"M".to_vec() } else { b"M prime".to_vec() });
                }
                sim.start(&[s]);
                sim.run(2_000_000);
                sim.safety().unwrap_or_else(|e| panic!("{alg:?} split {split} {byzantine:?} seed {seed}: {e}"));
                let honest: Vec<u16> = (0..4).filter(|&i| sim.honest(i)).collect();
                let with_m = honest.iter().filter(|&&i| i < split).count();
                if with_m >= 3 {
                    for &i in &honest {
                        let r = &sim.replicas[usize::from(i)];
                        assert_eq!(r.done.contains_key(&s), i < split, "{alg:?} split {split} replica {i}");
                        assert_eq!(r.conflicts.contains(&s), i >= split, "{alg:?} split {split} replica {i}");
                    }
                } else {
                    assert!(sim.honest_shares.is_empty(), "{alg:?} split {split}: no quorum, no share");
                }
            }
        }
    }
}

/// A restarted replica is given its records: the slot it signed is refused for other data and
/// signed again for the same data (same bytes, its peers answering its retries); a slot whose
/// record never completed sent nothing; slots below the floor are refused.
#[test]
fn a_restart_never_reuses_a_slot() {
    for alg in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
        let mut sim = Sim::new(alg, 4, &[Behaviour::Honest; 4], 3);
        let (s, lost) = (slot(1), slot(2));
        for i in 0..4 {
            sim.data.insert((i, s), b"M".to_vec());
            sim.data.insert((i, lost), b"L".to_vec());
        }
        sim.start(&[s]);
        sim.run(1_000_000);
        let signature = sim.replicas[0].done[&s];
        // Replica 0 is asked for `lost`, and crashes before its record completes.
        sim.replicas[0].core.prepare(sim.now, lost).unwrap();
        sim.replicas[0].core.sign(sim.now, lost, b"L").unwrap();
        let mut left = Vec::new();
        while let Some(output) = sim.replicas[0].core.poll_output() {
            left.push(output);
        }
        assert!(left.iter().any(|o| matches!(o, PresignOutput::Record { slot, .. } if *slot == lost)));
        assert_eq!(sim.replicas[0].core.sign(sim.now, lost, b"other"), Err(PresignError::Spent(lost)), "other data while the record is written");
        assert!(
            !left.iter().any(|o| matches!(o, PresignOutput::Broadcast { message: PresignMessage::Announce { .. } | PresignMessage::Share { .. } })),
            "nothing before the record"
        );

        let records = sim.replicas[0].records.clone();
        let records: Vec<(Slot, [u8; 32])> = records.into_iter().filter(|(k, _)| *k != lost).collect();
        let share = Arc::new(sim.shares[0].clone());
        let mut core = PresignCore::new(0, sim.pk.clone(), share.clone(), sim.limits.clone(), slot(0), records.clone()).unwrap();
        assert_eq!(core.sign(sim.now, s, b"other data"), Err(PresignError::Spent(s)));
        core.sign(sim.now, s, b"M").unwrap();
        let mut restarted = Vec::new();
        while let Some(output) = core.poll_output() {
            restarted.push(output);
        }
        assert!(!restarted.iter().any(|o| matches!(o, PresignOutput::Record { .. })), "the record is durable already");
        sim.replicas[0].core = core;
        sim.replicas[0].done.clear();
        sim.replicas[0].records.remove(&lost);
        sim.replicas[0].pending.clear();
        for o in restarted {
            if let PresignOutput::Broadcast { message } = o {
                (1..4).for_each(|to| sim.send(0, to, message.clone()));
            }
        }
        sim.schedule(sim.now + 1, Event::Tick);
        sim.run(sim.now + 2_000_000);
        assert_eq!(sim.replicas[0].done.get(&s), Some(&signature), "{alg:?}: the same bytes after the restart");
        sim.safety().unwrap();

        let floor = PresignCore::new(0, sim.pk.clone(), share, sim.limits.clone(), slot(5), records).unwrap();
        let mut floor = floor;
        assert_eq!(floor.sign(0, slot(4), b"M"), Err(PresignError::Spent(slot(4))));
        assert_eq!(floor.prepare(0, slot(4)), Err(PresignError::Spent(slot(4))));
    }
}

/// The pool refuses slots beyond its bound; a peer's messages for many unprepared slots stay
/// within the early bound.
#[test]
fn the_pool_and_the_stash_are_bounded() {
    let (pk, shares) = keys(Algorithm::EcdsaP256Sha256, 4);
    let limits = PresignLimits { max_slots: 3, max_early: 5, ..PresignLimits::default() };
    let mut core = PresignCore::new(0, pk.clone(), Arc::new(shares[0].clone()), limits.clone(), slot(0), []).unwrap();
    for c in 1..=3 {
        core.prepare(0, slot(c)).unwrap();
    }
    assert_eq!(core.prepare(0, slot(4)), Err(PresignError::PoolFull(3)));
    assert_eq!(core.active(), 3);
    for c in 100..200 {
        core.handle_message(0, 1, PresignMessage::Announce { slot: slot(c), h: [1; 32] });
    }
    assert_eq!(core.early_held(), 5);
    let tight = PresignLimits { max_bytes: 4096, ..limits };
    let mut core = PresignCore::new(0, pk, Arc::new(shares[0].clone()), tight, slot(0), []).unwrap();
    core.prepare(0, slot(1)).unwrap();
    assert!(matches!(core.prepare(0, slot(2)), Err(PresignError::PoolFull(1))), "bytes bound");
}
