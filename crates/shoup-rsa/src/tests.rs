//! Tests with independent checkers: the `rsa` crate and the `openssl` and `dnssec-dsfromkey`
//! command lines verify what this crate produces.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use num_bigint::BigUint;
use num_integer::Integer;
use num_traits::{One, Zero};
use proptest::prelude::*;
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

use crate::keys::{deal, safe_prime_pair};
use crate::*;

/// Two 512-bit safe primes (a 1024-bit modulus), generated once per test binary from a seed.
fn primes_1024() -> &'static (BigUint, BigUint) {
    static PRIMES: OnceLock<(BigUint, BigUint)> = OnceLock::new();
    PRIMES.get_or_init(|| {
        let mut rng = ChaCha20Rng::seed_from_u64(0x5d75_0001);
        safe_prime_pair(512, &mut rng, &mut |_| {}).expect("safe primes")
    })
}

/// A dealt key over the fixed primes (dealing is cheap; prime search is not).
fn key(players: u16, threshold: u16, seed: u64) -> (PublicKey, Vec<KeyShare>) {
    let (p, q) = primes_1024();
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    deal(p, q, players, threshold, &mut rng).expect("deal")
}

type HashFn = fn(&[u8]) -> Vec<u8>;

fn rsa_hash(alg: HashAlg) -> (rsa::Pkcs1v15Sign, HashFn) {
    use sha2::Digest;
    match alg {
        HashAlg::Sha1 => (rsa::Pkcs1v15Sign::new::<sha1::Sha1>(), |d| sha1::Sha1::digest(d).to_vec()),
        HashAlg::Sha256 => (rsa::Pkcs1v15Sign::new::<sha2::Sha256>(), |d| sha2::Sha256::digest(d).to_vec()),
        HashAlg::Sha512 => (rsa::Pkcs1v15Sign::new::<sha2::Sha512>(), |d| sha2::Sha512::digest(d).to_vec()),
    }
}

fn rsa_public(pk: &PublicKey) -> rsa::RsaPublicKey {
    let n = rsa::BoxedUint::from_be_slice_vartime(&pk.modulus().to_bytes_be());
    let e = rsa::BoxedUint::from_be_slice_vartime(&pk.public_exponent().to_be_bytes());
    rsa::RsaPublicKey::new(n, e).expect("rsa crate accepts the public key")
}

/// Verification by the `rsa` crate, independent of this crate's arithmetic and encoding.
fn rsa_crate_verifies(pk: &PublicKey, alg: HashAlg, data: &[u8], sig: &Signature) -> bool {
    let (scheme, hash) = rsa_hash(alg);
    rsa_public(pk).verify(scheme, &hash(data), sig.as_bytes()).is_ok()
}

fn openssl_verifies(dir: &Path, pk: &PublicKey, alg: HashAlg, data: &[u8], sig: &Signature) -> bool {
    use rsa::pkcs8::{EncodePublicKey, LineEnding};
    let pem = rsa_public(pk).to_public_key_pem(LineEnding::LF).expect("pem");
    std::fs::write(dir.join("pub.pem"), pem).unwrap();
    std::fs::write(dir.join("data"), data).unwrap();
    std::fs::write(dir.join("sig"), sig.as_bytes()).unwrap();
    let digest = match alg {
        HashAlg::Sha1 => "-sha1",
        HashAlg::Sha256 => "-sha256",
        HashAlg::Sha512 => "-sha512",
    };
    let out = Command::new("openssl")
        .args(["dgst", digest, "-verify", "pub.pem", "-signature", "sig", "data"])
        .current_dir(dir)
        .output()
        .expect("openssl command runs");
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Verified OK")
}

