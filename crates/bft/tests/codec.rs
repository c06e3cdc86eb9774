//! Wire codec: round trips, strictness, and no panic on arbitrary or mutated bytes.

use bft::{
    CheckpointClaim, DecodeError, Limits, Message, NewView, PrePreparedEntry, PreparedEntry, Proposal, Request, StatusReport, Time, ViewChange, WIRE_VERSION,
};
use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn proposal() -> Proposal {
    Proposal {
        time: Time(1_700_000_000_123_456),
        requests: vec![
            Request { origin: 1, client: 7, number: 300, payload: b"update example.com".to_vec() },
            Request { origin: 3, client: u64::MAX, number: 0, payload: Vec::new() },
        ],
    }
}

fn claim(seq: u64) -> CheckpointClaim {
    CheckpointClaim { seq, time: Time(seq * 1000), log_digest: [!(seq as u8); 32], state_digest: [seq as u8; 32] }
}

fn samples() -> Vec<Message> {
    let view_change = ViewChange {
        sender: 2,
        view: 5,
        stable: claim(64),
        checkpoints: vec![claim(128)],
        prepared: vec![PreparedEntry { seq: 65, view: 4, proposal: proposal() }],
        pre_prepared: vec![PrePreparedEntry { seq: 65, view: 4, digest: [9; 32] }],
    };
    vec![
        Message::Request { sender: 1, request: proposal().requests[0].clone() },
        Message::PrePrepare { sender: 0, view: 0, seq: 1, proposal: proposal() },
        Message::Prepare { sender: 1, view: 3, seq: 1 << 40, digest: [1; 32] },
        Message::Commit { sender: 65535, view: u64::MAX, seq: 2, digest: [2; 32] },
        Message::Checkpoint { sender: 3, checkpoint: claim(64) },
        Message::ViewChange(view_change),
        Message::NewView {
            sender: 1,
            new_view: NewView {
                view: 5,
                view_changes: vec![(0, [3; 32]), (2, [4; 32]), (3, [5; 32])],
                checkpoint: claim(64),
                proposals: vec![(65, proposal()), (66, Proposal::null())],
            },
        },
        Message::Status(StatusReport { sender: 2, view: 9, view_changing: true, last_delivered: 100, stable_seq: 64, oldest_retained: 1 }),
        Message::Committed { sender: 0, seq: 12, proposal: proposal() },
    ]
}

#[test]
fn every_message_round_trips() {
    for message in samples() {
        let bytes = message.encode();
        assert_eq!(bytes[0], WIRE_VERSION);
        let decoded = Message::decode(&bytes, Limits::default()).expect("valid encoding");
        assert_eq!(decoded, message);
        assert_eq!(decoded.sender(), message.sender());
    }
}

#[test]
fn truncations_and_extensions_are_errors() {
    for message in samples() {
        let bytes = message.encode();
        for cut in 0..bytes.len() {
            assert!(Message::decode(&bytes[..cut], Limits::default()).is_err(), "{} cut at {cut}", message.kind());
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Message::decode(&longer, Limits::default()), Err(DecodeError::Trailing(1)));
    }
}

#[test]
fn limits_are_enforced_before_allocation() {
    let bytes = Message::PrePrepare { sender: 0, view: 0, seq: 1, proposal: proposal() }.encode();
    let small = Limits { max_message_bytes: bytes.len() - 1, max_entries: 16 };
    assert!(matches!(Message::decode(&bytes, small), Err(DecodeError::TooLarge { .. })));
    // A pre-prepare claiming u64::MAX requests in a few bytes.
    let mut forged = vec![WIRE_VERSION, 2, 0, 0, 1, 5];
    forged.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    assert_eq!(Message::decode(&forged, Limits::default()), Err(DecodeError::Truncated("requests")));
    // A view change with more prepared entries than the limit allows.
    let mut view_change = match samples().remove(5) {
        Message::ViewChange(view_change) => view_change,
        _ => unreachable!(),
    };
    view_change.prepared = (1..=20).map(|seq| PreparedEntry { seq, view: 0, proposal: Proposal::null() }).collect();
    let bytes = Message::ViewChange(view_change).encode();
    let tight = Limits { max_message_bytes: 1 << 20, max_entries: 10 };
    assert!(matches!(Message::decode(&bytes, tight), Err(DecodeError::TooMany { field: "prepared", .. })));
}

