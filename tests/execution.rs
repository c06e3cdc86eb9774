//! System tests of deterministic execution: no client stalls the replicas, and
//! whole-zone signing runs only when t+1 replicas ask for it.

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use sdns_system_tests::{run, text, Cluster, ClusterOpts, Replicas};

/// `example.test ANY` with EDNS and the DO bit (what `dig ANY +dnssec` sends), framed for TCP.
fn any_dnssec_query(id: u16) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&[0x00, 0x00, 0, 1, 0, 0, 0, 0, 0, 1]);
    for label in ["example", "test"] {
        m.push(label.len() as u8);
        m.extend_from_slice(label.as_bytes());
    }
    m.push(0);
    m.extend_from_slice(&[0, 255, 0, 1]); // ANY, IN
                                          // OPT: root owner, type 41, UDP size 4096, DO set, no options.
    m.extend_from_slice(&[0, 0, 41, 0x10, 0x00, 0, 0, 0x80, 0, 0, 0]);
    let mut framed = (m.len() as u16).to_be_bytes().to_vec();
    framed.extend(m);
    framed
}

/// A client that pipelines `count` queries on one connection with a tiny receive
/// buffer and never reads. Returns the socket, which the caller holds open.
fn slow_reader(port: u16, count: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    socket2::SockRef::from(&s).set_recv_buffer_size(1024).expect("SO_RCVBUF");
    let mut w = s.try_clone().expect("clone");
    w.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    std::thread::spawn(move || {
        for id in 0..count {
            // Once the replica stops reading this connection, writes block and time out.
            if w.write_all(&any_dnssec_query(id)).is_err() {
                break;
            }
        }
    });
    s
}