fn jacobi(a: &BigUint, n: &BigUint) -> i32 {
    let mut a = a % n;
    let mut n = n.clone();
    let mut result = 1;
    while !a.is_zero() {
        while a.is_even() {
            a >>= 1u32;
            let r = (&n % 8u32).iter_u32_digits().next().unwrap_or(0);
            if r == 3 || r == 5 {
                result = -result;
            }
        }
        std::mem::swap(&mut a, &mut n);
        if (&a % 4u32) == BigUint::from(3u32) && (&n % 4u32) == BigUint::from(3u32) {
            result = -result;
        }
        a %= &n;
    }
    if n.is_one() {
        result
    } else {
        0
    }
}

fn sign_all(pk: &PublicKey, shares: &[KeyShare], msg: &Message, proof: bool) -> Vec<SignatureShare> {
    shares.iter().map(|s| if proof { s.sign_with_proof(pk, msg) } else { s.sign(pk, msg) }.unwrap()).collect()
}

#[test]
fn default_2048_key_signs_and_openssl_verifies() {
    let mut rng = ChaCha20Rng::seed_from_u64(2048);
    let mut events = Vec::new();
    let (pk, shares) = generate(DEFAULT_MODULUS_BITS, 4, default_threshold(4), &mut rng, &mut |e| events.push(e)).unwrap();
    assert_eq!(pk.modulus_bits(), 2048);
    assert_eq!(pk.threshold(), 2);
    assert_eq!(events.iter().filter(|e| matches!(e, Progress::PrimeFound { .. })).count(), 2);
    assert_eq!(events.last(), Some(&Progress::Done));
    for share in &shares {
        share.validate(&pk).unwrap();
    }
    let data = b"\x00\x06\x08\x02 rrsig to-be-signed bytes";
    let msg = pk.encode_message(HashAlg::Sha256, data).unwrap();
    let sig_shares = sign_all(&pk, &shares[2..], &msg, true);
    let combined = combine_basic(&pk, &msg, &sig_shares).unwrap();
    assert_eq!(combined.signature.as_bytes().len(), 256);
    let dir = tempfile::tempdir().unwrap();
    assert!(openssl_verifies(dir.path(), &pk, HashAlg::Sha256, data, &combined.signature));
    assert!(rsa_crate_verifies(&pk, HashAlg::Sha256, data, &combined.signature));
    // The independent verifier must reject a wrong signature too.
    let mut wrong = combined.signature.clone();
    wrong.0[100] ^= 1;
    assert!(!openssl_verifies(dir.path(), &pk, HashAlg::Sha256, data, &wrong));
}

#[test]
fn every_algorithm_verifies_in_openssl_and_rsa_crate() {
    let (pk, shares) = key(7, 3, 1);
    let dir = tempfile::tempdir().unwrap();
    for alg in [5u8, 7, 8, 10] {
        let hash = HashAlg::from_dnssec_alg(alg).unwrap();
        let data = format!("data for algorithm {alg}");
        let msg = pk.encode_message(hash, data.as_bytes()).unwrap();
        let sig_shares = sign_all(&pk, &shares[..3], &msg, false);
        let sig = pk.combine(&msg, &sig_shares).unwrap();
        assert!(pk.verify(&msg, &sig));
        assert!(rsa_crate_verifies(&pk, hash, data.as_bytes(), &sig), "rsa crate, alg {alg}");
        assert!(openssl_verifies(dir.path(), &pk, hash, data.as_bytes(), &sig), "openssl, alg {alg}");
    }
    assert_eq!(HashAlg::from_dnssec_alg(13), None);
}

#[test]
fn messages_with_jacobi_minus_one_and_plus_one_combine() {
    let (pk, shares) = key(4, 2, 2);
    let mut seen = [false; 2];
    for i in 0u32..64 {
        let data = i.to_be_bytes();
        let msg = pk.encode_message(HashAlg::Sha256, &data).unwrap();
        let symbol = jacobi(msg.representative(), pk.modulus());
        let slot = usize::from(symbol == 1);
        if seen[slot] {
            continue;
        }
        seen[slot] = true;
        let sig_shares = sign_all(&pk, &shares[1..3], &msg, true);
        for s in &sig_shares {
            pk.verify_share(&msg, s).unwrap();
        }
        let sig = pk.combine(&msg, &sig_shares).unwrap();
        assert!(rsa_crate_verifies(&pk, HashAlg::Sha256, &data, &sig), "jacobi {symbol}");
        if seen == [true, true] {
            return;
        }
    }
    panic!("no message with each Jacobi symbol in 64 tries: {seen:?}");
}

