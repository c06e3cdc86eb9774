//! Client-facing listeners: DNS over UDP and TCP on the replica's public address.
//!
//! A listener only frames messages and does what the read router (`crate::reads::route`)
//! decides for each: answers the router produces itself (REFUSED, FORMERR) go straight back,
//! local and vouched reads are taken here, and the rest goes to the gateway with its lane and
//! a way back to the client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{mpsc, Semaphore};
use tracing::{debug, info, warn};

use dnswire::framing;
use exec::access::AccessSection;
use exec::answer::{error_answer, RCODE_REFUSED};
use exec::classify::Kind;

use crate::client::reply::{Delivery, Outgoing, ReplyTo};
use crate::ops::metrics::Metrics;
use crate::reads::route::{route, ClientRequest, Lane, ReadSetup, Route};
use crate::reads::vouched::{VouchTurn, VouchedReads};

/// What a listener applies to client traffic: the pre-ordering check and UDP RRL.
#[derive(Default)]
pub struct ClientFilters {
    pub auth: Option<std::sync::Arc<crate::execution::zoneset::SharedAuth>>,
    pub rrl: Option<std::sync::Arc<crate::client::rrl::Limiter>>,
    /// `[order_limit]`: requests one client prefix may have ordered per second.
    pub order_limit: Option<std::sync::Arc<crate::client::rrl::OrderLimiter>>,
    /// Fault injection (Byzantine mode wrong-answers, test clusters only): rewrite every
    /// answer this replica gives its clients.
    pub lie: bool,
    /// `reads = "local"`: the listeners answer reads themselves (no hop through the
    /// gateway task).
    pub local_reads: Option<crate::reads::read::LocalReads>,
    /// Ordered mode with `cluster.vouched_reads`: the listeners put plain queries on the
    /// vouched path themselves (no hop through the gateway task).
    pub vouched: Option<Arc<VouchedReads>>,
}

impl ClientFilters {
    /// The read paths the router may choose: local reads take every read, vouched reads plain queries.
    fn read_setup(&self) -> ReadSetup {
        match (&self.local_reads, &self.vouched) {
            (Some(_), _) => ReadSetup::Local,
            (None, Some(_)) => ReadSetup::Vouched,
            (None, None) => ReadSetup::Ordered,
        }
    }
}

/// Largest DNS message over UDP we accept (EDNS allows up to 65535).
const UDP_MAX: usize = 65_535;
/// Datagrams already waiting that the UDP listener takes in one turn, so that their read
/// probes go to the peers as one message.
const UDP_BURST: usize = 64;

