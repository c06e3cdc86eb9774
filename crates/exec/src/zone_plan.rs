//! The zone plan: what zone maintenance computes from a zone's records, deterministically,
//! the same on every honest replica. The content digest and SOA serial a checkpoint
//! attests, a background signing's kept content and how many signatures it must produce,
//! the catch-up diff a round installs, the IXFR applied to a round's base, and the choice
//! of RRSIGs a re-signing slice renews. The wrapper's `zone::ZoneMaintenance` runs the IO
//! (transfers from named, dnssec-signzone, files, updates) and calls these.

use dnswire::rrwire::{soa_rdata_serial, split_record, RawRecord};
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use hickory_proto::serialize::binary::BinEncodable;

pub const TYPE_RRSIG: u16 = 46;
const CLASS_IN: u16 = 1;
const CLASS_NONE: u16 = 254;
/// A slice's UPDATE stays well inside one TCP message (with room for the TSIG).
const MAX_SLICE_MESSAGE: usize = 60_000;

/// Why a message could not be built from a zone's records.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// An UPDATE (a catch-up or a re-signing slice).
    #[error("{0}")]
    Build(String),
    /// The IXFR query for a round's base.
    #[error("{0}")]
    Query(String),
}

/// The digest of a zone's records (canonical wire form, as the wrapper's `ZoneMaintenance::zone_records`
/// returns them), the same on every honest replica: sorted, duplicates (the AXFR's closing
/// SOA) dropped, each hashed with its length. Leaves `records` sorted and deduplicated.
pub fn zone_digest_of(records: &mut Vec<Vec<u8>>) -> [u8; 32] {
    use sha2::{Digest as _, Sha256};
    records.sort();
    records.dedup();
    let mut h = Sha256::new();
    for r in records.iter() {
        h.update((r.len() as u32).to_be_bytes());
        h.update(r);
    }
    h.finalize().into()
}

/// The SOA serial among a zone's records (canonical wire form, as
/// the wrapper's `ZoneMaintenance::zone_records` returns them), for the status; `None` without a
/// readable SOA.
pub fn soa_serial_of(records: &[Vec<u8>]) -> Option<u32> {
    const TYPE_SOA: u16 = 6;
    let rdata = records.iter().find_map(|r| split_wire(r).filter(|(_, rtype, ..)| *rtype == TYPE_SOA).map(|(.., rdata)| rdata))?;
    soa_rdata_serial(rdata)
}

/// Record types dnssec-signzone makes itself (RRSIG, NSEC, DNSKEY, NSEC3, NSEC3PARAM).
pub const DNSSEC_TYPE_CODES: [u16; 5] = [46, 47, 48, 50, 51];
const TYPE_NS: u16 = 2;
const TYPE_DS: u16 = 43;

/// `seq`, then lists of byte strings, each a u32 count and u32-length-prefixed items.
pub fn encode_records(seq: u64, lists: &[Vec<Vec<u8>>]) -> Vec<u8> {
    let mut out = seq.to_be_bytes().to_vec();
    for list in lists {
        out.extend_from_slice(&(list.len() as u32).to_be_bytes());
        for r in list {
            out.extend_from_slice(&(r.len() as u32).to_be_bytes());
            out.extend_from_slice(r);
        }
    }
    out
}

/// The lists [`encode_records`] wrote for `seq`; `None` for another seq or damage.
pub fn decode_records(bytes: &[u8], seq: u64) -> Option<Vec<Vec<Vec<u8>>>> {
    if bytes.get(..8)? != seq.to_be_bytes() {
        return None;
    }
    let mut pos = 8;
    let word = |pos: &mut usize| -> Option<usize> {
        let b = bytes.get(*pos..*pos + 4)?;
        *pos += 4;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let mut lists = Vec::new();
    while pos < bytes.len() {
        let n = word(&mut pos)?;
        let mut list = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            let len = word(&mut pos)?;
            list.push(bytes.get(pos..pos + len)?.to_vec());
            pos += len;
        }
        lists.push(list);
    }
    Some(lists)
}

/// [`split_record`] without the class: (owner, type, ttl, rdata).
pub fn split_wire(record: &[u8]) -> Option<(&[u8], u16, u32, &[u8])> {
    split_record(record).map(|(owner, rtype, _, ttl, rdata)| (owner, rtype, ttl, rdata))
}

/// The label boundaries of a wire name: each proper ancestor, as a suffix.
fn ancestors(name: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        let len = usize::from(*name.get(pos)?);
        if len == 0 {
            return None;
        }
        pos += 1 + len;
        name.get(pos..)
    })
}

/// How many RRSIGs dnssec-signzone makes for these (non-DNSSEC, lowercased) records
/// with NSEC: one per authoritative RRset (at a delegation only DS), one per NSEC (one
/// per name that is not below a delegation), and one for the DNSKEY RRset.
pub fn expected_signatures(zone: &Name, records: &[Vec<u8>]) -> u64 {
    use std::collections::BTreeSet;
    let mut apex = zone.to_lowercase();
    apex.set_fqdn(true);
    let apex = apex.to_bytes().unwrap_or_default();
    let split: Vec<(&[u8], u16)> = records.iter().filter_map(|r| split_wire(r).map(|(o, t, _, _)| (o, t))).collect();
    let cuts: BTreeSet<&[u8]> = split.iter().filter(|(o, t)| *t == TYPE_NS && *o != apex.as_slice()).map(|(o, _)| *o).collect();
    let below_cut = |o: &[u8]| ancestors(o).any(|a| cuts.contains(a));
    let mut rrsets = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (o, t) in split {
        if below_cut(o) {
            continue;
        }
        names.insert(o);
        if !cuts.contains(o) || t == TYPE_DS {
            rrsets.insert((o, t));
        }
    }
    (rrsets.len() + names.len() + 1) as u64
}