/// Corrupts the shares of `faulty` (as the paper does) and runs all three strategies.
fn corruption_case(players: u16, faulty: &[u16]) {
    let t = max_faults(players);
    assert!(faulty.len() <= usize::from(t));
    let (pk, shares) = key(players, t + 1, 10 + u64::from(players));
    let data = b"update example.com A 192.0.2.1";
    let msg = pk.encode_message(HashAlg::Sha256, data).unwrap();
    let with_faults = |proof: bool| -> Vec<SignatureShare> {
        sign_all(&pk, &shares, &msg, proof).into_iter().map(|s| if faulty.contains(&s.index) { corrupt(&pk, &s) } else { s }).collect()
    };
    let expected_bad: Vec<u16> = faulty.to_vec();

    // BASIC: the proofs reject exactly the faulty shares met before k valid ones.
    let proven = with_faults(true);
    let basic = combine_basic(&pk, &msg, &proven).unwrap();
    assert!(rsa_crate_verifies(&pk, HashAlg::Sha256, data, &basic.signature));
    let examined: Vec<u16> = faulty.iter().copied().filter(|&f| f <= *basic.used.last().unwrap()).collect();
    assert_eq!(basic.bad, examined);
    for &f in faulty {
        assert!(matches!(pk.verify_share(&msg, &proven[usize::from(f) - 1]), Err(ShareError::BadProof { .. } | ShareError::OutOfRange { .. })));
        assert!(!basic.used.contains(&f));
    }

    // OPT-PROOF: without proofs it asks for them when a faulty share is among the first k,
    // and succeeds with the proofs.
    let plain = with_faults(false);
    // Inverted bits may push a value past N; such shares are dropped before combining.
    let well_formed: Vec<u16> = plain.iter().filter(|s| !s.value.is_zero() && &s.value < pk.modulus()).map(|s| s.index).collect();
    let first_k_faulty = well_formed[..usize::from(t + 1)].iter().any(|i| faulty.contains(i));
    match combine_opt_proof(&pk, &msg, &plain) {
        Ok(c) => {
            assert!(!first_k_faulty);
            assert!(rsa_crate_verifies(&pk, HashAlg::Sha256, data, &c.signature));
        }
        Err(CombineError::NeedProofs { .. }) => assert!(first_k_faulty),
        Err(other) => panic!("unexpected {other:?}"),
    }
    let fallback = combine_opt_proof(&pk, &msg, &proven).unwrap();
    assert!(rsa_crate_verifies(&pk, HashAlg::Sha256, data, &fallback.signature));
    assert!(fallback.used.iter().all(|u| !faulty.contains(u)));

    // OPT-TE: with 2t+1 shares it finds a good subset and names the faulty ones.
    let received = &plain[..usize::from(2 * t + 1)];
    let te = combine_opt_te(&pk, &msg, received).unwrap();
    assert!(rsa_crate_verifies(&pk, HashAlg::Sha256, data, &te.signature));
    assert!(te.attempts <= binomial(u64::from(2 * t + 1), u64::from(t + 1)));
    let bad_received: Vec<u16> = expected_bad.iter().copied().filter(|&f| f <= 2 * t + 1).collect();
    if te.attempts > 1 {
        assert_eq!(te.bad, bad_received);
    } else {
        assert!(te.bad.iter().all(|b| bad_received.contains(b)));
    }
    // With only k shares, one of them bad, no subset works yet.
    if let Some(&f) = faulty.first() {
        let mut few: Vec<SignatureShare> = plain.iter().filter(|s| !faulty.contains(&s.index)).take(usize::from(t)).cloned().collect();
        few.push(plain[usize::from(f) - 1].clone());
        assert!(matches!(
            combine_opt_te(&pk, &msg, &few),
            Err(CombineError::NeedMoreShares { attempts: 1, .. } | CombineError::NeedMoreShares { attempts: 0, .. })
        ));
    }
}

