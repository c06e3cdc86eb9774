//! The execution core: ordered batches in, commands out, results back as events.
//!
//! No IO, no clock, no randomness: everything it decides comes from the batch (its
//! sequence number, agreed time and requests) and the replicated [`ExecState`], so
//! every honest replica decides alike. The tokio side (the wrapper's `executor`) performs
//! the commands and reports their results; it decides nothing.
//!
//! Rules it enforces:
//! - writes run one at a time, in log order, on every replica; each write's outcome
//!   (named's rcode, or the gate's refusal) is folded into the state's outcome chain;
//! - reads run only at the gateway that owes the answer, at most `max_reads_in_flight`
//!   at once, and never across a write or a whole-zone signing (a barrier waits for the
//!   reads issued before it);
//! - nothing waits on a client: answers are commands that the tokio side delivers
//!   without blocking;
//! - sign-zone begins once requests for it from `faults + 1` distinct replicas were
//!   ordered (within `sign_zone_window_s` of agreed time), each proven by its replica's
//!   signature (`authority`), each signed request counting at most once, and at most
//!   once per `sign_zone_interval_s`. It runs in the background: the zone's content at
//!   that point is what is signed, reads and writes go on meanwhile, and the signed zone
//!   is installed (with the writes ordered meanwhile applied on top) at the point of the
//!   log where `SignZoneFinish` from `faults + 1` replicas completes (docs/DETERMINISM.md,
//!   "Background whole-zone signing"), unless the writes changed too much meanwhile: then
//!   another round of the signing begins there (`Event::SigningRound`), with claims for it;
//! - an adopted zone's double-KSK rollover finishes once reports from `faults + 1` distinct
//!   replicas that the parent's DS covers the threshold key (`Op::RolloverReport`, each
//!   proven by its replica's signature and counted once) were ordered: the state records it
//!   and a whole-zone signing that leaves the rollover's records out begins there;
//! - re-signing is incremental: an ordered `Resign` at agreed time T, once the zone was
//!   signed and no earlier than `slice_interval_s` after the last slice, re-signs at most
//!   `slice_rrsets` RRsets whose signatures expire by T + (validity - `resign_after_s`),
//!   soonest first (docs/DETERMINISM.md, "Incremental re-signing");
//! - a write named does not answer is abandoned by a rule of the log, never a local timer:
//!   once ordered `Stuck` claims for that write from `faults + 1` distinct origins are
//!   committed (seen in batches after it, through [`ExecCore::committed`]), a replica that
//!   has not executed it records `code::ABANDONED`, answers its client SERVFAIL and goes on
//!   (docs/DETERMINISM.md, "Abandoned writes");
//! - ordered writes that an honest gateway's pre-ordering check answers itself (refused by
//!   the gate, or too long for named once re-signed) are counted per origin
//!   ([`ExecCore::hostile_writes`]): refused alike everywhere, and attributed.
//!
//! With several zones, sign-zone, finish claims and re-signing name their zone (its index in
//! the configuration's zone order) and each zone keeps its own counts and schedules in the
//! state (`ExecState::zones`, a BTreeMap by index); writes name theirs in their own zone
//! section, and all zones share one outcome chain and one log.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use dnswire::dnssec::SignatureTimes;
use hickory_proto::op::{Message, ResponseCode};

use crate::authority::{SignFinishAuth, SignZoneAuth, SignZoneVerifier, ZoneSetAction, ZoneSetChange};
use crate::classify::{classify, Kind, Verdict};
use crate::envelope::Op;
use crate::gate::{forwardable, replay_key, UpdateDecision, UpdateGate};
use crate::state::{code, ExecState, RecentWrite, SigningRun, ZoneEntry, MAX_ZONES};

/// named's answers to recent writes kept for retransmissions (local, not replicated:
/// only what to send, never whether to execute).
const ANSWER_CACHE: usize = 256;

/// Static parameters, the same on every replica.
#[derive(Clone, Debug)]
pub struct ExecConfig {
    pub id: u16,
    /// t: sign-zone needs requests from t+1 distinct replicas.
    pub faults: u16,
    /// Signature validity (s) from the agreed time.
    pub validity_s: u32,
    /// A signature this old (by agreed time) is due for re-signing.
    pub resign_after_s: u64,
    /// At most one re-signing slice per this much agreed time.
    pub slice_interval_s: u64,
    /// At most this many RRsets re-signed per slice.
    pub slice_rrsets: u32,
    /// At most one whole-zone signing per this much agreed time.
    pub sign_zone_interval_s: u64,
    /// A sign-zone request older than this (agreed time) no longer counts; nor does one
    /// whose signer's stamp is further than this from the agreed time.
    pub sign_zone_window_s: u64,
    /// Checks which replica signed a sign-zone request: one per configured zone, in zone
    /// index order (each checks that the request names its zone). Its length is the number
    /// of configured zones, which seed the zone set (`ExecState::zone_set`); a zone added at
    /// run time gets its verifier from the same CA. A request for an index not served is
    /// refused.
    pub sign_zone_verifiers: Vec<SignZoneVerifier>,
    /// Reads executing at once at this gateway.
    pub max_reads_in_flight: usize,
}

/// One delivered batch, with the reply handles this gateway holds for its own requests.
#[derive(Debug)]
pub struct Delivered<R> {
    pub seq: u64,
    /// Agreed time, microseconds since the epoch.
    pub time_us: u64,
    pub checkpoint_due: bool,
    pub requests: Vec<Item<R>>,
}

#[derive(Debug)]
pub struct Item<R> {
    pub origin: u16,
    pub payload: Vec<u8>,
    /// Where the answer goes, if this replica is the request's gateway and still holds
    /// the client.
    pub reply: Option<R>,
}

/// What the tokio side must do.
#[derive(Debug, PartialEq, Eq)]
pub enum Command<R> {
    /// Ask named (a query, or a zone transfer) and send its answer to `reply`; report
    /// [`Event::ReadDone`] once named's answer (the first message of a transfer) is in.
    Read { id: u64, transfer: bool, tcp: bool, message: Vec<u8>, reply: R },
    /// Forward this write to named with these agreed signature times; wait for named
    /// however long it takes (retrying while it is down), then report
    /// [`Event::WriteAnswered`].
    Write { seq: u64, index: u32, message: Vec<u8>, times: SignatureTimes },
    /// Begin a background whole-zone signing: keep the zone's content as it is now (what
    /// will be signed, with these agreed times); report [`Event::SigningBegun`]. The
    /// signing itself runs off the log.
    BeginSigning { zone: u16, seq: u64, times: SignatureTimes },
    /// Install the zone signed by background run `run` (waiting for this replica's part
    /// of it however long it takes), then apply on top of it what changed since `run`
    /// began, with this batch's agreed `times`; report [`Event::SigningFinished`]. When
    /// that is more than a short catch-up (a function of the zone's content and of the
    /// rounds so far, so the same on every honest replica), begin another round here
    /// instead and report [`Event::SigningRound`].
    FinishSigning { zone: u16, seq: u64, run: SigningRun, times: SignatureTimes },
    /// Re-sign, in zone `zone`, at most `max_rrsets` RRsets whose signatures expire at or before
    /// `due_before_s`, soonest first (ties by owner and type), with these agreed times;
    /// wait for named however long it takes, then report [`Event::SliceDone`].
    ResignSlice { zone: u16, seq: u64, times: SignatureTimes, due_before_s: u32, max_rrsets: u32 },
    /// Send these bytes to a client, without waiting for it.
    Answer { reply: R, bytes: Vec<u8> },
    /// Compute the digest of every zone named serves; report [`Event::ZoneDigest`]. Later
    /// batches run meanwhile, their reads included; nothing that changes a zone runs until
    /// it is in.
    DigestZone { seq: u64 },
    /// The zone set changed at this point of the log (`change`: the zone added or removed,
    /// with its index); `zones` is the zone set now, by index. Make the replica serve exactly
    /// these zones (named, the signing cores, the catalog with serial `seq`), however long it
    /// takes, then report [`Event::ZoneSetChanged`]. An added zone's first whole-zone signing
    /// follows as a [`Command::BeginSigning`].
    ChangeZoneSet { seq: u64, index: u16, change: ZoneSetChange, zones: BTreeMap<u16, ZoneEntry> },
    /// Report this checkpoint digest to the ordering; `state` is the execution state the
    /// checkpoint attests (batch `seq` executed), for its snapshot.
    Checkpoint { seq: u64, digest: [u8; 32], state: ExecState },
    /// Persist this state (the batch it names is executed).
    Persist(ExecState),
    /// Batch `seq` is executed and changed nothing but the executed position (reads, a
    /// re-sign that was not due): nothing to write. Re-executing such a batch after a
    /// restart changes nothing either (its clients are gone, so its reads are skipped).
    Executed(u64),
    /// Write `index` of batch `seq` is abandoned (see [`ExecCore::committed`]): stop sending
    /// it to named if it was sent; its outcome is recorded and its client answered.
    AbandonWrite { seq: u64, index: u32 },
}

