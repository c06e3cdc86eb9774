//! Errors, layered as in shoup-rsa: a peer's fault ([`Blame`]), and everything else ([`Error`]:
//! caller misuse, key files, the negligible-probability dead ends of a session).

/// What a peer did wrong. A replica is blamed once, for the first fault seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum Fault {
    /// Not a replica of this key (index 0 or above n): never recorded, only returned.
    UnknownReplica,
    /// Bytes that do not parse as this algorithm's message for this key (wrong tag, length,
    /// count of commitments, or a point or scalar that is not canonical).
    Malformed,
    /// A commitment for a set T that differs from the one t+1 holders of ρ_T agree on.
    LyingCommitment,
    /// A second, different message of a kind it already sent.
    Equivocation,
    /// A signature share that fails its check (Ed25519: s_j·G ≠ K_j + c·X_j; ECDSA: its proof
    /// does not verify, whether the value or the proof is wrong).
    BadShare,
}

/// Replica `replica` sent `fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("replica {replica}: {fault:?}")]
pub struct Blame {
    pub replica: u16,
    pub fault: Fault,
}

/// Errors of dealing, key files and sessions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("DNSSEC algorithm {0} is not one this crate signs with (13, 15)")]
    Algorithm(u8),
    #[error("{players} replicas out of range (1..={max})")]
    Players { players: u16, max: u16 },
    #[error("threshold {threshold} needs at least 3t+1 = {need} replicas, have {players}")]
    Threshold { threshold: u16, players: u16, need: u32 },
    #[error("replica index {index} out of range 1..={players}")]
    Index { index: u16, players: u16 },
    #[error("key material is malformed: {0}")]
    Malformed(&'static str),
    #[error("key share {found} given to replica {expected} (1-based)")]
    ShareIndex { expected: u16, found: u16 },
    #[error("key share belongs to another key (algorithm, size or public key differ)")]
    KeyMismatch,
    #[error("key share {index} does not match its verification point X_{index}")]
    ShareInconsistent { index: u16 },
    #[error("verification points do not lie on one degree-t polynomial through the public key")]
    VerificationPoints,
    /// r, s, μ or the nonce came out zero: probability about 2^-256 per signature, and the same
    /// at every replica (the data cannot be signed with this key; re-dealing would fix it).
    #[error("a value of this signature is zero (negligible probability); cannot sign this data")]
    Degenerate,
}
