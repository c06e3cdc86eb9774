//! Forwarding DNS messages to the local named, over UDP (falling back to
//! TCP when the answer is truncated) or TCP, and zone transfers as a stream
//! of messages. DNS bytes are read with hickory-proto only; the one thing
//! done by hand is the 2-byte TCP length prefix.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Header, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use hickory_proto::serialize::binary::BinDecodable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
        }
    }

    /// Forwards over UDP and returns named's answer; an answer with TC set
    /// is fetched again over TCP.
    pub async fn forward_udp(&self, request: &[u8]) -> Result<Vec<u8>, ForwardError> {
        let id = header_of(request).map_err(ForwardError::BadRequest)?.id;
        let bind: SocketAddr = if self.addr.is_ipv4() {
            SocketAddr::from(([127, 0, 0, 1], 0))
        } else {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0))
        };
        let socket = UdpSocket::bind(bind).await?;
        socket.connect(self.addr).await?;
        let mut buf = vec![0u8; MAX_UDP];
        for _ in 0..self.udp_attempts.max(1) {
            socket.send(request).await?;
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
                        if h.truncation {
                            return self.forward_tcp(request).await;
                        }
                        return Ok(answer.to_vec());
                    }
                    // A late answer to an earlier attempt has the same id;
                    // anything else is noise.
                    _ => continue,
                }
            }
        }
        Err(ForwardError::Timeout(self.udp_timeout * self.udp_attempts.max(1)))
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

    /// Starts a zone transfer (the request is an AXFR query) and returns the
    /// answer messages as a stream.
    pub async fn axfr(&self, request: &[u8]) -> Result<AxfrStream, ForwardError> {
        let header = header_of(request).map_err(ForwardError::BadRequest)?;
        let mut stream = self.connect().await?;
        write_framed(&mut stream, request, self.tcp_timeout).await?;
        Ok(AxfrStream {
            stream,
            id: header.id,
            timeout: self.tcp_timeout,
            soa_seen: 0,
            messages: 0,
            done: false,
        })
    }
}

/// The messages of one zone transfer, ending after the closing SOA.
pub struct AxfrStream {
    stream: TcpStream,
    id: u16,
    timeout: Duration,
    soa_seen: u32,
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
        let bytes = read_framed(&mut self.stream, self.timeout).await?.ok_or(ForwardError::Closed)?;
        self.messages += 1;
        let message = Message::from_vec(&bytes).map_err(|e| ForwardError::BadAnswer(e.to_string()))?;
        if message.metadata.id != self.id {
            return Err(ForwardError::BadAnswer(format!(
                "transfer message id {} for request {}",
                message.metadata.id, self.id
            )));
        }
        if message.metadata.response_code != ResponseCode::NoError {
            self.done = true;
        }
        self.soa_seen += message.answers.iter().filter(|r| r.record_type() == RecordType::SOA).count() as u32;
        // The transfer opens and closes with the SOA; a one-message answer
        // without records (e.g. refused) also ends it.
        if self.soa_seen >= 2 || message.answers.is_empty() {
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
    let len = u16::try_from(msg.len()).map_err(|_| ForwardError::TooLarge(msg.len()))?;
    let mut framed = Vec::with_capacity(msg.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    tokio::time::timeout(timeout, stream.write_all(&framed))
        .await
        .map_err(|_| ForwardError::Timeout(timeout))??;
    Ok(())
}

/// One framed message; `None` on a clean close before its length.
async fn read_framed(stream: &mut TcpStream, timeout: Duration) -> Result<Option<Vec<u8>>, ForwardError> {
    let read = async {
        let mut len = [0u8; 2];
        match stream.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(ForwardError::Io(e)),
        }
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut buf).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                ForwardError::Closed
            } else {
                ForwardError::Io(e)
            }
        })?;
        Ok(Some(buf))
    };
    tokio::time::timeout(timeout, read).await.map_err(|_| ForwardError::Timeout(timeout))?
}

/// Builds a query for (`name`, `rtype`) with the given id.
pub fn build_query(id: u16, name: &Name, rtype: RecordType) -> Result<Vec<u8>, ForwardError> {
    let mut message = Message::new(id, MessageType::Query, OpCode::Query);
    message.add_query(Query::query(name.clone(), rtype));
    message.to_vec().map_err(|e| ForwardError::BadRequest(e.to_string()))
}

/// Asks named for the zone's SOA over UDP; `Ok(true)` once it answers
/// authoritatively with the SOA (the zone is loaded).
pub async fn zone_answers(addr: SocketAddr, zone: &Name, timeout: Duration) -> Result<bool, ForwardError> {
    let id = (crate::time::unix_now() as u16) ^ (std::process::id() as u16);
    let query = build_query(id, zone, RecordType::SOA)?;
    let forwarder = Forwarder { addr, udp_timeout: timeout, udp_attempts: 1, tcp_timeout: timeout };
    let answer = forwarder.forward_udp(&query).await?;
    let message = Message::from_vec(&answer).map_err(|e| ForwardError::BadAnswer(e.to_string()))?;
    Ok(message.metadata.response_code == ResponseCode::NoError
        && message.metadata.authoritative
        && message.answers.iter().any(|r| r.record_type() == RecordType::SOA))
}
