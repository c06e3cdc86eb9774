//! Forwarding DNS messages to the local named, over UDP or TCP, and zone
//! transfers as a stream of messages. The client's bytes go to named
//! unchanged and named's answer comes back as it is: over UDP that includes
//! named's truncation to the size the client advertised (TC set), which the
//! client resolves by asking again over TCP itself. Transfer messages are
//! relayed byte for byte and walked with [`crate::rrwire`], so a record that
//! a full decoder rejects cannot break a transfer.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Header, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

use crate::rrwire::{RawMessage, RawRecord, TYPE_IXFR};
use dnswire::framing;
use hickory_proto::serialize::binary::BinDecodable;
use tokio::net::{TcpStream, UdpSocket};

/// Largest UDP answer accepted (EDNS maximum).
const MAX_UDP: usize = 65_535;
/// Bound on messages in one zone transfer.
const MAX_AXFR_MESSAGES: u32 = 1_000_000;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("no answer from named within {0:?}")]
    Timeout(Duration),
    #[error("request is not a DNS message: {0}")]
    BadRequest(String),
    #[error("named sent an undecodable message: {0}")]
    BadAnswer(String),
    #[error("message of {0} bytes does not fit TCP framing")]
    TooLarge(usize),
    #[error("named closed the connection mid-transfer")]
    Closed,
    #[error("zone transfer exceeded {0} messages")]
    TransferTooLong(u32),
}

impl ForwardError {
    /// Whether the local named (or the path to it) failed and the same bytes may well succeed
    /// later: refused, reset or closed connections, timeouts, an answer named garbled. The
    /// rest (a request too short for a header, or too long for TCP framing) is a function of
    /// the bytes alone: sending them again fails again, on every replica alike.
    pub fn is_transient(&self) -> bool {
        match self {
            ForwardError::Io(_) | ForwardError::Timeout(_) | ForwardError::Closed | ForwardError::BadAnswer(_) => true,
            ForwardError::BadRequest(_) | ForwardError::TooLarge(_) | ForwardError::TransferTooLong(_) => false,
        }
    }
}

/// Connected UDP sockets to named with no query outstanding, each with its receive
/// buffer, reused across queries: a socket per query costs socket, bind, connect,
/// close and two epoll registrations, a fresh 64 KiB buffer besides. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct UdpPool(std::sync::Arc<std::sync::Mutex<Vec<Pooled>>>);

/// An idle socket and its receive buffer.
type Pooled = (UdpSocket, Vec<u8>);

/// Idle sockets kept at most (more may be open while queries are in flight).
const UDP_POOL_MAX: usize = 64;

impl UdpPool {
    fn take(&self) -> Option<Pooled> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn put(&self, socket: UdpSocket, buf: Vec<u8>) {
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < UDP_POOL_MAX {
            idle.push((socket, buf));
        }
    }

