//! Update authentication end to end: real `sdns` clusters and the patched named, driven
//! by BIND's nsupdate and dig, and by TSIG-signed updates this test times itself.

use std::net::UdpSocket;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sdns_system_tests::{Cluster, ClusterOpts};
use wrapper::auth::{tsig, wire};

fn metric(c: &Cluster, i: u16, series: &str) -> u64 {
    let text = c.metrics(i);
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

fn writes_executed(c: &Cluster, i: u16) -> u64 {
    metric(c, i, &format!("sdns_requests_total{{replica=\"{i}\",kind=\"write\"}}"))
}

fn sig0_private_key(c: &Cluster) -> PathBuf {
    std::fs::read_dir(c.dir.path())
        .expect("cluster dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("Ksdns-update.") && n.ends_with(".private")))
        .expect("the dealer's SIG(0) private key")
}

/// A corrupted replica holding the shared TSIG secret orders an update signed with it;
/// in a sig0-only cluster every replica refuses it at execution and the zone stays as
/// it was, while the operator's SIG(0) key updates it. Unsigned updates and transfers
/// without the transfer key are refused too.
#[test]
fn sig0_zone_refuses_the_shared_tsig_key_even_when_ordered() {
    let c = Cluster::up(ClusterOpts { update_auth: "sig0", skip_precheck: vec![0], ..ClusterOpts::default() });
    let before: Vec<String> = (0..c.n).map(|i| c.axfr(i)).collect();
    let writes = writes_executed(&c, 1);

    // Through replica 0, which skips the pre-ordering check: ordered, then refused.
    let (ok, out) = c.nsupdate(0, "update add forged.example.test 300 A 192.0.2.66");
    assert!(!ok && out.contains("REFUSED"), "the shared key must not update a sig0 zone:\n{out}\n{}", c.logs());
    c.eventually("the forged update executed", |i| writes_executed(&c, i) > writes);
    // Through an honest replica: refused before ordering (the write count stays).
    let (ok, out) = c.nsupdate(1, "update add forged2.example.test 300 A 192.0.2.67");
    assert!(!ok && out.contains("REFUSED"), "{out}");
    let (ok, out) = c.nsupdate_unsigned(2, "update add rogue.example.test 300 A 192.0.2.68");
    assert!(!ok && out.contains("REFUSED"), "{out}");
    assert_eq!(writes_executed(&c, 1), writes + 1, "only the update replica 0 ordered was executed");
    for i in 0..c.n {
        assert_eq!(c.axfr(i), before[usize::from(i)], "replica {i}'s zone changed\n{}", c.logs());
    }

    // The operator's SIG(0) key works through any replica.
    let key = sig0_private_key(&c);
    let (ok, out) = c.nsupdate_key(3, "update add signed.example.test 300 A 192.0.2.5", Some(&key));
    assert!(ok, "SIG(0) update through replica 3 failed:\n{out}\n{}", c.logs());
    c.eventually("the SIG(0) update", |i| c.dig(i, &["signed.example.test", "A", "+short"]).trim() == "192.0.2.5");
    let reference = c.axfr(0);
    for i in 1..c.n {
        assert_eq!(c.axfr(i), reference, "replica {i} differs\n{}", c.logs());
    }
    c.verify_zone(1);

    // Transfers from an address the [access] ACL does not list (the local cluster lists
    // 127.0.0.1 only): refused without the transfer key and with the update key, served
    // with the transfer key (allowed by address OR by key, as BIND's allow-transfer lists).
    let plain = c.dig(2, &["-b", "127.0.0.2", "example.test", "AXFR"]);
    assert!(plain.contains("Transfer failed") && !plain.contains("SOA\t"), "AXFR without a key must be refused:\n{plain}");
    let tsig = c.path("tsig.key");
    let wrong = c.dig(2, &["-b", "127.0.0.2", "-k", tsig.to_str().unwrap(), "example.test", "AXFR"]);
    assert!(wrong.contains("Transfer failed"), "AXFR with the update key must be refused:\n{wrong}");
    let transfer = c.path("transfer.key");
    let keyed = c.dig(2, &["-b", "127.0.0.2", "-k", transfer.to_str().unwrap(), "example.test", "AXFR"]);
    assert!(!keyed.contains("Transfer failed") && keyed.matches("\tSOA\t").count() == 2, "AXFR with the transfer key must be served:\n{keyed}");
}

/// An update with a MAC made with the wrong secret gets NOTAUTH(BADSIG) before ordering.
#[test]
fn badly_signed_updates_are_answered_without_ordering() {
    let c = Cluster::up(ClusterOpts { replicas: 1, ..ClusterOpts::default() });
    let writes = writes_executed(&c, 0);
    let wrong = c.path("wrong.key");
    let text = std::fs::read_to_string(c.path("tsig.key")).unwrap();
    let start = text.find("secret \"").unwrap() + 8;
    let mut bad = text.clone();
    bad.replace_range(start..start + 4, if &text[start..start + 4] == "AAAA" { "BBBB" } else { "AAAA" });
    std::fs::write(&wrong, bad).unwrap();
    let (ok, out) = c.nsupdate_key(0, "update add bad.example.test 300 A 192.0.2.9", Some(&wrong));
    assert!(!ok && out.contains("BADSIG"), "{out}");
    let (ok, out) = c.nsupdate_unsigned(0, "update add bad.example.test 300 A 192.0.2.9");
    assert!(!ok && out.contains("REFUSED"), "{out}");
    assert_eq!(writes_executed(&c, 0), writes, "refused updates must not be ordered");
    let (ok, out) = c.nsupdate(0, "update add good.example.test 300 A 192.0.2.10");
    assert!(ok, "{out}\n{}", c.logs());
    assert_eq!(writes_executed(&c, 0), writes + 1);
}

fn update(id: u16, k: u32) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.extend_from_slice(&[0x28, 0, 0, 1, 0, 0, 0, 1, 0, 0]);
    m.extend_from_slice(&wire::name_to_wire("example.test.").unwrap());
    m.extend_from_slice(&[0, 6, 0, 1]);
    m.extend_from_slice(&wire::name_to_wire(&format!("edge-{k}.example.test.")).unwrap());
    m.extend_from_slice(&[0, 1, 0, 1, 0, 0, 1, 44, 0, 4, 192, 0, 2, (k % 250) as u8 + 1]);
    m
}

/// Updates signed with fudge 0 and sent a few ms before a second boundary, through
/// different replicas: whether each passes depends on the agreed time of its batch,
/// never on a replica's clock, so every replica applies it or none does.
#[test]
fn edge_of_window_tsig_updates_apply_everywhere_or_nowhere() {
    let c = Cluster::up(ClusterOpts::default());
    let file = wrapper::files::TsigKey::from_bind(&std::fs::read_to_string(c.path("tsig.key")).unwrap()).unwrap();
    let key = tsig::Key::new(&file.name, tsig::Algorithm::from_name(&file.algorithm).unwrap(), &file.secret()).unwrap();
    let ordered_before = writes_executed(&c, 0);
    let mut outcomes = Vec::new();
    for round in 0..30u32 {
        // Aim 1..=8 ms before the next second: about an ordering's latency.
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let lead = Duration::from_millis(u64::from(1 + (round * 3) % 8));
        let next = Duration::from_secs(now.as_secs() + 1);
        std::thread::sleep(next.saturating_sub(now).saturating_sub(lead).max(Duration::from_millis(1)));
        let signed_at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let mut sent = Vec::new();
        for j in 0..2u32 {
            let k = round * 2 + j;
            let replica = ((round + 2 * j) % u32::from(c.n)) as u16;
            let msg = tsig::sign(&update(k as u16, k), &key, signed_at, 0, 0, Vec::new(), None);
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            sock.send_to(&msg, ("127.0.0.1", c.client_port(replica))).unwrap();
            sent.push((k, replica, sock));
        }
        for (k, replica, sock) in sent {
            let mut buf = [0u8; 4096];
            let n = sock.recv(&mut buf).unwrap_or_else(|e| panic!("update {k} through replica {replica}: no answer: {e}\n{}", c.logs()));
            outcomes.push((k, buf[..n][3] & 0x0f));
        }
    }
    let applied = outcomes.iter().filter(|(_, rcode)| *rcode == 0).count();
    let refused = outcomes.iter().filter(|(_, rcode)| *rcode == 9).count();
    // Refused before ordering (the local clock, a filter) or at execution (the agreed time).
    let ordered = writes_executed(&c, 0) - ordered_before;
    eprintln!(
        "edge-of-window: {applied} applied, {refused} refused (BADTIME) of {}; {ordered} ordered, so {} refused at execution",
        outcomes.len(),
        ordered.saturating_sub(applied as u64)
    );
    assert_eq!(applied + refused, outcomes.len(), "only NOERROR or NOTAUTH expected: {outcomes:?}");
    let reference = c.axfr(0);
    for i in 1..c.n {
        assert_eq!(c.axfr(i), reference, "replica {i}'s zone differs after the edge-of-window updates\n{}", c.logs());
    }
    for (k, rcode) in outcomes {
        let present = reference.contains(&format!("edge-{k}.example.test."));
        assert_eq!(present, rcode == 0, "update {k}: answered rcode {rcode} but present = {present}");
    }
    c.verify_zone(0);
}

/// With response rate limiting on, a burst of identical UDP queries from one client gets
/// about the rate in full answers, every second limited one truncated (TC) and the rest
/// dropped; the same client over TCP is not limited.
#[test]
fn udp_answers_are_rate_limited_per_client() {
    let c = Cluster::up(ClusterOpts { replicas: 1, rrl: 5, ..ClusterOpts::default() });
    let mut q = vec![0x77, 0x00, 0x00, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    q.extend_from_slice(&wire::name_to_wire("www.example.test.").unwrap());
    q.extend_from_slice(&[0, 1, 0, 1]);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    for i in 0..60u16 {
        q[..2].copy_from_slice(&i.to_be_bytes());
        sock.send_to(&q, ("127.0.0.1", c.client_port(0))).unwrap();
    }
    let (mut full, mut truncated) = (0, 0);
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        if buf[2] & 0x02 != 0 {
            assert_eq!(&buf[6..12], &[0; 6], "a slipped answer carries no records");
            truncated += 1;
        } else if n > 12 {
            full += 1;
        }
    }
    eprintln!("rrl: {full} full, {truncated} truncated of 60");
    // 5 per second of credit; the burst is answered within a few seconds.
    assert!((5..=25).contains(&full), "{full} full answers");
    assert!(truncated >= 10, "{truncated} truncated answers");
    assert!(full + truncated < 60, "some limited answers must be dropped");
    // TCP is never limited.
    for _ in 0..10 {
        let out = c.dig(0, &["+tcp", "www.example.test", "A"]);
        assert!(out.contains("status: NOERROR") && out.contains("192.0.2.80"), "{out}");
    }
}
