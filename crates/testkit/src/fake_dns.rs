//! A fake DNS server for tests: UDP and TCP on one loopback port, each message answered by a
//! function of its bytes (or not at all), on plain threads so that sync and async tests alike
//! can use it. It stops when dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// How the server answers one message: the answer's bytes, or `None` for silence.
pub type Answer = dyn Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync;

/// A running fake server; see the module documentation.
#[derive(Debug)]
pub struct FakeDns {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl FakeDns {
    /// Starts a server on a port of 127.0.0.1 free for both UDP and TCP. Each message is
    /// answered in a thread of its own, so an `answer` that blocks (a relay to another server)
    /// holds up nothing else.
    pub fn start(answer: impl Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync + 'static) -> FakeDns {
        // The kernel's free UDP port may be taken for TCP: try a few.
        let (udp, addr, tcp) = (0..100)
            .find_map(|_| {
                let udp = UdpSocket::bind("127.0.0.1:0").expect("fake dns: udp socket");
                let addr = udp.local_addr().expect("fake dns: local address");
                TcpListener::bind(addr).ok().map(|tcp| (udp, addr, tcp))
            })
            .expect("fake dns: a loopback port free for both UDP and TCP");
        udp.set_read_timeout(Some(Duration::from_millis(50))).expect("fake dns: udp timeout");
        tcp.set_nonblocking(true).expect("fake dns: nonblocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let answer: Arc<Answer> = Arc::new(answer);
        {
            let (stop, answer) = (stop.clone(), answer.clone());
            thread::spawn(move || serve_udp(udp, &stop, &answer));
        }
        {
            let (stop, answer) = (stop.clone(), answer.clone());
            thread::spawn(move || serve_tcp(tcp, &stop, &answer));
        }
        FakeDns { addr, stop }
    }

    /// Where it listens (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for FakeDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve_udp(udp: UdpSocket, stop: &AtomicBool, answer: &Arc<Answer>) {
    let mut buf = vec![0u8; 65_535];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, peer)) = udp.recv_from(&mut buf) else { continue };
        let (query, answer) = (buf[..n].to_vec(), answer.clone());
        let Ok(udp) = udp.try_clone() else { continue };
        thread::spawn(move || {
            if let Some(reply) = answer(&query) {
                let _ = udp.send_to(&reply, peer);
            }
        });
    }
}

fn serve_tcp(tcp: TcpListener, stop: &AtomicBool, answer: &Arc<Answer>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok((conn, _)) = tcp.accept() else {
            thread::sleep(Duration::from_millis(20));
            continue;
        };
        let answer = answer.clone();
        thread::spawn(move || serve_connection(conn, &answer));
    }
}

/// Length-prefixed messages (RFC 1035 4.2.2) until the client closes, stays silent for 5 s,
/// or is not answered.
fn serve_connection(mut conn: TcpStream, answer: &Arc<Answer>) {
    if conn.set_nonblocking(false).is_err() || conn.set_read_timeout(Some(Duration::from_secs(5))).is_err() {
        return;
    }
    loop {
        let mut len = [0u8; 2];
        if conn.read_exact(&mut len).is_err() {
            return;
        }
        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if conn.read_exact(&mut query).is_err() {
            return;
        }
        let Some(reply) = answer(&query) else { return };
        let Ok(reply_len) = u16::try_from(reply.len()) else { return };
        if conn.write_all(&reply_len.to_be_bytes()).and_then(|()| conn.write_all(&reply)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Echoes the message with the QR bit set, and stays silent for messages starting with 0.
    fn echo(query: &[u8]) -> Option<Vec<u8>> {
        let mut reply = query.to_vec();
        (*reply.first()? != 0).then(|| {
            if let Some(flags) = reply.get_mut(2) {
                *flags |= 0x80;
            }
            reply
        })
    }

    #[test]
    fn answers_over_udp_and_tcp_and_stays_silent_when_told() {
        let server = FakeDns::start(echo);
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        client.send_to(&[1, 2, 0, 4], server.addr()).unwrap();
        let mut buf = [0u8; 64];
        let (n, _) = client.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &[1, 2, 0x80, 4]);
        client.send_to(&[0, 2, 0, 4], server.addr()).unwrap();
        assert!(client.recv_from(&mut buf).is_err(), "a message answered by None gets no reply");

        let mut tcp = TcpStream::connect(server.addr()).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        for _ in 0..2 {
            tcp.write_all(&[0, 3, 7, 8, 1]).unwrap();
            let mut framed = [0u8; 5];
            tcp.read_exact(&mut framed).unwrap();
            assert_eq!(framed, [0, 3, 7, 8, 0x81]);
        }
    }
}
