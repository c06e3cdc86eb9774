//! The payload of one ordered request.
//!
//! Every replica decodes and re-classifies the payload itself on delivery: a lying
//! gateway cannot make a write look like a read (which only it would execute).

use serde::{Deserialize, Serialize};

use crate::authority::{SignFinishAuth, SignZoneAuth, ZoneSetChange};
use crate::codec::{self, CodecError};

// 2: sign-zone requests carry their replica's signature.
// 3: finish claims too.
const VERSION: u8 = 3;
/// A DNS message over TCP is at most 65535 bytes; leave room for the envelope.
pub const MAX_ENVELOPE_BYTES: usize = 65_535 + 64;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// A client's DNS message, byte for byte as received.
    Dns { tcp: bool, message: Vec<u8> },
    /// The paper's special command (Section 4.3): sign the whole zone with the
    /// distributed key, on every replica at this point of the log. Carries the asking
    /// replica's signature: it counts toward the t+1 needed only for the replica whose
    /// key signed it (`crate::authority`).
    SignZone(SignZoneAuth),
    /// Maintenance: sign the zone again if, by the batch's agreed time, the last signing
    /// is at least `resign_after` old. Any replica may submit it when its own clock says
    /// so; the decision is made on agreed values, so every replica makes the same one and
    /// duplicates are no-ops.
    Resign,
    /// The sender's own part of the running background whole-zone signing is done; once
    /// t+1 replicas said so, every replica installs its signed zone at that point of the
    /// log (waiting for its own part if need be). Ignored when no signing runs. Carries
    /// the replica's signature over the run's seq: it counts only for the replica whose
    /// key signed it, and only for that run (`crate::authority`).
    SignZoneFinish(SignFinishAuth),
    // Appended variants keep the encoding of the ones above: a single-zone cluster sends
    // only those (zone 0), and its replicas of this version and the last decode each other.
    /// [`Op::SignZone`] for zone `zone` (an index into the configured zones).
    SignZoneIn { zone: u16, auth: SignZoneAuth },
    /// [`Op::Resign`] for zone `zone`.
    ResignZone(u16),
    /// [`Op::SignZoneFinish`] for zone `zone`.
    SignZoneFinishIn { zone: u16, auth: SignFinishAuth },
    /// The sender's executor has waited longer than its local bound for named's answer to
    /// write `index` of batch `seq`. Once claims from `faults + 1` distinct origins for the
    /// same write are committed, every replica that has not executed it abandons it
    /// (`crate::core`, docs/DETERMINISM.md "Abandoned writes"). Only the ordering's
    /// authenticated origin counts, so f Byzantine replicas alone cannot make up the f+1.
    Stuck { seq: u64, index: u32 },
    /// The sender saw the parent's DS for zone `zone` cover the zone's threshold key (it
    /// asked its configured resolvers): once reports from t+1 distinct replicas are ordered,
    /// the adopted zone's double-KSK rollover finishes at that point of the log on every
    /// replica (`crate::core`). Signed with the sender's identity key like a sign-zone
    /// request (`crate::authority::rollover_signed_bytes`): it counts only for that replica.
    RolloverReport { zone: u16, auth: SignZoneAuth },
    /// The sender asks for a change of the zone set (`sdns zone add|remove`): once requests
    /// for the same change from t+1 distinct replicas are ordered, the zone is added or
    /// removed at that point of the log on every replica (`crate::core`). Signed with the
    /// sender's identity key over the change (`crate::authority::zone_set_signed_bytes`).
    ZoneSet { change: ZoneSetChange, auth: SignZoneAuth },
}

/// postcard's tag of [`Op::Stuck`] (its variant index), the byte after the version: lets the
/// executor find claims among committed requests without decoding every DNS message.
const STUCK_TAG: u8 = 7;

