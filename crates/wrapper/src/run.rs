//! `sdns run`: one replica, all its parts wired together.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use bft::transport::driver::{now, spawn_replica_with};
use bft::transport::Store;
use bft::Replica;
use exec::auth::sig0::Sig0Key;
use exec::auth::zones::ZoneAuth;
use exec::auth::TsigKey as DealerTsig;
use exec::auth::{tsig, Authenticator, TsigSecret};
use exec::{ExecConfig, ExecCore, ExecState, SignZoneSigner, SignZoneVerifier, UpdateGate};
use hickory_proto::rr::Name;
use mesh::{Mesh, MeshConfig, CHANNEL_ORDERING, CHANNEL_READS, CHANNEL_SIGNING, CHANNEL_STATE};
use named_glue::conf::{NamedConf, TsigKey, ZoneConf};
use named_glue::forward::Forwarder;
use named_glue::signer::{watch_time_source, ServiceLimits, SigningService};
use named_glue::supervisor::{NamedSpec, Supervisor};
use named_glue::tools::BindTools;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tracing::info;

use crate::byzantine::{Mode, SigningFault};
use crate::config::{Config, ZoneSection};
use crate::endpoint;
use crate::executor::Executor;
use crate::files::{check_secret_mode, read_secret, zone_key};
use crate::gateway::Gateway;
use crate::listener::ClientFilters;
use crate::listener::{serve_tcp, serve_udp, TcpLimits};
use crate::metrics::{self, Metrics};
use crate::pending::Pending;
use crate::rrl::Limiter;
use crate::signing::{service, Keys, SignerCore, SignerLimits};
use crate::statexfer::{SnapshotStore, StateTransfer};
use crate::tasks::Essential;
use crate::zone::ZoneMaintenance;

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Reads a TSIG key file (BIND's key statement, as `sdns keygen` or tsig-keygen write it);
/// one that group or others may read is refused.
fn load_tsig(path: &Path) -> Result<TsigSecret> {
    let key = DealerTsig::from_bind(&read_secret(path).map_err(|e| anyhow!(e))?).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let algorithm = tsig::Algorithm::from_name(&key.algorithm)
        .ok_or_else(|| anyhow!("{}: TSIG algorithm {} is not supported (hmac-sha1/256/384/512 are)", path.display(), key.algorithm))?;
    Ok(TsigSecret { name: key.name.clone(), algorithm, secret: key.secret() })
}

/// The update authenticator of the zone with this index, from `[auth]` and the zone's keys,
/// and the keys named must know for it: the local keys it grants updates to, and the
/// clients' update and transfer keys.
fn authenticator(config: &Config, index: usize, zone: &ZoneSection) -> Result<(Authenticator, Vec<TsigKey>, Vec<TsigKey>)> {
    let updates = zone.tsig_keys.iter().map(|p| load_tsig(&config.resolve(p))).collect::<Result<Vec<_>>>()?;
    let transfers = zone.transfer_keys.iter().map(|p| load_tsig(&config.resolve(p))).collect::<Result<Vec<_>>>()?;
    let sig0 = zone
        .sig0_keys
        .iter()
        .map(|p| {
            let path = config.resolve(p);
            Sig0Key::from_key_file(&read(&path)?).map_err(|e| anyhow!("{}: {}: {e}", config.field_of(zone, "sig0_keys"), path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let auth = if config.zones.len() == 1 {
        Authenticator::new(config.auth.mode, &updates, &transfers, sig0, named_glue::time::unix_now)
    } else {
        // validate() bounds the zone count far below u16::MAX.
        let index = u16::try_from(index).map_err(|_| anyhow!("zone index {index} out of range"))?;
        Authenticator::for_zone(index, config.auth.mode, &updates, &transfers, sig0, named_glue::time::unix_now)
    };
    let auth = auth.with_context(|| format!("update authentication of zone {}", zone.name))?.with_sig0_max_validity(config.auth.sig0_max_validity_s);
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
fn local_policy(config: &Config, zone: &ZoneSection, auth: &Authenticator) -> Result<Option<Vec<named_glue::conf::PolicyRule>>> {
    let Some(rules) = zone.policy_rules() else {
        return Ok(None);
    };
    let (policy_field, keys_field) = (config.field_of(zone, "update_policy"), config.field_of(zone, "tsig_keys"));
    let rules = rules.map_err(|e| anyhow!("{policy_field}: {e}"))?;
    let mut local = Vec::new();
    for rule in rules {
        let names =
            auth.local_names(&rule.identity).ok_or_else(|| anyhow!("{policy_field} names the key {:?}, which is in no file of {keys_field}", rule.identity))?;
        for name in names {
            local.push(named_glue::conf::PolicyRule { identity: name, ..rule.clone() });
        }
    }
    Ok(Some(local))
}

/// Reads executing at once at this gateway.
const MAX_READS_IN_FLIGHT: usize = 64;
/// The key named grants the re-signing updates to (RRSIG only).
const MAINTENANCE_KEY: &str = "resign.sdns-local.";
/// The key of the update that brings a zone signed in the background up to date.
const CATCHUP_KEY: &str = "catchup.sdns-local.";
/// How often the parts that own their tasks (mesh, named's supervisor, signing sockets, the
/// ordering driver) are asked whether those still run.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Runs one replica; its execution core asks the update authenticator about every
/// ordered write.
pub async fn run(config: Config) -> Result<()> {
    let id = config.replica.id;
    let n = config.cluster.replicas;
    let t = config.faults();
    let Some(zone_config) = config.zones.first() else { bail!("no zone is configured") };
    let zone = Name::from_ascii(&zone_config.name).with_context(|| config.field_of(zone_config, "name"))?;
    let metrics = Metrics::new(id);
    let byzantine = config.replica.byzantine;
    if let Some(mode) = byzantine {
        // validate() allows this only in a test cluster.
        tracing::warn!(replica = id, %mode, "BYZANTINE MODE: this replica misbehaves on purpose (test cluster)");
    }
    let seeded_bug = crate::seeded_bug::active(id);
    if let Some(bug) = seeded_bug {
        tracing::warn!(replica = id, ?bug, "SEEDED BUG (SDNS_SEEDED_BUG): this replica is wrong on purpose, to test the history checker");
    }

    // Keys: one threshold key per zone, in zone index order; every share must be private
    // to this replica's user.
    let mut zone_keys = Vec::new();
    for z in &config.zones {
        let share_path = config.resolve(&z.key_share);
        check_secret_mode(&share_path).map_err(|e| anyhow!(e))?;
        let public = Arc::new(shoup_rsa::load_public(config.resolve(&z.public_key)).with_context(|| config.field_of(z, "public_key"))?);
        let share = Arc::new(shoup_rsa::load_share(&share_path).with_context(|| config.field_of(z, "key_share"))?);
        let keys = Keys::new(public.clone(), share).with_context(|| format!("zone {}: key share does not belong to the public key", z.name))?;
        if public.players() != n {
            bail!("zone {}: public key is for {} replicas, config says {n}", z.name, public.players());
        }
        let apex = Name::from_ascii(&z.name).with_context(|| config.field_of(z, "name"))?;
        let key = zone_key(&apex, z.algorithm, &public)?;
        zone_keys.push((keys, key));
    }
    // The status lists every zone, in zone index order, with its key tag.
    metrics.set_zones(config.zones.iter().zip(&zone_keys).map(|(z, (_, key))| (z.name.clone(), key.key_tag())));

    // named's directory: configuration and key files are rewritten at every start;
    // the zone file only on first start (afterwards named's file and journal rule).
    let state = config.resolve(&config.replica.state_dir);
    let named_dir = state.join("named");
    std::fs::create_dir_all(&named_dir).with_context(|| format!("creating {}", named_dir.display()))?;
    let mut conf = NamedConf::without_zones(&named_dir, config.named.port);
    // Key files dated a day back, so named takes them as active now.
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0).saturating_sub(86_400);
    // The key of the ordered re-signing updates (granted RRSIG only), fresh each start.
    let mut maintenance_secret = vec![0u8; 32];
    getrandom::fill(&mut maintenance_secret).map_err(|e| anyhow!("no OS randomness for the maintenance key: {e}"))?;
    let maintenance_key =
        tsig::Key::new(MAINTENANCE_KEY, tsig::Algorithm::HmacSha256, &maintenance_secret).ok_or_else(|| anyhow!("bad maintenance key name"))?;
    conf.maintenance_key =
        Some(TsigKey { name: MAINTENANCE_KEY.trim_end_matches('.').to_string(), algorithm: "hmac-sha256".into(), secret: maintenance_secret });
    // The catch-up key after a background signing: granted what the update keys are (no
    // DNSSEC types), fresh each start.
    let mut catchup_secret = vec![0u8; 32];
    getrandom::fill(&mut catchup_secret).map_err(|e| anyhow!("no OS randomness for the catch-up key: {e}"))?;
    let catchup_key = tsig::Key::new(CATCHUP_KEY, tsig::Algorithm::HmacSha256, &catchup_secret).ok_or_else(|| anyhow!("bad catch-up key name"))?;
    let catchup_conf_key = TsigKey { name: CATCHUP_KEY.trim_end_matches('.').to_string(), algorithm: "hmac-sha256".into(), secret: catchup_secret };
    conf.sig_validity_days = config.named.signature_validity_days;
    let tools = BindTools::new(&config.resolve(&config.named.bind_dir));
    tools.check().context("named.bind_dir")?;
    // named loads its zone file in raw format several times faster than text (a 10,000-name
    // signed zone: 0.3 s against 1.1 s), and a signed zone is installed by restarting named.
    conf.raw_zone_file = true;
    // One zone statement per zone. named trusts only this replica's local keys for updates
    // (fresh secrets each start), one per (zone, identity), granted in that zone only.
    let mut zone_auths = Vec::new();
    for (index, z) in config.zones.iter().enumerate() {
        let (auth, local_keys, known_keys) = authenticator(&config, index, z)?;
        let apex = Name::from_ascii(&z.name).with_context(|| config.field_of(z, "name"))?;
        // One zone keeps the layout of every earlier state directory; several get a directory each.
        let files = if config.zones.len() == 1 { named_dir.clone() } else { named_dir.join(z.dir_name()) };
        let mut zone_conf = ZoneConf::in_dir(&apex, &files, local_keys);
        zone_conf.tsig_keys.push(catchup_conf_key.clone());
        zone_conf.update_policy = local_policy(&config, z, &auth)?;
        std::fs::create_dir_all(&zone_conf.key_directory).with_context(|| format!("creating {}", zone_conf.key_directory.display()))?;
        // The zone's public DNSKEY only: the private half is the replicas' threshold key.
        if let Some((_, key)) = zone_keys.get(index) {
            key.write_files(&zone_conf.key_directory, created).with_context(|| format!("writing the key files of zone {}", z.name))?;
        }
        // The operator's zone file only on first start (afterwards named's file and journal
        // rule), compiled to raw; a state directory of a version that kept it in text is
        // compiled once (named's journal still applies: the serial is the same).
        if !zone_conf.zone_file.exists() {
            let src = config.resolve(&z.zone_file);
            tools.compile_raw(&z.name, &src, &zone_conf.zone_file).map_err(|e| anyhow!("{} {}: {e}", config.field_of(z, "zone_file"), src.display()))?;
        } else if !named_glue::tools::is_raw_zone_file(&zone_conf.zone_file).with_context(|| format!("reading {}", zone_conf.zone_file.display()))? {
            let text = zone_conf.zone_file.with_extension("text");
            std::fs::rename(&zone_conf.zone_file, &text).with_context(|| format!("moving {} aside", zone_conf.zone_file.display()))?;
            tools.compile_raw(&z.name, &text, &zone_conf.zone_file).map_err(|e| anyhow!("compiling {} to raw: {e}", text.display()))?;
            std::fs::remove_file(&text).with_context(|| format!("removing {}", text.display()))?;
            info!(replica = id, zone = z.name, "named's zone file converted from text to raw format");
        }
        conf.transfer_keys.extend(known_keys);
        conf.zones.push(zone_conf);
        zone_auths.push((z.name.clone(), auth));
    }
    let auth = Arc::new(ZoneAuth::new(zone_auths).context("update authentication")?);
    for line in auth.describe() {
        info!(replica = id, mode = auth.mode().as_str(), "update identity: {line}");
    }
    let conf_path = named_dir.join("named.conf");
    conf.write(&conf_path).context("writing named.conf")?;
    named_glue::conf::check_conf(&tools, &conf_path).context("named-checkconf rejects the generated named.conf")?;

    // The mesh to the other replicas: ordering on channel 0, signing on channel 1.
    let me = config.me().clone();
    let peers: Vec<(u16, SocketAddr)> = config.peers.iter().filter(|p| p.id != id).map(|p| (p.id, p.peer)).collect();
    let tls_key_pem = read_secret(&config.resolve(&config.replica.tls_key)).map_err(|e| anyhow!(e)).context("replica.tls_key")?;
    let (ca_pem, cert_pem) = (read(&config.resolve(&config.cluster.ca_cert))?, read(&config.resolve(&config.replica.cert))?);
    // Sign-zone requests are signed with the mesh identity over the zone's name and checked
    // against the CA: one verifier and one signer per zone, in zone index order.
    let ca_der = mesh::pki::cert_der_from_pem(&ca_pem).context("cluster.ca_cert")?;
    let sign_zone_verifiers: Vec<SignZoneVerifier> = config.zones.iter().map(|z| SignZoneVerifier::new(&z.name, ca_der.clone())).collect();
    let sign_zone_signers = config
        .zones
        .iter()
        .map(|z| SignZoneSigner::new(id, &z.name, &cert_pem, tls_key_pem.clone()).map(Arc::new).map_err(anyhow::Error::msg).context("replica.cert"))
        .collect::<Result<Vec<_>>>()?;
    let mut mesh_config = MeshConfig::new(id, me.peer, peers, ca_pem, cert_pem, tls_key_pem);
    // Every ordering message the core may send must fit a frame: a view change reports up to
    // a window of prepared batches (tens of MiB when peers fill batches, as a flooder does),
    // and one that cannot be sent stalls the view change.
    let max_message = bft::Config::new(n, id).max_message_bytes;
    mesh_config.max_frame_bytes = mesh_config.max_frame_bytes.max(max_message).min(mesh::MAX_FRAME_BYTES_LIMIT);
    mesh_config.queue_bytes = mesh_config.queue_bytes.max(mesh_config.max_frame_bytes);
    let mesh = Mesh::start(mesh_config).await.context("starting the replica mesh")?;
    let signing_rx = mesh.subscribe(CHANNEL_SIGNING).context("mesh signing channel")?;
    let ordering_rx = mesh.subscribe(CHANNEL_ORDERING).context("mesh ordering channel")?;
    let state_rx = mesh.subscribe(CHANNEL_STATE).context("mesh state-transfer channel")?;

    // Threshold signing, and the socket named asks it on.
    let limits = SignerLimits { finals_cache: config.signing.cache_entries, ..SignerLimits::default() };
    let corrupt = config.replica.corrupt_shares || byzantine == Some(Mode::CorruptShares);
    // One core per zone (its own key and session limits), in zone index order.
    let cores = config
        .zones
        .iter()
        .zip(&zone_keys)
        .map(|(z, (keys, key))| {
            let signing_key = service::ZoneSigningKey { signer: z.apex(), algorithm: z.algorithm, key_tag: key.key_tag() };
            (signing_key, SignerCore::new(id, n, config.cluster.protocol.into(), corrupt, keys.clone(), limits.clone()))
        })
        .collect();
    let fault = byzantine.map_or(SigningFault::None, Mode::signing);
    // Every task the replica cannot run without is kept here: the first to end stops it.
    let mut tasks = Essential::new();
    let (signer, signing_task) = service::spawn(cores, mesh.sender(), signing_rx, metrics.clone(), fault);
    tasks.spawn("threshold signing service", signing_task);
    let (times_tx, times_rx) = watch::channel(None);
    let socket_path = state.join("signer.sock");
    // No timeout anywhere on this path: a signature takes as long as the replicas take.
    // Signatures made for writes: a write that still gets them is not stuck (`Executor::signatures`).
    let write_signatures = Arc::new(AtomicU64::new(0));
    let progressing = Arc::new(service::Progressing { inner: signer.clone(), done: write_signatures.clone() });
    let signing_service =
        SigningService::bind(&socket_path, progressing, watch_time_source(times_rx), ServiceLimits::default()).context("binding the signing socket")?;
    tasks.watch("signing socket", WATCH_EVERY, move || signing_service.has_stopped());
    // Background whole-zone signings have a socket of their own: its times are the running
    // signing's while writes execute with theirs, and what it signs is counted for progress.
    // One per zone, since two zones' signings may run at once with different times (zone 0
    // keeps the socket name of a single-zone replica).
    let counting = Arc::new(service::Counting { inner: signer, metrics: metrics.clone() });
    let mut backgrounds = Vec::new();
    let mut background_sockets = Vec::new();
    for index in 0..config.zones.len() {
        let (background, background_times) = crate::executor::Background::new();
        let background_socket = if index == 0 { state.join("signzone.sock") } else { state.join(format!("signzone-{index}.sock")) };
        let background_service = SigningService::bind(&background_socket, counting.clone(), watch_time_source(background_times), ServiceLimits::default())
            .context("binding the background signing socket")?;
        tasks.watch("background signing socket", WATCH_EVERY, move || background_service.has_stopped());
        backgrounds.push(background);
        background_sockets.push(background_socket);
    }

    // named, supervised, asking our socket for every signature.
    let mut spec = NamedSpec::new(tools.named(), conf_path.clone(), config.named.port, zone.clone(), named_dir.join("named.log"));
    spec.signer_socket = Some(socket_path.clone());
    spec.pid_file = Some(conf.pid_file.clone());
    // named waits for each signature without a deadline (re-sending its request to a
    // restarted service); it dies with this process (the supervisor's PDEATHSIG).
    let supervisor = Arc::new(Supervisor::start(spec).await.context("starting named")?);
    supervisor.wait_ready().await.context("named did not become ready")?;
    metrics.update_status(|s| s.named_running = true);
    let watched = supervisor.clone();
    tasks.watch("named supervisor", WATCH_EVERY, move || watched.has_stopped());
    let named = Forwarder::new(SocketAddr::from(([127, 0, 0, 1], config.named.port)));
    // An ordered write waits for named, which waits for its threshold signatures: no
    // local timer decides that a write failed. The long read timeout only notices a
    // named that lost the request (it is then sent again).
    let writes = Forwarder { tcp_timeout: Duration::from_secs(3600), ..named.clone() };

    // Ordering.
    let o = &config.ordering;
    let mut bcfg = bft::Config::new(n, id);
    bcfg.f = t;
    bcfg.batch_max_requests = o.batch_max_requests;
    bcfg.batch_delay = Duration::from_millis(o.batch_delay_ms);
    bcfg.checkpoint_interval = o.checkpoint_interval;
    bcfg.watermark_window = o.checkpoint_interval * 4;
    bcfg.request_timeout = Duration::from_millis(o.request_timeout_ms);
    bcfg.min_request_timeout = Duration::from_millis(o.min_request_timeout_ms);
    bcfg.view_change_timeout = Duration::from_millis(o.view_change_timeout_ms);
    bcfg.max_clock_skew = Duration::from_millis(o.max_clock_skew_ms);
    bcfg.retained_batches = o.retained_batches;
    bcfg.max_origin_bytes_per_sec = o.max_origin_bytes_per_sec;
    bcfg.min_request_charge = o.min_request_charge;
    let state_file = state.join("exec.state");
    let mut exec_state = ExecState::load(&state_file).context("the execution state")?;
    if !state_file.exists() {
        // A state directory from before the execution core kept two plain numbers.
        let number = |name: &str| std::fs::read_to_string(state.join(name)).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
        exec_state.executed = number("executed.seq");
        let last_signed_s = number("last-signed");
        if last_signed_s != 0 {
            exec_state.zone_mut(0).last_signed_s = last_signed_s;
        }
    }
    // The ordering resumes where it left off (view, promises, committed batches), so that it
    // and the executor agree on where they are after any restart.
    let store = Store::open(&state.join("ordering")).context("the ordering state directory")?;
    let replica = match store.load().context("the ordering state")? {
        Some(persisted) => {
            let deliverable = persisted.deliverable();
            info!(
                replica = id,
                view = persisted.view(),
                stable = persisted.stable_checkpoint().seq,
                deliverable,
                executed = exec_state.executed,
                "resuming the ordering from its persisted state"
            );
            if deliverable < exec_state.executed {
                // The ordering state is older than what named applied: a crash between a state
                // transfer's install and the ordering's record of it, or a copied directory.
                // The executor skips every batch up to its executed position (named holds
                // them), so the ordering may catch up from its peers, or by a state transfer
                // once they no longer hold those batches; nothing is applied twice.
                tracing::warn!(
                    replica = id,
                    deliverable,
                    executed = exec_state.executed,
                    "the ordering state is behind the executed position; catching up from peers"
                );
            }
            Replica::restore(bcfg, now(), persisted).context("restoring the ordering state")?
        }
        None => {
            if exec_state.executed > 0 {
                tracing::error!(replica = id, executed = exec_state.executed, "no ordering state next to an executed position (a state directory from an older version): this replica counts as faulty until it has caught up");
            }
            Replica::new(bcfg, now()).context("ordering configuration")?
        }
    };
    let behaviour = byzantine.and_then(Mode::ordering).map(|b| bft::transport::Byzantine::new(b, replica.config()));
    // Vouched reads travel on the mesh's reads channel (`crate::vouched`), never through the
    // ordering driver, which only publishes the read barrier they wait for.
    let (mut handle, batches) = spawn_replica_with(replica, mesh.sender(), ordering_rx, behaviour, Some(store));

    let pending = Arc::new(Pending::new(config.client.max_pending));
    let core = ExecCore::new(
        ExecConfig {
            id,
            faults: t,
            validity_s: config.validity_s(),
            resign_after_s: config.resign_after_s(),
            slice_interval_s: config.signing.resign_slice_interval_s,
            slice_rrsets: config.signing.resign_slice_rrsets,
            sign_zone_interval_s: config.signing.sign_zone_interval_s,
            sign_zone_window_s: config.signing.sign_zone_window_s,
            sign_zone_verifiers,
            max_reads_in_flight: MAX_READS_IN_FLIGHT,
        },
        auth.clone() as Arc<dyn UpdateGate>,
        exec_state,
    );
    let last_signed: Vec<Arc<AtomicU64>> = config.zones.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let cache = Arc::new(crate::read::ReadCache::default());
    // State transfer: snapshots kept at every checkpoint, served to and fetched from peers.
    let snapshots = SnapshotStore::new(state.join("snapshots")).context("the snapshot directory")?;
    let (installs_tx, installs_rx) = mpsc::channel(1);
    let transfer_stats: Arc<std::sync::Mutex<crate::statexfer::TransferStats>> = Default::default();
    let transfer = StateTransfer {
        id,
        peers: config.peers.iter().map(|p| p.id).filter(|p| *p != id).collect(),
        store: snapshots.clone(),
        outbound: Arc::new(mesh.sender()),
        max_snapshot_bytes: o.max_snapshot_bytes,
        stats: transfer_stats.clone(),
        zones: config.zones.iter().map(|z| z.name.clone()).collect(),
    };
    // What to fetch: the ordering's request (it fell behind the log its peers retain), or the
    // next certified checkpoint after this replica's state was found to differ.
    let (needed_tx, needed_rx) = watch::channel(None);
    let (installed_tx, installed_rx) = mpsc::channel(4);
    let (diverged_tx, diverged_rx) = watch::channel(0u64);
    let own_digests: crate::executor::OwnDigests = Default::default();
    tasks.spawn("state transfer", transfer.run(state_rx, needed_rx, installs_tx, installed_tx));
    if byzantine == Some(Mode::SnapshotLeech) {
        let (status, peers) = (handle.status.clone(), config.peers.iter().map(|p| p.id).filter(|p| *p != id).collect());
        let target = move || {
            let claim = status.borrow().core.stable_claim;
            (claim.seq, claim.state_digest)
        };
        tasks.spawn("snapshot leech", crate::statexfer::leech(Arc::new(mesh.sender()), peers, target));
    }
    let leeches = transfer_stats.clone();
    tasks.spawn(
        "checkpoint repair",
        repair(
            id,
            handle.status.clone(),
            handle.state_transfer.clone(),
            needed_tx,
            installed_rx,
            handle.installed.clone(),
            diverged_tx,
            own_digests.clone(),
            transfer_stats,
            metrics.clone(),
        ),
    );
    // Each zone's whole-zone operations. One zone keeps the layout of every earlier state
    // directory (work files in named's directory, resign.pending); several get their own.
    let several = config.zones.len() > 1;
    let zone_maintenance: Vec<Arc<ZoneMaintenance>> = config
        .zones
        .iter()
        .zip(&conf.zones)
        .zip(&zone_keys)
        .zip(&background_sockets)
        .map(|(((z, files), (_, key)), background_socket)| {
            let apex = Name::from_ascii(&z.name).with_context(|| config.field_of(z, "name"))?;
            let (work_dir, slice_journal) = if several {
                let dir = named_dir.join(z.dir_name());
                (dir.clone(), dir.join("resign.pending"))
            } else {
                (named_dir.clone(), state.join("resign.pending"))
            };
            Ok(Arc::new(ZoneMaintenance {
                tools: tools.clone(),
                zone: apex,
                named: named.clone(),
                work_dir,
                files: files.clone(),
                raw_zone_file: conf.raw_zone_file,
                key: key.clone(),
                signer_socket: socket_path.clone(),
                supervisor: supervisor.clone(),
                maintenance_key: maintenance_key.clone(),
                writes: writes.clone(),
                earliest_expiration: std::sync::atomic::AtomicU32::new(0),
                slice_index: Default::default(),
                slice_journal,
                signer_threads: config.signing.zone_signer_threads(),
                catchup_key: catchup_key.clone(),
                background_socket: background_socket.clone(),
            }))
        })
        .collect::<Result<_>>()?;
    let (executed_tx, executed_rx) = watch::channel(0u64);
    let (stuck_tx, stuck_rx) = watch::channel(None);
    let fail_writes_naming = match &config.replica.test_fail_writes_naming {
        Some(name) => Some(Name::from_ascii(name).context("replica.test_fail_writes_naming")?),
        None => None,
    };
    if let Some(name) = &fail_writes_naming {
        tracing::warn!(replica = id, %name, "FAULT INJECTION: ordered writes naming this owner are never sent to named (test cluster)");
    }
    let executor = Executor {
        stuck: stuck_tx,
        signatures: write_signatures,
        // Half the watermark window (four checkpoint intervals, above).
        claim_backlog: usize::try_from(o.checkpoint_interval.saturating_mul(2)).unwrap_or(usize::MAX).max(1),
        fail_writes_naming,
        write_task: Default::default(),
        executed: executed_tx,
        tasks: Default::default(),
        id,
        cache: cache.clone(),
        last_digest: Default::default(),
        core,
        named: named.clone(),
        writes: writes.clone(),
        pending: pending.clone(),
        times: times_tx,
        checkpoints: handle.checkpoint.clone(),
        metrics: metrics.clone(),
        zones: zone_maintenance,
        state_file,
        last_signed: last_signed.clone(),
        snapshots: Some(snapshots),
        digested: Default::default(),
        bases: Default::default(),
        installs: Some(installs_rx),
        backgrounds: backgrounds.clone(),
        own_digests,
        diverged_at: Some(diverged_rx),
    };
    // Subscribed before the executor can resume a signing and finish its part.
    let voter_rxs: Vec<_> = backgrounds.iter().map(|b| b.finished.subscribe()).collect();
    tasks.spawn("executor", executor.run(batches));

    // Vouched reads (ordered mode): probes and barriers travel on the mesh's reads channel and
    // are handled in its reader tasks; the peers' probes are answered whatever this replica's
    // own setting (a gateway with it off sends none).
    let (fallback_tx, fallback_rx) = mpsc::channel(config.client.max_pending);
    let (vouched, vouched_task) = crate::vouched::VouchedReads::start(
        n,
        t,
        named.clone(),
        cache.clone(),
        metrics.clone(),
        Duration::from_millis(config.cluster.vouch_timeout_ms)..=Duration::from_millis(config.cluster.vouch_timeout_max_ms),
        crate::vouched::Wiring {
            out: Arc::new(mesh.sender()),
            barrier: handle.read_barrier.clone(),
            executed: executed_rx,
            fallback: fallback_tx,
            fault: byzantine.map(Mode::reads).unwrap_or_default(),
        },
    );
    let inbox = vouched.clone();
    mesh.handle_inline(CHANNEL_READS, Arc::new(move |from, frame: bytes::Bytes| inbox.handle(from, &frame))).context("mesh reads channel")?;
    tasks.spawn("vouched-read timeouts", vouched_task);
    let vouched = (config.cluster.reads == crate::config::ReadMode::Ordered && config.cluster.vouched_reads).then_some(vouched);
    let incarnation = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
    let gateway = Arc::new(Gateway {
        id,
        incarnation: AtomicU64::new(incarnation),
        pending,
        submit: handle.submit.clone(),
        named: named.clone(),
        cache: cache.clone(),
        metrics: metrics.clone(),
        client_timeout: Duration::from_millis(config.client.request_timeout_ms),
        next_number: AtomicU64::new(0),
    });
    metrics.set_slice_pace(config.signing.resign_slice_rrsets, config.signing.resign_slice_interval_s);
    if let Some(mode @ (Mode::OversizedWrites | Mode::UpdateFlooder)) = byzantine {
        // The first zone's first update key signs the oversized updates.
        let key = zone_config.tsig_keys.first().and_then(|p| load_tsig(&config.resolve(p)).ok()).and_then(|k| tsig::Key::new(&k.name, k.algorithm, &k.secret));
        tasks.spawn("Byzantine writes", order_hostile_writes(gateway.clone(), mode, key));
    }
    tasks.spawn("stuck-write claimer", stuck_claimer(gateway.clone(), stuck_rx));
    for (index, (last, (signer, voter_rx))) in last_signed.into_iter().zip(sign_zone_signers.iter().zip(voter_rxs)).enumerate() {
        // validate() bounds the zone count far below u16::MAX.
        let zone = u16::try_from(index).map_err(|_| anyhow!("zone index {index} out of range"))?;
        tasks.spawn("re-sign timer", resign_timer(gateway.clone(), zone, last, config.signing.resign_slice_interval_s));
        tasks.spawn("sign-zone finish voter", finish_voter(gateway.clone(), zone, signer.clone(), voter_rx));
    }
    let (client_tx, client_rx) = mpsc::channel(config.client.max_pending);
    tasks.spawn("gateway", gateway.clone().run(client_rx, fallback_rx));
    if let Some(refused) = handle.refused.take() {
        tasks.spawn("gateway renumbering", gateway.clone().renumber_refused(refused));
    }

    let udp = Arc::new(crate::listener::bind_udp(me.client, config.client.udp_receive_buffer).with_context(|| format!("binding UDP {}", me.client))?);
    let tcp = TcpListener::bind(me.client).await.with_context(|| format!("binding TCP {}", me.client))?;
    let access = Arc::new(config.access.clone());
    let filters = Arc::new(ClientFilters {
        // The fault-injection switch leaves this replica ordering whatever it gets.
        auth: (!config.auth.skip_precheck).then(|| auth.clone()),
        rrl: Limiter::new(config.rrl.clone()).map(Arc::new),
        order_limit: crate::rrl::OrderLimiter::new(&config.order_limit).map(Arc::new),
        lie: byzantine == Some(Mode::WrongAnswers),
        local_reads: (config.cluster.reads == crate::config::ReadMode::Local || seeded_bug == Some(crate::seeded_bug::Bug::EarlyRead))
            .then(|| crate::read::LocalReads::new(cache.clone(), named.clone())),
        vouched,
    });
    tasks.spawn("UDP listener", serve_udp(udp, client_tx.clone(), metrics.clone(), access.clone(), filters.clone()));
    let tcp_limits = TcpLimits {
        idle: Duration::from_millis(config.client.tcp_idle_timeout_ms),
        max_connections: config.client.tcp_max_connections,
        max_pipelined: config.client.tcp_max_pipelined,
        write_timeout: Duration::from_millis(config.client.tcp_write_timeout_ms),
    };
    tasks.spawn("TCP listener", serve_tcp(tcp, client_tx, tcp_limits, metrics.clone(), access, filters));
    if let Some(addr) = config.metrics.listen {
        let m = metrics.clone();
        let token = endpoint::write_admin_token(&state.join(endpoint::ADMIN_TOKEN_FILE)).context("writing the admin token")?;
        let signers = config.zones.iter().map(|z| z.name.clone()).zip(sign_zone_signers).collect();
        let admin = Arc::new(endpoint::Admin { gateway: gateway.clone(), token, signers });
        tasks.spawn("metrics and admin endpoint", endpoint::serve(addr, m, Some(admin)));
    }

    // Status for /status and `cluster status`.
    let mut status = handle.status.clone();
    let m = metrics.clone();
    let mesh_status = Arc::new(mesh);
    let ms = mesh_status.clone();
    tasks.watch("mesh", WATCH_EVERY, move || mesh_status.has_stopped());
    let started = tokio::time::Instant::now();
    let (own_requests, stall_after) = (gateway.pending.clone(), config.stall_after());
    tasks.spawn("status", async move {
        let mut last_view = 0;
        let mut attribution = Attribution::default();
        let mut progress = Progress::default();
        loop {
            {
                let s = status.borrow_and_update().clone();
                if s.core.view > last_view {
                    m.inc_view_change();
                    last_view = s.core.view;
                }
                let connected = ms.peer_status().iter().filter(|p| p.connected).count();
                let over_rate = leeches.lock().map(|t| t.over_rate.clone()).unwrap_or_default();
                let (faults, silent) = attribution.update(id, n, &s, &m.bad_shares(), &over_rate, &m.hostile_writes(), started);
                let observed = progress.observe(id, &s, m.status().last_executed, &own_requests, stall_after);
                m.update_status(|st| {
                    st.view = s.core.view;
                    st.primary = s.core.primary;
                    st.stable_checkpoint = s.core.stable_checkpoint;
                    st.peers_connected = connected;
                    st.peer_faults = faults;
                    st.silent_peers = silent;
                    (st.progress_stalled, st.own_requests_waiting_s, st.executor_behind_s) = observed;
                });
            }
            tokio::select! {
                r = status.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    });

    info!(replica = id, client = %me.client, peer = %me.peer, named_port = config.named.port, protocol = ?config.cluster.protocol, "replica running");
    let mut status = handle.status.clone();
    tasks.watch("ordering driver", WATCH_EVERY, move || handle.has_stopped());
    let crash_after = match byzantine {
        Some(Mode::CrashAfter(batches)) => Some(batches),
        _ => None,
    };
    let crash = async move {
        let Some(batches) = crash_after else { return std::future::pending().await };
        while status.borrow_and_update().batches_delivered < batches {
            if status.changed().await.is_err() {
                break;
            }
        }
        batches
    };
    let outcome = tokio::select! {
        _ = wait_for_shutdown() => Ok(()),
        ended = tasks.ended() => {
            tracing::error!(replica = id, task = ended.task, why = %ended.why, "an essential task ended: stopping the replica (its service manager starts it again)");
            Err(anyhow::Error::new(ended))
        }
        batches = crash => {
            tracing::error!(replica = id, batches, "BYZANTINE MODE crash-after-{batches}: stopping now");
            Err(anyhow!("crashed on purpose after {batches} batches (Byzantine mode crash-after-{batches})"))
        }
    };
    info!(replica = id, "shutting down");
    // Every task stops (the ordering driver with them), then named.
    drop(tasks);
    drop(supervisor);
    outcome
}

/// Runs `oversized-writes` or `update-flooder`: orders [`crate::byzantine::hostile_write`]s as this replica's
/// own requests, straight to the ordering (no pending client, so no bound but the ordering's
/// own), as fast as it takes them. Returns when the ordering has gone.
async fn order_hostile_writes(gateway: Arc<Gateway>, mode: Mode, key: Option<tsig::Key>) {
    let mut k = 0u64;
    loop {
        let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let Some(message) = crate::byzantine::hostile_write(mode, k, key.as_ref(), now_s) else { return };
        let payload = exec::envelope::Op::Dns { tcp: true, message }.encode();
        let (client, number) = gateway.next_key();
        let request = bft::Request { origin: gateway.id, client, number, payload };
        if gateway.submit.send(request).await.is_err() {
            return;
        }
        k += 1;
        // Let the rest of this replica run between bursts (the submit queue bounds the rest).
        if k.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
    }
}

/// Turns the ordering driver's and the signer's per-peer counts into the status's
/// `peer_faults` and `silent_peers`, and logs each peer's misbehaviour as it first shows and
/// then at every doubling (a flood of faults is not a flood of log lines).
#[derive(Default)]
struct Attribution {
    logged: std::collections::BTreeMap<(u16, String), u64>,
    silent: std::collections::BTreeSet<u16>,
}

impl Attribution {
    #[allow(clippy::too_many_arguments)]
    fn update(
        &mut self,
        me: u16,
        n: u16,
        s: &bft::transport::DriverStatus,
        bad_shares: &std::collections::BTreeMap<u16, u64>,
        over_rate: &std::collections::BTreeMap<u16, u64>,
        hostile_writes: &std::collections::BTreeMap<(u16, &'static str), u64>,
        started: tokio::time::Instant,
    ) -> (Vec<metrics::PeerFault>, Vec<u16>) {
        let mut faults = std::collections::BTreeMap::<(u16, String), u64>::new();
        for ((peer, reason), count) in &s.core.faults {
            *faults.entry((*peer, metrics::fault_kind(reason))).or_default() += count;
        }
        for (peer, count) in &s.decode_errors_by_peer {
            *faults.entry((*peer, "undecodable_message".into())).or_default() += count;
        }
        for (peer, count) in bad_shares {
            *faults.entry((*peer, "bad_signature_share".into())).or_default() += count;
        }
        for (peer, count) in over_rate {
            *faults.entry((*peer, "state_transfer_requests_over_rate".into())).or_default() += count;
        }
        // Writes the peer ordered that its gateway's check would have answered (not blamed in
        // the ordering's sense: refused alike everywhere, they cost only their share of the
        // origin's budget; docs/RELIABILITY.md).
        for ((peer, kind), count) in hostile_writes.iter().filter(|((peer, _), _)| *peer != me) {
            *faults.entry((*peer, (*kind).to_string())).or_default() += count;
        }
        for ((peer, kind), &count) in &faults {
            let logged = self.logged.entry((*peer, kind.clone())).or_default();
            if count > *logged && (*logged == 0 || count >= 2 * *logged) {
                tracing::warn!(replica = me, peer, kind = %kind, count, "peer misbehaviour");
                *logged = count;
            }
        }
        let now = tokio::time::Instant::now();
        let silent: Vec<u16> =
            (0..n).filter(|&p| p != me).filter(|p| now.duration_since(s.last_heard.get(p).copied().unwrap_or(started)) >= metrics::SILENT_AFTER).collect();
        for p in &silent {
            if self.silent.insert(*p) {
                tracing::warn!(replica = me, peer = p, "peer silent: no ordering message for {:?}", metrics::SILENT_AFTER);
            }
        }
        self.silent.retain(|p| silent.contains(p));
        let faults = faults.into_iter().map(|((peer, kind), count)| metrics::PeerFault { peer, kind, count }).collect();
        (faults, silent)
    }
}

/// The health check's memory between status rounds (`crate::health`), and whether it last
/// found this replica stalled (logged when that changes).
#[derive(Default)]
struct Progress {
    lag: crate::health::ExecutorLag,
    stalled: bool,
}

impl Progress {
    /// Why this replica is stalled (if it is), how long its own requests have gone
    /// undelivered and how long its executor has not moved behind the log (s).
    fn observe(&mut self, me: u16, s: &bft::transport::DriverStatus, executed: u64, pending: &Pending, bound: Duration) -> (Option<String>, u64, u64) {
        let delivered = s.core.last_delivered;
        let observed = crate::health::Observed {
            own_waiting: pending.undelivered_for(bound),
            refused: s.submit_rejected,
            executor_behind: self.lag.observe(executed, delivered, std::time::Instant::now()),
            executed,
            delivered,
        };
        let why = crate::health::stalled(&observed, bound);
        match (&why, self.stalled) {
            (Some(why), false) => tracing::warn!(replica = me, "stalled: {why}"),
            (None, true) => info!(replica = me, "making progress again"),
            _ => {}
        }
        self.stalled = why.is_some();
        let secs = |d: Option<Duration>| d.map_or(0, |d| d.as_secs());
        (why, secs(observed.own_waiting), secs(observed.executor_behind))
    }
}

/// A batch stalled this long (s) gives way to the certified state past it (see [`repair`]).
const STUCK_BATCH_TRANSFER_S: u64 = 20;

/// Keeps this replica in agreement with the certified checkpoints: passes the ordering's
/// state-transfer requests to the fetcher; compares the replica's own digest at each stable
/// checkpoint with the certified one and, when they differ, stops execution
/// (`diverged_tx`) and has the next certified checkpoint after the executed position fetched
/// and installed; reports installs to the ordering when it still needs them; and shows all of
/// it in the status (`sdns cluster status`, metrics).
#[allow(clippy::too_many_arguments)]
async fn repair(
    id: u16,
    mut status: watch::Receiver<bft::transport::DriverStatus>,
    mut ordering_needs: watch::Receiver<Option<bft::CheckpointClaim>>,
    needed: watch::Sender<Option<bft::CheckpointClaim>>,
    mut installed: mpsc::Receiver<bft::Transferred>,
    ordering_installed: mpsc::Sender<bft::Transferred>,
    diverged_tx: watch::Sender<u64>,
    own_digests: crate::executor::OwnDigests,
    stats: Arc<std::sync::Mutex<crate::statexfer::TransferStats>>,
    metrics: Arc<Metrics>,
) {
    loop {
        tokio::select! {
            r = ordering_needs.changed() => {
                if r.is_err() {
                    return;
                }
                let claim = *ordering_needs.borrow_and_update();
                if claim.is_some() {
                    needed.send_replace(claim);
                }
            }
            Some(transferred) = installed.recv() => {
                // The ordering resumes after it only if it has not delivered that far itself
                // (after a divergence it has: the executor skips what it delivered up to there).
                if status.borrow().core.last_delivered < transferred.claim.seq {
                    let _ = ordering_installed.send(transferred).await;
                }
            }
            r = status.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let stable = status.borrow_and_update().core.stable_claim;
        let (last_installed, fetching, transfers) = stats.lock().map(|s| (s.last_installed.unwrap_or(0), s.fetching, s.installed)).unwrap_or_default();
        let executed = metrics.status().last_executed;
        let diverged_at = *diverged_tx.borrow();
        let differs = own_digests.lock().map(|own| crate::statexfer::diverged(&stable, &own)).unwrap_or(false);
        if differs && stable.seq > diverged_at && stable.seq > last_installed {
            tracing::error!(
                replica = id,
                checkpoint = stable.seq,
                "this replica's state differs from the checkpoint 2t+1 replicas certified; execution stops until the certified state is installed"
            );
            diverged_tx.send_replace(stable.seq);
            metrics.update_status(|s| {
                s.diverged =
                    Some(format!("state at checkpoint {} differs from the certified one (zone or write outcomes); repairing by state transfer", stable.seq))
            });
        }
        let diverged_at = *diverged_tx.borrow();
        let repairing = diverged_at > last_installed;
        if repairing && stable.seq > executed && needed.borrow().is_none_or(|c| c.seq < stable.seq) {
            needed.send_replace(Some(stable));
        }
        // A batch that does not finish, where 2t+1 replicas certified a checkpoint at or past
        // it: the certified state replaces what it would do. It happens to a replica restored
        // from an old copy of its directory: it executes again a write whose signatures its
        // peers made long ago and no longer hold, and its named waits for them forever.
        // Which way a replica reaches the certified state is its own affair; the state is the
        // same (the transfer checks it against the certified digest).
        if let Some((batch, secs)) = metrics.status().stalled {
            if secs >= STUCK_BATCH_TRANSFER_S && stable.seq >= batch && stable.seq > last_installed && needed.borrow().is_none_or(|c| c.seq < stable.seq) {
                tracing::warn!(
                    replica = id,
                    batch,
                    secs,
                    checkpoint = stable.seq,
                    "a batch has not finished while 2t+1 replicas certified a checkpoint past it; fetching that checkpoint's state"
                );
                needed.send_replace(Some(stable));
            }
        }
        metrics.update_status(|s| {
            if !repairing && s.diverged.take().is_some() {
                info!(replica = id, checkpoint = last_installed, "diverged state repaired by state transfer");
            }
            s.state_transfer = fetching;
            s.state_transfers = transfers;
        });
    }
}

/// Submits an ordered re-sign of zone `zone` every slice interval of this replica's clock,
/// once the zone was signed. Every replica does; the executor runs a slice only when the
/// batch's agreed time says the zone's next one is due, so extra submissions are no-ops.
async fn resign_timer(gateway: Arc<Gateway>, zone: u16, last_signed: Arc<AtomicU64>, slice_interval_s: u64) {
    let check = Duration::from_secs(slice_interval_s.max(1));
    loop {
        tokio::time::sleep(check).await;
        let last = last_signed.load(std::sync::atomic::Ordering::Relaxed);
        if last != 0 {
            let (reply, mut rx) = crate::reply::ReplyTo::internal();
            gateway.order(exec::envelope::Op::resign(zone), reply).await;
            // Wait for it to be ordered and executed (or expire) before checking again.
            let _ = tokio::time::timeout(Duration::from_secs(600), rx.recv()).await;
        }
    }
}

/// How often a replica says again that a write is still stuck (a claim lost with a primary
/// that failed is thereby replaced).
const STUCK_CLAIM_EVERY: Duration = Duration::from_secs(5);

/// While the executor reports a write its named has not answered for its local bound
/// (`Executor::stuck`), orders `Op::Stuck` for it, again every `STUCK_CLAIM_EVERY`. Claims
/// of t+1 replicas committed after the write make every replica that has not executed it
/// abandon it (`exec::core`); this task only says when this replica is stuck.
async fn stuck_claimer(gateway: Arc<Gateway>, mut stuck: watch::Receiver<Option<(u64, u32)>>) {
    loop {
        let current = *stuck.borrow_and_update();
        match current {
            Some((seq, index)) => {
                tracing::warn!(replica = gateway.id, seq, index, "named has not answered an ordered write for long; ordering a claim that it is stuck");
                let (reply, _answer) = crate::reply::ReplyTo::internal();
                gateway.order(exec::envelope::Op::Stuck { seq, index }, reply).await;
                tokio::select! {
                    r = stuck.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(STUCK_CLAIM_EVERY) => {}
                }
            }
            None => {
                if stuck.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Once this replica's part of a background whole-zone signing is done, says so through
/// the ordering (`Op::SignZoneFinish`) until the signing is finished: t+1 such requests
/// install the signed zone everywhere. Said again every second while others are not done
/// (a request lost with a primary that failed is thereby replaced). Each claim is signed
/// with this replica's identity key over the run's seq (`exec::authority`): a primary
/// cannot make one up.
async fn finish_voter(gateway: Arc<Gateway>, zone: u16, signer: Arc<SignZoneSigner>, mut finished: watch::Receiver<Option<(u64, Result<(), String>)>>) {
    loop {
        if finished.changed().await.is_err() {
            return;
        }
        let Some(run) = finished.borrow_and_update().as_ref().map(|(seq, _)| *seq) else { continue };
        let auth = match signer.sign_finish(run) {
            Ok(auth) => auth,
            Err(e) => {
                tracing::error!(zone, run, error = %e, "cannot sign this replica's finish claim");
                continue;
            }
        };
        loop {
            let (reply, mut rx) = crate::reply::ReplyTo::internal();
            gateway.order(exec::envelope::Op::sign_zone_finish(zone, auth.clone()), reply).await;
            let answer = tokio::time::timeout(Duration::from_secs(600), rx.recv()).await;
            let text = match answer {
                Ok(Some(a)) => String::from_utf8_lossy(&a.bytes).into_owned(),
                _ => String::new(),
            };
            if !text.starts_with("counted") && !text.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            if finished.borrow().as_ref().map(|(seq, _)| *seq) != Some(run) {
                break;
            }
        }
    }
}

async fn wait_for_shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
