//! The question the execution core asks before it forwards an ordered write to named.
//!
//! The answer must be a function of the message and the batch's agreed time only, so
//! that every honest replica decides alike (the update-authentication module supplies
//! the real gate; [`Unchanged`] is the pass-through).

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
