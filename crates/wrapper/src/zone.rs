//! Operations on the whole zone that the executor runs at an ordered point:
//! the content digest for checkpoints, the paper's sign-zone command, and the
//! slices of incremental re-signing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use hickory_proto::rr::{Name, RecordType};
use hickory_proto::serialize::binary::BinEncodable;
use named_glue::conf::NamedConf;
use named_glue::forward::{build_query, Forwarder};
use named_glue::keys::ZoneKey;
use named_glue::rrwire::{RawMessage, RawRecord};
use named_glue::signer::SignatureTimes;
use named_glue::signzone::sign_zone_file;
use named_glue::supervisor::Supervisor;
use named_glue::tools::BindTools;

use crate::auth::tsig;

const TYPE_RRSIG: u16 = 46;
const CLASS_IN: u16 = 1;
const CLASS_NONE: u16 = 254;
/// A slice's UPDATE stays well inside one TCP message (with room for the TSIG).
const MAX_SLICE_MESSAGE: usize = 60_000;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZoneError {
    #[error("zone transfer from named failed: {0}")]
    Transfer(String),
    #[error("named-compilezone failed: {0}")]
    Compile(String),
    #[error("signing the zone failed: {0}")]
    Sign(String),
    #[error("io on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("named did not come back after loading the signed zone: {0}")]
    Restart(String),
    #[error("named answered the re-signing update with rcode {0}")]
    Refused(u8),
    #[error("building the re-signing update: {0}")]
    Build(String),
}

/// The digest of a zone's records (canonical wire form, as [`ZoneMaintenance::zone_records`]
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

/// Record types dnssec-signzone makes itself; a re-sign starts from the zone without them.
const DNSSEC_TYPES: [&str; 5] = ["RRSIG", "NSEC", "NSEC3", "NSEC3PARAM", "DNSKEY"];

pub struct ZoneMaintenance {
    pub tools: BindTools,
    pub zone: Name,
    pub named: Forwarder,
    pub conf: NamedConf,
    pub key: ZoneKey,
    pub signer_socket: PathBuf,
    pub supervisor: Arc<Supervisor>,
    /// Signs the re-signing updates; named.conf grants it RRSIG only.
    pub maintenance_key: tsig::Key,
    /// Forwarder for the re-signing updates (long timeout, like ordered writes).
    pub writes: Forwarder,
    /// A lower bound on every RRSIG expiration in the zone (0: unknown). Only ever
    /// raised by what a slice saw: writes and signings add signatures expiring later,
    /// so a slice whose horizon is below it has nothing to do and needs no AXFR. A
    /// shortcut only: the outcome is what the AXFR would have given.
    pub earliest_expiration: AtomicU32,
    /// The last slice's UPDATE, written before it is sent: a slice executed again after
    /// a crash (named applied it, the batch was not yet recorded as executed) sends the
    /// same deletions, which find nothing and change nothing, instead of choosing anew
    /// from a zone it already changed.
    pub slice_journal: PathBuf,
}

/// What one slice did, for the log and the progress metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceReport {
    /// RRsets re-signed (named was asked to and answered NOERROR).
    pub resigned: u32,
    /// Signatures that were due (this slice's and those left for later ones).
    pub due: u32,
    /// Signatures in the zone; `None` when the AXFR was skipped.
    pub total: Option<u32>,
}

impl ZoneMaintenance {
    /// The zone's records, each in canonical wire form (owner and the names of
    /// compressible rdata decompressed and lowercased, every other rdata as named
    /// sent it), from an AXFR of the local named. Read with `rrwire`, so a record
    /// named accepts but a full decoder rejects still counts.
    pub async fn zone_records(&self) -> Result<Vec<Vec<u8>>, ZoneError> {
        Ok(self.raw_records().await?.iter().map(RawRecord::to_wire).collect())
    }

    async fn raw_records(&self) -> Result<Vec<RawRecord>, ZoneError> {
        let request = build_query(0, &self.zone, RecordType::AXFR).map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let stream = self.named.axfr(&request).await.map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let messages = stream.collect().await.map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let mut out = Vec::new();
        for bytes in messages {
            let m = RawMessage::parse(&bytes).map_err(|e| ZoneError::Transfer(e.to_string()))?;
            if m.header.rcode() != 0 {
                return Err(ZoneError::Transfer(format!("named answered the AXFR with rcode {}", m.header.rcode())));
            }
            out.extend(m.answers);
        }
        Ok(out)
    }

