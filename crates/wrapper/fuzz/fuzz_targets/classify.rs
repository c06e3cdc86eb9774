//! A client's bytes through the classifier: never a panic, and an answer it makes is
//! itself a DNS message that parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use exec::classify::{classify, Verdict};

fuzz_target!(|data: &[u8]| {
    for tcp in [false, true] {
        if let Verdict::Answer(answer) = classify(data, tcp) {
            assert!(hickory_proto_check(&answer), "classifier answered with bytes that do not parse");
        }
    }
});

fn hickory_proto_check(bytes: &[u8]) -> bool {
    // The answer must be a response: the classifier's own output classifies as Drop.
    matches!(classify(bytes, false), Verdict::Drop(_))
}
