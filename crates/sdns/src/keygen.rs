//! `sdns keygen`: the trusted dealer (the paper's Section 4.3).
//!
//! Writes, under the output directory:
//! - `replica-<i>/`: everything replica i needs and nothing another replica's secret:
//!   its key share and TLS key (0600), its certificate, the CA certificate, the public
//!   key, the TSIG key named checks updates with, the initial zone, and `replica.toml`;
//! - `tsig.key` (0600): the shared TSIG key, for `nsupdate -k` (it authorizes updates
//!   in the `tsig` and `both` update-authentication modes; every replica holds it);
//! - `transfer.key` (0600): the TSIG key zone transfers need (`dig -k transfer.key AXFR`);
//! - with `--update-auth sig0|both`: `K<sdns-update.zone>.+013+<tag>.key/.private`, the
//!   SIG(0) key pair from the BIND build's dnssec-keygen, for `nsupdate -k ....private`.
//!   The private half stays here (0600); replicas get the public KEY as `sig0.key`;
//! - `trust-anchor.conf` (for `delv -a`), `ds.txt` (for the parent zone), and BIND's
//!   `K<zone>+<alg>+<tag>.key`.
//!
//! With several zones (`--zone A --zone B`) every zone gets its own threshold key and its
//! own update keys: what is listed above per zone (key share, public key, zone file, TSIG
//! and SIG(0) update keys, DS, trust anchor) goes to `zones/<zone>/` in each directory, and
//! `replica.toml` describes the zones in `[[zone]]` tables; the CA, the TLS identities and
//! `transfer.key` are the cluster's.
//! The CA's private key is not kept: adding a replica means a new dealing.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use hickory_proto::rr::Name;
use mesh::pki::{generate_ca, issue_replica_cert};
use rand_chacha::rand_core::SeedableRng;

use exec::access::{AccessSection, Prefix};
use exec::auth::Mode;
use exec::auth::TsigKey;
use wrapper::config::{
    AuthSection, CatalogSection, ClusterSection, Config, MetricsSection, NamedSection, OrderingSection, PeerSection, Protocol, ReadMode, ReplicaSection,
    SigningSection, ZoneSection,
};
use wrapper::files::{is_ec_algorithm, ThresholdPublic, ThresholdShare};
use wrapper::rrl::RrlConfig;
use zeroize::Zeroizing;

use crate::files::{demo_zone, write_public, write_secret};

/// Where each replica listens. Defaults put a whole cluster on one host.
#[derive(Clone, Debug)]
pub struct Layout {
    /// One address per replica, or one for all.
    pub addresses: Vec<IpAddr>,
    pub client_port: u16,
    pub peer_port: u16,
    pub named_port: u16,
    pub metrics_port: u16,
}

impl Default for Layout {
    fn default() -> Self {
        Layout { addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)], client_port: 5301, peer_port: 5401, named_port: 5501, metrics_port: 5601 }
    }
}

impl Layout {
    /// With one shared address, replica i takes base port + i for every service.
    fn offset(&self, i: u16) -> u16 {
        if self.addresses.len() == 1 {
            i
        } else {
            0
        }
    }
    fn address(&self, i: u16) -> IpAddr {
        self.addresses.get(usize::from(i)).copied().unwrap_or(self.addresses[0])
    }
    pub fn client(&self, i: u16) -> SocketAddr {
        SocketAddr::new(self.address(i), self.client_port + self.offset(i))
    }
    pub fn peer(&self, i: u16) -> SocketAddr {
        SocketAddr::new(self.address(i), self.peer_port + self.offset(i))
    }
    pub fn named_port(&self, i: u16) -> u16 {
        self.named_port + self.offset(i)
    }
    pub fn metrics(&self, i: u16) -> SocketAddr {
        // Metrics and the admin route stay on loopback unless the operator says otherwise.
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.metrics_port + self.offset(i))
    }
}

#[derive(Clone, Debug)]
pub struct ClusterParams {
    /// The zones, at least one; only `keygen` deals several so far.
    pub zones: Vec<String>,
    pub replicas: u16,
    pub threshold: Option<u16>,
    pub bits: u32,
    pub algorithm: u8,
    pub protocol: Protocol,
    pub reads: ReadMode,
    pub corrupt: Vec<u16>,
    /// Replicas that misbehave, and how (fault injection; makes the cluster a test cluster).
    pub byzantine: Vec<(u16, wrapper::byzantine::Mode)>,
    /// Written as every replica's `replica.test_fail_writes_naming` (fault injection; makes
    /// the cluster a test cluster).
    pub fail_writes_naming: Option<String>,
    pub layout: Layout,
    pub bind_dir: PathBuf,
    /// Each zone's data, in the order of `zones` (none: a small demo zone each).
    pub zone_files: Vec<PathBuf>,
    /// Written as `[signing] resign_after_s` when set.
    pub resign_after_s: Option<u64>,
    /// Written as `[signing] sign_zone_interval_s` when set.
    pub sign_zone_interval_s: Option<u64>,
    /// Written as `[signing] validity_s`, `resign_slice_interval_s`, `resign_slice_rrsets` when set.
    pub validity_s: Option<u32>,
    pub resign_slice_interval_s: Option<u64>,
    pub resign_slice_rrsets: Option<u32>,
    /// Written as `[signing] zone_signer_threads` when set.
    pub zone_signer_threads: Option<usize>,
    /// Written as `[signing] cache_entries` when set.
    pub signature_cache_entries: Option<usize>,
    /// Which signatures authorize updates (`[auth] mode`).
    pub update_auth: Mode,
    /// Replicas that order updates without the pre-ordering check (fault injection).
    pub skip_precheck: Vec<u16>,
    /// `[rrl] responses_per_second` (0: off).
    pub rrl_responses_per_second: u32,
    /// Written as `[ordering] checkpoint_interval` and `retained_batches` when set (tests and
    /// soak runs shrink them so a short absence is already past the retained log).
    pub checkpoint_interval: Option<u64>,
    pub retained_batches: Option<u64>,
    /// A file of `FROM TO ADDRESS` lines: replica FROM dials replica TO at ADDRESS instead of
    /// TO's own peer address (a delaying proxy in front of it: emulated wide-area links,
    /// docs/LATENCY.md). Only the dialing side changes; every replica still listens on its own.
    pub peer_routes: Option<PathBuf>,
    /// Written as `[ordering] min_request_timeout_ms` when set: it must exceed the ordering
    /// latency of a cluster's first requests, which over wide-area links is far above the
    /// default 250 ms.
    pub min_request_timeout_ms: Option<u64>,
    /// External secondaries every zone NOTIFYs, written as `[named] also_notify`.
    pub also_notify: Vec<SocketAddr>,
    /// The catalog zone listing the zones, written as `[catalog] zone` when set.
    pub catalog_zone: Option<String>,
    /// Resolvers asked for the parent's DS during an adopted zone's rollover, written as
    /// `[rollover] parent_resolvers` (the finish then happens by itself).
    pub parent_resolvers: Vec<SocketAddr>,
    /// Written as `[rollover] poll_interval_s` when set.
    pub rollover_poll_s: Option<u64>,
}

