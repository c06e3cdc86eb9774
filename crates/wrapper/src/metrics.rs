//! Prometheus metrics and a /status endpoint, over a deliberately tiny HTTP/1.0
//! responder on a loopback address (no HTTP framework for two GET routes).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::debug;

/// A latency histogram with fixed buckets (seconds).
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
    total: AtomicU64,
}

const LATENCY_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

impl Histogram {
    fn new() -> Self {
        Self {
            bounds: LATENCY_BUCKETS,
            counts: LATENCY_BUCKETS.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            total: AtomicU64::new(0),
        }
    }
    fn observe_us(&self, us: u64) {
        let s = us as f64 / 1e6;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            if s <= *b {
                c.fetch_add(1, Relaxed);
            }
        }
        self.sum_us.fetch_add(us, Relaxed);
        self.total.fetch_add(1, Relaxed);
    }
    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {}", c.load(Relaxed));
        }
        let total = self.total.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {total}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {total}");
    }
}

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
    /// snake_case: the ordering core's reason, `undecodable_message` or `bad_signature_share`.
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
        let certified = self.stable_checkpoint.max(others_stable);
        (self.last_executed < certified).then(|| format!("catching up: executed batch {} is below the certified checkpoint {certified}", self.last_executed))
    }
}

pub struct Metrics {
    pub id: u16,
    requests: [AtomicU64; 3], // read, transfer, write
    refused: AtomicU64,
    dropped: Mutex<BTreeMap<&'static str, u64>>,
    ordering_latency: Histogram,
    signing_latency: Histogram,
    execute_errors: AtomicU64,
    /// Reads answered from the read cache, and reads that asked named.
    read_cache: [AtomicU64; 2],
    view_changes: AtomicU64,
    slice_latency: Histogram,
    /// Pace of the slices: at most this many RRsets per this many seconds.
    slice_pace: Mutex<(u32, u64)>,
    bad_shares: Mutex<BTreeMap<u16, u64>>,
    /// Signatures the background whole-zone signer received (RRsets signed).
    zone_signed: AtomicU64,
    /// The background signing running: (began at seq, expected RRsets, since).
    zone_signing: Mutex<Option<(u64, u64, std::time::Instant, bool)>>,
    pub status: Mutex<Status>,
}

impl Metrics {
    pub fn new(id: u16) -> Arc<Metrics> {
        Arc::new(Metrics {
            id,
            requests: Default::default(),
            refused: AtomicU64::new(0),
            dropped: Mutex::new(BTreeMap::new()),
            ordering_latency: Histogram::new(),
            signing_latency: Histogram::new(),
            execute_errors: AtomicU64::new(0),
            read_cache: Default::default(),
            view_changes: AtomicU64::new(0),
            slice_latency: Histogram::new(),
            slice_pace: Mutex::new((0, 0)),
            bad_shares: Mutex::new(BTreeMap::new()),
            zone_signed: AtomicU64::new(0),
            zone_signing: Mutex::new(None),
            status: Mutex::new(Status { id, ..Default::default() }),
        })
    }

    pub fn inc_request(&self, kind: crate::classify::Kind) {
        let i = match kind {
            crate::classify::Kind::Read => 0,
            crate::classify::Kind::Transfer => 1,
            crate::classify::Kind::Write => 2,
        };
        self.requests[i].fetch_add(1, Relaxed);
    }
    pub fn inc_refused(&self) {
        self.refused.fetch_add(1, Relaxed);
    }
    pub fn inc_dropped(&self, why: &'static str) {
        if let Ok(mut d) = self.dropped.lock() {
            *d.entry(why).or_default() += 1;
        }
    }
    pub fn inc_execute_error(&self) {
        self.execute_errors.fetch_add(1, Relaxed);
    }
    pub fn inc_read_cache(&self, hit: bool) {
        self.read_cache[usize::from(!hit)].fetch_add(1, Relaxed);
    }
    pub fn inc_view_change(&self) {
        self.view_changes.fetch_add(1, Relaxed);
    }
    pub fn observe_ordering_us(&self, us: u64) {
        self.ordering_latency.observe_us(us);
    }
    pub fn observe_signing_us(&self, us: u64) {
        self.signing_latency.observe_us(us);
    }
    /// The configured slice size and interval, for the ETA.
    pub fn set_slice_pace(&self, rrsets: u32, interval_s: u64) {
        if let Ok(mut p) = self.slice_pace.lock() {
            *p = (rrsets, interval_s);
        }
    }

