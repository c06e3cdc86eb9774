//! What a replica runs from: the file form ([`Config`]) checked and converted once.
//!
//! Every value here has passed its check, so the components take them as they are:
//! durations are `Duration`, counts that must not be zero are `NonZero*`, paths are
//! absolute (named changes into its own directory before it opens files), defaults are
//! filled in. Times the execution core agrees on stay whole seconds of agreed time
//! (`*_s`): they are part of the replicated state, not local timers. Each component
//! takes its own small part (`From<&Settings>`, or a method for a per-zone part).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::num::{NonZeroU16, NonZeroU32, NonZeroU64, NonZeroUsize};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hickory_proto::rr::Name;
use named_glue::conf::PolicyRule;

use super::{
    check_zone_set, zone_dir_name, AuthSection, CatalogSection, ClientSection, ClusterSection, Config, ConfigError, Layout, MetricsSection, NamedSection,
    OrderingSection, PeerSection, Protocol, ReadMode, SigningSection, ZoneSection, MAX_UDP_RECEIVE_BUFFER, MAX_ZONES,
};
use crate::byzantine::{Mode, SigningFault};
use crate::rrl::{OrderLimitConfig, RrlConfig};
use exec::access::AccessSection;

/// Secondaries one NOTIFY list may name (each gets one NOTIFY per change from every replica).
const MAX_NOTIFY_TARGETS: usize = 64;

/// A replica's configuration, checked.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The file it was read from (messages name it).
    pub path: PathBuf,
    /// Where the file gives the zone settings (messages name a zone's field there).
    pub layout: Layout,
    /// This replica's id, below `replicas`.
    pub id: u16,
    /// n.
    pub replicas: u16,
    /// t, with n >= 3t+1.
    pub faults: u16,
    pub protocol: Protocol,
    /// A cluster for tests and demonstrations (see [`TestHooks`]).
    pub test_cluster: bool,
    /// This replica's addresses.
    pub me: PeerSection,
    /// Every replica's addresses (this one's too), each id once.
    pub peers: Vec<PeerSection>,
    /// The cluster CA certificate, this replica's certificate and TLS key (PEM files).
    pub ca_cert: PathBuf,
    pub cert: PathBuf,
    pub tls_key: PathBuf,
    /// Runtime state: named's directory, the ordering's and executor's files, the sockets.
    pub state_dir: PathBuf,
    pub reads: ReadSettings,
    pub named: NamedSettings,
    /// The zones in canonical order: the position is the zone index.
    pub zones: Vec<ZoneSettings>,
    /// The catalog zone listing them (`[catalog]`), if any.
    pub catalog: Option<CatalogSettings>,
    pub ordering: OrderingSettings,
    pub signing: SigningSettings,
    pub client: ClientSettings,
    pub metrics: MetricsSettings,
    pub access: AccessSection,
    pub auth: AuthSettings,
    pub rrl: RrlConfig,
    pub order_limit: OrderLimitConfig,
    pub rollover: crate::rollover::RolloverSection,
    pub test: TestHooks,
}

/// How reads are answered.
#[derive(Clone, Debug)]
pub struct ReadSettings {
    pub mode: ReadMode,
    /// `cluster.vouched_reads`: whether this gateway tries vouched reads in ordered mode.
    pub vouched_reads: bool,
    /// How long a gateway waits for its peers' vouches: at least the start, at most the end.
    pub vouch_timeout: RangeInclusive<Duration>,
}

impl ReadSettings {
    /// Whether this gateway answers plain queries by vouches (ordered mode only).
    pub fn vouched(&self) -> bool {
        self.mode == ReadMode::Ordered && self.vouched_reads
    }

    /// Whether this gateway answers reads from its own named without ordering them.
    pub fn local(&self) -> bool {
        self.mode == ReadMode::Local
    }
}

#[derive(Clone, Debug)]
pub struct NamedSettings {
    /// The patched BIND build.
    pub bind_dir: PathBuf,
    /// The private loopback port named listens on.
    pub port: NonZeroU16,
    /// named's sig-validity-interval.
    pub signature_validity_days: u32,
    /// The secondaries a zone NOTIFYs unless it names its own (`[named] also_notify`).
    pub also_notify: Vec<SocketAddr>,
}

