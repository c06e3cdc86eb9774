//! Reads and writes interleaved at one replica in ordered mode: every read sent after an
//! update was acknowledged sees it, however warm the replica's read cache was, and no read
//! ever sees an older value than one acknowledged before it was sent. Most of these reads
//! take the vouched path (answered without ordering, once 2t peers' read barriers show the
//! gateway's answer recent enough); with a replica that sends made-up barriers they still do,
//! and where too few honest replicas are left they fall back to ordering, answers as fresh as
//! ever.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use sdns_system_tests::{bind, Cluster, ClusterOpts, Replicas};

const NAME: &str = "rw.example.test";

/// The last octet of NAME's A record as replica `port` answers it over UDP or TCP, 0 when
/// there is none; `None` when the read was not answered. Without a cookie option (dig sends
/// one by default), which the read cache never serves.
fn read(port: u16, tcp: bool) -> Option<u32> {
    let out = bind::dig(port, &["+nocookie", NAME, "A", if tcp { "+tcp" } else { "+notcp" }]);
    if !out.contains("status: NOERROR") && !out.contains("status: NXDOMAIN") {
        return None;
    }
    let value = out.lines().filter(|l| !l.starts_with(';')).find_map(|l| l.split_whitespace().last()?.strip_prefix("192.0.2.")?.parse().ok());
    Some(value.unwrap_or(0))
}

/// Replica `i`'s count of vouched reads with this outcome (vouched, fell_back).
fn vouched(c: &Cluster, i: u16, outcome: &str) -> u64 {
    let metrics = c.metrics(i);
    metrics
        .lines()
        .find(|l| l.starts_with("sdns_vouched_reads_total") && l.contains(&format!("outcome=\"{outcome}\"")))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no vouched-read counter for {outcome}:\n{metrics}"))
}

/// Replica `i`'s vouch timeout (s), as its gauge shows it.
fn vouch_timeout(c: &Cluster, i: u16) -> f64 {
    let metrics = c.metrics(i);
    metrics
        .lines()
        .find(|l| l.starts_with("sdns_vouch_timeout_seconds{"))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no vouch timeout gauge:\n{metrics}"))
}

/// Updates at replica 0, each followed by reads that must see it, with concurrent readers
/// (UDP and TCP) that must never see less than what was acknowledged before they asked.
fn interleave(c: &Cluster, rounds: u32, first: u32) {
    let port = c.client_port(0);
    let acked = AtomicU32::new(first - 1);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let readers: Vec<_> = [false, true]
            .into_iter()
            .map(|tcp| {
                let (acked, done) = (&acked, &done);
                s.spawn(move || {
                    let mut reads = 0u32;
                    while !done.load(Ordering::SeqCst) {
                        let floor = acked.load(Ordering::SeqCst);
                        let seen = read(port, tcp).unwrap_or_else(|| panic!("read unanswered (tcp {tcp})"));
                        assert!(seen >= floor, "stale read (tcp {tcp}): saw {seen} after {floor} was acknowledged");
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        for k in first..first + rounds {
            for _ in 0..3 {
                assert_eq!(read(port, false), Some(k - 1), "before update {k}\n{}", c.logs());
            }
            let (ok, out) = c.nsupdate(0, &format!("update delete {NAME} A\nupdate add {NAME} 300 A 192.0.2.{k}"));
            assert!(ok, "update {k} failed:\n{out}\n{}", c.logs());
            acked.store(k, Ordering::SeqCst);
            assert_eq!(read(port, false), Some(k), "UDP read right after update {k} was acknowledged");
            assert_eq!(read(port, true), Some(k), "TCP read right after update {k} was acknowledged");
        }
        done.store(true, Ordering::SeqCst);
        for r in readers {
            assert!(r.join().expect("reader") > 0, "each reader read during the updates");
        }
    });
}

/// A replica that sends made-up barriers (t = 1; far ahead for even rounds, 0 for odd ones)
/// cannot stop reads from being vouched by the two honest peers, nor make a stale answer
/// pass. With one honest peer stopped, the rounds it claims far ahead fall back to ordering;
/// those it claims at 0 are vouched with the one honest peer left, whose barrier alone
/// decides what the answer must reflect: still fresh.
#[test]
fn a_wrong_voucher_cannot_make_reads_stale() {
    let c = Cluster::up(ClusterOpts { byzantine: vec![(1, "wrong-vouches".into())], ..Default::default() });
    interleave(&c, 3, 1);
    let (vouched_before, fell_back_before) = (vouched(&c, 0, "vouched"), vouched(&c, 0, "fell_back"));
    assert!(vouched_before > 0, "the two honest peers vouched for nothing (fell back {fell_back_before})");
    c.stop(2);
    interleave(&c, 3, 4);
    let fell_back = vouched(&c, 0, "fell_back") - fell_back_before;
    let vouched_after = vouched(&c, 0, "vouched") - vouched_before;
    assert!(fell_back > 0, "with replica 2 stopped, the rounds the liar claimed far ahead fell back (vouched meanwhile: {vouched_after})");
    assert!(vouched_after > 0, "with replica 2 stopped, the rounds the liar claimed at 0 were vouched (fell back meanwhile: {fell_back})");
    // Whatever the liar did, the gateway's wait stayed within the configured bounds.
    let timeout = vouch_timeout(&c, 0);
    assert!((0.005..=0.05).contains(&timeout), "vouch timeout {timeout} s outside cluster.vouch_timeout_ms..=vouch_timeout_max_ms");
}

#[test]
fn reads_after_an_acknowledged_update_see_it() {
    let c = Cluster::up(ClusterOpts::default());
    interleave(&c, 12, 1);
    // The answers above came from the cache too: replica 0 counted hits.
    let metrics = c.metrics(0);
    let hits: u64 = metrics
        .lines()
        .find(|l| l.starts_with("sdns_read_cache_hits_total"))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no cache hit counter:\n{metrics}"));
    assert!(hits > 0, "the read cache answered nothing:\n{metrics}");
    // Most of those reads were answered without ordering.
    let (vouched, fell_back) = (vouched(&c, 0, "vouched"), vouched(&c, 0, "fell_back"));
    assert!(vouched > fell_back, "most reads were vouched: vouched {vouched}, fell back {fell_back}");
}
