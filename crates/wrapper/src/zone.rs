//! Operations on the whole zone that the executor runs at an ordered point:
//! the content digest for checkpoints, the paper's sign-zone command (begun at one
//! point of the log, signed in the background, installed at a later point), and the
//! slices of incremental re-signing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use hickory_proto::rr::{Name, RecordType};
use hickory_proto::serialize::binary::BinEncodable;
use named_glue::conf::ZoneConf;
use named_glue::forward::{build_query, Forwarder};
use named_glue::keys::ZoneKey;
use named_glue::rrwire::{soa_rdata_serial, split_record, RawMessage, RawRecord};
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
    #[error("background signing: {0}")]
    Background(String),
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

/// The SOA serial among a zone's records (canonical wire form, as
/// [`ZoneMaintenance::zone_records`] returns them), for the status; `None` without a
/// readable SOA.
pub fn soa_serial_of(records: &[Vec<u8>]) -> Option<u32> {
    const TYPE_SOA: u16 = 6;
    let rdata = records.iter().find_map(|r| split_wire(r).filter(|(_, rtype, ..)| *rtype == TYPE_SOA).map(|(.., rdata)| rdata))?;
    soa_rdata_serial(rdata)
}

/// Record types dnssec-signzone makes itself (RRSIG, NSEC, DNSKEY, NSEC3, NSEC3PARAM).
const DNSSEC_TYPE_CODES: [u16; 5] = [46, 47, 48, 50, 51];
const TYPE_NS: u16 = 2;
const TYPE_DS: u16 = 43;

/// Files of a background whole-zone signing, in named's directory.
const BASE_TEXT: &str = "signzone.unsigned";
/// The records the signer starts from (case kept; see [`crate::signer_input`]), written
/// while the executor holds the log; the text is made from them in the background.
const SIGNER_RECORDS: &str = "signzone.input-records";
const BASE_RECORDS: &str = "signzone.base";
const SIGNED: &str = "signzone.signed";
/// The signed zone in the format named loads (raw), made in the background so that the
/// installation only copies it.
const SIGNED_LOAD: &str = "signzone.signed.load";
const SIGNED_MARK: &str = "signzone.done";
const FINISH_JOURNAL: &str = "signzone.finish";

/// A background signing is installed once the writes ordered during its last round
/// changed at most this many records (named signs each of those, about three signatures
/// per added name, while the executor waits); otherwise another round signs them in the
/// background first.
pub const CATCH_UP_RECORDS: usize = 16;
/// Rounds (the whole-zone signing included) after which the signed zone is installed
/// whatever the writes changed meanwhile: a zone written to faster than a round signs
/// still gets installed, with a longer catch-up.
pub const MAX_ROUNDS: usize = 8;

/// What finishing a background signing round did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The signed zone is installed; this many records changed on top (the catch-up).
    Installed { changed: u32 },
    /// Too much changed during the round: another round begins here, signing the zone
    /// as it is now from the last round's output. `changed`: records changed during the
    /// round just ended; `rrsets`: signatures the zone will hold (progress).
    Round { changed: u32, rrsets: u64 },
}

pub struct ZoneMaintenance {
    pub tools: BindTools,
    pub zone: Name,
    pub named: Forwarder,
    /// named's directory: this zone's working files (base text, signed output) go there.
    pub work_dir: PathBuf,
    /// The zone's files as named.conf names them (zone file, journal, key directory).
    pub files: ZoneConf,
    /// named.conf's `masterfile-format raw`: the zone file is written and read as raw.
    pub raw_zone_file: bool,
    pub key: ZoneKey,
    pub signer_socket: PathBuf,
    pub supervisor: Arc<Supervisor>,
    /// Signs the re-signing updates; named.conf grants it RRSIG only.
    pub maintenance_key: tsig::Key,
    /// Forwarder for the re-signing updates (long timeout, like ordered writes).
    pub writes: Forwarder,
    /// Signs the update that brings a zone signed in the background up to date; named.conf
    /// grants it what the update keys may do (no DNSSEC types).
    pub catchup_key: tsig::Key,
    /// The signing socket of background signings: its signature times are the running
    /// signing's, whatever write executes meanwhile.
    pub background_socket: PathBuf,
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
    /// dnssec-signzone's threads in a whole-zone signing (`signing.zone_signer_threads`).
    pub signer_threads: usize,
    /// The zone's SOA and RRSIGs as the last slice saw them, with the supervisor's start
    /// count then (see [`Self::slice_records`]); `Default` to begin.
    pub slice_index: std::sync::Mutex<Option<(u64, Vec<Vec<u8>>)>>,
}

