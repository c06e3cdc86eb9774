//! The signing service: the glue's end of named's signing socket.
//!
//! [`SigningService::bind`] listens on a unix datagram socket; for each
//! request it takes the agreed signature times from a [`TimeSource`],
//! rewrites offsets 8..16 of the to-be-signed data to them, asks the
//! [`Signer`] for a signature and replies with the signature and the times
//! used. A signer's failure or a request it cannot serve becomes an error reply,
//! on which named fails the update cleanly. Nothing here gives up on a timer: a
//! signature takes as long as the replicas take, and a request that cannot be taken
//! now (all slots busy) is dropped without a reply, for named re-sends it.

use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::rr::Name;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::wire::{self, Reply, Request, Status};

/// What the signer is asked to sign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignRequest {
    /// DNSSEC algorithm number from named (8 = RSASHA256, 10 = RSASHA512,
    /// 13 = ECDSAP256SHA256, 15 = ED25519).
    pub algorithm: u8,
    pub key_tag: u16,
    /// The zone whose key signs.
    pub signer: Name,
    /// To-be-signed data with the agreed times already at offsets 8..16.
    pub data: Vec<u8>,
    pub times: SignatureTimes,
}

/// Why a signature could not be produced.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    #[error("no key for algorithm {algorithm}, key tag {key_tag}")]
    UnknownKey { algorithm: u8, key_tag: u16 },
    #[error("signer is shutting down")]
    ShuttingDown,
    #[error("signing failed: {0}")]
    Failed(String),
}

/// Boxed future returned by [`Signer::sign`].
pub type SignFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, SignError>> + Send>>;

/// Computes a DNSSEC signature over to-be-signed data in the RRSIG's wire form
/// (for RSA: PKCS#1 v1.5 over the data's hash; ECDSA P-256: r || s over its
/// SHA-256; Ed25519: RFC 8032 over the data; see [`crate::wire`]). Its length
/// must be the key's ([`crate::keys::ZoneKey::signature_len`]): named refuses
/// any other. The wrapper's implementation runs the threshold protocol with
/// the other replicas.
pub trait Signer: Send + Sync + 'static {
    fn sign(&self, request: SignRequest) -> SignFuture;
}

// Part of the signer's API, defined with the wire arithmetic so that the execution core
// decides the times without a runtime.
pub use dnswire::dnssec::SignatureTimes;

/// Where the service gets the agreed times of the request being executed;
/// `None` means no ordered request is executing, and signing is refused.
pub type TimeSource = Arc<dyn Fn() -> Option<SignatureTimes> + Send + Sync>;

/// A [`TimeSource`] backed by a watch channel the executor sets.
pub fn watch_time_source(rx: watch::Receiver<Option<SignatureTimes>>) -> TimeSource {
    Arc::new(move || *rx.borrow())
}

/// Limits of the service.
#[derive(Debug, Clone)]
pub struct ServiceLimits {
    /// Requests signed concurrently; more are dropped unanswered (named re-sends them).
    pub max_in_flight: usize,
}

impl Default for ServiceLimits {
    fn default() -> Self {
        ServiceLimits { max_in_flight: 64 }
    }
}

/// The running service; dropping it stops it and removes the socket file.
pub struct SigningService {
    path: PathBuf,
    task: JoinHandle<()>,
}

