//! named.conf for one replica, with the settings that keep named
//! deterministic (docs/DETERMINISM.md), and TSIG key files.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use hickory_proto::rr::Name;

use crate::keys::{write_file, KeyError};
use crate::tools::BindTools;

/// Record types no update may touch: each would start named's timer-driven
/// (re)signing, which the replicas would not do in step. The wrapper refuses
/// them before ordering; named refuses them too through update-policy.
pub const REFUSED_UPDATE_TYPES: &[&str] = &["DNSKEY", "CDS", "CDNSKEY", "NSEC3PARAM", "TYPE65534"];

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfError {
    #[error("{what} {value:?} cannot be written into named.conf")]
    Unquotable { what: &'static str, value: String },
    #[error("sig-validity-interval of {0} days: must be 8..=3660 (re-sign equal to validity means no jitter only above 7 days)")]
    BadValidity(u32),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("two different TSIG keys are named {0:?}")]
    DuplicateKey(String),
    #[error("named.conf needs at least one zone")]
    NoZone,
    #[error("running named-checkconf: {0}")]
    Spawn(std::io::Error),
    #[error("named-checkconf rejected the configuration: {0}")]
    Rejected(String),
}

/// A TSIG key (RFC 8945) clients use to sign updates.
#[derive(Clone, PartialEq, Eq)]
pub struct TsigKey {
    /// Key name, e.g. `update-key`.
    pub name: String,
    /// BIND algorithm name, e.g. `hmac-sha256`.
    pub algorithm: String,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for TsigKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret never reaches logs.
        f.debug_struct("TsigKey").field("name", &self.name).field("algorithm", &self.algorithm).finish_non_exhaustive()
    }
}

impl TsigKey {
    pub fn hmac_sha256(name: &str, secret: Vec<u8>) -> Self {
        TsigKey { name: name.to_string(), algorithm: "hmac-sha256".to_string(), secret }
    }

    /// The `key` statement, usable in named.conf and as `nsupdate -k` file.
    pub fn statement(&self) -> Result<String, ConfError> {
        check_token("TSIG key name", &self.name)?;
        check_token("TSIG algorithm", &self.algorithm)?;
        Ok(format!(
            "key \"{}\" {{\n\talgorithm {};\n\tsecret \"{}\";\n}};\n",
            self.name,
            self.algorithm,
            base64::engine::general_purpose::STANDARD.encode(&self.secret)
        ))
    }

    /// Writes the key statement to `path` with mode 0600 (for nsupdate -k).
    pub fn write_key_file(&self, path: &Path) -> Result<(), ConfError> {
        write_file(path, self.statement()?.as_bytes(), 0o600)?;
        Ok(())
    }
}

/// Configuration of one replica's named: one process serving every zone of the cluster.
#[derive(Debug, Clone)]
pub struct NamedConf {
    /// named's working directory (relative paths resolve against it).
    pub directory: PathBuf,
    pub listen_address: Ipv4Addr,
    pub port: u16,
    pub pid_file: PathBuf,
    /// One `zone` statement each, in this order.
    pub zones: Vec<ZoneConf>,
    /// Keys named knows only to check and sign zone transfers; never granted updates.
    pub transfer_keys: Vec<TsigKey>,
    /// The key of the wrapper's ordered re-signing updates: granted RRSIG only, in every
    /// zone (with the BIND patch, deleting one exact RRSIG makes named sign that RRset again).
    pub maintenance_key: Option<TsigKey>,
    /// RRSIG validity in days; also the re-sign interval, so no jitter.
    pub sig_validity_days: u32,
    /// Every zone file is in BIND's raw format (`masterfile-format raw`), which named loads
    /// several times faster than text: a replica restarting named on a freshly signed zone
    /// holds its executor that much shorter. Write such files with [`BindTools::compile_raw`].
    ///
    /// [`BindTools::compile_raw`]: crate::tools::BindTools::compile_raw
    pub raw_zone_file: bool,
    /// The address NOTIFY to a zone's `also_notify` leaves from: the one secondaries list as
    /// this replica (a BIND secondary takes a NOTIFY only from an address among its primaries,
    /// whatever the port). `None`: the system picks it. Written only when some zone notifies.
    pub notify_source: Option<IpAddr>,
    /// The cluster's catalog zone (RFC 9432), served beside the member zones.
    pub catalog: Option<CatalogZoneConf>,
}

