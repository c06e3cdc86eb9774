//! The replica's loopback HTTP endpoint: GET /metrics (OpenMetrics text) and GET /status
//! (JSON) from [`Metrics`], and the admin routes POST /admin/sign-zone and POST /admin/zone,
//! which order through the gateway; and the small client `sdns cluster status`, `sdns
//! sign-zone` and `sdns zone` use. Both are hyper's HTTP/1 (server and client connections, no
//! framework: four routes).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, ORIGIN};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use crate::ops::metrics::Metrics;

/// What the admin route needs: the gateway to order through, the bearer token every
/// POST must carry, and this replica's key to sign its sign-zone and zone-set requests with.
pub struct Admin {
    pub gateway: Arc<crate::front::gateway::Gateway>,
    pub token: String,
    /// Each zone's name and sign-zone signer, in zone index order. The first also signs
    /// zone-set requests (any would: the signature is the replica's identity key's, and
    /// one signer keeps their stamps strictly increasing).
    pub signers: Vec<(String, Arc<exec::SignZoneSigner>)>,
    /// The replica's directory, holding the dealt `zones/<zone>/`: an added zone's key
    /// digest is checked against the `zone.pub.json` there.
    pub dealt_dir: PathBuf,
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

/// Connections served at once; more are closed as they arrive, so that no local client can
/// make the replica hold an unbounded number of sockets and tasks.
const MAX_CONNECTIONS: usize = 16;
/// A client must have sent its whole request head by then.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The most a connection buffers of a request (hyper's smallest allowed buffer): heads are a
/// few hundred bytes, and no route reads a body.
const MAX_REQUEST: usize = 8192;
/// How long an authorised sign-zone request waits for its outcome.
const SIGN_ZONE_WAIT: Duration = Duration::from_secs(3600);
/// How long an authorised zone-set request waits for its outcome: counted at once, or the
/// change executed (named restarted on the changed zone set); the ordering keeps it as long.
const ZONE_SET_WAIT: Duration = Duration::from_secs(600);
/// Every connection ends by then, whatever it does (a sign-zone request waits longest).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(3600 + 60);

/// Serves GET /metrics (OpenMetrics text), GET /status (JSON) and, with an admin,
/// POST /admin/sign-zone (orders this replica's sign-zone request and waits for its
/// outcome). The admin route wants `Authorization: Bearer <token>` (the token file in
/// the state directory) and refuses any request with an `Origin` header, so neither
/// another local user nor a web page the operator visits can use it.
/// Every route refuses a `Host` that is not the endpoint's own address ([`host_allowed`]):
/// a web page cannot read the status or metrics through DNS rebinding.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>, admin: Option<Arc<Admin>>) -> std::io::Result<()> {
    serve_on(TcpListener::bind(addr).await?, metrics, admin).await
}

async fn serve_on(listener: TcpListener, metrics: Arc<Metrics>, admin: Option<Arc<Admin>>) -> std::io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    // One request per connection: nothing to gain from keeping a scrape's connection open.
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).max_buf_size(MAX_REQUEST).max_headers(32).keep_alive(false);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of descriptors or a connection reset before it was accepted: the endpoint
            // goes on (a pause, so that a lasting error does not spin).
            Err(e) => {
                debug!(error = %e, "accepting an endpoint connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!("endpoint connection limit reached; closing a new connection");
            continue;
        };
        // The address the client reached: the listen address, or with an unspecified one the
        // interface's.
        let Ok(local) = stream.local_addr() else { continue };
        let (metrics, admin) = (metrics.clone(), admin.clone());
        let service = hyper::service::service_fn(move |request| respond(request, local, metrics.clone(), admin.clone()));
        let connection = http.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            match tokio::time::timeout(CONNECTION_LIFETIME, connection).await {
                Ok(Err(e)) => debug!(error = %e, "endpoint connection"),
                Err(_) => debug!("endpoint connection outlived its lifetime"),
                Ok(Ok(())) => {}
            }
            drop(slot);
        });
    }
}

fn reply(code: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = code;
    response.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(ctype));
    response
}

