//! Who asked for a whole-zone signing, proven end to end.
//!
//! The ordering delivers every request with an origin, but a primary builds its batches
//! itself and could put in requests that claim any replica as their origin. So a
//! sign-zone request carries its replica's signature, made with the identity key of that
//! replica's mesh certificate (the certificate travels with the request), over
//! (label, zone, replica, stamp). Every replica checks it at execution against the cluster
//! CA and the batch's agreed time only, so all decide alike, and a request counts for the
//! replica whose key signed it, never for the one it claims. The stamp (the signer's
//! clock, made strictly increasing) bounds how long a signed request counts and makes
//! each one count at most once (`ZoneExec::sign_zone_stamps`, per zone).
//!
//! A replica's claim that its part of a running background signing is done
//! (`Op::SignZoneFinish`) is bound to its origin the same way: signed with its identity
//! key over (label, zone, replica, the run's beginning seq), so a Byzantine primary cannot
//! order t+1 finish claims that no replica made. The run's seq makes a claim count for
//! that run only; within the run a replayed claim is still true (counted once, as a set).

use std::sync::Mutex;

use mesh::pki;
use serde::{Deserialize, Serialize};

const LABEL: &[u8] = b"sdns sign-zone request v1\0";
const FINISH_LABEL: &[u8] = b"sdns sign-zone finish v1\0";
const ROLLOVER_LABEL: &[u8] = b"sdns rollover parent-ds report v1\0";
const ZONE_SET_LABEL: &[u8] = b"sdns zone-set change v1\0";

/// What a zone-set change does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ZoneSetAction {
    Add,
    Remove,
}

/// A change of the cluster's zone set that replicas ask for (`crate::envelope::Op::ZoneSet`):
/// requests count together only when all three fields are equal, so t+1 replicas must agree
/// on the zone and on the key it is served with.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ZoneSetChange {
    pub action: ZoneSetAction,
    /// The zone, absolute and in lower case ([`ZoneSetChange::new`] makes it so).
    pub name: String,
    /// SHA-256 of the zone's dealt public key (the replica's `zone.pub.json`); zeros for a
    /// removal, which names the zone only.
    pub key_digest: [u8; 32],
}

impl ZoneSetChange {
    pub fn new(action: ZoneSetAction, name: &str, key_digest: [u8; 32]) -> Self {
        let key_digest = if action == ZoneSetAction::Remove { [0; 32] } else { key_digest };
        ZoneSetChange { action, name: canonical_zone(name), key_digest }
    }
}

/// What a zone-set request's signature covers: the action, the zone's name as given (the
/// executing core compares it canonically), the key digest, the replica and its stamp.
pub fn zone_set_signed_bytes(change: &ZoneSetChange, replica: u16, stamp_us: u64) -> Vec<u8> {
    let mut m = claim_bytes(ZONE_SET_LABEL, &change.name, replica, stamp_us);
    m.push(match change.action {
        ZoneSetAction::Add => 1,
        ZoneSetAction::Remove => 2,
    });
    m.extend_from_slice(&change.key_digest);
    m
}

/// The authenticator of one replica's sign-zone request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignZoneAuth {
    /// The replica that asks (must be the one whose certificate follows).
    pub replica: u16,
    /// The asking replica's clock when it signed (µs since the epoch), strictly
    /// increasing per replica.
    pub stamp_us: u64,
    /// That replica's mesh certificate (DER).
    pub cert: Vec<u8>,
    /// ECDSA P-256 SHA-256 over [`signed_bytes`].
    pub signature: Vec<u8>,
}

/// The authenticator of one replica's claim that its part of the background signing that
/// began at `run_seq` is done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignFinishAuth {
    /// The replica whose part is done (must be the one whose certificate follows).
    pub replica: u16,
    /// The seq of the batch where the signing began (`SigningRun::seq`).
    pub run_seq: u64,
    /// That replica's mesh certificate (DER).
    pub cert: Vec<u8>,
    /// ECDSA P-256 SHA-256 over [`finish_signed_bytes`].
    pub signature: Vec<u8>,
}

