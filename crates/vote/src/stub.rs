//! A stub resolver that answers by voting: unmodified applications on a host point their
//! resolver at it (e.g. 127.0.0.1) and get the voting client's guarantees for the replicated
//! zones. Each query is asked of every replica; the accepted answer is returned with the
//! client's id and question; without a quorum the answer is SERVFAIL, never a guess.
//!
//! Queries in flight are bounded; beyond the bound new ones are dropped (the application
//! retries) rather than queued. TCP connections are bounded and closed when idle.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dnswire::framing;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{mpsc, Semaphore};
use tracing::{debug, warn};

use crate::client::{Verdict, VotingClient};

/// Queries being voted on at once.
pub const MAX_IN_FLIGHT: usize = 256;
/// TCP connections at once.
pub const MAX_TCP_CONNECTIONS: usize = 64;
/// A TCP connection with nothing to read for this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// Answer size without EDNS (RFC 1035).
const CLASSIC_UDP: usize = 512;

/// Serves DNS on `listen` (UDP and TCP) until the task is dropped.
pub async fn serve(listen: SocketAddr, client: Arc<VotingClient>) -> std::io::Result<()> {
    let udp = Arc::new(UdpSocket::bind(listen).await?);
    let tcp = TcpListener::bind(udp.local_addr()?).await?;
    serve_on(udp, tcp, client).await;
    Ok(())
}

/// Serves on sockets already bound (tests bind port 0 and read the address first).
pub async fn serve_on(udp: Arc<UdpSocket>, tcp: TcpListener, client: Arc<VotingClient>) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    tokio::select! {
        () = serve_udp(udp, client.clone(), slots.clone()) => {}
        () = serve_tcp(tcp, client, slots) => {}
    }
}

async fn serve_udp(socket: Arc<UdpSocket>, client: Arc<VotingClient>, slots: Arc<Semaphore>) {
    let mut buf = vec![0u8; 65_535];
    loop {
        let (len, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                debug!(error = %e, "stub udp recv");
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            debug!(%peer, "stub busy; query dropped");
            continue;
        };
        let bytes = buf[..len].to_vec();
        let (socket, client) = (socket.clone(), client.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(answer) = answer(&client, &bytes, false).await {
                let _ = socket.send_to(&answer, peer).await;
            }
        });
    }
}

async fn serve_tcp(listener: TcpListener, client: Arc<VotingClient>, slots: Arc<Semaphore>) {
    let connections = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "stub tcp accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else { continue };
        let (client, slots) = (client.clone(), slots.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = connection(stream, client, slots).await {
                debug!(%peer, error = %e, "stub tcp connection ended");
            }
        });
    }
}

/// One TCP connection: several queries, answers in completion order (matched by id).
async fn connection(stream: TcpStream, client: Arc<VotingClient>, slots: Arc<Semaphore>) -> std::io::Result<()> {
    let (mut reader, mut writer) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    let writer_task = tokio::spawn(async move {
        while let Some(a) = rx.recv().await {
            let Some(framed) = framing::frame(&a) else { continue };
            match tokio::time::timeout(TCP_IDLE, writer.write_all(&framed)).await {
                Ok(Ok(())) => {}
                _ => break,
            }
        }
    });
    loop {
        let bytes = match tokio::time::timeout(TCP_IDLE, framing::read_message(&mut reader)).await {
            Ok(Ok(Some(bytes))) => bytes,
            _ => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else { continue };
        let (client, tx) = (client.clone(), tx.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(a) = answer(&client, &bytes, true).await {
                let _ = tx.send(a).await;
            }
        });
    }
    drop(tx);
    let _ = tokio::time::timeout(TCP_IDLE, writer_task).await;
    Ok(())
}