/// One zone, its paths absolute and its policy parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneSettings {
    /// The apex as the file gives it (messages and snapshots name the zone by it).
    pub name: String,
    pub apex: Name,
    pub algorithm: u8,
    pub public_key: PathBuf,
    pub key_share: PathBuf,
    pub zone_file: PathBuf,
    pub tsig_keys: Vec<PathBuf>,
    /// The update-policy rules (first match wins); `None`: every update key may update the
    /// whole zone.
    pub update_policy: Option<Vec<PolicyRule>>,
    pub sig0_keys: Vec<PathBuf>,
    pub transfer_keys: Vec<PathBuf>,
    /// The external secondaries this zone NOTIFYs: its own list, else the cluster's default.
    pub also_notify: Vec<SocketAddr>,
}

impl ZoneSettings {
    /// `zones/<name>`: the zone's directory in a cluster of several zones.
    pub fn dir_name(&self) -> String {
        zone_dir_name(&self.name)
    }
}

/// The catalog zone (RFC 9432): no zone index, no key, no updates; its data follows from
/// the zone set alone (`crate::catalog`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogSettings {
    /// The name as the file gives it.
    pub name: String,
    pub apex: Name,
    /// Every zone's NOTIFY targets, each once, in zone order: whoever secondaries a zone
    /// learns of the catalog's changes too.
    pub also_notify: Vec<SocketAddr>,
    /// Every zone's transfer key files, each once: a consumer transfers the catalog with
    /// the key it transfers the zones with.
    pub transfer_keys: Vec<PathBuf>,
}

/// The ordering's settings (`bft::Config` is built from them).
#[derive(Clone, Debug)]
pub struct OrderingSettings {
    pub batch_max_requests: NonZeroUsize,
    pub batch_delay: Duration,
    pub checkpoint_interval: NonZeroU64,
    pub request_timeout: Duration,
    pub min_request_timeout: Duration,
    pub view_change_timeout: Duration,
    pub max_clock_skew: Duration,
    pub retained_batches: u64,
    pub max_snapshot_bytes: NonZeroUsize,
    pub max_origin_bytes_per_sec: usize,
    pub min_request_charge: usize,
}

/// Signing and re-signing. The `*_s` values are agreed time, counted by the execution core.
#[derive(Clone, Debug)]
pub struct SigningSettings {
    pub cache_entries: NonZeroUsize,
    /// Signature validity (s) for the agreed times.
    pub validity_s: u32,
    /// A signature this old (s) is signed again.
    pub resign_after_s: u64,
    pub resign_slice_interval_s: NonZeroU64,
    pub resign_slice_rrsets: NonZeroU32,
    pub sign_zone_interval_s: u64,
    pub sign_zone_window_s: NonZeroU64,
    /// dnssec-signzone's threads; `None`: as many as the signing pool computes at once (the
    /// signing driver knows that number).
    pub zone_signer_threads: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct ClientSettings {
    pub tcp_idle_timeout: Duration,
    pub tcp_max_connections: NonZeroUsize,
    pub max_pending: NonZeroUsize,
    pub request_timeout: Duration,
    pub tcp_max_pipelined: NonZeroUsize,
    pub tcp_write_timeout: Duration,
    pub udp_receive_buffer: usize,
}

#[derive(Clone, Debug)]
pub struct MetricsSettings {
    pub listen: Option<SocketAddr>,
    /// How long without progress makes this replica report itself stalled.
    pub stall_after: Duration,
}

#[derive(Clone, Debug)]
pub struct AuthSettings {
    pub mode: exec::auth::Mode,
    pub skip_precheck: bool,
    pub sig0_max_validity_s: u64,
}

/// Fault injection; each is refused unless `cluster.test_cluster`.
#[derive(Clone, Debug, Default)]
pub struct TestHooks {
    pub byzantine: Option<Mode>,
    /// Invert every bit of this replica's signature shares (`replica.corrupt_shares`).
    pub corrupt_shares: bool,
    /// Ordered writes with a record of this owner name never reach named.
    pub fail_writes_naming: Option<Name>,
}

/// A check's failure, naming the file and the field.
struct Check<'a> {
    path: &'a Path,
    layout: Layout,
}

impl Check<'_> {
    fn bad(&self, field: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { path: self.path.to_owned(), field: field.to_owned(), problem: problem.into() }
    }
}

fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_owned()
    } else {
        base.join(p)
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl Config {
    /// A replica's file as tools read it back (`sdns update --config`, keygen's tests): checked
    /// as [`Settings::load`] checks it, then the file form with its layout upgraded and its
    /// zones in canonical order (paths as written). Here rather than beside the file form so
    /// that the file form does not depend on the runtime form.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let (text, base) = read(path)?;
        let mut config = Config::from_toml(&text, path)?;
        Settings::new(config.clone(), path, &base)?;
        config.upgrade(path)?;
        config.zones.sort_by_key(ZoneSection::apex);
        Ok(config)
    }
}

