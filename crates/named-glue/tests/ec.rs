//! ECDSA P-256 (algorithm 13) and Ed25519 (algorithm 15) external keys against the real
//! patched named and dnssec-signzone: every signature comes through the signing socket
//! from a signer holding an ordinary local key (the stand-in for the threshold signers),
//! and BIND's own tools validate the result.

mod common;

use std::process::Command;

use common::*;
use named_glue::keys::{ALG_ECDSAP256SHA256, ALG_ED25519};
use named_glue::signer::SignatureTimes;
use named_glue::time::unix_now;

/// The RRSIG records of zone text (one record per line): (owner, algorithm, key tag,
/// signature length).
fn rrsigs(text: &str) -> Vec<(String, u8, u16, usize)> {
    use base64::Engine;
    text.lines()
        .filter(|l| !l.starts_with(';'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 12 && f[3] == "RRSIG")
        .map(|f| {
            let signature = base64::engine::general_purpose::STANDARD.decode(f[12..].concat()).unwrap();
            (f[0].to_owned(), f[5].parse().unwrap(), f[10].parse().unwrap(), signature.len())
        })
        .collect()
}

fn mnemonic(algorithm: u8) -> &'static str {
    if algorithm == ALG_ECDSAP256SHA256 {
        "ECDSAP256SHA256"
    } else {
        "ED25519"
    }
}

