//! The execution state every honest replica holds identically after the same prefix
//! of the log: where execution stands, the outcome of every ordered write, and what
//! whole-zone operations were asked for and done. Persisted after every batch that sent
//! something to named or changed a zone's schedule, and at every checkpoint batch (a batch of
//! reads and refusals decided without named is executed again alike after a restart);
//! checkpoints attest to it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::authority::{ZoneSetAction, ZoneSetChange};
use crate::codec::{self, CodecError};

/// 2 added `next_slice_s` and the sign-zone stamps; 3 the background whole-zone signing
/// (`signing`, `sign_finish_votes`); 4 moved everything whole-zone operations decide into
/// one [`ZoneExec`] per zone; 5 added the rollover reports (`rollover_reports`,
/// `rollover_finished_s`); 6 the zone set changed at run time (`zone_set`, `next_zone_index`,
/// `zone_set_requests`, `zone_set_stamps`). Older states are read and converted (as zone 0's;
/// a state before 6 serves the configuration's zones).
const VERSION: u8 = 6;
/// Room for the largest zone set (`MAX_ZONES` names with their entries and schedules).
const MAX_STATE_BYTES: usize = 1024 * 1024;
/// The most zones one cluster serves (configured and added at run time together).
pub const MAX_ZONES: usize = 1024;
/// Recent signed writes (TSIG or SIG(0)) remembered for deduplication; beyond, the one whose
/// window closes first is forgotten.
pub const MAX_RECENT_WRITES: usize = 1024;

/// Outcome codes folded into the outcome chain besides named's rcodes (0..=4095).
pub mod code {
    /// named's answer to a write did not decode.
    pub const UNDECODABLE_ANSWER: u32 = 0x0001_0000;
    /// A whole-zone signing ran and the zone was replaced.
    pub const ZONE_SIGNED: u32 = 0x0002_0000;
    /// A whole-zone signing ran and failed; the zone was left as it was.
    pub const ZONE_SIGN_FAILED: u32 = 0x0002_0001;
    /// Added to the first execution's code: a byte-identical retransmission, not executed.
    pub const DUPLICATE: u32 = 0x0004_0000;
    /// A re-signing slice ran; the low 16 bits hold how many RRsets it re-signed
    /// (the same on every honest replica, whose zones are the same).
    pub const SLICE_RESIGNED: u32 = 0x0008_0000;
    /// A re-signing slice failed (named refused or could not sign); the zone is unchanged.
    pub const SLICE_FAILED: u32 = 0x0008_ffff;
    /// A background whole-zone signing began: the zone's content at this point was
    /// taken as what it signs.
    pub const SIGNING_BEGUN: u32 = 0x0010_0000;
    /// Another round of a background signing began: the low 16 bits hold how many records
    /// the writes changed during the last one (capped).
    pub const SIGNING_ROUND: u32 = 0x0020_0000;
    /// A write abandoned: claims that it was stuck from t+1 replicas were committed before
    /// named answered it here (or before it was sent); its client got SERVFAIL.
    pub const ABANDONED: u32 = 0x0040_0000;
    /// A zone was added to the zone set; the low 16 bits hold its index.
    pub const ZONE_ADDED: u32 = 0x0080_0000;
    /// A zone was removed from the zone set; the low 16 bits hold its index.
    pub const ZONE_REMOVED: u32 = 0x0100_0000;
}

/// A whole-zone signing running in the background: it signs the zone as it was at
/// batch `seq`, with signature times from that batch's agreed time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigningRun {
    pub seq: u64,
    pub time_s: u64,
}

/// A signed write executed recently: a copy of what its signature covers ordered before its
/// validity ends is not executed again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecentWrite {
    /// When its signature stops being valid (s): TSIG time signed plus fudge, SIG(0) expiration.
    pub expires_s: u64,
    /// The first execution's outcome code.
    pub outcome: u32,
}

/// What the whole-zone operations of one zone (sign-zone, background signing, incremental
/// re-signing) decided so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneExec {
    /// Agreed time (s) of the last successful whole-zone signing (0: never).
    pub last_signed_s: u64,
    /// Replicas whose sign-zone request was ordered and not yet acted on, with the
    /// agreed time (s) of that request.
    pub sign_zone_requests: BTreeMap<u16, u64>,
    /// Per replica, the stamp of its last signed sign-zone request that was counted:
    /// only a newer one counts, so no signed request counts twice.
    pub sign_zone_stamps: BTreeMap<u16, u64>,
    /// Agreed time (s) from which the next incremental re-signing slice may run.
    pub next_slice_s: u64,
    /// The whole-zone signing running in the background, if any.
    pub signing: Option<SigningRun>,
    /// Replicas whose request to finish the running signing (their own part of it is
    /// done) was ordered; t+1 finish it.
    pub sign_finish_votes: std::collections::BTreeSet<u16>,
    /// Replicas whose report that the parent's DS covers the threshold key was counted
    /// (`Op::RolloverReport`, each replica once); t+1 finish an adopted zone's rollover.
    pub rollover_reports: std::collections::BTreeSet<u16>,
    /// Agreed time (s) at which t+1 reports finished the zone's rollover (0: not finished).
    /// From then on a whole-zone signing leaves the rollover's records out.
    pub rollover_finished_s: u64,
}