    /// Idle sockets now.
    pub fn idle(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A UDP query to named begun by [`Forwarder::start_udp`]: a pooled socket, and whether the
/// first attempt is already sent.
#[derive(Debug)]
pub struct UdpQuery {
    pooled: Option<Pooled>,
    sent: bool,
}

impl UdpQuery {
    /// Whether the first attempt went out when the query was begun.
    pub fn sent(&self) -> bool {
        self.sent
    }
}

/// Forwards messages to one named.
#[derive(Debug, Clone)]
pub struct Forwarder {
    pub addr: SocketAddr,
    /// Wait per UDP attempt.
    pub udp_timeout: Duration,
    /// UDP attempts before giving up.
    pub udp_attempts: u32,
    /// Wait for each TCP read or write.
    pub tcp_timeout: Duration,
    /// Deadline for a whole zone transfer, however fast named trickles it.
    pub transfer_timeout: Duration,
    pub udp_pool: UdpPool,
}

fn header_of(bytes: &[u8]) -> Result<Header, String> {
    let head = bytes.get(..12).ok_or_else(|| format!("{} bytes, shorter than a header", bytes.len()))?;
    Header::from_bytes(head).map_err(|e| e.to_string())
}

impl Forwarder {
    pub fn new(addr: SocketAddr) -> Self {
        Forwarder {
            addr,
            udp_timeout: Duration::from_millis(1500),
            udp_attempts: 3,
            tcp_timeout: Duration::from_secs(10),
            transfer_timeout: Duration::from_secs(60),
            udp_pool: UdpPool::default(),
        }
    }

    /// Forwards over UDP and returns named's answer as it is (TC included).
    pub async fn forward_udp(&self, request: &[u8]) -> Result<Vec<u8>, ForwardError> {
        self.finish_udp(self.start_udp(request), request).await
    }

    /// Sends the first attempt of a UDP query at once when a pooled socket can take it
    /// without waiting, so that named works on it while the caller goes on (a read probe
    /// that arrived in a connection's reader task, say); [`Self::finish_udp`] with the same
    /// request waits for the answer, sending first what could not be sent here. Never waits.
    pub fn start_udp(&self, request: &[u8]) -> UdpQuery {
        let pooled = self.udp_pool.take();
        let sent = match &pooled {
            // `Ok` of a shorter length cannot happen for a datagram; count it as not sent.
            Some((socket, _)) if header_of(request).is_ok() => socket.try_send(request).is_ok_and(|n| n == request.len()),
            _ => false,
        };
        UdpQuery { pooled, sent }
    }

    /// Named's answer to a query begun with [`Self::start_udp`] (`request` is the same).
    pub async fn finish_udp(&self, query: UdpQuery, request: &[u8]) -> Result<Vec<u8>, ForwardError> {
        let id = header_of(request).map_err(ForwardError::BadRequest)?.id;
        let UdpQuery { pooled, mut sent } = query;
        let (socket, mut buf) = match pooled {
            Some(pooled) => pooled,
            None => (self.udp_socket().await?, vec![0u8; MAX_UDP]),
        };
        for attempt in 0..self.udp_attempts.max(1) {
            if !std::mem::take(&mut sent) {
                socket.send(request).await?;
            }
            let deadline = tokio::time::Instant::now() + self.udp_timeout;
            loop {
                let n = match tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
                    Err(_) => break,
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        // named not (yet) listening: wait out this attempt.
                        tokio::time::sleep_until(deadline).await;
                        break;
                    }
                    Ok(r) => r?,
                };
                let answer = buf.get(..n).unwrap_or_default();
                match header_of(answer) {
                    Ok(h) if h.id == id && h.message_type == MessageType::Response => {
                        let answer = answer.to_vec();
                        // Answered at the first attempt: nothing more can arrive for this
                        // query, so the socket is clean for the next. After a resend a
                        // late answer could still come; that socket is closed instead.
                        if attempt == 0 {
                            self.udp_pool.put(socket, buf);
                        }
                        return Ok(answer);
                    }
                    // A late answer to an earlier attempt has the same id;
                    // anything else is noise.
                    _ => continue,
                }
            }
        }
        Err(ForwardError::Timeout(self.udp_timeout * self.udp_attempts.max(1)))
    }

