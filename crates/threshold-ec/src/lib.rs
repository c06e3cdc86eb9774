//! Deterministic threshold Ed25519 (DNSSEC algorithm 15, RFC 8080/8032) and ECDSA P-256
//! (algorithm 13, RFC 6605) for n = 3t+1 replicas: every honest replica obtains the same
//! signature bytes for the same data, whichever replicas answered and whatever up to t
//! Byzantine ones did. The design and its argument are in docs/DETERMINISM.md ("ECDSA P-256
//! and Ed25519: the same signature from every honest subset"); in short:
//!
//! - [`deal`]: a trusted dealer shares the key x on a degree-t polynomial (replica i, 1-based,
//!   is evaluation point i, as in shoup-rsa) and gives every replica the pseudorandom secret
//!   sharing keys ρ_T of all t-sets T it is not in ([`prss`]).
//! - The nonce k is derived from h = SHA-256(algorithm ‖ key tag ‖ data) through the PRSS keys:
//!   no randomness while signing, nothing the adversary can bias, the same k for the same data.
//! - [`EdSession`]: a commitment round fixes R = k·G (a set's commitment counts once t+1 of its
//!   holders report the same bytes), then any t+1 shares s_i = k_i + c·x_i give s.
//! - [`EcdsaSession`]: the first message carries the commitments and μ_i = k_i·a_i + z1_i with a
//!   proof; the second σ_i with a proof; any 2t+1 valid σ_j give s = k⁻¹(e + r·x).
//! - Checks are lazy: a combined signature is returned only after the standard verifier
//!   (ed25519-dalek's `verify_strict`, p256's ECDSA verifier, and for ECDSA the exact nonce
//!   point) accepts it; only when it does not are shares checked one by one, their senders
//!   blamed ([`Blame`]) and the combination retried with valid shares.
//!
//! Sessions are pure computation (no IO, no clock, no randomness): a driver delivers peers'
//! messages and sends what the session produces. [`EcSignerCore`] is that driver's sans-IO
//! network side, as `threshold::SignerCore` is for RSA: one session per digest, opened only
//! when the local named asks, peers' early messages stashed within bounds, retries, final
//! signatures checked exactly and cached, expensive steps handed out as [`EcJob`]s. Peers' bytes never cause a panic: malformed
//! points, scalars or framing become [`Fault::Malformed`]. Scalar multiplications by secrets use
//! curve25519-dalek's and p256's constant-time code; secrets are wiped on drop and never
//! printed by `Debug`.
//!
//! ```
//! use threshold_ec::{deal, Algorithm, EdSession};
//! use rand_core::SeedableRng;
//! # fn main() -> Result<(), threshold_ec::Error> {
//! let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7); // OsRng in `sdns keygen`
//! let (pk, shares) = deal(Algorithm::Ed25519, 4, 1, &mut rng)?;
//! let data = b"RRSIG to-be-signed bytes";
//! let (mut sessions, first): (Vec<_>, Vec<_>) = shares.iter().map(|s| EdSession::new(&pk, s, data).unwrap()).unzip();
//! for (from, message) in first.iter().enumerate() {
//!     for (to, session) in sessions.iter_mut().enumerate() {
//!         if to != from {
//!             session.receive(from as u16 + 1, &message.to_bytes()).unwrap();
//!         }
//!     }
//! }
//! let second: Vec<_> = sessions.iter().map(|s| s.my_share().unwrap()).collect();
//! for (from, message) in second.iter().enumerate() {
//!     for (to, session) in sessions.iter_mut().enumerate() {
//!         if to != from {
//!             session.add(from as u16 + 1, message.clone()).unwrap();
//!         }
//!     }
//! }
//! let signature = sessions[0].try_finish().unwrap()?;
//! assert!(sessions.iter_mut().all(|s| s.try_finish() == Some(Ok(signature))));
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod commit;
mod core;
mod curve;
mod ecdsa;
mod ed;
mod error;
mod intake;
mod keys;
mod presign;
mod proof;
pub mod prss;

pub use self::core::{digest_of, Digest, EcJob, EcJobDone, EcLimits, EcOutput, EcRequestError, EcSignMessage, EcSignerCore, EcStats};
pub use ecdsa::{EcdsaMessage, EcdsaSession};
pub use ed::{EdMessage, EdSession};
pub use error::{Blame, Error, Fault};
pub use keys::{deal, Algorithm, KeyShare, PublicKey, FLAGS_KSK, MAX_PLAYERS};
pub use presign::{PresignCore, PresignError, PresignLimits, PresignMessage, PresignOutput, Slot};

// The version of the RNG trait `deal` takes.
pub use rand_core;
