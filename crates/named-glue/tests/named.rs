//! Tests against the real patched named (patches/bind9/build.sh output,
//! found through SDNS_BIND_DIR or <workspace>/target/bind9).

mod common;

use std::time::Duration;

use common::*;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use named_glue::forward::{build_query, Forwarder};
use named_glue::time::unix_now;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_replica_signs_updates_through_the_socket() {
    let (signer, key) = RsaSigner::generate();
    let t0 = unix_now() as u32;
    let r = Replica::start(signer, key, t0, None).await;

    // The initially signed zone validates and carries the agreed times.
    let before = r.axfr().await;
    let v = r.verify_zone(&before);
    assert!(v.status.success(), "dnssec-verify on the initial zone: {}", text(&v));
    let inception = named_glue::time::format_timestamp(u64::from(t0 - 3600));
    assert!(before.contains(&inception), "RRSIG inception {inception} missing:\n{before}");

    // Adds and a delete through TSIG-signed updates.
    r.times.set_agreed(t0 + 10);
    let out = r.nsupdate(&["update add new.example.test. 300 A 192.0.2.77", "update add new.example.test. 300 TXT \"hello\""]).await;
    assert!(out.status.success(), "nsupdate add: {}\n{}", text(&out), r.log());
    r.times.set_agreed(t0 + 20);
    let out = r.nsupdate(&["update delete www.example.test. A"]).await;
    assert!(out.status.success(), "nsupdate delete: {}", text(&out));

    let after = r.axfr().await;
    assert!(after.contains("new.example.test.") && after.contains("192.0.2.77"), "{after}");
    assert!(!after.contains("192.0.2.1\n"), "www A still present:\n{after}");
    let updated_inception = named_glue::time::format_timestamp(u64::from(t0 + 20 - 3600));
    assert!(after.contains(&updated_inception), "update RRSIGs not at the agreed time:\n{after}");
    let v = r.verify_zone(&after);
    assert!(v.status.success(), "dnssec-verify after updates: {}", text(&v));

    // dig +dnssec gets the RRSIG; delv validates against the zone's key.
    let out = r.dig(&["new.example.test.", "A", "+dnssec", "+norec"]).await;
    let dig_text = text(&out);
    assert!(dig_text.contains("RRSIG") && dig_text.contains("192.0.2.77"), "{dig_text}");
    let out = r.delv("new.example.test.", "A");
    assert!(text(&out).contains("fully validated"), "delv: {}", text(&out));
    let out = r.delv("www.example.test.", "A");
    assert!(
        text(&out).contains("resolution failed: ncache nxrrset") || text(&out).contains("negative response, fully validated"),
        "delv on the deleted name: {}",
        text(&out)
    );

    // The forwarder gets the same answer over UDP and TCP, and the zone by AXFR.
    let fwd = Forwarder::new(r.addr());
    let query = build_query(4242, &"new.example.test.".parse().unwrap(), RecordType::A).unwrap();
    for answer in [fwd.forward_udp(&query).await.unwrap(), fwd.forward_tcp(&query).await.unwrap()] {
        let m = Message::from_vec(&answer).unwrap();
        assert_eq!(m.metadata.id, 4242);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(m.answers.len(), 1);
    }
    // An answer over 512 bytes comes back over UDP as named truncated it (no EDNS
    // in the query: TC set, at most 512 bytes); the client asks again over TCP.
    r.times.set_agreed(t0 + 30);
    let txt: Vec<String> = (0..12).map(|i| format!("update add big.example.test. 300 TXT \"{i:02}{}\"", "x".repeat(90))).collect();
    let lines: Vec<&str> = txt.iter().map(String::as_str).collect();
    let out = r.nsupdate(&lines).await;
    assert!(out.status.success(), "{}", text(&out));
    let big = build_query(99, &"big.example.test.".parse().unwrap(), RecordType::TXT).unwrap();
    let udp_only = named_glue::forward::Forwarder { udp_attempts: 1, ..fwd.clone() };
    let answer = udp_only.forward_udp(&big).await.unwrap();
    let m = Message::from_vec(&answer).unwrap();
    assert!(m.metadata.truncation && answer.len() <= 512, "named's truncation kept: {} bytes, TC {}", answer.len(), m.metadata.truncation);
    let whole = Message::from_vec(&fwd.forward_tcp(&big).await.unwrap()).unwrap();
    assert_eq!(whole.answers.len(), 12);

    let axfr_query = build_query(7, &zone(), RecordType::AXFR).unwrap();
    let messages = fwd.axfr(&axfr_query).await.unwrap().collect().await.unwrap();
    let records: usize = messages.iter().map(|m| Message::from_vec(m).unwrap().answers.len()).sum();
    let dig_records = r.axfr().await.lines().count();
    assert_eq!(records, dig_records, "forwarded AXFR and dig AXFR differ in size");

    // An IXFR at the current serial is answered with the SOA alone, and the stream
    // ends there (RFC 1995), in one round trip rather than at named's idle timeout.
    let soa = messages[0].clone();
    let serial = named_glue::rrwire::RawMessage::parse(&soa).unwrap().answers[0].soa_serial().unwrap();
    let ixfr = ixfr_query(8, serial);
    // (named keeps the connection open: a stream waiting for more would fail here
    // with a timeout instead of ending.)
    let answers = fwd.axfr(&ixfr).await.unwrap().collect().await.unwrap();
    assert_eq!(answers.len(), 1, "one message for an up-to-date IXFR");
    // From an older serial: the incremental framing, ending at the closing SOA.
    let answers = fwd.axfr(&ixfr_query(9, serial - 1)).await.unwrap().collect().await.unwrap();
    let soas =
        answers.iter().flat_map(|m| named_glue::rrwire::RawMessage::parse(m).unwrap().answers).filter(|r| r.rtype == named_glue::rrwire::TYPE_SOA).count();
    assert!(soas >= 4, "an incremental transfer has at least four SOAs, got {soas}");

    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_material_updates_are_refused() {
    let (signer, key) = RsaSigner::generate();
    let t0 = unix_now() as u32;
    let r = Replica::start(signer, key.clone(), t0, None).await;
    let before = r.axfr().await;
    let dnskey = key.dnskey_record();
    let dnskey_rdata = dnskey.split(" DNSKEY ").nth(1).unwrap().to_string();
    let cases = [
        format!("update add example.test. 3600 DNSKEY {dnskey_rdata}"),
        format!("update add example.test. 3600 CDNSKEY {dnskey_rdata}"),
        format!("update add example.test. 3600 CDS {} 8 2 {}", key.key_tag(), "AB".repeat(32)),
        "update add example.test. 0 NSEC3PARAM 1 0 0 -".to_string(),
        "update delete example.test. DNSKEY".to_string(),
    ];
    for case in &cases {
        let out = r.nsupdate(&[case.as_str()]).await;
        assert!(!out.status.success(), "{case} was accepted");
        assert!(text(&out).contains("REFUSED"), "{case}: {}", text(&out));
    }
    assert_same_zone(&r.axfr().await, &before, "refused update");
    // An ordinary update still works.
    let out = r.nsupdate(&["update add ok.example.test. 300 A 192.0.2.9"]).await;
    assert!(out.status.success(), "{}", text(&out));
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_end_byte_identical() {
    let (signer, key) = RsaSigner::generate();
    let t0 = unix_now() as u32;
    let a = Replica::start(signer.clone(), key.clone(), t0, None).await;
    let updates: [&[&str]; 3] = [
        &["update add a.example.test. 300 A 192.0.2.10", "update add b.example.test. 300 AAAA 2001:db8::1"],
        &["update delete mail.example.test. MX"],
        &["update add c.example.test. 600 TXT \"third\"", "update delete a.example.test. A"],
    ];
    for (i, u) in updates.iter().enumerate() {
        a.times.set_agreed(t0 + 100 * (i as u32 + 1));
        let out = a.nsupdate(u).await;
        assert!(out.status.success(), "replica a, update {i}: {}", text(&out));
    }
    // Replica b gets the same updates with the same agreed times, later in
    // wall-clock time (named's own clock differs by seconds).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b = Replica::start(signer, key, t0, None).await;
    for (i, u) in updates.iter().enumerate() {
        b.times.set_agreed(t0 + 100 * (i as u32 + 1));
        tokio::time::sleep(Duration::from_millis(700)).await;
        let out = b.nsupdate(u).await;
        assert!(out.status.success(), "replica b, update {i}: {}", text(&out));
    }
    let (za, zb) = (a.axfr().await, b.axfr().await);
    assert!(za.contains("c.example.test."), "{za}");
    assert_same_zone(&za, &zb, "replicas a and b");
    let v = a.verify_zone(&za);
    assert!(v.status.success(), "{}", text(&v));
    a.shutdown().await;
    b.shutdown().await;
}

/// A signer's error answers make named answer SERVFAIL and leave the zone as it was.
/// An absent, silent or lying signer does not: named keeps waiting for the reply with
/// its request's id (no deadline of its own), re-sending the request, and the update
/// completes once a real signer answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signer_failures_leave_the_zone_unchanged() {
    let (signer, key) = RsaSigner::generate();
    let t0 = unix_now() as u32;
    let mut r = Replica::start(signer, key, t0, Some(300)).await;
    r.times.set_agreed(t0 + 5);
    let out = r.nsupdate(&["update add first.example.test. 300 A 192.0.2.5"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let zone_before = r.axfr().await;

    let expect_servfail = |out: &std::process::Output, what: &str| {
        assert!(!out.status.success(), "{what}: update succeeded");
        assert!(text(out).contains("SERVFAIL"), "{what}: {}", text(out));
    };
    let update = ["update add second.example.test. 300 A 192.0.2.6"];

    // Replies named must refuse: an error status, signatures of the wrong size.
    let sig_len = r.signer.public.modulus_bytes() + 1;
    let wrong_size = named_glue::wire::Reply::ok(0, t0, t0 + 86_400, vec![7; sig_len]).encode().unwrap();
    let refused = [
        ("short", vector("reply-short.hex"), "bad signature length"),
        ("long", vector("reply-long.hex"), "bad signature length"),
        ("error status", vector("reply-error.hex"), "signer refused"),
        ("wrong signature size", wrong_size, "bad signature length"),
    ];
    r.stop_service();
    for (what, bytes, logged) in refused {
        let fake = FakeSigner::bind(&r.socket, Fake::Reply { bytes, patch_id: true });
        let seen = r.log().matches(logged).count();
        expect_servfail(&r.nsupdate(&update).await, what);
        r.wait_log_count(logged, seen + 1).await;
        assert!(*fake.requests.lock().unwrap() >= 1, "{what}: named never asked");
        // named's requests (the C encoder) decode with the Rust decoder.
        assert!(fake.undecodable.lock().unwrap().is_empty(), "{:?}", fake.undecodable.lock().unwrap());
        for (alg, tag, signer) in fake.seen.lock().unwrap().iter() {
            assert_eq!((*alg, *tag, signer.as_str()), (8, r.key.key_tag(), ZONE));
        }
        drop(fake);
        assert_same_zone(&r.axfr().await, &zone_before, what);
    }

    // No socket at all: named waits, re-sending, and says so once.
    let pending = r.nsupdate_in_background(&update);
    r.wait_log_count("request not delivered (will re-send): No such file or directory", 1).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(r.log().matches("request not delivered").count(), 1, "one line per distinct error:\n{}", r.log());
    // No AXFR while the update waits: the wait blocks one of named's two worker threads,
    // and a connection handed to that thread waits too (sdns sends no reads during a write).

    // A signer that never answers; then replies that named ignores (malformed, another
    // request's id, a good reply from another socket); through all of it named keeps
    // re-sending the same request and the update does not end.
    let good = named_glue::wire::Reply::ok(0, t0, t0 + 86_400, vec![7; sig_len - 1]).encode().unwrap();
    let mut wrong_id = good.clone();
    wrong_id[15] ^= 1;
    let ignored = [
        ("silent signer", Fake::Silent, None),
        ("bad magic", Fake::Reply { bytes: vector("reply-bad-magic.hex"), patch_id: true }, Some("ignoring a malformed reply")),
        ("bad version", Fake::Reply { bytes: vector("reply-bad-version.hex"), patch_id: true }, Some("ignoring a malformed reply")),
        ("short header", Fake::Reply { bytes: vector("reply-short-header.hex"), patch_id: true }, Some("ignoring a malformed reply")),
        ("wrong id", Fake::Reply { bytes: wrong_id, patch_id: false }, Some("ignoring a reply for another request")),
        // The kernel refuses it: named's socket is connected to the signer's.
        ("spoofed reply", Fake::Spoofed(good.clone()), None),
    ];
    let mut ids = Vec::new();
    for (what, how, logged) in ignored {
        let seen = logged.map(|l| r.log().matches(l).count()).unwrap_or(0);
        let fake = FakeSigner::bind(&r.socket, how);
        for _ in 0..100 {
            if *fake.requests.lock().unwrap() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(*fake.requests.lock().unwrap() >= 2, "{what}: named did not re-send\n{}", r.log());
        if let Some(l) = logged {
            r.wait_log_count(l, seen + 2).await;
        }
        ids.extend(fake.ids.lock().unwrap().iter().copied());
        drop(fake);
        assert!(!pending.is_finished(), "{what}: the update ended\n{}", r.log());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every re-send is the same request: {ids:?}");

    // The signer is back: the waiting update completes, signed.
    r.start_service();
    let out = tokio::time::timeout(Duration::from_secs(60), pending).await.unwrap().unwrap();
    assert!(out.status.success(), "after recovery: {}\n{}", text(&out), r.log());
    r.wait_log_count("request delivered", 1).await;
    let zone_after = r.axfr().await;
    assert!(zone_after.contains("second.example.test."), "{zone_after}");
    let v = r.verify_zone(&zone_after);
    assert!(v.status.success(), "{}", text(&v));
    assert_eq!(r.named.as_ref().unwrap().starts(), 1, "named restarted during the failures");
    // The journal holds exactly the successful updates.
    r.named.as_ref().unwrap().restart().await.unwrap();
    assert_eq!(canonical(&r.axfr().await), canonical(&zone_after), "zone changed across a restart");

    // A reply for another request, a malformed one, then the one for this request:
    // named reads on until its own arrives (the signature bytes are not checked by named).
    r.stop_service();
    {
        let mut stray = good.clone();
        stray[8..16].copy_from_slice(&[0xee; 8]);
        let _fake = FakeSigner::bind(&r.socket, Fake::Replies(vec![(stray, false), (vector("reply-bad-magic.hex"), true), (good, true)]));
        let seen = r.log().matches("ignoring a reply for another request").count();
        let out = r.nsupdate(&["update add third.example.test. 300 A 192.0.2.7"]).await;
        assert!(out.status.success(), "the right reply after a stray one: {}\n{}", text(&out), r.log());
        r.wait_log_count("ignoring a reply for another request", seen + 1).await;
        assert!(r.log().contains("ignoring a malformed reply"));
    }
    r.shutdown().await;
}

/// named killed behind the supervisor's back comes back by itself with its
/// zone (file + journal); restart on demand and stop work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_restarts_named() {
    let (signer, key) = RsaSigner::generate();
    let t0 = unix_now() as u32;
    let mut r = Replica::start(signer, key, t0, None).await;
    r.times.set_agreed(t0 + 1);
    let out = r.nsupdate(&["update add kept.example.test. 300 A 192.0.2.99"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let zone_before = r.axfr().await;
    let signed_before = r.signer.signed();
    assert!(signed_before > 0);

    let named = r.named.as_ref().unwrap();
    let first_pid = named.pid();
    assert_ne!(first_pid, 0);
    assert!(named_glue::signal::send(first_pid as i32, named_glue::signal::SIGKILL));
    // Back within the backoff plus startup.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while named.starts() < 2 || named.pid() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "named was not restarted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    named.wait_ready().await.unwrap();
    assert_ne!(named.pid(), first_pid);
    assert_eq!(canonical(&r.axfr().await), canonical(&zone_before), "zone lost across a crash");

    named.restart().await.unwrap();
    assert_eq!(named.starts(), 3);
    assert_eq!(canonical(&r.axfr().await), canonical(&zone_before), "zone lost across a restart");

    // named never signs on its own (no re-signing timers, no key
    // maintenance): not at startup, not after a journal replay.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(r.signer.signed(), signed_before, "named signed without an update");

    let last_pid = named.pid();
    r.named.take().unwrap().stop().await;
    let alive = named_glue::signal::alive(last_pid as i32);
    assert!(!alive, "named still running after stop");
    let _ = &mut r;
}

/// The initial signing is deterministic: same agreed time, same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_signing_is_deterministic() {
    use named_glue::signer::{ServiceLimits, SignatureTimes, SigningService};
    use named_glue::signzone::sign_zone_file;
    let tools = tools();
    let (signer, key) = RsaSigner::generate();
    let dir = tempfile::tempdir().unwrap();
    let key_dir = dir.path().join("keys");
    std::fs::create_dir(&key_dir).unwrap();
    key.write_files(&key_dir, unix_now() - 86_400).unwrap();
    let unsigned = dir.path().join("zone.unsigned");
    std::fs::write(&unsigned, UNSIGNED_ZONE).unwrap();
    let times = Times::default();
    let socket = dir.path().join("signer.sock");
    let _service = SigningService::bind(&socket, signer, times.source(), ServiceLimits::default()).unwrap();
    let t0 = unix_now() as u32;
    let mut outputs = Vec::new();
    for (i, t) in [t0, t0, t0 + 1].into_iter().enumerate() {
        times.set_agreed(t);
        let signed = dir.path().join(format!("signed{i}.db"));
        let agreed = SignatureTimes::from_agreed(t, VALIDITY_DAYS * 86_400);
        sign_zone_file(&tools, &zone(), &unsigned, &signed, &key_dir, &key, &socket, agreed, 1).await.unwrap();
        outputs.push(std::fs::read(&signed).unwrap());
        if i == 0 {
            // Different wall-clock time for the second run.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
    }
    assert_eq!(outputs[0], outputs[1], "two signings at the same agreed time differ");
    assert_ne!(outputs[0], outputs[2], "the agreed time does not reach the signatures");
    let text0 = String::from_utf8(outputs[0].clone()).unwrap();
    assert!(text0.contains("RRSIG") && text0.contains("DNSKEY"), "{text0}");

    // Several threads: names may come out in another order, never other records.
    times.set_agreed(t0);
    let threaded = dir.path().join("threaded.db");
    sign_zone_file(&tools, &zone(), &unsigned, &threaded, &key_dir, &key, &socket, SignatureTimes::from_agreed(t0, VALIDITY_DAYS * 86_400), 4).await.unwrap();
    let sorted = |text: &str| {
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };
    let threaded_text = std::fs::read_to_string(&threaded).unwrap();
    assert_eq!(sorted(&threaded_text), sorted(&text0), "four signer threads gave other records than one");

    // No signing socket: the tool neither signs locally nor gives up on a timer of its own;
    // it waits (re-sending) for the service. Stopping it (kill_on_drop) leaves no output.
    drop(_service);
    let signed = dir.path().join("nosigner.db");
    let agreed = SignatureTimes::from_agreed(t0, VALIDITY_DAYS * 86_400);
    let waited =
        tokio::time::timeout(std::time::Duration::from_secs(5), sign_zone_file(&tools, &zone(), &unsigned, &signed, &key_dir, &key, &socket, agreed, 1)).await;
    assert!(waited.is_err(), "without a signer the tool finished: {:?}", waited.map(|r| r.map(|_| ())));
    assert!(!signed.exists(), "signed without a signer");
}

/// A named left running by an earlier run of the replica (its supervisor killed without
/// cleaning up) is stopped before a new one starts; a port held by anything else is refused.
/// Never two named on one port (named binds with SO_REUSEPORT, so both would serve).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_never_starts_a_second_named() {
    use named_glue::supervisor::{NamedSpec, SuperviseError, Supervisor};
    let (signer, key) = RsaSigner::generate();
    let t0 = unix_now() as u32;
    let mut r = Replica::start(signer, key, t0, None).await;
    r.named.take().unwrap().stop().await;
    let conf = r.path().join("named.conf");
    let pid_file = r.path().join("named.pid");
    let _ = std::fs::remove_file(&pid_file);

    // The leftover: a named started outside any supervisor, as after `kill -9` of an old sdns.
    let mut stale = std::process::Command::new(r.tools.named())
        .args(["-g", "-4", "-n", "1", "-c"])
        .arg(&conf)
        .env(named_glue::SIGNER_SOCKET_ENV, &r.socket)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the stale named");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !(named_glue::forward::zone_answers(r.addr(), &zone(), Duration::from_millis(300)).await.unwrap_or(false)
        && std::fs::read_to_string(&pid_file).is_ok_and(|p| p.trim() == stale.id().to_string()))
    {
        assert!(tokio::time::Instant::now() < deadline, "the stale named did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let spec = |with_pid_file: bool| {
        let mut spec = NamedSpec::new(r.tools.named(), conf.clone(), r.port, zone(), r.path().join("named.log"));
        spec.signer_socket = Some(r.socket.clone());
        spec.pid_file = with_pid_file.then(|| pid_file.clone());
        spec
    };
    // Without the pid file the supervisor cannot tell whose named it is: it refuses.
    match Supervisor::start(spec(false)).await {
        Err(SuperviseError::PortHeld(addr)) => assert_eq!(addr, r.addr()),
        Err(e) => panic!("expected PortHeld, got {e}"),
        Ok(_) => panic!("a second named was started beside the stale one"),
    }
    assert!(stale.try_wait().unwrap().is_none(), "the stale named must not be touched without proof it is ours");

    // With it, the stale named is stopped and exactly one new named serves the zone.
    let named = Supervisor::start(spec(true)).await.expect("supervisor replaces the stale named");
    let status = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(status) = stale.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the stale named was not stopped");
    assert!(!status.success(), "the stale named was killed, not stopped cleanly: {status:?}");
    assert_ne!(named.pid(), 0);
    assert_ne!(named.pid(), stale.id());
    assert!(r.axfr().await.contains("SOA"), "the zone is served by the new named");
    named.stop().await;

    // Anything else on the port is never replaced.
    let squatter = std::net::UdpSocket::bind(r.addr()).expect("bind the squatter");
    match Supervisor::start(spec(true)).await {
        Err(SuperviseError::PortHeld(_)) => {}
        Err(e) => panic!("expected PortHeld, got {e}"),
        Ok(_) => panic!("named started on a port held by another process"),
    }
    drop(squatter);
    let _ = &mut r;
}

/// An IXFR query for the test zone from `serial` (the client's SOA in the authority section).
fn ixfr_query(id: u16, serial: u32) -> Vec<u8> {
    use hickory_proto::op::{MessageType, OpCode, Query};
    use hickory_proto::rr::{rdata::SOA, RData, Record};
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(zone(), RecordType::IXFR));
    let soa = SOA::new(zone(), zone(), serial, 0, 0, 0, 0);
    m.add_authority(Record::from_rdata(zone(), 0, RData::SOA(soa)));
    m.to_vec().unwrap()
}

/// A forward and a reverse zone in one named.conf, each with its own files and keys: the
/// patched build's named-checkconf accepts the configuration and loads both zones.
#[test]
fn several_zones_load_from_one_named_conf() {
    use named_glue::conf::{check_conf, NamedConf, TsigKey, ZoneConf};
    let tools = tools();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let reverse = hickory_proto::rr::Name::from_ascii("2.0.192.in-addr.arpa.").unwrap();
    let mut conf = NamedConf::without_zones(base, free_port());
    let catchup = TsigKey::hmac_sha256("catchup.sdns-local", vec![9; 32]);
    for (name, index, data) in [
        (
            &reverse,
            0,
            "$TTL 300\n@ IN SOA ns1.example.test. hostmaster.example.test. 7 3600 600 86400 300\n@ IN NS ns1.example.test.\n1 IN PTR www.example.test.\n",
        ),
        (&zone(), 1, UNSIGNED_ZONE),
    ] {
        let zone_dir = base.join("zones").join(name.to_ascii().trim_end_matches('.'));
        std::fs::create_dir_all(zone_dir.join("keys")).unwrap();
        let z = ZoneConf::in_dir(name, &zone_dir, vec![TsigKey::hmac_sha256(&format!("tsig-{index}-0.sdns-local"), vec![index; 32]), catchup.clone()]);
        std::fs::write(&z.zone_file, data).unwrap();
        conf.zones.push(z);
    }
    conf.maintenance_key = Some(TsigKey::hmac_sha256("resign.sdns-local", vec![3; 32]));
    let path = base.join("named.conf");
    conf.write(&path).unwrap();
    check_conf(&tools, &path).unwrap();
    let out = std::process::Command::new(tools.bin("named-checkconf")).arg("-z").arg(&path).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("zone 2.0.192.in-addr.arpa/IN: loaded serial 7"), "{text}");
    assert!(text.contains("zone example.test/IN: loaded serial 1"), "{text}");
}
