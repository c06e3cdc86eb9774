//! Recovery of a real cluster: a whole-cluster restart after real traffic resumes where the
//! ordering left off, with every acknowledged update still present.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sdns_system_tests::{Cluster, ClusterOpts, Replicas};

/// A plain DNS query for `www.example.test A` with this id.
fn query(id: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in ["www", "example", "test"] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Ordered reads against every replica from a few threads until `stop`; counts answers.
fn read_load(c: &Cluster, stop: Arc<AtomicBool>, answered: Arc<AtomicU64>) -> Vec<std::thread::JoinHandle<()>> {
    (0..c.n)
        .map(|i| {
            let (stop, answered, port) = (stop.clone(), answered.clone(), c.client_port(i));
            std::thread::spawn(move || {
                let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
                socket.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
                let mut buf = [0u8; 4096];
                let mut id: u16 = 0;
                while !stop.load(Ordering::Relaxed) {
                    id = id.wrapping_add(1);
                    if socket.send_to(&query(id), ("127.0.0.1", port)).is_err() {
                        continue;
                    }
                    if let Ok((n, _)) = socket.recv_from(&mut buf) {
                        if n >= 12 && buf[..2] == id.to_be_bytes() {
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect()
}

fn last_executed(c: &Cluster, i: u16) -> u64 {
    c.metrics(i).lines().find(|l| l.starts_with("sdns_last_executed_seq{")).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[test]
fn whole_cluster_restart_resumes_after_traffic() {
    let c = Cluster::up(ClusterOpts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let readers = read_load(&c, stop.clone(), answered.clone());
    // TSIG updates through every replica while the reads run; each acknowledged one must
    // survive the restart.
    let mut acknowledged = Vec::new();
    let started = Instant::now();
    let mut k = 0u32;
    // At least 8 s and 256 batches of traffic (a loaded machine orders fewer per second),
    // at most 90 s.
    let executed_min = |c: &Cluster| (0..c.n).map(|i| last_executed(c, i)).min().unwrap_or(0);
    while (started.elapsed() < Duration::from_secs(8) || k < 4 || executed_min(&c) < 256) && started.elapsed() < Duration::from_secs(90) {
        let name = format!("before{k}.example.test");
        let (ok, out) = c.nsupdate((k % u32::from(c.n)) as u16, &format!("update add {name} 300 A 192.0.2.{}", k % 250 + 1));
        if ok {
            acknowledged.push((name, format!("192.0.2.{}", k % 250 + 1)));
        } else {
            eprintln!("update {k} not acknowledged: {out}");
        }
        k += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        let _ = reader.join();
    }
    let reads = answered.load(Ordering::Relaxed);
    let executed = (0..c.n).map(|i| last_executed(&c, i)).min().unwrap_or(0);
    eprintln!("{reads} ordered reads and {} acknowledged updates before the restart; every replica executed {executed} batches", acknowledged.len());
    assert!(!acknowledged.is_empty(), "no update was acknowledged before the restart\n{}", c.logs());
    // Several checkpoint intervals (64) of history: the old restart bug dropped all of it.
    assert!(executed >= 256, "the traffic executed only {executed} batches\n{}", c.logs());

    c.down();
    // Replica 1's named zone file as a version before raw files left it: text. It is compiled
    // to raw at start, and named's journal (the updates since) still applies on top.
    let zone_file = c.path("replica-1/state/named/zone.db");
    let text_file = c.path("replica-1/state/named/zone.text");
    let compiled = std::process::Command::new(sdns_system_tests::tool("named-compilezone"))
        .args(["-q", "-f", "raw", "-F", "text", "-o"])
        .arg(&text_file)
        .arg("example.test")
        .arg(&zone_file)
        .output()
        .expect("named-compilezone");
    assert!(compiled.status.success(), "named-compilezone: {}", sdns_system_tests::text(&compiled));
    std::fs::rename(&text_file, &zone_file).expect("zone file replaced by its text");
    c.start_stopped();

    // Reads and a new update succeed at every replica.
    for i in 0..c.n {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = c.dig(i, &["www.example.test", "A"]);
            if out.contains("status: NOERROR") {
                break;
            }
            assert!(Instant::now() < deadline, "replica {i} does not answer after the restart:\n{out}\n{}", c.logs());
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    for i in 0..c.n {
        let (ok, out) = c.nsupdate(i, &format!("update add after{i}.example.test 300 A 198.51.100.{}", i + 1));
        assert!(ok, "update through replica {i} after the restart failed:\n{out}\n{}", c.logs());
    }
    c.eventually("the updates after the restart", |i| {
        (0..c.n).all(|j| c.dig(i, &[&format!("after{j}.example.test"), "A", "+short"]).trim() == format!("198.51.100.{}", j + 1))
    });
    c.eventually("every update acknowledged before the restart", |i| acknowledged.iter().all(|(name, addr)| c.dig(i, &[name, "A", "+short"]).trim() == addr));
    let reference = c.axfr(0);
    for i in 1..c.n {
        assert_eq!(c.axfr(i), reference, "replica {i}'s zone differs after the restart\n{}", c.logs());
    }
    let logs = c.logs();
    assert!(logs.contains("resuming the ordering from its persisted state"), "the replicas did not restore their ordering state\n{logs}");
    assert!(logs.contains("named's zone file converted from text to raw format"), "replica 1's text zone file was not converted\n{logs}");
}

/// A replica stops as a whole, naming the part, when one of its essential tasks ends: here its
/// metrics/admin endpoint cannot take its port (another process holds it), so that task fails
/// at once. The process exits non-zero for its service manager to restart it, instead of
/// running on without the part.
#[test]
fn a_replica_whose_essential_task_ends_exits_non_zero_and_names_it() {
    use sdns_system_tests::{bind_dir, free_port_block, ports, sdns_bin, text};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().expect("tempdir");
    let base = free_port_block(1);
    let out = Command::new(sdns_bin())
        .args(["keygen", "--bits", "1024", "--replicas", "1", "--out"])
        .arg(dir.path())
        .arg("--bind-dir")
        .arg(bind_dir())
        .args(ports(base))
        .output()
        .expect("keygen");
    assert!(out.status.success(), "keygen: {}", text(&out));
    let squatter = std::net::TcpListener::bind(("127.0.0.1", base + 301)).expect("the metrics port");
    let mut replica = Command::new(sdns_bin())
        .args(["run", "--config"])
        .arg(dir.path().join("replica-0/replica.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sdns run");
    let deadline = Instant::now() + Duration::from_secs(120);
    while replica.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = replica.kill();
            let out = replica.wait_with_output().expect("output");
            panic!("the replica kept running without its endpoint:\n{}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = replica.wait_with_output().expect("output");
    let log = text(&out);
    assert!(!out.status.success(), "exit status {:?}:\n{log}", out.status);
    assert!(log.contains("essential task `metrics and admin endpoint` failed"), "{log}");
    drop(squatter);
}
