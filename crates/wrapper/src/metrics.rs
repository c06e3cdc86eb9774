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

/// Serves GET /metrics (Prometheus text), GET /status (JSON) and, with a gateway,
/// POST /admin/sign-zone (orders the sign-zone operation and waits for its outcome).
/// The admin route is why this listens on loopback by default.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>, admin: Option<Arc<crate::gateway::Gateway>>) -> std::io::Result<()> {
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
            let (code, ctype, body) = match (method, path) {
                ("POST", "/admin/sign-zone") => match admin {
                    Some(gateway) => {
                        let outcome = sign_zone(&gateway).await;
                        let code = if outcome.starts_with("signed") { "200 OK" } else { "500 Internal Server Error" };
                        (code, "text/plain", outcome + "\n")
                    }
                    None => ("404 Not Found", "text/plain", "no admin here\n".to_string()),
                },
                (_, "/metrics") => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
                (_, "/status") => ("200 OK", "application/json", serde_json::to_string(&metrics.status()).unwrap_or_default()),
                _ => ("404 Not Found", "text/plain", "try /metrics or /status\n".to_string()),
            };
            let response = format!("HTTP/1.0 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            if let Err(e) = stream.write_all(response.as_bytes()).await {
                debug!(error = %e, "metrics response");
            }
        });
    }
}

async fn sign_zone(gateway: &crate::gateway::Gateway) -> String {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    gateway.order(crate::envelope::Op::SignZone, crate::listener::ReplyTo::Tcp { writer: tx }).await;
    match tokio::time::timeout(std::time::Duration::from_secs(600), rx.recv()).await {
        Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
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
}