/// A file's text, and the directory its relative paths are resolved against: absolute,
/// because named changes into its own directory before opening files.
fn read(path: &Path) -> Result<(String, PathBuf), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    let absolute = std::path::absolute(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    Ok((text, absolute.parent().map(Path::to_owned).unwrap_or_default()))
}

impl Settings {
    /// Reads, checks and converts a replica's file.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        let (text, base) = read(path)?;
        Settings::parse(&text, path, &base)
    }

    /// [`Settings::new`] of a file's text; `path` names it in errors, relative paths are
    /// resolved against `base_dir`.
    pub fn parse(text: &str, path: &Path, base_dir: &Path) -> Result<Settings, ConfigError> {
        Settings::new(Config::from_toml(text, path)?, path, base_dir)
    }

    /// The validating constructor: the file form, either layout, checked field by field (an
    /// error names the first bad field and why) and converted.
    pub fn new(mut file: Config, path: &Path, base_dir: &Path) -> Result<Settings, ConfigError> {
        let layout = file.upgrade(path)?;
        let check = Check { path, layout };
        let (replicas, faults) = check.cluster(&file.cluster)?;
        let zones = check.zones(&file.zones, file.auth.mode, &file.named.also_notify, base_dir)?;
        let catalog = check.catalog(file.catalog.as_ref(), &zones)?;
        let test = check.test_hooks(&file)?;
        let reads = check.reads(&file.cluster)?;
        let (me, peers) = check.peers(file.replica.id, replicas, &file.peers)?;
        let named = check.named(&file.named, base_dir)?;
        check.secondaries(&file, &peers)?;
        let ordering = check.ordering(&file.ordering)?;
        let metrics = check.metrics(&file.metrics, &file.client)?;
        let signing = check.signing(&file.signing, &named)?;
        file.rrl.validate().map_err(|e| check.bad("rrl", e))?;
        file.order_limit.validate().map_err(|e| check.bad("order_limit", e))?;
        file.rollover.validate().map_err(|e| check.bad("rollover", e))?;
        let auth = check.auth(&file.auth)?;
        let client = check.client(&file.client)?;
        Ok(Settings {
            path: path.to_owned(),
            layout,
            id: file.replica.id,
            replicas,
            faults,
            protocol: file.cluster.protocol,
            test_cluster: file.cluster.test_cluster,
            me,
            peers,
            ca_cert: resolve(base_dir, &file.cluster.ca_cert),
            cert: resolve(base_dir, &file.replica.cert),
            tls_key: resolve(base_dir, &file.replica.tls_key),
            state_dir: resolve(base_dir, &file.replica.state_dir),
            reads,
            named,
            zones,
            catalog,
            ordering,
            signing,
            client,
            metrics,
            access: file.access,
            auth,
            rrl: file.rrl,
            order_limit: file.order_limit,
            rollover: file.rollover,
            test,
        })
    }

    /// How messages name a zone's field: where the file has it.
    pub fn field_of(&self, zone: &ZoneSettings, field: &str) -> String {
        match self.layout {
            Layout::SingleZone => self.layout.zone_field(0, field),
            Layout::ZoneTables => format!("[[zone]] {}: {field}", zone.name),
        }
    }

    /// The one zone of a single-zone cluster; `None` with several.
    pub fn only_zone(&self) -> Option<&ZoneSettings> {
        match self.zones.as_slice() {
            [z] => Some(z),
            _ => None,
        }
    }

    /// The other replicas' ids.
    pub fn other_ids(&self) -> Vec<u16> {
        self.peers.iter().map(|p| p.id).filter(|p| *p != self.id).collect()
    }

    /// named's directory: its configuration, key files and (one zone) zone files.
    pub fn named_dir(&self) -> PathBuf {
        self.state_dir.join("named")
    }

    /// Zone `index`'s whole-zone operations. One zone keeps the layout of every earlier
    /// state directory (work files in named's directory, resign.pending in the state
    /// directory); several get a directory each.
    pub fn maintenance(&self, index: usize) -> Option<MaintenanceConfig> {
        let zone = self.zones.get(index)?;
        let named_dir = self.named_dir();
        let (work_dir, slice_journal) = if self.zones.len() > 1 {
            let dir = named_dir.join(zone.dir_name());
            (dir.clone(), dir.join("resign.pending"))
        } else {
            (named_dir, self.state_dir.join("resign.pending"))
        };
        Some(MaintenanceConfig { zone: zone.apex.clone(), work_dir, slice_journal, signer_threads: self.signing.zone_signer_threads })
    }
}