/// An IXFR query for `zone` from the serial of `soa` (a record in canonical wire form):
/// RFC 1995 puts the client's SOA in the authority section.
pub fn ixfr_request(zone: &Name, soa: &[u8]) -> Result<Vec<u8>, PlanError> {
    let mut query = Message::new(0, MessageType::Query, OpCode::Query);
    query.add_query(Query::query(zone.clone(), RecordType::IXFR));
    let mut request = query.to_vec().map_err(|e| PlanError::Query(e.to_string()))?;
    // NSCOUNT (header bytes 8-9): one record, appended after the question.
    request[8..10].copy_from_slice(&1u16.to_be_bytes());
    request.extend_from_slice(soa);
    Ok(request)
}

/// `base` (canonical wire form, DNSSEC types excluded, sorted) with an IXFR answer's
/// records applied (RFC 1995 section 4): one SOA alone, nothing changed; the requested
/// serial's SOA second, an incremental answer (parts opened by the old SOA, whose records
/// are deleted, then by the new one, whose records are added); otherwise AXFR-style, the
/// whole zone. DNSSEC records are passed over, as in the wrapper's `ZoneMaintenance::content`. `None`
/// when an incremental answer does not fit `base`: a deleted record it lacks, an added one
/// it holds, or a result whose SOA is not the answer's last.
pub fn apply_ixfr(base: &[Vec<u8>], records: &[RawRecord]) -> Option<Vec<Vec<u8>>> {
    apply_ixfr_kept(base, records, |rtype| !DNSSEC_TYPE_CODES.contains(&rtype))
}

/// [`apply_ixfr`] for a `base` that holds, besides the SOA, the records of the types
/// `kept` says (the SOA is always kept: it chains the answer's parts).
pub fn apply_ixfr_kept(base: &[Vec<u8>], records: &[RawRecord], kept: impl Fn(u16) -> bool) -> Option<Vec<Vec<u8>>> {
    use dnswire::rrwire::TYPE_SOA;
    let kept = |rtype: u16| rtype == TYPE_SOA || kept(rtype);
    let base_serial = soa_serial_of(base)?;
    let (first, rest) = records.split_first()?;
    first.soa_serial()?;
    let incremental = rest.first().and_then(RawRecord::soa_serial) == Some(base_serial) && rest.len() > 1;
    if rest.is_empty() {
        // Up to date; the SOA must be base's own.
        return (first.soa_serial() == Some(base_serial)).then(|| base.to_vec());
    }
    if !incremental {
        let mut now: Vec<Vec<u8>> = records.iter().filter(|r| kept(r.rtype)).map(RawRecord::to_wire).collect();
        now.sort();
        now.dedup();
        return Some(now);
    }
    let (last, parts) = rest.split_last()?;
    if last.to_wire() != first.to_wire() {
        return None;
    }
    let mut now: std::collections::BTreeSet<Vec<u8>> = base.iter().cloned().collect();
    let mut deleting = false;
    for r in parts {
        if r.rtype == TYPE_SOA {
            deleting = !deleting;
        } else if !kept(r.rtype) {
            continue;
        }
        let wire = r.to_wire();
        let applied = if deleting { now.remove(&wire) } else { now.insert(wire) };
        if !applied {
            return None;
        }
    }
    let now: Vec<Vec<u8>> = now.into_iter().collect();
    let soas: Vec<&Vec<u8>> = now.iter().filter(|r| split_wire(r).is_some_and(|(_, t, ..)| t == TYPE_SOA)).collect();
    (soas.len() == 1 && *soas[0] == first.to_wire()).then_some(now)
}

/// What changed between two sets of records (canonical wire form, DNSSEC types
/// excluded), as updates: the SOA is carried over as the later one.
pub struct ZoneDiff<'a> {
    removed: Vec<&'a [u8]>,
    added: Vec<&'a [u8]>,
    soa: Option<&'a [u8]>,
}