/// The stub's answer to one client message; `None` for what must not be answered (responses,
/// runts).
pub async fn answer(client: &VotingClient, bytes: &[u8], tcp: bool) -> Option<Vec<u8>> {
    let request = match Message::from_vec(bytes) {
        Ok(m) => m,
        Err(_) => {
            // Answer FORMERR only to something that looks like a query header.
            let head = bytes.get(..12)?;
            let id = u16::from_be_bytes([head[0], head[1]]);
            if head[2] & 0x80 != 0 {
                return None;
            }
            return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr).to_vec().ok();
        }
    };
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let refuse = |code| {
        let mut m = Message::error_msg(request.metadata.id, request.metadata.op_code, code);
        m.add_queries(request.queries.iter().cloned());
        m.to_vec().ok()
    };
    if request.metadata.op_code != OpCode::Query {
        return refuse(ResponseCode::NotImp);
    }
    let [question] = request.queries.as_slice() else { return refuse(ResponseCode::FormErr) };
    let dnssec = request.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok);
    let outcome = match client.read(question.name(), question.query_type(), dnssec).await {
        Ok(o) => o,
        Err(e) => {
            debug!(error = %e, "stub cannot ask");
            return refuse(ResponseCode::ServFail);
        }
    };
    let accepted = match (outcome.verdict(), outcome.answer()) {
        (Verdict::Accepted, Some(a)) => a.clone(),
        (verdict, _) => {
            debug!(?verdict, disagreed = ?outcome.disagreed(), silent = ?outcome.silent(), "stub: no accepted answer");
            return refuse(ResponseCode::ServFail);
        }
    };
    let mut reply = Message::new(request.metadata.id, MessageType::Response, OpCode::Query);
    reply.metadata.authoritative = accepted.metadata.authoritative;
    reply.metadata.recursion_desired = request.metadata.recursion_desired;
    reply.metadata.checking_disabled = request.metadata.checking_disabled;
    reply.metadata.response_code = accepted.metadata.response_code;
    reply.add_queries(request.queries.iter().cloned());
    reply.insert_answers(accepted.answers);
    reply.insert_authorities(accepted.authorities);
    reply.insert_additionals(accepted.additionals);
    let limit = match &request.edns {
        Some(e) => {
            let mut edns = Edns::new();
            edns.set_max_payload(crate::client::EDNS_PAYLOAD);
            edns.set_dnssec_ok(dnssec);
            reply.set_edns(edns);
            usize::from(e.max_payload().max(512))
        }
        None => CLASSIC_UDP,
    };
    let bytes = reply.to_vec().ok()?;
    if !tcp && bytes.len() > limit {
        // Too big for the client's datagrams: TC, and the client asks again over TCP.
        return reply.truncate().to_vec().ok();
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Options;
    use crate::net::Timeouts;
    use crate::Replicas;
    use hickory_proto::op::Query;
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData, Record, RecordType};
    use std::str::FromStr;
    use testkit::FakeDns;

    /// A replica that answers every query with `count` A records.
    fn replica(count: u8) -> FakeDns {
        FakeDns::start(move |bytes| {
            let q = Message::from_vec(bytes).ok()?;
            let mut a = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
            a.metadata.authoritative = true;
            a.add_queries(q.queries.iter().cloned());
            let name = q.queries.first()?.name().clone();
            for i in 0..count {
                a.add_answer(Record::from_rdata(name.clone(), 300, RData::A(A::new(192, 0, 2, i))));
            }
            a.to_vec().ok()
        })
    }

    /// A client of four such replicas; they run as long as it lives.
    async fn client(count: u8) -> (VotingClient, Vec<FakeDns>) {
        let replicas: Vec<FakeDns> = (0..4).map(|_| replica(count)).collect();
        let timeouts = Timeouts { udp_attempt: Duration::from_millis(200), udp_attempts: 2, tcp: Duration::from_millis(300) };
        let options = Options { timeouts, round: Duration::from_secs(2), linger: Duration::ZERO, voting_reads: true };
        (VotingClient::new(Replicas::new(replicas.iter().map(FakeDns::addr).collect(), None).unwrap(), options), replicas)
    }

    fn query(id: u16, edns: bool) -> Vec<u8> {
        let mut m = Message::new(id, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_str("big.example.test.").unwrap(), RecordType::A));
        if edns {
            let mut e = Edns::new();
            e.set_max_payload(4096);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    #[tokio::test]
    async fn answers_carry_the_clients_id_and_are_truncated_to_fit() {
        let (c, _replicas) = client(60).await;
        // 60 A records do not fit 512 bytes: TC without records, and the client retries on TCP.
        let a = Message::from_vec(&answer(&c, &query(0x5151, false), false).await.unwrap()).unwrap();
        assert_eq!((a.metadata.id, a.metadata.truncation, a.answers.len()), (0x5151, true, 0));
        let a = Message::from_vec(&answer(&c, &query(0x5152, false), true).await.unwrap()).unwrap();
        assert_eq!((a.metadata.id, a.metadata.truncation, a.answers.len()), (0x5152, false, 60));
        // With EDNS the client takes the whole answer over UDP.
        let a = Message::from_vec(&answer(&c, &query(0x5153, true), false).await.unwrap()).unwrap();
        assert_eq!((a.metadata.truncation, a.answers.len(), a.metadata.authoritative), (false, 60, true));
    }

    #[tokio::test]
    async fn garbage_and_responses_get_no_vote() {
        let (c, _replicas) = client(1).await;
        assert!(answer(&c, &[1, 2, 3], false).await.is_none(), "a runt is dropped");
        let mut response = Message::from_vec(&query(7, false)).unwrap();
        response.metadata.message_type = MessageType::Response;
        assert!(answer(&c, &response.to_vec().unwrap(), false).await.is_none(), "responses are never answered");
        let mut two = Message::from_vec(&query(8, false)).unwrap();
        two.add_query(Query::query(Name::from_str("b.example.test.").unwrap(), RecordType::A));
        let a = Message::from_vec(&answer(&c, &two.to_vec().unwrap(), false).await.unwrap()).unwrap();
        assert_eq!(a.metadata.response_code, ResponseCode::FormErr);
    }
}
