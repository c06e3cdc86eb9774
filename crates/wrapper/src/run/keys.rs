//! The keys a replica reads at start: each zone's threshold key share, and the TSIG and
//! SIG(0) keys its update authenticator checks.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use named_glue::conf::{PolicyRule, TsigKey};
use named_glue::keys::ZoneKey;

use crate::config::{Settings, ZoneSettings};
use crate::ops::files::{read_secret, ThresholdPublic, ThresholdShare};
use crate::signing::{Keys, ZoneKeys};
use exec::auth::sig0::Sig0Key;
use exec::auth::TsigKey as DealerTsig;
use exec::auth::{tsig, Authenticator, TsigSecret};
use exec::ZoneEntry;

pub(super) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// One threshold key per zone, in zone index order, of the zone's algorithm (RSA or EC),
/// with the DNSKEY named publishes for it; every share must be private to this replica's user.
pub(super) fn load_zone_keys(s: &Settings) -> Result<Vec<(ZoneKeys, ZoneKey)>> {
    let mut zone_keys = Vec::new();
    for z in &s.zones {
        let public = ThresholdPublic::load(&z.public_key, z.algorithm).with_context(|| s.field_of(z, "public_key"))?;
        let share = ThresholdShare::load(&z.key_share, z.algorithm).with_context(|| s.field_of(z, "key_share"))?;
        let mismatch = || format!("zone {}: key share does not belong to the public key", z.name);
        let keys = match (&public, share) {
            (ThresholdPublic::Rsa(public), ThresholdShare::Rsa(share)) => ZoneKeys::Rsa(Keys::new(public.clone(), share).with_context(mismatch)?),
            (ThresholdPublic::Ec(public), ThresholdShare::Ec(share)) => {
                share.check(public).with_context(mismatch)?;
                ZoneKeys::Ec { public: public.clone(), share }
            }
            // Both were read as the zone's algorithm says.
            _ => bail!("{}", mismatch()),
        };
        if public.players() != s.replicas {
            bail!("zone {}: public key is for {} replicas, config says {}", z.name, public.players(), s.replicas);
        }
        let key = public.zone_key(&z.apex, z.algorithm)?;
        zone_keys.push((keys, key));
    }
    Ok(zone_keys)
}

/// Whether zone `index` keeps the layout of a single-zone state directory (its files at the
/// top of named's directory): the one zone of a single-zone configuration, never re-added.
/// Stable across changes of the zone set, so a zone's files stay where they are.
pub(crate) fn single_layout(s: &Settings, index: u16) -> bool {
    s.zones.len() == 1 && index == 0
}

/// A zone this replica serves, by the execution state's zone index.
#[derive(Clone)]
pub(crate) struct ServedZone {
    pub index: u16,
    pub settings: ZoneSettings,
    /// This replica's share of the zone's key; `None` when it holds none of the key the zone
    /// set names (a zone added at run time whose `zones/<zone>/share.json` is missing or of
    /// another key): the zone is served, unsigned until its peers sign it.
    pub keys: Option<ZoneKeys>,
    /// The zone's DNSKEY.
    pub key: ZoneKey,
}

/// The zone set served at start: the execution state's (`zones`, by index), or the
/// configuration's (indices 0..n) while it never changed.
pub(crate) fn zone_set_at_start(s: &Settings, state: &exec::ExecState) -> BTreeMap<u16, ZoneEntry> {
    if !state.zone_set.is_empty() {
        return state.zone_set.clone();
    }
    let names: Vec<String> = s.zones.iter().map(|z| z.name.clone()).collect();
    let mut seeded = exec::ExecState::default();
    seeded.seed_zone_set(&names);
    seeded.zone_set
}

