//! The way back to a client: an answer handed to a UDP socket, a TCP connection's writer,
//! or a channel inside this process, without waiting for the client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tracing::debug;

use crate::client::rrl::Limiter;

/// One answer on its way to a TCP connection's writer. It holds the request's
/// pipelining slot until it is written (or dropped), so a connection whose client does
/// not read stops being read.
#[derive(Debug)]
pub struct Outgoing {
    pub bytes: Vec<u8>,
    _slot: Option<Arc<OwnedSemaphorePermit>>,
}

/// Where an answer for a client goes. Sending never waits for the client: a full queue
/// or socket buffer drops the answer (the client retries).
#[derive(Clone, Debug)]
pub enum ReplyTo {
    /// `rrl`: response rate limiting for this socket's answers, when configured.
    /// `lie`: the Byzantine mode wrong-answers (test clusters only).
    Udp { socket: Arc<UdpSocket>, peer: SocketAddr, rrl: Option<Arc<Limiter>>, lie: bool },
    /// The connection's writer task (bounded queue); a closed connection drops answers.
    /// `slot` is the request's pipelining slot on that connection.
    Tcp { writer: mpsc::Sender<Outgoing>, slot: Option<Arc<OwnedSemaphorePermit>> },
    /// A caller inside this process (the admin endpoint, the re-sign timer, the sign-zone
    /// finish voter) waiting for the outcome of what it had ordered.
    Internal { writer: mpsc::Sender<Outgoing> },
}

/// What became of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    Sent,
    /// Dropped, and why (a metrics label).
    Dropped(&'static str),
}

impl ReplyTo {
    /// A reply channel inside this process (the admin endpoint, the re-sign timer).
    pub fn internal() -> (ReplyTo, mpsc::Receiver<Outgoing>) {
        let (writer, rx) = mpsc::channel(1);
        (ReplyTo::Internal { writer }, rx)
    }

    /// Hands the answer over without waiting: a UDP send that would block, a full
    /// answer queue or a closed connection drops it.
    pub fn try_send(&self, answer: Vec<u8>) -> Delivery {
        match self {
            ReplyTo::Udp { socket, peer, rrl, lie } => match match rrl {
                Some(limiter) if *lie => limiter.filter(peer.ip(), crate::faults::byzantine::lie(answer)),
                None if *lie => Some(crate::faults::byzantine::lie(answer)),
                Some(limiter) => limiter.filter(peer.ip(), answer),
                None => Some(answer),
            } {
                // Rate-limited (BIND's RRL): dropped, or a truncated "slip" answer sent instead.
                None => Delivery::Dropped("rate_limited"),
                Some(answer) => match socket.try_send_to(&answer, *peer) {
                    Ok(_) => Delivery::Sent,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Delivery::Dropped("udp_send_would_block"),
                    Err(e) => {
                        debug!(%peer, error = %e, "udp answer not sent");
                        Delivery::Dropped("udp_send_error")
                    }
                },
            },
            ReplyTo::Tcp { writer, slot } => queue(writer, Outgoing { bytes: answer, _slot: slot.clone() }),
            ReplyTo::Internal { writer } => queue(writer, Outgoing { bytes: answer, _slot: None }),
        }
    }

    /// [`Self::try_send`] for callers that do not count drops. Never waits for the client.
    pub async fn send(&self, answer: Vec<u8>) {
        if let Delivery::Dropped(why) = self.try_send(answer) {
            debug!(why, "answer dropped");
        }
    }

    /// Waits up to `within` for room in a TCP connection's queue (the later messages of
    /// a zone transfer, sent by a task of their own); UDP as [`Self::try_send`].
    pub async fn send_within(&self, answer: Vec<u8>, within: Duration) -> Delivery {
        match self {
            ReplyTo::Udp { .. } => self.try_send(answer),
            ReplyTo::Tcp { writer, slot } => match writer.send_timeout(Outgoing { bytes: answer, _slot: slot.clone() }, within).await {
                Ok(()) => Delivery::Sent,
                Err(mpsc::error::SendTimeoutError::Timeout(_)) => Delivery::Dropped("answer_queue_full"),
                Err(mpsc::error::SendTimeoutError::Closed(_)) => Delivery::Dropped("connection_closed"),
            },
            ReplyTo::Internal { .. } => self.try_send(answer),
        }
    }

    pub fn is_tcp(&self) -> bool {
        matches!(self, ReplyTo::Tcp { .. })
    }
}

/// Hands an answer to a bounded queue without waiting.
fn queue(writer: &mpsc::Sender<Outgoing>, answer: Outgoing) -> Delivery {
    match writer.try_send(answer) {
        Ok(()) => Delivery::Sent,
        Err(mpsc::error::TrySendError::Full(_)) => Delivery::Dropped("answer_queue_full"),
        Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Dropped("connection_closed"),
    }
}
