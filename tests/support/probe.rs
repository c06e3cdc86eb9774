//! A read probe for the tests that measure how long the service stops answering (whole-zone
//! signing, re-signing): `www.example.test A` every 50 ms, one query outstanding, 2 s timeout.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// When each answer came, which answers were wrong, and how many queries got none.
#[derive(Default)]
pub struct ProbeLog {
    pub answers: Vec<Instant>,
    pub bad: Vec<String>,
    pub unanswered: u32,
}

impl ProbeLog {
    pub fn within(&self, from: Instant, to: Instant) -> Vec<Instant> {
        self.answers.iter().copied().filter(|t| *t >= from && *t <= to).collect()
    }

    /// The largest gap between consecutive answers within [from, to], the edges counted as
    /// points, so that no answer at all in the interval gives its whole length.
    pub fn max_gap(&self, from: Instant, to: Instant) -> Duration {
        let mut points = vec![from];
        points.extend(self.within(from, to));
        points.push(to);
        points.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }
}

/// A running probe; [`ReadProbe::stop`] ends it and hands over what it saw.
pub struct ReadProbe {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<ProbeLog>>,
    thread: JoinHandle<()>,
}

impl ReadProbe {
    /// Starts probing the replica whose client port is `port`.
    pub fn start(port: u16) -> ReadProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(ProbeLog::default()));
        let thread = {
            let (stop, log) = (stop.clone(), log.clone());
            std::thread::spawn(move || run(port, &stop, &log))
        };
        ReadProbe { stop, log, thread }
    }

    pub fn stop(self) -> ProbeLog {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("probe thread");
        std::mem::take(&mut *self.log.lock().expect("probe log"))
    }
}

/// `www.example.test A`, no recursion, with this id.
fn query(id: u16) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in ["www", "example", "test"] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

fn run(port: u16, stop: &AtomicBool, log: &Mutex<ProbeLog>) {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("probe socket");
    socket.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    let mut id: u16 = 0;
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        id = id.wrapping_add(1);
        socket.send_to(&query(id), ("127.0.0.1", port)).expect("probe send");
        let mut answered = false;
        while sent.elapsed() < Duration::from_secs(2) {
            let Ok((len, _)) = socket.recv_from(&mut buf) else { break };
            if len < 12 || u16::from_be_bytes([buf[0], buf[1]]) != id {
                continue; // a late answer to an earlier query
            }
            let (rcode, ancount) = (buf[3] & 0x0f, u16::from_be_bytes([buf[6], buf[7]]));
            let mut l = log.lock().expect("probe log");
            if rcode == 0 && ancount > 0 {
                l.answers.push(Instant::now());
            } else {
                l.bad.push(format!("rcode {rcode}, {ancount} answers"));
            }
            answered = true;
            break;
        }
        if !answered {
            log.lock().expect("probe log").unanswered += 1;
        }
        if let Some(rest) = Duration::from_millis(50).checked_sub(sent.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

/// Prints a measurement line and appends it to the file named by `$env_var`, if set (the
/// benchmark scripts collect these for docs/BENCHMARKS.md).
pub fn report(env_var: &str, line: &str) {
    println!("{line}");
    if let Some(path) = std::env::var_os(env_var) {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}
