//! The `Cluster` harness: virtual time, a seeded network (delay, loss, duplication, reordering,
//! partitions), crashes and restarts, honest clients, Byzantine nodes, and the checked invariants.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

use bft::{Action, Batch, Config, Message, Persist, PersistedState, Replica, ReplicaId, Request, RequestKey, Time};
use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest as _, Sha256};

use crate::byzantine::{self, Behaviour, ByzantineState};

/// The simulator's only source of randomness.
pub struct SimRng(ChaCha8Rng);

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng(ChaCha8Rng::seed_from_u64(seed))
    }

    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..bound` (bound > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }

    pub fn chance(&mut self, probability: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - probability
    }

    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }
}

/// Why a run failed, classified like a VOPR report.
#[derive(Debug)]
#[allow(dead_code)] // read through Debug in failure reports
pub enum Failure {
    Safety(String),
    Liveness(String),
}

/// A message on the wire: (arrival time, tie-break order, from, to, bytes).
type InFlight = (u64, u64, ReplicaId, ReplicaId, Vec<u8>);

/// One sequence of events and faults, fully determined by `seed`.
pub struct Cluster {
    n: u16,
    f: u16,
    seed: u64,
    now: u64,
    rng: SimRng,
    nodes: Vec<Node>,
    queue: BinaryHeap<Reverse<InFlight>>,
    order: u64,
    loss: f64,
    duplication: f64,
    delays_us: Vec<u64>,
    partition: Option<(Vec<bool>, u64)>,
    next_script: u64,
    client_numbers: BTreeMap<(ReplicaId, u64), u64>,
    /// Requests accepted by honest replicas, with the request for client retries.
    tracked: BTreeMap<RequestKey, Request>,
    /// Every request an honest replica's clients submitted (accepted or not), with its bytes:
    /// an honest replica never delivers anything else under an honest origin.
    submitted: BTreeMap<RequestKey, Vec<u8>>,
    /// seq -> digest of (time, requests) first delivered by an honest replica.
    canonical: BTreeMap<u64, [u8; 32]>,
    trace: u64,
    pub stats: Stats,
    failure: Option<Failure>,
    /// In the liveness phase: the highest honest view at the last honest delivery.
    view_at_progress: Option<u64>,
    /// Crashes restart replicas from their persisted state (see [`Reboots`]).
    reboots: Option<Reboots>,
    /// Bytes the budget hogs' requests in the canonical log are charged (see `check_hog`).
    hog_charged: u64,
    /// Agreed times of the canonical log's first and latest batch.
    log_span: Option<(u64, u64)>,
    /// A scripted run ([`Cluster::scripted`]): no random faults or submissions, the test
    /// drives the faults; the script submits `scripted_load` requests per tick.
    scripted: bool,
    scripted_load: usize,
    /// Scripted runs: when each request was submitted, and when its origin delivered it.
    submitted_at: BTreeMap<RequestKey, u64>,
    served_at: BTreeMap<RequestKey, u64>,
    /// Links add a random delay of up to their base delay again (see
    /// [`Cluster::set_link_delay`]); [`Cluster::exact_delays`] turns that off.
    jitter: bool,
}

/// How a cluster built with [`Cluster::with_reboots`] crashes replicas: each crash throws the
/// `Replica` away and restores a new one from what it persisted (its "disk"), the application
/// state surviving (like named's zone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reboots {
    /// One or two honest replicas at a time, at random points.
    Single,
    /// Every honest replica at once, at random points (a power cut), besides single ones.
    All,
}

/// What a replica persisted, as its driver's store would hold it.
#[derive(Default)]
struct Disk {
    snapshot: Option<Vec<u8>>,
    generation: u64,
    log: Vec<Vec<u8>>,
}

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub messages: u64,
    pub delivered_batches: u64,
    pub max_view: u64,
    pub crashes: u64,
    pub state_losses: u64,
    /// Restarts from persisted state.
    pub reboots: u64,
    pub partitions: u64,
    /// Views the honest replicas went through in the liveness phase (highest view at its end
    /// minus highest at its start).
    pub liveness_views: u64,
    /// Longest run of views without any honest delivery in the liveness phase (highest honest
    /// view at a delivery minus the highest at the previous delivery, or at its start).
    pub views_without_delivery: u64,
    /// Highest accounted bytes held by an honest replica (sampled while a flooder runs).
    pub peak_held_bytes: usize,
}

/// Most views in a row the honest replicas may go through without any of them delivering,
/// after stabilisation. Measured (`view_histogram`): after the safety phase's partitions and
/// crashes, replicas scattered over views with backed-off timers need up to 14 views for
/// n = 4 and 41 for n = 7 to realign, whatever the Byzantine behaviour; the bound leaves
/// margin. A stall (the old poisoning) also fails the delivery check at the end.
pub fn liveness_view_bound(f: u16) -> u64 {
    std::env::var("BFT_VIEW_BOUND").ok().and_then(|v| v.parse().ok()).unwrap_or(24 * (u64::from(f) + 1))
}

struct Node {
    replicas: Vec<Replica>,
    apps: Vec<App>,
    behaviour: Option<Behaviour>,
    byzantine_state: ByzantineState,
    up: bool,
    /// Lost its state at least once; counts against f like a Byzantine replica.
    amnesiac: bool,
    /// Its clock jumps [`SKEW_JUMP_US`] ahead at every restart (the nemesis campaign's
    /// `--faults skew`); counted against f from the start, since once skewed it vouches for no
    /// proposal's time.
    skew_at_restart: bool,
    restart_at: Option<(u64, bool)>,
    clock_offset_us: u64,
    /// Fresh `Replica`s started for this node (state losses), for per-incarnation bounds.
    incarnations: u64,
    /// Committed batches this node pushed to a status spammer.
    pushed_to_spammer: u64,
    disks: Vec<Disk>,
    /// The next restart restores from the disk.
    reboot_pending: bool,
    /// Batches up to here were executed before the last reboot: delivered again, they are
    /// checked against the canonical log and skipped, as the executor skips them.
    replay_until: u64,
}

/// The application a replica drives: a hash chain over delivered batches.
#[derive(Default)]
struct App {
    digest: [u8; 32],
    last_seq: u64,
    last_time: Time,
    delivered: BTreeSet<RequestKey>,
    state_transfer_needed: bool,
}

const START_US: u64 = 1_700_000_000_000_000;
const SCRIPT_INTERVAL_US: u64 = 2_000;
const CLOCK_SKEW_US: u64 = 10_000;
/// How far a skewed replica's clock jumps ahead when it restarts: two hours.
const SKEW_JUMP_US: u64 = 2 * 3_600 * 1_000_000;
/// Honest clients number from 1 and never get near it; forged relays use far larger numbers.
pub const MAX_NUMBER_JUMP: u64 = 1 << 20;
/// Held bytes are checked every this many script ticks while a flooder runs.
const HELD_CHECK_TICKS: u64 = 25;

pub fn sim_config(n: u16, id: ReplicaId) -> Config {
    let mut config = Config::new(n, id);
    config.batch_max_requests = 8;
    config.batch_delay = Duration::from_millis(1);
    config.checkpoint_interval = 8;
    config.watermark_window = 32;
    config.request_timeout = Duration::from_millis(300);
    // The adaptive request timeout starts low, so the seeds exercise its backoff.
    config.min_request_timeout = Duration::from_millis(100);
    config.view_change_timeout = Duration::from_millis(300);
    config.retransmit_interval = Duration::from_millis(100);
    config.max_clock_skew = Duration::from_millis(100);
    config.retained_batches = 100_000;
    config.max_pending_requests = 4096;
    // Small budgets, so the flooder reaches them within a run.
    config.batch_max_bytes = 16 * 1024;
    config.max_request_bytes = 4 * 1024;
    config.max_pending_bytes_per_origin = 64 * 1024;
    // Low enough that the flooder's requests (8 KiB per message) are held back at the primary.
    config.max_origin_bytes_per_sec = 256 * 1024;
    config.max_number_jump = MAX_NUMBER_JUMP;
    config
}

impl Cluster {
    pub fn new(n: u16, seed: u64) -> Cluster {
        Cluster::with_behaviour(n, seed, None)
    }

    /// With `forced`, exactly f replicas (chosen by the seed) behave that way; otherwise up to f
    /// replicas get behaviours drawn from [`byzantine::ALL`].
    pub fn with_behaviour(n: u16, seed: u64, forced: Option<Behaviour>) -> Cluster {
        let salt = forced.map_or(0, |b| (b as u64 + 1) << 48);
        let mut rng = SimRng::new(seed ^ (u64::from(n) << 56) ^ salt);
        let f = (n - 1) / 3;
        let byzantine_count = if forced.is_some() { usize::from(f) } else { rng.below(u64::from(f) + 1) as usize };
        let mut byzantine_ids = BTreeSet::new();
        while byzantine_ids.len() < byzantine_count {
            byzantine_ids.insert(rng.below(u64::from(n)) as ReplicaId);
        }
        // Seeds without Byzantine nodes: one in eight has a replica whose clock jumps hours ahead
        // when it restarts. Drawn from a stream of its own, so every other draw stays the same.
        let mut skew_rng = SimRng::new(seed ^ (u64::from(n) << 56) ^ salt ^ 0x5ce3_d0c1_0c4e);
        let skewed = (byzantine_count == 0 && skew_rng.chance(0.125)).then(|| skew_rng.below(u64::from(n)) as ReplicaId);
        let mut nodes = Vec::new();
        for id in 0..n {
            let behaviour = byzantine_ids.contains(&id).then(|| forced.unwrap_or_else(|| byzantine::ALL[rng.below(byzantine::ALL.len() as u64) as usize]));
            let clock_offset_us = rng.below(CLOCK_SKEW_US);
            let now = Time(START_US + clock_offset_us);
            let copies = if behaviour == Some(Behaviour::Twins) { 2 } else { 1 };
            let replicas = (0..copies).map(|_| Replica::new(sim_config(n, id), now).expect("valid config")).collect();
            nodes.push(Node {
                replicas,
                apps: (0..copies).map(|_| App::default()).collect(),
                behaviour,
                byzantine_state: ByzantineState::default(),
                up: true,
                amnesiac: false,
                skew_at_restart: skewed == Some(id),
                restart_at: None,
                clock_offset_us,
                incarnations: 1,
                pushed_to_spammer: 0,
                disks: (0..copies).map(|_| Disk::default()).collect(),
                reboot_pending: false,
                replay_until: 0,
            });
        }
        let loss = [0.0, 0.01, 0.05, 0.1][rng.below(4) as usize];
        let duplication = [0.0, 0.02, 0.05][rng.below(3) as usize];
        let delays_us = (0..usize::from(n) * usize::from(n)).map(|_| rng.between(100, 3_000)).collect();
        Cluster {
            n,
            f,
            seed,
            now: START_US,
            rng,
            nodes,
            queue: BinaryHeap::new(),
            order: 0,
            loss,
            duplication,
            delays_us,
            partition: None,
            next_script: START_US,
            client_numbers: BTreeMap::new(),
            tracked: BTreeMap::new(),
            submitted: BTreeMap::new(),
            canonical: BTreeMap::new(),
            trace: 0xcbf2_9ce4_8422_2325,
            stats: Stats::default(),
            failure: None,
            view_at_progress: None,
            reboots: None,
            hog_charged: 0,
            log_span: None,
            scripted: false,
            scripted_load: 0,
            submitted_at: BTreeMap::new(),
            served_at: BTreeMap::new(),
            jitter: true,
        }
    }

    /// n honest replicas over a network that loses, duplicates and partitions nothing (link
    /// delays drawn from `seed`), driven by the test: [`Cluster::stop`], [`Cluster::start`],
    /// [`Cluster::set_link_delay`], [`Cluster::set_load`], [`Cluster::run_until`].
    pub fn scripted(n: u16, seed: u64) -> Cluster {
        let mut cluster = Cluster::with_behaviour(n, seed, None);
        for id in 0..n {
            let node = &mut cluster.nodes[usize::from(id)];
            if node.behaviour.take().is_some() {
                let now = Time(START_US + node.clock_offset_us);
                node.replicas = vec![Replica::new(sim_config(n, id), now).expect("valid config")];
                node.apps = vec![App::default()];
                node.disks = vec![Disk::default()];
            }
        }
        for node in &mut cluster.nodes {
            node.skew_at_restart = false;
        }
        cluster.loss = 0.0;
        cluster.duplication = 0.0;
        cluster.scripted = true;
        cluster
    }

    /// Like [`Cluster::scripted`], every replica's configuration changed by `adjust` (for
    /// timeouts in the proportion of real links, say).
    pub fn scripted_with(n: u16, seed: u64, adjust: impl Fn(&mut Config)) -> Cluster {
        let mut cluster = Cluster::scripted(n, seed);
        for id in 0..n {
            let node = &mut cluster.nodes[usize::from(id)];
            let mut config = sim_config(n, id);
            adjust(&mut config);
            let now = Time(START_US + node.clock_offset_us);
            node.replicas = vec![Replica::new(config, now).expect("valid config")];
        }
        cluster
    }

    /// Every message takes exactly its link's base delay (a topology's one-way delays).
    pub fn exact_delays(&mut self) {
        self.jitter = false;
    }

    /// Requests of replica `id`'s clients it has not delivered yet (scripted runs).
    pub fn outstanding(&self, id: usize) -> usize {
        self.submitted_at.keys().filter(|key| usize::from(key.origin) == id && !self.served_at.contains_key(key)).count()
    }

    /// The request timeout replica `id` would use now (see `Replica::current_request_timeout`).
    pub fn request_timeout(&self, id: usize) -> Duration {
        self.nodes[id].replicas[0].current_request_timeout()
    }

    /// One request from a client of replica `id`.
    pub fn submit(&mut self, id: usize) {
        let client = self.rng.below(3);
        self.submit_as(id, client);
    }

    /// Requests submitted per script tick (2 ms), each through the next replica that is up.
    pub fn set_load(&mut self, per_tick: usize) {
        self.scripted_load = per_tick;
    }

    /// The base delay of the links between `a` and `b`, both ways (a message takes between
    /// it and twice it).
    pub fn set_link_delay(&mut self, a: usize, b: usize, base_us: u64) {
        let n = usize::from(self.n);
        self.delays_us[a * n + b] = base_us;
        self.delays_us[b * n + a] = base_us;
    }

    /// Kills replica `id` (like kill -9): it comes back from its disk at [`Cluster::start`].
    pub fn stop(&mut self, id: usize) {
        self.nodes[id].up = false;
        self.nodes[id].reboot_pending = true;
        self.nodes[id].restart_at = None;
        self.stats.crashes += 1;
    }

    /// Starts replica `id` again from its disk, its clock `clock_offset_us` ahead of true time.
    pub fn start(&mut self, id: usize, clock_offset_us: u64) {
        self.nodes[id].clock_offset_us = clock_offset_us;
        self.restart(id, false);
    }

    /// Runs until `at_us` after the start of the simulation.
    pub fn run_until(&mut self, at_us: u64) -> Result<(), Failure> {
        self.drive(START_US + at_us, false);
        self.failure.take().map_or(Ok(()), Err)
    }

    pub fn status(&self, id: usize) -> bft::Status {
        self.nodes[id].replicas[0].status()
    }

    pub fn held_bytes(&self, id: usize) -> (usize, usize) {
        let replica = &self.nodes[id].replicas[0];
        (replica.held_bytes(), replica.held_bytes_bound())
    }

    /// Every request submitted so far is delivered at every replica (the liveness check).
    pub fn check_all_delivered(&self) -> Result<(), Failure> {
        self.check_liveness()
    }

    /// Requests of origin `id` submitted from `from_us` (after the start of the simulation)
    /// on: how many, and the longest time until `id` delivered one (`None`: one is not
    /// delivered at `id` yet).
    pub fn served(&self, id: usize, from_us: u64) -> (usize, Option<u64>) {
        let mut count = 0;
        let mut longest = Some(0);
        for (key, at) in self.submitted_at.iter().filter(|(key, at)| usize::from(key.origin) == id && **at >= START_US + from_us) {
            count += 1;
            longest = match (longest, self.served_at.get(key)) {
                (Some(longest), Some(served)) => Some(longest.max(served - at)),
                _ => None,
            };
        }
        (count, longest)
    }

    /// Like [`Cluster::new`], but every crash is a restart from persisted state.
    pub fn with_reboots(n: u16, seed: u64, reboots: Reboots) -> Cluster {
        let mut cluster = Cluster::with_behaviour(n, seed ^ 0x5eb0_07ed, None);
        cluster.reboots = Some(reboots);
        cluster
    }

    /// Describes the faulty nodes, for failure reports.
    pub fn describe(&self) -> String {
        let mut faulty: Vec<String> = self.nodes.iter().enumerate().filter_map(|(id, node)| node.behaviour.map(|b| format!("{id}:{b:?}"))).collect();
        faulty.extend(self.nodes.iter().enumerate().filter(|(_, node)| node.skew_at_restart).map(|(id, _)| format!("{id}:skewed-at-restart")));
        format!("n={} seed={} byzantine=[{}] loss={} dup={}", self.n, self.seed, faulty.join(","), self.loss, self.duplication)
    }

    pub fn trace_hash(&self) -> u64 {
        self.trace
    }

    fn mix(&mut self, values: &[u64], bytes: &[u8]) {
        let mut hash = self.trace;
        for value in values {
            hash = (hash ^ value).wrapping_mul(0x0100_0000_01b3);
        }
        for byte in bytes {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
        self.trace = hash;
    }

    fn honest(&self, id: usize) -> bool {
        self.nodes[id].behaviour.is_none()
    }

    /// Runs the safety phase (faults) then the liveness phase (healed network, bounded).
    pub fn run(&mut self, safety_us: u64, liveness_us: u64) -> Result<Stats, Failure> {
        let safety_end = self.now + safety_us;
        self.drive(safety_end, true);
        if let Some(failure) = self.failure.take() {
            return Err(failure);
        }
        // Global stabilisation: heal, restart everyone, stop losing messages.
        self.partition = None;
        self.loss = 0.0;
        self.duplication = 0.0;
        for id in 0..self.nodes.len() {
            if !self.nodes[id].up {
                let lose = self.nodes[id].restart_at.is_some_and(|(_, lose)| lose);
                self.restart(id, lose);
            }
        }
        let views_before = self.honest_max_view();
        self.view_at_progress = Some(views_before);
        let liveness_end = self.now + liveness_us;
        self.drive(liveness_end, false);
        if let Some(failure) = self.failure.take() {
            return Err(failure);
        }
        self.check_liveness()?;
        // A replica back from a view change it withdrew from reports its last view again.
        self.stats.liveness_views = self.honest_max_view().saturating_sub(views_before);
        let bound = liveness_view_bound(self.f);
        if self.stats.views_without_delivery > bound {
            return Err(Failure::Liveness(format!(
                "{} view changes in a row without a delivery after stabilisation (bound {bound})",
                self.stats.views_without_delivery
            )));
        }
        self.check_blame()?;
        self.check_held_bytes()?;
        self.check_spammer_answers()?;
        self.check_hog()?;
        Ok(self.stats.clone())
    }

    fn honest_max_view(&self) -> u64 {
        (0..self.nodes.len()).filter(|id| self.honest(*id)).flat_map(|id| self.nodes[id].replicas.iter().map(|r| r.status().view)).max().unwrap_or(0)
    }

    fn has(&self, behaviour: Behaviour) -> bool {
        self.nodes.iter().any(|node| node.behaviour == Some(behaviour))
    }

    /// Every honest replica holds no more than its documented bound (the flooder's target).
    fn check_held_bytes(&mut self) -> Result<(), Failure> {
        for id in 0..self.nodes.len() {
            if !self.honest(id) {
                continue;
            }
            for replica in &self.nodes[id].replicas {
                let (held, bound) = (replica.held_bytes(), replica.held_bytes_bound());
                self.stats.peak_held_bytes = self.stats.peak_held_bytes.max(held);
                if held > bound {
                    return Err(Failure::Safety(format!("replica {id} holds {held} bytes, above its bound {bound}")));
                }
            }
        }
        Ok(())
    }

    /// A status spammer gets at most one push of at most PUSH_BURST (64) batches per half
    /// retransmit interval from each incarnation of an honest replica.
    fn check_spammer_answers(&self) -> Result<(), Failure> {
        if !self.has(Behaviour::StatusSpammer) {
            return Ok(());
        }
        let half_interval_us = sim_config(self.n, 0).retransmit_interval.as_micros() as u64 / 2;
        let elapsed = self.now - START_US;
        for (id, node) in self.nodes.iter().enumerate() {
            if !self.honest(id) {
                continue;
            }
            let spammers = self.nodes.iter().filter(|n| n.behaviour == Some(Behaviour::StatusSpammer)).count() as u64;
            let bound = (elapsed / half_interval_us + 1 + node.incarnations) * 64 * spammers;
            if node.pushed_to_spammer > bound {
                return Err(Failure::Liveness(format!(
                    "replica {id} pushed {} batches to a status spammer in {elapsed} us (bound {bound})",
                    node.pushed_to_spammer
                )));
            }
        }
        Ok(())
    }

    /// Charges the budget hogs' requests in a newly delivered batch of the canonical log, as
    /// the per-origin budget charges them, and notes the log's time span.
    fn account_hog(&mut self, batch: &bft::Batch) {
        let min_charge = sim_config(self.n, 0).min_request_charge;
        for request in &batch.requests {
            if self.nodes.get(usize::from(request.origin)).is_some_and(|node| node.behaviour == Some(Behaviour::BudgetHog)) {
                self.hog_charged += request.wire_size().max(min_charge) as u64;
            }
        }
        if batch.requests.is_empty() {
            // A null batch's time may be raised from 0 (a view change at the start).
            return;
        }
        let first = self.log_span.map_or(batch.time.0, |(first, _)| first);
        self.log_span = Some((first, batch.time.0));
    }

    /// The log carries no more of the budget hogs' requests than the per-origin budget allows
    /// over its time span: a bucket, the rate, and a window of batches of slack (a backup that
    /// has not seen the batches before one checks it more leniently). Without the backups'
    /// check a hog that is primary for a second puts megabytes in.
    fn check_hog(&self) -> Result<(), Failure> {
        let hogs = self.nodes.iter().filter(|node| node.behaviour == Some(Behaviour::BudgetHog)).count() as u64;
        if hogs == 0 {
            return Ok(());
        }
        let config = sim_config(self.n, 0);
        let (first, last) = self.log_span.unwrap_or((0, 0));
        let batch = config.batch_max_bytes as u64;
        let refill = u128::from(last - first) * config.max_origin_bytes_per_sec as u128 / 1_000_000;
        let per_hog = batch + u64::try_from(refill).unwrap_or(u64::MAX) + config.watermark_window * batch;
        let bound = hogs.saturating_mul(per_hog);
        if self.hog_charged > bound {
            return Err(Failure::Liveness(format!(
                "the log carries {} bytes of budget hogs' requests over {} us, above the budget's {bound}",
                self.hog_charged,
                last - first
            )));
        }
        Ok(())
    }

    fn all_delivered(&self) -> bool {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(id, _)| self.honest(*id))
            .all(|(_, node)| node.apps.iter().all(|app| self.tracked.keys().all(|key| app.delivered.contains(key))))
    }

    fn drive(&mut self, end: u64, faults: bool) {
        // Bounded: every iteration handles one event and time never moves backwards.
        for _ in 0..20_000_000u64 {
            if self.failure.is_some() {
                return;
            }
            let next_message = self.queue.peek().map(|Reverse((at, ..))| *at);
            let (timer_node, next_timer) = self.next_timer();
            let next = [next_message, next_timer, Some(self.next_script)].into_iter().flatten().min().unwrap_or(end);
            if next >= end {
                self.now = end;
                return;
            }
            self.now = self.now.max(next);
            if next_message == Some(next) {
                let Some(Reverse((_, _, from, to, bytes))) = self.queue.pop() else { continue };
                self.deliver_message(from, to, bytes);
            } else if next_timer == Some(next) {
                if let Some(id) = timer_node {
                    self.fire_timer(id);
                }
            } else {
                self.next_script = self.now + SCRIPT_INTERVAL_US;
                self.script(faults);
                if !faults && !self.scripted && self.all_delivered() {
                    return;
                }
            }
        }
        self.failure = Some(Failure::Liveness("simulation step bound reached".into()));
    }

    fn local_time(&self, id: usize) -> Time {
        Time(self.now + self.nodes[id].clock_offset_us)
    }

    fn next_timer(&self) -> (Option<usize>, Option<u64>) {
        let mut best: (Option<usize>, Option<u64>) = (None, None);
        for (id, node) in self.nodes.iter().enumerate() {
            if !node.up {
                continue;
            }
            for replica in &node.replicas {
                if let Some(Time(local)) = replica.poll_timeout() {
                    let global = local.saturating_sub(node.clock_offset_us).max(self.now);
                    if best.1.is_none_or(|at| global < at) {
                        best = (Some(id), Some(global));
                    }
                }
            }
        }
        best
    }

    fn fire_timer(&mut self, id: usize) {
        let now = self.local_time(id);
        self.mix(&[self.now, id as u64, 0xfeed], &[]);
        for copy in 0..self.nodes[id].replicas.len() {
            self.nodes[id].replicas[copy].handle_timeout(now);
            self.drain(id, copy);
        }
    }

    fn deliver_message(&mut self, from: ReplicaId, to: ReplicaId, bytes: Vec<u8>) {
        let id = usize::from(to);
        if !self.nodes[id].up || self.cut(usize::from(from), id) {
            return;
        }
        self.mix(&[self.now, u64::from(from), u64::from(to)], &bytes);
        let now = self.local_time(id);
        for copy in 0..self.nodes[id].replicas.len() {
            let limits = self.nodes[id].replicas[copy].config().limits();
            match Message::decode(&bytes, limits) {
                Ok(message) => {
                    if message.encode() != bytes {
                        self.failure = Some(Failure::Safety("codec round trip changed a message".into()));
                        return;
                    }
                    self.nodes[id].replicas[copy].handle_message(now, from, message);
                }
                Err(error) => {
                    self.failure = Some(Failure::Safety(format!("valid message failed to decode: {error}")));
                    return;
                }
            }
            self.drain(id, copy);
        }
    }

    fn cut(&self, a: usize, b: usize) -> bool {
        self.partition.as_ref().is_some_and(|(side, _)| side[a] != side[b])
    }

    fn drain(&mut self, id: usize, copy: usize) {
        // Bounded: a replica emits a finite number of actions per input.
        for _ in 0..1_000_000 {
            let Some(action) = self.nodes[id].replicas[copy].poll_action() else { return };
            match action {
                Action::Send { to, message } => self.route(id, to, message),
                Action::Broadcast { message } => {
                    for to in 0..self.n {
                        if usize::from(to) != id {
                            self.route(id, to, message.clone());
                        }
                    }
                }
                Action::Deliver(batch) => self.on_deliver(id, copy, batch),
                Action::NeedStateTransfer { .. } => self.nodes[id].apps[copy].state_transfer_needed = true,
                Action::Persist(persist) => {
                    let disk = &mut self.nodes[id].disks[copy];
                    match persist {
                        Persist::Snapshot { generation, bytes } => {
                            disk.snapshot = Some(bytes);
                            disk.generation = generation;
                            disk.log.clear();
                        }
                        Persist::Append { generation, records } => {
                            if generation != disk.generation {
                                self.failure =
                                    Some(Failure::Safety(format!("replica {id} appended to generation {generation}, disk holds {}", disk.generation)));
                                return;
                            }
                            disk.log.extend(records);
                        }
                    }
                }
                other => panic!("unknown action {other:?}"),
            }
        }
        self.failure = Some(Failure::Liveness(format!("replica {id} emitted unbounded actions")));
    }

    fn route(&mut self, id: usize, to: ReplicaId, message: Message) {
        if debug() && matches!(message, Message::ViewChange(_) | Message::NewView { .. } | Message::PrePrepare { .. } | Message::Request { .. }) {
            eprintln!("{} r{id} -> {to}: {:?}", self.now, message);
        }
        let me = id as ReplicaId;
        let outgoing = match self.nodes[id].behaviour {
            Some(behaviour) => {
                let mut state = std::mem::take(&mut self.nodes[id].byzantine_state);
                let out = byzantine::rewrite(behaviour, &mut state, &mut self.rng, me, self.n, to, message);
                self.nodes[id].byzantine_state = state;
                out
            }
            None => vec![(to, message)],
        };
        for (to, message) in outgoing {
            if usize::from(to) == id || to >= self.n {
                continue;
            }
            if matches!(message, Message::Committed { .. })
                && self.nodes[usize::from(to)].behaviour == Some(Behaviour::StatusSpammer)
                && self.nodes[id].behaviour.is_none()
            {
                self.nodes[id].pushed_to_spammer += 1;
            }
            self.stats.messages += 1;
            if self.cut(id, usize::from(to)) || self.rng.chance(self.loss) {
                continue;
            }
            let bytes = message.encode();
            let copies = if self.rng.chance(self.duplication) { 2 } else { 1 };
            for _ in 0..copies {
                let base = self.delays_us[id * usize::from(self.n) + usize::from(to)];
                let extra = if self.jitter { self.rng.below(base) } else { 0 };
                let at = self.now + base + extra;
                self.order += 1;
                self.queue.push(Reverse((at, self.order, me, to, bytes.clone())));
            }
        }
    }

    fn on_deliver(&mut self, id: usize, copy: usize, batch: Batch) {
        self.stats.delivered_batches += 1;
        self.stats.max_view = self.stats.max_view.max(self.nodes[id].replicas[copy].status().view);
        let mut hasher = Sha256::new();
        hasher.update(batch.seq.to_le_bytes());
        hasher.update(batch.time.0.to_le_bytes());
        for request in &batch.requests {
            hasher.update(request.origin.to_le_bytes());
            hasher.update(request.client.to_le_bytes());
            hasher.update(request.number.to_le_bytes());
            hasher.update((request.payload.len() as u64).to_le_bytes());
            hasher.update(&request.payload);
        }
        let digest: [u8; 32] = hasher.finalize().into();
        if debug() {
            let status = self.nodes[id].replicas[copy].status();
            eprintln!(
                "{} deliver r{id}.{copy} seq {} view {} time {} n_req {} digest {:02x}{:02x}",
                self.now,
                batch.seq,
                status.view,
                batch.time.0,
                batch.requests.len(),
                digest[0],
                digest[1]
            );
        }
        self.mix(&[self.now, id as u64, batch.seq], &digest);
        let honest = self.honest(id);
        if honest {
            if let Some(before) = self.view_at_progress {
                let view = self.honest_max_view();
                self.stats.views_without_delivery = self.stats.views_without_delivery.max(view.saturating_sub(before));
                self.view_at_progress = Some(view);
            }
        }
        if honest && batch.seq <= self.nodes[id].replay_until {
            // Executed before the reboot: must be the same batch, and the application skips it.
            if self.canonical.get(&batch.seq).is_some_and(|expected| *expected != digest) {
                self.failure = Some(Failure::Safety(format!("replica {id} replayed a different batch at seq {} after a reboot", batch.seq)));
            }
            return;
        }
        if honest {
            let forged = batch.requests.iter().find(|request| {
                let origin = usize::from(request.origin);
                origin < self.nodes.len() && self.honest(origin) && self.submitted.get(&request.key()) != Some(&request.payload)
            });
            if let Some(request) = forged {
                self.failure = Some(Failure::Safety(format!("replica {id} delivered {:?}, which its honest origin never submitted", request.key())));
                return;
            }
        }
        let app = &mut self.nodes[id].apps[copy];
        if honest {
            if batch.seq != app.last_seq + 1 {
                self.failure = Some(Failure::Safety(format!("replica {id} delivered seq {} after {}", batch.seq, app.last_seq)));
                return;
            }
            if batch.time <= app.last_time {
                self.failure = Some(Failure::Safety(format!("replica {id}: agreed time did not increase at seq {}", batch.seq)));
                return;
            }
            for request in &batch.requests {
                if self.scripted && usize::from(request.origin) == id {
                    self.served_at.entry(request.key()).or_insert(self.now);
                }
                if request.number > MAX_NUMBER_JUMP {
                    self.failure = Some(Failure::Safety(format!("replica {id} delivered a jumped number {:?}", request.key())));
                    return;
                }
                if !app.delivered.insert(request.key()) {
                    self.failure = Some(Failure::Safety(format!("replica {id} delivered {:?} twice", request.key())));
                    return;
                }
            }
        } else {
            app.delivered.extend(batch.requests.iter().map(Request::key));
        }
        app.last_seq = batch.seq;
        app.last_time = batch.time;
        let mut chain = Sha256::new();
        chain.update(app.digest);
        chain.update(digest);
        app.digest = chain.finalize().into();
        let state_digest = app.digest;
        if honest {
            match self.canonical.get(&batch.seq) {
                Some(expected) if *expected != digest => {
                    self.failure = Some(Failure::Safety(format!("replica {id} delivered a different batch at seq {}", batch.seq)));
                    return;
                }
                Some(_) => {}
                None => {
                    self.canonical.insert(batch.seq, digest);
                    self.account_hog(&batch);
                }
            }
        }
        if batch.checkpoint_due {
            if let Err(error) = self.nodes[id].replicas[copy].checkpoint(batch.seq, state_digest) {
                self.failure = Some(Failure::Safety(format!("replica {id} refused its checkpoint: {error}")));
            }
        }
    }

    /// One tick of the script: clients submit; in the safety phase, faults come and go.
    fn script(&mut self, faults: bool) {
        for id in 0..self.nodes.len() {
            if let Some((at, lose)) = self.nodes[id].restart_at {
                if at <= self.now && faults {
                    self.restart(id, lose);
                }
            }
        }
        if let Some((_, heal_at)) = self.partition {
            if heal_at <= self.now {
                self.partition = None;
            }
        }
        // `%` keeps the workspace's declared rust-version (is_multiple_of is 1.87).
        #[allow(clippy::manual_is_multiple_of)]
        let due = (self.now / SCRIPT_INTERVAL_US) % HELD_CHECK_TICKS == 0;
        if self.has(Behaviour::Flooder) && due {
            if let Err(failure) = self.check_held_bytes() {
                self.failure = Some(failure);
                return;
            }
        }
        if self.scripted {
            for _ in 0..self.scripted_load {
                let next = self.client_numbers.values().sum::<u64>() as usize;
                if let Some(id) = (0..self.nodes.len()).map(|i| (next + i) % self.nodes.len()).find(|id| self.nodes[*id].up) {
                    let client = self.rng.below(3);
                    self.submit_as(id, client);
                }
            }
            return;
        }
        if !faults {
            return;
        }
        if self.rng.chance(0.3) {
            self.submit_one();
        }
        if self.partition.is_none() && self.rng.chance(0.005) {
            let side: Vec<bool> = (0..self.n).map(|_| self.rng.chance(0.5)).collect();
            let heal_at = self.now + self.rng.between(50_000, 600_000);
            self.partition = Some((side, heal_at));
            self.stats.partitions += 1;
            if debug() {
                eprintln!("{} partition {:?}", self.now, self.partition);
            }
        }
        if self.rng.chance(0.005) {
            self.crash_one();
        }
        if self.reboots == Some(Reboots::All) && self.rng.chance(0.002) {
            self.crash_all();
        }
    }

    /// Every honest replica goes down at once and comes back from its disk at its own time.
    fn crash_all(&mut self) {
        for id in 0..self.nodes.len() {
            if !self.honest(id) || self.nodes[id].amnesiac {
                continue;
            }
            if self.nodes[id].up || self.nodes[id].reboot_pending {
                self.nodes[id].up = false;
                self.nodes[id].reboot_pending = true;
                self.nodes[id].restart_at = Some((self.now + self.rng.between(5_000, 400_000), false));
                self.stats.crashes += 1;
            }
        }
        if debug() {
            eprintln!("{} crash all", self.now);
        }
        self.mix(&[self.now, 0xa11], &[]);
    }

    fn submit_one(&mut self) {
        let id = self.rng.below(u64::from(self.n)) as usize;
        if !self.nodes[id].up {
            return;
        }
        let client = self.rng.below(3);
        self.submit_as(id, client);
    }

    fn submit_as(&mut self, id: usize, client: u64) {
        let origin = id as ReplicaId;
        let number = {
            let counter = self.client_numbers.entry((origin, client)).or_insert(0);
            *counter += 1;
            *counter
        };
        let payload = self.rng.next().to_le_bytes().to_vec();
        let request = Request { origin, client, number, payload };
        let now = self.local_time(id);
        let copies = self.nodes[id].replicas.len();
        let copy = self.rng.below(copies as u64) as usize;
        if self.honest(id) {
            self.submitted.insert(request.key(), request.payload.clone());
        }
        let accepted = self.nodes[id].replicas[copy].submit(now, request.clone()).is_ok();
        self.mix(&[self.now, id as u64, number, u64::from(accepted)], &[]);
        if accepted && self.honest(id) {
            if self.scripted {
                self.submitted_at.insert(request.key(), self.now);
            }
            self.tracked.insert(request.key(), request);
        }
        self.drain(id, copy);
    }

    fn crash_one(&mut self) {
        let down = self.nodes.iter().filter(|node| !node.up).count();
        if down >= 2 {
            return;
        }
        let id = self.rng.below(u64::from(self.n)) as usize;
        if !self.honest(id) || !self.nodes[id].up {
            return;
        }
        // Losing state is a fault like a Byzantine one (the replica forgets what it promised):
        // allow it only while Byzantine plus amnesiac replicas stay within f.
        let faulty = self.nodes.iter().filter(|node| node.behaviour.is_some() || node.amnesiac || node.skew_at_restart).count();
        let lose = self.reboots.is_none() && (self.nodes[id].amnesiac || faulty < usize::from(self.f)) && self.rng.chance(0.5);
        self.nodes[id].up = false;
        self.nodes[id].reboot_pending = self.reboots.is_some();
        self.nodes[id].amnesiac |= lose;
        self.nodes[id].restart_at = Some((self.now + self.rng.between(20_000, 800_000), lose));
        self.stats.crashes += 1;
        if debug() {
            eprintln!("{} crash r{id} lose={lose}", self.now);
        }
        self.mix(&[self.now, id as u64, 0xdead, u64::from(lose)], &[]);
    }

    fn restart(&mut self, id: usize, lose: bool) {
        let node = &mut self.nodes[id];
        node.up = true;
        node.restart_at = None;
        if node.skew_at_restart {
            node.clock_offset_us += SKEW_JUMP_US;
        }
        if debug() {
            eprintln!("{} restart r{id} lose={lose} reboot={}", self.now, node.reboot_pending);
        }
        if std::mem::take(&mut node.reboot_pending) {
            self.reboot(id);
            return;
        }
        if !lose {
            return;
        }
        self.stats.state_losses += 1;
        node.amnesiac = true;
        node.incarnations += 1;
        let now = Time(self.now + node.clock_offset_us);
        node.replicas = vec![Replica::new(sim_config(self.n, id as ReplicaId), now).expect("valid config")];
        node.apps = vec![App::default()];
        // Clients of this gateway retry what they have not seen delivered.
        let origin = id as ReplicaId;
        let retries: Vec<Request> = self.tracked.values().filter(|r| r.origin == origin).cloned().collect();
        for request in retries {
            let _ = self.nodes[id].replicas[0].submit(now, request);
        }
        self.drain(id, 0);
    }

    /// A new `Replica` restored from the disk; the application keeps its state.
    fn reboot(&mut self, id: usize) {
        self.stats.reboots += 1;
        let node = &mut self.nodes[id];
        let now = Time(self.now + node.clock_offset_us);
        let disk = &node.disks[0];
        let config = sim_config(self.n, id as ReplicaId);
        let restored = match disk.snapshot.as_ref() {
            // Crashed before its first action: it never said anything.
            None => Replica::new(config, now).map_err(bft::RestoreError::from),
            Some(snapshot) => PersistedState::decode_snapshot(snapshot)
                .and_then(|mut state| {
                    for record in &disk.log {
                        state.apply_record(record)?;
                    }
                    Ok(state)
                })
                .and_then(|state| Replica::restore(config, now, state)),
        };
        match restored {
            Ok(replica) => node.replicas = vec![replica],
            Err(error) => {
                self.failure = Some(Failure::Safety(format!("replica {id} cannot restore: {error}")));
                return;
            }
        }
        node.replay_until = node.apps[0].last_seq;
        node.apps[0].state_transfer_needed = false;
        // Clients of this gateway retry what they have not seen delivered.
        let origin = id as ReplicaId;
        let app = &node.apps[0];
        let retries: Vec<Request> = self.tracked.values().filter(|r| r.origin == origin && !app.delivered.contains(&r.key())).cloned().collect();
        for request in retries {
            let _ = self.nodes[id].replicas[0].submit(now, request);
        }
        self.drain(id, 0);
    }

    fn check_liveness(&self) -> Result<(), Failure> {
        for (id, node) in self.nodes.iter().enumerate() {
            if !self.honest(id) {
                continue;
            }
            for app in &node.apps {
                let missing: Vec<&RequestKey> = self.tracked.keys().filter(|key| !app.delivered.contains(key)).collect();
                if !missing.is_empty() {
                    let statuses: Vec<String> = self
                        .nodes
                        .iter()
                        .enumerate()
                        .map(|(peer, node)| {
                            let status = node.replicas[0].status();
                            format!(
                                "r{peer}{}: view {}{} delivered {} stable {}",
                                if node.behaviour.is_some() {
                                    "(byz)"
                                } else if node.amnesiac {
                                    "(amnesiac)"
                                } else {
                                    ""
                                },
                                status.view,
                                if status.view_changing { " changing" } else { "" },
                                status.last_delivered,
                                status.stable_checkpoint
                            )
                        })
                        .collect();
                    return Err(Failure::Liveness(format!(
                        "replica {id} misses {} of {} requests (first {:?}); state transfer needed {}; {}",
                        missing.len(),
                        self.tracked.len(),
                        missing[0],
                        app.state_transfer_needed,
                        statuses.join("; ")
                    )));
                }
            }
        }
        Ok(())
    }

    /// Honest replicas never blame a replica that stayed honest, and every honest replica
    /// blames an impersonator (half of whose messages claim another sender), a forger of
    /// relayed requests and a status spammer (whose made-up reports are impossible).
    fn check_blame(&self) -> Result<(), Failure> {
        for (faulty, node) in self.nodes.iter().enumerate() {
            if !matches!(node.behaviour, Some(Behaviour::Impersonator | Behaviour::ForgedRelays | Behaviour::StatusSpammer)) {
                continue;
            }
            for (id, honest) in self.nodes.iter().enumerate() {
                if self.honest(id) && honest.replicas[0].status().misbehaviour[faulty] == 0 {
                    return Err(Failure::Safety(format!("replica {id} never blamed {:?} {faulty}", node.behaviour)));
                }
            }
        }
        for (id, node) in self.nodes.iter().enumerate() {
            if !self.honest(id) {
                continue;
            }
            let misbehaviour = node.replicas[0].status().misbehaviour;
            for (peer, count) in misbehaviour.iter().enumerate() {
                if *count > 0 && self.honest(peer) && !self.nodes[peer].amnesiac {
                    return Err(Failure::Safety(format!(
                        "replica {id} blamed honest replica {peer} {count} times (last: {:?})",
                        node.replicas[0].status().last_misbehaviour
                    )));
                }
            }
        }
        Ok(())
    }
}

fn debug() -> bool {
    std::env::var("BFT_DEBUG").is_ok()
}
