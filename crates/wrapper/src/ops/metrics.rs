//! The replica's counters, histograms and status, as a `prometheus-client` registry encoded in
//! the OpenMetrics text format, and the status as JSON (both served by `crate::front::endpoint`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::Serialize;

/// Latency buckets (seconds): 0.5 ms to 10 s.
const LATENCY_BUCKETS: [f64; 14] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// What `sdns cluster status` shows for one replica.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Status {
    pub id: u16,
    pub view: u64,
    pub primary: u16,
    pub last_executed: u64,
    pub stable_checkpoint: u64,
    pub named_running: bool,
    pub zone_serial: Option<u32>,
    pub peers_connected: usize,
    /// What this replica saw its peers do wrong, per peer and kind (attribution).
    #[serde(default)]
    pub peer_faults: Vec<PeerFault>,
    /// Peers this replica has not heard from on the ordering channel for `SILENT_AFTER`.
    #[serde(default)]
    pub silent_peers: Vec<u16>,
    /// Incremental re-signing, as the last slice that read the zone saw it: signatures
    /// in the zone, and those due (expiring within the refresh window).
    pub rrsigs: u64,
    pub rrsigs_due: u64,
    /// RRsets re-signed by slices since start, and slices run.
    pub resigned_rrsets: u64,
    pub resign_slices: u64,
    /// RRsets per second over the slices that re-signed something, and the time (s) the
    /// signatures due would take at that rate and the configured slice pace.
    pub resign_rate: f64,
    pub resign_eta_s: Option<u64>,
    /// A whole-zone signing running in the background (`sdns sign-zone`, the first
    /// signing): RRsets signed so far of those the signed zone will hold, signing rate
    /// and time left at it. `None` when none runs.
    pub zone_signing: Option<ZoneSigning>,
    /// Whole-zone signings finished since start, and how long the last one held the
    /// executor to install the signed zone (s).
    pub zone_signings: u64,
    pub zone_install_s: f64,
    /// The last checkpoint whose zones were read from named (not reused unchanged): how
    /// long reading and digesting them took (s), and how many zones it read.
    #[serde(default)]
    pub checkpoint_digest_s: f64,
    #[serde(default)]
    pub checkpoint_zones_read: u64,
    /// The last snapshot kept for state transfer: its encoded size and how long writing it
    /// took (s).
    #[serde(default)]
    pub snapshot_bytes: u64,
    #[serde(default)]
    pub snapshot_write_s: f64,
    /// Set while this replica's state differs from a checkpoint 2t+1 replicas certified (its
    /// zone, or the outcome of a write its named answered differently): why, until a state
    /// transfer repaired it.
    #[serde(default)]
    pub diverged: Option<String>,
    /// The checkpoint whose state this replica is fetching from its peers, while it does.
    #[serde(default)]
    pub state_transfer: Option<u64>,
    /// Transferred states installed since start.
    #[serde(default)]
    pub state_transfers: u64,
    /// The batch the executor has been running for a while, and for how long (s), as its
    /// stall check last saw it.
    #[serde(default)]
    pub stalled: Option<(u64, u64)>,
    /// Ordered writes this replica abandoned (claims from t+1 replicas that they were stuck
    /// were committed before its named answered), since start.
    #[serde(default)]
    pub writes_abandoned: u64,
    /// Every zone this replica serves, in zone index order.
    #[serde(default)]
    pub zones: Vec<ZoneStatus>,
    /// Set while this replica makes no progress for longer than `metrics.stall_after_ms`
    /// (`crate::ops::health`): why.
    #[serde(default)]
    pub progress_stalled: Option<String>,
    /// How long (s) this gateway's requests have gone undelivered, and how long the executor
    /// has not moved while behind the log, as the health check last saw them (0: not so).
    #[serde(default)]
    pub own_requests_waiting_s: u64,
    #[serde(default)]
    pub executor_behind_s: u64,
}

/// One zone at one replica, for `/status`, `sdns cluster status` and the `zone`-labelled
/// metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ZoneStatus {
    /// The zone index (the execution state's, stable while the zone is served).
    pub index: u16,
    pub name: String,
    /// "ok", or "missing" when this replica holds no share of the zone's key (a zone added
    /// at run time without its `zones/<zone>/share.json`, or with one of another key).
    pub share: String,
    /// The threshold key's tag (the one its DS names).
    pub key_tag: u16,
    /// The zone's SOA serial at the last checkpoint this replica digested.
    pub serial: Option<u32>,
    /// Agreed time (s) of its last whole-zone signing (0: never).
    pub signed_at: u64,
    /// Agreed time (s) from which its next re-signing slice may run.
    pub next_resign_due: u64,
    /// The batch at which its running background whole-zone signing began, if one runs.
    pub signing_since: Option<u64>,
    /// Re-signing as its last slice that read the zone saw it, and RRsets re-signed since start.
    pub rrsigs: u64,
    pub rrsigs_due: u64,
    pub resigned_rrsets: u64,
    /// Signatures of the zone this replica could not take part in (no share of its key).
    pub signing_failures: u64,
}

/// Progress of a background whole-zone signing at one replica.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ZoneSigning {
    /// The batch at which it began.
    pub seq: u64,
    pub done: u64,
    pub total: u64,
    /// RRsets per second since it began.
    pub rate: f64,
    pub eta_s: Option<u64>,
    /// This replica's part is done; waiting for t+1 replicas to be, then installed.
    pub signed: bool,
}

