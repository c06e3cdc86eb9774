//! Plain data types shared by the core, the codec and drivers.

use std::time::Duration;

/// Index of a replica, `0..n`.
pub type ReplicaId = u16;

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// Microseconds since the Unix epoch, supplied by the driver (wall clock).
///
/// Used both for timers and for the agreed batch time. The core never reads a clock itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub u64);

impl Time {
    /// `self + duration`, saturating.
    pub fn plus(self, duration: Duration) -> Time {
        Time(self.0.saturating_add(duration_us(duration)))
    }

    /// Absolute distance between two times, in microseconds.
    pub fn distance_us(self, other: Time) -> u64 {
        self.0.abs_diff(other.0)
    }
}

pub(crate) fn duration_us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// A client request. `(origin, client, number)` identifies it; retries reuse the same triple.
///
/// `origin` is the replica the client submitted to (the gateway). Numbers of one
/// `(origin, client)` should increase; a request more than [`DEDUP_WINDOW`] numbers below the
/// highest delivered number of its client is treated as already delivered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    pub origin: ReplicaId,
    pub client: u64,
    pub number: u64,
    pub payload: Vec<u8>,
}

/// How far below a client's highest delivered number requests are still tracked individually.
pub const DEDUP_WINDOW: u64 = 128;

/// Bytes a pending request is charged beyond its [`Request::wire_size`] (bookkeeping).
pub const REQUEST_OVERHEAD: usize = 128;

/// The key that deduplicates a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub origin: ReplicaId,
    pub client: u64,
    pub number: u64,
}

impl Request {
    pub fn key(&self) -> RequestKey {
        RequestKey { origin: self.origin, client: self.client, number: self.number }
    }

    /// Bytes this request takes in a batch (payload plus a fixed overhead for the header).
    pub fn wire_size(&self) -> usize {
        self.payload.len().saturating_add(24)
    }
}

/// What a primary proposes for one sequence number: the agreed time and the requests.
///
/// A *null* proposal (no requests, time 0) fills a gap after a view change.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Proposal {
    pub time: Time,
    pub requests: Vec<Request>,
}

impl Proposal {
    pub fn null() -> Proposal {
        Proposal { time: Time(0), requests: Vec::new() }
    }

    pub fn is_null(&self) -> bool {
        self.requests.is_empty()
    }
}

/// One remembered `(origin, client)` pair of the request deduplication table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientEntry {
    pub origin: ReplicaId,
    pub client: u64,
    /// Highest delivered number.
    pub high: u64,
    /// Bit i set: number `high - i` was delivered.
    pub mask: u128,
    /// Sequence number of the pair's last delivery (eviction order).
    pub last_seq: u64,
}

/// Where delivery resumes from: the state of the ordering's own delivery bookkeeping after
/// batch `seq` (a checkpoint). Together with the application state certified at that checkpoint
/// it is what a replica needs to go on delivering after `seq`, which also makes it what a state
/// transfer has to carry besides the application state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryBase {
    pub seq: u64,
    /// Agreed time of batch `seq`.
    pub time: Time,
    /// Log digest after batch `seq`.
    pub log_digest: Digest,
    pub clients: Vec<ClientEntry>,
    /// The per-origin budget after batch `seq` (see [`OriginBudgets`]).
    pub budgets: OriginBudgets,
}

/// The per-origin budget of the log (see [`Config::max_origin_bytes_per_sec`]): a token bucket
/// of `batch_max_bytes` per origin, refilled at `max_origin_bytes_per_sec` by the agreed times
/// of the batches in sequence order and charged for every request in them (at least
/// `min_request_charge` each). A function of the log alone, so every honest replica holds the
/// same one after the same batch; a checkpoint certifies it with the deduplication table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OriginBudgets {
    /// The latest batch time the balances were refilled to.
    pub clock: Time,
    /// Each origin's balance in bytes (negative after an overdraft) at `clock`, for origins
    /// below a full bucket; an origin not listed has a full bucket.
    pub balances: std::collections::BTreeMap<ReplicaId, i64>,
}

