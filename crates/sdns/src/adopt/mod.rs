//! `sdns adopt`: take zones from an existing BIND installation into a new cluster.
//!
//! The configuration is read through BIND's own parser (`named-checkconf -p` prints it in
//! canonical form with includes resolved), so what is adopted is what that named loads.
//! For the chosen primary zone it takes the data (the zone file, normalised by
//! `named-compilezone`, or an AXFR from the running named), the TSIG keys its
//! update-policy / allow-update and allow-transfer name (kept as they are, so nsupdate
//! scripts and DHCP servers keep their key files), and the update-policy rules, then
//! deals the cluster's keys as `sdns keygen` does. A zone it cannot take keeps its
//! reasons in the report; nothing is dropped silently.
//!
//! Every zone given with `--zone` is adopted into the one cluster of a run, each with its own
//! threshold key, keys, rules and data (`[[zone]]` tables with several); the report names
//! every other zone and why it was not taken, and a chosen zone that cannot be adopted stops
//! the run with its reasons before anything is dealt.

pub mod bindconf;
pub mod rollover;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};

use exec::auth::TsigKey;

use self::bindconf::Statement;
use crate::adopted::{self as record, absolute_name, Adopted, ADOPTED_FILE};
use crate::files::{write_public, write_secret};
use crate::keygen::{keygen, replica_dir, write_configs, ClusterParams};

/// A TSIG key from a `key` statement.
#[derive(Clone)]
pub struct ConfKey {
    pub name: String,
    pub algorithm: String,
    pub secret_b64: String,
}

/// What the adoption would take for one zone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The zone file as named.conf names it, resolved against `options { directory }`.
    pub file: Option<PathBuf>,
    /// `masterfile-format` (text when absent).
    pub format: Option<String>,
    /// Keys the update rules name, in first-use order.
    pub update_keys: Vec<String>,
    /// Keys allow-transfer names.
    pub transfer_keys: Vec<String>,
    /// Address prefixes allow-transfer names (for `[access] allow_transfer`).
    pub transfer_addresses: Vec<String>,
    /// update-policy rules (allow-update keys become `grant KEY zonesub ANY`).
    pub policy: Vec<String>,
    /// What is not carried over but does not stop the adoption.
    pub notes: Vec<String>,
    /// Why the zone is signed with the operator's own key (`dnssec-policy NAME`, `auto-dnssec
    /// MODE`); such a zone is adopted with a double-KSK rollover to the threshold key.
    pub signed: Option<String>,
    /// Where named keeps the zone's keys (`key-directory`, else `directory`).
    pub key_directory: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Adoptable(Plan),
    /// A primary zone that cannot be adopted, with every reason found.
    Unsupported(Vec<String>),
    /// Not a candidate at all (not primary, a built-in zone): why.
    NotCandidate(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneReport {
    /// Absolute, lower case (`example.com.`).
    pub name: String,
    pub view: Option<String>,
    pub verdict: Verdict,
}

/// Everything named.conf holds that the adoption needs.
pub struct Inventory {
    pub zones: Vec<ZoneReport>,
    pub keys: BTreeMap<String, ConfKey>,
}

/// Zone options that the adoption takes, or knows it may leave behind (with a note where
/// that changes behaviour). Any other option makes the zone unsupported: the adoption
/// does not know what it would lose.
const KNOWN_ZONE_OPTIONS: &[&str] = &[
    "type",
    "file",
    "update-policy",
    "allow-update",
    "allow-transfer",
    "allow-query",
    "notify",
    "also-notify",
    "notify-source",
    "notify-source-v6",
    "check-names",
    "masterfile-format",
    "journal",
    "max-journal-size",
    "ixfr-from-differences",
    "zone-statistics",
    "serial-update-method",
    "key-directory",
    "dnssec-policy",
    "inline-signing",
    "auto-dnssec",
];

/// Known zone options the adoption reads past: the replicas' named has its own journal,
/// key directory, serial method (increment) and checks.
const NOT_CARRIED: &[&str] = &[
    "check-names",
    "journal",
    "max-journal-size",
    "ixfr-from-differences",
    "zone-statistics",
    "serial-update-method",
    "key-directory",
    "notify-source",
    "notify-source-v6",
];

/// The zones Debian's named.conf.default-zones (and RFC 6761/6303 practice) defines
/// locally: they belong to each host's own named, not to a replicated service.
const BUILT_IN_ZONES: &[&str] =
    &["localhost.", "127.in-addr.arpa.", "0.in-addr.arpa.", "255.in-addr.arpa.", "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa."];

fn key_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Why the double-KSK rollover cannot take a zone whose KSK uses DNSSEC algorithm `ksk` to a
/// threshold key of algorithm `threshold` (`--algorithm`); `None` when it can. The list and
/// the adoption ask this one check, so that the list never calls a zone adoptable that the
/// adoption then refuses for its algorithm.
pub fn algorithm_refusal(ksk: u8, threshold: u8) -> Option<String> {
    if ksk == threshold {
        return None;
    }
    // What `sdns keygen` can deal a threshold key of: RSA (8, 10), ECDSA P-256 (13), Ed25519 (15).
    let dealt = if shoup_rsa::HashAlg::from_dnssec_alg(ksk).is_some() || wrapper::files::is_ec_algorithm(ksk) {
        format!(" (--algorithm {ksk} adopts it)")
    } else {
        format!("; sdns deals no threshold key of algorithm {ksk} yet (8, 10, 13 and 15 only)")
    };
    Some(format!(
        "your KSK uses DNSSEC algorithm {ksk}, the threshold key {threshold} (--algorithm): a rollover that also changes the algorithm is not supported (the zone would have to be signed with both algorithms meanwhile){dealt}"
    ))
}

/// The algorithms of a `dnssec-policy`'s KSKs and CSKs, as named.conf (or BIND 9.18's
/// built-in `default`, one CSK of algorithm 13) gives them; empty when unknown.
fn policy_ksk_algorithms(policies: &BTreeMap<String, &Statement>, name: &str) -> Vec<u8> {
    if name == "default" {
        return vec![13];
    }
    let Some(policy) = policies.get(name) else { return Vec::new() };
    let mut out = Vec::new();
    for keys in policy.children("keys") {
        for key in keys.block().unwrap_or(&[]) {
            let words = key.words();
            if !matches!(words.first().map(|w| w.to_ascii_lowercase()).as_deref(), Some("ksk" | "csk")) {
                continue;
            }
            let alg = words.iter().position(|w| w.eq_ignore_ascii_case("algorithm")).and_then(|i| words.get(i + 1)).and_then(|a| algorithm_number(a));
            if let Some(a) = alg.filter(|a| !out.contains(a)) {
                out.push(a);
            }
        }
    }
    out
}

/// A DNSSEC algorithm as named.conf writes it: a number or BIND's mnemonic.
fn algorithm_number(text: &str) -> Option<u8> {
    const NAMES: &[(&str, u8)] = &[
        ("rsasha1", 5),
        ("nsec3rsasha1", 7),
        ("rsasha256", 8),
        ("rsasha512", 10),
        ("ecdsap256sha256", 13),
        ("ecdsa256", 13),
        ("ecdsap384sha384", 14),
        ("ecdsa384", 14),
        ("ed25519", 15),
        ("ed448", 16),
    ];
    text.parse().ok().or_else(|| NAMES.iter().find(|(n, _)| text.eq_ignore_ascii_case(n)).map(|(_, a)| *a))
}

/// Reads the statements of `named-checkconf -p` into zones and keys, deciding for every
/// zone whether it can be adopted into a cluster whose threshold keys use DNSSEC
/// algorithm `algorithm`.
pub fn inventory(statements: &[Statement], conf_dir: &Path, algorithm: u8) -> Inventory {
    let mut keys = BTreeMap::new();
    let mut acls: BTreeMap<String, &Statement> = BTreeMap::new();
    let mut policies: BTreeMap<String, &Statement> = BTreeMap::new();
    let mut options: Option<&Statement> = None;
    for s in statements {
        match s.keyword().as_deref() {
            Some("key") => {
                if let (Some(name), Some(alg), Some(secret)) = (s.arg(), s.child("algorithm").and_then(|a| a.arg()), s.child("secret").and_then(|a| a.arg())) {
                    keys.insert(
                        key_name(name),
                        ConfKey { name: name.trim_end_matches('.').to_owned(), algorithm: alg.to_ascii_lowercase(), secret_b64: secret.to_owned() },
                    );
                }
            }
            Some("acl") => {
                if let Some(name) = s.arg() {
                    acls.insert(name.to_ascii_lowercase(), s);
                }
            }
            Some("options") => options = Some(s),
            Some("dnssec-policy") => {
                if let Some(name) = s.arg() {
                    policies.insert(name.to_owned(), s);
                }
            }
            _ => {}
        }
    }
    let directory = options.and_then(|o| o.child("directory")).and_then(|d| d.arg()).map(PathBuf::from).unwrap_or_else(|| conf_dir.to_owned());
    let ctx = Scope { keys: &keys, acls: &acls, policies: &policies, options, directory, algorithm };
    let mut zones = Vec::new();
    for s in statements {
        match s.keyword().as_deref() {
            Some("zone") => zones.push(ctx.zone(s, None)),
            Some("view") => {
                let view = s.arg().unwrap_or("").to_owned();
                for z in s.children("zone") {
                    zones.push(ctx.zone(z, Some(view.clone())));
                }
            }
            _ => {}
        }
    }
    Inventory { zones, keys }
}

struct Scope<'a> {
    keys: &'a BTreeMap<String, ConfKey>,
    acls: &'a BTreeMap<String, &'a Statement>,
    policies: &'a BTreeMap<String, &'a Statement>,
    options: Option<&'a Statement>,
    directory: PathBuf,
    /// The threshold keys' DNSSEC algorithm.
    algorithm: u8,
}