/// One peer's misbehaviour of one kind, as one replica saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct PeerFault {
    pub peer: u16,
    /// snake_case: the ordering core's reason, `undecodable_message`, `bad_signature_share` or
    /// `state_transfer_requests_over_rate`.
    pub kind: String,
    pub count: u64,
}

/// A peer silent on the ordering channel this long is reported (honest peers send a status
/// report every half second).
pub const SILENT_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// A metrics label from one of the core's reasons ("two pre-prepares for one seq and view").
pub fn fault_kind(reason: &str) -> String {
    reason.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect()
}

impl Status {
    /// Why this replica is not in agreement with the cluster, from what it knows itself
    /// (`None`: nothing says so). `others_stable`: the highest stable checkpoint another
    /// replica reports, when the caller has it (`sdns cluster status` does).
    pub fn disagreement(&self, others_stable: u64) -> Option<String> {
        // A stable checkpoint is certified by 2t+1 replicas: whoever has not executed that
        // far is behind by at least a checkpoint interval, not merely sampled a moment early.
        if let Some(why) = &self.diverged {
            return Some(format!("diverged: {why}"));
        }
        if let Some(seq) = self.state_transfer {
            return Some(format!("catching up: fetching the state of checkpoint {seq} from peers"));
        }
        // Before the checkpoint comparison: a replica that does not move is not catching up.
        if let Some(why) = &self.progress_stalled {
            return Some(format!("stalled: {why}"));
        }
        let certified = self.stable_checkpoint.max(others_stable);
        (self.last_executed < certified).then(|| format!("catching up: executed batch {} is below the certified checkpoint {certified}", self.last_executed))
    }
}

/// What the status collector reads at every scrape: the status the replica's tasks update,
/// and the progress of a background whole-zone signing.
#[derive(Debug)]
struct Progress {
    status: Mutex<Status>,
    /// Signatures the background whole-zone signer received (RRsets signed).
    zone_signed: AtomicU64,
    /// The background signing running: (began at seq, expected RRsets, since, this part done).
    zone_signing: Mutex<Option<(u64, u64, std::time::Instant, bool)>>,
}

impl Progress {
    fn zone_signing(&self) -> Option<ZoneSigning> {
        let (seq, total, since, signed) = (*self.zone_signing.lock().ok()?)?;
        let done = self.zone_signed.load(Relaxed);
        let rate = done as f64 / since.elapsed().as_secs_f64().max(1e-3);
        let left = total.saturating_sub(done);
        let eta_s = if signed { Some(0) } else { (rate > 0.0).then(|| (left as f64 / rate).ceil() as u64) };
        Some(ZoneSigning { seq, done, total, rate, eta_s, signed })
    }

    fn snapshot(&self) -> Status {
        let mut s = self.status.lock().map(|s| s.clone()).unwrap_or_default();
        s.zone_signing = self.zone_signing();
        s
    }
}

