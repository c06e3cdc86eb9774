//! `sdns`: the replicated, threshold-signed DNS service. `sdns run` is one replica (the
//! `wrapper` library); every other command is an operator's tool that lives here, so the
//! replica library ships no offline tools (the dealer, adoption, the local cluster, the
//! voting client).
#![forbid(unsafe_code)]

mod adopt;
mod adopted;
mod cluster;
mod files;
mod keygen;
mod voting;
mod zone;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use wrapper::config::{Protocol, ReadMode, Settings};

use crate::keygen::{ClusterParams, Layout};

#[derive(Parser)]
#[command(name = "sdns", version, about = "Byzantine-fault-tolerant DNS with threshold-signed DNSSEC (Cachin & Samar, DSN 2004)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The trusted dealer: threshold key, certificates, TSIG key, one directory per replica.
    Keygen {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Deal only this zone, for the cluster already dealt (with several zones) in --out:
        /// its key shares and files in every replica's zones/<zone>/, nothing else changed
        /// (--zone-file: its data; --bits, --algorithm: its key).
        #[arg(long, value_name = "ZONE")]
        add_zone: Option<String>,
    },
    /// Take primary zones from an existing BIND (their data, TSIG keys and update-policy, read
    /// through `named-checkconf -p`) and deal one cluster for them, as keygen does: every
    /// --zone given, one threshold key each. The report names every zone of named.conf and
    /// why it was or was not taken.
    Adopt {
        /// The existing BIND's configuration.
        #[arg(long, default_value = "/etc/bind/named.conf")]
        named_conf: PathBuf,
        /// Only print which zones could be adopted, and why not the others.
        #[arg(long)]
        list: bool,
        /// Take the zone's data by AXFR from this running named (ADDRESS:PORT) instead of its file.
        #[arg(long)]
        server: Option<SocketAddr>,
        /// TSIG key file for that AXFR (default: the zone's first allow-transfer key).
        #[arg(long)]
        axfr_key: Option<PathBuf>,
        /// The existing BIND's named-checkconf (its parser decides what named.conf means).
        #[arg(long, default_value = "named-checkconf")]
        named_checkconf: PathBuf,
        /// named-compilezone, to check the zone data and write it in canonical form.
        #[arg(long, default_value = "named-compilezone")]
        named_compilezone: PathBuf,
        /// A signed zone: the directory of your private KSK (default: the zone's key-directory).
        #[arg(long)]
        key_dir: Option<PathBuf>,
        /// A signed zone: your dnssec-signzone, which signs the DNSKEY RRset with your KSK once.
        #[arg(long, default_value = "dnssec-signzone")]
        dnssec_signzone: PathBuf,
        /// A signed zone: validity of that signature, in days (finish the rollover before it ends).
        #[arg(long, default_value_t = 90)]
        rollover_validity_days: u32,
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Output directory (the dealer's files, as keygen writes them).
        #[arg(long, default_value = "adopted")]
        out: PathBuf,
    },
    /// Run one replica.
    Run {
        #[arg(long)]
        config: PathBuf,
    },
    /// The paper's special command: ask replicas to sign the zone with the distributed
    /// key. It runs, on every replica at the same point of the log, once t+1 replicas'
    /// requests for it were ordered. Give one --admin and --token per replica asked.
    SignZone {
        /// A replica's metrics/admin address (loopback on the replica's host).
        #[arg(long, required = true)]
        admin: Vec<SocketAddr>,
        /// That replica's admin token file (`admin.token` in its state directory), in
        /// the same order as --admin.
        #[arg(long, required = true)]
        token: Vec<PathBuf>,
        /// The zone to sign (default: every zone the replicas serve, one request each).
        #[arg(long)]
        zone: Option<String>,
    },
    /// Add a zone to the running cluster, or remove one: an ordered change that runs at the
    /// same point of the log on every replica once t+1 replicas asked for it (each signs its
    /// request with its identity key). Each replica's answer is printed. Exit status: 0 the
    /// change executed, 3 counted but fewer than t+1 replicas asked so far (ask others
    /// within the cluster's sign_zone_window_s), 2 refused or an error.
    Zone {
        #[command(subcommand)]
        action: ZoneCmd,
    },
    /// Ask every replica and print the answer a quorum gave (the voting client). Exit status:
    /// 0 accepted, 2 bad arguments, 3 no quorum, 4 timeout.
    Query(crate::voting::QueryArgs),
    /// Send one RFC 2136 update to every replica; report the result n-t of them agree on.
    /// Exit status: 0 applied, 1 agreed failure (e.g. REFUSED), 2 bad arguments, 3 no quorum, 4 timeout.
    Update(crate::voting::UpdateArgs),
    /// A stub resolver for local applications that answers every query by voting.
    Stub(crate::voting::StubArgs),
    /// A whole cluster on this machine.
    Cluster {
        #[command(subcommand)]
        action: ClusterCmd,
    },
}

