//! Incremental re-signing against a real cluster: signatures with a validity of one
//! minute, re-signed in ordered slices for three validity periods, while a probe reads
//! 20 times a second and updates keep coming. delv and dnssec-verify must accept the
//! zone at every check. The read gaps and update acknowledgement times are recorded
//! (printed, and appended to $SDNS_RESIGN_REPORT when set) for docs/BENCHMARKS.md, not
//! asserted: timings on a shared 2-core machine are measurements, not correctness.

use std::time::{Duration, Instant};

use sdns_system_tests::probe::{report, ReadProbe};
use sdns_system_tests::{metric_value, Cluster, ClusterOpts, Replicas};

/// The RRSIG over www's A RRset as replica `i` serves it: (expiration, inception).
fn www_sig_times(c: &Cluster, i: u16) -> Option<(String, String)> {
    let out = c.dig(i, &["www.example.test", "RRSIG", "+short"]);
    let line = out.lines().find(|l| l.starts_with("A "))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    Some((f.get(4)?.to_string(), f.get(5)?.to_string()))
}

fn metric(c: &Cluster, i: u16, name: &str) -> u64 {
    metric_value(&c.metrics(i), name)
}

#[test]
fn short_validity_zone_stays_valid_while_re_signed_in_slices() {
    const VALIDITY_S: u64 = 60;
    const PERIODS: u64 = 3;
    let c = Cluster::up(ClusterOpts {
        resign_after_s: Some(20),
        sign_zone_interval_s: Some(1),
        extra: vec![
            "--signature-validity-s".into(),
            VALIDITY_S.to_string(),
            "--resign-slice-interval-s".into(),
            "2".into(),
            "--resign-slice-rrsets".into(),
            "6".into(),
        ],
        ..Default::default()
    });
    let first = www_sig_times(&c, 0).expect("www A is signed");

    let prober = ReadProbe::start(c.client_port(0));

    let start = Instant::now();
    let end = start + Duration::from_secs(VALIDITY_S * PERIODS);
    let mut acks = Vec::new();
    let mut checks = 0;
    let mut k = 0;
    while Instant::now() < end {
        // An update, acknowledged by the replica it was sent to.
        k += 1;
        let sent = Instant::now();
        let (ok, out) = c.nsupdate(k % c.n, &format!("update add n{k}.example.test 300 A 192.0.2.{}", k % 250));
        assert!(ok, "update {k} failed: {out}\n{}", c.logs());
        acks.push(sent.elapsed());
        // The zone as validators see it, now: every signature current.
        let i = checks % c.n;
        c.verify_zone(i);
        let delv = c.delv(i, "www.example.test", "A");
        assert!(delv.contains("; fully validated"), "delv through replica {i} at +{:?}:\n{delv}", start.elapsed());
        checks += 1;
        std::thread::sleep(Duration::from_secs(4));
    }
    let resigning_until = Instant::now();

    // A whole-zone signing (sign-zone) while the probe runs, for comparison.
    let sign_from = Instant::now();
    let (ok, out) = c.sign_zone(&[0, 1]);
    assert!(ok, "sign-zone: {out}\n{}", c.logs());
    let sign_took = sign_from.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let s = prober.stop();

    // Re-signing did happen, in slices, on every replica, and the signatures moved on.
    let now = www_sig_times(&c, 0).expect("www A is signed");
    assert!(now.1 > first.1 && now.0 > first.0, "www A was never re-signed: {first:?} -> {now:?}");
    for i in 0..c.n {
        assert!(metric(&c, i, "sdns_resigned_rrsets_total") > 0, "replica {i} re-signed nothing:\n{}", c.metrics(i));
        // After its first, a slice chooses from the last one's records and an IXFR since,
        // not from a transfer of the whole zone (the whole-zone signing's installation
        // restarts named, and the next slice reads the zone whole again).
        let log = std::fs::read_to_string(c.path(&format!("replica-{i}/sdns.log"))).unwrap_or_default();
        let reads: Vec<&str> =
            log.lines().filter(|l| l.contains("re-signing slice")).filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("read="))).collect();
        let incremental = reads.iter().filter(|r| r.contains("ixfr")).count();
        assert!(incremental * 2 > reads.len(), "replica {i}: most slices transferred the whole zone: {reads:?}");
    }
    c.verify_zone(0);
    // Replicas agree (slices keep coming; retry across one).
    let mut same = false;
    for _ in 0..6 {
        let zones: Vec<String> = (0..c.n).map(|i| c.axfr(i)).collect();
        if zones.iter().all(|z| z == &zones[0]) {
            same = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(700));
    }
    assert!(same, "replicas' zones differ after re-signing\n{}", c.logs());

    // A slice changes the zone (new RRSIGs, a new SOA serial) as a write does, so what a
    // replica answers must follow it: its SOA answer is named's own whenever named's did not
    // change around the read (the read cache once kept answers across slices).
    let soa = |dig: &dyn Fn(&[&str]) -> String| dig(&["example.test", "SOA", "+dnssec", "+noall", "+answer"]);
    let mut serials = std::collections::BTreeSet::new();
    let watch_until = Instant::now() + Duration::from_secs(40);
    while serials.len() < 3 && Instant::now() < watch_until {
        let before = soa(&|a| c.dig_named(0, a));
        let served = soa(&|a| c.dig(0, a));
        let after = soa(&|a| c.dig_named(0, a));
        if before == after && !before.is_empty() {
            assert_eq!(served, before, "replica 0 answers an SOA its named no longer holds");
            serials.insert(before);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(serials.len() >= 2, "no slice changed the zone in 40 s of checks: {serials:?}\n{}", c.logs());

    assert!(s.bad.is_empty(), "the probe got wrong answers: {:?}", s.bad);
    assert!(s.answers.len() as u64 > VALIDITY_S * PERIODS * 5, "the probe got only {} answers", s.answers.len());
    let slices = metric(&c, 0, "sdns_resign_slice_seconds_count");
    let slice_sum: f64 = c
        .metrics(0)
        .lines()
        .find(|l| l.starts_with("sdns_resign_slice_seconds_sum"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let max_ack = acks.iter().max().copied().unwrap_or_default();
    report("SDNS_RESIGN_REPORT", &format!(
        "resign soak: validity {VALIDITY_S} s x {PERIODS}, {checks} checks (dnssec-verify + delv) all passed; probe 20 q/s: {} answers, {} unanswered (2 s timeout), max gap during re-signing {:?}; {} updates, max ack {:?}; replica 0: {} slices that re-signed, mean {:.3} s each, {} RRsets",
        s.answers.len(),
        s.unanswered,
        s.max_gap(start, resigning_until),
        acks.len(),
        max_ack,
        slices,
        if slices > 0 { slice_sum / slices as f64 } else { 0.0 },
        metric(&c, 0, "sdns_resigned_rrsets_total"),
    ));
    report(
        "SDNS_RESIGN_REPORT",
        &format!(
            "whole-zone sign-zone (in the background): took {sign_took:?}, max read gap meanwhile {:?}",
            s.max_gap(sign_from, sign_from + sign_took + Duration::from_secs(1))
        ),
    );
}