/// The catalog zone (RFC 9432) as named serves it: a plain primary zone from a text file the
/// wrapper writes, never updated and never signed (consumers authenticate it by TSIG or by
/// address, as the RFC expects; see docs/MULTIZONE.md, "The catalog zone").
#[derive(Debug, Clone)]
pub struct CatalogZoneConf {
    pub zone: Name,
    pub zone_file: PathBuf,
    /// External secondaries NOTIFYed after each change of the catalog (and at start).
    pub also_notify: Vec<SocketAddr>,
}

/// One zone of named.conf: its files and who may update it. TSIG keys are global in named,
/// so a key granted here must not be granted in another zone unless that is meant.
#[derive(Debug, Clone)]
pub struct ZoneConf {
    pub zone: Name,
    /// The (signed) zone file named loads and dumps into.
    pub zone_file: PathBuf,
    pub journal: PathBuf,
    /// The zone's public DNSKEY only (the private half is the replicas' threshold key).
    pub key_directory: PathBuf,
    /// Keys this zone's update-policy grants (with sdns: the replica-local keys the wrapper
    /// re-signs authenticated updates with, one per client identity and zone).
    pub tsig_keys: Vec<TsigKey>,
    /// The operator's update-policy (an adopted zone), its identities already the local
    /// keys; `None`: every key in `tsig_keys` may update the whole zone.
    pub update_policy: Option<Vec<PolicyRule>>,
    /// External secondaries named sends NOTIFY to after each change of the zone (and at
    /// start); empty: none, as named's NOTIFY to the zone's NS hosts stays off.
    pub also_notify: Vec<SocketAddr>,
}

impl ZoneConf {
    /// A zone with its files under `dir`: zone.db, zone.db.jnl, keys/.
    pub fn in_dir(zone: &Name, dir: &Path, tsig_keys: Vec<TsigKey>) -> Self {
        ZoneConf {
            zone: zone.clone(),
            zone_file: dir.join("zone.db"),
            journal: dir.join("zone.db.jnl"),
            key_directory: dir.join("keys"),
            tsig_keys,
            update_policy: None,
            also_notify: Vec::new(),
        }
    }
}

/// The update-policy rule types that decide by the key's name and the updated name only.
/// The others (self, selfsub, krb5-*, tcp-self, external, ...) compare the signer's own
/// name or the client's address, which the wrapper's re-signing with a local key and
/// named seeing every client as the loopback address would change.
pub const POLICY_RULE_TYPES: &[&str] = &["name", "subdomain", "zonesub", "wildcard"];

/// One update-policy rule: `grant|deny IDENTITY RULETYPE [NAME] [TYPES...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRule {
    pub grant: bool,
    /// A key name, or `*` for any key.
    pub identity: String,
    pub rule_type: String,
    /// The name the rule type matches against (absent for zonesub).
    pub name: Option<String>,
    /// Record types, e.g. `A`, `TXT`, `ANY`, or with a quota `A(2)`; empty: BIND's default.
    pub types: Vec<String>,
}

