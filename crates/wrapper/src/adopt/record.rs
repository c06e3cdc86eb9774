//! The adoption record (`adopted.toml`): what `sdns adopt` leaves in the output directory
//! for `sdns keygen` and `sdns cluster up` (the adopted keys, update-policy and transfer
//! addresses).

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

    /// The adoption record in `dir`, if the directory was dealt by `sdns adopt`.
    pub fn load(dir: &Path) -> Result<Option<Adopted>> {
        let path = dir.join(ADOPTED_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(toml::from_str(&text).with_context(|| format!("reading {}", path.display()))?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
}

/// A domain name in lower case with its trailing dot.
pub fn absolute_name(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    if lower.ends_with('.') {
        lower
    } else {
        format!("{lower}.")
    }
}

/// Checks a directory's adoption record against the zone being configured.
pub fn adopted_for(dir: &Path, zone: &str) -> Result<Option<Adopted>> {
    let Some(a) = Adopted::load(dir)? else { return Ok(None) };
    if absolute_name(&a.zone) != absolute_name(zone) {
        bail!("{} was adopted for zone {}; give --zone {}", dir.display(), a.zone, a.zone);
    }
    if Name::from_ascii(&a.zone).is_err() {
        bail!("{}: zone {:?} is not a domain name", dir.join(ADOPTED_FILE).display(), a.zone);
    }
    Ok(Some(a))
}
