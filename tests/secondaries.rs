//! External secondaries of the cluster (issue 28, "NOTIFY and IXFR out"): Debian's stock named
//! (the bind9 package) and NSD, each a secondary of example.test with every replica's client
//! address as a primary. Their refresh is held at one hour, so only the replicas' NOTIFY can
//! bring them an update within seconds; they then transfer (IXFR) through a replica's wrapper.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sdns_system_tests::bind::{dig_at, loopback, spawn_named, transfer_records};
use sdns_system_tests::{free_port_block, log_tail, Cluster, ClusterOpts, Replicas};

const ZONE: &str = "example.test";
/// The bar (issue 28): an acknowledged update is served by the secondaries within this.
const NOTIFY_BAR: Duration = Duration::from_secs(5);

/// A secondary server of its own (stock named or NSD) in a directory of its own, killed on drop.
struct Secondary {
    what: &'static str,
    addr: SocketAddr,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Secondary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A packaged server binary; its absence is a failure (scripts/install-deps.sh installs it).
fn packaged(path: &str, package: &str) -> PathBuf {
    let p = PathBuf::from(path);
    assert!(p.is_file(), "no {path}: install Debian's {package} package (scripts/install-deps.sh)");
    p
}

impl Secondary {
    /// Debian's named as a secondary, NOTIFY accepted from its primaries' address (BIND
    /// compares the address only, not the port: every replica's named notifies from
    /// 127.0.0.1, from a port of its own).
    fn stock_named(port: u16, primaries: &[SocketAddr]) -> Secondary {
        let named = packaged("/usr/sbin/named", "bind9");
        let dir = tempfile::Builder::new().prefix("sdns-secondary-named-").tempdir().expect("tempdir");
        let d = dir.path().display();
        let primaries: String = primaries.iter().map(|p| format!(" {} port {};", p.ip(), p.port())).collect();
        let conf = dir.path().join("named.conf");
        std::fs::write(
            &conf,
            format!(
                "options {{\n\tdirectory \"{d}\";\n\tpid-file \"{d}/named.pid\";\n\tsession-keyfile \"{d}/session.key\";\n\
                 \tlisten-on port {port} {{ 127.0.0.1; }};\n\tlisten-on-v6 {{ none; }};\n\trecursion no;\n\tdnssec-validation no;\n\
                 \tnotify no;\n\t// Only a NOTIFY can explain a fast update: refresh held at one hour; a failed\n\
                 \t// first transfer is retried soon (a retry follows a failure only).\n\
                 \tmin-refresh-time 3600;\n\tmax-refresh-time 3600;\n\tmin-retry-time 10;\n\tmax-retry-time 10;\n\
                 \tallow-transfer {{ 127.0.0.1; }};\n}};\ncontrols {{ }};\n\
                 zone \"{ZONE}\" {{\n\ttype secondary;\n\tfile \"{ZONE}.db\";\n\tprimaries {{{primaries} }};\n}};\n"
            ),
        )
        .expect("write named.conf");
        let log = dir.path().join("named.log");
        let child = spawn_named(&named, &conf, &log);
        Secondary { what: "stock named", addr: loopback(port), child, log, _dir: dir }
    }

    /// NSD as a secondary: NOTIFY allowed from 127.0.0.1 (any port), transfers requested from
    /// every replica (IXFR over TCP, AXFR as NSD's fallback).
    fn nsd(port: u16, primaries: &[SocketAddr]) -> Secondary {
        let nsd = packaged("/usr/sbin/nsd", "nsd");
        let dir = tempfile::Builder::new().prefix("sdns-secondary-nsd-").tempdir().expect("tempdir");
        let d = dir.path().display();
        let request: String = primaries.iter().map(|p| format!("\trequest-xfr: {}@{} NOKEY\n", p.ip(), p.port())).collect();
        let conf = dir.path().join("nsd.conf");
        let log = dir.path().join("nsd.log");
        std::fs::write(
            &conf,
            format!(
                "server:\n\tip-address: 127.0.0.1\n\tport: {port}\n\tdo-ip6: no\n\tusername: \"\"\n\tchroot: \"\"\n\
                 \tzonesdir: \"{d}\"\n\tdatabase: \"\"\n\tzonelistfile: \"{d}/zone.list\"\n\txfrdfile: \"{d}/xfrd.state\"\n\
                 \txfrdir: \"{d}\"\n\tpidfile: \"{d}/nsd.pid\"\n\tlogfile: \"{}\"\n\tserver-count: 1\n\tverbosity: 2\n\
                 remote-control:\n\tcontrol-enable: no\n\
                 zone:\n\tname: \"{ZONE}\"\n\tzonefile: \"{ZONE}.zone\"\n\tallow-notify: 127.0.0.1 NOKEY\n{request}\
                 \tprovide-xfr: 127.0.0.1 NOKEY\n\tmin-refresh-time: 3600\n\tmax-refresh-time: 3600\n\
                 \tmin-retry-time: 10\n\tmax-retry-time: 10\n",
                log.display()
            ),
        )
        .expect("write nsd.conf");
        let child = Command::new(&nsd)
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", nsd.display()));
        Secondary { what: "NSD", addr: loopback(port), child, log, _dir: dir }
    }

    /// dig at this secondary, one short try (a poll must not overrun its deadline by much).
    fn dig(&self, args: &[&str]) -> String {
        dig_at(self.addr, &["+norec", "+time=1", "+tries=1"], args)
    }

