//! Asking one replica one question: UDP with retries and TCP when the answer is truncated (or
//! for updates, which must not be retried over UDP). Every socket operation has a timeout; an
//! answer is taken only if it is a response with our id and our question.

use std::net::SocketAddr;
use std::time::Duration;

use dnswire::framing;
use hickory_proto::op::{Message, MessageType};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

/// Largest UDP answer accepted (the EDNS maximum).
const MAX_UDP: usize = 65_535;
/// Datagrams that are not our answer (late answers, noise) read per attempt before giving up on it.
const MAX_STRAY_DATAGRAMS: usize = 64;
/// TCP messages that are not our answer read before giving up.
const MAX_STRAY_TCP_MESSAGES: usize = 16;

#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// Wait per UDP attempt.
    pub udp_attempt: Duration,
    /// UDP attempts (the first send and its retries).
    pub udp_attempts: u32,
    /// Wait for the TCP connection, and for each TCP read or write.
    pub tcp: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { udp_attempt: Duration::from_millis(1000), udp_attempts: 3, tcp: Duration::from_secs(3) }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AskError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("connection closed before the answer")]
    Closed,
    #[error("message of {0} bytes does not fit TCP framing")]
    TooLarge(usize),
    #[error("no answer to our question among the messages received")]
    NoMatchingAnswer,
}

/// Sends `request` (whose id is `id`) over UDP, retrying; a truncated answer is fetched again
/// over TCP. Returns the parsed answer.
pub async fn ask_udp(addr: SocketAddr, request: &[u8], expect: &Message, t: Timeouts) -> Result<Message, AskError> {
    let bind: SocketAddr = if addr.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let socket = UdpSocket::bind(bind).await?;
    socket.connect(addr).await?;
    let mut buf = vec![0u8; MAX_UDP];
    let attempts = t.udp_attempts.max(1);
    for _ in 0..attempts {
        // A send error (e.g. an ICMP refusal from an earlier attempt) is one failed attempt.
        if socket.send(request).await.is_err() {
            tokio::time::sleep(t.udp_attempt).await;
            continue;
        }
        let deadline = tokio::time::Instant::now() + t.udp_attempt;
        for _ in 0..MAX_STRAY_DATAGRAMS {
            let n = match tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
                Err(_) => break,
                Ok(Err(_)) => {
                    // Port unreachable: nothing listens there; wait out the attempt.
                    tokio::time::sleep_until(deadline).await;
                    break;
                }
                Ok(Ok(n)) => n,
            };
            let Some(answer) = buf.get(..n).and_then(|b| Message::from_vec(b).ok()) else { continue };
            if !answers(&answer, expect) {
                continue;
            }
            if answer.metadata.truncation {
                return ask_tcp(addr, request, expect, t).await;
            }
            return Ok(answer);
        }
    }
    Err(AskError::Timeout(t.udp_attempt * attempts))
}

/// Sends `request` over TCP and returns the parsed answer.
pub async fn ask_tcp(addr: SocketAddr, request: &[u8], expect: &Message, t: Timeouts) -> Result<Message, AskError> {
    let framed = framing::frame(request).ok_or(AskError::TooLarge(request.len()))?;
    let mut stream = tokio::time::timeout(t.tcp, TcpStream::connect(addr)).await.map_err(|_| AskError::Timeout(t.tcp))??;
    tokio::time::timeout(t.tcp, stream.write_all(&framed)).await.map_err(|_| AskError::Timeout(t.tcp))??;
    for _ in 0..MAX_STRAY_TCP_MESSAGES {
        let bytes = tokio::time::timeout(t.tcp, read_framed(&mut stream)).await.map_err(|_| AskError::Timeout(t.tcp))??;
        if let Ok(answer) = Message::from_vec(&bytes) {
            if answers(&answer, expect) {
                return Ok(answer);
            }
        }
    }
    Err(AskError::NoMatchingAnswer)
}

async fn read_framed(stream: &mut TcpStream) -> Result<Vec<u8>, AskError> {
    match framing::read_message(stream).await {
        Ok(Some(message)) => Ok(message),
        Ok(None) => Err(AskError::Closed),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(AskError::Closed),
        Err(e) => Err(AskError::Io(e)),
    }
}