impl ClusterParams {
    /// The zone (the first, where only one is dealt or served).
    pub fn zone(&self) -> &str {
        self.zones.first().map(String::as_str).unwrap_or_default()
    }

    /// Refuses several zones where only `sdns keygen` deals them yet.
    pub fn one_zone(&self, command: &str) -> Result<()> {
        if self.zones.len() != 1 {
            bail!("{command} takes one --zone; only `sdns keygen` deals several zones so far (docs/MULTIZONE.md)");
        }
        Ok(())
    }
}

/// The SIG(0) signer's name: a USER key under the zone.
pub fn sig0_signer(zone: &str) -> String {
    format!("sdns-update.{}.", zone.trim_end_matches('.'))
}

/// Makes the SIG(0) key pair with the BIND build's dnssec-keygen in `out` (the
/// operator's directory); returns the `.key` file's path. The `.private` is 0600.
fn sig0_keygen(bind_dir: &Path, zone: &str, out: &Path) -> Result<PathBuf> {
    let tools = named_glue::tools::BindTools::new(&std::path::absolute(bind_dir).unwrap_or_else(|_| bind_dir.to_owned()));
    let output = std::process::Command::new(tools.bin("dnssec-keygen"))
        .arg("-K")
        .arg(out)
        .args(["-q", "-T", "KEY", "-a", "ECDSAP256SHA256", "-n", "USER"])
        .arg(sig0_signer(zone))
        .output()
        .with_context(|| format!("running {}", tools.bin("dnssec-keygen").display()))?;
    if !output.status.success() {
        bail!("dnssec-keygen failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let stem = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if stem.is_empty() || stem.contains('/') {
        bail!("dnssec-keygen printed no key name");
    }
    let private = out.join(format!("{stem}.private"));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).with_context(|| format!("chmod {}", private.display()))?;
    Ok(out.join(format!("{stem}.key")))
}

pub fn replica_dir(out: &Path, i: u16) -> PathBuf {
    out.join(format!("replica-{i}"))
}

/// One zone as dealt: its threshold key and its update keys.
struct Dealt {
    /// The apex, absolute, as given.
    name: String,
    /// Its directory under each output directory: the top level with one zone,
    /// `zones/<zone>` with several.
    dir: PathBuf,
    public: ThresholdPublic,
    /// Replica i's share at index i.
    shares: Vec<ThresholdShare>,
    key: named_glue::keys::ZoneKey,
    tsig: TsigKey,
    sig0: Option<Vec<u8>>,
    data: String,
}

pub fn keygen(p: &ClusterParams, out: &Path) -> Result<()> {
    let k = checked_threshold(p, out)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no OS randomness: {e}"))?;
    let mut rng = rand_chacha::ChaCha20Rng::from_seed(seed);
    let dealt = p.zones.iter().enumerate().map(|(i, name)| deal_zone(p, out, k, i, name, &mut rng)).collect::<Result<Vec<Dealt>>>()?;
    let several = dealt.len() > 1;
    let ca = generate_ca(&format!("sdns {}{}", dealt[0].name, if several { " and more" } else { "" })).context("cluster CA")?;
    let transfer = TsigKey::generate("sdns-transfer").context("transfer TSIG key")?;

    // Operator-side files.
    write_secret(&out.join("transfer.key"), transfer.to_bind().as_bytes())?;
    for z in &dealt {
        write_operator_zone_files(p, out, z)?;
    }
    for i in 0..p.replicas {
        write_replica_files(out, i, &ca, &transfer, &dealt)?;
    }
    write_configs(p, out)?;
    for z in &dealt {
        let ds = z.ds(p.algorithm)?;
        eprintln!("sdns keygen: wrote {} for {} (key tag {}, DS: {ds})", out.join(&z.dir).display(), z.name, z.key.key_tag());
    }
    Ok(())
}

/// The operator's files of a dealt zone: its update key, trust anchor, DS, BIND key file, data.
fn write_operator_zone_files(p: &ClusterParams, out: &Path, z: &Dealt) -> Result<()> {
    let dir = out.join(&z.dir);
    write_secret(&dir.join("tsig.key"), z.tsig.to_bind().as_bytes())?;
    write_public(&dir.join("trust-anchor.conf"), z.key.trust_anchor().as_bytes())?;
    let ds = z.ds(p.algorithm)?;
    write_public(&dir.join("ds.txt"), format!("{ds}\n").as_bytes())?;
    let (key_name, key_file) = z.bind_key_file(p.algorithm)?;
    write_public(&dir.join(key_name), key_file.as_bytes())?;
    write_public(&dir.join("zone.db"), z.data.as_bytes())?;
    Ok(())
}

/// `sdns keygen --add-zone ZONE --out DIR`: deals one more zone for the cluster dealt (with
/// several zones) in `out`: its threshold key for the cluster's replicas and threshold, its
/// update key and data, in `zones/<zone>/` of the operator's directory and of every replica
/// directory. Nothing else is touched: not the CA, TLS keys, transfer key or other zones'
/// shares, and not any `replica.toml` (a zone set changed by configuration would change it
/// outside the log; putting the zone into service is the ordered operation of
/// docs/MULTIZONE.md, not built yet).
pub fn add_zone(p: &ClusterParams, out: &Path, zone: &str) -> Result<()> {
    let zone = if zone.ends_with('.') { zone.to_string() } else { format!("{zone}.") };
    let config_path = replica_dir(out, 0).join("replica.toml");
    let text = std::fs::read_to_string(&config_path).with_context(|| format!("reading {} (is {} a dealt cluster?)", config_path.display(), out.display()))?;
    let config = Config::from_toml(&text, &config_path)?;
    if config.layout() != wrapper::config::Layout::ZoneTables {
        bail!("{} was dealt for one zone (files at the top level): --add-zone adds to a cluster dealt with several zones", out.display());
    }
    let n = config.cluster.replicas;
    if let Some(i) = (0..n).find(|&i| !replica_dir(out, i).join("replica.toml").is_file()) {
        bail!("{} has no replica-{i}/replica.toml for its {n} replicas", out.display());
    }
    let mut zones: Vec<String> = vec![zone.clone()];
    zones.extend(config.zones.iter().map(|z| z.name.clone()));
    let names: Vec<&str> = zones.iter().map(String::as_str).collect();
    wrapper::config::check_zone_set(&names).map_err(|(_, why)| anyhow::anyhow!("--add-zone {zone}: {why}"))?;
    let zdir = PathBuf::from(wrapper::config::zone_dir_name(&zone));
    if let Some(there) = std::iter::once(out.to_path_buf()).chain((0..n).map(|i| replica_dir(out, i))).map(|d| d.join(&zdir)).find(|d| d.exists()) {
        bail!("{} exists: {zone} was dealt already", there.display());
    }
    if p.zone_files.len() > 1 {
        bail!("--zone-file: give at most one, the added zone's data");
    }
    // The cluster's threshold, from a zone it was dealt with.
    let first = config.zones.first().ok_or_else(|| anyhow::anyhow!("{} names no zone", config_path.display()))?;
    let k = ThresholdPublic::load(&replica_dir(out, 0).join(&first.public_key), first.algorithm)
        .with_context(|| format!("reading {}'s public key", first.name))?
        .threshold();
    let p = ClusterParams { zones, replicas: n, update_auth: config.auth.mode, ..p.clone() };
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no OS randomness: {e}"))?;
    let dealt = deal_zone(&p, out, k, 0, &zone, &mut rand_chacha::ChaCha20Rng::from_seed(seed))?;
    write_operator_zone_files(&p, out, &dealt)?;
    for i in 0..n {
        write_replica_zone_files(&replica_dir(out, i), i, &dealt)?;
    }
    let ds = dealt.ds(p.algorithm)?;
    eprintln!(
        "sdns keygen: wrote {} for {} (key tag {}, DS: {ds}) and replica-<i>/{} for each of the {n} replicas; no replica.toml was changed",
        out.join(&dealt.dir).display(),
        dealt.name,
        dealt.key.key_tag(),
        dealt.dir.display()
    );
    Ok(())
}