/// Every zone of `zones` with its settings and keys. A zone of the configuration (never
/// re-added) is as `replica.toml` says, its key required as at every start; a zone added at
/// run time is read from `zones/<zone>/` beside `replica.toml`, as `sdns keygen --add-zone`
/// deals it (see [`added_zone`]).
pub(crate) fn served_zones(s: &Settings, zones: &BTreeMap<u16, ZoneEntry>) -> Result<Vec<ServedZone>> {
    let configured = load_zone_keys(s)?;
    let mut served = Vec::with_capacity(zones.len());
    for (&index, entry) in zones {
        let of_config = s.zones.iter().zip(&configured).find(|(z, _)| entry.added_at == 0 && exec::names::absolute_name(&z.name) == entry.name);
        served.push(match of_config {
            Some((z, (keys, key))) => ServedZone { index, settings: z.clone(), keys: Some(keys.clone()), key: key.clone() },
            None => added_zone(s, index, entry)?,
        });
    }
    Ok(served)
}

/// The directory a replica's dealt files of `zone` are in: `zones/<zone>/` beside its
/// `replica.toml`.
pub(crate) fn added_zone_dir(s: &Settings, zone: &str) -> std::path::PathBuf {
    let base = s.path.parent().unwrap_or_else(|| Path::new("."));
    base.join(crate::config::zone_dir_name(zone))
}

/// A zone added at run time, from `zones/<zone>/` (`share.json`, `zone.pub.json`,
/// `tsig.key`, `zone.db`): its update key is the dealt `tsig.key` (every key may update the
/// whole zone), its transfer keys and NOTIFY targets the cluster's. The share counts only
/// when its public key's SHA-256 DS digest is the one the zone set names; otherwise (or
/// when `share.json` is missing) the zone is served without it, and that is logged. Without
/// `zone.pub.json` the zone cannot be served (named would publish no DNSKEY for it): an
/// error naming the file, so that the replica stops there until the operator installs it.
pub(crate) fn added_zone(s: &Settings, index: u16, entry: &ZoneEntry) -> Result<ServedZone> {
    let dir = added_zone_dir(s, &entry.name);
    let apex = hickory_proto::rr::Name::from_ascii(&entry.name).map_err(|e| anyhow!("zone {}: {e}", entry.name))?;
    let first = s.zones.first();
    let tsig = dir.join("tsig.key");
    let mut settings = ZoneSettings {
        name: entry.name.clone(),
        apex: apex.clone(),
        algorithm: first.map_or(8, |z| z.algorithm),
        public_key: dir.join("zone.pub.json"),
        key_share: dir.join("share.json"),
        zone_file: dir.join("zone.db"),
        tsig_keys: if tsig.is_file() { vec![tsig] } else { Vec::new() },
        update_policy: None,
        sig0_keys: Vec::new(),
        transfer_keys: first.map(|z| z.transfer_keys.clone()).unwrap_or_default(),
        also_notify: s.named.also_notify.clone(),
    };
    // The replica does not know the added key's algorithm: the configured zones' first, then the others dealt.
    let mut algorithms: Vec<u8> = s.zones.iter().map(|z| z.algorithm).collect();
    algorithms.extend([13, 8, 15, 10, 7, 5]);
    let public = algorithms.iter().find_map(|&a| ThresholdPublic::load(&settings.public_key, a).ok().map(|p| (a, p)));
    let Some((algorithm, public)) = public else {
        bail!(
            "zone {} was added by the cluster, and this replica has no readable public key for it in {} (install the files `sdns keygen --add-zone` dealt it)",
            entry.name,
            settings.public_key.display()
        );
    };
    settings.algorithm = algorithm;
    if !settings.zone_file.is_file() {
        // Served empty (SOA and NS only) rather than not at all: its checkpoint digest then
        // differs from its peers', and state transfer brings the zone's data.
        tracing::error!(replica = s.id, zone = entry.name, file = %settings.zone_file.display(), "no dealt zone file for the added zone: serving it empty until state transfer");
        let placeholder = s.state_dir.join(format!("added-{}.db", entry.name.trim_end_matches('.')));
        std::fs::write(&placeholder, format!("{} 3600 IN SOA invalid. invalid. 0 3600 600 86400 0\n{} 3600 IN NS invalid.\n", entry.name, entry.name))
            .with_context(|| format!("writing {}", placeholder.display()))?;
        settings.zone_file = placeholder;
    }
    let key = public.zone_key(&apex, algorithm)?;
    if entry.key_digest != [0; 32] && key.ds_digest() != entry.key_digest {
        tracing::error!(
            replica = s.id,
            zone = entry.name,
            file = %settings.public_key.display(),
            "the added zone's public key here is not the one the replicas ordered (its DS digest differs): served without a share"
        );
        return Ok(ServedZone { index, settings, keys: None, key });
    }
    let keys = match ThresholdShare::load(&settings.key_share, algorithm) {
        Ok(share) => match (&public, share) {
            (ThresholdPublic::Rsa(public), ThresholdShare::Rsa(share)) => Keys::new(public.clone(), share).ok().map(ZoneKeys::Rsa),
            (ThresholdPublic::Ec(public), ThresholdShare::Ec(share)) => share.check(public).ok().map(|()| ZoneKeys::Ec { public: public.clone(), share }),
            _ => None,
        },
        Err(e) => {
            tracing::error!(replica = s.id, zone = entry.name, error = %e, "no key share for the added zone: it is served, and this replica takes no part in its signatures");
            None
        }
    };
    if keys.is_none() {
        tracing::error!(replica = s.id, zone = entry.name, "the added zone's key share is missing or not of its key: share missing");
    }
    Ok(ServedZone { index, settings, keys, key })
}

