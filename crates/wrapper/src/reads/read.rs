//! The one way a read is answered from the local named: ordered reads (executor), local
//! reads (`reads = "local"`, listeners: [`LocalReads`]) and voting reads (voting_read) all
//! go through the cache lookup and [`forward_read`] here, and vouched reads (`crate::reads::vouched`,
//! at the gateway that was asked) through the cache's keyed lookup and
//! [`forward_answer`], the same steps returning the answer instead of sending it, so the paths
//! cannot drift apart in what a client receives.
//!
//! What the client gets, by what named did:
//! - named answered: its answer as it is (TC and all);
//! - named stayed silent for the whole wait: silence too. On loopback silence is named's
//!   choice for those bytes (as for some malformed requests), and over UDP it is also how
//!   a stopped named looks (refused sends are waited out), so the client retries;
//! - anything else (TCP connection refused, named's answer undecodable, ...): the SERVFAIL
//!   named would give, shaped as named's (`answer`).
//!
//! The answer is handed over without waiting for the client (bounded queues drop).
//!
//! Answers named gave are kept in a [`ReadCache`] (see there for why a cached answer is
//! the one named would give at that point of the log).

use std::sync::Arc;

use named_glue::forward::{ForwardError, Forwarder, UdpQuery};
use tokio::sync::Semaphore;
use tracing::debug;

pub use crate::reads::read_cache::{Fill, Keyed, Lookup, ReadCache};

use crate::client::reply::{Delivery, ReplyTo};
use crate::ops::metrics::Metrics;

/// Answers `message` (a query, never a transfer) from the cache, or asks named over the
/// client's transport, and hands what the client should get to `reply`.
pub async fn answer_read(named: &Forwarder, cache: &ReadCache, message: &[u8], tcp: bool, reply: &ReplyTo, metrics: &Metrics) {
    match cache.lookup(message, tcp) {
        Lookup::Hit(answer) => {
            metrics.inc_read_cache(true);
            deliver(reply, answer, metrics)
        }
        Lookup::Miss(fill) => forward_read(named, cache, fill, message, tcp, reply, metrics).await,
    }
}

/// The cache missed: asks named, keeps its answer when `fill` allows, answers the client.
pub async fn forward_read(named: &Forwarder, cache: &ReadCache, fill: Option<Fill>, message: &[u8], tcp: bool, reply: &ReplyTo, metrics: &Metrics) {
    let Some(answer) = forward_answer(named, cache, fill, message, tcp, metrics).await else { return };
    deliver(reply, answer, metrics);
}

/// What [`forward_read`] would hand the client, returned instead; `None`: no answer.
pub async fn forward_answer(named: &Forwarder, cache: &ReadCache, fill: Option<Fill>, message: &[u8], tcp: bool, metrics: &Metrics) -> Option<Vec<u8>> {
    vouched_answer(named, cache, fill, message, tcp, None, metrics).await
}

/// [`forward_answer`] for a UDP query to named that may already be begun (`begun`, from
/// [`Forwarder::start_udp`] with the same message: named works on it while the caller goes on).
pub async fn vouched_answer(
    named: &Forwarder,
    cache: &ReadCache,
    fill: Option<Fill>,
    message: &[u8],
    tcp: bool,
    begun: Option<UdpQuery>,
    metrics: &Metrics,
) -> Option<Vec<u8>> {
    let result = match begun {
        Some(query) => named.finish_udp(query, message).await,
        None if tcp => named.forward_tcp(message).await,
        None => named.forward_udp(message).await,
    };
    took(cache, fill, message, result, metrics)
}

/// named's result for a read: counted, kept when `fill` allows, turned into what the client
/// gets.
fn took(cache: &ReadCache, fill: Option<Fill>, message: &[u8], result: Result<Vec<u8>, ForwardError>, metrics: &Metrics) -> Option<Vec<u8>> {
    metrics.inc_read_cache(false);
    if result.as_ref().is_err_and(|e| !matches!(e, ForwardError::Timeout(_))) {
        metrics.inc_execute_error();
    }
    if let (Some(fill), Ok(answer)) = (fill, &result) {
        cache.fill(fill, answer);
    }
    client_answer(message, result)
}

/// `reads = "local"`: the listeners answer every read themselves, from the cache or from
/// named, without the hop through the gateway task (each hop is a task wake-up, and the
/// gateway would classify and look the request up again).
pub struct LocalReads {
    pub cache: Arc<ReadCache>,
    pub named: Forwarder,
    /// Reads waiting for named; beyond the bound a read is dropped (the client retries),
    /// so a flood of distinct questions holds at most this many tasks.
    in_flight: Arc<Semaphore>,
}

/// Local reads waiting for named at once, per replica process.
const LOCAL_IN_FLIGHT: usize = 1024;

impl LocalReads {
    pub fn new(cache: Arc<ReadCache>, named: Forwarder) -> Self {
        LocalReads { cache, named, in_flight: Arc::new(Semaphore::new(LOCAL_IN_FLIGHT)) }
    }