/// True if `answer` is a response to `request`: same id, same opcode, same question (names
/// compared case-insensitively, as DNS does).
pub fn answers(answer: &Message, request: &Message) -> bool {
    answer.metadata.message_type == MessageType::Response
        && answer.metadata.id == request.metadata.id
        && answer.metadata.op_code == request.metadata.op_code
        && answer.queries.len() == request.queries.len()
        && answer
            .queries
            .iter()
            .zip(&request.queries)
            .all(|(a, q)| a.name() == q.name() && a.query_type() == q.query_type() && a.query_class() == q.query_class())
}

/// A message id no off-path spoofer can predict.
pub fn random_id() -> u16 {
    let mut b = [0u8; 2];
    // Without OS randomness fall back to a clock-derived id: spoofing gets easier, voting still holds.
    if getrandom::fill(&mut b).is_err() {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        return nanos as u16;
    }
    u16::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    use std::str::FromStr;

    fn query(id: u16) -> Message {
        let mut m = Message::new(id, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_str("www.example.test.").unwrap(), RecordType::A));
        m
    }

    #[test]
    fn only_responses_to_our_question_count() {
        let q = query(42);
        let mut ok = query(42);
        ok.metadata.message_type = MessageType::Response;
        ok.queries[0] = Query::query(Name::from_str("WWW.example.TEST.").unwrap(), RecordType::A);
        assert!(answers(&ok, &q));
        let mut other_id = ok.clone();
        other_id.metadata.id = 43;
        let mut other_type = ok.clone();
        other_type.queries[0] = Query::query(Name::from_str("www.example.test.").unwrap(), RecordType::AAAA);
        for bad in [q.clone(), other_id, other_type] {
            assert!(!answers(&bad, &q));
        }
    }

    /// A server that sends a truncated answer over UDP and the full one over TCP: the client
    /// follows to TCP; one that never answers times out within the configured bound.
    #[tokio::test]
    async fn truncation_falls_back_to_tcp_and_silence_times_out() {
        // The kernel's free UDP port may be taken for TCP: try a few.
        let mut pair = None;
        for _ in 0..100 {
            let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let addr = udp.local_addr().unwrap();
            if let Ok(tcp) = tokio::net::TcpListener::bind(addr).await {
                pair = Some((udp, addr, tcp));
                break;
            }
        }
        let (udp, addr, tcp) = pair.expect("a loopback port free for both UDP and TCP");
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let (n, peer) = udp.recv_from(&mut buf).await.unwrap();
            let mut answer = Message::from_vec(&buf[..n]).unwrap();
            answer.metadata.message_type = MessageType::Response;
            answer.metadata.truncation = true;
            udp.send_to(&answer.to_vec().unwrap(), peer).await.unwrap();
        });
        tokio::spawn(async move {
            let (mut s, _) = tcp.accept().await.unwrap();
            let request = read_framed(&mut s).await.unwrap();
            let mut answer = Message::from_vec(&request).unwrap();
            answer.metadata.message_type = MessageType::Response;
            answer.metadata.authoritative = true;
            let bytes = answer.to_vec().unwrap();
            s.write_all(&(bytes.len() as u16).to_be_bytes()).await.unwrap();
            s.write_all(&bytes).await.unwrap();
        });
        let q = query(random_id());
        let t = Timeouts { udp_attempt: Duration::from_millis(500), udp_attempts: 2, tcp: Duration::from_secs(2) };
        let answer = ask_udp(addr, &q.to_vec().unwrap(), &q, t).await.unwrap();
        assert!(answer.metadata.authoritative && !answer.metadata.truncation, "the TCP answer, not the truncated one");

        let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let t = Timeouts { udp_attempt: Duration::from_millis(100), udp_attempts: 2, tcp: Duration::from_millis(200) };
        let started = std::time::Instant::now();
        let r = ask_udp(silent.local_addr().unwrap(), &q.to_vec().unwrap(), &q, t).await;
        assert!(matches!(r, Err(AskError::Timeout(_))), "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