impl PolicyRule {
    /// Parses a rule from its words as `named-checkconf -p` prints them (quotes removed).
    pub fn parse(words: &[&str]) -> Result<PolicyRule, String> {
        let [verb, identity, rule_type, rest @ ..] = words else {
            return Err(format!("rule {:?} is not `grant|deny IDENTITY RULETYPE ...`", words.join(" ")));
        };
        let grant = match verb.to_ascii_lowercase().as_str() {
            "grant" => true,
            "deny" => false,
            other => return Err(format!("rule starts with {other:?}, not grant or deny")),
        };
        let rule_type = rule_type.to_ascii_lowercase();
        if !POLICY_RULE_TYPES.contains(&rule_type.as_str()) {
            return Err(format!("update-policy rule type `{rule_type}` is not supported (only {})", POLICY_RULE_TYPES.join(", ")));
        }
        let (name, types) = match (rule_type.as_str(), rest) {
            ("zonesub", types) => (None, types),
            (_, [name, types @ ..]) => (Some(name.to_string()), types),
            (_, []) => return Err(format!("update-policy rule type `{rule_type}` needs a name")),
        };
        let rule = PolicyRule { grant, identity: identity.to_string(), rule_type, name, types: types.iter().map(|t| t.to_ascii_uppercase()).collect() };
        rule.check().map_err(|e| e.to_string())?;
        Ok(rule)
    }

    fn check(&self) -> Result<(), ConfError> {
        check_token("update-policy identity", &self.identity)?;
        if let Some(name) = &self.name {
            check_token("update-policy name", name)?;
            let bare = name.strip_prefix("*.").unwrap_or(name);
            if bare != "." && Name::from_ascii(bare).is_err() {
                return Err(ConfError::Unquotable { what: "update-policy name", value: name.clone() });
            }
        }
        for t in &self.types {
            let (ty, quota) = match t.split_once('(') {
                Some((ty, q)) => (ty, Some(q)),
                None => (t.as_str(), None),
            };
            let quota_ok = quota.is_none_or(|q| q.strip_suffix(')').is_some_and(|d| !d.is_empty() && d.len() <= 9 && d.bytes().all(|b| b.is_ascii_digit())));
            if ty.is_empty() || !ty.bytes().all(|b| b.is_ascii_alphanumeric()) || !quota_ok {
                return Err(ConfError::Unquotable { what: "update-policy type", value: t.clone() });
            }
        }
        Ok(())
    }

    /// The rule as named.conf takes it.
    pub fn render(&self) -> Result<String, ConfError> {
        self.check()?;
        let mut s = format!("{} \"{}\" {}", if self.grant { "grant" } else { "deny" }, self.identity, self.rule_type);
        if let Some(name) = &self.name {
            s += &format!(" \"{name}\"");
        }
        for t in &self.types {
            s += &format!(" {t}");
        }
        Ok(s)
    }
}

impl NamedConf {
    /// One zone with every file under `directory`: zone.db, zone.db.jnl, keys/,
    /// named.pid; listening on 127.0.0.1:`port`.
    pub fn new(directory: &Path, port: u16, zone: &Name, tsig_keys: Vec<TsigKey>) -> Self {
        let mut conf = NamedConf::without_zones(directory, port);
        conf.zones.push(ZoneConf::in_dir(zone, directory, tsig_keys));
        conf
    }

    /// No zone yet (push [`ZoneConf`]s); named.pid under `directory`.
    pub fn without_zones(directory: &Path, port: u16) -> Self {
        NamedConf {
            directory: directory.to_path_buf(),
            listen_address: Ipv4Addr::LOCALHOST,
            port,
            pid_file: directory.join("named.pid"),
            zones: Vec::new(),
            transfer_keys: Vec::new(),
            maintenance_key: None,
            sig_validity_days: 30,
            raw_zone_file: false,
            notify_source: None,
            catalog: None,
        }
    }

    /// The first zone (the only one of a single-zone cluster).
    pub fn first_zone(&self) -> Option<&ZoneConf> {
        self.zones.first()
    }

    /// Every key statement, once each: a key granted in several zones (the catch-up key) is
    /// declared once; two different keys with one name are refused.
    fn key_statements(&self) -> Result<String, ConfError> {
        let mut seen: Vec<&TsigKey> = Vec::new();
        let mut out = String::new();
        for key in self.zones.iter().flat_map(|z| &z.tsig_keys).chain(&self.transfer_keys).chain(&self.maintenance_key) {
            if let Some(earlier) = seen.iter().find(|k| k.name.eq_ignore_ascii_case(&key.name)) {
                if *earlier != key {
                    return Err(ConfError::DuplicateKey(key.name.clone()));
                }
                continue;
            }
            seen.push(key);
            out.push_str(&key.statement()?);
        }
        Ok(out)
    }