/// Whether a request's `Host` header names this endpoint (`local`: the address the client
/// connected to). A web page can reach a loopback endpoint through a name of its own that it
/// points at 127.0.0.1 (DNS rebinding); the browser then sends that name as `Host`. So only
/// the endpoint's own address is accepted: its IP with its port or without one, and for a
/// loopback endpoint also `localhost` (with its port or without). A request without `Host`
/// (HTTP/1.0 clients; browsers always send one) is accepted.
fn host_allowed(host: Option<&[u8]>, local: SocketAddr) -> bool {
    let Some(host) = host else { return true };
    let Ok(host) = std::str::from_utf8(host) else { return false };
    let host = host.trim().to_ascii_lowercase();
    // `[v6]:port`, `[v6]`, `name:port`, `v4:port`, or a bare name or address.
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, "")) => (ip, None),
            Some((ip, port)) => match port.strip_prefix(':') {
                Some(port) => (ip, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host.as_str(), None),
        },
    };
    if port.is_some_and(|p| p.parse::<u16>().ok() != Some(local.port())) {
        return false;
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip == local.ip(),
        Err(_) => name == "localhost" && local.ip().is_loopback(),
    }
}

/// One request's answer. The request's body is never read (no route takes one), so its size
/// does not matter.
async fn respond(
    request: Request<hyper::body::Incoming>,
    local: SocketAddr,
    metrics: Arc<Metrics>,
    admin: Option<Arc<Admin>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if request.headers().contains_key(ORIGIN) {
        return Ok(reply(StatusCode::FORBIDDEN, TEXT, "requests from web pages are refused\n"));
    }
    let hosts = request.headers().get_all(HOST);
    if hosts.iter().count() > 1 || !host_allowed(hosts.iter().next().map(|h| h.as_bytes()), local) {
        return Ok(reply(StatusCode::FORBIDDEN, TEXT, format!("the Host header must name this endpoint ({local}, or localhost on loopback)\n")));
    }
    let response = match (request.method(), request.uri().path()) {
        (&Method::POST, path @ ("/admin/sign-zone" | "/admin/zone")) => match admin {
            Some(admin) => {
                let presented = request.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
                if !same_secret(presented.trim().as_bytes(), admin.token.as_bytes()) {
                    reply(StatusCode::UNAUTHORIZED, TEXT, "the admin token (state directory, admin.token) is required\n")
                } else if path == "/admin/zone" {
                    let (code, outcome) = change_zone_set(&admin, request.uri().query()).await;
                    reply(code, TEXT, outcome + "\n")
                } else {
                    let outcome = sign_zones(&admin, request.uri().query()).await;
                    let code = if outcome.starts_with("error") { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::OK };
                    reply(code, TEXT, outcome + "\n")
                }
            }
            None => reply(StatusCode::NOT_FOUND, TEXT, "no admin here\n"),
        },
        (&Method::GET, "/metrics") => reply(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", metrics.render()),
        (&Method::GET, "/status") => reply(StatusCode::OK, "application/json", serde_json::to_string(&metrics.status()).unwrap_or_default()),
        (_, "/metrics" | "/status") => reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n"),
        _ => reply(StatusCode::NOT_FOUND, TEXT, "try /metrics or /status\n"),
    };
    Ok(response)
}

/// The zone a sign-zone request asks for: `zone=NAME` in the query (case and final dot
/// aside), or every zone without one. `Err`: the answer for a zone not served.
fn zones_asked(signers: &[(String, Arc<exec::SignZoneSigner>)], query: Option<&str>) -> Result<Vec<usize>, String> {
    let canonical = |n: &str| n.trim_end_matches('.').to_ascii_lowercase();
    let asked = query.into_iter().flat_map(|q| q.split('&')).find_map(|kv| kv.strip_prefix("zone="));
    match asked {
        None | Some("") => Ok((0..signers.len()).collect()),
        Some(name) => signers.iter().position(|(z, _)| canonical(z) == canonical(name)).map(|i| vec![i]).ok_or_else(|| {
            format!("error: this replica serves no zone {name:?} (it serves {})", signers.iter().map(|(z, _)| z.as_str()).collect::<Vec<_>>().join(", "))
        }),
    }
}

/// Sign-zone for the zones asked for, one ordered request each, one after another; with
/// several, each outcome on a line of its own after its zone's name.
async fn sign_zones(admin: &Admin, query: Option<&str>) -> String {
    let zones = match zones_asked(&admin.signers, query) {
        Ok(zones) => zones,
        Err(text) => return text,
    };
    if let [(_, signer)] = admin.signers.as_slice() {
        return sign_zone(admin, 0, signer).await;
    }
    let (mut lines, mut failed) = (Vec::new(), 0);
    for &i in &zones {
        let (name, signer) = &admin.signers[i];
        let outcome = sign_zone(admin, u16::try_from(i).unwrap_or(u16::MAX), signer).await;
        failed += usize::from(outcome.starts_with("error"));
        lines.push(format!("zone {name}: {outcome}"));
    }
    // An error anywhere makes the answer one (its status code says so).
    if failed > 0 {
        lines.insert(0, format!("error: {failed} of {} zones not signed", zones.len()));
    }
    lines.join("\n")
}

async fn sign_zone(admin: &Admin, zone: u16, signer: &exec::SignZoneSigner) -> String {
    let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
    let auth = match signer.sign(now_us) {
        Ok(auth) => auth,
        Err(e) => return format!("error: cannot sign the request: {e}"),
    };
    let (reply, mut rx) = crate::client::reply::ReplyTo::internal();
    admin.gateway.order(exec::envelope::Op::sign_zone(zone, auth), reply).await;
    // Answered once the signed zone is installed (the signing runs in the background).
    match tokio::time::timeout(SIGN_ZONE_WAIT, rx.recv()).await {
        Ok(Some(answer)) => String::from_utf8_lossy(&answer.bytes).into_owned(),
        Ok(None) => "error: the request was dropped before it was ordered".into(),
        Err(_) => "error: not signed within 3600 s (see sdns cluster status for its progress)".into(),
    }
}

/// The change a zone-set request asks for: `action=add|remove`, `zone=NAME` and, for an
/// add, `key=HEX` (the zone's SHA-256 DS digest, 64 hex digits, as in its `ds.txt`). Names
/// need no escapes (letters, digits, `-`, `_`, dots), so none are decoded: a `%` is refused.
fn zone_change_asked(query: Option<&str>) -> Result<exec::ZoneSetChange, String> {
    let (mut action, mut zone, mut key) = (None, None, None);
    for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
        match kv.split_once('=') {
            Some(("action", v)) => action = Some(v),
            Some(("zone", v)) => zone = Some(v),
            Some(("key", v)) => key = Some(v),
            _ => return Err(format!("error: unknown parameter {kv:?} (action=add|remove, zone=NAME, key=DS-DIGEST)")),
        }
    }
    let zone = zone.filter(|z| !z.is_empty()).ok_or("error: name the zone (zone=NAME)")?;
    let labels_empty = zone.trim_end_matches('.').split('.').any(str::is_empty);
    if labels_empty || !zone.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        return Err(format!("error: {zone:?} is not a zone name (labels of letters, digits, '-' and '_', between dots)"));
    }
    match (action, key) {
        (Some("add"), Some(key)) => {
            let digest = parse_digest(key).ok_or_else(|| format!("error: key={key:?} is not a SHA-256 DS digest (64 hex digits)"))?;
            Ok(exec::ZoneSetChange::new(exec::ZoneSetAction::Add, zone, digest))
        }
        (Some("add"), None) => Err("error: an add names the zone's key: key=<its SHA-256 DS digest, from zones/<zone>/ds.txt>".into()),
        (Some("remove"), None) => Ok(exec::ZoneSetChange::new(exec::ZoneSetAction::Remove, zone, [0; 32])),
        (Some("remove"), Some(_)) => Err("error: a removal names the zone only (no key=)".into()),
        (other, _) => Err(format!("error: action={} is neither add nor remove", other.unwrap_or(""))),
    }
}

