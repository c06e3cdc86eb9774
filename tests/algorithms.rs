//! Clusters whose zone key is threshold ECDSA P-256 (algorithm 13) or Ed25519 (15):
//! `sdns cluster up --algorithm N`, end to end with the real named, dig, nsupdate, delv and
//! dnssec-verify (issue 27's first bar). Per algorithm: the DNSKEY is of that algorithm; an
//! update through one replica validates through another with the cluster's trust anchor; the
//! zone verifies and is the same on every replica; a replica behind the retained log catches
//! up by state transfer and a restart of the whole cluster keeps validating. With one replica
//! sending garbage in its signing messages, or corrupting its shares (`--corrupt`, the
//! paper's fault injection, made by its signing core), updates are still acknowledged and
//! that replica is reported by the honest ones.
//!
//! Each cluster has a short retained log (checkpoints every 8 batches, 16 kept) so that the
//! state transfer needs only a few hundred ordered reads.

use std::process::Command;
use std::time::{Duration, Instant};

use sdns_system_tests::{run, text, tool, Cluster, ClusterOpts, Replicas};

fn cluster(algorithm: u8, byzantine: Vec<(u16, String)>, corrupt: Vec<u16>) -> Cluster {
    let extra = ["--algorithm", &algorithm.to_string(), "--checkpoint-interval", "8", "--retained-batches", "16"].map(String::from).to_vec();
    Cluster::up(ClusterOpts { extra, byzantine, corrupt, ..ClusterOpts::default() })
}

