//! The question the execution core asks before it forwards an ordered write to named.
//!
//! The answer must be a function of the message and the batch's agreed time only, so
//! that every honest replica decides alike (the update-authentication module supplies
//! the real gate; [`Unchanged`] is the pass-through).

use dnswire::layout::{self, HEADER_LEN, TYPE_SIG};
use dnswire::tsig;
use sha2::{Digest as _, Sha256};

/// The largest message named can take: TCP's two-byte length (RFC 1035 4.2.2).
pub const MAX_FORWARD: usize = dnswire::framing::MAX_MESSAGE;

/// Whether named can be sent these bytes as they are: a header at least, and no longer
/// than TCP framing allows. Bytes that are not are refused by the core (FORMERR, the same
/// at every replica) instead of being sent to named, which could never take them.
pub fn forwardable(bytes: &[u8]) -> bool {
    (HEADER_LEN..=MAX_FORWARD).contains(&bytes.len())
}

/// What identifies a signed write against its replay: a digest of what its signature
/// covers (not of its bytes: a TSIG'd update replayed under another header id, or with its
/// MAC truncated, or a SIG(0) whose ECDSA signature was re-encoded, is the same write), and
/// the agreed times (s) at which it can verify: a copy ordered then is not executed again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayKey {
    pub digest: [u8; 32],
    pub from_s: u64,
    pub until_s: u64,
}

/// The replay key of a TSIG or SIG(0) signed message, read from its signature record
/// without checking the signature (the gate's `decide` does that; the core remembers a key
/// only once the write was forwarded, so an unverifiable copy cannot take a key first).
/// `None`: unsigned or unreadable.
pub fn replay_key(message: &[u8]) -> Option<ReplayKey> {
    let l = layout::layout(message).ok()?;
    let rec = l.signature?;
    let mut h = Sha256::new();
    if rec.rtype == layout::TYPE_TSIG {
        let t = tsig::Tsig::parse(message, &rec).ok()?;
        // RFC 8945 4.3.3: the MAC covers the message with its original id, and the TSIG
        // variables (key, algorithm, time, fudge, error, other): not the header id.
        h.update(b"tsig");
        h.update(tsig::strip(message, rec.start, t.original_id));
        h.update(t.key_name.to_ascii_lowercase());
        h.update(t.algorithm.to_ascii_lowercase());
        h.update(t.time_signed.to_be_bytes());
        h.update(t.fudge.to_be_bytes());
        h.update(t.error.to_be_bytes());
        h.update(&t.other);
        let fudge = u64::from(t.fudge);
        return Some(ReplayKey { digest: h.finalize().into(), from_s: t.time_signed.saturating_sub(fudge), until_s: t.time_signed.saturating_add(fudge) });
    }
    if rec.rtype != TYPE_SIG {
        return None;
    }
    // RFC 2931 3.1: the SIG rdata less the signature, then the message before the SIG(0)
    // (its header id included, ARCOUNT one less). Fixed part of 18 bytes, then the signer's
    // name, uncompressed.
    let rdata = message.get(rec.rdata..rec.rdata + rec.rdlen)?;
    let fixed = rdata.get(..18)?;
    let expiration = u32::from_be_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]);
    let inception = u32::from_be_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]);
    let mut at = 18;
    loop {
        let len = usize::from(*rdata.get(at)?);
        at += 1 + len;
        if len == 0 {
            break;
        }
        if len & 0xc0 != 0 || at - 18 > 255 {
            return None;
        }
    }
    h.update(b"sig0");
    h.update(rdata.get(..at)?.to_ascii_lowercase());
    let mut header = message.get(..HEADER_LEN)?.to_vec();
    let ar = layout::u16_at(&header, 10)?.saturating_sub(1);
    header[10..12].copy_from_slice(&ar.to_be_bytes());
    h.update(&header);
    h.update(message.get(HEADER_LEN..rec.start)?);
    Some(ReplayKey { digest: h.finalize().into(), from_s: u64::from(inception), until_s: u64::from(expiration) })
}

/// What to do with one ordered write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateDecision {
    /// Forward these bytes to named (auth re-signs them with a replica-local key).
    Forward(Vec<u8>),
    /// Do not forward; every replica records `rcode`; the gateway sends `answer` to its client.
    Refuse { rcode: u16, answer: Vec<u8> },
}

pub trait UpdateGate: Send + Sync {
    /// Decided from the message and the batch's agreed time only (deterministic).
    fn decide(&self, message: &[u8], agreed_time_s: u64) -> UpdateDecision;
    /// What the client gets back, given the request and named's answer to the forwarded bytes.
    fn answer_for_client(&self, request: &[u8], named_answer: &[u8]) -> Vec<u8>;
    /// The answer with `rcode` to a write the core answers without named (a refusal of bytes
    /// named cannot take, or a retransmission's recorded outcome whose first answer this
    /// replica no longer holds): from the request and the agreed time only, signed for the
    /// client where named would sign.
    fn answer_without_named(&self, request: &[u8], rcode: u16, _agreed_time_s: u64) -> Vec<u8> {
        u8::try_from(rcode).ok().and_then(|r| crate::answer::error_answer(request, r)).unwrap_or_default()
    }
}

/// Forwards every write byte for byte and hands named's answer back as it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unchanged;

impl UpdateGate for Unchanged {
    fn decide(&self, message: &[u8], _agreed_time_s: u64) -> UpdateDecision {
        UpdateDecision::Forward(message.to_vec())
    }

    fn answer_for_client(&self, _request: &[u8], named_answer: &[u8]) -> Vec<u8> {
        named_answer.to_vec()
    }
}

/// A shared gate (the replica holds one for its whole life).
impl<T: UpdateGate + ?Sized> UpdateGate for std::sync::Arc<T> {
    fn decide(&self, message: &[u8], agreed_time_s: u64) -> UpdateDecision {
        (**self).decide(message, agreed_time_s)
    }

    fn answer_for_client(&self, request: &[u8], named_answer: &[u8]) -> Vec<u8> {
        (**self).answer_for_client(request, named_answer)
    }

    fn answer_without_named(&self, request: &[u8], rcode: u16, agreed_time_s: u64) -> Vec<u8> {
        (**self).answer_without_named(request, rcode, agreed_time_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchanged_passes_bytes_through() {
        let g = Unchanged;
        assert_eq!(g.decide(b"update bytes", 7), UpdateDecision::Forward(b"update bytes".to_vec()));
        assert_eq!(g.answer_for_client(b"update bytes", b"named's answer"), b"named's answer".to_vec());
    }
}