impl Op {
    /// A sign-zone request for zone `zone` (zone 0 in its original form).
    pub fn sign_zone(zone: u16, auth: SignZoneAuth) -> Op {
        if zone == 0 {
            Op::SignZone(auth)
        } else {
            Op::SignZoneIn { zone, auth }
        }
    }

    /// A re-signing request for zone `zone`.
    pub fn resign(zone: u16) -> Op {
        if zone == 0 {
            Op::Resign
        } else {
            Op::ResignZone(zone)
        }
    }

    /// A finish claim for zone `zone`.
    pub fn sign_zone_finish(zone: u16, auth: SignFinishAuth) -> Op {
        if zone == 0 {
            Op::SignZoneFinish(auth)
        } else {
            Op::SignZoneFinishIn { zone, auth }
        }
    }

    /// The write a [`Op::Stuck`] claim names, if `bytes` are one.
    pub fn stuck_claim(bytes: &[u8]) -> Option<(u64, u32)> {
        if bytes.get(1) != Some(&STUCK_TAG) {
            return None;
        }
        match Op::decode(bytes) {
            Ok(Op::Stuck { seq, index }) => Some((seq, index)),
            _ => None,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        codec::encode(VERSION, self)
    }

    pub fn decode(bytes: &[u8]) -> Result<Op, CodecError> {
        codec::decode("request payload", VERSION, MAX_ENVELOPE_BYTES, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let auth = SignZoneAuth { replica: 1, stamp_us: 7, cert: vec![1; 9], signature: vec![2; 70] };
        let finish = SignFinishAuth { replica: 2, run_seq: 9, cert: vec![3; 9], signature: vec![4; 70] };
        // Zone 0's requests keep the encoding of the version before several zones.
        assert_eq!(Op::sign_zone(0, auth.clone()), Op::SignZone(auth.clone()));
        assert_eq!(Op::resign(0).encode(), vec![VERSION, 2]);
        for op in [
            Op::Dns { tcp: true, message: vec![1, 2, 3] },
            Op::SignZone(auth.clone()),
            Op::Resign,
            Op::SignZoneFinish(finish.clone()),
            Op::sign_zone(1, auth),
            Op::resign(2),
            Op::sign_zone_finish(1, finish),
            Op::Stuck { seq: 300, index: 2 },
            Op::RolloverReport { zone: 1, auth: SignZoneAuth { replica: 3, stamp_us: 8, cert: vec![5; 9], signature: vec![6; 70] } },
            Op::ZoneSet {
                change: ZoneSetChange::new(crate::authority::ZoneSetAction::Add, "new.test", [1; 32]),
                auth: SignZoneAuth { replica: 0, stamp_us: 9, cert: vec![7; 9], signature: vec![8; 70] },
            },
        ] {
            assert_eq!(Op::decode(&op.encode()), Ok(op));
        }
        // Claims are found by their tag; nothing else carries it.
        assert_eq!(Op::stuck_claim(&Op::Stuck { seq: 300, index: 2 }.encode()), Some((300, 2)));
        assert_eq!(Op::stuck_claim(&Op::Stuck { seq: u64::MAX, index: u32::MAX }.encode()), Some((u64::MAX, u32::MAX)));
        assert_eq!(Op::stuck_claim(&Op::Dns { tcp: true, message: vec![7; 12] }.encode()), None);
        assert_eq!(Op::stuck_claim(&Op::resign(7).encode()), None);
        assert_eq!(Op::stuck_claim(&[VERSION, STUCK_TAG, 0xff]), None);
        assert!(matches!(Op::decode(&[]), Err(CodecError::Empty { .. })));
        assert!(matches!(Op::decode(&[9, 0]), Err(CodecError::Version { got: 9, .. })));
        assert!(matches!(Op::decode(&[VERSION, 0, 1]), Err(CodecError::Decode { .. })));
        assert!(matches!(Op::decode(&vec![VERSION; MAX_ENVELOPE_BYTES + 1]), Err(CodecError::TooLarge { .. })));
    }
}