/// The kinds [`ExecCore::hostile_writes`] counts per origin (attribution labels): ordered
/// writes the gate refused (unreadable, unsigned, unknown key, bad signature or time)...
pub const UNAUTHORIZED_WRITES: &str = "unauthorized_writes_ordered";
/// ...and ordered writes too long for named once re-signed.
pub const UNFORWARDABLE_WRITES: &str = "unforwardable_writes_ordered";

/// Results of commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    ReadDone {
        id: u64,
    },
    /// named's answer to the write (the tokio side waits until there is one).
    WriteAnswered {
        seq: u64,
        index: u32,
        answer: Vec<u8>,
    },
    /// The zone's content was kept for a background signing (or could not be).
    SigningBegun {
        seq: u64,
        result: Result<(), String>,
    },
    /// The signed zone is installed: how many records changed since the signing began
    /// (applied on top), or why it failed (the zone is then left as it was).
    SigningFinished {
        seq: u64,
        result: Result<u32, String>,
    },
    /// Too much changed during the round that ended: another round of the same signing
    /// began at `seq` (its content kept, the last round's signatures with it), to sign in
    /// the background what the writes changed; `changed`: records they changed.
    SigningRound {
        seq: u64,
        changed: u32,
    },
    /// How many RRsets the slice re-signed, or why named refused it.
    SliceDone {
        seq: u64,
        result: Result<u32, String>,
    },
    /// One digest per zone, in zone index order. `None`: a zone could not be read; this
    /// replica's checkpoint will not match.
    ZoneDigest {
        seq: u64,
        digests: Option<Vec<[u8; 32]>>,
    },
    /// The replica serves the zone set of [`Command::ChangeZoneSet`] at `seq`.
    ZoneSetChanged {
        seq: u64,
    },
}

/// Why the core's current batch is not advancing.
#[derive(Debug)]
enum Wait<R> {
    /// Reads issued earlier must finish before the next item (a write or a signing).
    Barrier,
    /// A checkpoint batch, until the digest of the checkpoint before it is in.
    Digest,
    /// All read slots are taken.
    ReadSlot,
    Write {
        index: u32,
        request: Vec<u8>,
        reply: Option<R>,
        window: Option<([u8; 32], u64)>,
    },
    /// A signing decided at this point of the log, waiting for earlier reads.
    SignPending {
        zone: u16,
        index: u32,
        reply: Option<R>,
    },
    Begin {
        zone: u16,
        index: u32,
        reply: Option<R>,
    },
    Finish {
        zone: u16,
        index: u32,
        reply: Option<R>,
    },
    Slice {
        zone: u16,
        index: u32,
        reply: Option<R>,
    },
    /// The replica's named, signing and catalog following a zone-set change; `added`: the
    /// index of a zone added, whose first signing begins next.
    ZoneSet {
        index: u32,
        reply: Option<R>,
        added: Option<u16>,
        text: String,
    },
}

#[derive(Debug)]
struct Running<R> {
    seq: u64,
    time_us: u64,
    checkpoint_due: bool,
    items: VecDeque<(u32, Item<R>)>,
    wait: Option<Wait<R>>,
    /// The write named applied before a crash (see [`Resume`]): recorded, not sent again.
    applied: Option<u32>,
    /// The state before the current zone-changing item touched it (see
    /// [`ExecCore::zone_change_at`]).
    before: Option<ExecState>,
    /// Something of this batch went to named (a write, a signing, a slice): the batch is
    /// persisted. One that named never saw (reads, refusals decided here) is executed again
    /// alike after a restart, so it costs no fsync.
    named: bool,
    /// The last item counted in [`ExecCore::take_requests`]' counts: an item that waits is
    /// executed again, and counted once.
    counted: Option<u32>,
}

/// Where an item sits in the log: its batch, its index in it, and the batch's agreed time (µs).
#[derive(Clone, Copy, Debug)]
struct At {
    seq: u64,
    index: u32,
    time_us: u64,
}

/// What the running batch does after an item: go on with the next one, or wait for an event.
#[derive(Debug)]
enum Step {
    Next,
    Wait,
}

/// Where a crash interrupted the batch after the executed one, from the write intent
/// (`crate::state::WriteIntent`): the state before write `index`, and whether named
/// applied that write (its serial moved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    pub seq: u64,
    pub index: u32,
    pub state: ExecState,
    pub applied: bool,
}

/// The execution core of one replica.
pub struct ExecCore<R, G> {
    config: ExecConfig,
    /// The configured zones' names (absolute, lower case), index order: the zone set while
    /// the state has none of its own.
    configured: Vec<String>,
    /// A verifier per zone served, by index (the configured ones, then the state's zone set).
    verifiers: BTreeMap<u16, SignZoneVerifier>,
    gate: G,
    state: ExecState,
    /// The state as last handed out to be persisted (or as loaded).
    durable: ExecState,
    running: Option<Running<R>>,
    reads: BTreeSet<u64>,
    /// The checkpoint whose zone digest is being computed, with the state it attests. The
    /// zone is read like the reads are: later batches run, zone changes wait for it.
    digesting: Option<(u64, ExecState)>,
    next_read: u64,
    answers: BTreeMap<[u8; 32], Vec<u8>>,
    answer_order: VecDeque<[u8; 32]>,
    resume: Option<Resume>,
    /// Per zone, the admin waiting for its running background signing to finish (local:
    /// only the gateway that ordered the request holds it).
    sign_reply: BTreeMap<u16, R>,
    /// Committed `Stuck` claims past the executed position: per claiming origin, the latest
    /// (batch, write) it named (an honest replica's claims only move forward), so at most
    /// one entry per origin.
    stuck_claims: BTreeMap<u16, (u64, u32)>,
    /// Ordered writes refused without named, per (origin, kind): local attribution, not
    /// replicated state.
    hostile: BTreeMap<(u16, &'static str), u64>,
    /// Client requests taken up since [`ExecCore::take_requests`] last emptied it (local
    /// counts for the metrics, not replicated state).
    requests: RequestCounts,
}

/// Ordered client requests (`Op::Dns`) the core took up, by the kind it classified them as:
/// each counted once, however often it waits for its turn. The classification the core
/// needs anyway, so that the wrapper does not decode and classify the log again to count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub reads: u64,
    pub transfers: u64,
    pub writes: u64,
}

impl RequestCounts {
    fn add(&mut self, kind: Kind) {
        match kind {
            Kind::Read => self.reads += 1,
            Kind::Transfer => self.transfers += 1,
            Kind::Write => self.writes += 1,
        }
    }

    /// The counts with their kinds.
    pub fn by_kind(self) -> [(Kind, u64); 3] {
        [(Kind::Read, self.reads), (Kind::Transfer, self.transfers), (Kind::Write, self.writes)]
    }
}

impl<R, G: UpdateGate> ExecCore<R, G> {
    pub fn new(config: ExecConfig, gate: G, state: ExecState) -> Self {
        let configured = config.sign_zone_verifiers.iter().map(|v| v.zone().to_string()).collect();
        let mut core = ExecCore {
            config,
            configured,
            verifiers: BTreeMap::new(),
            gate,
            durable: state.clone(),
            state,
            running: None,
            reads: BTreeSet::new(),
            digesting: None,
            next_read: 0,
            answers: BTreeMap::new(),
            answer_order: VecDeque::new(),
            resume: None,
            sign_reply: BTreeMap::new(),
            stuck_claims: BTreeMap::new(),
            hostile: BTreeMap::new(),
            requests: RequestCounts::default(),
        };
        core.rebuild_verifiers();
        core
    }

    /// One verifier per zone of the state's zone set (the configured ones keep theirs).
    fn rebuild_verifiers(&mut self) {
        let names = self.state.zone_names(&self.configured);
        let Some(any) = self.config.sign_zone_verifiers.first() else {
            self.verifiers.clear();
            return;
        };
        self.verifiers = names
            .into_iter()
            .map(|(index, name)| {
                let configured = self.config.sign_zone_verifiers.get(usize::from(index)).filter(|v| v.zone() == name);
                (index, configured.cloned().unwrap_or_else(|| any.for_zone(&name)))
            })
            .collect();
    }