/// What a sign-zone signature covers. The zone name is compared case-insensitively.
pub fn signed_bytes(zone: &str, replica: u16, stamp_us: u64) -> Vec<u8> {
    claim_bytes(LABEL, zone, replica, stamp_us)
}

/// What a finish claim's signature covers (another label: a sign-zone signature is never
/// a finish claim, whatever its stamp).
pub fn finish_signed_bytes(zone: &str, replica: u16, run_seq: u64) -> Vec<u8> {
    claim_bytes(FINISH_LABEL, zone, replica, run_seq)
}

/// What a rollover report's signature covers: replica `replica` saw, at its clock's
/// `stamp_us`, the parent's DS for `zone` cover the threshold key (`crate::core`). Another
/// label: neither a sign-zone request nor a finish claim is a report, whatever its numbers.
pub fn rollover_signed_bytes(zone: &str, replica: u16, stamp_us: u64) -> Vec<u8> {
    claim_bytes(ROLLOVER_LABEL, zone, replica, stamp_us)
}

fn claim_bytes(label: &[u8], zone: &str, replica: u16, value: u64) -> Vec<u8> {
    let zone = canonical_zone(zone);
    let mut m = Vec::with_capacity(label.len() + zone.len() + 12);
    m.extend_from_slice(label);
    m.extend_from_slice(&(zone.len() as u16).to_be_bytes());
    m.extend_from_slice(zone.as_bytes());
    m.extend_from_slice(&replica.to_be_bytes());
    m.extend_from_slice(&value.to_be_bytes());
    m
}

fn canonical_zone(zone: &str) -> String {
    crate::names::absolute_name(zone)
}

/// The check every replica runs at execution: deterministic, no clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignZoneVerifier {
    zone: String,
    ca_der: Vec<u8>,
}

impl SignZoneVerifier {
    pub fn new(zone: &str, ca_der: Vec<u8>) -> Self {
        SignZoneVerifier { zone: canonical_zone(zone), ca_der }
    }

    /// The zone this verifier checks requests for (absolute, lower case).
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// A verifier for another zone of the same cluster (a zone added at run time).
    pub fn for_zone(&self, zone: &str) -> Self {
        SignZoneVerifier::new(zone, self.ca_der.clone())
    }

    /// The replica a zone-set request proves, judged at agreed time `time_s`. The cluster's
    /// CA decides; the zone this verifier was made for plays no part.
    pub fn verify_zone_set(&self, change: &ZoneSetChange, auth: &SignZoneAuth, time_s: u64) -> Result<u16, String> {
        let msg = zone_set_signed_bytes(change, auth.replica, auth.stamp_us);
        let signer = pki::verify_replica_signature(&self.ca_der, &auth.cert, time_s, &msg, &auth.signature).map_err(|e| e.to_string())?;
        if signer != auth.replica {
            return Err(format!("signed with replica {signer}'s certificate, claims replica {}", auth.replica));
        }
        Ok(signer)
    }

    /// The replica `auth` proves, judged at agreed time `time_s`.
    pub fn verify(&self, auth: &SignZoneAuth, time_s: u64) -> Result<u16, String> {
        let msg = signed_bytes(&self.zone, auth.replica, auth.stamp_us);
        let signer = pki::verify_replica_signature(&self.ca_der, &auth.cert, time_s, &msg, &auth.signature).map_err(|e| e.to_string())?;
        if signer != auth.replica {
            return Err(format!("signed with replica {signer}'s certificate, claims replica {}", auth.replica));
        }
        Ok(signer)
    }

    /// The replica a rollover report proves (the same authenticator as a sign-zone
    /// request's, over [`rollover_signed_bytes`]), judged at agreed time `time_s`.
    pub fn verify_rollover(&self, auth: &SignZoneAuth, time_s: u64) -> Result<u16, String> {
        let msg = rollover_signed_bytes(&self.zone, auth.replica, auth.stamp_us);
        let signer = pki::verify_replica_signature(&self.ca_der, &auth.cert, time_s, &msg, &auth.signature).map_err(|e| e.to_string())?;
        if signer != auth.replica {
            return Err(format!("signed with replica {signer}'s certificate, claims replica {}", auth.replica));
        }
        Ok(signer)
    }