/// A batch delivered to the application, in strict sequence order, one per sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Sequence number, starting at 1, without gaps.
    pub seq: u64,
    /// The view in which this replica saw the batch commit. Informational only: it can differ
    /// between replicas (a batch fetched from peers reports the replica's current view).
    pub view: u64,
    /// The agreed time: the primary's proposed time, raised to the previous batch's time plus
    /// one microsecond when needed, so times strictly increase across every delivered batch
    /// (null batches included). Identical on every honest replica.
    pub time: Time,
    /// Requests not delivered before, in proposal order. Empty for a null batch.
    pub requests: Vec<Request>,
    /// True when `seq` is a checkpoint (`seq % checkpoint_interval == 0`): the application must
    /// call [`crate::Replica::checkpoint`] with its state digest after executing this batch.
    pub checkpoint_due: bool,
    /// With `checkpoint_due`: the ordering's delivery base after this batch, whose
    /// deduplication table the certified checkpoint covers (see
    /// [`crate::checkpoint_state_digest`]). A snapshot of this checkpoint carries it for state
    /// transfer.
    pub base: Option<DeliveryBase>,
}

/// Static configuration of one replica. Build with [`Config::new`] and adjust fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Number of replicas.
    pub n: u16,
    /// Tolerated Byzantine replicas (`t` in the paper); `n >= 3f + 1`.
    pub f: u16,
    /// This replica.
    pub id: ReplicaId,
    /// A primary closes a batch at this many requests.
    pub batch_max_requests: usize,
    /// A primary closes a batch at this many payload bytes (a single larger request still goes).
    pub batch_max_bytes: usize,
    /// Longest a request waits at the primary while other batches are in flight.
    pub batch_delay: Duration,
    /// K: a checkpoint every K sequence numbers.
    pub checkpoint_interval: u64,
    /// L: sequence numbers accepted above the low water mark; a multiple of K.
    pub watermark_window: u64,
    /// The longest a backup waits for a request it knows of to be ordered before it suspects
    /// the primary and starts a view change (the cap of the adaptive timeout, see
    /// `min_request_timeout`).
    pub request_timeout: Duration,
    /// The shortest such wait. A backup suspects after a time that adapts: at least this,
    /// doubled for every suspicion in a row that brought no progress, at least four times the
    /// slowest recent ordering latency it observed in the current view, and at most
    /// `request_timeout` (which wins where the two disagree). A crashed primary is then noticed within about this time while a
    /// slow but working one (a loaded machine, a long queue) is not abandoned. It only decides
    /// when to suspect: a view change still needs f+1 replicas to ask for it.
    pub min_request_timeout: Duration,
    /// Wait for a new-view message after 2f+1 view changes; doubles per failed view.
    pub view_change_timeout: Duration,
    /// Largest accepted distance between a proposed batch time and this replica's clock.
    pub max_clock_skew: Duration,
    /// Largest encoded message accepted (the decoder refuses more before allocating).
    pub max_message_bytes: usize,
    /// Committed batches kept below the stable checkpoint to serve lagging replicas.
    pub retained_batches: u64,
    /// Bound on this replica's own requests (submitted by its clients) not yet delivered.
    pub max_pending_requests: usize,
    /// Byte budget for another origin's requests held here until delivered (each counted as its
    /// [`Request::wire_size`] plus [`REQUEST_OVERHEAD`]); requests beyond it are dropped, and the
    /// origin retransmits. Caps what one peer can make this replica hold in pending requests.
    pub max_pending_bytes_per_origin: usize,
    /// Bytes per second of one origin's requests the log may carry, on average: a token bucket
    /// of `batch_max_bytes` per origin, refilled by the agreed batch times and charged
    /// `max(wire size, min_request_charge)` per request, in sequence order ([`OriginBudgets`]);
    /// a request may be taken while its origin's balance is positive (so it may overdraw the
    /// bucket once). An honest primary proposes by this rule (requests beyond it wait at the
    /// primary) and backups refuse a pre-prepare that breaks it, blame the primary and suspect
    /// it. 0: unlimited. Caps how much ordering, execution, logging and persistence one origin
    /// (a flooding replica, or a primary filling its batches with its own requests) can make
    /// the whole cluster do, however idle the others are.
    pub max_origin_bytes_per_sec: usize,
    /// The least a request is charged against its origin's budget, whatever its size: bounds
    /// the requests per second of one origin (`max_origin_bytes_per_sec` / this), so tiny
    /// requests cannot be ordered by the thousand.
    pub min_request_charge: usize,
    /// Largest request accepted, as [`Request::wire_size`]: what the application can execute
    /// (a 64 KiB DNS message plus its envelope). At most `batch_max_bytes`.
    pub max_request_bytes: usize,
    /// A request whose number is more than this above its client's highest delivered number (or
    /// above this for a client with none) is not delivered (decided at delivery, so on every
    /// replica alike), is refused by [`crate::Replica::submit`] and, relayed, blamed. The
    /// pending bound: a gateway numbers its requests consecutively, so it never numbers
    /// further above its highest delivered one than the requests it has outstanding (at most
    /// `max_pending_requests` here; one that lost track of some renumbers under a new client
    /// when refused). A Byzantine origin can number its own clients' requests as it likes, and
    /// cannot put requests under another origin (see the crate docs, "Protocol").
    pub max_number_jump: u64,
    /// Period of status broadcasts and retransmissions (the network may lose messages).
    pub retransmit_interval: Duration,
    /// Bound on the number of `(origin, client)` pairs remembered for deduplication, shared
    /// equally among origins (`max_clients / n` each, at least one): when an origin exceeds its
    /// share, its pair delivered longest ago is forgotten (deterministically, on every replica
    /// alike), so one origin's clients can never evict another's.
    pub max_clients: usize,
    /// Emit [`crate::Action::Persist`] so the replica can be restored after a restart
    /// ([`crate::Replica::restore`]). Off only where nothing is ever restored (benchmarks of
    /// the core alone); a replica that restarts without its persisted state must be counted
    /// against `f`.
    pub persist: bool,
}

