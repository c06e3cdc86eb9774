//! `sdns query`, `sdns update` and `sdns stub`: the voting client (the `vote` crate) on the
//! command line.
//!
//! Exit status of `query` and `update`:
//! 0 accepted (for `update`: the agreed result is NOERROR); 1 (`update` only) the replicas agree
//! the update failed (e.g. REFUSED, NOTAUTH); 2 bad arguments or files; 3 no quorum: enough
//! replicas answered but no answer had a quorum (more than t faulty, or a write in progress);
//! 4 timeout: too few replicas answered.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use hickory_proto::op::{update_message, Message, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordSet, RecordType};
use vote::client::{Options, Verdict, VotingClient};
use vote::net::Timeouts;
use vote::tsig::TsigKey;
use vote::Replicas;

use exec::auth::TsigKey as DealerTsig;
use wrapper::config::Config;

pub const EXIT_REFUSED: u8 = 1;
pub const EXIT_ERROR: u8 = 2;
pub const EXIT_NO_QUORUM: u8 = 3;
pub const EXIT_TIMEOUT: u8 = 4;

#[derive(Args, Clone, Debug)]
pub struct ReplicaArgs {
    /// Every replica's client address (ADDR:PORT), in replica order.
    #[arg(long, value_delimiter = ',', required_unless_present = "config", conflicts_with = "config")]
    pub replicas: Vec<SocketAddr>,
    /// Take the replicas from a replica's config file (its [[peer]] client addresses, cluster.faults, and its zone if it serves one).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// t, the number of faulty replicas tolerated (default: the config's, else (n-1)/3).
    #[arg(long)]
    pub faults: Option<usize>,
    /// Wait per UDP attempt, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// UDP attempts per replica.
    #[arg(long, default_value_t = 3)]
    pub tries: u32,
}

impl ReplicaArgs {
    /// The replica set, and the zone if a config file named one.
    fn resolve(&self) -> Result<(Replicas, Option<String>)> {
        let (addrs, faults, zone) = match &self.config {
            Some(path) => {
                let c = Config::load(path)?;
                let mut peers = c.peers.clone();
                peers.sort_by_key(|p| p.id);
                let addrs = peers.iter().map(|p| p.client).collect();
                // With several zones the update names its zone itself (--zone).
                (addrs, self.faults.or(Some(usize::from(c.faults()))), c.only_zone().map(|z| z.name.clone()))
            }
            None => (self.replicas.clone(), self.faults, None),
        };
        Ok((Replicas::new(addrs, faults)?, zone))
    }

    fn options(&self) -> Options {
        let timeouts = Timeouts {
            udp_attempt: Duration::from_millis(self.timeout_ms.max(1)),
            udp_attempts: self.tries.max(1),
            tcp: Duration::from_millis(self.timeout_ms.max(1) * 3),
        };
        // A round outlasts one replica's retries, with room for a TCP fallback.
        let round = timeouts.udp_attempt * timeouts.udp_attempts + timeouts.tcp;
        Options { timeouts, round, ..Options::default() }
    }
}

