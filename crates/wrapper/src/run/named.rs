//! named's side of a replica: its directory and configuration (rewritten at every start),
//! the local keys it trusts, and the supervised process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};
use named_glue::conf::{CatalogZoneConf, NamedConf, TsigKey, ZoneConf};
use named_glue::forward::Forwarder;
use named_glue::supervisor::{NamedSpec, Supervisor};
use named_glue::tools::BindTools;
use tracing::info;

use super::keys::{authenticator, load_tsig, local_policy, single_layout, ServedZone};
use crate::config::{Settings, ZoneSettings};
use crate::execution::zoneset::SharedAuth;
use exec::auth::tsig;
use exec::auth::zones::ZoneAuth;
use exec::auth::Authenticator;

/// The key named grants the re-signing updates to (RRSIG only).
const MAINTENANCE_KEY: &str = "resign.sdns-local.";
/// The key of the update that brings a zone signed in the background up to date.
const CATCHUP_KEY: &str = "catchup.sdns-local.";

/// named's configuration as written, and what the rest of the replica needs of it.
#[derive(Clone)]
pub(super) struct NamedSetup {
    pub tools: BindTools,
    pub dir: PathBuf,
    pub conf: NamedConf,
    pub conf_path: PathBuf,
    /// Every zone's update authentication, replaced at a change of the zone set.
    pub auth: Arc<SharedAuth>,
    /// Signs the ordered re-signing updates (granted RRSIG only); fresh each start.
    pub maintenance_key: tsig::Key,
    /// Signs the catch-up update after a background signing; fresh each start.
    pub catchup_key: tsig::Key,
    /// The same two keys as named.conf names them.
    pub local: LocalKeys,
}

/// named as it runs: supervised, with a forwarder for reads and one for ordered writes.
#[derive(Clone)]
pub(super) struct NamedParts {
    pub supervisor: Arc<Supervisor>,
    /// Reads (their own timeouts: a read that fails gets SERVFAIL and changes nothing).
    pub reads: Forwarder,
    /// Ordered writes and re-signing updates: they wait for named, which waits for its
    /// threshold signatures, so no local timer decides that a write failed. The long read
    /// timeout only notices a named that lost the request (it is then sent again).
    pub writes: Forwarder,
}

/// A fresh HMAC-SHA256 key: for the checks here, and as named.conf names it.
fn fresh_key(name: &str, what: &str) -> Result<(tsig::Key, TsigKey)> {
    let mut secret = vec![0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| anyhow!("no OS randomness for the {what} key: {e}"))?;
    let key = tsig::Key::new(name, tsig::Algorithm::HmacSha256, &secret).ok_or_else(|| anyhow!("bad {what} key name"))?;
    Ok((key, TsigKey { name: name.trim_end_matches('.').to_string(), algorithm: "hmac-sha256".into(), secret }))
}

/// Writes named's directory: configuration and key files are rewritten at every start; the
/// zone file only on first start (afterwards named's file and journal rule). One zone
/// statement per zone served (`zones`, the execution state's zone set); named trusts only
/// this replica's local keys for updates (fresh secrets each start), one per (zone,
/// identity), granted in that zone only. The catalog, if configured, gets `catalog_serial`.
pub(super) fn prepare(s: &Settings, zones: &[ServedZone], catalog_serial: u32) -> Result<NamedSetup> {
    let dir = s.named_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (maintenance_key, maintenance_conf_key) = fresh_key(MAINTENANCE_KEY, "maintenance")?;
    // Granted what the update keys are (no DNSSEC types).
    let (catchup_key, catchup_conf_key) = fresh_key(CATCHUP_KEY, "catch-up")?;
    let tools = BindTools::new(&s.named.bind_dir);
    tools.check().context("named.bind_dir")?;
    let local = LocalKeys { maintenance: maintenance_conf_key, catchup: catchup_conf_key };
    let (conf, auth) = configure(s, &tools, &local, zones, catalog_serial)?;
    let conf_path = dir.join("named.conf");
    conf.write(&conf_path).context("writing named.conf")?;
    named_glue::conf::check_conf(&tools, &conf_path).context("named-checkconf rejects the generated named.conf")?;
    Ok(NamedSetup { tools, dir, conf, conf_path, auth: Arc::new(SharedAuth::new(auth)), maintenance_key, catchup_key, local })
}

