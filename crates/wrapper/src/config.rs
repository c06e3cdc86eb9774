//! The replica configuration file (TOML).
//!
//! One file per replica. Paths are relative to the file's own directory, so a
//! replica directory written by `sdns keygen` can be moved as a whole.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Which of the paper's threshold-signature protocols the replicas run (Section 3.5). The
/// same names in the configuration (serde) and on the command line (clap).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Every share carries its proof; verify each, combine k valid ones.
    Basic,
    /// Shares without proofs; combine the first k, check the signature, fall back to proofs.
    OptProof,
    /// Shares without proofs; try k-subsets of up to 2t+1 shares until one verifies.
    OptTe,
}

impl From<Protocol> for threshold::Protocol {
    fn from(p: Protocol) -> Self {
        match p {
            Protocol::Basic => threshold::Protocol::Basic,
            Protocol::OptProof => threshold::Protocol::OptProof,
            Protocol::OptTe => threshold::Protocol::OptTe,
        }
    }
}

/// Whether reads go through the ordering (the paper's default) or are answered locally.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ReadMode {
    Ordered,
    Local,
}

/// `Default` only as a base for building a file (`sdns keygen`): its required sections are
/// empty, which `validate` refuses.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub cluster: ClusterSection,
    pub replica: ReplicaSection,
    #[serde(rename = "peer")]
    pub peers: Vec<PeerSection>,
    pub named: NamedSection,
    #[serde(default)]
    pub ordering: OrderingSection,
    #[serde(default)]
    pub signing: SigningSection,
    #[serde(default)]
    pub client: ClientSection,
    #[serde(default)]
    pub metrics: MetricsSection,
    /// Client-address ACLs (named sees every client as the loopback address).
    #[serde(default)]
    pub access: crate::access::AccessSection,
    #[serde(default)]
    pub auth: AuthSection,
    #[serde(default)]
    pub rrl: crate::auth::rrl::RrlConfig,
    #[serde(default)]
    pub order_limit: crate::auth::rrl::OrderLimitConfig,
    /// The zones served, one `[[zone]]` table each; after parsing, sorted by canonical name
    /// (the position is the zone index every replica derives alike). A file without
    /// `[[zone]]` tables is read as one zone from the single-zone fields of `[cluster]`,
    /// `[replica]`, `[named]` and `[auth]`, which are then moved here.
    #[serde(rename = "zone", default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<ZoneSection>,
    /// Whether the zone came from the single-zone fields (error messages name those).
    #[serde(skip)]
    pub single_zone_fields: bool,
    /// Where the file was read from; relative paths are resolved against its directory.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Single-zone layout: the zone's apex, e.g. "example.test." (else `[[zone]] name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// n, the number of replicas.
    pub replicas: u16,
    /// t, the number of faulty replicas tolerated; defaults to (n-1)/3.
    pub faults: Option<u16>,
    #[serde(default = "default_protocol")]
    pub protocol: Protocol,
    #[serde(default = "default_read_mode")]
    pub reads: ReadMode,
    /// Ordered mode: answer a plain query without ordering it once 2t peers' read barriers
    /// show the gateway's own answer recent enough (a read index with a Byzantine quorum;
    /// `crate::vouched`). Still linearizable; `false` orders every read.
    #[serde(default = "default_true")]
    pub vouched_reads: bool,
    /// How long a gateway waits at least for its peers' barriers once its own answer is in,
    /// before it orders the read instead. Under load it waits longer, following the waits of
    /// its recently vouched reads (`crate::vouched::VouchClock`), up to `vouch_timeout_max_ms`.
    #[serde(default = "default_vouch_timeout_ms")]
    pub vouch_timeout_ms: u64,
    /// The most a gateway ever waits for vouches, whatever its peers do (at least
    /// `vouch_timeout_ms`; equal to it: a fixed timeout).
    #[serde(default = "default_vouch_timeout_max_ms")]
    pub vouch_timeout_max_ms: u64,
    /// The cluster CA certificate (PEM) that signs every replica's certificate.
    pub ca_cert: PathBuf,
    /// Single-zone layout: the threshold public key (shoup-rsa format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<PathBuf>,
    /// Single-zone layout: the DNSSEC algorithm number of the zone key (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<u8>,
    /// A cluster for tests and demonstrations: only then may a replica run a Byzantine mode
    /// (`replica.byzantine`, `replica.corrupt_shares`).
    #[serde(default)]
    pub test_cluster: bool,
}

