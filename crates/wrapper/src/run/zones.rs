//! Each zone's whole-zone operations (`crate::zone::ZoneMaintenance`): re-signing slices,
//! background signings and their installation, the zone's digest; and the replica's side of
//! a change of the zone set (`Host`, the executor's `ZoneHost`): what a zone added at run
//! time needs, made, and what a removed zone had, dropped.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Context, Result};
use tokio::sync::watch;
use tracing::info;

use super::keys::{added_zone, single_layout, ServedZone};
use super::named::{configure, NamedParts, NamedSetup};
use super::requests::{spawn_zone_requests, ZoneRequests};
use super::signing::{bind_background, signing_key, zone_core, zone_signer_threads, Backgrounds, SigningParts};
use crate::config::{MaintenanceConfig, Settings, SigningConfig};
use crate::execution::zoneset::{HostFuture, ZoneHost, ZoneMap, ZoneParts};
use crate::front::gateway::Gateway;
use crate::ops::metrics::Metrics;
use crate::signing::service::{Counting, ThresholdSigner};
use crate::zone::{ZoneMaintenance, ZoneMaintenanceConfig};
use exec::{SignZoneSigner, ZoneEntry};

/// Zone `zone`'s whole-zone operations' places. One zone keeps the layout of every earlier
/// state directory (work files in named's directory, resign.pending in the state
/// directory); several get a directory each.
fn maintenance_config(s: &Settings, zone: &ServedZone) -> MaintenanceConfig {
    let named_dir = s.named_dir();
    let (work_dir, slice_journal) = if single_layout(s, zone.index) {
        (named_dir, s.state_dir.join("resign.pending"))
    } else {
        let dir = named_dir.join(zone.settings.dir_name());
        (dir.clone(), dir.join("resign.pending"))
    };
    MaintenanceConfig { zone: zone.settings.apex.clone(), work_dir, slice_journal, signer_threads: s.signing.zone_signer_threads }
}

/// One zone's maintenance, from its settings and the parts of the replica it works with.
fn zone_maintenance(
    s: &Settings,
    setup: &NamedSetup,
    conf: &named_glue::conf::NamedConf,
    zone: &ServedZone,
    named: &NamedParts,
    signing: &SigningConfig,
) -> Result<ZoneMaintenance> {
    let cfg = maintenance_config(s, zone);
    let files = conf.zones.iter().find(|z| z.zone == zone.settings.apex).cloned().ok_or_else(|| anyhow!("named.conf has no zone {}", zone.settings.name))?;
    let config = ZoneMaintenanceConfig {
        tools: setup.tools.clone(),
        zone: cfg.zone,
        work_dir: cfg.work_dir,
        files,
        raw_zone_file: conf.raw_zone_file,
        key: zone.key.clone(),
        signer_socket: signing.socket.clone(),
        background_socket: signing.background_socket(zone.index),
        maintenance_key: setup.maintenance_key.clone(),
        catchup_key: setup.catchup_key.clone(),
        slice_journal: cfg.slice_journal,
        signer_threads: zone_signer_threads(cfg.signer_threads),
    };
    Ok(ZoneMaintenance::new(config, named.supervisor.clone(), named.reads.clone(), named.writes.clone()))
}

/// The replica's side of the zone set: everything a served zone needs beside the execution
/// core, by zone index, and how it changes.
pub(super) struct Host {
    s: Settings,
    setup: NamedSetup,
    named: NamedParts,
    signing_cfg: SigningConfig,
    signer: Arc<ThresholdSigner>,
    counting: Arc<Counting>,
    backgrounds: Backgrounds,
    metrics: Arc<Metrics>,
    /// The gateway the zones' own requests go through (set once the replica started it).
    gateway: watch::Sender<Option<Arc<Gateway>>>,
    /// This replica's certificate and identity key, for an added zone's sign-zone identity.
    identity: (String, String),
    /// The zones served, with the tasks of each (re-sign timer, finish voter).
    served: Mutex<BTreeMap<u16, (ServedZone, Vec<tokio::task::AbortHandle>)>>,
}

impl Drop for Host {
    fn drop(&mut self) {
        for (_, tasks) in self.served.get_mut().unwrap_or_else(|e| e.into_inner()).values() {
            tasks.iter().for_each(tokio::task::AbortHandle::abort);
        }
    }
}