impl Check<'_> {
    /// n and t.
    fn cluster(&self, c: &ClusterSection) -> Result<(u16, u16), ConfigError> {
        let n = c.replicas;
        if n == 0 {
            return Err(self.bad("cluster.replicas", "must be at least 1"));
        }
        let t = c.faults.unwrap_or(n.saturating_sub(1) / 3);
        if u32::from(n) < 3 * u32::from(t) + 1 {
            return Err(self.bad("cluster.faults", format!("{t} faults need at least {} replicas, have {n}", 3 * u32::from(t) + 1)));
        }
        Ok((n, t))
    }

    /// Each zone well formed, and the set of zones one named can serve side by side; in
    /// canonical order (the zone index every replica derives alike, whatever the file's order).
    fn zones(&self, zones: &[ZoneSection], mode: exec::auth::Mode, default_notify: &[SocketAddr], base: &Path) -> Result<Vec<ZoneSettings>, ConfigError> {
        if zones.len() > MAX_ZONES {
            return Err(self.bad("zone", format!("{} zones; at most {MAX_ZONES}", zones.len())));
        }
        let names: Vec<&str> = zones.iter().map(|z| z.name.as_str()).collect();
        check_zone_set(&names).map_err(|(i, why)| self.bad(&self.layout.zone_field(i, "name"), why))?;
        let mut out = Vec::with_capacity(zones.len());
        for (i, z) in zones.iter().enumerate() {
            let field = |f: &str| self.layout.zone_field(i, f);
            if ![5, 7, 8, 10, 13, 15].contains(&z.algorithm) {
                return Err(self.bad(
                    &field("algorithm"),
                    format!("{} is not a DNSSEC algorithm sdns signs with (RSA: 5, 7, 8, 10; ECDSA P-256: 13; Ed25519: 15)", z.algorithm),
                ));
            }
            if mode != exec::auth::Mode::Tsig && z.sig0_keys.is_empty() {
                return Err(self.bad(&field("sig0_keys"), format!("mode \"{}\" needs at least one SIG(0) key file", mode.as_str())));
            }
            if mode != exec::auth::Mode::Sig0 && z.tsig_keys.is_empty() {
                return Err(self.bad(&field("tsig_keys"), format!("auth.mode \"{}\" needs at least one TSIG key file", mode.as_str())));
            }
            let update_policy = z.policy_rules().transpose().map_err(|e| self.bad(&field("update_policy"), e))?;
            let paths = |ps: &[PathBuf]| ps.iter().map(|p| resolve(base, p)).collect::<Vec<_>>();
            out.push(ZoneSettings {
                name: z.name.clone(),
                apex: z.apex(),
                algorithm: z.algorithm,
                public_key: resolve(base, &z.public_key),
                key_share: resolve(base, &z.key_share),
                zone_file: resolve(base, &z.zone_file),
                tsig_keys: paths(&z.tsig_keys),
                update_policy,
                sig0_keys: paths(&z.sig0_keys),
                transfer_keys: paths(&z.transfer_keys),
                also_notify: z.also_notify.clone().unwrap_or_else(|| default_notify.to_vec()),
            });
        }
        out.sort_by(|a, b| a.apex.cmp(&b.apex));
        Ok(out)
    }

    /// `[catalog]`: a name that one named can serve beside the zones (no zone's, none above
    /// or below one), with the zones' NOTIFY targets and transfer keys.
    fn catalog(&self, c: Option<&CatalogSection>, zones: &[ZoneSettings]) -> Result<Option<CatalogSettings>, ConfigError> {
        let Some(c) = c else { return Ok(None) };
        let mut names: Vec<&str> = zones.iter().map(|z| z.name.as_str()).collect();
        names.push(&c.zone);
        check_zone_set(&names).map_err(|(_, why)| self.bad("catalog.zone", why))?;
        let mut apex = Name::from_ascii(&c.zone).map_err(|e| self.bad("catalog.zone", format!("{:?}: {e}", c.zone)))?;
        apex.set_fqdn(true);
        let mut also_notify: Vec<SocketAddr> = Vec::new();
        let mut transfer_keys: Vec<PathBuf> = Vec::new();
        for z in zones {
            for t in &z.also_notify {
                if !also_notify.contains(t) {
                    also_notify.push(*t);
                }
            }
            for k in &z.transfer_keys {
                if !transfer_keys.contains(k) {
                    transfer_keys.push(k.clone());
                }
            }
        }
        if also_notify.len() > MAX_NOTIFY_TARGETS {
            return Err(self.bad("catalog.zone", format!("its zones NOTIFY {} secondaries together; at most {MAX_NOTIFY_TARGETS}", also_notify.len())));
        }
        Ok(Some(CatalogSettings { name: c.zone.clone(), apex, also_notify, transfer_keys }))
    }

    fn test_hooks(&self, file: &Config) -> Result<TestHooks, ConfigError> {
        let r = &file.replica;
        if !file.cluster.test_cluster {
            let refused = "is fault injection; refused unless cluster.test_cluster = true";
            if let Some(mode) = r.byzantine {
                return Err(self.bad("replica.byzantine", format!("\"{mode}\" {refused}")));
            }
            if r.corrupt_shares {
                return Err(self.bad("replica.corrupt_shares", refused));
            }
            if r.test_fail_writes_naming.is_some() {
                return Err(self.bad("replica.test_fail_writes_naming", refused));
            }
        }
        let fail_writes_naming = match &r.test_fail_writes_naming {
            Some(name) => Some(Name::from_ascii(name).map_err(|e| self.bad("replica.test_fail_writes_naming", format!("{name:?}: {e}")))?),
            None => None,
        };
        Ok(TestHooks { byzantine: r.byzantine, corrupt_shares: r.corrupt_shares, fail_writes_naming })
    }

    fn reads(&self, c: &ClusterSection) -> Result<ReadSettings, ConfigError> {
        if c.vouch_timeout_ms == 0 || c.vouch_timeout_ms > 10_000 {
            return Err(self.bad("cluster.vouch_timeout_ms", format!("{} is outside 1..=10000", c.vouch_timeout_ms)));
        }
        if !(c.vouch_timeout_ms..=10_000).contains(&c.vouch_timeout_max_ms) {
            return Err(self.bad(
                "cluster.vouch_timeout_max_ms",
                format!("{} is outside cluster.vouch_timeout_ms..=10000 ({}..=10000)", c.vouch_timeout_max_ms, c.vouch_timeout_ms),
            ));
        }
        Ok(ReadSettings { mode: c.reads, vouched_reads: c.vouched_reads, vouch_timeout: ms(c.vouch_timeout_ms)..=ms(c.vouch_timeout_max_ms) })
    }

    /// This replica's entry and every replica's: ids 0..n each once, no address twice.
    fn peers(&self, id: u16, n: u16, peers: &[PeerSection]) -> Result<(PeerSection, Vec<PeerSection>), ConfigError> {
        if id >= n {
            return Err(self.bad("replica.id", format!("{id} is not below cluster.replicas = {n}")));
        }
        if peers.len() != usize::from(n) {
            return Err(self.bad("peer", format!("{} [[peer]] entries for {n} replicas", peers.len())));
        }
        let ids: BTreeSet<u16> = peers.iter().map(|p| p.id).collect();
        if ids.len() != peers.len() || ids.iter().any(|&i| i >= n) {
            return Err(self.bad("peer.id", format!("ids must be 0..{} each once, got {:?}", n, peers.iter().map(|p| p.id).collect::<Vec<_>>())));
        }
        let mut addrs = BTreeSet::new();
        for p in peers {
            for a in [p.client, p.peer] {
                if !addrs.insert(a) {
                    return Err(self.bad("peer", format!("address {a} is used twice")));
                }
            }
        }
        let me = peers.iter().find(|p| p.id == id).cloned().ok_or_else(|| self.bad("peer.id", format!("no [[peer]] entry for replica {id}")))?;
        Ok((me, peers.to_vec()))
    }

    fn named(&self, n: &NamedSection, base: &Path) -> Result<NamedSettings, ConfigError> {
        let port = NonZeroU16::new(n.port).ok_or_else(|| self.bad("named.port", "must not be 0"))?;
        if !(8..=3660).contains(&n.signature_validity_days) {
            return Err(
                self.bad("named.signature_validity_days", format!("{} is outside 8..=3660 (named's sig-validity-interval range)", n.signature_validity_days))
            );
        }
        Ok(NamedSettings { bind_dir: resolve(base, &n.bind_dir), port, signature_validity_days: n.signature_validity_days, also_notify: n.also_notify.clone() })
    }

    /// Every NOTIFY target list (the cluster's default and each zone's own): addresses a
    /// NOTIFY can go to, each once, none of them a replica's (the replicas' named do not
    /// notify one another: each is a primary of the zone).
    fn secondaries(&self, file: &Config, peers: &[PeerSection]) -> Result<(), ConfigError> {
        let lists = std::iter::once(("named.also_notify".to_string(), file.named.also_notify.as_slice()))
            .chain(file.zones.iter().enumerate().filter_map(|(i, z)| Some((self.layout.zone_field(i, "also_notify"), z.also_notify.as_deref()?))));
        for (field, targets) in lists {
            if targets.len() > MAX_NOTIFY_TARGETS {
                return Err(self.bad(&field, format!("{} secondaries; at most {MAX_NOTIFY_TARGETS}", targets.len())));
            }
            for (k, t) in targets.iter().enumerate() {
                let ip = t.ip();
                if t.port() == 0 || ip.is_unspecified() || ip.is_multicast() || ip == std::net::IpAddr::V4(std::net::Ipv4Addr::BROADCAST) {
                    return Err(self.bad(&field, format!("{t} is not an address a NOTIFY can be sent to")));
                }
                if targets[..k].contains(t) {
                    return Err(self.bad(&field, format!("{t} is given twice")));
                }
                if let Some(p) = peers.iter().find(|p| p.client == *t || p.peer == *t) {
                    return Err(self.bad(&field, format!("{t} is replica {}'s own address: the replicas are primaries, not secondaries", p.id)));
                }
            }
        }
        Ok(())
    }

    fn ordering(&self, o: &OrderingSection) -> Result<OrderingSettings, ConfigError> {
        let batch_max_requests = NonZeroUsize::new(o.batch_max_requests).ok_or_else(|| self.bad("ordering.batch_max_requests", "must be at least 1"))?;
        let checkpoint_interval = NonZeroU64::new(o.checkpoint_interval).ok_or_else(|| self.bad("ordering.checkpoint_interval", "must be at least 1"))?;
        let max_snapshot_bytes = NonZeroUsize::new(o.max_snapshot_bytes).ok_or_else(|| self.bad("ordering.max_snapshot_bytes", "must be positive"))?;
        if o.view_change_timeout_ms == 0 || o.request_timeout_ms == 0 || o.min_request_timeout_ms == 0 {
            return Err(self.bad("ordering", "timeouts must be positive"));
        }
        Ok(OrderingSettings {
            batch_max_requests,
            batch_delay: ms(o.batch_delay_ms),
            checkpoint_interval,
            request_timeout: ms(o.request_timeout_ms),
            min_request_timeout: ms(o.min_request_timeout_ms),
            view_change_timeout: ms(o.view_change_timeout_ms),
            max_clock_skew: ms(o.max_clock_skew_ms),
            retained_batches: o.retained_batches,
            max_snapshot_bytes,
            max_origin_bytes_per_sec: o.max_origin_bytes_per_sec,
            min_request_charge: o.min_request_charge,
        })
    }

    /// The stall bound: twice the client timeout unless given (far above what a view change
    /// or a busy executor takes); 0 would make every replica stalled.
    fn metrics(&self, m: &MetricsSection, client: &ClientSection) -> Result<MetricsSettings, ConfigError> {
        if m.stall_after_ms == Some(0) {
            return Err(self.bad("metrics.stall_after_ms", "must be positive (every replica would be stalled)"));
        }
        let stall_after = ms(m.stall_after_ms.unwrap_or(client.request_timeout_ms.saturating_mul(2)));
        Ok(MetricsSettings { listen: m.listen, stall_after })
    }

    fn signing(&self, s: &SigningSection, named: &NamedSettings) -> Result<SigningSettings, ConfigError> {
        let named_validity_s = named.signature_validity_days.saturating_mul(86_400);
        if let Some(v) = s.validity_s {
            if v < 60 || v > named_validity_s {
                return Err(self.bad("signing.validity_s", format!("{v} must be at least 60 and at most named.signature_validity_days")));
            }
        }
        let validity_s = s.validity_s.unwrap_or(named_validity_s);
        if let Some(threads) = s.zone_signer_threads {
            if !(1..=named_glue::signzone::MAX_THREADS).contains(&threads) {
                return Err(self.bad("signing.zone_signer_threads", format!("{threads} is outside 1..={}", named_glue::signzone::MAX_THREADS)));
            }
        }
        let slice = "the slice interval and slice size must be at least 1";
        let resign_slice_interval_s = NonZeroU64::new(s.resign_slice_interval_s).ok_or_else(|| self.bad("signing.resign_slice_interval_s", slice))?;
        let resign_slice_rrsets = NonZeroU32::new(s.resign_slice_rrsets).ok_or_else(|| self.bad("signing.resign_slice_interval_s", slice))?;
        if let Some(r) = s.resign_after_s {
            let validity = u64::from(validity_s);
            if r == 0 || r >= validity {
                return Err(self.bad("signing.resign_after_s", format!("{r} must be above 0 and below the signature validity ({validity} s)")));
            }
        }
        let sign_zone_window_s = NonZeroU64::new(s.sign_zone_window_s).ok_or_else(|| self.bad("signing.sign_zone_window_s", "must be at least 1"))?;
        let cache_entries = NonZeroUsize::new(s.cache_entries).ok_or_else(|| self.bad("signing.cache_entries", "must be at least 1"))?;
        Ok(SigningSettings {
            cache_entries,
            validity_s,
            resign_after_s: s.resign_after_s.unwrap_or(u64::from(validity_s) / 2),
            resign_slice_interval_s,
            resign_slice_rrsets,
            sign_zone_interval_s: s.sign_zone_interval_s,
            sign_zone_window_s,
            zone_signer_threads: s.zone_signer_threads,
        })
    }

    fn auth(&self, a: &AuthSection) -> Result<AuthSettings, ConfigError> {
        // At least nsupdate's 10 minutes; at most a day (each is remembered until it expires).
        if !(600..=86_400).contains(&a.sig0_max_validity_s) {
            return Err(self.bad("auth.sig0_max_validity_s", format!("{} s is outside 600..=86400", a.sig0_max_validity_s)));
        }
        Ok(AuthSettings { mode: a.mode, skip_precheck: a.skip_precheck, sig0_max_validity_s: a.sig0_max_validity_s })
    }

    fn client(&self, c: &ClientSection) -> Result<ClientSettings, ConfigError> {
        let positive = |v: usize| NonZeroUsize::new(v).ok_or_else(|| self.bad("client", "limits must be positive"));
        let (max_pending, tcp_max_connections, tcp_max_pipelined) =
            (positive(c.max_pending)?, positive(c.tcp_max_connections)?, positive(c.tcp_max_pipelined)?);
        if c.tcp_write_timeout_ms == 0 {
            return Err(self.bad("client", "limits must be positive"));
        }
        // setsockopt takes an int; a larger ask would wrap to a tiny buffer.
        if c.udp_receive_buffer > MAX_UDP_RECEIVE_BUFFER {
            return Err(
                self.bad("client.udp_receive_buffer", format!("{} bytes is above the largest allowed ({MAX_UDP_RECEIVE_BUFFER}, 1 GiB)", c.udp_receive_buffer))
            );
        }
        Ok(ClientSettings {
            tcp_idle_timeout: ms(c.tcp_idle_timeout_ms),
            tcp_max_connections,
            max_pending,
            request_timeout: ms(c.request_timeout_ms),
            tcp_max_pipelined,
            tcp_write_timeout: ms(c.tcp_write_timeout_ms),
            udp_receive_buffer: c.udp_receive_buffer,
        })
    }
}