/// The metrics read from [`Status`] at each scrape: their values are kept there (for
/// `/status` too), so they are encoded as constant metrics of one snapshot rather than
/// mirrored into counters and gauges that could disagree with it.
#[derive(Debug)]
struct StatusCollector(Arc<Progress>);

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge<N: prometheus_client::encoding::EncodeGaugeValue>(e: &mut DescriptorEncoder, name: &str, help: &str, v: N) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for StatusCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let s = self.0.snapshot();
        if !s.peer_faults.is_empty() {
            let mut family =
                e.encode_descriptor("peer_faults", "Misbehaviour seen from each peer, by kind.", None, prometheus_client::metrics::MetricType::Counter)?;
            for f in &s.peer_faults {
                let labels = [("peer", f.peer.to_string()), ("kind", f.kind.clone())];
                ConstCounter::new(f.count).encode(family.encode_family(&labels)?)?;
            }
        }
        if !s.silent_peers.is_empty() {
            let mut family = e.encode_descriptor(
                "peer_silent",
                "Peers silent on the ordering channel (1: nothing heard for 5 s).",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for peer in &s.silent_peers {
                ConstGauge::new(1i64).encode(family.encode_family(&[("peer", *peer)])?)?;
            }
        }
        let z = s.zone_signing.clone().unwrap_or_default();
        gauge(&mut e, "zone_signing", "Whether a background whole-zone signing runs (1) or not (0).", i64::from(s.zone_signing.is_some()))?;
        gauge(&mut e, "zone_signing_rrsets_done", "RRsets signed so far by the running background whole-zone signing.", z.done)?;
        gauge(&mut e, "zone_signing_rrsets", "RRsets the running background whole-zone signing signs.", z.total)?;
        gauge(&mut e, "zone_signing_rate", "RRsets per second since the running whole-zone signing began.", z.rate)?;
        if let Some(eta) = z.eta_s {
            gauge(&mut e, "zone_signing_eta_seconds", "Time until the running whole-zone signing is done at its rate.", eta)?;
        }
        counter(&mut e, "zone_signings", "Whole-zone signings finished (installed or failed).", s.zone_signings)?;
        gauge(&mut e, "zone_install_seconds", "How long installing the last signed zone held the executor.", s.zone_install_s)?;
        gauge(
            &mut e,
            "checkpoint_digest_seconds",
            "How long reading and digesting the zones took for the last checkpoint that read them (a checkpoint with no zone changed reuses the last digests).",
            s.checkpoint_digest_s,
        )?;
        gauge(&mut e, "checkpoint_zones_read", "Zones read from named for the last checkpoint that read them.", s.checkpoint_zones_read)?;
        gauge(&mut e, "snapshot_bytes", "Encoded size of the last checkpoint snapshot kept for state transfer.", s.snapshot_bytes)?;
        gauge(&mut e, "snapshot_write_seconds", "How long encoding and writing the last kept snapshot took.", s.snapshot_write_s)?;
        counter(&mut e, "resigned_rrsets", "RRsets re-signed by incremental re-signing slices.", s.resigned_rrsets)?;
        counter(&mut e, "resign_slices", "Re-signing slices run (with or without anything due).", s.resign_slices)?;
        gauge(&mut e, "rrsigs", "Signatures in the zone at the last slice that read it.", s.rrsigs)?;
        gauge(&mut e, "rrsigs_due", "Signatures due for re-signing and not yet re-signed.", s.rrsigs_due)?;
        gauge(&mut e, "resign_rate", "RRsets per second while a slice runs (smoothed).", s.resign_rate)?;
        if let Some(eta) = s.resign_eta_s {
            gauge(&mut e, "resign_eta_seconds", "Time until the signatures due are re-signed at the slice pace.", eta)?;
        }
        gauge(&mut e, "view", "Current PBFT view.", s.view)?;
        gauge(&mut e, "last_executed_seq", "Last ordered batch executed.", s.last_executed)?;
        gauge(&mut e, "stable_checkpoint_seq", "Latest checkpoint 2t+1 replicas certified.", s.stable_checkpoint)?;
        gauge(
            &mut e,
            "catching_up",
            "1 while this replica is not in agreement: behind the certified checkpoint, fetching state from peers, diverged, or stalled.",
            i64::from(s.disagreement(0).is_some()),
        )?;
        gauge(
            &mut e,
            "state_diverged",
            "1 while this replica's state differs from the certified checkpoint (it repairs itself by state transfer).",
            i64::from(s.diverged.is_some()),
        )?;
        counter(&mut e, "state_transfers", "Checkpoint states fetched from peers and installed.", s.state_transfers)?;
        counter(&mut e, "writes_abandoned", "Ordered writes abandoned by the rule of the log (t+1 replicas' named did not answer them).", s.writes_abandoned)?;
        gauge(
            &mut e,
            "stalled",
            "1 while this replica makes no progress: its own requests go undelivered, or its executor does not move behind the log, for longer than metrics.stall_after_ms.",
            i64::from(s.progress_stalled.is_some()),
        )?;
        gauge(
            &mut e,
            "own_requests_undelivered_seconds",
            "How long this gateway's requests have gone undelivered (0: they are delivered).",
            s.own_requests_waiting_s,
        )?;
        gauge(
            &mut e,
            "executor_behind_seconds",
            "How long the executor has not moved while the ordering delivered past it (0: it keeps up).",
            s.executor_behind_s,
        )?;
        encode_zones(&mut e, &s.zones)
    }
}

/// The per-zone series, labelled `zone`.
fn encode_zones(e: &mut DescriptorEncoder, zones: &[ZoneStatus]) -> std::fmt::Result {
    use prometheus_client::metrics::MetricType;
    type Value = fn(&ZoneStatus) -> Option<i64>;
    let series: [(&str, &str, MetricType, Value); 8] = [
        ("zone_soa_serial", "The zone's SOA serial at the last checkpoint digested.", MetricType::Gauge, |z| z.serial.map(i64::from)),
        ("zone_last_signed_time_seconds", "Agreed time of the zone's last whole-zone signing (0: never).", MetricType::Gauge, |z| {
            Some(i64::try_from(z.signed_at).unwrap_or(i64::MAX))
        }),
        ("zone_next_resign_time_seconds", "Agreed time from which the zone's next re-signing slice may run.", MetricType::Gauge, |z| {
            Some(i64::try_from(z.next_resign_due).unwrap_or(i64::MAX))
        }),
        ("zone_background_signing", "Whether a background whole-zone signing of the zone runs (1) or not (0).", MetricType::Gauge, |z| {
            Some(i64::from(z.signing_since.is_some()))
        }),
        ("zone_rrsigs", "Signatures in the zone at its last slice that read it.", MetricType::Gauge, |z| Some(i64::try_from(z.rrsigs).unwrap_or(i64::MAX))),
        ("zone_rrsigs_due", "The zone's signatures due for re-signing and not yet re-signed.", MetricType::Gauge, |z| {
            Some(i64::try_from(z.rrsigs_due).unwrap_or(i64::MAX))
        }),
        ("zone_resigned_rrsets", "RRsets of the zone re-signed by incremental re-signing slices.", MetricType::Counter, |z| {
            Some(i64::try_from(z.resigned_rrsets).unwrap_or(i64::MAX))
        }),
        ("signing_failures", "Signatures of the zone this replica was asked for and could not take part in (no share of its key).", MetricType::Counter, |z| {
            Some(i64::try_from(z.signing_failures).unwrap_or(i64::MAX))
        }),
    ];
    if zones.is_empty() {
        return Ok(());
    }
    for (name, help, kind, value) in series {
        let mut family = e.encode_descriptor(name, help, None, kind)?;
        for z in zones {
            let Some(v) = value(z) else { continue };
            let labels = [("zone", z.name.clone())];
            match kind {
                MetricType::Counter => ConstCounter::new(u64::try_from(v).unwrap_or(0)).encode(family.encode_family(&labels)?)?,
                _ => ConstGauge::new(v).encode(family.encode_family(&labels)?)?,
            }
        }
    }
    Ok(())
}