    /// Signature validity in seconds, as the wrapper must use it.
    pub fn sig_validity_secs(&self) -> u32 {
        self.sig_validity_days.saturating_mul(86_400)
    }

    pub fn render(&self) -> Result<String, ConfError> {
        if !(8..=3660).contains(&self.sig_validity_days) {
            return Err(ConfError::BadValidity(self.sig_validity_days));
        }
        if self.zones.is_empty() {
            return Err(ConfError::NoZone);
        }
        let dir = quoted_path("directory", &self.directory)?;
        let pid = quoted_path("pid-file", &self.pid_file)?;
        let session_key = quoted_path("session-keyfile", &self.directory.join("session.key"))?;
        let mut out = self.key_statements()?;
        out.push_str(&format!(
            "options {{\n\
             \tdirectory {dir};\n\
             \tpid-file {pid};\n\
             \tsession-keyfile {session_key};\n\
             \tlisten-on port {port} {{ {addr}; }};\n\
             \tlisten-on-v6 {{ none; }};\n\
             \trecursion no;\n\
             \tdnssec-validation no;\n\
             \tnotify no;\n\
             \tanswer-cookie no;\n\
             \trrset-order {{ order none; }};\n\
             \t// Every client reaches named through the sdns wrapper, so named sees\n\
             \t// them all as the loopback address: client-address ACLs here would\n\
             \t// mean nothing. The wrapper enforces them ([access] in replica.toml).\n\
             \tallow-query {{ any; }};\n\
             \tallow-transfer {{ any; }};\n\
             \tversion none;\n\
             \thostname none;\n\
             \tserver-id none;\n\
             {notify_source}\
             }};\n\
             controls {{ }};\n",
            port = self.port,
            addr = self.listen_address,
            notify_source = self.notify_source_option(),
        ));
        for z in &self.zones {
            let zone_file = quoted_path("zone file", &z.zone_file)?;
            let journal = quoted_path("journal", &z.journal)?;
            let key_dir = quoted_path("key-directory", &z.key_directory)?;
            let mut zone = z.zone.to_lowercase().to_ascii();
            if !zone.ends_with('.') {
                zone.push('.');
            }
            check_token("zone name", &zone)?;
            out.push_str(&format!(
                "zone \"{zone}\" {{\n\
                 \ttype primary;\n\
                 \tfile {zone_file};\n\
                 {format}\
                 \tjournal {journal};\n\
                 \tkey-directory {key_dir};\n\
                 \tsig-validity-interval {v} {v};\n\
                 \tdnssec-update-mode no-resign;\n\
                 \tserial-update-method increment;\n\
                 \tupdate-policy {{\n{policy}\t}};\n\
                 {notify}\
                 }};\n",
                v = self.sig_validity_days,
                format = if self.raw_zone_file { "\tmasterfile-format raw;\n" } else { "" },
                policy = self.update_policy(z)?,
                notify = also_notify(&z.also_notify),
            ));
        }
        if let Some(catalog) = &self.catalog {
            out.push_str(&catalog.render()?);
        }
        Ok(out)
    }

    /// `notify-source` (or `-v6`) when some zone sends NOTIFY and the address is given.
    fn notify_source_option(&self) -> String {
        match self.notify_source {
            Some(ip) if self.zones.iter().map(|z| &z.also_notify).chain(self.catalog.as_ref().map(|c| &c.also_notify)).any(|n| !n.is_empty()) => {
                let v6 = if ip.is_ipv6() { "-v6" } else { "" };
                format!("\tnotify-source{v6} {ip};\n")
            }
            _ => String::new(),
        }
    }