/// The replicas `sdns zone` asks, as `sdns sign-zone` takes them.
#[derive(Args)]
struct AdminArgs {
    /// A replica's metrics/admin address (loopback on the replica's host).
    #[arg(long, required = true)]
    admin: Vec<SocketAddr>,
    /// That replica's admin token file (`admin.token` in its state directory), in the same
    /// order as --admin.
    #[arg(long, required = true)]
    token: Vec<PathBuf>,
}

#[derive(Subcommand)]
enum ZoneCmd {
    /// Serve ZONE, dealt beforehand with `sdns keygen --add-zone` (each replica holding its
    /// zones/<zone>/ files). Every replica asked checks the key against the one it was dealt.
    Add {
        zone: String,
        /// The zone's key: its SHA-256 DS digest (the last field of zones/<zone>/ds.txt).
        #[arg(long, required_unless_present = "dir", conflicts_with = "dir")]
        key_digest: Option<String>,
        /// The dealer's directory (keygen's --out): the digest is read from its zones/<zone>/ds.txt.
        #[arg(long)]
        dir: Option<PathBuf>,
        #[command(flatten)]
        replicas: AdminArgs,
    },
    /// Stop serving ZONE (never the last one).
    Remove {
        zone: String,
        #[command(flatten)]
        replicas: AdminArgs,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Deal keys if DIR is new, start every replica, sign the zone, print how to use it.
    Up {
        #[command(flatten)]
        cluster: ClusterArgs,
        #[arg(long, default_value = ".cluster")]
        dir: PathBuf,
    },
    /// Stop every replica of the cluster in DIR (found by its pid files; the other
    /// cluster flags are accepted, so the same flags work for up, status and down).
    Down {
        #[command(flatten)]
        cluster: ClusterArgs,
        #[arg(long, default_value = ".cluster")]
        dir: PathBuf,
    },
    /// Finish the rollover of a zone adopted signed, once the parent serves the new DS:
    /// an ordered update deletes the rollover marker, then an ordered sign-zone drops your
    /// old KSK and its signature. With several zones, --zone names the one to finish.
    RolloverFinish {
        #[command(flatten)]
        cluster: ClusterArgs,
        #[arg(long, default_value = ".cluster")]
        dir: PathBuf,
    },
    /// Each replica's view, last executed sequence number, checkpoint and health.
    Status {
        #[command(flatten)]
        cluster: ClusterArgs,
        #[arg(long, default_value = ".cluster")]
        dir: PathBuf,
    },
}

#[derive(Args, Clone)]
struct ClusterArgs {
    /// The zone; `sdns keygen` takes it several times (one threshold key per zone).
    #[arg(long = "zone", default_value = "example.test.")]
    zones: Vec<String>,
    /// n, the number of replicas (n = 3t+1 tolerates t faulty ones).
    #[arg(long, default_value_t = 4)]
    replicas: u16,
    /// k, shares needed for a signature (default t+1).
    #[arg(long)]
    threshold: Option<u16>,
    #[arg(long, default_value_t = 2048)]
    bits: u32,
    /// DNSSEC algorithm of the zone's threshold key: 8 (RSASHA256), 10 (RSASHA512),
    /// 13 (ECDSAP256SHA256) or 15 (ED25519); README, "Choosing the algorithm".
    #[arg(long, default_value_t = 8, value_parser = parse_algorithm)]
    algorithm: u8,
    #[arg(long, value_enum, default_value = "opt-te")]
    protocol: Protocol,
    #[arg(long, value_enum, default_value = "ordered")]
    reads: ReadMode,
    /// Replicas that invert every bit of their signature shares (the paper's corrupted mode).
    #[arg(long, value_delimiter = ',')]
    corrupt: Vec<u16>,
    /// Replicas that misbehave, for tests and demonstrations (makes the cluster a test
    /// cluster): ID:MODE,... with MODE one of silent, crash-after-N, equivocating-primary,
    /// view-change-poisoner, forged-relays, peer-flooder, status-spammer, corrupt-shares,
    /// garbage-shares, wrong-answers, wrong-vouches, oversized-writes, update-flooder,
    /// snapshot-leech, origin-forger, budget-hog.
    #[arg(long, value_delimiter = ',', value_parser = wrapper::byzantine::parse_assignment)]
    byzantine: Vec<(u16, wrapper::byzantine::Mode)>,
    /// Fault injection for tests (makes the cluster a test cluster): every replica's
    /// executor treats ordered writes with a record of this owner name as if its named
    /// timed out on them, never sending them (`replica.test_fail_writes_naming`).
    #[arg(long)]
    test_fail_writes_naming: Option<String>,
    /// The zone's data (default: a small demo zone); with several --zone, one per zone in
    /// the same order.
    #[arg(long = "zone-file")]
    zone_files: Vec<PathBuf>,
    /// The patched BIND build (from patches/bind9/build.sh).
    #[arg(long, env = "SDNS_BIND_DIR", default_value = "target/bind9")]
    bind_dir: PathBuf,
    /// One address for all replicas, or one per replica.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1")]
    addresses: Vec<IpAddr>,
    #[arg(long, default_value_t = 5301)]
    client_port: u16,
    #[arg(long, default_value_t = 5401)]
    peer_port: u16,
    #[arg(long, default_value_t = 5501)]
    named_port: u16,
    #[arg(long, default_value_t = 5601)]
    metrics_port: u16,
    /// Re-sign the zone once its last signing is this old (default: half the validity).
    #[arg(long)]
    resign_after_s: Option<u64>,
    /// At most one whole-zone signing per this many seconds of agreed time (default 3600).
    #[arg(long)]
    sign_zone_interval_s: Option<u64>,
    /// Signature validity in seconds (default: named's 30 days); short values for soak runs.
    #[arg(long)]
    signature_validity_s: Option<u32>,
    /// Incremental re-signing: at most one slice per this many seconds of agreed time (default 10).
    #[arg(long)]
    resign_slice_interval_s: Option<u64>,
    /// Incremental re-signing: at most this many RRsets per slice (default 16).
    #[arg(long)]
    resign_slice_rrsets: Option<u32>,
    /// Signatures a whole-zone signing keeps in flight per replica (default: one per core).
    #[arg(long)]
    zone_signer_threads: Option<usize>,
    /// Finished signatures each replica keeps to answer peers still working on them
    /// (`[signing] cache_entries`, default 4096).
    #[arg(long)]
    signature_cache_entries: Option<usize>,
    /// What authorizes updates: tsig (a shared key every replica holds), sig0 (a KEY
    /// pair whose private half only the operator has), or both.
    #[arg(long, default_value = "tsig", value_parser = update_auth_parser())]
    update_auth: exec::auth::Mode,
    /// Replicas that order updates without checking them first (fault injection, tests).
    #[arg(long, value_delimiter = ',')]
    skip_precheck: Vec<u16>,
    /// Rate-limit UDP answers to this many per second per client prefix and answer
    /// (BIND's RRL; 0: off).
    #[arg(long, default_value_t = 0)]
    rrl_responses_per_second: u32,
    /// Ordering: a checkpoint every this many batches (default 64).
    #[arg(long)]
    checkpoint_interval: Option<u64>,
    /// Ordering: batches kept below the stable checkpoint for peers that fell behind
    /// (default 1024); one further behind catches up by state transfer.
    #[arg(long)]
    retained_batches: Option<u64>,
    /// Emulated wide-area links: a file of `FROM TO ADDRESS` lines; replica FROM dials replica
    /// TO at ADDRESS (a delaying proxy, `netdelay`) instead of TO's peer port (docs/LATENCY.md).
    #[arg(long)]
    peer_routes: Option<PathBuf>,
    /// Ordering: the shortest wait before a backup suspects the primary (default 250 ms); it
    /// must exceed the ordering latency of the cluster's first requests (raise it over
    /// wide-area links).
    #[arg(long)]
    min_request_timeout_ms: Option<u64>,
    /// An external secondary (ADDRESS:PORT) every replica NOTIFYs after each change of a zone
    /// (`[named] also_notify`); repeat for several. It then transfers from any replica
    /// (README, "Secondaries").
    #[arg(long = "also-notify", value_name = "ADDR:PORT")]
    also_notify: Vec<SocketAddr>,
    /// Serve a catalog zone (RFC 9432) of this name listing every zone (`[catalog] zone`),
    /// for secondaries that provision zones from a catalog (README, "Secondaries").
    #[arg(long, value_name = "NAME")]
    catalog_zone: Option<String>,
    /// A resolver (ADDRESS:PORT) the replicas ask for an adopted zone's DS at the parent
    /// (`[rollover] parent_resolvers`); repeat for several. Once t+1 replicas see the
    /// threshold key's DS there, the rollover finishes by itself (README, "Beside an
    /// existing BIND").
    #[arg(long = "parent-resolver", value_name = "ADDR:PORT")]
    parent_resolvers: Vec<SocketAddr>,
    /// Seconds between two rounds of DS questions (`[rollover] poll_interval_s`, default 60).
    #[arg(long)]
    rollover_poll_s: Option<u64>,
}

/// `--algorithm`: a DNSSEC algorithm sdns deals threshold keys of.
fn parse_algorithm(text: &str) -> Result<u8, String> {
    match text.parse::<u8>() {
        Ok(a @ (8 | 10 | 13 | 15)) => Ok(a),
        _ => Err(format!("DNSSEC algorithm {text}: sdns deals threshold keys of 8 (RSASHA256), 10 (RSASHA512), 13 (ECDSAP256SHA256) and 15 (ED25519)")),
    }
}

impl ClusterArgs {
    fn params(&self) -> ClusterParams {
        ClusterParams {
            zones: self.zones.iter().map(|z| if z.ends_with('.') { z.clone() } else { format!("{z}.") }).collect(),
            replicas: self.replicas,
            threshold: self.threshold,
            bits: self.bits,
            algorithm: self.algorithm,
            protocol: self.protocol,
            reads: self.reads,
            corrupt: self.corrupt.clone(),
            byzantine: self.byzantine.clone(),
            fail_writes_naming: self.test_fail_writes_naming.clone(),
            layout: Layout {
                addresses: self.addresses.clone(),
                client_port: self.client_port,
                peer_port: self.peer_port,
                named_port: self.named_port,
                metrics_port: self.metrics_port,
            },
            bind_dir: self.bind_dir.clone(),
            zone_files: self.zone_files.clone(),
            resign_after_s: self.resign_after_s,
            sign_zone_interval_s: self.sign_zone_interval_s,
            validity_s: self.signature_validity_s,
            resign_slice_interval_s: self.resign_slice_interval_s,
            resign_slice_rrsets: self.resign_slice_rrsets,
            zone_signer_threads: self.zone_signer_threads,
            signature_cache_entries: self.signature_cache_entries,
            update_auth: self.update_auth,
            skip_precheck: self.skip_precheck.clone(),
            rrl_responses_per_second: self.rrl_responses_per_second,
            checkpoint_interval: self.checkpoint_interval,
            retained_batches: self.retained_batches,
            peer_routes: self.peer_routes.clone(),
            min_request_timeout_ms: self.min_request_timeout_ms,
            also_notify: self.also_notify.clone(),
            catalog_zone: self.catalog_zone.as_ref().map(|z| if z.ends_with('.') { z.clone() } else { format!("{z}.") }),
            parent_resolvers: self.parent_resolvers.clone(),
            rollover_poll_s: self.rollover_poll_s,
        }
    }
}

/// `--update-auth`: the execution core's `Mode`, by its names, each shown with what it trusts.
fn update_auth_parser() -> impl TypedValueParser<Value = exec::auth::Mode> {
    let values = exec::auth::Mode::ALL.map(|m| PossibleValue::new(m.as_str()).help(m.help()));
    PossibleValuesParser::new(values).try_map(|s| s.parse::<exec::auth::Mode>())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Cmd::Run { .. } | Cmd::Stub(_)) {
        named_glue::signal::default_sigpipe();
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SDNS_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal; log files and journald get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Cmd::Query(args) => return crate::voting::query(args),
        Cmd::Update(args) => return crate::voting::update(args),
        Cmd::Stub(args) => return crate::voting::stub(args),
        Cmd::Keygen { cluster, out, add_zone: Some(zone) } => crate::keygen::add_zone(&cluster.params(), &out, &zone),
        Cmd::Keygen { cluster, out, add_zone: None } => crate::keygen::keygen(&cluster.params(), &out),
        Cmd::Adopt {
            named_conf,
            list,
            server,
            axfr_key,
            named_checkconf,
            named_compilezone,
            key_dir,
            dnssec_signzone,
            rollover_validity_days,
            cluster,
            out,
        } => {
            let options = crate::adopt::AdoptOptions {
                named_conf,
                checkconf: named_checkconf,
                compilezone: named_compilezone,
                server,
                axfr_key,
                list,
                key_dir,
                signzone: dnssec_signzone,
                rollover_validity_days,
            };
            crate::adopt::adopt(&options, &cluster.params(), &out)
        }
        Cmd::Run { config } => match Settings::load(&config) {
            Ok(c) => tokio::runtime::Runtime::new().map_err(anyhow::Error::from).and_then(|rt| {
                let result = rt.block_on(wrapper::run::run(c));
                // A blocking job still running (a share being computed) must not hold up the
                // exit, least of all after an essential task ended.
                rt.shutdown_timeout(std::time::Duration::from_secs(5));
                result
            }),
            Err(e) => Err(e.into()),
        },
        Cmd::SignZone { admin, token, zone } => crate::cluster::sign_zone(&admin, &token, zone.as_deref()).map(|outcome| println!("{outcome}")),
        Cmd::Zone { action } => {
            let asked = match action {
                ZoneCmd::Add { zone, key_digest, dir, replicas } => crate::zone::key_digest(&zone, key_digest.as_deref(), dir.as_deref())
                    .and_then(|digest| crate::zone::change(&replicas.admin, &replicas.token, &zone, Some(digest))),
                ZoneCmd::Remove { zone, replicas } => crate::zone::change(&replicas.admin, &replicas.token, &zone, None),
            };
            match asked {
                Ok(crate::zone::Outcome::Executed) => Ok(()),
                Ok(crate::zone::Outcome::Counted) => {
                    eprintln!("sdns: counted, not executed yet: fewer than t+1 replicas asked for it so far");
                    return ExitCode::from(3);
                }
                Err(e) => Err(e),
            }
        }
        Cmd::Cluster { action } => match action {
            ClusterCmd::Up { cluster, dir } => crate::cluster::up(&cluster.params(), &dir),
            ClusterCmd::Down { cluster, dir } => crate::cluster::down(cluster.replicas, &dir),
            ClusterCmd::RolloverFinish { cluster, dir } => crate::cluster::rollover_finish(&cluster.params(), &dir),
            ClusterCmd::Status { cluster, dir } => match crate::cluster::status(&cluster.params(), &dir) {
                Ok(true) => Ok(()),
                Ok(false) => return ExitCode::from(1),
                Err(e) => Err(e),
            },
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sdns: {e:#}");
            ExitCode::from(2)
        }
    }
}
