//! The links (feature `links`): the TLS connections between the replicas, their channels,
//! queues and loss rules, as the crate's documentation describes them.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::{PeerError, TransportError};
use crate::pki::{replica_dns_name, replica_id_from_cert_der};

/// PBFT ordering messages.
pub const CHANNEL_ORDERING: u8 = 0;
/// Threshold-signature shares and final signatures.
pub const CHANNEL_SIGNING: u8 = 1;
/// State transfer: checkpoint snapshots fetched in chunks by a replica that fell behind.
pub const CHANNEL_STATE: u8 = 2;
/// Vouched reads: read probes and the vouches that answer them (the wrapper's, outside the
/// ordering).
pub const CHANNEL_READS: u8 = 3;
/// Reserved: empty frames a writer sends when idle, dropped by the reader.
pub const CHANNEL_KEEPALIVE: u8 = 255;

/// Frames of a channel waiting for its consumer after the per-peer queues are merged (not
/// counted against any peer's byte budget, so kept short).
const MERGED_QUEUE: usize = 16;
/// Smallest byte budget of one peer's receive queue on one channel.
const MIN_PEER_BUDGET: usize = 1024 * 1024;

/// A received frame waiting in its peer's queue, holding its share of that peer's byte budget.
type Queued = (u16, Bytes, OwnedSemaphorePermit);

/// Takes the frames of one channel as (sender replica id, payload) in the task reading that
/// peer's connection ([`Mesh::handle_inline`]). It must not block: the peer's next frame waits
/// for it, and so does, through TCP flow control, that peer's sending.
pub type InlineHandler = Arc<dyn Fn(u16, Bytes) + Send + Sync>;

/// One peer's receive queue on one channel: bounded in frames (the channel) and in bytes
/// (`budget`, permits = payload bytes; a frame larger than the whole budget takes all of it).
struct PeerInbox {
    tx: mpsc::Sender<Queued>,
    budget: Arc<Semaphore>,
    budget_bytes: usize,
}

/// Forwards the per-peer queues of one channel into the consumer's queue, one frame per peer
/// in turn (round robin over the peers that have one), until the consumer or every peer
/// queue is gone. A frame's bytes return to its peer's budget once it is handed on.
async fn merge_fairly(mut queues: Vec<mpsc::Receiver<Queued>>, out: mpsc::Sender<(u16, Bytes)>) {
    if queues.is_empty() {
        // A mesh without peers: the channel stays open (and empty) while it is subscribed.
        out.closed().await;
        return;
    }
    let mut next = 0usize;
    loop {
        let start = next;
        let ready = std::future::poll_fn(|cx| {
            let n = queues.len();
            let mut open = false;
            for k in 0..n {
                let i = (start + k) % n;
                match queues[i].poll_recv(cx) {
                    std::task::Poll::Ready(Some(frame)) => return std::task::Poll::Ready(Some((i, frame))),
                    std::task::Poll::Ready(None) => {}
                    std::task::Poll::Pending => open = true,
                }
            }
            if open {
                std::task::Poll::Pending
            } else {
                std::task::Poll::Ready(None)
            }
        });
        let (i, (from, payload, permit)) = tokio::select! {
            got = ready => match got { Some(got) => got, None => return },
            _ = out.closed() => return,
        };
        next = i + 1;
        if out.send((from, payload)).await.is_err() {
            return;
        }
        drop(permit);
    }
}

/// How long a reader waits for a full subscriber before dropping the frame.
const SUBSCRIBER_WAIT: Duration = Duration::from_secs(1);
/// First allocation for a frame being read; it grows as the peer sends more.
const READ_CHUNK: usize = 64 * 1024;
/// Length prefix size in bytes.
const HEADER_BYTES: usize = 4;
/// Ceiling for `max_frame_bytes`, so the length always fits the u32 prefix with the channel byte.
pub const MAX_FRAME_BYTES_LIMIT: usize = 256 * 1024 * 1024;