/// 64 hex digits (either case) as 32 bytes.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 || !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// For an add: the digest must be the DS digest of the key this replica was dealt for the
/// zone (`zones/<zone>/zone.pub.json`), so that a mistyped digest is the operator's error
/// here rather than a request that can never make t+1. A replica without the file asks all
/// the same: the zone set must not depend on local files (it serves the zone unsigned and
/// counts as faulty for its signing, docs/MULTIZONE.md).
fn check_dealt_key(dealt_dir: &std::path::Path, change: &exec::ZoneSetChange) -> Result<(), String> {
    if change.action != exec::ZoneSetAction::Add {
        return Ok(());
    }
    let path = dealt_dir.join(crate::config::zone_dir_name(&change.name)).join("zone.pub.json");
    if !path.exists() {
        return Ok(());
    }
    let apex = hickory_proto::rr::Name::from_ascii(&change.name).map_err(|e| format!("error: {:?} is not a zone name: {e}", change.name))?;
    let digests = crate::files::ds_digests(&path, &apex).map_err(|e| format!("error: {e:#}"))?;
    if digests.iter().any(|(_, d)| *d == change.key_digest) {
        return Ok(());
    }
    let dealt: Vec<String> = digests.iter().map(|(alg, d)| format!("{} (algorithm {alg})", hex(d))).collect();
    Err(format!(
        "error: this replica was dealt another key for {}: {} gives the DS digest {}, the request names {}; nothing was asked",
        change.name,
        path.display(),
        dealt.join(" or "),
        hex(&change.key_digest)
    ))
}

