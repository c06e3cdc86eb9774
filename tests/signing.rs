//! A whole-zone signing (`sdns sign-zone`, the operation that also signs a new zone) runs
//! in the background: while a zone of a few hundred names is signed, a probe reads 20
//! times a second and an update is sent. The reads must be answered during the signing
//! and the update applied (and signed in the end); the replicas' signed zones must be
//! the same and valid for dnssec-verify and delv. The largest gap between the probe's
//! answers, the update's acknowledgement time and how long the installation held the
//! executor are recorded (printed, and appended to $SDNS_SIGNING_REPORT when set) for
//! docs/BENCHMARKS.md, not asserted: timings on a shared 2-core machine are
//! measurements, not correctness.

use std::time::{Duration, Instant};

use sdns_system_tests::probe::{report, ReadProbe};
use sdns_system_tests::{Cluster, ClusterOpts, Replicas};

fn metric(c: &Cluster, i: u16, name: &str) -> Option<f64> {
    c.metrics(i).lines().find(|l| l.starts_with(&format!("{name}{{"))).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse().ok())
}

/// The demo zone plus `names` hosts with A, AAAA and MX (the zone shape).
fn zone_file(names: usize) -> String {
    let mut z = String::from("$ORIGIN example.test.\n$TTL 300\n@ IN SOA ns0.example.test. hostmaster.example.test. ( 1 3600 900 604800 300 )\n");
    for i in 0..4 {
        z += &format!("@ IN NS ns{i}.example.test.\nns{i} IN A 127.0.0.1\n");
    }
    z += "@ IN MX 10 mail\nwww IN A 192.0.2.80\nwww IN AAAA 2001:db8::80\nmail IN A 192.0.2.25\n";
    for i in 0..names {
        z += &format!("h{i} IN A 10.0.{}.{}\nh{i} IN AAAA 2001:db8::{i:x}\nh{i} IN MX 10 mail\n", i >> 8, i & 255);
    }
    z
}

/// A cluster serving the demo zone plus `SDNS_SIGNING_NAMES` (default 150) hosts, sign-zone
/// allowed every second; the zone file's directory lives as long as the returned handle.
fn signing_cluster() -> (usize, tempfile::TempDir, Cluster) {
    let names: usize = std::env::var("SDNS_SIGNING_NAMES").ok().and_then(|v| v.parse().ok()).unwrap_or(150);
    let zone_dir = tempfile::tempdir().expect("tempdir");
    let zone_path = zone_dir.path().join("zone.db");
    std::fs::write(&zone_path, zone_file(names)).expect("zone file");
    let c = Cluster::up(ClusterOpts {
        sign_zone_interval_s: Some(1),
        extra: vec!["--zone-file".into(), zone_path.to_str().expect("utf-8 path").into()],
        ..Default::default()
    });
    (names, zone_dir, c)
}