    fn update_policy(&self, z: &ZoneConf) -> Result<String, ConfError> {
        let refused = REFUSED_UPDATE_TYPES.join(" ");
        let mut rules = String::new();
        // First match wins: the denials come before the grants.
        for key in &z.tsig_keys {
            check_token("TSIG key name", &key.name)?;
            rules.push_str(&format!("\t\tdeny \"{}\" zonesub {refused};\n", key.name));
        }
        match &z.update_policy {
            Some(policy) => {
                for rule in policy {
                    rules.push_str(&format!("\t\t{};\n", rule.render()?));
                }
            }
            None => {
                for key in &z.tsig_keys {
                    rules.push_str(&format!("\t\tgrant \"{}\" zonesub ANY;\n", key.name));
                }
            }
        }
        if let Some(key) = &self.maintenance_key {
            check_token("TSIG key name", &key.name)?;
            rules.push_str(&format!("\t\tgrant \"{}\" zonesub RRSIG;\n", key.name));
        }
        if rules.is_empty() {
            // update-policy needs a rule; this one matches no signed request.
            rules.push_str(&format!("\t\tdeny * zonesub {refused};\n"));
        }
        Ok(rules)
    }

    /// Writes named.conf (0600: it holds TSIG secrets).
    pub fn write(&self, path: &Path) -> Result<(), ConfError> {
        write_file(path, self.render()?.as_bytes(), 0o600)?;
        Ok(())
    }
}

impl CatalogZoneConf {
    /// Its zone statement: text format (a few lines, rewritten by the wrapper), no updates,
    /// no journal, no DNSSEC.
    fn render(&self) -> Result<String, ConfError> {
        let mut zone = self.zone.to_lowercase().to_ascii();
        if !zone.ends_with('.') {
            zone.push('.');
        }
        check_token("catalog zone name", &zone)?;
        let file = quoted_path("catalog zone file", &self.zone_file)?;
        Ok(format!("zone \"{zone}\" {{\n\ttype primary;\n\tfile {file};\n\tallow-update {{ none; }};\n{notify}}};\n", notify = also_notify(&self.also_notify)))
    }
}

/// A zone's NOTIFY settings: none without secondaries (the options' `notify no` holds), else
/// NOTIFY to exactly these (`explicit`: never to the NS hosts, which may be the replicas).
/// NOTIFY is output only: it changes no zone, so the replicas need not send it in step
/// (docs/DETERMINISM.md). `notify-delay 1` (named's default is 5 s) keeps a change's NOTIFY
/// from waiting long behind the last one, while a stream of updates still makes at most one
/// NOTIFY a second per secondary.
fn also_notify(targets: &[SocketAddr]) -> String {
    if targets.is_empty() {
        return String::new();
    }
    let list: String = targets.iter().map(|t| format!(" {} port {};", t.ip(), t.port())).collect();
    format!("\tnotify explicit;\n\tnotify-delay 1;\n\talso-notify {{{list} }};\n")
}

/// Runs the build's named-checkconf on `conf`.
pub fn check_conf(tools: &BindTools, conf: &Path) -> Result<(), ConfError> {
    let out = Command::new(tools.bin("named-checkconf")).arg(conf).output().map_err(ConfError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ConfError::Rejected(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))))
    }
}

fn check_token(what: &'static str, value: &str) -> Result<(), ConfError> {
    let bad = value.is_empty() || value.chars().any(|c| c == '"' || c == '\\' || c == ';' || c.is_control() || c.is_whitespace());
    if bad {
        return Err(ConfError::Unquotable { what, value: value.to_string() });
    }
    Ok(())
}