/// (a) dnssec-signzone signs the whole zone through the socket, dnssec-verify accepts it;
/// (b) named serves it, signs an update through the socket, and delv validates the new
/// name with the DNSKEY as trust anchor.
async fn signs_end_to_end(algorithm: u8) {
    let (signer, key) = EcSigner::generate(algorithm);
    assert_eq!(key.signature_len(), 64);
    let t0 = unix_now() as u32;
    let r = Replica::start(signer.clone(), key.clone(), t0, None).await;

    // (a) The signed file: every RRSIG is of the key's algorithm and tag, 64 bytes, and
    // came from the signer (no key material is anywhere else).
    let signed_file = r.path().join("zone.db");
    let signed = std::fs::read_to_string(&signed_file).unwrap();
    let sigs = rrsigs(&signed);
    assert!(sigs.len() >= 10, "one RRSIG per RRset expected:\n{signed}");
    for (owner, alg, tag, len) in &sigs {
        assert_eq!((*alg, *tag, *len), (algorithm, key.key_tag(), 64), "RRSIG at {owner}:\n{signed}");
    }
    assert_eq!(signer.signed(), sigs.len() as u64, "every RRSIG was signed through the socket, once");
    let v = Command::new(r.tools.bin("dnssec-verify")).args(["-z", "-o", ZONE]).arg(&signed_file).output().unwrap();
    assert!(v.status.success(), "dnssec-verify on dnssec-signzone's output: {}", text(&v));
    assert!(text(&v).contains(mnemonic(algorithm)), "{}", text(&v));

    // The DS we compute is BIND's.
    let key_file = r.path().join("keys").join(format!("{}.key", key.file_stem()));
    let ds = Command::new(r.tools.bin("dnssec-dsfromkey")).arg("-2").arg(&key_file).output().unwrap();
    assert!(ds.status.success(), "{}", text(&ds));
    let words = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(words(&String::from_utf8_lossy(&ds.stdout)), words(&key.ds_record()));

    if algorithm == ALG_ED25519 {
        // Ed25519 signatures are deterministic: the same agreed time gives the same bytes.
        let again = r.path().join("again.db");
        let agreed = SignatureTimes::from_agreed(t0, VALIDITY_DAYS * 86_400);
        let unsigned = r.path().join("zone.unsigned");
        named_glue::signzone::sign_zone_file(&r.tools, &zone(), &unsigned, &again, &r.path().join("keys"), &key, &r.socket, agreed, 1).await.unwrap();
        assert_eq!(std::fs::read_to_string(&again).unwrap(), signed, "two Ed25519 signings at one agreed time differ");
    }

    // (b) An update through nsupdate, signed through the socket at the agreed time.
    r.times.set_agreed(t0 + 10);
    let before = signer.signed();
    let out = r.nsupdate(&["update add new.example.test. 300 A 192.0.2.77", "update add new.example.test. 300 TXT \"ec\""]).await;
    assert!(out.status.success(), "nsupdate: {}\n{}", text(&out), r.log());
    assert!(signer.signed() > before, "the update was signed without the signer");
    let zone = r.axfr().await;
    assert!(zone.contains("new.example.test.") && zone.contains("192.0.2.77"), "{zone}");
    let updated = named_glue::time::format_timestamp(u64::from(t0 + 10 - 3600));
    assert!(zone.contains(&updated), "update RRSIGs not at the agreed time:\n{zone}");
    for (owner, alg, tag, len) in rrsigs(&zone) {
        assert_eq!((alg, tag, len), (algorithm, key.key_tag(), 64), "RRSIG at {owner}:\n{zone}");
    }
    let v = r.verify_zone(&zone);
    assert!(v.status.success(), "dnssec-verify after the update: {}", text(&v));
    let out = r.delv("new.example.test.", "A");
    assert!(text(&out).contains("fully validated"), "delv: {}", text(&out));
    let out = r.delv("new.example.test.", "TXT");
    assert!(text(&out).contains("fully validated"), "delv: {}", text(&out));
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecdsa_p256_zone_signs_through_the_socket() {
    signs_end_to_end(ALG_ECDSAP256SHA256).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ed25519_zone_signs_through_the_socket() {
    signs_end_to_end(ALG_ED25519).await;
}

/// A signer answering with signatures of the wrong length (after some good ones, so that
/// the update is part-way signed) is refused: named answers SERVFAIL, and the zone, also
/// as replayed from its journal after a restart, is as before. Once the signer answers
/// correctly the same update goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_length_signatures_fail_the_update_and_leave_the_zone() {
    // (algorithm, good signatures first, then this length): one byte long or short,
    // the RSA-1024 length, half a signature.
    for (algorithm, good, len) in [(ALG_ECDSAP256SHA256, 2, 65), (ALG_ED25519, 2, 63), (ALG_ECDSAP256SHA256, 0, 128), (ALG_ED25519, 0, 32)] {
        let what = format!("algorithm {algorithm}, {good} good signatures, then {len} bytes");
        let (signer, key) = EcSigner::generate(algorithm);
        let t0 = unix_now() as u32;
        let r = Replica::start(signer.clone(), key, t0, None).await;
        let before = r.axfr().await;
        r.times.set_agreed(t0 + 5);
        let asked = signer.signed();
        let refused = r.log().matches("bad signature length").count();
        signer.answer_wrong_length_after(good, len);
        let update = ["update add second.example.test. 300 A 192.0.2.6", "update add second.example.test. 300 TXT \"x\""];
        let out = r.nsupdate(&update).await;
        assert!(!out.status.success() && text(&out).contains("SERVFAIL"), "{what}: {}", text(&out));
        r.wait_log_count("bad signature length", refused + 1).await;
        assert_eq!(signer.signed(), asked + good + 1, "{what}: named stops at the first bad signature");
        assert_same_zone(&r.axfr().await, &before, &what);
        r.named.as_ref().unwrap().restart().await.unwrap();
        assert_eq!(canonical(&r.axfr().await), canonical(&before), "{what}: the journal holds part of the update");

        signer.answer_correctly();
        let out = r.nsupdate(&update).await;
        assert!(out.status.success(), "{what}, then correct signatures: {}\n{}", text(&out), r.log());
        let zone = r.axfr().await;
        assert!(zone.contains("second.example.test."), "{zone}");
        let v = r.verify_zone(&zone);
        assert!(v.status.success(), "{what}: {}", text(&v));
        r.shutdown().await;
    }
}