impl SigningService {
    /// Binds `path` (removing a stale socket file) with mode 0600; creates
    /// the parent directory with mode 0700 if missing. Must be called from
    /// within a tokio runtime.
    pub fn bind(path: &Path, signer: Arc<dyn Signer>, times: TimeSource, limits: ServiceLimits) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
            }
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let bound = UnixDatagram::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        bound.set_nonblocking(true)?;
        // Replies leave from the bound socket itself: named connects to this
        // path and accepts datagrams only from it. They go to named's abstract
        // autobind addresses, which only std's send_to_addr can name, so a
        // (non-blocking) std handle of the same socket sends them.
        let replies = bound.try_clone()?;
        let socket = tokio::net::UnixDatagram::from_std(bound)?;
        let task = tokio::spawn(serve(socket, Arc::new(replies), signer, times, limits));
        Ok(SigningService { path: path.to_path_buf(), task })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the service's task has ended. It serves until dropped, so before that an end
    /// is a failure (a panic included): named's signing requests go unanswered.
    pub fn has_stopped(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for SigningService {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn serve(socket: tokio::net::UnixDatagram, replies: Arc<UnixDatagram>, signer: Arc<dyn Signer>, times: TimeSource, limits: ServiceLimits) {
    let permits = Arc::new(Semaphore::new(limits.max_in_flight.max(1)));
    // Requests being signed, by (sender, id): named's re-sends of one of them start nothing.
    let in_flight = Arc::new(Mutex::new(HashSet::<(Vec<u8>, u64)>::new()));
    let mut buf = vec![0u8; wire::MAX_REQUEST_LEN + 1];
    loop {
        let (len, from) = match socket.recv_from(&mut buf).await {
            Ok((len, from)) => (len, UnixAddr::from(from)),
            Err(e) => {
                tracing::warn!(error = %e, "signing socket receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let datagram = buf.get(..len).unwrap_or_default().to_vec();
        let key = Request::peek_id(&datagram).map(|id| (sender_key(&from), id));
        if let Some(key) = &key {
            if in_flight.lock().unwrap_or_else(|p| p.into_inner()).contains(key) {
                continue;
            }
        }
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Busy: no answer now rather than one that fails the update; named re-sends.
            tracing::debug!("signing service busy; request dropped until named re-sends it");
            continue;
        };
        if let Some(key) = &key {
            in_flight.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone());
        }
        let (replies, signer, times, in_flight) = (replies.clone(), signer.clone(), times.clone(), in_flight.clone());
        tokio::spawn(async move {
            if let Some(reply) = handle(&datagram, signer.as_ref(), &times).await {
                send_reply(&replies, &from, &reply);
            }
            if let Some(key) = key {
                in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
            }
            drop(permit);
        });
    }
}

/// Produces the reply to one datagram; `None` if it is not worth one (not
/// even an id to answer to).
pub(crate) async fn handle(datagram: &[u8], signer: &dyn Signer, times: &TimeSource) -> Option<Reply> {
    let request = match Request::decode(datagram) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "malformed signing request");
            return Request::peek_id(datagram).map(|id| Reply::error(id, Status::BadRequest));
        }
    };
    let Some(agreed) = times() else {
        tracing::warn!(id = request.id, "signing request outside an ordered request: refused");
        return Some(Reply::error(request.id, Status::Unavailable));
    };
    let mut data = request.data;
    if let Err(e) = wire::rewrite_times(&mut data, agreed.inception, agreed.expiration) {
        tracing::warn!(error = %e, "bad to-be-signed data");
        return Some(Reply::error(request.id, Status::BadRequest));
    }
    let sign_request = SignRequest { algorithm: request.algorithm, key_tag: request.key_tag, signer: request.signer, data, times: agreed };
    // However long the replicas take: a local timer must not decide this signature.
    match signer.sign(sign_request).await {
        Ok(signature) if !signature.is_empty() && signature.len() <= wire::MAX_SIGNATURE_LEN => {
            Some(Reply::ok(request.id, agreed.inception, agreed.expiration, signature))
        }
        Ok(signature) => {
            tracing::warn!(len = signature.len(), "signer returned a signature of bad length");
            Some(Reply::error(request.id, Status::SignerFailed))
        }
        Err(e) => {
            tracing::warn!(id = request.id, error = %e, "signing failed");
            Some(Reply::error(request.id, Status::SignerFailed))
        }
    }
}

/// Identifies a sender's socket (named binds an abstract autobind address per request).
fn sender_key(addr: &UnixAddr) -> Vec<u8> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    if let Some(name) = addr.as_abstract_name() {
        let mut k = vec![0u8];
        k.extend_from_slice(name);
        k
    } else if let Some(path) = addr.as_pathname() {
        path.as_os_str().as_bytes().to_vec()
    } else {
        Vec::new()
    }
}