/// Checks the parameters before any key is made; the threshold k.
fn checked_threshold(p: &ClusterParams, out: &Path) -> Result<u16> {
    let n = p.replicas;
    if n == 0 {
        bail!("--replicas must be at least 1");
    }
    if p.layout.addresses.len() != 1 && p.layout.addresses.len() != usize::from(n) {
        bail!("--addresses: give one address, or one per replica ({n}), not {}", p.layout.addresses.len());
    }
    if p.zones.is_empty() {
        bail!("give a --zone");
    }
    let names: Vec<&str> = p.zones.iter().map(String::as_str).collect();
    wrapper::config::check_zone_set(&names).map_err(|(i, why)| anyhow::anyhow!("--zone {}: {why}", p.zones[i]))?;
    if !p.zone_files.is_empty() && p.zone_files.len() != p.zones.len() {
        bail!("--zone-file: give one per --zone, in the same order ({} zones, {} files)", p.zones.len(), p.zone_files.len());
    }
    // A directory `sdns adopt` dealt is for the zones it adopted.
    crate::adopted::adopted_zones(out, &p.zones)?;
    let t = (n - 1) / 3;
    let k = p.threshold.unwrap_or(t + 1);
    if k == 0 || k > n {
        bail!("--threshold {k} must be in 1..={n}");
    }
    if !is_ec_algorithm(p.algorithm) && shoup_rsa::HashAlg::from_dnssec_alg(p.algorithm).is_none() {
        bail!("--algorithm {}: sdns deals threshold keys of 8, 10 (RSA), 13 (ECDSA P-256) and 15 (Ed25519)", p.algorithm);
    }
    // An EC key tolerates t = (n-1)/3 faults and any t+1 honest replicas sign
    // (docs/DETERMINISM.md): its threshold is not a choice.
    if is_ec_algorithm(p.algorithm) && k != t + 1 {
        bail!("--threshold {k}: a key of algorithm {} has threshold t+1 = {} for {n} replicas", p.algorithm, t + 1);
    }
    Ok(k)
}

/// Deals the `i`-th zone: its threshold key (one per zone: each has its own DS and may later
/// roll alone), its update keys and its data.
fn deal_zone(p: &ClusterParams, out: &Path, k: u16, i: usize, name: &str, rng: &mut rand_chacha::ChaCha20Rng) -> Result<Dealt> {
    let (n, several) = (p.replicas, p.zones.len() > 1);
    let zone = Name::from_ascii(name).with_context(|| format!("--zone {name:?} is not a domain name"))?;
    let zone_text = zone.to_ascii();
    let (public, shares): (ThresholdPublic, Vec<ThresholdShare>) = match threshold_ec::Algorithm::try_from(p.algorithm) {
        Ok(alg) => {
            eprintln!("sdns keygen: {zone_text}: {n} replicas, threshold {k}, {alg:?} (algorithm {})", p.algorithm);
            let (public, shares) = threshold_ec::deal(alg, n, (n - 1) / 3, &mut rand_core::OsRng).context("threshold key dealing")?;
            (ThresholdPublic::Ec(public.into()), shares.into_iter().map(|s| ThresholdShare::Ec(s.into())).collect())
        }
        Err(_) => {
            eprintln!("sdns keygen: {zone_text}: {n} replicas, threshold {k}, {}-bit modulus from two safe primes", p.bits);
            let mut progress = shoup_rsa::stderr_progress();
            let (public, shares) = shoup_rsa::generate(p.bits, n, k, rng, &mut progress).context("threshold key generation")?;
            eprintln!();
            (ThresholdPublic::Rsa(public.into()), shares.into_iter().map(|s| ThresholdShare::Rsa(s.into())).collect())
        }
    };
    let key = public.zone_key(&zone, p.algorithm)?;
    let dir = if several { PathBuf::from(wrapper::config::zone_dir_name(&zone_text)) } else { PathBuf::new() };
    std::fs::create_dir_all(out.join(&dir)).with_context(|| format!("creating {}", out.join(&dir).display()))?;
    // With several zones each has its own update key, so a grant in one never reaches another.
    let tsig_name = if several { format!("sdns-update.{}", zone_text.trim_end_matches('.')) } else { "sdns-update".into() };
    let tsig = TsigKey::generate(&tsig_name).context("TSIG key")?;
    let sig0 = match p.update_auth {
        Mode::Tsig => None,
        Mode::Sig0 | Mode::Both => {
            let key = sig0_keygen(&p.bind_dir, &zone_text, &out.join(&dir))?;
            Some(std::fs::read(&key).with_context(|| format!("reading {}", key.display()))?)
        }
    };
    let data = match p.zone_files.get(i) {
        Some(f) => std::fs::read_to_string(f).with_context(|| format!("reading --zone-file {}", f.display()))?,
        None => demo_zone(&zone_text, n),
    };
    Ok(Dealt { name: zone_text, dir, public, shares, key, tsig, sig0, data })
}

impl Dealt {
    /// The DS record for the parent (SHA-256).
    fn ds(&self, algorithm: u8) -> Result<String> {
        match &self.public {
            ThresholdPublic::Rsa(public) => public.ds_record(&self.name, self.key.flags, algorithm).context("DS record"),
            ThresholdPublic::Ec(_) => Ok(self.key.ds_record()),
        }
    }

