//! End-to-end tests of a replicated cluster: real `sdns` processes, the patched named,
//! and BIND's dig, nsupdate, delv and dnssec-verify as the clients.

use std::net::UdpSocket;
use std::time::Duration;

use sdns_system_tests::{Cluster, ClusterOpts, Replicas};

fn answers(c: &Cluster, i: u16, name: &str, rtype: &str) -> String {
    c.dig(i, &[name, rtype, "+short"]).trim().to_string()
}

/// Every replica serves the same zone, byte for byte, and it verifies.
fn assert_converged(c: &Cluster) {
    let reference = c.axfr(0);
    for i in 1..c.n {
        assert_eq!(c.axfr(i), reference, "replica {i}'s zone differs from replica 0's\n{}", c.logs());
    }
    c.verify_zone(0);
}

/// Adds through one replica and deletes through another; every replica follows,
/// the zones stay identical and signed, and answers validate with the trust anchor.
fn updates_keep_replicas_identical(c: &Cluster) {
    for i in 0..c.n {
        let out = c.dig(i, &["www.example.test", "A", "+dnssec"]);
        assert!(out.contains("status: NOERROR") && out.contains("RRSIG"), "signed read through replica {i}:\n{out}");
    }
    let (ok, out) = c.nsupdate(1 % c.n, "update add added.example.test 300 A 192.0.2.7\nupdate add added.example.test 300 TXT \"threshold-signed\"");
    assert!(ok, "nsupdate add through replica 1 failed:\n{out}\n{}", c.logs());
    c.eventually("the added A record", |i| answers(c, i, "added.example.test", "A") == "192.0.2.7");
    assert_converged(c);

    let (ok, out) = c.nsupdate(2 % c.n, "update delete www.example.test A");
    assert!(ok, "nsupdate delete through replica 2 failed:\n{out}\n{}", c.logs());
    c.eventually("the deleted A record", |i| c.dig(i, &["www.example.test", "A"]).contains("ANSWER: 0"));
    assert_converged(c);

    for i in 0..c.n {
        let out = c.delv(i, "added.example.test", "A");
        assert!(out.contains("; fully validated") && out.contains("192.0.2.7"), "delv through replica {i}:\n{out}");
    }
}

#[test]
fn four_replicas_serve_update_and_validate() {
    let c = Cluster::up(ClusterOpts::default());
    updates_keep_replicas_identical(&c);

    // Key-changing updates are refused before they are ordered.
    let (ok, out) = c.nsupdate(3, "update add example.test 300 DNSKEY 257 3 8 AwEAAQ==");
    assert!(!ok && out.contains("REFUSED"), "a DNSKEY update must be refused:\n{out}");

    // An update without the TSIG key is answered REFUSED, as named would, without ordering.
    let (ok, out) = c.nsupdate_unsigned(0, "update add rogue.example.test 300 A 192.0.2.66");
    assert!(!ok && out.contains("REFUSED"), "an unsigned update must be refused:\n{out}");
    c.eventually("no rogue record", |i| c.dig(i, &["rogue.example.test", "A"]).contains("status: NXDOMAIN"));

    // The metrics endpoint counts what happened.
    let metrics = c.metrics(1);
    assert!(metrics.contains("sdns_requests_total{replica=\"1\",kind=\"write\"}"), "{metrics}");
    assert!(!metrics.contains("kind=\"write\"} 0"), "replica 1 executed the writes:\n{metrics}");
}

#[test]
fn seven_replicas_each_protocol_with_t_corrupted() {
    for protocol in ["basic", "opt-proof", "opt-te"] {
        let c = Cluster::up(ClusterOpts { replicas: 7, protocol, corrupt: vec![1, 4], ..Default::default() });
        let (ok, out) = c.nsupdate(0, &format!("update add {protocol}.example.test 300 A 192.0.2.9"));
        assert!(ok, "{protocol}: nsupdate failed:\n{out}\n{}", c.logs());
        c.eventually("the added record", |i| answers(&c, i, &format!("{protocol}.example.test"), "A") == "192.0.2.9");
        assert_converged(&c);
        // Honest replicas saw the corrupted replicas' bad shares (and only theirs).
        let m = c.metrics(0);
        for honest in [2u16, 3, 5, 6] {
            assert!(!m.contains(&format!("peer=\"{honest}\"")), "{protocol}: honest replica {honest} blamed:\n{m}");
        }
    }
}

#[test]
fn four_replicas_with_one_corrupted_opt_proof() {
    let c = Cluster::up(ClusterOpts { protocol: "opt-proof", corrupt: vec![3], ..Default::default() });
    updates_keep_replicas_identical(&c);
}

#[test]
fn single_replica_cluster() {
    let c = Cluster::up(ClusterOpts { replicas: 1, ..Default::default() });
    updates_keep_replicas_identical(&c);
}