/// The file's defaults; `replicas` and `ca_cert` are required in a file and empty here.
impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            zone: None,
            replicas: 0,
            faults: None,
            protocol: default_protocol(),
            reads: default_read_mode(),
            vouched_reads: true,
            vouch_timeout_ms: default_vouch_timeout_ms(),
            vouch_timeout_max_ms: default_vouch_timeout_max_ms(),
            ca_cert: PathBuf::new(),
            public_key: None,
            algorithm: None,
            test_cluster: false,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaSection {
    /// This replica's id, 0..n.
    pub id: u16,
    /// Single-zone layout: this replica's key share (must be mode 0600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_share: Option<PathBuf>,
    /// This replica's TLS certificate and key (PEM), signed by the cluster CA.
    pub cert: PathBuf,
    pub tls_key: PathBuf,
    /// The paper's fault injection: invert every bit of this replica's signature shares.
    #[serde(default)]
    pub corrupt_shares: bool,
    /// Fault injection for tests and demonstrations: this replica misbehaves this way
    /// (see `crate::byzantine`). Refused unless `cluster.test_cluster`.
    #[serde(default)]
    pub byzantine: Option<crate::byzantine::Mode>,
    /// Fault injection for tests: ordered writes with a record of this owner name are never
    /// sent to this replica's named; the executor sees the transient failure of a named that
    /// times out on them (set on every replica, it makes one write fail everywhere: the
    /// abandon rule's test). Refused unless `cluster.test_cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_fail_writes_naming: Option<String>,
    /// Working directory for runtime state (named's files, the signer socket).
    pub state_dir: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    pub id: u16,
    /// Where this replica takes DNS from clients (UDP and TCP).
    pub client: SocketAddr,
    /// Where this replica takes connections from the other replicas (TLS).
    pub peer: SocketAddr,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedSection {
    /// Directory holding the patched BIND build (sbin/named, bin/...).
    pub bind_dir: PathBuf,
    /// The private loopback port named listens on.
    pub port: u16,
    /// Single-zone layout: the zone file named starts from (unsigned or signed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_file: Option<PathBuf>,
    /// Single-zone layout: TSIG key file(s) (BIND format) whose keys may update the zone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tsig_keys: Vec<PathBuf>,
    /// Signature validity in days (named's sig-validity-interval, and the agreed expiration).
    #[serde(default = "default_validity_days")]
    pub signature_validity_days: u32,
    /// Single-zone layout: the zone's update-policy (see [`ZoneSection::update_policy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_policy: Option<Vec<String>>,
}

/// The file's defaults; `bind_dir` and `port` are required in a file and empty here.
impl Default for NamedSection {
    fn default() -> Self {
        NamedSection {
            bind_dir: PathBuf::new(),
            port: 0,
            zone_file: None,
            tsig_keys: Vec::new(),
            signature_validity_days: default_validity_days(),
            update_policy: None,
        }
    }
}

/// One zone of the cluster: its threshold key, its data, and who may update and transfer
/// it. Paths are relative to the configuration file, as everywhere.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneSection {
    /// The zone's apex, e.g. "example.test.".
    pub name: String,
    /// The DNSSEC algorithm number of the zone key (8 = RSASHA256, 10 = RSASHA512).
    #[serde(default = "default_algorithm")]
    pub algorithm: u8,
    /// The zone's threshold public key (shoup-rsa format).
    pub public_key: PathBuf,
    /// This replica's share of the zone's key (must be mode 0600).
    pub key_share: PathBuf,
    /// The zone file named starts from (unsigned or signed).
    pub zone_file: PathBuf,
    /// TSIG key file(s) (BIND format) whose keys may update the zone.
    #[serde(default)]
    pub tsig_keys: Vec<PathBuf>,
    /// Who may update what, as BIND's update-policy rules naming the keys of `tsig_keys`
    /// (`"grant dhcp-key zonesub A PTR"`, first match wins; rule types name, subdomain,
    /// zonesub, wildcard). Absent: every key in `tsig_keys` may update the whole zone.
    /// `sdns adopt` writes the operator's rules here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_policy: Option<Vec<String>>,
    /// SIG(0) public key files (`dnssec-keygen -T KEY -n USER` output) that may update the
    /// zone in `auth.mode` sig0 or both.
    #[serde(default)]
    pub sig0_keys: Vec<PathBuf>,
    /// TSIG key files that allow transfers of the zone (AXFR/IXFR); without one, refused.
    #[serde(default)]
    pub transfer_keys: Vec<PathBuf>,
}

impl ZoneSection {
    /// The update-policy rules, parsed (validate() has checked that they parse).
    pub fn policy_rules(&self) -> Option<Result<Vec<named_glue::conf::PolicyRule>, String>> {
        self.update_policy.as_ref().map(|rules| {
            rules.iter().map(|r| named_glue::conf::PolicyRule::parse(&r.split_whitespace().collect::<Vec<_>>()).map_err(|e| format!("{r:?}: {e}"))).collect()
        })
    }

    /// The apex as a domain name (validate() has checked that it is one).
    pub fn apex(&self) -> hickory_proto::rr::Name {
        let mut apex = hickory_proto::rr::Name::from_ascii(&self.name).unwrap_or_else(|_| hickory_proto::rr::Name::root());
        apex.set_fqdn(true);
        apex
    }

    /// Where a cluster of several zones keeps this zone's files, in a replica directory
    /// and in named's: `zones/<name>` (validate() has checked the name makes a plain path).
    pub fn dir_name(&self) -> String {
        zone_dir_name(&self.name)
    }
}

/// `zones/<name>`: the zone's directory with several zones (lower case, no trailing dot).
pub fn zone_dir_name(name: &str) -> String {
    format!("zones/{}", name.trim_end_matches('.').to_ascii_lowercase())
}