#[derive(Args, Debug)]
pub struct QueryArgs {
    #[command(flatten)]
    pub replicas: ReplicaArgs,
    /// Skip the unordered voting read and ask for an ordered read at once.
    #[arg(long)]
    pub ordered: bool,
    /// NAME [TYPE] [+dnssec] [+short]
    #[arg(required = true, num_args = 1..=4, allow_hyphen_values = false)]
    pub args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct UpdateArgs {
    #[command(flatten)]
    pub replicas: ReplicaArgs,
    /// TSIG key file in BIND's format (as `nsupdate -k` takes; `sdns keygen` writes tsig.key).
    #[arg(long, short = 'k')]
    pub key: Option<PathBuf>,
    /// The zone to update (default: the config file's zone).
    #[arg(long)]
    pub zone: Option<String>,
    /// `add NAME TTL TYPE RDATA...` | `delete NAME [TYPE [RDATA...]]`
    #[arg(required = true, num_args = 2.., allow_hyphen_values = true)]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct StubArgs {
    #[command(flatten)]
    pub replicas: ReplicaArgs,
    /// Where to take DNS queries (UDP and TCP).
    #[arg(long, default_value = "127.0.0.1:53")]
    pub listen: SocketAddr,
    /// Skip the unordered voting read; every query is an ordered read.
    #[arg(long)]
    pub ordered: bool,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("tokio runtime")
}

fn fail(e: anyhow::Error) -> ExitCode {
    eprintln!("sdns: {e:#}");
    ExitCode::from(EXIT_ERROR)
}

fn verdict_code(v: Verdict) -> ExitCode {
    match v {
        Verdict::Accepted => ExitCode::SUCCESS,
        Verdict::NoQuorum => ExitCode::from(EXIT_NO_QUORUM),
        Verdict::Timeout => ExitCode::from(EXIT_TIMEOUT),
    }
}

pub fn query(a: QueryArgs) -> ExitCode {
    match query_inner(a) {
        Ok(code) => code,
        Err(e) => fail(e),
    }
}

fn query_inner(a: QueryArgs) -> Result<ExitCode> {
    let (mut dnssec, mut short) = (false, false);
    let mut words = Vec::new();
    for w in &a.args {
        match w.as_str() {
            "+dnssec" => dnssec = true,
            "+short" => short = true,
            w if w.starts_with('+') => bail!("unknown option {w} (known: +dnssec, +short)"),
            w => words.push(w),
        }
    }
    let (name, rtype) = match words.as_slice() {
        [name] => (*name, "A"),
        [name, rtype] => (*name, *rtype),
        _ => bail!("expected NAME [TYPE]"),
    };
    let name = Name::from_str(name).with_context(|| format!("bad name {name}"))?;
    let rtype = RecordType::from_str(&rtype.to_ascii_uppercase()).map_err(|e| anyhow!("bad type {rtype}: {e}"))?;
    let (replicas, _) = a.replicas.resolve()?;
    let mut options = a.replicas.options();
    options.voting_reads = !a.ordered;
    let client = VotingClient::new(replicas, options);
    let outcome = runtime()?.block_on(client.read(&name, rtype, dnssec))?;
    if short {
        print!("{}", vote::show::short(&outcome));
        // Who disagreed still matters: on stderr, as dig prints its own warnings.
        for i in outcome.disagreed() {
            eprintln!(";; DISAGREED: replica {i} ({})", outcome.replicas[i]);
        }
    } else {
        print!("{}", vote::show::full(&outcome, &format!("{name} {rtype}")));
    }
    Ok(verdict_code(outcome.verdict()))
}

pub fn update(a: UpdateArgs) -> ExitCode {
    match update_inner(a) {
        Ok(code) => code,
        Err(e) => fail(e),
    }
}

fn update_inner(a: UpdateArgs) -> Result<ExitCode> {
    let (replicas, config_zone) = a.replicas.resolve()?;
    let zone = a.zone.clone().or(config_zone).ok_or_else(|| anyhow!("no zone: give --zone (or --config)"))?;
    let mut zone = Name::from_str(&zone).with_context(|| format!("bad zone {zone}"))?;
    zone.set_fqdn(true);
    let message = build_update(&a.command, &zone)?;
    let key = match &a.key {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            if !text.to_ascii_lowercase().contains("hmac-sha256") {
                bail!("{}: only hmac-sha256 keys are supported", path.display());
            }
            let k = DealerTsig::from_bind(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
            let name = Name::from_str(&k.name).with_context(|| format!("{}: bad key name", path.display()))?;
            Some(TsigKey::new(name, k.secret())?)
        }
        None => None,
    };
    let client = VotingClient::new(replicas, a.replicas.options());
    let outcome = runtime()?.block_on(client.update(&message, key.as_ref()))?;
    print!("{}", vote::show::full(&outcome, &a.command.join(" ")));
    Ok(match (outcome.verdict(), outcome.answer()) {
        (Verdict::Accepted, Some(m)) if m.metadata.response_code == ResponseCode::NoError => ExitCode::SUCCESS,
        (Verdict::Accepted, _) => ExitCode::from(EXIT_REFUSED),
        (v, _) => verdict_code(v),
    })
}

/// `add NAME TTL TYPE RDATA...` or `delete NAME [TYPE [RDATA...]]`, as nsupdate's `update`
/// lines; names are absolute (as in nsupdate) and must be in the zone.
fn build_update(words: &[String], zone: &Name) -> Result<Message> {
    let name_of = |s: &str| -> Result<Name> {
        // As in nsupdate, names are absolute whether or not they end in a dot.
        let mut n = Name::from_str(s).with_context(|| format!("bad name {s}"))?;
        n.set_fqdn(true);
        if !zone.zone_of(&n) {
            bail!("{n} is not in zone {zone}");
        }
        Ok(n)
    };
    let type_of = |s: &str| RecordType::from_str(&s.to_ascii_uppercase()).map_err(|e| anyhow!("bad type {s}: {e}"));
    let rdata_of = |t: RecordType, words: &[String]| RData::try_from_str(t, &words.join(" ")).map_err(|e| anyhow!("bad {t} data {:?}: {e}", words.join(" ")));
    match words.split_first() {
        Some((op, rest)) if op == "add" => {
            let [name, ttl, rtype, rdata @ ..] = rest else { bail!("add NAME TTL TYPE RDATA...") };
            if rdata.is_empty() {
                bail!("add NAME TTL TYPE RDATA...");
            }
            let ttl: u32 = ttl.parse().with_context(|| format!("bad TTL {ttl}"))?;
            let rtype = type_of(rtype)?;
            // `with_ttl`: `RecordSet::new`'s third argument is a SOA serial, and its records get TTL 0.
            let mut rrset = RecordSet::with_ttl(name_of(name)?, rtype, ttl);
            rrset.add_rdata(rdata_of(rtype, rdata)?);
            // No prerequisite: like nsupdate's `update add`.
            Ok(update_message::append(rrset, zone.clone(), false, false))
        }
        Some((op, rest)) if op == "delete" || op == "del" => match rest {
            [name] => Ok(update_message::delete_all(name_of(name)?, zone.clone(), DNSClass::IN, false)),
            [name, rtype] => Ok(update_message::delete_rrset(Record::update0(name_of(name)?, 0, type_of(rtype)?), zone.clone(), false)),
            [name, rtype, rdata @ ..] => {
                let rtype = type_of(rtype)?;
                let mut rrset = RecordSet::with_ttl(name_of(name)?, rtype, 0);
                rrset.add_rdata(rdata_of(rtype, rdata)?);
                Ok(update_message::delete_by_rdata(rrset, zone.clone(), false))
            }
            [] => bail!("delete NAME [TYPE [RDATA...]]"),
        },
        _ => bail!("expected `add NAME TTL TYPE RDATA...` or `delete NAME [TYPE [RDATA...]]`"),
    }
}

pub fn stub(a: StubArgs) -> ExitCode {
    let run = || -> Result<()> {
        let (replicas, _) = a.replicas.resolve()?;
        let mut options = a.replicas.options();
        // An application waits for the stub: answer as soon as a quorum is in.
        options.linger = Duration::ZERO;
        options.voting_reads = !a.ordered;
        let client = Arc::new(VotingClient::new(replicas, options));
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
        rt.block_on(vote::stub::serve(a.listen, client)).with_context(|| format!("serving on {}", a.listen))
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn update_commands_build_rfc2136_messages() {
        let zone = Name::from_str("example.test.").unwrap();
        let add = build_update(&words("add new.example.test 300 A 192.0.2.7"), &zone).unwrap();
        assert_eq!(add.queries[0].name(), &zone);
        assert_eq!(add.authorities.len(), 1);
        assert_eq!(add.authorities[0].name, Name::from_str("new.example.test.").unwrap());
        assert_eq!(add.authorities[0].to_string().split_whitespace().last(), Some("192.0.2.7"));
        assert_eq!(add.authorities[0].ttl, 300, "the TTL given, as nsupdate stores it");
        let del = build_update(&words("delete www.example.test. A"), &zone).unwrap();
        assert_eq!((del.authorities[0].record_type(), del.authorities[0].dns_class), (RecordType::A, DNSClass::ANY));
        let txt = build_update(&words("add t.example.test. 60 TXT \"two words\""), &zone).unwrap();
        assert_eq!(txt.authorities[0].record_type(), RecordType::TXT);
        for bad in [
            "add new 300 A 192.0.2.7",
            "add new.other.test 300 A 192.0.2.7",
            "add x 300 A",
            "add x ttl A 1.2.3.4",
            "add x 300 A not-an-address",
            "remove x",
            "delete",
        ] {
            assert!(build_update(&words(bad), &zone).is_err(), "{bad}");
        }
    }
}