    async fn udp_socket(&self) -> Result<UdpSocket, ForwardError> {
        let bind: SocketAddr = if self.addr.is_ipv4() { SocketAddr::from(([127, 0, 0, 1], 0)) } else { SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0)) };
        let socket = UdpSocket::bind(bind).await?;
        socket.connect(self.addr).await?;
        Ok(socket)
    }

    async fn connect(&self) -> Result<TcpStream, ForwardError> {
        tokio::time::timeout(self.tcp_timeout, TcpStream::connect(self.addr))
            .await
            .map_err(|_| ForwardError::Timeout(self.tcp_timeout))?
            .map_err(ForwardError::Io)
    }

    /// Forwards over TCP (2-byte length framing) and returns one answer.
    pub async fn forward_tcp(&self, request: &[u8]) -> Result<Vec<u8>, ForwardError> {
        let id = header_of(request).map_err(ForwardError::BadRequest)?.id;
        let mut stream = self.connect().await?;
        write_framed(&mut stream, request, self.tcp_timeout).await?;
        loop {
            let answer = read_framed(&mut stream, self.tcp_timeout).await?.ok_or(ForwardError::Closed)?;
            let h = header_of(&answer).map_err(ForwardError::BadAnswer)?;
            if h.id == id {
                return Ok(answer);
            }
        }
    }

    /// Starts a zone transfer (the request is an AXFR or IXFR query) and
    /// returns the answer messages as a stream, which ends where the protocol
    /// says (see [`TransferEnd`]) or at the transfer's deadline.
    pub async fn axfr(&self, request: &[u8]) -> Result<AxfrStream, ForwardError> {
        let deadline = tokio::time::Instant::now() + self.transfer_timeout;
        let parsed = RawMessage::parse(request).map_err(|e| ForwardError::BadRequest(e.to_string()))?;
        let end = TransferEnd::for_request(&parsed);
        let mut stream = tokio::time::timeout_at(deadline, self.connect()).await.map_err(|_| ForwardError::Timeout(self.transfer_timeout))??;
        write_framed(&mut stream, request, self.tcp_timeout.min(self.transfer_timeout)).await?;
        Ok(AxfrStream { stream, id: parsed.header.id, timeout: self.tcp_timeout, deadline, total: self.transfer_timeout, end, messages: 0, done: false })
    }
}

/// Where a transfer's answer stream ends (RFC 5936 for AXFR, RFC 1995 for IXFR),
/// fed the answer records in order.
#[derive(Debug, Clone)]
pub struct TransferEnd {
    /// The IXFR request's serial (from its authority SOA); `None` for AXFR.
    ixfr_serial: Option<u32>,
    /// The first record's serial: the server's current version.
    first: Option<u32>,
    /// Records seen so far.
    records: u64,
    /// IXFR framing: SOAs seen after the first (odd ones open a deletion part).
    incremental_soas: Option<u64>,
    finished: bool,
}

impl TransferEnd {
    pub fn for_request(request: &RawMessage) -> Self {
        let ixfr = request.questions.first().is_some_and(|q| q.qtype == TYPE_IXFR);
        let ixfr_serial = if ixfr { request.authorities.iter().find_map(|r| r.soa_serial()) } else { None };
        TransferEnd { ixfr_serial, first: None, records: 0, incremental_soas: None, finished: false }
    }

    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Takes one answer message; `Err` when it cannot belong to the transfer.
    pub fn message(&mut self, m: &RawMessage) -> Result<(), String> {
        if m.header.rcode() != 0 || m.answers.is_empty() {
            // An error (REFUSED, NOTAUTH, ...) or an empty answer is the whole reply.
            self.finished = true;
            return Ok(());
        }
        let first_message = self.records == 0;
        for r in &m.answers {
            if self.finished {
                return Err("records after the transfer's closing SOA".into());
            }
            self.record(r)?;
        }
        // RFC 1995 section 4: an IXFR answered by one SOA alone means the client is
        // up to date (or the server has nothing newer).
        if first_message && m.answers.len() == 1 && self.ixfr_serial.is_some() {
            self.finished = true;
        }
        Ok(())
    }

