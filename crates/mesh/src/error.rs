//! Errors of the mesh and its PKI, split by whose fault they are: the caller's configuration,
//! local I/O, or a peer's misbehaviour.

use std::io;

/// Everything the transport can report. Peer misbehaviour never panics; it closes the
/// connection and shows up in logs and counters, and as this error where a call waits on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The configuration is unusable; `field` names the offending field.
    #[error("invalid config field `{field}`: {reason}")]
    Config { field: &'static str, reason: String },
    /// A PEM certificate or key could not be parsed or used.
    #[error("bad {what}: {reason}")]
    Pem { what: &'static str, reason: String },
    /// Certificate generation failed.
    #[error("certificate generation failed: {0}")]
    CertGen(String),
    /// TLS setup failed (bad key for the certificate, unsupported algorithm, ...).
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// Local socket error (bind, accept, connect).
    #[error("I/O error during {during}: {source}")]
    Io {
        during: &'static str,
        #[source]
        source: io::Error,
    },
    /// The caller tried to send a frame larger than the configured maximum.
    #[error("frame of {len} bytes exceeds max_frame_bytes {max}")]
    FrameTooLarge { len: usize, max: usize },
    /// The caller named a replica that is not a configured peer.
    #[error("unknown peer replica {0}")]
    UnknownPeer(u16),
    /// A peer broke the protocol (oversize frame, bad certificate, wrong identity).
    #[error("peer misbehaved: {0}")]
    PeerMisbehaved(#[from] PeerError),
    /// The mesh has been shut down.
    #[error("mesh is shut down")]
    Shutdown,
}

/// A peer's fault, detected on a connection. The connection is closed; the mesh goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    #[error("frame length {len} exceeds limit {max}")]
    OversizeFrame { len: usize, max: usize },
    #[error("empty frame (no channel byte)")]
    EmptyFrame,
    #[error("peer presented no certificate")]
    NoCertificate,
    #[error("peer certificate does not name exactly one replica: {0}")]
    BadIdentity(String),
    #[error("peer certificate names replica {got}, expected {expected}")]
    WrongReplica { expected: u16, got: u16 },
    #[error("peer certificate names replica {0}, which is not a configured peer")]
    NotAPeer(u16),
    /// A replica signature outside TLS (`pki::verify_replica_signature`) does not verify.
    #[error("replica signature not proven: {0}")]
    NotProven(String),
}
