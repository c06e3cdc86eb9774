//! Update authentication for a cluster serving several zones: each zone has its own
//! [`Authenticator`] (its keys, its SIG(0) KEYs, its local identities), and the zone
//! section of an update, or the question of a transfer, picks it. A request for a zone
//! the cluster does not serve is answered as named answers it (NOTAUTH; FORMERR for an
//! update whose zone section does not hold exactly one zone), before ordering and again
//! at execution against the agreed time.
//!
//! The cluster's catalog zone (RFC 9432) is no zone here: it has no index, takes no update,
//! and only its transfers are checked, against its own transfer keys.

use super::wire::{self, Layout};
use super::{answer_header, AuthError, Authenticator, Mode, RCODE_FORMERR, RCODE_NOTAUTH};
use crate::gate::{UpdateDecision, UpdateGate};

pub struct ZoneAuth {
    /// In zone index order: the apex in lower-case wire form, its text, its authenticator.
    zones: Vec<(Vec<u8>, String, Authenticator)>,
    /// The catalog zone's apex in lower-case wire form and the authenticator of its
    /// transfers (no update keys).
    catalog: Option<(Vec<u8>, Authenticator)>,
}

/// Whom a request is for.
enum Target<'a> {
    Zone(&'a Authenticator),
    /// Named no served zone: answered with this rcode.
    Unserved(Layout, u16),
}

impl ZoneAuth {
    /// One authenticator per zone, in zone index order.
    pub fn new(zones: Vec<(String, Authenticator)>) -> Result<Self, AuthError> {
        if zones.is_empty() {
            return Err(AuthError::NoZone);
        }
        let zones = zones
            .into_iter()
            .map(|(name, auth)| match wire::name_to_wire(&name) {
                Some(apex) => Ok((apex, name, auth)),
                None => Err(AuthError::BadZoneName(name)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ZoneAuth { zones, catalog: None })
    }

    /// The same, with the catalog zone `name` whose transfers `auth` checks.
    pub fn with_catalog(mut self, name: &str, auth: Authenticator) -> Result<Self, AuthError> {
        let apex = wire::name_to_wire(name).ok_or_else(|| AuthError::BadZoneName(name.to_string()))?;
        self.catalog = Some((apex, auth));
        Ok(self)
    }

    /// The catalog's authenticator when `msg` asks for the catalog zone.
    fn catalog_of(&self, msg: &[u8]) -> Option<&Authenticator> {
        let (apex, auth) = self.catalog.as_ref()?;
        let layout = wire::layout(msg).ok()?;
        let (name, _) = wire::read_name(msg, wire::HEADER_LEN).ok()?;
        (layout.qdcount == 1 && name == *apex).then_some(auth)
    }

    /// The update-authentication mode (`[auth] mode`, the same for every zone).
    pub fn mode(&self) -> Mode {
        self.zones.first().map_or(Mode::default(), |(_, _, a)| a.mode())
    }

    /// The zone with this index.
    pub fn zone(&self, index: usize) -> Option<&Authenticator> {
        self.zones.get(index).map(|(_, _, a)| a)
    }

    /// Who each local key stands for, for the log at start-up.
    pub fn describe(&self) -> Vec<String> {
        if let [(_, _, only)] = self.zones.as_slice() {
            return only.describe();
        }
        self.zones.iter().flat_map(|(_, name, a)| a.describe().into_iter().map(move |line| format!("zone {name}: {line}"))).collect()
    }

    fn target(&self, msg: &[u8]) -> Option<Target<'_>> {
        let (_, _, first) = self.zones.first()?;
        // One zone: its authenticator decides everything, as before several zones existed
        // (named answers for names outside the zone).
        if self.zones.len() == 1 {
            return Some(Target::Zone(first));
        }
        // Unreadable: every authenticator answers it alike, without looking at keys.
        let Ok(layout) = wire::layout(msg) else { return Some(Target::Zone(first)) };
        if layout.qdcount != 1 {
            return Some(Target::Unserved(layout, RCODE_FORMERR));
        }
        let Ok((apex, _)) = wire::read_name(msg, wire::HEADER_LEN) else { return Some(Target::Zone(first)) };
        match self.zones.iter().find(|(a, _, _)| *a == apex) {
            Some((_, _, auth)) => Some(Target::Zone(auth)),
            None => Some(Target::Unserved(layout, RCODE_NOTAUTH)),
        }
    }

    /// The answer for a request naming no served zone: signed with its TSIG key when that
    /// is one of any zone's keys (looked up in zone index order) and verifies, else plain.
    fn unserved(&self, msg: &[u8], layout: &Layout, rcode: u16, now_s: u64) -> Vec<u8> {
        self.zones.iter().find_map(|(_, _, a)| a.signed_refusal(msg, layout, rcode, now_s)).unwrap_or_else(|| answer_header(msg, layout, rcode))
    }

    /// [`Authenticator::precheck`] by the zone the request names.
    pub fn precheck(&self, msg: &[u8], is_transfer: bool, now_s: u64) -> Option<Vec<u8>> {
        // A transfer of the catalog needs one of its transfer keys; anything else naming it
        // is judged as before (named refuses updates to it, or it is no served zone).
        if let Some(catalog) = self.catalog_of(msg).filter(|_| is_transfer) {
            return catalog.precheck(msg, true, now_s);
        }
        match self.target(msg)? {
            Target::Zone(auth) => auth.precheck(msg, is_transfer, now_s),
            Target::Unserved(layout, rcode) => Some(self.unserved(msg, &layout, rcode, now_s)),
        }
    }
}

impl UpdateGate for ZoneAuth {
    fn decide(&self, message: &[u8], agreed_time_s: u64) -> UpdateDecision {
        match self.target(message) {
            Some(Target::Zone(auth)) => auth.decide(message, agreed_time_s),
            Some(Target::Unserved(layout, rcode)) => UpdateDecision::Refuse { rcode, answer: self.unserved(message, &layout, rcode, agreed_time_s) },
            // No zone at all: ZoneAuth::new refuses that, so this is never reached.
            None => UpdateDecision::Forward(message.to_vec()),
        }
    }