/// An address match list, with named ACLs expanded: the keys it names, and the
/// elements that are not keys (addresses, prefixes, any, negations), as written.
#[derive(Default)]
struct MatchList {
    keys: Vec<String>,
    others: Vec<String>,
    none: bool,
}

impl Scope<'_> {
    /// The zone's option, or the global one from `options`.
    fn option<'s>(&'s self, zone: &'s Statement, name: &str) -> Option<&'s Statement> {
        zone.child(name).or_else(|| self.options.and_then(|o| o.child(name)))
    }

    fn match_list(&self, list: &Statement) -> MatchList {
        let mut out = MatchList::default();
        self.expand(list.block().unwrap_or(&[]), &mut out, 0);
        out
    }

    fn expand(&self, elements: &[Statement], out: &mut MatchList, depth: usize) {
        for e in elements {
            let words = e.words();
            match words.as_slice() {
                ["key", k] => out.keys.push(key_name(k)),
                ["none"] => out.none = true,
                [one] if depth < 8 && self.acls.contains_key(&one.to_ascii_lowercase()) => {
                    let acl = self.acls[&one.to_ascii_lowercase()];
                    self.expand(acl.block().unwrap_or(&[]), out, depth + 1);
                }
                _ if e.block().is_some() => self.expand(e.block().unwrap_or(&[]), out, depth + 1),
                _ => out.others.push(words.join(" ")),
            }
        }
    }

    fn zone(&self, z: &Statement, view: Option<String>) -> ZoneReport {
        let name = absolute_name(z.arg().unwrap_or(""));
        let report = |verdict| ZoneReport { name: name.clone(), view: view.clone(), verdict };
        let zone_type = z.child("type").and_then(|t| t.arg()).unwrap_or("").to_ascii_lowercase();
        if zone_type != "primary" && zone_type != "master" {
            return report(Verdict::NotCandidate(format!("type {zone_type}: only primary zones are adopted")));
        }
        if BUILT_IN_ZONES.contains(&name.as_str()) {
            return report(Verdict::NotCandidate("a built-in local zone (it stays with each host's own named)".into()));
        }
        let mut why = Vec::new();
        let key_directory = match self.option(z, "key-directory").and_then(|d| d.arg()).map(PathBuf::from) {
            Some(d) if d.is_absolute() => d,
            Some(d) => self.directory.join(d),
            None => self.directory.clone(),
        };
        let mut plan = Plan { key_directory, ..Plan::default() };
        if let Some(v) = &view {
            why.push(format!("in view {v:?}: views choose answers by client address, and named behind the wrapper sees one client only"));
        }
        if let Some(class) = z.args().get(1) {
            if !class.eq_ignore_ascii_case("in") {
                why.push(format!("class {class}: only IN zones are served"));
            }
        }
        for option in z.block().unwrap_or(&[]) {
            let Some(keyword) = option.keyword() else { continue };
            if !KNOWN_ZONE_OPTIONS.contains(&keyword.as_str()) {
                why.push(format!("option `{keyword}` is not supported by the adoption"));
            }
        }
        self.signing(z, &mut plan, &mut why);
        match z.child("file").and_then(|f| f.arg()) {
            Some(f) => {
                let f = PathBuf::from(f);
                plan.file = Some(if f.is_absolute() { f } else { self.directory.join(f) });
            }
            None => plan.notes.push("no `file`: the data can only come from an AXFR (--server)".into()),
        }
        plan.format = z.child("masterfile-format").and_then(|f| f.arg()).map(str::to_owned);
        self.updates(z, &mut plan, &mut why);
        self.transfers(z, &mut plan);
        self.left_behind(z, &mut plan);
        if why.is_empty() {
            report(Verdict::Adoptable(plan))
        } else {
            report(Verdict::Unsupported(why))
        }
    }

    /// Signed by named with the operator's key: adopted with a double-KSK rollover; an
    /// inline-signed zone is not adopted.
    fn signing(&self, z: &Statement, plan: &mut Plan, why: &mut Vec<String>) {
        let mut policy_algorithms = Vec::new();
        if let Some(policy) = self.option(z, "dnssec-policy").and_then(|p| p.arg()) {
            if !policy.eq_ignore_ascii_case("none") {
                plan.signed = Some(format!("dnssec-policy {policy:?}"));
                policy_algorithms = policy_ksk_algorithms(self.policies, policy);
            }
        }
        if self.option(z, "inline-signing").and_then(|p| p.arg()).is_some_and(|v| ["yes", "true", "1"].contains(&v.to_ascii_lowercase().as_str())) {
            why.push("inline-signing yes: named keeps a signed copy of its own; sdns signs the zone itself".into());
        }
        // The KSK the adoption will find has the policy's algorithm: refused here, in the
        // adoption's words, rather than after the list called the zone adoptable.
        let known = !policy_algorithms.is_empty();
        why.extend(policy_algorithms.into_iter().filter_map(|a| algorithm_refusal(a, self.algorithm)));
        if let Some(a) = self.option(z, "auto-dnssec").and_then(|p| p.arg()) {
            if !a.eq_ignore_ascii_case("off") {
                plan.signed = Some(format!("auto-dnssec {a}"));
            }
        }
        if let Some(how) = &plan.signed {
            plan.notes.push(format!(
                "signed with your own key ({how}): adopted with a double-KSK rollover (your KSK stays published, with its signature over the DNSKEY RRset, until `sdns cluster rollover-finish`; see rollover.txt)"
            ));
            if !known {
                // Only the zone's data tells (auto-dnssec, or a policy named.conf does not show).
                plan.notes.push(format!(
                    "your KSK's algorithm is read from the zone's data at the adoption, which refuses it unless it is the threshold key's ({})",
                    self.algorithm
                ));
            }
        }
    }

    /// Who may update: update-policy, or allow-update (the zone's, else the global one),
    /// as update-policy rules naming TSIG keys of named.conf.
    fn updates(&self, z: &Statement, plan: &mut Plan, why: &mut Vec<String>) {
        let mut rules: Vec<(String, Vec<String>)> = Vec::new();
        if let Some(policy) = z.child("update-policy") {
            match policy.block() {
                None => why.push(format!(
                    "update-policy {}: named's session key for `nsupdate -l` has no counterpart behind the wrapper; give those clients a TSIG key",
                    policy.args().join(" ")
                )),
                Some(block) => {
                    for rule in block {
                        let words = rule.words();
                        match named_glue::conf::PolicyRule::parse(&words) {
                            Ok(r) => rules.push((r.identity.clone(), words.iter().map(|w| w.to_string()).collect())),
                            Err(e) => why.push(format!("update-policy rule `{}`: {e}", words.join(" "))),
                        }
                    }
                }
            }
        } else if let Some(allow) = self.option(z, "allow-update") {
            let list = self.match_list(allow);
            for other in &list.others {
                why.push(format!("allow-update by address (`{other}`): the wrapper is the only client named sees, so addresses cannot be told apart; give those clients a TSIG key"));
            }
            for k in &list.keys {
                let words = ["grant", k.as_str(), "zonesub", "ANY"];
                match named_glue::conf::PolicyRule::parse(&words) {
                    Ok(_) => rules.push((k.clone(), words.iter().map(|w| w.to_string()).collect())),
                    Err(e) => why.push(format!("allow-update key {k:?}: {e}")),
                }
            }
        }
        for (identity, words) in &rules {
            if identity != "*" {
                match self.keys.get(&key_name(identity)) {
                    None => why.push(format!(
                        "update rule names `{identity}`, which is not a TSIG key in named.conf (Kerberos principals and SIG(0) KEYs are not adopted)"
                    )),
                    Some(k) => match supported_algorithm(&k.algorithm) {
                        Ok(()) => {
                            if !plan.update_keys.contains(&key_name(identity)) {
                                plan.update_keys.push(key_name(identity));
                            }
                        }
                        Err(e) => why.push(format!("key {}: {e}", k.name)),
                    },
                }
            }
            plan.policy.push(words.join(" "));
        }
        if rules.is_empty() {
            plan.notes.push("no update-policy or allow-update: the zone takes no dynamic updates, as before".into());
        }
    }

    /// allow-transfer: its keys become transfer keys, its addresses the wrapper's [access]
    /// allow_transfer (address or key, as in BIND).
    fn transfers(&self, z: &Statement, plan: &mut Plan) {
        let Some(allow) = self.option(z, "allow-transfer") else {
            plan.notes.push(
                "no allow-transfer: your named let anyone transfer the zone (BIND 9.18's default); the replicas allow it with a transfer key only (list prefixes in [access] allow_transfer to allow more)".into(),
            );
            return;
        };
        let list = self.match_list(allow);
        for k in &list.keys {
            match self.keys.get(k).map(|c| supported_algorithm(&c.algorithm)) {
                Some(Ok(())) => {
                    if !plan.transfer_keys.contains(k) {
                        plan.transfer_keys.push(k.clone());
                    }
                }
                Some(Err(e)) => plan.notes.push(format!("allow-transfer key {k}: {e}; not carried over")),
                None => plan.notes.push(format!("allow-transfer names key {k}, which named.conf does not define; not carried over")),
            }
        }
        // A negation cannot be kept in [access], and dropping it would widen the list, so
        // then no address is carried.
        let mut prefixes = Vec::new();
        let mut unkept = Vec::new();
        for o in &list.others {
            match o.as_str() {
                "any" => prefixes.extend(["0.0.0.0/0".to_owned(), "::/0".to_owned()]),
                "localhost" => prefixes.extend(["127.0.0.1".to_owned(), "::1".to_owned()]),
                other if other.parse::<exec::access::Prefix>().is_ok() => prefixes.push(other.to_owned()),
                other => unkept.push(other.to_owned()),
            }
        }
        if unkept.iter().any(|u| u.starts_with('!')) {
            plan.notes.push(format!(
                "allow-transfer with a negation ({}): no address is carried over; list the secondaries' prefixes in [access] allow_transfer",
                unkept.join(", ")
            ));
            return;
        }
        if !unkept.is_empty() {
            plan.notes.push(format!("allow-transfer elements not carried over: {} (list prefixes in [access] allow_transfer)", unkept.join(", ")));
        }
        for p in prefixes {
            if !plan.transfer_addresses.contains(&p) {
                plan.transfer_addresses.push(p);
            }
        }
    }

    /// Notes on what the replicas' named does not take over: allow-query, the options it
    /// has its own settings for, NOTIFY.
    fn left_behind(&self, z: &Statement, plan: &mut Plan) {
        if let Some(q) = self.option(z, "allow-query") {
            let list = self.match_list(q);
            if !list.others.iter().all(|o| o == "any") || !list.keys.is_empty() || list.none {
                plan.notes.push("allow-query is not carried over: set [access] allow_query in each replica.toml".into());
            }
        }
        let left: Vec<String> = z.block().unwrap_or(&[]).iter().filter_map(|o| o.keyword()).filter(|k| NOT_CARRIED.contains(&k.as_str())).collect();
        if !left.is_empty() {
            plan.notes.push(format!("not carried over (the replicas' named uses its own settings): {}", left.join(", ")));
        }
        let notify = self.option(z, "notify").and_then(|n| n.arg()).map(|v| v.to_ascii_lowercase());
        if notify.as_deref() != Some("no") || z.child("also-notify").is_some() {
            plan.notes.push("NOTIFY is not carried over: list this zone's secondaries in the zone's also_notify (or [named] also_notify) in each replica.toml, and every replica notifies them".into());
        }
    }
}

