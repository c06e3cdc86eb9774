//! The TLS mesh over real loopback sockets: authentication, attribution, limits, reconnects.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use mesh::pki::{generate_ca, issue_replica_cert, replica_dns_name, CaBundle};
use mesh::{encode_frame, tls_configs, Mesh, MeshConfig, TransportError, CHANNEL_ORDERING, CHANNEL_READS, CHANNEL_SIGNING};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::timeout;

/// Liveness bound for "eventually" in these tests; generous because CI shares 2 cores.
const EVENTUALLY: Duration = Duration::from_secs(20);

async fn bind_local() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

fn config(ca: &CaBundle, id: u16, listen: SocketAddr, peers: Vec<(u16, SocketAddr)>) -> MeshConfig {
    let cert = issue_replica_cert(ca, id).unwrap();
    let mut cfg = MeshConfig::new(id, listen, peers, ca.cert_pem.clone(), cert.cert_pem, cert.key_pem);
    cfg.backoff_min = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(200);
    cfg
}

/// Starts replicas 0..n of one cluster, each knowing all others.
async fn cluster(ca: &CaBundle, n: u16) -> Vec<Mesh> {
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(bind_local().await);
    }
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut meshes = Vec::new();
    for (id, listener) in listeners.into_iter().enumerate() {
        let peers = (0..n).filter(|&p| p as usize != id).map(|p| (p, addrs[p as usize])).collect();
        let cfg = config(ca, id as u16, addrs[id], peers);
        meshes.push(Mesh::start_with_listener(cfg, listener).await.unwrap());
    }
    meshes
}

async fn recv(rx: &mut mpsc::Receiver<(u16, Bytes)>) -> (u16, Bytes) {
    timeout(EVENTUALLY, rx.recv()).await.expect("no frame in time").expect("channel closed")
}

/// A raw TLS client presenting `cert` to the mesh at `addr` (which must be replica `server_id`).
async fn raw_client(
    ca_for_trust: &CaBundle,
    cert_ca: &CaBundle,
    cert_id: u16,
    addr: SocketAddr,
    server_id: u16,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let cert = issue_replica_cert(cert_ca, cert_id).unwrap();
    let (client, _) = tls_configs(&ca_for_trust.cert_pem, &cert.cert_pem, &cert.key_pem).unwrap();
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(replica_dns_name(server_id)).unwrap();
    tokio_rustls::TlsConnector::from(client).connect(name, tcp).await
}

/// True once the server closed the connection (or failed it); false if it stays open.
async fn closed_by_server<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> bool {
    let mut buf = [0u8; 16];
    matches!(timeout(EVENTUALLY, stream.read(&mut buf)).await, Ok(Ok(0)) | Ok(Err(_)))
}

#[tokio::test]
async fn mutual_auth_delivers_on_every_link_with_proven_sender() {
    let ca = generate_ca("mesh-test").unwrap();
    let meshes = cluster(&ca, 4).await;
    let mut ordering: Vec<_> = meshes.iter().map(|m| m.subscribe(CHANNEL_ORDERING).unwrap()).collect();
    let mut signing: Vec<_> = meshes.iter().map(|m| m.subscribe(CHANNEL_SIGNING).unwrap()).collect();
    for mesh in &meshes {
        let me = mesh.id();
        for to in 0..4u16 {
            if to != me {
                let payload = Bytes::from(format!("{me}->{to}"));
                mesh.sender().send(to, CHANNEL_ORDERING, payload).unwrap();
            }
        }
        mesh.sender().broadcast(CHANNEL_SIGNING, Bytes::from(format!("share from {me}"))).unwrap();
    }
    for (me, rx) in ordering.iter_mut().enumerate() {
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(recv(rx).await);
        }
        got.sort();
        let want: Vec<(u16, Bytes)> = (0..4u16).filter(|&f| f as usize != me).map(|f| (f, Bytes::from(format!("{f}->{me}")))).collect();
        assert_eq!(got, want, "replica {me} ordering channel");
    }
    for (me, rx) in signing.iter_mut().enumerate() {
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(recv(rx).await);
        }
        got.sort();
        let want: Vec<(u16, Bytes)> = (0..4u16).filter(|&f| f as usize != me).map(|f| (f, Bytes::from(format!("share from {f}")))).collect();
        assert_eq!(got, want, "replica {me} signing channel");
    }
    for mesh in &meshes {
        for status in mesh.peer_status() {
            assert!(status.connected, "{status:?}");
            assert_eq!(status.frames_dropped, 0);
        }
    }
    let ordering_rx = ordering.pop().unwrap();
    for mesh in meshes {
        mesh.shutdown().await;
    }
    // Subscribers see the end of the stream once the mesh is shut down.
    let mut ordering_rx = ordering_rx;
    assert!(timeout(EVENTUALLY, ordering_rx.recv()).await.unwrap().is_none());
}