/// Configuration of one replica's end of the mesh.
#[derive(Clone)]
pub struct MeshConfig {
    /// This replica's id; must be the id bound into `cert_pem`.
    pub id: u16,
    /// Address to accept peers' connections on.
    pub listen: SocketAddr,
    /// Every other replica: (id, address it listens on). Must not contain `id`.
    pub peers: Vec<(u16, SocketAddr)>,
    /// The cluster CA certificate (PEM).
    pub ca_cert_pem: String,
    /// This replica's certificate (PEM), issued by the cluster CA.
    pub cert_pem: String,
    /// This replica's private key (PEM).
    pub key_pem: String,
    /// Largest payload accepted or sent in one frame, in bytes.
    pub max_frame_bytes: usize,
    /// Bound on each peer's send queue and on each subscriber's receive queue, in frames.
    pub queue_frames: usize,
    /// Bound on the payload bytes queued for one peer (at least `max_frame_bytes`).
    pub queue_bytes: usize,
    /// First reconnect delay; doubles per failed attempt up to `backoff_max` (with jitter).
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Limit for TCP connect plus TLS handshake, both directions.
    pub handshake_timeout: Duration,
    /// If set, a writer idle this long sends an empty keepalive frame, and a reader that hears
    /// nothing for three times this long closes the connection (catches half-open links).
    pub keepalive: Option<Duration>,
}

impl std::fmt::Debug for MeshConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshConfig")
            .field("id", &self.id)
            .field("listen", &self.listen)
            .field("peers", &self.peers)
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("queue_frames", &self.queue_frames)
            .field("queue_bytes", &self.queue_bytes)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl MeshConfig {
    /// A configuration with defaults: 4 MiB frames, 4096-frame and 64 MiB queues, backoff 50 ms to 5 s,
    /// 5 s handshake timeout, 10 s keepalive.
    pub fn new(id: u16, listen: SocketAddr, peers: Vec<(u16, SocketAddr)>, ca_cert_pem: String, cert_pem: String, key_pem: String) -> Self {
        MeshConfig {
            id,
            listen,
            peers,
            ca_cert_pem,
            cert_pem,
            key_pem,
            max_frame_bytes: 4 * 1024 * 1024,
            queue_frames: 4096,
            queue_bytes: 64 * 1024 * 1024,
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            keepalive: Some(Duration::from_secs(10)),
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), TransportError> {
        let bad = |field: &'static str, reason: String| Err(TransportError::Config { field, reason });
        if self.max_frame_bytes == 0 || self.max_frame_bytes > MAX_FRAME_BYTES_LIMIT {
            return bad("max_frame_bytes", format!("must be in 1..={MAX_FRAME_BYTES_LIMIT}"));
        }
        if self.queue_frames == 0 {
            return bad("queue_frames", "must be at least 1".into());
        }
        if self.queue_bytes < self.max_frame_bytes {
            return bad("queue_bytes", "must be at least max_frame_bytes".into());
        }
        if self.backoff_min.is_zero() {
            return bad("backoff_min", "must be positive".into());
        }
        if self.backoff_max < self.backoff_min {
            return bad("backoff_max", "must be >= backoff_min".into());
        }
        if self.handshake_timeout.is_zero() {
            return bad("handshake_timeout", "must be positive".into());
        }
        if self.keepalive.is_some_and(|k| k.is_zero()) {
            return bad("keepalive", "must be positive when set".into());
        }
        let mut seen = std::collections::HashSet::new();
        for (peer, _) in &self.peers {
            if *peer == self.id {
                return bad("peers", format!("contains this replica's own id {peer}"));
            }
            if !seen.insert(*peer) {
                return bad("peers", format!("replica {peer} listed twice"));
            }
        }
        let cert = parse_cert(&self.cert_pem, "cert_pem")?;
        match replica_id_from_cert_der(&cert) {
            Ok(id) if id == self.id => {}
            Ok(id) => return bad("cert_pem", format!("certificate is for replica {id}, not {}", self.id)),
            Err(e) => return bad("cert_pem", e.to_string()),
        }
        parse_cert(&self.ca_cert_pem, "ca_cert_pem")?;
        parse_key(&self.key_pem)?;
        // rustls checks that the key belongs to the certificate.
        tls_configs(&self.ca_cert_pem, &self.cert_pem, &self.key_pem).map_err(|e| match e {
            TransportError::Tls(reason) => TransportError::Config { field: "key_pem", reason: format!("unusable with cert_pem: {reason}") },
            other => other,
        })?;
        Ok(())
    }
}

/// Counters and state of the link to one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerStatus {
    pub id: u16,
    pub addr: SocketAddr,
    /// Our outgoing (sending) connection is up.
    pub connected: bool,
    /// The peer's incoming (receiving) connection is up.
    pub incoming_connected: bool,
    pub frames_sent: u64,
    /// Frames dropped from the full send queue.
    pub frames_dropped: u64,
    pub frames_queued: usize,
    /// Payload bytes in the send queue.
    pub bytes_queued: usize,
    pub frames_received: u64,
    /// Received frames dropped because their channel had no subscriber or a full one.
    pub frames_received_dropped: u64,
    /// Successful outgoing connections (handshakes) so far.
    pub connects: u64,
    /// The last error on either connection with this peer.
    pub last_error: Option<String>,
}