/// A zone's part as version 4 stored it (without the rollover reports).
#[derive(Deserialize)]
pub struct ZoneExecV4 {
    last_signed_s: u64,
    sign_zone_requests: BTreeMap<u16, u64>,
    sign_zone_stamps: BTreeMap<u16, u64>,
    next_slice_s: u64,
    signing: Option<SigningRun>,
    sign_finish_votes: std::collections::BTreeSet<u16>,
}

impl From<ZoneExecV4> for ZoneExec {
    fn from(v4: ZoneExecV4) -> ZoneExec {
        ZoneExec {
            last_signed_s: v4.last_signed_s,
            sign_zone_requests: v4.sign_zone_requests,
            sign_zone_stamps: v4.sign_zone_stamps,
            next_slice_s: v4.next_slice_s,
            signing: v4.signing,
            sign_finish_votes: v4.sign_finish_votes,
            ..Default::default()
        }
    }
}

/// The state as version 4 stored it. Also inside version 2 write intents and version 3
/// snapshots (the wrapper's `statexfer`, hence public; read only, through `From`).
#[derive(Deserialize)]
pub struct StateV4 {
    executed: u64,
    outcomes: [u8; 32],
    recent_writes: BTreeMap<[u8; 32], RecentWrite>,
    zones: BTreeMap<u16, ZoneExecV4>,
}

impl From<StateV4> for ExecState {
    fn from(v4: StateV4) -> ExecState {
        let zones = v4.zones.into_iter().map(|(i, z)| (i, z.into())).collect();
        ExecState { executed: v4.executed, outcomes: v4.outcomes, recent_writes: v4.recent_writes, zones, ..Default::default() }
    }
}

/// The state as version 5 stored it (the configuration's zone set). Also inside version 3
/// write intents and version 4 snapshots (read only, through `From`).
#[derive(Deserialize)]
pub struct StateV5 {
    executed: u64,
    outcomes: [u8; 32],
    recent_writes: BTreeMap<[u8; 32], RecentWrite>,
    zones: BTreeMap<u16, ZoneExec>,
}

impl From<StateV5> for ExecState {
    fn from(v5: StateV5) -> ExecState {
        ExecState { executed: v5.executed, outcomes: v5.outcomes, recent_writes: v5.recent_writes, zones: v5.zones, ..Default::default() }
    }
}

/// A zone of the zone set kept in the state once it changed at run time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneEntry {
    /// Absolute, lower case.
    pub name: String,
    /// SHA-256 of the dealt public key the replicas agreed on when adding it; zeros for a
    /// zone of the configuration (dealt with the cluster).
    pub key_digest: [u8; 32],
    /// The seq of the batch that added it (0: configured).
    pub added_at: u64,
}

impl ZoneExec {
    fn hash_into(&self, h: &mut Sha256) {
        h.update(self.last_signed_s.to_be_bytes());
        h.update((self.sign_zone_requests.len() as u64).to_be_bytes());
        for (origin, t) in &self.sign_zone_requests {
            h.update(origin.to_be_bytes());
            h.update(t.to_be_bytes());
        }
        h.update((self.sign_zone_stamps.len() as u64).to_be_bytes());
        for (origin, stamp) in &self.sign_zone_stamps {
            h.update(origin.to_be_bytes());
            h.update(stamp.to_be_bytes());
        }
    }

