//! TSIG (RFC 8945) signing of update requests with a BIND key (HMAC-SHA256, what `sdns keygen`
//! deals and `nsupdate -k` takes). hickory-proto builds the TSIG record and the bytes to be
//! signed; the MAC is HMAC-SHA256 over them.

use hickory_proto::op::Message;
use hickory_proto::rr::rdata::tsig::{make_tsig_record, message_tbs, TsigAlgorithm, TSIG};
use hickory_proto::rr::Name;
use hmac::{KeyInit, Mac};

/// Seconds of clock difference the server accepts (BIND's and nsupdate's default).
pub const FUDGE: u16 = 300;

/// An HMAC-SHA256 TSIG key.
pub struct TsigKey {
    pub name: Name,
    secret: Vec<u8>,
}

// The secret must not reach a log through a stray `{:?}`.
impl std::fmt::Debug for TsigKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TsigKey").field("name", &self.name).field("secret", &"<redacted>").finish()
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TsigError {
    #[error("cannot encode the message to sign: {0}")]
    Encode(String),
    #[error("unusable TSIG key: {0}")]
    Key(String),
}

impl TsigKey {
    pub fn new(name: Name, secret: Vec<u8>) -> Result<TsigKey, TsigError> {
        if secret.is_empty() {
            return Err(TsigError::Key("empty secret".into()));
        }
        Ok(TsigKey { name, secret })
    }

    /// Signs `message` at `now` (seconds since the epoch) and returns its wire form with the
    /// TSIG record last. The message's id must be final: the MAC covers it.
    pub fn sign(&self, message: &mut Message, now: u64) -> Result<Vec<u8>, TsigError> {
        message.signature = None;
        let pre = TSIG::new(TsigAlgorithm::HmacSha256, now, FUDGE, Vec::new(), message.metadata.id, None, Vec::new());
        let tbs = message_tbs(&*message, &pre, &self.name).map_err(|e| TsigError::Encode(e.to_string()))?;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.secret).map_err(|e| TsigError::Key(e.to_string()))?;
        mac.update(&tbs);
        let tag = mac.finalize().into_bytes().to_vec();
        message.signature = Some(Box::new(make_tsig_record(self.name.clone(), pre.set_mac(tag))));
        message.to_vec().map_err(|e| TsigError::Encode(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{MessageType, OpCode};
    use hickory_proto::rr::RecordType;
    use std::str::FromStr;

    #[test]
    fn signature_is_last_and_covers_the_message() {
        let key = TsigKey::new(Name::from_str("sdns-update.").unwrap(), vec![7u8; 32]).unwrap();
        let mut m = Message::new(0x1234, MessageType::Query, OpCode::Update);
        m.add_query(hickory_proto::op::Query::query(Name::from_str("example.test.").unwrap(), RecordType::SOA));
        let bytes = key.sign(&mut m, 1_700_000_000).unwrap();
        // Without hickory's dnssec features the TSIG record stays in the additional section.
        let mut back = Message::from_vec(&bytes).unwrap();
        let sig = back.additionals.pop().expect("a TSIG record");
        assert_eq!((sig.record_type(), sig.name.clone(), sig.dns_class), (RecordType::TSIG, key.name.clone(), hickory_proto::rr::DNSClass::ANY));
        assert!(back.additionals.is_empty(), "TSIG is the last record");
        // The wire form ends with MAC, original id, error 0 and empty other data; the MAC is
        // HMAC-SHA256 over the message without its TSIG plus the TSIG variables.
        let pre = TSIG::new(TsigAlgorithm::HmacSha256, 1_700_000_000, FUDGE, Vec::new(), 0x1234, None, Vec::new());
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&[7u8; 32]).unwrap();
        mac.update(&message_tbs(&back, &pre, &key.name).unwrap());
        let expected = mac.finalize().into_bytes().to_vec();
        let tail = &bytes[bytes.len() - 6 - 32..];
        assert_eq!(&tail[..32], &expected[..]);
        assert_eq!(&tail[32..], &[0x12, 0x34, 0, 0, 0, 0]);
        // Another key gives another MAC.
        let other = TsigKey::new(Name::from_str("sdns-update.").unwrap(), vec![8u8; 32]).unwrap();
        let bytes2 = other.sign(&mut back.clone(), 1_700_000_000).unwrap();
        assert_ne!(&bytes2[bytes2.len() - 38..bytes2.len() - 6], &expected[..]);
        assert!(TsigKey::new(key.name.clone(), Vec::new()).is_err());
    }
}
