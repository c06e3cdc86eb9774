//! Shared helpers for the system tests in tests/: a real cluster of `sdns` processes
//! with the patched named, driven by BIND's own dig, nsupdate, delv, dnssec-verify.

pub mod bind;
pub mod consumer;
pub mod probe;

pub use bind::Nsupdate;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Cluster tests run one at a time: each starts 2n processes on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The sdns binary built next to this test binary (`cargo build --workspace --bins`).
pub fn sdns_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SDNS_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let bin = dir.join("sdns");
    assert!(bin.is_file(), "no sdns binary at {}: run `cargo build --workspace --bins` first (scripts/test.sh does)", bin.display());
    bin
}

/// The patched BIND build; its absence is a failure, not a skip.
pub fn bind_dir() -> PathBuf {
    let dir = std::env::var_os("SDNS_BIND_DIR").map(PathBuf::from).unwrap_or_else(|| workspace().join("target/bind9"));
    assert!(dir.join("sbin/named").is_file(), "no patched named under {}: run patches/bind9/build.sh", dir.display());
    dir
}

pub fn tool(name: &str) -> PathBuf {
    bind_dir().join("bin").join(name)
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    out
}

pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

pub struct ClusterOpts {
    pub replicas: u16,
    pub protocol: &'static str,
    pub corrupt: Vec<u16>,
    pub reads: &'static str,
    pub resign_after_s: Option<u64>,
    /// `--sign-zone-interval-s`: at most one whole-zone signing per this much agreed time.
    pub sign_zone_interval_s: Option<u64>,
    /// `--update-auth`: tsig, sig0 or both.
    pub update_auth: &'static str,
    /// Replicas that order updates unchecked (`--skip-precheck`).
    pub skip_precheck: Vec<u16>,
    /// `--rrl-responses-per-second` (0: off).
    pub rrl: u32,
    /// `--byzantine ID:MODE,...`: replicas that misbehave, and how.
    pub byzantine: Vec<(u16, String)>,
    /// More `cluster up` arguments, as given.
    pub extra: Vec<String>,
}

impl Default for ClusterOpts {
    fn default() -> Self {
        ClusterOpts {
            replicas: 4,
            protocol: "opt-te",
            corrupt: Vec::new(),
            reads: "ordered",
            resign_after_s: None,
            sign_zone_interval_s: None,
            update_auth: "tsig",
            skip_precheck: Vec::new(),
            rrl: 0,
            byzantine: Vec::new(),
            extra: Vec::new(),
        }
    }
}

/// A running cluster; stopped (and its processes killed) on drop, even after a failed assertion.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub n: u16,
    base: u16,
    /// The `cluster up` arguments, to start stopped replicas again.
    up_args: Vec<std::ffi::OsString>,
    _serial: MutexGuard<'static, ()>,
}

