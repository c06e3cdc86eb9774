//! What replicas' signers send each other. The byte framing is the transport's business.

use serde::{Deserialize, Serialize};

/// SHA-256 over (DNSSEC algorithm, to-be-signed bytes after the time rewrite): names one
/// signing session on every replica without revealing the data.
pub type Digest = [u8; 32];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SignMessage {
    /// The sender's signature share, with or without its proof of correctness, in shoup-rsa's
    /// fixed-width byte form (decoded against the public key).
    Share { digest: Digest, share: Vec<u8> },
    /// The sender could not finish: resend your share (with proof when `proof`), or the final
    /// signature if you have it.
    Retry { digest: Digest, proof: bool },
    /// An assembled signature; any valid one ends everyone's wait.
    Final { digest: Digest, signature: Vec<u8> },
}

impl SignMessage {
    pub fn digest(&self) -> &Digest {
        match self {
            SignMessage::Share { digest, .. } | SignMessage::Retry { digest, .. } | SignMessage::Final { digest, .. } => digest,
        }
    }
}