    fn answer_for_client(&self, request: &[u8], named_answer: &[u8]) -> Vec<u8> {
        match self.target(request) {
            Some(Target::Zone(auth)) => auth.answer_for_client(request, named_answer),
            // Never forwarded to named (decide refused it); pass through as the gate would.
            _ => named_answer.to_vec(),
        }
    }

    fn answer_without_named(&self, request: &[u8], rcode: u16, agreed_time_s: u64) -> Vec<u8> {
        match self.target(request) {
            Some(Target::Zone(auth)) => auth.answer_without_named(request, rcode, agreed_time_s),
            Some(Target::Unserved(layout, _)) => self.unserved(request, &layout, rcode, agreed_time_s),
            None => crate::gate::Unchanged.answer_without_named(request, rcode, agreed_time_s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tsig;
    use super::super::{TsigSecret, RCODE_REFUSED};
    use super::*;
    use hickory_proto::rr::{rdata::A, Name, RData, RecordSet, RecordType};
    use std::str::FromStr;

    const NOW: u64 = 1_700_000_000;

    fn secret(name: &str, byte: u8) -> TsigSecret {
        TsigSecret { name: name.into(), algorithm: tsig::Algorithm::HmacSha256, secret: vec![byte; 32] }
    }

    fn key(s: &TsigSecret) -> tsig::Key {
        tsig::Key::new(&s.name, s.algorithm, &s.secret).unwrap()
    }

    /// An update of `zone` adding an A record, signed with `key` at `time`.
    fn update(zone: &str, key: Option<&tsig::Key>, time: u64) -> Vec<u8> {
        let mut rrset = RecordSet::new(Name::from_str(&format!("new.{zone}")).unwrap(), RecordType::A, 300);
        rrset.add_rdata(RData::A(A::new(192, 0, 2, 7)));
        let bytes = hickory_proto::op::update_message::create(rrset, Name::from_str(zone).unwrap(), false).to_vec().unwrap();
        match key {
            Some(k) => tsig::sign(&bytes, k, time, 300, 0, Vec::new(), None),
            None => bytes,
        }
    }

    fn rcode(answer: &[u8]) -> u16 {
        u16::from_be_bytes([answer[2], answer[3]]) & 0xf
    }

    /// The local key a forwarded update was re-signed with.
    fn local_key(forwarded: &[u8]) -> String {
        let layout = wire::layout(forwarded).unwrap();
        let t = tsig::Tsig::parse(forwarded, &layout.signature.unwrap()).unwrap();
        wire::wire_to_text(&t.key_name)
    }

    fn two_zones() -> (ZoneAuth, TsigSecret, TsigSecret) {
        let (rev, fwd) = (secret("rev-key", 1), secret("fwd-key", 2));
        let reverse = Authenticator::for_zone(0, Mode::Tsig, std::slice::from_ref(&rev), &[], Vec::new(), || NOW).unwrap();
        let forward = Authenticator::for_zone(1, Mode::Tsig, std::slice::from_ref(&fwd), &[], Vec::new(), || NOW).unwrap();
        let auth = ZoneAuth::new(vec![("2.0.192.in-addr.arpa.".into(), reverse), ("example.test.".into(), forward)]).unwrap();
        (auth, rev, fwd)
    }

    #[test]
    fn each_zone_takes_only_its_own_keys() {
        let (auth, rev, fwd) = two_zones();
        // Each key passes in its zone, as that zone's local identity.
        match auth.decide(&update("example.test.", Some(&key(&fwd)), NOW), NOW) {
            UpdateDecision::Forward(bytes) => assert_eq!(local_key(&bytes), "tsig-1-0.sdns-local."),
            other => panic!("{other:?}"),
        }
        match auth.decide(&update("2.0.192.in-addr.arpa.", Some(&key(&rev)), NOW), NOW) {
            UpdateDecision::Forward(bytes) => assert_eq!(local_key(&bytes), "tsig-0-0.sdns-local."),
            other => panic!("{other:?}"),
        }
        // The other zone's key is unknown there: NOTAUTH (BADKEY), before and after ordering.
        let crossed = update("example.test.", Some(&key(&rev)), NOW);
        assert!(matches!(auth.decide(&crossed, NOW), UpdateDecision::Refuse { rcode: RCODE_NOTAUTH, .. }));
        assert_eq!(auth.precheck(&crossed, false, NOW).map(|a| rcode(&a)), Some(RCODE_NOTAUTH));
        assert_eq!(auth.precheck(&update("example.test.", Some(&key(&fwd)), NOW), false, NOW), None);
        let lines = auth.describe();
        assert_eq!(lines, ["zone 2.0.192.in-addr.arpa.: TSIG rev-key -> tsig-0-0.sdns-local", "zone example.test.: TSIG fwd-key -> tsig-1-0.sdns-local"]);
    }

    #[test]
    fn a_zone_not_served_is_notauth_signed_when_the_key_verifies() {
        let (auth, _, fwd) = two_zones();
        let signed = update("other.test.", Some(&key(&fwd)), NOW);
        let UpdateDecision::Refuse { rcode: code, answer } = auth.decide(&signed, NOW) else { panic!("forwarded an update of a zone not served") };
        assert_eq!((code, rcode(&answer)), (RCODE_NOTAUTH, RCODE_NOTAUTH));
        // Signed with the client's key over its MAC, as named answers a valid key.
        assert_eq!(local_key(&answer), "fwd-key.");
        assert_eq!(auth.precheck(&signed, false, NOW), Some(answer));
        // Unsigned, or with a key no zone knows: the plain answer.
        let plain = auth.precheck(&update("other.test.", None, NOW), false, NOW).unwrap();
        assert_eq!(rcode(&plain), RCODE_NOTAUTH);
        assert!(wire::layout(&plain).unwrap().signature.is_none());
        // A transfer of it too.
        assert_eq!(auth.precheck(&update("other.test.", None, NOW), true, NOW).map(|a| rcode(&a)), Some(RCODE_NOTAUTH));
        // Decided by the message and the agreed time only: the same answer every time.
        assert_eq!(auth.decide(&signed, NOW), auth.decide(&signed, NOW));
    }

    #[test]
    fn one_zone_behaves_as_its_authenticator() {
        let only = secret("k", 3);
        let auth = ZoneAuth::new(vec![("example.test.".into(), Authenticator::new(Mode::Tsig, std::slice::from_ref(&only), &[], Vec::new(), || NOW).unwrap())])
            .unwrap();
        // An update of another zone goes to named, which answers it NOTAUTH itself.
        match auth.decide(&update("other.test.", Some(&key(&only)), NOW), NOW) {
            UpdateDecision::Forward(bytes) => assert_eq!(local_key(&bytes), "tsig-0.sdns-local."),
            other => panic!("{other:?}"),
        }
        assert_eq!(auth.describe(), ["TSIG k -> tsig-0.sdns-local"]);
        assert!(ZoneAuth::new(Vec::new()).is_err());
    }

    /// An AXFR of `zone`, signed with `key` at `time`.
    fn axfr(zone: &str, key: Option<&tsig::Key>, time: u64) -> Vec<u8> {
        use hickory_proto::op::{Message, MessageType, OpCode, Query};
        let mut m = Message::new(0x5151, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_str(zone).unwrap(), RecordType::AXFR));
        let bytes = m.to_vec().unwrap();
        match key {
            Some(k) => tsig::sign(&bytes, k, time, 300, 0, Vec::new(), None),
            None => bytes,
        }
    }

    #[test]
    fn the_catalog_is_transferred_with_its_own_keys_and_takes_no_update() {
        let (auth, rev, fwd) = two_zones();
        let xfr = secret("xfr-key", 4);
        let catalog_auth = Authenticator::new(Mode::Tsig, &[], std::slice::from_ref(&xfr), Vec::new(), || NOW).unwrap();
        // Before the catalog is known, it is a zone the cluster does not serve.
        assert_eq!(auth.precheck(&axfr("Catalog.SDNS.", Some(&key(&xfr)), NOW), true, NOW).map(|a| rcode(&a)), Some(RCODE_NOTAUTH));
        let auth = auth.with_catalog("catalog.sdns.", catalog_auth).unwrap();
        // Its transfer key passes (the name in any case); ordered, named then answers it.
        assert_eq!(auth.precheck(&axfr("Catalog.SDNS.", Some(&key(&xfr)), NOW), true, NOW), None);
        // Unsigned: REFUSED; a member zone's update key, which the catalog does not know: BADKEY.
        assert_eq!(auth.precheck(&axfr("catalog.sdns.", None, NOW), true, NOW).map(|a| rcode(&a)), Some(RCODE_REFUSED));
        assert_eq!(auth.precheck(&axfr("catalog.sdns.", Some(&key(&fwd)), NOW), true, NOW).map(|a| rcode(&a)), Some(RCODE_NOTAUTH));
        // An update of the catalog is still refused, before ordering and at execution.
        let update = update("catalog.sdns.", Some(&key(&rev)), NOW);
        assert!(matches!(auth.decide(&update, NOW), UpdateDecision::Refuse { rcode: RCODE_NOTAUTH, .. }));
        assert_eq!(auth.precheck(&update, false, NOW).map(|a| rcode(&a)), Some(RCODE_NOTAUTH));
        // The member zones' transfers are unchanged.
        assert_eq!(auth.precheck(&axfr("example.test.", Some(&key(&xfr)), NOW), true, NOW).map(|a| rcode(&a)), Some(RCODE_NOTAUTH));
        assert!(ZoneAuth::new(vec![("a.test.".into(), Authenticator::new(Mode::Tsig, &[], &[], Vec::new(), || NOW).unwrap())])
            .unwrap()
            .with_catalog("bad..name", Authenticator::new(Mode::Tsig, &[], &[], Vec::new(), || NOW).unwrap())
            .is_err());
    }

    #[test]
    fn truncated_requests_never_panic() {
        let (auth, _, fwd) = two_zones();
        let q = update("example.test.", Some(&key(&fwd)), NOW);
        for cut in 0..q.len() {
            let _ = auth.precheck(&q[..cut], cut % 2 == 0, NOW);
            let _ = auth.decide(&q[..cut], NOW);
            let _ = auth.answer_for_client(&q[..cut], &q[..cut]);
        }
    }
}