struct Peer {
    id: u16,
    addr: SocketAddr,
    queue: Mutex<SendQueue>,
    queued: Notify,
    connected: AtomicBool,
    incoming_connected: AtomicBool,
    /// Bumped for every accepted connection; a reader whose generation is stale exits.
    incoming_generation: watch::Sender<u64>,
    frames_sent: AtomicU64,
    frames_dropped: AtomicU64,
    frames_received: AtomicU64,
    frames_received_dropped: AtomicU64,
    connects: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Peer {
    fn set_error(&self, error: impl std::fmt::Display) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(error.to_string());
        }
    }
}

/// Frames waiting for a peer's writer, with their payload bytes counted.
#[derive(Default)]
struct SendQueue {
    frames: VecDeque<(u8, Bytes)>,
    bytes: usize,
}

struct Shared {
    id: u16,
    max_frame_bytes: usize,
    queue_frames: usize,
    queue_bytes: usize,
    keepalive: Option<Duration>,
    peers: HashMap<u16, Arc<Peer>>,
    /// Per channel, one queue per peer: a peer that floods a channel fills only its own
    /// queue and byte budget (and then waits, as TCP flow control reaches it), never the other
    /// peers'.
    subscribers: RwLock<HashMap<u8, HashMap<u16, Arc<PeerInbox>>>>,
    /// Channels whose frames are handed to a function in the reader task.
    inline: RwLock<HashMap<u8, InlineHandler>>,
    shutdown: watch::Sender<bool>,
}

/// One replica's end of the mesh. Dropping it shuts the mesh down.
pub struct Mesh {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

/// Cheap, cloneable handle for sending; it fails with `Shutdown` once the mesh is gone.
#[derive(Clone)]
pub struct MeshSender {
    shared: Arc<Shared>,
}

impl Mesh {
    /// Binds `cfg.listen` and starts the mesh.
    pub async fn start(cfg: MeshConfig) -> Result<Mesh, TransportError> {
        cfg.validate()?;
        let listener = TcpListener::bind(cfg.listen).await.map_err(|source| TransportError::Io { during: "binding the listen address", source })?;
        Self::start_with_listener(cfg, listener).await
    }

    /// Starts the mesh on an already bound listener (`cfg.listen` is then ignored). Lets tests
    /// bind port 0 for every replica first and hand out the real addresses.
    pub async fn start_with_listener(cfg: MeshConfig, listener: TcpListener) -> Result<Mesh, TransportError> {
        cfg.validate()?;
        let local_addr = listener.local_addr().map_err(|source| TransportError::Io { during: "reading the listen address", source })?;
        let (client_config, server_config) = tls_configs(&cfg.ca_cert_pem, &cfg.cert_pem, &cfg.key_pem)?;
        let (shutdown, _) = watch::channel(false);
        let peers = cfg
            .peers
            .iter()
            .map(|&(id, addr)| {
                let peer = Peer {
                    id,
                    addr,
                    queue: Mutex::new(SendQueue::default()),
                    queued: Notify::new(),
                    connected: AtomicBool::new(false),
                    incoming_connected: AtomicBool::new(false),
                    incoming_generation: watch::channel(0).0,
                    frames_sent: AtomicU64::new(0),
                    frames_dropped: AtomicU64::new(0),
                    frames_received: AtomicU64::new(0),
                    frames_received_dropped: AtomicU64::new(0),
                    connects: AtomicU64::new(0),
                    last_error: Mutex::new(None),
                };
                (id, Arc::new(peer))
            })
            .collect();
        let shared = Arc::new(Shared {
            id: cfg.id,
            max_frame_bytes: cfg.max_frame_bytes,
            queue_frames: cfg.queue_frames,
            queue_bytes: cfg.queue_bytes,
            keepalive: cfg.keepalive,
            peers,
            subscribers: RwLock::new(HashMap::new()),
            inline: RwLock::new(HashMap::new()),
            shutdown,
        });
        let mut tasks = Vec::new();
        let acceptor = TlsAcceptor::from(server_config);
        tasks.push(tokio::spawn(accept_loop(shared.clone(), listener, acceptor, cfg.handshake_timeout)));
        let connector = TlsConnector::from(client_config);
        for peer in shared.peers.values() {
            tasks.push(tokio::spawn(dial_loop(shared.clone(), peer.clone(), connector.clone(), cfg.backoff_min, cfg.backoff_max, cfg.handshake_timeout)));
        }
        tracing::info!(id = cfg.id, %local_addr, peers = cfg.peers.len(), "mesh started");
        Ok(Mesh { shared, local_addr, tasks })
    }

