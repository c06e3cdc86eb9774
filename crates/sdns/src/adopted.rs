//! The adoption record (`adopted.toml`): what `sdns adopt` leaves in the output directory
//! for `sdns keygen` and `sdns cluster up` (the adopted keys, update-policy and transfer
//! addresses).
//!
//! One zone: the record's fields at the top level, key paths relative to a replica
//! directory (`tsig.key`, `key-<name>.key`), as every earlier version wrote it. Several
//! zones: one `[[zone]]` table each, with the same fields; the dealer's update key is then
//! the zone's own (`zones/<zone>/tsig.key`), the operator's key files stay at the top level
//! (a key two zones grant is one file, declared once in named.conf).

use std::path::Path;

use anyhow::{bail, Context, Result};
use hickory_proto::rr::Name;
use serde::{Deserialize, Serialize};

/// What `sdns adopt` leaves in the output directory for `write_configs` (so `sdns cluster
/// up` on that directory keeps the adopted keys and policy).
pub const ADOPTED_FILE: &str = "adopted.toml";

/// The adopted zone's update authorization, as written to `adopted.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adopted {
    /// The zone this directory was dealt for.
    pub zone: String,
    /// `named.tsig_keys`: the dealer's key first, then the operator's update keys.
    pub tsig_keys: Vec<String>,
    /// `auth.transfer_keys`: the dealer's transfer key, then the operator's.
    pub transfer_keys: Vec<String>,
    /// `named.update_policy`: the operator's rules in order.
    pub update_policy: Vec<String>,
    /// `[access] allow_transfer` additions: the prefixes of the zone's allow-transfer.
    #[serde(default)]
    pub allow_transfer: Vec<String>,
}

impl Adopted {
    /// The record as `adopted.toml` holds it, after a comment saying where it came from.
    pub fn to_toml(&self, comment: &str) -> Result<String> {
        let comment: String = comment.lines().map(|l| format!("# {l}\n")).collect();
        Ok(comment + &toml::to_string(self).context("writing the adoption record")?)
    }

    /// The adoption record in `dir`, if the directory was dealt by `sdns adopt` for one zone
    /// (a record of several zones is an error here: see [`Adopted::load_all`]).
    pub fn load(dir: &Path) -> Result<Option<Adopted>> {
        match Adopted::load_all(dir)? {
            None => Ok(None),
            Some(mut zones) if zones.len() == 1 && !is_several(dir)? => Ok(zones.pop()),
            Some(zones) => bail!(
                "{} was adopted for several zones ({}); give each with --zone",
                dir.display(),
                zones.iter().map(|z| z.zone.as_str()).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    /// Every zone's adoption record in `dir` (one for a single-zone record), in the record's
    /// order; none when the directory was not dealt by `sdns adopt`.
    pub fn load_all(dir: &Path) -> Result<Option<Vec<Adopted>>> {
        let path = dir.join(ADOPTED_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let table: toml::Table = toml::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        let zones = if table.get("zone").is_some_and(toml::Value::is_array) {
            let all: AdoptedZones = toml::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
            if all.zone.is_empty() {
                bail!("{}: no [[zone]] table", path.display());
            }
            all.zone
        } else {
            vec![toml::from_str(&text).with_context(|| format!("reading {}", path.display()))?]
        };
        for (i, z) in zones.iter().enumerate() {
            if Name::from_ascii(&z.zone).is_err() {
                bail!("{}: zone {:?} is not a domain name", path.display(), z.zone);
            }
            if zones[..i].iter().any(|o| absolute_name(&o.zone) == absolute_name(&z.zone)) {
                bail!("{}: zone {} is recorded twice", path.display(), z.zone);
            }
        }
        Ok(Some(zones))
    }
}

/// The record of several zones: one `[[zone]]` table each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdoptedZones {
    pub zone: Vec<Adopted>,
}

impl AdoptedZones {
    pub fn to_toml(&self, comment: &str) -> Result<String> {
        let comment: String = comment.lines().map(|l| format!("# {l}\n")).collect();
        Ok(comment + &toml::to_string(self).context("writing the adoption record")?)
    }
}

/// Whether `dir`'s record is written as `[[zone]]` tables (several zones).
fn is_several(dir: &Path) -> Result<bool> {
    let text = std::fs::read_to_string(dir.join(ADOPTED_FILE)).with_context(|| format!("reading {}", dir.join(ADOPTED_FILE).display()))?;
    let table: toml::Table = toml::from_str(&text).with_context(|| format!("reading {}", dir.join(ADOPTED_FILE).display()))?;
    Ok(table.get("zone").is_some_and(toml::Value::is_array))
}

/// The adoption records in `dir` for the zones being configured, in `zones`' order (none
/// when the directory was not adopted). With several zones the record must name exactly
/// these zones; with one, the record must be that zone's.
pub fn adopted_zones(dir: &Path, zones: &[String]) -> Result<Option<Vec<Adopted>>> {
    let Some(recorded) = Adopted::load_all(dir)? else { return Ok(None) };
    let names = |z: &[String]| z.iter().map(|n| absolute_name(n)).collect::<std::collections::BTreeSet<_>>();
    let recorded_names: Vec<String> = recorded.iter().map(|a| a.zone.clone()).collect();
    if names(&recorded_names) != names(zones) || recorded.len() != zones.len() {
        let give: Vec<String> = recorded_names.iter().map(|z| format!("--zone {z}")).collect();
        bail!("{} was adopted for zone{} {}; give {}", dir.display(), if recorded.len() == 1 { "" } else { "s" }, recorded_names.join(", "), give.join(" "));
    }
    zones
        .iter()
        .map(|z| {
            recorded
                .iter()
                .find(|a| absolute_name(&a.zone) == absolute_name(z))
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("{} holds no record of zone {z}", dir.display()))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// A domain name in lower case with its trailing dot (one definition, the runtime's).
pub use exec::names::absolute_name;