    fn hash_schedule_into(&self, h: &mut Sha256) {
        h.update(self.next_slice_s.to_be_bytes());
        match self.signing {
            None => h.update([0u8]),
            Some(run) => {
                h.update([1u8]);
                h.update(run.seq.to_be_bytes());
                h.update(run.time_s.to_be_bytes());
            }
        }
        h.update((self.sign_finish_votes.len() as u64).to_be_bytes());
        for v in &self.sign_finish_votes {
            h.update(v.to_be_bytes());
        }
        // Only once a report counted: the digests of zones that never had one stay what
        // version 4 computed (a cluster upgraded mid-log keeps agreeing with its checkpoints).
        if !self.rollover_reports.is_empty() || self.rollover_finished_s != 0 {
            h.update(b"rollover");
            h.update(self.rollover_finished_s.to_be_bytes());
            h.update((self.rollover_reports.len() as u64).to_be_bytes());
            for r in &self.rollover_reports {
                h.update(r.to_be_bytes());
            }
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecState {
    /// The last batch executed in full (0: none).
    pub executed: u64,
    /// Hash chain over (seq, request index, outcome code) of every ordered write and
    /// whole-zone signing: a replica whose named answered differently differs here.
    pub outcomes: [u8; 32],
    /// Recent signed writes by what their signature covers (`exec::gate::ReplayKey`), with the
    /// end of their validity and their outcome.
    pub recent_writes: BTreeMap<[u8; 32], RecentWrite>,
    /// Per zone index (the order of the configuration's zones): a BTreeMap, so every
    /// replica walks it in the same order. A zone nothing happened to yet has no entry
    /// and reads as [`ZoneExec::default`].
    pub zones: BTreeMap<u16, ZoneExec>,
    /// The zones served, by index, once the zone set changed at run time (`Op::ZoneSet`).
    /// Empty: the configuration's zones, indices 0..n in canonical order, as every version
    /// before 6 (whose states and checkpoint digests thus stay as they were). A removed
    /// zone's index is never used again.
    pub zone_set: BTreeMap<u16, ZoneEntry>,
    /// The index the next added zone takes (meaningful once `zone_set` is not empty).
    pub next_zone_index: u16,
    /// Zone-set requests counted and not yet acted on: per change, the replicas that asked
    /// with the agreed time of their request.
    pub zone_set_requests: BTreeMap<ZoneSetChange, BTreeMap<u16, u64>>,
    /// Per replica, the stamp of its last counted zone-set request: only a newer one counts.
    pub zone_set_stamps: BTreeMap<u16, u64>,
}

/// The state as version 3 stored it (one zone). Also inside version 1 write intents and
/// version 2 snapshots (the wrapper's `statexfer`, hence public; read only, through `From`).
#[derive(Deserialize)]
pub struct StateV3 {
    executed: u64,
    last_signed_s: u64,
    sign_zone_requests: BTreeMap<u16, u64>,
    sign_zone_stamps: BTreeMap<u16, u64>,
    outcomes: [u8; 32],
    recent_writes: BTreeMap<[u8; 32], RecentWrite>,
    next_slice_s: u64,
    signing: Option<SigningRun>,
    sign_finish_votes: std::collections::BTreeSet<u16>,
}

impl From<StateV3> for ExecState {
    fn from(v3: StateV3) -> ExecState {
        let zone = ZoneExec {
            last_signed_s: v3.last_signed_s,
            sign_zone_requests: v3.sign_zone_requests,
            sign_zone_stamps: v3.sign_zone_stamps,
            next_slice_s: v3.next_slice_s,
            signing: v3.signing,
            sign_finish_votes: v3.sign_finish_votes,
            ..Default::default()
        };
        ExecState::with_zone0(v3.executed, v3.outcomes, v3.recent_writes, zone)
    }
}

/// The state as version 2 stored it.
#[derive(Deserialize)]
struct StateV2 {
    executed: u64,
    last_signed_s: u64,
    sign_zone_requests: BTreeMap<u16, u64>,
    sign_zone_stamps: BTreeMap<u16, u64>,
    outcomes: [u8; 32],
    recent_writes: BTreeMap<[u8; 32], RecentWrite>,
    next_slice_s: u64,
}

/// The state as version 1 stored it.
#[derive(Deserialize)]
struct StateV1 {
    executed: u64,
    last_signed_s: u64,
    #[allow(dead_code)]
    sign_zone_requests: BTreeMap<u16, u64>,
    outcomes: [u8; 32],
    recent_writes: BTreeMap<[u8; 32], RecentWrite>,
}

impl ExecState {
    /// Forgets writes whose window closed by `time_s`.
    pub fn prune_recent(&mut self, time_s: u64) {
        self.recent_writes.retain(|_, w| w.expires_s >= time_s);
    }

    /// Remembers a write; at the bound, the one whose window closes first goes.
    pub fn remember_write(&mut self, digest: [u8; 32], write: RecentWrite) {
        while self.recent_writes.len() >= MAX_RECENT_WRITES {
            let Some(first) = self.recent_writes.iter().min_by_key(|(k, w)| (w.expires_s, **k)).map(|(k, _)| *k) else { break };
            self.recent_writes.remove(&first);
        }
        self.recent_writes.insert(digest, write);
    }

    pub fn record(&mut self, seq: u64, index: u32, outcome: u32) {
        let mut h = Sha256::new();
        h.update(self.outcomes);
        h.update(seq.to_be_bytes());
        h.update(index.to_be_bytes());
        h.update(outcome.to_be_bytes());
        self.outcomes = h.finalize().into();
    }

    fn with_zone0(executed: u64, outcomes: [u8; 32], recent_writes: BTreeMap<[u8; 32], RecentWrite>, zone: ZoneExec) -> ExecState {
        let mut zones = BTreeMap::new();
        if zone != ZoneExec::default() {
            zones.insert(0, zone);
        }
        ExecState { executed, outcomes, recent_writes, zones, ..Default::default() }
    }

    /// The indices of the zones served, ascending: the state's zone set, or the
    /// `configured` zones' indices while it never changed.
    pub fn zone_indices(&self, configured: usize) -> Vec<u16> {
        if self.zone_set.is_empty() {
            (0..configured).map(|i| u16::try_from(i).unwrap_or(u16::MAX)).collect()
        } else {
            self.zone_set.keys().copied().collect()
        }
    }

    /// The zones served by index: the state's zone set, or the configured names (absolute,
    /// lower case) with indices 0..n while it never changed.
    pub fn zone_names(&self, configured: &[String]) -> BTreeMap<u16, String> {
        if self.zone_set.is_empty() {
            configured.iter().enumerate().map(|(i, n)| (u16::try_from(i).unwrap_or(u16::MAX), crate::names::absolute_name(n))).collect()
        } else {
            self.zone_set.iter().map(|(i, e)| (*i, e.name.clone())).collect()
        }
    }

    /// Copies the configured zones into `zone_set` (indices 0..n) before its first change.
    pub fn seed_zone_set(&mut self, configured: &[String]) {
        if !self.zone_set.is_empty() {
            return;
        }
        for (index, name) in self.zone_names(configured) {
            self.zone_set.insert(index, ZoneEntry { name, key_digest: [0; 32], added_at: 0 });
        }
        self.next_zone_index = u16::try_from(configured.len()).unwrap_or(u16::MAX);
    }

    /// Whether anything of the run-time zone set is in the state (then the checkpoint
    /// digest takes its version 3 form, which covers it).
    fn zone_set_touched(&self) -> bool {
        !self.zone_set.is_empty() || !self.zone_set_requests.is_empty() || !self.zone_set_stamps.is_empty()
    }

    /// Whether what a batch may change durably (everything but the executed position, the
    /// outcome chain and the recent writes, which executing it again recomputes) is equal.
    pub fn same_schedules(&self, other: &ExecState) -> bool {
        self.zones == other.zones
            && self.zone_set == other.zone_set
            && self.next_zone_index == other.next_zone_index
            && self.zone_set_requests == other.zone_set_requests
            && self.zone_set_stamps == other.zone_set_stamps
    }

    /// Zone `index`'s part (the default when nothing happened to it yet).
    pub fn zone(&self, index: u16) -> ZoneExec {
        self.zones.get(&index).cloned().unwrap_or_default()
    }

    /// Zone `index`'s part, to change.
    pub fn zone_mut(&mut self, index: u16) -> &mut ZoneExec {
        self.zones.entry(index).or_default()
    }

    /// What a checkpoint attests: the zones' content (`zones[i]`: the digest of zone i's
    /// records) and this state (less the executed position, which the checkpoint's
    /// sequence number already names). With one zone, the form every earlier version
    /// used, so a single-zone cluster's digests, kept snapshots and certificates stay
    /// valid across the upgrade; with several, SHA-256 over (zone index, zone digest) in
    /// index order, then the shared state, then each zone's part in index order.
    ///
    /// Once the zone set was touched at run time (a zone-set request counted), version 3:
    /// `zones` are the digests in the state's zone index order, each hashed with its index,
    /// name, key digest and the batch that added it, then the next index, the shared state,
    /// the counted zone-set requests and stamps, and each zone's part.
    pub fn checkpoint_digest(&self, zones: &[[u8; 32]]) -> [u8; 32] {
        if self.zone_set_touched() {
            return self.checkpoint_digest_v3(zones);
        }
        let mut h = Sha256::new();
        if let [zone] = zones {
            let z = self.zone(0);
            h.update(b"sdns checkpoint v1");
            h.update(zone);
            h.update(self.outcomes);
            z.hash_into(&mut h);
            self.hash_recent_into(&mut h);
            z.hash_schedule_into(&mut h);
            return h.finalize().into();
        }
        h.update(b"sdns checkpoint v2");
        h.update((zones.len() as u64).to_be_bytes());
        for (index, digest) in zones.iter().enumerate() {
            h.update((index as u64).to_be_bytes());
            h.update(digest);
        }
        h.update(self.outcomes);
        self.hash_recent_into(&mut h);
        for index in 0..zones.len() {
            let z = self.zone(u16::try_from(index).unwrap_or(u16::MAX));
            h.update((index as u64).to_be_bytes());
            z.hash_into(&mut h);
            z.hash_schedule_into(&mut h);
        }
        h.finalize().into()
    }

    fn checkpoint_digest_v3(&self, zones: &[[u8; 32]]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"sdns checkpoint v3");
        let indices = self.zone_indices(zones.len());
        h.update((zones.len() as u64).to_be_bytes());
        h.update((indices.len() as u64).to_be_bytes());
        for (index, digest) in indices.iter().zip(zones) {
            h.update(index.to_be_bytes());
            match self.zone_set.get(index) {
                Some(e) => {
                    h.update([1u8]);
                    hash_name(&mut h, &e.name);
                    h.update(e.key_digest);
                    h.update(e.added_at.to_be_bytes());
                }
                None => h.update([0u8]),
            }
            h.update(digest);
        }
        h.update(self.next_zone_index.to_be_bytes());
        h.update(self.outcomes);
        self.hash_recent_into(&mut h);
        h.update((self.zone_set_requests.len() as u64).to_be_bytes());
        for (change, votes) in &self.zone_set_requests {
            h.update([match change.action {
                ZoneSetAction::Add => 1u8,
                ZoneSetAction::Remove => 2,
            }]);
            hash_name(&mut h, &change.name);
            h.update(change.key_digest);
            h.update((votes.len() as u64).to_be_bytes());
            for (replica, t) in votes {
                h.update(replica.to_be_bytes());
                h.update(t.to_be_bytes());
            }
        }
        h.update((self.zone_set_stamps.len() as u64).to_be_bytes());
        for (replica, stamp) in &self.zone_set_stamps {
            h.update(replica.to_be_bytes());
            h.update(stamp.to_be_bytes());
        }
        for index in &indices {
            let z = self.zone(*index);
            h.update(index.to_be_bytes());
            z.hash_into(&mut h);
            z.hash_schedule_into(&mut h);
        }
        h.finalize().into()
    }

    fn hash_recent_into(&self, h: &mut Sha256) {
        h.update((self.recent_writes.len() as u64).to_be_bytes());
        for (digest, w) in &self.recent_writes {
            h.update(digest);
            h.update(w.expires_s.to_be_bytes());
            h.update(w.outcome.to_be_bytes());
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        codec::encode(VERSION, self)
    }

    pub fn decode(bytes: &[u8]) -> Result<ExecState, CodecError> {
        match codec::decode("execution state", VERSION, MAX_STATE_BYTES, bytes) {
            Err(CodecError::Version { got: 1, .. }) => {
                let v1: StateV1 = codec::decode("execution state", 1, MAX_STATE_BYTES, bytes)?;
                // Requests counted under v1 were not proven by their replicas: dropped.
                let zone = ZoneExec { last_signed_s: v1.last_signed_s, ..Default::default() };
                Ok(ExecState::with_zone0(v1.executed, v1.outcomes, v1.recent_writes, zone))
            }
            Err(CodecError::Version { got: 2, .. }) => {
                let v2: StateV2 = codec::decode("execution state", 2, MAX_STATE_BYTES, bytes)?;
                let zone = ZoneExec {
                    last_signed_s: v2.last_signed_s,
                    sign_zone_requests: v2.sign_zone_requests,
                    sign_zone_stamps: v2.sign_zone_stamps,
                    next_slice_s: v2.next_slice_s,
                    ..Default::default()
                };
                Ok(ExecState::with_zone0(v2.executed, v2.outcomes, v2.recent_writes, zone))
            }
            Err(CodecError::Version { got: 3, .. }) => {
                let v3: StateV3 = codec::decode("execution state", 3, MAX_STATE_BYTES, bytes)?;
                Ok(v3.into())
            }
            Err(CodecError::Version { got: 4, .. }) => {
                let v4: StateV4 = codec::decode("execution state", 4, MAX_STATE_BYTES, bytes)?;
                Ok(v4.into())
            }
            Err(CodecError::Version { got: 5, .. }) => {
                let v5: StateV5 = codec::decode("execution state", 5, MAX_STATE_BYTES, bytes)?;
                Ok(v5.into())
            }
            other => other,
        }
    }

    /// The persisted state; a missing file is the initial state.
    pub fn load(path: &Path) -> Result<ExecState, StateError> {
        match std::fs::read(path) {
            Ok(bytes) => ExecState::decode(&bytes).map_err(|source| StateError::Decode { path: path.to_owned(), source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ExecState::default()),
            Err(source) => Err(StateError::Io { path: path.to_owned(), source }),
        }
    }

    /// Writes the state atomically and durably: temporary file, fsync, rename, fsync of the
    /// directory. A crash leaves the previous state or this one, never a mix.
    pub fn store(&self, path: &Path) -> Result<(), StateError> {
        store_durably(path, &self.encode())
    }
}

fn hash_name(h: &mut Sha256, name: &str) {
    h.update((name.len() as u64).to_be_bytes());
    h.update(name.as_bytes());
}

fn store_durably(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    use std::io::Write as _;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|source| StateError::Io { path: path.to_owned(), source })
}

/// 2: with the zone whose serial was read (and the version 4 state); 3: the version 5 state;
/// 4: the version 6 state. 1 is read as zone 0's.
const INTENT_VERSION: u8 = 4;

/// Recorded durably before a write goes to named: which write (batch and item), named's SOA
/// serial just before it, and the execution state just before it (the outcomes of the
/// batch's earlier items included; `state` is persisted only after whole batches).
///
/// After a crash, the batch after the executed one is resumed from here rather than run
/// again from its start: the items before `index` are not sent to named a second time, and
/// named's serial says whether it applied this one (named increments the serial with every
/// update that changes the zone, and an update changes the zone only when it succeeds). A
/// write it applied is recorded as the NOERROR it was; one it did not apply, or applied
/// without a change, is sent again and answers as it did (or would have) the first time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteIntent {
    pub seq: u64,
    pub index: u32,
    /// The zone the change is to, whose serial `serial` is.
    pub zone: u16,
    pub serial: u32,
    pub state: ExecState,
}

/// A write intent as version 3 stored it (a version 5 state).
#[derive(Deserialize)]
struct IntentV3 {
    seq: u64,
    index: u32,
    zone: u16,
    serial: u32,
    state: StateV5,
}

/// A write intent as version 2 stored it (a version 4 state).
#[derive(Deserialize)]
struct IntentV2 {
    seq: u64,
    index: u32,
    zone: u16,
    serial: u32,
    state: StateV4,
}

/// A write intent as version 1 stored it (one zone, a version 3 state).
#[derive(Deserialize)]
struct IntentV1 {
    seq: u64,
    index: u32,
    serial: u32,
    state: StateV3,
}

impl WriteIntent {
    /// The intent kept next to the execution state `state_file`.
    pub fn path_for(state_file: &Path) -> std::path::PathBuf {
        state_file.with_file_name("exec.intent")
    }

    pub fn load(path: &Path) -> Result<Option<WriteIntent>, StateError> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let decoded = match codec::decode("write intent", INTENT_VERSION, MAX_STATE_BYTES + 64, &bytes) {
                    Err(CodecError::Version { got: 1, .. }) => codec::decode::<IntentV1>("write intent", 1, MAX_STATE_BYTES + 64, &bytes)
                        .map(|v1| WriteIntent { seq: v1.seq, index: v1.index, zone: 0, serial: v1.serial, state: v1.state.into() }),
                    Err(CodecError::Version { got: 2, .. }) => codec::decode::<IntentV2>("write intent", 2, MAX_STATE_BYTES + 64, &bytes)
                        .map(|v2| WriteIntent { seq: v2.seq, index: v2.index, zone: v2.zone, serial: v2.serial, state: v2.state.into() }),
                    Err(CodecError::Version { got: 3, .. }) => codec::decode::<IntentV3>("write intent", 3, MAX_STATE_BYTES + 64, &bytes)
                        .map(|v3| WriteIntent { seq: v3.seq, index: v3.index, zone: v3.zone, serial: v3.serial, state: v3.state.into() }),
                    other => other,
                };
                decoded.map(Some).map_err(|source| StateError::Decode { path: path.to_owned(), source })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StateError::Io { path: path.to_owned(), source }),
        }
    }

    /// Durably, before the write may reach named.
    pub fn store(&self, path: &Path) -> Result<(), StateError> {
        store_durably(path, &codec::encode(INTENT_VERSION, self))
    }
}

