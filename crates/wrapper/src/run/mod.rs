//! `sdns run`: one replica, its parts started in order.
//!
//! [`run`] reads as the order of start-up; each step is a module that takes its own part of
//! the [`Settings`]:
//! 1. `keys`: each zone's threshold key share (and the TSIG and SIG(0) keys, for `named`);
//! 2. `named`: named's directory and configuration, rewritten at every start;
//! 3. `mesh`: the TLS mesh to the other replicas;
//! 4. `signing`: threshold signing and the sockets named asks it on;
//! 5. `named` again: named itself, supervised;
//! 6. `ordering`: the ordering, resumed where it left off;
//! 7. `repair`: state transfer, and the repair of a diverged state;
//! 8. the executor (`crate::execution::executor`) with each zone's maintenance (`zones`);
//! 9. `front`: vouched reads, the gateway, and (`requests`) what the replica orders itself;
//!    then the client listeners and the metrics endpoint;
//! 10. `status`: the status loop, and the wait for the end.

mod front;
mod keys;
mod mesh;
mod named;
mod ordering;
mod repair;
mod requests;
mod signing;
mod status;
mod zones;

use std::sync::Arc;

use anyhow::Result;
use tracing::info;

use crate::config::{GatewayConfig, Settings, SigningConfig, TransferConfig};
use crate::execution::executor::{exec_config, Executor, ExecutorConfig, ExecutorLinks};
use crate::execution::pending::Pending;
use crate::faults::byzantine::Mode;
use crate::ops::metrics::Metrics;
use crate::ops::tasks::Essential;
use crate::reads::read::ReadCache;
use exec::{ExecCore, UpdateGate};

