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
use sdns_system_tests::{Cluster, ClusterOpts};

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

#[test]
fn a_whole_zone_signing_runs_in_the_background_while_reads_and_updates_go_on() {
    let names: usize = std::env::var("SDNS_SIGNING_NAMES").ok().and_then(|v| v.parse().ok()).unwrap_or(150);
    let zone_dir = tempfile::tempdir().expect("tempdir");
    let zone_path = zone_dir.path().join("zone.db");
    std::fs::write(&zone_path, zone_file(names)).expect("zone file");
    let c = Cluster::up(ClusterOpts {
        sign_zone_interval_s: Some(1),
        extra: vec!["--zone-file".into(), zone_path.to_str().expect("utf-8 path").into()],
        ..Default::default()
    });
    c.verify_zone(0);

    let prober = ReadProbe::start(c.client_port(0));
    std::thread::sleep(Duration::from_millis(500));

    // The whole-zone signing, asked by replicas 0 and 1 (t+1), in a thread of its own.
    let from = Instant::now();
    let signer = {
        let args: Vec<String> = (0..2u16)
            .flat_map(|i| ["--admin".to_string(), format!("127.0.0.1:{}", c.metrics_port(i)), "--token".to_string(), c.admin_token(i).display().to_string()])
            .collect();
        let bin = sdns_system_tests::sdns_bin();
        std::thread::spawn(move || {
            let out = std::process::Command::new(bin).arg("sign-zone").args(&args).output().expect("sdns sign-zone");
            (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
        })
    };

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
    let signer = {
        let args: Vec<String> = (0..2u16)
            .flat_map(|i| ["--admin".to_string(), format!("127.0.0.1:{}", c.metrics_port(i)), "--token".to_string(), c.admin_token(i).display().to_string()])
            .collect();
        let bin = sdns_system_tests::sdns_bin();
        std::thread::spawn(move || {
            let out = std::process::Command::new(bin).arg("sign-zone").args(&args).output().expect("sdns sign-zone");
            (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
        })
    };
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
