//! The client side of a replica: vouched reads, the gateway, the UDP and TCP listeners, and
//! the metrics and admin endpoint.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use bft::transport::driver::ReplicaHandle;
use mesh::{Mesh, CHANNEL_READS};
use named_glue::forward::Forwarder;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::client::rrl::{Limiter, OrderLimiter};
use crate::config::{GatewayConfig, Settings};
use crate::execution::pending::Pending;
use crate::execution::zoneset::SharedAuth;
use crate::faults::byzantine::Mode;
use crate::front::endpoint;
use crate::front::gateway::Gateway;
use crate::front::listener::{bind_udp, serve_tcp, serve_udp, ClientFilters, TcpLimits};
use crate::ops::metrics::Metrics;
use crate::ops::tasks::Essential;
use crate::reads::read::{LocalReads, ReadCache};
use crate::reads::route::ClientRequest;
use crate::reads::vouched::VouchedReads;
use exec::SignZoneSigner;

/// What the client side reads and answers with.
pub(super) struct Reads {
    pub named: Forwarder,
    pub cache: Arc<ReadCache>,
    pub metrics: Arc<Metrics>,
}

/// Starts vouched reads: probes and barriers travel on the mesh's reads channel and are
/// handled in its reader tasks; the peers' probes are answered whatever this replica's own
/// setting (a gateway with it off sends none). Returns the service if this gateway uses it,
/// and the reads it gives back to be ordered.
pub(super) fn start_vouched(
    s: &Settings,
    reads: &Reads,
    mesh: &Mesh,
    barrier: watch::Receiver<u64>,
    executed: watch::Receiver<u64>,
    tasks: &mut Essential,
) -> Result<(Option<Arc<VouchedReads>>, mpsc::Receiver<ClientRequest>)> {
    let (fallback_tx, fallback_rx) = mpsc::channel(s.client.max_pending.get());
    let (vouched, vouched_task) = VouchedReads::start(
        s.replicas,
        s.faults,
        reads.named.clone(),
        reads.cache.clone(),
        reads.metrics.clone(),
        s.reads.vouch_timeout.clone(),
        crate::reads::vouched::Wiring {
            out: Arc::new(mesh.sender()),
            barrier,
            executed,
            fallback: fallback_tx,
            fault: s.test.byzantine.map(Mode::reads).unwrap_or_default(),
        },
    );
    let inbox = vouched.clone();
    mesh.handle_inline(CHANNEL_READS, Arc::new(move |from, frame: bytes::Bytes| inbox.handle(from, &frame))).context("mesh reads channel")?;
    tasks.spawn("vouched-read timeouts", vouched_task);
    Ok((s.reads.vouched().then_some(vouched), fallback_rx))
}

/// Starts the gateway: it numbers this replica's clients' requests and submits them to the
/// ordering (and renumbers those the ordering refused). Returns it, with the queue the
/// listeners hand it requests on.
pub(super) fn start_gateway(
    cfg: &GatewayConfig,
    reads: &Reads,
    pending: Arc<Pending>,
    handle: &mut ReplicaHandle,
    fallback: mpsc::Receiver<ClientRequest>,
    tasks: &mut Essential,
) -> (Arc<Gateway>, mpsc::Sender<ClientRequest>) {
    let incarnation = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
    let gateway = Arc::new(Gateway {
        id: cfg.id,
        incarnation: AtomicU64::new(incarnation),
        pending,
        submit: handle.submit.clone(),
        named: reads.named.clone(),
        cache: reads.cache.clone(),
        metrics: reads.metrics.clone(),
        client_timeout: cfg.client_timeout,
        next_number: AtomicU64::new(0),
    });
    let (client_tx, client_rx) = mpsc::channel(cfg.max_pending);
    tasks.spawn("gateway", gateway.clone().run(client_rx, fallback));
    if let Some(refused) = handle.refused.take() {
        tasks.spawn("gateway renumbering", gateway.clone().renumber_refused(refused));
    }
    (gateway, client_tx)
}