#[tokio::test]
async fn peer_with_certificate_from_another_ca_is_rejected() {
    let ca = generate_ca("cluster-a").unwrap();
    let foreign = generate_ca("cluster-b").unwrap();
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    let mesh = Mesh::start_with_listener(config(&ca, 0, addr, vec![(1, "127.0.0.1:9".parse().unwrap())]), listener).await.unwrap();
    let mut rx = mesh.subscribe(CHANNEL_ORDERING).unwrap();

    // A client that trusts the right CA but holds a replica-1 certificate from the foreign CA:
    // the server must refuse it. With TLS 1.3 the client may finish its side before the
    // server's verdict arrives, so the refusal shows as a failed handshake or a closed stream.
    match raw_client(&ca, &foreign, 1, addr, 0).await {
        Err(_) => {}
        Ok(mut stream) => {
            let mut frame = Vec::new();
            encode_frame(CHANNEL_ORDERING, b"forged", &mut frame);
            let _ = stream.write_all(&frame).await;
            let _ = stream.flush().await;
            assert!(closed_by_server(&mut stream).await, "server kept a foreign-CA connection open");
        }
    }
    // A foreign-CA mesh cannot dial in either, and it rejects our certificate in turn.
    let foreign_listener = bind_local().await;
    let foreign_addr = foreign_listener.local_addr().unwrap();
    let foreign_mesh = Mesh::start_with_listener(config(&foreign, 1, foreign_addr, vec![(0, addr)]), foreign_listener).await.unwrap();
    foreign_mesh.sender().send(0, CHANNEL_ORDERING, Bytes::from_static(b"forged")).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(rx.try_recv().is_err(), "a frame from a foreign-CA peer was delivered");
    let status = &foreign_mesh.peer_status()[0];
    assert!(!status.connected && status.connects == 0, "{status:?}");
    assert!(status.last_error.is_some());
    assert_eq!(mesh.peer_status()[0].frames_received, 0);
    foreign_mesh.shutdown().await;
    mesh.shutdown().await;
}

#[tokio::test]
async fn frames_are_attributed_to_the_certificate_not_the_claim() {
    let ca = generate_ca("impostor-test").unwrap();
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    let dummy: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mesh = Mesh::start_with_listener(config(&ca, 0, addr, vec![(2, dummy), (3, dummy)]), listener).await.unwrap();
    let mut rx = mesh.subscribe(CHANNEL_ORDERING).unwrap();

    // Replica 2's certificate, with a payload claiming to be replica 3.
    let mut stream = raw_client(&ca, &ca, 2, addr, 0).await.unwrap();
    let mut frame = Vec::new();
    encode_frame(CHANNEL_ORDERING, b"from: replica 3", &mut frame);
    stream.write_all(&frame).await.unwrap();
    stream.flush().await.unwrap();
    let (from, payload) = recv(&mut rx).await;
    assert_eq!(from, 2, "frame attributed to a claimed identity");
    assert_eq!(&payload[..], b"from: replica 3");
    let status = mesh.peer_status();
    assert_eq!(status.iter().find(|s| s.id == 3).unwrap().frames_received, 0);

    // A mesh cannot even be configured to be replica 3 with replica 2's certificate.
    let cert2 = issue_replica_cert(&ca, 2).unwrap();
    let cfg = MeshConfig::new(3, dummy, vec![(0, addr)], ca.cert_pem.clone(), cert2.cert_pem, cert2.key_pem);
    match Mesh::start(cfg).await {
        Err(TransportError::Config { field: "cert_pem", .. }) => {}
        other => panic!("expected a cert_pem config error, got {:?}", other.err()),
    }
    mesh.shutdown().await;
}

