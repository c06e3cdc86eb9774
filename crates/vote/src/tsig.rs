//! TSIG (RFC 8945) signing of update requests with a BIND key (HMAC-SHA256, what `sdns keygen`
//! deals and `nsupdate -k` takes), with the same TSIG code the replicas verify with
//! (`dnswire::tsig`).

use dnswire::tsig::{self, Algorithm, Key};
use hickory_proto::op::Message;
use hickory_proto::rr::Name;

/// Seconds of clock difference the server accepts (BIND's and nsupdate's default).
pub const FUDGE: u16 = 300;

/// An HMAC-SHA256 TSIG key. `dnswire`'s key keeps the secret inside ring and prints none of it.
#[derive(Debug)]
pub struct TsigKey {
    pub name: Name,
    key: Key,
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
        let key =
            Key::new(&name.to_ascii(), Algorithm::HmacSha256, &secret).ok_or_else(|| TsigError::Key(format!("key name {name} is not a valid DNS name")))?;
        Ok(TsigKey { name, key })
    }

    /// Signs `message` at `now` (seconds since the epoch) and returns its wire form with the
    /// TSIG record last. The message's id must be final: the MAC covers it.
    pub fn sign(&self, message: &mut Message, now: u64) -> Result<Vec<u8>, TsigError> {
        message.signature = None;
        let unsigned = message.to_vec().map_err(|e| TsigError::Encode(e.to_string()))?;
        Ok(tsig::sign(&unsigned, &self.key, now, FUDGE, 0, Vec::new(), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{MessageType, OpCode};
    use hickory_proto::rr::rdata::tsig::{message_tbs, TsigAlgorithm, TSIG};
    use hickory_proto::rr::RecordType;
    use std::str::FromStr;

    #[test]
    fn signature_is_last_covers_the_message_and_verifies() {
        let key = TsigKey::new(Name::from_str("sdns-update.").unwrap(), vec![7u8; 32]).unwrap();
        let mut m = Message::new(0x1234, MessageType::Query, OpCode::Update);
        m.add_query(hickory_proto::op::Query::query(Name::from_str("example.test.").unwrap(), RecordType::SOA));
        let bytes = key.sign(&mut m, 1_700_000_000).unwrap();
        // Without hickory's dnssec features the TSIG record stays in the additional section.
        let mut back = Message::from_vec(&bytes).unwrap();
        let sig = back.additionals.pop().expect("a TSIG record");
        assert_eq!((sig.record_type(), sig.name.clone(), sig.dns_class), (RecordType::TSIG, key.name.clone(), hickory_proto::rr::DNSClass::ANY));
        assert!(back.additionals.is_empty(), "TSIG is the last record");
        // Independently of dnswire: the MAC is HMAC-SHA256 over what hickory-proto says a TSIG
        // covers (the message without its TSIG plus the TSIG variables).
        let pre = TSIG::new(TsigAlgorithm::HmacSha256, 1_700_000_000, FUDGE, Vec::new(), 0x1234, None, Vec::new());
        let hk = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[7u8; 32]);
        let expected = ring::hmac::sign(&hk, &message_tbs(&back, &pre, &key.name).unwrap());
        let tail = &bytes[bytes.len() - 6 - 32..];
        assert_eq!(&tail[..32], expected.as_ref());
        assert_eq!(&tail[32..], &[0x12, 0x34, 0, 0, 0, 0]);
        // What the replicas run accepts it at its time and refuses it outside the fudge.
        let l = dnswire::layout::layout(&bytes).unwrap();
        let rec = l.signature.unwrap();
        let t = tsig::Tsig::parse(&bytes, &rec).unwrap();
        assert_eq!(tsig::verify(&bytes, &rec, &t, &key.key, 1_700_000_000 + 300), Ok(()));
        assert_eq!(tsig::verify(&bytes, &rec, &t, &key.key, 1_700_000_000 + 301), Err(tsig::Failure::BadTime));
        // Another key gives another MAC.
        let other = TsigKey::new(Name::from_str("sdns-update.").unwrap(), vec![8u8; 32]).unwrap();
        let bytes2 = other.sign(&mut back.clone(), 1_700_000_000).unwrap();
        assert_ne!(&bytes2[bytes2.len() - 38..bytes2.len() - 6], expected.as_ref());
        assert!(TsigKey::new(key.name.clone(), Vec::new()).is_err());
    }
}