/// What the listeners check before a request reaches the gateway, and how they answer.
pub(super) fn client_filters(s: &Settings, auth: &Arc<SharedAuth>, reads: &Reads, vouched: Option<Arc<VouchedReads>>) -> ClientFilters {
    let early_read = crate::faults::seeded_bug::active(s.id) == Some(crate::faults::seeded_bug::Bug::EarlyRead);
    ClientFilters {
        // The fault-injection switch leaves this replica ordering whatever it gets.
        auth: (!s.auth.skip_precheck).then(|| auth.clone()),
        rrl: Limiter::new(s.rrl.clone()).map(Arc::new),
        order_limit: OrderLimiter::new(&s.order_limit).map(Arc::new),
        lie: s.test.byzantine == Some(Mode::WrongAnswers),
        local_reads: (s.reads.local() || early_read).then(|| LocalReads::new(reads.cache.clone(), reads.named.clone())),
        vouched,
    }
}

/// Binds the client address (UDP and TCP) and starts a listener on each.
pub(super) async fn start_listeners(
    cfg: &GatewayConfig,
    access: exec::access::AccessSection,
    filters: ClientFilters,
    to_gateway: mpsc::Sender<ClientRequest>,
    metrics: &Arc<Metrics>,
    tasks: &mut Essential,
) -> Result<()> {
    let udp = Arc::new(bind_udp(cfg.client, cfg.udp_receive_buffer).with_context(|| format!("binding UDP {}", cfg.client))?);
    let tcp = TcpListener::bind(cfg.client).await.with_context(|| format!("binding TCP {}", cfg.client))?;
    let (access, filters) = (Arc::new(access), Arc::new(filters));
    tasks.spawn("UDP listener", serve_udp(udp, to_gateway.clone(), metrics.clone(), access.clone(), filters.clone()));
    let limits =
        TcpLimits { idle: cfg.tcp_idle, max_connections: cfg.tcp_max_connections, max_pipelined: cfg.tcp_max_pipelined, write_timeout: cfg.tcp_write_timeout };
    tasks.spawn("TCP listener", serve_tcp(tcp, to_gateway, limits, metrics.clone(), access, filters));
    Ok(())
}

/// The metrics and admin endpoint's settings.
pub(super) struct EndpointConfig {
    pub listen: SocketAddr,
    /// Where the admin token is written for `sdns sign-zone` and `sdns zone`.
    pub token_file: PathBuf,
    /// The replica's directory (its file's), where the dealt `zones/<zone>/` are.
    pub dealt_dir: PathBuf,
}

impl EndpointConfig {
    /// `None` when `metrics.listen` is not set.
    pub fn from_settings(s: &Settings) -> Option<EndpointConfig> {
        let listen = s.metrics.listen?;
        let dealt_dir = std::path::absolute(&s.path).ok().and_then(|p| p.parent().map(PathBuf::from)).unwrap_or_default();
        Some(EndpointConfig { listen, token_file: s.state_dir.join(endpoint::ADMIN_TOKEN_FILE), dealt_dir })
    }
}

/// Serves metrics, `/status` and the admin requests (`sdns sign-zone`, `sdns zone`) if configured.
pub(super) fn start_endpoint(
    cfg: Option<EndpointConfig>,
    zones: Vec<String>,
    signers: Vec<Arc<SignZoneSigner>>,
    gateway: &Arc<Gateway>,
    metrics: &Arc<Metrics>,
    tasks: &mut Essential,
) -> Result<()> {
    let Some(cfg) = cfg else { return Ok(()) };
    let token = endpoint::write_admin_token(&cfg.token_file).context("writing the admin token")?;
    let admin = Arc::new(endpoint::Admin { gateway: gateway.clone(), token, signers: zones.into_iter().zip(signers).collect(), dealt_dir: cfg.dealt_dir });
    tasks.spawn("metrics and admin endpoint", endpoint::serve(cfg.listen, metrics.clone(), Some(admin)));
    Ok(())
}
