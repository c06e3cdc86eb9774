//! A TCP link: accept, dial the target, and delay each direction's bytes by the link's shape.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::line;
use crate::{Rng, Shape};

/// Bytes read at most in one go; also the largest chunk in a delay line.
const READ_CHUNK: usize = 16 * 1024;

/// A TCP link's parameters.
#[derive(Clone, Debug)]
pub struct TcpLink {
    pub listen: SocketAddr,
    pub target: SocketAddr,
    /// Applied to both directions (the emulated links are symmetric).
    pub shape: Shape,
    /// Bytes held per direction of each connection.
    pub budget: usize,
    /// Bound on connecting to the target.
    pub connect_timeout: Duration,
    /// Accepted connections open at once; more are closed at once.
    pub max_connections: usize,
}

impl TcpLink {
    pub fn new(listen: SocketAddr, target: SocketAddr, shape: Shape) -> Self {
        TcpLink { listen, target, shape, budget: 1 << 20, connect_timeout: Duration::from_secs(5), max_connections: 256 }
    }
}

/// Binds the link and serves it in a task; returns the bound address (the listen port may be 0).
pub async fn start(link: TcpLink, rng: Rng) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(link.listen).await?;
    let addr = listener.local_addr()?;
    Ok((addr, tokio::spawn(serve(listener, link, rng))))
}

async fn serve(listener: TcpListener, link: TcpLink, rng: Rng) {
    let open = std::sync::Arc::new(tokio::sync::Semaphore::new(link.max_connections));
    let mut k = 0u64;
    loop {
        let (client, _) = match listener.accept().await {
            Ok(c) => c,
            // Out of descriptors and the like: back off instead of spinning.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = open.clone().try_acquire_owned() else { continue };
        k += 1;
        let (link, rng) = (link.clone(), rng.derive(k));
        tokio::spawn(async move {
            connection(client, &link, rng).await;
            drop(slot);
        });
    }
}

async fn connection(client: TcpStream, link: &TcpLink, rng: Rng) {
    let upstream = match tokio::time::timeout(link.connect_timeout, TcpStream::connect(link.target)).await {
        Ok(Ok(s)) => s,
        // The target is down: the client sees its connection closed, as a refused one.
        _ => return,
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let forward = tokio::spawn(direction(cr, uw, link.shape, link.budget, rng.derive(1)));
    let backward = tokio::spawn(direction(ur, cw, link.shape, link.budget, rng.derive(2)));
    let _ = tokio::join!(forward, backward);
}

/// One direction: a reader stamps chunks into the delay line, a writer sends them when due.
/// EOF is forwarded (a half close) once the bytes before it are delivered.
async fn direction(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shape: Shape, budget: usize, mut rng: Rng) {
    let (mut tx, mut rx) = line::channel(budget);
    let chunk = READ_CHUNK.min(tx.capacity());
    let reader = async move {
        let mut buf = vec![0u8; chunk];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let now = Instant::now();
            if shape.cut() {
                continue;
            }
            let mut delay = shape.draw_delay(&mut rng);
            if shape.draw_loss(&mut rng) {
                delay += shape.retransmit;
            }
            if !tx.push(now + delay, buf[..n].to_vec()).await {
                break;
            }
        }
        // Dropping tx ends the writer after the last chunk.
    };
    let writer = async move {
        while let Some(d) = rx.next().await {
            if to.write_all(d.data()).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