impl Config {
    /// Defaults for a cluster of `n` with the largest `f` it tolerates.
    pub fn new(n: u16, id: ReplicaId) -> Config {
        Config {
            n,
            f: n.saturating_sub(1) / 3,
            id,
            batch_max_requests: 512,
            batch_max_bytes: 256 * 1024,
            batch_delay: Duration::from_millis(2),
            checkpoint_interval: 64,
            watermark_window: 256,
            request_timeout: Duration::from_secs(2),
            min_request_timeout: Duration::from_millis(250),
            view_change_timeout: Duration::from_secs(2),
            max_clock_skew: Duration::from_secs(2),
            max_message_bytes: 64 * 1024 * 1024,
            retained_batches: 1024,
            max_pending_requests: 100_000,
            max_pending_bytes_per_origin: 16 * 1024 * 1024,
            max_origin_bytes_per_sec: 1024 * 1024,
            min_request_charge: 512,
            max_request_bytes: 64 * 1024 + 1024,
            max_number_jump: 100_000,
            retransmit_interval: Duration::from_millis(500),
            max_clients: 1_000_000,
            persist: true,
        }
    }

    /// Checks the constraints the protocol relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.n == 0 {
            return Err(ConfigError::NoReplicas);
        }
        if u32::from(self.n) < 3 * u32::from(self.f) + 1 {
            return Err(ConfigError::TooFewReplicas { n: self.n, f: self.f });
        }
        if self.id >= self.n {
            return Err(ConfigError::IdOutOfRange { id: self.id, n: self.n });
        }
        if self.checkpoint_interval == 0 || self.watermark_window == 0 || self.watermark_window % self.checkpoint_interval != 0 {
            return Err(ConfigError::BadWindow { checkpoint_interval: self.checkpoint_interval, watermark_window: self.watermark_window });
        }
        if self.batch_max_requests == 0 || self.batch_max_bytes == 0 {
            return Err(ConfigError::ZeroBound("batch_max_requests/batch_max_bytes"));
        }
        if self.max_pending_requests == 0 || self.max_clients == 0 || self.max_number_jump == 0 {
            return Err(ConfigError::ZeroBound("max_pending_requests/max_clients/max_number_jump"));
        }
        if self.max_request_bytes < 24 || self.max_request_bytes > self.batch_max_bytes {
            return Err(ConfigError::BadRequestLimit { max_request_bytes: self.max_request_bytes, batch_max_bytes: self.batch_max_bytes });
        }
        if self.max_pending_bytes_per_origin < self.max_request_bytes + REQUEST_OVERHEAD {
            return Err(ConfigError::ZeroBound("max_pending_bytes_per_origin (at least one request)"));
        }
        if self.max_message_bytes < 1024 {
            return Err(ConfigError::ZeroBound("max_message_bytes (at least 1024)"));
        }
        for (name, value) in [
            ("request_timeout", self.request_timeout),
            ("min_request_timeout", self.min_request_timeout),
            ("view_change_timeout", self.view_change_timeout),
            ("retransmit_interval", self.retransmit_interval),
        ] {
            if value.is_zero() {
                return Err(ConfigError::ZeroBound(name));
            }
        }
        Ok(())
    }

    /// Size of every quorum: any two intersect in at least f+1 replicas (2f+1 when n = 3f+1).
    pub fn quorum(&self) -> usize {
        (usize::from(self.n) + usize::from(self.f)) / 2 + 1
    }

    /// The primary of `view`.
    pub fn primary(&self, view: u64) -> ReplicaId {
        // n > 0 after validation; the remainder is < n <= u16::MAX.
        (view % u64::from(self.n.max(1))) as ReplicaId
    }

    /// Limits the decoder enforces for this configuration.
    pub fn limits(&self) -> Limits {
        Limits {
            max_message_bytes: self.max_message_bytes,
            // A replica whose log runs past its stable checkpoint (after a new view that started
            // from a later checkpoint) reports up to four windows of entries.
            max_entries: usize::try_from(self.watermark_window.saturating_mul(4)).unwrap_or(usize::MAX),
        }
    }
}