    /// The zones served, by index (absolute, lower-case names): the configuration's until the
    /// zone set changed at run time, then the state's.
    pub fn zone_set(&self) -> BTreeMap<u16, String> {
        self.state.zone_names(&self.configured)
    }

    /// A batch the ordering committed, seen when it arrives, before it is executed (the
    /// executor is usually behind): its `Stuck` claims count for the writes before it. When
    /// the write this replica waits for now has claims from `faults + 1` distinct origins,
    /// it is abandoned (recorded `code::ABANDONED`, its client answered SERVFAIL,
    /// [`Command::AbandonWrite`]) and the batch goes on; a write that has them already when
    /// its turn comes is abandoned without being sent.
    pub fn committed<'a>(&mut self, seq: u64, requests: impl IntoIterator<Item = (u16, &'a [u8])>) -> Vec<Command<R>> {
        let mut out = Vec::new();
        let mut changed = false;
        for (origin, payload) in requests {
            let Some(claim) = crate::envelope::Op::stuck_claim(payload) else { continue };
            // A claim names a write ordered before it; one already executed here decides nothing.
            if claim.0 >= seq || claim.0 <= self.state.executed {
                continue;
            }
            let latest = self.stuck_claims.entry(origin).or_insert(claim);
            if claim > *latest {
                *latest = claim;
            }
            changed = true;
        }
        if !changed {
            return out;
        }
        let Some(run) = self.running.as_mut() else { return out };
        let seq = run.seq;
        let waiting = matches!(&run.wait, Some(Wait::Write { index, .. }) if self_abandoned(&self.stuck_claims, self.config.faults, seq, *index));
        if !waiting {
            return out;
        }
        let time_s = run.time_us / 1_000_000;
        let Some(Wait::Write { index, request, reply, window }) = run.wait.take() else { return out };
        self.abandon_write(seq, index, &request, reply, window, time_s, &mut out);
        out.push(Command::AbandonWrite { seq, index });
        self.advance(&mut out);
        out
    }

    /// Records write `index` of batch `seq` as abandoned and answers its client SERVFAIL
    /// (a function of the request and the agreed time, as every refusal without named).
    #[allow(clippy::too_many_arguments)]
    fn abandon_write(
        &mut self,
        seq: u64,
        index: u32,
        request: &[u8],
        reply: Option<R>,
        window: Option<([u8; 32], u64)>,
        time_s: u64,
        out: &mut Vec<Command<R>>,
    ) {
        self.state.record(seq, index, code::ABANDONED);
        // A retransmission within the signature's window gets the same outcome, not another wait.
        if let Some((digest, expires_s)) = window {
            self.state.remember_write(digest, RecentWrite { expires_s, outcome: code::ABANDONED });
        }
        if let Some(reply) = reply {
            out.push(Command::Answer { reply, bytes: self.gate.answer_without_named(request, u16::from(ResponseCode::ServFail), time_s) });
        }
        // Persisted like a write named saw: the decision came from batches after this one,
        // which a restart may not have seen again before reaching it.
        if let Some(run) = self.running.as_mut() {
            run.named = true;
        }
    }

    /// The write this replica's named has not answered yet: (batch, index), for the
    /// executor's local bound after which it orders a `Stuck` claim.
    pub fn stuck_write(&self) -> Option<(u64, u32)> {
        let run = self.running.as_ref()?;
        match &run.wait {
            Some(Wait::Write { index, .. }) => Some((run.seq, *index)),
            _ => None,
        }
    }

    /// Ordered writes refused without named, per (origin, kind) ([`UNAUTHORIZED_WRITES`],
    /// [`UNFORWARDABLE_WRITES`]) since this replica started. An honest gateway orders none
    /// (its pre-ordering check answers them), except an update whose signature's time
    /// window closed between its check and the agreed time.
    pub fn hostile_writes(&self) -> &BTreeMap<(u16, &'static str), u64> {
        &self.hostile
    }

    /// The client requests taken up since the last call (for the metrics), emptied.
    pub fn take_requests(&mut self) -> RequestCounts {
        std::mem::take(&mut self.requests)
    }

    /// After a crash in the middle of batch `resume.seq`: when that batch is delivered
    /// again, it continues at write `resume.index` with the state recorded before it, so no
    /// earlier write of the batch reaches named twice; that write itself is recorded as
    /// applied (NOERROR) or sent, per `applied`. The persisted state may lag the intent by
    /// batches that changed nothing but the executed position (reads are not persisted),
    /// which replay harmlessly first; an intent older than the persisted state is ignored.
    pub fn resume_at(&mut self, resume: Resume) {
        if resume.seq > self.state.executed && resume.state.executed + 1 == resume.seq && resume.state.executed >= self.state.executed {
            self.resume = Some(resume);
        }
    }

    pub fn state(&self) -> &ExecState {
        &self.state
    }

    /// Drops the running batch and the reads in flight (their tasks were aborted): a
    /// transferred state replaces whatever they would have done. Call [`Self::install`] next.
    pub fn abandon(&mut self) {
        self.running = None;
        self.reads.clear();
        self.digesting = None;
        self.resume = None;
    }

    /// Replaces the state with one transferred from peers (its batch is executed: named
    /// holds its zone). Call only when [`Self::is_idle`] (after [`Self::abandon`] if need
    /// be); the cached answers of earlier writes go, since the transferred state's recent
    /// writes are not this replica's.
    pub fn install(&mut self, state: ExecState) {
        debug_assert!(self.running.is_none());
        self.durable = state.clone();
        self.state = state;
        self.answers.clear();
        self.answer_order.clear();
        self.rebuild_verifiers();
    }

    /// The zone change (write, signing, re-signing slice) the core waits for, if any: its
    /// batch, its item, the zone when the core knows it (a write names its zone in its own
    /// zone section), and the state before that item, which decides it again alike when
    /// the batch resumes there after a crash. What the executor names in its write intent.
    pub fn zone_change_at(&self) -> Option<(u64, u32, Option<u16>, ExecState)> {
        let run = self.running.as_ref()?;
        let before = || run.before.clone().unwrap_or_else(|| self.state.clone());
        match &run.wait {
            Some(Wait::Write { index, .. }) => Some((run.seq, *index, None, before())),
            Some(Wait::Finish { zone, index, .. } | Wait::Slice { zone, index, .. }) => Some((run.seq, *index, Some(*zone), before())),
            Some(Wait::ZoneSet { index, .. }) => Some((run.seq, *index, None, before())),
            _ => None,
        }
    }

    fn keep_before(&mut self) {
        let before = self.state.clone();
        if let Some(run) = self.running.as_mut() {
            run.before = Some(before);
        }
    }

    /// Zone `zone`'s background signing running, with the signature times it signs with.
    pub fn signing_run(&self, zone: u16) -> Option<(SigningRun, SignatureTimes)> {
        self.state.zone(zone).signing.map(|run| (run, self.times(run.time_s.saturating_mul(1_000_000))))
    }

    /// Every zone's running background signing, in zone index order.
    pub fn signing_runs(&self) -> Vec<(u16, SigningRun, SignatureTimes)> {
        self.state.zones.iter().filter_map(|(zone, z)| z.signing.map(|run| (*zone, run, self.times(run.time_s.saturating_mul(1_000_000))))).collect()
    }

    /// How many zones this replica serves.
    pub fn zone_count(&self) -> usize {
        self.verifiers.len()
    }

    fn serves(&self, zone: u16) -> bool {
        self.verifiers.contains_key(&zone)
    }

    /// Reads issued and not yet reported done.
    pub fn reads_in_flight(&self) -> usize {
        self.reads.len()
    }

    /// The batch being executed and what it waits for (for the executor's stall warning).
    pub fn waiting_for(&self) -> Option<(u64, &'static str)> {
        let run = self.running.as_ref()?;
        let what = match &run.wait {
            None => "nothing (runnable)",
            Some(Wait::Barrier) => "earlier reads, or a checkpoint's digest, to finish before a zone change",
            Some(Wait::ReadSlot) => "a free read slot",
            Some(Wait::Write { .. }) => "named's answer to a write",
            Some(Wait::SignPending { .. }) => "earlier reads to finish before a signing",
            Some(Wait::Begin { .. }) => "the zone content for a whole-zone signing",
            Some(Wait::Finish { .. }) => "the installation of a signed zone",
            Some(Wait::Slice { .. }) => "a re-signing slice",
            Some(Wait::ZoneSet { .. }) => "the replica to serve a changed zone set",
            Some(Wait::Digest) => "the zone digest of the checkpoint before",
        };
        Some((run.seq, what))
    }

    /// True when the next batch may be delivered (reads of earlier batches may still run).
    pub fn is_idle(&self) -> bool {
        self.running.is_none()
    }

    /// Starts executing `batch`. A batch at or below the executed position (named applied
    /// it before a restart) is skipped. Call only when [`Self::is_idle`].
    pub fn deliver(&mut self, batch: Delivered<R>) -> Vec<Command<R>> {
        let mut out = Vec::new();
        if batch.seq <= self.state.executed || self.running.is_some() {
            return out;
        }
        let (mut from, mut applied) = (0, None);
        // Kept across the replayed read-only batches before it, used by its own batch.
        if let Some(resume) = self.resume.take_if(|r| r.seq == batch.seq) {
            self.state = resume.state;
            self.rebuild_verifiers();
            from = resume.index;
            applied = resume.applied.then_some(resume.index);
        }
        let items = batch.requests.into_iter().enumerate().map(|(i, item)| (u32::try_from(i).unwrap_or(u32::MAX), item)).filter(|(i, _)| *i >= from).collect();
        self.running = Some(Running {
            seq: batch.seq,
            time_us: batch.time_us,
            checkpoint_due: batch.checkpoint_due,
            items,
            wait: None,
            applied,
            before: None,
            named: false,
            counted: None,
        });
        self.advance(&mut out);
        out
    }

    pub fn handle(&mut self, event: Event) -> Vec<Command<R>> {
        let mut out = Vec::new();
        // `None`: the event answers nothing the core waits for (stale, or another batch's):
        // nothing changes and the batch is not advanced.
        let taken = match event {
            Event::ReadDone { id } => {
                self.read_done(id);
                Some(())
            }
            Event::WriteAnswered { seq, index, answer } => self.write_answered(seq, index, answer, &mut out),
            Event::SigningBegun { seq, result } => self.signing_begun(seq, result, &mut out),
            Event::SigningFinished { seq, result } => self.signing_finished(seq, result, &mut out),
            Event::SigningRound { seq, changed } => self.signing_round(seq, changed, &mut out),
            Event::SliceDone { seq, result } => self.slice_done(seq, result, &mut out),
            Event::ZoneDigest { seq, digests } => self.zone_digest(seq, digests, &mut out),
            Event::ZoneSetChanged { seq } => self.zone_set_changed(seq, &mut out),
        };
        if taken.is_some() {
            self.advance(&mut out);
        }
        out
    }

    /// Read `id` is done: its slot is free, and a barrier may fall.
    fn read_done(&mut self, id: u64) {
        if self.reads.remove(&id) {
            if let Some(run) = &mut self.running {
                let released = match run.wait {
                    Some(Wait::ReadSlot) => true,
                    Some(Wait::Barrier) => self.reads.is_empty() && self.digesting.is_none(),
                    _ => false,
                };
                if released {
                    run.wait = None;
                }
            }
        }
    }

    /// named answered the write the core waits for: its outcome is recorded (and remembered
    /// against a replay), its client answered.
    fn write_answered(&mut self, seq: u64, index: u32, answer: Vec<u8>, out: &mut Vec<Command<R>>) -> Option<()> {
        let run = self.running.as_mut()?;
        if run.seq != seq || !matches!(&run.wait, Some(Wait::Write { index: i, .. }) if *i == index) {
            return None;
        }
        let Some(Wait::Write { request, reply, window, .. }) = run.wait.take() else { return None };
        let outcome = match Message::from_vec(&answer) {
            Ok(m) => u32::from(u16::from(m.metadata.response_code)),
            Err(_) => code::UNDECODABLE_ANSWER,
        };
        self.state.record(seq, index, outcome);
        if let Some((digest, expires_s)) = window {
            self.state.remember_write(digest, RecentWrite { expires_s, outcome });
            self.cache_answer(digest, answer.clone());
        }
        if let Some(reply) = reply {
            out.push(Command::Answer { reply, bytes: self.gate.answer_for_client(&request, &answer) });
        }
        Some(())
    }

    /// The zone's content was kept for the background signing begun at `seq` (or could not be).
    fn signing_begun(&mut self, seq: u64, result: Result<(), String>, out: &mut Vec<Command<R>>) -> Option<()> {
        let run = self.running.as_mut()?;
        if run.seq != seq || !matches!(run.wait, Some(Wait::Begin { .. })) {
            return None;
        }
        let Some(Wait::Begin { zone, index, reply }) = run.wait.take() else { return None };
        let time_s = run.time_us / 1_000_000;
        match result {
            Ok(()) => {
                let z = self.state.zone_mut(zone);
                z.signing = Some(SigningRun { seq, time_s });
                z.sign_finish_votes.clear();
                self.state.record(seq, index, code::SIGNING_BEGUN);
                // Answered when the signed zone is installed.
                match reply {
                    Some(reply) => {
                        self.sign_reply.insert(zone, reply);
                    }
                    None => {
                        self.sign_reply.remove(&zone);
                    }
                }
            }
            Err(e) => {
                self.state.record(seq, index, code::ZONE_SIGN_FAILED);
                if let Some(reply) = reply {
                    out.push(Command::Answer { reply, bytes: format!("error: {e}").into_bytes() });
                }
            }
        }
        Some(())
    }

    /// The signed zone is installed at `seq` (or failed to be): the signing is over.
    fn signing_finished(&mut self, seq: u64, result: Result<u32, String>, out: &mut Vec<Command<R>>) -> Option<()> {
        let run = self.running.as_mut()?;
        if run.seq != seq || !matches!(run.wait, Some(Wait::Finish { .. })) {
            return None;
        }
        let Some(Wait::Finish { zone, index, reply }) = run.wait.take() else { return None };
        let z = self.state.zone_mut(zone);
        let signing = z.signing.take().unwrap_or(SigningRun { seq, time_s: run.time_us / 1_000_000 });
        z.sign_finish_votes.clear();
        let text = match result {
            Ok(_) => {
                // The signatures carry the run's agreed time.
                self.state.zone_mut(zone).last_signed_s = signing.time_s;
                self.state.record(seq, index, code::ZONE_SIGNED);
                format!("signed at seq {}", signing.seq)
            }
            Err(e) => {
                self.state.record(seq, index, code::ZONE_SIGN_FAILED);
                format!("error: {e}")
            }
        };
        if let Some(reply) = self.sign_reply.remove(&zone) {
            out.push(Command::Answer { reply, bytes: text.clone().into_bytes() });
        }
        if let Some(reply) = reply {
            out.push(Command::Answer { reply, bytes: format!("finished: {text}").into_bytes() });
        }
        Some(())
    }

    /// Instead of installing at `seq`, another round of the signing began there.
    fn signing_round(&mut self, seq: u64, changed: u32, out: &mut Vec<Command<R>>) -> Option<()> {
        let run = self.running.as_mut()?;
        if run.seq != seq || !matches!(run.wait, Some(Wait::Finish { .. })) {
            return None;
        }
        let Some(Wait::Finish { zone, index, reply }) = run.wait.take() else { return None };
        // The same signing: its signatures keep the first round's times; the finish
        // claims now name this round.
        let z = self.state.zone_mut(zone);
        let time_s = z.signing.map_or(run.time_us / 1_000_000, |s| s.time_s);
        z.signing = Some(SigningRun { seq, time_s });
        z.sign_finish_votes.clear();
        self.state.record(seq, index, code::SIGNING_ROUND | changed.min(0xffff));
        if let Some(reply) = reply {
            out.push(Command::Answer {
                reply,
                bytes: format!("finished round: another begun at seq {seq} for the {changed} records changed meanwhile").into_bytes(),
            });
        }
        Some(())
    }

    /// The re-signing slice of batch `seq` is done (or named refused it).
    fn slice_done(&mut self, seq: u64, result: Result<u32, String>, out: &mut Vec<Command<R>>) -> Option<()> {
        let run = self.running.as_mut()?;
        if run.seq != seq || !matches!(run.wait, Some(Wait::Slice { .. })) {
            return None;
        }
        let Some(Wait::Slice { index, reply, .. }) = run.wait.take() else { return None };
        let outcome = match result {
            Ok(n) => code::SLICE_RESIGNED | n.min(0xfffe),
            Err(_) => code::SLICE_FAILED,
        };
        self.state.record(seq, index, outcome);
        if let Some(reply) = reply {
            out.push(Command::Answer { reply, bytes: b"done".to_vec() });
        }
        Some(())
    }

    /// The zone digests of checkpoint `seq` are in: its checkpoint digest goes to the
    /// ordering, and zone changes waiting for it may go on.
    fn zone_digest(&mut self, seq: u64, digests: Option<Vec<[u8; 32]>>, out: &mut Vec<Command<R>>) -> Option<()> {
        let (_, state) = self.digesting.take_if(|(at, _)| *at == seq)?;
        // The zone set cannot change while a digest is computed (a change waits for it).
        let zones = state.zone_indices(self.configured.len()).len().max(1);
        let digest = match digests.filter(|d| d.len() == zones) {
            Some(digests) => state.checkpoint_digest(&digests),
            // A digest no other replica can produce: this checkpoint will not match.
            None => {
                let mut zone = [0xffu8; 32];
                zone[..2].copy_from_slice(&self.config.id.to_be_bytes());
                let mut d = state.checkpoint_digest(&vec![zone; zones]);
                d[0] ^= 0x5a;
                d
            }
        };
        out.push(Command::Checkpoint { seq, digest, state });
        if let Some(run) = &mut self.running {
            let released = match run.wait {
                Some(Wait::Digest) => true,
                Some(Wait::Barrier) => self.reads.is_empty(),
                _ => false,
            };
            if released {
                run.wait = None;
            }
        }
        Some(())
    }

    fn times(&self, time_us: u64) -> SignatureTimes {
        let t = u32::try_from(time_us / 1_000_000).unwrap_or(u32::MAX);
        SignatureTimes::from_agreed(t, self.config.validity_s)
    }

    /// Runs the current batch until it must wait for an event, or finishes it.
    fn advance(&mut self, out: &mut Vec<Command<R>>) {
        loop {
            let quiet = self.zone_quiet();
            let Some(run) = self.running.as_mut() else { return };
            match run.wait {
                Some(Wait::SignPending { .. }) if quiet => {
                    let Some(Wait::SignPending { zone, index, reply }) = run.wait.take() else { return };
                    let (seq, time_us) = (run.seq, run.time_us);
                    self.start_signing(zone, index, reply, seq, time_us, out);
                    return;
                }
                Some(_) => return,
                None => {}
            }
            let Some((index, item)) = run.items.pop_front() else {
                if run.checkpoint_due && self.digesting.is_some() {
                    // One digest at a time (each attests its own checkpoint's state).
                    run.wait = Some(Wait::Digest);
                    return;
                }
                return self.finish_batch(out);
            };
            let at = At { seq: run.seq, index, time_us: run.time_us };
            if let Step::Wait = self.execute(at, item, out) {
                return;
            }
        }
    }

    /// Every item of the running batch is executed: the batch is recorded executed
    /// (persisted when it changed something durable) and, at a checkpoint, its zone digest
    /// is asked for.
    fn finish_batch(&mut self, out: &mut Vec<Command<R>>) {
        let Some(run) = self.running.take() else { return };
        let (seq, checkpoint, named) = (run.seq, run.checkpoint_due, run.named);
        // A batch that changed nothing durable costs no write (and no fsync): most
        // batches are reads only, and refusals decided here without named (an
        // unauthenticated or unforwardable update, from a faulty origin) change only
        // the outcome chain and recent writes, which executing the batch again after
        // a restart computes alike. Checkpoint batches are always written, so a
        // restart never executes a checkpoint again: named may by then hold a write
        // ordered after it (the one running at the crash), which would change its digest.
        self.state.executed = self.durable.executed;
        self.stuck_claims.retain(|_, (at, _)| *at > seq);
        if !named && !checkpoint && self.state.same_schedules(&self.durable) {
            self.state.executed = seq;
            out.push(Command::Executed(seq));
        } else {
            self.state.executed = seq;
            self.durable = self.state.clone();
            out.push(Command::Persist(self.state.clone()));
        }
        if checkpoint {
            // The zone is as this batch left it until the next zone change, which
            // waits for the digest (like a write waits for earlier reads); reads of
            // later batches go on meanwhile. A crash before the digest is in loses
            // only this replica's vote for this checkpoint.
            self.digesting = Some((seq, self.state.clone()));
            out.push(Command::DigestZone { seq });
        }
    }

    /// Executes one ordered item: what it decides, the commands it needs, and whether the
    /// batch goes on with its next item or waits for an event.
    fn execute(&mut self, at: At, item: Item<R>, out: &mut Vec<Command<R>>) -> Step {
        let Ok(op) = Op::decode(&item.payload) else { return Step::Next };
        // Zone 0's requests in their original form are zone 0's requests.
        let op = match op {
            Op::SignZone(auth) => Op::SignZoneIn { zone: 0, auth },
            Op::Resign => Op::ResignZone(0),
            Op::SignZoneFinish(auth) => Op::SignZoneFinishIn { zone: 0, auth },
            other => other,
        };
        let zone = match op {
            Op::SignZoneIn { zone, .. } | Op::ResignZone(zone) | Op::SignZoneFinishIn { zone, .. } | Op::RolloverReport { zone, .. } => zone,
            _ => 0,
        };
        if !matches!(op, Op::Dns { .. } | Op::ZoneSet { .. } | Op::Stuck { .. }) && !self.serves(zone) {
            // An index from the log that names no configured zone: the same refusal on
            // every replica (they share the configuration's zone set).
            if let Some(reply) = item.reply {
                out.push(Command::Answer { reply, bytes: format!("refused: no zone has index {zone}").into_bytes() });
            }
            return Step::Next;
        }
        match op {
            Op::Dns { tcp, message } => match classify(&message, tcp) {
                Verdict::Order(kind) => {
                    self.count(at.index, kind);
                    match kind {
                        Kind::Write => self.execute_write(at, item, message, out),
                        Kind::Read | Kind::Transfer => self.execute_read(at.index, item, kind == Kind::Transfer, tcp, message, out),
                    }
                }
                // A gateway answers these itself; one that orders them is lying or newer.
                Verdict::Answer(_) | Verdict::Drop(_) => Step::Next,
            },
            // Normalised above.
            Op::SignZone(_) | Op::Resign | Op::SignZoneFinish(_) => Step::Next,
            // Counted when committed (`committed`); executed, it names a write this
            // replica is already past.
            Op::Stuck { seq: batch, index: write } => {
                if let Some(reply) = item.reply {
                    out.push(Command::Answer { reply, bytes: format!("noted: write {write} of batch {batch} is executed here").into_bytes() });
                }
                Step::Next
            }
            Op::SignZoneIn { auth, .. } => {
                self.keep_before();
                let asked = self.sign_zone_request(zone, item.origin, &auth, at.time_us / 1_000_000);
                self.begin_signing_or_refuse(asked, zone, at, item, out)
            }
            Op::SignZoneFinishIn { auth, .. } => self.execute_finish_claim(zone, at, item, &auth, out),
            Op::ResignZone(_) => self.execute_resign(zone, at, item, out),
            Op::RolloverReport { auth, .. } => self.execute_rollover_report(zone, at, item, &auth, out),
            Op::ZoneSet { change, auth } => self.execute_zone_set(at, item, change, &auth, out),
        }
    }

    /// An ordered report that the parent's DS covers zone `zone`'s threshold key: counted
    /// once per replica; the `faults + 1`-th finishes the adopted zone's rollover at this
    /// point of the log: recorded in the state (from then on a whole-zone signing leaves the
    /// operator's key, its signatures, the CDS and CDNSKEY and the marker out:
    /// `signer_input::signer_records_at`), and a whole-zone signing begins here, as
    /// `rollover-finish`'s sign-zone would.
    fn execute_rollover_report(&mut self, zone: u16, at: At, item: Item<R>, auth: &SignZoneAuth, out: &mut Vec<Command<R>>) -> Step {
        self.keep_before();
        let reported = self.rollover_report(zone, item.origin, auth, at.time_us / 1_000_000);
        self.begin_signing_or_refuse(reported, zone, at, item, out)
    }

    /// A whole-zone signing begins at this point of the log when `asked` (a sign-zone request
    /// or a rollover report, counted) says so; otherwise the refusal goes back to the client.
    fn begin_signing_or_refuse(&mut self, asked: Result<(), String>, zone: u16, at: At, item: Item<R>, out: &mut Vec<Command<R>>) -> Step {
        match asked {
            Ok(()) => {
                self.start_signing(zone, at.index, item.reply, at.seq, at.time_us, out);
                Step::Wait
            }
            Err(text) => {
                if let Some(reply) = item.reply {
                    out.push(Command::Answer { reply, bytes: text.into_bytes() });
                }
                Step::Next
            }
        }
    }

    /// Counts a rollover report; `Ok` when it completes the t+1 needed. It counts only for
    /// the replica whose key signed it (the ordering's `origin` must agree), once per replica
    /// (a set: a replayed report adds nothing), only if signed within the sign-zone window of
    /// the agreed time, and not while a whole-zone signing runs (the finish begins one; the
    /// replica reports again at its next poll). Once finished, reports are refused.
    fn rollover_report(&mut self, zone: u16, origin: u16, auth: &SignZoneAuth, time_s: u64) -> Result<(), String> {
        let verifier = self.verifiers.get(&zone).ok_or_else(|| format!("refused: no zone has index {zone}"))?;
        let z = self.state.zone(zone);
        if z.rollover_finished_s != 0 {
            return Err(format!("finished: the rollover ended at agreed time {}", z.rollover_finished_s));
        }
        if let Some(run) = z.signing {
            return Err(format!("refused: a whole-zone signing is running since seq {}", run.seq));
        }
        if auth.replica != origin {
            return Err(format!("refused: a report signed for replica {} was ordered as replica {origin}'s", auth.replica));
        }
        let window = self.config.sign_zone_window_s;
        let stamp_s = auth.stamp_us / 1_000_000;
        if stamp_s.abs_diff(time_s) > window {
            return Err(format!("refused: replica {origin}'s report was signed at {stamp_s}, ordered at agreed time {time_s}: more than {window} s apart"));
        }
        if let Err(e) = verifier.verify_rollover(auth, time_s) {
            return Err(format!("refused: the report does not prove replica {origin}: {e}"));
        }
        let needed = usize::from(self.config.faults) + 1;
        let s = self.state.zone_mut(zone);
        s.rollover_reports.insert(origin);
        if s.rollover_reports.len() < needed {
            return Err(format!("counted: {} of the {needed} replicas needed saw the new DS", s.rollover_reports.len()));
        }
        s.rollover_reports.clear();
        s.rollover_finished_s = time_s.max(1);
        Ok(())
    }

    /// An ordered zone-set request: counted per (action, name, key digest); the
    /// `faults + 1`-th for the same change adds or removes the zone at this point of the log,
    /// after the reads before it (named's zones change), unless the zone set refuses it.
    fn execute_zone_set(&mut self, at: At, item: Item<R>, change: ZoneSetChange, auth: &SignZoneAuth, out: &mut Vec<Command<R>>) -> Step {
        // Before counting, so that an item held at the barrier is counted once.
        if !self.zone_quiet() {
            self.hold(at.index, item, Wait::Barrier);
            return Step::Wait;
        }
        self.keep_before();
        let change = match self.zone_set_request(item.origin, &change, auth, at.time_us / 1_000_000) {
            Ok(change) => change,
            Err(text) => {
                if let Some(reply) = item.reply {
                    out.push(Command::Answer { reply, bytes: text.into_bytes() });
                }
                return Step::Next;
            }
        };
        self.state.seed_zone_set(&self.configured);
        let (index, added, text) = match change.action {
            ZoneSetAction::Add => {
                let index = self.state.next_zone_index;
                self.state.next_zone_index = index.saturating_add(1);
                self.state.zone_set.insert(index, ZoneEntry { name: change.name.clone(), key_digest: change.key_digest, added_at: at.seq });
                self.state.zones.remove(&index);
                self.state.record(at.seq, at.index, code::ZONE_ADDED | u32::from(index));
                (index, Some(index), format!("added {} as zone {index} at seq {}; its first signing begins there", change.name, at.seq))
            }
            ZoneSetAction::Remove => {
                let index = self.state.zone_set.iter().find(|(_, e)| e.name == change.name).map_or(u16::MAX, |(i, _)| *i);
                self.state.zone_set.remove(&index);
                self.state.zones.remove(&index);
                self.state.record(at.seq, at.index, code::ZONE_REMOVED | u32::from(index));
                if let Some(reply) = self.sign_reply.remove(&index) {
                    out.push(Command::Answer { reply, bytes: format!("error: zone {} was removed", change.name).into_bytes() });
                }
                (index, None, format!("removed {} (zone {index}) at seq {}", change.name, at.seq))
            }
        };
        self.rebuild_verifiers();
        out.push(Command::ChangeZoneSet { seq: at.seq, index, change, zones: self.state.zone_set.clone() });
        if let Some(run) = self.running.as_mut() {
            run.wait = Some(Wait::ZoneSet { index: at.index, reply: item.reply, added, text });
            run.named = true;
        }
        Step::Wait
    }

    /// The replica serves the changed zone set: the admin is answered, and an added zone's
    /// first whole-zone signing begins at the same point of the log.
    fn zone_set_changed(&mut self, seq: u64, out: &mut Vec<Command<R>>) -> Option<()> {
        let run = self.running.as_mut()?;
        if run.seq != seq || !matches!(run.wait, Some(Wait::ZoneSet { .. })) {
            return None;
        }
        let Some(Wait::ZoneSet { index, reply, added, text }) = run.wait.take() else { return None };
        let time_us = run.time_us;
        if let Some(reply) = reply {
            out.push(Command::Answer { reply, bytes: text.into_bytes() });
        }
        if let Some(zone) = added {
            self.start_signing(zone, index, None, seq, time_us, out);
        }
        Some(())
    }

    /// Counts a zone-set request; `Ok` with the change (canonical) when it completes the t+1
    /// needed for it. It counts only for the replica whose key signed it (the ordering's
    /// `origin` must agree), once (its stamp newer than that replica's last counted one),
    /// only if signed within the sign-zone window of the agreed time, and only while the zone
    /// set allows the change (checked again at the t+1-th: another change may have come first).
    fn zone_set_request(&mut self, origin: u16, change: &ZoneSetChange, auth: &SignZoneAuth, time_s: u64) -> Result<ZoneSetChange, String> {
        let window = self.config.sign_zone_window_s;
        check_stamped(origin, auth, self.state.zone_set_stamps.get(&origin).copied(), time_s, window)?;
        let verifier = self.config.sign_zone_verifiers.first().ok_or("refused: no zone is configured")?;
        if let Err(e) = verifier.verify_zone_set(change, auth, time_s) {
            return Err(format!("refused: the request does not prove replica {origin}: {e}"));
        }
        // Used now, whatever follows: a replay of this request never counts.
        self.state.zone_set_stamps.insert(origin, auth.stamp_us);
        let change = ZoneSetChange::new(change.action, &change.name, change.key_digest);
        if let Some(refusal) = self.zone_set_refusal(&change) {
            self.state.zone_set_requests.remove(&change);
            return Err(refusal);
        }
        let requests = &mut self.state.zone_set_requests;
        for votes in requests.values_mut() {
            votes.retain(|_, t| t.saturating_add(window) >= time_s);
        }
        requests.retain(|_, votes| !votes.is_empty());
        let votes = requests.entry(change.clone()).or_default();
        votes.insert(origin, time_s);
        let (counted, needed) = (votes.len(), usize::from(self.config.faults) + 1);
        if counted < needed {
            let what = match change.action {
                ZoneSetAction::Add => "add",
                ZoneSetAction::Remove => "remove",
            };
            return Err(format!("counted: {counted} of the {needed} replicas needed asked to {what} {}", change.name));
        }
        requests.remove(&change);
        Ok(change)
    }

    /// Why the zone set cannot take `change` now (the same answer on every replica: it
    /// depends on the replicated zone set only), or `None`.
    fn zone_set_refusal(&self, change: &ZoneSetChange) -> Option<String> {
        let served = self.zone_set();
        let name = &change.name;
        match change.action {
            ZoneSetAction::Add => {
                if !valid_zone_name(name) {
                    return Some(format!("refused: {name:?} is not a zone name this cluster serves (letters, digits, '-', '_', at most 253 characters)"));
                }
                if served.values().any(|z| z == name) {
                    return Some(format!("refused: {name} is served already"));
                }
                if let Some(other) = served.values().find(|z| within(name, z) || within(z, name)) {
                    return Some(format!("refused: {name} is inside or above the served zone {other}"));
                }
                let next = if self.state.zone_set.is_empty() { self.configured.len() } else { usize::from(self.state.next_zone_index) };
                if served.len() >= MAX_ZONES || next >= usize::from(u16::MAX) {
                    return Some(format!("refused: {} zones are served; at most {MAX_ZONES}", served.len()));
                }
                None
            }
            ZoneSetAction::Remove => {
                if !served.values().any(|z| z == name) {
                    return Some(format!("refused: {name} is not served"));
                }
                if served.len() == 1 {
                    return Some(format!("refused: {name} is the last zone served"));
                }
                None
            }
        }
    }

    /// Whether zone `zone`'s rollover was finished by the replicas' reports (the executor
    /// hands it to the zone's signing, which then leaves the rollover's records out).
    pub fn rollover_finished(&self, zone: u16) -> bool {
        self.state.zone(zone).rollover_finished_s != 0
    }

    /// An ordered write, at every replica, after the reads before it: a replay gets the
    /// first execution's answer; otherwise the gate decides and the write goes to named or
    /// is refused here.
    fn execute_write(&mut self, at: At, item: Item<R>, message: Vec<u8>, out: &mut Vec<Command<R>>) -> Step {
        if !self.zone_quiet() {
            self.hold(at.index, item, Wait::Barrier);
            return Step::Wait;
        }
        let (seq, index, time_s) = (at.seq, at.index, at.time_us / 1_000_000);
        let replay = replay_key(&message);
        // Pruning at this agreed time is idempotent, so the state kept for a
        // resume (`keep_before`) may be taken after it, and only for a write
        // that goes to named: a refusal or a duplicate costs no copy of the state.
        self.state.prune_recent(time_s);
        if let Some((digest, first)) = replay.and_then(|k| self.state.recent_writes.get(&k.digest).map(|w| (k.digest, *w))) {
            // What the same signature covers, again within its window: a
            // client's retransmission (or a replay, under any header id).
            // Executed once; this gets the first execution's answer.
            self.state.record(seq, index, code::DUPLICATE | first.outcome);
            if let Some(reply) = item.reply {
                let bytes = self.duplicate_answer(&message, digest, first.outcome, time_s);
                out.push(Command::Answer { reply, bytes });
            }
            return Step::Next;
        }
        match self.gate.decide(&message, time_s) {
            UpdateDecision::Forward(bytes) if !forwardable(&bytes) => {
                // Bytes named can never take (too long for TCP once re-signed,
                // or no header): refused here, alike at every replica, rather
                // than sent to named for ever.
                let rcode = u16::from(crate::answer::RCODE_FORMERR);
                self.state.record(seq, index, u32::from(rcode));
                *self.hostile.entry((item.origin, UNFORWARDABLE_WRITES)).or_default() += 1;
                if let Some(reply) = item.reply {
                    out.push(Command::Answer { reply, bytes: self.gate.answer_without_named(&message, rcode, time_s) });
                }
                Step::Next
            }
            UpdateDecision::Forward(bytes) => {
                // Only a signature valid now opens a window: a far-future time
                // signed cannot pin an entry.
                let window = replay.filter(|k| k.from_s <= time_s && time_s <= k.until_s).map(|k| (k.digest, k.until_s));
                self.forward_write(at, item, message, bytes, window, out)
            }
            UpdateDecision::Refuse { rcode, answer } => {
                self.state.record(seq, index, u32::from(rcode));
                *self.hostile.entry((item.origin, UNAUTHORIZED_WRITES)).or_default() += 1;
                if let Some(reply) = item.reply {
                    out.push(Command::Answer { reply, bytes: answer });
                }
                Step::Next
            }
        }
    }

    /// named's answer to a replayed write as the client got it the first time (the gate
    /// re-signs it for the client's key, over the same MAC), or one built for its recorded
    /// `outcome` when this replica no longer holds it.
    fn duplicate_answer(&self, message: &[u8], digest: [u8; 32], outcome: u32, time_s: u64) -> Vec<u8> {
        match self.answers.get(&digest) {
            Some(a) => {
                // Under this copy's header id (a replay may carry another).
                let mut a = a.clone();
                if let (Some(to), Some(from)) = (a.get_mut(..2), message.get(..2)) {
                    to.copy_from_slice(from);
                }
                self.gate.answer_for_client(message, &a)
            }
            // Signed for the client as named's answer was (a state
            // transfer or a restart emptied the cache, say).
            None => self.gate.answer_without_named(message, client_rcode(outcome), time_s),
        }
    }

    /// A write the gate passed (`bytes`, re-signed for named): sent to named, unless named
    /// applied it before a crash or `faults + 1` replicas already said it is stuck.
    fn forward_write(&mut self, at: At, item: Item<R>, message: Vec<u8>, bytes: Vec<u8>, window: Option<([u8; 32], u64)>, out: &mut Vec<Command<R>>) -> Step {
        let (seq, index, time_s) = (at.seq, at.index, at.time_us / 1_000_000);
        if self.running.as_ref().is_some_and(|run| run.applied == Some(index)) {
            // named applied it before this replica crashed: it answered
            // NOERROR then (only a successful update changes the zone).
            // Its client went with the crash; a retransmission gets the
            // recorded outcome.
            self.state.record(seq, index, 0);
            if let Some((digest, expires_s)) = window {
                self.state.remember_write(digest, RecentWrite { expires_s, outcome: 0 });
            }
            if let Some(run) = self.running.as_mut() {
                run.named = true;
            }
            return Step::Next;
        }
        if self_abandoned(&self.stuck_claims, self.config.faults, seq, index) {
            // f+1 replicas said it is stuck, and this one has not sent it
            // yet (it was behind, or restarted): not sent at all.
            self.abandon_write(seq, index, &message, item.reply, window, time_s, out);
            out.push(Command::AbandonWrite { seq, index });
            return Step::Next;
        }
        self.keep_before();
        let times = self.times(at.time_us);
        out.push(Command::Write { seq, index, message: bytes, times });
        if let Some(run) = self.running.as_mut() {
            run.wait = Some(Wait::Write { index, request: message, reply: item.reply, window });
            run.named = true;
        }
        Step::Wait
    }

    /// An ordered read or transfer: executed only at the gateway that owes the answer,
    /// within the read slots.
    fn execute_read(&mut self, index: u32, item: Item<R>, transfer: bool, tcp: bool, message: Vec<u8>, out: &mut Vec<Command<R>>) -> Step {
        // Only the gateway owes an answer; the others only ordered it.
        if item.reply.is_none() {
            return Step::Next;
        }
        if self.reads.len() >= self.config.max_reads_in_flight.max(1) {
            self.hold(index, item, Wait::ReadSlot);
            return Step::Wait;
        }
        let Some(reply) = item.reply else { return Step::Next };
        self.next_read += 1;
        let id = self.next_read;
        self.reads.insert(id);
        out.push(Command::Read { id, transfer, tcp, message, reply });
        Step::Next
    }

    /// An ordered claim that a replica's part of zone `zone`'s signing is done: counted, and
    /// with `faults + 1` of them the signed zone is installed here.
    fn execute_finish_claim(&mut self, zone: u16, at: At, item: Item<R>, auth: &SignFinishAuth, out: &mut Vec<Command<R>>) -> Step {
        self.keep_before();
        let Some(signing) = self.state.zone(zone).signing else {
            if let Some(reply) = item.reply {
                out.push(Command::Answer { reply, bytes: b"no signing running".to_vec() });
            }
            return Step::Next;
        };
        if let Err(text) = self.finish_claim(zone, item.origin, auth, signing.seq, at.time_us / 1_000_000) {
            if let Some(reply) = item.reply {
                out.push(Command::Answer { reply, bytes: text.into_bytes() });
            }
            return Step::Next;
        }
        let votes = &mut self.state.zone_mut(zone).sign_finish_votes;
        votes.insert(item.origin);
        let (counted, needed) = (votes.len(), usize::from(self.config.faults) + 1);
        if counted < needed {
            if let Some(reply) = item.reply {
                let text = format!("counted: {counted} of the {needed} replicas needed are done");
                out.push(Command::Answer { reply, bytes: text.into_bytes() });
            }
            return Step::Next;
        }
        // Installing changes the zone: like a write, after the reads before it.
        if !self.zone_quiet() {
            self.hold(at.index, item, Wait::Barrier);
            return Step::Wait;
        }
        let times = self.times(at.time_us);
        out.push(Command::FinishSigning { zone, seq: at.seq, run: signing, times });
        if let Some(run) = self.running.as_mut() {
            run.wait = Some(Wait::Finish { zone, index: at.index, reply: item.reply });
            run.named = true;
        }
        Step::Wait
    }

    /// An ordered re-signing of zone `zone`: a slice when one is due by the agreed time.
    fn execute_resign(&mut self, zone: u16, at: At, item: Item<R>, out: &mut Vec<Command<R>>) -> Step {
        let time_s = at.time_us / 1_000_000;
        let z = self.state.zone(zone);
        if z.last_signed_s != 0 && time_s >= z.next_slice_s {
            // A slice changes the zone: like a write, after the reads before it.
            if !self.zone_quiet() {
                self.hold(at.index, item, Wait::Barrier);
                return Step::Wait;
            }
            self.keep_before();
            self.state.zone_mut(zone).next_slice_s = time_s.saturating_add(self.config.slice_interval_s.max(1));
            let refresh = u64::from(self.config.validity_s).saturating_sub(self.config.resign_after_s);
            let due_before_s = u32::try_from(time_s.saturating_add(refresh)).unwrap_or(u32::MAX);
            let times = self.times(at.time_us);
            out.push(Command::ResignSlice { zone, seq: at.seq, times, due_before_s, max_rrsets: self.config.slice_rrsets.max(1) });
            if let Some(run) = self.running.as_mut() {
                run.wait = Some(Wait::Slice { zone, index: at.index, reply: item.reply });
                run.named = true;
            }
            return Step::Wait;
        }
        if let Some(reply) = item.reply {
            out.push(Command::Answer { reply, bytes: b"done".to_vec() });
        }
        Step::Next
    }

    fn cache_answer(&mut self, digest: [u8; 32], answer: Vec<u8>) {
        if self.answers.insert(digest, answer).is_none() {
            self.answer_order.push_back(digest);
        }
        while self.answer_order.len() > ANSWER_CACHE {
            if let Some(old) = self.answer_order.pop_front() {
                self.answers.remove(&old);
            }
        }
    }

    /// Nothing reads the zone for an earlier item: no read in flight, no checkpoint digest
    /// being computed. A zone change (write, signing, slice) waits for this.
    fn zone_quiet(&self) -> bool {
        self.reads.is_empty() && self.digesting.is_none()
    }

    /// Counts the running batch's item `index` as a request of this kind, unless it was
    /// counted when it first came up (it waited since).
    fn count(&mut self, index: u32, kind: Kind) {
        let Some(run) = self.running.as_mut() else { return };
        if run.counted.is_some_and(|last| index <= last) {
            return;
        }
        run.counted = Some(index);
        self.requests.add(kind);
    }

    /// Puts `item` back at the front and waits.
    fn hold(&mut self, index: u32, item: Item<R>, wait: Wait<R>) {
        if let Some(run) = self.running.as_mut() {
            run.items.push_front((index, item));
            run.wait = Some(wait);
        }
    }

    /// A whole-zone signing decided at this point of the log; it begins once the reads
    /// issued before it are done (the decision is not taken again).
    fn start_signing(&mut self, zone: u16, index: u32, reply: Option<R>, seq: u64, time_us: u64, out: &mut Vec<Command<R>>) {
        let times = self.times(time_us);
        let quiet = self.zone_quiet();
        let Some(run) = self.running.as_mut() else { return };
        if quiet {
            run.wait = Some(Wait::Begin { zone, index, reply });
            run.named = true;
            out.push(Command::BeginSigning { zone, seq, times });
        } else {
            run.wait = Some(Wait::SignPending { zone, index, reply });
        }
    }

    /// Whether an ordered finish claim proves that replica `origin`'s part of the signing
    /// begun at `run_seq` is done: signed by `origin`'s key (checked at agreed time
    /// `time_s`), for this run. A Byzantine primary can order claims under any origin;
    /// only the claims replicas made count.
    fn finish_claim(&self, zone: u16, origin: u16, auth: &SignFinishAuth, run_seq: u64, time_s: u64) -> Result<(), String> {
        if auth.replica != origin {
            return Err(format!("refused: a finish claim signed for replica {} was ordered as replica {origin}'s", auth.replica));
        }
        if auth.run_seq != run_seq {
            return Err(format!("refused: replica {origin}'s finish claim is for the signing begun at seq {}, not {run_seq}", auth.run_seq));
        }
        let verifier = self.verifiers.get(&zone).ok_or_else(|| format!("refused: no zone has index {zone}"))?;
        verifier.verify_finish(auth, time_s).map(|_| ()).map_err(|e| format!("refused: the finish claim does not prove replica {origin}: {e}"))
    }

    /// Counts an ordered sign-zone request; `Ok` when it completes the t+1 needed (the
    /// requests are then used up), otherwise the answer for the admin. It counts only for
    /// the replica whose key signed it, only once (its stamp must be newer than any
    /// counted before from that replica), and only if signed within the window of the
    /// agreed time; the ordering's `origin` must agree with the signer.
    fn sign_zone_request(&mut self, zone: u16, origin: u16, auth: &SignZoneAuth, time_s: u64) -> Result<(), String> {
        let verifier = self.verifiers.get(&zone).ok_or_else(|| format!("refused: no zone has index {zone}"))?;
        if let Some(run) = self.state.zone(zone).signing {
            return Err(format!("refused: a whole-zone signing is running since seq {}", run.seq));
        }
        let window = self.config.sign_zone_window_s;
        check_stamped(origin, auth, self.state.zone(zone).sign_zone_stamps.get(&origin).copied(), time_s, window)?;
        if let Err(e) = verifier.verify(auth, time_s) {
            return Err(format!("refused: the request does not prove replica {origin}: {e}"));
        }
        let s = self.state.zone_mut(zone);
        // Used now, whatever follows: a replay of this request never counts.
        s.sign_zone_stamps.insert(origin, auth.stamp_us);
        if s.last_signed_s != 0 && time_s < s.last_signed_s.saturating_add(self.config.sign_zone_interval_s) {
            return Err(format!(
                "refused: the zone was signed at agreed time {}; the next sign-zone may run from {}",
                s.last_signed_s,
                s.last_signed_s.saturating_add(self.config.sign_zone_interval_s)
            ));
        }
        s.sign_zone_requests.retain(|_, t| t.saturating_add(window) >= time_s);
        s.sign_zone_requests.insert(origin, time_s);
        let needed = usize::from(self.config.faults) + 1;
        if s.sign_zone_requests.len() >= needed {
            s.sign_zone_requests.clear();
            Ok(())
        } else {
            Err(format!("waiting: {} of the {needed} replicas needed asked for sign-zone", s.sign_zone_requests.len()))
        }
    }
}