impl Cluster {
    /// Starts a cluster on a block of free ports (client base+1.., peer base+101.., named
    /// base+201.., metrics base+301..; see [`free_port_block`]), deals a 1024-bit key (fast;
    /// the product default is 2048).
    pub fn up(opts: ClusterOpts) -> Cluster {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let base = free_port_block(opts.replicas);
        let dir = tempfile::Builder::new().prefix("sdns-test-").tempdir().expect("tempdir");
        let mut args: Vec<std::ffi::OsString> = ["cluster", "up", "--bits", "1024", "--replicas"].iter().map(Into::into).collect();
        args.push(opts.replicas.to_string().into());
        args.push("--dir".into());
        args.push(dir.path().into());
        args.push("--bind-dir".into());
        args.push(bind_dir().into());
        for a in ["--protocol", opts.protocol, "--reads", opts.reads, "--update-auth", opts.update_auth] {
            args.push(a.into());
        }
        args.extend(ports(base).into_iter().map(Into::into));
        if let Some(r) = opts.resign_after_s {
            args.push("--resign-after-s".into());
            args.push(r.to_string().into());
        }
        if let Some(s) = opts.sign_zone_interval_s {
            args.push("--sign-zone-interval-s".into());
            args.push(s.to_string().into());
        }
        if !opts.corrupt.is_empty() {
            args.push("--corrupt".into());
            args.push(opts.corrupt.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",").into());
        }
        if opts.rrl > 0 {
            args.push("--rrl-responses-per-second".into());
            args.push(opts.rrl.to_string().into());
        }
        if !opts.skip_precheck.is_empty() {
            args.push("--skip-precheck".into());
            args.push(opts.skip_precheck.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",").into());
        }
        if !opts.byzantine.is_empty() {
            args.push("--byzantine".into());
            args.push(opts.byzantine.iter().map(|(i, m)| format!("{i}:{m}")).collect::<Vec<_>>().join(",").into());
        }
        args.extend(opts.extra.iter().map(Into::into));
        let cluster = Cluster { dir, n: opts.replicas, base, up_args: args, _serial: serial };
        let _usage = cluster.start_stopped();
        cluster
    }

    /// Runs `cluster up` again: starts replicas that are not running, keeps the rest.
    /// Returns what it printed on stdout (how to use the cluster).
    pub fn start_stopped(&self) -> String {
        self.start_stopped_env(&[])
    }

    /// The same with extra environment for the replicas it starts (a fault scenario's
    /// LD_PRELOAD, say): they inherit it, and so do their named.
    pub fn start_stopped_env(&self, env: &[(&str, &str)]) -> String {
        let out = run(Command::new(sdns_bin()).args(&self.up_args).envs(env.iter().copied()));
        assert!(out.status.success(), "cluster up failed:\n{}\n{}", text(&out), self.logs());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `sdns cluster down` on the cluster's directory: every replica stops (the state stays).
    pub fn down(&self) {
        let out = run(Command::new(sdns_bin()).args(["cluster", "down", "--replicas", &self.n.to_string()]).arg("--dir").arg(self.dir.path()));
        assert!(out.status.success(), "cluster down failed:\n{}", text(&out));
    }

    /// Stops replica `i` (its wrapper, which takes its named along) and waits until it is gone.
    pub fn stop(&self, i: u16) {
        let pid_file = self.dir.path().join(format!("replica-{i}/sdns.pid"));
        let pid: i32 = std::fs::read_to_string(&pid_file).expect("pid file").trim().parse().expect("pid");
        let _ = Command::new("kill").arg(pid.to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        // A replica a test started itself stays a zombie of the test process once it exited
        // (nobody waits for it), and `kill -0` succeeds on a zombie: gone means no process or
        // a zombie.
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
            assert!(Instant::now() < deadline, "replica {i} (pid {pid}) did not stop");
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(pid_file);
    }

    /// Kills replica `i`'s sdns with SIGKILL (no clean-up of its own) and waits until it is gone.
    pub fn kill9(&self, i: u16) {
        let pid_file = self.dir.path().join(format!("replica-{i}/sdns.pid"));
        let pid: i32 = std::fs::read_to_string(&pid_file).expect("pid file").trim().parse().expect("pid");
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
            assert!(Instant::now() < deadline, "replica {i} (pid {pid}) did not die");
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(pid_file);
    }

    /// Replica `i`'s own named (its private port).
    pub fn named_port(&self, i: u16) -> u16 {
        self.base + 201 + i
    }

    /// `dig` straight at replica `i`'s named, past the wrapper: what named answers now.
    pub fn dig_named(&self, i: u16, args: &[&str]) -> String {
        bind::dig(self.named_port(i), args)
    }

    pub fn metrics_port(&self, i: u16) -> u16 {
        self.base + 301 + i
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The same as [`Replicas::nsupdate`] without any key (named's update-policy must refuse it).
    pub fn nsupdate_unsigned(&self, i: u16, commands: &str) -> (bool, String) {
        self.nsupdate_key(i, commands, None)
    }

    /// `nsupdate -k KEY` (a TSIG key file or a SIG(0) `.private`), or unsigned, to example.test.
    pub fn nsupdate_key(&self, i: u16, commands: &str, key: Option<&Path>) -> (bool, String) {
        Nsupdate::to(self.client_port(i), "example.test").key_opt(key).send(commands)
    }

    /// Replica `i`'s AXFR of example.test as sorted lines ([`Replicas::transfer_sorted`]).
    pub fn axfr_sorted(&self, i: u16) -> Vec<String> {
        self.transfer_sorted(i, "example.test")
    }

    /// The zone as AXFR from replica `i` with the transfer key, records only (no
    /// comments, no TSIG).
    pub fn axfr(&self, i: u16) -> String {
        let lines = self.transfer(i, "example.test").unwrap_or_else(|| panic!("AXFR from replica {i} failed\n{}", self.logs()));
        lines.join("\n") + "\n"
    }

    /// dnssec-verify over an AXFR (-z: the single key is a KSK that signs everything).
    pub fn verify_zone(&self, i: u16) {
        let zone = self.axfr(i);
        let file = self.path(&format!("axfr-{i}.db"));
        std::fs::write(&file, zone).expect("write axfr");
        let out = run(Command::new(tool("dnssec-verify")).args(["-z", "-o", "example.test"]).arg(&file));
        assert!(out.status.success() && text(&out).contains("Zone fully signed"), "dnssec-verify on replica {i}'s zone:\n{}", text(&out));
    }

    /// delv with the zone's trust anchor through replica `i`.
    pub fn delv(&self, i: u16, name: &str, rtype: &str) -> String {
        bind::delv(self.client_port(i), &self.path("trust-anchor.conf"), name, rtype, "example.test")
    }

    /// Replica `i`'s admin token file (written 0600 at start-up).
    pub fn admin_token(&self, i: u16) -> PathBuf {
        self.dir.path().join(format!("replica-{i}/state/admin.token"))
    }

    /// `sdns sign-zone` asking the given replicas (with their tokens); (success, output).
    pub fn sign_zone(&self, replicas: &[u16]) -> (bool, String) {
        let out = run(&mut self.sign_zone_command(replicas));
        (out.status.success(), text(&out))
    }

    /// [`Cluster::sign_zone`] in a thread of its own, for a test that watches the cluster
    /// meanwhile.
    pub fn sign_zone_in_background(&self, replicas: &[u16]) -> std::thread::JoinHandle<(bool, String)> {
        let mut cmd = self.sign_zone_command(replicas);
        std::thread::spawn(move || {
            let out = run(&mut cmd);
            (out.status.success(), text(&out))
        })
    }

    fn sign_zone_command(&self, replicas: &[u16]) -> Command {
        let mut cmd = Command::new(sdns_bin());
        cmd.arg("sign-zone");
        for &i in replicas {
            cmd.arg("--admin").arg(format!("127.0.0.1:{}", self.metrics_port(i))).arg("--token").arg(self.admin_token(i));
        }
        cmd
    }

    pub fn metrics(&self, i: u16) -> String {
        metrics_page(self.metrics_port(i))
    }
}

impl Replicas for Cluster {
    fn count(&self) -> u16 {
        self.n
    }

    fn client_port(&self, i: u16) -> u16 {
        self.base + 1 + i
    }

    fn zone(&self) -> &str {
        "example.test"
    }

    fn update_key(&self) -> PathBuf {
        self.path("tsig.key")
    }

    fn transfer_key(&self) -> PathBuf {
        self.path("transfer.key")
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for i in 0..self.n {
            let p = self.dir.path().join(format!("replica-{i}/sdns.log"));
            let log = std::fs::read_to_string(&p).unwrap_or_default();
            s += &format!("--- replica {i} ({})\n{}\n", p.display(), log_tail(&log, 15));
        }
        s
    }
}

/// A base port such that base+1..=base+n, base+101.., base+201.. and base+301.. (for n
/// replicas) are all free on 127.0.0.1 for UDP and TCP at the time of asking, so that two test
/// runs on one machine do not collide. The base is drawn from the process id and a counter and
/// probed; taken blocks are skipped.
pub fn free_port_block(n: u16) -> u16 {
    use std::net::{TcpListener, UdpSocket};
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..500 {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        // Bases 20000..=32000 in steps of 400: a block spans base+1..base+301+n (n < 99), all
        // below Linux's ephemeral range (32768 up), where an outgoing connection of any process
        // (a replica's own mesh links included) may take a port between this check and the
        // bind: named then ran without its TCP socket and a test hung.
        let base = 20_000 + (seed.wrapping_add(k.wrapping_mul(7919)) % 31) as u16 * 400;
        let free = [1u16, 101, 201, 301].iter().all(|off| {
            (0..n).all(|i| {
                let port = base + off + i;
                UdpSocket::bind(("127.0.0.1", port)).is_ok() && TcpListener::bind(("127.0.0.1", port)).is_ok()
            })
        });
        if free {
            return base;
        }
    }
    panic!("no free block of ports for {n} replicas on 127.0.0.1");
}

pub fn ports(base: u16) -> Vec<String> {
    [("--client-port", 1), ("--peer-port", 101), ("--named-port", 201), ("--metrics-port", 301)]
        .iter()
        .flat_map(|(flag, off)| [flag.to_string(), (base + off).to_string()])
        .collect()
}

/// What every cluster harness gives (a cluster of processes, one in Docker, an adopted one), so
/// that a check is written once and runs against any of them.
pub trait Replicas {
    /// How many replicas the cluster has.
    fn count(&self) -> u16;
    /// Replica `i`'s client port on 127.0.0.1: where dig, nsupdate and resolvers go.
    fn client_port(&self, i: u16) -> u16;
    /// The zone of the helpers that take none.
    fn zone(&self) -> &str;
    /// The operator's update key (TSIG) for that zone.
    fn update_key(&self) -> PathBuf;
    /// The key that may transfer the zones.
    fn transfer_key(&self) -> PathBuf;
    /// The tail of every replica's log, for failure messages.
    fn logs(&self) -> String;

    /// dig through replica `i` ([`bind::DIG_OPTS`] first).
    fn dig(&self, i: u16, args: &[&str]) -> String {
        bind::dig(self.client_port(i), args)
    }

    /// `nsupdate -k` with the operator's key through replica `i`: (success, output).
    fn nsupdate(&self, i: u16, commands: &str) -> (bool, String) {
        self.nsupdate_in(i, self.zone(), &self.update_key(), commands)
    }

    /// `nsupdate -k KEY` through replica `i` to `zone`: (success, output).
    fn nsupdate_in(&self, i: u16, zone: &str, key: &Path, commands: &str) -> (bool, String) {
        Nsupdate::to(self.client_port(i), zone).key(key).send(commands)
    }

    /// `zone`'s records by AXFR through replica `i` with the transfer key, as dig prints them,
    /// without TSIG; `None` unless the transfer is whole.
    fn transfer(&self, i: u16, zone: &str) -> Option<Vec<String>> {
        let key = self.transfer_key();
        let key = key.to_str().expect("utf-8 key path");
        bind::transfer_records(&self.dig(i, &["-k", key, zone, "AXFR", "+nocmd", "+nostats", "+nocomments"]))
    }

    /// [`Replicas::transfer`], sorted: a named that loaded a transferred or restarted zone may
    /// list an RRset's records in another order than one that built it by updates.
    fn transfer_sorted(&self, i: u16, zone: &str) -> Vec<String> {
        let mut lines = self.transfer(i, zone).unwrap_or_else(|| panic!("AXFR of {zone} from replica {i} failed\n{}", self.logs()));
        lines.sort();
        lines
    }

    /// Waits (bounded) until `check` holds on every replica; reads are ordered, so after an
    /// update's answer every replica has applied it, but a lagging replica may still be
    /// catching up with the ordering.
    fn eventually(&self, what: &str, check: impl Fn(u16) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..self.count() {
            while !check(i) {
                assert!(Instant::now() < deadline, "{what}: replica {i} never got there\n{}", self.logs());
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// The value of a counter or gauge in a Prometheus text page (the first sample of that name;
/// 0 when absent).
pub fn metric_value(page: &str, name: &str) -> u64 {
    page.lines().find(|l| l.starts_with(name) && !l.starts_with('#')).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// GET /metrics of the endpoint on 127.0.0.1:`port`.
pub fn metrics_page(port: u16) -> String {
    text(&run(Command::new("curl").args(["-s", "-m", "5"]).arg(format!("http://127.0.0.1:{port}/metrics"))))
}

impl Cluster {
    /// After a failed test the whole logs outlive the cluster's directory (the failure message
    /// shows only their tails): copied to `<tmp>/sdns-failed-<dir>/replica-<i>.log`.
    fn keep_logs(&self) {
        let name = self.dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let to = std::env::temp_dir().join(format!("sdns-failed-{name}"));
        if std::fs::create_dir_all(&to).is_err() {
            return;
        }
        for i in 0..self.n {
            let _ = std::fs::copy(self.dir.path().join(format!("replica-{i}/sdns.log")), to.join(format!("replica-{i}.log")));
        }
        eprintln!("the replicas' whole logs are kept in {}", to.display());
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(sdns_bin()).args(["cluster", "down", "--replicas", &self.n.to_string()]).arg("--dir").arg(self.dir.path()).output();
        if std::thread::panicking() {
            self.keep_logs();
        }
    }
}

/// The last `lines` distinct events of a log: a message repeated back to back (a warning said
/// every checkpoint) is shown once with its count, so the tail still shows what led to it.
pub fn log_tail(log: &str, lines: usize) -> String {
    // The message without its timestamp (the first field) and its key=value fields, which
    // tracing writes after the message, separated by spaces.
    let message = |l: &str| {
        let rest = l.split_once(' ').map_or(l, |(_, rest)| rest);
        rest.split(' ').take_while(|w| !w.contains('=')).collect::<Vec<_>>().join(" ")
    };
    let mut kept: Vec<(String, String, usize)> = Vec::new();
    for line in log.lines() {
        let m = message(line);
        match kept.last_mut() {
            Some((last, shown, count)) if *last == m => {
                *shown = line.to_string();
                *count += 1;
            }
            _ => kept.push((m, line.to_string(), 1)),
        }
    }
    let start = kept.len().saturating_sub(lines);
    kept[start..]
        .iter()
        .map(|(_, line, count)| if *count > 1 { format!("{line}  [said {count} times in a row; the last shown]") } else { line.clone() })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod log_tail_tests {
    #[test]
    fn repeats_are_counted_not_shown() {
        let log = "t1 a\nt2 b x=1\nt3 b x=2\nt4 b x=3\nt5 c";
        assert_eq!(super::log_tail(log, 2), "t4 b x=3  [said 3 times in a row; the last shown]\nt5 c");
        assert_eq!(super::log_tail(log, 10), "t1 a\nt4 b x=3  [said 3 times in a row; the last shown]\nt5 c");
    }
}