fn quoted_path(what: &'static str, path: &Path) -> Result<String, ConfError> {
    let s = path.to_str().ok_or_else(|| ConfError::Unquotable { what, value: path.to_string_lossy().into_owned() })?;
    if s.is_empty() || s.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
        return Err(ConfError::Unquotable { what, value: s.to_string() });
    }
    Ok(format!("\"{s}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_determinism_settings() {
        let zone = Name::from_ascii("Example.TEST.").unwrap();
        let conf = NamedConf::new(Path::new("/tmp/r1"), 5353, &zone, vec![TsigKey::hmac_sha256("k1", vec![1; 32])]);
        let text = conf.render().unwrap();
        for needle in [
            "zone \"example.test.\"",
            "sig-validity-interval 30 30;",
            "dnssec-update-mode no-resign;",
            "serial-update-method increment;",
            "rrset-order { order none; };",
            "answer-cookie no;",
            "controls { };",
            "notify no;",
            "listen-on port 5353 { 127.0.0.1; };",
            "listen-on-v6 { none; };",
            "deny \"k1\" zonesub DNSKEY CDS CDNSKEY NSEC3PARAM TYPE65534;",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        for absent in ["auto-dnssec", "dnssec-policy", "inline-signing"] {
            assert!(!text.contains(absent));
        }
        assert!(text.find("deny \"k1\"").unwrap() < text.find("grant \"k1\"").unwrap());
    }

    #[test]
    fn secondaries_are_notified_explicitly_per_zone() {
        let dir = Path::new("/tmp/r1");
        let mut conf = NamedConf::without_zones(dir, 5353);
        conf.notify_source = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let quiet = ZoneConf::in_dir(&Name::from_ascii("quiet.test.").unwrap(), &dir.join("zones/quiet.test"), vec![]);
        conf.zones.push(quiet);
        // No zone notifies: named.conf is as it always was.
        let text = conf.render().unwrap();
        assert!(text.contains("\tnotify no;") && !text.contains("notify-source") && !text.contains("also-notify"), "{text}");
        let mut loud = ZoneConf::in_dir(&Name::from_ascii("loud.test.").unwrap(), &dir.join("zones/loud.test"), vec![]);
        loud.also_notify = vec!["192.0.2.53:53".parse().unwrap(), "[2001:db8::53]:5300".parse().unwrap()];
        conf.zones.push(loud);
        let text = conf.render().unwrap();
        assert!(text.contains("\tnotify no;") && text.contains("\tnotify-source 127.0.0.1;"), "{text}");
        let loud_stmt = &text[text.find("zone \"loud.test.\"").unwrap()..];
        assert!(loud_stmt.contains("\tnotify explicit;\n\tnotify-delay 1;\n\talso-notify { 192.0.2.53 port 53; 2001:db8::53 port 5300; };"), "{loud_stmt}");
        let quiet_stmt = &text[text.find("zone \"quiet.test.\"").unwrap()..text.find("zone \"loud.test.\"").unwrap()];
        assert!(!quiet_stmt.contains("notify"), "{quiet_stmt}");
        conf.notify_source = Some("2001:db8::1".parse().unwrap());
        assert!(conf.render().unwrap().contains("\tnotify-source-v6 2001:db8::1;"));
    }

    #[test]
    fn the_catalog_is_a_plain_primary_zone_notifying_its_secondaries() {
        let dir = Path::new("/tmp/r1");
        let mut conf = NamedConf::new(dir, 5353, &Name::from_ascii("example.test.").unwrap(), vec![]);
        conf.raw_zone_file = true;
        conf.notify_source = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        conf.catalog =
            Some(CatalogZoneConf { zone: Name::from_ascii("Catalog.SDNS").unwrap(), zone_file: dir.join("catalog/catalog.db"), also_notify: Vec::new() });
        let text = conf.render().unwrap();
        let stmt = &text[text.find("zone \"catalog.sdns.\" {").unwrap_or_else(|| panic!("{text}"))..];
        assert_eq!(stmt, "zone \"catalog.sdns.\" {\n\ttype primary;\n\tfile \"/tmp/r1/catalog/catalog.db\";\n\tallow-update { none; };\n};\n");
        // Without NOTIFY targets anywhere, no notify-source either.
        assert!(!text.contains("notify-source"), "{text}");
        // Text, not raw (the wrapper writes it), and nothing that signs or takes updates.
        for absent in ["masterfile-format", "update-policy", "key-directory", "sig-validity"] {
            assert!(!stmt.contains(absent), "{absent} in {stmt}");
        }
        conf.catalog.as_mut().unwrap().also_notify = vec!["192.0.2.53:53".parse().unwrap()];
        let text = conf.render().unwrap();
        assert!(text.contains("\tnotify-source 127.0.0.1;"), "{text}");
        let stmt = &text[text.find("zone \"catalog.sdns.\" {").unwrap()..];
        assert!(stmt.contains("\tnotify explicit;\n\tnotify-delay 1;\n\talso-notify { 192.0.2.53 port 53; };"), "{stmt}");
    }

    #[test]
    fn transfer_keys_are_known_but_never_granted() {
        let zone = Name::from_ascii("example.test.").unwrap();
        let mut conf = NamedConf::new(Path::new("/tmp/r1"), 5353, &zone, vec![TsigKey::hmac_sha256("tsig-0.sdns-local", vec![1; 32])]);
        conf.transfer_keys = vec![TsigKey { name: "xfr".into(), algorithm: "hmac-sha512".into(), secret: vec![2; 64] }];
        let text = conf.render().unwrap();
        assert!(text.contains("key \"xfr\" {\n\talgorithm hmac-sha512;"), "{text}");
        assert!(text.contains("grant \"tsig-0.sdns-local\" zonesub ANY;"), "{text}");
        assert!(!text.contains("grant \"xfr\"") && !text.contains("deny \"xfr\""), "{text}");
    }

    #[test]
    fn maintenance_key_is_granted_rrsig_only() {
        let zone = Name::from_ascii("example.test.").unwrap();
        let mut conf = NamedConf::new(Path::new("/tmp/r1"), 5353, &zone, vec![]);
        conf.maintenance_key = Some(TsigKey::hmac_sha256("resign.sdns-local", vec![3; 32]));
        let text = conf.render().unwrap();
        assert!(text.contains("key \"resign.sdns-local\" {"), "{text}");
        assert!(text.contains("grant \"resign.sdns-local\" zonesub RRSIG;"), "{text}");
        assert!(!text.contains("grant \"resign.sdns-local\" zonesub ANY"), "{text}");
        // The catch-all denial is only for a policy without any grant.
        assert!(!text.contains("deny * zonesub"), "{text}");
    }

    #[test]
    fn operator_policy_replaces_the_blanket_grant_after_the_denials() {
        let zone = Name::from_ascii("example.test.").unwrap();
        let mut conf = NamedConf::new(Path::new("/tmp/r1"), 5353, &zone, vec![TsigKey::hmac_sha256("tsig-0.sdns-local", vec![1; 32])]);
        let rule = |w: &str| PolicyRule::parse(&w.split(' ').collect::<Vec<_>>()).unwrap();
        let mut grant = rule("grant dhcp zonesub A PTR(2)");
        grant.identity = "tsig-0.sdns-local".into();
        let mut deny = rule("deny dhcp name www.example.test. A");
        deny.identity = "tsig-0.sdns-local".into();
        conf.zones[0].update_policy = Some(vec![deny, grant]);
        let text = conf.render().unwrap();
        let at = |n: &str| text.find(n).unwrap_or_else(|| panic!("no {n} in\n{text}"));
        assert!(at("deny \"tsig-0.sdns-local\" zonesub DNSKEY") < at("deny \"tsig-0.sdns-local\" name \"www.example.test.\" A;"));
        assert!(at("name \"www.example.test.\" A;") < at("grant \"tsig-0.sdns-local\" zonesub A PTR(2);"));
        assert!(!text.contains("zonesub ANY"), "{text}");
    }

    #[test]
    fn several_zones_each_grant_only_their_own_keys() {
        let dir = Path::new("/tmp/r1");
        let forward = Name::from_ascii("example.test.").unwrap();
        let reverse = Name::from_ascii("2.0.192.in-addr.arpa.").unwrap();
        let catchup = TsigKey::hmac_sha256("catchup.sdns-local", vec![9; 32]);
        let mut conf = NamedConf::without_zones(dir, 5353);
        conf.zones.push(ZoneConf::in_dir(
            &reverse,
            &dir.join("zones/2.0.192.in-addr.arpa"),
            vec![TsigKey::hmac_sha256("tsig-0-0.sdns-local", vec![1; 32]), catchup.clone()],
        ));
        conf.zones.push(ZoneConf::in_dir(&forward, &dir.join("zones/example.test"), vec![TsigKey::hmac_sha256("tsig-1-0.sdns-local", vec![2; 32]), catchup]));
        conf.maintenance_key = Some(TsigKey::hmac_sha256("resign.sdns-local", vec![3; 32]));
        let text = conf.render().unwrap();
        let reverse_at = text.find("zone \"2.0.192.in-addr.arpa.\" {").unwrap_or_else(|| panic!("{text}"));
        let forward_at = text.find("zone \"example.test.\" {").unwrap_or_else(|| panic!("{text}"));
        assert!(reverse_at < forward_at, "{text}");
        let (reverse_stmt, forward_stmt) = (&text[reverse_at..forward_at], &text[forward_at..]);
        assert!(reverse_stmt.contains("file \"/tmp/r1/zones/2.0.192.in-addr.arpa/zone.db\";"), "{reverse_stmt}");
        assert!(reverse_stmt.contains("key-directory \"/tmp/r1/zones/2.0.192.in-addr.arpa/keys\";"), "{reverse_stmt}");
        assert!(reverse_stmt.contains("grant \"tsig-0-0.sdns-local\" zonesub ANY;") && !reverse_stmt.contains("tsig-1-0"), "{reverse_stmt}");
        assert!(forward_stmt.contains("grant \"tsig-1-0.sdns-local\" zonesub ANY;") && !forward_stmt.contains("tsig-0-0"), "{forward_stmt}");
        for stmt in [reverse_stmt, forward_stmt] {
            assert!(stmt.contains("grant \"resign.sdns-local\" zonesub RRSIG;"), "{stmt}");
            assert!(stmt.contains("grant \"catchup.sdns-local\" zonesub ANY;"), "{stmt}");
        }
        // A key granted in two zones is declared once; named refuses a key declared twice.
        assert_eq!(text.matches("key \"catchup.sdns-local\" {").count(), 1, "{text}");
        // Two different keys under one name are refused rather than one silently dropped.
        conf.zones[1].tsig_keys.push(TsigKey::hmac_sha256("tsig-0-0.sdns-local", vec![7; 32]));
        assert!(matches!(conf.render(), Err(ConfError::DuplicateKey(name)) if name == "tsig-0-0.sdns-local"));
        conf.zones.clear();
        assert!(matches!(conf.render(), Err(ConfError::NoZone)));
    }

    #[test]
    fn policy_rules_parse_or_say_why_not() {
        let p = |w: &str| PolicyRule::parse(&w.split(' ').collect::<Vec<_>>());
        let r = p("grant k subdomain hosts.example.test ANY").unwrap();
        assert_eq!(
            (r.grant, r.rule_type.as_str(), r.name.as_deref(), r.types.clone()),
            (true, "subdomain", Some("hosts.example.test"), vec!["ANY".to_string()])
        );
        assert_eq!(p("deny * wildcard *.example.test txt").unwrap().types, vec!["TXT"]);
        assert_eq!(p("grant k zonesub").unwrap().types, Vec::<String>::new());
        for (bad, why) in [
            ("grant k self . A", "`self` is not supported"),
            ("grant k tcp-self . PTR", "not supported"),
            ("allow k zonesub A", "not grant or deny"),
            ("grant k name", "needs a name"),
            ("grant k", "is not"),
            ("grant k zonesub A;B", "cannot be written"),
            ("grant k zonesub A(x)", "cannot be written"),
            ("grant k\" zonesub A", "cannot be written"),
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn rejects_bad_values() {
        let zone = Name::from_ascii("example.test.").unwrap();
        let mut conf = NamedConf::new(Path::new("/tmp/a\"b"), 1, &zone, vec![]);
        assert!(matches!(conf.render(), Err(ConfError::Unquotable { .. })));
        conf.directory = PathBuf::from("/tmp/ok");
        conf.sig_validity_days = 7;
        assert!(matches!(conf.render(), Err(ConfError::BadValidity(7))));
        let key = TsigKey::hmac_sha256("bad name", vec![1]);
        assert!(key.statement().is_err());
    }
}