/// What the host is made from at start.
pub(super) struct HostParts<'a> {
    pub setup: NamedSetup,
    pub named: NamedParts,
    pub signing_cfg: SigningConfig,
    pub signing: &'a SigningParts,
    pub metrics: Arc<Metrics>,
    /// This replica's sign-zone identity per configured zone (zone index order of the configuration).
    pub signers: &'a [Arc<SignZoneSigner>],
}

impl Host {
    /// The host of the zones served at start (`zones`), with their parts: each zone's
    /// maintenance, background signing and own requests (which wait for the gateway).
    pub(super) fn start(s: &Settings, p: HostParts<'_>, zones: Vec<ServedZone>) -> Result<(Arc<Host>, ZoneMap)> {
        let tls_key = crate::ops::files::read_secret(&s.tls_key).map_err(|e| anyhow!(e)).context("replica.tls_key")?;
        let cert = std::fs::read_to_string(&s.cert).with_context(|| format!("reading {}", s.cert.display()))?;
        let host = Arc::new(Host {
            s: s.clone(),
            setup: p.setup,
            named: p.named,
            signing_cfg: p.signing_cfg,
            signer: p.signing.signer.clone(),
            counting: p.signing.counting.clone(),
            backgrounds: p.signing.backgrounds.clone(),
            metrics: p.metrics,
            gateway: watch::channel(None).0,
            identity: (cert, tls_key),
            served: Mutex::new(BTreeMap::new()),
        });
        let mut parts = ZoneMap::new();
        let conf = host.setup.conf.clone();
        for zone in zones {
            // A configured zone keeps the identity the mesh made for it (by its name).
            let signer = s.zones.iter().position(|z| z.apex == zone.settings.apex).and_then(|i| p.signers.get(i).cloned());
            let made = host.zone_parts(&conf, &zone, signer)?;
            parts.insert(zone.index, made);
        }
        host.publish();
        Ok((host, parts))
    }

    /// The gateway is up: the zones' own requests may go through it.
    pub(super) fn set_gateway(&self, gateway: Arc<Gateway>) {
        self.gateway.send_replace(Some(gateway));
    }

    /// Zone `zone`'s parts: its maintenance, its background signing (bound now if it has
    /// no socket yet) and its own requests; the zone is recorded as served.
    fn zone_parts(&self, conf: &named_glue::conf::NamedConf, zone: &ServedZone, signer: Option<Arc<SignZoneSigner>>) -> Result<ZoneParts> {
        let maintenance = Arc::new(zone_maintenance(&self.s, &self.setup, conf, zone, &self.named, &self.signing_cfg)?);
        let background = {
            let mut sockets = self.backgrounds.lock().unwrap_or_else(|e| e.into_inner());
            if !sockets.contains_key(&zone.index) {
                sockets.insert(zone.index, bind_background(&self.signing_cfg, &self.counting, zone.index)?);
            }
            sockets.get(&zone.index).map(|b| b.background.clone()).ok_or_else(|| anyhow!("no background signing for zone {}", zone.settings.name))?
        };
        let signer = match signer {
            Some(signer) => signer,
            None => Arc::new(
                SignZoneSigner::new(self.s.id, &zone.settings.name, &self.identity.0, self.identity.1.clone())
                    .map_err(anyhow::Error::msg)
                    .context("replica.cert")?,
            ),
        };
        let last_signed = Arc::new(AtomicU64::new(0));
        let requests =
            ZoneRequests { zone: zone.index, last_signed: last_signed.clone(), signer, slice_interval_s: self.s.signing.resign_slice_interval_s.get() };
        let tasks = spawn_zone_requests(requests, &background, self.gateway.subscribe());
        self.served.lock().unwrap_or_else(|e| e.into_inner()).insert(zone.index, (zone.clone(), tasks));
        Ok(ZoneParts { maintenance, background, last_signed })
    }

    /// `/status` and the metrics list the zones served, each with its key tag and whether
    /// this replica holds a share of its key.
    fn publish(&self) {
        let served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        self.metrics.set_zones(served.values().map(|(z, _)| (z.index, z.settings.name.clone(), z.key.key_tag(), z.keys.is_some())));
    }