    /// The replica a finish claim proves, judged at agreed time `time_s`.
    pub fn verify_finish(&self, auth: &SignFinishAuth, time_s: u64) -> Result<u16, String> {
        let msg = finish_signed_bytes(&self.zone, auth.replica, auth.run_seq);
        let signer = pki::verify_replica_signature(&self.ca_der, &auth.cert, time_s, &msg, &auth.signature).map_err(|e| e.to_string())?;
        if signer != auth.replica {
            return Err(format!("signed with replica {signer}'s certificate, claims replica {}", auth.replica));
        }
        Ok(signer)
    }
}

/// A replica's own signing side (the admin route uses it). Holds the identity key.
pub struct SignZoneSigner {
    id: u16,
    zone: String,
    cert: Vec<u8>,
    key_pem: String,
    last_stamp: Mutex<u64>,
}

// The key must not end up in logs through a stray `{:?}`.
impl std::fmt::Debug for SignZoneSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignZoneSigner").field("id", &self.id).field("key_pem", &"<redacted>").finish_non_exhaustive()
    }
}

impl SignZoneSigner {
    /// `cert_pem` and `key_pem`: this replica's mesh certificate and key.
    pub fn new(id: u16, zone: &str, cert_pem: &str, key_pem: String) -> Result<Self, String> {
        let cert = pki::cert_der_from_pem(cert_pem).map_err(|e| e.to_string())?;
        Ok(SignZoneSigner { id, zone: canonical_zone(zone), cert, key_pem, last_stamp: Mutex::new(0) })
    }

    /// A fresh authenticator stamped with the local clock, `now_us` (µs since the epoch, read
    /// by the caller), never below the last one.
    pub fn sign(&self, now_us: u64) -> Result<SignZoneAuth, String> {
        let now = now_us;
        let stamp_us = {
            let mut last = self.last_stamp.lock().unwrap_or_else(|p| p.into_inner());
            *last = now.max(last.saturating_add(1));
            *last
        };
        self.sign_at(stamp_us)
    }

    /// An authenticator with a given stamp (tests, and [`Self::sign`]).
    pub fn sign_at(&self, stamp_us: u64) -> Result<SignZoneAuth, String> {
        let msg = signed_bytes(&self.zone, self.id, stamp_us);
        let signature = pki::sign_as_replica(&self.key_pem, &msg).map_err(|e| e.to_string())?;
        Ok(SignZoneAuth { replica: self.id, stamp_us, cert: self.cert.clone(), signature })
    }

    /// This replica's report that the parent's DS covers the threshold key, stamped like a
    /// sign-zone request (strictly increasing with [`Self::sign`]'s stamps).
    pub fn sign_rollover(&self, now_us: u64) -> Result<SignZoneAuth, String> {
        let stamp_us = {
            let mut last = self.last_stamp.lock().unwrap_or_else(|p| p.into_inner());
            *last = now_us.max(last.saturating_add(1));
            *last
        };
        self.sign_rollover_at(stamp_us)
    }

    /// A rollover report with a given stamp (tests, and [`Self::sign_rollover`]).
    pub fn sign_rollover_at(&self, stamp_us: u64) -> Result<SignZoneAuth, String> {
        let msg = rollover_signed_bytes(&self.zone, self.id, stamp_us);
        let signature = pki::sign_as_replica(&self.key_pem, &msg).map_err(|e| e.to_string())?;
        Ok(SignZoneAuth { replica: self.id, stamp_us, cert: self.cert.clone(), signature })
    }

    /// This replica's request for a zone-set change, stamped like a sign-zone request
    /// (strictly increasing with [`Self::sign`]'s stamps).
    pub fn sign_zone_set(&self, change: &ZoneSetChange, now_us: u64) -> Result<SignZoneAuth, String> {
        let stamp_us = {
            let mut last = self.last_stamp.lock().unwrap_or_else(|p| p.into_inner());
            *last = now_us.max(last.saturating_add(1));
            *last
        };
        self.sign_zone_set_at(change, stamp_us)
    }