#[test]
fn corrupted_shares_n4_one_fault() {
    corruption_case(4, &[]);
    corruption_case(4, &[1]);
    corruption_case(4, &[3]);
}

#[test]
fn corrupted_shares_n7_up_to_two_faults() {
    corruption_case(7, &[2]);
    corruption_case(7, &[1, 2]);
    corruption_case(7, &[2, 5]);
}

#[test]
fn corrupted_shares_n10_three_faults() {
    corruption_case(10, &[1, 4, 7]);
}

#[test]
fn opt_te_names_bad_shares_beyond_the_good_subset() {
    let (pk, shares) = key(7, 3, 3);
    let msg = pk.encode_message(HashAlg::Sha512, b"x").unwrap();
    let mut plain = sign_all(&pk, &shares, &msg, false);
    plain[0] = corrupt(&pk, &plain[0]);
    plain[4] = corrupt(&pk, &plain[4]);
    let te = combine_opt_te(&pk, &msg, &plain).unwrap();
    assert_eq!(te.bad, vec![1, 5]);
    assert_eq!(te.used, vec![2, 3, 4]);
    assert!(rsa_crate_verifies(&pk, HashAlg::Sha512, b"x", &te.signature));
}

#[test]
fn dnskey_and_ds_match_bind() {
    let tool = Path::new("/usr/bin/dnssec-dsfromkey");
    let tool = if tool.exists() {
        tool.to_path_buf()
    } else if let Ok(path) = which("dnssec-dsfromkey") {
        path
    } else {
        eprintln!("\n\n*** SKIPPED: dnssec-dsfromkey not found (install bind9-utils) ***\n\n");
        return;
    };
    let (pk, _) = key(4, 2, 4);
    let dir = tempfile::tempdir().unwrap();
    for (zone, flags, alg) in [("example.com", FLAGS_KSK, 8u8), ("Sub.Example.ORG.", FLAGS_ZSK, 10)] {
        let (name, text) = pk.bind_key_file(zone, flags, alg, Some(3600)).unwrap();
        let tag = pk.key_tag(flags, alg).unwrap();
        assert!(name.ends_with(&format!("+{alg:03}+{tag:05}.key")), "{name}");
        let path = dir.path().join(&name);
        std::fs::write(&path, &text).unwrap();
        let out = Command::new(&tool).arg("-2").arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let bind = String::from_utf8_lossy(&out.stdout).to_string();
        let ours = pk.ds_record(zone, flags, alg).unwrap();
        let fields = |s: &str| -> Vec<String> { s.split_whitespace().map(|f| f.to_ascii_uppercase()).collect() };
        // owner IN DS tag alg 2 digest
        assert_eq!(fields(&bind), fields(&ours), "BIND: {bind} ours: {ours}");
        assert_eq!(fields(&ours)[3], tag.to_string());
    }
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.exists()).ok_or(())
}

#[test]
fn key_tag_follows_rfc4034_appendix_b() {
    // Recompute the tag from the rdata by the RFC's definition with 32-bit wrapping sums.
    let (pk, _) = key(1, 1, 5);
    let rdata = pk.dnskey_rdata(257, 8).unwrap();
    assert_eq!(&rdata[..4], &[1, 1, 3, 8]);
    assert_eq!(&rdata[4..8], &[3, 1, 0, 1]);
    assert_eq!(BigUint::from_bytes_be(&rdata[8..]), *pk.modulus());
    let mut sum: u64 = 0;
    for pair in rdata.chunks(2) {
        sum += u64::from(pair[0]) << 8 | u64::from(*pair.get(1).unwrap_or(&0));
    }
    let tag = ((sum + (sum >> 16)) & 0xffff) as u16;
    assert_eq!(pk.key_tag(257, 8).unwrap(), tag);
    assert!(matches!(pk.dnskey_rdata(257, 13), Err(Error::Algorithm(13))));
}