    /// The zones of `zones` with their settings: those served now as they are, the others
    /// read (a configured zone never removed from the configuration, an added one from its
    /// dealt files).
    fn settings_for(&self, zones: &BTreeMap<u16, ZoneEntry>) -> Result<Vec<ServedZone>> {
        let served = self.served.lock().unwrap_or_else(|e| e.into_inner()).clone_zones();
        let mut out = Vec::with_capacity(zones.len());
        for (&index, entry) in zones {
            match served.get(&index).filter(|z| exec::names::absolute_name(&z.settings.name) == entry.name) {
                Some(zone) => out.push(zone.clone()),
                None => out.push(added_zone(&self.s, index, entry)?),
            }
        }
        Ok(out)
    }

    fn prepare_now(&self, zones: &BTreeMap<u16, ZoneEntry>, catalog_serial: u32, current: &ZoneMap) -> Result<(ZoneMap, Vec<(u16, ServedZone)>)> {
        let list = self.settings_for(zones)?;
        // named.conf and the catalog for the new set, checked before anything else changes.
        let (conf, auth) = configure(&self.s, &self.setup.tools, &self.setup.local, &list, catalog_serial)?;
        conf.write(&self.setup.conf_path).context("writing named.conf")?;
        named_glue::conf::check_conf(&self.setup.tools, &self.setup.conf_path).context("named-checkconf rejects the named.conf of the changed zone set")?;
        let mut parts = ZoneMap::new();
        let mut added = Vec::new();
        for zone in &list {
            match current.get(&zone.index) {
                Some(kept) => {
                    parts.insert(zone.index, kept.clone());
                }
                None => {
                    parts.insert(zone.index, self.zone_parts(&conf, zone, None)?);
                    added.push((zone.index, zone.clone()));
                }
            }
        }
        self.setup.auth.replace(auth);
        Ok((parts, added))
    }
}

/// Clones the zones of a served map without their tasks.
trait CloneZones {
    fn clone_zones(&self) -> BTreeMap<u16, ServedZone>;
}

impl CloneZones for BTreeMap<u16, (ServedZone, Vec<tokio::task::AbortHandle>)> {
    fn clone_zones(&self) -> BTreeMap<u16, ServedZone> {
        self.iter().map(|(i, (z, _))| (*i, z.clone())).collect()
    }
}

impl ZoneHost for Host {
    fn prepare<'a>(&'a self, zones: &'a BTreeMap<u16, ZoneEntry>, catalog_serial: u32, current: &'a ZoneMap) -> HostFuture<'a> {
        Box::pin(async move {
            let (parts, added) = self.prepare_now(zones, catalog_serial, current).map_err(|e| format!("{e:#}"))?;
            // The signing service signs each added zone with its key (or answers its requests
            // with an error where this replica holds no share), and no longer a removed one.
            for (index, zone) in &added {
                let core = match zone.keys.as_ref().map(|keys| zone_core(&self.signing_cfg, keys)).transpose() {
                    Ok(core) => core,
                    Err(e) => {
                        tracing::error!(replica = self.s.id, zone = zone.settings.name, error = %e, "cannot make the added zone's signing core: served without a share");
                        None
                    }
                };
                self.signer.set_zone(*index, Some(signing_key(zone)), core).await;
                info!(
                    replica = self.s.id,
                    zone = zone.settings.name,
                    index,
                    share = zone.keys.is_some(),
                    "zone added to this replica's named.conf and signing service"
                );
            }
            let removed: Vec<u16> = current.keys().filter(|i| !parts.contains_key(i)).copied().collect();
            for index in removed {
                self.signer.set_zone(index, None, None).await;
                let gone = self.served.lock().unwrap_or_else(|e| e.into_inner()).remove(&index);
                if let Some((zone, tasks)) = gone {
                    tasks.iter().for_each(tokio::task::AbortHandle::abort);
                    info!(replica = self.s.id, zone = zone.settings.name, index, "zone removed from this replica's named.conf and signing service");
                }
                // Its socket closes with its service.
                self.backgrounds.lock().unwrap_or_else(|e| e.into_inner()).remove(&index);
            }
            self.publish();
            Ok(parts)
        })
    }
}