fn supported_algorithm(name: &str) -> Result<(), String> {
    match dnswire::tsig::Algorithm::from_name(name) {
        Some(_) => Ok(()),
        None => Err(format!("TSIG algorithm {name} is not supported (hmac-sha1/256/384/512 are)")),
    }
}

/// The report, one zone per line with its reasons or notes below.
pub fn render_report(zones: &[ZoneReport], chosen: Option<&[String]>) -> String {
    let mut out = String::new();
    for z in zones {
        let name = match &z.view {
            Some(v) => format!("{} (view {v})", z.name),
            None => z.name.clone(),
        };
        match &z.verdict {
            Verdict::Adoptable(plan) => {
                let status = match chosen {
                    Some(c) if c.contains(&z.name) && z.view.is_none() => "adopted",
                    Some(_) => "not taken",
                    None => "adoptable",
                };
                let _ = writeln!(
                    out,
                    "{status:<10} {name}  (update keys: {}; transfer keys: {}; {} update rule(s))",
                    if plan.update_keys.is_empty() { "none".into() } else { plan.update_keys.join(", ") },
                    if plan.transfer_keys.is_empty() { "none".into() } else { plan.transfer_keys.join(", ") },
                    plan.policy.len()
                );
                if !plan.transfer_addresses.is_empty() {
                    let _ = writeln!(out, "           transfers also from: {}", plan.transfer_addresses.join(", "));
                }
                if chosen.is_some_and(|c| !c.contains(&z.name)) {
                    let _ = writeln!(out, "           not chosen: give --zone {} too to adopt it into the same cluster", z.name);
                }
                for n in &plan.notes {
                    let _ = writeln!(out, "           note: {n}");
                }
            }
            Verdict::Unsupported(why) => {
                let _ = writeln!(out, "{:<10} {name}", "cannot");
                for w in why {
                    let _ = writeln!(out, "           because: {w}");
                }
            }
            Verdict::NotCandidate(why) => {
                let _ = writeln!(out, "{:<10} {name}  ({why})", "skipped");
            }
        }
    }
    out
}

