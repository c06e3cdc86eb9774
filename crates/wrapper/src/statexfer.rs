//! State transfer (PBFT's, for a replica that fell behind the log its peers retain).
//!
//! At every checkpoint the executor keeps the snapshot it digested: the zone's records in
//! canonical form as read from named at that log position, the execution state, and the
//! ordering's delivery base there (its request deduplication table, which the certified
//! state digest covers too, see [`bft::checkpoint_state_digest`]). A
//! replica the ordering core sends to state transfer asks its peers for the snapshot of the
//! stable checkpoint over mesh channel [`CHANNEL_STATE`], one chunk per request, checks it
//! against the state digest 2t+1 replicas certified, and has the executor install it.
//!
//! What a peer sends cannot make this replica install wrong state (the digest is checked
//! before anything is written) nor hold unbounded memory (`max_snapshot_bytes`, one chunk per
//! request, a deadline per chunk); a peer that lies, stalls or lacks the snapshot is left
//! for the next one.

use named_glue::tools::BindTools;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bft::CheckpointClaim;
use bytes::Bytes;
use exec::codec::{self, CodecError};
use exec::zone_plan::zone_digest_of;
use exec::ExecState;
use mesh::{MeshSender, CHANNEL_STATE};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

/// 2: with the ordering's delivery base; 3: every zone's records, with its name (version 2
/// snapshots, one zone's, are read too: kept ones stay servable after an upgrade); 4: the
/// execution state's version 5 (rollover reports); 5: its version 6 (the zone set changed at
/// run time); versions 3 and 4 are read too.
const SNAPSHOT_VERSION: u8 = 5;
const MESSAGE_VERSION: u8 = 1;
/// Snapshots kept on disk: the stable checkpoint and the ones after it that may become stable
/// while a peer fetches.
pub const SNAPSHOTS_KEPT: usize = 3;
/// Bytes of snapshot per answer (well under the mesh's 4 MiB frame).
pub const CHUNK_BYTES: usize = 1024 * 1024;
/// How long a peer may take to answer one chunk request.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before trying the peers again when none had the snapshot.
const ROUND_PAUSE: Duration = Duration::from_secs(1);
/// A fetch must go at least this fast once the peer said how large the snapshot is (one chunk
/// per second): a peer that answers every chunk just before [`CHUNK_TIMEOUT`] is left for
/// another instead of holding the fetch for hours.
const SLOWEST_CHUNK: Duration = Duration::from_secs(1);
/// The fetcher asks one peer for at most this many chunks a second (one outstanding at a time,
/// so fewer on a slow path), half of what a peer serves it ([`SERVE_RATE`]): an honest fetch
/// is never over the limit, and a 256 MiB snapshot still comes in 8 s.
const FETCH_RATE: u32 = 32;
/// Chunk requests served per peer: this many a second on average, bursts of [`SERVE_BURST`].
/// Each answer is up to [`CHUNK_BYTES`] for a request of some 50 bytes; beyond the rate a
/// request is dropped and counted against the peer (`state_transfer_requests_over_rate`).
pub const SERVE_RATE: f64 = 64.0;
pub const SERVE_BURST: f64 = 64.0;
/// Chunk requests being answered at once (on the blocking pool: reading and decoding a
/// snapshot file is slow); more are dropped, and their fetcher asks again after its timeout.
const SERVING_AT_ONCE: usize = 2;
/// Encoded snapshots kept in memory for serving, newest checkpoints first: every kept one, so
/// that requests going round them do not read a file each; together at most the larger of
/// `max_snapshot_bytes` and one snapshot.
const SERVED_CACHED: usize = SNAPSHOTS_KEPT;
/// Bytes of encoded delivery base a snapshot may carry: the ordering's `max_clients` (a
/// million by default) entries of at most 49 bytes each fit.
pub const MAX_BASE_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    #[error("snapshot: {0}")]
    Codec(#[from] CodecError),
    #[error("snapshot is for batch {got}, wanted {want}")]
    WrongSeq { got: u64, want: u64 },
    #[error("snapshot's execution state is at batch {executed}, not at its checkpoint {seq}")]
    WrongPosition { executed: u64, seq: u64 },
    #[error("snapshot of checkpoint {seq} does not match the certified state digest")]
    DigestMismatch { seq: u64 },
    #[error("snapshot's delivery base: {0}")]
    BadBase(String),
    #[error("snapshot record {index} of zone {zone} is malformed")]
    BadRecord { zone: usize, index: usize },
    #[error("the snapshot holds zones [{theirs}], its state or this replica's configuration names [{ours}]: refused (replicas dealt different zone sets, or a forged snapshot)")]
    ZoneSet { theirs: String, ours: String },
    #[error("io on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The state a checkpoint attests: enough to rebuild the replica at that log position.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub seq: u64,
    /// This replica's checkpoint digest for `seq` (what it voted for).
    pub digest: [u8; 32],
    /// The execution state after batch `seq` (`executed == seq`).
    pub state: ExecState,
    /// Every zone, in zone index order.
    pub zones: Vec<SnapshotZone>,
    /// The ordering's delivery base after batch `seq` ([`bft::DeliveryBase::encode`]), at
    /// most [`MAX_BASE_BYTES`].
    pub base: Vec<u8>,
}

/// One zone of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotZone {
    /// The zone's name, lower-case with the final dot; empty in a snapshot of version 2,
    /// which held the one zone of its replica.
    pub name: String,
    /// The zone's records in canonical wire form, sorted, without duplicates.
    pub records: Vec<Vec<u8>>,
}

/// A snapshot as version 2 stored it (one zone).
#[derive(Deserialize)]
struct SnapshotV2 {
    seq: u64,
    digest: [u8; 32],
    state: exec::state::StateV3,
    records: Vec<Vec<u8>>,
    base: Vec<u8>,
}

/// A snapshot as version 3 stored it (a version 4 execution state).
#[derive(Deserialize)]
struct SnapshotV3 {
    seq: u64,
    digest: [u8; 32],
    state: exec::state::StateV4,
    zones: Vec<SnapshotZone>,
    base: Vec<u8>,
}

/// A snapshot as version 4 stored it (a version 5 execution state).
#[derive(Deserialize)]
struct SnapshotV4 {
    seq: u64,
    digest: [u8; 32],
    state: exec::state::StateV5,
    zones: Vec<SnapshotZone>,
    base: Vec<u8>,
}

/// A zone name as snapshots and their checks compare it.
pub fn canonical_zone_name(name: &str) -> String {
    let name = name.to_ascii_lowercase();
    if name.ends_with('.') {
        name
    } else {
        name + "."
    }
}

impl Snapshot {
    pub fn encode(&self) -> Vec<u8> {
        codec::encode(SNAPSHOT_VERSION, self)
    }

    pub fn decode(bytes: &[u8], max: usize) -> Result<Snapshot, SnapshotError> {
        match codec::decode("snapshot", SNAPSHOT_VERSION, max, bytes) {
            Err(CodecError::Version { got: 2, .. }) => {
                let v2: SnapshotV2 = codec::decode("snapshot", 2, max, bytes)?;
                let zones = vec![SnapshotZone { name: String::new(), records: v2.records }];
                Ok(Snapshot { seq: v2.seq, digest: v2.digest, state: v2.state.into(), zones, base: v2.base })
            }
            Err(CodecError::Version { got: 3, .. }) => {
                let v3: SnapshotV3 = codec::decode("snapshot", 3, max, bytes)?;
                Ok(Snapshot { seq: v3.seq, digest: v3.digest, state: v3.state.into(), zones: v3.zones, base: v3.base })
            }
            Err(CodecError::Version { got: 4, .. }) => {
                let v4: SnapshotV4 = codec::decode("snapshot", 4, max, bytes)?;
                Ok(Snapshot { seq: v4.seq, digest: v4.digest, state: v4.state.into(), zones: v4.zones, base: v4.base })
            }
            other => Ok(other?),
        }
    }

