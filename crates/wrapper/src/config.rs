//! The replica configuration file (TOML), and what a replica runs from.
//!
//! One file per replica. Paths are relative to the file's own directory, so a
//! replica directory written by `sdns keygen` can be moved as a whole.
//!
//! Two forms: [`Config`] is the file as written (serde; `sdns keygen` and `sdns adopt` write
//! it, tools read it back), and [`Settings`] is what a replica runs from, built once from it by
//! a constructor that checks every value (durations as `Duration`, paths absolute, defaults
//! filled in). Each component takes its own part of the settings (`settings.rs`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod settings;
pub use settings::{
    AuthSettings, CatalogSettings, ClientSettings, GatewayConfig, MaintenanceConfig, MetricsSettings, NamedSettings, OrderingSettings, ReadSettings, Settings,
    SigningConfig, SigningSettings, TestHooks, TransferConfig, ZoneSettings,
};

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
    pub access: exec::access::AccessSection,
    #[serde(default)]
    pub auth: AuthSection,
    #[serde(default)]
    pub rrl: crate::rrl::RrlConfig,
    #[serde(default)]
    pub order_limit: crate::rrl::OrderLimitConfig,
    /// The parent's DS watched to finish an adopted zone's rollover by itself.
    #[serde(default, skip_serializing_if = "crate::rollover::RolloverSection::is_default")]
    pub rollover: crate::rollover::RolloverSection,
    /// The zones served, one `[[zone]]` table each; once loaded, sorted by canonical name
    /// (the position is the zone index every replica derives alike). A file without
    /// `[[zone]]` tables is read as one zone from the single-zone fields of `[cluster]`,
    /// `[replica]`, `[named]` and `[auth]`, which [`Config::upgrade`] moves here.
    #[serde(rename = "zone", default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<ZoneSection>,
    /// The cluster's catalog zone (RFC 9432), listing its zones for secondaries that consume
    /// catalogs; none unless named here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<CatalogSection>,
}

/// `[catalog]`: a catalog zone (RFC 9432, version 2) every replica's named serves, listing
/// every zone of the cluster. Off unless given: its name is a contract with the consumers,
/// which must name it in their own configuration (README, "Secondaries").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogSection {
    /// The catalog's name, e.g. "catalog.sdns." (no zone of the cluster, nor above or below
    /// one). It is transferred with any zone's transfer keys, and NOTIFYed to every zone's
    /// secondaries.
    pub zone: String,
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
    /// `crate::reads::vouched`). Still linearizable; `false` orders every read.
    #[serde(default = "default_true")]
    pub vouched_reads: bool,
    /// How long a gateway waits at least for its peers' barriers once its own answer is in,
    /// before it orders the read instead. Under load it waits longer, following the waits of
    /// its recently vouched reads (`exec::vouch_core::VouchClock`), up to `vouch_timeout_max_ms`.
    #[serde(default = "default_vouch_timeout_ms")]
    pub vouch_timeout_ms: u64,
    /// The most a gateway ever waits for vouches, whatever its peers do (at least
    /// `vouch_timeout_ms`; equal to it: a fixed timeout).
    #[serde(default = "default_vouch_timeout_max_ms")]
    pub vouch_timeout_max_ms: u64,
    /// The cluster CA certificate (PEM) that signs every replica's certificate.
    pub ca_cert: PathBuf,
    /// Single-zone layout: the threshold public key (shoup-rsa format; threshold-ec's for algorithms 13 and 15).
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
    /// External secondaries (ADDRESS:PORT) every zone NOTIFYs after each change, unless its
    /// `[[zone]] also_notify` says otherwise. Every replica's named sends its own NOTIFY, so
    /// no single replica can withhold it (README, "Secondaries").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also_notify: Vec<SocketAddr>,
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
            also_notify: Vec::new(),
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
    /// The DNSSEC algorithm number of the zone key (8 = RSASHA256, 10 = RSASHA512, 13 =
    /// ECDSAP256SHA256, 15 = ED25519).
    #[serde(default = "default_algorithm")]
    pub algorithm: u8,
    /// The zone's threshold public key (shoup-rsa format; threshold-ec's for algorithms 13 and 15).
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
    /// External secondaries (ADDRESS:PORT) NOTIFYed after each change of this zone; absent:
    /// `[named] also_notify`, the cluster's default (`[]`: none for this zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub also_notify: Option<Vec<SocketAddr>>,
}