/// Binds the client UDP socket with a receive buffer of `receive_buffer` bytes (0: the OS
/// default). The OS default (208 KiB on Linux; it held 256 small queries in the unit test
/// below) overflows when a burst arrives while the listener's thread is busy elsewhere, and the kernel then drops
/// queries unseen; named's own listeners drain faster, so without this the replica would
/// lose queries that named alone answers.
pub fn bind_udp(addr: SocketAddr, receive_buffer: usize) -> std::io::Result<UdpSocket> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
    if receive_buffer > 0 {
        socket.set_recv_buffer_size(receive_buffer)?;
        // Linux reports twice what it grants (its bookkeeping overhead included).
        let granted = socket.recv_buffer_size()?;
        if granted < receive_buffer {
            // Stock kernels cap the default ask (rmem_max 208 KiB, twice that granted): worth
            // a line, not a warning at every start. A size the operator chose is warned about.
            if receive_buffer == crate::config::ClientSection::default().udp_receive_buffer {
                info!(asked = receive_buffer, granted, "client UDP receive buffer capped by net.core.rmem_max; raise it (sysctl) to absorb larger bursts");
            } else {
                warn!(asked = receive_buffer, granted, "client UDP receive buffer capped by net.core.rmem_max; raise it (sysctl) to absorb bursts");
            }
        } else {
            debug!(asked = receive_buffer, granted, "client UDP receive buffer");
        }
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

pub async fn serve_udp(
    socket: Arc<UdpSocket>,
    to_gateway: mpsc::Sender<ClientRequest>,
    metrics: Arc<Metrics>,
    access: Arc<AccessSection>,
    filters: Arc<ClientFilters>,
) {
    let mut buf = vec![0u8; UDP_MAX];
    let mut probes = VouchTurn::default();
    loop {
        let (len, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                // ICMP errors from earlier sends surface here on Linux; keep serving.
                debug!(error = %e, "udp recv");
                continue;
            }
        };
        let reply = ReplyTo::Udp { socket: socket.clone(), peer, rrl: filters.rrl.clone(), lie: filters.lie };
        dispatch(buf[..len].to_vec(), false, reply, peer, &access, &filters, &to_gateway, &metrics, &mut probes);
        for _ in 0..UDP_BURST {
            let (len, peer) = match socket.try_recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    debug!(error = %e, "udp recv");
                    continue;
                }
            };
            let reply = ReplyTo::Udp { socket: socket.clone(), peer, rrl: filters.rrl.clone(), lie: filters.lie };
            dispatch(buf[..len].to_vec(), false, reply, peer, &access, &filters, &to_gateway, &metrics, &mut probes);
        }
        if let Some(vouched) = &filters.vouched {
            vouched.send_probes(&mut probes);
        }
    }
}

/// Does what the read router (`crate::reads::route`) decides for one client message. Never
/// waits: a vouched read's probe is added to `probes` (with the gateway's own query to named,
/// on a cache miss), which the caller sends (`VouchedReads::send_probes`).
#[allow(clippy::too_many_arguments)]
fn dispatch(
    bytes: Vec<u8>,
    tcp: bool,
    reply: ReplyTo,
    peer: SocketAddr,
    access: &AccessSection,
    filters: &ClientFilters,
    to_gateway: &mpsc::Sender<ClientRequest>,
    metrics: &Arc<Metrics>,
    probes: &mut VouchTurn,
) {
    // The zones served now (the set may change at run time).
    let auth = filters.auth.as_ref().map(|a| a.current());
    match route(&bytes, tcp, peer.ip(), access, auth.as_deref(), filters.read_setup(), named_glue::time::unix_now) {
        Route::Answer(answer) => {
            metrics.inc_refused();
            if let Some(answer) = answer {
                if let Delivery::Dropped(why) = reply.try_send(answer) {
                    metrics.inc_dropped(why);
                }
            }
        }
        Route::Drop(why) => metrics.inc_dropped(why),
        Route::Local => {
            if let Some(local) = &filters.local_reads {
                local.answer(bytes, tcp, reply, metrics);
            }
        }
        Route::Vouched { key } => {
            let request = ClientRequest { bytes, tcp, reply, lane: Lane::Ordered(Kind::Read) };
            let request = match &filters.vouched {
                Some(vouched) => match vouched.take(request, key, probes) {
                    Ok(()) => return,
                    Err(request) => request,
                },
                None => request,
            };
            to_order(request, peer, filters, to_gateway, metrics);
        }
        Route::Gateway(lane) => to_order(ClientRequest { bytes, tcp, reply, lane }, peer, filters, to_gateway, metrics),
    }
}

/// Hands a request to the gateway (to be ordered, or answered there as a voting read), unless
/// its client prefix is over `[order_limit]`'s rate.
fn to_order(request: ClientRequest, peer: SocketAddr, filters: &ClientFilters, to_gateway: &mpsc::Sender<ClientRequest>, metrics: &Metrics) {
    if filters.order_limit.as_ref().is_some_and(|l| !l.allow(peer.ip(), request.lane.limited_as_write())) {
        // Over its prefix's rate: refused without ordering (the answer is no larger
        // than the request, so it amplifies nothing).
        metrics.inc_dropped("order_rate");
        metrics.inc_refused();
        if let Some(answer) = error_answer(&request.bytes, RCODE_REFUSED) {
            if let Delivery::Dropped(why) = request.reply.try_send(answer) {
                metrics.inc_dropped(why);
            }
        }
        return;
    }
    // The gateway's queue is bounded; when full the client's retry will do.
    if to_gateway.try_send(request).is_err() {
        metrics.inc_dropped("gateway_full");
    }
}