/// Reads a TSIG key file (BIND's key statement, as `sdns keygen` or tsig-keygen write it);
/// one that group or others may read is refused.
pub(super) fn load_tsig(path: &Path) -> Result<TsigSecret> {
    let key = DealerTsig::from_bind(&read_secret(path).map_err(|e| anyhow!(e))?).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let algorithm = tsig::Algorithm::from_name(&key.algorithm)
        .ok_or_else(|| anyhow!("{}: TSIG algorithm {} is not supported (hmac-sha1/256/384/512 are)", path.display(), key.algorithm))?;
    Ok(TsigSecret { name: key.name.clone(), algorithm, secret: key.secret() })
}

/// The update authenticator of the zone with this index, from `[auth]` and the zone's keys,
/// and the keys named must know for it: the local keys it grants updates to, and the
/// clients' update and transfer keys.
pub(super) fn authenticator(s: &Settings, index: u16, zone: &ZoneSettings) -> Result<(Authenticator, Vec<TsigKey>, Vec<TsigKey>)> {
    let updates = zone.tsig_keys.iter().map(|p| load_tsig(p)).collect::<Result<Vec<_>>>()?;
    let transfers = zone.transfer_keys.iter().map(|p| load_tsig(p)).collect::<Result<Vec<_>>>()?;
    let sig0 = zone
        .sig0_keys
        .iter()
        .map(|path| Sig0Key::from_key_file(&read(path)?).map_err(|e| anyhow!("{}: {}: {e}", s.field_of(zone, "sig0_keys"), path.display())))
        .collect::<Result<Vec<_>>>()?;
    // The one zone of a single-zone configuration keeps its local key names, zones added
    // beside it at run time get their own.
    let auth = if single_layout(s, index) {
        Authenticator::new(s.auth.mode, &updates, &transfers, sig0, named_glue::time::unix_now)
    } else {
        Authenticator::for_zone(index, s.auth.mode, &updates, &transfers, sig0, named_glue::time::unix_now)
    };
    let auth = auth.with_context(|| format!("update authentication of zone {}", zone.name))?.with_sig0_max_validity(s.auth.sig0_max_validity_s);
    // named knows the clients' update keys and the transfer keys but grants them nothing: it
    // verifies and signs TSIG on reads and transfers, which it answers itself; updates reach
    // it only re-signed with a local key.
    let mut known = transfers.clone();
    known.extend(updates.iter().filter(|u| !transfers.iter().any(|t| t.name.eq_ignore_ascii_case(&u.name))).cloned());
    let (local, transfer) = auth.named_keys(&known);
    let conf_key = |k: exec::auth::NamedKey| TsigKey { name: k.name, algorithm: k.algorithm.to_string(), secret: k.secret };
    Ok((auth, local.into_iter().map(conf_key).collect(), transfer.into_iter().map(conf_key).collect()))
}