// Each component's part.

/// The ordering: every field the file sets, the rest `bft::Config`'s defaults.
impl From<&Settings> for bft::Config {
    fn from(s: &Settings) -> bft::Config {
        let o = &s.ordering;
        let mut c = bft::Config::new(s.replicas, s.id);
        c.f = s.faults;
        c.batch_max_requests = o.batch_max_requests.get();
        c.batch_delay = o.batch_delay;
        c.checkpoint_interval = o.checkpoint_interval.get();
        c.watermark_window = o.checkpoint_interval.get().saturating_mul(4);
        c.request_timeout = o.request_timeout;
        c.min_request_timeout = o.min_request_timeout;
        c.view_change_timeout = o.view_change_timeout;
        c.max_clock_skew = o.max_clock_skew;
        c.retained_batches = o.retained_batches;
        c.max_origin_bytes_per_sec = o.max_origin_bytes_per_sec;
        c.min_request_charge = o.min_request_charge;
        c
    }
}

/// One zone's whole-zone operations (`crate::zone::ZoneMaintenance`), from
/// [`Settings::maintenance`].
#[derive(Clone, Debug)]
pub struct MaintenanceConfig {
    pub zone: Name,
    /// Where the zone's working files (base text, signed output) go.
    pub work_dir: PathBuf,
    /// The last re-signing slice's UPDATE, kept for a crash.
    pub slice_journal: PathBuf,
    /// `signing.zone_signer_threads`; `None`: the signing driver's default.
    pub signer_threads: Option<usize>,
}