/// The tools and inputs of one adoption.
pub struct AdoptOptions {
    pub named_conf: PathBuf,
    /// The operator's `named-checkconf` (its parser decides what the config means).
    pub checkconf: PathBuf,
    /// `named-compilezone`, to check and normalise the zone data.
    pub compilezone: PathBuf,
    /// Take the data by AXFR from this running named instead of the zone file.
    pub server: Option<std::net::SocketAddr>,
    /// The TSIG key file for that AXFR (default: the zone's first allow-transfer key).
    pub axfr_key: Option<PathBuf>,
    /// Only print the report.
    pub list: bool,
    /// The operator's key directory, for the private KSK of a signed zone (default: the
    /// zone's `key-directory` from named.conf, else its `directory`).
    pub key_dir: Option<PathBuf>,
    /// The operator's `dnssec-signzone`, which signs the DNSKEY RRset with the old KSK.
    pub signzone: PathBuf,
    /// Validity of that one signature, in days.
    pub rollover_validity_days: u32,
}

/// Runs `named-checkconf -p` and parses what it prints.
pub fn read_named_conf(checkconf: &Path, conf: &Path) -> Result<Vec<Statement>> {
    let out = Command::new(checkconf).arg("-p").arg(conf).output().with_context(|| format!("running {}", checkconf.display()))?;
    if !out.status.success() {
        bail!("{} -p {} failed:\n{}{}", checkconf.display(), conf.display(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8(out.stdout).context("named-checkconf printed text that is not UTF-8")?;
    bindconf::parse(&text).map_err(|e| anyhow!("reading the output of named-checkconf -p: {e}"))
}

/// One chosen zone's data, ready for the dealing.
struct Prepared {
    zone: String,
    plan: Plan,
    /// The checked data without the operator's signatures (removed after the dealing).
    normalized: PathBuf,
    /// A signed zone: the operator's KSK and the directory of its private half.
    old_ksk: Option<(rollover::Dnskey, PathBuf)>,
}

/// `sdns adopt`: prints the report; with chosen adoptable zones (`--zone`, one or more),
/// deals one cluster for all of them in `out`: one threshold key per zone, each zone's
/// keys, rules and data.
pub fn adopt(o: &AdoptOptions, p: &ClusterParams, out: &Path) -> Result<()> {
    let statements = read_named_conf(&o.checkconf, &o.named_conf)?;
    let conf_dir = std::path::absolute(&o.named_conf)?.parent().map(Path::to_owned).unwrap_or_default();
    let inv = inventory(&statements, &conf_dir, p.algorithm);
    if o.list {
        print!("{}", render_report(&inv.zones, None));
        return Ok(());
    }
    if p.zones.is_empty() {
        print!("{}", render_report(&inv.zones, None));
        bail!("give the zones to adopt with --zone (one or more; the zones {} defines are listed above)", o.named_conf.display());
    }
    let zones: Vec<String> = p.zones.iter().map(|z| absolute_name(z)).collect();
    for (i, z) in zones.iter().enumerate() {
        if zones[..i].contains(z) {
            bail!("--zone {z} is given twice");
        }
    }
    let plans = chosen_plans(o, &inv, &zones)?;
    if !p.zone_files.is_empty() {
        bail!("--zone-file: sdns adopt takes each zone's data from named.conf's file or from --server");
    }
    let key_texts = operator_keys(&inv, &plans)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let dealt_share = match zones.as_slice() {
        [_] => replica_dir(out, 0).join("share.json"),
        _ => replica_dir(out, 0).join(wrapper::config::zone_dir_name(&zones[0])).join("share.json"),
    };
    if dealt_share.exists() || replica_dir(out, 0).join("share.json").exists() || out.join(ADOPTED_FILE).exists() {
        bail!("{} already holds a dealt cluster; give a new --out", out.display());
    }
    let prepared = prepare_all(o, p, &inv, &zones, &plans, out)?;
    let mut p = p.clone();
    p.zones = zones.clone();
    p.zone_files = prepared.iter().map(|z| z.normalized.clone()).collect();
    let dealt = keygen(&p, out);
    for z in &prepared {
        let _ = std::fs::remove_file(&z.normalized);
    }
    dealt?;
    let several = zones.len() > 1;
    let mut rollover_notes = Vec::new();
    for z in &prepared {
        if let Some((ksk, key_dir)) = &z.old_ksk {
            rollover_notes.push(add_old_ksk(o, &p, out, &z.zone, ksk, key_dir, &zone_dir(several, &z.zone))?);
        }
    }
    let files = write_operator_keys(&p, out, &plans, &key_texts)?;
    let records = adoption_records(&prepared, &files, several);
    let comment = format!(
        "Written by sdns adopt from {conf}: {what} {zones}. sdns cluster up and write_configs\n\
         read it; the keys are the operator's own (0600 files next to this one).",
        conf = o.named_conf.display(),
        what = if several { "zones" } else { "zone" },
        zones = zones.join(", "),
    );
    let record = match records.as_slice() {
        [one] => one.to_toml(&comment)?,
        _ => record::AdoptedZones { zone: records.clone() }.to_toml(&comment)?,
    };
    write_public(&out.join(ADOPTED_FILE), record.as_bytes())?;
    write_configs(&p, out)?;
    print!("{}", render_report(&inv.zones, Some(&zones)));
    println!("{}", next_steps(&p, out, &records, &files, &rollover_notes));
    Ok(())
}

/// Where a zone's files are: the top level with one zone, zones/<zone>/ with several.
fn zone_dir(several: bool, zone: &str) -> PathBuf {
    if several {
        PathBuf::from(wrapper::config::zone_dir_name(zone))
    } else {
        PathBuf::new()
    }
}

/// Every chosen zone's plan; every chosen zone must be adoptable, and all refusals are
/// named at once (after the report).
fn chosen_plans(o: &AdoptOptions, inv: &Inventory, zones: &[String]) -> Result<Vec<Plan>> {
    let mut plans = Vec::new();
    let mut refused = Vec::new();
    let mut unknown = false;
    for zone in zones {
        let chosen = inv.zones.iter().find(|z| &z.name == zone && z.view.is_none()).or_else(|| inv.zones.iter().find(|z| &z.name == zone));
        match chosen.map(|c| &c.verdict) {
            None => {
                unknown = true;
                refused.push(format!("{} defines no zone {zone} (the zones it defines are listed above; give them with --zone)", o.named_conf.display()));
            }
            Some(Verdict::Adoptable(plan)) => plans.push(plan.clone()),
            Some(Verdict::Unsupported(why)) => refused.push(format!("zone {zone} cannot be adopted: {}", why.join("; "))),
            Some(Verdict::NotCandidate(why)) => refused.push(format!("zone {zone} is not adopted: {why}")),
        }
    }
    if !refused.is_empty() {
        print!("{}", render_report(&inv.zones, if unknown { None } else { Some(zones) }));
        bail!("{}", refused.join("\n"));
    }
    Ok(plans)
}

/// The operator's keys the plans name, as key files, checked before anything is written.
fn operator_keys(inv: &Inventory, plans: &[Plan]) -> Result<BTreeMap<String, String>> {
    for k in plans.iter().flat_map(|plan| plan.update_keys.iter().chain(&plan.transfer_keys)) {
        if k == "sdns-update" || k == "sdns-transfer" || k.starts_with("sdns-update.") {
            bail!("the key name {k} is one sdns deals for itself; rename that key in named.conf first");
        }
    }
    let mut key_texts: BTreeMap<String, String> = BTreeMap::new();
    for k in plans.iter().flat_map(|plan| plan.update_keys.iter().chain(&plan.transfer_keys)) {
        let key = inv.keys.get(k).ok_or_else(|| anyhow!("key {k} is not defined in named.conf"))?;
        let text = TsigKey { name: key.name.clone(), algorithm: key.algorithm.clone(), secret_b64: key.secret_b64.clone() }.to_bind();
        let back = TsigKey::from_bind(&text).map_err(|e| anyhow!("key {}: {e}", key.name))?;
        if back.name != key.name || back.secret_b64 != key.secret_b64 {
            bail!("key {:?} cannot be written as a key file (quotes in its name or secret)", key.name);
        }
        key_texts.insert(k.clone(), text);
    }
    Ok(key_texts)
}

/// Each zone's data, checked and in canonical text form; no DNSSEC records (those would
/// be the operator's signatures, which the threshold key does not continue). On an error
/// the data prepared so far is removed.
fn prepare_all(o: &AdoptOptions, p: &ClusterParams, inv: &Inventory, zones: &[String], plans: &[Plan], out: &Path) -> Result<Vec<Prepared>> {
    let mut prepared: Vec<Prepared> = Vec::new();
    for (i, (zone, plan)) in zones.iter().zip(plans).enumerate() {
        match prepare(o, p, inv, zone, plan, &out.join(format!(".adopt-zone-{i}.db")), out) {
            Ok(z) => prepared.push(z),
            Err(e) => {
                for z in &prepared {
                    let _ = std::fs::remove_file(&z.normalized);
                }
                return Err(e);
            }
        }
    }
    Ok(prepared)
}

/// The operator's keys, under their own names, for every replica and the operator; a key
/// several zones name is one file. The file name of each key.
fn write_operator_keys(p: &ClusterParams, out: &Path, plans: &[Plan], key_texts: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>> {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for k in plans.iter().flat_map(|plan| plan.update_keys.iter().chain(&plan.transfer_keys)) {
        if files.contains_key(k) {
            continue;
        }
        let file = key_file_name(k, files.values());
        let text = &key_texts[k];
        write_secret(&out.join(&file), text.as_bytes())?;
        for i in 0..p.replicas {
            write_secret(&replica_dir(out, i).join(&file), text.as_bytes())?;
        }
        files.insert(k.clone(), file);
    }
    Ok(files)
}

/// Each zone's adoption record: the dealer's keys first, then the operator's, and the
/// operator's rules.
fn adoption_records(prepared: &[Prepared], files: &BTreeMap<String, String>, several: bool) -> Vec<Adopted> {
    prepared
        .iter()
        .map(|z| {
            let dir = zone_dir(several, &z.zone);
            // The dealer's update key: `sdns-update` with one zone, the zone's own with several.
            let dealer = if several { format!("sdns-update.{}", z.zone.trim_end_matches('.')) } else { "sdns-update".to_owned() };
            Adopted {
                zone: z.zone.clone(),
                tsig_keys: std::iter::once(dir.join("tsig.key").to_string_lossy().into_owned())
                    .chain(z.plan.update_keys.iter().map(|k| files[k].clone()))
                    .collect(),
                transfer_keys: std::iter::once("transfer.key".to_owned()).chain(z.plan.transfer_keys.iter().map(|k| files[k].clone())).collect(),
                update_policy: z
                    .plan
                    .policy
                    .iter()
                    .cloned()
                    // The dealer's key may delete the rollover marker (and change nothing else).
                    .chain(z.old_ksk.as_ref().map(|_| format!("grant {dealer} name {} TXT", rollover::marker_name(&z.zone))))
                    .collect(),
                allow_transfer: z.plan.transfer_addresses.clone(),
            }
        })
        .collect()
}

/// What the operator does next, after the report.
fn next_steps(p: &ClusterParams, out: &Path, records: &[Adopted], files: &BTreeMap<String, String>, rollover_notes: &[String]) -> String {
    let zones = &p.zones;
    let several = zones.len() > 1;
    let shared_prefixes: Vec<String> = records.iter().filter(|r| !r.allow_transfer.is_empty()).map(|r| r.zone.clone()).collect();
    let up_zones: String = zones.iter().map(|z| format!(" --zone {z}")).collect();
    format!(
        "\nsdns adopt: dealt {zones} for {n} replicas in {dir}{one_key}.\n\
         Your TSIG key files (for nsupdate -k) are there too: {keys}.\n\
         The dealer's update key{s} ({dealer_keys}) {is} known to the replicas, but only rules naming `*` grant {it} anything{finish}.\n\
         Next: copy replica-<i>/ to host i and install it there (scripts/install.sh --replica replica-<i>),\n\
         or try it on this machine: sdns cluster up --dir {dir}{up_zones} --replicas {n} (with the same\n\
         address and port options as here). DS for the parent once every replica serves the signed zone: {ds}.{shared}{rollover}",
        zones = zones.join(", "),
        one_key = if several { " (one threshold key per zone)" } else { "" },
        s = if several { "s" } else { "" },
        is = if several { "are" } else { "is" },
        it = if several { "them" } else { "it" },
        dealer_keys = zones.iter().map(|z| zone_dir(several, z).join("tsig.key").display().to_string()).collect::<Vec<_>>().join(", "),
        finish = if rollover_notes.is_empty() { "" } else { " (and the deletion of the rollover marker)" },
        ds = zones.iter().map(|z| zone_dir(several, z).join("ds.txt").display().to_string()).collect::<Vec<_>>().join(", "),
        shared = if several && !shared_prefixes.is_empty() {
            format!(
                "\nNote: [access] allow_transfer is the cluster's: the prefixes of {}'s allow-transfer may transfer every zone.",
                shared_prefixes.join(", ")
            )
        } else {
            String::new()
        },
        rollover = rollover_notes.iter().map(|n| format!("\n\n{n}")).collect::<String>(),
        n = p.replicas,
        dir = out.display(),
        keys = if files.is_empty() { "none".to_owned() } else { files.values().cloned().collect::<Vec<_>>().join(", ") },
    )
}

/// Takes one chosen zone's data (from its file with the journal, or by AXFR), checks it with
/// `named-compilezone`, finds a signed zone's KSK, and writes the data without the
/// operator's signatures to `normalized`.
fn prepare(o: &AdoptOptions, p: &ClusterParams, inv: &Inventory, zone: &str, plan: &Plan, normalized: &Path, out: &Path) -> Result<Prepared> {
    let raw = match o.server {
        Some(server) => axfr(server, zone, o.axfr_key.as_deref(), plan, inv, out)?,
        None => plan.file.clone().ok_or_else(|| anyhow!("zone {zone} has no file in named.conf; give --server to take it by AXFR"))?,
    };
    let format = if o.server.is_some() { None } else { plan.format.as_deref() };
    // From the file, with its journal (named keeps its own signing and updates there).
    let compiled = compile_zone(&o.compilezone, zone, &raw, format, o.server.is_none(), normalized);
    if o.server.is_some() {
        let _ = std::fs::remove_file(&raw);
    }
    compiled?;
    let text = std::fs::read_to_string(normalized)?;
    let signed: Vec<&str> = dnssec_types(&text);
    // A signed zone: its KSK (the key the parent's DS names) stays published for the
    // rollover; the data goes on without the operator's signatures.
    let old_ksk = if signed.is_empty() && plan.signed.is_none() {
        None
    } else {
        match old_ksk(&text, zone, &signed, plan, p.algorithm, o.key_dir.as_deref()) {
            Ok(found) => Some(found),
            Err(e) => {
                let _ = std::fs::remove_file(normalized);
                return Err(e);
            }
        }
    };
    std::fs::write(normalized, rollover::strip_signed(&text))?;
    Ok(Prepared { zone: zone.to_owned(), plan: plan.clone(), normalized: normalized.to_owned(), old_ksk })
}

/// The operator's KSK of a signed zone, from its data, and the directory holding its
/// private half. Refuses what the double-KSK rollover cannot do.
fn old_ksk(text: &str, zone: &str, signed: &[&str], plan: &Plan, algorithm: u8, key_dir: Option<&Path>) -> Result<(rollover::Dnskey, PathBuf)> {
    let how = plan.signed.clone().unwrap_or_else(|| format!("its data holds {} records", signed.join("/")));
    let ksks = rollover::apex_ksks(text, zone);
    let ksk = match ksks.as_slice() {
        [] => bail!(
            "zone {zone} is signed with your own key ({how}), but its data holds no KSK (DNSKEY with flags 257) to roll over from; take the data by AXFR from the running named (--server)"
        ),
        [one] => one.clone(),
        many => bail!(
            "zone {zone} publishes {} KSKs ({}): a key rollover of your own is under way; finish it before the adoption",
            many.len(),
            many.iter().map(|k| k.key_tag().map_or("?".into(), |t| t.to_string())).collect::<Vec<_>>().join(", ")
        ),
    };
    if let Some(why) = algorithm_refusal(ksk.algorithm, algorithm) {
        bail!("zone {zone}: {why}");
    }
    let dir = key_dir.map(Path::to_owned).unwrap_or_else(|| plan.key_directory.clone());
    let stem = ksk.file_stem().ok_or_else(|| anyhow!("zone {zone}: the KSK's key field is not base64"))?;
    rollover::key_files(&dir, &stem)?;
    Ok((ksk, dir))
}

/// Publishes the operator's KSK `ksk` beside the threshold key, with its signature over the
/// DNSKEY RRset, in every copy of the zone under `out` (in `zdir` of each directory: empty
/// with one zone, `zones/<zone>` with several); writes the old DS and the rollover's steps
/// there. Returns what to tell the operator.
#[allow(clippy::too_many_arguments)]
fn add_old_ksk(o: &AdoptOptions, p: &ClusterParams, out: &Path, zone: &str, ksk: &rollover::Dnskey, key_dir: &Path, zdir: &Path) -> Result<String> {
    let public =
        wrapper::files::ThresholdPublic::load(&replica_dir(out, 0).join(zdir).join("zone.pub.json"), p.algorithm).context("reading the dealt public key")?;
    let name = hickory_proto::rr::Name::from_ascii(zone)?;
    let threshold = public.zone_key(&name, p.algorithm)?;
    let data = std::fs::read_to_string(out.join(zdir).join("zone.db"))?;
    let soa =
        data.lines().find(|l| l.split_whitespace().nth(3).is_some_and(|t| t.eq_ignore_ascii_case("SOA"))).ok_or_else(|| anyhow!("zone {zone} has no SOA"))?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    // An hour back, for validators whose clocks are behind.
    let validity = (now.saturating_sub(3600), now + u64::from(o.rollover_validity_days) * 86_400);
    // The CDS and CDNSKEY for the threshold key are known now: the operator's KSK signs
    // them here with the DNSKEY RRset (RFC 7344 4.1: signed by a key the parent's DS covers).
    let cds = rollover::cds_records(&threshold.dnskey_record(), threshold.ttl)?;
    let apex: Vec<String> = [ksk.record(threshold.ttl), threshold.dnskey_record()].into_iter().chain(cds.iter().cloned()).collect();
    let rrsigs = rollover::sign_apex_rrsets(&o.signzone, zone, soa, &apex, ksk, key_dir, validity, &out.join(".adopt-sign"))?;
    let records = rollover::rollover_records(zone, ksk, threshold.ttl, &cds, &rrsigs);
    for dir in std::iter::once(out.to_owned()).chain((0..p.replicas).map(|i| replica_dir(out, i))) {
        let path = dir.join(zdir).join("zone.db");
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str(&records);
        write_public(&path, text.as_bytes())?;
    }
    let old_ds = ksk.ds().ok_or_else(|| anyhow!("the DS of your KSK"))?;
    let new_ds = std::fs::read_to_string(out.join(zdir).join("ds.txt"))?.trim().to_owned();
    write_public(&out.join(zdir).join(rollover::OLD_DS_FILE), format!("{old_ds}\n").as_bytes())?;
    // The finish: `cluster rollover-finish` (with several zones, for this zone), or its two
    // ordered steps by hand.
    let finish = if zdir.as_os_str().is_empty() {
        format!(
            "sdns cluster rollover-finish --dir DIR (a local cluster), or delete {} TXT\n            (nsupdate -k tsig.key) and run sdns sign-zone",
            rollover::marker_name(zone)
        )
    } else {
        format!(
            "sdns cluster rollover-finish --dir DIR --zone {zone} (a local cluster), or delete\n            {} TXT (nsupdate -k {}) and run sdns sign-zone --zone {zone}",
            rollover::marker_name(zone),
            zdir.join("tsig.key").display()
        )
    };
    let until = named_glue::time::format_timestamp(validity.1);
    let steps = format!(
        "Rollover of {zone} from your KSK {old_tag} to the threshold key {new_tag} (double KSK).\n\
         Both keys are published; your KSK signed the DNSKEY RRset once, valid until {until} UTC,\n\
         so validators that trust the DS at the parent now keep validating.\n\
         1. Once every replica serves the zone, give the parent the new DS (keep the old one):\n   {new_ds}\n   \
         (the zone publishes it as CDS and CDNSKEY, signed by your KSK: a parent that reads\n   \
         them, RFC 7344/8078, takes it by itself)\n\
         2. Wait until the parent serves it and the parent's DS TTL has passed.\n\
         3. Finish: {finish}: your KSK and its signature leave the zone.\n   \
         With [rollover] parent_resolvers in every replica.toml, steps 2 and 3 happen by\n   \
         themselves once t+1 replicas see the new DS at the parent.\n\
         4. Have the parent remove the old DS:\n   {old_ds}\n\
         Finish before {until}: after it the old key's signature expires, and validators that only\n\
         know the old DS fail.\n",
        old_tag = ksk.key_tag().unwrap_or(0),
        new_tag = threshold.key_tag(),
    );
    write_public(&out.join(zdir).join(rollover::ROLLOVER_FILE), steps.as_bytes())?;
    Ok(steps)
}

/// A file name for a key: `key-<name>.key`, made safe and distinct from `taken`.
fn key_file_name<'a>(name: &str, taken: impl Iterator<Item = &'a String>) -> String {
    let taken: Vec<&String> = taken.collect();
    let safe: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '_' }).collect();
    let mut file = format!("key-{safe}.key");
    let mut n = 1;
    while taken.iter().any(|t| **t == file) {
        n += 1;
        file = format!("key-{safe}-{n}.key");
    }
    file
}

/// Record types in zone text (one record per line, as named-compilezone writes it)
/// that only a signed zone holds.
fn dnssec_types(text: &str) -> Vec<&'static str> {
    const SIGNED_ONLY: [&str; 7] = ["DNSKEY", "RRSIG", "NSEC", "NSEC3", "NSEC3PARAM", "CDS", "CDNSKEY"];
    let mut seen = [false; SIGNED_ONLY.len()];
    for line in text.lines() {
        if let Some(t) = line.split_whitespace().nth(3) {
            if let Some(i) = SIGNED_ONLY.iter().position(|d| t.eq_ignore_ascii_case(d)) {
                seen[i] = true;
            }
        }
    }
    // In a fixed order, so the message does not depend on the zone's.
    SIGNED_ONLY.iter().zip(seen).filter(|(_, s)| *s).map(|(d, _)| *d).collect()
}

