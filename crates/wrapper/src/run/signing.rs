//! Threshold signing: one signing core per zone driven over the mesh, and the sockets named
//! asks it on (one for writes and re-signing, one per zone for background signings).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use mesh::MeshSender;
use named_glue::keys::ZoneKey;
use named_glue::signer::{watch_time_source, ServiceLimits, SignatureTimes, SigningService};
use tokio::sync::{mpsc, watch};

use crate::config::{SigningConfig, ZoneSettings};
use crate::execution::executor::Background;
use crate::ops::metrics::Metrics;
use crate::ops::tasks::Essential;
use crate::signing::{service, SignerCore, ZoneCore, ZoneKeys};

/// How often the parts that own their tasks (mesh, named's supervisor, signing sockets, the
/// ordering driver) are asked whether those still run.
pub(super) const WATCH_EVERY: Duration = Duration::from_secs(1);

/// What the executor and named need of the signing side.
pub(super) struct SigningParts {
    /// The signature times of the write being executed (the write socket signs with them).
    pub times: watch::Sender<Option<SignatureTimes>>,
    /// Signatures made for writes: a write that still gets them is not stuck
    /// (`Executor::signatures`).
    pub write_signatures: Arc<AtomicU64>,
    /// Each zone's background signing, in zone index order.
    pub backgrounds: Vec<Arc<Background>>,
}

/// Starts the signing service (its task and sockets are kept in `tasks`). No timeout
/// anywhere on this path: a signature takes as long as the replicas take.
pub(super) fn start_signing(
    cfg: &SigningConfig,
    zones: &[ZoneSettings],
    zone_keys: &[(ZoneKeys, ZoneKey)],
    mesh: MeshSender,
    incoming: mpsc::Receiver<(u16, Bytes)>,
    metrics: &Arc<Metrics>,
    tasks: &mut Essential,
) -> Result<SigningParts> {
    // One core per zone (its own key and session limits), in zone index order.
    let cores = zones
        .iter()
        .zip(zone_keys)
        .map(|(z, (keys, key))| {
            let signing_key = service::ZoneSigningKey { signer: z.apex.clone(), algorithm: z.algorithm, key_tag: key.key_tag() };
            Ok((signing_key, zone_core(cfg, keys).with_context(|| format!("signing core of zone {}", z.name))?))
        })
        .collect::<Result<Vec<_>>>()?;
    let (signer, signing_task) = service::spawn(cores, mesh, incoming, metrics.clone(), cfg.fault);
    tasks.spawn("threshold signing service", signing_task);
    let (times, times_rx) = watch::channel(None);
    let write_signatures = Arc::new(AtomicU64::new(0));
    let progressing = Arc::new(service::Progressing { inner: signer.clone(), done: write_signatures.clone() });
    let signing_service =
        SigningService::bind(&cfg.socket, progressing, watch_time_source(times_rx), ServiceLimits::default()).context("binding the signing socket")?;
    tasks.watch("signing socket", WATCH_EVERY, move || signing_service.has_stopped());
    // Background whole-zone signings have a socket of their own: its times are the running
    // signing's while writes execute with theirs, and what it signs is counted for progress.
    // One per zone, since two zones' signings may run at once with different times.
    let counting = Arc::new(service::Counting { inner: signer, metrics: metrics.clone() });
    let mut backgrounds = Vec::new();
    for socket in &cfg.background_sockets {
        let (background, background_times) = Background::new();
        let background_service = SigningService::bind(socket, counting.clone(), watch_time_source(background_times), ServiceLimits::default())
            .context("binding the background signing socket")?;
        tasks.watch("background signing socket", WATCH_EVERY, move || background_service.has_stopped());
        backgrounds.push(background);
    }
    Ok(SigningParts { times, write_signatures, backgrounds })
}

/// The zone's signing core for its kind of key, with the configured session limits.
fn zone_core(cfg: &SigningConfig, keys: &ZoneKeys) -> Result<ZoneCore> {
    Ok(match keys {
        ZoneKeys::Rsa(keys) => ZoneCore::Rsa(SignerCore::new(cfg.id, cfg.replicas, cfg.protocol, cfg.corrupt_shares, keys.clone(), cfg.limits.clone())),
        ZoneKeys::Ec { public, share } => {
            // The same bounds as RSA's sessions (EcLimits' further fields keep their defaults).
            let mut limits = threshold_ec::EcLimits::default();
            limits.max_sessions = cfg.limits.max_sessions;
            limits.early_digests = cfg.limits.early_digests;
            limits.early_per_peer = cfg.limits.early_per_peer;
            limits.finals_cache = cfg.limits.finals_cache;
            limits.retry_after_us = cfg.limits.retry_after_us;
            // `corrupt_shares`: the core sends its own shares corrupted, as RSA's does.
            ZoneCore::Ec(threshold_ec::EcSignerCore::new(cfg.id, public.clone(), share.clone(), limits)?.with_corrupt(cfg.corrupt_shares))
        }
    })
}

/// The number of dnssec-signzone threads a whole-zone signing uses: the configured one, or
/// as many as the signing pool computes at once.
pub(super) fn zone_signer_threads(configured: Option<usize>) -> usize {
    configured.unwrap_or_else(|| service::default_workers().min(named_glue::signzone::MAX_THREADS))
}
