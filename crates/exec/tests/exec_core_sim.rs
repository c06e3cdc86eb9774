//! Seeded, deterministic simulation of the execution core (`exec`) on n
//! replicas against fake nameds that are slow, stall for minutes (a named restarting:
//! the executor keeps sending until it answers), or answer one write differently; with
//! wrappers that crash and resume from their persisted state, and clients whose answers
//! are never read. Checks: honest replicas report the same checkpoint digests and end in
//! the same state; a replica whose named answered differently is visibly different at the
//! next checkpoint; reads see exactly the writes ordered before them; read slots are
//! bounded; every batch executes although no client reads.
//!
//! Seeds follow the workspace's convention (crates/testkit): `SIM_SEEDS=N` runs N seeds in the
//! campaigns a command selects, `SIM_SEED=S` replays one, and a failure prints the line that
//! replays it.
//!
//! A Byzantine origin (`a_hostile_origin_cannot_stop_execution_or_reach_named`): its ordered
//! requests are drawn per seed from a grammar of hostile DNS bytes (unreadable headers, bad
//! counts, compression loops, every opcode, validly signed updates sized around 65,535 less
//! what re-signing adds, unsigned, wrongly signed, unknown keys, stale times, replays under new
//! header ids, zone transfers over both transports), executed by honest replicas with the real
//! update authentication, which restart now and then from what they persisted. Oracles: every
//! batch ends within a bounded number of steps, nothing not validly signed (nor anything named
//! cannot take) reaches named, honest states and zones are identical, every honest client is
//! answered. CI runs 24 seeds; a longer campaign:
//! `SIM_SEEDS=5000 cargo test --release -p exec --test exec_core_sim -- a_hostile_origin --nocapture`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use exec::envelope::Op;
use exec::{
    Command, Delivered, Event, ExecConfig, ExecCore, ExecState, Item, RequestCounts, SignZoneAuth, SignZoneSigner, SignZoneVerifier, Unchanged, UpdateDecision,
    UpdateGate,
};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{rdata::A, DNSClass, Name, RData, Record, RecordType};
use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest as _, Sha256};

const N: u16 = 4;
const T: u16 = 1;
const MAX_READS: usize = 8;
const CHECKPOINT_EVERY: u64 = 5;
/// Agreed time at the start (s): today at midnight, inside the validity of the replica
/// certificates made for the run (sign-zone requests are checked at agreed time). Only
/// differences of times decide anything else, so a seed replays alike on any day.
fn start_s() -> u64 {
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        now - now % 86_400
    })
}

/// The replica's local clock (s), which the update authentication signs towards named with
/// (the wrapper gives it named-glue's; named's time check is the fake named's business here).
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// The cluster's CA and every replica's identity (mesh certificate and key), made once.
struct Pki {
    verifier: SignZoneVerifier,
    signers: Vec<SignZoneSigner>,
    /// Replica certificates and keys of another cluster's CA.
    outsiders: Vec<SignZoneSigner>,
    /// The replicas' own keys, signing for another zone.
    other_zone: Vec<SignZoneSigner>,
    /// The cluster's verifier for that other zone.
    other_verifier: SignZoneVerifier,
}

fn pki() -> &'static Pki {
    static PKI: std::sync::OnceLock<Pki> = std::sync::OnceLock::new();
    PKI.get_or_init(|| {
        use mesh::pki::{cert_der_from_pem, generate_ca, issue_replica_cert};
        let certs = |ca| (0..N).map(|i| issue_replica_cert(ca, i).unwrap()).collect::<Vec<_>>();
        let signers = |certs: &[mesh::pki::ReplicaCert], zone| {
            certs.iter().map(|c| SignZoneSigner::new(c.replica_id, zone, &c.cert_pem, c.key_pem.clone()).unwrap()).collect::<Vec<_>>()
        };
        let ca = generate_ca("sim").unwrap();
        let other = generate_ca("other").unwrap();
        let (mine, theirs) = (certs(&ca), certs(&other));
        Pki {
            verifier: SignZoneVerifier::new("example.test.", cert_der_from_pem(&ca.cert_pem).unwrap()),
            signers: signers(&mine, "example.test."),
            outsiders: signers(&theirs, "example.test."),
            other_zone: signers(&mine, "other.test."),
            other_verifier: SignZoneVerifier::new("other.test.", cert_der_from_pem(&ca.cert_pem).unwrap()),
        }
    })
}

/// Replica `replica`'s genuine claim that its part of the signing begun at `run_seq` is done.
fn finish(replica: u16, run_seq: u64) -> Op {
    Op::SignZoneFinish(pki().signers[replica as usize].sign_finish(run_seq).unwrap())
}

/// Replica `origin`'s genuine report that the parent's DS covers the new key, signed at `time_s`.
fn report(origin: u16, time_s: u64) -> Op {
    Op::RolloverReport { zone: 0, auth: pki().signers[origin as usize].sign_rollover_at(time_s * 1_000_000).unwrap() }
}

/// Replica `origin`'s genuine sign-zone request, signed at `time_s`.
fn sz(origin: u16, time_s: u64) -> Op {
    Op::SignZone(pki().signers[origin as usize].sign_at(time_s * 1_000_000).unwrap())
}

fn zone() -> Name {
    Name::from_ascii("example.test.").unwrap()
}

fn query(id: u16) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(format!("r{id}.example.test.")).unwrap(), RecordType::A));
    m.to_vec().unwrap()
}

/// An update whose message id is its write number `k`.
fn update(k: u16) -> Vec<u8> {
    let mut m = Message::new(k, MessageType::Query, OpCode::Update);
    let mut q = Query::query(zone(), RecordType::SOA);
    q.set_query_class(DNSClass::IN);
    m.add_query(q);
    let name = Name::from_ascii(format!("w{k}.example.test.")).unwrap();
    m.add_authority(Record::from_rdata(name, 300, RData::A(A::new(192, 0, 2, (k % 250) as u8))));
    m.to_vec().unwrap()
}

fn answer(request: &[u8], rcode: ResponseCode) -> Vec<u8> {
    let m = Message::from_vec(request).unwrap();
    let mut a = Message::error_msg(m.metadata.id, m.metadata.op_code, rcode);
    a.metadata.message_type = MessageType::Response;
    a.to_vec().unwrap()
}

fn id_of(message: &[u8]) -> u16 {
    u16::from_be_bytes([message[0], message[1]])
}

/// What every honest named answers to write `k`: some updates fail their prerequisites.
fn rule_rcode(k: u16) -> ResponseCode {
    if k % 7 == 3 {
        ResponseCode::NXRRSet
    } else {
        ResponseCode::NoError
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Named {
    Quick,
    Slow,
    /// Now and then takes minutes to answer a write (restarting, or stuck on a signature).
    Stalls,
    /// Answers write `k` SERVFAIL without applying it (and is otherwise honest).
    Deviates(u16),
    /// Every whole-zone signing fails here (say, a full disk), the zone left as it was.
    SigningFails,
}

/// A fake named's zone: the writes applied (an update applied twice changes nothing,
/// as with real updates re-sent after a lost answer) and the time of the last signing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Zone {
    applied: BTreeSet<u16>,
    signed_at: Option<(u32, u32)>,
    /// Re-signing slices applied, by batch: (horizon, signature times). Keyed by batch
    /// as the real one is idempotent per batch (its journal): a slice executed again
    /// after a crash changes nothing more.
    slices: BTreeMap<u64, (u32, (u32, u32))>,
    /// What each slice reported (named's journal: not part of the zone's content).
    resigned: BTreeMap<u64, u32>,
}

impl Zone {
    fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        for k in &self.applied {
            h.update(k.to_be_bytes());
        }
        if let Some((i, e)) = self.signed_at {
            h.update(i.to_be_bytes());
            h.update(e.to_be_bytes());
        }
        for (seq, (due, (i, e))) in &self.slices {
            h.update(seq.to_be_bytes());
            h.update(due.to_be_bytes());
            h.update(i.to_be_bytes());
            h.update(e.to_be_bytes());
        }
        h.finalize().into()
    }
}

/// One ordered request of the generated log.
#[derive(Clone, Debug)]
struct Logged {
    origin: u16,
    payload: Vec<u8>,
    /// The gateway still holds the client (false: it gave up before ordering).
    client_waits: bool,
    /// For a read: how many writes named must have applied when it answers.
    expected_applied: Option<usize>,
}

struct Log {
    batches: Vec<(u64, Vec<Logged>)>,
}

fn generate(rng: &mut ChaCha8Rng, batches: usize) -> Log {
    let mut out = Vec::new();
    let (mut writes, mut reads) = (0u16, 0u16);
    let mut applied = 0usize;
    let mut time_us = start_s() * 1_000_000;
    // Seqs of batches holding a sign-zone request: a signing can only have begun at one.
    let mut sign_zone_seqs: Vec<u64> = Vec::new();
    for b in 0..batches {
        let seq = b as u64 + 1;
        time_us += 200_000 + rng.next_u64() % 3_000_000;
        let mut requests = Vec::new();
        for _ in 0..rng.next_u64() % 6 {
            let origin = (rng.next_u64() % u64::from(N)) as u16;
            let client_waits = !rng.next_u64().is_multiple_of(10);
            let r = rng.next_u64() % 100;
            let (op, expected) = if r < 55 {
                reads += 1;
                let tcp = rng.next_u64().is_multiple_of(2);
                (Op::Dns { tcp, message: query(reads) }, Some(applied))
            } else if r < 85 {
                writes += 1;
                if rule_rcode(writes) == ResponseCode::NoError {
                    applied += 1;
                }
                (Op::Dns { tcp: true, message: update(writes) }, None)
            } else if r < 92 {
                // Stamped with the agreed time and the request's place: each counts once.
                if sign_zone_seqs.last() != Some(&seq) {
                    sign_zone_seqs.push(seq);
                }
                (Op::SignZone(pki().signers[origin as usize].sign_at(time_us + requests.len() as u64).unwrap()), None)
            } else if r < 96 {
                // A replica's part of a background signing is done (a no-op when none runs).
                // The generator does not know where a signing began, so the replica claims it
                // for each of the last runs that may have begun (all but one refused); now and
                // then one is ordered under another replica's origin, as a Byzantine primary
                // could order it.
                let signer = if rng.next_u64().is_multiple_of(10) { (origin + 1) % N } else { origin };
                for back in 1..3 {
                    if let Some(k) = sign_zone_seqs.len().checked_sub(1 + back) {
                        let payload = finish(origin, sign_zone_seqs[k]).encode();
                        requests.push(Logged { origin, payload, client_waits, expected_applied: None });
                    }
                }
                let run_seq = sign_zone_seqs.last().copied().unwrap_or(0);
                (finish(signer, run_seq), None)
            } else if r < 97 {
                // A zone added or removed at run time: t+1 distinct replicas asking for the
                // same change execute it (a name served already, or not served, is refused).
                let (name, key) = if rng.next_u64().is_multiple_of(2) { ("a.test", 1) } else { ("b.test", 2) };
                let action = if rng.next_u64().is_multiple_of(3) { exec::ZoneSetAction::Remove } else { exec::ZoneSetAction::Add };
                let change = exec::ZoneSetChange::new(action, name, [key; 32]);
                if rng.next_u64().is_multiple_of(2) {
                    // Another replica asks for the same change in the same batch: t+1 at once.
                    let other = (origin + 1) % N;
                    let auth = pki().signers[other as usize].sign_zone_set_at(&change, time_us + requests.len() as u64).unwrap();
                    requests.push(Logged {
                        origin: other,
                        payload: Op::ZoneSet { change: change.clone(), auth }.encode(),
                        client_waits,
                        expected_applied: None,
                    });
                }
                let auth = pki().signers[origin as usize].sign_zone_set_at(&change, time_us + requests.len() as u64).unwrap();
                (Op::ZoneSet { change, auth }, None)
            } else if r < 98 {
                // The parent's new DS seen: t+1 distinct reporters finish the rollover once,
                // with a whole-zone signing at that point of the log (finish claims follow).
                if sign_zone_seqs.last() != Some(&seq) {
                    sign_zone_seqs.push(seq);
                }
                (Op::RolloverReport { zone: 0, auth: pki().signers[origin as usize].sign_rollover_at(time_us + requests.len() as u64).unwrap() }, None)
            } else {
                (Op::Resign, None)
            };
            requests.push(Logged { origin, payload: op.encode(), client_waits, expected_applied: expected });
        }
        out.push((time_us, requests));
    }
    Log { batches: out }
}

struct Node {
    core: ExecCore<u64, Unchanged>,
    named: Named,
    zone: Zone,
    /// Index into the log of the next batch to deliver.
    next: usize,
    incarnation: u64,
    persisted: ExecState,
    /// The last batch executed (persisted or not: a batch that changed nothing is not).
    executed: u64,
    checkpoints: BTreeMap<u64, [u8; 32]>,
    reads: BTreeMap<u64, usize>,
    write_in_flight: bool,
    /// A checkpoint's digest is being computed: the zone must not change until it is in.
    digesting: bool,
    signings: u32,
    sign_seqs: Vec<u64>,
    /// The zones named serves (named's configuration, which a crash of the wrapper keeps).
    zone_set: Vec<u16>,
}

impl Node {
    /// One digest per zone served, in index order: zone 0's content, and for a zone added
    /// at run time its index (the fake named's added zones hold nothing else).
    fn digests(&self) -> Vec<[u8; 32]> {
        self.zone_set.iter().map(|&index| if index == 0 { self.zone.digest() } else { Sha256::digest(index.to_be_bytes()).into() }).collect()
    }
}

enum Due {
    /// Try to hand the node its next batch.
    Deliver,
    /// A command's result arrives (dropped if the node restarted since).
    Done {
        incarnation: u64,
        effect: Effect,
        event: Event,
    },
    Crash,
    /// The executor's local bound on a write named has not answered (the abandon runs):
    /// if the node still waits for it, it orders a `Stuck` claim.
    StuckCheck {
        incarnation: u64,
        seq: u64,
        index: u32,
    },
    /// Batch `batch` (an index into the log) committed: the node's executor sees it now,
    /// before it executes it (`ExecCore::committed`).
    Committed {
        batch: usize,
    },
}

enum Effect {
    None,
    /// The zone read for a checkpoint, as it is when named's transfer ends (a zone change
    /// the core let through meanwhile would show in the digest).
    Digest,
    Write {
        k: u16,
    },
    Read {
        expected: Option<usize>,
    },
    /// A signed zone installed (`None`: this replica's signing failed, zone unchanged).
    Sign {
        times: Option<(u32, u32)>,
    },
    Slice {
        seq: u64,
        due_before_s: u32,
        times: (u32, u32),
    },
    /// named serves these zones now.
    ZoneSet {
        zones: Vec<u16>,
    },
}

