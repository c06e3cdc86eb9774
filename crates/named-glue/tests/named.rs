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
    let axfr_query = build_query(7, &zone(), RecordType::AXFR).unwrap();
    let messages = fwd.axfr(&axfr_query).await.unwrap().collect().await.unwrap();
    let records: usize = messages.iter().map(|m| Message::from_vec(m).unwrap().answers.len()).sum();
    let dig_records = after.lines().count();
    assert_eq!(records, dig_records, "forwarded AXFR and dig AXFR differ in size");

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
    assert_eq!(r.axfr().await, before, "a refused update changed the zone");
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
    assert_eq!(za, zb, "replica zones differ");
    let v = a.verify_zone(&za);
    assert!(v.status.success(), "{}", text(&v));
    a.shutdown().await;
    b.shutdown().await;
}