impl<'a> ZoneDiff<'a> {
    /// `before` and `now` sorted and deduplicated.
    pub fn between(before: &'a [Vec<u8>], now: &'a [Vec<u8>]) -> ZoneDiff<'a> {
        use std::collections::BTreeSet;
        let is_soa = |r: &[u8]| split_wire(r).is_some_and(|(_, t, _, _)| t == dnswire::rrwire::TYPE_SOA);
        let b: BTreeSet<&[u8]> = before.iter().map(Vec::as_slice).collect();
        let n: BTreeSet<&[u8]> = now.iter().map(Vec::as_slice).collect();
        let removed = b.difference(&n).copied().filter(|r| !is_soa(r)).collect();
        let added = n.difference(&b).copied().filter(|r| !is_soa(r)).collect();
        let soa = n.difference(&b).copied().find(|r| is_soa(r));
        ZoneDiff { removed, added, soa }
    }

    pub fn len(&self) -> usize {
        self.removed.len() + self.added.len() + usize::from(self.soa.is_some())
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// UPDATE messages (each within one TCP message), the SOA in the first: with a serial
    /// above the installed one, named takes it as it is and increments only for the later
    /// messages. Deletions (class NONE, exact records) before additions.
    pub fn updates(&self, zone: &Name) -> Result<Vec<Vec<u8>>, PlanError> {
        let mut entries: Vec<(bool, &[u8])> = Vec::new();
        entries.extend(self.soa.iter().map(|r| (false, *r)));
        entries.extend(self.removed.iter().map(|r| (true, *r)));
        entries.extend(self.added.iter().map(|r| (false, *r)));
        let mut zone_lc = zone.to_lowercase();
        zone_lc.set_fqdn(true);
        let zone_wire = zone_lc.to_bytes().map_err(|e| PlanError::Build(e.to_string()))?;
        let mut out = Vec::new();
        let mut chunk: Vec<Vec<u8>> = Vec::new();
        let mut size = 12 + zone_wire.len() + 4 + 255;
        for (delete, r) in entries {
            let (owner, rtype, ttl, rdata) = split_wire(r).ok_or_else(|| PlanError::Build("a record does not split".into()))?;
            let mut rr = owner.to_vec();
            rr.extend_from_slice(&rtype.to_be_bytes());
            rr.extend_from_slice(&(if delete { CLASS_NONE } else { CLASS_IN }).to_be_bytes());
            rr.extend_from_slice(&(if delete { 0 } else { ttl }).to_be_bytes());
            let len = u16::try_from(rdata.len()).map_err(|_| PlanError::Build("rdata too long".into()))?;
            rr.extend_from_slice(&len.to_be_bytes());
            rr.extend_from_slice(rdata);
            if size + rr.len() > MAX_SLICE_MESSAGE || chunk.len() == usize::from(u16::MAX) {
                out.push(update_message(&zone_wire, &std::mem::take(&mut chunk)));
                size = 12 + zone_wire.len() + 4 + 255;
            }
            size += rr.len();
            chunk.push(rr);
        }
        if !chunk.is_empty() {
            out.push(update_message(&zone_wire, &chunk));
        }
        Ok(out)
    }
}

/// An UPDATE of the zone (id 0) with these update-section records.
fn update_message(zone_wire: &[u8], records: &[Vec<u8>]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(&(5u16 << 11).to_be_bytes());
    for c in [1u16, 0, records.len() as u16, 0] {
        m.extend_from_slice(&c.to_be_bytes());
    }
    m.extend_from_slice(zone_wire);
    m.extend_from_slice(&6u16.to_be_bytes());
    m.extend_from_slice(&CLASS_IN.to_be_bytes());
    for r in records {
        m.extend_from_slice(r);
    }
    m
}

/// The signatures one slice re-signs, chosen from the zone's records.
#[derive(Debug)]
pub struct SlicePlan<'a> {
    pub chosen: Vec<&'a RawRecord>,
    /// Signatures due (expiring at or before the bound), chosen or not.
    pub due: usize,
    /// The threshold key's signatures in the zone.
    pub total: usize,
    /// The earliest expiration among the signatures not chosen.
    pub rest_earliest: Option<u32>,
}