/// `a` is before `b` in serial number arithmetic (RFC 1982).
pub fn serial_before(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000_0000
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    #[error("execution state {path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("execution state {path}: {source}")]
    Decode { path: std::path::PathBuf, source: CodecError },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_chain_order_matters() {
        let mut a = ExecState { executed: 9, ..Default::default() };
        a.zone_mut(0).last_signed_s = 100;
        a.zone_mut(0).sign_zone_requests.insert(2, 50);
        a.record(1, 0, 0);
        a.record(2, 0, 5);
        assert_eq!(ExecState::decode(&a.encode()).unwrap(), a);
        let mut b = ExecState { executed: 9, ..Default::default() };
        b.zone_mut(0).last_signed_s = 100;
        b.zone_mut(0).sign_zone_requests.insert(2, 50);
        b.record(2, 0, 5);
        b.record(1, 0, 0);
        assert_ne!(a.outcomes, b.outcomes);
        let zone = [7; 32];
        assert_ne!(a.checkpoint_digest(&[zone]), b.checkpoint_digest(&[zone]));
        assert_ne!(a.checkpoint_digest(&[zone]), a.checkpoint_digest(&[[8; 32]]));
    }

    #[test]
    fn stamps_are_attested_and_v1_states_convert() {
        let mut a = ExecState::default();
        a.zone_mut(0).sign_zone_stamps.insert(1, 10);
        let mut b = a.clone();
        b.zone_mut(0).sign_zone_stamps.insert(1, 11);
        assert_ne!(a.checkpoint_digest(&[[0; 32]]), b.checkpoint_digest(&[[0; 32]]));
        assert_eq!(ExecState::decode(&b.encode()).unwrap(), b);

        #[derive(Serialize)]
        struct V1 {
            executed: u64,
            last_signed_s: u64,
            sign_zone_requests: BTreeMap<u16, u64>,
            outcomes: [u8; 32],
            recent_writes: BTreeMap<[u8; 32], RecentWrite>,
        }
        let old = V1 { executed: 5, last_signed_s: 6, sign_zone_requests: [(2, 3)].into(), outcomes: [9; 32], recent_writes: BTreeMap::new() };
        let s = ExecState::decode(&codec::encode(1, &old)).unwrap();
        assert_eq!((s.executed, s.zone(0).last_signed_s, s.outcomes), (5, 6, [9; 32]));
        assert!(s.zone(0).sign_zone_requests.is_empty() && s.zone(0).sign_zone_stamps.is_empty());
    }

    #[test]
    fn recent_writes_are_bounded_and_expire() {
        let mut s = ExecState::default();
        for i in 0..(MAX_RECENT_WRITES + 10) {
            let mut d = [0u8; 32];
            d[..8].copy_from_slice(&(i as u64).to_be_bytes());
            s.remember_write(d, RecentWrite { expires_s: 1000 + i as u64, outcome: 0 });
        }
        assert_eq!(s.recent_writes.len(), MAX_RECENT_WRITES);
        assert!(s.recent_writes.values().all(|w| w.expires_s >= 1010), "the earliest windows went first");
        s.prune_recent(1000 + MAX_RECENT_WRITES as u64);
        assert_eq!(s.recent_writes.len(), 10);
        assert!(s.encode().len() < MAX_STATE_BYTES);
    }

    #[test]
    fn reads_a_version_1_state() {
        #[derive(Serialize)]
        struct V1 {
            executed: u64,
            last_signed_s: u64,
            sign_zone_requests: BTreeMap<u16, u64>,
            outcomes: [u8; 32],
            recent_writes: BTreeMap<[u8; 32], RecentWrite>,
        }
        let old = V1 { executed: 7, last_signed_s: 99, sign_zone_requests: BTreeMap::new(), outcomes: [4; 32], recent_writes: BTreeMap::new() };
        let s = ExecState::decode(&codec::encode(1, &old)).unwrap();
        assert_eq!((s.executed, s.zone(0).last_signed_s, s.outcomes, s.zone(0).next_slice_s), (7, 99, [4; 32], 0));
        let mut later = s.clone();
        later.zone_mut(0).next_slice_s = 5;
        assert_ne!(s.checkpoint_digest(&[[0; 32]]), later.checkpoint_digest(&[[0; 32]]));
    }

    #[test]
    fn reads_a_version_2_state_and_attests_the_signing_run() {
        #[derive(Serialize)]
        struct V2 {
            executed: u64,
            last_signed_s: u64,
            sign_zone_requests: BTreeMap<u16, u64>,
            sign_zone_stamps: BTreeMap<u16, u64>,
            outcomes: [u8; 32],
            recent_writes: BTreeMap<[u8; 32], RecentWrite>,
            next_slice_s: u64,
        }
        let old = V2 {
            executed: 8,
            last_signed_s: 90,
            sign_zone_requests: BTreeMap::new(),
            sign_zone_stamps: [(1, 4)].into(),
            outcomes: [3; 32],
            recent_writes: BTreeMap::new(),
            next_slice_s: 12,
        };
        let s = ExecState::decode(&codec::encode(2, &old)).unwrap();
        assert_eq!((s.executed, s.zone(0).last_signed_s, s.zone(0).next_slice_s, s.zone(0).signing), (8, 90, 12, None));
        assert_eq!(s.zone(0).sign_zone_stamps.get(&1), Some(&4));
        let mut running = s.clone();
        running.zone_mut(0).signing = Some(SigningRun { seq: 9, time_s: 100 });
        assert_ne!(s.checkpoint_digest(&[[0; 32]]), running.checkpoint_digest(&[[0; 32]]));
        let mut voted = running.clone();
        voted.zone_mut(0).sign_finish_votes.insert(2);
        assert_ne!(running.checkpoint_digest(&[[0; 32]]), voted.checkpoint_digest(&[[0; 32]]));
        assert_eq!(ExecState::decode(&voted.encode()).unwrap(), voted);
    }

    #[derive(Serialize)]
    struct V3 {
        executed: u64,
        last_signed_s: u64,
        sign_zone_requests: BTreeMap<u16, u64>,
        sign_zone_stamps: BTreeMap<u16, u64>,
        outcomes: [u8; 32],
        recent_writes: BTreeMap<[u8; 32], RecentWrite>,
        next_slice_s: u64,
        signing: Option<SigningRun>,
        sign_finish_votes: std::collections::BTreeSet<u16>,
    }

    fn v3() -> V3 {
        V3 {
            executed: 11,
            last_signed_s: 95,
            sign_zone_requests: [(3, 94)].into(),
            sign_zone_stamps: [(1, 4)].into(),
            outcomes: [6; 32],
            recent_writes: [([1; 32], RecentWrite { expires_s: 200, outcome: 0 })].into(),
            next_slice_s: 120,
            signing: Some(SigningRun { seq: 10, time_s: 90 }),
            sign_finish_votes: [2].into(),
        }
    }

    /// The digest a version 3 replica computed over the same state (its code, copied
    /// here as it was): a single-zone replica's checkpoints do not change with the upgrade.
    fn v3_digest(s: &V3, zone: &[u8; 32]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"sdns checkpoint v1");
        h.update(zone);
        h.update(s.outcomes);
        h.update(s.last_signed_s.to_be_bytes());
        h.update((s.sign_zone_requests.len() as u64).to_be_bytes());
        for (origin, t) in &s.sign_zone_requests {
            h.update(origin.to_be_bytes());
            h.update(t.to_be_bytes());
        }
        h.update((s.sign_zone_stamps.len() as u64).to_be_bytes());
        for (origin, stamp) in &s.sign_zone_stamps {
            h.update(origin.to_be_bytes());
            h.update(stamp.to_be_bytes());
        }
        h.update((s.recent_writes.len() as u64).to_be_bytes());
        for (digest, w) in &s.recent_writes {
            h.update(digest);
            h.update(w.expires_s.to_be_bytes());
            h.update(w.outcome.to_be_bytes());
        }
        h.update(s.next_slice_s.to_be_bytes());
        match s.signing {
            None => h.update([0u8]),
            Some(run) => {
                h.update([1u8]);
                h.update(run.seq.to_be_bytes());
                h.update(run.time_s.to_be_bytes());
            }
        }
        h.update((s.sign_finish_votes.len() as u64).to_be_bytes());
        for v in &s.sign_finish_votes {
            h.update(v.to_be_bytes());
        }
        h.finalize().into()
    }

    #[test]
    fn a_version_3_state_becomes_zone_0_with_the_same_single_zone_digest() {
        let old = v3();
        let s = ExecState::decode(&codec::encode(3, &old)).unwrap();
        let z = s.zone(0);
        assert_eq!((s.executed, s.outcomes, z.last_signed_s, z.next_slice_s, z.signing), (11, [6; 32], 95, 120, old.signing));
        assert_eq!(
            (&z.sign_zone_requests, &z.sign_zone_stamps, &z.sign_finish_votes),
            (&old.sign_zone_requests, &old.sign_zone_stamps, &old.sign_finish_votes)
        );
        assert_eq!(s.recent_writes, old.recent_writes);
        assert_eq!(s.checkpoint_digest(&[[5; 32]]), v3_digest(&old, &[5; 32]));
        assert_eq!(ExecState::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn a_version_1_write_intent_is_read_as_zone_0() {
        #[derive(Serialize)]
        struct IntentV1Out {
            seq: u64,
            index: u32,
            serial: u32,
            state: V3,
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exec.intent");
        std::fs::write(&path, codec::encode(1, &IntentV1Out { seq: 12, index: 2, serial: 7, state: v3() })).unwrap();
        let intent = WriteIntent::load(&path).unwrap().unwrap();
        assert_eq!((intent.seq, intent.index, intent.zone, intent.serial, intent.state.executed), (12, 2, 0, 7, 11));
        let new = WriteIntent { zone: 1, ..intent };
        new.store(&path).unwrap();
        assert_eq!(WriteIntent::load(&path).unwrap(), Some(new));
    }

    #[test]
    fn the_digest_over_several_zones_covers_every_zone_and_its_index() {
        let mut s = ExecState::default();
        let (a, b) = ([1; 32], [2; 32]);
        let base = s.checkpoint_digest(&[a, b]);
        assert_ne!(base, s.checkpoint_digest(&[b, a]), "the zones' order is their index");
        assert_ne!(base, s.checkpoint_digest(&[a, [3; 32]]));
        assert_ne!(base, s.checkpoint_digest(&[a]));
        // A zone without an entry and one with the default entry are the same state.
        s.zone_mut(1);
        assert_eq!(base, s.checkpoint_digest(&[a, b]));
        s.zone_mut(1).next_slice_s = 9;
        let one = s.checkpoint_digest(&[a, b]);
        assert_ne!(base, one);
        let mut other = ExecState::default();
        other.zone_mut(0).next_slice_s = 9;
        assert_ne!(one, other.checkpoint_digest(&[a, b]), "each zone's schedule is its own");
    }

    #[test]
    fn a_version_4_state_and_intent_read_as_without_reports_and_reports_are_attested() {
        #[derive(Serialize)]
        struct ZoneV4 {
            last_signed_s: u64,
            sign_zone_requests: BTreeMap<u16, u64>,
            sign_zone_stamps: BTreeMap<u16, u64>,
            next_slice_s: u64,
            signing: Option<SigningRun>,
            sign_finish_votes: std::collections::BTreeSet<u16>,
        }
        #[derive(Serialize)]
        struct V4 {
            executed: u64,
            outcomes: [u8; 32],
            recent_writes: BTreeMap<[u8; 32], RecentWrite>,
            zones: BTreeMap<u16, ZoneV4>,
        }
        let zone = |n: u64| ZoneV4 {
            last_signed_s: n,
            sign_zone_requests: [(1, n)].into(),
            sign_zone_stamps: [(2, n + 1)].into(),
            next_slice_s: n + 2,
            signing: Some(SigningRun { seq: n, time_s: n + 3 }),
            sign_finish_votes: [3].into(),
        };
        let old = V4 { executed: 13, outcomes: [7; 32], recent_writes: BTreeMap::new(), zones: [(0, zone(10)), (2, zone(20))].into() };
        let s = ExecState::decode(&codec::encode(4, &old)).unwrap();
        assert_eq!((s.executed, s.outcomes, s.zones.len()), (13, [7; 32], 2));
        let z = s.zone(2);
        assert_eq!((z.last_signed_s, z.next_slice_s, z.signing, z.rollover_finished_s), (20, 22, Some(SigningRun { seq: 20, time_s: 23 }), 0));
        assert!(z.rollover_reports.is_empty() && z.sign_finish_votes.contains(&3));
        // A report or a finish is attested (a zone without either hashes as version 4 did:
        // the version 3 digest test above still holds).
        let mut reported = s.clone();
        reported.zone_mut(2).rollover_reports.insert(1);
        assert_ne!(s.checkpoint_digest(&[[1; 32], [2; 32], [3; 32]]), reported.checkpoint_digest(&[[1; 32], [2; 32], [3; 32]]));
        let mut finished = s.clone();
        finished.zone_mut(0).rollover_finished_s = 99;
        assert_ne!(s.checkpoint_digest(&[[1; 32]]), finished.checkpoint_digest(&[[1; 32]]));
        assert_eq!(ExecState::decode(&reported.encode()).unwrap(), reported);

        #[derive(Serialize)]
        struct IntentV2Out {
            seq: u64,
            index: u32,
            zone: u16,
            serial: u32,
            state: V4,
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exec.intent");
        std::fs::write(&path, codec::encode(2, &IntentV2Out { seq: 14, index: 1, zone: 2, serial: 9, state: old })).unwrap();
        let intent = WriteIntent::load(&path).unwrap().unwrap();
        assert_eq!((intent.seq, intent.index, intent.zone, intent.serial), (14, 1, 2, 9));
        assert_eq!(intent.state, s);
    }

    #[test]
    fn store_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exec.state");
        assert_eq!(ExecState::load(&path).unwrap(), ExecState::default());
        let mut s = ExecState { executed: 3, ..Default::default() };
        s.record(3, 1, 2);
        s.store(&path).unwrap();
        assert_eq!(ExecState::load(&path).unwrap(), s);
        std::fs::write(&path, b"\x03garbage").unwrap();
        assert!(matches!(ExecState::load(&path), Err(StateError::Decode { .. })));
    }
}
