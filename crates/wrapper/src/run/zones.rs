//! Each zone's whole-zone operations (`crate::zone::ZoneMaintenance`): re-signing slices,
//! background signings and their installation, the zone's digest.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use named_glue::keys::ZoneKey;

use super::named::{NamedParts, NamedSetup};
use super::signing::zone_signer_threads;
use crate::config::{MaintenanceConfig, Settings};
use crate::signing::ZoneKeys;
use crate::zone::{ZoneMaintenance, ZoneMaintenanceConfig};

/// One zone's maintenance, from its settings and the parts of the replica it works with.
fn zone_maintenance(
    cfg: MaintenanceConfig,
    setup: &NamedSetup,
    index: usize,
    key: ZoneKey,
    named: &NamedParts,
    signer_socket: PathBuf,
    background_socket: PathBuf,
) -> Result<ZoneMaintenance> {
    let files = setup.conf.zones.get(index).cloned().ok_or_else(|| anyhow!("named.conf has no zone {index}"))?;
    let config = ZoneMaintenanceConfig {
        tools: setup.tools.clone(),
        zone: cfg.zone,
        work_dir: cfg.work_dir,
        files,
        raw_zone_file: setup.conf.raw_zone_file,
        key,
        signer_socket,
        background_socket,
        maintenance_key: setup.maintenance_key.clone(),
        catchup_key: setup.catchup_key.clone(),
        slice_journal: cfg.slice_journal,
        signer_threads: zone_signer_threads(cfg.signer_threads),
    };
    Ok(ZoneMaintenance::new(config, named.supervisor.clone(), named.reads.clone(), named.writes.clone()))
}

/// Every zone's maintenance, in zone index order.
pub(super) fn zones_maintenance(
    s: &Settings,
    setup: &NamedSetup,
    zone_keys: &[(ZoneKeys, ZoneKey)],
    named: &NamedParts,
    signing: &crate::config::SigningConfig,
) -> Result<Vec<Arc<ZoneMaintenance>>> {
    (0..s.zones.len())
        .map(|index| {
            let cfg = s.maintenance(index).ok_or_else(|| anyhow!("no zone {index}"))?;
            let key = zone_keys.get(index).map(|(_, key)| key.clone()).ok_or_else(|| anyhow!("no key for zone {index}"))?;
            let background = signing.background_sockets.get(index).cloned().ok_or_else(|| anyhow!("no background socket for zone {index}"))?;
            zone_maintenance(cfg, setup, index, key, named, signing.socket.clone(), background).map(Arc::new)
        })
        .collect()
}