struct Sim {
    rng: ChaCha8Rng,
    log: Log,
    nodes: Vec<Node>,
    now_ms: u64,
    queue: BinaryHeap<Reverse<(u64, u64, u16)>>,
    dues: BTreeMap<u64, Due>,
    next_due: u64,
    trace: Sha256,
    answers_dropped: u64,
    max_reads_seen: usize,
    failures: Vec<String>,
    write_answers: BTreeMap<u16, BTreeSet<u16>>,
    /// Write `k` that no named ever answers (every replica's named times out on it): the
    /// executors claim it stuck after `STUCK_AFTER_MS`, through the log.
    hang: Option<u16>,
    /// Writes abandoned (sent or not), per node.
    abandoned: BTreeMap<u16, u32>,
}

/// The executors' local bound before a stuck claim, and between claims (simulated ms).
const STUCK_AFTER_MS: u64 = 10_000;
const STUCK_CLAIM_EVERY_MS: u64 = 5_000;

fn config(id: u16) -> ExecConfig {
    ExecConfig {
        id,
        faults: T,
        validity_s: 600,
        resign_after_s: 300,
        slice_interval_s: 20,
        slice_rrsets: 4,
        sign_zone_interval_s: 60,
        sign_zone_window_s: 40,
        sign_zone_verifiers: vec![pki().verifier.clone()],
        max_reads_in_flight: MAX_READS,
    }
}

impl Sim {
    fn new(seed: u64, batches: usize, nameds: [Named; N as usize]) -> Sim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let log = generate(&mut rng, batches);
        let nodes = (0..N)
            .map(|id| Node {
                core: ExecCore::new(config(id), Unchanged, ExecState::default()),
                named: nameds[usize::from(id)],
                zone: Zone::default(),
                next: 0,
                incarnation: 0,
                persisted: ExecState::default(),
                executed: 0,
                checkpoints: BTreeMap::new(),
                reads: BTreeMap::new(),
                write_in_flight: false,
                digesting: false,
                signings: 0,
                sign_seqs: Vec::new(),
                zone_set: vec![0],
            })
            .collect();
        let mut sim = Sim {
            rng,
            log,
            nodes,
            now_ms: 0,
            queue: BinaryHeap::new(),
            dues: BTreeMap::new(),
            next_due: 0,
            trace: Sha256::new(),
            answers_dropped: 0,
            max_reads_seen: 0,
            failures: Vec::new(),
            write_answers: BTreeMap::new(),
            hang: None,
            abandoned: BTreeMap::new(),
        };
        for id in 0..N {
            sim.schedule(0, id, Due::Deliver);
        }
        sim
    }

    fn schedule(&mut self, after_ms: u64, node: u16, due: Due) {
        self.next_due += 1;
        self.dues.insert(self.next_due, due);
        self.queue.push(Reverse((self.now_ms + after_ms, self.next_due, node)));
    }

    fn fail(&mut self, what: String) {
        if self.failures.len() < 20 {
            self.failures.push(format!("t={}ms: {what}", self.now_ms));
        }
    }

    fn run(&mut self, crashes: bool) {
        if crashes {
            // An honest replica's wrapper crashes now and then, at any point of a batch.
            for _ in 0..3 {
                let at = self.rng.next_u64() % 400_000;
                let node = 1 + (self.rng.next_u64() % u64::from(N - 1)) as u16;
                self.next_due += 1;
                self.dues.insert(self.next_due, Due::Crash);
                self.queue.push(Reverse((at, self.next_due, node)));
            }
        }
        let mut steps = 0u64;
        while let Some(Reverse((at, key, node))) = self.queue.pop() {
            steps += 1;
            assert!(steps < 5_000_000, "simulation does not end");
            self.now_ms = at;
            let Some(due) = self.dues.remove(&key) else { continue };
            self.step(node, due);
        }
    }

    fn step(&mut self, id: u16, due: Due) {
        let i = usize::from(id);
        let commands = match due {
            Due::Crash => {
                let n = &mut self.nodes[i];
                n.incarnation += 1;
                n.core = ExecCore::new(config(id), Unchanged, n.persisted.clone());
                n.next = usize::try_from(n.persisted.executed).unwrap();
                n.executed = n.persisted.executed;
                n.reads.clear();
                n.write_in_flight = false;
                n.digesting = false;
                // The ordering hands the restarted executor every committed batch past its
                // position again: their claims count anew.
                for (b, (_, requests)) in self.log.batches.iter().enumerate().skip(usize::try_from(n.persisted.executed).unwrap()) {
                    let cmds = n.core.committed(b as u64 + 1, requests.iter().map(|r| (r.origin, &r.payload[..])));
                    assert!(cmds.is_empty(), "a core running no batch abandons nothing");
                }
                self.schedule(1, id, Due::Deliver);
                return;
            }
            Due::StuckCheck { incarnation, seq, index } => {
                if incarnation != self.nodes[i].incarnation || self.nodes[i].core.stuck_write() != Some((seq, index)) {
                    return;
                }
                // Ordered: a batch after every one committed so far, seen by every node soon.
                let time_us = self.log.batches.last().map_or(start_s() * 1_000_000, |(t, _)| *t) + 1_000_000;
                let payload = Op::Stuck { seq, index }.encode();
                self.log.batches.push((time_us, vec![Logged { origin: id, payload, client_waits: false, expected_applied: None }]));
                let batch = self.log.batches.len() - 1;
                for j in 0..N {
                    let delay = 1 + self.rng.next_u64() % 50;
                    self.schedule(delay, j, Due::Committed { batch });
                    self.schedule(delay + 1, j, Due::Deliver);
                }
                self.schedule(STUCK_CLAIM_EVERY_MS, id, Due::StuckCheck { incarnation, seq, index });
                return;
            }
            Due::Committed { batch } => {
                let n = &mut self.nodes[i];
                let requests = &self.log.batches[batch].1;
                n.core.committed(batch as u64 + 1, requests.iter().map(|r| (r.origin, &r.payload[..])))
            }
            Due::Deliver => {
                let n = &mut self.nodes[i];
                if !n.core.is_idle() || n.next >= self.log.batches.len() {
                    return;
                }
                let (time_us, requests) = &self.log.batches[n.next];
                let seq = n.next as u64 + 1;
                let fresh = n.incarnation == 0;
                let requests = requests
                    .iter()
                    .enumerate()
                    .map(|(k, r)| Item {
                        origin: r.origin,
                        payload: r.payload.clone(),
                        // After a crash the gateway's clients are gone.
                        reply: (r.origin == id && r.client_waits && fresh).then_some(seq * 100 + k as u64),
                    })
                    .collect();
                n.next += 1;
                n.core.deliver(Delivered { seq, time_us: *time_us, checkpoint_due: seq.is_multiple_of(CHECKPOINT_EVERY), requests })
            }
            Due::Done { incarnation, effect, event } => {
                if incarnation != self.nodes[i].incarnation {
                    return;
                }
                let event = match (&effect, event) {
                    (Effect::Digest, Event::ZoneDigest { seq, .. }) => Event::ZoneDigest { seq, digests: Some(self.nodes[i].digests()) },
                    (_, event) => event,
                };
                self.apply(id, effect, &event);
                self.nodes[i].core.handle(event)
            }
        };
        self.perform(id, commands);
        if self.nodes[i].core.is_idle() {
            let pause = self.rng.next_u64() % 3;
            self.schedule(pause, id, Due::Deliver);
        }
    }

    /// What named did when it answered.
    fn apply(&mut self, id: u16, effect: Effect, event: &Event) {
        let i = usize::from(id);
        match effect {
            Effect::None => {}
            Effect::Digest => self.nodes[i].digesting = false,
            Effect::Write { k } => {
                self.nodes[i].write_in_flight = false;
                let honest_answer = rule_rcode(k) == ResponseCode::NoError;
                let deviates = self.nodes[i].named == Named::Deviates(k);
                if honest_answer && !deviates {
                    self.nodes[i].zone.applied.insert(k);
                }
            }
            Effect::Read { expected } => {
                let Event::ReadDone { id: read } = event else { return };
                self.nodes[i].reads.remove(read);
                let seen = self.nodes[i].zone.applied.len();
                let honest = !matches!(self.nodes[i].named, Named::Deviates(_));
                if let (Some(expected), true) = (expected, honest) {
                    if seen != expected {
                        self.fail(format!("replica {id}: a read saw {seen} writes, {expected} were ordered before it"));
                    }
                }
            }
            Effect::Sign { times } => {
                self.nodes[i].write_in_flight = false;
                if let Some(times) = times {
                    self.nodes[i].zone.signed_at = Some(times);
                    self.nodes[i].signings += 1;
                }
            }
            Effect::Slice { seq, due_before_s, times } => {
                self.nodes[i].write_in_flight = false;
                self.nodes[i].zone.slices.insert(seq, (due_before_s, times));
            }
            Effect::ZoneSet { zones } => {
                self.nodes[i].write_in_flight = false;
                self.nodes[i].zone_set = zones;
            }
        }
    }

    fn perform(&mut self, id: u16, commands: Vec<Command<u64>>) {
        let i = usize::from(id);
        for c in commands {
            self.trace.update(format!("{id} {c:?}\n").as_bytes());
            let inc = self.nodes[i].incarnation;
            match c {
                Command::Read { id: read, message, .. } => {
                    if self.nodes[i].write_in_flight {
                        self.fail(format!("replica {id}: a read was issued while a write runs"));
                    }
                    let expected = self
                        .log
                        .batches
                        .iter()
                        .flat_map(|(_, r)| r)
                        .find(|r| matches!(Op::decode(&r.payload), Ok(Op::Dns { message: m, .. }) if m == message))
                        .and_then(|r| r.expected_applied);
                    self.nodes[i].reads.insert(read, 0);
                    self.max_reads_seen = self.max_reads_seen.max(self.nodes[i].reads.len());
                    let delay = 1 + self.rng.next_u64() % 40;
                    self.schedule(delay, id, Due::Done { incarnation: inc, effect: Effect::Read { expected }, event: Event::ReadDone { id: read } });
                }
                Command::Write { seq, index, message, times } => {
                    if !self.nodes[i].reads.is_empty() || self.nodes[i].digesting {
                        self.fail(format!("replica {id}: a write was issued with {} reads in flight or a digest running", self.nodes[i].reads.len()));
                    }
                    if self.nodes[i].write_in_flight {
                        self.fail(format!("replica {id}: two writes at once"));
                    }
                    let _ = times;
                    self.nodes[i].write_in_flight = true;
                    let k = id_of(&message);
                    if self.hang == Some(k) {
                        // No answer ever; the executor's local bound runs.
                        let delay = STUCK_AFTER_MS + self.rng.next_u64() % 1_000;
                        self.schedule(delay, id, Due::StuckCheck { incarnation: inc, seq, index });
                        continue;
                    }
                    let rcode = if self.nodes[i].named == Named::Deviates(k) { ResponseCode::ServFail } else { rule_rcode(k) };
                    let delay = match self.nodes[i].named {
                        Named::Quick | Named::Deviates(_) | Named::SigningFails => 1 + self.rng.next_u64() % 5,
                        Named::Slow => 50 + self.rng.next_u64() % 500,
                        Named::Stalls if self.rng.next_u64().is_multiple_of(6) => 30_000 + self.rng.next_u64() % 120_000,
                        Named::Stalls => 1 + self.rng.next_u64() % 20,
                    };
                    let event = Event::WriteAnswered { seq, index, answer: answer(&message, rcode) };
                    self.schedule(delay, id, Due::Done { incarnation: inc, effect: Effect::Write { k }, event });
                }
                Command::BeginSigning { seq, times, .. } => {
                    if !self.nodes[i].reads.is_empty() || self.nodes[i].write_in_flight || self.nodes[i].digesting {
                        self.fail(format!("replica {id}: a signing began while reads or a write run"));
                    }
                    let _ = times;
                    let delay = 1 + self.rng.next_u64() % 50;
                    self.schedule(delay, id, Due::Done { incarnation: inc, effect: Effect::None, event: Event::SigningBegun { seq, result: Ok(()) } });
                }
                Command::FinishSigning { seq, run, times, .. } => {
                    if !self.nodes[i].reads.is_empty() || self.nodes[i].write_in_flight || self.nodes[i].digesting {
                        self.fail(format!("replica {id}: a signed zone was installed while reads or a write run"));
                    }
                    let _ = times;
                    self.nodes[i].write_in_flight = true;
                    // Waits for this replica's background part, then installs.
                    let delay = 100 + self.rng.next_u64() % 2000;
                    self.nodes[i].sign_seqs.push(seq);
                    // The run's agreed times (named's rule: inception an hour back).
                    let signed = (run.time_s as u32 - 3600, run.time_s as u32 + 600);
                    let (effect, result) = if self.nodes[i].named == Named::SigningFails {
                        (Effect::Sign { times: None }, Err("dnssec-signzone: disk full".to_string()))
                    } else {
                        (Effect::Sign { times: Some(signed) }, Ok(0))
                    };
                    self.schedule(delay, id, Due::Done { incarnation: inc, effect, event: Event::SigningFinished { seq, result } });
                }
                Command::ResignSlice { seq, times, due_before_s, max_rrsets, .. } => {
                    if !self.nodes[i].reads.is_empty() || self.nodes[i].write_in_flight || self.nodes[i].digesting {
                        self.fail(format!("replica {id}: a re-signing slice was issued while reads or a write run"));
                    }
                    self.nodes[i].write_in_flight = true;
                    // What named re-signs depends on the zone only: equal zones, equal counts;
                    // a slice executed again after a crash reports what it did the first time.
                    let resigned = match self.nodes[i].zone.resigned.get(&seq) {
                        Some(&n) => n,
                        None => (self.nodes[i].zone.applied.len() as u32).min(max_rrsets),
                    };
                    self.nodes[i].zone.resigned.insert(seq, resigned);
                    let delay = 1 + self.rng.next_u64() % 300;
                    let effect = Effect::Slice { seq, due_before_s, times: (times.inception, times.expiration) };
                    self.schedule(delay, id, Due::Done { incarnation: inc, effect, event: Event::SliceDone { seq, result: Ok(resigned) } });
                }
                Command::ChangeZoneSet { seq, zones, .. } => {
                    if !self.nodes[i].reads.is_empty() || self.nodes[i].write_in_flight || self.nodes[i].digesting {
                        self.fail(format!("replica {id}: the zone set changed while reads, a write or a digest run"));
                    }
                    self.nodes[i].write_in_flight = true;
                    let delay = 1 + self.rng.next_u64() % 200;
                    let effect = Effect::ZoneSet { zones: zones.keys().copied().collect() };
                    self.schedule(delay, id, Due::Done { incarnation: inc, effect, event: Event::ZoneSetChanged { seq } });
                }
                Command::DigestZone { seq } => {
                    if self.nodes[i].write_in_flight || self.nodes[i].digesting {
                        self.fail(format!("replica {id}: a zone digest was asked for while a zone change or another digest runs"));
                    }
                    self.nodes[i].digesting = true;
                    // Sometimes as long as a large zone's transfer: later batches run meanwhile.
                    let delay = if self.rng.next_u64().is_multiple_of(4) { 100 + self.rng.next_u64() % 400 } else { 1 + self.rng.next_u64() % 30 };
                    self.schedule(delay, id, Due::Done { incarnation: inc, effect: Effect::Digest, event: Event::ZoneDigest { seq, digests: None } });
                }
                Command::Answer { reply, bytes } => {
                    // No client ever reads: the answer is simply gone. Record write rcodes.
                    self.answers_dropped += 1;
                    if let Ok(m) = Message::from_vec(&bytes) {
                        if m.metadata.op_code == OpCode::Update {
                            self.write_answers.entry(m.metadata.id).or_default().insert(u16::from(m.metadata.response_code));
                        }
                    }
                    let _ = reply;
                }
                Command::Checkpoint { seq, digest, state } => {
                    if state.executed != seq {
                        self.fail(format!("replica {id}: checkpoint {seq} attests the state of batch {}", state.executed));
                    }
                    if self.nodes[i].checkpoints.insert(seq, digest).is_some_and(|d| d != digest) {
                        self.fail(format!("replica {id}: checkpoint {seq} reported twice with different digests"));
                    }
                }
                Command::Persist(state) => {
                    self.nodes[i].executed = state.executed;
                    self.nodes[i].persisted = state;
                }
                Command::AbandonWrite { .. } => {
                    // The task sending it, if any, is aborted.
                    self.nodes[i].write_in_flight = false;
                    *self.abandoned.entry(id).or_default() += 1;
                }
                Command::Executed(seq) => {
                    let before = self.nodes[i].executed;
                    if seq <= before {
                        self.fail(format!("replica {id}: batch {seq} reported executed after batch {before}"));
                    }
                    self.nodes[i].executed = seq;
                }
            }
        }
    }
}