    /// BIND's `K<zone>+<alg>+<tag>.key` file: its name and text.
    fn bind_key_file(&self, algorithm: u8) -> Result<(String, String)> {
        match &self.public {
            ThresholdPublic::Rsa(public) => public.bind_key_file(&self.name, self.key.flags, algorithm, Some(3600)).context("BIND key file"),
            ThresholdPublic::Ec(public) => Ok((
                format!("{}.key", self.key.file_stem()),
                format!(
                    "; This is a key-signing key, keyid {}, for {}\n; Threshold {:?}: {} players, tolerating {} faulty\n{}\n",
                    self.key.key_tag(),
                    self.key.zone_text(),
                    public.algorithm(),
                    public.players(),
                    public.threshold(),
                    self.key.dnskey_record()
                ),
            )),
        }
    }
}

/// Writes a replica's key share, 0600.
fn save_share(path: &Path, share: &ThresholdShare) -> Result<()> {
    match share {
        ThresholdShare::Rsa(share) => shoup_rsa::save_share(path, share)?,
        ThresholdShare::Ec(share) => {
            let text = Zeroizing::new(serde_json::to_string_pretty(&**share)?);
            write_secret(path, text.as_bytes())?;
        }
    }
    Ok(())
}

/// Writes the zone's threshold public key.
pub fn save_public(path: &Path, public: &ThresholdPublic) -> Result<()> {
    match public {
        ThresholdPublic::Rsa(public) => shoup_rsa::save_public(path, public)?,
        ThresholdPublic::Ec(public) => write_public(path, format!("{}\n", serde_json::to_string_pretty(&**public)?).as_bytes())?,
    }
    Ok(())
}

/// Replica `i`'s keys and zone files (its `replica.toml` is `write_configs`').
fn write_replica_files(out: &Path, i: u16, ca: &mesh::pki::CaBundle, transfer: &TsigKey, dealt: &[Dealt]) -> Result<()> {
    let dir = replica_dir(out, i);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let cert = issue_replica_cert(ca, i).with_context(|| format!("certificate for replica {i}"))?;
    write_secret(&dir.join("tls.key"), cert.key_pem.as_bytes())?;
    write_public(&dir.join("tls.pem"), cert.cert_pem.as_bytes())?;
    write_public(&dir.join("ca.pem"), ca.cert_pem.as_bytes())?;
    write_secret(&dir.join("transfer.key"), transfer.to_bind().as_bytes())?;
    for z in dealt {
        write_replica_zone_files(&dir, i, z)?;
    }
    Ok(())
}

/// Replica `i`'s files of one zone, under its directory `dir`: its share (0600), the public
/// key, the update key (0600), the SIG(0) public key and the data.
fn write_replica_zone_files(dir: &Path, i: u16, z: &Dealt) -> Result<()> {
    let zdir = dir.join(&z.dir);
    std::fs::create_dir_all(&zdir).with_context(|| format!("creating {}", zdir.display()))?;
    let share_path = zdir.join("share.json");
    let _ = std::fs::remove_file(&share_path);
    let share = z.shares.get(usize::from(i)).ok_or_else(|| anyhow::anyhow!("no share dealt for replica {i}"))?;
    save_share(&share_path, share).with_context(|| format!("writing {}", share_path.display()))?;
    let pub_path = zdir.join("zone.pub.json");
    let _ = std::fs::remove_file(&pub_path);
    save_public(&pub_path, &z.public).with_context(|| format!("writing {}", pub_path.display()))?;
    write_secret(&zdir.join("tsig.key"), z.tsig.to_bind().as_bytes())?;
    if let Some(public) = &z.sig0 {
        write_public(&zdir.join("sig0.key"), public)?;
    }
    write_public(&zdir.join("zone.db"), z.data.as_bytes())?;
    Ok(())
}

/// What every replica's `replica.toml` shares, decided once for the cluster.
struct Shared {
    several: bool,
    test_cluster: bool,
    bind_dir: PathBuf,
    /// One zone: its update keys, transfer keys and policy (an adopted zone's own).
    tsig_keys: Vec<PathBuf>,
    transfer_keys: Vec<PathBuf>,
    update_policy: Option<Vec<String>>,
    access: AccessSection,
    signing: SigningSection,
    ordering: OrderingSection,
    rrl: RrlConfig,
    /// Several zones: every zone's `[[zone]]` table (none with one zone).
    zones: Vec<ZoneSection>,
    /// `--peer-routes`: replica FROM dials replica TO at this address.
    routes: Vec<(u16, u16, SocketAddr)>,
}

impl Shared {
    fn new(p: &ClusterParams, adopted: Option<&[crate::adopted::Adopted]>) -> Result<Shared> {
        let several = p.zones.len() > 1;
        let paths = |names: &[String]| names.iter().map(PathBuf::from).collect::<Vec<_>>();
        // A directory dealt by `sdns adopt` keeps the operator's keys and update-policy.
        let (tsig_keys, transfer_keys, update_policy) = match adopted.and_then(|a| a.first()).filter(|_| !several) {
            Some(a) => (paths(&a.tsig_keys), paths(&a.transfer_keys), Some(a.update_policy.clone())),
            None => (vec![PathBuf::from("tsig.key")], vec![PathBuf::from("transfer.key")], None),
        };
        let routes = match &p.peer_routes {
            Some(f) => {
                let text = std::fs::read_to_string(f).with_context(|| format!("reading --peer-routes {}", f.display()))?;
                parse_peer_routes(&text, p.replicas).with_context(|| format!("--peer-routes {}", f.display()))?
            }
            None => Vec::new(),
        };
        Ok(Shared {
            several,
            test_cluster: !p.corrupt.is_empty() || !p.byzantine.is_empty() || p.fail_writes_naming.is_some(),
            bind_dir: std::path::absolute(&p.bind_dir).unwrap_or_else(|_| p.bind_dir.clone()),
            tsig_keys,
            transfer_keys,
            update_policy,
            access: AccessSection { allow_transfer: allow_transfer(p, adopted)?, ..AccessSection::default() },
            signing: signing_section(p),
            ordering: ordering_section(p),
            rrl: RrlConfig { responses_per_second: p.rrl_responses_per_second, ..RrlConfig::default() },
            zones: if several { zone_tables(p, adopted) } else { Vec::new() },
            routes,
        })
    }

    /// One zone: `value`; several: none (the zone tables hold it).
    fn single<T>(&self, value: T) -> Option<T> {
        (!self.several).then_some(value)
    }
}

/// Who may transfer by address: on a cluster of this machine only, this machine's own
/// loopback addresses (other loopback addresses may not, as a test needs); and every
/// adopted zone's allow-transfer prefixes ([access] is the cluster's, so with several zones
/// a prefix one zone allowed may transfer each; noted in the adoption's report).
fn allow_transfer(p: &ClusterParams, adopted: Option<&[crate::adopted::Adopted]>) -> Result<Vec<Prefix>> {
    let mut allowed: Vec<String> = if p.layout.addresses.iter().all(|a| a.is_loopback()) { vec!["127.0.0.1".into(), "::1".into()] } else { Vec::new() };
    for a in adopted.into_iter().flatten().flat_map(|a| &a.allow_transfer) {
        if !allowed.contains(a) {
            allowed.push(a.clone());
        }
    }
    allowed.iter().map(|a| a.parse().map_err(|e| anyhow::anyhow!("allow_transfer {a:?}: {e}"))).collect()
}