    /// One slice of incremental re-signing: the RRSIGs expiring at or before
    /// `due_before_s`, soonest first, at most `max_rrsets`, are deleted by an UPDATE
    /// signed with the maintenance key; named (patched to accept exact RRSIG deletions)
    /// signs those RRsets again through the signing service, which must be answering
    /// with the slice's agreed times meanwhile. Every honest replica holds the same
    /// zone, so all choose the same RRsets and get the same signatures. Waits for named
    /// however long it takes, as an ordered write does.
    pub async fn resign_slice(&self, seq: u64, due_before_s: u32, max_rrsets: u32, times: SignatureTimes) -> Result<SliceReport, ZoneError> {
        let (report, body, rest_earliest) = match self.journaled_slice(seq).await {
            Some((report, body)) => (report, body, None),
            None => {
                let floor = self.earliest_expiration.load(Ordering::Relaxed);
                if floor != 0 && due_before_s < floor {
                    return Ok(SliceReport::default());
                }
                let records = self.raw_records().await?;
                let plan = plan_slice(&records, due_before_s, max_rrsets as usize);
                let report = SliceReport { resigned: plan.chosen.len() as u32, due: plan.due as u32, total: Some(plan.total as u32) };
                if plan.chosen.is_empty() {
                    self.earliest_expiration.store(plan.rest_earliest.unwrap_or(0), Ordering::Relaxed);
                    return Ok(report);
                }
                let body = build_slice_update(&self.zone, &plan.chosen)?;
                let mut journal = seq.to_be_bytes().to_vec();
                journal.extend_from_slice(&report.resigned.to_be_bytes());
                journal.extend_from_slice(&report.due.to_be_bytes());
                journal.extend_from_slice(&(plan.total as u32).to_be_bytes());
                journal.extend_from_slice(&body);
                let tmp = self.slice_journal.with_extension("tmp");
                tokio::fs::write(&tmp, &journal).await.map_err(|source| ZoneError::Io { path: tmp.clone(), source })?;
                tokio::fs::rename(&tmp, &self.slice_journal).await.map_err(|source| ZoneError::Io { path: self.slice_journal.clone(), source })?;
                (report, body, plan.rest_earliest)
            }
        };
        let mut pause = std::time::Duration::from_millis(50);
        let answer = loop {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            let message = tsig::sign(&body, &self.maintenance_key, now, tsig::ANSWER_FUDGE, 0, Vec::new(), None);
            match self.writes.forward_tcp(&message).await {
                Ok(a) => break a,
                Err(e) => {
                    tracing::warn!(error = %e, "named did not answer a re-signing update; waiting for it and sending again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(2));
                }
            }
        };
        let rcode = named_glue::rrwire::RawHeader::parse(&answer).map(|h| h.rcode()).unwrap_or(2);
        if rcode != 0 {
            return Err(ZoneError::Refused(rcode));
        }
        // The re-signed RRsets now expire at times.expiration, later than the rest.
        let floor = rest_earliest.map_or(times.expiration, |e| e.min(times.expiration));
        self.earliest_expiration.store(floor, Ordering::Relaxed);
        Ok(report)
    }

    /// The journaled slice of batch `seq`, if this replica already chose it.
    async fn journaled_slice(&self, seq: u64) -> Option<(SliceReport, Vec<u8>)> {
        let bytes = tokio::fs::read(&self.slice_journal).await.ok()?;
        let (head, body) = (bytes.get(..20)?, bytes.get(20..)?);
        let word = |i: usize| u32::from_be_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        if u64::from_be_bytes(head[..8].try_into().ok()?) != seq {
            return None;
        }
        Some((SliceReport { resigned: word(8), due: word(12), total: Some(word(16)) }, body.to_vec()))
    }

    /// Signs the zone's current content (file plus journal) with the distributed key,
    /// then restarts named on the signed file. Every replica does this at the same
    /// point of the log with the same agreed times, so all get the same signed zone.
    pub async fn sign_zone(&self, times: SignatureTimes) -> Result<(), ZoneError> {
        let dir = &self.conf.directory;
        let merged = dir.join("resign.merged");
        let unsigned = dir.join("resign.unsigned");
        let signed = dir.join("resign.signed");
        let zone_text = self.zone.to_ascii();

        // BIND's own tool folds the journal into the file, in full one-RR-per-line style.
        let out = tokio::process::Command::new(self.tools.bin("named-compilezone"))
            .args(["-q", "-j", "-s", "full", "-o"])
            .arg(&merged)
            .arg(&zone_text)
            .arg(&self.conf.zone_file)
            .output()
            .await
            .map_err(|e| ZoneError::Compile(e.to_string()))?;
        if !out.status.success() {
            return Err(ZoneError::Compile(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))));
        }
        let text = tokio::fs::read_to_string(&merged).await.map_err(|source| ZoneError::Io { path: merged.clone(), source })?;
        let stripped = strip_dnssec(&text);
        tokio::fs::write(&unsigned, stripped).await.map_err(|source| ZoneError::Io { path: unsigned.clone(), source })?;

        sign_zone_file(&self.tools, &self.zone, &unsigned, &signed, &self.conf.key_directory, &self.key, &self.signer_socket, times)
            .await
            .map_err(|e| ZoneError::Sign(e.to_string()))?;

        tokio::fs::rename(&signed, &self.conf.zone_file)
            .await
            .map_err(|source| ZoneError::Io { path: self.conf.zone_file.clone(), source })?;
        match tokio::fs::remove_file(&self.conf.journal).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(ZoneError::Io { path: self.conf.journal.clone(), source }),
        }
        for p in [&merged, &unsigned] {
            let _ = tokio::fs::remove_file(p).await;
        }
        self.supervisor.restart().await.map_err(|e| ZoneError::Restart(e.to_string()))?;
        self.supervisor.wait_ready().await.map_err(|e| ZoneError::Restart(e.to_string()))
    }
}