pub struct TcpLimits {
    pub idle: Duration,
    pub max_connections: usize,
    /// Requests read from one connection and not yet answered (or dropped); at the
    /// bound that connection is not read until answers go out.
    pub max_pipelined: usize,
    /// A write to a client that does not progress in this time ends its connection.
    pub write_timeout: Duration,
}

/// Answers queued per connection before further ones are dropped (a transfer's
/// messages wait for room instead, bounded by the write timeout).
const ANSWER_QUEUE: usize = 64;

pub async fn serve_tcp(
    listener: TcpListener,
    to_gateway: mpsc::Sender<ClientRequest>,
    limits: TcpLimits,
    metrics: Arc<Metrics>,
    access: Arc<AccessSection>,
    filters: Arc<ClientFilters>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let limits = Arc::new(limits);
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
        let limits = limits.clone();
        let access = access.clone();
        let filters = filters.clone();
        tokio::spawn(async move {
            let _permit = permit;
            serve_connection(stream, peer, to_gateway, &limits, metrics, access, filters).await;
            debug!(%peer, "tcp connection ended");
        });
    }
}

/// One TCP connection: several messages, answers in completion order (RFC 7766
/// allows that; clients match them by message id), closed when idle, when a write
/// stalls, or when the client closes.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    to_gateway: mpsc::Sender<ClientRequest>,
    limits: &TcpLimits,
    metrics: Arc<Metrics>,
    access: Arc<AccessSection>,
    filters: Arc<ClientFilters>,
) {
    let (mut reader, mut writer) = stream.into_split();
    let (answers_tx, mut answers_rx) = mpsc::channel::<Outgoing>(ANSWER_QUEUE);
    let write_timeout = limits.write_timeout;
    let m = metrics.clone();
    let lie = filters.lie;
    let mut write_task = tokio::spawn(async move {
        while let Some(mut answer) = answers_rx.recv().await {
            if lie {
                answer.bytes = crate::faults::byzantine::lie(std::mem::take(&mut answer.bytes));
            }
            let Some(framed) = framing::frame(&answer.bytes) else { continue };
            match tokio::time::timeout(write_timeout, writer.write_all(&framed)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => break,
                Err(_) => {
                    m.inc_dropped("tcp_write_timeout");
                    break;
                }
            }
        }
    });
    let pipelined = Arc::new(Semaphore::new(limits.max_pipelined.max(1)));
    let mut writer_done = false;
    loop {
        // A slot first: a client that does not read its answers is not read either.
        let slot = tokio::select! {
            s = pipelined.clone().acquire_owned() => match s { Ok(s) => s, Err(_) => break },
            _ = &mut write_task => { writer_done = true; break }
        };
        // The whole message within the idle time.
        let read = async { tokio::time::timeout(limits.idle, framing::read_message(&mut reader)).await.ok()?.ok()? };
        let bytes = tokio::select! {
            b = read => match b { Some(b) => b, None => break }, // idle, or closed
            _ = &mut write_task => { writer_done = true; break }
        };
        let reply = ReplyTo::Tcp { writer: answers_tx.clone(), slot: Some(Arc::new(slot)) };
        let mut probes = VouchTurn::default();
        dispatch(bytes, true, reply, peer, &access, &filters, &to_gateway, &metrics, &mut probes);
        if let Some(vouched) = &filters.vouched {
            vouched.send_probes(&mut probes);
        }
    }
    drop(answers_tx);
    if !writer_done {
        // Answers still in flight (held by the gateway) may drain, bounded by the idle time.
        if tokio::time::timeout(limits.idle, &mut write_task).await.is_err() {
            write_task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reads::read::{Lookup, ReadCache};

    fn query(id: u16, name: &str) -> Vec<u8> {
        let name = hickory_proto::rr::Name::from_ascii(name).unwrap();
        named_glue::forward::build_query(id, &name, hickory_proto::rr::RecordType::A).unwrap()
    }

    /// The client socket gets the buffer asked for, as far as net.core.rmem_max allows, and a
    /// burst larger than the OS default waits in it instead of being dropped.
    #[tokio::test]
    async fn client_udp_socket_holds_a_burst() {
        let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        let rmem_default: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_default").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        let asked = 4 << 20;
        let socket = bind_udp("127.0.0.1:0".parse().unwrap(), asked).unwrap();
        let granted = socket2::SockRef::from(&socket).recv_buffer_size().unwrap();
        // Linux grants min(asked, rmem_max) and reports twice that.
        assert!(granted >= asked.min(rmem_max), "granted {granted}, asked {asked}, rmem_max {rmem_max}");
        let default = bind_udp("127.0.0.1:0".parse().unwrap(), 0).unwrap();
        assert_eq!(socket2::SockRef::from(&default).recv_buffer_size().unwrap(), rmem_default, "0 keeps the OS default");
        if asked.min(rmem_max) <= 2 * rmem_default {
            return; // this host's limit leaves nothing more to show
        }
        // Twice as many queries as the default buffer holds, sent before anything is read.
        let to = socket.local_addr().unwrap();
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let sent = 2 * rmem_default / 512;
        for id in 0..sent {
            sender.send_to(&query(id as u16, "www.example.test."), to).unwrap();
        }
        let mut buf = [0u8; 512];
        let mut received = 0;
        socket.readable().await.unwrap();
        while socket.try_recv_from(&mut buf).is_ok() {
            received += 1;
        }
        assert_eq!(received, sent, "every query of the burst waited in the buffer");
    }

    /// Local reads: a cache hit is answered by the listener (with the request's id), a miss
    /// is asked of named by the listener too; in ordered mode every read goes to the gateway.
    #[tokio::test]
    async fn local_reads_are_answered_without_the_gateway() {
        let cache = Arc::new(ReadCache::default());
        let cached = query(1, "www.example.test.");
        let Lookup::Miss(Some(fill)) = cache.lookup(&cached, false) else { panic!("an empty cache misses") };
        let mut answer = cached.clone();
        answer[2] |= 0x84; // QR, AA: named's answer as kept
        answer.extend_from_slice(b"named's records");
        cache.fill(fill, &answer);

        let server = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        // A fresh socket's send readiness is known once the reactor has seen it.
        server.writable().await.unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let peer = client.local_addr().unwrap();
        let reply = || ReplyTo::Udp { socket: server.clone(), peer, rrl: None, lie: false };
        let (metrics, access) = (Metrics::new(0), AccessSection::default());
        let (to_gateway, mut gateway) = mpsc::channel(4);
        // named: answers every query with its bytes, QR set, and one extra byte.
        let named = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let forwarder = named_glue::forward::Forwarder::new(named.local_addr().unwrap());
        let local = ClientFilters {
            auth: None,
            rrl: None,
            order_limit: None,
            lie: false,
            local_reads: Some(crate::reads::read::LocalReads::new(cache.clone(), forwarder)),
            vouched: None,
        };
        let probes = &mut VouchTurn::default();

        dispatch(query(0x4242, "www.example.test."), false, reply(), peer, &access, &local, &to_gateway, &metrics, probes);
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(2), client.recv(&mut buf)).await.expect("answered").unwrap();
        let mut want = answer.clone();
        want[..2].copy_from_slice(&0x4242u16.to_be_bytes());
        assert_eq!(&buf[..n], &want[..]);
        assert!(gateway.try_recv().is_err(), "a hit does not reach the gateway");

        dispatch(query(7, "other.example.test."), false, reply(), peer, &access, &local, &to_gateway, &metrics, probes);
        let (n, from) = tokio::time::timeout(Duration::from_secs(2), named.recv_from(&mut buf)).await.expect("named asked").unwrap();
        let mut named_answer = buf[..n].to_vec();
        assert_eq!(named_answer, query(7, "other.example.test."), "the miss reaches named as it came");
        named_answer[2] |= 0x80;
        named_answer.push(0);
        named.send_to(&named_answer, from).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(2), client.recv(&mut buf)).await.expect("miss answered").unwrap();
        assert_eq!(&buf[..n], &named_answer[..]);
        assert!(gateway.try_recv().is_err(), "a miss does not reach the gateway either");

        let ordered = ClientFilters { local_reads: None, ..local };
        dispatch(query(8, "www.example.test."), false, reply(), peer, &access, &ordered, &to_gateway, &metrics, probes);
        assert!(gateway.try_recv().is_ok(), "ordered mode: every read goes to the gateway");
        assert!(client.try_recv(&mut buf).is_err(), "and nothing was answered meanwhile");
    }

    /// Before ordering: an AXFR/IXFR over UDP needs a transfer key or address like one over
    /// TCP; an UPDATE that cannot be authorized (unreadable, unsigned) is answered and never
    /// reaches the gateway; signed updates beyond a prefix's rate are refused.
    #[tokio::test]
    async fn what_cannot_be_authorized_or_is_over_the_rate_is_not_ordered() {
        use exec::auth::{tsig, zones::ZoneAuth, Authenticator, Mode, TsigSecret};
        let secret = TsigSecret { name: "up.".into(), algorithm: tsig::Algorithm::HmacSha256, secret: vec![7; 32] };
        let auth = Authenticator::new(Mode::Tsig, std::slice::from_ref(&secret), &[], Vec::new(), named_glue::time::unix_now).unwrap();
        let auth = Arc::new(crate::execution::zoneset::SharedAuth::new(ZoneAuth::new(vec![("example.test.".into(), auth)]).unwrap()));
        let limit = crate::client::rrl::OrderLimitConfig { writes_per_second: 2, ..Default::default() };
        let filters = ClientFilters {
            auth: Some(auth),
            rrl: None,
            order_limit: crate::client::rrl::OrderLimiter::new(&limit).map(Arc::new),
            lie: false,
            local_reads: None,
            vouched: None,
        };
        let server = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        server.writable().await.unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let peer = client.local_addr().unwrap();
        let reply = || ReplyTo::Udp { socket: server.clone(), peer, rrl: None, lie: false };
        let (metrics, access) = (Metrics::new(0), AccessSection::default());
        let (to_gateway, mut gateway) = mpsc::channel(8);
        let mut probes = VouchTurn::default();
        let mut buf = [0u8; 512];
        let mut answered = |bytes: Vec<u8>| {
            dispatch(bytes, false, reply(), peer, &access, &filters, &to_gateway, &metrics, &mut probes);
        };
        // An IXFR over UDP (type 251), unsigned, from an address allow_transfer does not list.
        let mut ixfr = query(11, "example.test.");
        let at = ixfr.len() - 4;
        ixfr[at..at + 2].copy_from_slice(&251u16.to_be_bytes());
        answered(ixfr);
        let n = tokio::time::timeout(Duration::from_secs(2), client.recv(&mut buf)).await.expect("answered").unwrap();
        assert_eq!((buf[3] & 0x0f, &buf[..2]), (RCODE_REFUSED, &[0u8, 11][..]));
        assert!(n >= 12 && gateway.try_recv().is_err(), "not ordered");
        // Opcode UPDATE, one question announced, none there: FORMERR, not ordered.
        answered(vec![0, 12, 5 << 3, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        tokio::time::timeout(Duration::from_secs(2), client.recv(&mut buf)).await.expect("answered").unwrap();
        assert_eq!((buf[3] & 0x0f, buf[2] & 0x80), (exec::answer::RCODE_FORMERR, 0x80));
        assert!(gateway.try_recv().is_err(), "not ordered");
        // Validly signed updates: two a second pass, the third is refused.
        let key = tsig::Key::new(&secret.name, secret.algorithm, &secret.secret).unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        for id in 1..=3u16 {
            let mut update = query(id, "example.test.");
            update[2] = 5 << 3;
            answered(tsig::sign(&update, &key, now, 300, 0, Vec::new(), None));
        }
        assert!(gateway.try_recv().is_ok() && gateway.try_recv().is_ok(), "two ordered");
        assert!(gateway.try_recv().is_err(), "the third is over the rate");
        tokio::time::timeout(Duration::from_secs(2), client.recv(&mut buf)).await.expect("answered").unwrap();
        assert_eq!((buf[3] & 0x0f, &buf[..2]), (RCODE_REFUSED, &[0u8, 3][..]));
    }

    struct Broadcasts(std::sync::Mutex<Vec<Vec<u8>>>);

    impl crate::reads::vouched::ReadsOutbound for Broadcasts {
        fn send(&self, _: u16, _: Vec<u8>) {}
        fn broadcast(&self, message: Vec<u8>) {
            self.0.lock().unwrap().push(message);
        }
    }

    /// Ordered mode with vouched reads: the listener puts a plain query on the vouched path
    /// itself (its probe goes out, the gateway never sees it); an update still goes to the
    /// gateway.
    #[tokio::test]
    async fn vouched_reads_are_taken_by_the_listener() {
        let out = Arc::new(Broadcasts(Default::default()));
        let (_barrier, barrier) = tokio::sync::watch::channel(0);
        let (_executed, executed) = tokio::sync::watch::channel(0);
        let (fallback, _fallback_rx) = mpsc::channel(4);
        let wiring = crate::reads::vouched::Wiring { out: out.clone(), barrier, executed, fallback, fault: Default::default() };
        let named = named_glue::forward::Forwarder::new("127.0.0.1:9".parse().unwrap());
        let (vouched, _timeouts) =
            VouchedReads::start(4, 1, named, Arc::new(ReadCache::default()), Metrics::new(0), Duration::from_secs(1)..=Duration::from_secs(1), wiring);
        let filters = ClientFilters { auth: None, rrl: None, order_limit: None, lie: false, local_reads: None, vouched: Some(vouched.clone()) };
        let server = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let reply = || ReplyTo::Udp { socket: server.clone(), peer, rrl: None, lie: false };
        let (metrics, access) = (Metrics::new(0), AccessSection::default());
        let (to_gateway, mut gateway) = mpsc::channel(4);
        let mut probes = VouchTurn::default();
        for id in 1..=2 {
            dispatch(query(id, "www.example.test."), false, reply(), peer, &access, &filters, &to_gateway, &metrics, &mut probes);
        }
        assert!(gateway.try_recv().is_err(), "plain queries do not reach the gateway");
        vouched.send_probes(&mut probes);
        let sent = out.0.lock().unwrap().clone();
        assert_eq!(sent.len(), 1, "one probe message for both reads");
        assert!(matches!(exec::vouch::decode_read_wire(&sent[0]), Ok(exec::vouch::ReadWire::Probe { .. })), "a probe");
        let mut update = query(3, "www.example.test.");
        update[2] |= 5 << 3;
        dispatch(update, false, reply(), peer, &access, &filters, &to_gateway, &metrics, &mut probes);
        assert!(gateway.try_recv().is_ok(), "an update is ordered");
        assert!(probes.is_empty());
    }
}
