//! One threshold signature computed by all n = 4 replicas in one process (every replica's
//! whole session: both rounds, combination and the final check), next to one single-key
//! signature of the same algorithm. Messages are delivered in order and all replicas are
//! honest, so this is the optimistic path: no share or proof is checked individually.
//!
//! `cargo bench -p threshold-ec --bench sign` (add `-- --quick` for a sanity run).

use criterion::{criterion_group, criterion_main, Criterion};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use std::hint::black_box;
use threshold_ec::{deal, Algorithm, EcdsaSession, EdSession, KeyShare, PublicKey};

const DATA: &[u8] = b"\x00\x06\x0f\x02\x00\x00\x0e\x10 an RRSIG prefix and a canonical RRset of typical size";

fn all_to_all<S>(sessions: &mut [S], messages: &[Vec<u8>], receive: impl Fn(&mut S, u16, &[u8])) {
    for (from, m) in messages.iter().enumerate() {
        for (to, s) in sessions.iter_mut().enumerate() {
            if to != from {
                receive(s, from as u16 + 1, m);
            }
        }
    }
}

fn ed_threshold(pk: &PublicKey, shares: &[KeyShare]) -> [u8; 64] {
    let (mut sessions, first): (Vec<EdSession>, Vec<Vec<u8>>) =
        shares.iter().map(|s| EdSession::new(pk, s, DATA).map(|(s, m)| (s, m.to_bytes())).unwrap()).unzip();
    all_to_all(&mut sessions, &first, |s, from, m| s.receive(from, m).unwrap());
    let second: Vec<Vec<u8>> = sessions.iter().map(|s| s.my_share().unwrap().to_bytes()).collect();
    all_to_all(&mut sessions, &second, |s, from, m| s.receive(from, m).unwrap());
    let signatures: Vec<[u8; 64]> = sessions.iter_mut().map(|s| s.try_finish().unwrap().unwrap()).collect();
    signatures[0]
}

fn ecdsa_threshold(pk: &PublicKey, shares: &[KeyShare]) -> [u8; 64] {
    let (mut sessions, first): (Vec<EcdsaSession>, Vec<Vec<u8>>) =
        shares.iter().map(|s| EcdsaSession::new(pk, s, DATA).map(|(s, m)| (s, m.to_bytes())).unwrap()).unzip();
    all_to_all(&mut sessions, &first, |s, from, m| s.receive(from, m).unwrap());
    let second: Vec<Vec<u8>> = sessions.iter_mut().map(|s| s.my_share().unwrap().to_bytes()).collect();
    all_to_all(&mut sessions, &second, |s, from, m| s.receive(from, m).unwrap());
    let signatures: Vec<[u8; 64]> = sessions.iter_mut().map(|s| s.try_finish().unwrap().unwrap()).collect();
    signatures[0]
}

fn bench(c: &mut Criterion) {
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let mut group = c.benchmark_group("sign");

    let (pk, shares) = deal(Algorithm::Ed25519, 4, 1, &mut rng).unwrap();
    group.bench_function("ed25519 threshold n=4 (all replicas)", |b| b.iter(|| ed_threshold(&pk, &shares)));
    let single = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    group.bench_function("ed25519 single key", |b| {
        use ed25519_dalek::Signer as _;
        b.iter(|| single.sign(black_box(DATA)))
    });

    let (pk, shares) = deal(Algorithm::EcdsaP256Sha256, 4, 1, &mut rng).unwrap();
    group.bench_function("ecdsa-p256 threshold n=4 (all replicas)", |b| b.iter(|| ecdsa_threshold(&pk, &shares)));
    let single = p256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap();
    group.bench_function("ecdsa-p256 single key", |b| {
        use p256::ecdsa::signature::Signer as _;
        b.iter(|| -> p256::ecdsa::Signature { single.sign(black_box(DATA)) })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