/// Limits enforced while decoding, before any allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest message accepted, in bytes.
    pub max_message_bytes: usize,
    /// Largest number of per-sequence entries in view-change and new-view messages.
    pub max_entries: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_message_bytes: 64 * 1024 * 1024, max_entries: 4096 }
    }
}

/// A configuration the protocol cannot run with (the caller's mistake).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("n must be at least 1")]
    NoReplicas,
    #[error("n = {n} replicas cannot tolerate f = {f} faults (need n >= 3f + 1)")]
    TooFewReplicas { n: u16, f: u16 },
    #[error("replica id {id} is not below n = {n}")]
    IdOutOfRange { id: ReplicaId, n: u16 },
    #[error("watermark window {watermark_window} must be a positive multiple of the checkpoint interval {checkpoint_interval}")]
    BadWindow { checkpoint_interval: u64, watermark_window: u64 },
    #[error("{0} must be positive")]
    ZeroBound(&'static str),
    #[error("max_request_bytes {max_request_bytes} must be in 24..=batch_max_bytes ({batch_max_bytes})")]
    BadRequestLimit { max_request_bytes: usize, batch_max_bytes: usize },
}

/// Why [`crate::Replica::submit`] refused a request (back-pressure or the caller's mistake).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    #[error("{pending} requests already pending; retry later")]
    QueueFull { pending: usize },
    #[error("request of {size} bytes exceeds the batch byte limit {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("request was already delivered")]
    AlreadyDelivered,
    /// The number is more than `max_number_jump` above the client's highest delivered one, so
    /// the request would never be delivered: the caller renumbers (a new client, numbering
    /// from 1, is always within the jump).
    #[error("request number is more than max_number_jump above its client's highest delivered number")]
    NumberTooFar,
    #[error("request names origin {origin}, not this replica {id}")]
    NotOwnOrigin { origin: ReplicaId, id: ReplicaId },
}

/// Why [`crate::Replica::checkpoint`] refused a state digest (the caller's mistake).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    #[error("sequence {seq} is not a multiple of the checkpoint interval {interval}")]
    NotACheckpoint { seq: u64, interval: u64 },
    #[error("batch {seq} was not delivered yet (last delivered {last_delivered})")]
    NotDelivered { seq: u64, last_delivered: u64 },
    #[error("checkpoint {seq} was already reported")]
    Stale { seq: u64 },
}

/// Why [`crate::Replica::state_transferred`] refused an installed checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateTransferError {
    #[error("checkpoint {seq} is not beyond the last delivered batch {last_delivered}")]
    NotAhead { seq: u64, last_delivered: u64 },
    #[error("checkpoint {seq} is not the stable one ({stable}) nor an earlier certified one this replica asked for")]
    NotCertified { seq: u64, stable: u64 },
    #[error("the delivery base of checkpoint {seq} does not match it ({why})")]
    BadBase { seq: u64, why: &'static str },
}