#[tokio::test]
async fn dialer_rejects_a_server_that_is_not_the_replica_it_dialed() {
    let ca = generate_ca("dial-test").unwrap();
    let meshes = cluster(&ca, 3).await;
    // Replica 5 believes replica 1 lives where replica 2 actually listens.
    let addr2 = meshes[2].local_addr();
    let listener = bind_local().await;
    let addr5 = listener.local_addr().unwrap();
    let confused = Mesh::start_with_listener(config(&ca, 5, addr5, vec![(1, addr2)]), listener).await.unwrap();
    confused.sender().send(1, CHANNEL_ORDERING, Bytes::from_static(b"hello")).unwrap();
    let error = timeout(EVENTUALLY, async {
        loop {
            if let Some(e) = confused.peer_status()[0].last_error.clone() {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    let status = &confused.peer_status()[0];
    assert!(!status.connected && status.connects == 0, "{status:?}");
    assert!(error.contains("connect") && error.contains("certificate"), "{error}");
    confused.shutdown().await;
    for mesh in meshes {
        mesh.shutdown().await;
    }
}

#[tokio::test]
async fn oversize_frames_are_refused_by_sender_and_receiver() {
    let ca = generate_ca("oversize-test").unwrap();
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    let mut cfg = config(&ca, 0, addr, vec![(1, "127.0.0.1:9".parse().unwrap())]);
    cfg.max_frame_bytes = 1024;
    let mesh = Mesh::start_with_listener(cfg, listener).await.unwrap();
    let mut rx = mesh.subscribe(CHANNEL_ORDERING).unwrap();

    // The sending side checks its own limit.
    match mesh.sender().send(1, CHANNEL_ORDERING, Bytes::from(vec![0u8; 1025])) {
        Err(TransportError::FrameTooLarge { len: 1025, max: 1024 }) => {}
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }

    // A frame at the limit passes; one byte more closes the connection.
    let mut stream = raw_client(&ca, &ca, 1, addr, 0).await.unwrap();
    let mut frame = Vec::new();
    encode_frame(CHANNEL_ORDERING, &[7u8; 1024], &mut frame);
    stream.write_all(&frame).await.unwrap();
    stream.flush().await.unwrap();
    let (from, payload) = recv(&mut rx).await;
    assert_eq!((from, payload.len()), (1, 1024));

    frame.clear();
    encode_frame(CHANNEL_ORDERING, &[8u8; 1025], &mut frame);
    stream.write_all(&frame).await.unwrap();
    stream.flush().await.unwrap();
    assert!(closed_by_server(&mut stream).await, "oversize frame did not close the connection");
    assert!(rx.try_recv().is_err());
    let error = mesh.peer_status()[0].last_error.clone().unwrap_or_default();
    assert!(error.contains("exceeds limit 1024"), "{error}");

    // A huge declared length is refused from the header alone (no allocation of 4 GiB).
    let mut stream = raw_client(&ca, &ca, 1, addr, 0).await.unwrap();
    stream.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    assert!(closed_by_server(&mut stream).await);
    mesh.shutdown().await;
}

#[tokio::test]
async fn reconnects_after_a_peer_restarts() {
    let ca = generate_ca("restart-test").unwrap();
    let mut meshes = cluster(&ca, 2).await;
    let mesh1 = meshes.pop().unwrap();
    let mesh0 = meshes.pop().unwrap();
    let addr1 = mesh1.local_addr();
    let addr0 = mesh0.local_addr();
    let mut rx0 = mesh0.subscribe(CHANNEL_ORDERING).unwrap();
    let mut rx1 = mesh1.subscribe(CHANNEL_ORDERING).unwrap();
    mesh0.sender().send(1, CHANNEL_ORDERING, Bytes::from_static(b"before")).unwrap();
    assert_eq!(recv(&mut rx1).await, (0, Bytes::from_static(b"before")));
    mesh1.shutdown().await;
    drop(rx1);

    // Replica 1 comes back on the same address with fresh state.
    let listener = timeout(EVENTUALLY, async {
        loop {
            match TcpListener::bind(addr1).await {
                Ok(l) => return l,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .unwrap();
    let mesh1 = Mesh::start_with_listener(config(&ca, 1, addr1, vec![(0, addr0)]), listener).await.unwrap();
    let mut rx1 = mesh1.subscribe(CHANNEL_ORDERING).unwrap();
    // Frames sent while the old link was dying may be lost; keep sending until one arrives.
    let got = timeout(EVENTUALLY, async {
        loop {
            mesh0.sender().send(1, CHANNEL_ORDERING, Bytes::from_static(b"after")).unwrap();
            if let Ok(Some(frame)) = timeout(Duration::from_millis(100), rx1.recv()).await {
                return frame;
            }
        }
    })
    .await
    .expect("no frame after the restart");
    assert_eq!(got, (0, Bytes::from_static(b"after")));
    assert!(mesh0.peer_status()[0].connects >= 2);
    // And the restarted replica can talk back.
    mesh1.sender().send(0, CHANNEL_ORDERING, Bytes::from_static(b"back")).unwrap();
    assert_eq!(recv(&mut rx0).await, (1, Bytes::from_static(b"back")));
    mesh1.shutdown().await;
    mesh0.shutdown().await;
}

#[tokio::test]
async fn full_send_queue_drops_oldest_and_counts() {
    let ca = generate_ca("queue-test").unwrap();
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    // The peer is unreachable, so frames pile up in its queue.
    let mut cfg = config(&ca, 0, addr, vec![(1, "127.0.0.1:9".parse().unwrap())]);
    cfg.queue_frames = 3;
    let mesh = Mesh::start_with_listener(cfg, listener).await.unwrap();
    for i in 0..5u8 {
        mesh.sender().send(1, CHANNEL_ORDERING, Bytes::from(vec![i])).unwrap();
    }
    let status = &mesh.peer_status()[0];
    assert_eq!((status.frames_queued, status.frames_dropped, status.frames_sent), (3, 2, 0));
    assert!(matches!(mesh.sender().send(9, CHANNEL_ORDERING, Bytes::new()), Err(TransportError::UnknownPeer(9))));
    mesh.shutdown().await;
}

#[tokio::test]
async fn send_queue_is_bounded_in_bytes() {
    let ca = generate_ca("queue-bytes-test").unwrap();
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    let mut cfg = config(&ca, 0, addr, vec![(1, "127.0.0.1:9".parse().unwrap())]);
    cfg.max_frame_bytes = 1000;
    cfg.queue_bytes = 2500;
    let mesh = Mesh::start_with_listener(cfg, listener).await.unwrap();
    // Frames of 1000 bytes: only two fit in 2500 bytes, whatever the frame bound (4096).
    for i in 0..5u8 {
        mesh.sender().send(1, CHANNEL_ORDERING, Bytes::from(vec![i; 1000])).unwrap();
    }
    let status = &mesh.peer_status()[0];
    assert_eq!((status.frames_queued, status.bytes_queued, status.frames_dropped), (2, 2000, 3));
    // A small frame still fits beside them without dropping anything.
    mesh.sender().send(1, CHANNEL_ORDERING, Bytes::from(vec![9; 400])).unwrap();
    let status = &mesh.peer_status()[0];
    assert_eq!((status.frames_queued, status.bytes_queued, status.frames_dropped), (3, 2400, 3));
    mesh.shutdown().await;
}

#[tokio::test]
async fn receive_queue_is_bounded_in_bytes_per_peer() {
    // Replica 1 does not read; replica 0 sends 100 frames of 256 KiB (25 MiB). Replica 1 holds
    // at most its 2 MiB budget for replica 0 (plus the short merged queue): the rest waits in
    // TCP and, after a second each, is dropped, although 100 frames are far within the frame
    // bound (4096).
    let ca = generate_ca("receive-bytes-test").unwrap();
    let (l0, l1) = (bind_local().await, bind_local().await);
    let (a0, a1) = (l0.local_addr().unwrap(), l1.local_addr().unwrap());
    let mut c0 = config(&ca, 0, a0, vec![(1, a1)]);
    let mut c1 = config(&ca, 1, a1, vec![(0, a0)]);
    for c in [&mut c0, &mut c1] {
        c.max_frame_bytes = 256 * 1024;
        c.queue_bytes = 2 * 1024 * 1024;
    }
    let m0 = Mesh::start_with_listener(c0, l0).await.unwrap();
    let m1 = Mesh::start_with_listener(c1, l1).await.unwrap();
    let mut rx = m1.subscribe(CHANNEL_ORDERING).unwrap();
    // Sent in chunks that fit the sender's own 2 MiB queue.
    for chunk in 0..10u8 {
        for i in 0..10u8 {
            m0.sender().send(1, CHANNEL_ORDERING, Bytes::from(vec![chunk * 10 + i; 256 * 1024])).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dropped = m1.peer_status()[0].frames_received_dropped;
    assert!(dropped > 0, "the receiver held more than its byte budget without dropping");
    // What was queued is still delivered once the consumer reads.
    let (from, _) = recv(&mut rx).await;
    assert_eq!(from, 0);
    m0.shutdown().await;
    m1.shutdown().await;
}

/// A channel handled inline gets every frame with its proven sender, in order, while the
/// other channels keep their subscribers; a channel is handled inline or subscribed, once.
#[tokio::test]
async fn inline_handler_takes_its_channel_with_the_proven_sender() {
    let ca = generate_ca("inline-test").unwrap();
    let meshes = cluster(&ca, 3).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    meshes[0].handle_inline(CHANNEL_READS, std::sync::Arc::new(move |from: u16, payload: Bytes| drop(tx.send((from, payload))))).unwrap();
    assert!(matches!(meshes[0].subscribe(CHANNEL_READS), Err(TransportError::Config { .. })), "inline and subscribed at once");
    assert!(matches!(meshes[0].handle_inline(CHANNEL_READS, std::sync::Arc::new(|_: u16, _: Bytes| {})), Err(TransportError::Config { .. })), "two handlers");
    let mut ordering = meshes[0].subscribe(CHANNEL_ORDERING).unwrap();
    assert!(
        matches!(meshes[0].handle_inline(CHANNEL_ORDERING, std::sync::Arc::new(|_: u16, _: Bytes| {})), Err(TransportError::Config { .. })),
        "subscribed already"
    );
    for i in 0..5u8 {
        meshes[1].sender().send(0, CHANNEL_READS, Bytes::from(vec![1, i])).unwrap();
        meshes[2].sender().send(0, CHANNEL_READS, Bytes::from(vec![2, i])).unwrap();
    }
    meshes[2].sender().send(0, CHANNEL_ORDERING, Bytes::from_static(b"ordered")).unwrap();
    let mut next = [0u8; 3];
    for _ in 0..10 {
        let (from, payload) = timeout(EVENTUALLY, rx.recv()).await.expect("no frame in time").unwrap();
        assert_eq!(payload[..], [from as u8, next[from as usize]], "in order, attributed to the link's certificate");
        next[from as usize] += 1;
    }
    assert_eq!(recv(&mut ordering).await, (2, Bytes::from_static(b"ordered")));
    for m in meshes {
        m.shutdown().await;
    }
}

#[test]
fn config_errors_name_the_field() {
    let ca = generate_ca("config-test").unwrap();
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let base = config(&ca, 0, addr, vec![(1, addr)]);
    assert!(base.validate().is_ok());
    let field_of = |cfg: MeshConfig| match cfg.validate() {
        Err(TransportError::Config { field, .. }) => field,
        Err(TransportError::Pem { what, .. }) => what,
        other => panic!("expected an error, got {other:?}"),
    };
    let mut c = base.clone();
    c.max_frame_bytes = 0;
    assert_eq!(field_of(c), "max_frame_bytes");
    let mut c = base.clone();
    c.queue_frames = 0;
    assert_eq!(field_of(c), "queue_frames");
    let mut c = base.clone();
    c.queue_bytes = c.max_frame_bytes - 1;
    assert_eq!(field_of(c), "queue_bytes");
    let mut c = base.clone();
    c.backoff_max = Duration::from_millis(1);
    assert_eq!(field_of(c), "backoff_max");
    let mut c = base.clone();
    c.peers.push((0, addr));
    assert_eq!(field_of(c), "peers");
    let mut c = base.clone();
    c.peers.push((1, addr));
    assert_eq!(field_of(c), "peers");
    let mut c = base.clone();
    c.ca_cert_pem = "not pem".into();
    assert_eq!(field_of(c), "ca_cert_pem");
    let mut c = base.clone();
    c.key_pem = String::new();
    assert_eq!(field_of(c), "key_pem");
    let mut c = base.clone();
    c.id = 4;
    assert_eq!(field_of(c), "cert_pem");
    // Replica 1's key with replica 0's certificate.
    let mut c = base;
    c.key_pem = issue_replica_cert(&ca, 1).unwrap().key_pem;
    assert_eq!(field_of(c), "key_pem");
    // Keys never show in Debug output.
    let shown = format!("{:?}", config(&ca, 0, addr, vec![]));
    assert!(!shown.contains("PRIVATE KEY"));
}

#[tokio::test]
async fn keepalive_keeps_idle_links_up_and_silent_peers_are_cut() {
    let ca = generate_ca("keepalive-test").unwrap();
    let mut listeners = Vec::new();
    for _ in 0..2 {
        listeners.push(bind_local().await);
    }
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut meshes = Vec::new();
    for (id, listener) in listeners.into_iter().enumerate() {
        let mut cfg = config(&ca, id as u16, addrs[id], vec![(1 - id as u16, addrs[1 - id])]);
        cfg.keepalive = Some(Duration::from_millis(500));
        meshes.push(Mesh::start_with_listener(cfg, listener).await.unwrap());
    }
    let mut rx1 = meshes[1].subscribe(CHANNEL_ORDERING).unwrap();
    meshes[0].sender().send(1, CHANNEL_ORDERING, Bytes::from_static(b"first")).unwrap();
    assert_eq!(recv(&mut rx1).await.1, Bytes::from_static(b"first"));
    // Idle for two silence limits (3 x 500 ms): keepalives hold the link, no reconnect.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    meshes[0].sender().send(1, CHANNEL_ORDERING, Bytes::from_static(b"second")).unwrap();
    assert_eq!(recv(&mut rx1).await.1, Bytes::from_static(b"second"));
    assert_eq!(meshes[0].peer_status()[0].connects, 1, "idle link was dropped despite keepalives");

    // An authenticated peer that goes silent is cut after three keepalive intervals.
    let mut silent = raw_client(&ca, &ca, 0, addrs[1], 1).await.unwrap();
    assert!(closed_by_server(&mut silent).await, "silent connection kept open");
    for mesh in meshes {
        mesh.shutdown().await;
    }
}
