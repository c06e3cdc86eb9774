//! Error types, layered: a share's defect (the peer's fault), a combination failure, and
//! everything else (caller misuse, files).

use std::path::PathBuf;

/// Why one signature share was rejected. These are the sending replica's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShareError {
    #[error("share index {index} is not a player of this key (players are 1..={players})")]
    UnknownIndex { index: u16, players: u16 },
    #[error("share encoding has {got} bytes, expected {expected}")]
    WrongLength { expected: usize, got: usize },
    #[error("share {index}: value is 0 or not below the modulus")]
    OutOfRange { index: u16 },
    #[error("share {index}: value shares a factor with the modulus (not in Z_N*)")]
    NotInvertible { index: u16 },
    #[error("share {index}: carries no proof of correctness")]
    MissingProof { index: u16 },
    #[error("share {index}: proof of correctness does not verify")]
    BadProof { index: u16 },
    #[error("share encoding is malformed: {reason}")]
    Malformed { reason: &'static str },
}

/// Why shares could not be combined into a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CombineError {
    /// Caller misuse: the same index appears twice among the shares passed in.
    #[error("share index {0} appears more than once")]
    DuplicateIndex(u16),
    #[error("need {need} shares, have {have}")]
    NotEnoughShares { have: usize, need: usize },
    #[error("share rejected: {0}")]
    InvalidShare(#[from] ShareError),
    /// The combination of exactly the given shares is not a valid RSA signature: at least one
    /// of them is bad.
    #[error("combined signature does not verify (shares {used:?})")]
    Verification { used: Vec<u16> },
    /// OPT-PROOF: the optimistic combination failed; ask every replica for shares with proofs
    /// and call again (or call `combine_basic`).
    #[error("optimistic combination of shares {used:?} failed; fall back to shares with proofs")]
    NeedProofs { used: Vec<u16>, bad: Vec<u16> },
    /// BASIC: fewer than k shares carry a valid proof.
    #[error("only {valid} shares have valid proofs, need {need} (bad: {bad:?})")]
    NotEnoughValidShares { valid: usize, need: usize, bad: Vec<u16> },
    /// OPT-TE: no k-subset of the shares received so far verifies; wait for more shares.
    #[error("no {need}-subset of the {have} shares verifies after {attempts} attempts; need more shares (bad: {bad:?})")]
    NeedMoreShares { have: usize, need: usize, attempts: u64, bad: Vec<u16> },
    #[error("message and shares belong to different keys")]
    KeyMismatch,
}

/// Errors of key generation, signing, encoding and files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("modulus size {bits} bits not allowed (even sizes {min}..={max})")]
    ModulusBits { bits: u32, min: u32, max: u32 },
    #[error("player count {0} out of range (1..={max})", max = crate::util::MAX_PLAYERS)]
    Players(u16),
    #[error("threshold {threshold} out of range for {players} players (1..={players})")]
    Threshold { threshold: u16, players: u16 },
    #[error("safe prime generation gave up after {0} sieve windows")]
    PrimeSearchExhausted(u64),
    #[error("message of {len} bytes does not fit a PKCS#1 v1.5 block of {block} bytes")]
    MessageTooLong { len: usize, block: usize },
    #[error("encoded message is not in Z_N*")]
    MessageNotInvertible,
    #[error("key share belongs to another public key (fingerprint mismatch)")]
    KeyMismatch,
    #[error("key share {index} does not match its verification key")]
    ShareInconsistent { index: u16 },
    #[error("share index {index} out of range 1..={players}")]
    ShareIndex { index: u16, players: u16 },
    #[error("zone name {name:?} is not a valid domain name: {reason}")]
    ZoneName { name: String, reason: &'static str },
    #[error("DNSSEC algorithm {0} is not an RSA algorithm this crate signs with (5, 7, 8, 10)")]
    Algorithm(u8),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: share file is readable by group or others (mode {mode:o}); run chmod 600 on it")]
    InsecurePermissions { path: PathBuf, mode: u32 },
    #[error("{path}: corrupted or unreadable key file: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("invalid key data: {0}")]
    InvalidKey(String),
    /// The big-number backend (OpenSSL) failed, e.g. out of memory.
    #[error("big-number backend: {0}")]
    Backend(String),
}