/// What one slice did, for the log and the progress metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceReport {
    /// RRsets re-signed (named was asked to and answered NOERROR).
    pub resigned: u32,
    /// Signatures that were due (this slice's and those left for later ones).
    pub due: u32,
    /// The threshold key's signatures in the zone; `None` when the AXFR was skipped.
    pub total: Option<u32>,
    /// The choice was made from the last slice's records and an IXFR since (not an AXFR).
    pub incremental: bool,
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
        Ok(self.transfer().await?.into_iter().flat_map(|(_, m)| m.answers).collect())
    }

    /// An AXFR of the local named: each message with what `rrwire` read from it.
    async fn transfer(&self) -> Result<Vec<(Vec<u8>, RawMessage)>, ZoneError> {
        let request = build_query(0, &self.zone, RecordType::AXFR).map_err(|e| ZoneError::Transfer(e.to_string()))?;
        self.transfer_of(&request, "AXFR").await
    }

    /// A zone transfer (`request`, an AXFR or IXFR query, named `kind` in errors) from the
    /// local named: each message with what `rrwire` read from it.
    async fn transfer_of(&self, request: &[u8], kind: &str) -> Result<Vec<(Vec<u8>, RawMessage)>, ZoneError> {
        let stream = self.named.axfr(request).await.map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let messages = stream.collect().await.map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let mut out = Vec::with_capacity(messages.len());
        for bytes in messages {
            let m = RawMessage::parse(&bytes).map_err(|e| ZoneError::Transfer(e.to_string()))?;
            if m.header.rcode() != 0 {
                return Err(ZoneError::Transfer(format!("named answered the {kind} with rcode {}", m.header.rcode())));
            }
            out.push((bytes, m));
        }
        Ok(out)
    }

    /// The zone's records less the DNSSEC ones (canonical wire form, sorted, as
    /// [`Self::content`] returns them) now, from `base` (that form, sorted) and an IXFR of
    /// the local named from `base`'s SOA serial: named's journal holds what the writes
    /// since then changed, a few records where the AXFR is the whole signed zone. named
    /// may answer AXFR-style (its journal no longer reaches back): then from that. `None`
    /// when the answer does not apply to `base` exactly (a deletion of a record `base`
    /// lacks, an end SOA the result does not hold): the caller transfers the whole zone.
    /// Either way the outcome is the zone's content, the same on every honest replica.
    async fn content_since(&self, base: &[Vec<u8>]) -> Result<Option<Vec<Vec<u8>>>, ZoneError> {
        let Some(records) = self.ixfr_since(base).await? else { return Ok(None) };
        Ok(apply_ixfr(base, &records))
    }

    /// The records of an IXFR of the local named from the serial of the SOA among `base`
    /// (`None` without one).
    async fn ixfr_since(&self, base: &[Vec<u8>]) -> Result<Option<Vec<RawRecord>>, ZoneError> {
        let Some(base_soa) = base.iter().find(|r| split_wire(r).is_some_and(|(_, t, ..)| t == named_glue::rrwire::TYPE_SOA)) else {
            return Ok(None);
        };
        let request = ixfr_request(&self.zone, base_soa)?;
        Ok(Some(self.transfer_of(&request, "IXFR").await?.into_iter().flat_map(|(_, m)| m.answers).collect()))
    }

    /// The zone's SOA and RRSIGs (canonical wire form, sorted), what a slice chooses from:
    /// from the records kept at the last slice with an IXFR since applied, so that a slice
    /// costs what changed since, not a transfer of the whole signed zone. Kept only while
    /// the same named runs: an installation or a state transfer replaces the zone (and its
    /// journal) under a serial that may not change, and restarts named. Any answer that
    /// does not apply exactly is set aside for an AXFR. The outcome is the zone's content
    /// either way, so every honest replica chooses alike.
    async fn slice_records(&self) -> Result<(Vec<RawRecord>, bool), ZoneError> {
        let is_rrsig = |rtype: u16| rtype == TYPE_RRSIG;
        let starts = self.supervisor.starts();
        let kept = self.slice_index.lock().unwrap_or_else(|e| e.into_inner()).take().filter(|(at, _)| *at == starts);
        let mut now = None;
        if let Some((_, base)) = kept {
            if let Some(records) = self.ixfr_since(&base).await? {
                now = apply_ixfr_kept(&base, &records, is_rrsig);
            }
        }
        let incremental = now.is_some();
        let now = match now {
            Some(now) => now,
            None => {
                let mut all: Vec<Vec<u8>> =
                    self.raw_records().await?.iter().filter(|r| is_rrsig(r.rtype) || r.rtype == named_glue::rrwire::TYPE_SOA).map(RawRecord::to_wire).collect();
                all.sort();
                all.dedup();
                all
            }
        };
        let records = now
            .iter()
            .filter_map(|w| {
                split_record(w).map(|(owner, rtype, class, ttl, rdata)| RawRecord {
                    owner: owner.to_vec(),
                    rtype,
                    class,
                    ttl,
                    rdata: rdata.to_vec(),
                    span: 0..0,
                })
            })
            .collect();
        *self.slice_index.lock().unwrap_or_else(|e| e.into_inner()) = Some((starts, now));
        Ok((records, incremental))
    }

    /// The zone's content for a signing, from one AXFR: the records less the DNSSEC ones
    /// (canonical wire form, sorted: the catch-up's base) and the signer's records (case
    /// kept, rollover keys included: the signer's input).
    async fn content(&self) -> Result<(Vec<Vec<u8>>, Vec<Vec<u8>>), ZoneError> {
        let messages = self.transfer().await?;
        let mut apex = self.zone.to_lowercase();
        apex.set_fqdn(true);
        let apex_wire = apex.to_bytes().map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let marker = Name::from_ascii(crate::adopt::rollover::marker_name(&apex.to_ascii()))
            .and_then(|n| n.to_lowercase().to_bytes())
            .map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let mut unsigned = Vec::new();
        let mut kept = Vec::new();
        for (bytes, m) in &messages {
            for r in &m.answers {
                if !DNSSEC_TYPE_CODES.contains(&r.rtype) {
                    unsigned.push(r.to_wire());
                }
                kept.push(crate::signer_input::case_kept(bytes, r).ok_or_else(|| ZoneError::Transfer("a record of the transfer does not read back".into()))?);
            }
        }
        unsigned.sort();
        unsigned.dedup();
        // The AXFR ends with the SOA again.
        let mut signer: Vec<Vec<u8>> =
            crate::signer_input::signer_records(kept, &apex_wire, &marker, self.key.key_tag()).iter().map(RawRecord::to_wire).collect();
        let mut seen = std::collections::HashSet::new();
        signer.retain(|r| seen.insert(r.to_ascii_lowercase()));
        Ok((unsigned, signer))
    }

    /// One slice of incremental re-signing: the RRSIGs expiring at or before
    /// `due_before_s`, soonest first, at most `max_rrsets`, are deleted by an UPDATE
    /// signed with the maintenance key; named (patched to accept exact RRSIG deletions)
    /// signs those RRsets again through the signing service, which must be answering
    /// with the slice's agreed times meanwhile. Every honest replica holds the same
    /// zone, so all choose the same RRsets and get the same signatures. Waits for named
    /// however long it takes, as an ordered write does. `begin_change` is called just
    /// before the update goes to named and its guard dropped once named answered (the read
    /// cache and the reused checkpoint digest must not outlive a slice that changed the
    /// zone); a slice with nothing due changes nothing and calls it not.
    pub async fn resign_slice<G>(
        &self,
        seq: u64,
        due_before_s: u32,
        max_rrsets: u32,
        times: SignatureTimes,
        begin_change: impl FnOnce() -> G,
    ) -> Result<SliceReport, ZoneError> {
        let (report, body, rest_earliest) = match self.journaled_slice(seq).await {
            Some((report, body)) => (report, body, None),
            None => {
                let floor = self.earliest_expiration.load(Ordering::Relaxed);
                if floor != 0 && due_before_s < floor {
                    return Ok(SliceReport::default());
                }
                let (records, incremental) = self.slice_records().await?;
                let plan = plan_slice(&records, due_before_s, max_rrsets as usize, self.key.key_tag());
                let report = SliceReport { resigned: plan.chosen.len() as u32, due: plan.due as u32, total: Some(plan.total as u32), incremental };
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
        let change = begin_change();
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
        drop(change);
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
        Some((SliceReport { resigned: word(8), due: word(12), total: Some(word(16)), incremental: false }, body.to_vec()))
    }

    fn file(&self, name: &str) -> PathBuf {
        self.work_dir.join(name)
    }

    /// Begins a background whole-zone signing at batch `seq`: keeps the zone's content
    /// now (text for the signer, records for the catch-up at the end). Every replica does
    /// this at the same point of the log, so all keep the same content. Returns how many
    /// signatures the signed zone will hold (for progress).
    pub async fn begin_signing(&self, seq: u64) -> Result<u64, ZoneError> {
        let started = std::time::Instant::now();
        for stale in [SIGNED, SIGNED_LOAD, SIGNED_MARK, FINISH_JOURNAL] {
            let _ = tokio::fs::remove_file(self.file(stale)).await;
        }
        // One AXFR, the zone as it is at this batch (the executor holds the next one until
        // this returns); the signer's text is made from it in the background.
        let (records, signer) = self.content().await?;
        let expected = expected_signatures(&self.zone, &records);
        write_atomic(&self.file(SIGNER_RECORDS), &encode_records(seq, &[signer])).await?;
        // Written last: its tag says the signing has begun.
        write_atomic(&self.file(BASE_RECORDS), &encode_records(seq, &[records])).await?;
        // The executor holds the log this long (issue 13: a read gap).
        tracing::info!(seq, hold_ms = started.elapsed().as_millis() as u64, "zone content kept for a whole-zone signing");
        Ok(expected)
    }

    /// The background part: signs the content kept at batch `seq` with the distributed key,
    /// through the background signing socket (which must be answering with the run's
    /// times). Off the log: the input and the times are fixed, so every replica signs the
    /// same bytes. Done once per run (a restart finds the mark and skips it).
    pub async fn sign_in_background(&self, seq: u64, times: SignatureTimes) -> Result<(), ZoneError> {
        if tokio::fs::read(self.file(SIGNED_MARK)).await.ok().as_deref() == Some(&seq.to_be_bytes()[..]) {
            return Ok(());
        }
        let base = tokio::fs::read(self.file(BASE_RECORDS)).await.map_err(|source| ZoneError::Io { path: self.file(BASE_RECORDS), source })?;
        let tag = base.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
        if tag.is_some_and(|t| t > seq) {
            // A later round began from this one's output, which it found done (a restart
            // between that round's beginning and its batch's persistence).
            return Ok(());
        }
        if tag != Some(seq) {
            return Err(ZoneError::Background(format!("the zone content kept here is not that of the signing begun at seq {seq}")));
        }
        self.write_signer_text(seq).await?;
        sign_zone_file(
            &self.tools,
            &self.zone,
            &self.file(BASE_TEXT),
            &self.file(SIGNED),
            &self.files.key_directory,
            &self.key,
            &self.background_socket,
            times,
            self.signer_threads,
        )
        .await
        .map_err(|e| ZoneError::Sign(e.to_string()))?;
        let (signed, load) = (self.file(SIGNED), self.file(SIGNED_LOAD));
        if self.raw_zone_file {
            let (tools, zone) = (self.tools.clone(), self.zone.to_ascii());
            tokio::task::spawn_blocking(move || tools.compile_raw(&zone, &signed, &load))
                .await
                .map_err(|e| ZoneError::Compile(e.to_string()))?
                .map_err(ZoneError::Compile)?;
        } else {
            tokio::fs::copy(&signed, &load).await.map_err(|source| ZoneError::Io { path: load.clone(), source })?;
        }
        write_atomic(&self.file(SIGNED_MARK), &seq.to_be_bytes()).await
    }

    /// Finishes background signing `run` at batch `seq`: replaces named's zone by the signed
    /// one, then applies, as updates signed with the catch-up key, what the writes ordered
    /// since `run` began changed (named signs those with the times published for this
    /// batch). The update is computed from the zone before it is replaced and journaled,
    /// so a finish executed again after a crash installs and applies the same. Returns the
    /// number of records changed on top.
    pub async fn finish_signing(&self, seq: u64, run: u64) -> Result<Finish, ZoneError> {
        let base_bytes = tokio::fs::read(self.file(BASE_RECORDS)).await.map_err(|source| ZoneError::Io { path: self.file(BASE_RECORDS), source })?;
        // A round already begun at this batch (executed again after a crash): the same outcome.
        if let Some(kept) = decode_records(&base_bytes, seq) {
            let rounds = round_counts(&kept);
            let changed = rounds.last().copied().unwrap_or(0);
            let rrsets = kept.first().map_or(0, |records| expected_signatures(&self.zone, records));
            return Ok(Finish::Round { changed, rrsets });
        }
        if tokio::fs::read(self.file(SIGNED_MARK)).await.ok().as_deref() != Some(&run.to_be_bytes()[..]) {
            return Err(ZoneError::Background(format!("no signed zone of the signing begun at seq {run}")));
        }
        let started = std::time::Instant::now();
        let mut kept = decode_records(&base_bytes, run).ok_or_else(|| ZoneError::Background("the kept zone content does not decode".into()))?;
        // Records changed during each earlier round (the rounds begun so far, less this one).
        let mut rounds = round_counts(&kept);
        let base = if kept.is_empty() { Vec::new() } else { kept.swap_remove(0) };
        let journal = self.file(FINISH_JOURNAL);
        // Where the catch-up was read from, for the log: named's journal (IXFR), the whole
        // zone (AXFR), or this finish's own journal (executed again after a crash).
        let mut diff_from = "ixfr";
        let (changed, messages) = match tokio::fs::read(&journal).await.ok().and_then(|b| decode_records(&b, seq)) {
            Some(mut parts) if !parts.is_empty() => {
                diff_from = "journal";
                let changed = parts.remove(0).len() as u32;
                (changed, parts.pop().unwrap_or_default())
            }
            _ => {
                // What changed since the round began, from named's journal (an IXFR), so
                // that an installation that is due does not transfer the whole signed zone.
                let (now, signer) = match self.content_since(&base).await? {
                    Some(now) => (now, None),
                    None => {
                        tracing::warn!(seq, run, "the IXFR since the round began did not apply to its content; transferring the whole zone");
                        diff_from = "axfr";
                        let (now, signer) = self.content().await?;
                        (now, Some(signer))
                    }
                };
                let read_ms = started.elapsed().as_millis() as u64;
                let diff = ZoneDiff::between(&base, &now);
                let changed = diff.len();
                // Decided from the zone's content and the rounds so far, both functions of
                // the log: every honest replica decides alike.
                if changed > CATCH_UP_RECORDS && rounds.len() + 1 < MAX_ROUNDS {
                    // Another round needs the signer's input, which only the AXFR gives. The
                    // executor holds the log, so the zone is the one the IXFR showed.
                    let (now, signer, changed) = match signer {
                        Some(signer) => (now, signer, changed),
                        None => {
                            let (now, signer) = self.content().await?;
                            let changed = ZoneDiff::between(&base, &now).len();
                            (now, signer, changed)
                        }
                    };
                    rounds.push(changed as u32);
                    let rrsets = self.begin_round(seq, now, signer, &rounds).await?;
                    tracing::info!(
                        seq,
                        run,
                        changed,
                        round = rounds.len() + 1,
                        read_ms,
                        hold_ms = started.elapsed().as_millis() as u64,
                        "signing round begun: the writes made during the last one are signed in the background first"
                    );
                    return Ok(Finish::Round { changed: changed as u32, rrsets });
                }
                let messages = diff.updates(&self.zone)?;
                // First part: one entry per changed record (only its count is read back).
                let counted = vec![Vec::new(); changed];
                write_atomic(&journal, &encode_records(seq, &[counted, messages.clone()])).await?;
                (changed as u32, messages)
            }
        };
        let diffed = started.elapsed();
        let (signed, zone_file, named_journal) = (self.file(SIGNED_LOAD), self.files.zone_file.clone(), self.files.journal.clone());
        // A copy, made while named still answers: the signed file stays for a finish
        // executed again after a crash.
        let tmp = zone_file.with_extension("installing");
        tokio::fs::copy(&signed, &tmp).await.map_err(|source| ZoneError::Io { path: tmp.clone(), source })?;
        let installed = self
            .supervisor
            .replace_files(move || {
                std::fs::rename(&tmp, &zone_file)?;
                match std::fs::remove_file(&named_journal) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            })
            .await
            .map_err(|e| ZoneError::Restart(e.to_string()))?;
        installed.map_err(|source| ZoneError::Io { path: self.files.zone_file.clone(), source })?;
        let restarted = started.elapsed();
        for body in &messages {
            let answer = self.send_maintenance(body, &self.catchup_key).await;
            let rcode = named_glue::rrwire::RawHeader::parse(&answer).map(|h| h.rcode()).unwrap_or(2);
            if rcode != 0 {
                return Err(ZoneError::Refused(rcode));
            }
        }
        rounds.push(changed);
        let per_round: Vec<String> = rounds.iter().map(u32::to_string).collect();
        // Where an installation's hold goes (issue 13: the hold is the read gap).
        tracing::info!(
            seq,
            run,
            changed,
            rounds = rounds.len(),
            round_records = per_round.join(","),
            messages = messages.len(),
            diff_from,
            diff_ms = diffed.as_millis() as u64,
            restart_ms = (restarted - diffed).as_millis() as u64,
            catch_up_ms = (started.elapsed() - restarted).as_millis() as u64,
            "signed zone installed"
        );
        Ok(Finish::Installed { changed })
    }

    /// Begins another round of the signing at batch `seq`: keeps the zone's content now
    /// (`records`, and as text for the signer) with, for the signer to keep, the last
    /// round's signatures of what is still in the zone. Every signature of a signing
    /// carries its first round's times, so an RRset that did not change gets the same
    /// bytes whether dnssec-signzone keeps its signature (it keeps those that verify and
    /// have not expired by its clock) or signs it again: the output is the same on every
    /// replica whatever its clock, and only what changed costs threshold signatures.
    /// `rounds`: records changed during each round so far. Returns the signatures the zone
    /// will hold.
    async fn begin_round(&self, seq: u64, records: Vec<Vec<u8>>, signer: Vec<Vec<u8>>, rounds: &[u32]) -> Result<u64, ZoneError> {
        let expected = expected_signatures(&self.zone, &records);
        write_atomic(&self.file(SIGNER_RECORDS), &encode_records(seq, &[signer])).await?;
        let counts: Vec<Vec<u8>> = rounds.iter().map(|c| c.to_be_bytes().to_vec()).collect();
        // Written last: its tag says the round has begun.
        write_atomic(&self.file(BASE_RECORDS), &encode_records(seq, &[records, counts])).await?;
        Ok(expected)
    }

    /// Writes the signer's input for the signing (or round) begun at `seq`: the records kept
    /// then as zone text, with, in a later round, the last round's signatures of what is
    /// still in the zone (see [`Self::begin_round`]). Off the log: a function of files
    /// every replica wrote alike. The last round's output may already be this round's own
    /// (a restart after the signer finished): its signatures are the same bytes.
    async fn write_signer_text(&self, seq: u64) -> Result<(), ZoneError> {
        let bytes = match tokio::fs::read(self.file(SIGNER_RECORDS)).await {
            Ok(bytes) => bytes,
            // Begun by a version that wrote the text itself.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tokio::fs::metadata(self.file(BASE_TEXT)).await.is_ok() => return Ok(()),
            Err(source) => return Err(ZoneError::Io { path: self.file(SIGNER_RECORDS), source }),
        };
        let records = decode_records(&bytes, seq)
            .and_then(|mut lists| lists.pop())
            .ok_or_else(|| ZoneError::Background(format!("the signer's records kept here are not those of the signing begun at seq {seq}")))?;
        let signed = match tokio::fs::read_to_string(self.file(SIGNED)).await {
            Ok(signed) => Some(signed),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(ZoneError::Io { path: self.file(SIGNED), source }),
        };
        let input = tokio::task::spawn_blocking(move || {
            let text = crate::signer_input::zone_text(&records);
            match signed {
                Some(signed) => with_kept_signatures(&text, &signed),
                None => text,
            }
        })
        .await
        .map_err(|e| ZoneError::Background(e.to_string()))?;
        write_atomic(&self.file(BASE_TEXT), input.as_bytes()).await
    }

    /// Sends a maintenance update to named until it answers (named restarting is waited
    /// for, as for an ordered write); signed with `key` and the local clock, which named
    /// checks.
    async fn send_maintenance(&self, body: &[u8], key: &tsig::Key) -> Vec<u8> {
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            let message = tsig::sign(body, key, now, tsig::ANSWER_FUDGE, 0, Vec::new(), None);
            match self.writes.forward_tcp(&message).await {
                Ok(a) => return a,
                Err(e) => {
                    tracing::warn!(error = %e, "named did not answer a maintenance update; waiting for it and sending again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(2));
                }
            }
        }
    }
}

async fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<(), ZoneError> {
    let tmp = path.with_extension("tmp");
    let io = |source| ZoneError::Io { path: path.to_path_buf(), source };
    tokio::fs::write(&tmp, bytes).await.map_err(io)?;
    tokio::fs::rename(&tmp, path).await.map_err(io)
}

/// `seq`, then lists of byte strings, each a u32 count and u32-length-prefixed items.
fn encode_records(seq: u64, lists: &[Vec<Vec<u8>>]) -> Vec<u8> {
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
fn decode_records(bytes: &[u8], seq: u64) -> Option<Vec<Vec<Vec<u8>>>> {
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
fn split_wire(record: &[u8]) -> Option<(&[u8], u16, u32, &[u8])> {
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
fn expected_signatures(zone: &Name, records: &[Vec<u8>]) -> u64 {
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
fn ixfr_request(zone: &Name, soa: &[u8]) -> Result<Vec<u8>, ZoneError> {
    let mut request = build_query(0, zone, RecordType::IXFR).map_err(|e| ZoneError::Transfer(e.to_string()))?;
    // NSCOUNT (header bytes 8-9): one record, appended after the question.
    request[8..10].copy_from_slice(&1u16.to_be_bytes());
    request.extend_from_slice(soa);
    Ok(request)
}

/// `base` (canonical wire form, DNSSEC types excluded, sorted) with an IXFR answer's
/// records applied (RFC 1995 section 4): one SOA alone, nothing changed; the requested
/// serial's SOA second, an incremental answer (parts opened by the old SOA, whose records
/// are deleted, then by the new one, whose records are added); otherwise AXFR-style, the
/// whole zone. DNSSEC records are passed over, as in [`ZoneMaintenance::content`]. `None`
/// when an incremental answer does not fit `base`: a deleted record it lacks, an added one
/// it holds, or a result whose SOA is not the answer's last.
fn apply_ixfr(base: &[Vec<u8>], records: &[RawRecord]) -> Option<Vec<Vec<u8>>> {
    apply_ixfr_kept(base, records, |rtype| !DNSSEC_TYPE_CODES.contains(&rtype))
}

/// [`apply_ixfr`] for a `base` that holds, besides the SOA, the records of the types
/// `kept` says (the SOA is always kept: it chains the answer's parts).
fn apply_ixfr_kept(base: &[Vec<u8>], records: &[RawRecord], kept: impl Fn(u16) -> bool) -> Option<Vec<Vec<u8>>> {
    use named_glue::rrwire::TYPE_SOA;
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
struct ZoneDiff<'a> {
    removed: Vec<&'a [u8]>,
    added: Vec<&'a [u8]>,
    soa: Option<&'a [u8]>,
}

impl<'a> ZoneDiff<'a> {
    /// `before` and `now` sorted and deduplicated.
    fn between(before: &'a [Vec<u8>], now: &'a [Vec<u8>]) -> ZoneDiff<'a> {
        use std::collections::BTreeSet;
        let is_soa = |r: &[u8]| split_wire(r).is_some_and(|(_, t, _, _)| t == named_glue::rrwire::TYPE_SOA);
        let b: BTreeSet<&[u8]> = before.iter().map(Vec::as_slice).collect();
        let n: BTreeSet<&[u8]> = now.iter().map(Vec::as_slice).collect();
        let removed = b.difference(&n).copied().filter(|r| !is_soa(r)).collect();
        let added = n.difference(&b).copied().filter(|r| !is_soa(r)).collect();
        let soa = n.difference(&b).copied().find(|r| is_soa(r));
        ZoneDiff { removed, added, soa }
    }

    fn len(&self) -> usize {
        self.removed.len() + self.added.len() + usize::from(self.soa.is_some())
    }

    /// UPDATE messages (each within one TCP message), the SOA in the first: with a serial
    /// above the installed one, named takes it as it is and increments only for the later
    /// messages. Deletions (class NONE, exact records) before additions.
    fn updates(&self, zone: &Name) -> Result<Vec<Vec<u8>>, ZoneError> {
        let mut entries: Vec<(bool, &[u8])> = Vec::new();
        entries.extend(self.soa.iter().map(|r| (false, *r)));
        entries.extend(self.removed.iter().map(|r| (true, *r)));
        entries.extend(self.added.iter().map(|r| (false, *r)));
        let mut zone_lc = zone.to_lowercase();
        zone_lc.set_fqdn(true);
        let zone_wire = zone_lc.to_bytes().map_err(|e| ZoneError::Build(e.to_string()))?;
        let mut out = Vec::new();
        let mut chunk: Vec<Vec<u8>> = Vec::new();
        let mut size = 12 + zone_wire.len() + 4 + 255;
        for (delete, r) in entries {
            let (owner, rtype, ttl, rdata) = split_wire(r).ok_or_else(|| ZoneError::Build("a record does not split".into()))?;
            let mut rr = owner.to_vec();
            rr.extend_from_slice(&rtype.to_be_bytes());
            rr.extend_from_slice(&(if delete { CLASS_NONE } else { CLASS_IN }).to_be_bytes());
            rr.extend_from_slice(&(if delete { 0 } else { ttl }).to_be_bytes());
            let len = u16::try_from(rdata.len()).map_err(|_| ZoneError::Build("rdata too long".into()))?;
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
fn plan_slice(records: &[RawRecord], due_before_s: u32, max: usize, key_tag: u16) -> SlicePlan<'_> {
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

/// Records changed during each round so far, as [`ZoneMaintenance::begin_round`] kept
/// them after the zone's records (none for the whole-zone signing's first round).
fn round_counts(kept: &[Vec<Vec<u8>>]) -> Vec<u32> {
    kept.get(1).map_or_else(Vec::new, |counts| counts.iter().filter_map(|c| c.as_slice().try_into().ok().map(u32::from_be_bytes)).collect())
}

/// A round's input for dnssec-signzone: the zone's content now (`unsigned`, one record per
/// line) with the RRSIGs of the last round's output (`signed`, the same style) that cover
/// an RRset still in the zone: the DNSKEY's, each remaining RRset's, and the NSEC's of
/// each remaining name, whose NSEC comes along too (dnssec-signzone drops the signatures
/// of a type the input lacks before it rebuilds the chain, so without it every NSEC would
/// be signed again). dnssec-signzone rebuilds the chain, keeps the signatures that still
/// verify and signs the rest; what the writes removed is left out.
fn with_kept_signatures(unsigned: &str, signed: &str) -> String {
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
        assert_eq!(parsed.questions[0].qtype, named_glue::rrwire::TYPE_IXFR);
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
