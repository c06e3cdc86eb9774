//! Shoup's threshold RSA signatures ("Practical Threshold Signatures", EUROCRYPT 2000) for
//! DNSSEC, as pure computation (the only IO is in the file helpers of [`files`]).
//!
//! - [`generate`]: a trusted dealer makes N = pq from two safe primes (1024..=4096 bits, default
//!   2048), e = 65537, and shares s_i of d on a degree k-1 polynomial over Z_{p'q'}, plus the
//!   verification keys v, v_i = v^{s_i}. Safe primes are sieved and tested on two threads.
//! - [`PublicKey::encode_message`]: PKCS#1 v1.5 encoding for DNSSEC algorithms 5/7 (SHA-1),
//!   8 (SHA-256) and 10 (SHA-512) of the RRSIG to-be-signed bytes.
//! - [`KeyShare::sign`] / [`KeyShare::sign_with_proof`]: x_i = x^{2Δ s_i} mod N, optionally with
//!   Shoup's proof of correctness (deterministic nonce, see [`share`]). Exponentiations with
//!   secret exponents run in constant time (OpenSSL's `BN_mod_exp_mont_consttime`, and a
//!   fixed-base table of v scanned with masks); public operations use OpenSSL's modexp and
//!   crypto-bigint Montgomery forms.
//! - [`PublicKey::verify_share`], [`PublicKey::combine`], [`PublicKey::verify`], and the paper's
//!   strategies [`combine_basic`], [`combine_opt_proof`], [`combine_opt_te`].
//! - [`corrupt`]: the paper's fault injection (every bit of a share inverted).
//! - DNSSEC output: [`PublicKey::dnskey_rdata`], [`PublicKey::key_tag`],
//!   [`PublicKey::bind_key_file`], [`PublicKey::ds_record`].
//! - Serde for [`PublicKey`], [`KeyShare`] (via [`files`]) and [`SignatureShare`];
//!   [`SignatureShare::to_bytes`]/[`SignatureShare::from_bytes`] give a fixed-length wire form.
//!
//! Malformed input (shares, files, peers' data) yields typed errors, never panics: see
//! [`ShareError`] (a peer's fault), [`CombineError`] and [`Error`].
//!
//! ```no_run
//! use shoup_rsa::{combine_opt_te, default_threshold, generate, stderr_progress, HashAlg};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let mut rng = rand_chacha::ChaCha20Rng::from_seed([7; 32]);
//! # use rand_core::SeedableRng;
//! // rng: any rand_core 0.10 CryptoRng (here a seeded ChaCha20 for the example).
//! let (pk, shares) = generate(2048, 4, default_threshold(4), &mut rng, &mut stderr_progress())?;
//! let msg = pk.encode_message(HashAlg::Sha256, b"RRSIG to-be-signed bytes")?;
//! let received: Vec<_> = shares[..2].iter().map(|s| s.sign(&pk, &msg)).collect::<Result<_, _>>()?;
//! let combined = combine_opt_te(&pk, &msg, &received)?;
//! assert!(pk.verify(&msg, &combined.signature));
//! let (file_name, contents) = pk.bind_key_file("example.com", shoup_rsa::FLAGS_KSK, 8, None)?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod combine;
mod dnssec;
mod encode;
mod error;
mod exp;
pub mod files;
mod keys;
mod prime;
pub mod share;
mod util;

pub use combine::{binomial, check_share_structure, combine_basic, combine_opt_proof, combine_opt_te, Combined, Signature};
pub use dnssec::{FLAGS_KSK, FLAGS_ZSK};
pub use encode::{HashAlg, Message};
pub use error::{CombineError, Error, ShareError};
pub use files::{load_public, load_share, save_public, save_share};
pub use keys::{
    default_threshold, generate, max_faults, stderr_progress, KeyShare, Progress, PublicKey, DEFAULT_MODULUS_BITS, MAX_MODULUS_BITS, MAX_PLAYERS,
    MIN_MODULUS_BITS, PUBLIC_EXPONENT,
};
#[cfg(any(test, feature = "insecure-small-keys"))]
pub use keys::{generate_insecure, INSECURE_MIN_MODULUS_BITS};
pub use share::{corrupt, ShareProof, SignatureShare};

// The versions in this crate's API (BigUint in shares, the CryptoRng trait of `generate`).
pub use {num_bigint, rand_core};

#[cfg(test)]
mod tests;
