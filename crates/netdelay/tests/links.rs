//! The proxies over real loopback sockets: nothing arrives before the link's delay, order is
//! kept, loss 1.0 drops everything. Only lower bounds on time are asserted (the machine may be
//! slow; it is never faster than the delay).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use netdelay::tcp::{self, TcpLink};
use netdelay::udp::{self, UdpLink};
use netdelay::{Rng, Shape};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn tcp_echo() -> SocketAddr {
    let l = TcpListener::bind(any()).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn udp_echo() -> SocketAddr {
    let s = UdpSocket::bind(any()).await.unwrap();
    let addr = s.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        while let Ok((n, from)) = s.recv_from(&mut buf).await {
            let _ = s.send_to(&buf[..n], from).await;
        }
    });
    addr
}

#[tokio::test]
async fn tcp_round_trip_takes_at_least_twice_the_delay_and_keeps_order() {
    let echo = tcp_echo().await;
    let delay = Duration::from_millis(60);
    let (proxy, _task) = tcp::start(TcpLink::new(any(), echo, Shape::delay(delay)), Rng::new(1)).await.unwrap();
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let t0 = Instant::now();
    s.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");
    let rtt = t0.elapsed();
    assert!(rtt >= 2 * delay, "echo came back after {rtt:?}, before two one-way delays of {delay:?}");

    // 2 MB of numbered bytes (more than the 1 MiB budget, in many chunks), written and read at
    // once: every byte comes back, in order.
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = s.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&sent).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut back = Vec::new();
    r.read_to_end(&mut back).await.unwrap();
    writer.await.unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "bytes came back out of order");
}

#[tokio::test]
async fn tcp_cut_link_delivers_nothing() {
    let echo = tcp_echo().await;
    let shape = Shape { loss: 1.0, ..Shape::delay(Duration::from_millis(1)) };
    let (proxy, _task) = tcp::start(TcpLink::new(any(), echo, shape), Rng::new(2)).await.unwrap();
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(b"anyone there?").await.unwrap();
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_millis(400), s.read(&mut buf)).await;
    assert!(r.is_err(), "a cut link delivered {r:?}");
}

#[tokio::test]
async fn tcp_loss_costs_a_retransmission_timeout() {
    let echo = tcp_echo().await;
    // Every chunk "lost" once: each direction waits one retransmission timeout more.
    let shape = Shape { loss: 0.999_999, retransmit: Duration::from_millis(150), ..Shape::delay(Duration::from_millis(10)) };
    let (proxy, _task) = tcp::start(TcpLink::new(any(), echo, shape), Rng::new(3)).await.unwrap();
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let t0 = Instant::now();
    s.write_all(b"x").await.unwrap();
    let mut got = [0u8; 1];
    s.read_exact(&mut got).await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(2 * 160), "{:?}", t0.elapsed());
}

#[tokio::test]
async fn udp_round_trip_takes_at_least_twice_the_delay_and_keeps_order() {
    let echo = udp_echo().await;
    let delay = Duration::from_millis(50);
    let (proxy, _task) = udp::start(UdpLink::new(any(), echo, Shape::delay(delay)), Rng::new(4)).await.unwrap();
    let c = UdpSocket::bind(any()).await.unwrap();
    c.connect(proxy).await.unwrap();
    let t0 = Instant::now();
    c.send(b"q").await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), c.recv(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"q");
    assert!(t0.elapsed() >= 2 * delay, "{:?}", t0.elapsed());

    // A burst of numbered datagrams comes back in order (jitter 20 ms does not reorder).
    let shape = Shape { jitter: Duration::from_millis(20), ..Shape::delay(Duration::from_millis(5)) };
    let (proxy, _task) = udp::start(UdpLink::new(any(), echo, shape), Rng::new(5)).await.unwrap();
    let c = UdpSocket::bind(any()).await.unwrap();
    c.connect(proxy).await.unwrap();
    for i in 0..50u8 {
        c.send(&[i]).await.unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 50 {
        match tokio::time::timeout(Duration::from_secs(5), c.recv(&mut buf)).await {
            Ok(Ok(1)) => got.push(buf[0]),
            other => panic!("after {} datagrams: {other:?}", got.len()),
        }
    }
    assert_eq!(got, (0..50u8).collect::<Vec<_>>());
}

#[tokio::test]
async fn udp_loss_one_drops_everything() {
    let echo = udp_echo().await;
    let shape = Shape { loss: 1.0, ..Shape::delay(Duration::ZERO) };
    let (proxy, _task) = udp::start(UdpLink::new(any(), echo, shape), Rng::new(6)).await.unwrap();
    let c = UdpSocket::bind(any()).await.unwrap();
    c.connect(proxy).await.unwrap();
    for _ in 0..20 {
        c.send(b"lost").await.unwrap();
    }
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_millis(400), c.recv(&mut buf)).await;
    assert!(r.is_err(), "a datagram got through: {r:?}");
}

#[tokio::test]
async fn udp_clients_get_their_own_answers() {
    let echo = udp_echo().await;
    let (proxy, _task) = udp::start(UdpLink::new(any(), echo, Shape::delay(Duration::from_millis(5))), Rng::new(7)).await.unwrap();
    let a = UdpSocket::bind(any()).await.unwrap();
    let b = UdpSocket::bind(any()).await.unwrap();
    a.send_to(b"from a", proxy).await.unwrap();
    b.send_to(b"from b", proxy).await.unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = tokio::time::timeout(Duration::from_secs(5), a.recv_from(&mut buf)).await.unwrap().unwrap();
    assert_eq!((&buf[..n], from), (&b"from a"[..], proxy));
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), b.recv_from(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"from b");
}