/// The named.conf keys that stay for the replica's life (the maintenance and catch-up
/// keys, which the zones' maintenance signs with), for rewriting named.conf at a zone-set change.
#[derive(Clone)]
pub(crate) struct LocalKeys {
    pub maintenance: TsigKey,
    pub catchup: TsigKey,
}

/// named's configuration for `zones` and their update authentication; writes each zone's
/// key directory, its zone file on first start (a zone added at run time: from its dealt
/// file), and the catalog's file with `catalog_serial`. Called at start and at every change
/// of the zone set (named.conf is then written by the caller and named restarted).
pub(crate) fn configure(s: &Settings, tools: &BindTools, local: &LocalKeys, zones: &[ServedZone], catalog_serial: u32) -> Result<(NamedConf, ZoneAuth)> {
    let dir = s.named_dir();
    let mut conf = NamedConf::without_zones(&dir, s.named.port.get());
    // Key files dated a day back, so named takes them as active now.
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0).saturating_sub(86_400);
    conf.maintenance_key = Some(local.maintenance.clone());
    conf.sig_validity_days = s.named.signature_validity_days;
    // named loads its zone file in raw format several times faster than text (a 10,000-name
    // signed zone: 0.3 s against 1.1 s), and a signed zone is installed by restarting named.
    conf.raw_zone_file = true;
    // NOTIFY to the secondaries leaves from the address they list this replica by.
    conf.notify_source = Some(s.me.client.ip()).filter(|ip| !ip.is_unspecified());
    let mut zone_auths = Vec::new();
    for zone in zones {
        let z = &zone.settings;
        let (auth, local_keys, known_keys) = authenticator(s, zone.index, z)?;
        // One zone keeps the layout of every earlier state directory; several get a directory each.
        let files = if single_layout(s, zone.index) { dir.clone() } else { dir.join(z.dir_name()) };
        let mut zone_conf = ZoneConf::in_dir(&z.apex, &files, local_keys);
        zone_conf.tsig_keys.push(local.catchup.clone());
        zone_conf.update_policy = local_policy(s, z, &auth)?;
        zone_conf.also_notify = z.also_notify.clone();
        std::fs::create_dir_all(&zone_conf.key_directory).with_context(|| format!("creating {}", zone_conf.key_directory.display()))?;
        // The zone's public DNSKEY only: the private half is the replicas' threshold key.
        zone.key.write_files(&zone_conf.key_directory, created).with_context(|| format!("writing the key files of zone {}", z.name))?;
        install_zone_file(s, tools, z, &zone_conf)?;
        conf.transfer_keys.extend(known_keys);
        conf.zones.push(zone_conf);
        zone_auths.push((z.name.clone(), auth));
    }
    let mut auth = ZoneAuth::new(zone_auths).context("update authentication")?;
    if let Some(catalog) = &s.catalog {
        let members: Vec<_> = zones.iter().map(|z| z.settings.apex.clone()).collect();
        conf.catalog = Some(write_catalog(s, &dir, &members, catalog_serial)?);
        // Transfers only, with every zone's transfer keys (named knows them already).
        let keys = catalog.transfer_keys.iter().map(|p| load_tsig(p)).collect::<Result<Vec<_>>>()?;
        let checker = Authenticator::new(s.auth.mode, &[], &keys, Vec::new(), named_glue::time::unix_now).context("catalog transfer keys")?;
        auth = auth.with_catalog(&catalog.name, checker).context("catalog.zone")?;
    }
    for line in auth.describe() {
        info!(replica = s.id, mode = auth.mode().as_str(), "update identity: {line}");
    }
    Ok((conf, auth))
}

/// The catalog's SOA serial at start: `DEALT_SERIAL` for the dealt zone set, else the
/// serial of the last change this replica executed (kept beside the catalog's file), and
/// never below the batch that added the newest zone (a replica that got the zone set by
/// state transfer has no file).
pub(super) fn catalog_serial(s: &Settings, zone_set: &std::collections::BTreeMap<u16, exec::ZoneEntry>, changed: bool) -> u32 {
    if !changed {
        return crate::catalog::DEALT_SERIAL;
    }
    let kept = std::fs::read_to_string(catalog_serial_file(s)).ok().and_then(|t| t.trim().parse::<u32>().ok()).unwrap_or(0);
    let added = zone_set.values().map(|e| crate::catalog::serial_at(e.added_at)).max().unwrap_or(0);
    kept.max(added).max(crate::catalog::DEALT_SERIAL)
}

