//! What other replicas (or a lying gateway) can send: signing messages and ordered
//! request payloads. Decoding never panics; what decodes re-encodes and decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use exec::envelope::Op;
use wrapper::signing::{SignEnvelope, WireFormat};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = SignEnvelope::decode(data) {
        assert_eq!(SignEnvelope::decode(&m.encode()).as_ref(), Ok(&m));
    }
    if let Ok(op) = Op::decode(data) {
        assert_eq!(Op::decode(&op.encode()).as_ref(), Ok(&op));
    }
});