/// Checks the zone data and writes it in canonical text form (one record per line,
/// absolute names), with the operator's `named-compilezone`.
fn compile_zone(compilezone: &Path, zone: &str, input: &Path, format: Option<&str>, journal: bool, output: &Path) -> Result<()> {
    let mut cmd = Command::new(compilezone);
    cmd.args(["-q", "-s", "full", "-F", "text"]);
    if journal {
        cmd.arg("-j");
    }
    if let Some(f) = format {
        cmd.arg("-f").arg(f);
    }
    cmd.arg("-o").arg(output).arg(zone).arg(input);
    let done = cmd.output().with_context(|| format!("running {}", compilezone.display()))?;
    if !done.status.success() {
        bail!(
            "{} rejects the data of zone {zone} ({}):\n{}{}",
            compilezone.display(),
            input.display(),
            String::from_utf8_lossy(&done.stdout),
            String::from_utf8_lossy(&done.stderr)
        );
    }
    Ok(())
}

/// The zone by AXFR from the running named, into a file under `out` (removed by the caller).
fn axfr(server: std::net::SocketAddr, zone: &str, key: Option<&Path>, plan: &Plan, inv: &Inventory, out: &Path) -> Result<PathBuf> {
    let key_path = out.join(".adopt-axfr.key");
    let key_file = match (key, plan.transfer_keys.first()) {
        (Some(k), _) => Some(k.to_owned()),
        (None, Some(name)) => {
            let k = &inv.keys[name];
            write_secret(&key_path, TsigKey { name: k.name.clone(), algorithm: k.algorithm.clone(), secret_b64: k.secret_b64.clone() }.to_bind().as_bytes())?;
            Some(key_path.clone())
        }
        (None, None) => None,
    };
    let mut cmd = Command::new("dig");
    cmd.arg(format!("@{}", server.ip())).arg("-p").arg(server.port().to_string());
    if let Some(k) = &key_file {
        cmd.arg("-k").arg(k);
    }
    cmd.args([zone, "AXFR", "+onesoa", "+nocmd", "+nocomments", "+nostats", "+time=10", "+tries=1"]);
    let done = cmd.output().context("running dig for the AXFR");
    let _ = std::fs::remove_file(&key_path);
    let done = done?;
    let text = String::from_utf8_lossy(&done.stdout);
    let records: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .filter(|l| l.split_whitespace().nth(3).is_none_or(|t| !t.eq_ignore_ascii_case("TSIG")))
        .collect();
    if !done.status.success() || records.first().is_none_or(|l| l.split_whitespace().nth(3) != Some("SOA")) {
        bail!("AXFR of {zone} from {server} failed:\n{text}{}", String::from_utf8_lossy(&done.stderr));
    }
    let path = out.join(".adopt-axfr.db");
    write_public(&path, (records.join("\n") + "\n").as_bytes())?;
    Ok(path)
}

#[cfg(test)]
mod tests;