    /// A zone-set request with a given stamp (tests, and [`Self::sign_zone_set`]).
    pub fn sign_zone_set_at(&self, change: &ZoneSetChange, stamp_us: u64) -> Result<SignZoneAuth, String> {
        let msg = zone_set_signed_bytes(change, self.id, stamp_us);
        let signature = pki::sign_as_replica(&self.key_pem, &msg).map_err(|e| e.to_string())?;
        Ok(SignZoneAuth { replica: self.id, stamp_us, cert: self.cert.clone(), signature })
    }

    /// This replica's claim that its part of the signing begun at `run_seq` is done.
    pub fn sign_finish(&self, run_seq: u64) -> Result<SignFinishAuth, String> {
        let msg = finish_signed_bytes(&self.zone, self.id, run_seq);
        let signature = pki::sign_as_replica(&self.key_pem, &msg).map_err(|e| e.to_string())?;
        Ok(SignFinishAuth { replica: self.id, run_seq, cert: self.cert.clone(), signature })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_binds_zone_replica_and_stamp() {
        let ca = pki::generate_ca("t").unwrap();
        let ca_der = pki::cert_der_from_pem(&ca.cert_pem).unwrap();
        let r2 = pki::issue_replica_cert(&ca, 2).unwrap();
        let signer = SignZoneSigner::new(2, "Example.TEST", &r2.cert_pem, r2.key_pem.clone()).unwrap();
        let v = SignZoneVerifier::new("example.test.", ca_der.clone());
        let t = 1_800_000_000;
        let a = signer.sign_at(t * 1_000_000).unwrap();
        assert_eq!(v.verify(&a, t), Ok(2));
        assert!(!format!("{signer:?}").contains("PRIVATE"));
        // Any field changed: no longer valid.
        assert!(v.verify(&SignZoneAuth { stamp_us: a.stamp_us + 1, ..a.clone() }, t).is_err());
        assert!(v.verify(&SignZoneAuth { replica: 1, ..a.clone() }, t).is_err());
        assert!(SignZoneVerifier::new("other.test", ca_der).verify(&a, t).is_err());
        // Stamps from one signer strictly increase, even at the same clock reading.
        let now_us = t * 1_000_000;
        let (x, y) = (signer.sign(now_us).unwrap(), signer.sign(now_us).unwrap());
        assert!(y.stamp_us > x.stamp_us);
    }

    #[test]
    fn a_finish_claim_binds_zone_replica_and_run() {
        let ca = pki::generate_ca("t").unwrap();
        let ca_der = pki::cert_der_from_pem(&ca.cert_pem).unwrap();
        let r1 = pki::issue_replica_cert(&ca, 1).unwrap();
        let r2 = pki::issue_replica_cert(&ca, 2).unwrap();
        let signer = SignZoneSigner::new(1, "example.test", &r1.cert_pem, r1.key_pem.clone()).unwrap();
        let v = SignZoneVerifier::new("example.test.", ca_der.clone());
        let t = 1_800_000_000;
        let a = signer.sign_finish(42).unwrap();
        assert_eq!(v.verify_finish(&a, t), Ok(1));
        // Another run, another replica, another zone: no longer valid.
        assert!(v.verify_finish(&SignFinishAuth { run_seq: 43, ..a.clone() }, t).is_err());
        assert!(v.verify_finish(&SignFinishAuth { replica: 2, ..a.clone() }, t).is_err());
        assert!(SignZoneVerifier::new("other.test", ca_der).verify_finish(&a, t).is_err());
        // Replica 2's certificate with replica 1's signature, or claiming replica 2.
        let r2_cert = pki::cert_der_from_pem(&r2.cert_pem).unwrap();
        assert!(v.verify_finish(&SignFinishAuth { cert: r2_cert.clone(), ..a.clone() }, t).is_err());
        assert!(v.verify_finish(&SignFinishAuth { replica: 2, cert: r2_cert, ..a.clone() }, t).is_err());
        // A sign-zone signature over the same numbers is not a finish claim.
        let sz = signer.sign_at(42).unwrap();
        assert!(v.verify_finish(&SignFinishAuth { signature: sz.signature, ..a }, t).is_err());
    }

    #[test]
    fn a_rollover_report_is_neither_a_sign_zone_request_nor_a_finish_claim() {
        let ca = pki::generate_ca("t").unwrap();
        let ca_der = pki::cert_der_from_pem(&ca.cert_pem).unwrap();
        let r3 = pki::issue_replica_cert(&ca, 3).unwrap();
        let signer = SignZoneSigner::new(3, "example.test", &r3.cert_pem, r3.key_pem.clone()).unwrap();
        let v = SignZoneVerifier::new("example.test.", ca_der.clone());
        let t = 1_800_000_000;
        let report = signer.sign_rollover(t * 1_000_000).unwrap();
        assert_eq!(v.verify_rollover(&report, t), Ok(3));
        // Not a sign-zone request, and a sign-zone request is not a report.
        assert!(v.verify(&report, t).is_err());
        assert!(v.verify_rollover(&signer.sign_at(report.stamp_us).unwrap(), t).is_err());
        // Another stamp, replica or zone: no longer valid.
        assert!(v.verify_rollover(&SignZoneAuth { stamp_us: report.stamp_us + 1, ..report.clone() }, t).is_err());
        assert!(v.verify_rollover(&SignZoneAuth { replica: 2, ..report.clone() }, t).is_err());
        assert!(SignZoneVerifier::new("other.test", ca_der).verify_rollover(&report, t).is_err());
        // Its stamps move forward with the sign-zone requests'.
        assert!(signer.sign(t * 1_000_000).unwrap().stamp_us > report.stamp_us);
    }

    #[test]
    fn a_zone_set_request_binds_action_name_key_replica_and_stamp() {
        let ca = pki::generate_ca("t").unwrap();
        let ca_der = pki::cert_der_from_pem(&ca.cert_pem).unwrap();
        let r1 = pki::issue_replica_cert(&ca, 1).unwrap();
        let signer = SignZoneSigner::new(1, "example.test", &r1.cert_pem, r1.key_pem.clone()).unwrap();
        // Any zone's verifier checks it: the CA decides.
        let v = SignZoneVerifier::new("other.test.", ca_der);
        let t = 1_800_000_000;
        let add = ZoneSetChange::new(ZoneSetAction::Add, "New.Test", [7; 32]);
        assert_eq!(add.name, "new.test.");
        let a = signer.sign_zone_set(&add, t * 1_000_000).unwrap();
        assert_eq!(v.verify_zone_set(&add, &a, t), Ok(1));
        // Another action, name or key, stamp or replica: no longer valid.
        let remove = ZoneSetChange::new(ZoneSetAction::Remove, "new.test", [7; 32]);
        assert_eq!(remove.key_digest, [0; 32], "a removal names the zone only");
        assert!(v.verify_zone_set(&remove, &a, t).is_err());
        assert!(v.verify_zone_set(&ZoneSetChange::new(ZoneSetAction::Add, "new2.test", [7; 32]), &a, t).is_err());
        assert!(v.verify_zone_set(&ZoneSetChange::new(ZoneSetAction::Add, "new.test", [8; 32]), &a, t).is_err());
        assert!(v.verify_zone_set(&add, &SignZoneAuth { stamp_us: a.stamp_us + 1, ..a.clone() }, t).is_err());
        assert!(v.verify_zone_set(&add, &SignZoneAuth { replica: 2, ..a.clone() }, t).is_err());
        // Neither a sign-zone request nor a report for the same numbers.
        assert!(v.for_zone("new.test").verify(&a, t).is_err());
        assert!(v.for_zone("new.test").verify_rollover(&a, t).is_err());
        assert_eq!(v.for_zone("New.Test").zone(), "new.test.");
    }
}