/// Where the catalog's serial of the last zone-set change is kept.
pub(crate) fn catalog_serial_file(s: &Settings) -> PathBuf {
    s.named_dir().join("catalog").join("serial")
}

/// The catalog zone's file, rewritten at every start and change of the zone set: its data
/// follows from the zone set alone, which every replica has alike (`crate::catalog`).
fn write_catalog(s: &Settings, dir: &Path, members: &[hickory_proto::rr::Name], serial: u32) -> Result<CatalogZoneConf> {
    let catalog = s.catalog.as_ref().ok_or_else(|| anyhow!("no catalog is configured"))?;
    let text = crate::catalog::zone_text(&catalog.apex, members, serial).map_err(|e| anyhow!("catalog.zone: {e}"))?;
    let zone_file = dir.join("catalog").join("catalog.db");
    if let Some(parent) = zone_file.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&zone_file, text).with_context(|| format!("writing {}", zone_file.display()))?;
    if serial != crate::catalog::DEALT_SERIAL {
        let file = dir.join("catalog").join("serial");
        std::fs::write(&file, serial.to_string()).with_context(|| format!("writing {}", file.display()))?;
    }
    info!(replica = s.id, catalog = catalog.name, zones = members.len(), serial, "catalog zone written");
    Ok(CatalogZoneConf { zone: catalog.apex.clone(), zone_file, also_notify: catalog.also_notify.clone() })
}

/// The operator's zone file only on first start (afterwards named's file and journal rule),
/// compiled to raw; a state directory of a version that kept it in text is compiled once
/// (named's journal still applies: the serial is the same).
fn install_zone_file(s: &Settings, tools: &BindTools, z: &ZoneSettings, zone_conf: &ZoneConf) -> Result<()> {
    if !zone_conf.zone_file.exists() {
        let src = &z.zone_file;
        tools.compile_raw(&z.name, src, &zone_conf.zone_file).map_err(|e| anyhow!("{} {}: {e}", s.field_of(z, "zone_file"), src.display()))?;
    } else if !named_glue::tools::is_raw_zone_file(&zone_conf.zone_file).with_context(|| format!("reading {}", zone_conf.zone_file.display()))? {
        let text = zone_conf.zone_file.with_extension("text");
        std::fs::rename(&zone_conf.zone_file, &text).with_context(|| format!("moving {} aside", zone_conf.zone_file.display()))?;
        tools.compile_raw(&z.name, &text, &zone_conf.zone_file).map_err(|e| anyhow!("compiling {} to raw: {e}", text.display()))?;
        std::fs::remove_file(&text).with_context(|| format!("removing {}", text.display()))?;
        info!(replica = s.id, zone = z.name, "named's zone file converted from text to raw format");
    }
    Ok(())
}

/// Starts named, supervised, asking `signer_socket` for every signature, and waits until it
/// answers. named waits for each signature without a deadline (re-sending its request to a
/// restarted service); it dies with this process (the supervisor's PDEATHSIG).
pub(super) async fn start_named(setup: &NamedSetup, port: u16, signer_socket: PathBuf) -> Result<NamedParts> {
    // named is ready once it answers for a zone it serves.
    let first = setup.conf.zones.first().map(|z| z.zone.clone()).ok_or_else(|| anyhow!("no zone is served"))?;
    let mut spec = NamedSpec::new(setup.tools.named(), setup.conf_path.clone(), port, first, setup.dir.join("named.log"));
    spec.signer_socket = Some(signer_socket);
    spec.pid_file = Some(setup.conf.pid_file.clone());
    let supervisor = Arc::new(Supervisor::start(spec).await.context("starting named")?);
    supervisor.wait_ready().await.context("named did not become ready")?;
    let reads = Forwarder::new(SocketAddr::from(([127, 0, 0, 1], port)));
    let writes = Forwarder { tcp_timeout: Duration::from_secs(3600), ..reads.clone() };
    Ok(NamedParts { supervisor, reads, writes })
}
