//! A UDP link: each client address gets its own upstream socket (a flow, as a NAT keeps one),
//! and datagrams in both directions wait the link's delay. Datagrams past a flow's budget, and
//! new clients past the flow limit, are dropped: a proxy must never block or grow on input.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::line;
use crate::{Rng, Shape};

/// A UDP link's parameters.
#[derive(Clone, Debug)]
pub struct UdpLink {
    pub listen: SocketAddr,
    pub target: SocketAddr,
    /// Applied to both directions.
    pub shape: Shape,
    /// Bytes held per direction of each flow.
    pub budget: usize,
    /// Client addresses served at once.
    pub max_flows: usize,
    /// A flow with no datagram from the target for this long is forgotten.
    pub idle: Duration,
}

impl UdpLink {
    pub fn new(listen: SocketAddr, target: SocketAddr, shape: Shape) -> Self {
        UdpLink { listen, target, shape, budget: 1 << 20, max_flows: 4096, idle: Duration::from_secs(120) }
    }
}

type Flows = Arc<Mutex<HashMap<SocketAddr, line::Sender>>>;

/// Binds the link and serves it in a task; returns the bound address.
pub async fn start(link: UdpLink, rng: Rng) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    let socket = Arc::new(UdpSocket::bind(link.listen).await?);
    let addr = socket.local_addr()?;
    Ok((addr, tokio::spawn(serve(socket, link, rng))))
}

async fn serve(socket: Arc<UdpSocket>, link: UdpLink, rng: Rng) {
    let flows: Flows = Arc::new(Mutex::new(HashMap::new()));
    let mut rng_in = rng.derive(0);
    let mut k = 0u64;
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, src) = match socket.recv_from(&mut buf).await {
            Ok(r) => r,
            // ICMP errors surface as receive errors on some systems; they end nothing.
            Err(_) => continue,
        };
        let now = Instant::now();
        if link.shape.draw_loss(&mut rng_in) {
            continue;
        }
        let at = now + link.shape.draw_delay(&mut rng_in);
        let data = buf[..n].to_vec();
        let mut table = flows.lock().expect("flow table lock");
        if let Some(tx) = table.get_mut(&src) {
            tx.try_push(at, data);
            continue;
        }
        if table.len() >= link.max_flows {
            continue;
        }
        k += 1;
        let (mut tx, rx) = line::channel(link.budget);
        tx.try_push(at, data);
        table.insert(src, tx);
        drop(table);
        tokio::spawn(flow(socket.clone(), flows.clone(), src, rx, link.clone(), rng.derive(k)));
    }
}

/// One client's flow: its upstream socket, the client-to-target writer and the
/// target-to-client reader and writer. Ends (and leaves the table) when idle.
async fn flow(socket: Arc<UdpSocket>, flows: Flows, src: SocketAddr, mut to_target: line::Receiver, link: UdpLink, mut rng: Rng) {
    let any: IpAddr = if link.target.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    let upstream = match UdpSocket::bind((any, 0)).await {
        Ok(s) => s,
        Err(_) => {
            flows.lock().expect("flow table lock").remove(&src);
            return;
        }
    };
    if upstream.connect(link.target).await.is_err() {
        flows.lock().expect("flow table lock").remove(&src);
        return;
    }
    let upstream = Arc::new(upstream);
    let (mut back_tx, mut back_rx) = line::channel(link.budget);
    let up = upstream.clone();
    let forward = tokio::spawn(async move {
        while let Some(d) = to_target.next().await {
            let _ = up.send(d.data()).await;
        }
    });
    let reply_socket = socket.clone();
    let backward = tokio::spawn(async move {
        while let Some(d) = back_rx.next().await {
            let _ = reply_socket.send_to(d.data(), src).await;
        }
    });
    let mut buf = vec![0u8; 65_536];
    loop {
        match tokio::time::timeout(link.idle, upstream.recv(&mut buf)).await {
            Err(_) => break,
            // A refused send (the target is down) reports here; keep the flow.
            Ok(Err(_)) => continue,
            Ok(Ok(n)) => {
                let now = Instant::now();
                if link.shape.draw_loss(&mut rng) {
                    continue;
                }
                back_tx.try_push(now + link.shape.draw_delay(&mut rng), buf[..n].to_vec());
            }
        }
    }
    // Removing the sender ends the forward writer; the backward writer ends with back_tx.
    flows.lock().expect("flow table lock").remove(&src);
    drop(back_tx);
    let _ = tokio::join!(forward, backward);
}