    fn serial(&self) -> Option<u32> {
        serial_of(&self.dig(&[ZONE, "SOA", "+short"]))
    }

    /// The zone as AXFR from this secondary, sorted; `None` unless the transfer is whole.
    fn zone_sorted(&self) -> Option<Vec<String>> {
        let mut lines = transfer_records(&dig_at(self.addr, &["+norec", "+time=5", "+tries=2"], &[ZONE, "AXFR", "+nocmd", "+nostats", "+nocomments"]))?;
        lines.sort();
        Some(lines)
    }

    fn log_tail(&self) -> String {
        format!("--- {} ({})\n{}", self.what, self.log.display(), log_tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 25))
    }
}

/// The serial of a `dig +short SOA` answer.
fn serial_of(short: &str) -> Option<u32> {
    short.lines().find_map(|l| l.split_whitespace().nth(2)?.parse().ok())
}

#[test]
fn stock_named_and_nsd_follow_an_update_by_notify_and_hold_the_replicas_zone() {
    // The secondaries' ports first: the cluster's `--also-notify` names them.
    let base = free_port_block(2);
    let (named_port, nsd_port) = (base + 1, base + 2);
    let cluster = Cluster::up(ClusterOpts {
        extra: [named_port, nsd_port].iter().flat_map(|p| ["--also-notify".to_string(), format!("127.0.0.1:{p}")]).collect(),
        ..ClusterOpts::default()
    });
    let primaries: Vec<SocketAddr> = (0..cluster.n).map(|i| loopback(cluster.client_port(i))).collect();
    let secondaries = [Secondary::stock_named(named_port, &primaries), Secondary::nsd(nsd_port, &primaries)];
    let logs = || format!("{}\n{}\n{}", secondaries[0].log_tail(), secondaries[1].log_tail(), cluster.logs());

    // The first transfer (at the secondaries' start, not the bar): each serves the replicas' serial.
    let serial = serial_of(&cluster.dig(0, &[ZONE, "SOA", "+short"])).unwrap_or_else(|| panic!("no SOA from replica 0\n{}", cluster.logs()));
    let deadline = Instant::now() + Duration::from_secs(60);
    for s in &secondaries {
        while s.serial() != Some(serial) {
            assert!(Instant::now() < deadline, "{} never loaded serial {serial} from the replicas\n{}", s.what, logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // An update acknowledged through replica 1; the secondaries serve it within the bar.
    let (ok, said) = cluster.nsupdate(1, "update add notified.example.test. 300 TXT \"by notify\"");
    assert!(ok, "update failed: {said}\n{}", cluster.logs());
    let acknowledged = Instant::now();
    let mut pending: Vec<&Secondary> = secondaries.iter().collect();
    while !pending.is_empty() {
        pending.retain(|s| {
            let served = s.dig(&["notified.example.test", "TXT"]).contains("\"by notify\"");
            if served {
                eprintln!("{} served the update {:?} after it was acknowledged", s.what, acknowledged.elapsed());
            }
            !served
        });
        if pending.is_empty() {
            break;
        }
        let waited = acknowledged.elapsed();
        assert!(
            waited < NOTIFY_BAR,
            "{} did not serve the update {waited:?} after the cluster acknowledged it (refresh is held at one hour: \
             only a NOTIFY brings it sooner)\n{}",
            pending.iter().map(|s| s.what).collect::<Vec<_>>().join(" and "),
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The IXFR a secondary gets carries the signed differences: the new record and its
    // signature, not the whole zone (no DNSKEY).
    let transfer_key = cluster.transfer_key();
    let ixfr = cluster.dig(0, &["-k", transfer_key.to_str().expect("utf-8 path"), ZONE, &format!("IXFR={serial}"), "+nocmd", "+nostats", "+nocomments"]);
    let has =
        |rtype: &str, rest: &str| ixfr.lines().any(|l| l.starts_with("notified.example.test.") && l.split('\t').nth(3) == Some(rtype) && l.contains(rest));
    assert!(has("TXT", "\"by notify\"") && has("RRSIG", "TXT "), "IXFR={serial} lacks the new record or its signature:\n{ixfr}");
    assert!(!ixfr.lines().any(|l| l.split('\t').nth(3) == Some("DNSKEY")), "IXFR={serial} came back as a whole zone:\n{ixfr}");

    // Both secondaries hold exactly every replica's zone.
    let replicas: Vec<Vec<String>> = (0..cluster.n).map(|i| cluster.transfer_sorted(i, ZONE)).collect();
    for (i, zone) in replicas.iter().enumerate() {
        assert_eq!(zone, &replicas[0], "replica {i}'s zone differs from replica 0's");
    }
    for s in &secondaries {
        // Served means transferred; a moment's grace (bounded) for a transfer still being
        // applied, then the comparison.
        let deadline = Instant::now() + Duration::from_secs(10);
        let zone = loop {
            match s.zone_sorted() {
                Some(z) if z == replicas[0] => break z,
                other if Instant::now() >= deadline => break other.unwrap_or_default(),
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        let missing: Vec<&String> = replicas[0].iter().filter(|l| !zone.contains(l)).collect();
        let extra: Vec<&String> = zone.iter().filter(|l| !replicas[0].contains(l)).collect();
        assert!(zone == replicas[0], "{}'s zone differs from the replicas': missing {missing:#?}\nextra {extra:#?}\n{}", s.what, logs());
    }
}