fn within(what: &str, c: &Cluster, secs: u64, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(Instant::now() < deadline, "{what} within {secs} s\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn answers(c: &Cluster, i: u16, name: &str) -> String {
    c.dig(i, &[name, "A", "+short", "+time=2", "+tries=1"]).trim().to_string()
}

fn log_of(c: &Cluster, i: u16) -> String {
    std::fs::read_to_string(c.path(&format!("replica-{i}/sdns.log"))).unwrap_or_default()
}

/// The zone's DNSKEY RRset through replica `i` is one key of `algorithm`, the dealt one, and
/// the trust anchor and DS the dealer wrote name it.
fn check_dnskey(c: &Cluster, i: u16, algorithm: u8) {
    let keys = c.dig(i, &["example.test", "DNSKEY", "+short"]);
    let keys: Vec<&str> = keys.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(keys.len(), 1, "one DNSKEY through replica {i}: {keys:?}");
    assert!(keys[0].starts_with(&format!("257 3 {algorithm} ")), "DNSKEY of algorithm {algorithm}: {}", keys[0]);
    let anchor = std::fs::read_to_string(c.path("trust-anchor.conf")).expect("trust anchor");
    assert!(anchor.contains(&format!("static-key 257 3 {algorithm} ")), "{anchor}");
    let ds = std::fs::read_to_string(c.path("ds.txt")).expect("ds.txt");
    // `example.test. IN DS <tag> <algorithm> 2 <digest>`
    assert!(ds.contains(" DS ") && ds.split_whitespace().nth(4) == Some(algorithm.to_string().as_str()), "{ds}");
    // The key file BIND's tools take names the algorithm as BIND does.
    let stem = format!("Kexample.test.+{algorithm:03}+");
    assert!(std::fs::read_dir(c.dir.path()).expect("cluster dir").flatten().any(|e| e.file_name().to_string_lossy().starts_with(&stem)), "no {stem}*.key");
}

/// An update through replica `from` is acknowledged, every replica in `serving` serves it,
/// its RRSIG is of `algorithm` and 64 bytes, and delv through `check` validates it fully.
fn update_validates(c: &Cluster, algorithm: u8, from: u16, serving: &[u16], check: u16, name: &str, address: &str) {
    let (ok, out) = c.nsupdate(from, &format!("update add {name}.example.test 300 A {address}"));
    assert!(ok, "update through replica {from} failed:\n{out}\n{}", c.logs());
    for &i in serving {
        within(&format!("replica {i} serves {name}"), c, 60, || answers(c, i, &format!("{name}.example.test")) == address);
    }
    let rrsig = c.dig(check, &[&format!("{name}.example.test"), "RRSIG", "+short"]);
    let line = rrsig.lines().find(|l| l.starts_with("A ")).unwrap_or_else(|| panic!("no RRSIG A for {name}: {rrsig}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.get(1).copied(), Some(algorithm.to_string().as_str()), "{line}");
    // The signature field (base64 after the signer name) is 64 bytes: 88 characters.
    assert_eq!(f[8..].concat().len(), 88, "{line}");
    let out = c.delv(check, &format!("{name}.example.test"), "A");
    assert!(out.contains("; fully validated") && out.contains(address), "delv through replica {check}:\n{out}\n{}", c.logs());
}

/// The zones of `replicas` are identical (records sorted: a restarted or transferred named
/// may list an RRset in another order), and dnssec-verify accepts them.
fn zones_identical(c: &Cluster, replicas: &[u16]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let zones: Vec<Vec<String>> = replicas.iter().map(|&i| c.axfr_sorted(i)).collect();
        if zones.iter().all(|z| z == &zones[0]) {
            break;
        }
        assert!(Instant::now() < deadline, "zones differ: {:?} lines\n{}", zones.iter().map(Vec::len).collect::<Vec<_>>(), c.logs());
        std::thread::sleep(Duration::from_secs(1));
    }
    c.verify_zone(replicas[0]);
}

/// Ordered reads through `through`: one batch each when the cluster is idle.
fn drive_batches(c: &Cluster, through: &[u16], count: usize) {
    for k in 0..count {
        let i = through[k % through.len()];
        assert_eq!(answers(c, i, "www.example.test"), "192.0.2.80", "read {k} through replica {i} unanswered\n{}", c.logs());
    }
}

fn end_to_end(algorithm: u8) {
    let c = cluster(algorithm, Vec::new(), Vec::new());
    let all: Vec<u16> = (0..c.n).collect();
    check_dnskey(&c, 2, algorithm);
    update_validates(&c, algorithm, 0, &all, 2, "new", "192.0.2.7");
    zones_identical(&c, &all);

    // Replica 3 misses more batches than its peers retain: back, it fetches the state.
    c.stop(3);
    for k in 0..2u16 {
        let (ok, out) = c.nsupdate(k, &format!("update add missed{k}.example.test 300 A 192.0.2.{}", 10 + k));
        assert!(ok, "update {k} with replica 3 stopped failed:\n{out}\n{}", c.logs());
        drive_batches(&c, &[0, 1, 2], 60);
    }
    c.start_stopped();
    within("replica 3 serves what it missed", &c, 120, || answers(&c, 3, "missed1.example.test") == "192.0.2.11");
    assert!(log_of(&c, 3).contains("transferred state installed"), "replica 3 did not use state transfer\n{}", c.logs());
    update_validates(&c, algorithm, 3, &all, 1, "after-transfer", "192.0.2.20");
    zones_identical(&c, &all);

    // The whole cluster stops and starts again with its keys and state.
    c.down();
    c.start_stopped();
    update_validates(&c, algorithm, 1, &all, 3, "after-restart", "192.0.2.21");
    let out = c.delv(0, "missed0.example.test", "A");
    assert!(out.contains("; fully validated"), "an update from before the restart, through replica 0:\n{out}");
    zones_identical(&c, &all);
}

/// How replica 1 spoils its signing messages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spoil {
    /// Random bytes in every share and signature it sends (the garbage-shares mode, a rewrite
    /// by its signing service).
    Garbage,
    /// `cluster up --corrupt 1`: its signing core sends shares that parse but fail their
    /// check (the paper's fault injection).
    Corrupt,
}

/// Replica 1 spoils its signing messages: the others still sign (n = 4 tolerates one), and
/// report it.
fn with_spoiled_shares(algorithm: u8, spoil: Spoil) {
    let bad = 1u16;
    let c = match spoil {
        Spoil::Garbage => cluster(algorithm, vec![(bad, "garbage-shares".into())], Vec::new()),
        Spoil::Corrupt => cluster(algorithm, Vec::new(), vec![bad]),
    };
    let good: Vec<u16> = (0..c.n).filter(|&i| i != bad).collect();
    check_dnskey(&c, 0, algorithm);
    update_validates(&c, algorithm, 3, &good, 0, "despite-bad-shares", "192.0.2.9");
    zones_identical(&c, &good);
    let reported = |i: u16| c.metrics(i).contains(&format!("sdns_peer_faults_total{{replica=\"{i}\",peer=\"{bad}\",kind=\"bad_signature_share\"}}"));
    // Whether a spoiled message was among those a replica needed depends on arrival order:
    // keep signing (one update a round) until an honest replica reported it.
    let round = std::cell::Cell::new(0u32);
    within("an honest replica reports replica 1's bad shares", &c, 60, || {
        if good.iter().any(|&i| reported(i)) {
            return true;
        }
        round.set(round.get() + 1);
        let (ok, out) = c.nsupdate(good[round.get() as usize % good.len()], &format!("update add round{}.example.test 300 A 192.0.2.10", round.get()));
        assert!(ok, "update {} failed:\n{out}\n{}", round.get(), c.logs());
        false
    });
    for &i in &good {
        let m = c.metrics(i);
        for &h in &good {
            assert!(!m.contains(&format!("sdns_peer_faults_total{{replica=\"{i}\",peer=\"{h}\"")), "honest replica {h} accused by {i}:\n{m}");
        }
    }
    zones_identical(&c, &good);
    if spoil == Spoil::Corrupt {
        // The corrupted replica computes the signatures itself from the others' shares: its
        // zone is the honest one too, and delv validates through it.
        zones_identical(&c, &(0..c.n).collect::<Vec<_>>());
        let out = c.delv(bad, "despite-bad-shares.example.test", "A");
        assert!(out.contains("; fully validated") && out.contains("192.0.2.9"), "delv through replica {bad}:\n{out}");
    }
}

#[test]
fn ecdsa_p256_cluster_end_to_end() {
    end_to_end(13);
}

#[test]
fn ed25519_cluster_end_to_end() {
    end_to_end(15);
}

#[test]
fn ecdsa_p256_cluster_with_a_replica_sending_garbage_shares() {
    with_spoiled_shares(13, Spoil::Garbage);
}

#[test]
fn ed25519_cluster_with_a_replica_sending_garbage_shares() {
    with_spoiled_shares(15, Spoil::Garbage);
}

#[test]
fn ecdsa_p256_cluster_with_a_replica_corrupting_its_shares() {
    with_spoiled_shares(13, Spoil::Corrupt);
}

#[test]
fn ed25519_cluster_with_a_replica_corrupting_its_shares() {
    with_spoiled_shares(15, Spoil::Corrupt);
}

/// `sdns keygen --algorithm` refuses what it cannot deal, before making any key.
#[test]
fn keygen_refuses_other_algorithms_and_thresholds() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (args, why) in [(&["--algorithm", "14"][..], "14"), (&["--algorithm", "13", "--threshold", "3"][..], "threshold t+1 = 2")] {
        let out = run(Command::new(sdns_system_tests::sdns_bin())
            .args(["keygen", "--replicas", "4", "--out"])
            .arg(dir.path())
            .args(args)
            .arg("--bind-dir")
            .arg(sdns_system_tests::bind_dir()));
        assert!(!out.status.success() && text(&out).contains(why), "{args:?}:\n{}", text(&out));
    }
    assert!(!dir.path().join("replica-0/share.json").exists());
    // What named's own tools say of the dealt key files: dnssec-dsfromkey gives the DS the
    // dealer wrote.
    let out = run(Command::new(sdns_system_tests::sdns_bin())
        .args(["keygen", "--replicas", "4", "--algorithm", "15", "--out"])
        .arg(dir.path())
        .arg("--bind-dir")
        .arg(sdns_system_tests::bind_dir()));
    assert!(out.status.success(), "{}", text(&out));
    let key = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "key") && p.to_string_lossy().contains("+015+"))
        .expect("K*.key");
    let ds = run(Command::new(tool("dnssec-dsfromkey")).args(["-2"]).arg(&key));
    let written = std::fs::read_to_string(dir.path().join("ds.txt")).expect("ds.txt");
    let digest = |s: &str| s.split_whitespace().last().map(str::to_ascii_uppercase);
    assert!(ds.status.success() && digest(&text(&ds)) == digest(&written), "dnssec-dsfromkey:\n{}\nds.txt: {written}", text(&ds));
    use std::os::unix::fs::PermissionsExt;
    for i in 0..4 {
        let mode = std::fs::metadata(dir.path().join(format!("replica-{i}/share.json"))).expect("share").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "replica {i}'s share");
    }
}
