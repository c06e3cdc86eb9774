//! Decodes arbitrary bytes as a bft `Message`: must never panic, and whatever is accepted must
//! re-encode to exactly the input (one encoding per message).
#![no_main]

use bft::{Limits, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_message_bytes: 1 << 20, max_entries: 512 };
    if let Ok(message) = Message::decode(data, limits) {
        assert_eq!(message.encode(), data);
        let _ = message.sender();
    }
});
