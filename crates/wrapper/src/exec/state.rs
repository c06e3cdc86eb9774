//! The execution state every honest replica holds identically after the same prefix
//! of the log: where execution stands, the outcome of every ordered write, and what
//! whole-zone operations were asked for and done. Persisted after every batch that changed
//! more than the executed position, and at every checkpoint batch;
//! checkpoints attest to it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::codec::{self, CodecError};

/// 2 added `next_slice_s` and the sign-zone stamps; 3 the background whole-zone signing
/// (`signing`, `sign_finish_votes`). Older states are read and converted.
const VERSION: u8 = 3;
const MAX_STATE_BYTES: usize = 256 * 1024;
/// Recent TSIG-signed writes remembered for deduplication; beyond, the one whose window
/// closes first is forgotten.
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
}

/// A whole-zone signing running in the background: it signs the zone as it was at
/// batch `seq`, with signature times from that batch's agreed time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigningRun {
    pub seq: u64,
    pub time_s: u64,
}

/// A TSIG-signed write executed recently: a byte-identical copy ordered before its
/// window closes is not executed again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecentWrite {
    /// The TSIG's time signed plus its fudge (s).
    pub expires_s: u64,
    /// The first execution's outcome code.
    pub outcome: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecState {
    /// The last batch executed in full (0: none).
    pub executed: u64,
    /// Agreed time (s) of the last successful whole-zone signing (0: never).
    pub last_signed_s: u64,
    /// Replicas whose sign-zone request was ordered and not yet acted on, with the
    /// agreed time (s) of that request.
    pub sign_zone_requests: BTreeMap<u16, u64>,
    /// Per replica, the stamp of its last signed sign-zone request that was counted:
    /// only a newer one counts, so no signed request counts twice.
    pub sign_zone_stamps: BTreeMap<u16, u64>,
    /// Hash chain over (seq, request index, outcome code) of every ordered write and
    /// whole-zone signing: a replica whose named answered differently differs here.
    pub outcomes: [u8; 32],
    /// SHA-256 of the bytes of recent TSIG-signed writes, with their window and outcome.
    pub recent_writes: BTreeMap<[u8; 32], RecentWrite>,
    /// Agreed time (s) from which the next incremental re-signing slice may run.
    pub next_slice_s: u64,
    /// The whole-zone signing running in the background, if any.
    pub signing: Option<SigningRun>,
    /// Replicas whose request to finish the running signing (their own part of it is
    /// done) was ordered; t+1 finish it.
    pub sign_finish_votes: std::collections::BTreeSet<u16>,
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

    /// What a checkpoint attests: the zone's content and this state (less the
    /// executed position, which the checkpoint's sequence number already names).
    pub fn checkpoint_digest(&self, zone: &[u8; 32]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"sdns checkpoint v1");
        h.update(zone);
        h.update(self.outcomes);
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
        h.update((self.recent_writes.len() as u64).to_be_bytes());
        for (digest, w) in &self.recent_writes {
            h.update(digest);
            h.update(w.expires_s.to_be_bytes());
            h.update(w.outcome.to_be_bytes());
        }
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
        h.finalize().into()
    }

    pub fn encode(&self) -> Vec<u8> {
        codec::encode(VERSION, self)
    }

    pub fn decode(bytes: &[u8]) -> Result<ExecState, CodecError> {
        match codec::decode("execution state", VERSION, MAX_STATE_BYTES, bytes) {
            Err(CodecError::Version { got: 1, .. }) => {
                let v1: StateV1 = codec::decode("execution state", 1, MAX_STATE_BYTES, bytes)?;
                // Requests counted under v1 were not proven by their replicas: dropped.
                Ok(ExecState {
                    executed: v1.executed,
                    last_signed_s: v1.last_signed_s,
                    outcomes: v1.outcomes,
                    recent_writes: v1.recent_writes,
                    ..Default::default()
                })
            }
            Err(CodecError::Version { got: 2, .. }) => {
                let v2: StateV2 = codec::decode("execution state", 2, MAX_STATE_BYTES, bytes)?;
                Ok(ExecState {
                    executed: v2.executed,
                    last_signed_s: v2.last_signed_s,
                    sign_zone_requests: v2.sign_zone_requests,
                    sign_zone_stamps: v2.sign_zone_stamps,
                    outcomes: v2.outcomes,
                    recent_writes: v2.recent_writes,
                    next_slice_s: v2.next_slice_s,
                    ..Default::default()
                })
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

const INTENT_VERSION: u8 = 1;

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
    pub serial: u32,
    pub state: ExecState,
}

impl WriteIntent {
    /// The intent kept next to the execution state `state_file`.
    pub fn path_for(state_file: &Path) -> std::path::PathBuf {
        state_file.with_file_name("exec.intent")
    }

    pub fn load(path: &Path) -> Result<Option<WriteIntent>, StateError> {
        match std::fs::read(path) {
            Ok(bytes) => codec::decode("write intent", INTENT_VERSION, MAX_STATE_BYTES + 64, &bytes)
                .map(Some)
                .map_err(|source| StateError::Decode { path: path.to_owned(), source }),
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
        let mut a = ExecState { executed: 9, last_signed_s: 100, ..Default::default() };
        a.sign_zone_requests.insert(2, 50);
        a.record(1, 0, 0);
        a.record(2, 0, 5);
        assert_eq!(ExecState::decode(&a.encode()).unwrap(), a);
        let mut b = ExecState { executed: 9, last_signed_s: 100, ..Default::default() };
        b.sign_zone_requests.insert(2, 50);
        b.record(2, 0, 5);
        b.record(1, 0, 0);
        assert_ne!(a.outcomes, b.outcomes);
        let zone = [7; 32];
        assert_ne!(a.checkpoint_digest(&zone), b.checkpoint_digest(&zone));
        assert_ne!(a.checkpoint_digest(&zone), a.checkpoint_digest(&[8; 32]));
    }

    #[test]
    fn stamps_are_attested_and_v1_states_convert() {
        let mut a = ExecState::default();
        a.sign_zone_stamps.insert(1, 10);
        let mut b = a.clone();
        b.sign_zone_stamps.insert(1, 11);
        assert_ne!(a.checkpoint_digest(&[0; 32]), b.checkpoint_digest(&[0; 32]));
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
        assert_eq!((s.executed, s.last_signed_s, s.outcomes), (5, 6, [9; 32]));
        assert!(s.sign_zone_requests.is_empty() && s.sign_zone_stamps.is_empty());
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
        assert_eq!((s.executed, s.last_signed_s, s.outcomes, s.next_slice_s), (7, 99, [4; 32], 0));
        let mut later = s.clone();
        later.next_slice_s = 5;
        assert_ne!(s.checkpoint_digest(&[0; 32]), later.checkpoint_digest(&[0; 32]));
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
        assert_eq!((s.executed, s.last_signed_s, s.next_slice_s, s.signing), (8, 90, 12, None));
        assert_eq!(s.sign_zone_stamps.get(&1), Some(&4));
        let mut running = s.clone();
        running.signing = Some(SigningRun { seq: 9, time_s: 100 });
        assert_ne!(s.checkpoint_digest(&[0; 32]), running.checkpoint_digest(&[0; 32]));
        let mut voted = running.clone();
        voted.sign_finish_votes.insert(2);
        assert_ne!(running.checkpoint_digest(&[0; 32]), voted.checkpoint_digest(&[0; 32]));
        assert_eq!(ExecState::decode(&voted.encode()).unwrap(), voted);
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