    fn record(&mut self, r: &RawRecord) -> Result<(), String> {
        self.records += 1;
        let serial = r.soa_serial();
        let Some(current) = self.first else {
            self.first = Some(serial.ok_or("a transfer must open with the zone's SOA")?);
            return Ok(());
        };
        if self.records == 2 {
            // The second record tells the framing: an SOA with the client's serial
            // opens the first deletion part of an incremental transfer; anything
            // else is an AXFR-style answer, which the next SOA ends.
            if serial.is_some() && serial == self.ixfr_serial && serial != Some(current) {
                self.incremental_soas = Some(1);
                return Ok(());
            }
        }
        match (self.incremental_soas.as_mut(), serial) {
            (_, None) => {}
            (None, Some(_)) => self.finished = true,
            (Some(n), Some(s)) => {
                *n += 1;
                // Odd positions open a deletion part; the current serial there ends it.
                if *n % 2 == 1 && s == current {
                    self.finished = true;
                }
            }
        }
        Ok(())
    }
}

/// The messages of one zone transfer, relayed as named sent them, ending where
/// the transfer protocol says or at the deadline for the whole transfer.
pub struct AxfrStream {
    stream: TcpStream,
    id: u16,
    timeout: Duration,
    deadline: tokio::time::Instant,
    total: Duration,
    end: TransferEnd,
    messages: u32,
    done: bool,
}

impl AxfrStream {
    /// The next message, or `None` after the last.
    pub async fn next_message(&mut self) -> Option<Result<Vec<u8>, ForwardError>> {
        if self.done {
            return None;
        }
        let result = self.read_one().await;
        if result.is_err() {
            self.done = true;
        }
        Some(result)
    }

    async fn read_one(&mut self) -> Result<Vec<u8>, ForwardError> {
        if self.messages >= MAX_AXFR_MESSAGES {
            return Err(ForwardError::TransferTooLong(MAX_AXFR_MESSAGES));
        }
        let bytes = tokio::time::timeout_at(self.deadline, read_framed(&mut self.stream, self.timeout))
            .await
            .map_err(|_| ForwardError::Timeout(self.total))??
            .ok_or(ForwardError::Closed)?;
        self.messages += 1;
        let message = RawMessage::parse(&bytes).map_err(|e| ForwardError::BadAnswer(e.to_string()))?;
        if message.header.id != self.id {
            return Err(ForwardError::BadAnswer(format!("transfer message id {} for request {}", message.header.id, self.id)));
        }
        self.end.message(&message).map_err(ForwardError::BadAnswer)?;
        if self.end.finished() {
            self.done = true;
        }
        Ok(bytes)
    }

    /// Collects the remaining messages.
    pub async fn collect(mut self) -> Result<Vec<Vec<u8>>, ForwardError> {
        let mut out = Vec::new();
        while let Some(m) = self.next_message().await {
            out.push(m?);
        }
        Ok(out)
    }
}

async fn write_framed(stream: &mut TcpStream, msg: &[u8], timeout: Duration) -> Result<(), ForwardError> {
    if msg.len() > framing::MAX_MESSAGE {
        return Err(ForwardError::TooLarge(msg.len()));
    }
    tokio::time::timeout(timeout, framing::write_message(stream, msg)).await.map_err(|_| ForwardError::Timeout(timeout))??;
    Ok(())
}

/// One framed message; `None` on a clean close before its length.
async fn read_framed(stream: &mut TcpStream, timeout: Duration) -> Result<Option<Vec<u8>>, ForwardError> {
    let read = framing::read_message(stream);
    match tokio::time::timeout(timeout, read).await.map_err(|_| ForwardError::Timeout(timeout))? {
        Ok(message) => Ok(message),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(ForwardError::Closed),
        Err(e) => Err(ForwardError::Io(e)),
    }
}

/// Builds a query for (`name`, `rtype`) with the given id.
pub fn build_query(id: u16, name: &Name, rtype: RecordType) -> Result<Vec<u8>, ForwardError> {
    let mut message = Message::new(id, MessageType::Query, OpCode::Query);
    message.add_query(Query::query(name.clone(), rtype));
    message.to_vec().map_err(|e| ForwardError::BadRequest(e.to_string()))
}