    /// The address actually listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// This replica's id.
    pub fn id(&self) -> u16 {
        self.shared.id
    }

    pub fn sender(&self) -> MeshSender {
        MeshSender { shared: self.shared.clone() }
    }

    /// Receives the frames of `channel` as (sender replica id, payload). One subscriber per
    /// channel; frames arriving on a channel before it is subscribed are dropped (counted).
    pub fn subscribe(&self, channel: u8) -> Result<mpsc::Receiver<(u16, Bytes)>, TransportError> {
        if channel == CHANNEL_KEEPALIVE {
            return Err(TransportError::Config { field: "channel", reason: "255 is reserved".into() });
        }
        if self.shared.inline.read().map_err(|_| TransportError::Shutdown)?.contains_key(&channel) {
            return Err(TransportError::Config { field: "channel", reason: format!("channel {channel} is handled inline") });
        }
        let mut subscribers = self.shared.subscribers.write().map_err(|_| TransportError::Shutdown)?;
        if subscribers.get(&channel).is_some_and(|s| s.values().any(|q| !q.tx.is_closed())) {
            return Err(TransportError::Config { field: "channel", reason: format!("channel {channel} already has a subscriber") });
        }
        // The peers share the frame bound; the merged queue the consumer reads stays short,
        // so a frame waits behind at most a few frames of other peers.
        let per_peer = (self.shared.queue_frames / self.shared.peers.len().max(1)).max(16);
        // The peers share queue_bytes too: what one peer can make this replica hold on a
        // channel is its budget plus one frame being read, however fast it sends.
        let budget_bytes = (self.shared.queue_bytes / self.shared.peers.len().max(1)).max(MIN_PEER_BUDGET);
        let (tx, rx) = mpsc::channel(MERGED_QUEUE);
        let mut queues = HashMap::new();
        let mut receivers = Vec::new();
        for &id in self.shared.peers.keys() {
            let (peer_tx, peer_rx) = mpsc::channel(per_peer);
            queues.insert(id, Arc::new(PeerInbox { tx: peer_tx, budget: Arc::new(Semaphore::new(budget_bytes)), budget_bytes }));
            receivers.push(peer_rx);
        }
        subscribers.insert(channel, queues);
        tokio::spawn(merge_fairly(receivers, tx));
        Ok(rx)
    }

    /// Hands every frame of `channel` to `handler`, called in the task that reads the sending
    /// peer's connection: no queue and no task wake-up between the socket and the handler.
    /// For light work that never waits; what the handler keeps per peer is its own to bound
    /// (a slow handler slows only the link it is called for). One handler per channel, and a
    /// channel is either handled inline or subscribed.
    pub fn handle_inline(&self, channel: u8, handler: InlineHandler) -> Result<(), TransportError> {
        if channel == CHANNEL_KEEPALIVE {
            return Err(TransportError::Config { field: "channel", reason: "255 is reserved".into() });
        }
        if self.shared.subscribers.read().map_err(|_| TransportError::Shutdown)?.get(&channel).is_some_and(|s| s.values().any(|q| !q.tx.is_closed())) {
            return Err(TransportError::Config { field: "channel", reason: format!("channel {channel} already has a subscriber") });
        }
        let mut inline = self.shared.inline.write().map_err(|_| TransportError::Shutdown)?;
        if inline.contains_key(&channel) {
            return Err(TransportError::Config { field: "channel", reason: format!("channel {channel} already has a handler") });
        }
        inline.insert(channel, handler);
        Ok(())
    }