fn check_honest_agree(sim: &Sim, honest: &[usize], batches: usize) -> Result<(), String> {
    let first = &sim.nodes[honest[0]];
    for &h in honest {
        let n = &sim.nodes[h];
        if n.executed != batches as u64 {
            return Err(format!("replica {h} executed {} of {batches} batches", n.executed));
        }
        // What was persisted last may name different batches (batches that changed nothing
        // are not written); the rest of the state must agree.
        let unpositioned = |s: &ExecState| ExecState { executed: 0, ..s.clone() };
        if n.core.state() != first.core.state() || unpositioned(&n.persisted) != unpositioned(&first.persisted) {
            return Err(format!("replica {h}'s state differs from replica {}'s", honest[0]));
        }
        if n.zone != first.zone || n.zone_set != first.zone_set {
            return Err(format!("replica {h}'s zone or zone set differs from replica {}'s", honest[0]));
        }
        for (seq, d) in &first.checkpoints {
            if n.checkpoints.get(seq).is_some_and(|x| x != d) {
                return Err(format!("replica {h}'s checkpoint {seq} differs"));
            }
        }
    }
    Ok(())
}

fn run_seed(seed: u64) -> Result<[u8; 32], String> {
    run_sim(seed).map(|sim| sim.trace.clone().finalize().into())
}

/// One seed's run, checked: honest replicas agree (state, zone, zone set, checkpoints).
fn run_sim(seed: u64) -> Result<Sim, String> {
    let batches = 120;
    let mut probe = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let slow = 1 + (probe.next_u64() % 3) as usize;
    let mut nameds = [Named::Quick; N as usize];
    nameds[slow] = Named::Slow;
    nameds[1 + slow % 3] = Named::Stalls;
    let mut sim = Sim::new(seed, batches, nameds);
    sim.run(true);
    if !sim.failures.is_empty() {
        return Err(sim.failures.join("\n"));
    }
    let honest: Vec<usize> = (0..usize::from(N)).collect();
    check_honest_agree(&sim, &honest, batches)?;
    if sim.max_reads_seen > MAX_READS {
        return Err(format!("{} reads in flight at one replica, bound {MAX_READS}", sim.max_reads_seen));
    }
    // Every write the clients got an answer for carries the rcode every named gave.
    for (k, codes) in &sim.write_answers {
        let want = u16::from(rule_rcode(*k));
        if codes.iter().any(|c| *c != want) {
            return Err(format!("write {k} answered {codes:?}, named's rule says {want}"));
        }
    }
    if sim.nodes[0].checkpoints.len() != batches / CHECKPOINT_EVERY as usize {
        return Err(format!("{} checkpoints, expected {}", sim.nodes[0].checkpoints.len(), batches / CHECKPOINT_EVERY as usize));
    }
    Ok(sim)
}

/// The running test's campaign (the workspace's seed convention, crates/testkit): `SIM_SEEDS`
/// runs more seeds, `SIM_SEED` replays one, a failure prints its replay line.
fn campaign(ci_count: u64) -> testkit::Campaign {
    testkit::Campaign::here("exec", "exec_core_sim", ci_count)
}

#[test]
fn honest_replicas_agree_with_slow_stalling_named_and_crashing_wrappers() {
    campaign(200).run(1, |seed| run_seed(seed).map(|_| ()));
}