#[test]
fn a_whole_zone_signing_runs_in_the_background_while_reads_and_updates_go_on() {
    let (names, _zone_dir, c) = signing_cluster();
    c.verify_zone(0);

    let prober = ReadProbe::start(c.client_port(0));
    std::thread::sleep(Duration::from_millis(500));

    // The whole-zone signing, asked by replicas 0 and 1 (t+1), in a thread of its own.
    let from = Instant::now();
    let signer = c.sign_zone_in_background(&[0, 1]);

    // Progress shows while it runs; an update sent meanwhile is applied.
    let mut progress: Option<(f64, f64)> = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while progress.is_none() && !signer.is_finished() && Instant::now() < deadline {
        if metric(&c, 2, "sdns_zone_signing") == Some(1.0) {
            let done = metric(&c, 2, "sdns_zone_signing_rrsets_done").unwrap_or(0.0);
            let total = metric(&c, 2, "sdns_zone_signing_rrsets").unwrap_or(0.0);
            progress = Some((done, total));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let update_sent = Instant::now();
    let (ok, out) = c.nsupdate(1, "update add during-signing.example.test 300 A 192.0.2.99");
    let ack = update_sent.elapsed();
    assert!(ok, "an update during the signing failed: {out}\n{}", c.logs());
    let during_signing = !signer.is_finished();

    let (ok, out) = signer.join().expect("sign-zone thread");
    let took = from.elapsed();
    assert!(ok && out.contains("signed at seq"), "sign-zone: {out}\n{}", c.logs());
    std::thread::sleep(Duration::from_millis(500));
    let s = prober.stop();

    let (total, done_at_check) = match progress {
        Some((done, total)) => (total, done),
        None => panic!("no signing progress seen in the metrics while sign-zone ran ({took:?})\n{}", c.logs()),
    };
    // What the replicas installed: the same zone, every signature valid, the update in it.
    let reference = c.axfr(0);
    c.eventually("the replicas' zones agree after the signing", |i| c.axfr(i) == reference);
    assert!(reference.contains("during-signing.example.test."), "the update sent during the signing is missing:\n{reference}");
    for i in 0..c.n {
        c.verify_zone(i);
    }
    let delv = c.delv(2, "during-signing.example.test", "A");
    assert!(delv.contains("; fully validated"), "delv on the name added during the signing:\n{delv}");
    let delv = c.delv(3, "h1.example.test", "AAAA");
    assert!(delv.contains("; fully validated"), "delv after the signing:\n{delv}");

    assert!(s.bad.is_empty(), "the probe got wrong answers: {:?}", s.bad);
    // Not stop-the-world: the middle half of the signing had answers.
    let (q1, q3) = (from + took / 4, from + took * 3 / 4);
    let middle = s.within(q1, q3).len();
    assert!(middle > 0, "no read was answered in the middle of the {took:?} signing");
    let install = metric(&c, 0, "sdns_zone_install_seconds").unwrap_or(-1.0);
    report("SDNS_SIGNING_REPORT", &format!(
        "background sign-zone, {names} names ({total} RRsets, {done_at_check} done when first seen): took {took:?}; probe 20 q/s: {} answers during it, {} unanswered overall, max gap {:?}; update {} the signing, acknowledged in {ack:?}; installation held replica 0's executor {install:.3} s",
        s.within(from, from + took).len(),
        s.unanswered,
        s.max_gap(from, from + took),
        if during_signing { "during" } else { "after (the signing was already done)" },
    ));
}

/// A replica killed (SIGKILL) while its part of a background signing runs resumes that part
/// when it is started again, installs the same signed zone where the others did, and ends
/// with the same zone.
#[test]
fn a_replica_killed_during_a_background_signing_resumes_it_and_ends_with_the_same_zone() {
    let zone_dir = tempfile::tempdir().expect("tempdir");
    let zone_path = zone_dir.path().join("zone.db");
    std::fs::write(&zone_path, zone_file(150)).expect("zone file");
    let c = Cluster::up(ClusterOpts {
        sign_zone_interval_s: Some(1),
        extra: vec!["--zone-file".into(), zone_path.to_str().expect("utf-8 path").into()],
        ..Default::default()
    });
    let signer = c.sign_zone_in_background(&[0, 1]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&c, 3, "sdns_zone_signing_rrsets_done").unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < deadline && !signer.is_finished(), "replica 3 never showed signing progress\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    c.kill9(3);
    let (ok, out) = c.nsupdate(1, "update add while-3-down.example.test 300 A 192.0.2.98");
    assert!(ok, "update: {out}");
    std::thread::sleep(Duration::from_secs(1));
    c.start_stopped();
    let (ok, out) = signer.join().expect("sign-zone thread");
    assert!(ok && out.contains("signed at seq"), "sign-zone: {out}\n{}", c.logs());
    let reference = c.axfr(0);
    assert!(reference.contains("while-3-down.example.test."), "{reference}");
    c.eventually("the restarted replica installs the same signed zone", |i| c.axfr(i) == reference);
    c.verify_zone(3);
    let log = std::fs::read_to_string(c.path("replica-3/sdns.log")).unwrap_or_default();
    assert!(log.contains("resuming the background whole-zone signing"), "replica 3 did not resume its part:\n{}", c.logs());
}

/// The fields of replica `i`'s "signed zone installed" log line (`key=value`, quotes
/// dropped).
fn installation(c: &Cluster, i: u16) -> Option<std::collections::BTreeMap<String, String>> {
    let log = std::fs::read_to_string(c.path(&format!("replica-{i}/sdns.log"))).ok()?;
    let line = log.lines().rev().find(|l| l.contains("signed zone installed"))?;
    let strip = |s: &str| -> String { s.chars().filter(|&ch| !ch.is_control()).collect::<String>() };
    Some(
        line.split_whitespace()
            .filter_map(|field| field.split_once('='))
            .map(|(k, v)| (strip(k).trim_start_matches(|ch: char| !ch.is_ascii_alphanumeric()).to_string(), strip(v).trim_matches('"').to_string()))
            .collect(),
    )
}

/// Updates keep coming to replica 1 (one every 200 ms) for the whole signing: the signing
/// still ends with an installation (more rounds in the background while much changed, then
/// a short catch-up), every update is in the zone, and the replicas' zones are the same and
/// valid. How many records each round saw and how long the installation held the executor
/// are recorded, not asserted; that each round but the last saw more than the catch-up
/// bound, and the last at most that (or the round limit was reached), is asserted on every
/// replica's log.
const NAMES_PER_UPDATE: usize = 8;

#[test]
fn a_zone_written_to_throughout_its_signing_is_still_installed() {
    let (names, _zone_dir, c) = signing_cluster();
    let prober = ReadProbe::start(c.client_port(0));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (from, took, out, sent, acks) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let (mut sent, mut acks) = (Vec::new(), Vec::new());
            let mut next = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Several names per update: shared signing made the signing of this zone take
                // about a second, and the catch-up rounds are only reached when more than 16
                // records change during one.
                let first = sent.len();
                let names: Vec<String> = (first..first + NAMES_PER_UPDATE).map(|k| format!("w{k}.example.test")).collect();
                let lines: Vec<String> =
                    names.iter().enumerate().map(|(j, name)| format!("update add {name} 300 A 192.0.2.{}", (first + j) % 250 + 1)).collect();
                let at = Instant::now();
                let (ok, out) = c.nsupdate(1, &lines.join("\n"));
                assert!(ok, "update {names:?}: {out}");
                acks.push(at.elapsed());
                sent.extend(names);
                next += Duration::from_millis(200);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            (sent, acks)
        });
        std::thread::sleep(Duration::from_millis(600));
        let from = Instant::now();
        let args: Vec<String> = (0..2u16)
            .flat_map(|i| ["--admin".to_string(), format!("127.0.0.1:{}", c.metrics_port(i)), "--token".to_string(), c.admin_token(i).display().to_string()])
            .collect();
        let out = std::process::Command::new(sdns_system_tests::sdns_bin()).arg("sign-zone").args(&args).output().expect("sdns sign-zone");
        let took = from.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (sent, acks) = writer.join().expect("writer thread");
        (from, took, out, sent, acks)
    });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("signed at seq"), "sign-zone: {text}\n{}", c.logs());
    std::thread::sleep(Duration::from_millis(500));
    let s = prober.stop();

    let reference = c.axfr(0);
    for name in &sent {
        assert!(reference.contains(&format!("{name}.")), "{name} is missing from the signed zone");
    }
    c.eventually("the replicas' zones agree after the signing", |i| c.axfr(i) == reference);
    for i in 0..c.n {
        c.verify_zone(i);
    }
    let last = sent.last().expect("updates were sent");
    let delv = c.delv(2, last, "A");
    assert!(delv.contains("; fully validated"), "delv on the last name added:\n{delv}");
    assert!(s.bad.is_empty(), "the probe got wrong answers: {:?}", s.bad);

    let mut rounds_seen = Vec::new();
    for i in 0..c.n {
        let fields = installation(&c, i).unwrap_or_else(|| panic!("replica {i} logged no installation\n{}", c.logs()));
        let counts: Vec<u32> = fields.get("round_records").map(|v| v.split(',').filter_map(|n| n.parse().ok()).collect()).unwrap_or_default();
        assert_eq!(counts.len().to_string(), fields.get("rounds").cloned().unwrap_or_default(), "replica {i}: {fields:?}");
        let (last, earlier) = counts.split_last().unwrap_or_else(|| panic!("replica {i}: no round counts: {fields:?}"));
        assert!(earlier.iter().all(|&n| n > 16), "replica {i}: a round began although the catch-up was short: {counts:?}");
        assert!(*last <= 16 || counts.len() == 8, "replica {i}: installed with {last} records to catch up before the round limit: {counts:?}");
        // The catch-up is read from named's journal (an IXFR from the round's serial), not
        // from a transfer of the whole signed zone.
        assert_eq!(fields.get("diff_from").map(String::as_str), Some("ixfr"), "replica {i}: {fields:?}");
        rounds_seen.push((counts, fields.get("restart_ms").cloned(), fields.get("catch_up_ms").cloned()));
    }
    assert!(rounds_seen.iter().all(|r| r.0 == rounds_seen[0].0), "the replicas went different rounds: {rounds_seen:?}");
    // What this test is for: 8 names every 200 ms from before the signing began put more than
    // 16 changed records into its first round, however fast the signing.
    assert!(rounds_seen[0].0.len() >= 2, "the signing was installed after one round; the rounds were not exercised: {rounds_seen:?}");
    // A later round keeps the signatures of what did not change: it asks the threshold
    // signers for fewer than the first signing did (the whole zone, smaller then than now;
    // a round that kept nothing would sign the grown zone again). How many fewer depends on
    // how long the round before took, so on the machine's load.
    let log = std::fs::read_to_string(c.path("replica-2/sdns.log")).unwrap_or_default();
    let parts: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("this replica's part of the whole-zone signing is done"))
        .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("signatures=")).and_then(|v| v.parse().ok()))
        .collect();
    // The first part is the first signing's, at `cluster up`.
    assert_eq!(parts.len(), 1 + rounds_seen[0].0.len(), "one part per round on replica 2: {parts:?}\n{log}");
    let later_rounds = parts.get(2..).unwrap_or_default();
    assert!(later_rounds.iter().all(|n| *n < parts[0]), "a later round signed the zone again instead of what changed: {parts:?}, rounds {rounds_seen:?}");
    let install = metric(&c, 0, "sdns_zone_install_seconds").unwrap_or(-1.0);
    let max_ack = acks.iter().max().copied().unwrap_or_default();
    report("SDNS_SIGNING_REPORT", &format!(
        "sign-zone written to every 200 ms, {names} names: took {took:?}; {} updates ({} names), max ack {max_ack:?}; rounds (records changed during each) {:?}, signatures per round (replica 2) {parts:?}; installation held replica 0's executor {install:.3} s (restart {} ms, catch-up {} ms); probe: max gap {:?} during the signing, {} unanswered",
        acks.len(),
        sent.len(),
        rounds_seen[0].0,
        rounds_seen[0].1.clone().unwrap_or_default(),
        rounds_seen[0].2.clone().unwrap_or_default(),
        s.max_gap(from, from + took),
        s.unanswered,
    ));
}
