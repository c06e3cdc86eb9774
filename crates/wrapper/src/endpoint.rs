//! The replica's loopback HTTP endpoint: GET /metrics (Prometheus text) and GET /status
//! (JSON) from [`Metrics`], and the admin route POST /admin/sign-zone, which orders through
//! the gateway. A deliberately tiny HTTP/1.0 responder (no HTTP framework for three routes).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::debug;

use crate::metrics::Metrics;

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
    let (reply, mut rx) = crate::reply::ReplyTo::internal();
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