    /// A snapshot of every peer link, sorted by id.
    pub fn peer_status(&self) -> Vec<PeerStatus> {
        let mut all: Vec<PeerStatus> = self
            .shared
            .peers
            .values()
            .map(|p| PeerStatus {
                id: p.id,
                addr: p.addr,
                connected: p.connected.load(Ordering::Relaxed),
                incoming_connected: p.incoming_connected.load(Ordering::Relaxed),
                frames_sent: p.frames_sent.load(Ordering::Relaxed),
                frames_dropped: p.frames_dropped.load(Ordering::Relaxed),
                frames_queued: p.queue.lock().map(|q| q.frames.len()).unwrap_or(0),
                bytes_queued: p.queue.lock().map(|q| q.bytes).unwrap_or(0),
                frames_received: p.frames_received.load(Ordering::Relaxed),
                frames_received_dropped: p.frames_received_dropped.load(Ordering::Relaxed),
                connects: p.connects.load(Ordering::Relaxed),
                last_error: p.last_error.lock().ok().and_then(|e| e.clone()),
            })
            .collect();
        all.sort_by_key(|s| s.id);
        all
    }

    /// Whether one of the mesh's own tasks (the accept loop, a peer's dial loop) has ended.
    /// They run until shutdown, so before it an end is a failure (a panic included).
    pub fn has_stopped(&self) -> bool {
        self.tasks.iter().any(|t| t.is_finished())
    }

    /// Stops every task and closes every connection.
    pub async fn shutdown(mut self) {
        self.signal_shutdown();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }

    fn signal_shutdown(&self) {
        self.shared.shutdown.send_replace(true);
        // Close the subscribers' channels so their consumers see the end (the senders would
        // otherwise live on in every MeshSender clone).
        if let Ok(mut subscribers) = self.shared.subscribers.write() {
            subscribers.clear();
        }
        // The handlers may hold what holds this mesh (a sender): let it go.
        if let Ok(mut inline) = self.shared.inline.write() {
            inline.clear();
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        self.signal_shutdown();
    }
}

impl MeshSender {
    /// Queues `payload` for replica `to` on `channel`. Returns once queued; a full queue drops
    /// its oldest frames (see [`PeerStatus::frames_dropped`]).
    pub fn send(&self, to: u16, channel: u8, payload: Bytes) -> Result<(), TransportError> {
        self.check(channel, &payload)?;
        let peer = self.shared.peers.get(&to).ok_or(TransportError::UnknownPeer(to))?;
        self.enqueue(peer, channel, payload);
        Ok(())
    }

    /// Queues `payload` for every peer (not this replica itself).
    pub fn broadcast(&self, channel: u8, payload: Bytes) -> Result<(), TransportError> {
        self.check(channel, &payload)?;
        for peer in self.shared.peers.values() {
            self.enqueue(peer, channel, payload.clone());
        }
        Ok(())
    }

    /// This replica's id.
    pub fn id(&self) -> u16 {
        self.shared.id
    }