#[test]
fn local_read_mode_answers_and_follows_updates() {
    let c = Cluster::up(ClusterOpts { reads: "local", ..Default::default() });
    let (ok, out) = c.nsupdate(0, "update add local.example.test 300 A 192.0.2.11");
    assert!(ok, "{out}");
    c.eventually("the added record, read locally", |i| answers(&c, i, "local.example.test", "A") == "192.0.2.11");
    assert_converged(&c);
}

#[test]
fn malformed_packets_disturb_nothing() {
    let c = Cluster::up(ClusterOpts::default());
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let target = ("127.0.0.1", c.client_port(0));
    let mut noise = testkit::Noise::new(0x2545f4914f6cdd1d);
    for len in [0usize, 1, 11, 12, 13, 40, 512, 1400] {
        for _ in 0..20 {
            let buf = noise.bytes(len);
            sock.send_to(&buf, target).unwrap();
        }
    }
    // A header claiming a question that is not there gets FORMERR with the same id.
    let mut runt = vec![0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 3, b'w'];
    sock.send_to(&runt, target).unwrap();
    let mut buf = [0u8; 512];
    let mut formerr = false;
    for _ in 0..50 {
        match sock.recv_from(&mut buf) {
            Ok((n, _)) if n >= 4 && buf[0] == 0xab && buf[1] == 0xcd => {
                formerr = buf[3] & 0x0f == 1;
                break;
            }
            Ok(_) => continue,
            Err(_) => break,
        }
    }
    assert!(formerr, "a truncated question must be answered FORMERR");
    runt.clear();
    // Every replica still answers and the zone is intact.
    for i in 0..c.n {
        assert_eq!(answers(&c, i, "mail.example.test", "A"), "192.0.2.25", "replica {i} after garbage\n{}", c.logs());
    }
    assert_converged(&c);

    // A record named accepts but a full DNS decoder rejects (a NAPTR whose flag is the
    // byte 0xff), then more updates than one checkpoint interval (64): transfers and
    // checkpoint digests read records as wire bytes, so checkpoints keep becoming
    // stable and every replica keeps answering.
    // With it, records whose rdata names named compresses in a transfer (MX, MINFO,
    // PTR, RP), which the digest reads decompressed.
    let (ok, out) = c.nsupdate(
        0,
        "update add odd.example.test 300 NAPTR \\# 9 0064000a01ff000000\n\
         update add mx.example.test 300 MX 10 mail.example.test\n\
         update add mx.example.test 300 MINFO www.example.test mail.example.test\n\
         update add ptr.example.test 300 PTR www.example.test\n\
         update add rp.example.test 300 RP mail.example.test www.example.test",
    );
    assert!(ok, "adding the odd NAPTR failed:\n{out}\n{}", c.logs());
    let many: Vec<String> = (0..70).map(|k| format!("update add n{k}.example.test 300 A 192.0.2.{}", k + 1)).collect();
    let (ok, out) = c.nsupdate(1, &many.join("\nsend\n"));
    assert!(ok, "70 updates failed:\n{out}\n{}", c.logs());
    c.eventually("the last of 70 updates", |i| answers(&c, i, "n69.example.test", "A") == "192.0.2.70");
    c.eventually("a stable checkpoint past the odd record", |i| stable_checkpoint(&c, i) >= 64);
    for i in 0..c.n {
        let log = std::fs::read_to_string(c.path(&format!("replica-{i}/sdns.log"))).unwrap_or_default();
        assert!(!log.contains("zone digest unavailable"), "replica {i} could not digest its zone:\n{}", c.logs());
    }
    for i in 0..c.n {
        let naptr = c.dig(i, &["odd.example.test", "NAPTR"]);
        assert!(naptr.contains("status: NOERROR") && naptr.contains("ANSWER: 1"), "replica {i}: odd NAPTR\n{naptr}");
    }
    assert_converged(&c);
    assert!(c.axfr(2).contains("odd.example.test."), "the AXFR carries the odd NAPTR");

    // An IXFR at the current serial is answered by the SOA alone and ends there
    // (RFC 1995): dig gets its one message, and the replica goes on with writes.
    let serial = c.dig(3, &["example.test", "SOA", "+short"]).split_whitespace().nth(2).unwrap_or_default().to_string();
    assert!(serial.parse::<u32>().is_ok(), "no serial: {serial:?}");
    let ixfr = c.dig(3, &["example.test", &format!("IXFR={serial}"), "+nocmd", "+nostats", "+nocomments"]);
    let records: Vec<&str> = ixfr.lines().filter(|l| !l.starts_with(';') && !l.trim().is_empty()).collect();
    assert!(records.len() == 1 && records[0].contains("SOA"), "IXFR at the current serial:\n{ixfr}");
    let (ok, out) = c.nsupdate(3, "update add after-ixfr.example.test 300 A 192.0.2.99");
    assert!(ok, "update after an IXFR:\n{out}\n{}", c.logs());
}

