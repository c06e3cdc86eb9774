//! State transfer with a real cluster: a replica that fell behind the log its peers retain,
//! and one whose state directory was deleted, fetch the stable checkpoint's snapshot from
//! their peers, install it into their named and go on from there.
//!
//! The retained log is shrunk (`[ordering] retained_batches`, test-only use of the knob) and
//! checkpoints come every 8 batches, so a few hundred ordered reads leave a replica behind it.
//! The replica is taken down (not SIGSTOPped, whose sockets would still queue messages).

use std::process::Command;
use std::time::{Duration, Instant};

use sdns_system_tests::{Cluster, ClusterOpts};

const ORDERING: &str = "\n[ordering]\ncheckpoint_interval = 8\nretained_batches = 16\n";

fn answers(c: &Cluster, i: u16, name: &str, rtype: &str) -> String {
    c.dig(i, &[name, rtype, "+short"]).trim().to_string()
}

/// A 4-replica cluster whose replicas keep only a short log. `cluster up` rewrites the
/// replicas' configurations, so they are started here with the edited ones.
fn short_log_cluster() -> Cluster {
    let c = Cluster::up(ClusterOpts::default());
    for i in 0..c.n {
        c.stop(i);
        let config = c.path(&format!("replica-{i}/replica.toml"));
        let mut text = std::fs::read_to_string(&config).expect("replica config");
        text.push_str(ORDERING);
        std::fs::write(&config, text).expect("write replica config");
    }
    for i in 0..c.n {
        start_replica(&c, i);
    }
    for i in 0..c.n {
        wait_answering(&c, i);
    }
    c
}

/// Starts replica `i` on its configuration as `cluster up` does, without rewriting it.
fn start_replica(c: &Cluster, i: u16) {
    use std::os::unix::process::CommandExt;
    let dir = c.path(&format!("replica-{i}"));
    let log = std::fs::File::create(dir.join("sdns.log")).expect("log file");
    let child = Command::new(sdns_system_tests::sdns_bin())
        .arg("run")
        .arg("--config")
        .arg(dir.join("replica.toml"))
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("start sdns");
    std::fs::write(dir.join("sdns.pid"), format!("{}\n", child.id())).expect("pid file");
}