/// `name` (absolute, lower case) is `zone` or below it.
fn within(name: &str, zone: &str) -> bool {
    zone == "." || name == zone || name.strip_suffix(zone).is_some_and(|head| head.ends_with('.'))
}

/// An absolute lower-case name of labels of letters, digits, `-` and `_` (what the zone
/// directories and named.conf take), not the root.
fn valid_zone_name(name: &str) -> bool {
    let Some(body) = name.strip_suffix('.') else { return false };
    !body.is_empty()
        && name.len() <= 253
        && body.split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'))
}

/// Whether committed claims from `faults + 1` distinct origins name write `index` of batch `seq`.
fn self_abandoned(claims: &BTreeMap<u16, (u64, u32)>, faults: u16, seq: u64, index: u32) -> bool {
    claims.values().filter(|c| **c == (seq, index)).count() > usize::from(faults)
}

/// The rcode a client gets for a recorded outcome: named's own (its low four bits: an
/// extended rcode needs an OPT the core does not build), SERVFAIL for the core's own codes.
fn client_rcode(outcome: u32) -> u16 {
    u16::try_from(outcome).ok().filter(|c| *c < 16).unwrap_or(u16::from(ResponseCode::ServFail))
}

/// The checks an identity-signed admin request (sign-zone, zone-set change) passes before it
/// counts: signed by the replica the ordering names, stamped after that replica's last counted
/// request, and within `window_s` of the agreed time.
fn check_stamped(origin: u16, auth: &SignZoneAuth, last_stamp_us: Option<u64>, time_s: u64, window_s: u64) -> Result<(), String> {
    if auth.replica != origin {
        return Err(format!("refused: a request signed for replica {} was ordered as replica {origin}'s", auth.replica));
    }
    if let Some(last) = last_stamp_us {
        if auth.stamp_us <= last {
            return Err(format!("refused: replica {origin}'s request stamped {} is not newer than its last counted one", auth.stamp_us));
        }
    }
    let stamp_s = auth.stamp_us / 1_000_000;
    if stamp_s.abs_diff(time_s) > window_s {
        return Err(format!("refused: replica {origin}'s request was signed at {stamp_s}, ordered at agreed time {time_s}: more than {window_s} s apart"));
    }
    Ok(())
}