/// Checks that these zones can be served side by side by one named (distinct, none inside
/// another, with several: names that make plain directory names). On error, the position
/// of the offending zone and why.
pub fn check_zone_set(names: &[&str]) -> Result<(), (usize, String)> {
    use hickory_proto::rr::Name;
    let several = names.len() > 1;
    let mut apexes: Vec<(usize, Name)> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut apex = match Name::from_ascii(name) {
            Ok(n) if !name.is_empty() => n,
            _ => return Err((i, format!("{name:?} is not a domain name"))),
        };
        apex.set_fqdn(true);
        let plain = name.trim_end_matches('.');
        if several && (plain.is_empty() || !plain.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')) {
            return Err((i, format!("{name:?}: with several zones, names are letters, digits, '-', '_' and dots only")));
        }
        for (j, other) in &apexes {
            if *other == apex {
                return Err((i, format!("zone {apex} is given twice (zone[{j}] too)")));
            }
            let (parent, child) = if other.zone_of(&apex) {
                (other, &apex)
            } else if apex.zone_of(other) {
                (&apex, other)
            } else {
                continue;
            };
            return Err((
                i,
                format!(
                    "zone {child} is inside zone {parent}: a parent and a child zone in one cluster would need a delegation and DS between two threshold keys, which sdns does not do; serve them from separate clusters"
                ),
            ));
        }
        apexes.push((i, apex));
    }
    Ok(())
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrderingSection {
    pub batch_max_requests: usize,
    pub batch_delay_ms: u64,
    pub checkpoint_interval: u64,
    /// The longest a backup waits for a request it knows to be ordered before it suspects the
    /// primary; the wait adapts between `min_request_timeout_ms` and this.
    pub request_timeout_ms: u64,
    /// The shortest such wait (a quick cluster notices a crashed primary this soon); it
    /// doubles per view change without progress and grows with the ordering latency
    /// observed. Must exceed the ordering latency of the cluster's first requests. A replica
    /// that has just started or resumed suspects no primary before fresh status reports from
    /// 2t peers (docs/RELIABILITY.md, "Failover").
    pub min_request_timeout_ms: u64,
    pub view_change_timeout_ms: u64,
    pub max_clock_skew_ms: u64,
    /// Batches kept below the stable checkpoint for peers that catch up by replaying the log;
    /// a peer further behind fetches the state by state transfer instead. Tests shrink it to
    /// reach state transfer quickly.
    pub retained_batches: u64,
    /// Largest snapshot (zone records plus execution state, encoded) this replica accepts
    /// from a peer in a state transfer.
    pub max_snapshot_bytes: usize,
    /// Bytes per second of one replica's requests the log may carry, on average (bft
    /// `max_origin_bytes_per_sec`, a token bucket of one batch's bytes that every replica
    /// derives from the log): an honest primary proposes by it and backups refuse, blame and
    /// depose a primary that breaks it. Bounds what a flooding replica, or a primary filling
    /// its batches with its own requests, makes every replica order, log, persist and execute.
    pub max_origin_bytes_per_sec: usize,
    /// The least one request is charged against that budget (bft `min_request_charge`): with
    /// the defaults one replica's requests are ordered at most 2,048 a second on average.
    pub min_request_charge: usize,
}