fn wait_answering(c: &Cluster, i: u16) {
    let start = Instant::now();
    while !c.dig(i, &["example.test", "SOA", "+short", "+time=2", "+tries=1"]).contains("example.test") {
        assert!(start.elapsed() < Duration::from_secs(120), "replica {i} never answered\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Ordered reads through the given replicas: one batch each when the cluster is idle.
fn drive_batches(c: &Cluster, through: &[u16], count: usize) {
    for k in 0..count {
        let i = through[k % through.len()];
        let out = c.dig(i, &["www.example.test", "A", "+short", "+time=2", "+tries=1"]);
        assert!(!out.trim().is_empty(), "read {k} through replica {i} unanswered\n{}", c.logs());
    }
}

/// Waits (bounded by `limit`) until replica `i` answers `name` with `want`; returns how long.
fn wait_for(c: &Cluster, i: u16, name: &str, want: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    while answers(c, i, name, "A") != want {
        assert!(start.elapsed() < limit, "replica {i} never served {name} = {want}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    start.elapsed()
}

fn assert_converged(c: &Cluster) {
    // A checkpoint or a late write may still be under way on one replica: compare a few times.
    let mut last = String::new();
    for _ in 0..10 {
        let zones: Vec<String> = (0..c.n).map(|i| c.axfr(i)).collect();
        if zones.iter().all(|z| z == &zones[0]) {
            c.verify_zone(3);
            return;
        }
        last = (1..c.n).filter(|i| zones[usize::from(*i)] != zones[0]).map(|i| format!("replica {i} differs")).collect::<Vec<_>>().join(", ");
        std::thread::sleep(Duration::from_secs(1));
    }
    panic!("zones differ: {last}\n{}", c.logs());
}

fn log_of(c: &Cluster, i: u16) -> String {
    std::fs::read_to_string(c.path(&format!("replica-{i}/sdns.log"))).unwrap_or_default()
}

/// Replica 3 is down while the others order far more batches than they retain and apply
/// updates; started again, it cannot replay the log, fetches the stable checkpoint's
/// state, installs it, replays the rest, and serves every acknowledged update.
#[test]
#[ignore = "state transfer is not yet shown working end to end: in the last run (2026-11-23) the stopped replica did not come back and a replica started by the test did not stop on SIGTERM; docs/RELIABILITY.md"]
fn a_replica_behind_the_retained_log_transfers_state_and_converges() {
    let c = short_log_cluster();
    let (ok, out) = c.nsupdate(0, "update add before.example.test 300 A 192.0.2.1");
    assert!(ok, "update before the stop failed:\n{out}\n{}", c.logs());
    wait_for(&c, 3, "before.example.test", "192.0.2.1", Duration::from_secs(30));

    c.stop(3);
    for k in 0..3u16 {
        let (ok, out) = c.nsupdate(k, &format!("update add missed{k}.example.test 300 A 192.0.2.{}", 10 + k));
        assert!(ok, "update {k} with replica 3 stopped failed:\n{out}\n{}", c.logs());
        drive_batches(&c, &[0, 1, 2], 60);
    }
    let started = Instant::now();
    start_replica(&c, 3);
    let took = wait_for(&c, 3, "missed2.example.test", "192.0.2.12", Duration::from_secs(90));
    eprintln!("replica 3 caught up by state transfer in {took:?} ({:?} since its start)", started.elapsed());
    assert!(log_of(&c, 3).contains("transferred state installed"), "replica 3 did not use state transfer\n{}", c.logs());
    for k in 0..3u16 {
        assert_eq!(answers(&c, 3, &format!("missed{k}.example.test"), "A"), format!("192.0.2.{}", 10 + k));
    }

    // It keeps applying new updates, including through itself.
    let (ok, out) = c.nsupdate(3, "update add after.example.test 300 A 192.0.2.30");
    assert!(ok, "update through the transferred replica failed:\n{out}\n{}", c.logs());
    for i in 0..c.n {
        wait_for(&c, i, "after.example.test", "192.0.2.30", Duration::from_secs(30));
    }
    assert_converged(&c);
}

/// Replica 3 loses its state directory (its keys are kept) while the others move on; started
/// again, it installs the stable checkpoint's state from its peers instead of a zone missing
/// every update.
#[test]
#[ignore = "state transfer is not yet shown working end to end: in the last run (2026-11-23) the stopped replica did not come back and a replica started by the test did not stop on SIGTERM; docs/RELIABILITY.md"]
fn a_replica_whose_state_was_deleted_transfers_state_and_converges() {
    let c = short_log_cluster();
    c.stop(3);
    for k in 0..3u16 {
        let (ok, out) = c.nsupdate(k, &format!("update add gone{k}.example.test 300 A 192.0.2.{}", 40 + k));
        assert!(ok, "update {k} with replica 3 down failed:\n{out}\n{}", c.logs());
        drive_batches(&c, &[0, 1, 2], 40);
    }
    std::fs::remove_dir_all(c.path("replica-3/state")).expect("delete replica 3's state");
    let started = Instant::now();
    start_replica(&c, 3);
    wait_for(&c, 3, "gone2.example.test", "192.0.2.42", Duration::from_secs(90));
    eprintln!("replica 3 restored from an empty state directory in {:?}", started.elapsed());
    assert!(log_of(&c, 3).contains("transferred state installed"), "replica 3 did not use state transfer\n{}", c.logs());
    for k in 0..3u16 {
        assert_eq!(answers(&c, 3, &format!("gone{k}.example.test"), "A"), format!("192.0.2.{}", 40 + k));
    }
    let (ok, out) = c.nsupdate(3, "update add back.example.test 300 A 192.0.2.50");
    assert!(ok, "update through the restored replica failed:\n{out}\n{}", c.logs());
    for i in 0..c.n {
        wait_for(&c, i, "back.example.test", "192.0.2.50", Duration::from_secs(30));
    }
    assert_converged(&c);
}