    /// One re-signing slice done: how long it held the executor, and progress.
    pub fn observe_slice(&self, report: crate::zone::SliceReport, took: std::time::Duration) {
        if report.resigned > 0 {
            self.slice_latency.observe_us(took.as_micros() as u64);
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
        self.zone_signed.store(0, Relaxed);
        if let Ok(mut z) = self.zone_signing.lock() {
            *z = Some((seq, total, std::time::Instant::now(), false));
        }
    }
    /// One signature made for the background signing.
    pub fn inc_zone_signed(&self) {
        self.zone_signed.fetch_add(1, Relaxed);
    }
    /// This replica's part of the background signing is done.
    pub fn zone_signing_part_done(&self) {
        if let Ok(mut z) = self.zone_signing.lock() {
            if let Some(z) = z.as_mut() {
                z.3 = true;
            }
        }
    }
    /// The signed zone is installed (or the signing failed); `held`: how long the
    /// installation held the executor.
    pub fn zone_signing_finished(&self, held: std::time::Duration) {
        if let Ok(mut z) = self.zone_signing.lock() {
            *z = None;
        }
        self.update_status(|s| {
            s.zone_signings += 1;
            s.zone_install_s = held.as_secs_f64();
        });
    }
    fn zone_signing_progress(&self) -> Option<ZoneSigning> {
        let (seq, total, since, signed) = (*self.zone_signing.lock().ok()?)?;
        let done = self.zone_signed.load(Relaxed);
        let rate = done as f64 / since.elapsed().as_secs_f64().max(1e-3);
        let left = total.saturating_sub(done);
        let eta_s = if signed { Some(0) } else { (rate > 0.0).then(|| (left as f64 / rate).ceil() as u64) };
        Some(ZoneSigning { seq, done, total, rate, eta_s, signed })
    }

    pub fn add_bad_share(&self, peer: u16) {
        if let Ok(mut b) = self.bad_shares.lock() {
            *b.entry(peer).or_default() += 1;
        }
    }
    /// Bad shares per peer so far (merged into the status's `peer_faults`).
    pub fn bad_shares(&self) -> BTreeMap<u16, u64> {
        self.bad_shares.lock().map(|b| b.clone()).unwrap_or_default()
    }
    pub fn update_status(&self, f: impl FnOnce(&mut Status)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }
    pub fn status(&self) -> Status {
        let mut s = self.status.lock().map(|s| s.clone()).unwrap_or_default();
        s.zone_signing = self.zone_signing_progress();
        s
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let id = self.id;
        let _ = writeln!(out, "# HELP sdns_requests_total Client requests ordered, by kind.\n# TYPE sdns_requests_total counter");
        for (i, kind) in ["read", "transfer", "write"].iter().enumerate() {
            let _ = writeln!(out, "sdns_requests_total{{replica=\"{id}\",kind=\"{kind}\"}} {}", self.requests[i].load(Relaxed));
        }
        let _ = writeln!(out, "# HELP sdns_refused_total Requests answered before ordering (REFUSED, FORMERR).\n# TYPE sdns_refused_total counter");
        let _ = writeln!(out, "sdns_refused_total{{replica=\"{id}\"}} {}", self.refused.load(Relaxed));
        let _ = writeln!(out, "# HELP sdns_dropped_total Client messages dropped, by reason.\n# TYPE sdns_dropped_total counter");
        if let Ok(d) = self.dropped.lock() {
            for (why, n) in d.iter() {
                let _ = writeln!(out, "sdns_dropped_total{{replica=\"{id}\",reason=\"{}\"}} {n}", why.replace(' ', "_"));
            }
        }
        let labels = format!("replica=\"{id}\"");
        self.ordering_latency.render(&mut out, "sdns_ordering_latency_seconds", "From a client request's arrival to its delivery by the ordering.", &labels);
        self.signing_latency.render(&mut out, "sdns_signing_latency_seconds", "From named's signing request to the threshold signature.", &labels);
        let _ = writeln!(out, "# HELP sdns_execute_errors_total Ordered requests named did not answer.\n# TYPE sdns_execute_errors_total counter");
        let _ = writeln!(out, "sdns_execute_errors_total{{replica=\"{id}\"}} {}", self.execute_errors.load(Relaxed));
        let _ = writeln!(out, "# HELP sdns_read_cache_hits_total Reads answered from the replica's read cache.\n# TYPE sdns_read_cache_hits_total counter");
        let _ = writeln!(out, "sdns_read_cache_hits_total{{replica=\"{id}\"}} {}", self.read_cache[0].load(Relaxed));
        let _ = writeln!(out, "# HELP sdns_read_cache_misses_total Reads answered by asking named.\n# TYPE sdns_read_cache_misses_total counter");
        let _ = writeln!(out, "sdns_read_cache_misses_total{{replica=\"{id}\"}} {}", self.read_cache[1].load(Relaxed));
        let _ = writeln!(out, "# HELP sdns_view_changes_total Views installed after the first.\n# TYPE sdns_view_changes_total counter");
        let _ = writeln!(out, "sdns_view_changes_total{{replica=\"{id}\"}} {}", self.view_changes.load(Relaxed));
        let _ = writeln!(out, "# HELP sdns_bad_shares_total Bad signature shares or signatures, by sending replica.\n# TYPE sdns_bad_shares_total counter");
        if let Ok(b) = self.bad_shares.lock() {
            for (peer, n) in b.iter() {
                let _ = writeln!(out, "sdns_bad_shares_total{{replica=\"{id}\",peer=\"{peer}\"}} {n}");
            }
        }
        self.slice_latency.render(&mut out, "sdns_resign_slice_seconds", "How long a re-signing slice that re-signed something held the executor.", &labels);
        let s = self.status();
        let _ = writeln!(out, "# HELP sdns_peer_faults_total Misbehaviour seen from each peer, by kind.\n# TYPE sdns_peer_faults_total counter");
        for f in &s.peer_faults {
            let _ = writeln!(out, "sdns_peer_faults_total{{replica=\"{id}\",peer=\"{}\",kind=\"{}\"}} {}", f.peer, f.kind, f.count);
        }
        let _ = writeln!(out, "# HELP sdns_peer_silent Peers silent on the ordering channel (1: nothing heard for 5 s).\n# TYPE sdns_peer_silent gauge");
        for peer in &s.silent_peers {
            let _ = writeln!(out, "sdns_peer_silent{{replica=\"{id}\",peer=\"{peer}\"}} 1");
        }
        let z = s.zone_signing.clone().unwrap_or_default();
        let _ = writeln!(out, "# HELP sdns_zone_signing Whether a background whole-zone signing runs (1) or not (0).\n# TYPE sdns_zone_signing gauge\nsdns_zone_signing{{replica=\"{id}\"}} {}", u8::from(s.zone_signing.is_some()));
        let _ = writeln!(out, "# HELP sdns_zone_signing_rrsets_done RRsets signed so far by the running background whole-zone signing.\n# TYPE sdns_zone_signing_rrsets_done gauge\nsdns_zone_signing_rrsets_done{{replica=\"{id}\"}} {}", z.done);
        let _ = writeln!(out, "# HELP sdns_zone_signing_rrsets RRsets the running background whole-zone signing signs.\n# TYPE sdns_zone_signing_rrsets gauge\nsdns_zone_signing_rrsets{{replica=\"{id}\"}} {}", z.total);
        let _ = writeln!(out, "# HELP sdns_zone_signing_rate RRsets per second since the running whole-zone signing began.\n# TYPE sdns_zone_signing_rate gauge\nsdns_zone_signing_rate{{replica=\"{id}\"}} {}", z.rate);
        if let Some(eta) = z.eta_s {
            let _ = writeln!(out, "# HELP sdns_zone_signing_eta_seconds Time until the running whole-zone signing is done at its rate.\n# TYPE sdns_zone_signing_eta_seconds gauge\nsdns_zone_signing_eta_seconds{{replica=\"{id}\"}} {eta}");
        }
        let _ = writeln!(out, "# HELP sdns_zone_signings_total Whole-zone signings finished (installed or failed).\n# TYPE sdns_zone_signings_total counter\nsdns_zone_signings_total{{replica=\"{id}\"}} {}", s.zone_signings);
        let _ = writeln!(out, "# HELP sdns_zone_install_seconds How long installing the last signed zone held the executor.\n# TYPE sdns_zone_install_seconds gauge\nsdns_zone_install_seconds{{replica=\"{id}\"}} {}", s.zone_install_s);
        let _ = writeln!(out, "# HELP sdns_resigned_rrsets_total RRsets re-signed by incremental re-signing slices.\n# TYPE sdns_resigned_rrsets_total counter\nsdns_resigned_rrsets_total{{replica=\"{id}\"}} {}", s.resigned_rrsets);
        let _ = writeln!(out, "# HELP sdns_resign_slices_total Re-signing slices run (with or without anything due).\n# TYPE sdns_resign_slices_total counter\nsdns_resign_slices_total{{replica=\"{id}\"}} {}", s.resign_slices);
        let _ = writeln!(
            out,
            "# HELP sdns_rrsigs Signatures in the zone at the last slice that read it.\n# TYPE sdns_rrsigs gauge\nsdns_rrsigs{{replica=\"{id}\"}} {}",
            s.rrsigs
        );
        let _ = writeln!(
            out,
            "# HELP sdns_rrsigs_due Signatures due for re-signing and not yet re-signed.\n# TYPE sdns_rrsigs_due gauge\nsdns_rrsigs_due{{replica=\"{id}\"}} {}",
            s.rrsigs_due
        );
        let _ = writeln!(
            out,
            "# HELP sdns_resign_rate RRsets per second while a slice runs (smoothed).\n# TYPE sdns_resign_rate gauge\nsdns_resign_rate{{replica=\"{id}\"}} {}",
            s.resign_rate
        );
        if let Some(eta) = s.resign_eta_s {
            let _ = writeln!(out, "# HELP sdns_resign_eta_seconds Time until the signatures due are re-signed at the slice pace.\n# TYPE sdns_resign_eta_seconds gauge\nsdns_resign_eta_seconds{{replica=\"{id}\"}} {eta}");
        }
        let _ = writeln!(out, "# HELP sdns_view Current PBFT view.\n# TYPE sdns_view gauge\nsdns_view{{replica=\"{id}\"}} {}", s.view);
        let _ = writeln!(
            out,
            "# HELP sdns_last_executed_seq Last ordered batch executed.\n# TYPE sdns_last_executed_seq gauge\nsdns_last_executed_seq{{replica=\"{id}\"}} {}",
            s.last_executed
        );
        let _ = writeln!(out, "# HELP sdns_stable_checkpoint_seq Latest checkpoint 2t+1 replicas certified.\n# TYPE sdns_stable_checkpoint_seq gauge\nsdns_stable_checkpoint_seq{{replica=\"{id}\"}} {}", s.stable_checkpoint);
        let _ = writeln!(out, "# HELP sdns_catching_up 1 while this replica is not in agreement: behind the certified checkpoint, fetching state from peers, or diverged.\n# TYPE sdns_catching_up gauge\nsdns_catching_up{{replica=\"{id}\"}} {}", u8::from(s.disagreement(0).is_some()));
        let _ = writeln!(out, "# HELP sdns_state_diverged 1 while this replica's state differs from the certified checkpoint (it repairs itself by state transfer).\n# TYPE sdns_state_diverged gauge\nsdns_state_diverged{{replica=\"{id}\"}} {}", u8::from(s.diverged.is_some()));
        let _ = writeln!(out, "# HELP sdns_state_transfers_total Checkpoint states fetched from peers and installed.\n# TYPE sdns_state_transfers_total counter\nsdns_state_transfers_total{{replica=\"{id}\"}} {}", s.state_transfers);
        out
    }
}

/// What the admin route needs: the gateway to order through, the bearer token every
/// POST must carry, and this replica's key to sign its sign-zone requests with.
pub struct Admin {
    pub gateway: Arc<crate::gateway::Gateway>,
    pub token: String,
    pub signer: Arc<crate::exec::SignZoneSigner>,
}

/// The admin token's file in a replica's state directory.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// Writes a fresh random admin token (hex, mode 0600) to `path` and returns it. A new
/// one at every start: only a process that can read the replica's state directory can
/// use the admin route.
pub fn write_admin_token(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    // An existing file keeps its mode on open; make it private before writing.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(format!("{token}\n").as_bytes())?;
    Ok(token)
}

/// Equal-time comparison: how long a wrong token takes says nothing about the right one.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of header `name` (case-insensitive) in a request head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Serves GET /metrics (Prometheus text), GET /status (JSON) and, with an admin,
/// POST /admin/sign-zone (orders this replica's sign-zone request and waits for its
/// outcome). The admin route wants `Authorization: Bearer <token>` (the token file in
/// the state directory) and refuses any request with an `Origin` header, so neither
/// another local user nor a web page the operator visits can use it.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>, admin: Option<Arc<Admin>>) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    loop {
        let (mut stream, _) = listener.accept().await?;
        let metrics = metrics.clone();
        let admin = admin.clone();
        tokio::spawn(async move {
            // Read the request head (bounded): a client may send it in several pieces.
            let mut buf = [0u8; 2048];
            let mut n = 0;
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
            while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                match tokio::time::timeout_at(deadline, stream.read(&mut buf[n..])).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                    Ok(Ok(k)) => n += k,
                }
            }
            let request = String::from_utf8_lossy(&buf[..n]);
            let mut words = request.split_whitespace();
            let method = words.next().unwrap_or("");
            let path = words.next().unwrap_or("");
            let (code, ctype, body) = if header(&request, "origin").is_some() {
                ("403 Forbidden", "text/plain", "requests from web pages are refused\n".to_string())
            } else {
                match (method, path) {
                    ("POST", "/admin/sign-zone") => match admin {
                        Some(admin) => {
                            let presented = header(&request, "authorization").and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
                            if same_secret(presented.trim().as_bytes(), admin.token.as_bytes()) {
                                let outcome = sign_zone(&admin).await;
                                let code = if outcome.starts_with("error") { "500 Internal Server Error" } else { "200 OK" };
                                (code, "text/plain", outcome + "\n")
                            } else {
                                ("401 Unauthorized", "text/plain", "the admin token (state directory, admin.token) is required\n".to_string())
                            }
                        }
                        None => ("404 Not Found", "text/plain", "no admin here\n".to_string()),
                    },
                    (_, "/metrics") => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
                    (_, "/status") => ("200 OK", "application/json", serde_json::to_string(&metrics.status()).unwrap_or_default()),
                    _ => ("404 Not Found", "text/plain", "try /metrics or /status\n".to_string()),
                }
            };
            let response = format!("HTTP/1.0 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            if let Err(e) = stream.write_all(response.as_bytes()).await {
                debug!(error = %e, "metrics response");
            }
        });
    }
}

