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
        Self { bounds: LATENCY_BUCKETS, counts: LATENCY_BUCKETS.iter().map(|_| AtomicU64::new(0)).collect(), sum_us: AtomicU64::new(0), total: AtomicU64::new(0) }
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
pub struct Status {
    pub id: u16,
    pub view: u64,
    pub primary: u16,
    pub last_executed: u64,
    pub stable_checkpoint: u64,
    pub named_running: bool,
    pub zone_serial: Option<u32>,
    pub peers_connected: usize,
}

pub struct Metrics {
    pub id: u16,
    requests: [AtomicU64; 3], // read, transfer, write
    refused: AtomicU64,
    dropped: Mutex<BTreeMap<&'static str, u64>>,
    ordering_latency: Histogram,
    signing_latency: Histogram,
    execute_errors: AtomicU64,
    view_changes: AtomicU64,
    bad_shares: Mutex<BTreeMap<u16, u64>>,
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
            view_changes: AtomicU64::new(0),
            bad_shares: Mutex::new(BTreeMap::new()),
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
    pub fn inc_view_change(&self) {
        self.view_changes.fetch_add(1, Relaxed);
    }
    pub fn observe_ordering_us(&self, us: u64) {
        self.ordering_latency.observe_us(us);
    }
    pub fn observe_signing_us(&self, us: u64) {
        self.signing_latency.observe_us(us);
    }
    pub fn add_bad_share(&self, peer: u16) {
        if let Ok(mut b) = self.bad_shares.lock() {
            *b.entry(peer).or_default() += 1;
        }
    }
    pub fn update_status(&self, f: impl FnOnce(&mut Status)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }
    pub fn status(&self) -> Status {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
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
        let _ = writeln!(out, "# HELP sdns_view_changes_total Views installed after the first.\n# TYPE sdns_view_changes_total counter");
        let _ = writeln!(out, "sdns_view_changes_total{{replica=\"{id}\"}} {}", self.view_changes.load(Relaxed));
        let _ = writeln!(out, "# HELP sdns_bad_shares_total Bad signature shares or signatures, by sending replica.\n# TYPE sdns_bad_shares_total counter");
        if let Ok(b) = self.bad_shares.lock() {
            for (peer, n) in b.iter() {
                let _ = writeln!(out, "sdns_bad_shares_total{{replica=\"{id}\",peer=\"{peer}\"}} {n}");
            }
        }
        let s = self.status();
        let _ = writeln!(out, "# HELP sdns_view Current PBFT view.\n# TYPE sdns_view gauge\nsdns_view{{replica=\"{id}\"}} {}", s.view);
        let _ = writeln!(out, "# HELP sdns_last_executed_seq Last ordered batch executed.\n# TYPE sdns_last_executed_seq gauge\nsdns_last_executed_seq{{replica=\"{id}\"}} {}", s.last_executed);
        out
    }
}

/// What the admin route needs: the gateway to order through, the bearer token every
/// POST must carry, and this replica's key to sign its sign-zone requests with.
pub struct Admin {
    pub gateway: Arc<crate::gateway::Gateway>,
    pub token: String,
    pub signer: crate::exec::SignZoneSigner,
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
    match tokio::time::timeout(std::time::Duration::from_secs(600), rx.recv()).await {
        Ok(Some(answer)) => String::from_utf8_lossy(&answer.bytes).into_owned(),
        Ok(None) => "error: the request was dropped before it was ordered".into(),
        Err(_) => "error: not ordered and executed within 600 s".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