/// Replica `i`'s stable checkpoint, from its /status.
fn stable_checkpoint(c: &Cluster, i: u16) -> u64 {
    let out = std::process::Command::new("curl").args(["-s", "-m", "5"]).arg(format!("http://127.0.0.1:{}/status", c.metrics_port(i))).output();
    let body = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    body.split("\"stable_checkpoint\":").nth(1).and_then(|r| r.split(|ch: char| !ch.is_ascii_digit()).next()).and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[test]
fn stopped_replica_catches_up_and_converges() {
    let c = Cluster::up(ClusterOpts::default());
    c.stop(3);
    // t = 1: the other three order and sign without it.
    for k in 0..3 {
        let (ok, out) = c.nsupdate(k % 3, &format!("update add missed{k}.example.test 300 A 192.0.2.{}", 20 + k));
        assert!(ok, "update {k} with replica 3 down failed:\n{out}\n{}", c.logs());
    }
    c.start_stopped();
    // Replica 3 fetches the batches it missed, executes them on its named (signatures come
    // from the others' caches of final signatures) and ends with the same zone.
    c.eventually("replica 3 caught up", |i| answers(&c, i, "missed2.example.test", "A") == "192.0.2.22");
    assert_converged(&c);
    // And it takes part in new updates.
    let (ok, out) = c.nsupdate(3, "update add after.example.test 300 A 192.0.2.30");
    assert!(ok, "update through the restarted replica failed:\n{out}\n{}", c.logs());
    c.eventually("the update after restart", |i| answers(&c, i, "after.example.test", "A") == "192.0.2.30");
    assert_converged(&c);
}

/// The inception time of the RRSIG over `name`'s A RRset, as replica `i` serves it.
fn inception(c: &Cluster, i: u16, name: &str) -> String {
    let out = c.dig(i, &[name, "RRSIG", "+short"]);
    // "A 8 3 300 <expiration> <inception> <tag> <signer> <signature>"
    out.lines().find(|l| l.starts_with("A ")).and_then(|l| l.split_whitespace().nth(5)).unwrap_or_default().to_string()
}

#[test]
fn zone_is_re_signed_before_signatures_expire() {
    let c = Cluster::up(ClusterOpts { resign_after_s: Some(15), ..Default::default() });
    let first = inception(&c, 0, "www.example.test");
    assert_eq!(first.len(), 14, "no RRSIG inception for www:\n{}", c.dig(0, &["www.example.test", "RRSIG"]));
    // The re-sign is ordered once the last signing is 15 s old by the agreed time.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    for i in 0..c.n {
        while inception(&c, i, "www.example.test") == first {
            assert!(std::time::Instant::now() < deadline, "replica {i} never re-signed\n{}", c.logs());
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    assert!(inception(&c, 0, "www.example.test") > first, "inception moved backwards");
    // Re-signs keep coming every 15 s; one may fall between two transfers, so compare a
    // few times before calling the zones different.
    let mut last = String::new();
    for _ in 0..5 {
        let zones: Vec<String> = (0..c.n).map(|i| c.axfr(i)).collect();
        if zones.iter().all(|z| z == &zones[0]) {
            c.verify_zone(0);
            return;
        }
        last = zones.iter().enumerate().map(|(i, z)| format!("replica {i}: {} lines", z.lines().count())).collect::<Vec<_>>().join(", ");
        std::thread::sleep(Duration::from_secs(2));
    }
    panic!("replicas' zones differ after re-signing ({last})\n{}", c.logs());
}

/// `kill -9` of a replica's sdns takes its named along (named belongs to its sdns), the
/// replica starts again the way `cluster up` starts it, with one named on its port, catches up
/// on what it missed and converges.
#[test]
fn killed_replica_takes_its_named_along_and_comes_back() {
    let c = Cluster::up(ClusterOpts::default());
    let named_pid_file = c.path("replica-2/state/named/named.pid");
    let named_pid: i32 = std::fs::read_to_string(&named_pid_file).expect("named.pid").trim().parse().expect("pid");
    let alive =
        |pid: i32| std::process::Command::new("kill").args(["-0", &pid.to_string()]).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success());
    assert!(alive(named_pid), "replica 2's named is not running");
    c.kill9(2);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(named_pid) {
        assert!(std::time::Instant::now() < deadline, "replica 2's named (pid {named_pid}) outlived its sdns");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, out) = c.nsupdate(0, "update add while-down.example.test 300 A 192.0.2.41");
    assert!(ok, "update with replica 2 killed failed:\n{out}\n{}", c.logs());
    c.start_stopped();
    let new_pid: i32 = std::fs::read_to_string(&named_pid_file).expect("named.pid").trim().parse().expect("pid");
    assert_ne!(new_pid, named_pid);
    c.eventually("replica 2 caught up", |i| answers(&c, i, "while-down.example.test", "A") == "192.0.2.41");
    assert_converged(&c);
}
