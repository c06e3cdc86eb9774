//! The byte form of the signers' messages on mesh channel 1: the wrapper's codec framing
//! (version byte, postcard, size limit) around `threshold::SignMessage` (RSA zones) or
//! `threshold_ec::EcSignMessage` (ECDSA P-256 and Ed25519 zones), with the index of the zone
//! whose key the session signs with.

use serde::{Deserialize, Serialize};
pub use threshold::SignMessage;
pub use threshold_ec::EcSignMessage;

use exec::codec::{self, CodecError};

/// 2: every message carries its zone index (several zones per cluster). 3: the message is
/// RSA's or EC's ([`ZoneMessage`]). A replica drops messages of another version as
/// undecodable (counted against the sender), so all replicas of a cluster are upgraded
/// together.
const VERSION: u8 = 3;

/// Large enough for a 4096-bit RSA share with its proof, and for ECDSA's first message at
/// threshold-ec's largest cluster (n = 16, t = 5): a commitment of 33 bytes for each of the
/// 2t + 2 values of each of the C(n-1, t) = 3003 PRSS sets, about 1.2 MB (see the test).
pub const MAX_MESSAGE_BYTES: usize = 2 * 1024 * 1024;

/// A signing message of the zone's kind of key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ZoneMessage {
    Rsa(SignMessage),
    Ec(EcSignMessage),
}

/// One signing message and the zone it is for. The session digest does not say: the zone
/// index picks the key a share is checked against (the signer name inside the signed data
/// already keeps two zones' sessions apart).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignEnvelope {
    /// The zone index (position in canonical order of the configured zones).
    pub zone: u16,
    pub message: ZoneMessage,
}

/// Encoding and decoding of a signing message for the mesh.
pub trait WireFormat: Sized {
    fn encode(&self) -> Vec<u8>;
    fn decode(bytes: &[u8]) -> Result<Self, CodecError>;
}

impl WireFormat for SignEnvelope {
    fn encode(&self) -> Vec<u8> {
        codec::encode(VERSION, self)
    }

    fn decode(bytes: &[u8]) -> Result<SignEnvelope, CodecError> {
        codec::decode("signing message", VERSION, MAX_MESSAGE_BYTES, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects() {
        let digest = [7u8; 32];
        for (zone, message) in [
            (0, ZoneMessage::Rsa(SignMessage::Share { digest, share: vec![0, 1, 2, 3] })),
            (1, ZoneMessage::Rsa(SignMessage::Retry { digest, proof: true })),
            (u16::MAX, ZoneMessage::Rsa(SignMessage::Final { digest, signature: vec![9; 128] })),
        ] {
            let m = SignEnvelope { zone, message };
            assert_eq!(SignEnvelope::decode(&m.encode()), Ok(m));
        }
        assert!(matches!(SignEnvelope::decode(&[]), Err(CodecError::Empty { .. })));
        // A replica of the single-zone version (version 1, no zone index) is not understood,
        // nor one of the RSA-only version 2.
        let old = codec::encode(1, &SignMessage::Retry { digest, proof: false });
        assert!(matches!(SignEnvelope::decode(&old), Err(CodecError::Version { got: 1, .. })));
        #[derive(Serialize)]
        struct V2 {
            zone: u16,
            message: SignMessage,
        }
        let v2 = codec::encode(2, &V2 { zone: 0, message: SignMessage::Retry { digest, proof: false } });
        assert!(matches!(SignEnvelope::decode(&v2), Err(CodecError::Version { got: 2, .. })));
        assert!(matches!(SignEnvelope::decode(&vec![VERSION; MAX_MESSAGE_BYTES + 1]), Err(CodecError::TooLarge { .. })));
        // A length prefix claiming more bytes than there are.
        assert!(matches!(SignEnvelope::decode(&[VERSION, 0, 0, 0xff, 0xff, 0x03]), Err(CodecError::Decode { .. })));
    }

    #[test]
    fn ec_messages_round_trip_and_the_largest_fits() {
        use crate::ops::files::tests::TestRng;
        for alg in [threshold_ec::Algorithm::EcdsaP256Sha256, threshold_ec::Algorithm::Ed25519] {
            let (pk, shares) = threshold_ec::deal(alg, 4, 1, &mut TestRng(9)).unwrap();
            let mut core = threshold_ec::EcSignerCore::new(0, std::sync::Arc::new(pk), std::sync::Arc::new(shares[0].clone()), Default::default()).unwrap();
            core.request(0, alg.number(), b"some RRset").unwrap();
            let mut seen = 0;
            // Run the core's jobs until it has said what it sends first.
            while let Some(out) = core.poll_output() {
                match out {
                    threshold_ec::EcOutput::Compute(job) => core.job_done(job.run()),
                    threshold_ec::EcOutput::Broadcast { message } | threshold_ec::EcOutput::Send { message, .. } => {
                        let m = SignEnvelope { zone: 7, message: ZoneMessage::Ec(message) };
                        assert_eq!(SignEnvelope::decode(&m.encode()), Ok(m));
                        seen += 1;
                    }
                    _ => {}
                }
            }
            assert!(seen > 0, "{alg:?}: the core sent nothing");
        }
        // ECDSA's first message at n = 16, t = 5: the commitments with their μ and proof (and
        // room for the envelope) stay below the limit, and that below the mesh's smallest frame
        // limit (4 MiB, MeshConfig::new; run/mesh.rs only raises it).
        let binomial = |n: usize, k: usize| (0..k).fold(1usize, |acc, i| acc * (n - i) / (i + 1));
        let (n, t) = (usize::from(threshold_ec::MAX_PLAYERS), (usize::from(threshold_ec::MAX_PLAYERS) - 1) / 3);
        let largest = binomial(n - 1, t) * (2 * t + 2) * 33 + 32 + 96 + 1024;
        assert!(largest < MAX_MESSAGE_BYTES, "{largest}");
        const { assert!(MAX_MESSAGE_BYTES < 4 * 1024 * 1024) };
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut state = 0x853c49e6748fea9bu64;
        for len in 0..2000usize {
            let mut buf: Vec<u8> = (0..len % 300)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (state >> 33) as u8
                })
                .collect();
            if let Some(b) = buf.first_mut() {
                *b = VERSION; // get past the version check most of the time
            }
            let _ = SignEnvelope::decode(&buf);
        }
    }
}