/// The threshold signing service and the sockets named asks it on.
#[derive(Clone, Debug)]
pub struct SigningConfig {
    pub id: u16,
    pub replicas: u16,
    pub protocol: threshold::Protocol,
    /// The paper's fault injection (`replica.corrupt_shares`, or the Byzantine mode).
    pub corrupt_shares: bool,
    pub fault: SigningFault,
    pub limits: crate::signing::SignerLimits,
    /// The socket of the signatures named makes for ordered writes and re-signing.
    pub socket: PathBuf,
    /// Each zone's socket for background whole-zone signings (zone 0 keeps the socket name
    /// of a single-zone replica).
    pub background_sockets: Vec<PathBuf>,
}

impl SigningConfig {
    /// Zone `index`'s socket for background whole-zone signings (zone 0 keeps the socket
    /// name of a single-zone replica), beside the signing socket.
    pub fn background_socket(&self, index: u16) -> PathBuf {
        let name = if index == 0 { "signzone.sock".to_string() } else { format!("signzone-{index}.sock") };
        self.socket.with_file_name(name)
    }
}

impl From<&Settings> for SigningConfig {
    fn from(s: &Settings) -> SigningConfig {
        let byzantine = s.test.byzantine;
        let background = |index: usize| if index == 0 { s.state_dir.join("signzone.sock") } else { s.state_dir.join(format!("signzone-{index}.sock")) };
        SigningConfig {
            id: s.id,
            replicas: s.replicas,
            protocol: s.protocol.into(),
            corrupt_shares: s.test.corrupt_shares || byzantine == Some(Mode::CorruptShares),
            fault: byzantine.map_or(SigningFault::None, Mode::signing),
            limits: crate::signing::SignerLimits { finals_cache: s.signing.cache_entries.get(), ..Default::default() },
            socket: s.state_dir.join("signer.sock"),
            background_sockets: (0..s.zones.len()).map(background).collect(),
        }
    }
}