async fn sign_zone(admin: &Admin) -> String {
    let auth = match admin.signer.sign() {
        Ok(auth) => auth,
        Err(e) => return format!("error: cannot sign the request: {e}"),
    };
    let (reply, mut rx) = crate::listener::ReplyTo::internal();
    admin.gateway.order(crate::envelope::Op::SignZone(auth), reply).await;
    // Answered once the signed zone is installed (the signing runs in the background).
    match tokio::time::timeout(std::time::Duration::from_secs(3600), rx.recv()).await {
        Ok(Some(answer)) => String::from_utf8_lossy(&answer.bytes).into_owned(),
        Ok(None) => "error: the request was dropped before it was ordered".into(),
        Err(_) => "error: not signed within 3600 s (see sdns cluster status for its progress)".into(),
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
        let s = m.status.lock().unwrap().clone();
        assert!(s.disagreement(0).is_some_and(|r| r.contains("fetching the state of checkpoint 320")));
        m.update_status(|st| {
            st.state_transfer = None;
            st.diverged = Some("checkpoint 256 differs".into());
        });
        let s = m.status.lock().unwrap().clone();
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
        let s: Status = serde_json::from_str(&serde_json::to_string(&*m.status.lock().unwrap()).unwrap()).unwrap();
        assert_eq!(s.state_transfers, 1);
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
    fn admin_token_is_private_and_compared_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ADMIN_TOKEN_FILE);
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let token = write_admin_token(&path).unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), token);
        assert_ne!(write_admin_token(&path).unwrap(), token, "a fresh token every start");
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd") && !same_secret(b"abc", b"ab") && !same_secret(b"", b"a"));
    }

    #[test]
    fn headers_are_found_case_insensitively() {
        let head = "POST /admin/sign-zone HTTP/1.0\r\nHost: x\r\nAUTHORIZATION: Bearer t0k\r\norigin: https://evil.example\r\n\r\n";
        assert_eq!(header(head, "authorization"), Some("Bearer t0k"));
        assert_eq!(header(head, "Origin"), Some("https://evil.example"));
        assert_eq!(header(head, "cookie"), None);
        assert_eq!(header("GET / HTTP/1.0\r\n\r\n", "origin"), None);
    }
}