/// One label, for the families: kind, reason or peer.
type Label<V> = [(&'static str, V); 1];

/// The phases of `sdns_signing_phase_seconds`, in the order of `signing::split::Split`.
pub const SIGNING_PHASES: [&str; 4] = ["share", "wait", "combine", "other"];

/// How an ordered-mode read that tried the vouched path ended.
pub const VOUCH_OUTCOMES: [&str; 2] = ["vouched", "fell_back"];

pub struct Metrics {
    pub id: u16,
    /// Every metric below, under the prefix `sdns` and the label `replica`.
    registry: Registry,
    requests: Family<Label<&'static str>, Counter>,
    refused: Counter,
    own_requests_refused: Counter,
    dropped: Family<Label<&'static str>, Counter>,
    ordering_latency: Histogram,
    signing_latency: Histogram,
    signing_split: Family<Label<&'static str>, Histogram, fn() -> Histogram>,
    execute_errors: Counter,
    read_cache_hits: Counter,
    read_cache_misses: Counter,
    vouched_reads: Family<Label<&'static str>, Counter>,
    vouches_sent: Counter,
    /// The gateway's current vouch timeout (s), as `exec::vouch_core::VouchClock` sets it.
    vouch_timeout: Gauge<f64, AtomicU64>,
    view_changes: Counter,
    slice_latency: Histogram,
    bad_shares: Family<Label<u16>, Counter>,
    shares_spared: Counter,
    shared_fallbacks: Counter,
    /// The same counts, which `bad_shares()` hands to the attribution (a family cannot be read
    /// back as a whole).
    bad_share_counts: Mutex<BTreeMap<u16, u64>>,
    /// Ordered writes an honest gateway would have answered itself, per (origin, kind), as
    /// the execution core counted them (merged into the status's `peer_faults`).
    hostile_writes: Mutex<BTreeMap<(u16, &'static str), u64>>,
    /// Pace of the slices: at most this many RRsets per this many seconds.
    slice_pace: Mutex<(u32, u64)>,
    progress: Arc<Progress>,
}

impl Metrics {
    pub fn new(id: u16) -> Arc<Metrics> {
        let mut registry = Registry::with_prefix_and_labels("sdns", [("replica".into(), id.to_string().into())].into_iter());
        let m = Metrics {
            id,
            registry: Registry::default(),
            requests: Family::default(),
            refused: Counter::default(),
            own_requests_refused: Counter::default(),
            dropped: Family::default(),
            ordering_latency: Histogram::new(LATENCY_BUCKETS),
            signing_latency: Histogram::new(LATENCY_BUCKETS),
            signing_split: Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS)),
            execute_errors: Counter::default(),
            read_cache_hits: Counter::default(),
            read_cache_misses: Counter::default(),
            vouched_reads: Family::default(),
            vouches_sent: Counter::default(),
            vouch_timeout: Gauge::default(),
            view_changes: Counter::default(),
            slice_latency: Histogram::new(LATENCY_BUCKETS),
            bad_shares: Family::default(),
            hostile_writes: Mutex::default(),
            shares_spared: Counter::default(),
            shared_fallbacks: Counter::default(),
            bad_share_counts: Mutex::new(BTreeMap::new()),
            slice_pace: Mutex::new((0, 0)),
            progress: Arc::new(Progress {
                status: Mutex::new(Status { id, ..Default::default() }),
                zone_signed: AtomicU64::new(0),
                zone_signing: Mutex::new(None),
            }),
        };
        // Every kind shows from the start, at 0, so a scrape tells "none yet" from "not exported".
        for kind in ["read", "transfer", "write"] {
            let _ = m.requests.get_or_create(&[("kind", kind)]);
        }
        registry.register("requests", "Client requests ordered, by kind.", m.requests.clone());
        registry.register("refused", "Requests answered before ordering (REFUSED, FORMERR).", m.refused.clone());
        registry.register("dropped", "Client messages dropped, by reason.", m.dropped.clone());
        registry.register(
            "own_requests_refused",
            "Fresh requests of this gateway the ordering refused as already delivered or numbered beyond the jump (a primary ordered requests under its name, or numbers were lost); each was renumbered.",
            m.own_requests_refused.clone(),
        );
        registry.register("ordering_latency_seconds", "From a client request's arrival to its delivery by the ordering.", m.ordering_latency.clone());
        registry.register("signing_latency_seconds", "From named's signing request to the threshold signature.", m.signing_latency.clone());
        for phase in SIGNING_PHASES {
            let _ = m.signing_split.get_or_create(&[("phase", phase)]);
        }
        registry.register(
            "signing_phase_seconds",
            "Each threshold signature's time split by phase: share (this replica's share computation), wait (for peers' shares or their signature), combine (combining and verifying), other (waiting for a worker, message handling); the phases of one signature add up to its signing_latency_seconds.",
            m.signing_split.clone(),
        );
        registry.register(
            "signing_shares_spared",
            "Whole-zone signing: signatures this replica got from the designated replicas without computing its own share.",
            m.shares_spared.clone(),
        );
        registry.register(
            "signing_shared_fallbacks",
            "Whole-zone signing: signatures whose designated replicas did not deliver in time, so this replica computed its share and combined.",
            m.shared_fallbacks.clone(),
        );
        registry.register("execute_errors", "Ordered requests named did not answer.", m.execute_errors.clone());
        registry.register("read_cache_hits", "Reads answered from the replica's read cache.", m.read_cache_hits.clone());
        registry.register("read_cache_misses", "Reads answered by asking named.", m.read_cache_misses.clone());
        for outcome in VOUCH_OUTCOMES {
            let _ = m.vouched_reads.get_or_create(&[("outcome", outcome)]);
        }
        registry.register(
            "vouched_reads",
            "Ordered-mode reads by how they were answered: vouched (not ordered: 2t peers' read barriers showed the answer recent enough), fell_back (ordered instead: timeout, or no room), or taken_again (the answer was taken again after executing as far as a peer's barrier; such a read also counts as vouched or fell_back).",
            m.vouched_reads.clone(),
        );
        registry.register("vouches_sent", "Peers' read probes answered with this replica's read barrier.", m.vouches_sent.clone());
        registry.register(
            "vouch_timeout_seconds",
            "How long this gateway now waits for vouches once its own answer is in, before ordering the read (follows its recently vouched reads, within cluster.vouch_timeout_ms..=vouch_timeout_max_ms).",
            m.vouch_timeout.clone(),
        );
        registry.register("view_changes", "Views installed after the first.", m.view_changes.clone());
        registry.register("bad_shares", "Bad signature shares or signatures, by sending replica.", m.bad_shares.clone());
        registry.register("resign_slice_seconds", "How long a re-signing slice that re-signed something held the executor.", m.slice_latency.clone());
        registry.register_collector(Box::new(StatusCollector(m.progress.clone())));
        Arc::new(Metrics { registry, ..m })
    }

    pub fn inc_request(&self, kind: exec::classify::Kind) {
        self.add_requests(kind, 1);
    }
    /// `n` requests of this kind (the execution core's counts of the ordered ones).
    pub fn add_requests(&self, kind: exec::classify::Kind, n: u64) {
        let kind = match kind {
            exec::classify::Kind::Read => "read",
            exec::classify::Kind::Transfer => "transfer",
            exec::classify::Kind::Write => "write",
        };
        if n > 0 {
            self.requests.get_or_create(&[("kind", kind)]).inc_by(n);
        }
    }
    pub fn inc_refused(&self) {
        self.refused.inc();
    }
    /// `why`: a snake_case reason, the label value as it is.
    pub fn inc_own_request_refused(&self) {
        self.own_requests_refused.inc();
    }

    pub fn inc_dropped(&self, why: &'static str) {
        self.dropped.get_or_create(&[("reason", why)]).inc();
    }
    pub fn inc_execute_error(&self) {
        self.execute_errors.inc();
    }
    /// A vouched-read outcome: one of [`VOUCH_OUTCOMES`].
    pub fn inc_vouched_read(&self, outcome: &'static str) {
        self.vouched_reads.get_or_create(&[("outcome", outcome)]).inc();
    }

    pub fn inc_vouches_sent(&self, n: u64) {
        self.vouches_sent.inc_by(n);
    }

    pub fn set_vouch_timeout(&self, timeout: std::time::Duration) {
        self.vouch_timeout.set(timeout.as_secs_f64());
    }

    pub fn inc_read_cache(&self, hit: bool) {
        if hit { &self.read_cache_hits } else { &self.read_cache_misses }.inc();
    }
    pub fn inc_view_change(&self) {
        self.view_changes.inc();
    }
    pub fn observe_ordering_us(&self, us: u64) {
        self.ordering_latency.observe(us as f64 / 1e6);
    }
    /// Shared-signing counters grown by these amounts.
    pub fn add_shared_signing(&self, spared: u64, fallbacks: u64) {
        self.shares_spared.inc_by(spared);
        self.shared_fallbacks.inc_by(fallbacks);
    }
    pub fn observe_signing_us(&self, us: u64) {
        self.signing_latency.observe(us as f64 / 1e6);
    }
    /// One signature's time split (`crate::signing::split`), one observation per phase.
    pub fn observe_signing_split(&self, split: crate::signing::split::Split) {
        for (phase, took) in SIGNING_PHASES.into_iter().zip([split.share, split.wait, split.combine, split.other]) {
            self.signing_split.get_or_create(&[("phase", phase)]).observe(took.as_secs_f64());
        }
    }
    /// The configured slice size and interval, for the ETA.
    pub fn set_slice_pace(&self, rrsets: u32, interval_s: u64) {
        if let Ok(mut p) = self.slice_pace.lock() {
            *p = (rrsets, interval_s);
        }
    }

    /// Every zone served: (index, name, key tag, whether this replica holds a share of its
    /// key), at start and at every change of the zone set; a zone served before keeps its
    /// figures.
    pub fn set_zones(&self, zones: impl IntoIterator<Item = (u16, String, u16, bool)>) {
        let zones: Vec<ZoneStatus> = zones
            .into_iter()
            .map(|(index, name, key_tag, share)| ZoneStatus { index, name, key_tag, share: if share { "ok" } else { "missing" }.into(), ..Default::default() })
            .collect();
        self.update_status(|s| {
            let old = std::mem::take(&mut s.zones);
            s.zones = zones
                .into_iter()
                .map(|new| match old.iter().find(|z| z.index == new.index && z.name == new.name) {
                    Some(z) => ZoneStatus { key_tag: new.key_tag, share: new.share, ..z.clone() },
                    None => new,
                })
                .collect();
            s.zones.sort_by_key(|z| z.index);
        });
    }

    /// Changes zone `zone`'s status, if it is one.
    pub fn update_zone(&self, zone: u16, f: impl FnOnce(&mut ZoneStatus)) {
        self.update_status(|s| {
            if let Some(z) = s.zones.iter_mut().find(|z| z.index == zone) {
                f(z);
            }
        });
    }

    /// A signature of zone `zone` asked of this replica, which holds no share of its key.
    pub fn zone_signing_failed(&self, zone: u16) {
        self.update_zone(zone, |z| z.signing_failures += 1);
    }

    /// Each zone's schedule as the execution state holds it (agreed values).
    pub fn set_zone_schedules(&self, state: &exec::ExecState) {
        self.update_status(|s| {
            for z in s.zones.iter_mut() {
                let e = state.zone(z.index);
                z.signed_at = e.last_signed_s;
                z.next_resign_due = e.next_slice_s;
                z.signing_since = e.signing.map(|r| r.seq);
            }
        });
    }

    /// One re-signing slice of zone `zone` done: how long it held the executor, and progress.
    pub fn observe_zone_slice(&self, zone: u16, report: crate::zone::SliceReport, took: std::time::Duration) {
        self.update_zone(zone, |z| {
            z.resigned_rrsets += u64::from(report.resigned);
            if let Some(total) = report.total {
                z.rrsigs = u64::from(total);
                z.rrsigs_due = u64::from(report.due.saturating_sub(report.resigned));
            } else {
                z.rrsigs_due = 0;
            }
        });
        self.observe_slice(report, took);
    }

    /// One re-signing slice done: how long it held the executor, and progress.
    pub fn observe_slice(&self, report: crate::zone::SliceReport, took: std::time::Duration) {
        if report.resigned > 0 {
            self.slice_latency.observe(took.as_secs_f64());
        }
        let (size, interval) = self.slice_pace.lock().map(|p| *p).unwrap_or((0, 0));
        self.update_status(|s| {
            s.resign_slices += 1;
            s.resigned_rrsets += u64::from(report.resigned);
            if report.resigned > 0 {
                let rate = f64::from(report.resigned) / took.as_secs_f64().max(1e-3);
                // A smoothed rate: recent slices count most.
                s.resign_rate = if s.resign_rate == 0.0 { rate } else { 0.8 * s.resign_rate + 0.2 * rate };
            }
            if let Some(total) = report.total {
                s.rrsigs = u64::from(total);
                s.rrsigs_due = u64::from(report.due.saturating_sub(report.resigned));
            } else {
                s.rrsigs_due = 0;
            }
            // The slice pace bounds the rate: one slice of `size` per `interval`.
            s.resign_eta_s = (size > 0).then(|| s.rrsigs_due.div_ceil(u64::from(size)) * interval);
        });
    }

    /// A background whole-zone signing began at batch `seq`; it signs `total` RRsets.
    pub fn zone_signing_begun(&self, seq: u64, total: u64) {
        self.progress.zone_signed.store(0, Relaxed);
        if let Ok(mut z) = self.progress.zone_signing.lock() {
            *z = Some((seq, total, std::time::Instant::now(), false));
        }
    }
    /// One signature made for the background signing.
    pub fn inc_zone_signed(&self) {
        self.progress.zone_signed.fetch_add(1, Relaxed);
    }
    /// Signatures made for the background signing's current round so far.
    pub fn zone_signed(&self) -> u64 {
        self.progress.zone_signed.load(Relaxed)
    }
    /// This replica's part of the background signing is done.
    pub fn zone_signing_part_done(&self) {
        if let Ok(mut z) = self.progress.zone_signing.lock() {
            if let Some(z) = z.as_mut() {
                z.3 = true;
            }
        }
    }
    /// The signed zone is installed (or the signing failed); `held`: how long the
    /// installation held the executor.
    pub fn zone_signing_finished(&self, held: std::time::Duration) {
        if let Ok(mut z) = self.progress.zone_signing.lock() {
            *z = None;
        }
        self.update_status(|s| {
            s.zone_signings += 1;
            s.zone_install_s = held.as_secs_f64();
        });
    }
    /// A checkpoint read and digested `zones` zones from named in `took`.
    pub fn checkpoint_digested(&self, took: std::time::Duration, zones: usize) {
        self.update_status(|s| {
            s.checkpoint_digest_s = took.as_secs_f64();
            s.checkpoint_zones_read = u64::try_from(zones).unwrap_or(u64::MAX);
        });
    }
    /// A checkpoint snapshot of `bytes` was written in `took`.
    pub fn snapshot_kept(&self, bytes: u64, took: std::time::Duration) {
        self.update_status(|s| {
            s.snapshot_bytes = bytes;
            s.snapshot_write_s = took.as_secs_f64();
        });
    }
    pub fn add_bad_share(&self, peer: u16) {
        self.bad_shares.get_or_create(&[("peer", peer)]).inc();
        if let Ok(mut b) = self.bad_share_counts.lock() {
            *b.entry(peer).or_default() += 1;
        }
    }
    /// Bad shares per peer so far (merged into the status's `peer_faults`).
    pub fn bad_shares(&self) -> BTreeMap<u16, u64> {
        self.bad_share_counts.lock().map(|b| b.clone()).unwrap_or_default()
    }
    /// The execution core's per-origin counts of ordered writes refused without named.
    pub fn set_hostile_writes(&self, counts: &BTreeMap<(u16, &'static str), u64>) {
        if let Ok(mut h) = self.hostile_writes.lock() {
            if *h != *counts {
                h.clone_from(counts);
            }
        }
    }
    pub fn hostile_writes(&self) -> BTreeMap<(u16, &'static str), u64> {
        self.hostile_writes.lock().map(|h| h.clone()).unwrap_or_default()
    }
    pub fn update_status(&self, f: impl FnOnce(&mut Status)) {
        if let Ok(mut s) = self.progress.status.lock() {
            f(&mut s);
        }
    }
    pub fn status(&self) -> Status {
        self.progress.snapshot()
    }

    /// The OpenMetrics text of every metric (what GET /metrics serves).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; a collector's error would leave the text cut short.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding the metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behind_the_certified_checkpoint_is_catching_up() {
        let s = Status { last_executed: 130, stable_checkpoint: 128, ..Default::default() };
        assert_eq!(s.disagreement(0), None);
        assert_eq!(s.disagreement(128), None);
        let reason = s.disagreement(256).expect("behind another replica's certified checkpoint");
        assert!(reason.contains("catching up") && reason.contains("256"), "{reason}");
        let own = Status { last_executed: 100, stable_checkpoint: 128, ..Default::default() };
        assert!(own.disagreement(0).is_some(), "its own stable checkpoint is ahead of it");
        let m = Metrics::new(2);
        m.update_status(|st| *st = own.clone());
        assert!(m.render().contains("sdns_catching_up{replica=\"2\"} 1"));
        m.update_status(|st| st.last_executed = 128);
        assert!(m.render().contains("sdns_catching_up{replica=\"2\"} 0"));
    }

    #[test]
    fn a_diverged_or_transferring_replica_is_not_healthy() {
        let m = Metrics::new(1);
        m.update_status(|st| {
            st.last_executed = 300;
            st.stable_checkpoint = 256;
            st.state_transfer = Some(320);
        });
        let s = m.status();
        assert!(s.disagreement(0).is_some_and(|r| r.contains("fetching the state of checkpoint 320")));
        m.update_status(|st| {
            st.state_transfer = None;
            st.diverged = Some("checkpoint 256 differs".into());
        });
        let s = m.status();
        assert_eq!(s.disagreement(0).as_deref(), Some("diverged: checkpoint 256 differs"));
        assert!(m.render().contains("sdns_state_diverged{replica=\"1\"} 1"));
        assert!(m.render().contains("sdns_catching_up{replica=\"1\"} 1"));
        m.update_status(|st| {
            st.diverged = None;
            st.state_transfers = 1;
        });
        assert!(m.render().contains("sdns_state_diverged{replica=\"1\"} 0"));
        assert!(m.render().contains("sdns_state_transfers_total{replica=\"1\"} 1"));
        // The status travels as JSON to `sdns cluster status`, which shows the reason.
        let s: Status = serde_json::from_str(&serde_json::to_string(&m.status()).unwrap()).unwrap();
        assert_eq!(s.state_transfers, 1);
    }

    #[test]
    fn a_stalled_replica_is_not_ok_anywhere() {
        let m = Metrics::new(3);
        m.update_status(|st| {
            st.last_executed = 200;
            st.stable_checkpoint = 192;
        });
        assert_eq!(m.status().disagreement(0), None);
        assert!(m.render().contains("sdns_stalled{replica=\"3\"} 0"));
        m.update_status(|st| {
            st.progress_stalled = Some("own requests not delivered for 34 s".into());
            st.own_requests_waiting_s = 34;
        });
        // What `sdns cluster status` prints instead of `ok`, from the JSON of /status.
        let s: Status = serde_json::from_str(&serde_json::to_string(&m.status()).unwrap()).unwrap();
        assert_eq!(s.disagreement(0).as_deref(), Some("stalled: own requests not delivered for 34 s"));
        let text = m.render();
        assert!(text.contains("sdns_stalled{replica=\"3\"} 1"), "{text}");
        assert!(text.contains("sdns_own_requests_undelivered_seconds{replica=\"3\"} 34"), "{text}");
        assert!(text.contains("sdns_catching_up{replica=\"3\"} 1"), "{text}");
        // A diverged replica says that first (its repair explains the stall).
        m.update_status(|st| st.diverged = Some("checkpoint 192 differs".into()));
        assert!(m.status().disagreement(0).unwrap().starts_with("diverged"));
    }

    #[test]
    fn each_zone_has_its_own_labelled_series_and_status() {
        let m = Metrics::new(0);
        m.set_zones([(0, "2.0.192.in-addr.arpa.".to_string(), 11, true), (1, "example.test.".to_string(), 22, true)]);
        let mut state = exec::ExecState::default();
        state.zone_mut(1).last_signed_s = 1000;
        state.zone_mut(1).next_slice_s = 1020;
        m.set_zone_schedules(&state);
        m.update_zone(0, |z| z.serial = Some(7));
        let report = crate::zone::SliceReport { resigned: 3, due: 5, total: Some(40), incremental: false };
        m.observe_zone_slice(1, report, std::time::Duration::from_millis(5));
        let text = m.render();
        assert!(text.contains("sdns_zone_soa_serial{replica=\"0\",zone=\"2.0.192.in-addr.arpa.\"} 7"), "{text}");
        assert!(!text.contains("sdns_zone_soa_serial{replica=\"0\",zone=\"example.test.\"}"), "no serial read yet: {text}");
        assert!(text.contains("sdns_zone_last_signed_time_seconds{replica=\"0\",zone=\"example.test.\"} 1000"), "{text}");
        assert!(text.contains("sdns_zone_resigned_rrsets_total{replica=\"0\",zone=\"example.test.\"} 3"), "{text}");
        assert!(text.contains("sdns_zone_rrsigs_due{replica=\"0\",zone=\"example.test.\"} 2"), "{text}");
        let s: Status = serde_json::from_str(&serde_json::to_string(&m.status()).unwrap()).unwrap();
        assert_eq!(
            s.zones.iter().map(|z| (z.name.as_str(), z.key_tag, z.next_resign_due)).collect::<Vec<_>>(),
            vec![("2.0.192.in-addr.arpa.", 11, 0), ("example.test.", 22, 1020)]
        );
        // The zone set changes: zone 0 goes, zone 4 comes without a share of its key; zone 1
        // keeps its figures, and zone 4's refused signatures are counted under its name.
        m.set_zones([(1, "example.test.".to_string(), 22, true), (4, "added.test.".to_string(), 44, false)]);
        m.zone_signing_failed(4);
        m.zone_signing_failed(0);
        let text = m.render();
        assert!(text.contains("sdns_signing_failures_total{replica=\"0\",zone=\"added.test.\"} 1"), "{text}");
        assert!(text.contains("sdns_zone_resigned_rrsets_total{replica=\"0\",zone=\"example.test.\"} 3"), "{text}");
        assert!(!text.contains("2.0.192.in-addr.arpa."), "a removed zone is gone: {text}");
        let s = m.status();
        assert_eq!(
            s.zones.iter().map(|z| (z.index, z.name.as_str(), z.share.as_str())).collect::<Vec<_>>(),
            vec![(1, "example.test.", "ok"), (4, "added.test.", "missing")]
        );
        // A status from a replica of the version before zones reads with none.
        let old: Status = serde_json::from_str("{\"id\": 1}").unwrap();
        assert!(old.zones.is_empty());
    }

    #[test]
    fn checkpoint_cost_and_snapshot_size_are_exported() {
        let m = Metrics::new(2);
        m.checkpoint_digested(std::time::Duration::from_millis(1500), 1000);
        m.snapshot_kept(4_200_000, std::time::Duration::from_millis(250));
        let text = m.render();
        assert!(text.contains("sdns_checkpoint_digest_seconds{replica=\"2\"} 1.5"), "{text}");
        assert!(text.contains("sdns_checkpoint_zones_read{replica=\"2\"} 1000"), "{text}");
        assert!(text.contains("sdns_snapshot_bytes{replica=\"2\"} 4200000"), "{text}");
        assert!(text.contains("sdns_snapshot_write_seconds{replica=\"2\"} 0.25"), "{text}");
        assert_eq!(m.status().snapshot_bytes, 4_200_000);
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_render() {
        let m = Metrics::new(3);
        m.observe_ordering_us(700); // 0.7 ms
        m.observe_ordering_us(30_000); // 30 ms
        m.add_bad_share(2);
        m.add_bad_share(2);
        let text = m.render();
        assert!(text.contains("sdns_ordering_latency_seconds_bucket{replica=\"3\",le=\"0.001\"} 1"), "{text}");
        assert!(text.contains("sdns_ordering_latency_seconds_bucket{replica=\"3\",le=\"0.05\"} 2"), "{text}");
        assert!(text.contains("sdns_ordering_latency_seconds_count{replica=\"3\"} 2"), "{text}");
        assert!(text.contains("sdns_bad_shares_total{replica=\"3\",peer=\"2\"} 2"), "{text}");
    }
    #[test]
    fn a_signatures_split_is_one_observation_per_phase() {
        use std::time::Duration;
        let m = Metrics::new(1);
        let text = m.render();
        assert!(text.contains("sdns_signing_phase_seconds_count{replica=\"1\",phase=\"wait\"} 0"), "every phase shows from the start: {text}");
        let ms = Duration::from_millis;
        m.observe_signing_split(crate::signing::split::Split { share: ms(10), wait: ms(30), combine: ms(4), other: ms(1) });
        let text = m.render();
        for (phase, sum) in [("share", "0.01"), ("wait", "0.03"), ("combine", "0.004"), ("other", "0.001")] {
            assert!(text.contains(&format!("sdns_signing_phase_seconds_sum{{replica=\"1\",phase=\"{phase}\"}} {sum}")), "{phase}: {text}");
            assert!(text.contains(&format!("sdns_signing_phase_seconds_count{{replica=\"1\",phase=\"{phase}\"}} 1")), "{phase}: {text}");
        }
    }
}