/// State transfer: where snapshots are kept, whom they are fetched from, how big one may be.
#[derive(Clone, Debug)]
pub struct TransferConfig {
    pub id: u16,
    pub peers: Vec<u16>,
    pub snapshot_dir: PathBuf,
    pub max_snapshot_bytes: usize,
    /// The zones in index order: a snapshot of other zones is refused.
    pub zones: Vec<String>,
}

impl From<&Settings> for TransferConfig {
    fn from(s: &Settings) -> TransferConfig {
        TransferConfig {
            id: s.id,
            peers: s.other_ids(),
            snapshot_dir: s.state_dir.join("snapshots"),
            max_snapshot_bytes: s.ordering.max_snapshot_bytes.get(),
            zones: s.zones.iter().map(|z| z.name.clone()).collect(),
        }
    }
}

/// The gateway and the client listeners in front of it.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    pub id: u16,
    /// Where clients reach this replica (UDP and TCP).
    pub client: SocketAddr,
    /// Client requests awaiting an answer at once (and the queues in front of the gateway).
    pub max_pending: usize,
    /// A client request not answered in this time is dropped.
    pub client_timeout: Duration,
    pub udp_receive_buffer: usize,
    pub tcp_idle: Duration,
    pub tcp_max_connections: usize,
    pub tcp_max_pipelined: usize,
    pub tcp_write_timeout: Duration,
}

impl From<&Settings> for GatewayConfig {
    fn from(s: &Settings) -> GatewayConfig {
        let c = &s.client;
        GatewayConfig {
            id: s.id,
            client: s.me.client,
            max_pending: c.max_pending.get(),
            client_timeout: c.request_timeout,
            udp_receive_buffer: c.udp_receive_buffer,
            tcp_idle: c.tcp_idle_timeout,
            tcp_max_connections: c.tcp_max_connections.get(),
            tcp_max_pipelined: c.tcp_max_pipelined.get(),
            tcp_write_timeout: c.tcp_write_timeout,
        }
    }
}