    /// Records over all zones.
    pub fn record_count(&self) -> usize {
        self.zones.iter().map(|z| z.records.len()).sum()
    }

    /// Refuses a snapshot whose zones are not those its state names. Once the zone set
    /// changed at run time (the state holds it), the snapshot's zones are its state's, by
    /// index, and the receiver follows them (it serves the snapshot's set once installed,
    /// from the files dealt for each zone). Before, they must be `ours` (this replica's
    /// configured zones, in index order): replicas dealt different zone sets cannot share
    /// state. A version 2 snapshot's one unnamed zone stands for the receiver's zone when it
    /// serves one.
    pub fn check_zones(&self, ours: &[String]) -> Result<(), SnapshotError> {
        let ours: Vec<String> = ours.iter().map(|n| canonical_zone_name(n)).collect();
        let matches = if self.state.zone_set.is_empty() {
            match self.zones.as_slice() {
                [only] if only.name.is_empty() => ours.len() == 1,
                zones => zones.len() == ours.len() && zones.iter().zip(&ours).all(|(z, o)| z.name == *o),
            }
        } else {
            let own = self.state.zone_set.values().map(|e| e.name.as_str());
            self.zones.len() == self.state.zone_set.len() && self.zones.iter().map(|z| z.name.as_str()).eq(own)
        };
        if matches {
            return Ok(());
        }
        let theirs: Vec<&str> = self.zones.iter().map(|z| if z.name.is_empty() { "(one unnamed zone)" } else { z.name.as_str() }).collect();
        Err(SnapshotError::ZoneSet { theirs: theirs.join(", "), ours: ours.join(", ") })
    }

    /// Checks this snapshot against a certified checkpoint: same position, and the
    /// checkpoint digest recomputed from its own records, state and delivery base equals the
    /// certified one. Returns what the ordering installs with it.
    pub fn verify(&self, claim: &CheckpointClaim) -> Result<bft::Transferred, SnapshotError> {
        if self.seq != claim.seq {
            return Err(SnapshotError::WrongSeq { got: self.seq, want: claim.seq });
        }
        if self.state.executed != self.seq {
            return Err(SnapshotError::WrongPosition { executed: self.state.executed, seq: self.seq });
        }
        for (zone, z) in self.zones.iter().enumerate() {
            for (index, record) in z.records.iter().enumerate() {
                if split_record(record).is_none() {
                    return Err(SnapshotError::BadRecord { zone, index });
                }
            }
        }
        if self.base.len() > MAX_BASE_BYTES {
            return Err(SnapshotError::BadBase(format!("{} bytes, over {MAX_BASE_BYTES}", self.base.len())));
        }
        let base = bft::DeliveryBase::decode(&self.base).map_err(|e| SnapshotError::BadBase(e.to_string()))?;
        let digests: Vec<[u8; 32]> = self.zones.iter().map(|z| zone_digest_of(&mut z.records.clone())).collect();
        let transferred = bft::Transferred { claim: *claim, application_digest: self.state.checkpoint_digest(&digests), base };
        match transferred.check() {
            Ok(()) => Ok(transferred),
            Err(bft::TransferMismatch::StateDigest) => Err(SnapshotError::DigestMismatch { seq: self.seq }),
            Err(bft::TransferMismatch::Position) => Err(SnapshotError::BadBase("not the checkpoint's position, time or log digest".into())),
        }
    }
}

/// The parts of a canonical record: (owner in wire form, type, class, ttl, rdata); an owner
/// longer than a name may be (255 bytes, RFC 1035) is refused too.
fn split_record(record: &[u8]) -> Option<dnswire::rrwire::SplitRecord<'_>> {
    dnswire::rrwire::split_record(record).filter(|parts| parts.0.len() <= 255)
}

/// A wire-form name as master-file text, every byte outside letters, digits, '-' and '_'
/// escaped, so any label survives.
fn name_text(wire: &[u8]) -> String {
    let mut out = String::new();
    let mut pos = 0usize;
    while let Some(&len) = wire.get(pos) {
        if len == 0 {
            break;
        }
        let label = wire.get(pos + 1..pos + 1 + usize::from(len)).unwrap_or(&[]);
        for &b in label {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("\\{b:03}"));
            }
        }
        out.push('.');
        pos += 1 + usize::from(len);
    }
    if out.is_empty() {
        out.push('.');
    }
    out
}

/// The records as a master file named loads, each in RFC 3597 generic form
/// (`TYPEn \# len hex`), so the loaded zone has exactly these records whatever their type.
/// The SOA goes first. Records must have passed [`Snapshot::verify`] (malformed ones are
/// skipped).
pub fn render_zone(records: &[Vec<u8>]) -> String {
    const TYPE_SOA: u16 = 6;
    let mut parts: Vec<_> = records.iter().filter_map(|r| split_record(r)).collect();
    parts.sort_by_key(|(_, rtype, ..)| *rtype != TYPE_SOA);
    let mut out = String::with_capacity(records.iter().map(|r| r.len() * 2 + 40).sum());
    for (owner, rtype, class, ttl, rdata) in parts {
        let class = if class == 1 { "IN".to_string() } else { format!("CLASS{class}") };
        out.push_str(&format!("{} {ttl} {class} TYPE{rtype} \\# {}", name_text(owner), rdata.len()));
        if !rdata.is_empty() {
            out.push(' ');
            for b in rdata {
                out.push_str(&format!("{b:02x}"));
            }
        }
        out.push('\n');
    }
    out
}

/// Snapshots read for peers, by checkpoint: (state digest, encoded snapshot). A fetch in
/// chunks reads and checks the file once, not once per chunk.
#[derive(Default)]
struct ServedCache {
    entries: BTreeMap<u64, ([u8; 32], Arc<Vec<u8>>)>,
}

impl ServedCache {
    /// `Some(None)`: the checkpoint is cached with another digest, so this replica has no
    /// snapshot with `digest` (one checkpoint has one state), and no file need be read.
    fn get(&self, seq: u64, digest: &[u8; 32]) -> Option<Option<Arc<Vec<u8>>>> {
        self.entries.get(&seq).map(|(d, bytes)| (d == digest).then(|| bytes.clone()))
    }

    /// Keeps `bytes` for `seq`, then forgets the oldest checkpoints beyond [`SERVED_CACHED`]
    /// entries or `max_bytes` together (the newest stays, whatever its size).
    fn put(&mut self, seq: u64, digest: [u8; 32], bytes: Arc<Vec<u8>>, max_bytes: usize) {
        self.entries.insert(seq, (digest, bytes));
        while self.entries.len() > 1 && (self.entries.len() > SERVED_CACHED || self.entries.values().map(|(_, b)| b.len()).sum::<usize>() > max_bytes) {
            self.entries.pop_first();
        }
    }
}

/// The snapshots this replica kept, in `dir` (one file per checkpoint).
#[derive(Clone)]
pub struct SnapshotStore {
    dir: PathBuf,
    served: Arc<Mutex<ServedCache>>,
    /// Files read for peers (cache misses), for tests of the cache.
    reads: Arc<std::sync::atomic::AtomicU64>,
}

