//! What other replicas (or a lying gateway) can send: signing messages and ordered
//! request payloads. Decoding never panics; what decodes re-encodes and decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wrapper::envelope::Op;
use wrapper::signing::{SignMessage, WireFormat};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = SignMessage::decode(data) {
        assert_eq!(SignMessage::decode(&m.encode()).as_ref(), Ok(&m));
    }
    if let Ok(op) = Op::decode(data) {
        assert_eq!(Op::decode(&op.encode()).as_ref(), Ok(&op));
    }
});
