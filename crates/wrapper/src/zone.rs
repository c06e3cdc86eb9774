//! Operations on the whole zone that the executor runs at an ordered point:
//! the content digest for checkpoints, the paper's sign-zone command (begun at one
//! point of the log, signed in the background, installed at a later point), and the
//! slices of incremental re-signing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use exec::auth::tsig;
use exec::zone_plan::{
    apply_ixfr, apply_ixfr_kept, build_slice_update, decode_records, encode_records, expected_signatures, ixfr_request, plan_slice, round_counts, split_wire,
    with_kept_signatures, PlanError, ZoneDiff, DNSSEC_TYPE_CODES, TYPE_RRSIG,
};
use hickory_proto::rr::{Name, RecordType};
use hickory_proto::serialize::binary::BinEncodable;
use named_glue::conf::ZoneConf;
use named_glue::forward::{build_query, Forwarder};
use named_glue::keys::ZoneKey;
use named_glue::rrwire::{split_record, RawMessage, RawRecord};
use named_glue::signer::SignatureTimes;
use named_glue::signzone::sign_zone_file;
use named_glue::supervisor::Supervisor;
use named_glue::tools::BindTools;

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

/// The zone plan's messages that could not be built: the IXFR query counts as the transfer
/// it starts, an UPDATE as the re-signing it carries.
impl From<PlanError> for ZoneError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::Build(text) => ZoneError::Build(text),
            PlanError::Query(text) => ZoneError::Transfer(text),
        }
    }
}

/// Files of a background whole-zone signing, in named's directory.
const BASE_TEXT: &str = "signzone.unsigned";
/// The records the signer starts from (case kept; see [`signer_input`]), written
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

/// What one zone's maintenance is made from: the zone's own settings
/// (`config::MaintenanceConfig`, the signer's threads resolved), named's set-up for it, the
/// zone's key and the signing sockets. The tasks and handles it works with are
/// [`ZoneMaintenance::new`]'s other arguments; what it learns as it runs starts empty there.
pub struct ZoneMaintenanceConfig {
    pub tools: BindTools,
    pub zone: Name,
    /// named's directory: this zone's working files (base text, signed output) go there.
    pub work_dir: PathBuf,
    /// The zone's files as named.conf names them (zone file, journal, key directory).
    pub files: ZoneConf,
    /// named.conf's `masterfile-format raw`.
    pub raw_zone_file: bool,
    pub key: ZoneKey,
    /// The signing socket of ordered writes and re-signing.
    pub signer_socket: PathBuf,
    /// The signing socket of background signings.
    pub background_socket: PathBuf,
    /// Signs the re-signing updates (named.conf grants it RRSIG only).
    pub maintenance_key: tsig::Key,
    /// Signs the catch-up update after a background signing.
    pub catchup_key: tsig::Key,
    /// The last re-signing slice's UPDATE, kept for a crash.
    pub slice_journal: PathBuf,
    /// dnssec-signzone's threads in a whole-zone signing.
    pub signer_threads: usize,
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
    /// The zone's rollover was finished by the replicas' reports of the parent's new DS
    /// (replicated state: `exec::ExecCore::rollover_finished`, set by the executor before
    /// every signing it begins or finishes): a signing leaves the rollover's records out.
    pub rollover_finished: std::sync::atomic::AtomicBool,
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
    /// One zone's maintenance: `named` answers its transfers, `writes` takes its re-signing
    /// updates (the ordered writes' long timeout), `supervisor` restarts named to install a
    /// signed zone.
    pub fn new(config: ZoneMaintenanceConfig, supervisor: Arc<Supervisor>, named: Forwarder, writes: Forwarder) -> ZoneMaintenance {
        let ZoneMaintenanceConfig {
            tools,
            zone,
            work_dir,
            files,
            raw_zone_file,
            key,
            signer_socket,
            background_socket,
            maintenance_key,
            catchup_key,
            slice_journal,
            signer_threads,
        } = config;
        ZoneMaintenance {
            tools,
            zone,
            named,
            work_dir,
            files,
            raw_zone_file,
            key,
            signer_socket,
            supervisor,
            maintenance_key,
            writes,
            catchup_key,
            background_socket,
            earliest_expiration: AtomicU32::new(0),
            slice_journal,
            signer_threads,
            slice_index: Default::default(),
            rollover_finished: Default::default(),
        }
    }

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
        let marker = Name::from_ascii(exec::names::marker_name(&apex.to_ascii()))
            .and_then(|n| n.to_lowercase().to_bytes())
            .map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let mut unsigned = Vec::new();
        let mut kept = Vec::new();
        for (bytes, m) in &messages {
            for r in &m.answers {
                if !DNSSEC_TYPE_CODES.contains(&r.rtype) {
                    unsigned.push(r.to_wire());
                }
                kept.push(exec::signer_input::case_kept(bytes, r).ok_or_else(|| ZoneError::Transfer("a record of the transfer does not read back".into()))?);
            }
        }
        unsigned.sort();
        unsigned.dedup();
        // The AXFR ends with the SOA again.
        let mut signer: Vec<Vec<u8>> =
            exec::signer_input::signer_records_at(kept, &apex_wire, &marker, self.key.key_tag(), self.rollover_finished.load(Ordering::Relaxed))
                .iter()
                .map(RawRecord::to_wire)
                .collect();
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
            let text = exec::signer_input::zone_text(&records);
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
