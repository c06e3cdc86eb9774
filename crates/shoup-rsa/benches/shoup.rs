//! 2048-bit benchmarks of the threshold scheme and its baselines, in one run:
//! `cargo bench -p shoup-rsa --bench shoup`.
//!
//! Baselines: a plain 2048-bit modular exponentiation with num-bigint (random base, full-size
//! exponent) and OpenSSL's RSA-2048 PKCS#1 v1.5 sign (CRT) through the openssl crate.
//!
//! `modexp_2048` measures the candidate backends for a secret 2048-bit exponent side by side on
//! the key's modulus: crypto-bigint's constant-time `pow` on a boxed and on a fixed-size
//! (`U2048`) Montgomery form with precomputed parameters, OpenSSL's `BN_mod_exp_mont_consttime`
//! (the reference the share bars are set against) and OpenSSL's variable-time `BN_mod_exp`.

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, SamplingMode};
use num_bigint::BigUint;
use rand_chacha::ChaCha20Rng;
use rand_core::{Rng, SeedableRng};
use shoup_rsa::{combine_basic, combine_opt_proof, combine_opt_te, corrupt, generate, HashAlg, KeyShare, Message, PublicKey, SignatureShare};

const BITS: u32 = 2048;

fn key(players: u16) -> &'static (PublicKey, Vec<KeyShare>) {
    static KEYS: OnceLock<[(PublicKey, Vec<KeyShare>); 2]> = OnceLock::new();
    let keys = KEYS.get_or_init(|| {
        let make = |n: u16, seed: u64| {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            generate(BITS, n, shoup_rsa::default_threshold(n), &mut rng, &mut |_| {}).unwrap()
        };
        [make(4, 4), make(7, 7)]
    });
    if players == 4 {
        &keys[0]
    } else {
        &keys[1]
    }
}

fn message(pk: &PublicKey) -> Message {
    pk.encode_message(HashAlg::Sha256, b"benchmark rrsig data").unwrap()
}

fn baselines(c: &mut Criterion) {
    let (pk, _) = key(4);
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let mut random = |bytes: usize| {
        let mut b = vec![0u8; bytes];
        rng.fill_bytes(&mut b);
        BigUint::from_bytes_be(&b)
    };
    let base = random(256) % pk.modulus();
    let exponent = random(256);
    let mut group = c.benchmark_group("baseline");
    group.measurement_time(Duration::from_secs(4));
    group.bench_function("num_bigint_modpow_2048", |b| b.iter(|| black_box(base.modpow(black_box(&exponent), pk.modulus()))));
    let rsa = openssl::rsa::Rsa::generate(2048).unwrap();
    let digest_info = {
        let mut d = vec![0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20];
        d.extend_from_slice(&[7u8; 32]);
        d
    };
    let mut out = vec![0u8; 256];
    group.bench_function("openssl_rsa2048_sign", |b| b.iter(|| rsa.private_encrypt(black_box(&digest_info), &mut out, openssl::rsa::Padding::PKCS1).unwrap()));
    group.finish();
}

fn modexp(c: &mut Criterion) {
    use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams, FixedMontyForm, FixedMontyParams};
    use crypto_bigint::{BoxedUint, Odd, U2048};
    use openssl::bn::{BigNum, BigNumContext};
    let (pk, _) = key(4);
    let mut rng = ChaCha20Rng::seed_from_u64(2);
    let mut random = |bytes: usize| {
        let mut b = vec![0u8; bytes];
        rng.fill_bytes(&mut b);
        BigUint::from_bytes_be(&b)
    };
    let base = random(256) % pk.modulus();
    // Like a key share: just below N/4.
    let exponent = random(256) >> 2u32;
    let pad = |x: &BigUint| {
        let b = x.to_bytes_be();
        let mut out = vec![0u8; 256 - b.len()];
        out.extend(b);
        out
    };
    let (n_bytes, base_bytes, exp_bytes) = (pad(pk.modulus()), pad(&base), pad(&exponent));
    let mut group = c.benchmark_group("modexp_2048");
    group.measurement_time(Duration::from_secs(4));

    let odd = |bytes: &[u8]| Odd::new(BoxedUint::from_be_slice(bytes, 2048).unwrap()).unwrap();
    let params = BoxedMontyParams::new_vartime(odd(&n_bytes));
    let b = BoxedMontyForm::new(BoxedUint::from_be_slice(&base_bytes, 2048).unwrap(), &params);
    let e = BoxedUint::from_be_slice(&exp_bytes, 2048).unwrap();
    group.bench_function("crypto_bigint_boxed_consttime", |bench| bench.iter(|| black_box(&b).pow(black_box(&e))));

    let fixed_params = FixedMontyParams::new_vartime(Odd::new(U2048::from_be_slice(&n_bytes)).unwrap());
    let fb = FixedMontyForm::new(&U2048::from_be_slice(&base_bytes), &fixed_params);
    let fe = U2048::from_be_slice(&exp_bytes);
    group.bench_function("crypto_bigint_u2048_consttime", |bench| bench.iter(|| black_box(&fb).pow(black_box(&fe))));

    let mut ctx = BigNumContext::new().unwrap();
    let on = BigNum::from_slice(&n_bytes).unwrap();
    let ob = BigNum::from_slice(&base_bytes).unwrap();
    let mut oe = BigNum::from_slice(&exp_bytes).unwrap();
    let mut out = BigNum::new().unwrap();
    group.bench_function("openssl_vartime", |bench| bench.iter(|| out.mod_exp(black_box(&ob), black_box(&oe), &on, &mut ctx).unwrap()));
    oe.set_const_time();
    group.bench_function("openssl_consttime", |bench| bench.iter(|| out.mod_exp(black_box(&ob), black_box(&oe), &on, &mut ctx).unwrap()));
    group.finish();
}