/// The zone's update-policy with each key replaced by the local key(s) that stand for it
/// towards named, in the same order (first match wins).
pub(super) fn local_policy(s: &Settings, zone: &ZoneSettings, auth: &Authenticator) -> Result<Option<Vec<PolicyRule>>> {
    let Some(rules) = &zone.update_policy else {
        return Ok(None);
    };
    let (policy_field, keys_field) = (s.field_of(zone, "update_policy"), s.field_of(zone, "tsig_keys"));
    let mut local = Vec::new();
    for rule in rules {
        let names =
            auth.local_names(&rule.identity).ok_or_else(|| anyhow!("{policy_field} names the key {:?}, which is in no file of {keys_field}", rule.identity))?;
        for name in names {
            local.push(PolicyRule { identity: name, ..rule.clone() });
        }
    }
    Ok(Some(local))
}

/// The key the Byzantine `oversized-writes` and `update-flooder` modes sign with: the first
/// zone's first update key.
pub(super) fn hostile_write_key(s: &Settings) -> Option<tsig::Key> {
    let path = s.zones.first()?.tsig_keys.first()?;
    let k = load_tsig(path).ok()?;
    tsig::Key::new(&k.name, k.algorithm, &k.secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::files::tests::TestRng;
    use std::os::unix::fs::PermissionsExt;

    /// Settings of replica 0 of a 4-replica cluster with the zones `example.test.` and
    /// `2.0.192.in-addr.arpa.` (algorithm 13), read from `dir/replica.toml`.
    fn settings(dir: &Path) -> Settings {
        let mut text = String::from(
            r#"
[cluster]
replicas = 4
ca_cert = "ca.pem"

[replica]
id = 0
cert = "replica.pem"
tls_key = "replica.key"
state_dir = "state"

[named]
bind_dir = "/opt/bind"
port = 5501

[[zone]]
name = "example.test."
algorithm = 13
public_key = "zones/example.test/zone.pub.json"
key_share = "zones/example.test/share.json"
zone_file = "zones/example.test/zone.db"
tsig_keys = ["zones/example.test/tsig.key"]
transfer_keys = ["transfer.key"]

[[zone]]
name = "2.0.192.in-addr.arpa."
algorithm = 13
public_key = "zones/2.0.192.in-addr.arpa/zone.pub.json"
key_share = "zones/2.0.192.in-addr.arpa/share.json"
zone_file = "zones/2.0.192.in-addr.arpa/zone.db"
tsig_keys = ["zones/2.0.192.in-addr.arpa/tsig.key"]
transfer_keys = ["transfer.key"]
"#,
        );
        for i in 0..4 {
            text += &format!("\n[[peer]]\nid = {i}\nclient = \"127.0.0.1:{}\"\npeer = \"127.0.0.1:{}\"\n", 5301 + i, 5401 + i);
        }
        let path = dir.join("replica.toml");
        Settings::parse(&text, &path, dir).unwrap()
    }

    /// Deals an algorithm-13 key for `zone` and writes replica 0's files as `sdns keygen
    /// --add-zone` does (share 0600); returns the key's SHA-256 DS digest.
    fn deal(dir: &Path, zone: &str, seed: u64) -> [u8; 32] {
        let (pk, shares) = threshold_ec::deal(threshold_ec::Algorithm::EcdsaP256Sha256, 4, 1, &mut TestRng(seed)).unwrap();
        let zdir = dir.join(crate::config::zone_dir_name(zone));
        std::fs::create_dir_all(&zdir).unwrap();
        std::fs::write(zdir.join("zone.pub.json"), serde_json::to_string(&pk).unwrap()).unwrap();
        let share = zdir.join("share.json");
        std::fs::write(&share, serde_json::to_string(&shares[0]).unwrap()).unwrap();
        std::fs::set_permissions(&share, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(zdir.join("zone.db"), format!("{zone} 300 IN SOA ns.{zone} h.{zone} 1 3600 600 86400 300\n{zone} 300 IN NS ns.{zone}\n")).unwrap();
        let public = ThresholdPublic::Ec(std::sync::Arc::new(pk));
        public.zone_key(&hickory_proto::rr::Name::from_ascii(zone).unwrap(), 13).unwrap().ds_digest()
    }

    fn entry(name: &str, key_digest: [u8; 32], added_at: u64) -> ZoneEntry {
        ZoneEntry { name: name.into(), key_digest, added_at }
    }

    #[test]
    fn the_zone_set_at_start_is_the_states_or_the_configurations() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        // Never changed: the configuration's zones, indices 0..n in canonical order.
        let set = zone_set_at_start(&s, &exec::ExecState::default());
        let names: Vec<(u16, &str)> = set.iter().map(|(i, e)| (*i, e.name.as_str())).collect();
        assert_eq!(names, [(0, "2.0.192.in-addr.arpa."), (1, "example.test.")]);
        // Changed at run time: the state's, whatever the configuration says.
        let mut state = exec::ExecState::default();
        state.zone_set.insert(1, entry("example.test.", [0; 32], 0));
        state.zone_set.insert(4, entry("added.test.", [9; 32], 77));
        assert_eq!(zone_set_at_start(&s, &state), state.zone_set);
    }

    #[test]
    fn an_added_zone_is_read_from_its_dealt_files_and_its_share_counts_only_for_the_ordered_key() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        // No files at all: an error naming the public key file (the replica cannot serve it).
        let e = added_zone(&s, 4, &entry("added.test.", [1; 32], 50)).err().unwrap().to_string();
        assert!(e.contains("added.test.") && e.contains("zones/added.test/zone.pub.json"), "{e}");

        let digest = deal(dir.path(), "added.test.", 7);
        let zone = added_zone(&s, 4, &entry("added.test.", digest, 50)).unwrap();
        assert_eq!(zone.index, 4);
        assert_eq!(zone.settings.algorithm, 13);
        assert_eq!(zone.settings.apex, hickory_proto::rr::Name::from_ascii("added.test.").unwrap());
        assert_eq!(zone.settings.zone_file, dir.path().join("zones/added.test/zone.db"));
        // The cluster's transfer key, the zone's own update key (absent here).
        assert_eq!(zone.settings.transfer_keys, [dir.path().join("transfer.key")]);
        assert!(zone.settings.tsig_keys.is_empty());
        assert!(zone.keys.is_some(), "the share of the ordered key counts");
        assert_eq!(zone.key.ds_digest(), digest);

        // Another key than the replicas ordered: served, without the share.
        let other = added_zone(&s, 4, &entry("added.test.", [3; 32], 50)).unwrap();
        assert!(other.keys.is_none());
        assert_eq!(other.key.ds_digest(), digest);

        // The share file missing: served without it; the dealt zone data still used.
        std::fs::remove_file(dir.path().join("zones/added.test/share.json")).unwrap();
        let missing = added_zone(&s, 4, &entry("added.test.", digest, 50)).unwrap();
        assert!(missing.keys.is_none());
        assert_eq!(missing.settings.zone_file, dir.path().join("zones/added.test/zone.db"));

        // The zone file missing: served empty until state transfer, from a file of its own.
        std::fs::remove_file(dir.path().join("zones/added.test/zone.db")).unwrap();
        std::fs::create_dir_all(dir.path().join("state")).unwrap();
        let empty = added_zone(&s, 4, &entry("added.test.", digest, 50)).unwrap();
        let text = std::fs::read_to_string(&empty.settings.zone_file).unwrap();
        assert!(text.starts_with("added.test. 3600 IN SOA invalid. invalid. 0 "), "{text}");
    }
}