#[test]
fn files_round_trip_with_modes_and_reject_corruption() {
    use std::os::unix::fs::PermissionsExt;
    let (pk, shares) = key(4, 2, 6);
    let dir = tempfile::tempdir().unwrap();
    let pub_path = dir.path().join("zone.pub.json");
    save_public(&pub_path, &pk).unwrap();
    let loaded = load_public(&pub_path).unwrap();
    assert_eq!(loaded, pk);
    assert_eq!(loaded.verification_key(3), pk.verification_key(3));

    let share_path = dir.path().join("share-2.json");
    save_share(&share_path, &shares[1]).unwrap();
    let mode = std::fs::metadata(&share_path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&share_path).unwrap();
    assert!(text.contains("\"format\": \"shoup-rsa-share/1\""));
    let share = load_share(&share_path).unwrap();
    share.validate(&pk).unwrap();
    assert_eq!(share.index(), 2);
    let msg = pk.encode_message(HashAlg::Sha256, b"m").unwrap();
    assert_eq!(share.sign(&pk, &msg).unwrap(), shares[1].sign(&pk, &msg).unwrap());

    // Group-readable share file: refused with a clear error.
    std::fs::set_permissions(&share_path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = load_share(&share_path).unwrap_err();
    assert!(matches!(err, Error::InsecurePermissions { mode: 0o640, .. }), "{err}");
    assert!(err.to_string().contains("chmod 600"));
    std::fs::set_permissions(&share_path, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Corrupted files: truncated, bad hex, wrong format tag, wrong secret length, tampered key.
    let corrupt_share = |edit: &dyn Fn(&str) -> String| {
        std::fs::write(&share_path, edit(&text)).unwrap();
        load_share(&share_path)
    };
    assert!(matches!(corrupt_share(&|t| t[..t.len() / 2].to_string()), Err(Error::Corrupt { .. })));
    assert!(matches!(corrupt_share(&|t| t.replace("shoup-rsa-share/1", "shoup-rsa-share/9")), Err(Error::Corrupt { .. })));
    let secret_hex = text.split("\"secret\": \"").nth(1).unwrap().split('"').next().unwrap().to_string();
    assert!(matches!(corrupt_share(&|t| t.replace(&secret_hex, &format!("zz{}", &secret_hex[2..]))), Err(Error::Corrupt { .. })));
    assert!(matches!(corrupt_share(&|t| t.replace(&secret_hex, &secret_hex[2..])), Err(Error::Corrupt { .. })));
    // A flipped secret bit loads but fails validation against the public key.
    let flipped = corrupt_share(&|t| {
        let last = secret_hex.chars().last().unwrap();
        let new_last = if last == '0' { '1' } else { '0' };
        t.replace(&secret_hex, &format!("{}{}", &secret_hex[..secret_hex.len() - 1], new_last))
    })
    .unwrap();
    assert!(matches!(flipped.validate(&pk), Err(Error::ShareInconsistent { index: 2 })));
    // A share of another key.
    let (other_pk, _) = key(4, 2, 7);
    assert!(matches!(shares[0].validate(&other_pk), Err(Error::KeyMismatch)));
    assert!(matches!(shares[0].sign(&other_pk, &msg), Err(Error::KeyMismatch)));

    let pub_text = std::fs::read_to_string(&pub_path).unwrap();
    let corrupt_public = |new: String| {
        std::fs::write(&pub_path, new).unwrap();
        load_public(&pub_path)
    };
    assert!(matches!(corrupt_public(pub_text.replace("\"threshold\": 2", "\"threshold\": 5")), Err(Error::Corrupt { .. })));
    assert!(matches!(corrupt_public(pub_text.replace("\"players\": 4", "\"players\": 3")), Err(Error::Corrupt { .. })));
    assert!(matches!(corrupt_public("{".into()), Err(Error::Corrupt { .. })));
    assert!(matches!(load_public(dir.path().join("missing")), Err(Error::Io { .. })));
}

#[test]
fn share_errors_are_typed() {
    let (pk, shares) = key(4, 2, 8);
    let msg = pk.encode_message(HashAlg::Sha256, b"errors").unwrap();
    let good = shares[0].sign_with_proof(&pk, &msg).unwrap();
    let (p, _) = primes_1024();

    let unknown = SignatureShare { index: 5, ..good.clone() };
    assert_eq!(pk.verify_share(&msg, &unknown), Err(ShareError::UnknownIndex { index: 5, players: 4 }));
    let zero_index = SignatureShare { index: 0, ..good.clone() };
    assert!(matches!(pk.verify_share(&msg, &zero_index), Err(ShareError::UnknownIndex { .. })));
    let zero = SignatureShare { value: BigUint::zero(), ..good.clone() };
    assert_eq!(pk.verify_share(&msg, &zero), Err(ShareError::OutOfRange { index: 1 }));
    let too_big = SignatureShare { value: pk.modulus().clone(), ..good.clone() };
    assert_eq!(pk.verify_share(&msg, &too_big), Err(ShareError::OutOfRange { index: 1 }));
    let not_unit = SignatureShare { value: p.clone(), ..good.clone() };
    assert_eq!(pk.verify_share(&msg, &not_unit), Err(ShareError::NotInvertible { index: 1 }));
    let no_proof = SignatureShare { proof: None, ..good.clone() };
    assert_eq!(pk.verify_share(&msg, &no_proof), Err(ShareError::MissingProof { index: 1 }));

    // Wire form: round trip and wrong lengths.
    for share in [&good, &no_proof] {
        let bytes = share.to_bytes(&pk).unwrap();
        assert_eq!(&SignatureShare::from_bytes(&pk, &bytes).unwrap(), share);
        assert!(matches!(SignatureShare::from_bytes(&pk, &bytes[..bytes.len() - 1]), Err(ShareError::WrongLength { .. })));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(SignatureShare::from_bytes(&pk, &longer), Err(ShareError::WrongLength { .. })));
    }
    let mut bad_index = no_proof.to_bytes(&pk).unwrap();
    bad_index[1] = 9;
    assert!(matches!(SignatureShare::from_bytes(&pk, &bad_index), Err(ShareError::UnknownIndex { index: 9, .. })));
    let mut bad_flag = no_proof.to_bytes(&pk).unwrap();
    *bad_flag.last_mut().unwrap() = 1;
    assert!(matches!(SignatureShare::from_bytes(&pk, &bad_flag), Err(ShareError::Malformed { .. })));
    assert!(matches!(SignatureShare::from_bytes(&pk, &[]), Err(ShareError::WrongLength { .. })));

    // Combination: duplicates, too few, structurally invalid, and a non-unit share.
    let second = shares[1].sign(&pk, &msg).unwrap();
    assert_eq!(pk.combine(&msg, &[good.clone(), good.clone()]), Err(CombineError::DuplicateIndex(1)));
    assert_eq!(combine_opt_te(&pk, &msg, &[good.clone(), good.clone()]), Err(CombineError::DuplicateIndex(1)));
    assert_eq!(pk.combine(&msg, std::slice::from_ref(&good)), Err(CombineError::NotEnoughShares { have: 1, need: 2 }));
    assert_eq!(pk.combine(&msg, &[unknown.clone(), second.clone()]), Err(CombineError::InvalidShare(ShareError::UnknownIndex { index: 5, players: 4 })));
    assert_eq!(pk.combine(&msg, &[not_unit.clone(), second.clone()]), Err(CombineError::InvalidShare(ShareError::NotInvertible { index: 1 })));
    let third = shares[2].sign(&pk, &msg).unwrap();
    let te = combine_opt_te(&pk, &msg, &[not_unit, second.clone(), third.clone()]).unwrap();
    assert_eq!(te.bad, vec![1]);
    assert!(rsa_crate_verifies(&pk, HashAlg::Sha256, b"errors", &te.signature));
    // Shares for another message do not combine.
    let other = pk.encode_message(HashAlg::Sha256, b"other").unwrap();
    assert!(matches!(pk.combine(&other, &[second, third]), Err(CombineError::Verification { .. })));
    // A message of another key.
    let (other_pk, _) = key(4, 2, 9);
    let foreign = other_pk.encode_message(HashAlg::Sha256, b"x").unwrap();
    assert_eq!(pk.combine(&foreign, &[good]), Err(CombineError::KeyMismatch));
}

#[test]
fn parameter_errors_are_typed() {
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let mut quiet = |_: Progress| {};
    assert!(matches!(generate(512, 4, 2, &mut rng, &mut quiet), Err(Error::ModulusBits { bits: 512, .. })));
    assert!(matches!(generate(8192, 4, 2, &mut rng, &mut quiet), Err(Error::ModulusBits { .. })));
    assert!(matches!(generate(2047, 4, 2, &mut rng, &mut quiet), Err(Error::ModulusBits { .. })));
    assert!(matches!(generate(1024, 4, 0, &mut rng, &mut quiet), Err(Error::Threshold { threshold: 0, players: 4 })));
    assert!(matches!(generate(1024, 4, 5, &mut rng, &mut quiet), Err(Error::Threshold { threshold: 5, players: 4 })));
    assert!(matches!(generate(1024, 0, 1, &mut rng, &mut quiet), Err(Error::Players(0))));
    assert!(matches!(generate(1024, 256, 1, &mut rng, &mut quiet), Err(Error::Players(256))));
    let (p, q) = primes_1024();
    assert!(matches!(deal(p, q, 3, 4, &mut rng), Err(Error::Threshold { .. })));
    assert_eq!(default_threshold(1), 1);
    assert_eq!(default_threshold(4), 2);
    assert_eq!(default_threshold(7), 3);
    assert_eq!(default_threshold(13), 5);
}

#[test]
fn small_keys_only_through_the_insecure_path() {
    let mut rng = ChaCha20Rng::seed_from_u64(512);
    let (pk, shares) = generate_insecure(512, 3, 2, &mut rng, &mut |_| {}).unwrap();
    assert_eq!(pk.modulus_bits(), 512);
    let msg = pk.encode_message(HashAlg::Sha256, b"small").unwrap();
    let sig = pk.combine(&msg, &sign_all(&pk, &shares[..2], &msg, false)).unwrap();
    assert!(pk.verify(&msg, &sig));
    // SHA-512 needs 83 bytes of block; a 512-bit modulus has 64.
    assert!(matches!(pk.encode_message(HashAlg::Sha512, b"x"), Err(Error::MessageTooLong { .. })));
}

#[test]
fn proofs_are_deterministic_and_bound_to_the_message() {
    let (pk, shares) = key(4, 2, 11);
    let a = pk.encode_message(HashAlg::Sha256, b"a").unwrap();
    let b = pk.encode_message(HashAlg::Sha256, b"b").unwrap();
    let first = shares[0].sign_with_proof(&pk, &a).unwrap();
    assert_eq!(first, shares[0].sign_with_proof(&pk, &a).unwrap());
    let other = shares[0].sign_with_proof(&pk, &b).unwrap();
    assert_ne!(first.proof.as_ref().unwrap().z, other.proof.as_ref().unwrap().z);
    // A valid share with the proof of another message, or another share's proof, is rejected.
    let swapped = SignatureShare { proof: other.proof.clone(), ..first.clone() };
    assert_eq!(pk.verify_share(&a, &swapped), Err(ShareError::BadProof { index: 1 }));
    let borrowed = SignatureShare { index: 2, ..first.clone() };
    assert!(pk.verify_share(&a, &borrowed).is_err());
    pk.verify_share(&a, &first).unwrap();
    // Share without proof equals the share with proof, minus the proof.
    assert_eq!(shares[0].sign(&pk, &a).unwrap().value, first.value);
    // Serde round trip of a share.
    let json = serde_json::to_string(&first).unwrap();
    assert_eq!(serde_json::from_str::<SignatureShare>(&json).unwrap(), first);
}

#[test]
fn corrupt_inverts_every_bit() {
    let (pk, shares) = key(4, 2, 12);
    let msg = pk.encode_message(HashAlg::Sha256, b"c").unwrap();
    let share = shares[0].sign(&pk, &msg).unwrap();
    let bad = corrupt(&pk, &share);
    let a = crate::util::to_fixed_be(&share.value, pk.modulus_bytes()).unwrap();
    let b = crate::util::to_fixed_be(&bad.value, pk.modulus_bytes()).unwrap();
    assert!(a.iter().zip(&b).all(|(x, y)| x ^ y == 0xff));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn random_groups_sign_and_verify(
        players in 1u16..=13,
        threshold_seed in any::<u16>(),
        order_seed in any::<u64>(),
        data in proptest::collection::vec(any::<u8>(), 0..200),
        alg in prop_oneof![Just(5u8), Just(8u8), Just(10u8)],
        with_proof in any::<bool>(),
    ) {
        let threshold = threshold_seed % players + 1;
        let (pk, shares) = key(players, threshold, order_seed % 4);
        let hash = HashAlg::from_dnssec_alg(alg).unwrap();
        let msg = pk.encode_message(hash, &data).unwrap();
        // A pseudo-random k-subset in pseudo-random order.
        let mut order: Vec<usize> = (0..usize::from(players)).collect();
        let mut state = order_seed;
        for i in (1..order.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            order.swap(i, (state >> 33) as usize % (i + 1));
        }
        let chosen: Vec<SignatureShare> = order[..usize::from(threshold)]
            .iter()
            .map(|&i| if with_proof { shares[i].sign_with_proof(&pk, &msg) } else { shares[i].sign(&pk, &msg) }.unwrap())
            .collect();
        if with_proof {
            for s in &chosen {
                prop_assert!(pk.verify_share(&msg, s).is_ok());
            }
        }
        let sig = pk.combine(&msg, &chosen).unwrap();
        prop_assert!(pk.verify(&msg, &sig));
        prop_assert!(rsa_crate_verifies(&pk, hash, &data, &sig));
        // k-1 shares are not enough.
        if threshold > 1 {
            let fewer = &chosen[..usize::from(threshold) - 1];
            let is_not_enough = matches!(pk.combine(&msg, fewer), Err(CombineError::NotEnoughShares { .. }));
            prop_assert!(is_not_enough);
        }
    }

    #[test]
    fn jacobi_minus_one_messages_sign(
        players in 1u16..=13,
        threshold_seed in any::<u16>(),
        data in proptest::collection::vec(any::<u8>(), 1..64),
    ) {
        let threshold = threshold_seed % players + 1;
        let (pk, shares) = key(players, threshold, 20);
        let msg = pk.encode_message(HashAlg::Sha256, &data).unwrap();
        prop_assume!(jacobi(msg.representative(), pk.modulus()) == -1);
        let chosen: Vec<SignatureShare> = shares[usize::from(players - threshold)..]
            .iter()
            .map(|s| s.sign(&pk, &msg).unwrap())
            .collect();
        let sig = pk.combine(&msg, &chosen).unwrap();
        prop_assert!(rsa_crate_verifies(&pk, HashAlg::Sha256, &data, &sig));
    }
}