/// Asks named for the zone's SOA over UDP, once its TCP port takes connections;
/// `Ok(true)` once it answers authoritatively with the SOA (the zone is loaded).
pub async fn zone_answers(addr: SocketAddr, zone: &Name, timeout: Duration) -> Result<bool, ForwardError> {
    let id = (crate::time::unix_now() as u16) ^ (std::process::id() as u16);
    let query = build_query(id, zone, RecordType::SOA)?;
    let forwarder = Forwarder { udp_timeout: timeout, udp_attempts: 1, tcp_timeout: timeout, transfer_timeout: timeout, ..Forwarder::new(addr) };
    // named binds UDP and TCP apart and keeps running without TCP when its port is taken
    // ("creating TCP socket: address in use"); transfers, digests and large answers need it.
    if !matches!(tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await, Ok(Ok(_))) {
        return Ok(false);
    }
    let answer = forwarder.forward_udp(&query).await?;
    let message = Message::from_vec(&answer).map_err(|e| ForwardError::BadAnswer(e.to_string()))?;
    Ok(message.metadata.response_code == ResponseCode::NoError
        && message.metadata.authoritative
        && message.answers.iter().any(|r| r.record_type() == RecordType::SOA))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rrwire::{RawHeader, RawQuestion, TYPE_AXFR, TYPE_SOA};

    fn soa(serial: u32) -> RawRecord {
        let mut rdata = vec![0, 0];
        rdata.extend_from_slice(&serial.to_be_bytes());
        rdata.extend_from_slice(&[0u8; 16]);
        RawRecord { owner: vec![0], rtype: TYPE_SOA, class: 1, ttl: 0, rdata, span: 0..0 }
    }

    fn a() -> RawRecord {
        RawRecord { owner: vec![0], rtype: 1, class: 1, ttl: 0, rdata: vec![192, 0, 2, 1], span: 0..0 }
    }

    fn msg(rcode: u16, qtype: u16, answers: Vec<RawRecord>, authorities: Vec<RawRecord>) -> RawMessage {
        RawMessage {
            header: RawHeader { id: 1, flags: rcode, qdcount: 1, ancount: answers.len() as u16, nscount: 0, arcount: 0 },
            questions: vec![RawQuestion { name: vec![0], qtype, qclass: 1, span: 0..0 }],
            answers,
            authorities,
            additionals: Vec::new(),
        }
    }

    /// Feeds `messages` (answer sections) and says after which message the transfer ended.
    fn ends_after(request: &RawMessage, messages: Vec<Vec<RawRecord>>) -> Option<usize> {
        let mut end = TransferEnd::for_request(request);
        for (i, answers) in messages.into_iter().enumerate() {
            end.message(&msg(0, TYPE_AXFR, answers, vec![])).unwrap();
            if end.finished() {
                return Some(i);
            }
        }
        None
    }

    #[test]
    fn axfr_ends_at_the_second_soa_across_messages() {
        let req = msg(0, TYPE_AXFR, vec![], vec![]);
        assert_eq!(ends_after(&req, vec![vec![soa(5), a()], vec![a()], vec![a(), soa(5)]]), Some(2));
        assert_eq!(ends_after(&req, vec![vec![soa(5)], vec![a()]]), None, "an AXFR may open with the SOA alone");
        assert_eq!(ends_after(&req, vec![vec![soa(5), soa(5)]]), Some(0), "a zone of just its SOA");
    }

    #[test]
    fn ixfr_up_to_date_incremental_and_axfr_style() {
        let req = msg(0, TYPE_IXFR, vec![], vec![soa(7)]);
        // Up to date: the SOA alone, one message.
        assert_eq!(ends_after(&req, vec![vec![soa(7)]]), Some(0));
        // Incremental 7 -> 8 -> 9: SOA9, SOA7 dels SOA8 adds, SOA8 dels SOA9 adds, SOA9.
        let inc = vec![vec![soa(9), soa(7), a(), soa(8), a()], vec![soa(8), a(), soa(9)], vec![a(), soa(9)]];
        assert_eq!(ends_after(&req, inc), Some(2));
        // The SOA of the current serial in an addition part does not end it early.
        assert_eq!(ends_after(&req, vec![vec![soa(9), soa(7), soa(8), soa(8), soa(9)], vec![soa(9)]]), Some(1));
        // AXFR-style fallback: the next SOA ends it.
        assert_eq!(ends_after(&req, vec![vec![soa(9), a(), a()], vec![a(), soa(9)]]), Some(1));
        // An error answer is the whole reply.
        let mut end = TransferEnd::for_request(&req);
        end.message(&msg(5, TYPE_IXFR, vec![], vec![])).unwrap();
        assert!(end.finished());
        // A transfer must open with the SOA.
        let mut end = TransferEnd::for_request(&req);
        assert!(end.message(&msg(0, TYPE_IXFR, vec![a()], vec![])).is_err());
    }
}

