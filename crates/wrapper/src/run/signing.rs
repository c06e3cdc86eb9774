//! Threshold signing: one signing core per zone driven over the mesh, and the sockets named
//! asks it on (one for writes and re-signing, one per zone for background signings).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use mesh::MeshSender;
use named_glue::signer::{watch_time_source, ServiceLimits, SignatureTimes, SigningService};
use tokio::sync::{mpsc, watch};

use super::keys::ServedZone;
use crate::config::SigningConfig;
use crate::execution::executor::Background;
use crate::ops::metrics::Metrics;
use crate::ops::tasks::Essential;
use crate::signing::service::ThresholdSigner;
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
    /// The threshold signer: zones are added to and removed from it with the zone set.
    pub signer: Arc<ThresholdSigner>,
    /// What background signings sign with (counting their progress).
    pub counting: Arc<service::Counting>,
    /// Each zone's background signing and its socket, by zone index.
    pub backgrounds: Backgrounds,
}

/// Each served zone's background signing with the socket it signs through, by zone index.
pub(super) type Backgrounds = Arc<Mutex<BTreeMap<u16, BackgroundSocket>>>;

/// One zone's background signing and its socket (closed when dropped).
pub(super) struct BackgroundSocket {
    pub background: Arc<Background>,
    service: SigningService,
}

/// Binds zone `index`'s background signing socket: its times are the running signing's
/// while writes execute with theirs, and what it signs is counted for progress. One per
/// zone, since two zones' signings may run at once with different times.
pub(super) fn bind_background(cfg: &SigningConfig, counting: &Arc<service::Counting>, index: u16) -> Result<BackgroundSocket> {
    let (background, times) = Background::new();
    let socket = cfg.background_socket(index);
    let service = SigningService::bind(&socket, counting.clone(), watch_time_source(times), ServiceLimits::default())
        .with_context(|| format!("binding the background signing socket {}", socket.display()))?;
    Ok(BackgroundSocket { background, service })
}

/// The signing-service key of a served zone: (apex, algorithm, key tag).
pub(super) fn signing_key(zone: &ServedZone) -> service::ZoneSigningKey {
    service::ZoneSigningKey { signer: zone.settings.apex.clone(), algorithm: zone.settings.algorithm, key_tag: zone.key.key_tag() }
}

/// Starts the signing service (its task and sockets are kept in `tasks`). No timeout
/// anywhere on this path: a signature takes as long as the replicas take.
pub(super) fn start_signing(
    cfg: &SigningConfig,
    zones: &[ServedZone],
    mesh: MeshSender,
    incoming: mpsc::Receiver<(u16, Bytes)>,
    metrics: &Arc<Metrics>,
    tasks: &mut Essential,
) -> Result<SigningParts> {
    // One core per zone (its own key and session limits), by zone index; none for a zone
    // this replica holds no share of.
    let cores = zones
        .iter()
        .map(|z| {
            let core = z.keys.as_ref().map(|keys| zone_core(cfg, keys).with_context(|| format!("signing core of zone {}", z.settings.name))).transpose()?;
            Ok((z.index, signing_key(z), core))
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
    let counting = Arc::new(service::Counting { inner: signer.clone(), metrics: metrics.clone() });
    let mut sockets = BTreeMap::new();
    for z in zones {
        sockets.insert(z.index, bind_background(cfg, &counting, z.index)?);
    }
    let backgrounds: Backgrounds = Arc::new(Mutex::new(sockets));
    let watched = backgrounds.clone();
    tasks.watch("background signing socket", WATCH_EVERY, move || watched.lock().unwrap_or_else(|e| e.into_inner()).values().any(|b| b.service.has_stopped()));
    Ok(SigningParts { times, write_signatures, signer, counting, backgrounds })
}

/// The zone's signing core for its kind of key, with the configured session limits.
pub(super) fn zone_core(cfg: &SigningConfig, keys: &ZoneKeys) -> Result<ZoneCore> {
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
