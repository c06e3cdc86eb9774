//! Against what BIND's own tools sent and answered: testdata/auth holds requests from
//! the BIND build's nsupdate (TSIG keys from tsig-keygen, SIG(0) KEYs from
//! `dnssec-keygen -T KEY -n USER`) and the answers of its named 9.18.49, captured by
//! a UDP relay between the two ("Q hex" / "R hex" lines after "# key file"); the
//! "badtime" request was signed by a script 1000 s in the past, sent to the same named.

use super::keyfile::TsigKey as FileKey;
use super::*;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/auth");

fn file(name: &str) -> String {
    std::fs::read_to_string(format!("{DATA}/{name}")).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// (request, named's answer) captured for the key file `label`.
fn capture(capture: &str, label: &str) -> (Vec<u8>, Option<Vec<u8>>) {
    let text = file(capture);
    let mut lines = text.lines().skip_while(|l| *l != format!("# {label}")).skip(1);
    let q = lines.next().and_then(|l| l.strip_prefix("Q ")).map(hex).expect("request line");
    let r = lines.next().and_then(|l| l.strip_prefix("R ")).filter(|r| *r != "none").map(hex);
    (q, r)
}

fn secret(name: &str) -> TsigSecret {
    let k = FileKey::from_bind(&file(name)).unwrap();
    TsigSecret { name: k.name.clone(), algorithm: tsig::Algorithm::from_name(&k.algorithm).unwrap(), secret: k.secret() }
}

fn sig0_keys() -> Vec<Sig0Key> {
    ["Ksig0-ecdsap256sha256.example.test.+013+64761.key", "Ksig0-ed25519.example.test.+015+62289.key", "Ksig0-rsasha256.example.test.+008+38849.key"]
        .iter()
        .map(|f| Sig0Key::from_key_file(&file(f)).unwrap())
        .collect()
}

fn fixed_clock() -> u64 {
    1_800_000_000
}

fn auth(mode: Mode) -> Authenticator {
    let updates = [secret("ukey.key"), secret("k512.key"), secret("k1.key")];
    Authenticator::new(mode, &updates, &[], sig0_keys(), fixed_clock).unwrap()
}

fn tsig_of(msg: &[u8]) -> tsig::Tsig {
    let l = wire::layout(msg).unwrap();
    tsig::Tsig::parse(msg, &l.signature.unwrap()).unwrap()
}

fn rcode(msg: &[u8]) -> u16 {
    u16::from(msg[3] & 0xf)
}

#[test]
fn key_tags_match_dnssec_keygen() {
    let tags: Vec<(u8, u16)> = sig0_keys().iter().map(|k| (k.algorithm, k.tag)).collect();
    assert_eq!(tags, vec![(13, 64761), (15, 62289), (8, 38849)]);
    assert_eq!(sig0_keys()[0].name, "sig0-ecdsap256sha256.example.test.");
    let text = file("Ksig0-ed25519.example.test.+015+62289.key");
    assert!(matches!(Sig0Key::from_key_file(&text.replace("KEY 0 3 15", "KEY 32768 3 15")), Err(sig0::KeyFileError::Bad(_))));
    assert!(matches!(Sig0Key::from_key_file(&text.replace("KEY 0 3 15", "KEY 0 3 5")), Err(sig0::KeyFileError::Algorithm(5))));
    assert_eq!(Sig0Key::from_key_file("; nothing here\n"), Err(sig0::KeyFileError::NoKeyRecord));
}

#[test]
fn tsig_update_passes_and_goes_to_named_under_the_local_key() {
    let a = auth(Mode::Tsig);
    let (q, r) = capture("tsig-hmac-sha256.txt", "ukey.key");
    let t = tsig_of(&q);
    let UpdateDecision::Forward(fwd) = a.decide(&q, t.time_signed) else { panic!("a valid update must pass") };
    // The forwarded request is the client's minus its TSIG, plus one from the local key
    // at the local clock, verifiable with that key only.
    let l = wire::layout(&fwd).unwrap();
    let rec = l.signature.unwrap();
    let ft = tsig::Tsig::parse(&fwd, &rec).unwrap();
    assert_eq!(wire::wire_to_text(&ft.key_name), "tsig-0.sdns-local.");
    assert_eq!(ft.time_signed, fixed_clock());
    assert_eq!(tsig::verify(&fwd, &rec, &ft, &a.identities[0].local, fixed_clock()), Ok(()));
    let client_key = &a.tsig[0];
    assert_eq!(tsig::verify(&fwd, &rec, &ft, client_key, fixed_clock()), Err(tsig::Failure::BadSig));
    let qrec = wire::layout(&q).unwrap().signature.unwrap();
    assert_eq!(tsig::strip(&fwd, rec.start, ft.original_id), tsig::strip(&q, qrec.start, t.original_id));
    // Re-signing named's answer for the client reproduces named's own signed answer.
    let r = r.unwrap();
    assert_eq!(a.answer_for_client(&q, &r), r);
    // Within the fudge either side, still fine; one second beyond, BADTIME.
    for dt in [-300i64, 300] {
        assert!(matches!(a.decide(&q, t.time_signed.saturating_add_signed(dt)), UpdateDecision::Forward(_)), "{dt}");
    }
}

#[test]
fn badtime_is_answered_signed_with_the_agreed_time() {
    let a = auth(Mode::Tsig);
    let (q, _) = capture("tsig-hmac-sha256.txt", "ukey.key");
    let t = tsig_of(&q);
    let agreed = t.time_signed + 301;
    let UpdateDecision::Refuse { rcode: code, answer } = a.decide(&q, agreed) else { panic!("late update must be refused") };
    assert_eq!((code, rcode(&answer)), (RCODE_NOTAUTH, RCODE_NOTAUTH));
    let at = tsig_of(&answer);
    assert_eq!(at.error, tsig::BADTIME);
    assert_eq!(at.time_signed, t.time_signed);
    assert_eq!(at.other, agreed.to_be_bytes()[2..].to_vec());
    // Signed with the client's key over the request MAC (RFC 8945 4.3.1).
    let l = wire::layout(&answer).unwrap();
    let unsigned = tsig::strip(&answer, l.signature.unwrap().start, l.id);
    let again = tsig::sign(&unsigned, &a.tsig[0], at.time_signed, at.fudge, at.error, at.other.clone(), Some(&t.mac));
    assert_eq!(again, answer);
    // The same bytes for the same agreed time, whatever the replica's clock.
    assert_eq!(a.decide(&q, agreed), auth(Mode::Tsig).decide(&q, agreed));
}

/// The "badtime" capture: a request signed 1000 s in the past (by a script, with the
/// ukey secret) and named's answer, which carries named's clock in its other data.
#[test]
fn badtime_answer_is_byte_identical_to_named_s() {
    let a = auth(Mode::Tsig);
    let (q, r) = capture("tsig-hmac-sha256.txt", "badtime");
    let r = r.unwrap();
    let named_time = tsig_of(&r).other.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    assert_eq!(a.decide(&q, named_time), UpdateDecision::Refuse { rcode: RCODE_NOTAUTH, answer: r });
}

#[test]
fn bad_and_missing_signatures_get_named_s_exact_answer() {
    let a = auth(Mode::Tsig);
    for label in ["wrong.key", "other.key", "none"] {
        let (q, r) = capture("tsig-hmac-sha256.txt", label);
        let r = r.unwrap();
        // named stamped its answers in the second it got them, the request's second.
        let now = if label == "none" { fixed_clock() } else { tsig_of(&q).time_signed };
        match a.decide(&q, now) {
            UpdateDecision::Refuse { rcode: code, answer } => {
                assert_eq!(answer, r, "{label}");
                assert_eq!(code, u16::from(r[3] & 0xf), "{label}");
            }
            d => panic!("{label}: {d:?}"),
        }
        assert_eq!(a.precheck(&q, false, now), Some(r), "{label}");
    }
}

#[test]
fn other_tsig_algorithms_verify() {
    let a = auth(Mode::Both);
    for label in ["k512.key", "k1.key"] {
        let (q, _) = capture("sig0-and-tsig-algs.txt", label);
        let t = tsig_of(&q);
        assert!(matches!(a.decide(&q, t.time_signed), UpdateDecision::Forward(_)), "{label}");
    }
}

fn sig0_window(q: &[u8]) -> (u64, u64) {
    let rec = wire::layout(q).unwrap().signature.unwrap();
    let w = |o| u64::from(wire::u32_at(q, rec.rdata + o).unwrap());
    (w(12), w(8))
}

#[test]
fn sig0_updates_verify_within_their_window_only() {
    let a = auth(Mode::Sig0);
    let labels = [
        "Ksig0-ecdsap256sha256.example.test.+013+64761.private",
        "Ksig0-ed25519.example.test.+015+62289.private",
        "Ksig0-rsasha256.example.test.+008+38849.private",
    ];
    for (i, label) in labels.iter().enumerate() {
        let (q, r) = capture("sig0-and-tsig-algs.txt", label);
        let (inception, expiration) = sig0_window(&q);
        for now in [inception, inception + 300, expiration] {
            let UpdateDecision::Forward(fwd) = a.decide(&q, now) else { panic!("{label} at {now}") };
            let ft = tsig_of(&fwd);
            // SIG(0) identities come after the (here absent) TSIG ones.
            assert_eq!(wire::wire_to_text(&ft.key_name), format!("sig0-{i}.sdns-local."));
        }
        // named 9.18.49 answers every SIG(0) update REFUSED; so does the gate when it fails.
        let named = r.unwrap();
        for now in [inception - 1, expiration + 1] {
            assert_eq!(a.decide(&q, now), UpdateDecision::Refuse { rcode: RCODE_REFUSED, answer: named.clone() }, "{label} at {now}");
        }
        let mut tampered = q.clone();
        let at = q.len() / 2; // inside the update section or the signature
        tampered[at] ^= 1;
        assert!(matches!(a.decide(&tampered, inception + 300), UpdateDecision::Refuse { rcode: RCODE_REFUSED, .. }), "{label}");
        // SIG(0) answers go back unsigned.
        let answer = a.answer_for_client(&q, &named);
        assert_eq!(answer, named);
        // In TSIG mode SIG(0) is not an identity at all.
        assert!(matches!(auth(Mode::Tsig).decide(&q, inception + 300), UpdateDecision::Refuse { rcode: RCODE_REFUSED, .. }));
    }
}

#[test]
fn in_sig0_mode_a_valid_shared_tsig_update_is_refused() {
    let a = auth(Mode::Sig0);
    let (q, _) = capture("tsig-hmac-sha256.txt", "ukey.key");
    let t = tsig_of(&q);
    let UpdateDecision::Refuse { rcode: code, answer } = a.decide(&q, t.time_signed) else { panic!("must be refused") };
    assert_eq!((code, rcode(&answer)), (RCODE_REFUSED, RCODE_REFUSED));
    // Signed with the key, as named answers a known key that update-policy does not grant.
    assert_eq!(tsig_of(&answer).error, 0);
    assert_eq!(tsig_of(&answer).mac.len(), 32);
}

#[test]
fn transfers_need_a_transfer_key() {
    let update = secret("ukey.key");
    let transfer = secret("k512.key");
    let a = Authenticator::new(Mode::Tsig, std::slice::from_ref(&update), std::slice::from_ref(&transfer), vec![], fixed_clock).unwrap();
    let axfr = |key: Option<&tsig::Key>| {
        let mut m = vec![0xab, 0xcd, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(&wire::name_to_wire("example.test.").unwrap());
        m.extend_from_slice(&[0, 252, 0, 1]);
        match key {
            Some(k) => tsig::sign(&m, k, fixed_clock(), 300, 0, vec![], None),
            None => m,
        }
    };
    let tk = tsig::Key::new(&transfer.name, transfer.algorithm, &transfer.secret).unwrap();
    let uk = tsig::Key::new(&update.name, update.algorithm, &update.secret).unwrap();
    assert_eq!(a.precheck(&axfr(Some(&tk)), true, fixed_clock()), None);
    let unsigned = a.precheck(&axfr(None), true, fixed_clock()).unwrap();
    assert_eq!(rcode(&unsigned), RCODE_REFUSED);
    // The update key is valid but not a transfer key.
    let wrong = a.precheck(&axfr(Some(&uk)), true, fixed_clock()).unwrap();
    assert_eq!(rcode(&wrong), RCODE_REFUSED);
    let late = a.precheck(&axfr(Some(&tk)), true, fixed_clock() + 400).unwrap();
    assert_eq!((rcode(&late), tsig_of(&late).error), (RCODE_NOTAUTH, tsig::BADTIME));
    // Transfer keys never authorize updates.
    let mut upd = vec![0x11, 0x22, 0x28, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    upd.extend_from_slice(&wire::name_to_wire("example.test.").unwrap());
    upd.extend_from_slice(&[0, 6, 0, 1]);
    let signed = tsig::sign(&upd, &tk, fixed_clock(), 300, 0, vec![], None);
    assert!(matches!(a.decide(&signed, fixed_clock()), UpdateDecision::Refuse { rcode: RCODE_REFUSED, .. }));
    let (local, named_transfer) = a.named_keys(std::slice::from_ref(&transfer));
    assert_eq!(local.len(), 1);
    assert_eq!(named_transfer[0].name, "k512");
}

#[test]
fn garbage_never_panics() {
    let a = auth(Mode::Both);
    let (q, _) = capture("sig0-and-tsig-algs.txt", "Ksig0-ed25519.example.test.+015+62289.private");
    for cut in 0..q.len() {
        let _ = a.decide(&q[..cut], 0);
        let _ = a.precheck(&q[..cut], cut % 2 == 0, 0);
        let _ = a.answer_for_client(&q[..cut], &q[..cut / 2]);
    }
    let mut noise = testkit::Noise::new(0x243f6a8885a308d3);
    for len in 0..400 {
        let _ = a.decide(&noise.bytes(len), 1);
    }
}

#[test]
fn update_keys_map_to_their_local_keys_for_the_policy() {
    let key = |name: &str| TsigSecret { name: name.into(), algorithm: tsig::Algorithm::HmacSha256, secret: vec![7; 32] };
    let auth = Authenticator::new(Mode::Tsig, &[key("dhcp-key"), key("Ops.")], &[key("xfr")], Vec::new(), fixed_clock).unwrap();
    assert_eq!(auth.local_names("dhcp-key."), Some(vec!["tsig-0.sdns-local".to_string()]));
    assert_eq!(auth.local_names("ops"), Some(vec!["tsig-1.sdns-local".to_string()]));
    assert_eq!(auth.local_names("*").map(|v| v.len()), Some(2));
    // A transfer-only key or an unknown one may not appear in an update-policy.
    assert_eq!(auth.local_names("xfr"), None);
    assert_eq!(auth.local_names("nobody"), None);
    // In sig0 mode a TSIG key authorizes nothing: its rules name no local key.
    let sig0 = Authenticator::new(Mode::Sig0, &[key("dhcp-key")], &[], sig0_keys(), fixed_clock).unwrap();
    assert_eq!(sig0.local_names("dhcp-key"), Some(Vec::new()));
    assert_eq!(sig0.local_names("*").map(|v| v.len()), Some(3));
}

/// An update of `total` bytes once signed with `key` at the fixed clock: one authority
/// record whose rdata fills the rest (its content does not matter before named).
fn update_of_size(key: &tsig::Key, total: usize) -> Vec<u8> {
    let mut m = vec![0x12, 0x34, 0x28, 0, 0, 1, 0, 0, 0, 1, 0, 0];
    m.extend_from_slice(&wire::name_to_wire("example.test.").unwrap());
    m.extend_from_slice(&[0, 6, 0, 1]);
    let owner = wire::name_to_wire("big.example.test.").unwrap();
    let signed_growth = tsig::sign(&m, key, fixed_clock(), 300, 0, vec![], None).len() - m.len();
    let rdlen = total - m.len() - owner.len() - 10 - signed_growth;
    m.extend_from_slice(&owner);
    m.extend_from_slice(&[0, 16, 0, 1, 0, 0, 1, 44]);
    m.extend_from_slice(&u16::try_from(rdlen).unwrap().to_be_bytes());
    m.extend((0..rdlen).map(|i| if i % 256 == 0 { 255 } else { b'x' }));
    let signed = tsig::sign(&m, key, fixed_clock(), 300, 0, vec![], None);
    assert_eq!(signed.len(), total);
    signed
}

/// A validly signed update that named could take as it came, but not once re-signed with
/// the (longer-named) local key: the gateway answers FORMERR, signed with the client's key,
/// and the refusal the execution core gives (`UpdateGate::refusal`) is the same answer.
#[test]
fn an_update_too_long_once_re_signed_is_refused_before_ordering() {
    let secret = TsigSecret { name: "up.".into(), algorithm: tsig::Algorithm::HmacSha256, secret: vec![9; 32] };
    let a = Authenticator::new(Mode::Tsig, std::slice::from_ref(&secret), &[], Vec::new(), fixed_clock).unwrap();
    let key = tsig::Key::new(&secret.name, secret.algorithm, &secret.secret).unwrap();
    let big = update_of_size(&key, 65_530);
    let UpdateDecision::Forward(forwarded) = a.decide(&big, fixed_clock()) else { panic!("valid: the gate passes it") };
    assert!(forwarded.len() > crate::gate::MAX_FORWARD, "re-signed it grows past TCP framing: {}", forwarded.len());
    assert!(!crate::gate::forwardable(&forwarded));
    let answer = a.precheck(&big, false, fixed_clock()).expect("refused before ordering");
    assert_eq!(rcode(&answer), RCODE_FORMERR);
    assert_eq!(&answer[..2], &big[..2]);
    let t = tsig_of(&answer);
    assert_eq!((t.error, t.mac.len()), (0, 32), "signed with the client's key, as named signs");
    assert_eq!(a.answer_without_named(&big, RCODE_FORMERR, fixed_clock()), answer, "the execution core's refusal is the same");
    // One that still fits once re-signed is ordered.
    let fits = update_of_size(&key, 65_500);
    assert_eq!(a.precheck(&fits, false, fixed_clock()), None);
    let UpdateDecision::Forward(forwarded) = a.decide(&fits, fixed_clock()) else { panic!("passes") };
    assert!(crate::gate::forwardable(&forwarded));
}

/// An UPDATE too broken to read (here a header announcing a question that is not there)
/// authorizes nothing: FORMERR, as named answers it, before ordering and at execution.
#[test]
fn unreadable_updates_are_refused_without_named() {
    let a = auth(Mode::Both);
    let runt = vec![0xbe, 0xef, 0x28, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    let UpdateDecision::Refuse { rcode: code, answer } = a.decide(&runt, fixed_clock()) else { panic!("refused") };
    assert_eq!((code, rcode(&answer), &answer[..2]), (RCODE_FORMERR, RCODE_FORMERR, &runt[..2]));
    assert_eq!(answer[2] & 0xf8, 0x80 | 0x28, "a response with the request's opcode");
    assert_eq!(a.precheck(&runt, false, fixed_clock()), Some(answer.clone()));
    assert_eq!(a.answer_without_named(&runt, RCODE_FORMERR, fixed_clock()), answer);
}

/// A SIG(0) valid for longer than `sig0_max_validity_s` is refused; the replay key of a
/// SIG(0) update is the signed data, valid until its expiration.
#[test]
fn sig0_validity_is_bounded_and_its_replay_key_spans_it() {
    let (q, _) = capture("sig0-and-tsig-algs.txt", "Ksig0-ed25519.example.test.+015+62289.private");
    let (inception, expiration) = sig0_window(&q);
    let span = expiration - inception;
    let now = inception + 1;
    assert!(matches!(auth(Mode::Sig0).with_sig0_max_validity(span).decide(&q, now), UpdateDecision::Forward(_)));
    assert!(matches!(auth(Mode::Sig0).with_sig0_max_validity(span - 1).decide(&q, now), UpdateDecision::Refuse { rcode: RCODE_REFUSED, .. }));
    let key = crate::gate::replay_key(&q).expect("signed");
    assert_eq!((key.from_s, key.until_s), (inception, expiration));
    // The header id is signed: another id is another (unverifiable) message.
    let mut other = q.clone();
    other[0] ^= 1;
    assert_ne!(crate::gate::replay_key(&other).unwrap().digest, key.digest);
    // The signature bytes are not part of the key (an ECDSA signature has two encodings).
    let mut resigned = q.clone();
    let last = resigned.len() - 1;
    resigned[last] ^= 1;
    assert_eq!(crate::gate::replay_key(&resigned).unwrap().digest, key.digest);
}

/// A TSIG update's replay key is what its MAC covers: the original id, not the header's.
#[test]
fn tsig_replay_key_ignores_the_header_id() {
    let (q, _) = capture("tsig-hmac-sha256.txt", "ukey.key");
    let t = tsig_of(&q);
    let key = crate::gate::replay_key(&q).expect("signed");
    assert_eq!((key.from_s, key.until_s), (t.time_signed - u64::from(t.fudge), t.time_signed + u64::from(t.fudge)));
    let mut replay = q.clone();
    replay[..2].copy_from_slice(&(t.original_id ^ 0x5555).to_be_bytes());
    assert_eq!(crate::gate::replay_key(&replay).unwrap().digest, key.digest);
    // Still valid under the new id (the MAC covers the original one): the gate passes it, so
    // only the replay key keeps it from running twice.
    assert!(matches!(auth(Mode::Tsig).decide(&replay, t.time_signed), UpdateDecision::Forward(_)));
    let mut changed = q.clone();
    changed[20] ^= 1;
    assert_ne!(crate::gate::replay_key(&changed).map(|k| k.digest), Some(key.digest));
    // Unsigned or unreadable: no key.
    assert_eq!(crate::gate::replay_key(&q[..40]), None);
}

/// A retransmission whose first answer the replica no longer holds (a state transfer or a
/// restart emptied its cache) gets the recorded rcode signed with the client's key, as
/// named's answer was: nsupdate rejects an unsigned answer to a signed update.
#[test]
fn an_answer_without_named_is_signed_for_a_tsig_client() {
    let a = auth(Mode::Tsig);
    let (q, _) = capture("tsig-hmac-sha256.txt", "ukey.key");
    let t = tsig_of(&q);
    let answer = a.answer_without_named(&q, 0, t.time_signed);
    assert_eq!((rcode(&answer), &answer[..2], answer[2] & 0x80), (0, &q[..2], 0x80));
    let at = tsig_of(&answer);
    assert_eq!((at.error, at.mac.len()), (0, 32));
    let l = wire::layout(&answer).unwrap();
    let again = tsig::sign(&tsig::strip(&answer, l.signature.unwrap().start, l.id), &a.tsig[0], at.time_signed, at.fudge, 0, Vec::new(), Some(&t.mac));
    assert_eq!(again, answer, "signed with the client's key over the request's MAC");
}

/// An update cut short after its zone section gets FORMERR with the zone section back, as
/// named answers it; one whose question does not parse gets the header alone.
#[test]
fn formerr_keeps_the_question_when_it_parses() {
    let a = auth(Mode::Tsig);
    let mut cut = vec![0x12, 0x34, 0x28, 0, 0, 1, 0, 0, 0, 1, 0, 0];
    cut.extend_from_slice(&wire::name_to_wire("example.test.").unwrap());
    cut.extend_from_slice(&[0, 6, 0, 1]);
    let zone_end = cut.len();
    cut.extend_from_slice(&[3, b'w', b'w']);
    let UpdateDecision::Refuse { rcode: code, answer } = a.decide(&cut, fixed_clock()) else { panic!("refused") };
    assert_eq!(code, RCODE_FORMERR);
    assert_eq!(answer.len(), zone_end);
    assert_eq!(&answer[4..12], &[0, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&answer[12..], &cut[12..zone_end]);
    assert_eq!((answer[2], answer[3]), (0xa8, 0x01));
}