/// Zones added and removed in the seeded log (with crashes, slow and stalling nameds):
/// honest replicas end with the same zone set, state and checkpoints (`run_sim`'s checks), and
/// the campaign does change the zone set.
#[test]
fn zones_added_and_removed_in_the_log_leave_honest_replicas_agreeing() {
    let mut changed = 0;
    for seed in 0..24 {
        let sim = run_sim(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let state = sim.nodes[0].core.state();
        if state.zone_set.keys().any(|&i| i > 0) || state.next_zone_index > 1 {
            changed += 1;
            assert_eq!(sim.nodes[0].zone_set, state.zone_set.keys().copied().collect::<Vec<_>>(), "seed {seed}: named serves the state's zone set");
        }
    }
    assert!(changed >= 6, "only {changed} of 24 seeds changed the zone set");
}

#[test]
fn same_seed_same_trace() {
    for seed in [3, 17, 99] {
        assert_eq!(run_seed(seed).unwrap(), run_seed(seed).unwrap(), "seed {seed} is not reproducible");
    }
    assert_ne!(run_seed(3).unwrap(), run_seed(4).unwrap(), "different seeds take different paths");
}

/// A named that answers one write differently (SERVFAIL, not applied) makes its
/// replica's next checkpoint differ from every honest replica's, and only from then on.
#[test]
fn a_named_that_answers_differently_is_visible_at_the_next_checkpoint() {
    for seed in 0..20 {
        let batches = 60;
        // Find the write the deviating named will get wrong: the first one in the log.
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let log = generate(&mut rng, batches);
        let (first_batch, k) = log
            .batches
            .iter()
            .enumerate()
            .find_map(|(b, (_, r))| {
                r.iter().find_map(|x| match Op::decode(&x.payload) {
                    Ok(Op::Dns { message, .. }) if Message::from_vec(&message).unwrap().metadata.op_code == OpCode::Update => Some((b, id_of(&message))),
                    _ => None,
                })
            })
            .expect("a write in the log");
        if rule_rcode(k) != ResponseCode::NoError {
            continue;
        }
        let mut sim = Sim::new(seed, batches, [Named::Quick, Named::Quick, Named::Slow, Named::Deviates(k)]);
        sim.run(false);
        check_honest_agree(&sim, &[0, 1, 2], batches).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let deviating_seq = first_batch as u64 + 1;
        let honest = &sim.nodes[0].checkpoints;
        let odd = &sim.nodes[3].checkpoints;
        for (seq, d) in honest {
            if *seq < deviating_seq {
                assert_eq!(odd.get(seq), Some(d), "seed {seed}: checkpoint {seq} precedes the deviation");
            } else {
                assert_ne!(odd.get(seq), Some(d), "seed {seed}: checkpoint {seq} must expose replica 3's named");
            }
        }
    }
}

/// A replica whose whole-zone signing fails while the others' succeed is visibly
/// different from the first checkpoint after that signing on.
#[test]
fn a_failed_signing_at_one_replica_is_visible_at_the_next_checkpoint() {
    let mut exercised = 0;
    for seed in 0..30 {
        let batches = 80;
        let mut sim = Sim::new(seed, batches, [Named::Quick, Named::Slow, Named::Quick, Named::SigningFails]);
        sim.run(false);
        check_honest_agree(&sim, &[0, 1, 2], batches).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(sim.failures.is_empty(), "seed {seed}: {:?}", sim.failures);
        // The first signing is decided alike; after it failed at replica 3, its state
        // differs (no new last signing time), and so may its later decisions.
        assert_eq!(sim.nodes[3].sign_seqs.first(), sim.nodes[0].sign_seqs.first(), "seed {seed}: the first signing is decided alike");
        let Some(&first) = sim.nodes[0].sign_seqs.first() else { continue };
        exercised += 1;
        for (seq, d) in &sim.nodes[0].checkpoints {
            let odd = sim.nodes[3].checkpoints.get(seq);
            if *seq < first {
                assert_eq!(odd, Some(d), "seed {seed}: checkpoint {seq} precedes the failed signing");
            } else {
                assert_ne!(odd, Some(d), "seed {seed}: checkpoint {seq} must expose the failed signing");
            }
        }
    }
    assert!(exercised >= 5, "only {exercised} seeds had a signing");
}

/// Gate that refuses every update whose id is odd (as an authentication module would
/// refuse a bad signature): not forwarded, the refusal's rcode recorded everywhere.
struct OddRefused;

impl UpdateGate for OddRefused {
    fn decide(&self, message: &[u8], _agreed_time_s: u64) -> UpdateDecision {
        if id_of(message) % 2 == 1 {
            UpdateDecision::Refuse { rcode: u16::from(ResponseCode::NotAuth), answer: answer(message, ResponseCode::NotAuth) }
        } else {
            UpdateDecision::Forward(message.to_vec())
        }
    }
    fn answer_for_client(&self, _request: &[u8], named_answer: &[u8]) -> Vec<u8> {
        let mut a = named_answer.to_vec();
        a.push(0xaa);
        a
    }
}

/// The answers among `cmds`: (reply handle, text).
fn answer_texts(cmds: &[Command<u64>]) -> Vec<(u64, String)> {
    cmds.iter()
        .filter_map(|c| match c {
            Command::Answer { reply, bytes } => Some((*reply, String::from_utf8_lossy(bytes).into_owned())),
            _ => None,
        })
        .collect()
}

fn batch(seq: u64, time_s: u64, requests: Vec<(u16, Op, Option<u64>)>) -> Delivered<u64> {
    Delivered {
        seq,
        time_us: time_s * 1_000_000,
        checkpoint_due: false,
        requests: requests.into_iter().map(|(origin, op, reply)| Item { origin, payload: op.encode(), reply }).collect(),
    }
}

#[test]
fn the_gate_decides_what_reaches_named_and_what_the_client_gets() {
    let mut core = ExecCore::new(config(0), OddRefused, ExecState::default());
    let mut refused = ExecState::default();
    let cmds =
        core.deliver(batch(1, start_s(), vec![(0, Op::Dns { tcp: true, message: update(1) }, Some(7)), (1, Op::Dns { tcp: true, message: update(2) }, None)]));
    // Update 1 is refused without reaching named; its client gets the gate's answer.
    assert_eq!(cmds[0], Command::Answer { reply: 7, bytes: answer(&update(1), ResponseCode::NotAuth) });
    refused.record(1, 0, u32::from(u16::from(ResponseCode::NotAuth)));
    let Command::Write { seq: 1, index: 1, .. } = &cmds[1] else { panic!("update 2 goes to named: {cmds:?}") };
    assert_eq!(cmds.len(), 2, "nothing else before named answers: {cmds:?}");
    let cmds = core.handle(Event::WriteAnswered { seq: 1, index: 1, answer: answer(&update(2), ResponseCode::NoError) });
    refused.record(1, 1, 0);
    refused.executed = 1;
    assert_eq!(cmds, vec![Command::Persist(refused)]);
}

#[test]
fn answers_go_to_the_gateway_only_and_through_the_gate() {
    let mut core = ExecCore::new(config(2), OddRefused, ExecState::default());
    let cmds = core.deliver(batch(1, start_s(), vec![(2, Op::Dns { tcp: false, message: update(4) }, Some(9))]));
    assert!(matches!(cmds[..], [Command::Write { .. }]), "{cmds:?}");
    let named = answer(&update(4), ResponseCode::NoError);
    let cmds = core.handle(Event::WriteAnswered { seq: 1, index: 0, answer: named.clone() });
    let mut want = named;
    want.push(0xaa);
    assert_eq!(cmds[0], Command::Answer { reply: 9, bytes: want });
    // A read ordered by another gateway is not executed here.
    let cmds = core.deliver(batch(2, start_s() + 1, vec![(1, Op::Dns { tcp: false, message: query(5) }, None)]));
    assert_eq!(cmds, vec![Command::Executed(2)], "a batch of reads changes nothing durable");
}

#[test]
fn only_batches_that_change_the_state_and_checkpoints_are_persisted() {
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    // Reads only: executed, nothing to write.
    let cmds = core.deliver(batch(1, start_s(), vec![(1, Op::Dns { tcp: false, message: query(1) }, None)]));
    assert_eq!(cmds, vec![Command::Executed(1)]);
    // A read-only checkpoint batch is always written (a restart must not compute its digest
    // again), and its digest is computed after it.
    let mut checkpoint = batch(2, start_s(), vec![(1, Op::Dns { tcp: false, message: query(2) }, None)]);
    checkpoint.checkpoint_due = true;
    let cmds = core.deliver(checkpoint);
    assert!(matches!(&cmds[..], [Command::Persist(s), Command::DigestZone { seq: 2 }] if s.executed == 2), "{cmds:?}");
    // A write waits for the digest; the reads of the batch around it do not.
    let reads_around = |seq, at: u16| batch(seq, start_s(), vec![(at, Op::Dns { tcp: false, message: query(at) }, None)]);
    assert_eq!(core.deliver(reads_around(3, 5)), vec![Command::Executed(3)]);
    let cmds = core.deliver(batch(4, start_s(), vec![(1, Op::Dns { tcp: true, message: update(3) }, None)]));
    assert!(cmds.is_empty(), "a write went ahead of the checkpoint's digest: {cmds:?}");
    let cmds = core.handle(Event::ZoneDigest { seq: 2, digests: Some(vec![[7; 32]]) });
    let Some(Command::Checkpoint { seq: 2, state, .. }) = cmds.first() else { panic!("{cmds:?}") };
    assert_eq!(state.executed, 2, "the checkpoint attests its own batch's state");
    let Some(Command::Write { seq, index, .. }) = cmds.get(1) else { panic!("{cmds:?}") };
    let cmds = core.handle(Event::WriteAnswered { seq: *seq, index: *index, answer: answer(&update(3), ResponseCode::NoError) });
    assert!(matches!(&cmds[..], [Command::Persist(s)] if s.executed == 4), "{cmds:?}");
    let cmds = core.deliver(batch(5, start_s(), vec![]));
    assert_eq!(cmds, vec![Command::Executed(5)]);
}

/// Delivers one batch and completes every command at once (a slice re-signs what it
/// may); returns the answers, the signings installed and the slices issued
/// (horizon, size). A background signing that began is finished right after by
/// votes from replicas 0 and 1 (t+1), in a batch of its own at the same agreed time.
fn drive(core: &mut ExecCore<u64, Unchanged>, seq: &mut u64, time_s: u64, requests: Vec<(u16, Op, Option<u64>)>) -> (Vec<String>, usize, Vec<(u32, u32)>) {
    let (mut texts, mut ran, mut slices) = (Vec::new(), 0, Vec::new());
    *seq += 1;
    let mut cmds = core.deliver(batch(*seq, time_s, requests));
    loop {
        while let Some(c) = cmds.pop() {
            match c {
                Command::BeginSigning { seq, times, .. } => {
                    assert_eq!(u64::from(times.expiration), time_s + 600, "signed with the beginning batch's agreed times");
                    cmds.extend(core.handle(Event::SigningBegun { seq, result: Ok(()) }));
                }
                Command::FinishSigning { seq, .. } => {
                    ran += 1;
                    cmds.extend(core.handle(Event::SigningFinished { seq, result: Ok(0) }));
                }
                Command::ResignSlice { seq, times, due_before_s, max_rrsets, .. } => {
                    assert_eq!(u64::from(times.expiration), time_s + 600, "the slice signs with the batch's agreed times");
                    slices.push((due_before_s, max_rrsets));
                    cmds.extend(core.handle(Event::SliceDone { seq, result: Ok(max_rrsets) }));
                }
                Command::Answer { bytes, reply } => {
                    // Votes are sent without a reply handle; anything else answers a request.
                    let _ = reply;
                    texts.push(String::from_utf8(bytes).unwrap());
                }
                Command::Persist(_) | Command::Executed(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(core.is_idle());
        if core.state().zone(0).signing.is_none() {
            return (texts, ran, slices);
        }
        *seq += 1;
        let run = core.state().zone(0).signing.map(|r| r.seq).unwrap_or(0);
        cmds = core.deliver(batch(*seq, time_s, vec![(0, finish(0, run), None), (1, finish(1, run), None)]));
    }
}

/// Drives one core through a sequence of sign-zone/resign requests, with every command
/// completed at once; returns how many signings ran and the admins' answers.
fn signings(requests: &[(u64, u16, Op)]) -> (usize, Vec<String>) {
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let (mut ran, mut texts, mut seq) = (0, Vec::new(), 0);
    for (time_s, origin, op) in requests {
        let reply = Some(seq + 1);
        let (t, r, _) = drive(&mut core, &mut seq, *time_s, vec![(*origin, op.clone(), reply)]);
        texts.extend(t);
        ran += r;
    }
    (ran, texts)
}

#[test]
fn sign_zone_needs_t_plus_one_replicas_and_is_rate_limited() {
    let s = start_s();
    // One replica asking, however often, does not sign.
    let (ran, texts) = signings(&[(s, 3, sz(3, s)), (s + 1, 3, sz(3, s + 1)), (s + 2, 3, sz(3, s + 2))]);
    assert_eq!(ran, 0, "{texts:?}");
    assert!(texts.iter().all(|t| t.starts_with("waiting: 1 of the 2")), "{texts:?}");
    // Two distinct replicas (t+1 = 2) do, once.
    let (ran, texts) = signings(&[(s, 3, sz(3, s)), (s + 1, 1, sz(1, s + 1))]);
    assert_eq!(ran, 1, "{texts:?}");
    assert_eq!(texts.last().map(String::as_str), Some("signed at seq 2"));
    // Requests used up by a signing do not count again; within the interval more are refused.
    let (ran, texts) = signings(&[(s, 3, sz(3, s)), (s + 1, 1, sz(1, s + 1)), (s + 2, 0, sz(0, s + 2)), (s + 3, 2, sz(2, s + 3))]);
    assert_eq!(ran, 1, "{texts:?}");
    assert!(texts[2].starts_with("refused") && texts[3].starts_with("refused"), "{texts:?}");
    // After the interval (60 s here), two new requests sign again.
    let (ran, _) = signings(&[(s, 3, sz(3, s)), (s + 1, 1, sz(1, s + 1)), (s + 61, 0, sz(0, s + 61)), (s + 62, 2, sz(2, s + 62))]);
    assert_eq!(ran, 2);
    // A request older than the window (40 s) no longer counts.
    let (ran, texts) = signings(&[(s, 3, sz(3, s)), (s + 41, 1, sz(1, s + 41))]);
    assert_eq!(ran, 0, "{texts:?}");
}

/// Drives one core through ordered requests, completing every command at once;
/// returns the re-signing slices it issued (agreed time, horizon, slice size).
fn slices(requests: &[(u64, u16, Op)]) -> Vec<(u64, u32, u32)> {
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let (mut out, mut seq) = (Vec::new(), 0);
    for (time_s, origin, op) in requests {
        let reply = Some(seq + 1);
        let (_, _, slices) = drive(&mut core, &mut seq, *time_s, vec![(*origin, op.clone(), reply)]);
        out.extend(slices.into_iter().map(|(due, size)| (*time_s, due, size)));
    }
    out
}

#[test]
fn re_signing_runs_in_slices_at_most_once_per_interval_of_agreed_time() {
    let s = start_s();
    // Never signed: no slice. Signed at s+1: slices from then on, at most one per 20 s,
    // each re-signing what expires within validity - resign_after (600 - 300 s).
    let got = slices(&[
        (s, 3, Op::Resign),
        (s, 3, sz(3, s)),
        (s + 1, 1, sz(1, s + 1)),
        (s + 2, 2, Op::Resign),
        (s + 3, 0, Op::Resign),
        (s + 21, 1, Op::Resign),
        (s + 22, 3, Op::Resign),
        (s + 50, 2, Op::Resign),
    ]);
    let horizon = |t: u64| (t + 300) as u32;
    assert_eq!(got, vec![(s + 2, horizon(s + 2), 4), (s + 22, horizon(s + 22), 4), (s + 50, horizon(s + 50), 4)]);
}

#[test]
fn a_slice_waits_for_the_reads_ordered_before_it() {
    let mut core = ExecCore::new(config(0), Unchanged, {
        let mut st = ExecState::default();
        st.zone_mut(0).last_signed_s = start_s();
        st
    });
    let cmds = core.deliver(batch(1, start_s() + 10, vec![(0, Op::Dns { tcp: false, message: query(1) }, Some(1)), (2, Op::Resign, None)]));
    let read = cmds
        .iter()
        .find_map(|c| match c {
            Command::Read { id, .. } => Some(*id),
            _ => None,
        })
        .expect("the read runs");
    assert!(!cmds.iter().any(|c| matches!(c, Command::ResignSlice { .. })), "{cmds:?}");
    let cmds = core.handle(Event::ReadDone { id: read });
    let Some(Command::ResignSlice { seq, .. }) = cmds.first() else { panic!("the slice follows the read: {cmds:?}") };
    let before = core.state().outcomes;
    let cmds = core.handle(Event::SliceDone { seq: *seq, result: Ok(3) });
    assert!(matches!(cmds.last(), Some(Command::Persist(_))), "{cmds:?}");
    assert_ne!(core.state().outcomes, before, "the slice's outcome is in the chain");
}

/// What a Byzantine primary (replica 3 here) can put into its batches in the name of
/// replicas 0, 1 and 2 without their keys.
fn forgeries(time_s: u64) -> Vec<(u16, Op)> {
    let p = pki();
    let own = p.signers[3].sign_at(time_s * 1_000_000).unwrap();
    let mut out = Vec::new();
    for victim in 0..3u16 {
        // Its own genuine request, ordered as the victim's.
        out.push((victim, Op::SignZone(own.clone())));
        // Its own request relabelled: claims the victim, carries its own certificate.
        out.push((victim, Op::SignZone(SignZoneAuth { replica: victim, ..own.clone() })));
        // The victim's certificate (public) with its own signature.
        let cert = p.signers[victim as usize].sign_at(1).unwrap().cert;
        let mine = p.signers[3].sign_at(time_s * 1_000_000 + 1).unwrap();
        out.push((victim, Op::SignZone(SignZoneAuth { replica: victim, cert, signature: mine.signature, stamp_us: mine.stamp_us })));
        // A certificate for the victim's id from a CA of its own making.
        out.push((victim, Op::SignZone(p.outsiders[victim as usize].sign_at(time_s * 1_000_000).unwrap())));
        // A garbage signature.
        let mut bad = p.signers[victim as usize].sign_at(time_s * 1_000_000).unwrap();
        bad.signature = vec![0x30; 8];
        out.push((victim, Op::SignZone(bad)));
    }
    out
}

#[test]
fn a_byzantine_primary_cannot_forge_the_t_plus_one() {
    let s = start_s();
    let mut log: Vec<(u64, u16, Op)> = vec![(s, 3, sz(3, s))];
    log.extend(forgeries(s + 1).into_iter().map(|(origin, op)| (s + 1, origin, op)));
    let (ran, texts) = signings(&log);
    assert_eq!(ran, 0, "{texts:?}");
    assert!(texts[0].starts_with("waiting: 1 of the 2"), "{texts:?}");
    assert!(texts[1..].iter().all(|t| t.starts_with("refused")), "{texts:?}");
    // One genuine request from another replica completes it, where it is ordered.
    log.push((s + 2, 1, sz(1, s + 2)));
    let (ran, texts) = signings(&log);
    assert_eq!(ran, 1, "{texts:?}");
    assert_eq!(texts.last().map(String::as_str), Some(format!("signed at seq {}", log.len()).as_str()));
}

#[test]
fn a_signed_request_counts_once_and_not_late() {
    let s = start_s();
    let a = sz(1, s);
    // Replayed while still pending: still one replica.
    let (ran, texts) = signings(&[(s, 1, a.clone()), (s + 1, 1, a.clone()), (s + 2, 1, a.clone())]);
    assert_eq!(ran, 0, "{texts:?}");
    assert!(texts[1].starts_with("refused") && texts[1].contains("not newer"), "{texts:?}");
    // Used by a signing, then replayed once the interval (60 s) is over: does not count.
    let b = sz(3, s + 39);
    let (ran, texts) = signings(&[(s + 38, 1, sz(1, s + 38)), (s + 39, 3, b.clone()), (s + 100, 3, b.clone()), (s + 101, 1, sz(1, s + 101))]);
    assert_eq!(ran, 1, "{texts:?}");
    assert!(texts[2].contains("not newer"), "{texts:?}");
    assert!(texts[3].starts_with("waiting: 1 of the 2"), "{texts:?}");
    // Ordered more than the window (40 s) after it was signed: refused, and a fresh one counts.
    let (ran, texts) = signings(&[(s + 41, 1, sz(1, s)), (s + 42, 3, sz(3, s + 42)), (s + 43, 1, sz(1, s + 43))]);
    assert_eq!(ran, 1, "{texts:?}");
    assert!(texts[0].starts_with("refused") && texts[0].contains("more than 40 s"), "{texts:?}");
    // Signed for another zone: refused.
    let (ran, texts) = signings(&[(s, 1, sz(1, s)), (s, 3, Op::SignZone(pki().other_zone[3].sign_at(s * 1_000_000).unwrap()))]);
    assert_eq!(ran, 0, "{texts:?}");
}

#[test]
fn a_rollover_finishes_once_t_plus_one_replicas_report_and_never_again() {
    let s = start_s();
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let mut seq = 0;
    let mut step = |core: &mut ExecCore<u64, Unchanged>, time_s: u64, origin: u16, op: Op| {
        let reply = Some(seq + 1);
        drive(core, &mut seq, time_s, vec![(origin, op, reply)])
    };
    // One replica reporting, however often, does not finish it (t+1 = 2).
    for k in 0..3 {
        let (texts, ran, _) = step(&mut core, s + k, 3, report(3, s + k));
        assert_eq!(ran, 0, "{texts:?}");
        assert_eq!(texts, vec!["counted: 1 of the 2 replicas needed saw the new DS".to_string()]);
    }
    // What a Byzantine primary (replica 3) can order in others' names counts for nobody: its
    // own report relabelled, another replica's sign-zone request (another label), a report
    // for another zone, one stamped outside the window, a garbage signature.
    let mine = pki().signers[3].sign_rollover_at((s + 3) * 1_000_000).unwrap();
    let mut bad = pki().signers[1].sign_rollover_at((s + 3) * 1_000_000).unwrap();
    bad.signature = vec![0x30; 8];
    let forged = [
        (1, Op::RolloverReport { zone: 0, auth: SignZoneAuth { replica: 1, ..mine.clone() } }),
        (1, Op::RolloverReport { zone: 0, auth: mine }),
        (1, Op::RolloverReport { zone: 0, auth: pki().signers[1].sign_at((s + 3) * 1_000_000).unwrap() }),
        (1, Op::RolloverReport { zone: 0, auth: pki().other_zone[1].sign_rollover_at((s + 3) * 1_000_000).unwrap() }),
        (1, report(1, s - 60)),
        (1, Op::RolloverReport { zone: 0, auth: bad }),
        (1, Op::RolloverReport { zone: 7, auth: pki().signers[1].sign_rollover_at((s + 3) * 1_000_000).unwrap() }),
    ];
    for (origin, op) in forged {
        let (texts, ran, _) = step(&mut core, s + 3, origin, op);
        assert_eq!(ran, 0, "{texts:?}");
        assert!(texts.iter().all(|t| t.starts_with("refused")), "{texts:?}");
    }
    assert!(!core.rollover_finished(0));
    assert_eq!(core.state().zone(0).rollover_reports, [3].into());
    // A second replica's genuine report finishes it: a whole-zone signing at that point.
    let (texts, ran, _) = step(&mut core, s + 4, 1, report(1, s + 4));
    assert_eq!(ran, 1, "{texts:?}");
    assert!(core.rollover_finished(0));
    let z = core.state().zone(0);
    assert_eq!((z.rollover_finished_s, z.last_signed_s, z.rollover_reports.len()), (s + 4, s + 4, 0));
    // Later reports are answered, change nothing, sign nothing.
    let before = core.state().clone();
    for origin in [0, 2] {
        let (texts, ran, _) = step(&mut core, s + 5, origin, report(origin, s + 5));
        assert_eq!(ran, 0, "{texts:?}");
        assert_eq!(texts, vec![format!("finished: the rollover ended at agreed time {}", s + 4)]);
    }
    assert_eq!(core.state().zones, before.zones);
}

#[test]
fn a_rollover_report_waits_for_a_running_signing_to_be_over() {
    let s = start_s();
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    // A signing begins (two sign-zone requests) and is not finished yet.
    let cmds = core.deliver(batch(1, s, vec![(2, sz(2, s), None), (3, sz(3, s), None)]));
    let Some(Command::BeginSigning { seq, .. }) = cmds.iter().find(|c| matches!(c, Command::BeginSigning { .. })) else { panic!("{cmds:?}") };
    let cmds = core.handle(Event::SigningBegun { seq: *seq, result: Ok(()) });
    assert!(core.is_idle(), "{cmds:?}");
    let cmds = core.deliver(batch(2, s + 1, vec![(1, report(1, s + 1), Some(7)), (3, report(3, s + 1), Some(8))]));
    let texts = answer_texts(&cmds);
    assert!(texts.iter().all(|(_, t)| t.starts_with("refused: a whole-zone signing is running")), "{texts:?}");
    assert!(core.state().zone(0).rollover_reports.is_empty() && !core.rollover_finished(0));
}

#[test]
fn a_write_waits_for_reads_ordered_before_it_and_reads_after_wait_for_it() {
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let cmds = core.deliver(batch(
        1,
        start_s(),
        vec![
            (0, Op::Dns { tcp: false, message: query(1) }, Some(1)),
            (0, Op::Dns { tcp: true, message: update(2) }, None),
            (0, Op::Dns { tcp: false, message: query(3) }, Some(3)),
        ],
    ));
    assert!(matches!(cmds[..], [Command::Read { id: 1, .. }]), "only the first read before the write: {cmds:?}");
    assert_eq!(core.reads_in_flight(), 1);
    let cmds = core.handle(Event::ReadDone { id: 1 });
    assert!(matches!(cmds[..], [Command::Write { .. }]), "{cmds:?}");
    let cmds = core.handle(Event::WriteAnswered { seq: 1, index: 1, answer: answer(&update(2), ResponseCode::NoError) });
    assert!(matches!(cmds[..], [Command::Read { id: 2, .. }, Command::Persist(_)]), "{cmds:?}");
    // The next batch may start while that read runs.
    assert!(core.is_idle());
    // Stale or foreign events change nothing.
    assert!(core.handle(Event::WriteAnswered { seq: 1, index: 1, answer: vec![] }).is_empty());
    assert!(core.handle(Event::ReadDone { id: 99 }).is_empty());
}

#[test]
fn read_slots_are_bounded_and_no_client_holds_the_core() {
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let requests = (0..(MAX_READS as u16 + 3)).map(|k| (0, Op::Dns { tcp: true, message: query(k) }, Some(u64::from(k)))).collect();
    let cmds = core.deliver(batch(1, start_s(), requests));
    assert_eq!(cmds.len(), MAX_READS, "{cmds:?}");
    assert!(!core.is_idle());
    let cmds = core.handle(Event::ReadDone { id: 1 });
    assert!(matches!(cmds[..], [Command::Read { .. }]), "one slot freed, one read issued: {cmds:?}");
    // An undecodable named answer is recorded as such, not as success.
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let _ = core.deliver(batch(1, start_s(), vec![(1, Op::Dns { tcp: true, message: update(2) }, None)]));
    let cmds = core.handle(Event::WriteAnswered { seq: 1, index: 0, answer: vec![1, 2, 3] });
    let mut good = ExecCore::new(config(0), Unchanged, ExecState::default());
    let _ = good.deliver(batch(1, start_s(), vec![(1, Op::Dns { tcp: true, message: update(2) }, None)]));
    let good_cmds = good.handle(Event::WriteAnswered { seq: 1, index: 0, answer: answer(&update(2), ResponseCode::NoError) });
    assert_ne!(cmds, good_cmds);
}

/// Update `k` carrying a TSIG record (time signed, fudge); the MAC is not checked here.
fn signed_update(k: u16, time_signed: u64, fudge: u16) -> Vec<u8> {
    use hickory_proto::rr::rdata::tsig::{TsigAlgorithm, TSIG};
    let mut m = Message::from_vec(&update(k)).unwrap();
    let tsig = TSIG::new(TsigAlgorithm::HmacSha256, time_signed, fudge, vec![0x11; 32], k, None, Vec::new());
    m.signature = Some(Box::new(Record::from_rdata(Name::from_ascii("tsig-key.").unwrap(), 0, tsig)));
    m.to_vec().unwrap()
}

/// Per batch: whether the write went to named, and what the client got.
type Seen = Vec<(bool, Option<Vec<u8>>)>;

/// Runs batches of single writes through a core, named answering each at once; returns
/// what happened per batch, and the final state.
fn writes(state: ExecState, batches: &[(u64, u64, Vec<u8>)], named_answer: &dyn Fn(&[u8]) -> Vec<u8>) -> (Seen, ExecState) {
    let mut core = ExecCore::new(config(0), Unchanged, state);
    let mut seen = Vec::new();
    for (seq, time_s, message) in batches {
        let mut cmds = core.deliver(batch(*seq, *time_s, vec![(0, Op::Dns { tcp: true, message: message.clone() }, Some(*seq))]));
        let mut forwarded = false;
        let mut answer = None;
        while let Some(c) = cmds.pop() {
            match c {
                Command::Write { seq, index, message, .. } => {
                    forwarded = true;
                    cmds.extend(core.handle(Event::WriteAnswered { seq, index, answer: named_answer(&message) }));
                }
                Command::Answer { bytes, .. } => answer = Some(bytes),
                Command::Persist(_) | Command::Executed(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        seen.push((forwarded, answer));
    }
    (seen, core.state().clone())
}

#[test]
fn an_identical_retransmission_within_its_tsig_window_is_executed_once() {
    let s = start_s();
    let update = signed_update(5, s, 300);
    let named = |m: &[u8]| {
        let mut a = answer(m, ResponseCode::NoError);
        a.extend_from_slice(b"named's tsig");
        a
    };
    let (seen, state) = writes(ExecState::default(), &[(1, s + 1, update.clone()), (2, s + 20, update.clone()), (3, s + 301, update.clone())], &named);
    assert!(seen[0].0, "the first copy goes to named");
    assert!(!seen[1].0, "the retransmission does not");
    assert_eq!(seen[1].1, seen[0].1, "and gets the first execution's answer");
    assert!(seen[2].0, "after the window closed it is not a retransmission any more");

    // A replica that restarted (state from disk, no cached answers) decides alike and
    // answers with the first execution's rcode.
    let (first, state1) = writes(ExecState::default(), &[(1, s + 1, update.clone())], &named);
    assert!(first[0].0);
    // The remembered write is part of what checkpoints attest; its window closed by the
    // end of the first run.
    assert_eq!(state1.recent_writes.len(), 1);
    assert!(state.recent_writes.is_empty());
    let (again, _) = writes(state1, &[(2, s + 20, update.clone())], &named);
    assert!(!again[0].0);
    let got = Message::from_vec(again[0].1.as_ref().unwrap()).unwrap();
    assert_eq!((got.metadata.id, got.metadata.response_code), (5, ResponseCode::NoError));

    // Unsigned updates have no window: every copy is executed (named judges them).
    let (plain, _) = writes(ExecState::default(), &[(1, s + 1, update_plain(6)), (2, s + 2, update_plain(6))], &named);
    assert!(plain[0].0 && plain[1].0);
    // Nor does a TSIG claiming a time beyond its fudge in the future (named refuses it).
    let future = signed_update(7, s + 10_000, 300);
    let (seen, state) = writes(ExecState::default(), &[(1, s + 1, future.clone()), (2, s + 2, future)], &named);
    assert!(seen[0].0 && seen[1].0);
    assert!(state.recent_writes.is_empty());
}

fn update_plain(k: u16) -> Vec<u8> {
    update(k)
}

/// A retransmission (the same bytes again) is not executed; its client gets named's first
/// answer as the gate hands it to clients (re-signed for the client's key in the product),
/// not named's own bytes, which carry the replica-local key.
#[test]
fn a_retransmission_gets_the_first_answer_through_the_gate() {
    let mut core = ExecCore::new(config(0), OddRefused, ExecState::default());
    let t = start_s();
    // Even: the OddRefused gate forwards it.
    let request = signed_update(2, t, 300);
    let cmds = core.deliver(batch(1, t, vec![(0, Op::Dns { tcp: false, message: request.clone() }, Some(1))]));
    assert!(matches!(cmds[..], [Command::Write { seq: 1, index: 0, .. }]), "{cmds:?}");
    let named = answer(&request, ResponseCode::NoError);
    let first = core.handle(Event::WriteAnswered { seq: 1, index: 0, answer: named.clone() });
    let Command::Answer { reply: 1, bytes: first_answer } = &first[0] else { panic!("{first:?}") };
    // The copy, ordered later through another gateway and through this one.
    let cmds = core.deliver(batch(2, t + 5, vec![(0, Op::Dns { tcp: false, message: request.clone() }, Some(2))]));
    assert_eq!(cmds[0], Command::Answer { reply: 2, bytes: first_answer.clone() }, "not the first answer as the client got it");
    // Decided without named: executing the batch again after a restart decides alike, so
    // it is not written.
    assert!(matches!(cmds[1..], [Command::Executed(2)]), "executed again: {cmds:?}");
}

/// A TSIG'd update replayed under another header id (the MAC covers the original id, so it
/// still verifies) is the same write: executed once.
#[test]
fn a_replay_under_another_header_id_is_executed_once() {
    let s = start_s();
    let update = signed_update(5, s, 300);
    let mut replay = update.clone();
    replay[..2].copy_from_slice(&0x7777u16.to_be_bytes());
    let named = |m: &[u8]| answer(m, ResponseCode::NoError);
    let (seen, state) = writes(ExecState::default(), &[(1, s + 1, update), (2, s + 2, replay)], &named);
    assert!(seen[0].0, "the first goes to named");
    assert!(!seen[1].0, "the replay does not");
    assert_eq!(state.recent_writes.len(), 1);
}

/// Forwards every write grown by `grow` bytes, as re-signing with a longer key name does.
struct Grows(usize);

impl UpdateGate for Grows {
    fn decide(&self, message: &[u8], _agreed_time_s: u64) -> UpdateDecision {
        let mut m = message.to_vec();
        m.resize(m.len() + self.0, 0);
        UpdateDecision::Forward(m)
    }
    fn answer_for_client(&self, _request: &[u8], named_answer: &[u8]) -> Vec<u8> {
        named_answer.to_vec()
    }
}

/// `update(k)` padded to `len` bytes (trailing bytes after the records: named's business).
fn update_of_len(k: u16, len: usize) -> Vec<u8> {
    let mut m = update(k);
    m.resize(len, 0);
    m
}

/// A write named can never take as it is (longer than TCP framing once the gate re-signed
/// it, or ordered oversized by a Byzantine origin) gets FORMERR at every replica without
/// reaching named, costs no write to disk, and the next write goes through as usual.
#[test]
fn a_write_named_cannot_take_is_refused_alike_without_named() {
    let s = start_s();
    let states: Vec<ExecState> = (0..2u16)
        .map(|id| {
            let mut core = ExecCore::new(config(id), Grows(6), ExecState::default());
            let big = update_of_len(9, 65_530);
            let reply = (id == 0).then_some(1);
            let cmds = core.deliver(batch(1, s, vec![(0, Op::Dns { tcp: true, message: big.clone() }, reply)]));
            let mut want = vec![];
            if id == 0 {
                want.push(Command::Answer { reply: 1, bytes: exec::answer::error_answer(&big, exec::answer::RCODE_FORMERR).unwrap() });
            }
            want.push(Command::Executed(1));
            assert_eq!(cmds, want, "replica {id}");
            // Ordered as it is, larger than any TCP message (the envelope's bound allows a
            // few bytes more), by a Byzantine origin.
            let mut core2 = ExecCore::new(config(id), Unchanged, ExecState::default());
            let huge = update_of_len(10, 65_540);
            assert_eq!(core2.deliver(batch(1, s, vec![(3, Op::Dns { tcp: true, message: huge }, None)])), vec![Command::Executed(1)]);
            assert_eq!(core2.state().outcomes, core.state().outcomes, "the same outcome: FORMERR");
            // The cluster goes on: the next write reaches named.
            let cmds = core.deliver(batch(2, s + 1, vec![(1, Op::Dns { tcp: true, message: update(11) }, None)]));
            let [Command::Write { seq: 2, index: 0, message, .. }] = &cmds[..] else { panic!("{cmds:?}") };
            let cmds = core.handle(Event::WriteAnswered { seq: 2, index: 0, answer: answer(message, ResponseCode::NoError) });
            assert!(matches!(&cmds[..], [Command::Persist(st)] if st.executed == 2), "{cmds:?}");
            core.state().clone()
        })
        .collect();
    assert_eq!(states[0], states[1], "honest replicas end alike");
    let mut formerr = ExecState::default();
    formerr.record(1, 0, u32::from(exec::answer::RCODE_FORMERR));
    formerr.record(2, 0, 0);
    formerr.executed = 2;
    assert_eq!(states[0], formerr);
}

/// A batch of refusals decided without named is not persisted; a restart (from the state
/// persisted before it) executes it again and ends in the same state.
#[test]
fn refusals_decided_without_named_are_not_written_and_replay_alike() {
    let s = start_s();
    let refused = |seq: u64| batch(seq, s, vec![(2, Op::Dns { tcp: false, message: update(1) }, None), (2, Op::Dns { tcp: true, message: update(3) }, None)]);
    let mut core = ExecCore::new(config(0), OddRefused, ExecState::default());
    assert_eq!(core.deliver(refused(1)), vec![Command::Executed(1)]);
    let after = core.state().clone();
    let mut restarted = ExecCore::new(config(0), OddRefused, ExecState::default());
    assert_eq!(restarted.deliver(refused(1)), vec![Command::Executed(1)]);
    assert_eq!(restarted.state(), &after);
    // A checkpoint batch is written all the same.
    let mut checkpoint = refused(2);
    checkpoint.checkpoint_due = true;
    assert!(matches!(&core.deliver(checkpoint)[..], [Command::Persist(st), Command::DigestZone { seq: 2 }] if st.executed == 2));
}

/// A crash between two writes of one batch: the batch resumes at the write the intent
/// names, with the state recorded before it. Whether named applied that write or not, the
/// replica ends where an uninterrupted one does, and no earlier write reaches named twice.
#[test]
fn a_crash_mid_batch_resumes_at_the_interrupted_write() {
    let t = start_s();
    let writes = || batch(1, t, (0..3u16).map(|i| (0, Op::Dns { tcp: true, message: update(2 * i + 2) }, None)).collect());
    // Uninterrupted: the reference.
    let mut whole = ExecCore::new(config(0), OddRefused, ExecState::default());
    let mut cmds = whole.deliver(writes());
    let mut before_second = None;
    for index in 0..3u32 {
        assert!(matches!(cmds[..], [Command::Write { index: i, .. }] if i == index), "{cmds:?}");
        if index == 1 {
            // What the executor records durably before sending this write.
            let (seq, at, _, state) = whole.zone_change_at().expect("waiting for a write");
            assert_eq!((seq, at), (1, 1));
            before_second = Some(state);
        }
        cmds = whole.handle(Event::WriteAnswered { seq: 1, index, answer: answer(&update(2 * index as u16 + 2), ResponseCode::NoError) });
    }
    let [Command::Persist(reference)] = &cmds[..] else { panic!("{cmds:?}") };
    let before_second = before_second.unwrap();
    for applied in [true, false] {
        let mut restarted = ExecCore::new(config(0), OddRefused, ExecState::default());
        restarted.resume_at(exec::Resume { seq: 1, index: 1, state: before_second.clone(), applied });
        let mut cmds = restarted.deliver(writes());
        let first_sent = if applied { 2 } else { 1 };
        for index in first_sent..3u32 {
            assert!(matches!(cmds[..], [Command::Write { index: i, .. }] if i == index), "applied {applied}: {cmds:?}");
            cmds = restarted.handle(Event::WriteAnswered { seq: 1, index, answer: answer(&update(2 * index as u16 + 2), ResponseCode::NoError) });
        }
        assert_eq!(cmds, vec![Command::Persist(reference.clone())], "applied {applied}: ends elsewhere than the uninterrupted replica");
    }
    // An intent for any other batch than the one after the executed position is ignored.
    let mut other = ExecCore::new(config(0), OddRefused, ExecState::default());
    other.resume_at(exec::Resume { seq: 2, index: 1, state: before_second, applied: true });
    let cmds = other.deliver(writes());
    assert!(matches!(cmds[..], [Command::Write { index: 0, .. }]), "{cmds:?}");
}

/// What the executor does when a transferred state arrives while a batch waits for named's
/// answer to a write (which may never come: its peers, far ahead, no longer help with it):
/// the core abandons the batch, installs the transferred state, ignores the abandoned
/// write's late answer and goes on from the installed position.
#[test]
fn a_transferred_state_preempts_a_batch_stuck_on_a_write() {
    let t = start_s();
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let cmds = core.deliver(batch(1, t, vec![(0, Op::Dns { tcp: true, message: update(2) }, Some(7)), (1, Op::Dns { tcp: true, message: update(4) }, None)]));
    assert!(matches!(cmds[..], [Command::Write { seq: 1, index: 0, .. }]), "{cmds:?}");
    assert_eq!(core.waiting_for(), Some((1, "named's answer to a write")));

    // The state of checkpoint 5, as its peers certified it.
    let mut transferred = ExecState::default();
    transferred.record(3, 0, 0);
    transferred.executed = 5;
    core.abandon();
    assert!(core.is_idle(), "the abandoned batch no longer holds the next one");
    assert_eq!(core.zone_change_at(), None, "no write intent left to record");
    core.install(transferred.clone());
    assert_eq!(core.state(), &transferred);

    // The abandoned write's answer comes late (its task was aborted mid-flight): ignored.
    let cmds = core.handle(Event::WriteAnswered { seq: 1, index: 0, answer: answer(&update(2), ResponseCode::NoError) });
    assert_eq!(cmds, Vec::<Command<u64>>::new());
    let cmds = core.handle(Event::ZoneDigest { seq: 1, digests: Some(vec![[1; 32]]) });
    assert_eq!(cmds, Vec::<Command<u64>>::new());
    assert_eq!(core.state(), &transferred, "late events change nothing");

    // Batches the transferred state covers are skipped; the next one executes on top of it.
    assert_eq!(core.deliver(batch(4, t, vec![(1, Op::Dns { tcp: true, message: update(6) }, None)])), Vec::<Command<u64>>::new());
    assert!(core.is_idle());
    let cmds = core.deliver(batch(6, t + 1, vec![(1, Op::Dns { tcp: true, message: update(8) }, None)]));
    assert!(matches!(cmds[..], [Command::Write { seq: 6, index: 0, .. }]), "{cmds:?}");
    let cmds = core.handle(Event::WriteAnswered { seq: 6, index: 0, answer: answer(&update(8), ResponseCode::NoError) });
    let mut want = transferred;
    want.record(6, 0, 0);
    want.executed = 6;
    assert_eq!(cmds, vec![Command::Persist(want)]);
}

#[test]
fn a_whole_zone_signing_runs_beside_reads_and_writes_until_t_plus_one_replicas_are_done() {
    let s = start_s();
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    assert!(core.deliver(batch(1, s, vec![(3, sz(3, s), None)])).iter().all(|c| matches!(c, Command::Persist(_))));
    let cmds = core.deliver(batch(2, s + 1, vec![(1, sz(1, s + 1), Some(7))]));
    let Some(Command::BeginSigning { seq: 2, times, .. }) = cmds.first() else { panic!("the t+1-th request begins it: {cmds:?}") };
    assert_eq!(u64::from(times.expiration), s + 1 + 600);
    let cmds = core.handle(Event::SigningBegun { seq: 2, result: Ok(()) });
    assert!(!cmds.iter().any(|c| matches!(c, Command::Answer { .. })), "the admin is answered when the zone is installed: {cmds:?}");
    assert_eq!(core.state().zone(0).signing, Some(exec::SigningRun { seq: 2, time_s: s + 1 }));
    assert!(core.is_idle(), "the executor goes on");

    // Reads and writes run meanwhile, as ever.
    let cmds =
        core.deliver(batch(3, s + 2, vec![(0, Op::Dns { tcp: false, message: query(1) }, Some(8)), (2, Op::Dns { tcp: true, message: update(1) }, None)]));
    let Some(Command::Read { id, .. }) = cmds.first() else { panic!("the read runs: {cmds:?}") };
    let cmds = core.handle(Event::ReadDone { id: *id });
    let Some(Command::Write { seq: 3, index: 1, message, .. }) = cmds.first() else { panic!("then the write: {cmds:?}") };
    let cmds = core.handle(Event::WriteAnswered { seq: 3, index: 1, answer: answer(message, ResponseCode::NoError) });
    assert!(matches!(cmds.last(), Some(Command::Persist(_))) && core.is_idle(), "{cmds:?}");

    // One replica saying it is done, however often, does not finish it.
    let cmds = core.deliver(batch(4, s + 3, vec![(3, finish(3, 2), Some(9)), (3, finish(3, 2), None)]));
    assert!(!cmds.iter().any(|c| matches!(c, Command::FinishSigning { .. })), "{cmds:?}");
    assert!(cmds.iter().any(|c| matches!(c, Command::Answer { bytes, .. } if bytes.starts_with(b"counted: 1 of the 2"))), "{cmds:?}");
    // A second one does, at its point of the log, with the signing's run and its own times.
    let cmds = core.deliver(batch(5, s + 4, vec![(0, finish(0, 2), Some(10))]));
    let Some(Command::FinishSigning { seq: 5, run, times, .. }) = cmds.first() else { panic!("t+1 finish it: {cmds:?}") };
    assert_eq!((run.seq, run.time_s, u64::from(times.expiration)), (2, s + 1, s + 4 + 600));
    assert!(!core.is_idle(), "installing holds the executor");
    let cmds = core.handle(Event::SigningFinished { seq: 5, result: Ok(1) });
    let texts = answer_texts(&cmds);
    assert_eq!(texts, vec![(7, "signed at seq 2".to_string()), (10, "finished: signed at seq 2".to_string())]);
    assert_eq!((core.state().zone(0).signing, core.state().zone(0).last_signed_s), (None, s + 1), "the signatures carry the beginning's time");
    // Late ones change nothing.
    let cmds = core.deliver(batch(6, s + 5, vec![(1, finish(1, 2), Some(11))]));
    assert!(cmds.iter().any(|c| matches!(c, Command::Answer { bytes, .. } if bytes == b"no signing running")), "{cmds:?}");
}

/// When the writes made during a signing changed too much for a short catch-up, the
/// executor reports another round instead of an installation: the same signing goes on
/// (its signature times kept), begun at that batch, and only claims for the new round
/// count towards finishing it.
#[test]
fn a_signing_that_was_written_to_goes_another_round_before_it_is_installed() {
    let s = start_s();
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    core.deliver(batch(1, s, vec![(3, sz(3, s), None)]));
    let cmds = core.deliver(batch(2, s + 1, vec![(1, sz(1, s + 1), Some(7))]));
    assert!(matches!(cmds.first(), Some(Command::BeginSigning { seq: 2, .. })), "{cmds:?}");
    core.handle(Event::SigningBegun { seq: 2, result: Ok(()) });
    core.deliver(batch(3, s + 2, vec![(3, finish(3, 2), None)]));
    let cmds = core.deliver(batch(4, s + 3, vec![(0, finish(0, 2), Some(8))]));
    let Some(Command::FinishSigning { seq: 4, run, .. }) = cmds.first() else { panic!("t+1 finish the round: {cmds:?}") };
    assert_eq!(run.seq, 2);
    let before = core.state().outcomes;

    let cmds = core.handle(Event::SigningRound { seq: 4, changed: 40 });
    let texts = answer_texts(&cmds);
    assert_eq!(texts.len(), 1, "only the claim is answered; the admin waits for the installation: {texts:?}");
    assert!(texts[0].1.starts_with("finished round: another begun at seq 4 for the 40 records"), "{texts:?}");
    assert!(matches!(cmds.last(), Some(Command::Persist(_))) && core.is_idle(), "the executor goes on: {cmds:?}");
    let st = core.state();
    assert_eq!(st.zone(0).signing, Some(exec::SigningRun { seq: 4, time_s: s + 1 }), "the new round, with the signing's first times");
    assert!(st.zone(0).sign_finish_votes.is_empty(), "the last round's claims are used up");
    assert_ne!(st.outcomes, before, "the round is in the outcome chain");
    let mut want = ExecState { outcomes: before, ..Default::default() };
    want.record(4, 0, exec::state::code::SIGNING_ROUND | 40);
    assert_eq!(st.outcomes, want.outcomes, "recorded with the records changed");

    // A claim for the round that ended no longer counts; two for the new one finish it.
    let cmds = core.deliver(batch(5, s + 4, vec![(1, finish(1, 2), Some(9)), (3, finish(3, 4), None)]));
    let texts = answer_texts(&cmds);
    assert!(texts[0].1.starts_with("refused: "), "{texts:?}");
    assert!(!cmds.iter().any(|c| matches!(c, Command::FinishSigning { .. })), "{cmds:?}");
    let cmds = core.deliver(batch(6, s + 5, vec![(2, finish(2, 4), None)]));
    let Some(Command::FinishSigning { seq: 6, run, times, .. }) = cmds.first() else { panic!("t+1 claims for the round: {cmds:?}") };
    assert_eq!((run.seq, run.time_s, u64::from(times.expiration)), (4, s + 1, s + 5 + 600));
    let cmds = core.handle(Event::SigningFinished { seq: 6, result: Ok(3) });
    assert_eq!(answer_texts(&cmds), vec![(7, "signed at seq 4".to_string())], "the admin hears of the installation");
    assert_eq!((core.state().zone(0).signing, core.state().zone(0).last_signed_s), (None, s + 1), "the signatures carry the first round's time");
}

/// A Byzantine primary orders finish claims under any origin it likes (the ordering does not
/// authenticate a request's origin end to end). None of the claims no replica made counts:
/// not a real claim ordered under another origin, not one for another run, not one signed
/// with another cluster's certificate or for another zone, not a sign-zone signature, not
/// garbage. Only then do two genuine claims finish the signing.
#[test]
fn a_byzantine_primary_cannot_forge_finish_claims() {
    let s = start_s();
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    core.deliver(batch(1, s, vec![(3, sz(3, s), None)]));
    let cmds = core.deliver(batch(2, s + 1, vec![(1, sz(1, s + 1), None)]));
    assert!(matches!(cmds.first(), Some(Command::BeginSigning { seq: 2, .. })), "{cmds:?}");
    core.handle(Event::SigningBegun { seq: 2, result: Ok(()) });
    assert!(core.is_idle());

    // Replica 3 (the Byzantine primary) says it is done, honestly signed: counts for 3 only.
    let genuine3 = finish(3, 2);
    let Op::SignZoneFinish(auth3) = genuine3.clone() else { unreachable!() };
    let sz_auth = pki().signers[2].sign_at(2).unwrap();
    let forged = vec![
        (3, genuine3.clone(), Some(1)),
        // Its own claim ordered again under every other origin.
        (0, genuine3.clone(), Some(2)),
        (1, genuine3.clone(), Some(3)),
        (2, genuine3, Some(4)),
        // Claims that name replicas 0, 1 and 2 but carry replica 3's certificate and signature.
        (0, Op::SignZoneFinish(exec::SignFinishAuth { replica: 0, ..auth3.clone() }), Some(5)),
        (1, Op::SignZoneFinish(exec::SignFinishAuth { replica: 1, ..auth3.clone() }), Some(6)),
        // Replica 2's genuine claim for another run (an earlier signing's claim, replayed).
        (2, finish(2, 1), Some(7)),
        // Another cluster's replica 2, and replica 2's key for another zone.
        (2, Op::SignZoneFinish(pki().outsiders[2].sign_finish(2).unwrap()), Some(8)),
        (2, Op::SignZoneFinish(pki().other_zone[2].sign_finish(2).unwrap()), Some(9)),
        // Replica 2's sign-zone signature (stamp 2) passed off as a finish claim for run 2.
        (2, Op::SignZoneFinish(exec::SignFinishAuth { replica: 2, run_seq: 2, cert: sz_auth.cert, signature: sz_auth.signature }), Some(10)),
        // Garbage.
        (1, Op::SignZoneFinish(exec::SignFinishAuth { replica: 1, run_seq: 2, cert: vec![0x30; 40], signature: vec![7; 64] }), Some(11)),
    ];
    let cmds = core.deliver(batch(3, s + 2, forged));
    assert!(!cmds.iter().any(|c| matches!(c, Command::FinishSigning { .. })), "forged claims finished the signing: {cmds:?}");
    let texts = answer_texts(&cmds);
    assert_eq!(texts.len(), 11, "{texts:?}");
    assert!(texts[0].1.starts_with("counted: 1 of the 2"), "{texts:?}");
    for (reply, text) in &texts[1..] {
        assert!(text.starts_with("refused: "), "claim {reply} was not refused: {text}");
    }
    assert_eq!(core.state().zone(0).sign_finish_votes.iter().copied().collect::<Vec<_>>(), vec![3]);
    assert!(core.state().zone(0).signing.is_some() && core.is_idle(), "the signing runs on, the executor is not held");

    // Replica 0's own claim completes t+1.
    let cmds = core.deliver(batch(4, s + 3, vec![(0, finish(0, 2), Some(12))]));
    assert!(matches!(cmds.first(), Some(Command::FinishSigning { seq: 4, .. })), "{cmds:?}");
}

/// Two zones (index 0 "example.test.", index 1 "other.test."): each counts its own sign-zone
/// requests and finish claims and keeps its own re-signing schedule; a request signed for
/// one zone does not count under the other's index; an index naming no zone is refused; the
/// checkpoint covers both zones' digests.
#[test]
fn two_zones_keep_their_own_signing_and_re_signing() {
    let s = start_s();
    let p = pki();
    let mut cfg = config(0);
    cfg.sign_zone_verifiers.push(p.other_verifier.clone());
    let mut core = ExecCore::new(cfg, Unchanged, ExecState::default());
    let sz1 = |origin: u16, t: u64| Op::sign_zone(1, p.other_zone[origin as usize].sign_at(t * 1_000_000).unwrap());

    // Zone 0's request under zone 1's index, and zone 1's under zone 0's: neither counts.
    let cmds = core.deliver(batch(
        1,
        s,
        vec![
            (3, Op::sign_zone(1, p.signers[3].sign_at(s * 1_000_000).unwrap()), Some(1)),
            (2, Op::SignZone(p.other_zone[2].sign_at(s * 1_000_000).unwrap()), Some(2)),
        ],
    ));
    let texts = answer_texts(&cmds);
    assert!(texts.iter().all(|(_, t)| t.starts_with("refused: the request does not prove")), "{texts:?}");
    // An index beyond the zones: refused, for every kind of request.
    let cmds = core.deliver(batch(2, s, vec![(3, Op::sign_zone(2, p.signers[3].sign_at(s * 1_000_000 + 1).unwrap()), Some(3)), (3, Op::resign(7), Some(4))]));
    let texts = answer_texts(&cmds);
    assert_eq!(texts.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>(), vec!["refused: no zone has index 2", "refused: no zone has index 7"]);

    // Zone 1: one request from replica 3, then one from replica 1: its signing begins.
    core.deliver(batch(3, s + 1, vec![(3, sz1(3, s + 1), None)]));
    assert_eq!(core.state().zone(1).sign_zone_requests.len(), 1);
    assert!(core.state().zone(0).sign_zone_requests.is_empty(), "zone 0 counts nothing of zone 1");
    let cmds = core.deliver(batch(4, s + 2, vec![(1, sz1(1, s + 2), Some(5))]));
    let Some(Command::BeginSigning { zone: 1, seq: 4, .. }) = cmds.first() else { panic!("zone 1's signing begins: {cmds:?}") };
    core.handle(Event::SigningBegun { seq: 4, result: Ok(()) });
    assert_eq!(core.state().zone(1).signing.map(|r| r.seq), Some(4));
    assert_eq!(core.state().zone(0).signing, None);
    // Zone 0 signs meanwhile, on its own.
    core.deliver(batch(5, s + 3, vec![(3, sz(3, s + 3), None)]));
    let cmds = core.deliver(batch(6, s + 3, vec![(0, sz(0, s + 3), Some(6))]));
    let Some(Command::BeginSigning { zone: 0, seq: 6, .. }) = cmds.first() else { panic!("zone 0's signing begins: {cmds:?}") };
    core.handle(Event::SigningBegun { seq: 6, result: Ok(()) });
    assert_eq!(core.signing_runs().iter().map(|(z, r, _)| (*z, r.seq)).collect::<Vec<_>>(), vec![(0, 6), (1, 4)]);

    // Zone 1's finish claims: zone 0's claims for the same run count nothing there.
    let fin1 = |r: u16, run: u64| Op::sign_zone_finish(1, p.other_zone[r as usize].sign_finish(run).unwrap());
    let cmds = core.deliver(batch(7, s + 4, vec![(3, Op::sign_zone_finish(1, p.signers[3].sign_finish(4).unwrap()), Some(7)), (3, fin1(3, 4), Some(8))]));
    assert!(!cmds.iter().any(|c| matches!(c, Command::FinishSigning { .. })), "{cmds:?}");
    assert_eq!(core.state().zone(1).sign_finish_votes.iter().copied().collect::<Vec<_>>(), vec![3]);
    assert!(core.state().zone(0).sign_finish_votes.is_empty());
    let cmds = core.deliver(batch(8, s + 5, vec![(2, fin1(2, 4), Some(9))]));
    let Some(Command::FinishSigning { zone: 1, seq: 8, run, .. }) = cmds.first() else { panic!("t+1 finish zone 1: {cmds:?}") };
    assert_eq!(run.seq, 4);
    let (_, _, zone, _) = core.zone_change_at().expect("installing is a zone change");
    assert_eq!(zone, Some(1));
    let cmds = core.handle(Event::SigningFinished { seq: 8, result: Ok(0) });
    let texts = answer_texts(&cmds);
    assert!(texts.contains(&(5, "signed at seq 4".to_string())), "zone 1's admin is answered, not zone 0's: {texts:?}");
    assert!(!texts.iter().any(|(r, _)| *r == 6), "{texts:?}");
    assert_eq!((core.state().zone(1).last_signed_s, core.state().zone(0).last_signed_s), (s + 2, 0));

    // Re-signing: zone 1 is signed, zone 0 not yet: only zone 1 slices, on its own schedule.
    let cmds = core.deliver(batch(9, s + 30, vec![(1, Op::resign(0), Some(10)), (1, Op::resign(1), Some(11))]));
    assert!(matches!(cmds.iter().find(|c| matches!(c, Command::ResignSlice { .. })), Some(Command::ResignSlice { zone: 1, seq: 9, .. })), "{cmds:?}");
    let cmds = core.handle(Event::SliceDone { seq: 9, result: Ok(2) });
    assert!(matches!(cmds.last(), Some(Command::Persist(_))), "{cmds:?}");
    assert_eq!((core.state().zone(1).next_slice_s, core.state().zone(0).next_slice_s), (s + 50, 0));

    // A checkpoint digests both zones, each under its index.
    let cmds = core.deliver(Delivered { checkpoint_due: true, ..batch(10, s + 31, Vec::new()) });
    assert!(matches!(&cmds[..], [Command::Persist(_), Command::DigestZone { seq: 10 }]), "{cmds:?}");
    let cmds = core.handle(Event::ZoneDigest { seq: 10, digests: Some(vec![[1; 32], [2; 32]]) });
    let Some(Command::Checkpoint { digest, state, .. }) = cmds.first() else { panic!("{cmds:?}") };
    assert_eq!(*digest, state.checkpoint_digest(&[[1; 32], [2; 32]]));
    assert_ne!(*digest, state.checkpoint_digest(&[[2; 32], [1; 32]]));
}

// ----- a Byzantine origin whose ordered requests are drawn from a grammar of hostile bytes -----

/// The cluster's update key in the hostile-origin runs (tsig mode: every replica holds it, so
/// the Byzantine one can sign validly too).
fn hostile_secret() -> exec::auth::TsigSecret {
    exec::auth::TsigSecret { name: "sdns-update.".into(), algorithm: exec::auth::tsig::Algorithm::HmacSha256, secret: vec![0x5a; 32] }
}

fn hostile_key(secret: &exec::auth::TsigSecret) -> exec::auth::tsig::Key {
    exec::auth::tsig::Key::new(&secret.name, secret.algorithm, &secret.secret).unwrap()
}

/// An update of example.test adding `w<k>` (A), with `pad` bytes of TXT rdata besides.
fn update_padded(id: u16, k: u32, pad: usize) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.extend_from_slice(&[0x28, 0, 0, 1, 0, 0, 0, if pad > 0 { 2 } else { 1 }, 0, 0]);
    m.extend_from_slice(&[7, b'e', b'x', b'a', b'm', b'p', b'l', b'e', 4, b't', b'e', b's', b't', 0, 0, 6, 0, 1]);
    let label = format!("w{k}");
    m.push(label.len() as u8);
    m.extend_from_slice(label.as_bytes());
    m.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 1, 44, 0, 4, 192, 0, 2, (k % 250) as u8]);
    if pad > 0 {
        m.extend_from_slice(&[0xc0, 12, 0, 16, 0, 1, 0, 0, 1, 44]);
        m.extend_from_slice(&(pad as u16).to_be_bytes());
        m.extend((0..pad).map(|i| if i % 256 == 0 { 255 } else { b'p' }));
    }
    m
}

/// One ordered request of a hostile run and what the test knows of it.
struct Hostile {
    origin: u16,
    payload: Vec<u8>,
    /// Signed validly with the cluster's key at the batch's agreed time: the only kind named
    /// may ever be sent.
    authentic: bool,
    /// Replica `origin` holds its client (an honest gateway's request).
    reply: bool,
}

/// Draws the requests of one batch at agreed time `time_s`: honest origins 1..N send signed
/// updates and reads; origin 0 sends anything from the grammar (every opcode, unreadable
/// headers, bad counts, compression loops, sizes around 65,535 less the re-signing growth,
/// signed, unsigned, wrongly signed, unknown keys, stale times, replays under new ids, zone
/// transfers over both transports).
fn hostile_batch(rng: &mut ChaCha8Rng, time_s: u64, key: &exec::auth::tsig::Key, next_k: &mut u32, signed_log: &mut Vec<Vec<u8>>) -> Vec<Hostile> {
    use exec::auth::tsig;
    let mut out = Vec::new();
    let sign = |m: &[u8], k: &tsig::Key, t: u64| tsig::sign(m, k, t, 300, 0, Vec::new(), None);
    for _ in 0..1 + rng.next_u64() % 6 {
        let origin = (rng.next_u64() % u64::from(N)) as u16;
        let id = rng.next_u64() as u16;
        *next_k += 1;
        let k = *next_k;
        if origin != 0 {
            let (message, authentic) = if rng.next_u64().is_multiple_of(3) { (query(id), false) } else { (sign(&update_padded(id, k, 0), key, time_s), true) };
            if authentic {
                signed_log.push(message.clone());
            }
            out.push(Hostile { origin, payload: Op::Dns { tcp: true, message }.encode(), authentic, reply: true });
            continue;
        }
        let tcp = rng.next_u64().is_multiple_of(2);
        let form = rng.next_u64() % 14;
        let (message, authentic) = match form {
            // Shorter than a header, with the UPDATE opcode where there is room.
            0 => ((0..rng.next_u64() % 12).map(|i| if i == 2 { 0x28 } else { rng.next_u64() as u8 }).collect::<Vec<u8>>(), false),
            // A header alone with counts it does not hold, any opcode.
            1 => {
                let mut h = id.to_be_bytes().to_vec();
                h.push(((rng.next_u64() % 16) as u8) << 3);
                h.push(0);
                h.extend((0..8).map(|_| rng.next_u64() as u8));
                (h, false)
            }
            // A compression loop in the zone section.
            2 => {
                let mut h = update_padded(id, k, 0)[..12].to_vec();
                h.extend_from_slice(&[0xc0, 12, 0, 6, 0, 1]);
                (h, false)
            }
            // Random bytes after a request header of any opcode.
            3 => {
                let mut h = id.to_be_bytes().to_vec();
                h.push(((rng.next_u64() % 16) as u8) << 3);
                h.extend((0..9 + rng.next_u64() % 200).map(|_| rng.next_u64() as u8));
                (h, false)
            }
            // Validly signed, sized around 65,535 less the growth re-signing adds.
            4 => {
                let base = sign(&update_padded(id, k, 0), key, time_s).len() + 12;
                let total = 65_535 - 12 + (rng.next_u64() % 24) as usize;
                let m = sign(&update_padded(id, k, total.saturating_sub(base)), key, time_s);
                signed_log.push(m.clone());
                (m, true)
            }
            // Unsigned, well formed.
            5 => (update_padded(id, k, 0), false),
            // Signed with the right key name and a wrong secret.
            6 => {
                let wrong = tsig::Key::new(&key.name, key.algorithm, &[0x11; 32]).unwrap();
                (sign(&update_padded(id, k, 0), &wrong, time_s), false)
            }
            // Signed with a key nobody configured.
            7 => {
                let stranger = tsig::Key::new("stranger.", key.algorithm, &[0x22; 32]).unwrap();
                (sign(&update_padded(id, k, 0), &stranger, time_s), false)
            }
            // Signed validly but far outside the fudge of the agreed time.
            8 => (sign(&update_padded(id, k, 0), key, time_s - 3600), false),
            // A signed update's MAC cut short or flipped.
            9 => {
                let mut m = sign(&update_padded(id, k, 0), key, time_s);
                let last = m.len() - 10;
                m[last] ^= 0x40;
                (m, false)
            }
            // A replay of an earlier authentic update under a new header id.
            10 if !signed_log.is_empty() => {
                let mut m = signed_log[(rng.next_u64() % signed_log.len() as u64) as usize].clone();
                m[..2].copy_from_slice(&id.to_be_bytes());
                // It verifies only within its own fudge: authentic only if still valid.
                (m, false)
            }
            // AXFR or IXFR, over either transport.
            11 => {
                let mut q = query(id);
                let at = q.len() - 4;
                q[at..at + 2].copy_from_slice(&(if rng.next_u64().is_multiple_of(2) { 252u16 } else { 251 }).to_be_bytes());
                (q, false)
            }
            // A signed update with a truncated body (named would answer FORMERR).
            12 => {
                let mut m = update_padded(id, k, 0);
                m.truncate(m.len() - 3);
                (sign(&m, key, time_s), true)
            }
            _ => (query(id), false),
        };
        out.push(Hostile { origin, payload: Op::Dns { tcp, message }.encode(), authentic, reply: false });
    }
    out
}

/// A fake named for the hostile runs: applies whatever reaches it (a set of the bytes'
/// digests less the TSIG, so a write sent twice changes nothing) and answers NOERROR.
#[derive(Default, Clone, PartialEq, Eq)]
struct HostileNamed {
    applied: BTreeSet<[u8; 32]>,
}

fn hostile_run(seed: u64, batches: usize) -> Result<(), String> {
    use exec::auth::{Authenticator, Mode};
    use std::sync::Arc;
    let secret = hostile_secret();
    let key = hostile_key(&secret);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut next_k = 0;
    let mut signed_log = Vec::new();
    let mut time_s = start_s();
    let log: Vec<(u64, Vec<Hostile>)> = (0..batches)
        .map(|_| {
            time_s += 1 + rng.next_u64() % 5;
            (time_s, hostile_batch(&mut rng, time_s, &key, &mut next_k, &mut signed_log))
        })
        .collect();
    // Replicas 1..N are honest, each with its own authenticator (its own local keys).
    struct Honest {
        core: ExecCore<u64, Arc<Authenticator>>,
        gate: Arc<Authenticator>,
        named: HostileNamed,
        persisted: ExecState,
        answers: BTreeMap<u64, usize>,
    }
    let gate = || Arc::new(Authenticator::new(Mode::Tsig, std::slice::from_ref(&secret), &[], Vec::new(), unix_now).unwrap());
    let mut nodes: Vec<Honest> = (1..N)
        .map(|id| {
            let g = gate();
            Honest {
                core: ExecCore::new(config(id), g.clone(), ExecState::default()),
                gate: g,
                named: HostileNamed::default(),
                persisted: ExecState::default(),
                answers: BTreeMap::new(),
            }
        })
        .collect();
    let mut b = 0usize;
    while b < batches {
        let seq = b as u64 + 1;
        let (time_s, requests) = &log[b];
        for (n, node) in nodes.iter_mut().enumerate() {
            let id = n as u16 + 1;
            if seq <= node.core.state().executed {
                continue;
            }
            let items = requests
                .iter()
                .enumerate()
                .map(|(i, r)| Item { origin: r.origin, payload: r.payload.clone(), reply: (r.reply && r.origin == id).then_some(seq * 100 + i as u64) })
                .collect();
            let mut queue =
                node.core.deliver(Delivered { seq, time_us: time_s * 1_000_000, checkpoint_due: seq.is_multiple_of(CHECKPOINT_EVERY), requests: items });
            // Every command is completed at once: the batch must end within a bounded number
            // of steps, whatever its bytes.
            let mut steps = 0;
            while let Some(command) = queue.pop() {
                steps += 1;
                if steps > 8 * requests.len() + 16 {
                    return Err(format!("replica {id}: batch {seq} did not finish in {steps} steps"));
                }
                let events = match command {
                    Command::Write { seq, index, message, .. } => {
                        if !requests[index as usize].authentic {
                            return Err(format!("replica {id}: batch {seq} request {index} (not validly signed) reached named"));
                        }
                        if !(12..=65_535).contains(&message.len()) {
                            return Err(format!("replica {id}: {} bytes sent to named", message.len()));
                        }
                        let layout = exec::auth::wire::layout(&message).map_err(|e| format!("replica {id}: named got unreadable bytes: {e}"))?;
                        let body = exec::auth::tsig::strip(&message, layout.signature.map_or(message.len(), |r| r.start), 0);
                        node.named.applied.insert(Sha256::digest(&body).into());
                        let mut answer = message[..12].to_vec();
                        answer[2] |= 0x80;
                        answer[3] &= 0xf0;
                        answer[4..12].fill(0);
                        vec![Event::WriteAnswered { seq, index, answer }]
                    }
                    Command::Read { id: read, reply, .. } => {
                        // named answers the read to its client.
                        *node.answers.entry(reply).or_default() += 1;
                        vec![Event::ReadDone { id: read }]
                    }
                    Command::DigestZone { seq } => {
                        let mut h = Sha256::new();
                        for d in &node.named.applied {
                            h.update(d);
                        }
                        vec![Event::ZoneDigest { seq, digests: Some(vec![h.finalize().into()]) }]
                    }
                    Command::Answer { reply, .. } => {
                        *node.answers.entry(reply).or_default() += 1;
                        vec![]
                    }
                    Command::Persist(state) => {
                        node.persisted = state;
                        vec![]
                    }
                    Command::Checkpoint { .. } | Command::Executed(_) => vec![],
                    other => return Err(format!("replica {id}: unexpected {other:?}")),
                };
                for event in events {
                    queue.extend(node.core.handle(event));
                }
            }
            if !node.core.is_idle() {
                return Err(format!("replica {id}: batch {seq} still running with nothing left to do: {:?}", node.core.waiting_for()));
            }
        }
        b += 1;
        // Now and then a replica restarts from what it persisted: the batches after it (reads,
        // refusals decided without named) are executed again and must decide alike.
        if rng.next_u64().is_multiple_of(7) {
            let n = (rng.next_u64() % u64::from(N - 1)) as usize;
            let node = &mut nodes[n];
            node.core = ExecCore::new(config(n as u16 + 1), node.gate.clone(), node.persisted.clone());
            b = b.min(node.persisted.executed as usize);
        }
    }
    let first = &nodes[0];
    for (n, node) in nodes.iter().enumerate().skip(1) {
        if node.core.state() != first.core.state() {
            return Err(format!("replica {}'s state differs from replica 1's", n + 1));
        }
        if node.named.applied != first.named.applied {
            return Err(format!("replica {}'s zone differs from replica 1's", n + 1));
        }
    }
    // Every honest client got one answer per request (a retransmission after a restart may
    // add one more, never none).
    for (n, node) in nodes.iter().enumerate() {
        let id = n as u16 + 1;
        for (b, (_, requests)) in log.iter().enumerate() {
            for (i, r) in requests.iter().enumerate() {
                if r.reply && r.origin == id && !node.answers.contains_key(&((b as u64 + 1) * 100 + i as u64)) {
                    return Err(format!("replica {id}: its client's request {i} of batch {} got no answer", b + 1));
                }
            }
        }
    }
    Ok(())
}

/// A Byzantine origin's requests, drawn per seed from a grammar of hostile DNS bytes, among
/// honest origins' signed updates: every ordered request reaches an outcome within a bounded
/// number of steps at every honest replica, honest states and zones are identical, and
/// nothing that is not validly signed (nor anything named cannot take) reaches named.
#[test]
fn a_hostile_origin_cannot_stop_execution_or_reach_named() {
    campaign(24).run(1, |seed| hostile_run(seed, 40));
}

/// The abandon rule on one core: claims that write 0 of batch 1 is stuck count only from
/// batches after it, once per origin; at t+1 distinct origins the write named has not
/// answered is abandoned (its client gets SERVFAIL, the outcome chain records it, the batch
/// goes on and named's late answer changes nothing). A replica that sees the claims before
/// its turn comes does not send the write at all and ends in the same state; one whose named
/// answered first ends elsewhere (its next checkpoint differs: the certified state repairs it).
#[test]
fn a_write_stuck_at_t_plus_one_replicas_is_abandoned_by_the_log() {
    let t = start_s();
    let claim = Op::Stuck { seq: 1, index: 0 }.encode();
    let first = || batch(1, t, vec![(0, Op::Dns { tcp: true, message: update(2) }, Some(7)), (1, Op::Dns { tcp: true, message: update(4) }, None)]);

    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let cmds = core.deliver(first());
    assert!(matches!(cmds[..], [Command::Write { seq: 1, index: 0, .. }]), "{cmds:?}");
    assert_eq!(core.stuck_write(), Some((1, 0)));
    // One origin, however often, is not t+1; a claim in the stuck batch itself or before it
    // names nothing ordered before it.
    assert!(core.committed(2, [(3, &claim[..])]).is_empty());
    assert!(core.committed(3, [(3, &claim[..]), (3, &claim[..])]).is_empty());
    assert!(core.committed(1, [(2, &claim[..])]).is_empty());
    // A claim for another write does not count for this one.
    let other = Op::Stuck { seq: 1, index: 1 }.encode();
    assert!(core.committed(3, [(1, &other[..])]).is_empty());
    assert_eq!(core.stuck_write(), Some((1, 0)));
    // The second distinct origin: abandoned, and the batch goes on to its next write.
    let cmds = core.committed(4, [(2, &claim[..])]);
    assert_eq!(cmds.len(), 3, "{cmds:?}");
    let Command::Answer { reply: 7, bytes } = &cmds[0] else { panic!("{cmds:?}") };
    let servfail = Message::from_vec(bytes).unwrap();
    assert_eq!((servfail.metadata.id, servfail.metadata.response_code), (2, ResponseCode::ServFail));
    assert_eq!(cmds[1], Command::AbandonWrite { seq: 1, index: 0 });
    assert!(matches!(cmds[2], Command::Write { seq: 1, index: 1, .. }), "{cmds:?}");
    // named's late answer to the abandoned write is ignored.
    assert!(core.handle(Event::WriteAnswered { seq: 1, index: 0, answer: answer(&update(2), ResponseCode::NoError) }).is_empty());
    let cmds = core.handle(Event::WriteAnswered { seq: 1, index: 1, answer: answer(&update(4), ResponseCode::NoError) });
    let [Command::Persist(abandoned)] = &cmds[..] else { panic!("{cmds:?}") };
    let mut want = ExecState::default();
    want.record(1, 0, exec::state::code::ABANDONED);
    want.record(1, 1, 0);
    want.executed = 1;
    assert_eq!(abandoned, &want);

    // A replica behind: the committed claims are known before batch 1 runs. The write is
    // never sent; the state is the same.
    let mut behind = ExecCore::new(config(1), Unchanged, ExecState::default());
    assert!(behind.committed(2, [(3, &claim[..])]).is_empty());
    assert!(behind.committed(3, [(2, &claim[..])]).is_empty());
    let cmds = behind.deliver(first());
    assert!(
        matches!(cmds[..], [Command::Answer { reply: 7, .. }, Command::AbandonWrite { seq: 1, index: 0 }, Command::Write { seq: 1, index: 1, .. }]),
        "the stuck write is not sent: {cmds:?}"
    );
    let cmds = behind.handle(Event::WriteAnswered { seq: 1, index: 1, answer: answer(&update(4), ResponseCode::NoError) });
    assert_eq!(cmds, vec![Command::Persist(want.clone())]);

    // A replica whose named answered before the claims came: applied, and so different.
    let mut ahead = ExecCore::new(config(2), Unchanged, ExecState::default());
    ahead.deliver(first());
    ahead.handle(Event::WriteAnswered { seq: 1, index: 0, answer: answer(&update(2), ResponseCode::NoError) });
    ahead.handle(Event::WriteAnswered { seq: 1, index: 1, answer: answer(&update(4), ResponseCode::NoError) });
    assert!(ahead.committed(4, [(3, &claim[..]), (2, &claim[..])]).is_empty(), "claims for an executed write decide nothing");
    assert_ne!(ahead.state(), &want);
    assert_ne!(ahead.state().checkpoint_digest(&[[0; 32]]), want.checkpoint_digest(&[[0; 32]]), "visible at the next checkpoint");

    // The claims, executed in their own batches, only answer their (internal) client.
    let cmds = core.deliver(batch(2, t + 1, vec![(0, Op::Stuck { seq: 1, index: 0 }, Some(9))]));
    assert!(matches!(&cmds[..], [Command::Answer { reply: 9, .. }, Command::Executed(2)]), "{cmds:?}");
}

/// Write `k` (the first that named's rule applies) is never answered by any named: every
/// executor claims it stuck after its local bound, through the log; once t+1 claims are
/// committed every replica abandons it, whether it was waiting for named, behind, or
/// restarted; every batch executes and the replicas agree (state, zone, checkpoints); no
/// zone holds the write and its client, if any, got SERVFAIL.
fn abandon_run(seed: u64) -> Result<(), String> {
    let batches = 60;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let log = generate(&mut rng, batches);
    let k = log
        .batches
        .iter()
        .flat_map(|(_, r)| r)
        .find_map(|x| match Op::decode(&x.payload) {
            Ok(Op::Dns { message, .. })
                if Message::from_vec(&message).unwrap().metadata.op_code == OpCode::Update && rule_rcode(id_of(&message)) == ResponseCode::NoError =>
            {
                Some(id_of(&message))
            }
            _ => None,
        })
        .ok_or("no write in the log")?;
    let mut nameds = [Named::Quick, Named::Slow, Named::Stalls, Named::Quick];
    nameds.rotate_left((seed % 4) as usize);
    let mut sim = Sim::new(seed, batches, nameds);
    sim.hang = Some(k);
    // Reads ordered after the hung write see one write fewer than the generator counted.
    let mut past = false;
    for r in sim.log.batches.iter_mut().flat_map(|(_, r)| r.iter_mut()) {
        if matches!(Op::decode(&r.payload), Ok(Op::Dns { message, .. }) if id_of(&message) == k && Message::from_vec(&message).unwrap().metadata.op_code == OpCode::Update)
        {
            past = true;
        }
        if past {
            if let Some(e) = r.expected_applied.as_mut() {
                *e -= 1;
            }
        }
    }
    sim.run(seed.is_multiple_of(2));
    if !sim.failures.is_empty() {
        return Err(sim.failures.join("\n"));
    }
    let total = sim.log.batches.len();
    if total == batches {
        return Err("no stuck claim was ordered".into());
    }
    check_honest_agree(&sim, &[0, 1, 2, 3], total)?;
    for (i, n) in sim.nodes.iter().enumerate() {
        if n.zone.applied.contains(&k) {
            return Err(format!("replica {i}'s zone holds the abandoned write {k}"));
        }
    }
    if sim.abandoned.values().sum::<u32>() == 0 {
        return Err("no replica abandoned a write".into());
    }
    if let Some(codes) = sim.write_answers.get(&k) {
        if codes.iter().any(|c| *c != u16::from(ResponseCode::ServFail)) {
            return Err(format!("the abandoned write was answered {codes:?}, not SERVFAIL"));
        }
    }
    Ok(())
}

#[test]
fn a_write_no_named_answers_is_abandoned_alike_everywhere() {
    campaign(40).run(1, abandon_run);
}

/// Every ordered client request is counted once by the kind the core classified it as, at
/// every replica (whichever gateway owes its answer), a write that waited for its turn too:
/// what the wrapper's metrics show, without classifying the log a second time.
#[test]
fn requests_are_counted_once_by_kind() {
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let mut checkpoint = batch(1, start_s(), vec![(1, Op::Dns { tcp: false, message: query(1) }, None)]);
    checkpoint.checkpoint_due = true;
    core.deliver(checkpoint);
    assert_eq!(core.take_requests(), RequestCounts { reads: 1, transfers: 0, writes: 0 });
    // The write waits for the checkpoint's digest; the read after it waits for the write.
    let requests = vec![(1, Op::Dns { tcp: true, message: update(3) }, None), (2, Op::Dns { tcp: false, message: query(2) }, Some(4))];
    assert!(core.deliver(batch(2, start_s(), requests)).is_empty());
    assert_eq!(core.take_requests(), RequestCounts { reads: 0, transfers: 0, writes: 1 });
    let cmds = core.handle(Event::ZoneDigest { seq: 1, digests: Some(vec![[7; 32]]) });
    let Some(Command::Write { seq, index, .. }) = cmds.get(1) else { panic!("{cmds:?}") };
    assert_eq!(core.take_requests(), RequestCounts::default(), "the write that waited is not counted again");
    core.handle(Event::WriteAnswered { seq: *seq, index: *index, answer: answer(&update(3), ResponseCode::NoError) });
    assert_eq!(core.take_requests(), RequestCounts { reads: 1, transfers: 0, writes: 0 });
}