/// `[signing]`: the defaults, with what the cluster flags set.
fn signing_section(p: &ClusterParams) -> SigningSection {
    let d = SigningSection::default();
    SigningSection {
        validity_s: p.validity_s,
        resign_slice_interval_s: p.resign_slice_interval_s.unwrap_or(d.resign_slice_interval_s),
        resign_slice_rrsets: p.resign_slice_rrsets.unwrap_or(d.resign_slice_rrsets),
        resign_after_s: p.resign_after_s,
        sign_zone_interval_s: p.sign_zone_interval_s.unwrap_or(d.sign_zone_interval_s),
        zone_signer_threads: p.zone_signer_threads,
        cache_entries: p.signature_cache_entries.unwrap_or(d.cache_entries),
        ..d
    }
}

/// `[ordering]`: the defaults, with what the cluster flags set.
fn ordering_section(p: &ClusterParams) -> OrderingSection {
    let d = OrderingSection::default();
    OrderingSection {
        checkpoint_interval: p.checkpoint_interval.unwrap_or(d.checkpoint_interval),
        retained_batches: p.retained_batches.unwrap_or(d.retained_batches),
        min_request_timeout_ms: p.min_request_timeout_ms.unwrap_or(d.min_request_timeout_ms),
        ..d
    }
}

/// Several zones: every zone's `[[zone]]` table, its files under `zones/<zone>/`; an
/// adopted zone keeps the keys and policy its record names (the zone's dealer key first).
fn zone_tables(p: &ClusterParams, adopted: Option<&[crate::adopted::Adopted]>) -> Vec<ZoneSection> {
    let paths = |names: &[String]| names.iter().map(PathBuf::from).collect::<Vec<_>>();
    p.zones
        .iter()
        .enumerate()
        .map(|(z, name)| {
            let dir = PathBuf::from(wrapper::config::zone_dir_name(name));
            let record = adopted.and_then(|a| a.get(z));
            ZoneSection {
                name: name.clone(),
                algorithm: p.algorithm,
                public_key: dir.join("zone.pub.json"),
                key_share: dir.join("share.json"),
                zone_file: dir.join("zone.db"),
                tsig_keys: record.map_or_else(|| vec![dir.join("tsig.key")], |a| paths(&a.tsig_keys)),
                update_policy: record.map(|a| a.update_policy.clone()),
                sig0_keys: if p.update_auth != Mode::Tsig { vec![dir.join("sig0.key")] } else { Vec::new() },
                transfer_keys: record.map_or_else(|| vec!["transfer.key".into()], |a| paths(&a.transfer_keys)),
                also_notify: None,
            }
        })
        .collect()
}

/// Replica `i`'s configuration: the file type the replica reads (`wrapper::config::Config`).
fn replica_config(p: &ClusterParams, s: &Shared, i: u16) -> Config {
    let n = p.replicas;
    let dial = |to: u16| s.routes.iter().find(|r| r.0 == i && r.1 == to).map_or_else(|| p.layout.peer(to), |r| r.2);
    Config {
        cluster: ClusterSection {
            zone: s.single(p.zone().to_owned()),
            replicas: n,
            protocol: p.protocol,
            reads: p.reads,
            ca_cert: "ca.pem".into(),
            public_key: s.single("zone.pub.json".into()),
            algorithm: s.single(p.algorithm),
            test_cluster: s.test_cluster,
            ..ClusterSection::default()
        },
        replica: ReplicaSection {
            id: i,
            key_share: s.single("share.json".into()),
            cert: "tls.pem".into(),
            tls_key: "tls.key".into(),
            corrupt_shares: p.corrupt.contains(&i),
            byzantine: p.byzantine.iter().find(|(id, _)| *id == i).map(|(_, mode)| *mode),
            test_fail_writes_naming: p.fail_writes_naming.clone(),
            state_dir: "state".into(),
        },
        peers: (0..n).map(|j| PeerSection { id: j, client: p.layout.client(j), peer: dial(j) }).collect(),
        named: NamedSection {
            bind_dir: s.bind_dir.clone(),
            port: p.layout.named_port(i),
            zone_file: s.single("zone.db".into()),
            tsig_keys: if s.several { Vec::new() } else { s.tsig_keys.clone() },
            update_policy: s.update_policy.clone(),
            also_notify: p.also_notify.clone(),
            ..NamedSection::default()
        },
        ordering: s.ordering.clone(),
        signing: s.signing.clone(),
        metrics: MetricsSection { listen: Some(p.layout.metrics(i)), ..MetricsSection::default() },
        access: s.access.clone(),
        auth: AuthSection {
            mode: p.update_auth,
            sig0_keys: if p.update_auth != Mode::Tsig && !s.several { vec!["sig0.key".into()] } else { Vec::new() },
            transfer_keys: if s.several { Vec::new() } else { s.transfer_keys.clone() },
            skip_precheck: p.skip_precheck.contains(&i),
            ..AuthSection::default()
        },
        rrl: s.rrl.clone(),
        zones: s.zones.clone(),
        catalog: p.catalog_zone.clone().map(|zone| CatalogSection { zone }),
        rollover: wrapper::rollover::RolloverSection {
            parent_resolvers: p.parent_resolvers.clone(),
            poll_interval_s: p.rollover_poll_s.unwrap_or(wrapper::rollover::RolloverSection::default().poll_interval_s),
            ..Default::default()
        },
        ..Config::default()
    }
}

/// (Re)writes every replica's `replica.toml` from the cluster parameters; keys are untouched.
pub fn write_configs(p: &ClusterParams, out: &Path) -> Result<()> {
    let n = p.replicas;
    for (k, (id, _)) in p.byzantine.iter().enumerate() {
        if *id >= n {
            bail!("--byzantine {id}: there is no replica {id} among {n}");
        }
        if p.byzantine[..k].iter().any(|(other, _)| other == id) {
            bail!("--byzantine: replica {id} is given two modes");
        }
    }
    // A directory dealt by `sdns adopt` keeps the operator's keys and update-policy, per zone
    // (in `p.zones`' order).
    let adopted = crate::adopted::adopted_zones(out, &p.zones)?;
    let shared = Shared::new(p, adopted.as_deref())?;
    for i in 0..n {
        let header = format!(
            "# Replica {i} of {n} for {zone}. Written by sdns; paths are relative to this file;\n\
             # a setting left out has its default (crates/wrapper/src/config.rs).\n\
             # [access]: client-address ACLs, enforced by the wrapper (named sees every client as\n\
             # 127.0.0.1, so it cannot); the others get REFUSED, as named would answer.\n\n",
            zone = p.zones.join(", "),
        );
        let text = header + &without_defaults(&replica_config(p, &shared, i))?;
        let path = replica_dir(out, i).join("replica.toml");
        // Validate what we wrote, so a bad parameter fails here and not at start-up.
        wrapper::config::Settings::parse(&text, &path, &replica_dir(out, i)).with_context(|| format!("generated {}", path.display()))?;
        write_public(&path, text.as_bytes())?;
    }
    Ok(())
}