/// The RRSIG rdata's expiration (RFC 4034 3.1: offset 8).
fn rrsig_expiration(r: &RawRecord) -> Option<u32> {
    let b = r.rdata.get(8..12)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// The RRSIG rdata's key tag (RFC 4034 3.1: offset 16).
fn rrsig_key_tag(r: &RawRecord) -> Option<u16> {
    let b = r.rdata.get(16..18)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// Chooses, from the zone's records, the RRSIGs by the threshold key (tag `key_tag`)
/// expiring at or before `due_before_s`: soonest first, ties broken by owner (lowercased
/// wire form) and covered type, then the rdata, so the choice is a function of the zone's
/// content alone. Expirations are compared as plain numbers: agreed times stay far from
/// the 2106 wrap. Signatures by other keys (the operator's KSK over the DNSKEY RRset
/// during an adopted zone's rollover) are not the slices' to renew: deleting one would
/// only lose it, as named signs with the threshold key alone.
pub fn plan_slice(records: &[RawRecord], due_before_s: u32, max: usize, key_tag: u16) -> SlicePlan<'_> {
    let mut sigs: Vec<(u32, &RawRecord)> =
        records.iter().filter(|r| r.rtype == TYPE_RRSIG && rrsig_key_tag(r) == Some(key_tag)).filter_map(|r| rrsig_expiration(r).map(|e| (e, r))).collect();
    sigs.sort_by(|(ea, a), (eb, b)| {
        ea.cmp(eb).then_with(|| a.owner.cmp(&b.owner)).then_with(|| a.rdata[..2].cmp(&b.rdata[..2])).then_with(|| a.rdata.cmp(&b.rdata))
    });
    sigs.dedup_by(|(_, a), (_, b)| a.owner == b.owner && a.rdata == b.rdata);
    let total = sigs.len();
    let due = sigs.iter().take_while(|(e, _)| *e <= due_before_s).count();
    let mut chosen = Vec::new();
    let mut size = 12 + 255 + 4;
    let mut taken = 0;
    for (_, r) in sigs.iter().take(due.min(max)) {
        let len = r.owner.len() + 10 + r.rdata.len();
        if size + len > MAX_SLICE_MESSAGE {
            break;
        }
        size += len;
        chosen.push(*r);
        taken += 1;
    }
    let rest_earliest = sigs.get(taken).map(|(e, _)| *e);
    SlicePlan { chosen, due, total, rest_earliest }
}

/// An UPDATE for `zone` deleting exactly these RRSIGs (RFC 2136 2.5.4: class NONE,
/// TTL 0), names uncompressed.
pub fn build_slice_update(zone: &Name, sigs: &[&RawRecord]) -> Result<Vec<u8>, PlanError> {
    let count = u16::try_from(sigs.len()).map_err(|_| PlanError::Build("too many records".into()))?;
    let mut zone_lc = zone.to_lowercase();
    zone_lc.set_fqdn(true);
    let zone_wire = zone_lc.to_bytes().map_err(|e| PlanError::Build(e.to_string()))?;
    let mut m = Vec::with_capacity(MAX_SLICE_MESSAGE);
    // id 0: named's answer comes back on this connection only.
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(&(5u16 << 11).to_be_bytes());
    for c in [1u16, 0, count, 0] {
        m.extend_from_slice(&c.to_be_bytes());
    }
    m.extend_from_slice(&zone_wire);
    m.extend_from_slice(&6u16.to_be_bytes());
    m.extend_from_slice(&CLASS_IN.to_be_bytes());
    for r in sigs {
        m.extend_from_slice(&r.owner);
        m.extend_from_slice(&TYPE_RRSIG.to_be_bytes());
        m.extend_from_slice(&CLASS_NONE.to_be_bytes());
        m.extend_from_slice(&0u32.to_be_bytes());
        let len = u16::try_from(r.rdata.len()).map_err(|_| PlanError::Build("RRSIG rdata too long".into()))?;
        m.extend_from_slice(&len.to_be_bytes());
        m.extend_from_slice(&r.rdata);
    }
    Ok(m)
}

/// Records changed during each round so far, as the wrapper's `ZoneMaintenance::begin_round` kept
/// them after the zone's records (none for the whole-zone signing's first round).
pub fn round_counts(kept: &[Vec<Vec<u8>>]) -> Vec<u32> {
    kept.get(1).map_or_else(Vec::new, |counts| counts.iter().filter_map(|c| c.as_slice().try_into().ok().map(u32::from_be_bytes)).collect())
}

/// A round's input for dnssec-signzone: the zone's content now (`unsigned`, one record per
/// line) with the RRSIGs of the last round's output (`signed`, the same style) that cover
/// an RRset still in the zone: the DNSKEY's, each remaining RRset's, and the NSEC's of
/// each remaining name, whose NSEC comes along too (dnssec-signzone drops the signatures
/// of a type the input lacks before it rebuilds the chain, so without it every NSEC would
/// be signed again). dnssec-signzone rebuilds the chain, keeps the signatures that still
/// verify and signs the rest; what the writes removed is left out.
pub fn with_kept_signatures(unsigned: &str, signed: &str) -> String {
    use std::collections::BTreeSet;
    let mut rrsets: BTreeSet<(String, &str)> = BTreeSet::new();
    let mut owners: BTreeSet<String> = BTreeSet::new();
    for line in unsigned.lines() {
        let mut fields = line.split_whitespace();
        let (Some(owner), Some(rtype)) = (fields.next(), fields.nth(2)) else { continue };
        if owner.starts_with(';') {
            continue;
        }
        owners.insert(owner.to_ascii_lowercase());
        rrsets.insert((owner.to_ascii_lowercase(), rtype));
    }
    let mut out = String::with_capacity(unsigned.len() + signed.len() / 2);
    out.push_str(unsigned);
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    for line in signed.lines() {
        let fields: Vec<&str> = line.split_whitespace().take(5).collect();
        let keep = match fields[..] {
            [owner, _, _, "NSEC", ..] | [owner, _, _, "RRSIG", "NSEC"] => owners.contains(&owner.to_ascii_lowercase()),
            [_, _, _, "RRSIG", "DNSKEY"] => true,
            [owner, _, _, "RRSIG", covered] => rrsets.contains(&(owner.to_ascii_lowercase(), covered)),
            _ => false,
        };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnswire::rrwire::RawMessage;

    #[test]
    fn the_serial_is_read_from_the_soa_record() {
        let mut soa = b"\x07example\x04test\x00".to_vec();
        soa.extend_from_slice(&[0, 6, 0, 1, 0, 0, 1, 44]);
        let mut rdata = b"\x03ns0\x07example\x04test\x00\x0ahostmaster\x07example\x04test\x00".to_vec();
        rdata.extend_from_slice(&[0, 0, 0, 42, 0, 0, 14, 16, 0, 0, 3, 132, 0, 9, 58, 128, 0, 0, 1, 44]);
        soa.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        soa.extend_from_slice(&rdata);
        let mut a = b"\x03www\x07example\x04test\x00".to_vec();
        a.extend_from_slice(&[0, 1, 0, 1, 0, 0, 1, 44, 0, 4, 192, 0, 2, 1]);
        assert_eq!(soa_serial_of(&[a.clone(), soa.clone()]), Some(42));
        assert_eq!(soa_serial_of(&[a]), None);
        soa.truncate(soa.len() - 21);
        assert_eq!(soa_serial_of(&[soa]), None, "a cut SOA reads as none, without a panic");
    }

    fn name_wire(text: &str) -> Vec<u8> {
        Name::from_ascii(text).unwrap().to_bytes().unwrap()
    }

    /// The threshold key's tag in these tests.
    const TAG: u16 = 0x1234;

    fn rrsig(owner: &str, covered: u16, expiration: u32) -> RawRecord {
        rrsig_by(owner, covered, expiration, TAG)
    }

    fn rrsig_by(owner: &str, covered: u16, expiration: u32, tag: u16) -> RawRecord {
        let mut rdata = Vec::new();
        rdata.extend_from_slice(&covered.to_be_bytes());
        rdata.extend_from_slice(&[8, 3, 0, 0, 1, 44]);
        rdata.extend_from_slice(&expiration.to_be_bytes());
        rdata.extend_from_slice(&expiration.saturating_sub(1000).to_be_bytes());
        rdata.extend_from_slice(&tag.to_be_bytes());
        rdata.extend_from_slice(&name_wire("example.test."));
        rdata.extend_from_slice(&[0xaa; 256]);
        RawRecord { owner: name_wire(owner), rtype: TYPE_RRSIG, class: CLASS_IN, ttl: 300, rdata, span: 0..0 }
    }

    fn a(owner: &str) -> RawRecord {
        RawRecord { owner: name_wire(owner), rtype: 1, class: CLASS_IN, ttl: 300, rdata: vec![192, 0, 2, 1], span: 0..0 }
    }

    #[test]
    fn a_slice_takes_the_soonest_expiring_due_signatures_in_a_fixed_order() {
        let zone = vec![
            a("b.example.test."),
            rrsig("b.example.test.", 1, 500),
            rrsig("a.example.test.", 47, 500),
            rrsig("a.example.test.", 1, 500),
            rrsig("c.example.test.", 1, 300),
            rrsig("d.example.test.", 1, 900),
            rrsig("e.example.test.", 1, 700),
        ];
        let plan = plan_slice(&zone, 700, 3, TAG);
        let picked: Vec<(Vec<u8>, u32)> = plan.chosen.iter().map(|r| (r.owner.clone(), rrsig_expiration(r).unwrap())).collect();
        assert_eq!(
            picked,
            vec![(name_wire("c.example.test."), 300), (name_wire("a.example.test."), 500), (name_wire("a.example.test."), 500)],
            "soonest first, then owner"
        );
        assert_eq!(&plan.chosen[1].rdata[..2], &1u16.to_be_bytes(), "then covered type");
        assert_eq!((plan.due, plan.total, plan.rest_earliest), (5, 6, Some(500)));
        // The same zone in another order gives the same choice.
        let mut shuffled = zone.clone();
        shuffled.reverse();
        let again = plan_slice(&shuffled, 700, 3, TAG);
        assert_eq!(again.chosen.iter().map(|r| r.to_wire()).collect::<Vec<_>>(), plan.chosen.iter().map(|r| r.to_wire()).collect::<Vec<_>>());
        // Nothing due: nothing chosen, the earliest expiration reported.
        let none = plan_slice(&zone, 299, 3, TAG);
        assert!(none.chosen.is_empty());
        assert_eq!((none.due, none.rest_earliest), (0, Some(300)));
    }

    #[test]
    fn a_slice_leaves_signatures_by_other_keys_alone() {
        // The operator's KSK signed the DNSKEY RRset during an adopted zone's rollover; its
        // signature expires first, but only the threshold key's are renewed by slices.
        let zone = vec![
            rrsig_by("example.test.", 48, 100, 0x4242),
            rrsig("example.test.", 48, 200),
            rrsig("www.example.test.", 1, 300),
            rrsig_by("www.example.test.", 1, 50, 0x4242),
        ];
        let plan = plan_slice(&zone, 1000, 10, TAG);
        let picked: Vec<(u32, u16)> = plan.chosen.iter().map(|r| (rrsig_expiration(r).unwrap(), rrsig_key_tag(r).unwrap())).collect();
        assert_eq!(picked, vec![(200, TAG), (300, TAG)]);
        assert_eq!((plan.due, plan.total, plan.rest_earliest), (2, 2, None));
        // Nothing of the threshold key's due: nothing chosen, whatever the others expire.
        let none = plan_slice(&zone, 150, 10, TAG);
        assert!(none.chosen.is_empty());
        assert_eq!(none.rest_earliest, Some(200));
        assert_eq!(plan_slice(&zone, 1000, 10, 0x4242).chosen.len(), 2, "the tag decides");
    }

    #[test]
    fn a_slice_stays_inside_one_message() {
        let zone: Vec<RawRecord> = (0..1000).map(|i| rrsig(&format!("n{i}.example.test."), 1, 100)).collect();
        let plan = plan_slice(&zone, 100, 1000, TAG);
        assert!(plan.chosen.len() < 1000 && plan.chosen.len() > 100, "{}", plan.chosen.len());
        let m = build_slice_update(&Name::from_ascii("example.test.").unwrap(), &plan.chosen).unwrap();
        assert!(m.len() <= MAX_SLICE_MESSAGE);
        assert_eq!(plan.rest_earliest, Some(100));
    }

    #[test]
    fn the_slice_update_deletes_exactly_the_chosen_rrsigs() {
        let sigs = [rrsig("www.example.test.", 1, 500), rrsig("example.test.", 6, 400)];
        let refs: Vec<&RawRecord> = sigs.iter().collect();
        let m = build_slice_update(&Name::from_ascii("Example.TEST.").unwrap(), &refs).unwrap();
        let parsed = RawMessage::parse(&m).unwrap();
        assert_eq!(parsed.header.opcode(), 5);
        assert_eq!(parsed.questions.len(), 1);
        assert_eq!(parsed.questions[0].name, name_wire("example.test."));
        assert_eq!(parsed.questions[0].qtype, 6);
        assert_eq!(parsed.authorities.len(), 2);
        for (got, want) in parsed.authorities.iter().zip(&sigs) {
            assert_eq!((got.rtype, got.class, got.ttl), (TYPE_RRSIG, CLASS_NONE, 0));
            assert_eq!((&got.owner, &got.rdata), (&want.owner, &want.rdata));
        }
    }

    fn rec(owner: &str, rtype: u16, ttl: u32, rdata: &[u8]) -> Vec<u8> {
        RawRecord { owner: name_wire(owner), rtype, class: CLASS_IN, ttl, rdata: rdata.to_vec(), span: 0..0 }.to_wire()
    }

    fn soa(serial: u32) -> Vec<u8> {
        let mut rdata = name_wire("ns0.example.test.");
        rdata.extend_from_slice(&name_wire("h.example.test."));
        for v in [serial, 3600, 900, 604800, 300] {
            rdata.extend_from_slice(&v.to_be_bytes());
        }
        rec("example.test.", 6, 300, &rdata)
    }

    #[test]
    fn the_catch_up_after_a_background_signing_is_what_the_writes_changed() {
        let mut before = vec![
            soa(7),
            rec("a.example.test.", 1, 300, &[192, 0, 2, 1]),
            rec("b.example.test.", 1, 300, &[192, 0, 2, 2]),
            rec("c.example.test.", 1, 300, &[192, 0, 2, 3]),
        ];
        let mut now = vec![
            soa(9),
            rec("a.example.test.", 1, 300, &[192, 0, 2, 1]),
            rec("c.example.test.", 1, 600, &[192, 0, 2, 3]),
            rec("d.example.test.", 1, 300, &[192, 0, 2, 4]),
        ];
        before.sort();
        now.sort();
        let diff = ZoneDiff::between(&before, &now);
        assert_eq!(diff.len(), 5, "b and c (old TTL) removed, c (new TTL) and d added, the SOA");
        let messages = diff.updates(&Name::from_ascii("Example.Test.").unwrap()).unwrap();
        assert_eq!(messages.len(), 1);
        let m = RawMessage::parse(&messages[0]).unwrap();
        assert_eq!(m.header.opcode(), 5);
        assert_eq!(m.questions[0].name, name_wire("example.test."));
        let got: Vec<(Vec<u8>, u16, u16, u32)> = m.authorities.iter().map(|r| (r.owner.clone(), r.rtype, r.class, r.ttl)).collect();
        assert_eq!(got[0], (name_wire("example.test."), 6, CLASS_IN, 300), "the SOA first, as it is now");
        assert_eq!(m.authorities[0].soa_serial(), Some(9));
        assert_eq!(got[1..3], [(name_wire("b.example.test."), 1, CLASS_NONE, 0), (name_wire("c.example.test."), 1, CLASS_NONE, 0)], "exact deletions next");
        assert_eq!(got[3..], [(name_wire("c.example.test."), 1, CLASS_IN, 600), (name_wire("d.example.test."), 1, CLASS_IN, 300)], "then additions");
        // Nothing written meanwhile: nothing to apply.
        let same = ZoneDiff::between(&before, &before);
        assert_eq!(same.len(), 0);
        assert!(same.updates(&Name::from_ascii("example.test.").unwrap()).unwrap().is_empty());
    }

    /// A record as an IXFR answer carries it (the form `RawMessage::parse` gives).
    fn raw(wire: &[u8]) -> RawRecord {
        let (owner, rtype, ttl, rdata) = split_wire(wire).unwrap();
        RawRecord { owner: owner.to_vec(), rtype, class: CLASS_IN, ttl, rdata: rdata.to_vec(), span: 0..0 }
    }

    #[test]
    fn an_ixfr_applied_to_the_round_s_base_gives_the_zone_as_an_axfr_would() {
        let a1 = rec("a.example.test.", 1, 300, &[192, 0, 2, 1]);
        let b = rec("b.example.test.", 1, 300, &[192, 0, 2, 2]);
        let c300 = rec("c.example.test.", 1, 300, &[192, 0, 2, 3]);
        let c600 = rec("c.example.test.", 1, 600, &[192, 0, 2, 3]);
        let d = rec("d.example.test.", 1, 300, &[192, 0, 2, 4]);
        let sig = rrsig("d.example.test.", 1, 900);
        let mut base = vec![soa(7), a1.clone(), b.clone(), c300.clone()];
        base.sort();
        // Two journal entries: 7 -> 8 deletes b and adds d (and its signature, passed
        // over), 8 -> 9 changes c's TTL and deletes d again then adds it back.
        let answer: Vec<RawRecord> = vec![
            raw(&soa(9)),
            raw(&soa(7)),
            raw(&b),
            raw(&soa(8)),
            raw(&d),
            sig.clone(),
            raw(&soa(8)),
            raw(&c300),
            raw(&d),
            sig.clone(),
            raw(&soa(9)),
            raw(&c600),
            raw(&d),
            raw(&soa(9)),
        ];
        let mut want = vec![soa(9), a1.clone(), c600.clone(), d.clone()];
        want.sort();
        assert_eq!(apply_ixfr(&base, &answer), Some(want.clone()));
        assert_eq!(ZoneDiff::between(&base, &want).len(), 5);

        // Nothing since: one SOA, the base's own.
        assert_eq!(apply_ixfr(&base, &[raw(&soa(7))]), Some(base.clone()));
        assert_eq!(apply_ixfr(&base, &[raw(&soa(8))]), None, "one SOA of another serial is no answer to apply");

        // AXFR-style (the journal no longer reaches back): the whole zone, DNSSEC passed over.
        let axfr: Vec<RawRecord> = vec![raw(&soa(9)), raw(&a1), raw(&c600), raw(&d), sig, raw(&soa(9))];
        assert_eq!(apply_ixfr(&base, &axfr), Some(want));
    }

    #[test]
    fn an_ixfr_that_does_not_fit_the_base_is_refused_for_the_whole_zone() {
        let a1 = rec("a.example.test.", 1, 300, &[192, 0, 2, 1]);
        let e = rec("e.example.test.", 1, 300, &[192, 0, 2, 5]);
        let mut base = vec![soa(7), a1.clone()];
        base.sort();
        // Deletes a record the base lacks.
        let stray = vec![raw(&soa(8)), raw(&soa(7)), raw(&e), raw(&soa(8)), raw(&soa(8))];
        assert_eq!(apply_ixfr(&base, &stray), None);
        // Adds one it holds.
        let twice = vec![raw(&soa(8)), raw(&soa(7)), raw(&soa(8)), raw(&a1), raw(&soa(8))];
        assert_eq!(apply_ixfr(&base, &twice), None);
        // Ends on another SOA than it began with.
        let torn = vec![raw(&soa(9)), raw(&soa(7)), raw(&soa(8)), raw(&e), raw(&soa(8))];
        assert_eq!(apply_ixfr(&base, &torn), None);
        // A gap in the chain: a part opened by a serial the zone did not hold.
        let gap = vec![raw(&soa(9)), raw(&soa(7)), raw(&soa(8)), raw(&soa(5)), raw(&soa(9)), raw(&soa(9))];
        assert_eq!(apply_ixfr(&base, &gap), None);
        assert_eq!(apply_ixfr(&base, &[]), None);
    }

    #[test]
    fn a_slice_s_records_follow_an_ixfr_of_signatures_only() {
        let a1 = rec("a.example.test.", 1, 300, &[192, 0, 2, 1]);
        let old = rrsig("a.example.test.", 1, 500).to_wire();
        let new = rrsig("a.example.test.", 1, 900).to_wire();
        let nsec = rec("a.example.test.", 47, 300, &[0]);
        let mut base = vec![soa(7), old.clone()];
        base.sort();
        // A slice re-signed a's A RRset (7 -> 8), then a write touched a and its NSEC (8 -> 9):
        // only the signatures and the SOA are followed.
        let answer: Vec<RawRecord> =
            vec![raw(&soa(9)), raw(&soa(7)), raw(&old), raw(&soa(8)), raw(&new), raw(&soa(8)), raw(&a1), raw(&soa(9)), raw(&a1), raw(&nsec), raw(&soa(9))];
        let mut want = vec![soa(9), new.clone()];
        want.sort();
        assert_eq!(apply_ixfr_kept(&base, &answer, |t| t == TYPE_RRSIG), Some(want));
        // The deletion of a signature the kept records lack does not apply.
        let stray = vec![raw(&soa(8)), raw(&soa(7)), raw(&new), raw(&soa(8)), raw(&soa(8))];
        assert_eq!(apply_ixfr_kept(&base, &stray, |t| t == TYPE_RRSIG), None);
    }

    #[test]
    fn the_ixfr_request_carries_the_base_soa_in_its_authority_section() {
        let request = ixfr_request(&Name::from_ascii("example.test.").unwrap(), &soa(42)).unwrap();
        let parsed = RawMessage::parse(&request).unwrap();
        assert_eq!(parsed.questions[0].qtype, dnswire::rrwire::TYPE_IXFR);
        assert_eq!(parsed.authorities.len(), 1);
        assert_eq!(parsed.authorities[0].soa_serial(), Some(42));
    }

    #[test]
    fn a_big_catch_up_is_split_into_messages_that_fit() {
        let before = vec![soa(1)];
        let mut now: Vec<Vec<u8>> = (0..5000).map(|i| rec(&format!("host-{i}.example.test."), 16, 300, &[40; 41])).collect();
        now.push(soa(2));
        now.sort();
        let messages = ZoneDiff::between(&before, &now).updates(&Name::from_ascii("example.test.").unwrap()).unwrap();
        assert!(messages.len() > 1);
        let mut records = 0;
        for (i, m) in messages.iter().enumerate() {
            assert!(m.len() <= MAX_SLICE_MESSAGE);
            let parsed = RawMessage::parse(m).unwrap();
            assert_eq!(parsed.authorities.iter().any(|r| r.rtype == 6), i == 0, "the SOA in the first message only");
            records += parsed.authorities.len();
        }
        assert_eq!(records, 5001);
    }

    #[test]
    fn expected_signatures_count_what_dnssec_signzone_signs() {
        let zone = Name::from_ascii("example.test.").unwrap();
        let records = vec![
            soa(1),
            rec("example.test.", 2, 300, &name_wire("ns0.example.test.")),
            rec("ns0.example.test.", 1, 300, &[127, 0, 0, 1]),
            rec("www.example.test.", 1, 300, &[192, 0, 2, 80]),
            rec("www.example.test.", 28, 300, &[0; 16]),
            // A delegation: its NS and glue unsigned, its DS signed.
            rec("sub.example.test.", 2, 300, &name_wire("ns.sub.example.test.")),
            rec("sub.example.test.", 43, 300, &[1, 2, 8, 2, 0xaa]),
            rec("ns.sub.example.test.", 1, 300, &[192, 0, 2, 53]),
        ];
        // RRsets: SOA, apex NS, ns0 A, www A, www AAAA, sub DS = 6; NSEC at apex, ns0, www,
        // sub = 4; the DNSKEY = 1.
        assert_eq!(expected_signatures(&zone, &records), 11);
    }

    #[test]
    fn kept_records_round_trip_and_name_their_signing() {
        let lists = vec![vec![b"abc".to_vec(), Vec::new()], vec![vec![7; 300]]];
        let bytes = encode_records(42, &lists);
        assert_eq!(decode_records(&bytes, 42), Some(lists));
        assert_eq!(decode_records(&bytes, 41), None, "another signing's");
        assert_eq!(decode_records(&bytes[..bytes.len() - 1], 42), None, "cut short");
    }

    #[test]
    fn a_round_keeps_the_signatures_of_what_is_still_in_the_zone() {
        let unsigned = "example.test. 300 IN SOA ns0.example.test. h.example.test. 9 3600 900 604800 300\n\
                        www.example.test. 300 IN A 192.0.2.80\n\
                        new.example.test. 300 IN A 192.0.2.81\n";
        let signed = "; comment\n\
                      example.test. 300 IN SOA ns0.example.test. h.example.test. 7 3600 900 604800 300\n\
                      example.test. 300 IN RRSIG SOA 8 2 300 20300101000000 20200101000000 1 example.test. AAAA\n\
                      example.test. 300 IN DNSKEY 257 3 8 AwEAAQ==\n\
                      example.test. 300 IN RRSIG DNSKEY 8 2 300 20300101000000 20200101000000 1 example.test. BBBB\n\
                      example.test. 300 IN NSEC gone.example.test. SOA RRSIG NSEC DNSKEY\n\
                      example.test. 300 IN RRSIG NSEC 8 2 300 20300101000000 20200101000000 1 example.test. CCCC\n\
                      gone.example.test. 300 IN A 192.0.2.1\n\
                      gone.example.test. 300 IN NSEC www.example.test. A RRSIG NSEC\n\
                      gone.example.test. 300 IN RRSIG A 8 3 300 20300101000000 20200101000000 1 example.test. DDDD\n\
                      gone.example.test. 300 IN RRSIG NSEC 8 3 300 20300101000000 20200101000000 1 example.test. EEEE\n\
                      WWW.example.test. 300 IN RRSIG A 8 3 300 20300101000000 20200101000000 1 example.test. FFFF\n\
                      www.example.test. 300 IN RRSIG AAAA 8 3 300 20300101000000 20200101000000 1 example.test. GGGG\n";
        let input = with_kept_signatures(unsigned, signed);
        let kept: Vec<&str> = input.lines().filter(|l| l.split_whitespace().nth(3) == Some("RRSIG")).map(|l| l.rsplit(' ').next().unwrap()).collect();
        assert_eq!(kept, ["AAAA", "BBBB", "CCCC", "FFFF"], "SOA, DNSKEY, the apex NSEC, www A (owner case aside); not what the writes removed");
        assert!(input.starts_with(unsigned), "the content as it is now, unchanged");
        assert!(input.contains("example.test. 300 IN NSEC gone.example.test."), "the NSEC of a remaining name, for its signature to be kept");
        assert!(
            !input.contains("gone.example.test. 300 IN NSEC") && !input.contains(" DNSKEY 257"),
            "no NSEC of a removed name, no DNSKEY (the signer adds it)"
        );
        assert_eq!(round_counts(&[vec![b"r".to_vec()], vec![30u32.to_be_bytes().to_vec(), 7u32.to_be_bytes().to_vec()]]), [30, 7]);
        assert!(round_counts(&[vec![b"r".to_vec()]]).is_empty());
    }
}