#[test]
fn wrong_version_unknown_tag_and_bad_varints_are_refused() {
    assert_eq!(Message::decode(&[], Limits::default()), Err(DecodeError::Truncated("version")));
    assert_eq!(Message::decode(&[WIRE_VERSION + 1, 2], Limits::default()), Err(DecodeError::Version(WIRE_VERSION + 1)));
    assert_eq!(Message::decode(&[WIRE_VERSION, 200], Limits::default()), Err(DecodeError::UnknownTag(200)));
    // Non-canonical sender varint (0x80 0x00 encodes 0 in two bytes).
    let mut bytes = vec![WIRE_VERSION, 3, 0x80, 0x00, 0, 0];
    bytes.extend_from_slice(&[0; 32]);
    assert_eq!(Message::decode(&bytes, Limits::default()), Err(DecodeError::Varint("sender")));
    // Sender beyond u16.
    let mut bytes = vec![WIRE_VERSION, 3, 0x80, 0x80, 0x04, 0, 0];
    bytes.extend_from_slice(&[0; 32]);
    assert!(matches!(Message::decode(&bytes, Limits::default()), Err(DecodeError::OutOfRange { field: "sender", .. })));
    // Eleven-byte varint.
    let bytes = [WIRE_VERSION, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
    assert!(Message::decode(&bytes, Limits::default()).is_err());
}

/// Arbitrary bytes and mutated valid encodings never panic and re-encode to themselves when accepted.
#[test]
fn arbitrary_bytes_never_panic() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    let valid: Vec<Vec<u8>> = samples().iter().map(Message::encode).collect();
    let limits = Limits { max_message_bytes: 4096, max_entries: 64 };
    for round in 0..200_000u32 {
        let mut bytes = if round % 2 == 0 {
            let length = (rng.next_u64() % 96) as usize;
            let mut bytes: Vec<u8> = (0..length).map(|_| rng.next_u64() as u8).collect();
            if let Some(first) = bytes.first_mut() {
                *first = WIRE_VERSION;
            }
            if bytes.len() > 1 {
                bytes[1] = (rng.next_u64() % 13) as u8;
            }
            bytes
        } else {
            valid[(rng.next_u64() % valid.len() as u64) as usize].clone()
        };
        for _ in 0..(rng.next_u64() % 4) {
            if bytes.is_empty() {
                break;
            }
            let index = (rng.next_u64() % bytes.len() as u64) as usize;
            bytes[index] = rng.next_u64() as u8;
        }
        if let Ok(message) = Message::decode(&bytes, limits) {
            assert_eq!(message.encode(), bytes, "accepted bytes must be the canonical encoding");
        }
    }
}

/// The tags of the read probes and vouches the core once carried (10, 11; vouched reads
/// travel on the mesh's reads channel now) are no messages, and the other kinds keep their
/// tags and encodings.
#[test]
fn old_read_tags_are_unknown() {
    let limits = Limits::default();
    for tag in [10u8, 11] {
        assert_eq!(Message::decode(&[WIRE_VERSION, tag, 1, 0], limits), Err(DecodeError::UnknownTag(tag)));
    }
    assert_eq!(Message::Prepare { sender: 1, view: 0, seq: 1, digest: [0; 32] }.encode()[..5], [WIRE_VERSION, 3, 1, 0, 1]);
    assert_eq!(Message::Committed { sender: 0, seq: 12, proposal: Proposal::null() }.encode(), vec![WIRE_VERSION, 9, 0, 12, 0, 0]);
}