/// `config` as TOML without the settings whose absence reads the same: a dealt cluster
/// follows a later change of a default (config.rs keeps them), and the file shows what the
/// dealing decided. Removing a setting is kept only if the file still reads back as
/// exactly `config`.
fn without_defaults(config: &Config) -> Result<String> {
    let full = toml::to_string(config).context("writing replica.toml")?;
    let mut doc: toml_edit::DocumentMut = full.parse().context("reading back replica.toml")?;
    // The sections' settings, each tried on the whole file (a few dozen).
    let sections: Vec<(String, Vec<String>)> =
        doc.iter().filter_map(|(section, item)| Some((section.to_owned(), item.as_table()?.iter().map(|(key, _)| key.to_owned()).collect()))).collect();
    for (section, keys) in sections {
        for key in keys {
            let mut trial = doc.clone();
            if trial[section.as_str()].as_table_mut().and_then(|t| t.remove(&key)).is_some() && reads_as(&trial, &full) {
                doc = trial;
            }
        }
    }
    // An entry of an array of tables ([[zone]]) reads the same or not by itself (serde reads
    // each table alone), so its settings are tried on a file holding only that entry: with N
    // zones, N small trials each instead of trials of the whole file (which made dealing
    // 1,000 zones quadratic: docs/BENCHMARKS.md, "1,000 zones"). The whole result is
    // checked below all the same.
    let arrays: Vec<String> = doc.iter().filter(|(_, item)| item.is_array_of_tables()).map(|(section, _)| section.to_owned()).collect();
    let mut rest = doc.clone();
    for section in &arrays {
        rest.remove(section);
    }
    for section in &arrays {
        let entries = doc[section.as_str()].as_array_of_tables().map_or(0, toml_edit::ArrayOfTables::len);
        for e in 0..entries {
            let Some(table) = doc[section.as_str()].as_array_of_tables().and_then(|a| a.get(e)).cloned() else { continue };
            let alone = |table: toml_edit::Table| {
                let mut one = rest.clone();
                let mut array = toml_edit::ArrayOfTables::new();
                array.push(table);
                one.insert(section, toml_edit::Item::ArrayOfTables(array));
                one
            };
            let reference = alone(table.clone()).to_string();
            let mut kept = table.clone();
            for (key, _) in table.iter() {
                let mut trial = kept.clone();
                if trial.remove(key).is_some() && reads_as(&alone(trial.clone()), &reference) {
                    kept = trial;
                }
            }
            if let Some(slot) = doc[section.as_str()].as_array_of_tables_mut().and_then(|a| a.get_mut(e)) {
                *slot = kept;
            }
        }
    }
    // A section with nothing left is the section's defaults.
    let empty: Vec<String> = doc.iter().filter(|(_, item)| item.as_table().is_some_and(toml_edit::Table::is_empty)).map(|(s, _)| s.to_owned()).collect();
    for section in empty {
        doc.remove(&section);
    }
    if !reads_as(&doc, &full) {
        bail!("replica.toml without its defaults does not read back as written");
    }
    Ok(doc.to_string())
}

/// Whether `doc` reads back as the configuration whose TOML is `full`.
fn reads_as(doc: &toml_edit::DocumentMut, full: &str) -> bool {
    let reference = toml::from_str::<Config>(full).ok().and_then(|c| toml::to_string(&c).ok());
    toml::from_str::<Config>(&doc.to_string()).ok().and_then(|c| toml::to_string(&c).ok()).is_some_and(|t| Some(t) == reference)
}

