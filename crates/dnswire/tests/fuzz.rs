//! Property-based fuzzing of the parsers every replica runs on bytes from the network:
//! arbitrary bytes and mutations of real messages must give an error, never a panic,
//! and what parses must be consistent. Runs in CI with proptest's seeded generator;
//! `PROPTEST_CASES=1000000 cargo test -p dnswire --test fuzz` for a longer campaign.

use dnswire::layout::{self, TYPE_TSIG};
use dnswire::rrwire::RawMessage;
use dnswire::tsig::{self, Algorithm, Key, Tsig};
use proptest::prelude::*;

const NOW: u64 = 1_800_000_000;

fn key() -> Key {
    Key::new("update-key.example.", Algorithm::HmacSha256, b"a secret of thirty-two bytes....").unwrap()
}

/// An UPDATE for example.test adding one A record, TSIG-signed.
fn signed_update() -> Vec<u8> {
    let mut m = vec![0xbe, 0xef, 0x28, 0x00, 0, 1, 0, 0, 0, 1, 0, 0];
    m.extend_from_slice(b"\x07example\x04test\x00\x00\x06\x00\x01");
    // www.example.test (compressed against the zone name at 12) A 192.0.2.1
    m.extend_from_slice(b"\x03www\xc0\x0c\x00\x01\x00\x01\x00\x00\x01\x2c\x00\x04\xc0\x00\x02\x01");
    tsig::sign(&m, &key(), NOW, 300, 0, Vec::new(), None)
}

/// An answer with compressed names in rdata (MX, SOA) and an OPT record.
fn answer() -> Vec<u8> {
    let mut m = vec![0x12, 0x34, 0x84, 0x00, 0, 1, 0, 2, 0, 0, 0, 1];
    m.extend_from_slice(b"\x07example\x04test\x00\x00\x0f\x00\x01");
    m.extend_from_slice(b"\xc0\x0c\x00\x0f\x00\x01\x00\x00\x0e\x10\x00\x09\x00\x0a\x04mail\xc0\x0c");
    m.extend_from_slice(b"\xc0\x0c\x00\x06\x00\x01\x00\x00\x0e\x10\x00\x20\x02ns\xc0\x0c\x04host\xc0\x0c");
    m.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5]);
    m.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0x80, 0, 0, 0]);
    m
}

/// Every parser the replica runs on untrusted bytes; none may panic.
fn exercise(bytes: &[u8]) {
    if let Ok(m) = RawMessage::parse(bytes) {
        for r in m.answers.iter().chain(&m.authorities).chain(&m.additionals) {
            let _ = r.to_wire();
            let _ = r.soa_serial();
        }
        let _ = m.opt();
        let _ = m.tsig();
    }
    if let Ok(l) = layout::layout(bytes) {
        assert!(l.question_end <= bytes.len());
        if let Some(rec) = l.signature {
            assert!(rec.start < rec.rdata && rec.rdata + rec.rdlen <= bytes.len(), "{rec:?} outside {} bytes", bytes.len());
            if rec.rtype == TYPE_TSIG {
                if let Ok(t) = Tsig::parse(bytes, &rec) {
                    let _ = tsig::verify(bytes, &rec, &t, &key(), NOW);
                }
            }
        }
    }
}

fn mutated(base: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = base.len();
    (proptest::collection::vec((0..len, any::<u8>()), 1..6), 0..=len, proptest::collection::vec(any::<u8>(), 0..8)).prop_map(move |(flips, cut, extra)| {
        let mut m = base.clone();
        for (at, x) in flips {
            m[at] ^= x;
        }
        m.truncate(cut.max(1));
        m.extend_from_slice(&extra);
        m
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
        exercise(&bytes);
    }

    #[test]
    fn mutated_updates_never_panic(bytes in mutated(signed_update())) {
        exercise(&bytes);
    }

    #[test]
    fn mutated_answers_never_panic(bytes in mutated(answer())) {
        exercise(&bytes);
    }
}

/// The MAC covers every byte but the message id (RFC 8945 5.3: a forwarder may change the
/// id; the original id in the TSIG is what is signed) and the TSIG record's TTL (signed as
/// 0 whatever the record says, as BIND does); the key and algorithm names are signed in
/// canonical (lower-case) form, so their letters' case is not covered either. Exhaustive:
/// every byte, every non-zero change.
#[test]
fn any_changed_byte_but_the_id_fails_verification() {
    let good = signed_update();
    let rec = layout::layout(&good).unwrap().signature.unwrap();
    let ttl = rec.start + rec.owner.len() + 4..rec.start + rec.owner.len() + 8;
    let alg_len = Tsig::parse(&good, &rec).unwrap().algorithm.len();
    let names = [rec.start..rec.start + rec.owner.len(), rec.rdata..rec.rdata + alg_len];
    let mut checked = 0;
    for at in 2..good.len() {
        if ttl.contains(&at) {
            continue;
        }
        for x in 1..=255u8 {
            if x == 0x20 && good[at].is_ascii_alphabetic() && names.iter().any(|r| r.contains(&at)) {
                continue;
            }
            let mut bad = good.clone();
            bad[at] ^= x;
            let verdict = layout::layout(&bad).ok().and_then(|l| l.signature).filter(|r| r.rtype == TYPE_TSIG).and_then(|rec| {
                let t = Tsig::parse(&bad, &rec).ok()?;
                Some(tsig::verify(&bad, &rec, &t, &key(), NOW))
            });
            assert!(verdict != Some(Ok(())), "byte {at} ^ {x:#x} still verifies");
            checked += 1;
        }
    }
    assert!(checked > 100 * 250, "only {checked} changes checked");
}

#[test]
fn the_seeds_themselves_parse_and_verify() {
    let u = signed_update();
    let l = layout::layout(&u).unwrap();
    let rec = l.signature.unwrap();
    let t = Tsig::parse(&u, &rec).unwrap();
    assert_eq!(tsig::verify(&u, &rec, &t, &key(), NOW), Ok(()));
    let mut other_id = u.clone();
    other_id[0] ^= 0xff;
    assert_eq!(tsig::verify(&other_id, &rec, &t, &key(), NOW), Ok(()));
    let a = RawMessage::parse(&answer()).unwrap();
    assert_eq!((a.answers.len(), a.additionals.len()), (2, 1));
    assert_eq!(a.answers[1].soa_serial(), Some(1));
    assert!(a.opt().is_some());
}