fn send_reply(socket: &UnixDatagram, to: &UnixAddr, reply: &Reply) {
    let bytes = match reply.encode() {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode signing reply");
            return;
        }
    };
    // named's socket is tiny and waits for exactly this datagram; if its
    // queue is full (it gave up) the reply is simply lost.
    if let Err(e) = socket.send_to_addr(&bytes, to) {
        tracing::warn!(error = %e, "cannot send signing reply");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Recording(Mutex<Vec<SignRequest>>, Option<SignError>);

    impl Signer for Arc<Recording> {
        fn sign(&self, request: SignRequest) -> SignFuture {
            let this = self.clone();
            Box::pin(async move {
                this.0.lock().unwrap().push(request);
                match &this.1 {
                    None => Ok(vec![0xab; 64]),
                    Some(_) => Err(SignError::Failed("test".into())),
                }
            })
        }
    }

    fn request_vector() -> Vec<u8> {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/request-ok.hex")).unwrap();
        wire::from_hex(&text).unwrap()
    }

    async fn exchange(service_path: &Path, client_path: &Path, bytes: &[u8]) -> Reply {
        let client = tokio::net::UnixDatagram::bind(client_path).unwrap();
        client.send_to(bytes, service_path).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let (n, from) = tokio::time::timeout(Duration::from_secs(5), client.recv_from(&mut buf)).await.unwrap().unwrap();
        // Replies come from the service's own bound socket: named accepts no other.
        assert_eq!(from.as_pathname(), Some(service_path));
        Reply::decode(&buf[..n]).unwrap()
    }

    /// Answers only once released, counting the signings it was asked for.
    struct Gated(Arc<tokio::sync::Notify>, Arc<std::sync::atomic::AtomicUsize>);

    impl Signer for Gated {
        fn sign(&self, _request: SignRequest) -> SignFuture {
            let (gate, count) = (self.0.clone(), self.1.clone());
            Box::pin(async move {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                gate.notified().await;
                Ok(vec![0xcd; 64])
            })
        }
    }

    #[tokio::test]
    async fn a_slow_signing_is_waited_for_and_resends_start_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signer");
        let (gate, count) = (Arc::new(tokio::sync::Notify::new()), Arc::new(std::sync::atomic::AtomicUsize::new(0)));
        let times: TimeSource = Arc::new(|| Some(SignatureTimes { inception: 1, expiration: 2 }));
        let limits = ServiceLimits { max_in_flight: 1 };
        let service = SigningService::bind(&path, Arc::new(Gated(gate.clone(), count.clone())), times, limits).unwrap();
        let client = tokio::net::UnixDatagram::bind(dir.path().join("named")).unwrap();
        let request = request_vector();
        // named's first request and its re-sends: one signing, no answer until it is done.
        for _ in 0..5 {
            client.send_to(&request, service.path()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut buf = vec![0u8; 4096];
        assert!(client.try_recv(&mut buf).is_err(), "no reply while the signing runs: no error either");
        // Another request while the only slot is taken: dropped, not refused.
        let other = tokio::net::UnixDatagram::bind(dir.path().join("other")).unwrap();
        other.send_to(&request, service.path()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(other.try_recv(&mut buf).is_err(), "a busy service answers nothing");
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
        gate.notify_one();
        let n = tokio::time::timeout(Duration::from_secs(5), client.recv(&mut buf)).await.unwrap().unwrap();
        let reply = Reply::decode(&buf[..n]).unwrap();
        assert_eq!((reply.status, reply.signature), (Status::Ok, vec![0xcd; 64]));
        // Once the slot is free, the dropped request's re-send is served.
        other.send_to(&request, service.path()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        gate.notify_one();
        let n = tokio::time::timeout(Duration::from_secs(5), other.recv(&mut buf)).await.unwrap().unwrap();
        assert_eq!(Reply::decode(&buf[..n]).unwrap().status, Status::Ok);
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn service_rewrites_times_and_replies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sock/signer");
        let signer = Arc::new(Recording(Mutex::new(Vec::new()), None));
        let agreed = SignatureTimes::from_agreed(1_800_000_000, 30 * 86_400);
        let times: TimeSource = Arc::new(move || Some(agreed));
        let service = SigningService::bind(&path, Arc::new(signer.clone()), times, ServiceLimits::default()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        let reply = exchange(service.path(), &dir.path().join("c1"), &request_vector()).await;
        assert_eq!(reply.id, 0x0102_0304_0506_0708);
        assert_eq!(reply.status, Status::Ok);
        assert_eq!((reply.inception, reply.expiration), (1_800_000_000 - 3600, 1_800_000_000 + 30 * 86_400));
        assert_eq!(reply.signature, vec![0xab; 64]);
        let seen = signer.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(wire::read_times(&seen[0].data), Some((reply.inception, reply.expiration)));
        assert_eq!(seen[0].key_tag, 0x4d2f);

        let mut garbage = request_vector();
        garbage[4] = 7;
        let reply = exchange(service.path(), &dir.path().join("c2"), &garbage).await;
        assert_eq!(reply.status, Status::BadRequest);
        assert_eq!(signer.0.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn no_agreed_time_or_signer_error_gives_error_status() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signer");
        let signer = Arc::new(Recording(Mutex::new(Vec::new()), None));
        let none: TimeSource = Arc::new(|| None);
        let service = SigningService::bind(&path, Arc::new(signer.clone()), none, ServiceLimits::default()).unwrap();
        let reply = exchange(service.path(), &dir.path().join("c"), &request_vector()).await;
        assert_eq!(reply.status, Status::Unavailable);
        assert!(signer.0.lock().unwrap().is_empty());
        drop(service);
        assert!(!path.exists());

        let failing = Arc::new(Recording(Mutex::new(Vec::new()), Some(SignError::ShuttingDown)));
        let times: TimeSource = Arc::new(|| Some(SignatureTimes { inception: 1, expiration: 2 }));
        let service = SigningService::bind(&path, Arc::new(failing), times, ServiceLimits::default()).unwrap();
        let reply = exchange(service.path(), &dir.path().join("d"), &request_vector()).await;
        assert_eq!(reply.status, Status::SignerFailed);
        assert!(reply.signature.is_empty());
    }
}