/// POST /admin/zone: this replica's request for a zone-set change, signed with its identity
/// key and ordered; the execution core's answer with its status code: 200 the change
/// executed here ("added ..."/"removed ..."), 202 counted but fewer than t+1 replicas asked
/// so far, 409 refused by the zone set, 400 a request this replica does not make, 500 an
/// error.
async fn change_zone_set(admin: &Admin, query: Option<&str>) -> (StatusCode, String) {
    let change = match zone_change_asked(query).and_then(|c| check_dealt_key(&admin.dealt_dir, &c).map(|()| c)) {
        Ok(change) => change,
        Err(text) => return (StatusCode::BAD_REQUEST, text),
    };
    let Some((_, signer)) = admin.signers.first() else { return (StatusCode::INTERNAL_SERVER_ERROR, "error: this replica has no signing identity".into()) };
    let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
    let auth = match signer.sign_zone_set(&change, now_us) {
        Ok(auth) => auth,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("error: cannot sign the request: {e}")),
    };
    let (reply, mut rx) = crate::client::reply::ReplyTo::internal();
    admin.gateway.order(exec::envelope::Op::ZoneSet { change, auth }, reply).await;
    let text = match tokio::time::timeout(ZONE_SET_WAIT, rx.recv()).await {
        Ok(Some(answer)) => String::from_utf8_lossy(&answer.bytes).into_owned(),
        Ok(None) => "error: the request was dropped before it was ordered".into(),
        Err(_) => format!("error: no outcome within {} s (see sdns cluster status)", ZONE_SET_WAIT.as_secs()),
    };
    (zone_set_code(&text), text)
}

/// The status code of the execution core's answer to a zone-set request (its wording:
/// exec's `ExecCore::zone_set_request`).
fn zone_set_code(text: &str) -> StatusCode {
    if text.starts_with("added ") || text.starts_with("removed ") {
        StatusCode::OK
    } else if text.starts_with("counted: ") {
        StatusCode::ACCEPTED
    } else if text.starts_with("refused: ") {
        StatusCode::CONFLICT
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

/// The most of an answer the client keeps (a /metrics text is a few KiB).
const MAX_ANSWER: usize = 4 << 20;

/// One request to a replica's endpoint: the status code and the body. The answer must be
/// complete within `within` (connecting within 2 s of it).
pub async fn request(addr: SocketAddr, method: Method, path: &str, headers: &[(&str, &str)], within: Duration) -> anyhow::Result<(u16, String)> {
    let exchange = async {
        let stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow!("connecting to {addr}: timed out"))?
            .with_context(|| format!("connecting to {addr}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(connection);
        let mut builder = Request::builder().method(method).uri(path).header(HOST, addr.to_string());
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let response = sender.send_request(builder.body(Empty::new())?).await?;
        let code = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_ANSWER).collect().await.map_err(|e| anyhow!("reading the answer from {addr}: {e}"))?.to_bytes();
        driver.abort();
        Ok::<_, anyhow::Error>((code, String::from_utf8_lossy(&body).trim().to_string()))
    };
    tokio::time::timeout(within, exchange).await.map_err(|_| anyhow!("no answer from {addr} within {within:?}"))?
}

/// The CLI's commands are synchronous: each request runs on a runtime of its own.
fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime for the request")?.block_on(f)
}

/// GET `path` (the body, whatever the status code).
pub fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    Ok(block_on(request(addr, Method::GET, path, &[], Duration::from_secs(3)))?.1)
}