/// The signatures one slice re-signs, chosen from the zone's records.
#[derive(Debug)]
struct SlicePlan<'a> {
    chosen: Vec<&'a RawRecord>,
    due: usize,
    total: usize,
    /// The earliest expiration among the signatures not chosen.
    rest_earliest: Option<u32>,
}

/// The RRSIG rdata's expiration (RFC 4034 3.1: offset 8).
fn rrsig_expiration(r: &RawRecord) -> Option<u32> {
    let b = r.rdata.get(8..12)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Chooses, from the zone's records, the RRSIGs expiring at or before `due_before_s`:
/// soonest first, ties broken by owner (lowercased wire form) and covered type, then
/// the rdata, so the choice is a function of the zone's content alone. Expirations
/// are compared as plain numbers: agreed times stay far from the 2106 wrap.
fn plan_slice(records: &[RawRecord], due_before_s: u32, max: usize) -> SlicePlan<'_> {
    let mut sigs: Vec<(u32, &RawRecord)> = records.iter().filter(|r| r.rtype == TYPE_RRSIG).filter_map(|r| rrsig_expiration(r).map(|e| (e, r))).collect();
    sigs.sort_by(|(ea, a), (eb, b)| ea.cmp(eb).then_with(|| a.owner.cmp(&b.owner)).then_with(|| a.rdata[..2].cmp(&b.rdata[..2])).then_with(|| a.rdata.cmp(&b.rdata)));
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
fn build_slice_update(zone: &Name, sigs: &[&RawRecord]) -> Result<Vec<u8>, ZoneError> {
    let count = u16::try_from(sigs.len()).map_err(|_| ZoneError::Build("too many records".into()))?;
    let mut zone_lc = zone.to_lowercase();
    zone_lc.set_fqdn(true);
    let zone_wire = zone_lc.to_bytes().map_err(|e| ZoneError::Build(e.to_string()))?;
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
        let len = u16::try_from(r.rdata.len()).map_err(|_| ZoneError::Build("RRSIG rdata too long".into()))?;
        m.extend_from_slice(&len.to_be_bytes());
        m.extend_from_slice(&r.rdata);
    }
    Ok(m)
}

/// Drops DNSSEC records from a zone in named-compilezone's full style
/// (`owner ttl class type rdata`, one record per line).
fn strip_dnssec(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let rtype = line.split_whitespace().nth(3).unwrap_or("");
        if DNSSEC_TYPES.contains(&rtype) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_wire(text: &str) -> Vec<u8> {
        Name::from_ascii(text).unwrap().to_bytes().unwrap()
    }

    fn rrsig(owner: &str, covered: u16, expiration: u32) -> RawRecord {
        let mut rdata = Vec::new();
        rdata.extend_from_slice(&covered.to_be_bytes());
        rdata.extend_from_slice(&[8, 3, 0, 0, 1, 44]);
        rdata.extend_from_slice(&expiration.to_be_bytes());
        rdata.extend_from_slice(&expiration.saturating_sub(1000).to_be_bytes());
        rdata.extend_from_slice(&[0x12, 0x34]);
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
        let plan = plan_slice(&zone, 700, 3);
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
        let again = plan_slice(&shuffled, 700, 3);
        assert_eq!(again.chosen.iter().map(|r| r.to_wire()).collect::<Vec<_>>(), plan.chosen.iter().map(|r| r.to_wire()).collect::<Vec<_>>());
        // Nothing due: nothing chosen, the earliest expiration reported.
        let none = plan_slice(&zone, 299, 3);
        assert!(none.chosen.is_empty());
        assert_eq!((none.due, none.rest_earliest), (0, Some(300)));
    }

    #[test]
    fn a_slice_stays_inside_one_message() {
        let zone: Vec<RawRecord> = (0..1000).map(|i| rrsig(&format!("n{i}.example.test."), 1, 100)).collect();
        let plan = plan_slice(&zone, 100, 1000);
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

    #[test]
    fn strips_only_dnssec_types() {
        let text = "example.test. 300 IN SOA ns0.example.test. h.example.test. 1 3600 900 604800 300\n\
                    example.test. 300 IN RRSIG SOA 8 2 300 20300101000000 20200101000000 1 example.test. AAAA\n\
                    example.test. 300 IN DNSKEY 257 3 8 AwEAAQ==\n\
                    example.test. 300 IN NSEC www.example.test. SOA RRSIG NSEC DNSKEY\n\
                    www.example.test. 300 IN A 192.0.2.80\n\
                    txt.example.test. 300 IN TXT \"RRSIG in text is data\"\n";
        let s = strip_dnssec(text);
        assert_eq!(s.lines().count(), 3, "{s}");
        assert!(s.contains(" SOA ") && s.contains(" A 192.0.2.80") && s.contains("RRSIG in text"));
    }
}
