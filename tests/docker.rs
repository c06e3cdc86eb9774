//! The Docker cluster (docker/, scripts/docker-cluster.sh): one replica per container on a
//! private compose network, driven from the host only through the ports published on
//! 127.0.0.1, under real faults: `docker kill`, `docker network disconnect`, rolling restarts.
//!
//! Needs a Docker engine with docker-compose, the sdns binary and the patched named
//! (scripts/test.sh builds both, and the replica image with `scripts/docker-cluster.sh build`);
//! each test runs the script with SDNS_PREBUILT=1, which stages the current binaries into
//! the image. Each cluster has its own compose project, /24 and host ports, so a cluster a
//! developer has up is left alone.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sdns_system_tests::{bind, free_port_block, run, text, Nsupdate, Replicas};

/// One Docker cluster at a time: seven containers already fill the two cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn docker(args: &[&str]) -> Output {
    run(Command::new("docker").args(args).stdin(Stdio::null()))
}

/// A /24 (as "a.b.c") that no Docker network and no host route uses.
fn free_net() -> String {
    let ids = text(&docker(&["network", "ls", "-q"]));
    let mut used = String::new();
    for id in ids.split_whitespace() {
        used += &text(&docker(&["network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", id]));
    }
    used += &text(&run(Command::new("ip").args(["-4", "route"])));
    static NEXT: AtomicU32 = AtomicU32::new(0);
    for _ in 0..100 {
        let k = std::process::id().wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) * 37) % 100;
        let net = format!("172.28.{}", 100 + k);
        if !used.contains(&format!("{net}.")) {
            return net;
        }
    }
    panic!("no free 172.28.x.0/24 for a test network; in use:\n{used}");
}

/// Which replicas a fault has taken away; streams send nothing to them.
type Down = Arc<Mutex<BTreeSet<u16>>>;

struct DockerCluster {
    project: String,
    net: String,
    ports: Vec<u16>,
    n: u16,
    /// The zone key's DNSSEC algorithm (SDNS_ALGORITHM for the dealer).
    algorithm: u8,
    /// Container ids by replica (they survive kill, start, restart and disconnect).
    ids: Vec<String>,
    operator: tempfile::TempDir,
    down: Down,
    _serial: MutexGuard<'static, ()>,
}

impl DockerCluster {
    /// `scripts/docker-cluster.sh up --replicas n`, as README says, on a test project.
    fn up(n: u16) -> DockerCluster {
        DockerCluster::up_with(n, 8)
    }

    /// The same with the zone key of DNSSEC `algorithm` (`SDNS_ALGORITHM=13 scripts/...`).
    fn up_with(n: u16, algorithm: u8) -> DockerCluster {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let base = free_port_block(n);
        let mut c = DockerCluster {
            project: format!("sdnstest{}n{n}", std::process::id()),
            net: free_net(),
            ports: (0..n).map(|i| base + 1 + i).collect(),
            n,
            algorithm,
            ids: Vec::new(),
            operator: tempfile::Builder::new().prefix("sdns-docker-").tempdir().expect("tempdir"),
            down: Arc::default(),
            _serial: serial,
        };
        let started = Instant::now();
        let mut out = c.script(&["up", "--replicas", &n.to_string()]);
        // Other tests on this machine take ports too: a port taken between probing and
        // Docker's bind gets a new block (bounded).
        for _ in 0..3 {
            if out.status.success() || !text(&out).contains("address already in use") {
                break;
            }
            let _ = c.script(&["down"]);
            let base = free_port_block(n);
            c.ports = (0..n).map(|i| base + 1 + i).collect();
            out = c.script(&["up", "--replicas", &n.to_string()]);
        }
        assert!(out.status.success(), "docker-cluster.sh up failed:\n{}\n{}", text(&out), c.logs());
        eprintln!("docker: {n} replicas up in {:?} ({})", started.elapsed(), c.project);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        for line in ["dig @127.0.0.1", "delv -a", "nsupdate -k", "docker-cluster.sh down"] {
            assert!(stdout.contains(line), "the usage lines lack {line:?}:\n{stdout}");
        }
        c.ids = (0..n)
            .map(|i| {
                let out = c.script(&["ps", "-q", &format!("replica-{i}")]);
                let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
                assert!(!id.is_empty(), "no container for replica-{i}:\n{}", text(&out));
                id
            })
            .collect();
        c
    }

