//! The byte form of the signers' messages on mesh channel 1: the wrapper's codec framing
//! (version byte, postcard, size limit) around `threshold::SignMessage`, with the index of
//! the zone whose key the session signs with.

use serde::{Deserialize, Serialize};
pub use threshold::SignMessage;

use exec::codec::{self, CodecError};

/// 2: every message carries its zone index (several zones per cluster). A replica drops
/// messages of another version as undecodable (counted against the sender), so all replicas
/// of a cluster are upgraded together.
const VERSION: u8 = 2;

/// Large enough for a 4096-bit share with its proof.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024;

/// One signing message and the zone it is for. The session digest does not say: the zone
/// index picks the key a share is checked against (the signer name inside the signed data
/// already keeps two zones' sessions apart).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignEnvelope {
    /// The zone index (position in canonical order of the configured zones).
    pub zone: u16,
    pub message: SignMessage,
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
            (0, SignMessage::Share { digest, share: vec![0, 1, 2, 3] }),
            (1, SignMessage::Retry { digest, proof: true }),
            (u16::MAX, SignMessage::Final { digest, signature: vec![9; 128] }),
        ] {
            let m = SignEnvelope { zone, message };
            assert_eq!(SignEnvelope::decode(&m.encode()), Ok(m));
        }
        assert!(matches!(SignEnvelope::decode(&[]), Err(CodecError::Empty { .. })));
        // A replica of the single-zone version (version 1, no zone index) is not understood.
        let old = codec::encode(1, &SignMessage::Retry { digest, proof: false });
        assert!(matches!(SignEnvelope::decode(&old), Err(CodecError::Version { got: 1, .. })));
        assert!(matches!(SignEnvelope::decode(&vec![VERSION; MAX_MESSAGE_BYTES + 1]), Err(CodecError::TooLarge { .. })));
        // A length prefix claiming more bytes than there are.
        assert!(matches!(SignEnvelope::decode(&[VERSION, 0, 0, 0xff, 0xff, 0x03]), Err(CodecError::Decode { .. })));
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