/// Parses `--peer-routes`: `FROM TO ADDRESS` per line, `#` comments; each (FROM, TO) once,
/// two different replicas below `n`.
pub fn parse_peer_routes(text: &str, n: u16) -> Result<Vec<(u16, u16, SocketAddr)>> {
    let mut out: Vec<(u16, u16, SocketAddr)> = Vec::new();
    for (k, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let [from, to, addr] = f[..] else { bail!("line {}: expected `FROM TO ADDRESS`", k + 1) };
        let from: u16 = from.parse().with_context(|| format!("line {}: replica {from:?}", k + 1))?;
        let to: u16 = to.parse().with_context(|| format!("line {}: replica {to:?}", k + 1))?;
        let addr: SocketAddr = addr.parse().with_context(|| format!("line {}: address {addr:?}", k + 1))?;
        if from >= n || to >= n || from == to {
            bail!("line {}: {from} -> {to} is not a link between two of the {n} replicas", k + 1);
        }
        if out.iter().any(|r| (r.0, r.1) == (from, to)) {
            bail!("line {}: {from} -> {to} is routed twice", k + 1);
        }
        out.push((from, to, addr));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(update_auth: Mode) -> ClusterParams {
        ClusterParams {
            zones: vec!["example.test.".into()],
            replicas: 4,
            threshold: None,
            bits: 1024,
            algorithm: 8,
            protocol: Protocol::OptTe,
            reads: ReadMode::Ordered,
            corrupt: Vec::new(),
            byzantine: vec![(1, wrapper::byzantine::Mode::Flooder)],
            fail_writes_naming: None,
            layout: Layout::default(),
            bind_dir: PathBuf::from("/opt/bind"),
            zone_files: Vec::new(),
            resign_after_s: None,
            sign_zone_interval_s: None,
            validity_s: None,
            resign_slice_interval_s: None,
            resign_slice_rrsets: None,
            zone_signer_threads: Some(3),
            signature_cache_entries: Some(512),
            update_auth,
            skip_precheck: vec![2],
            rrl_responses_per_second: 7,
            checkpoint_interval: Some(8),
            retained_batches: Some(16),
            peer_routes: None,
            min_request_timeout_ms: None,
            also_notify: Vec::new(),
            catalog_zone: None,
            parent_resolvers: Vec::new(),
            rollover_poll_s: None,
        }
    }

    #[test]
    fn configs_carry_the_update_authentication() {
        for mode in [Mode::Tsig, Mode::Sig0, Mode::Both] {
            let out = tempfile::tempdir().unwrap();
            for i in 0..4 {
                std::fs::create_dir_all(replica_dir(out.path(), i)).unwrap();
            }
            write_configs(&params(mode), out.path()).unwrap();
            for i in 0..4 {
                let c = wrapper::config::Config::load(&replica_dir(out.path(), i).join("replica.toml")).unwrap();
                assert_eq!(c.auth.mode, mode);
                let z = c.only_zone().unwrap();
                assert_eq!(z.transfer_keys, vec![PathBuf::from("transfer.key")]);
                assert_eq!(z.tsig_keys, vec![PathBuf::from("tsig.key")]);
                assert_eq!(z.sig0_keys.is_empty(), mode == Mode::Tsig);
                assert_eq!(c.auth.skip_precheck, i == 2);
                assert!(c.cluster.test_cluster);
                assert_eq!(c.replica.byzantine, (i == 1).then_some(wrapper::byzantine::Mode::Flooder));
                assert_eq!((c.rrl.responses_per_second, c.rrl.slip), (7, 2));
                assert_eq!((c.ordering.checkpoint_interval, c.ordering.retained_batches), (8, 16));
                assert_eq!(c.signing.zone_signer_threads, Some(3));
                assert_eq!(c.signing.cache_entries, 512);
            }
        }
        assert_eq!(sig0_signer("example.test."), "sdns-update.example.test.");
    }

    /// What keygen writes reads back as exactly the `Config` it built, both as the file type
    /// and upgraded as a replica reads it (`Config::upgrade`, which moves single-zone fields;
    /// `Settings::parse` then checks everything),
    /// though the settings at their defaults are left out of the file.
    #[test]
    fn written_configs_read_back_as_built() {
        let mut several = params(Mode::Both);
        several.zones = vec!["example.test.".into(), "2.0.192.in-addr.arpa.".into()];
        several.also_notify = vec!["192.0.2.53:53".parse().unwrap(), "127.0.0.1:5353".parse().unwrap()];
        let mut flags = params(Mode::Sig0);
        (flags.validity_s, flags.resign_after_s, flags.resign_slice_rrsets, flags.min_request_timeout_ms) = (Some(7200), Some(3600), Some(4), Some(900));
        (flags.protocol, flags.reads, flags.corrupt) = (Protocol::Basic, ReadMode::Local, vec![3]);
        for p in [params(Mode::Tsig), several, flags] {
            let out = tempfile::tempdir().unwrap();
            for i in 0..4 {
                std::fs::create_dir_all(replica_dir(out.path(), i)).unwrap();
            }
            write_configs(&p, out.path()).unwrap();
            let shared = Shared::new(&p, None).unwrap();
            for i in 0..4 {
                let built = replica_config(&p, &shared, i);
                let path = replica_dir(out.path(), i).join("replica.toml");
                let written = std::fs::read_to_string(&path).unwrap();
                let back: Config = toml::from_str(&written).unwrap();
                assert_eq!(toml::to_string(&back).unwrap(), toml::to_string(&built).unwrap(), "{written}");
                let parsed = |text: &str| {
                    wrapper::config::Settings::parse(text, &path, out.path()).unwrap();
                    let mut file = Config::from_toml(text, &path).unwrap();
                    file.upgrade(&path).unwrap();
                    toml::to_string(&file).unwrap()
                };
                assert_eq!(parsed(&written), parsed(&toml::to_string(&built).unwrap()));
                // Only what the dealing decided is written: no section of defaults alone.
                assert!(!written.contains("[client]") && !written.contains("[order_limit]"), "{written}");
                assert_eq!(written.contains("[signing]"), p.validity_s.is_some() || p.zone_signer_threads.is_some(), "{written}");
            }
        }
    }

    #[test]
    fn an_adopted_directory_keeps_its_keys_policy_and_transfer_addresses() {
        let out = tempfile::tempdir().unwrap();
        for i in 0..4 {
            std::fs::create_dir_all(replica_dir(out.path(), i)).unwrap();
        }
        std::fs::write(
            out.path().join(crate::adopted::ADOPTED_FILE),
            "zone = \"example.test.\"\ntsig_keys = [\"tsig.key\", \"key-dhcp.key\"]\ntransfer_keys = [\"transfer.key\", \"key-dhcp.key\"]\n\
             update_policy = [\"grant dhcp zonesub A PTR\"]\nallow_transfer = [\"192.0.2.0/24\", \"127.0.0.1\"]\n",
        )
        .unwrap();
        let mut p = params(Mode::Tsig);
        p.byzantine.clear();
        write_configs(&p, out.path()).unwrap();
        let c = wrapper::config::Config::load(&replica_dir(out.path(), 3).join("replica.toml")).unwrap();
        let z = c.only_zone().unwrap();
        assert_eq!(z.tsig_keys, vec![PathBuf::from("tsig.key"), PathBuf::from("key-dhcp.key")]);
        assert_eq!(z.transfer_keys, vec![PathBuf::from("transfer.key"), PathBuf::from("key-dhcp.key")]);
        assert_eq!(z.update_policy, Some(vec!["grant dhcp zonesub A PTR".to_string()]));
        let allowed: Vec<String> = c.access.allow_transfer.iter().map(|p| p.to_string()).collect();
        assert_eq!(allowed, vec!["127.0.0.1/32", "::1/128", "192.0.2.0/24"]);
        // The record is for one zone: configuring another one there is refused.
        p.zones = vec!["other.test.".into()];
        let e = write_configs(&p, out.path()).unwrap_err().to_string();
        assert!(e.contains("adopted for zone example.test."), "{e}");
        p.zones = vec!["example.test.".into(), "2.0.192.in-addr.arpa.".into()];
        let e = write_configs(&p, out.path()).unwrap_err().to_string();
        assert!(e.contains("adopted for zone example.test.; give --zone example.test."), "{e}");
    }

    #[test]
    fn several_zones_get_zone_tables_in_canonical_order() {
        let out = tempfile::tempdir().unwrap();
        for i in 0..4 {
            std::fs::create_dir_all(replica_dir(out.path(), i)).unwrap();
        }
        let mut p = params(Mode::Both);
        p.zones = vec!["example.test.".into(), "2.0.192.in-addr.arpa.".into()];
        write_configs(&p, out.path()).unwrap();
        // Loading refuses single-zone fields beside [[zone]] tables: none were written.
        let file = replica_dir(out.path(), 1).join("replica.toml");
        let written = Config::from_toml(&std::fs::read_to_string(&file).unwrap(), &file).unwrap();
        assert_eq!(written.layout(), wrapper::config::Layout::ZoneTables);
        let c = wrapper::config::Config::load(&file).unwrap();
        let names: Vec<&str> = c.zones.iter().map(|z| z.name.as_str()).collect();
        assert_eq!(names, ["2.0.192.in-addr.arpa.", "example.test."]);
        let reverse = &c.zones[0];
        assert_eq!(reverse.key_share, PathBuf::from("zones/2.0.192.in-addr.arpa/share.json"));
        assert_eq!(reverse.tsig_keys, vec![PathBuf::from("zones/2.0.192.in-addr.arpa/tsig.key")]);
        assert_eq!(reverse.sig0_keys, vec![PathBuf::from("zones/2.0.192.in-addr.arpa/sig0.key")]);
        assert_eq!(reverse.transfer_keys, vec![PathBuf::from("transfer.key")]);
        // Zones one named cannot serve side by side are refused before any key is made.
        p.zones = vec!["example.test.".into(), "sub.example.test.".into()];
        let e = keygen(&p, out.path()).unwrap_err().to_string();
        assert!(e.contains("inside zone example.test."), "{e}");
        p.zones = vec!["example.test.".into(), "other.test.".into()];
        p.zone_files = vec![PathBuf::from("one.db")];
        let e = keygen(&p, out.path()).unwrap_err().to_string();
        assert!(e.contains("one per --zone"), "{e}");
    }

    /// Many zones: each [[zone]] table loses its defaults by itself (a file of 300 zones is
    /// written in a moment, where trials of the whole file per setting took minutes at 1,000
    /// zones), and the file reads back as built.
    #[test]
    fn a_config_of_many_zones_leaves_out_every_tables_defaults() {
        let mut p = params(Mode::Tsig);
        p.zones = (0..300).map(|i| format!("z{i:04}.zones.test.")).collect();
        let shared = Shared::new(&p, None).unwrap();
        let built = replica_config(&p, &shared, 2);
        let written = without_defaults(&built).unwrap();
        let back: Config = toml::from_str(&written).unwrap();
        assert_eq!(toml::to_string(&back).unwrap(), toml::to_string(&built).unwrap());
        let doc: toml_edit::DocumentMut = written.parse().unwrap();
        let tables = doc["zone"].as_array_of_tables().unwrap();
        assert_eq!(tables.len(), 300);
        let shape = |t: &toml_edit::Table| t.iter().map(|(k, _)| k.to_owned()).collect::<Vec<_>>();
        let first = shape(tables.get(0).unwrap());
        assert!(first.contains(&"name".to_string()) && !first.contains(&"also_notify".to_string()), "{first:?}");
        assert!(tables.iter().all(|t| shape(t) == first), "every zone table keeps the same settings");
        // The same as the one zone table of a file dealt for that zone alone.
        let mut one = params(Mode::Tsig);
        one.zones = vec!["z0000.zones.test.".into(), "z0001.zones.test.".into()];
        let two = without_defaults(&replica_config(&one, &Shared::new(&one, None).unwrap(), 2)).unwrap();
        let two: toml_edit::DocumentMut = two.parse().unwrap();
        assert_eq!(shape(two["zone"].as_array_of_tables().unwrap().get(0).unwrap()), first);
    }

    /// `--algorithm 13` and `15`: an EC key dealt, each replica's share 0600 and its own, the
    /// operator's DS, trust anchor and BIND key file of that algorithm, and configs naming it.
    #[test]
    fn ec_keys_are_dealt_with_their_files() {
        use std::os::unix::fs::PermissionsExt;
        for algorithm in [13u8, 15] {
            let out = tempfile::tempdir().unwrap();
            let mut p = params(Mode::Tsig);
            (p.algorithm, p.byzantine) = (algorithm, Vec::new());
            keygen(&p, out.path()).unwrap();
            let public = ThresholdPublic::load(&replica_dir(out.path(), 0).join("zone.pub.json"), algorithm).unwrap();
            let zone = Name::from_ascii("example.test.").unwrap();
            let key = public.zone_key(&zone, algorithm).unwrap();
            for i in 0..4 {
                let share = replica_dir(out.path(), i).join("share.json");
                assert_eq!(std::fs::metadata(&share).unwrap().permissions().mode() & 0o777, 0o600);
                let ThresholdShare::Ec(share) = ThresholdShare::load(&share, algorithm).unwrap() else { panic!("not an EC share") };
                assert_eq!(share.index(), i + 1);
                let ThresholdPublic::Ec(pk) = &public else { panic!("not an EC key") };
                share.check(pk).unwrap();
                let config = wrapper::config::Config::load(&replica_dir(out.path(), i).join("replica.toml")).unwrap();
                assert_eq!(config.only_zone().unwrap().algorithm, algorithm);
            }
            let ds = std::fs::read_to_string(out.path().join("ds.txt")).unwrap();
            assert_eq!(ds.trim(), key.ds_record());
            assert!(ds.contains(&format!(" DS {} {algorithm} 2 ", key.key_tag())), "{ds}");
            let anchor = std::fs::read_to_string(out.path().join("trust-anchor.conf")).unwrap();
            assert!(anchor.contains(&format!("static-key 257 3 {algorithm} ")), "{anchor}");
            let key_file = std::fs::read_to_string(out.path().join(format!("{}.key", key.file_stem()))).unwrap();
            assert!(key_file.contains(&key.dnskey_record()), "{key_file}");
            // An EC key's threshold is t+1, not a choice.
            p.threshold = Some(3);
            let e = keygen(&p, tempfile::tempdir().unwrap().path()).unwrap_err().to_string();
            assert!(e.contains("threshold t+1 = 2"), "{e}");
        }
    }

    #[test]
    fn peer_routes_change_only_the_dialing_side() {
        let out = tempfile::tempdir().unwrap();
        for i in 0..4 {
            std::fs::create_dir_all(replica_dir(out.path(), i)).unwrap();
        }
        let routes = out.path().join("routes");
        std::fs::write(&routes, "# from to address\n0 1 127.0.0.1:41001\n0 2 127.0.0.1:41002 # NY\n3 0 127.0.0.1:41030\n").unwrap();
        let mut p = params(Mode::Tsig);
        p.peer_routes = Some(routes.clone());
        p.min_request_timeout_ms = Some(1500);
        write_configs(&p, out.path()).unwrap();
        let c = wrapper::config::Config::load(&replica_dir(out.path(), 2).join("replica.toml")).unwrap();
        assert_eq!((c.ordering.min_request_timeout_ms, c.ordering.checkpoint_interval), (1500, 8));
        let peer = |i: u16, j: u16| {
            let c = wrapper::config::Config::load(&replica_dir(out.path(), i).join("replica.toml")).unwrap();
            c.peers.iter().find(|e| e.id == j).unwrap().peer
        };
        assert_eq!(peer(0, 1), "127.0.0.1:41001".parse().unwrap());
        assert_eq!(peer(0, 2), "127.0.0.1:41002".parse().unwrap());
        assert_eq!(peer(3, 0), "127.0.0.1:41030".parse().unwrap());
        // Unrouted links and every replica's own (listening) entry keep the layout's address.
        assert_eq!(peer(0, 3), p.layout.peer(3));
        assert_eq!(peer(1, 0), p.layout.peer(0));
        assert_eq!(peer(0, 0), p.layout.peer(0));
        assert_eq!(peer(3, 3), p.layout.peer(3));
        for bad in ["0 0 127.0.0.1:1", "0 4 127.0.0.1:1", "0 1", "0 1 nowhere", "0 1 127.0.0.1:1\n0 1 127.0.0.1:2"] {
            assert!(parse_peer_routes(bad, 4).is_err(), "{bad}");
        }
    }
}