#[cfg(test)]
mod deadline {
    use super::*;
    use std::time::Duration;

    /// What the bytes alone decide is not transient; a named that is down is.
    #[tokio::test]
    async fn errors_say_whether_sending_again_can_help() {
        // A port nothing listens on: connection refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let fwd = Forwarder { tcp_timeout: Duration::from_secs(2), ..Forwarder::new(closed) };
        let query = build_query(7, &Name::from_ascii("example.test.").unwrap(), RecordType::SOA).unwrap();
        let refused = fwd.forward_tcp(&query).await.unwrap_err();
        assert!(matches!(refused, ForwardError::Io(_)) && refused.is_transient(), "{refused:?}");
        // Too long for TCP framing, and shorter than a header: the same failure every time.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fwd = Forwarder { tcp_timeout: Duration::from_secs(2), ..Forwarder::new(listener.local_addr().unwrap()) };
        let mut big = query.clone();
        big.resize(framing::MAX_MESSAGE + 1, 0);
        let too_large = fwd.forward_tcp(&big).await.unwrap_err();
        assert!(matches!(too_large, ForwardError::TooLarge(n) if n == framing::MAX_MESSAGE + 1) && !too_large.is_transient());
        let short = fwd.forward_tcp(&query[..11]).await.unwrap_err();
        assert!(matches!(short, ForwardError::BadRequest(_)) && !short.is_transient());
        assert!(ForwardError::Timeout(Duration::from_secs(1)).is_transient() && ForwardError::Closed.is_transient());
    }

    /// A server that sends a transfer's first message and then nothing (keeping the
    /// connection open) cannot hold a transfer past its deadline.
    #[tokio::test]
    async fn a_stalled_transfer_ends_at_its_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let request = read_framed(&mut s, Duration::from_secs(5)).await.unwrap().unwrap();
            // The SOA alone: an AXFR waits for more.
            let mut answer = request[..2].to_vec();
            answer.extend_from_slice(&[0x84, 0x00, 0, 0, 0, 1, 0, 0, 0, 0]);
            answer.extend_from_slice(&[0, 0, 6, 0, 1, 0, 0, 0, 0, 0, 22, 0, 0, 0, 0, 0, 7]);
            answer.extend_from_slice(&[0u8; 16]);
            write_framed(&mut s, &answer, Duration::from_secs(5)).await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(s);
        });
        let fwd = Forwarder { tcp_timeout: Duration::from_secs(60), transfer_timeout: Duration::from_millis(300), ..Forwarder::new(addr) };
        let request = build_query(77, &Name::from_ascii("example.test.").unwrap(), RecordType::AXFR).unwrap();
        let mut stream = fwd.axfr(&request).await.unwrap();
        assert!(stream.next_message().await.unwrap().is_ok(), "the first message is relayed");
        match stream.next_message().await {
            // The whole-transfer deadline, not the 60 s per-read wait, ended it.
            Some(Err(ForwardError::Timeout(d))) => assert_eq!(d, Duration::from_millis(300)),
            other => panic!("expected the transfer deadline, got {other:?}"),
        }
        assert!(stream.next_message().await.is_none());
        server.abort();
    }
}