/// Runs one replica until it is stopped or one of its essential tasks ends.
pub async fn run(settings: Settings) -> Result<()> {
    let s = &settings;
    let id = s.id;
    let metrics = Metrics::new(id);
    announce_fault_injection(s);
    // About two descriptors per zone: 1,000 zones need more than a shell's usual 1024.
    match named_glue::limits::raise_open_files() {
        Ok((before, now)) if before < now => info!(replica = id, before, now, "soft limit on open files raised to the hard limit"),
        Ok(_) => {}
        Err(e) => tracing::warn!(replica = id, error = %e, "cannot raise the soft limit on open files"),
    }
    // Every task the replica cannot run without is kept here: the first to end stops it.
    let mut tasks = Essential::new();

    // The zones served are the execution state's zone set (the configuration's until it
    // changed at run time): named.conf, the catalog and the signing cores are built from it.
    let exec_state = ordering::load_exec_state(&s.state_dir)?;
    let zone_set = keys::zone_set_at_start(s, &exec_state);
    let served = keys::served_zones(s, &zone_set)?;
    let catalog_serial = named::catalog_serial(s, &exec_state.zone_set, !exec_state.zone_set.is_empty());
    let named_setup = named::prepare(s, &served, catalog_serial)?;
    let mesh::MeshParts { mesh, ordering: ordering_rx, signing: signing_rx, state: state_rx, sign_zone_verifiers, sign_zone_signers } =
        mesh::start_mesh(s).await?;
    let signing_cfg = SigningConfig::from(s);
    let signing = signing::start_signing(&signing_cfg, &served, mesh.sender(), signing_rx, &metrics, &mut tasks)?;
    let named = named::start_named(&named_setup, s.named.port.get(), signing_cfg.socket.clone()).await?;
    metrics.update_status(|st| st.named_running = true);
    let supervisor = named.supervisor.clone();
    tasks.watch("named supervisor", signing::WATCH_EVERY, move || supervisor.has_stopped());

    let (mut handle, batches) = ordering::start_ordering(s, exec_state.executed, mesh.sender(), ordering_rx)?;
    let transfer_cfg = TransferConfig::from(s);
    let (transfer, repair_links) = repair::start_state_transfer(&transfer_cfg, &mesh, state_rx, &mut tasks)?;
    repair::start_leech(&transfer_cfg, &mesh, &handle, s.test.byzantine, &mut tasks);

    let reads = front::Reads { named: named.reads.clone(), cache: Arc::new(ReadCache::default()), metrics: metrics.clone() };
    let pending = Arc::new(Pending::new(s.client.max_pending.get()));
    let core = ExecCore::new(exec_config(s, sign_zone_verifiers), named_setup.auth.clone() as Arc<dyn UpdateGate>, exec_state);
    // Configured zones served, with their index, for the parent DS watches.
    let watched: Vec<(u16, usize, named_glue::keys::ZoneKey)> =
        served.iter().filter_map(|z| s.zones.iter().position(|c| c.apex == z.settings.apex).map(|i| (z.index, i, z.key.clone()))).collect();
    let host_parts = zones::HostParts {
        setup: named_setup.clone(),
        named: named.clone(),
        signing_cfg: signing_cfg.clone(),
        signing: &signing,
        metrics: metrics.clone(),
        signers: &sign_zone_signers,
    };
    let (host, zone_parts) = zones::Host::start(s, host_parts, served)?;
    let links = ExecutorLinks {
        named: named.reads.clone(),
        writes: named.writes.clone(),
        pending: pending.clone(),
        cache: reads.cache.clone(),
        metrics: metrics.clone(),
        times: signing.times,
        signatures: signing.write_signatures,
        checkpoints: handle.checkpoint.clone(),
        zones: zone_parts,
        host: Some(host.clone() as Arc<dyn crate::execution::zoneset::ZoneHost>),
        transfer: Some(transfer),
    };
    let executor = Executor::new(ExecutorConfig::from(s), core, links);
    let transfer_stats = repair_links.stats();
    repair::start_repair(id, repair_links, &handle, executor.own_digests(), metrics.clone(), &mut tasks);
    let (executed, stuck) = (executor.executed_rx(), executor.stuck_rx());
    tasks.spawn("executor", executor.run(batches));

    let (vouched, fallback) = front::start_vouched(s, &reads, &mesh, handle.read_barrier.clone(), executed, &mut tasks)?;
    let gateway_cfg = GatewayConfig::from(s);
    let (gateway, to_gateway) = front::start_gateway(&gateway_cfg, &reads, pending, &mut handle, fallback, &mut tasks);
    // Each zone's re-sign timer and finish voter order through it from now on.
    host.set_gateway(gateway.clone());
    metrics.set_slice_pace(s.signing.resign_slice_rrsets.get(), s.signing.resign_slice_interval_s.get());
    let hostile = s.test.byzantine.filter(|m| matches!(m, Mode::OversizedWrites | Mode::UpdateFlooder)).map(|m| (m, keys::hostile_write_key(s)));
    let own = requests::OwnRequests { gateway: &gateway, stuck, hostile };
    requests::start_own_requests(own, &mut tasks)?;
    if !s.rollover.parent_resolvers.is_empty() {
        // Zones added at run time have no watch (docs/MULTIZONE.md, "Not built").
        for (zone, position, key) in watched {
            let (Some(z), Some(signer)) = (s.zones.get(position), sign_zone_signers.get(position)) else { continue };
            let watch = crate::rollover::ParentWatch {
                zone,
                apex: z.apex.clone(),
                key,
                settings: s.rollover.clone(),
                named: named.reads.clone(),
                gateway: gateway.clone(),
                signer: signer.clone(),
            };
            tasks.spawn("parent DS watch", crate::rollover::watch_parent(watch));
        }
    }
    let filters = front::client_filters(s, &named_setup.auth, &reads, vouched);
    front::start_listeners(&gateway_cfg, s.access.clone(), filters, to_gateway, &metrics, &mut tasks).await?;
    let zone_names = s.zones.iter().map(|z| z.name.clone()).collect();
    front::start_endpoint(front::EndpointConfig::from_settings(s), zone_names, sign_zone_signers, &gateway, &metrics, &mut tasks)?;

    let sources = status::StatusSources {
        id,
        replicas: s.replicas,
        status: handle.status.clone(),
        mesh,
        transfers: transfer_stats,
        own_requests: gateway.pending.clone(),
        stall_after: s.metrics.stall_after,
    };
    status::start_status(sources, metrics.clone(), &mut tasks);
    info!(replica = id, client = %s.me.client, peer = %s.me.peer, named_port = s.named.port.get(), protocol = ?s.protocol, "replica running");
    let (outcome, tasks) = status::until_stopped(id, tasks, handle, s.test.byzantine).await;
    info!(replica = id, "shutting down");
    // Every task stops (the ordering driver with them), then named.
    drop(tasks);
    drop(named);
    outcome
}

/// Says loudly that this replica misbehaves on purpose (only a test cluster allows it).
fn announce_fault_injection(s: &Settings) {
    let id = s.id;
    if let Some(mode) = s.test.byzantine {
        tracing::warn!(replica = id, %mode, "BYZANTINE MODE: this replica misbehaves on purpose (test cluster)");
    }
    if let Some(bug) = crate::faults::seeded_bug::active(id) {
        tracing::warn!(replica = id, ?bug, "SEEDED BUG (SDNS_SEEDED_BUG): this replica is wrong on purpose, to test the history checker");
    }
    if let Some(name) = &s.test.fail_writes_naming {
        tracing::warn!(replica = id, %name, "FAULT INJECTION: ordered writes naming this owner are never sent to named (test cluster)");
    }
}
