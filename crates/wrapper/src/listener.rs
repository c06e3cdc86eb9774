//! Client-facing listeners: DNS over UDP and TCP on the replica's public address.
//!
//! A listener only frames messages and classifies them; anything to be ordered goes
//! to the gateway (gateway.rs) with a way back to the client. Answers the classifier
//! produces itself (REFUSED, FORMERR) go straight back without ordering.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{mpsc, Semaphore};
use tracing::{debug, warn};

use crate::auth::rrl::Limiter;
use crate::auth::ClientFilters;
use crate::classify::{classify, precheck, Verdict};
use crate::metrics::Metrics;

/// Where an answer for a client goes.
#[derive(Clone, Debug)]
pub enum ReplyTo {
    /// `rrl`: response rate limiting for this socket's answers, when configured.
    Udp { socket: Arc<UdpSocket>, peer: SocketAddr, rrl: Option<Arc<Limiter>> },
    /// The connection's writer task; a closed connection drops answers silently.
    Tcp { writer: mpsc::Sender<Vec<u8>> },
}

impl ReplyTo {
    pub async fn send(&self, answer: Vec<u8>) {
        match self {
            ReplyTo::Udp { socket, peer, rrl } => {
                let answer = match rrl {
                    Some(limiter) => match limiter.filter(peer.ip(), answer) {
                        Some(a) => a,
                        None => return, // rate-limited: dropped
                    },
                    None => answer,
                };
                if let Err(e) = socket.send_to(&answer, peer).await {
                    debug!(%peer, error = %e, "udp answer not sent");
                }
            }
            ReplyTo::Tcp { writer } => {
                let _ = writer.send(answer).await;
            }
        }
    }

    pub fn is_tcp(&self) -> bool {
        matches!(self, ReplyTo::Tcp { .. })
    }
}

/// A client message that passed the classifier, to be ordered.
#[derive(Debug)]
pub struct ClientRequest {
    pub bytes: Vec<u8>,
    pub tcp: bool,
    pub reply: ReplyTo,
}

/// Largest DNS message over UDP we accept (EDNS allows up to 65535).
const UDP_MAX: usize = 65_535;

pub async fn serve_udp(socket: Arc<UdpSocket>, to_gateway: mpsc::Sender<ClientRequest>, metrics: Arc<Metrics>, filters: Arc<ClientFilters>) {
    let mut buf = vec![0u8; UDP_MAX];
    loop {
        let (len, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                // ICMP errors from earlier sends surface here on Linux; keep serving.
                debug!(error = %e, "udp recv");
                continue;
            }
        };
        let bytes = buf[..len].to_vec();
        let reply = ReplyTo::Udp { socket: socket.clone(), peer, rrl: filters.rrl.clone() };
        dispatch(bytes, false, reply, &to_gateway, &metrics, &filters).await;
    }
}

async fn dispatch(bytes: Vec<u8>, tcp: bool, reply: ReplyTo, to_gateway: &mpsc::Sender<ClientRequest>, metrics: &Metrics, filters: &ClientFilters) {
    match precheck(classify(&bytes, tcp), &bytes, filters.auth.as_deref()) {
        Verdict::Order(_) => {
            // The gateway's queue is bounded; when full the client's retry will do.
            if to_gateway.try_send(ClientRequest { bytes, tcp, reply }).is_err() {
                metrics.inc_dropped("gateway_full");
            }
        }
        Verdict::Answer(answer) => {
            metrics.inc_refused();
            reply.send(answer).await;
        }
        Verdict::Drop(why) => {
            metrics.inc_dropped(why);
        }
    }
}

pub struct TcpLimits {
    pub idle: Duration,
    pub max_connections: usize,
}

pub async fn serve_tcp(listener: TcpListener, to_gateway: mpsc::Sender<ClientRequest>, limits: TcpLimits, metrics: Arc<Metrics>, filters: Arc<ClientFilters>) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "tcp accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            metrics.inc_dropped("tcp_connection_limit");
            continue; // dropping the stream closes it
        };
        let to_gateway = to_gateway.clone();
        let metrics = metrics.clone();
        let filters = filters.clone();
        let idle = limits.idle;
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = serve_connection(stream, to_gateway, idle, metrics, filters).await {
                debug!(%peer, error = %e, "tcp connection ended");
            }
        });
    }
}

/// One TCP connection: several messages, answers in completion order (RFC 7766
/// allows that; clients match them by message id), closed when idle.
async fn serve_connection(stream: TcpStream, to_gateway: mpsc::Sender<ClientRequest>, idle: Duration, metrics: Arc<Metrics>, filters: Arc<ClientFilters>) -> std::io::Result<()> {
    let (mut reader, mut writer) = stream.into_split();
    let (answers_tx, mut answers_rx) = mpsc::channel::<Vec<u8>>(64);
    let write_task = tokio::spawn(async move {
        while let Some(answer) = answers_rx.recv().await {
            let Ok(len) = u16::try_from(answer.len()) else { continue };
            let mut framed = Vec::with_capacity(answer.len() + 2);
            framed.extend_from_slice(&len.to_be_bytes());
            framed.extend_from_slice(&answer);
            if writer.write_all(&framed).await.is_err() {
                break;
            }
        }
    });
    loop {
        let mut len_bytes = [0u8; 2];
        match tokio::time::timeout(idle, reader.read_exact(&mut len_bytes)).await {
            Err(_) | Ok(Err(_)) => break, // idle, or closed
            Ok(Ok(_)) => {}
        }
        let len = usize::from(u16::from_be_bytes(len_bytes));
        let mut bytes = vec![0u8; len];
        match tokio::time::timeout(idle, reader.read_exact(&mut bytes)).await {
            Err(_) | Ok(Err(_)) => break,
            Ok(Ok(_)) => {}
        }
        dispatch(bytes, true, ReplyTo::Tcp { writer: answers_tx.clone() }, &to_gateway, &metrics, &filters).await;
    }
    drop(answers_tx);
    // Let answers still in flight (held by the gateway) drain, bounded by the idle time.
    let _ = tokio::time::timeout(idle, write_task).await;
    Ok(())
}
