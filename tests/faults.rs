//! Fault injection against a real cluster: named scenarios, each run under load (nsupdate
//! streams, and dnsperf reads where the scenario allows), each followed by the same
//! invariants:
//!
//! - every update a client got NOERROR for is in the zone of every live honest replica;
//! - the live honest replicas' zones hold the same records, byte for byte (AXFR, sorted: a
//!   restarted named may list an RRset's records in another order), and pass dnssec-verify;
//! - the service is back: an update through each live replica is acknowledged.
//!
//! Short scenarios run with the other system tests; the long ones are `#[ignore]`d and run by
//! `scripts/faults.sh` (results and dates in docs/RELIABILITY.md). A scenario that needs work
//! not done yet is here, ignored, with the reason.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sdns_system_tests::{tool, Cluster, ClusterOpts, Nsupdate, Replicas};

/// Replica `i`'s sdns pid.
fn sdns_pid(c: &Cluster, i: u16) -> i32 {
    let s = std::fs::read_to_string(c.path(&format!("replica-{i}/sdns.pid"))).expect("sdns.pid");
    s.trim().parse().expect("pid")
}

fn signal(pid: i32, sig: &str) {
    let ok = Command::new("kill").args([sig, &pid.to_string()]).status().is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

/// A field of replica `i`'s /status (0 when it does not answer).
fn status_field(c: &Cluster, i: u16, field: &str) -> u64 {
    let out = Command::new("curl").args(["-s", "-m", "2"]).arg(format!("http://127.0.0.1:{}/status", c.metrics_port(i))).output();
    let body = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    body.split(&format!("\"{field}\":")).nth(1).and_then(|r| r.split(|ch: char| !ch.is_ascii_digit()).next()).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// One acknowledged update: the name it added, and how long the client waited.
#[derive(Clone, Debug)]
struct Ack {
    name: String,
    sent: Instant,
    latency: Duration,
}

/// Client load on a cluster: `streams` threads each sending one update after the other
/// (each to the next replica in turn, skipping those in `avoid`), optionally dnsperf reads.
struct Load {
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Ack>>>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<JoinHandle<()>>,
    dnsperf: Option<Child>,
}

impl Load {
    fn start(c: &Cluster, tag: &str, streams: u16, avoid: &[u16], reads_qps: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let targets: Vec<u16> = (0..c.n).filter(|i| !avoid.contains(i)).collect();
        let key = c.path("tsig.key");
        let ports: Vec<u16> = targets.iter().map(|&i| c.client_port(i)).collect();
        let mut threads = Vec::new();
        for s in 0..streams {
            let (stop, acks, failures, key, ports) = (stop.clone(), acks.clone(), failures.clone(), key.clone(), ports.clone());
            let tag = format!("{tag}-s{s}");
            threads.push(std::thread::spawn(move || {
                let mut k = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("{tag}-{k}.example.test");
                    let port = ports[(k + usize::from(s)) % ports.len()];
                    let sent = Instant::now();
                    let (ok, out) = nsupdate(&key, port, &format!("update add {name} 300 A 192.0.2.{}", k % 250 + 1));
                    if ok {
                        acks.lock().unwrap().push(Ack { name, sent, latency: sent.elapsed() });
                    } else {
                        failures.lock().unwrap().push(format!("{name} via port {port}: {}", out.lines().last().unwrap_or("")));
                    }
                    k += 1;
                }
            }));
        }
        let dnsperf = (reads_qps > 0).then(|| {
            let queries = c.path(&format!("dnsperf-{tag}.txt"));
            std::fs::write(&queries, "www.example.test A\nexample.test SOA\nnope.example.test A\n").expect("query file");
            let port = c.client_port(targets[0]);
            Command::new("dnsperf")
                .args(["-s", "127.0.0.1", "-p", &port.to_string(), "-l", "3600", "-Q", &reads_qps.to_string(), "-q", "20", "-d"])
                .arg(&queries)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("dnsperf")
        });
        Load { stop, acks, failures, threads, dnsperf }
    }

    fn acked(&self) -> usize {
        self.acks.lock().unwrap().len()
    }

    /// Stops the load and returns what was acknowledged.
    fn finish(mut self) -> (Vec<Ack>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(mut d) = self.dnsperf.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        let acks = std::mem::take(&mut *self.acks.lock().unwrap());
        let failures = std::mem::take(&mut *self.failures.lock().unwrap());
        (acks, failures)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(d) = self.dnsperf.as_mut() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

/// nsupdate with a 10 s timeout and no retries of its own (a retransmission is a second
/// request; the streams want one request per update).
fn nsupdate(key: &std::path::Path, port: u16, commands: &str) -> (bool, String) {
    Nsupdate::to(port, "example.test").key(key).timeout_s(10).once().send(commands)
}

/// The invariants every scenario ends with, over the replicas in `live`.
fn check_invariants(c: &Cluster, live: &[u16], acks: &[Ack], what: &str) {
    check_invariants_serving(c, live, live, acks, what, None)
}

const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The environment that runs a process two hours ahead.
fn two_hours_ahead() -> [(&'static str, &'static str); 3] {
    [("LD_PRELOAD", FAKETIME_LIB), ("FAKETIME", "+2h"), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")]
}

/// Replica `i`'s zone by AXFR; for the replica whose clock is skewed, dig runs with the same
/// clock, since named checks the transfer key's TSIG time against its own.
fn axfr(c: &Cluster, i: u16, skewed: Option<u16>) -> String {
    if skewed != Some(i) {
        return c.axfr(i);
    }
    let out = Command::new(tool("dig"))
        .envs(two_hours_ahead())
        .arg("@127.0.0.1")
        .arg("-p")
        .arg(c.client_port(i).to_string())
        .args(["+norec", "+time=5", "+tries=2", "-k"])
        .arg(c.path("transfer.key"))
        .args(["example.test", "AXFR", "+nocmd", "+nostats", "+nocomments"])
        .output()
        .expect("dig");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("SOA"), "AXFR from the skewed replica {i} failed:\n{text}{}", String::from_utf8_lossy(&out.stderr));
    text.lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty() && l.split_whitespace().nth(3).is_none_or(|t| t != "TSIG"))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The same, where only the replicas in `serving` are expected to take client updates.
fn check_invariants_serving(c: &Cluster, live: &[u16], serving: &[u16], acks: &[Ack], what: &str, skewed: Option<u16>) {
    // Service back: an update through each serving replica is acknowledged (bounded wait: a
    // view change or a catch-up may still be finishing).
    let deadline = Instant::now() + Duration::from_secs(60);
    for &i in serving {
        loop {
            let (ok, out) = nsupdate(&c.path("tsig.key"), c.client_port(i), &format!("update add back-{what}-{i}.example.test 300 A 192.0.2.99"));
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "{what}: no update through replica {i} within 60 s:\n{out}\n{}", c.logs());
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    // Identical zones: the replicas may still be applying the last batches; compare a few times.
    let deadline = Instant::now() + Duration::from_secs(60);
    let zone = loop {
        // Records sorted: after a restart named may send an RRset's records in another order
        // (same records, same signatures), which is not a difference in the zone.
        let zones: Vec<String> = live
            .iter()
            .map(|&i| {
                let mut lines: Vec<String> = axfr(c, i, skewed).lines().map(str::to_string).collect();
                lines.sort();
                lines.join("\n")
            })
            .collect();
        if zones.iter().all(|z| z == &zones[0]) {
            break zones[0].clone();
        }
        let sizes: Vec<String> = live.iter().zip(&zones).map(|(i, z)| format!("replica {i}: {} lines", z.lines().count())).collect();
        // The records only some replicas have, for the failure message.
        let differing: Vec<String> = live
            .iter()
            .zip(&zones)
            .skip(1)
            .filter(|(_, z)| *z != &zones[0])
            .flat_map(|(i, z)| {
                let (a, b): (BTreeSet<&str>, BTreeSet<&str>) = (zones[0].lines().collect(), z.lines().collect());
                let only0: Vec<String> = a.difference(&b).take(3).map(|l| format!("only replica {}: {l}", live[0])).collect();
                let only_i: Vec<String> = b.difference(&a).take(3).map(|l| format!("only replica {i}: {l}")).collect();
                only0.into_iter().chain(only_i).collect::<Vec<_>>()
            })
            .collect();
        assert!(Instant::now() < deadline, "{what}: live replicas' zones differ ({})\n{}\n{}", sizes.join(", "), differing.join("\n"), c.logs());
        std::thread::sleep(Duration::from_secs(1));
    };
    let owners: BTreeSet<&str> = zone.lines().filter_map(|l| l.split_whitespace().next()).collect();
    let missing: Vec<&str> = acks.iter().map(|a| a.name.as_str()).filter(|n| !owners.contains(format!("{n}.").as_str())).collect();
    assert!(
        missing.is_empty(),
        "{what}: {} of {} acknowledged updates missing, e.g. {:?}\n{}",
        missing.len(),
        acks.len(),
        &missing[..missing.len().min(5)],
        c.logs()
    );
    c.verify_zone(live[0]);
}

/// Quantiles of update latency, and the longest time without an acknowledgement.
fn latency_summary(acks: &[Ack]) -> String {
    if acks.is_empty() {
        return "no updates acknowledged".into();
    }
    let mut l: Vec<u128> = acks.iter().map(|a| a.latency.as_millis()).collect();
    l.sort_unstable();
    let q = |p: f64| l[((l.len() - 1) as f64 * p).round() as usize];
    let mut done: Vec<Instant> = acks.iter().map(|a| a.sent + a.latency).collect();
    done.sort();
    let gap = done.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    format!("{} updates; latency ms p50 {} p90 {} p99 {} max {}; longest gap between acks {} ms", l.len(), q(0.5), q(0.9), q(0.99), q(1.0), gap.as_millis())
}

fn report(scenario: &str, line: &str) {
    // The runner (scripts/faults.sh) collects these lines for docs/RELIABILITY.md.
    eprintln!("FAULTS {scenario}: {line}");
}

/// SIGSTOP replica 3 for `stop_for` while updates stream through the others, SIGCONT it,
/// and time its catch-up against the live cluster's rate: (updates missed, live updates/s,
/// catch-up seconds).
fn stopped_replica_catches_up(stop_for: Duration, streams: u16, reads_qps: u32) -> (usize, f64, f64) {
    let c = Cluster::up(ClusterOpts::default());
    let late = 3;
    let load = Load::start(&c, "stop", streams, &[late], reads_qps);
    std::thread::sleep(Duration::from_secs(3));
    let pid = sdns_pid(&c, late);
    let named_pid: i32 = std::fs::read_to_string(c.path(&format!("replica-{late}/state/named/named.pid"))).expect("named.pid").trim().parse().expect("pid");
    let before = load.acked();
    signal(pid, "-STOP");
    signal(named_pid, "-STOP");
    let stopped_at = Instant::now();
    std::thread::sleep(stop_for);
    let missed = load.acked() - before;
    let live_rate = missed as f64 / stopped_at.elapsed().as_secs_f64();
    let target = status_field(&c, 0, "last_executed");
    signal(named_pid, "-CONT");
    signal(pid, "-CONT");
    let resumed = Instant::now();
    let deadline = resumed + stop_for * 4 + Duration::from_secs(60);
    while status_field(&c, late, "last_executed") < target {
        assert!(Instant::now() < deadline, "replica {late} did not reach batch {target} within {:?}\n{}", deadline - resumed, c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    let catch_up = resumed.elapsed().as_secs_f64();
    let (acks, failures) = load.finish();
    report("sigstop", &format!("stopped {:?}: {missed} updates missed at {live_rate:.1}/s live; caught up to batch {target} in {catch_up:.1} s ({:.1} updates/s, {:.2}x the live rate); {}; {} client failures", stop_for, missed as f64 / catch_up, (missed as f64 / catch_up) / live_rate, latency_summary(&acks), failures.len()));
    check_invariants(&c, &[0, 1, 2, 3], &acks, "sigstop");
    (missed, live_rate, catch_up)
}

/// A short stop: runs with the other system tests.
#[test]
fn sigstopped_replica_catches_up_at_the_live_rate() {
    let (missed, live_rate, catch_up) = stopped_replica_catches_up(Duration::from_secs(15), 2, 0);
    assert!(missed > 0, "no updates were made while replica 3 was stopped");
    // The bar is "at least as fast as the live cluster"; allow for the slack of a loaded
    // machine, but not for the half-second retry per signature that catch-up used to pay.
    let catch_up_rate = missed as f64 / catch_up;
    assert!(catch_up_rate >= live_rate * 0.5, "catch-up {catch_up_rate:.1} updates/s against {live_rate:.1}/s live");
}

#[test]
#[ignore = "long: scripts/faults.sh"]
fn sigstop_for_a_minute() {
    stopped_replica_catches_up(Duration::from_secs(60), 3, 0);
}

#[test]
fn sigstop_for_a_minute_under_read_load() {
    stopped_replica_catches_up(Duration::from_secs(60), 3, 20);
}

/// kill -9 of replica `victim`'s sdns mid-stream (its named goes with it), then started again.
fn kill9_and_restart(victim: u16, what: &str) {
    let c = Cluster::up(ClusterOpts::default());
    let load = Load::start(&c, what, 3, &[victim], 20);
    std::thread::sleep(Duration::from_secs(5));
    let view_before = status_field(&c, (victim + 1) % c.n, "view");
    c.kill9(victim);
    let killed_at = Instant::now();
    // When the next replica reports a new view (its /status, refreshed every few ms).
    let mut view_changed = None;
    while killed_at.elapsed() < Duration::from_secs(10) {
        if view_changed.is_none() && status_field(&c, (victim + 1) % c.n, "view") > view_before {
            view_changed = Some(killed_at.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.start_stopped();
    std::thread::sleep(Duration::from_secs(5));
    let (acks, failures) = load.finish();
    let after: Vec<Ack> = acks.iter().filter(|a| a.sent + a.latency >= killed_at).cloned().collect();
    // The stall the kill caused: the longest gap between acknowledgements in the 5 s after it.
    let window: Vec<Ack> = acks
        .iter()
        .filter(|a| a.sent + a.latency + Duration::from_secs(1) >= killed_at && a.sent + a.latency <= killed_at + Duration::from_secs(5))
        .cloned()
        .collect();
    let view = view_changed.map_or("no new view seen".to_string(), |d| format!("new view at replica {} after {} ms", (victim + 1) % c.n, d.as_millis()));
    report(
        what,
        &format!(
            "{view}; around the kill: {}; all: {}; after the kill: {}; {} client failures",
            latency_summary(&window),
            latency_summary(&acks),
            latency_summary(&after),
            failures.len()
        ),
    );
    check_invariants(&c, &[0, 1, 2, 3], &acks, what);
}

#[test]
fn kill9_backup_mid_stream() {
    kill9_and_restart(2, "kill9-backup");
}

/// The update stall after the primary dies is the longest gap between acknowledgements.
#[test]
#[ignore = "long: scripts/faults.sh"]
fn kill9_primary_mid_stream() {
    kill9_and_restart(0, "kill9-primary");
}

#[test]
#[ignore = "long: scripts/faults.sh"]
fn kill9_named_mid_stream() {
    let c = Cluster::up(ClusterOpts::default());
    let load = Load::start(&c, "kill9-named", 3, &[], 20);
    std::thread::sleep(Duration::from_secs(5));
    let named_pid: i32 = std::fs::read_to_string(c.path("replica-1/state/named/named.pid")).expect("named.pid").trim().parse().expect("pid");
    signal(named_pid, "-KILL");
    std::thread::sleep(Duration::from_secs(15));
    let (acks, failures) = load.finish();
    report("kill9-named", &format!("{}; {} client failures", latency_summary(&acks), failures.len()));
    check_invariants(&c, &[0, 1, 2, 3], &acks, "kill9-named");
}

/// Two of four stopped: nothing can be ordered; resumed, the cluster serves again.
#[test]
#[ignore = "long: scripts/faults.sh"]
fn more_than_t_down_then_back() {
    let c = Cluster::up(ClusterOpts::default());
    let load = Load::start(&c, "over-t", 2, &[2, 3], 0);
    std::thread::sleep(Duration::from_secs(3));
    let pids = [sdns_pid(&c, 2), sdns_pid(&c, 3)];
    for p in pids {
        signal(p, "-STOP");
    }
    std::thread::sleep(Duration::from_secs(20));
    for p in pids {
        signal(p, "-CONT");
    }
    std::thread::sleep(Duration::from_secs(20));
    let (acks, failures) = load.finish();
    report("over-t", &format!("{}; {} client failures (expected while 2 of 4 were stopped)", latency_summary(&acks), failures.len()));
    check_invariants(&c, &[0, 1, 2, 3], &acks, "over-t");
}

/// Replica 3 (its sdns and its named) runs with its clock two hours ahead (libfaketime). The
/// ordering accepts a primary's time only within max_clock_skew of a backup's own clock, so
/// this replica cannot vouch for batch times; what must hold is that nothing its named
/// checks against that clock makes it refuse what the others applied.
#[test]
#[ignore = "long: scripts/faults.sh (needs libfaketime: scripts/install-deps.sh)"]
fn skewed_clock_replica() {
    assert!(std::path::Path::new(FAKETIME_LIB).is_file(), "no {FAKETIME_LIB}: install the faketime package");
    let c = Cluster::up(ClusterOpts::default());
    c.stop(3);
    // `cluster up` starts only replica 3 again; it and the named it starts inherit the clock.
    c.start_stopped_env(&two_hours_ahead());
    let load = Load::start(&c, "skew", 2, &[3], 0);
    std::thread::sleep(Duration::from_secs(20));
    let (acks, failures) = load.finish();
    report("skewed-clock", &format!("{}; {} client failures", latency_summary(&acks), failures.len()));
    // Its own pre-ordering check refuses clients' TSIG times as 2 h old (BADTIME, nothing
    // ordered): a filter, which decides nothing for the others. It must still apply what
    // the others applied.
    let (ok, out) = nsupdate(&c.path("tsig.key"), c.client_port(3), "update add via-skewed.example.test 300 A 192.0.2.98");
    report(
        "skewed-clock",
        &format!("an update sent through the skewed replica: {}", if ok { "acknowledged".to_string() } else { out.lines().last().unwrap_or("").to_string() }),
    );
    check_invariants_serving(&c, &[0, 1, 2, 3], &[0, 1, 2], &acks, "skewed-clock", Some(3));
}

#[test]
#[ignore = "long: scripts/faults.sh (tests/recovery.rs covers a whole-cluster restart in CI)"]
fn full_cluster_restart() {
    let c = Cluster::up(ClusterOpts::default());
    let load = Load::start(&c, "restart", 2, &[], 20);
    std::thread::sleep(Duration::from_secs(10));
    let (acks, _) = load.finish();
    for i in 0..c.n {
        c.stop(i);
    }
    c.start_stopped();
    check_invariants(&c, &[0, 1, 2, 3], &acks, "full-restart");
}

/// The copy's first replayed writes need signatures its peers made 20 s earlier; with a small
/// cache of finished signatures they no longer hold them, so named waits for ever and the
/// replica must reach the certified state by state transfer instead.
#[test]
fn restored_from_an_old_copy() {
    let c = Cluster::up(ClusterOpts { extra: vec!["--signature-cache-entries".into(), "256".into()], ..ClusterOpts::default() });
    let load = Load::start(&c, "old-copy", 2, &[], 0);
    std::thread::sleep(Duration::from_secs(5));
    c.stop(3);
    let copy = c.path("replica-3-copy");
    assert!(Command::new("cp").arg("-a").arg(c.path("replica-3")).arg(&copy).status().unwrap().success());
    c.start_stopped();
    std::thread::sleep(Duration::from_secs(20));
    c.stop(3);
    let _ = std::fs::remove_dir_all(c.path("replica-3"));
    std::fs::rename(&copy, c.path("replica-3")).expect("restore the old copy");
    c.start_stopped();
    std::thread::sleep(Duration::from_secs(10));
    let (acks, _) = load.finish();
    check_invariants(&c, &[0, 1, 2, 3], &acks, "old-copy");
    let log = std::fs::read_to_string(c.path("replica-3/sdns.log")).unwrap_or_default();
    println!(
        "old-copy: replica 3 fetched the certified state past a stalled batch {} times, transferred state {} times",
        log.matches("fetching that checkpoint's state").count(),
        log.matches("state transfer done").count()
    );
}

#[test]
fn state_directory_deleted() {
    let c = Cluster::up(ClusterOpts::default());
    let load = Load::start(&c, "no-state", 2, &[], 0);
    std::thread::sleep(Duration::from_secs(10));
    c.stop(3);
    std::fs::remove_dir_all(c.path("replica-3/state")).expect("delete the state directory");
    c.start_stopped();
    std::thread::sleep(Duration::from_secs(10));
    let (acks, _) = load.finish();
    check_invariants(&c, &[0, 1, 2, 3], &acks, "no-state");
}

// ----- client retransmissions -----

/// One resource record in wire form (`rdata` empty for the prerequisite and delete forms).
fn rr(name: &str, rtype: u16, class: u16, ttl: u32, rdata: &[u8]) -> Vec<u8> {
    let mut r = exec::auth::wire::name_to_wire(name).expect("name");
    r.extend_from_slice(&rtype.to_be_bytes());
    r.extend_from_slice(&class.to_be_bytes());
    r.extend_from_slice(&ttl.to_be_bytes());
    r.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    r.extend_from_slice(rdata);
    r
}

/// An unsigned UPDATE for example.test with these prerequisites and updates.
fn update_message(id: u16, prerequisites: &[Vec<u8>], updates: &[Vec<u8>]) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.extend_from_slice(&[0x28, 0, 0, 1]);
    m.extend_from_slice(&(prerequisites.len() as u16).to_be_bytes());
    m.extend_from_slice(&(updates.len() as u16).to_be_bytes());
    m.extend_from_slice(&[0, 0]);
    m.extend_from_slice(&exec::auth::wire::name_to_wire("example.test.").expect("zone"));
    m.extend_from_slice(&[0, 6, 0, 1]);
    for r in prerequisites.iter().chain(updates) {
        m.extend_from_slice(r);
    }
    m
}

const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
const CLASS_NONE: u16 = 254;

/// "prereq nxrrset NAME A; update add NAME 300 A 192.0.2.LAST", TSIG-signed now (fudge 300):
/// executed a second time it fails (YXRRSET), or, after the record was deleted, adds it again.
fn add_if_absent(key: &exec::auth::tsig::Key, id: u16, name: &str, last: u8) -> Vec<u8> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let message = update_message(id, &[rr(name, TYPE_A, CLASS_NONE, 0, &[])], &[rr(name, TYPE_A, CLASS_IN, 300, &[192, 0, 2, last])]);
    exec::auth::tsig::sign(&message, key, now, 300, 0, Vec::new(), None)
}

/// Sends `bytes` over UDP to replica `i` and returns the answer.
fn exchange(c: &Cluster, i: u16, bytes: &[u8]) -> Vec<u8> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    sock.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    sock.send_to(bytes, ("127.0.0.1", c.client_port(i))).expect("send");
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).unwrap_or_else(|e| panic!("no answer from replica {i}: {e}\n{}", c.logs()));
    buf[..n].to_vec()
}

fn rcode(answer: &[u8]) -> u8 {
    answer[3] & 0x0f
}

/// The answer's TSIG is `key`'s over `request`'s MAC (checked by signing the stripped answer
/// again with the answer's own time and comparing).
fn assert_signed_answer(key: &exec::auth::tsig::Key, request: &[u8], answer: &[u8], what: &str) {
    use exec::auth::{tsig, wire};
    let req = wire::layout(request).expect("request layout").signature.expect("request TSIG");
    let req_mac = tsig::Tsig::parse(request, &req).expect("request TSIG").mac;
    let rec = wire::layout(answer).expect("answer layout").signature.unwrap_or_else(|| panic!("{what}: answer carries no TSIG"));
    let t = tsig::Tsig::parse(answer, &rec).expect("answer TSIG");
    let unsigned = tsig::strip(answer, rec.start, t.original_id);
    let again = tsig::sign(&unsigned, key, t.time_signed, t.fudge, t.error, t.other.clone(), Some(&req_mac));
    assert_eq!(again, answer, "{what}: the answer's TSIG does not verify with the client's key");
}

/// A client retransmits an update (the same bytes, as nsupdate does after its timeout), to
/// the same replica and to another: the copies are ordered, but the update executes once
/// and every copy is answered with the first execution's outcome, signed for the client.
/// Shown with an update whose second execution would differ: "add if absent" answers
/// YXRRSET when executed again, and re-adds the record once something deleted it.
#[test]
fn retransmitted_updates_execute_once() {
    let c = Cluster::up(ClusterOpts::default());
    let file = exec::auth::TsigKey::from_bind(&std::fs::read_to_string(c.path("tsig.key")).unwrap()).unwrap();
    let key = exec::auth::tsig::Key::new(&file.name, exec::auth::tsig::Algorithm::from_name(&file.algorithm).unwrap(), &file.secret()).unwrap();

    // A retransmission after the first answer, after another client deleted the record.
    let first = add_if_absent(&key, 0x5101, "once.example.test.", 1);
    let answer = exchange(&c, 1, &first);
    assert_eq!(rcode(&answer), 0, "the first execution");
    assert_signed_answer(&key, &first, &answer, "first answer");
    let (ok, out) = c.nsupdate(0, "update delete once.example.test A");
    assert!(ok, "{out}");
    let again_same = exchange(&c, 1, &first);
    let again_other = exchange(&c, 2, &first);
    // Through the same replica: the first answer, byte for byte.
    assert_eq!(again_same, answer, "the retransmission through replica 1 did not get the first answer");
    // Through another: its own named's answer to the first execution, signed for the client.
    assert_eq!(rcode(&again_other), 0, "the retransmission through replica 2");
    assert_signed_answer(&key, &first, &again_other, "retransmission through replica 2");
    // A replay under another header id (the MAC covers the original id, so it verifies): the
    // same write, not executed again; answered under its own id.
    let mut replay = first.clone();
    replay[..2].copy_from_slice(&0x6a6au16.to_be_bytes());
    let replayed = exchange(&c, 3, &replay);
    assert_eq!((rcode(&replayed), &replayed[..2]), (0, &replay[..2]), "the replay under a new id");

    // Copies in flight at once, through two replicas (nsupdate retransmitting while the
    // first copy is still being ordered).
    let twice = add_if_absent(&key, 0x5102, "twice.example.test.", 2);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| exchange(&c, 1, &twice));
        let b = s.spawn(|| exchange(&c, 3, &twice));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!((rcode(&a), rcode(&b)), (0, 0), "both copies get the first execution's NOERROR (a second execution answers YXRRSET)");
    assert_signed_answer(&key, &twice, &a, "copy through replica 1");
    assert_signed_answer(&key, &twice, &b, "copy through replica 3");

    // The effect happened once on every replica: the deleted record stays deleted, the other
    // is there; and the zones are identical.
    let reference = c.axfr(0);
    for i in 0..c.n {
        let zone = c.axfr(i);
        assert!(!zone.contains("once.example.test."), "replica {i}: a retransmission executed again and re-added the deleted record\n{zone}");
        assert!(zone.contains("twice.example.test."), "replica {i}: the update is missing");
        assert_eq!(zone, reference, "replica {i}'s zone differs");
    }
    c.verify_zone(0);
}

// ----- crash consistency -----

/// Replica 2's sdns is killed with SIGKILL at random moments of an update stream (its named
/// dies with it: the supervisor's parent-death signal), several times, and started again
/// each time, as a machine crash would. After each restart the replica's ordering state
/// (persisted before it acts on it) and its executed position (exec.state, written after each
/// batch) must agree with named's zone: a write named applied just before the kill is sent
/// again and must change nothing, one it never got is sent now. Then the invariants: every
/// acknowledged update on every replica, identical zones, dnssec-verify. The moments are
/// drawn from a seed printed with the figures (`SDNS_CRASH_SEED=N` replays the schedule).
#[test]
#[ignore = "long: scripts/faults.sh"]
fn kill9_at_random_moments() {
    let seed: u64 = std::env::var("SDNS_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos().into());
    // xorshift: enough to spread the moments, and replayable from the seed.
    let mut state = seed | 1;
    let mut next_ms = |range: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % range
    };
    let c = Cluster::up(ClusterOpts::default());
    let victim = 2;
    let load = Load::start(&c, "crash", 3, &[victim], 0);
    let mut moments = Vec::new();
    // How each restart found named (`cluster up` starts a new log per start, so each
    // incarnation's log is read before the next kill): a batch resumed at an interrupted
    // zone change that named had applied or not.
    let log_path = c.path(&format!("replica-{victim}/sdns.log"));
    let mut resumed = [0usize; 2];
    let count_resumed = |resumed: &mut [usize; 2]| {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        for line in log.lines().filter(|l| l.contains("resuming the batch a crash interrupted")) {
            resumed[usize::from(line.contains("applied=false"))] += 1;
        }
    };
    for round in 0..4 {
        let wait = 1000 + next_ms(3000);
        std::thread::sleep(Duration::from_millis(wait));
        if round > 0 {
            count_resumed(&mut resumed);
        }
        let named_pid: i32 =
            std::fs::read_to_string(c.path(&format!("replica-{victim}/state/named/named.pid"))).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        let executed = status_field(&c, victim, "last_executed");
        c.kill9(victim);
        // named goes with it; wait until it is gone, as after a machine crash.
        let deadline = Instant::now() + Duration::from_secs(10);
        while named_pid > 0 && std::fs::read_to_string(format!("/proc/{named_pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
            assert!(Instant::now() < deadline, "replica {victim}'s named (pid {named_pid}) outlived its sdns");
            std::thread::sleep(Duration::from_millis(50));
        }
        let down = next_ms(2000);
        std::thread::sleep(Duration::from_millis(down));
        moments.push(format!("+{wait} ms (executed batch {executed}), down {down} ms"));
        c.start_stopped();
    }
    std::thread::sleep(Duration::from_secs(5));
    let (acks, failures) = load.finish();
    count_resumed(&mut resumed);
    report(
        "crash",
        &format!(
            "seed {seed}; kills: {}; batches resumed at an interrupted write: {} applied by named, {} not; {}; {} client failures",
            moments.join(", "),
            resumed[0],
            resumed[1],
            latency_summary(&acks),
            failures.len()
        ),
    );
    check_invariants(&c, &[0, 1, 2, 3], &acks, "crash");
}