impl ZoneSection {
    /// The update-policy rules, parsed (`Settings::new` checks that they parse).
    pub fn policy_rules(&self) -> Option<Result<Vec<named_glue::conf::PolicyRule>, String>> {
        self.update_policy.as_ref().map(|rules| {
            rules.iter().map(|r| named_glue::conf::PolicyRule::parse(&r.split_whitespace().collect::<Vec<_>>()).map_err(|e| format!("{r:?}: {e}"))).collect()
        })
    }

    /// The apex as a domain name (`Settings::new` checks that it is one).
    pub fn apex(&self) -> hickory_proto::rr::Name {
        let mut apex = hickory_proto::rr::Name::from_ascii(&self.name).unwrap_or_else(|_| hickory_proto::rr::Name::root());
        apex.set_fqdn(true);
        apex
    }

    /// Where a cluster of several zones keeps this zone's files, in a replica directory
    /// and in named's: `zones/<name>` (`Settings::new` checks the name makes a plain path).
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
    pub mode: exec::auth::Mode,
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
            mode: exec::auth::Mode::default(),
            sig0_keys: Vec::new(),
            transfer_keys: Vec::new(),
            skip_precheck: false,
            sig0_max_validity_s: exec::auth::SIG0_MAX_VALIDITY_S,
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

/// Where the file gives the zone settings: the single-zone fields of `[cluster]`,
/// `[replica]`, `[named]` and `[auth]` (every directory dealt before several zones existed),
/// or `[[zone]]` tables. Messages name a zone's field where the file has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    SingleZone,
    ZoneTables,
}

impl Layout {
    /// How a message names field `field` of the zone at position `i`.
    pub fn zone_field(self, i: usize, field: &str) -> String {
        if self == Layout::ZoneTables {
            return format!("zone[{i}].{field}");
        }
        let section = match field {
            "name" => return "cluster.zone".into(),
            "algorithm" | "public_key" => "cluster",
            "key_share" => "replica",
            "zone_file" | "tsig_keys" | "update_policy" | "also_notify" => "named",
            _ => "auth",
        };
        format!("{section}.{field}")
    }
}

impl Config {
    /// The file as written (either layout); `path` only names it in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse { path: path.to_owned(), message: e.to_string() })
    }

    /// Which layout the file uses (before [`Config::upgrade`]).
    pub fn layout(&self) -> Layout {
        if self.zones.is_empty() {
            Layout::SingleZone
        } else {
            Layout::ZoneTables
        }
    }

    /// The one place the single-zone layout is read: its fields are moved (not copied) into
    /// one `[[zone]]` table, so one place holds each zone setting. Beside `[[zone]]` tables
    /// those fields are refused, so no setting is silently ignored. Returns the layout found.
    pub fn upgrade(&mut self, path: &Path) -> Result<Layout, ConfigError> {
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
            return Ok(Layout::ZoneTables);
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
            // `[named] also_notify` is the cluster's default, for one zone as for several.
            also_notify: None,
        });
        Ok(Layout::SingleZone)
    }

    /// The zone with this index (its position in canonical order, after `Config::load`).
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
}

/// Zones one cluster may serve (the zone index travels as a u16; named's start-up time and
/// the checkpoint's work grow with every zone): the execution core's bound, which zones added
/// at run time count against too.
pub const MAX_ZONES: usize = exec::state::MAX_ZONES;

#[cfg(test)]
mod tests;