impl Default for OrderingSection {
    fn default() -> Self {
        Self {
            batch_max_requests: 64,
            batch_delay_ms: 1,
            checkpoint_interval: 64,
            request_timeout_ms: 2000,
            min_request_timeout_ms: 250,
            view_change_timeout_ms: 2000,
            max_clock_skew_ms: 30_000,
            retained_batches: 1024,
            max_snapshot_bytes: 256 * 1024 * 1024,
            max_origin_bytes_per_sec: 1024 * 1024,
            min_request_charge: 512,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SigningSection {
    /// Final signatures kept to serve replicas that replay old writes.
    pub cache_entries: usize,
    /// A signature is re-signed once it is this old (its expiration is less than the
    /// validity minus this away, by agreed time); default: half the signature validity.
    pub resign_after_s: Option<u64>,
    /// Signature validity in seconds, overriding `named.signature_validity_days` for the
    /// agreed times (named's own interval is only counted in days); for short-validity
    /// soak runs.
    pub validity_s: Option<u32>,
    /// Incremental re-signing: at most one slice per this much agreed time.
    pub resign_slice_interval_s: u64,
    /// Incremental re-signing: at most this many RRsets (those whose signatures expire
    /// soonest) are re-signed in one slice, so a slice holds the executor briefly.
    pub resign_slice_rrsets: u32,
    /// At most one whole-zone signing (sign-zone or re-sign) per this much agreed time;
    /// a sign-zone asked for sooner is refused.
    pub sign_zone_interval_s: u64,
    /// A replica's ordered sign-zone request counts toward the t+1 needed for this long
    /// (agreed time).
    pub sign_zone_window_s: u64,
    /// Signatures a whole-zone signing keeps in flight at once (dnssec-signzone's threads,
    /// at most `named_glue::signzone::MAX_THREADS`); default: one per core, as many as the
    /// signing pool computes at once. Only the order of names in the signed file depends
    /// on it, never the zone, so replicas may differ here.
    pub zone_signer_threads: Option<usize>,
}

impl SigningSection {
    pub fn zone_signer_threads(&self) -> usize {
        self.zone_signer_threads.unwrap_or_else(|| crate::signing::service::default_workers().min(named_glue::signzone::MAX_THREADS))
    }
}

impl Default for SigningSection {
    fn default() -> Self {
        Self {
            cache_entries: 4096,
            resign_after_s: None,
            validity_s: None,
            resign_slice_interval_s: 10,
            resign_slice_rrsets: 16,
            sign_zone_interval_s: 3600,
            sign_zone_window_s: 600,
            zone_signer_threads: None,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientSection {
    /// A TCP client connection idle this long is closed.
    pub tcp_idle_timeout_ms: u64,
    /// At most this many client TCP connections at once.
    pub tcp_max_connections: usize,
    /// At most this many client requests awaiting an answer at once; more are answered SERVFAIL.
    pub max_pending: usize,
    /// A client request not answered in this time is dropped (the client retries).
    pub request_timeout_ms: u64,
    /// Requests one TCP connection may have unanswered; beyond, it is not read.
    pub tcp_max_pipelined: usize,
    /// A write to a TCP client that makes no progress in this time closes its connection.
    pub tcp_write_timeout_ms: u64,
    /// The receive buffer asked for the client UDP socket (SO_RCVBUF), in bytes; 0 keeps the
    /// OS default. The kernel caps it at net.core.rmem_max. A burst the listener has not read
    /// yet waits here; beyond it the kernel drops datagrams (RcvbufErrors in /proc/net/snmp).
    pub udp_receive_buffer: usize,
}

/// The largest `client.udp_receive_buffer` (within what setsockopt can take).
const MAX_UDP_RECEIVE_BUFFER: usize = 1 << 30;

impl Default for ClientSection {
    fn default() -> Self {
        Self {
            tcp_idle_timeout_ms: 10_000,
            tcp_max_connections: 256,
            max_pending: 4096,
            request_timeout_ms: 15_000,
            tcp_max_pipelined: 16,
            tcp_write_timeout_ms: 5_000,
            // Some 10,000 small queries on Linux (the 208 KiB default holds 256: each waits
            // with its buffer's overhead).
            udp_receive_buffer: 4 << 20,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Prometheus metrics and /status on this address (HTTP); off when absent.
    pub listen: Option<SocketAddr>,
    /// A replica whose own requests go undelivered, or whose executor does not move while
    /// the ordering delivered past it, this long reports itself stalled (`/status`,
    /// `sdns_stalled`, `sdns cluster status`); default: twice `client.request_timeout_ms`,
    /// far above what a view change or a busy executor takes.
    pub stall_after_ms: Option<u64>,
}

/// Who may update the zone and transfer it (see README, "Update authentication").
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// `tsig` (each zone's `tsig_keys`: every replica holds their secret),
    /// `sig0` (each zone's public `sig0_keys`: no replica can sign), or `both`; for every zone.
    pub mode: crate::auth::Mode,
    /// Single-zone layout: SIG(0) public key files as `dnssec-keygen -T KEY -n USER` writes
    /// them (`K<name>.+<alg>+<tag>.key`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sig0_keys: Vec<PathBuf>,
    /// Single-zone layout: TSIG key files that allow zone transfers (AXFR/IXFR); without
    /// one, transfers are refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub transfer_keys: Vec<PathBuf>,
    /// Fault injection for tests: order updates and transfers without the pre-ordering
    /// check, as a corrupted replica could.
    pub skip_precheck: bool,
    /// The longest validity (expiration less inception, s) a SIG(0) update may carry; one
    /// valid longer is refused. Each SIG(0) update is remembered until it expires, so that
    /// a replay of it is not executed again.
    pub sig0_max_validity_s: u64,
}

impl Default for AuthSection {
    fn default() -> Self {
        AuthSection {
            mode: crate::auth::Mode::default(),
            sig0_keys: Vec::new(),
            transfer_keys: Vec::new(),
            skip_precheck: false,
            sig0_max_validity_s: crate::auth::SIG0_MAX_VALIDITY_S,
        }
    }
}

fn default_protocol() -> Protocol {
    Protocol::OptTe
}
fn default_true() -> bool {
    true
}
pub fn default_vouch_timeout_ms() -> u64 {
    5
}
/// About what ordering a read costs under the load at which vouches get slow (50-55 ms in
/// docs/BENCHMARKS.md, "10,000 names"): a read that is never vouched then takes at most about
/// twice its ordered latency, and stays far below any resolver's retry timer.
pub fn default_vouch_timeout_max_ms() -> u64 {
    50
}
fn default_read_mode() -> ReadMode {
    ReadMode::Ordered
}
fn default_algorithm() -> u8 {
    8
}
fn default_validity_days() -> u32 {
    30
}

/// A configuration problem, naming the file and the field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path}: field `{field}`: {problem}")]
    Invalid { path: PathBuf, field: String, problem: String },
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        // Absolute, because named changes into its own directory before opening files.
        let absolute = std::path::absolute(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let base = absolute.parent().map(Path::to_owned).unwrap_or_default();
        Config::parse(&text, path, &base)
    }

    pub fn parse(text: &str, path: &Path, base_dir: &Path) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse { path: path.to_owned(), message: e.to_string() })?;
        config.base_dir = base_dir.to_owned();
        config.gather_zones(path)?;
        config.validate(path)?;
        // The zone index is the position in canonical order, whatever the file's order.
        config.zones.sort_by_key(ZoneSection::apex);
        Ok(config)
    }

    /// A file without `[[zone]]` tables is one zone from the single-zone fields (every
    /// directory dealt before several zones existed); beside `[[zone]]` tables those
    /// fields are refused, so no setting is silently ignored.
    fn gather_zones(&mut self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: &str, problem: &str| ConfigError::Invalid { path: path.to_owned(), field: field.to_owned(), problem: problem.to_owned() };
        if !self.zones.is_empty() {
            let single = [
                ("cluster.zone", self.cluster.zone.is_some()),
                ("cluster.public_key", self.cluster.public_key.is_some()),
                ("cluster.algorithm", self.cluster.algorithm.is_some()),
                ("replica.key_share", self.replica.key_share.is_some()),
                ("named.zone_file", self.named.zone_file.is_some()),
                ("named.tsig_keys", !self.named.tsig_keys.is_empty()),
                ("named.update_policy", self.named.update_policy.is_some()),
                ("auth.sig0_keys", !self.auth.sig0_keys.is_empty()),
                ("auth.transfer_keys", !self.auth.transfer_keys.is_empty()),
            ];
            if let Some((field, _)) = single.iter().find(|(_, set)| *set) {
                return Err(bad(field, "is a single-zone field: with [[zone]] tables, give it in each [[zone]]"));
            }
            return Ok(());
        }
        let missing = "missing (give it, or describe the zones in [[zone]] tables)";
        let name = self.cluster.zone.take().ok_or_else(|| bad("cluster.zone", missing))?;
        let public_key = self.cluster.public_key.take().ok_or_else(|| bad("cluster.public_key", missing))?;
        let key_share = self.replica.key_share.take().ok_or_else(|| bad("replica.key_share", missing))?;
        let zone_file = self.named.zone_file.take().ok_or_else(|| bad("named.zone_file", missing))?;
        self.zones.push(ZoneSection {
            name,
            algorithm: self.cluster.algorithm.take().unwrap_or_else(default_algorithm),
            public_key,
            key_share,
            zone_file,
            tsig_keys: std::mem::take(&mut self.named.tsig_keys),
            update_policy: self.named.update_policy.take(),
            sig0_keys: std::mem::take(&mut self.auth.sig0_keys),
            transfer_keys: std::mem::take(&mut self.auth.transfer_keys),
        });
        self.single_zone_fields = true;
        Ok(())
    }

    /// How an error names a zone's field: where the file has it.
    fn zone_field(&self, i: usize, field: &str) -> String {
        if !self.single_zone_fields {
            return format!("zone[{i}].{field}");
        }
        let section = match field {
            "name" => return "cluster.zone".into(),
            "algorithm" | "public_key" => "cluster",
            "key_share" => "replica",
            "zone_file" | "tsig_keys" | "update_policy" => "named",
            _ => "auth",
        };
        format!("{section}.{field}")
    }

    /// How messages name a zone's field: where the file has it.
    pub fn field_of(&self, zone: &ZoneSection, field: &str) -> String {
        if self.single_zone_fields {
            self.zone_field(0, field)
        } else {
            format!("[[zone]] {}: {field}", zone.name)
        }
    }

    /// The zone with this index (its position in canonical order).
    pub fn zone(&self, index: usize) -> Option<&ZoneSection> {
        self.zones.get(index)
    }

    /// The one zone of a single-zone cluster; `None` with several.
    pub fn only_zone(&self) -> Option<&ZoneSection> {
        match self.zones.as_slice() {
            [z] => Some(z),
            _ => None,
        }
    }

    /// t: explicit, or the largest t with n >= 3t+1.
    pub fn faults(&self) -> u16 {
        self.cluster.faults.unwrap_or(self.cluster.replicas.saturating_sub(1) / 3)
    }

    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.base_dir.join(p)
        }
    }

    /// Signature validity (s) for the agreed times.
    pub fn validity_s(&self) -> u32 {
        self.signing.validity_s.unwrap_or(self.named.signature_validity_days.saturating_mul(86_400))
    }

    /// How old a signature may get before it is signed again.
    pub fn resign_after_s(&self) -> u64 {
        self.signing.resign_after_s.unwrap_or(u64::from(self.validity_s()) / 2)
    }

    /// How long without progress makes this replica report itself stalled.
    pub fn stall_after(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.metrics.stall_after_ms.unwrap_or(self.client.request_timeout_ms.saturating_mul(2)))
    }

    pub fn me(&self) -> &PeerSection {
        // validate() established that exactly one peer entry has our id.
        self.peers.iter().find(|p| p.id == self.replica.id).expect("validated: own peer entry exists")
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: &str, problem: String| ConfigError::Invalid { path: path.to_owned(), field: field.to_owned(), problem };
        let n = self.cluster.replicas;
        if n == 0 {
            return Err(bad("cluster.replicas", "must be at least 1".into()));
        }
        let t = self.faults();
        if u32::from(n) < 3 * u32::from(t) + 1 {
            return Err(bad("cluster.faults", format!("{t} faults need at least {} replicas, have {n}", 3 * t + 1)));
        }
        self.validate_zones(path)?;
        if !self.cluster.test_cluster {
            if let Some(mode) = self.replica.byzantine {
                return Err(bad("replica.byzantine", format!("\"{mode}\" is fault injection; refused unless cluster.test_cluster = true")));
            }
            if self.replica.corrupt_shares {
                return Err(bad("replica.corrupt_shares", "is fault injection; refused unless cluster.test_cluster = true".into()));
            }
            if self.replica.test_fail_writes_naming.is_some() {
                return Err(bad("replica.test_fail_writes_naming", "is fault injection; refused unless cluster.test_cluster = true".into()));
            }
        }
        if self.cluster.vouch_timeout_ms == 0 || self.cluster.vouch_timeout_ms > 10_000 {
            return Err(bad("cluster.vouch_timeout_ms", format!("{} is outside 1..=10000", self.cluster.vouch_timeout_ms)));
        }
        if !(self.cluster.vouch_timeout_ms..=10_000).contains(&self.cluster.vouch_timeout_max_ms) {
            return Err(bad(
                "cluster.vouch_timeout_max_ms",
                format!("{} is outside cluster.vouch_timeout_ms..=10000 ({}..=10000)", self.cluster.vouch_timeout_max_ms, self.cluster.vouch_timeout_ms),
            ));
        }
        if self.replica.id >= n {
            return Err(bad("replica.id", format!("{} is not below cluster.replicas = {n}", self.replica.id)));
        }
        if self.peers.len() != usize::from(n) {
            return Err(bad("peer", format!("{} [[peer]] entries for {n} replicas", self.peers.len())));
        }
        let ids: BTreeSet<u16> = self.peers.iter().map(|p| p.id).collect();
        if ids.len() != self.peers.len() || ids.iter().any(|&i| i >= n) {
            return Err(bad("peer.id", format!("ids must be 0..{} each once, got {:?}", n, self.peers.iter().map(|p| p.id).collect::<Vec<_>>())));
        }
        let mut addrs = BTreeSet::new();
        for p in &self.peers {
            for a in [p.client, p.peer] {
                if !addrs.insert(a) {
                    return Err(bad("peer", format!("address {a} is used twice")));
                }
            }
        }
        if self.named.port == 0 {
            return Err(bad("named.port", "must not be 0".into()));
        }
        if !(8..=3660).contains(&self.named.signature_validity_days) {
            return Err(bad(
                "named.signature_validity_days",
                format!("{} is outside 8..=3660 (named's sig-validity-interval range)", self.named.signature_validity_days),
            ));
        }
        let o = &self.ordering;
        if o.batch_max_requests == 0 {
            return Err(bad("ordering.batch_max_requests", "must be at least 1".into()));
        }
        if o.checkpoint_interval == 0 {
            return Err(bad("ordering.checkpoint_interval", "must be at least 1".into()));
        }
        if o.max_snapshot_bytes == 0 {
            return Err(bad("ordering.max_snapshot_bytes", "must be positive".into()));
        }
        if o.view_change_timeout_ms == 0 || o.request_timeout_ms == 0 || o.min_request_timeout_ms == 0 {
            return Err(bad("ordering", "timeouts must be positive".into()));
        }
        if self.metrics.stall_after_ms == Some(0) {
            return Err(bad("metrics.stall_after_ms", "must be positive (every replica would be stalled)".into()));
        }
        if let Some(v) = self.signing.validity_s {
            if v < 60 || v > self.named.signature_validity_days.saturating_mul(86_400) {
                return Err(bad("signing.validity_s", format!("{v} must be at least 60 and at most named.signature_validity_days")));
            }
        }
        if let Some(threads) = self.signing.zone_signer_threads {
            if !(1..=named_glue::signzone::MAX_THREADS).contains(&threads) {
                return Err(bad("signing.zone_signer_threads", format!("{threads} is outside 1..={}", named_glue::signzone::MAX_THREADS)));
            }
        }
        if self.signing.resign_slice_interval_s == 0 || self.signing.resign_slice_rrsets == 0 {
            return Err(bad("signing.resign_slice_interval_s", "the slice interval and slice size must be at least 1".into()));
        }
        if let Some(r) = self.signing.resign_after_s {
            let validity = u64::from(self.validity_s());
            if r == 0 || r >= validity {
                return Err(bad("signing.resign_after_s", format!("{r} must be above 0 and below the signature validity ({validity} s)")));
            }
        }
        if self.signing.sign_zone_window_s == 0 {
            return Err(bad("signing.sign_zone_window_s", "must be at least 1".into()));
        }
        if self.signing.cache_entries == 0 {
            return Err(bad("signing.cache_entries", "must be at least 1".into()));
        }
        self.rrl.validate().map_err(|e| bad("rrl", e))?;
        self.order_limit.validate().map_err(|e| bad("order_limit", e))?;
        // At least nsupdate's 10 minutes; at most a day (each is remembered until it expires).
        if !(600..=86_400).contains(&self.auth.sig0_max_validity_s) {
            return Err(bad("auth.sig0_max_validity_s", format!("{} s is outside 600..=86400", self.auth.sig0_max_validity_s)));
        }
        if self.client.max_pending == 0 || self.client.tcp_max_connections == 0 || self.client.tcp_max_pipelined == 0 || self.client.tcp_write_timeout_ms == 0 {
            return Err(bad("client", "limits must be positive".into()));
        }
        // setsockopt takes an int; a larger ask would wrap to a tiny buffer.
        if self.client.udp_receive_buffer > MAX_UDP_RECEIVE_BUFFER {
            return Err(bad(
                "client.udp_receive_buffer",
                format!("{} bytes is above the largest allowed ({MAX_UDP_RECEIVE_BUFFER}, 1 GiB)", self.client.udp_receive_buffer),
            ));
        }
        Ok(())
    }

    /// Each zone well formed, and the set of zones one named can serve side by side.
    fn validate_zones(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: String, problem: String| ConfigError::Invalid { path: path.to_owned(), field, problem };
        if self.zones.len() > MAX_ZONES {
            return Err(bad("zone".into(), format!("{} zones; at most {MAX_ZONES}", self.zones.len())));
        }
        let mode = self.auth.mode;
        let names: Vec<&str> = self.zones.iter().map(|z| z.name.as_str()).collect();
        check_zone_set(&names).map_err(|(i, why)| bad(self.zone_field(i, "name"), why))?;
        for (i, z) in self.zones.iter().enumerate() {
            let field = |f: &str| self.zone_field(i, f);
            if ![5, 7, 8, 10].contains(&z.algorithm) {
                return Err(bad(field("algorithm"), format!("{} is not an RSA DNSSEC algorithm (5, 7, 8, 10)", z.algorithm)));
            }
            if mode != crate::auth::Mode::Tsig && z.sig0_keys.is_empty() {
                return Err(bad(field("sig0_keys"), format!("mode \"{}\" needs at least one SIG(0) key file", mode.as_str())));
            }
            if mode != crate::auth::Mode::Sig0 && z.tsig_keys.is_empty() {
                return Err(bad(field("tsig_keys"), format!("auth.mode \"{}\" needs at least one TSIG key file", mode.as_str())));
            }
            if let Some(Err(e)) = z.policy_rules() {
                return Err(bad(field("update_policy"), e));
            }
        }
        Ok(())
    }
}

/// Zones one cluster may serve (the zone index travels as a u16; named's start-up time and
/// the checkpoint's work grow with every zone).
pub const MAX_ZONES: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(n: u16) -> String {
        let mut s = format!(
            r#"
[cluster]
zone = "example.test."
replicas = {n}
ca_cert = "ca.pem"
public_key = "zone.pub.json"

[replica]
id = 0
key_share = "share.json"
cert = "replica.pem"
tls_key = "replica.key"
state_dir = "state"

[named]
bind_dir = "/opt/bind"
port = 5501
zone_file = "zone.db"
tsig_keys = ["tsig.key"]
"#
        );
        for i in 0..n {
            s += &format!("\n[[peer]]\nid = {i}\nclient = \"127.0.0.1:{}\"\npeer = \"127.0.0.1:{}\"\n", 5301 + i, 5401 + i);
        }
        s
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("r0.toml"), Path::new("/etc/sdns"))
    }

    #[test]
    fn sample_parses_with_defaults() {
        let c = parse(&sample(4)).unwrap();
        assert_eq!(c.faults(), 1);
        assert_eq!(c.cluster.protocol, Protocol::OptTe);
        assert_eq!(c.cluster.reads, ReadMode::Ordered);
        assert!(c.cluster.vouched_reads, "vouched reads are on by default");
        assert_eq!((c.cluster.vouch_timeout_ms, c.cluster.vouch_timeout_max_ms), (5, 50));
        assert_eq!(c.resolve(Path::new("share.json")), Path::new("/etc/sdns/share.json"));
        assert_eq!(c.me().client.port(), 5301);
        assert_eq!(c.auth.mode, crate::auth::Mode::Tsig);
        assert!(c.zones[0].transfer_keys.is_empty() && !c.auth.skip_precheck);
        assert_eq!(c.rrl.responses_per_second, 0);
        let both = parse(&(sample(4) + "\n[auth]\nmode = \"both\"\nsig0_keys = [\"K.key\"]\n[rrl]\nresponses_per_second = 20\n")).unwrap();
        assert_eq!((both.auth.mode, both.rrl.responses_per_second, both.rrl.slip), (crate::auth::Mode::Both, 20, 2));
        assert!(c.zones[0].update_policy.is_none() && c.zones[0].policy_rules().is_none());
        let policy = parse(&sample(4).replace("tsig_keys", "update_policy = [\"grant dhcp zonesub A PTR\"]\ntsig_keys")).unwrap();
        let rules = policy.zones[0].policy_rules().unwrap().unwrap();
        assert_eq!((rules[0].identity.as_str(), rules[0].types.len()), ("dhcp", 2));
        // The stall bound: twice the client timeout unless given; 0 is refused.
        assert_eq!(c.stall_after(), std::time::Duration::from_secs(30));
        let stall = |v: &str| parse(&(sample(4) + &format!("\n[metrics]\nstall_after_ms = {v}\n")));
        assert_eq!(stall("5000").unwrap().stall_after(), std::time::Duration::from_secs(5));
        assert!(stall("0").unwrap_err().to_string().contains("metrics.stall_after_ms"));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (sample(4).replace("replicas = 4", "replicas = 3"), "peer"),
            (sample(4).replace("id = 0\nkey_share", "id = 9\nkey_share"), "replica.id"),
            (sample(4).replace("zone = \"example.test.\"", "zone = \"\""), "cluster.zone"),
            (sample(4).replace("replicas = 4", "replicas = 4\nfaults = 2"), "cluster.faults"),
            (sample(4).replace("port = 5501", "port = 0"), "named.port"),
            (sample(4).replace("replicas = 4", "replicas = 4\nvouch_timeout_ms = 0"), "cluster.vouch_timeout_ms"),
            (sample(4).replace("replicas = 4", "replicas = 4\nvouch_timeout_ms = 20\nvouch_timeout_max_ms = 10"), "cluster.vouch_timeout_max_ms"),
            (sample(4).replace("replicas = 4", "replicas = 4\nvouch_timeout_max_ms = 10001"), "cluster.vouch_timeout_max_ms"),
            (sample(4) + "\n[signing]\nresign_after_s = 99999999\n", "signing.resign_after_s"),
            (sample(4) + "\n[signing]\nsign_zone_window_s = 0\n", "signing.sign_zone_window_s"),
            (sample(4).replace("127.0.0.1:5402", "127.0.0.1:5401"), "peer"),
            (sample(4) + "\n[auth]\nmode = \"sig0\"\n", "auth.sig0_keys"),
            (sample(4) + "\n[rrl]\nresponses_per_second = 5\nwindow_s = 0\n", "rrl"),
            (sample(4).replace("state_dir", "byzantine = \"silent\"\nstate_dir"), "replica.byzantine"),
            (sample(4).replace("state_dir", "corrupt_shares = true\nstate_dir"), "replica.corrupt_shares"),
            (sample(4).replace("state_dir", "test_fail_writes_naming = \"hang.example.test.\"\nstate_dir"), "replica.test_fail_writes_naming"),
            (sample(4).replace("tsig_keys", "update_policy = [\"grant k self . A\"]\ntsig_keys"), "named.update_policy"),
            (sample(4) + "\n[client]\nudp_receive_buffer = 5000000000\n", "client.udp_receive_buffer"),
        ];
        for (text, field) in cases {
            match parse(&text) {
                Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("expected an error naming {field}, got {other:?}"),
            }
        }
    }

    #[test]
    fn single_zone_fields_are_read_as_one_zone() {
        let c = parse(&sample(4)).unwrap();
        assert!(c.single_zone_fields);
        let z = c.only_zone().unwrap();
        assert_eq!(
            (z.name.as_str(), z.algorithm, z.public_key.as_path(), z.key_share.as_path(), z.zone_file.as_path()),
            ("example.test.", 8, Path::new("zone.pub.json"), Path::new("share.json"), Path::new("zone.db"))
        );
        assert_eq!(z.tsig_keys, vec![PathBuf::from("tsig.key")]);
        // Moved, not copied: one place holds each zone setting.
        assert!(c.cluster.zone.is_none() && c.replica.key_share.is_none() && c.named.tsig_keys.is_empty());
        let e = parse(&sample(4).replace("zone_file = \"zone.db\"\n", "")).unwrap_err();
        assert!(matches!(&e, ConfigError::Invalid { field, .. } if field == "named.zone_file"), "{e}");
    }

    /// `sample(4)` with its single-zone fields replaced by these `[[zone]]` tables.
    fn with_zones(zones: &[&str]) -> String {
        let mut text = sample(4);
        for line in [
            "zone = \"example.test.\"\n",
            "public_key = \"zone.pub.json\"\n",
            "key_share = \"share.json\"\n",
            "zone_file = \"zone.db\"\n",
            "tsig_keys = [\"tsig.key\"]\n",
        ] {
            text = text.replacen(line, "", 1);
        }
        for z in zones {
            let dir = z.trim_end_matches('.');
            text += &format!(
                "\n[[zone]]\nname = \"{z}\"\npublic_key = \"zones/{dir}/zone.pub.json\"\nkey_share = \"zones/{dir}/share.json\"\n\
                 zone_file = \"zones/{dir}/zone.db\"\ntsig_keys = [\"zones/{dir}/tsig.key\"]\n"
            );
        }
        text
    }

    #[test]
    fn zone_tables_are_sorted_into_canonical_order() {
        let c = parse(&with_zones(&["example.test.", "2.0.192.in-addr.arpa.", "Alpha.example."])).unwrap();
        assert!(!c.single_zone_fields && c.only_zone().is_none());
        let names: Vec<&str> = c.zones.iter().map(|z| z.name.as_str()).collect();
        // RFC 4034 6.1: compared label by label from the right, case ignored.
        assert_eq!(names, ["2.0.192.in-addr.arpa.", "Alpha.example.", "example.test."]);
        assert_eq!(c.zone(2).unwrap().tsig_keys, vec![PathBuf::from("zones/example.test/tsig.key")]);
        // The order is the file's no matter how the tables are listed.
        let again = parse(&with_zones(&["Alpha.example.", "example.test.", "2.0.192.in-addr.arpa."])).unwrap();
        assert_eq!(again.zones, c.zones);
    }

    #[test]
    fn zone_sets_one_named_cannot_serve_are_refused() {
        let cases = [
            (with_zones(&["example.test.", "EXAMPLE.test"]), "zone[1].name", "given twice"),
            (with_zones(&["example.test.", "sub.example.test."]), "zone[1].name", "inside zone example.test."),
            (with_zones(&["sub.example.test.", "example.test."]), "zone[1].name", "sub.example.test. is inside zone example.test."),
            (with_zones(&["example.test.", "*.wild.test."]), "zone[1].name", "letters, digits"),
            (with_zones(&["example.test.", "."]), "zone[1].name", "letters, digits"),
            (
                with_zones(&["example.test.", "other.test."]).replace("[replica]", "[replica]\nkey_share = \"share.json\""),
                "replica.key_share",
                "single-zone field",
            ),
            (with_zones(&["example.test."]).replacen("tsig_keys = [\"zones/example.test/tsig.key\"]\n", "", 1), "zone[0].tsig_keys", "at least one TSIG"),
            (with_zones(&["example.test."]) + "update_policy = [\"grant k self . A\"]\n", "zone[0].update_policy", "not supported"),
            (with_zones(&["example.test."]) + "algorithm = 13\n", "zone[0].algorithm", "not an RSA"),
        ];
        for (text, field, why) in cases {
            let e = parse(&text).unwrap_err();
            match &e {
                ConfigError::Invalid { field: f, problem, .. } => assert!(f == field && problem.contains(why), "{field}/{why}: {e}"),
                ConfigError::Parse { message, .. } => assert!(field.is_empty() && message.contains(why), "{why}: {e}"),
                other => panic!("{other:?}"),
            }
        }
        // A zone beside its sibling, and a one-label difference that is not containment.
        parse(&with_zones(&["example.test.", "xexample.test."])).unwrap();
    }

    #[test]
    fn byzantine_modes_only_in_test_clusters() {
        let text = sample(4).replace("state_dir", "byzantine = \"crash-after-5\"\nstate_dir");
        let test = text.replace("public_key = \"zone.pub.json\"", "public_key = \"zone.pub.json\"\ntest_cluster = true");
        let c = parse(&test).unwrap();
        assert_eq!(c.replica.byzantine, Some(crate::byzantine::Mode::CrashAfter(5)));
        let e = parse(&test.replace("crash-after-5", "evil")).unwrap_err();
        assert!(e.to_string().contains("evil"), "{e}");
        let hook = parse(&test.replace("state_dir", "test_fail_writes_naming = \"hang.example.test.\"\nstate_dir")).unwrap();
        assert_eq!(hook.replica.test_fail_writes_naming.as_deref(), Some("hang.example.test."));
    }

    #[test]
    fn relative_config_paths_resolve_to_absolute_ones() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("r0.toml");
        std::fs::write(&file, sample(4)).unwrap();
        let cwd = std::env::current_dir().unwrap();
        // Load through a path relative to the current directory, as `--dir .cluster` gives.
        let rel = pathdiff(&file, &cwd);
        let c = Config::load(&rel).unwrap();
        assert!(c.resolve(Path::new("state")).is_absolute(), "{:?}", c.resolve(Path::new("state")));
        assert_eq!(c.resolve(Path::new("r0.toml")).canonicalize().unwrap(), file.canonicalize().unwrap());
    }

    /// `to` relative to `from` (both absolute), with `..` as needed.
    fn pathdiff(to: &Path, from: &Path) -> PathBuf {
        let to: Vec<_> = to.components().collect();
        let from: Vec<_> = from.components().collect();
        let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
        let mut p = PathBuf::new();
        for _ in common..from.len() {
            p.push("..");
        }
        for c in &to[common..] {
            p.push(c);
        }
        p
    }

    #[test]
    fn unknown_and_mistyped_fields_are_parse_errors() {
        let e = parse(&sample(4).replace("[named]", "[named]\nbogus = 1")).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = parse(&sample(4).replace("port = 5501", "port = \"x\"")).unwrap_err();
        assert!(e.to_string().contains("port"), "{e}");
        let e = parse(&sample(4).replace("[cluster]", "[cluster]\nprotocol = \"fast\"")).unwrap_err();
        assert!(e.to_string().contains("protocol") || e.to_string().contains("fast"), "{e}");
    }
}