fn keygen(c: &mut Criterion) {
    let mut group = c.benchmark_group("keygen_2048");
    group.sample_size(10).sampling_mode(SamplingMode::Flat).measurement_time(Duration::from_secs(20));
    for players in [4u16, 7] {
        let mut seed = 100u64;
        group.bench_function(format!("n{players}"), |b| {
            b.iter_batched(
                || {
                    seed += 1;
                    ChaCha20Rng::seed_from_u64(seed)
                },
                |mut rng| generate(BITS, players, shoup_rsa::default_threshold(players), &mut rng, &mut |_| {}).unwrap(),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

fn shares(c: &mut Criterion) {
    let (pk, key_shares) = key(4);
    let msg = message(pk);
    let proven = key_shares[0].sign_with_proof(pk, &msg).unwrap();
    let mut group = c.benchmark_group("share_2048_n4");
    group.measurement_time(Duration::from_secs(4));
    group.bench_function("sign", |b| b.iter(|| key_shares[0].sign(pk, black_box(&msg)).unwrap()));
    group.bench_function("sign_with_proof", |b| b.iter(|| key_shares[0].sign_with_proof(pk, black_box(&msg)).unwrap()));
    group.bench_function("verify_share", |b| b.iter(|| pk.verify_share(black_box(&msg), black_box(&proven)).unwrap()));
    group.finish();
}

fn combination(c: &mut Criterion) {
    for players in [4u16, 7] {
        let (pk, key_shares) = key(players);
        let msg = message(pk);
        let k = usize::from(pk.threshold());
        let t = usize::from(pk.max_faults());
        let plain: Vec<SignatureShare> = key_shares.iter().map(|s| s.sign(pk, &msg).unwrap()).collect();
        let proven: Vec<SignatureShare> = key_shares.iter().map(|s| s.sign_with_proof(pk, &msg).unwrap()).collect();
        // t corrupted shares first: the worst case for OPT-TE's lexicographic search.
        let faulty: Vec<SignatureShare> = plain[..2 * t + 1].iter().enumerate().map(|(i, s)| if i < t { corrupt(pk, s) } else { s.clone() }).collect();
        // Bad shares that pass every structural check (shares of another message): each
        // failed subset costs a full combination.
        let other = pk.encode_message(HashAlg::Sha256, b"another message").unwrap();
        let wrong: Vec<SignatureShare> =
            key_shares[..2 * t + 1].iter().enumerate().map(|(i, s)| s.sign(pk, if i < t { &other } else { &msg }).unwrap()).collect();
        let inverted_out_of_range = faulty[..t].iter().filter(|s| &s.value >= pk.modulus()).count();
        eprintln!("n={players}: {inverted_out_of_range} of {t} inverted shares fall outside [0, N)");
        let mut group = c.benchmark_group(format!("combine_2048_n{players}"));
        group.measurement_time(Duration::from_secs(3));
        group.bench_function("combine_k", |b| b.iter(|| pk.combine(&msg, &plain[..k]).unwrap()));
        group.bench_function("opt_te_0_faults", |b| b.iter(|| combine_opt_te(pk, &msg, &plain[..k]).unwrap()));
        group.bench_function(format!("opt_te_{t}_faults"), |b| b.iter(|| combine_opt_te(pk, &msg, &faulty).unwrap()));
        group.bench_function(format!("opt_te_{t}_wrong_in_range"), |b| b.iter(|| combine_opt_te(pk, &msg, &wrong).unwrap()));
        group.bench_function("opt_proof_0_faults", |b| b.iter(|| combine_opt_proof(pk, &msg, &plain[..k]).unwrap()));
        group.bench_function("basic_k_with_proofs", |b| b.iter(|| combine_basic(pk, &msg, &proven[..k]).unwrap()));
        group.finish();
    }
}

criterion_group!(benches, baselines, modexp, shares, combination, keygen);
criterion_main!(benches);