    /// Answers a read (a query, never a transfer) without waiting: a hit at once, a miss
    /// by a task of its own.
    pub fn answer(&self, message: Vec<u8>, tcp: bool, reply: ReplyTo, metrics: &Arc<Metrics>) {
        metrics.inc_request(exec::classify::Kind::Read);
        let fill = match self.cache.lookup(&message, tcp) {
            Lookup::Hit(answer) => {
                metrics.inc_read_cache(true);
                return deliver(&reply, answer, metrics);
            }
            Lookup::Miss(fill) => fill,
        };
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            metrics.inc_dropped("local_reads_full");
            return;
        };
        let (named, cache, metrics) = (self.named.clone(), self.cache.clone(), metrics.clone());
        tokio::spawn(async move {
            let _permit = permit;
            forward_read(&named, &cache, fill, &message, tcp, &reply, &metrics).await
        });
    }
}

/// Hands an answer over without waiting for the client.
pub fn deliver(reply: &ReplyTo, answer: Vec<u8>, metrics: &Metrics) {
    if let Delivery::Dropped(why) = reply.try_send(answer) {
        metrics.inc_dropped(why);
    }
}

/// What the client gets for `request` given named's result; `None`: no answer.
pub fn client_answer(request: &[u8], result: Result<Vec<u8>, ForwardError>) -> Option<Vec<u8>> {
    match result {
        Ok(answer) => Some(answer),
        Err(ForwardError::Timeout(_)) => {
            debug!("named left a read unanswered");
            None
        }
        Err(e) => {
            debug!(error = %e, "read failed");
            exec::answer::error_answer(request, exec::answer::RCODE_SERVFAIL)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec::answer::RCODE_SERVFAIL;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::net::UdpSocket;

    fn query(id: u16) -> Vec<u8> {
        let name = hickory_proto::rr::Name::from_ascii("www.example.test.").unwrap();
        named_glue::forward::build_query(id, &name, hickory_proto::rr::RecordType::A).unwrap()
    }

    fn short(addr: SocketAddr) -> Forwarder {
        Forwarder { udp_timeout: Duration::from_millis(100), udp_attempts: 2, tcp_timeout: Duration::from_millis(300), ..Forwarder::new(addr) }
    }

    /// A client socket and the reply handle that answers it.
    async fn client() -> (UdpSocket, ReplyTo) {
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let server = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let reply = ReplyTo::Udp { socket: server, peer: client.local_addr().unwrap(), rrl: None, lie: false };
        (client, reply)
    }

    async fn received(client: &UdpSocket, within: Duration) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 4096];
        match tokio::time::timeout(within, client.recv(&mut buf)).await {
            Ok(Ok(n)) => Some(buf[..n].to_vec()),
            _ => None,
        }
    }

    #[test]
    fn outcome_by_what_named_did() {
        let q = query(7);
        assert_eq!(client_answer(&q, Ok(vec![1, 2, 3])), Some(vec![1, 2, 3]));
        assert_eq!(client_answer(&q, Err(ForwardError::Timeout(Duration::from_secs(1)))), None);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let servfail = client_answer(&q, Err(ForwardError::Io(refused))).expect("SERVFAIL");
        assert_eq!(&servfail[..2], &7u16.to_be_bytes());
        assert_eq!(servfail[3] & 0x0f, RCODE_SERVFAIL);
        assert_eq!(client_answer(&q, Err(ForwardError::Closed)).map(|a| a[3] & 0x0f), Some(RCODE_SERVFAIL));
    }

    /// A server that reads every request and never answers: the client hears nothing,
    /// on every path (formerly the local-read path answered SERVFAIL here).
    #[tokio::test]
    async fn silence_from_named_is_silence_to_the_client() {
        let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let named = short(silent.local_addr().unwrap());
        let metrics = Metrics::new(0);
        let (client, reply) = client().await;
        answer_read(&named, &ReadCache::default(), &query(9), false, &reply, &metrics).await;
        let mut buf = [0u8; 512];
        assert!(silent.try_recv(&mut buf).is_ok(), "the query reached the server");
        assert_eq!(received(&client, Duration::from_millis(300)).await, None);
    }

    /// named answering: its bytes reach the client unchanged.
    #[tokio::test]
    async fn named_answer_is_relayed_as_it_is() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let named = short(server.local_addr().unwrap());
        let echo = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            let (n, from) = server.recv_from(&mut buf).await.unwrap();
            let mut answer = buf[..n].to_vec();
            answer[2] |= 0x84; // QR, AA
            answer.extend_from_slice(b"tail bytes named chose");
            server.send_to(&answer, from).await.unwrap();
            answer
        });
        let metrics = Metrics::new(0);
        let (client, reply) = client().await;
        answer_read(&named, &ReadCache::default(), &query(11), false, &reply, &metrics).await;
        let sent = echo.await.unwrap();
        assert_eq!(received(&client, Duration::from_secs(2)).await, Some(sent));
    }

    /// No named listening over TCP: the SERVFAIL named would give.
    #[tokio::test]
    async fn unreachable_named_over_tcp_gets_servfail() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let named = short(port);
        let metrics = Metrics::new(0);
        let (client, reply) = client().await;
        answer_read(&named, &ReadCache::default(), &query(13), true, &reply, &metrics).await;
        let answer = received(&client, Duration::from_secs(2)).await.expect("an answer");
        assert_eq!(&answer[..2], &13u16.to_be_bytes());
        assert_eq!(answer[3] & 0x0f, RCODE_SERVFAIL);
    }
}