    /// Ids of all peers, sorted.
    pub fn peer_ids(&self) -> Vec<u16> {
        let mut ids: Vec<u16> = self.shared.peers.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    fn check(&self, channel: u8, payload: &Bytes) -> Result<(), TransportError> {
        if *self.shared.shutdown.borrow() {
            return Err(TransportError::Shutdown);
        }
        if channel == CHANNEL_KEEPALIVE {
            return Err(TransportError::Config { field: "channel", reason: "255 is reserved".into() });
        }
        if payload.len() > self.shared.max_frame_bytes {
            return Err(TransportError::FrameTooLarge { len: payload.len(), max: self.shared.max_frame_bytes });
        }
        Ok(())
    }

    fn enqueue(&self, peer: &Peer, channel: u8, payload: Bytes) {
        if let Ok(mut queue) = peer.queue.lock() {
            // Bounded: each pass removes one frame; `check` kept the new one within queue_bytes.
            while queue.frames.len() >= self.shared.queue_frames || queue.bytes.saturating_add(payload.len()) > self.shared.queue_bytes {
                let Some((_, old)) = queue.frames.pop_front() else { break };
                queue.bytes -= old.len();
                peer.frames_dropped.fetch_add(1, Ordering::Relaxed);
            }
            queue.bytes += payload.len();
            queue.frames.push_back((channel, payload));
        }
        peer.queued.notify_one();
    }
}

/// Builds the dialing and accepting TLS configurations (TLS 1.3 only, ring provider, mutual
/// authentication against the cluster CA). Public so tests can build raw peers.
pub fn tls_configs(ca_cert_pem: &str, cert_pem: &str, key_pem: &str) -> Result<(Arc<ClientConfig>, Arc<ServerConfig>), TransportError> {
    let tls = |e: rustls::Error| TransportError::Tls(e.to_string());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(parse_cert(ca_cert_pem, "ca_cert_pem")?).map_err(tls)?;
    let roots = Arc::new(roots);
    let chain = vec![parse_cert(cert_pem, "cert_pem")?];
    let key = parse_key(key_pem)?;

    let client_verifier =
        WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone()).build().map_err(|e| TransportError::Tls(e.to_string()))?;
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_client_cert_verifier(client_verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(tls)?;
    // Links are long-lived and the server never writes application data: no tickets.
    server.send_tls13_tickets = 0;

    let client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(tls)?;
    Ok((Arc::new(client), Arc::new(server)))
}

fn parse_cert(pem: &str, what: &'static str) -> Result<CertificateDer<'static>, TransportError> {
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| TransportError::Pem { what, reason: e.to_string() })
}

fn parse_key(pem: &str) -> Result<PrivateKeyDer<'static>, TransportError> {
    // The parse error can quote key material; do not include it.
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| TransportError::Pem { what: "key_pem", reason: "no usable private key".into() })
}

/// Appends one frame to `out`. The caller has checked `payload.len() <= max_frame_bytes`.
pub fn encode_frame(channel: u8, payload: &[u8], out: &mut Vec<u8>) {
    // Bounded by MAX_FRAME_BYTES_LIMIT via the caller's check, so it fits in u32.
    let len = (payload.len() + 1) as u32;
    out.extend_from_slice(&len.to_be_bytes());
    out.push(channel);
    out.extend_from_slice(payload);
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum ReadFrameError {
    Io(std::io::Error),
    Peer(PeerError),
}

/// Reads one frame: (channel, payload). Allocates only after the length passed the limit.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R, max_frame_bytes: usize) -> Result<(u8, Bytes), ReadFrameError> {
    let mut header = [0u8; HEADER_BYTES];
    reader.read_exact(&mut header).await.map_err(ReadFrameError::Io)?;
    let len = u32::from_be_bytes(header) as usize;
    if len == 0 {
        return Err(ReadFrameError::Peer(PeerError::EmptyFrame));
    }
    if len - 1 > max_frame_bytes {
        return Err(ReadFrameError::Peer(PeerError::OversizeFrame { len: len - 1, max: max_frame_bytes }));
    }
    // Grown as bytes arrive: a peer that announces a large frame and sends it slowly holds
    // only what it sent (plus at most as much again in spare capacity).
    let mut body = BytesMut::with_capacity(len.min(READ_CHUNK));
    while body.len() < len {
        if body.capacity() == body.len() {
            body.reserve((len - body.len()).min(body.len().max(READ_CHUNK)));
        }
        let room = (len - body.len()).min(body.capacity() - body.len());
        let read = (&mut *reader).take(room as u64).read_buf(&mut body).await.map_err(ReadFrameError::Io)?;
        if read == 0 {
            return Err(ReadFrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
    let mut body = body.freeze();
    let payload = body.split_off(1);
    let channel = body.first().copied().unwrap_or(CHANNEL_KEEPALIVE);
    Ok((channel, payload))
}

async fn dial_loop(shared: Arc<Shared>, peer: Arc<Peer>, connector: TlsConnector, backoff_min: Duration, backoff_max: Duration, handshake_timeout: Duration) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut backoff = backoff_min;
    loop {
        if *shutdown.borrow() {
            return;
        }
        match connect(&peer, &connector, handshake_timeout).await {
            Ok(stream) => {
                peer.connects.fetch_add(1, Ordering::Relaxed);
                peer.connected.store(true, Ordering::Relaxed);
                tracing::debug!(from = shared.id, to = peer.id, "connected");
                backoff = backoff_min;
                let result = run_writer(&shared, &peer, stream, &mut shutdown).await;
                peer.connected.store(false, Ordering::Relaxed);
                match result {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(from = shared.id, to = peer.id, error = %e, "connection lost");
                        peer.set_error(format!("send connection: {e}"));
                    }
                }
            }
            Err(e) => {
                tracing::debug!(from = shared.id, to = peer.id, error = %e, "connect failed");
                peer.set_error(format!("connect: {e}"));
            }
        }
        let delay = jitter(backoff);
        backoff = (backoff * 2).min(backoff_max);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// A delay uniform in [d/2, d], so replicas that lost a peer together do not redial in lockstep.
fn jitter(d: Duration) -> Duration {
    use rand::Rng;
    let half = d / 2;
    let extra_nanos = rand::rng().random_range(0..=half.as_nanos().min(u64::MAX as u128) as u64);
    half + Duration::from_nanos(extra_nanos)
}

async fn connect(peer: &Peer, connector: &TlsConnector, handshake_timeout: Duration) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let name = ServerName::try_from(replica_dns_name(peer.id)).map_err(|e| e.to_string())?;
    let attempt = async {
        let tcp = TcpStream::connect(peer.addr).await.map_err(|e| e.to_string())?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        connector.connect(name, tcp).await.map_err(|e| e.to_string())
    };
    let stream = tokio::time::timeout(handshake_timeout, attempt).await.map_err(|_| "handshake timed out".to_string())??;
    // The verifier already checked the name; re-derive the id as the mesh understands it, so a
    // certificate naming several replicas cannot pass.
    let der = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).ok_or_else(|| PeerError::NoCertificate.to_string())?;
    match replica_id_from_cert_der(der) {
        Ok(id) if id == peer.id => Ok(stream),
        Ok(id) => Err(PeerError::WrongReplica { expected: peer.id, got: id }.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Sends queued frames until the connection fails (Err) or the mesh shuts down (Ok).
async fn run_writer<S: AsyncRead + AsyncWrite + Unpin>(shared: &Shared, peer: &Peer, stream: S, shutdown: &mut watch::Receiver<bool>) -> Result<(), String> {
    let (mut read_half, mut write_half) = tokio::io::split(stream);
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut probe = [0u8; 64];
    let keepalive = shared.keepalive.unwrap_or(Duration::from_secs(86_400));
    loop {
        let frames: Vec<(u8, Bytes)> = match peer.queue.lock() {
            Ok(mut queue) => {
                queue.bytes = 0;
                queue.frames.drain(..).collect()
            }
            Err(_) => return Err("send queue poisoned".into()),
        };
        if !frames.is_empty() {
            buf.clear();
            for (channel, payload) in &frames {
                encode_frame(*channel, payload, &mut buf);
            }
            write_half.write_all(&buf).await.map_err(|e| e.to_string())?;
            write_half.flush().await.map_err(|e| e.to_string())?;
            peer.frames_sent.fetch_add(frames.len() as u64, Ordering::Relaxed);
            if buf.capacity() > 4 * 1024 * 1024 {
                buf = Vec::with_capacity(64 * 1024);
            }
            continue;
        }
        tokio::select! {
            _ = peer.queued.notified() => {}
            // The peer never sends on this connection; a read returns only at close or error.
            read = read_half.read(&mut probe) => match read {
                Ok(0) => return Err("closed by peer".into()),
                Ok(_) => return Err("peer sent data on a send-only connection".into()),
                Err(e) => return Err(e.to_string()),
            },
            _ = tokio::time::sleep(keepalive), if shared.keepalive.is_some() => {
                buf.clear();
                encode_frame(CHANNEL_KEEPALIVE, &[], &mut buf);
                write_half.write_all(&buf).await.map_err(|e| e.to_string())?;
                write_half.flush().await.map_err(|e| e.to_string())?;
            }
            _ = shutdown.changed() => {
                let _ = write_half.shutdown().await;
                return Ok(());
            }
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, acceptor: TlsAcceptor, handshake_timeout: Duration) {
    let mut shutdown = shared.shutdown.subscribe();
    // Bounds unauthenticated work: handshakes in progress at once.
    let handshakes = Arc::new(Semaphore::new(4 * shared.peers.len() + 8));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let (tcp, remote) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Typically EMFILE; back off instead of spinning.
                tracing::warn!(id = shared.id, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            tracing::warn!(id = shared.id, %remote, "too many handshakes in progress; dropping");
            continue;
        };
        let shared = shared.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let authenticated = accept_one(&shared, &acceptor, tcp, handshake_timeout).await;
            drop(permit);
            match authenticated {
                Ok((peer, stream)) => run_reader(&shared, &peer, stream).await,
                Err(e) => tracing::info!(id = shared.id, %remote, error = %e, "rejected incoming connection"),
            }
        });
    }
}

async fn accept_one(
    shared: &Shared,
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
    handshake_timeout: Duration,
) -> Result<(Arc<Peer>, tokio_rustls::server::TlsStream<TcpStream>), String> {
    let _ = tcp.set_nodelay(true);
    let stream =
        tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await.map_err(|_| "handshake timed out".to_string())?.map_err(|e| e.to_string())?;
    let der = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).ok_or_else(|| PeerError::NoCertificate.to_string())?;
    let id = replica_id_from_cert_der(der).map_err(|e| e.to_string())?;
    let peer = shared.peers.get(&id).ok_or_else(|| PeerError::NotAPeer(id).to_string())?;
    Ok((peer.clone(), stream))
}

/// Queues one received frame for its channel's consumer, within the peer's byte budget and
/// frame bound, waiting at most [`SUBSCRIBER_WAIT`] for room; false when it was dropped.
async fn deliver_frame(inbox: &PeerInbox, from: u16, payload: Bytes) -> bool {
    let wait = async {
        // Bounded by MAX_FRAME_BYTES_LIMIT, so it fits u32.
        let need = payload.len().clamp(1, inbox.budget_bytes) as u32;
        let permit = match inbox.budget.clone().try_acquire_many_owned(need) {
            Ok(permit) => permit,
            Err(_) => inbox.budget.clone().acquire_many_owned(need).await.ok()?,
        };
        match inbox.tx.try_send((from, payload, permit)) {
            Ok(()) => Some(()),
            Err(mpsc::error::TrySendError::Full(frame)) => inbox.tx.send(frame).await.ok(),
            Err(mpsc::error::TrySendError::Closed(_)) => None,
        }
    };
    matches!(tokio::time::timeout(SUBSCRIBER_WAIT, wait).await, Ok(Some(())))
}

/// Receives frames from `peer` until the connection fails, the peer reconnects, or shutdown.
async fn run_reader<S: AsyncRead + AsyncWrite + Unpin>(shared: &Shared, peer: &Peer, stream: S) {
    let mut generation = peer.incoming_generation.subscribe();
    let mine = {
        let mut mine = 0;
        peer.incoming_generation.send_modify(|g| {
            *g += 1;
            mine = *g;
        });
        generation.borrow_and_update();
        mine
    };
    peer.incoming_connected.store(true, Ordering::Relaxed);
    let mut shutdown = shared.shutdown.subscribe();
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let silence_limit = shared.keepalive.map(|k| k * 3).unwrap_or(Duration::from_secs(86_400 * 365));
    let outcome: Result<(), String> = loop {
        let frame = tokio::select! {
            frame = tokio::time::timeout(silence_limit, read_frame(&mut reader, shared.max_frame_bytes)) => frame,
            _ = generation.changed() => break Ok(()),
            _ = shutdown.changed() => break Ok(()),
        };
        let (channel, payload) = match frame {
            Err(_) => break Err("no frame within three keepalive intervals".into()),
            Ok(Err(ReadFrameError::Io(e))) => break Err(format!("receive connection: {e}")),
            Ok(Err(ReadFrameError::Peer(e))) => {
                tracing::warn!(id = shared.id, peer = peer.id, error = %e, "peer misbehaved; closing");
                break Err(format!("receive connection: {e}"));
            }
            Ok(Ok(frame)) => frame,
        };
        if channel == CHANNEL_KEEPALIVE {
            continue;
        }
        peer.frames_received.fetch_add(1, Ordering::Relaxed);
        let handler = shared.inline.read().ok().and_then(|h| h.get(&channel).cloned());
        if let Some(handler) = handler {
            handler(peer.id, payload);
            continue;
        }
        let subscriber = shared.subscribers.read().ok().and_then(|s| s.get(&channel).and_then(|q| q.get(&peer.id)).cloned());
        let delivered = match subscriber {
            // A busy subscriber slows this connection down (TCP flow control then reaches the
            // sender's queue) rather than losing frames, which the protocols recover only on
            // slow timers; a stuck one loses frames after a bound so other channels move on.
            // Only this peer's connection waits: its queue and byte budget are its own.
            Some(inbox) => deliver_frame(&inbox, peer.id, payload).await,
            None => false,
        };
        if !delivered {
            peer.frames_received_dropped.fetch_add(1, Ordering::Relaxed);
        }
    };
    // Only the newest connection reports the link state.
    if *peer.incoming_generation.borrow() == mine {
        peer.incoming_connected.store(false, Ordering::Relaxed);
    }
    if let Err(e) = outcome {
        peer.set_error(e);
    }
}
