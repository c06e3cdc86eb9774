//! Incremental re-signing against a real cluster: signatures with a validity of one
//! minute, re-signed in ordered slices for three validity periods, while a probe reads
//! 20 times a second and updates keep coming. delv and dnssec-verify must accept the
//! zone at every check. The read gaps and update acknowledgement times are recorded
//! (printed, and appended to $SDNS_RESIGN_REPORT when set) for docs/BENCHMARKS.md, not
//! asserted: timings on a shared 2-core machine are measurements, not correctness.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sdns_system_tests::{Cluster, ClusterOpts};

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

/// What the read probe saw: when each answer came, and how many queries got none.
#[derive(Default)]
struct Probe {
    answers: Vec<Instant>,
    bad: Vec<String>,
    unanswered: u32,
}

impl Probe {
    /// The largest gap between consecutive answers within [from, to].
    fn max_gap(&self, from: Instant, to: Instant) -> Duration {
        let inside: Vec<Instant> = self.answers.iter().copied().filter(|t| *t >= from && *t <= to).collect();
        inside.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }
}

/// Sends `www A` to `port` every 50 ms (one outstanding query, 2 s timeout) until `stop`.
fn probe(port: u16, stop: Arc<AtomicBool>, seen: Arc<Mutex<Probe>>) {
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
            let rcode = buf[3] & 0x0f;
            let ancount = u16::from_be_bytes([buf[6], buf[7]]);
            let mut s = seen.lock().unwrap();
            if rcode == 0 && ancount > 0 {
                s.answers.push(Instant::now());
            } else {
                s.bad.push(format!("rcode {rcode}, {ancount} answers"));
            }
            answered = true;
            break;
        }
        if !answered {
            seen.lock().unwrap().unanswered += 1;
        }
        if let Some(rest) = Duration::from_millis(50).checked_sub(sent.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

fn report(line: &str) {
    println!("{line}");
    if let Some(path) = std::env::var_os("SDNS_RESIGN_REPORT") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// The RRSIG over www's A RRset as replica `i` serves it: (expiration, inception).
fn www_sig_times(c: &Cluster, i: u16) -> Option<(String, String)> {
    let out = c.dig(i, &["www.example.test", "RRSIG", "+short"]);
    let line = out.lines().find(|l| l.starts_with("A "))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    Some((f.get(4)?.to_string(), f.get(5)?.to_string()))
}

fn metric(c: &Cluster, i: u16, name: &str) -> u64 {
    c.metrics(i).lines().find(|l| l.starts_with(name) && !l.starts_with('#')).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[test]
fn short_validity_zone_stays_valid_while_re_signed_in_slices() {
    const VALIDITY_S: u64 = 60;
    const PERIODS: u64 = 3;
    let c = Cluster::up(ClusterOpts {
        resign_after_s: Some(20),
        sign_zone_interval_s: Some(1),
        extra: vec!["--signature-validity-s".into(), VALIDITY_S.to_string(), "--resign-slice-interval-s".into(), "2".into(), "--resign-slice-rrsets".into(), "6".into()],
        ..Default::default()
    });
    let first = www_sig_times(&c, 0).expect("www A is signed");

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Probe::default()));
    let prober = {
        let (stop, seen, port) = (stop.clone(), seen.clone(), c.client_port(0));
        std::thread::spawn(move || probe(port, stop, seen))
    };

    let start = Instant::now();
    let end = start + Duration::from_secs(VALIDITY_S * PERIODS);
    let mut acks = Vec::new();
    let mut checks = 0;
    let mut k = 0;
    while Instant::now() < end {
        // An update, acknowledged by the replica it was sent to.
        k += 1;
        let sent = Instant::now();
        let (ok, out) = c.nsupdate(k % c.n, &format!("update add n{k}.example.test 300 A 192.0.2.{}", k % 250));
        assert!(ok, "update {k} failed: {out}\n{}", c.logs());
        acks.push(sent.elapsed());
        // The zone as validators see it, now: every signature current.
        let i = checks % c.n;
        c.verify_zone(i);
        let delv = c.delv(i, "www.example.test", "A");
        assert!(delv.contains("; fully validated"), "delv through replica {i} at +{:?}:\n{delv}", start.elapsed());
        checks += 1;
        std::thread::sleep(Duration::from_secs(4));
    }
    let resigning_until = Instant::now();

    // A whole-zone signing (sign-zone) while the probe runs, for comparison.
    let sign_from = Instant::now();
    let (ok, out) = c.sign_zone(&[0, 1]);
    assert!(ok, "sign-zone: {out}\n{}", c.logs());
    let sign_took = sign_from.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    prober.join().expect("probe thread");

    // Re-signing did happen, in slices, on every replica, and the signatures moved on.
    let now = www_sig_times(&c, 0).expect("www A is signed");
    assert!(now.1 > first.1 && now.0 > first.0, "www A was never re-signed: {first:?} -> {now:?}");
    for i in 0..c.n {
        assert!(metric(&c, i, "sdns_resigned_rrsets_total") > 0, "replica {i} re-signed nothing:\n{}", c.metrics(i));
    }
    c.verify_zone(0);
    // Replicas agree (slices keep coming; retry across one).
    let mut same = false;
    for _ in 0..6 {
        let zones: Vec<String> = (0..c.n).map(|i| c.axfr(i)).collect();
        if zones.iter().all(|z| z == &zones[0]) {
            same = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(700));
    }
    assert!(same, "replicas' zones differ after re-signing\n{}", c.logs());

    let s = seen.lock().unwrap();
    assert!(s.bad.is_empty(), "the probe got wrong answers: {:?}", s.bad);
    assert!(s.answers.len() as u64 > VALIDITY_S * PERIODS * 5, "the probe got only {} answers", s.answers.len());
    let slices = metric(&c, 0, "sdns_resign_slice_seconds_count");
    let slice_sum: f64 = c.metrics(0).lines().find(|l| l.starts_with("sdns_resign_slice_seconds_sum")).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let max_ack = acks.iter().max().copied().unwrap_or_default();
    report(&format!(
        "resign soak: validity {VALIDITY_S} s x {PERIODS}, {checks} checks (dnssec-verify + delv) all passed; probe 20 q/s: {} answers, {} unanswered (2 s timeout), max gap during re-signing {:?}; {} updates, max ack {:?}; replica 0: {} slices that re-signed, mean {:.3} s each, {} RRsets",
        s.answers.len(),
        s.unanswered,
        s.max_gap(start, resigning_until),
        acks.len(),
        max_ack,
        slices,
        if slices > 0 { slice_sum / slices as f64 } else { 0.0 },
        metric(&c, 0, "sdns_resigned_rrsets_total"),
    ));
    report(&format!("whole-zone sign-zone (in the background): took {sign_took:?}, max read gap meanwhile {:?}", s.max_gap(sign_from, sign_from + sign_took + Duration::from_secs(1))));
}