impl SnapshotStore {
    pub fn new(dir: PathBuf) -> Result<SnapshotStore, SnapshotError> {
        std::fs::create_dir_all(&dir).map_err(|source| SnapshotError::Io { path: dir.clone(), source })?;
        Ok(SnapshotStore { dir, served: Default::default(), reads: Default::default() })
    }

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.snap"))
    }

    /// Writes a snapshot (temporary file, then rename) and forgets all but the newest
    /// [`SNAPSHOTS_KEPT`]; the encoded size in bytes.
    pub fn save(&self, snapshot: &Snapshot) -> Result<u64, SnapshotError> {
        let path = self.path(snapshot.seq);
        let tmp = path.with_extension("tmp");
        let encoded = snapshot.encode();
        let bytes = u64::try_from(encoded.len()).unwrap_or(u64::MAX);
        std::fs::write(&tmp, encoded).and_then(|_| std::fs::rename(&tmp, &path)).map_err(|source| SnapshotError::Io { path: path.clone(), source })?;
        // A checkpoint written again (a repaired replica's) is served from the new file.
        if let Ok(mut served) = self.served.lock() {
            served.entries.remove(&snapshot.seq);
        }
        let mut seqs = self.seqs();
        seqs.sort_unstable();
        let excess = seqs.len().saturating_sub(SNAPSHOTS_KEPT);
        for seq in &seqs[..excess] {
            let _ = std::fs::remove_file(self.path(*seq));
        }
        Ok(bytes)
    }

    /// Checkpoints with a kept snapshot.
    pub fn seqs(&self) -> Vec<u64> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        entries.filter_map(|e| e.ok()).filter_map(|e| e.file_name().to_str()?.strip_suffix(".snap")?.parse::<u64>().ok()).collect()
    }

    /// The encoded snapshot of checkpoint `seq` if this replica kept one with `digest`. Blocks
    /// (reads and decodes the file unless it is cached): call it on the blocking pool.
    pub fn encoded(&self, seq: u64, digest: &[u8; 32], max: usize) -> Option<Arc<Vec<u8>>> {
        // Not held while reading: the executor saving a snapshot must not wait for a peer's
        // read. Two requests missing at once read twice, at most `SERVING_AT_ONCE` reads.
        if let Some(cached) = self.served.lock().ok().and_then(|served| served.get(seq, digest)) {
            return cached;
        }
        let bytes = std::fs::read(self.path(seq)).ok()?;
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let snapshot = Snapshot::decode(&bytes, max).ok()?;
        if snapshot.seq != seq || &snapshot.digest != digest {
            return None;
        }
        let bytes = Arc::new(bytes);
        if let Ok(mut served) = self.served.lock() {
            served.put(seq, *digest, bytes.clone(), max);
        }
        Some(bytes)
    }

    /// Snapshot files read for peers so far.
    pub fn files_read(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A token bucket per peer: `rate` requests a second on average, bursts of `burst`. Pure:
/// the caller gives the time.
#[derive(Debug)]
pub struct PeerRate {
    rate: f64,
    burst: f64,
    buckets: BTreeMap<u16, (f64, std::time::Instant)>,
}

impl PeerRate {
    pub fn new(rate: f64, burst: f64) -> PeerRate {
        PeerRate { rate, burst, buckets: BTreeMap::new() }
    }

    /// Whether a request of `peer` at `now` is within its rate (it then spends a token).
    pub fn allow(&mut self, peer: u16, now: std::time::Instant) -> bool {
        let (tokens, last) = self.buckets.entry(peer).or_insert((self.burst, now));
        *tokens = (*tokens + now.saturating_duration_since(*last).as_secs_f64() * self.rate).min(self.burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What replicas send each other on [`CHANNEL_STATE`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateMessage {
    /// Send the part of the snapshot of (seq, digest) that starts at `offset`.
    Request { seq: u64, digest: [u8; 32], offset: u64 },
    /// Part of an encoded snapshot of `total` bytes.
    Chunk { seq: u64, digest: [u8; 32], total: u64, offset: u64, data: Vec<u8> },
    /// The sender has no snapshot of (seq, digest).
    Unavailable { seq: u64, digest: [u8; 32] },
}

impl StateMessage {
    pub fn encode(&self) -> Vec<u8> {
        codec::encode(MESSAGE_VERSION, self)
    }

    pub fn decode(bytes: &[u8]) -> Result<StateMessage, CodecError> {
        codec::decode("state-transfer message", MESSAGE_VERSION, CHUNK_BYTES + 1024, bytes)
    }
}

/// A snapshot to install, and where to report the outcome.
pub type Install = (Snapshot, oneshot::Sender<Result<(), String>>);

/// Where state-transfer messages go (the mesh; an in-memory network in tests).
pub trait StateOutbound: Send + Sync + 'static {
    fn send(&self, to: u16, bytes: Bytes);
}

impl StateOutbound for MeshSender {
    fn send(&self, to: u16, bytes: Bytes) {
        if let Err(e) = MeshSender::send(self, to, CHANNEL_STATE, bytes) {
            debug!(to, error = %e, "state-transfer message not sent");
        }
    }
}

/// Counters of the transfers this replica made.
#[derive(Debug, Default, Clone)]
pub struct TransferStats {
    pub installed: u64,
    pub last_installed: Option<u64>,
    pub rejected_snapshots: u64,
    /// The checkpoint being fetched or installed now.
    pub fetching: Option<u64>,
    /// Chunk requests dropped per peer for going over [`SERVE_RATE`] (attribution).
    pub over_rate: BTreeMap<u16, u64>,
}

/// Whether this replica's own digest for the certified (stable) checkpoint differs from the
/// one 2t+1 replicas certified: its zone or its execution state (a write its named refused or
/// answered otherwise shows in the outcome chain) is not theirs.
pub fn diverged(stable: &CheckpointClaim, own_digests: &BTreeMap<u64, [u8; 32]>) -> bool {
    stable.seq > 0 && own_digests.get(&stable.seq).is_some_and(|own| *own != stable.state_digest)
}

/// Runs state transfer for one replica: serves its kept snapshots to peers, and, whenever
/// the ordering asks (`needed`), fetches the snapshot of that checkpoint, has it installed
/// (`installs`, the executor) and reports the claim as installed (`installed`, the ordering).
pub struct StateTransfer<O: StateOutbound> {
    pub id: u16,
    pub peers: Vec<u16>,
    pub store: SnapshotStore,
    pub outbound: Arc<O>,
    /// Bounds a snapshot's encoded size, all zones together.
    pub max_snapshot_bytes: usize,
    pub stats: Arc<Mutex<TransferStats>>,
    /// This replica's zones in index order: a snapshot with other zones is refused.
    pub zones: Vec<String>,
}

impl<O: StateOutbound> StateTransfer<O> {
    pub async fn run(
        self,
        mut incoming: mpsc::Receiver<(u16, Bytes)>,
        needed: watch::Receiver<Option<CheckpointClaim>>,
        installs: mpsc::Sender<Install>,
        installed: mpsc::Sender<bft::Transferred>,
    ) {
        let this = Arc::new(self);
        // Answers for the fetcher; bounded, and a full queue drops (the fetch times out).
        let (answers_tx, answers_rx) = mpsc::channel::<(u16, StateMessage)>(16);
        tokio::spawn(this.clone().fetch_loop(answers_rx, needed, installs, installed));
        let mut rate = PeerRate::new(SERVE_RATE, SERVE_BURST);
        let serving = Arc::new(tokio::sync::Semaphore::new(SERVING_AT_ONCE));
        while let Some((from, bytes)) = incoming.recv().await {
            match StateMessage::decode(&bytes) {
                Ok(StateMessage::Request { seq, digest, offset }) => {
                    if !rate.allow(from, std::time::Instant::now()) {
                        if let Ok(mut stats) = this.stats.lock() {
                            *stats.over_rate.entry(from).or_default() += 1;
                        }
                        continue;
                    }
                    let Ok(permit) = serving.clone().try_acquire_owned() else {
                        debug!(from, seq, "state-transfer request dropped: already serving {SERVING_AT_ONCE}");
                        continue;
                    };
                    let this = this.clone();
                    tokio::task::spawn_blocking(move || {
                        this.serve(from, seq, digest, offset);
                        drop(permit);
                    });
                }
                Ok(answer) => {
                    let _ = answers_tx.try_send((from, answer));
                }
                Err(e) => debug!(from, error = %e, "undecodable state-transfer message"),
            }
        }
    }

    /// Answers one chunk request (blocks: on the blocking pool).
    fn serve(&self, to: u16, seq: u64, digest: [u8; 32], offset: u64) {
        let message = match self.store.encoded(seq, &digest, self.max_snapshot_bytes) {
            Some(bytes) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
                let end = start.saturating_add(CHUNK_BYTES).min(bytes.len());
                StateMessage::Chunk { seq, digest, total: bytes.len() as u64, offset: start as u64, data: bytes[start..end].to_vec() }
            }
            None => StateMessage::Unavailable { seq, digest },
        };
        self.outbound.send(to, Bytes::from(message.encode()));
    }

    async fn fetch_loop(
        self: Arc<Self>,
        mut answers: mpsc::Receiver<(u16, StateMessage)>,
        mut needed: watch::Receiver<Option<CheckpointClaim>>,
        installs: mpsc::Sender<Install>,
        installed: mpsc::Sender<bft::Transferred>,
    ) {
        let mut done: u64 = 0;
        let mut next_peer = 0usize;
        loop {
            let current = *needed.borrow_and_update();
            let claim = match current {
                Some(claim) if claim.seq > done => claim,
                _ => {
                    if needed.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            info!(replica = self.id, seq = claim.seq, "fetching the state of the stable checkpoint from peers");
            let started = tokio::time::Instant::now();
            if let Ok(mut stats) = self.stats.lock() {
                stats.fetching = Some(claim.seq);
            }
            let mut fetched = None;
            for _ in 0..self.peers.len() {
                let peer = self.peers[next_peer % self.peers.len()];
                next_peer += 1;
                match self.fetch_from(peer, &claim, &mut answers).await {
                    Ok(verified) => {
                        fetched = Some(verified);
                        break;
                    }
                    Err(e) => {
                        warn!(replica = self.id, peer, seq = claim.seq, error = %e, "state transfer from this peer failed; trying another");
                        if let Ok(mut stats) = self.stats.lock() {
                            if matches!(e, FetchError::Snapshot(_)) {
                                stats.rejected_snapshots += 1;
                            }
                        }
                    }
                }
            }
            let Some((snapshot, transferred)) = fetched else {
                // No peer had it (the stable checkpoint may have moved on): ask again, for the
                // latest checkpoint the ordering wants.
                tokio::time::sleep(ROUND_PAUSE).await;
                continue;
            };
            let fetch_ms = started.elapsed().as_millis() as u64;
            let records = snapshot.record_count();
            info!(
                replica = self.id,
                seq = claim.seq,
                records,
                fetch_ms,
                "state fetched and verified; the executor installs it after the batch it is executing"
            );
            let (ack_tx, ack_rx) = oneshot::channel();
            if installs.send((snapshot, ack_tx)).await.is_err() {
                return;
            }
            match ack_rx.await {
                Ok(Ok(())) => {
                    done = claim.seq;
                    info!(replica = self.id, seq = claim.seq, records, fetch_ms, total_ms = started.elapsed().as_millis() as u64, "state transfer done");
                    if let Ok(mut stats) = self.stats.lock() {
                        stats.installed += 1;
                        stats.last_installed = Some(claim.seq);
                        stats.fetching = None;
                    }
                    if installed.send(transferred).await.is_err() {
                        return;
                    }
                }
                Ok(Err(e)) => {
                    warn!(replica = self.id, seq = claim.seq, error = %e, "installing the transferred state failed; fetching again");
                    tokio::time::sleep(ROUND_PAUSE).await;
                }
                Err(_) => return,
            }
        }
    }

    /// Fetches the snapshot of `claim` from `peer`, chunk by chunk, and verifies it.
    async fn fetch_from(
        &self,
        peer: u16,
        claim: &CheckpointClaim,
        answers: &mut mpsc::Receiver<(u16, StateMessage)>,
    ) -> Result<(Snapshot, bft::Transferred), FetchError> {
        // Answers to an earlier fetch are stale now.
        while answers.try_recv().is_ok() {}
        let (seq, digest) = (claim.seq, claim.state_digest);
        let mut buffer: Vec<u8> = Vec::new();
        let mut total: Option<u64> = None;
        let started = tokio::time::Instant::now();
        let mut pace = tokio::time::interval(Duration::from_secs(1) / FETCH_RATE);
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            pace.tick().await;
            let offset = buffer.len() as u64;
            debug!(replica = self.id, peer, seq, offset, "asking for a snapshot chunk");
            self.outbound.send(peer, Bytes::from(StateMessage::Request { seq, digest, offset }.encode()));
            let mut deadline = tokio::time::Instant::now() + CHUNK_TIMEOUT;
            // Once the size is known, the whole fetch has a deadline too (a peer slow on
            // every chunk is left for another).
            if let Some(total) = total {
                let slow = fetch_deadline(started, total);
                if slow <= tokio::time::Instant::now() {
                    return Err(FetchError::TooSlow);
                }
                deadline = deadline.min(slow);
            }
            let (chunk_total, data) = loop {
                let answer = tokio::time::timeout_at(deadline, answers.recv()).await.map_err(|_| {
                    if total.is_some_and(|t| fetch_deadline(started, t) <= deadline) {
                        FetchError::TooSlow
                    } else {
                        FetchError::Timeout
                    }
                })?;
                let Some((from, message)) = answer else { return Err(FetchError::Closed) };
                debug!(replica = self.id, from, "state-transfer answer");
                if from != peer {
                    continue;
                }
                match message {
                    StateMessage::Chunk { seq: s, digest: d, total, offset: o, data } if s == seq && d == digest && o == offset => break (total, data),
                    StateMessage::Unavailable { seq: s, digest: d } if s == seq && d == digest => return Err(FetchError::Unavailable),
                    _ => continue,
                }
            };
            if chunk_total > self.max_snapshot_bytes as u64 {
                return Err(FetchError::TooLarge(chunk_total));
            }
            if total.is_some_and(|t| t != chunk_total) || (data.is_empty() && offset < chunk_total) {
                return Err(FetchError::Inconsistent);
            }
            total = Some(chunk_total);
            if offset + data.len() as u64 > chunk_total {
                return Err(FetchError::Inconsistent);
            }
            buffer.extend_from_slice(&data);
            if buffer.len() as u64 == chunk_total {
                break;
            }
        }
        let snapshot = Snapshot::decode(&buffer, self.max_snapshot_bytes)?;
        // Before the digest: a zone set that differs is an operator's error to name.
        snapshot.check_zones(&self.zones)?;
        let transferred = snapshot.verify(claim)?;
        Ok((snapshot, transferred))
    }
}

/// Byzantine mode `snapshot-leech` (test clusters only): asks every peer for chunks of the
/// snapshot of `target()` (its stable checkpoint, which honest peers keep) without pause, at
/// changing offsets, and throws the answers away. Honest peers serve each peer at most
/// [`SERVE_RATE`] chunks a second and count the rest against it.
pub async fn leech<O: StateOutbound>(outbound: Arc<O>, peers: Vec<u16>, target: impl Fn() -> (u64, [u8; 32])) {
    // Requests per peer between two yields of a millisecond: some 16,000 a second, 250 times
    // the rate served.
    const BURST: u64 = 16;
    let mut sent = 0u64;
    loop {
        let (seq, digest) = target();
        for &peer in &peers {
            for _ in 0..BURST {
                let offset = (sent % 4) * CHUNK_BYTES as u64;
                outbound.send(peer, Bytes::from(StateMessage::Request { seq, digest, offset }.encode()));
                sent += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// When a fetch of `total` bytes begun at `started` must be done: a chunk's timeout, and then
/// [`SLOWEST_CHUNK`] per chunk.
fn fetch_deadline(started: tokio::time::Instant, total: u64) -> tokio::time::Instant {
    let chunks = u32::try_from(total.div_ceil(CHUNK_BYTES as u64)).unwrap_or(u32::MAX);
    started + CHUNK_TIMEOUT + SLOWEST_CHUNK.saturating_mul(chunks)
}

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("no answer to a chunk request in time")]
    Timeout,
    #[error("the peer's chunks come too slowly (under one a second)")]
    TooSlow,
    #[error("the peer has no snapshot of this checkpoint")]
    Unavailable,
    #[error("the snapshot would be {0} bytes, over the limit")]
    TooLarge(u64),
    #[error("the peer's chunks do not add up")]
    Inconsistent,
    #[error("the mesh is closed")]
    Closed,
    #[error("{0}")]
    Snapshot(#[from] SnapshotError),
}

impl From<CodecError> for FetchError {
    fn from(e: CodecError) -> Self {
        FetchError::Snapshot(SnapshotError::Codec(e))
    }
}

/// Installs a verified snapshot's zone into named's directory (run while named is stopped):
/// the zone file is replaced (in BIND's raw format, which named.conf names) and named's
/// journal removed, so named loads exactly these records.
pub fn write_zone_files(tools: &BindTools, zone: &str, zone_file: &Path, journal: &Path, records: &[Vec<u8>]) -> std::io::Result<()> {
    let tmp = zone_file.with_extension("transfer");
    std::fs::write(&tmp, render_zone(records))?;
    let compiled = tools.compile_raw(zone, &tmp, zone_file);
    let _ = std::fs::remove_file(&tmp);
    compiled.map_err(std::io::Error::other)?;
    match std::fs::remove_file(journal) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Keeps the records a checkpoint digest was computed from, until the checkpoint's state is
/// known (the executor pairs them in [`crate::execution::executor`]).
/// One list of records per zone, in zone index order.
pub type DigestedRecords = Arc<Mutex<BTreeMap<u64, Vec<Vec<Vec<u8>>>>>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// owner | type | class | ttl | rdlength | rdata.
    fn record(owner: &[&str], rtype: u16, ttl: u32, rdata: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for label in owner {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
        out.extend_from_slice(&rtype.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(rdata);
        out
    }

    fn snapshot(seq: u64, names: usize) -> (Snapshot, CheckpointClaim) {
        let mut records = vec![record(&["example", "test"], 6, 300, &[0; 22])];
        for i in 0..names {
            records.push(record(&[&format!("h{i}"), "example", "test"], 1, 300, &[192, 0, 2, (i % 250) as u8]));
        }
        let mut state = ExecState { executed: seq, ..Default::default() };
        state.zone_mut(0).last_signed_s = 77;
        state.record(seq, 0, 0);
        let zone = zone_digest_of(&mut records);
        let clients = vec![bft::ClientEntry { origin: 1, client: 7, high: 3, mask: 0b111, last_seq: seq - 2 }];
        let base = bft::DeliveryBase { seq, time: bft::Time(1), log_digest: [3; 32], clients, budgets: Default::default() };
        let digest = bft::checkpoint_state_digest(&state.checkpoint_digest(&[zone]), &base);
        let claim = CheckpointClaim { seq, time: bft::Time(1), log_digest: [3; 32], state_digest: digest };
        (Snapshot { seq, digest, state, zones: vec![SnapshotZone { name: "example.test.".into(), records }], base: base.encode() }, claim)
    }

    /// The snapshot with its delivery base changed by `change` (re-encoded, well formed).
    fn with_base(snapshot: &Snapshot, change: impl FnOnce(&mut bft::DeliveryBase)) -> Snapshot {
        let mut base = bft::DeliveryBase::decode(&snapshot.base).unwrap();
        change(&mut base);
        Snapshot { base: base.encode(), ..snapshot.clone() }
    }

    #[test]
    fn a_snapshot_verifies_only_against_its_own_checkpoint() {
        let (good, claim) = snapshot(64, 20);
        let decoded = Snapshot::decode(&good.encode(), 1 << 20).unwrap();
        assert_eq!(decoded, good);
        let transferred = decoded.verify(&claim).unwrap();
        assert_eq!((transferred.claim, transferred.base.encode()), (claim, good.base.clone()));

        let mut extra = good.clone();
        extra.zones[0].records.push(record(&["evil", "example", "test"], 1, 300, &[10, 0, 0, 1]));
        assert!(matches!(extra.verify(&claim), Err(SnapshotError::DigestMismatch { .. })));
        let mut changed = good.clone();
        if let Some(last) = changed.zones[0].records[3].last_mut() {
            *last ^= 1;
        }
        assert!(matches!(changed.verify(&claim), Err(SnapshotError::DigestMismatch { .. })));
        let mut state = good.clone();
        state.state.zone_mut(0).last_signed_s += 1;
        assert!(matches!(state.verify(&claim), Err(SnapshotError::DigestMismatch { .. })));
        let mut position = good.clone();
        position.state.executed = 63;
        assert!(matches!(position.verify(&claim), Err(SnapshotError::WrongPosition { .. })));
        let mut malformed = good.clone();
        malformed.zones[0].records.push(vec![0xc0, 0x0c, 0, 1]);
        assert!(matches!(malformed.verify(&claim), Err(SnapshotError::BadRecord { .. })));
        // Well-formed labels, but an owner longer than the 255 bytes a name may have.
        let mut long = good.clone();
        long.zones[0].records.push(record(&["a".repeat(63).as_str(); 4], 1, 300, &[10, 0, 0, 1]));
        assert!(matches!(long.verify(&claim), Err(SnapshotError::BadRecord { .. })));

        // The deduplication table is certified with the rest: a lying peer cannot hand over
        // one that forgets (or invents) delivered requests.
        let forgetful = with_base(&good, |base| base.clients[0].mask = 0b011);
        assert!(matches!(forgetful.verify(&claim), Err(SnapshotError::DigestMismatch { .. })));
        let emptied = with_base(&good, |base| base.clients.clear());
        assert!(matches!(emptied.verify(&claim), Err(SnapshotError::DigestMismatch { .. })));
        let elsewhere = with_base(&good, |base| base.log_digest = [4; 32]);
        assert!(matches!(elsewhere.verify(&claim), Err(SnapshotError::BadBase(_))));
        let garbage = Snapshot { base: vec![0xff; 12], ..good.clone() };
        assert!(matches!(garbage.verify(&claim), Err(SnapshotError::BadBase(_))));
        assert!(matches!(good.verify(&CheckpointClaim { seq: 128, ..claim }), Err(SnapshotError::WrongSeq { .. })));
        assert!(matches!(Snapshot::decode(&good.encode(), 100), Err(SnapshotError::Codec(CodecError::TooLarge { .. }))));
    }

    /// Two zones: each zone's records count under its index, and a snapshot is taken only by
    /// a replica that serves the same zones in the same order.
    #[test]
    fn a_snapshot_of_several_zones_covers_each_and_names_them() {
        let (one, _) = snapshot(64, 3);
        let mut reverse = vec![record(&["2", "0", "192", "in-addr", "arpa"], 6, 300, &[0; 22])];
        reverse.push(record(&["7", "2", "0", "192", "in-addr", "arpa"], 12, 300, b"\x01h\x07example\x04test\x00"));
        let digests = [zone_digest_of(&mut one.zones[0].records.clone()), zone_digest_of(&mut reverse.clone())];
        let base = bft::DeliveryBase::decode(&one.base).unwrap();
        let digest = bft::checkpoint_state_digest(&one.state.checkpoint_digest(&digests), &base);
        let claim = CheckpointClaim { seq: 64, time: bft::Time(1), log_digest: [3; 32], state_digest: digest };
        let mut two = one.clone();
        two.digest = digest;
        two.zones.push(SnapshotZone { name: "2.0.192.in-addr.arpa.".into(), records: reverse });
        assert_eq!(Snapshot::decode(&two.encode(), 1 << 20).unwrap(), two);
        two.verify(&claim).unwrap();
        // The zones swapped: their digests go under other indices.
        let mut swapped = two.clone();
        swapped.zones.swap(0, 1);
        assert!(matches!(swapped.verify(&claim), Err(SnapshotError::DigestMismatch { .. })));
        // One zone left out.
        let mut short = two.clone();
        short.zones.pop();
        assert!(matches!(short.verify(&claim), Err(SnapshotError::DigestMismatch { .. })));

        let ours = ["example.test".to_string(), "2.0.192.IN-ADDR.ARPA.".to_string()];
        two.check_zones(&ours).unwrap();
        let err = two.check_zones(&ours[..1]).unwrap_err();
        assert!(matches!(err, SnapshotError::ZoneSet { .. }));
        assert!(err.to_string().contains("dealt different zone sets"), "{err}");
        assert!(swapped.check_zones(&ours).is_err());
        assert!(one.check_zones(&ours).is_err());
        one.check_zones(&ours[..1]).unwrap();

        // The zone set changed at run time (the state holds it): the snapshot's zones are its
        // state's, whatever this replica's configuration says, and the receiver follows them.
        let mut changed = two.clone();
        changed.state.zone_set.insert(0, exec::ZoneEntry { name: "example.test.".into(), key_digest: [0; 32], added_at: 0 });
        changed.state.zone_set.insert(5, exec::ZoneEntry { name: "added.test.".into(), key_digest: [7; 32], added_at: 40 });
        changed.zones[1].name = "added.test.".into();
        changed.check_zones(&ours).unwrap();
        changed.check_zones(&ours[..1]).unwrap();
        // Zones other than the state names, or in another order: refused.
        let mut other = changed.clone();
        other.zones[1].name = "other.test.".into();
        assert!(matches!(other.check_zones(&ours), Err(SnapshotError::ZoneSet { .. })));
        let mut reordered = changed.clone();
        reordered.zones.swap(0, 1);
        assert!(reordered.check_zones(&ours).is_err());
        let mut short = changed.clone();
        short.zones.pop();
        assert!(short.check_zones(&ours).is_err());
    }

    /// A snapshot kept by the version before several zones (version 2: one zone's records,
    /// a version 3 execution state) is read as that zone's, and still verifies.
    #[test]
    fn a_version_2_snapshot_is_read_as_the_one_zone() {
        #[derive(Serialize)]
        struct V3State {
            executed: u64,
            last_signed_s: u64,
            sign_zone_requests: BTreeMap<u16, u64>,
            sign_zone_stamps: BTreeMap<u16, u64>,
            outcomes: [u8; 32],
            recent_writes: BTreeMap<[u8; 32], exec::state::RecentWrite>,
            next_slice_s: u64,
            signing: Option<exec::SigningRun>,
            sign_finish_votes: std::collections::BTreeSet<u16>,
        }
        #[derive(Serialize)]
        struct V2 {
            seq: u64,
            digest: [u8; 32],
            state: V3State,
            records: Vec<Vec<u8>>,
            base: Vec<u8>,
        }
        let (good, claim) = snapshot(64, 5);
        let st = &good.state;
        let old = V2 {
            seq: good.seq,
            digest: good.digest,
            state: V3State {
                executed: st.executed,
                last_signed_s: 77,
                sign_zone_requests: BTreeMap::new(),
                sign_zone_stamps: BTreeMap::new(),
                outcomes: st.outcomes,
                recent_writes: BTreeMap::new(),
                next_slice_s: 0,
                signing: None,
                sign_finish_votes: Default::default(),
            },
            records: good.zones[0].records.clone(),
            base: good.base.clone(),
        };
        let read = Snapshot::decode(&codec::encode(2, &old), 1 << 20).unwrap();
        assert_eq!(read.zones[0].name, "");
        assert_eq!((read.zones.len(), &read.zones[0].records, &read.state), (1, &good.zones[0].records, &good.state));
        read.verify(&claim).unwrap();
        read.check_zones(&["example.test.".into()]).unwrap();
        assert!(read.check_zones(&["example.test.".into(), "other.test.".into()]).is_err());
    }

    /// A snapshot of version 3 (a version 4 execution state, before the rollover reports) is
    /// read with its zones and state, and still verifies.
    #[test]
    fn a_version_3_snapshot_is_read_and_verifies() {
        #[derive(Serialize)]
        struct ZoneV4 {
            last_signed_s: u64,
            sign_zone_requests: BTreeMap<u16, u64>,
            sign_zone_stamps: BTreeMap<u16, u64>,
            next_slice_s: u64,
            signing: Option<exec::SigningRun>,
            sign_finish_votes: std::collections::BTreeSet<u16>,
        }
        #[derive(Serialize)]
        struct V4State {
            executed: u64,
            outcomes: [u8; 32],
            recent_writes: BTreeMap<[u8; 32], exec::state::RecentWrite>,
            zones: BTreeMap<u16, ZoneV4>,
        }
        #[derive(Serialize)]
        struct V3 {
            seq: u64,
            digest: [u8; 32],
            state: V4State,
            zones: Vec<SnapshotZone>,
            base: Vec<u8>,
        }
        let (good, claim) = snapshot(64, 5);
        let st = &good.state;
        let zones = st
            .zones
            .iter()
            .map(|(i, z)| {
                let z = ZoneV4 {
                    last_signed_s: z.last_signed_s,
                    sign_zone_requests: z.sign_zone_requests.clone(),
                    sign_zone_stamps: z.sign_zone_stamps.clone(),
                    next_slice_s: z.next_slice_s,
                    signing: z.signing,
                    sign_finish_votes: z.sign_finish_votes.clone(),
                };
                (*i, z)
            })
            .collect();
        let old = V3 {
            seq: good.seq,
            digest: good.digest,
            state: V4State { executed: st.executed, outcomes: st.outcomes, recent_writes: st.recent_writes.clone(), zones },
            zones: good.zones.clone(),
            base: good.base.clone(),
        };
        let read = Snapshot::decode(&codec::encode(3, &old), 1 << 20).unwrap();
        assert_eq!(read, good);
        read.verify(&claim).unwrap();
    }

    /// A snapshot of version 4 (a version 5 execution state, before the run-time zone set) is
    /// read with the configured zone set and still verifies; one whose state holds a zone set
    /// must list exactly those zones.
    #[test]
    fn a_version_4_snapshot_is_read_and_a_zone_set_must_match_its_zones() {
        #[derive(Serialize)]
        struct V5State {
            executed: u64,
            outcomes: [u8; 32],
            recent_writes: BTreeMap<[u8; 32], exec::state::RecentWrite>,
            zones: BTreeMap<u16, exec::state::ZoneExec>,
        }
        #[derive(Serialize)]
        struct V4 {
            seq: u64,
            digest: [u8; 32],
            state: V5State,
            zones: Vec<SnapshotZone>,
            base: Vec<u8>,
        }
        let (good, claim) = snapshot(64, 5);
        let st = &good.state;
        let old = V4 {
            seq: good.seq,
            digest: good.digest,
            state: V5State { executed: st.executed, outcomes: st.outcomes, recent_writes: st.recent_writes.clone(), zones: st.zones.clone() },
            zones: good.zones.clone(),
            base: good.base.clone(),
        };
        let read = Snapshot::decode(&codec::encode(4, &old), 1 << 20).unwrap();
        assert_eq!(read, good);
        read.verify(&claim).unwrap();
        assert_eq!(Snapshot::decode(&good.encode(), 1 << 20).unwrap(), good);
        // The state's zone set names another zone than the snapshot's records: refused.
        let mut other = good.clone();
        other.state.seed_zone_set(&["other.test.".into()]);
        assert!(other.check_zones(&["example.test.".into()]).is_err());
        let mut same = good.clone();
        same.state.seed_zone_set(&["example.test.".into()]);
        same.check_zones(&["example.test.".into()]).unwrap();
    }

    #[test]
    fn the_zone_file_has_every_record_in_generic_form_soa_first() {
        let records = vec![
            record(&["a b", "example", "test"], 16, 60, b"\x02hi"),
            record(&["example", "test"], 6, 300, &[1, 2]),
            record(&["e", "example", "test"], 10, 5, &[]),
        ];
        let text = render_zone(&records);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            vec!["example.test. 300 IN TYPE6 \\# 2 0102", "a\\032b.example.test. 60 IN TYPE16 \\# 3 026869", "e.example.test. 5 IN TYPE10 \\# 0",]
        );
    }

    #[test]
    fn only_a_differing_own_digest_for_the_certified_checkpoint_is_divergence() {
        let certified = CheckpointClaim { seq: 128, time: bft::Time(5), log_digest: [1; 32], state_digest: [2; 32] };
        let mut own = BTreeMap::from([(64, [9; 32]), (128, [2; 32])]);
        assert!(!diverged(&certified, &own), "same digest");
        own.insert(128, [3; 32]);
        assert!(diverged(&certified, &own), "another digest for the certified checkpoint");
        own.remove(&128);
        assert!(!diverged(&certified, &own), "no own digest (not executed that far, or skipped by a transfer): nothing to compare");
        assert!(!diverged(&CheckpointClaim::genesis(), &BTreeMap::from([(0, [7; 32])])));
    }

    #[test]
    fn the_store_keeps_the_newest_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path().join("snaps")).unwrap();
        for seq in [8, 16, 24, 32, 40] {
            store.save(&snapshot(seq, 2).0).unwrap();
        }
        let mut seqs = store.seqs();
        seqs.sort_unstable();
        assert_eq!(seqs, vec![24, 32, 40]);
        let (s, _) = snapshot(40, 2);
        assert!(store.encoded(40, &s.digest, 1 << 20).is_some());
        assert!(store.encoded(40, &[9; 32], 1 << 20).is_none(), "another digest is another checkpoint");
        assert!(store.encoded(8, &snapshot(8, 2).0.digest, 1 << 20).is_none(), "pruned");
    }

    #[test]
    fn a_peer_is_served_at_its_rate_and_no_faster() {
        let t0 = std::time::Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut rate = PeerRate::new(10.0, 5.0);
        for _ in 0..5 {
            assert!(rate.allow(1, t0), "a burst is served");
        }
        assert!(!rate.allow(1, t0), "beyond the burst");
        assert!(rate.allow(2, t0), "each peer has its own bucket");
        assert!(rate.allow(1, ms(100)), "a token a tenth of a second");
        assert!(!rate.allow(1, ms(100)));
        // A long pause refills the bucket to the burst, not beyond.
        assert_eq!((0..10).filter(|_| rate.allow(1, ms(60_000))).count(), 5);
        // A leech asking every millisecond for 10 s gets the burst and the rate, no more.
        let served = (0..10_000).filter(|&i| rate.allow(3, ms(i))).count();
        assert!((100..=106).contains(&served), "{served}");
        // An honest fetcher (one request per 1/FETCH_RATE s, however long) is never refused
        // at the rate served.
        let mut served = PeerRate::new(SERVE_RATE, SERVE_BURST);
        let step = Duration::from_secs(1) / FETCH_RATE;
        assert!((0..100_000u32).all(|i| served.allow(1, t0 + step * i)));
    }

    #[test]
    fn a_snapshot_is_read_once_for_all_its_chunks_and_the_cache_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path().to_path_buf()).unwrap();
        let snaps: Vec<Snapshot> = [64, 128, 192].iter().map(|&seq| snapshot(seq, 10).0).collect();
        for s in &snaps {
            store.save(s).unwrap();
        }
        for _ in 0..20 {
            assert_eq!(store.encoded(64, &snaps[0].digest, 1 << 20).unwrap().as_slice(), snaps[0].encode().as_slice());
        }
        assert_eq!(store.files_read(), 1, "one read for every request of checkpoint 64");
        for _ in 0..5 {
            store.encoded(128, &snaps[1].digest, 1 << 20).unwrap();
            store.encoded(64, &snaps[0].digest, 1 << 20).unwrap();
        }
        assert_eq!(store.files_read(), 2, "two checkpoints asked for in turn stay cached");
        assert!(store.encoded(64, &[7; 32], 1 << 20).is_none(), "another digest is not served from the cache");
        assert_eq!(store.files_read(), 2, "nor read from the file: the checkpoint has the cached digest");
        // Every kept checkpoint stays cached, asked for in any order.
        for s in snaps.iter().rev().chain(&snaps) {
            store.encoded(s.seq, &s.digest, 1 << 20).unwrap();
        }
        assert_eq!(store.files_read(), 3);
        // A fourth pushes out the oldest.
        let newer = snapshot(256, 10).0;
        store.save(&newer).unwrap();
        store.encoded(256, &newer.digest, 1 << 20).unwrap();
        assert_eq!(store.files_read(), 4);
        store.encoded(128, &snaps[1].digest, 1 << 20).unwrap();
        assert_eq!(store.files_read(), 4, "checkpoint 128 is still cached");
        assert!(store.encoded(64, &snaps[0].digest, 1 << 20).is_none(), "checkpoint 64 was forgotten (and its file pruned)");
        // The cache holds no more than max bytes (the newest entry always).
        let mut cache = ServedCache::default();
        cache.put(1, [1; 32], Arc::new(vec![0; 600]), 1000);
        cache.put(2, [2; 32], Arc::new(vec![0; 600]), 1000);
        assert!(cache.get(1, &[1; 32]).is_none() && cache.get(2, &[2; 32]).is_some_and(|b| b.is_some()));
        assert_eq!(cache.get(2, &[9; 32]), Some(None), "another digest for a cached checkpoint");
        cache.put(3, [3; 32], Arc::new(vec![0; 5000]), 1000);
        assert_eq!(cache.entries.keys().copied().collect::<Vec<_>>(), vec![3]);
    }

    /// A peer that answers each chunk request `delay` after it, with the chunk of `bytes`;
    /// counts the requests it got.
    fn fake_peer(
        mut incoming: mpsc::Receiver<(u16, Bytes)>,
        to: mpsc::Sender<(u16, Bytes)>,
        me: u16,
        bytes: Arc<Vec<u8>>,
        delay: Duration,
    ) -> Arc<std::sync::atomic::AtomicU64> {
        let asked = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let count = asked.clone();
        tokio::spawn(async move {
            while let Some((_, request)) = incoming.recv().await {
                let Ok(StateMessage::Request { seq, digest, offset }) = StateMessage::decode(&request) else { continue };
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (to, bytes) = (to.clone(), bytes.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let start = usize::try_from(offset).unwrap().min(bytes.len());
                    let data = bytes[start..(start + CHUNK_BYTES).min(bytes.len())].to_vec();
                    let chunk = StateMessage::Chunk { seq, digest, total: bytes.len() as u64, offset, data };
                    let _ = to.send((me, Bytes::from(chunk.encode()))).await;
                });
            }
        });
        asked
    }

    /// Replica 0 fetches from peer 1 first, which answers every chunk just within the chunk
    /// timeout: it is left once the fetch falls below a chunk a second, and peer 2 serves
    /// the snapshot.
    #[tokio::test(start_paused = true)]
    async fn a_peer_whose_chunks_come_too_slowly_is_left_for_another() {
        let (honest, claim) = snapshot(64, 80_000);
        let bytes = Arc::new(honest.encode());
        assert!(bytes.len() > 2 * CHUNK_BYTES, "several chunks");
        let (tx0, rx0) = mpsc::channel(64);
        let (tx1, rx1) = mpsc::channel(64);
        let (tx2, rx2) = mpsc::channel(64);
        let slow = fake_peer(rx1, tx0.clone(), 1, bytes.clone(), CHUNK_TIMEOUT - Duration::from_millis(500));
        let quick = fake_peer(rx2, tx0, 2, bytes, Duration::from_millis(1));
        let dir = tempfile::tempdir().unwrap();
        let transfer = StateTransfer {
            id: 0,
            peers: vec![1, 2],
            store: SnapshotStore::new(dir.path().to_path_buf()).unwrap(),
            outbound: Arc::new(Net { from: 0, peers: BTreeMap::from([(1, tx1), (2, tx2)]) }),
            max_snapshot_bytes: 64 * 1024 * 1024,
            stats: Default::default(),
            zones: vec!["example.test.".into()],
        };
        let (need_tx, need_rx) = watch::channel(None);
        let (itx, mut installs) = mpsc::channel(1);
        let (dtx, mut installed) = mpsc::channel(1);
        tokio::spawn(transfer.run(rx0, need_rx, itx, dtx));
        need_tx.send_replace(Some(claim));
        let (got, ack) = installs.recv().await.unwrap();
        assert_eq!(got, honest);
        ack.send(Ok(())).unwrap();
        assert_eq!(installed.recv().await.unwrap().claim, claim);
        let chunks = bytes_chunks(&honest);
        assert!(slow.load(std::sync::atomic::Ordering::Relaxed) < chunks, "the slow peer was left before the end");
        assert_eq!(quick.load(std::sync::atomic::Ordering::Relaxed), chunks, "the other peer served every chunk");
    }

    fn bytes_chunks(s: &Snapshot) -> u64 {
        (s.encode().len() as u64).div_ceil(CHUNK_BYTES as u64)
    }

    /// An in-memory network between state-transfer tasks.
    struct Net {
        from: u16,
        peers: BTreeMap<u16, mpsc::Sender<(u16, Bytes)>>,
    }

    impl StateOutbound for Net {
        fn send(&self, to: u16, bytes: Bytes) {
            if let Some(peer) = self.peers.get(&to) {
                let _ = peer.try_send((self.from, bytes));
            }
        }
    }

    /// Replica 0 needs checkpoint 64. Replica 1 serves a snapshot with a forged zone under the
    /// right name, replica 2 one whose deduplication table forgets a delivered request,
    /// replica 3 is honest, with a snapshot of several chunks: replica 0 installs exactly the
    /// honest one, and hands the ordering the honest table.
    #[tokio::test]
    async fn a_lagging_replica_installs_only_the_certified_state() {
        let (honest, claim) = snapshot(64, 80_000);
        assert!(honest.encode().len() > 2 * CHUNK_BYTES, "several chunks");
        let mut forged = honest.clone();
        forged.zones[0].records.push(record(&["evil", "example", "test"], 1, 300, &[10, 0, 0, 1]));
        let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
        let stores: Vec<_> = dirs.iter().map(|d| SnapshotStore::new(d.path().to_path_buf()).unwrap()).collect();
        let kept = stores.clone();
        stores[1].save(&forged).unwrap();
        stores[2].save(&with_base(&honest, |base| base.clients[0].mask = 0b110)).unwrap();
        stores[3].save(&honest).unwrap();

        let (txs, rxs): (Vec<_>, Vec<_>) = (0..4).map(|_| mpsc::channel(64)).unzip();
        let mut installs_rx = None;
        let mut installed_rx = None;
        let (need_tx, need_rx) = watch::channel(None);
        for (id, (store, incoming)) in stores.into_iter().zip(rxs).enumerate() {
            let id = id as u16;
            let peers: BTreeMap<u16, _> = (0..4u16).filter(|p| *p != id).map(|p| (p, txs[usize::from(p)].clone())).collect();
            let transfer = StateTransfer {
                id,
                peers: peers.keys().copied().collect(),
                store,
                outbound: Arc::new(Net { from: id, peers }),
                max_snapshot_bytes: 64 * 1024 * 1024,
                stats: Default::default(),
                zones: vec!["example.test.".into()],
            };
            let (itx, irx) = mpsc::channel(1);
            let (dtx, drx) = mpsc::channel(1);
            if id == 0 {
                installs_rx = Some(irx);
                installed_rx = Some(drx);
            }
            let needed = if id == 0 { need_rx.clone() } else { watch::channel(None).1 };
            tokio::spawn(transfer.run(incoming, needed, itx, dtx));
        }
        need_tx.send_replace(Some(claim));
        let (mut installs, mut installed) = (installs_rx.unwrap(), installed_rx.unwrap());
        let (got, ack) = tokio::time::timeout(Duration::from_secs(60), installs.recv()).await.unwrap().unwrap();
        assert_eq!(got, honest);
        ack.send(Ok(())).unwrap();
        let transferred = installed.recv().await.unwrap();
        assert_eq!((transferred.claim, transferred.base.encode()), (claim, honest.base));
        // Each server read its snapshot file once, whatever the number of chunks asked for.
        assert_eq!(kept[3].files_read(), 1);
        assert!(kept.iter().all(|s| s.files_read() <= 1));
    }
}