    fn script(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(root().join("scripts/docker-cluster.sh"));
        cmd.args(args)
            .env("SDNS_COMPOSE_PROJECT", &self.project)
            .env("SDNS_NET", &self.net)
            .env("SDNS_OPERATOR_DIR", self.operator.path())
            .env("SDNS_BITS", "1024")
            .env("SDNS_ALGORITHM", self.algorithm.to_string())
            .env("SDNS_PREBUILT", "1")
            .stdin(Stdio::null());
        for (i, p) in self.ports.iter().enumerate() {
            cmd.env(format!("SDNS_PORT_{i}"), p.to_string());
        }
        run(&mut cmd)
    }

    /// The zone as AXFR through replica `i`'s published port, records only; None if it fails.
    fn axfr(&self, i: u16) -> Option<String> {
        self.transfer(i, "example.test").map(|records| records.join("\n") + "\n")
    }

    /// Waits (bounded) until every replica holds the same zone, record for record and byte for
    /// byte, and returns it. Compared as the sorted list of records, the same content the
    /// checkpoints attest: a named restarted after SIGKILL rebuilds its zone from the journal
    /// and may send the same records in another order in an AXFR (reported, not a failure).
    fn converged(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let zones: Vec<Option<String>> = (0..self.n).map(|i| self.axfr(i)).collect();
            let sorted: Vec<Option<String>> = zones.iter().map(|z| z.as_ref().map(|z| sorted_lines(z))).collect();
            if let Some(Some(first)) = sorted.first() {
                if sorted.iter().all(|z| z.as_ref() == Some(first)) {
                    let reordered: Vec<u16> = (1..self.n).filter(|&i| zones[usize::from(i)] != zones[0]).collect();
                    if !reordered.is_empty() {
                        eprintln!("docker: {what}: replicas {reordered:?} send the same records as replica-0 in another AXFR order");
                    }
                    return first.clone();
                }
            }
            if Instant::now() >= deadline {
                let sizes: Vec<String> =
                    zones.iter().enumerate().map(|(i, z)| format!("replica-{i}: {:?} lines", z.as_ref().map(|z| z.lines().count()))).collect();
                panic!("{what}: zones never converged ({})\n{}", sizes.join(", "), self.logs());
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    fn delv(&self, i: u16, name: &str) -> String {
        bind::delv(self.client_port(i), &self.operator.path().join("trust-anchor.conf"), name, "A", "example.test")
    }

    fn health(&self, i: u16) -> String {
        let out = docker(&["inspect", "-f", "{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{end}}", &self.ids[usize::from(i)]]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Takes replica `i` out of the streams' targets, then `docker <args> <container>`.
    fn fault(&self, i: u16, args: &[&str]) {
        self.down.lock().unwrap().insert(i);
        let id = &self.ids[usize::from(i)];
        let out = docker(&[args, &[id.as_str()]].concat());
        assert!(out.status.success(), "docker {args:?} replica-{i}: {}", text(&out));
    }

    fn kill(&self, i: u16) {
        self.fault(i, &["kill"]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.health(i).starts_with("exited") {
            assert!(Instant::now() < deadline, "replica-{i} is {} after docker kill", self.health(i));
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn disconnect(&self, i: u16) {
        self.fault(i, &["network", "disconnect", &format!("{}_sdns", self.project)]);
    }

    fn connect(&self, i: u16) {
        let ip = format!("{}.{}", self.net, 10 + i);
        let out = docker(&["network", "connect", "--ip", &ip, &format!("{}_sdns", self.project), &self.ids[usize::from(i)]]);
        assert!(out.status.success(), "docker network connect replica-{i}: {}", text(&out));
        self.wait_healthy(i);
    }

    fn start(&self, i: u16) {
        let out = docker(&["start", &self.ids[usize::from(i)]]);
        assert!(out.status.success(), "docker start replica-{i}: {}", text(&out));
        self.wait_healthy(i);
    }

    /// Until the replica answers an (ordered) DNS question through its published port, as
    /// Docker's health check asks it inside; then the streams use it again.
    fn wait_healthy(&self, i: u16) {
        let deadline = Instant::now() + Duration::from_secs(150);
        while !(self.health(i).starts_with("running/") && self.dig(i, &["example.test", "SOA", "+short"]).contains("example.test")) {
            assert!(Instant::now() < deadline, "replica-{i} is not healthy again: {}\n{}", self.health(i), self.logs());
            std::thread::sleep(Duration::from_secs(1));
        }
        self.down.lock().unwrap().remove(&i);
    }

    /// A stream of TSIG updates, each through the next replica that is up.
    fn updates(&self, tag: &'static str) -> Stream<Vec<String>> {
        let (ports, key) = (self.ports.clone(), self.operator.path().join("tsig.key"));
        Stream::turns(self.down.clone(), self.ports.len(), Vec::new(), move |acked, k, i, _| {
            let name = format!("{tag}{k}.example.test");
            let (ok, _) =
                Nsupdate::to(ports[usize::from(i)], "example.test").key(&key).timeout_s(15).send(&format!("update add {name} 300 A 192.0.2.{}", k % 250 + 1));
            if ok {
                acked.push(name);
            }
        })
    }

    /// A stream of reads through the replicas that are up; returns (answered, failures), a
    /// failure being a read to a replica that was up before and after it and got no answer.
    fn reads(&self) -> Stream<(u32, Vec<String>)> {
        let ports = self.ports.clone();
        Stream::turns(self.down.clone(), self.ports.len(), (0u32, Vec::new()), move |(answered, failures), _, i, down| {
            let out = bind::dig(ports[usize::from(i)], &["mail.example.test", "A", "+short", "+time=4", "+tries=3"]);
            // dig retries a lost datagram itself (+tries), as any resolver does.
            if out.lines().any(|l| l.trim() == "192.0.2.25") {
                *answered += 1;
            } else if !down.lock().unwrap().contains(&i) {
                failures.push(format!("replica-{i}: {}", out.trim()));
            }
        })
    }
}

impl Replicas for DockerCluster {
    fn count(&self) -> u16 {
        self.n
    }

    fn client_port(&self, i: u16) -> u16 {
        self.ports[usize::from(i)]
    }

    fn zone(&self) -> &str {
        "example.test"
    }

    fn update_key(&self) -> PathBuf {
        self.operator.path().join("tsig.key")
    }

    fn transfer_key(&self) -> PathBuf {
        self.operator.path().join("transfer.key")
    }

    /// The last lines of every replica's container log, for failure messages.
    fn logs(&self) -> String {
        text(&self.script(&["logs", "--no-color", "--tail", "12"]))
    }
}

impl Drop for DockerCluster {
    fn drop(&mut self) {
        let _ = self.script(&["down"]);
    }
}

/// The pause between two requests of a stream: 400 ms, or SDNS_DOCKER_STREAM_PAUSE_MS.
fn stream_pause() -> Duration {
    let ms = std::env::var("SDNS_DOCKER_STREAM_PAUSE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    Duration::from_millis(ms)
}

/// The k-th replica in turn that is not down.
fn pick(down: &Down, k: u32, n: usize) -> Option<u16> {
    let down = down.lock().unwrap();
    (0..n).map(|j| ((k as usize + j) % n) as u16).find(|i| !down.contains(i))
}

/// A background loop that runs until stopped (or its own deadline).
struct Stream<T> {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<T>,
}

impl<T: Send + 'static> Stream<T> {
    fn spawn(f: impl FnOnce(Arc<AtomicBool>) -> T + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        Stream { stop, handle: std::thread::spawn(move || f(s)) }
    }

    /// Each turn until stopped (or 900 s), `turn(state, k, i, down)` on the k-th replica in turn
    /// that is up (`pick`), with a pause between turns; the stream's result is the state.
    fn turns(down: Down, n: usize, mut state: T, mut turn: impl FnMut(&mut T, u32, u16, &Down) + Send + 'static) -> Self {
        Stream::spawn(move |stop| {
            let mut k = 0u32;
            let deadline = Instant::now() + Duration::from_secs(900);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                k += 1;
                let Some(i) = pick(&down, k, n) else {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                };
                turn(&mut state, k, i, &down);
                std::thread::sleep(stream_pause());
            }
            state
        })
    }

    fn finish(self) -> T {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("stream thread")
    }
}

fn sorted_lines(zone: &str) -> String {
    let mut lines: Vec<&str> = zone.lines().collect();
    lines.sort_unstable();
    lines.join("\n") + "\n"
}

/// Every acknowledged update is in the converged zone.
fn assert_all_present(zone: &str, acked: &[String], what: &str) {
    let missing: Vec<&String> = acked.iter().filter(|name| !zone.contains(&format!("{name}.\t"))).collect();
    assert!(missing.is_empty(), "{what}: acknowledged updates missing from the converged zone: {missing:?}");
}

fn sleep_s(s: u64) {
    std::thread::sleep(Duration::from_secs(s));
}

#[test]
fn compose_files_match_their_generator() {
    for (n, file) in [(7, "docker/compose.yaml"), (4, "docker/compose-4.yaml")] {
        let out = run(Command::new(root().join("scripts/docker-compose-gen.sh")).arg(n.to_string()));
        assert!(out.status.success(), "{}", text(&out));
        let committed = std::fs::read(root().join(file)).expect("compose file");
        assert!(out.stdout == committed, "{file} differs from scripts/docker-compose-gen.sh {n}: regenerate it");
    }
}

#[test]
fn seven_replicas_in_docker_survive_kills_partitions_and_restarts() {
    let c = DockerCluster::up(7);

    // Reads and TSIG updates through several replicas; delv validates the new name.
    for i in [0u16, 3, 6] {
        let out = c.dig(i, &["www.example.test", "A", "+dnssec"]);
        assert!(out.contains("status: NOERROR") && out.contains("RRSIG"), "signed read through replica-{i}:\n{out}");
    }
    for i in [1u16, 4, 5] {
        let (ok, out) = c.nsupdate(i, &format!("update add via{i}.example.test 300 A 192.0.2.{}", 40 + i));
        assert!(ok, "nsupdate through replica-{i}:\n{out}\n{}", c.logs());
    }
    let zone = c.converged("after the first updates");
    assert_all_present(&zone, &["via1.example.test".into(), "via4.example.test".into(), "via5.example.test".into()], "first updates");
    let out = c.delv(6, "via4.example.test");
    assert!(out.contains("; fully validated") && out.contains("192.0.2.44"), "delv through replica-6:\n{out}");

    kills(&c);
    partition(&c, 5);
    // The rolling restart comes last; the ignored variant below puts the partition after it.
    // A restarted replica resumes from its state volume (docs/RELIABILITY.md, "Restart").
    rolling_restart(&c);

    // down -v leaves no container, network or volume of the project behind.
    let out = c.script(&["down"]);
    assert!(out.status.success(), "down: {}", text(&out));
    let label = format!("label=com.docker.compose.project={}", c.project);
    for what in ["ps -a", "network ls", "volume ls"] {
        let args: Vec<&str> = what.split(' ').chain(["-q", "--filter", &label]).collect();
        let left = text(&docker(&args));
        assert!(left.trim().is_empty(), "docker {what} after down: {left}");
    }
    let volumes = text(&docker(&["volume", "ls", "-q"]));
    assert!(!volumes.contains(&format!("{}_", c.project)), "volumes left after down:\n{volumes}");
    assert!(!c.operator.path().join("tsig.key").exists(), "down leaves the operator's key files behind");
}

/// Ignored (2.5 minutes more in CI): the same faults in another order, kills, rolling
/// restart, then the partition. In its first run (inside the main test, 2026-11-22, streams
/// pausing 100-150 ms) the reconnected replica did not catch up: its /status showed view 8
/// while the others were in view 7, last_executed 296 -> 300 in 20 s with its peers at 504,
/// and "signing timed out" every 8 s in its log; a fault in sdns's catch-up, not in this
/// test. Two runs with the default 400 ms pauses converged; a run with 100 ms pauses
/// (21:48 UTC) failed the same way (view 8 against 7, last_executed 507 against 815):
/// `SDNS_DOCKER_STREAM_PAUSE_MS=100 cargo test --test docker -- --ignored partition_after`.
/// On 2026-11-26, with restart persistence and state transfer in place, that command passed
/// four runs of four (94-106 s each; 103-110 updates acknowledged across the partition, zones
/// identical). It stays out of CI for its length.
#[test]
#[ignore = "longer variant (about 100 s); replays a catch-up failure seen on 2026-11-22 (doc comment)"]
fn seven_replicas_in_docker_partition_after_rolling_restart() {
    let c = DockerCluster::up(7);
    kills(&c);
    rolling_restart(&c);
    partition(&c, 5);
}

/// t = 2: one replica killed, then a second (the primary of view 0), while updates stream;
/// both started again: no acknowledged update lost, the zones converge.
fn kills(c: &DockerCluster) {
    let updates = c.updates("kill");
    sleep_s(3);
    c.kill(3);
    sleep_s(4);
    c.kill(0);
    sleep_s(8);
    c.start(3);
    c.start(0);
    sleep_s(3);
    let acked = updates.finish();
    assert!(acked.len() >= 10, "only {} updates acknowledged around the kills\n{}", acked.len(), c.logs());
    let zone = c.converged("after two kills and restarts");
    assert_all_present(&zone, &acked, "kills");
    eprintln!("docker: {} updates acknowledged across two kills; zones identical", acked.len());
}

/// Replica `i` cut off from the network during updates, then reconnected: it converges.
fn partition(c: &DockerCluster, i: u16) {
    let updates = c.updates("part");
    sleep_s(2);
    c.disconnect(i);
    sleep_s(8);
    c.connect(i);
    sleep_s(2);
    let acked = updates.finish();
    assert!(acked.len() >= 10, "only {} updates acknowledged around the partition", acked.len());
    let zone = c.converged("after the partition healed");
    assert_all_present(&zone, &acked, "partition");
    eprintln!("docker: {} updates acknowledged across a partition of replica-{i}; zones identical", acked.len());
}

/// All replicas restarted one at a time (`docker restart`) under a stream of updates and
/// one of reads: no acknowledged update lost, every read to a replica that is up answered.
fn rolling_restart(c: &DockerCluster) {
    let updates = c.updates("roll");
    let reads = c.reads();
    for i in 0..c.n {
        c.fault(i, &["restart", "-t", "10"]);
        c.wait_healthy(i);
    }
    sleep_s(2);
    let acked = updates.finish();
    let (answered, failures) = reads.finish();
    assert!(failures.is_empty(), "reads not answered by replicas that were up during the rolling restart: {failures:?}\n{}", c.logs());
    assert!(answered >= 20 && acked.len() >= 20, "rolling restart: {answered} reads answered, {} updates acknowledged", acked.len());
    let zone = c.converged("after the rolling restart");
    assert_all_present(&zone, &acked, "rolling restart");
    eprintln!("docker: rolling restart: {answered} reads answered, {} updates acknowledged; zones identical", acked.len());
}

/// Four replicas with a threshold ECDSA P-256 key (SDNS_ALGORITHM=13; the seven-replica test
/// above keeps the RSA default): the dealer's DNSKEY is of algorithm 13, updates are signed
/// with 64-byte signatures that delv validates, through a kill and a restart.
#[test]
fn four_replicas_in_docker_the_lan_setting() {
    let c = DockerCluster::up_with(4, 13);
    for i in 0..c.n {
        let keys = c.dig(i, &["example.test", "DNSKEY", "+short"]);
        assert!(keys.lines().count() == 1 && keys.starts_with("257 3 13 "), "replica-{i}'s DNSKEY:\n{keys}");
    }
    let (ok, out) = c.nsupdate(3, "update add lan.example.test 300 A 192.0.2.4");
    assert!(ok, "nsupdate through replica-3:\n{out}\n{}", c.logs());
    // t = 1: one replica killed, updates go on, it comes back and converges.
    c.kill(1);
    let (ok, out) = c.nsupdate(2, "update add lan2.example.test 300 A 192.0.2.5");
    assert!(ok, "nsupdate with replica-1 killed:\n{out}\n{}", c.logs());
    c.start(1);
    let zone = c.converged("four replicas after a kill");
    assert_all_present(&zone, &["lan.example.test".into(), "lan2.example.test".into()], "four replicas");
    let out = c.delv(1, "lan2.example.test");
    assert!(out.contains("; fully validated") && out.contains("192.0.2.5"), "delv through replica-1:\n{out}");
    let rrsig = c.dig(0, &["lan2.example.test", "RRSIG", "+short"]);
    let f: Vec<&str> = rrsig.lines().find(|l| l.starts_with("A ")).unwrap_or_default().split_whitespace().collect();
    // Algorithm 13, and the signature (base64 after the signer name) is 64 bytes: 88 characters.
    assert!(f.get(1) == Some(&"13") && f.get(8..).is_some_and(|s| s.concat().len() == 88), "the update's RRSIG:\n{rrsig}");
}
