//! The byte form of the signers' messages on mesh channel 1: the wrapper's codec framing
//! (version byte, postcard, size limit) around `threshold::SignMessage`.

pub use threshold::SignMessage;

use crate::codec::{self, CodecError};

const VERSION: u8 = 1;

/// Large enough for a 4096-bit share with its proof.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024;

/// Encoding and decoding of a signing message for the mesh.
pub trait WireFormat: Sized {
    fn encode(&self) -> Vec<u8>;
    fn decode(bytes: &[u8]) -> Result<Self, CodecError>;
}

impl WireFormat for SignMessage {
    fn encode(&self) -> Vec<u8> {
        codec::encode(VERSION, self)
    }

    fn decode(bytes: &[u8]) -> Result<SignMessage, CodecError> {
        codec::decode("signing message", VERSION, MAX_MESSAGE_BYTES, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects() {
        let digest = [7u8; 32];
        for m in [
            SignMessage::Share { digest, share: vec![0, 1, 2, 3] },
            SignMessage::Retry { digest, proof: true },
            SignMessage::Final { digest, signature: vec![9; 128] },
        ] {
            assert_eq!(SignMessage::decode(&m.encode()), Ok(m));
        }
        assert!(matches!(SignMessage::decode(&[]), Err(CodecError::Empty { .. })));
        assert!(matches!(SignMessage::decode(&[2, 0]), Err(CodecError::Version { got: 2, .. })));
        assert!(matches!(SignMessage::decode(&vec![VERSION; MAX_MESSAGE_BYTES + 1]), Err(CodecError::TooLarge { .. })));
        // A length prefix claiming more bytes than there are.
        assert!(matches!(SignMessage::decode(&[VERSION, 0, 0xff, 0xff, 0x03]), Err(CodecError::Decode { .. })));
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
            let _ = SignMessage::decode(&buf);
        }
    }
}