#[cfg(test)]
mod pool {
    use super::*;

    /// Answers every query with itself marked as a response, `skip` times staying silent first.
    async fn echo(server: UdpSocket, skip: usize) -> Vec<SocketAddr> {
        let mut buf = [0u8; 512];
        let mut from = Vec::new();
        let mut seen = 0;
        while let Ok(Ok((n, peer))) = tokio::time::timeout(Duration::from_millis(800), server.recv_from(&mut buf)).await {
            from.push(peer);
            seen += 1;
            if seen <= skip {
                continue;
            }
            buf[2] |= 0x80;
            server.send_to(&buf[..n], peer).await.unwrap();
        }
        from
    }

    fn query(id: u16) -> Vec<u8> {
        build_query(id, &Name::from_ascii("example.test.").unwrap(), RecordType::SOA).unwrap()
    }

    #[tokio::test]
    async fn a_socket_answered_at_once_is_reused_one_after_a_resend_is_not() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let fwd = Forwarder { udp_timeout: Duration::from_millis(150), ..Forwarder::new(server.local_addr().unwrap()) };
        let seen = tokio::spawn(echo(server, 1));
        // First query: its first attempt goes unanswered, the second is answered.
        assert_eq!(&fwd.forward_udp(&query(1)).await.unwrap()[..2], &[0, 1]);
        assert_eq!(fwd.udp_pool.idle(), 0, "a socket that resent may still get a late answer");
        for id in 2..5 {
            assert_eq!(&fwd.forward_udp(&query(id)).await.unwrap()[..2], &id.to_be_bytes());
            assert_eq!(fwd.udp_pool.idle(), 1);
        }
        let from = seen.await.unwrap();
        // Attempts 1-2 of the first query from one socket, the next three from another, reused.
        assert_eq!(from.len(), 5);
        assert_eq!(from[0], from[1]);
        assert_ne!(from[1], from[2]);
        assert!(from[2..].iter().all(|p| *p == from[2]));
    }

    /// A query begun on a pooled socket is sent within the call (the server has it before
    /// anyone waits), and finishing it does not send it again; with no pooled socket the
    /// send happens when it is finished.
    #[tokio::test]
    async fn a_begun_query_is_sent_at_once_and_once() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let fwd = Forwarder { udp_timeout: Duration::from_millis(150), udp_attempts: 1, ..Forwarder::new(server.local_addr().unwrap()) };
        let unpooled = fwd.start_udp(&query(1));
        assert!(!unpooled.sent(), "no pooled socket: nothing sent yet");
        let mut buf = [0u8; 512];
        assert!(server.try_recv_from(&mut buf).is_err());
        let answering = tokio::spawn(async move {
            let (n, peer) = server.recv_from(&mut buf).await.unwrap();
            buf[2] |= 0x80;
            server.send_to(&buf[..n], peer).await.unwrap();
            server
        });
        assert_eq!(&fwd.finish_udp(unpooled, &query(1)).await.unwrap()[..2], &[0, 1]);
        let server = answering.await.unwrap();
        assert_eq!(fwd.udp_pool.idle(), 1);
        let begun = fwd.start_udp(&query(2));
        assert!(begun.sent());
        // Already at the server, before anything awaited the answer.
        let mut buf = [0u8; 512];
        let (n, peer) = tokio::time::timeout(Duration::from_secs(2), server.recv_from(&mut buf)).await.unwrap().unwrap();
        buf[2] |= 0x80;
        server.send_to(&buf[..n], peer).await.unwrap();
        assert_eq!(&fwd.finish_udp(begun, &query(2)).await.unwrap()[..2], &[0, 2]);
        assert!(server.try_recv_from(&mut buf).is_err(), "sent once");
        assert_eq!(fwd.udp_pool.idle(), 1);
    }
}
