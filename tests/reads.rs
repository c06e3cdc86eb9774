//! Reads and writes interleaved at one replica in ordered mode: every read sent after an
//! update was acknowledged sees it, however warm the replica's read cache was, and no read
//! ever sees an older value than one acknowledged before it was sent.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use sdns_system_tests::{run, text, tool, Cluster, ClusterOpts};

const NAME: &str = "rw.example.test";

/// The last octet of NAME's A record as replica `port` answers it over UDP or TCP, 0 when
/// there is none; `None` when the read was not answered. Without a cookie option (dig sends
/// one by default), which the read cache never serves.
fn read(port: u16, tcp: bool) -> Option<u32> {
    let mut cmd = std::process::Command::new(tool("dig"));
    cmd.arg("@127.0.0.1").arg("-p").arg(port.to_string()).args(["+norec", "+nocookie", "+time=5", "+tries=2", NAME, "A"]);
    if tcp {
        cmd.arg("+tcp");
    }
    let out = text(&run(&mut cmd));
    if !out.contains("status: NOERROR") && !out.contains("status: NXDOMAIN") {
        return None;
    }
    let value = out.lines().filter(|l| !l.starts_with(';')).find_map(|l| l.split_whitespace().last()?.strip_prefix("192.0.2.")?.parse().ok());
    Some(value.unwrap_or(0))
}

#[test]
fn reads_after_an_acknowledged_update_see_it() {
    let c = Cluster::up(ClusterOpts::default());
    let port = c.client_port(0);
    let acked = AtomicU32::new(0);
    let done = AtomicBool::new(false);
    let rounds = 12u32;
    std::thread::scope(|s| {
        // Concurrent readers at the same replica, over UDP and TCP: never older than what
        // was acknowledged before the read was sent.
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
        for k in 1..=rounds {
            // Warm: the same question asked again and again before the update.
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
    // The answers above came from the cache too: replica 0 counted hits.
    let metrics = c.metrics(0);
    let hits: u64 = metrics
        .lines()
        .find(|l| l.starts_with("sdns_read_cache_hits_total"))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no cache hit counter:\n{metrics}"));
    assert!(hits > 0, "the read cache answered nothing:\n{metrics}");
}