fn counter(metrics: &str, reason: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("sdns_dropped_total") && l.contains(&format!("reason=\"{reason}\"")))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn clients_that_never_read_stall_nothing() {
    let c = Cluster::up(ClusterOpts::default());
    // One such client per replica, each pipelining thousands of large answers.
    let slow: Vec<TcpStream> = (0..c.n).map(|i| slow_reader(c.client_port(i), 3000)).collect();
    std::thread::sleep(Duration::from_millis(500));
    // While they hold their sockets, reads and TSIG updates through every replica work.
    let started = Instant::now();
    for i in 0..c.n {
        let out = c.dig(i, &["www.example.test", "A", "+dnssec"]);
        assert!(out.contains("status: NOERROR") && out.contains("RRSIG"), "read through replica {i} with a slow reader attached:\n{out}\n{}", c.logs());
        let (ok, out) = c.nsupdate(i, &format!("update add slow{i}.example.test 300 A 192.0.2.{}", 40 + i));
        assert!(ok, "update through replica {i} with a slow reader attached:\n{out}\n{}", c.logs());
    }
    let elapsed = started.elapsed();
    c.eventually("every update applied", |i| {
        (0..c.n).all(|k| c.dig(i, &[&format!("slow{k}.example.test"), "A", "+short"]).trim() == format!("192.0.2.{}", 40 + k))
    });
    // The replicas stopped reading the slow connections and then cut them off; answers
    // that found no room were dropped and counted.
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..c.n {
        loop {
            let m = c.metrics(i);
            if counter(&m, "tcp_write_timeout") >= 1 {
                break;
            }
            assert!(Instant::now() < deadline, "replica {i} never timed out the slow reader's writes:\n{m}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    drop(slow);
    eprintln!("reads and updates through {} replicas with slow readers attached took {elapsed:?}", c.n);
    let reference = c.axfr(0);
    for i in 1..c.n {
        assert_eq!(c.axfr(i), reference, "replica {i}'s zone differs\n{}", c.logs());
    }
}

/// The inception of the RRSIG over www's A RRset at replica `i`.
fn inception(c: &Cluster, i: u16) -> String {
    let out = c.dig(i, &["www.example.test", "RRSIG", "+short"]);
    out.lines().find(|l| l.starts_with("A ")).and_then(|l| l.split_whitespace().nth(5)).unwrap_or_default().to_string()
}

#[test]
fn sign_zone_runs_only_when_t_plus_one_replicas_ask() {
    let c = Cluster::up(ClusterOpts { sign_zone_interval_s: Some(1), ..Default::default() });
    let first = inception(&c, 0);
    assert_eq!(first.len(), 14, "no RRSIG after cluster up:\n{}", c.dig(0, &["www.example.test", "RRSIG"]));

    // The admin route: private token, no token or a browser's Origin header is refused.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(c.admin_token(1)).expect("admin token file").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "admin token file mode");
    let url = format!("http://127.0.0.1:{}/admin/sign-zone", c.metrics_port(1));
    let no_token = text(&run(Command::new("curl").args(["-s", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", &url])));
    assert_eq!(no_token, "401", "POST without the token");
    let token = std::fs::read_to_string(c.admin_token(1)).unwrap();
    let auth = format!("Authorization: Bearer {}", token.trim());
    let browser = text(&run(Command::new("curl").args([
        "-s",
        "-m",
        "10",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        "POST",
        "-H",
        &auth,
        "-H",
        "Origin: http://example.org",
        &url,
    ])));
    assert_eq!(browser, "403", "POST with an Origin header");

    // Agreed time must move past the 1 s interval, and a new signing's inception differ.
    std::thread::sleep(Duration::from_secs(2));
    // One replica alone: ordered, counted, not run.
    let (ok, out) = c.sign_zone(&[1]);
    assert!(!ok && out.contains("waiting: 1 of the 2"), "sign-zone through one replica must not run:\n{out}");
    std::thread::sleep(Duration::from_secs(1));
    for i in 0..c.n {
        assert_eq!(inception(&c, i), first, "replica {i} re-signed on one replica's request\n{}", c.logs());
    }
    // A second replica (t+1 = 2): it runs, everywhere, at one point of the log.
    let (ok, out) = c.sign_zone(&[2]);
    assert!(ok && out.contains("signed at seq"), "sign-zone through a second replica:\n{out}\n{}", c.logs());
    c.eventually("the re-signed zone", |i| {
        let now = inception(&c, i);
        now.len() == 14 && now > first
    });
    let reference = c.axfr(0);
    for i in 1..c.n {
        assert_eq!(c.axfr(i), reference, "replica {i}'s zone differs after sign-zone\n{}", c.logs());
    }
    c.verify_zone(0);
}

/// A write whose named is down when it is executed waits for named to come back (the
/// supervisor restarts it) and is then applied there too: no replica skips it.
#[test]
fn a_write_waits_for_a_restarting_named_and_is_not_skipped() {
    let c = Cluster::up(ClusterOpts::default());
    let pid_file = c.path("replica-3/state/named/named.pid");
    let pid = std::fs::read_to_string(&pid_file).expect("named.pid of replica 3").trim().to_string();
    // SIGSTOP: named is stuck (it holds its sockets but answers nothing) while the
    // update is ordered and the other replicas apply it.
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let (ok, out) = c.nsupdate(0, "update add while-stuck.example.test 300 A 192.0.2.50");
    assert!(ok, "the other three replicas apply the update:\n{out}\n{}", c.logs());
    std::thread::sleep(Duration::from_secs(3));
    // Then it crashes; the supervisor starts a new named, and replica 3's executor, which
    // has been waiting, sends the write again.
    assert!(Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
    c.eventually("the update at every replica, the restarted named's too", |i| c.dig(i, &["while-stuck.example.test", "A", "+short"]).trim() == "192.0.2.50");
    let reference = c.axfr(0);
    assert_eq!(c.axfr(3), reference, "replica 3's zone differs\n{}", c.logs());
    // Replica 3's executor did meet the dead named (and sent the write again).
    let m = c.metrics(3);
    let errors: u64 =
        m.lines().find(|l| l.starts_with("sdns_execute_errors_total")).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(errors >= 1, "replica 3 never saw its named fail:\n{m}");
    // And it goes on executing later writes.
    let (ok, out) = c.nsupdate(3, "update add after-restart.example.test 300 A 192.0.2.51");
    assert!(ok, "{out}\n{}", c.logs());
    c.eventually("the later update", |i| c.dig(i, &["after-restart.example.test", "A", "+short"]).trim() == "192.0.2.51");
    assert_eq!(c.axfr(3), c.axfr(0));
}

/// Replica `i`'s `progress_stalled` from its /status: `Ok(None)` while it makes progress,
/// `Err` with the body when it does not answer or the field is missing.
fn stalled_reason(c: &Cluster, i: u16) -> Result<Option<String>, String> {
    let out = run(Command::new("curl").args(["-s", "-m", "5"]).arg(format!("http://127.0.0.1:{}/status", c.metrics_port(i))));
    let body = String::from_utf8_lossy(&out.stdout).into_owned();
    match body.split("\"progress_stalled\":").nth(1) {
        Some(rest) if rest.starts_with("null") => Ok(None),
        Some(rest) => Ok(rest.strip_prefix('"').and_then(|r| r.split('"').next()).map(str::to_string)),
        None => Err(body),
    }
}

/// Health tells the truth: a replica whose named is stopped (SIGSTOP) under a write still
/// answers `/status` with the current view, but its executor does not move while the ordering
/// delivered past it; after `[metrics] stall_after_ms` (default 30 s) it says so in `/status`
/// and the metrics instead of reporting itself fine, and once named goes on (SIGCONT) it is
/// healthy again.
#[test]
fn a_replica_whose_executor_does_not_move_says_it_is_stalled() {
    let c = Cluster::up(ClusterOpts::default());
    assert_eq!(stalled_reason(&c, 3), Ok(None), "stalled before anything happened");
    let pid = std::fs::read_to_string(c.path("replica-3/state/named/named.pid")).expect("named.pid of replica 3").trim().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let (ok, out) = c.nsupdate(0, "update add stalled-3.example.test 300 A 192.0.2.52");
    assert!(ok, "the other three replicas apply the update:\n{out}\n{}", c.logs());
    // Default bound 30 s; the check runs every second.
    let deadline = Instant::now() + Duration::from_secs(120);
    let stalled = loop {
        if let Ok(Some(why)) = stalled_reason(&c, 3) {
            break why;
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill").args(["-CONT", &pid]).status();
            panic!("replica 3 never said it was stalled: {:?}\n{}", stalled_reason(&c, 3), c.logs());
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(stalled.contains("executor behind the log"), "{stalled}");
    let m = c.metrics(3);
    assert!(m.contains("sdns_stalled{replica=\"3\"} 1"), "{m}");
    // The other replicas are not stalled.
    for i in 0..3 {
        assert_eq!(stalled_reason(&c, i), Ok(None), "replica {i}");
    }
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    c.eventually("the update at every replica", |i| c.dig(i, &["stalled-3.example.test", "A", "+short"]).trim() == "192.0.2.52");
    let deadline = Instant::now() + Duration::from_secs(30);
    while stalled_reason(&c, 3) != Ok(None) {
        assert!(Instant::now() < deadline, "replica 3 still says it is stalled: {:?}\n{}", stalled_reason(&c, 3), c.logs());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(c.metrics(3).contains("sdns_stalled{replica=\"3\"} 0"));
}

/// `sdns_writes_abandoned_total` of replica `i`.
fn abandoned(c: &Cluster, i: u16) -> u64 {
    let series = format!("sdns_writes_abandoned_total{{replica=\"{i}\"}}");
    c.metrics(i).lines().find(|l| l.starts_with(&series)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// A write that named fails on at every replica (the test hook `--test-fail-writes-naming`
/// makes each replica's executor see a transient failure, for ever, for updates naming
/// hang.example.test, without sending them to named) is abandoned by the rule of the log:
/// every executor orders a claim that it is stuck after its local bound, and once t+1 claims
/// are committed every replica abandons it. Its client gets SERVFAIL, a later update is
/// acknowledged, every replica counts the abandoned write, and the zones are identical.
#[test]
fn a_write_named_fails_at_every_replica_is_abandoned_by_the_log() {
    let c = Cluster::up(ClusterOpts { extra: vec!["--test-fail-writes-naming".into(), "hang.example.test.".into()], ..Default::default() });
    let started = Instant::now();
    let (ok, out) = c.nsupdate(1, "update add hang.example.test 300 A 192.0.2.60");
    let took = started.elapsed();
    assert!(!ok && out.contains("SERVFAIL"), "the stuck write is answered SERVFAIL:\n{out}\n{}", c.logs());
    eprintln!("the stuck write was answered after {took:?}");
    // Ordered after the stuck one: it can only be acknowledged once that was abandoned.
    let (ok, out) = c.nsupdate(2, "update add after-hang.example.test 300 A 192.0.2.61");
    assert!(ok, "a later update is acknowledged:\n{out}\n{}", c.logs());
    c.eventually("the later update at every replica", |i| c.dig(i, &["after-hang.example.test", "A", "+short"]).trim() == "192.0.2.61");
    for i in 0..c.n {
        assert!(abandoned(&c, i) >= 1, "replica {i} abandoned no write:\n{}", c.metrics(i));
        assert_eq!(c.dig(i, &["hang.example.test", "A", "+short"]).trim(), "", "replica {i} serves the abandoned write");
    }
    let reference = c.axfr_sorted(0);
    for i in 1..c.n {
        assert_eq!(c.axfr_sorted(i), reference, "replica {i}'s zone differs from replica 0's\n{}", c.logs());
    }
    // A replica that only sent claims is not left behind: all take later writes alike.
    let (ok, out) = c.nsupdate(3, "update add later.example.test 300 A 192.0.2.62");
    assert!(ok, "{out}\n{}", c.logs());
    c.eventually("the last update at every replica", |i| c.dig(i, &["later.example.test", "A", "+short"]).trim() == "192.0.2.62");
}
