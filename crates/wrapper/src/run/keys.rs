//! The keys a replica reads at start: each zone's threshold key share, and the TSIG and
//! SIG(0) keys its update authenticator checks.

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
pub(super) fn authenticator(s: &Settings, index: usize, zone: &ZoneSettings) -> Result<(Authenticator, Vec<TsigKey>, Vec<TsigKey>)> {
    let updates = zone.tsig_keys.iter().map(|p| load_tsig(p)).collect::<Result<Vec<_>>>()?;
    let transfers = zone.transfer_keys.iter().map(|p| load_tsig(p)).collect::<Result<Vec<_>>>()?;
    let sig0 = zone
        .sig0_keys
        .iter()
        .map(|path| Sig0Key::from_key_file(&read(path)?).map_err(|e| anyhow!("{}: {}: {e}", s.field_of(zone, "sig0_keys"), path.display())))
        .collect::<Result<Vec<_>>>()?;
    let auth = if s.zones.len() == 1 {
        Authenticator::new(s.auth.mode, &updates, &transfers, sig0, named_glue::time::unix_now)
    } else {
        // The settings bound the zone count far below u16::MAX.
        let index = u16::try_from(index).map_err(|_| anyhow!("zone index {index} out of range"))?;
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