/// POST to a replica's zone-set admin route with its bearer token: the status code and
/// the answer, whatever the code (a count, a refusal and an execution are all answers).
pub fn post_zone_set(addr: SocketAddr, path: &str, token: &str) -> anyhow::Result<(u16, String)> {
    let auth = format!("Bearer {token}");
    block_on(request(addr, Method::POST, path, &[("authorization", &auth)], ZONE_SET_WAIT + Duration::from_secs(30)))
}

/// POST to a replica's admin route with its bearer token; an error unless it answers 200.
pub fn post(addr: SocketAddr, path: &str, token: &str) -> anyhow::Result<String> {
    let auth = format!("Bearer {token}");
    // A whole-zone signing answers once the signed zone is installed: minutes for a big zone.
    let (code, body) = block_on(request(addr, Method::POST, path, &[("authorization", &auth)], SIGN_ZONE_WAIT + Duration::from_secs(30)))?;
    if code != 200 {
        anyhow::bail!("{path} at {addr}: HTTP {code}: {body}");
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A server on an ephemeral loopback port, without an admin.
    async fn server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Metrics::new(7);
        metrics.inc_request(exec::classify::Kind::Write);
        tokio::spawn(serve_on(listener, metrics, None));
        addr
    }

    #[tokio::test]
    async fn routes_answer_and_a_web_page_is_refused() {
        let addr = server().await;
        let within = Duration::from_secs(5);
        let (code, text) = request(addr, Method::GET, "/metrics", &[], within).await.unwrap();
        assert_eq!(code, 200);
        assert!(text.contains("sdns_requests_total{replica=\"7\",kind=\"write\"} 1"), "{text}");
        let (code, json) = request(addr, Method::GET, "/status", &[], within).await.unwrap();
        assert_eq!(code, 200);
        let status: crate::ops::metrics::Status = serde_json::from_str(&json).unwrap();
        assert_eq!(status.id, 7);
        assert_eq!(request(addr, Method::GET, "/metrics", &[("origin", "https://evil.example")], within).await.unwrap().0, 403);
        assert_eq!(request(addr, Method::POST, "/admin/sign-zone", &[("authorization", "Bearer x")], within).await.unwrap().0, 404);
        assert_eq!(request(addr, Method::POST, "/admin/zone?action=remove&zone=x", &[("authorization", "Bearer x")], within).await.unwrap().0, 404);
        assert_eq!(request(addr, Method::POST, "/status", &[], within).await.unwrap().0, 405);
        assert_eq!(request(addr, Method::GET, "/", &[], within).await.unwrap().0, 404);
    }

    #[test]
    fn a_zone_set_request_is_read_from_the_query_or_refused() {
        let digest = "ab".repeat(32);
        let add = zone_change_asked(Some(&format!("action=add&zone=New.Test&key={digest}"))).unwrap();
        assert_eq!(add, exec::ZoneSetChange::new(exec::ZoneSetAction::Add, "new.test.", [0xab; 32]));
        assert_eq!(add.name, "new.test.");
        let remove = zone_change_asked(Some("zone=old.test.&action=remove")).unwrap();
        assert_eq!((remove.action, remove.name.as_str(), remove.key_digest), (exec::ZoneSetAction::Remove, "old.test.", [0; 32]));
        for bad in [
            None,
            Some("action=add&zone=new.test".to_string()),
            Some(format!("action=add&zone=new.test&key={}", &digest[..62])),
            Some(format!("action=add&zone=new.test&key={}zz", &digest[..62])),
            Some(format!("action=remove&zone=old.test&key={digest}")),
            Some("action=rename&zone=old.test".to_string()),
            Some("action=remove".to_string()),
            Some("action=remove&zone=".to_string()),
            Some("action=remove&zone=a..b".to_string()),
            Some("action=remove&zone=..".to_string()),
            Some("action=remove&zone=a%2eb".to_string()),
            Some("action=remove&zone=a/b".to_string()),
            Some("action=remove&zone=old.test&extra=1".to_string()),
        ] {
            let e = zone_change_asked(bad.as_deref()).unwrap_err();
            assert!(e.starts_with("error: "), "{bad:?}: {e}");
        }
        assert_eq!(parse_digest(&"0F".repeat(32)), Some([0x0f; 32]));
        assert_eq!(parse_digest("+f".repeat(32).as_str()), None, "from_str_radix takes a sign; a digest does not");
    }

    #[test]
    fn an_added_zones_digest_must_be_the_dealt_keys() {
        use crate::files::tests::TestRng;
        let dir = tempfile::tempdir().unwrap();
        let (pk, _) = threshold_ec::deal(threshold_ec::Algorithm::EcdsaP256Sha256, 4, 1, &mut TestRng(5)).unwrap();
        std::fs::create_dir_all(dir.path().join("zones/new.test")).unwrap();
        std::fs::write(dir.path().join("zones/new.test/zone.pub.json"), serde_json::to_string(&pk).unwrap()).unwrap();
        let apex = hickory_proto::rr::Name::from_ascii("new.test.").unwrap();
        let ds = crate::files::ThresholdPublic::load(&dir.path().join("zones/new.test/zone.pub.json"), 13).unwrap().zone_key(&apex, 13).unwrap().ds_digest();
        let add = |digest| exec::ZoneSetChange::new(exec::ZoneSetAction::Add, "New.Test", digest);
        assert_eq!(check_dealt_key(dir.path(), &add(ds)), Ok(()));
        let e = check_dealt_key(dir.path(), &add([1; 32])).unwrap_err();
        assert!(e.contains("dealt another key for new.test.") && e.contains(&hex(&ds)) && e.contains(&hex(&[1; 32])), "{e}");
        // Without the dealt file the replica asks all the same; a removal names no key.
        assert_eq!(check_dealt_key(dir.path(), &exec::ZoneSetChange::new(exec::ZoneSetAction::Add, "other.test", [1; 32])), Ok(()));
        assert_eq!(check_dealt_key(dir.path(), &exec::ZoneSetChange::new(exec::ZoneSetAction::Remove, "new.test", [0; 32])), Ok(()));
        assert_eq!(zone_set_code("added new.test. as zone 2 at seq 9; its first signing begins there"), StatusCode::OK);
        assert_eq!(zone_set_code("removed new.test. (zone 2) at seq 9"), StatusCode::OK);
        assert_eq!(zone_set_code("counted: 1 of the 2 replicas needed asked to add new.test."), StatusCode::ACCEPTED);
        assert_eq!(zone_set_code("refused: new.test. is served already"), StatusCode::CONFLICT);
        assert_eq!(zone_set_code("error: the request was dropped before it was ordered"), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn only_the_endpoints_own_address_is_a_host() {
        let v4: SocketAddr = "127.0.0.1:5601".parse().unwrap();
        let allowed = |host: &str, local: SocketAddr| host_allowed(Some(host.as_bytes()), local);
        for host in ["127.0.0.1:5601", "127.0.0.1", "localhost:5601", "localhost", "LOCALHOST.:5601", " 127.0.0.1:5601 "] {
            assert!(allowed(host, v4), "{host}");
        }
        assert!(host_allowed(None, v4), "no Host (HTTP/1.0)");
        for host in ["evil.example", "evil.example:5601", "127.0.0.1:80", "127.0.0.2:5601", "localhost:80", "127.0.0.1:", "[::1]:5601", "", "127.0.0.1:5601:1"]
        {
            assert!(!allowed(host, v4), "{host}");
        }
        assert!(!host_allowed(Some(b"\xff"), v4));
        let v6: SocketAddr = "[::1]:9100".parse().unwrap();
        for host in ["[::1]:9100", "[::1]", "localhost:9100"] {
            assert!(allowed(host, v6), "{host}");
        }
        for host in ["::1", "[::1]9100", "[::1", "127.0.0.1:9100"] {
            assert!(!allowed(host, v6), "{host}");
        }
        // Not loopback: `localhost` does not name it.
        let lan: SocketAddr = "192.0.2.5:5601".parse().unwrap();
        assert!(allowed("192.0.2.5:5601", lan) && allowed("192.0.2.5", lan));
        assert!(!allowed("localhost:5601", lan) && !allowed("rebound.example:5601", lan));
    }

    #[tokio::test]
    async fn a_request_for_another_host_is_refused() {
        let addr = server().await;
        let within = Duration::from_secs(5);
        assert_eq!(request(addr, Method::GET, "/status", &[], within).await.unwrap().0, 200, "the client names the address it connects to");
        let (code, text) = request(addr, Method::GET, "/status", &[("host", "rebound.example")], within).await.unwrap();
        assert_eq!(code, 403, "{text}");
        let local = format!("localhost:{}", addr.port());
        assert_eq!(request(addr, Method::GET, "/metrics", &[("host", &local)], within).await.unwrap().0, 403, "two Host headers");
        // Raw requests: without Host (HTTP/1.0) it is served; with `localhost` too; a rebound
        // name is refused.
        for (head, served) in [
            ("GET /status HTTP/1.0\r\n\r\n".to_string(), true),
            (format!("GET /status HTTP/1.1\r\nHost: localhost:{}\r\n\r\n", addr.port()), true),
            (format!("GET /metrics HTTP/1.1\r\nHost: attacker.example:{}\r\n\r\n", addr.port()), false),
        ] {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            tokio::time::timeout(within, stream.read_to_end(&mut answer)).await.unwrap().unwrap();
            let status = String::from_utf8_lossy(&answer).lines().next().unwrap_or("").to_string();
            assert_eq!(status.contains(" 200 "), served, "{head:?}: {status}");
            assert_eq!(status.contains(" 403 "), !served, "{head:?}: {status}");
        }
    }

    #[tokio::test]
    async fn slow_and_oversized_requests_and_idle_clients_are_bounded() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let addr = server().await;
        // A head never finished: the connection is closed after the header-read timeout.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        let mut buf = Vec::new();
        let closed = tokio::time::timeout(HEADER_READ_TIMEOUT * 3, slow.read_to_end(&mut buf)).await;
        assert!(closed.is_ok(), "an unfinished head held its connection open");
        // A head larger than the request buffer is refused, not buffered.
        let mut big = TcpStream::connect(addr).await.unwrap();
        let filler = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\n\r\n", "a".repeat(MAX_REQUEST * 2));
        let _ = big.write_all(filler.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), big.read_to_end(&mut answer)).await.expect("closed");
        assert!(!String::from_utf8_lossy(&answer).contains(" 200 "), "an oversized head was served");
        // Idle connections beyond the limit are closed at once; the held ones end by the
        // header-read timeout, after which the endpoint serves again.
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut extra = TcpStream::connect(addr).await.unwrap();
        let mut one = [0u8; 1];
        let refused = tokio::time::timeout(Duration::from_secs(1), extra.read(&mut one)).await;
        assert!(matches!(refused, Ok(Ok(0)) | Ok(Err(_))), "a connection over the limit was kept: {refused:?}");
        tokio::time::sleep(HEADER_READ_TIMEOUT + Duration::from_millis(500)).await;
        let (code, _) = request(addr, Method::GET, "/status", &[], Duration::from_secs(5)).await.unwrap();
        assert_eq!(code, 200, "served again once the idle connections timed out");
    }
}
