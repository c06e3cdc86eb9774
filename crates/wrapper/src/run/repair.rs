//! State transfer and checkpoint repair: snapshots served to and fetched from peers, and
//! the task that keeps this replica in agreement with the certified checkpoints.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use bft::transport::driver::ReplicaHandle;
use bytes::Bytes;
use mesh::Mesh;
use tokio::sync::{mpsc, watch};
use tracing::info;

use crate::config::TransferConfig;
use crate::execution::executor::{OwnDigests, TransferLinks};
use crate::faults::byzantine::Mode;
use crate::ops::metrics::Metrics;
use crate::ops::tasks::Essential;
use crate::statexfer::{SnapshotStore, StateTransfer, TransferStats};

/// What the repair task takes from state transfer (see [`start_repair`]).
pub(super) struct RepairLinks {
    needed: watch::Sender<Option<bft::CheckpointClaim>>,
    installed: mpsc::Receiver<bft::Transferred>,
    diverged: watch::Sender<u64>,
    stats: Arc<Mutex<TransferStats>>,
}

impl RepairLinks {
    /// State transfer's counts (the status shows peers' requests over the rate).
    pub fn stats(&self) -> Arc<Mutex<TransferStats>> {
        self.stats.clone()
    }
}

/// Starts state transfer: snapshots kept at every checkpoint, served to and fetched from
/// peers. What to fetch comes from the repair task: the ordering's request (it fell behind
/// the log its peers retain), or the next certified checkpoint after this replica's state
/// was found to differ.
pub(super) fn start_state_transfer(
    cfg: &TransferConfig,
    mesh: &Mesh,
    incoming: mpsc::Receiver<(u16, Bytes)>,
    tasks: &mut Essential,
) -> Result<(TransferLinks, RepairLinks)> {
    let snapshots = SnapshotStore::new(cfg.snapshot_dir.clone()).context("the snapshot directory")?;
    let (installs_tx, installs_rx) = mpsc::channel(1);
    let stats: Arc<Mutex<TransferStats>> = Default::default();
    let transfer = StateTransfer {
        id: cfg.id,
        peers: cfg.peers.clone(),
        store: snapshots.clone(),
        outbound: Arc::new(mesh.sender()),
        max_snapshot_bytes: cfg.max_snapshot_bytes,
        stats: stats.clone(),
        zones: cfg.zones.clone(),
    };
    let (needed_tx, needed_rx) = watch::channel(None);
    let (installed_tx, installed_rx) = mpsc::channel(4);
    let (diverged_tx, diverged_rx) = watch::channel(0u64);
    tasks.spawn("state transfer", transfer.run(incoming, needed_rx, installs_tx, installed_tx));
    let links = TransferLinks { snapshots, installs: installs_rx, diverged_at: diverged_rx };
    Ok((links, RepairLinks { needed: needed_tx, installed: installed_rx, diverged: diverged_tx, stats }))
}

/// The Byzantine `snapshot-leech` mode: floods the peers with requests for the latest
/// stable checkpoint's snapshot.
pub(super) fn start_leech(cfg: &TransferConfig, mesh: &Mesh, handle: &ReplicaHandle, byzantine: Option<Mode>, tasks: &mut Essential) {
    if byzantine != Some(Mode::SnapshotLeech) {
        return;
    }
    let status = handle.status.clone();
    let target = move || {
        let claim = status.borrow().core.stable_claim;
        (claim.seq, claim.state_digest)
    };
    tasks.spawn("snapshot leech", crate::statexfer::leech(Arc::new(mesh.sender()), cfg.peers.clone(), target));
}

/// Starts the checkpoint repair task (see [`repair`]).
pub(super) fn start_repair(id: u16, links: RepairLinks, handle: &ReplicaHandle, own_digests: OwnDigests, metrics: Arc<Metrics>, tasks: &mut Essential) {
    let r = Repair {
        id,
        status: handle.status.clone(),
        ordering_needs: handle.state_transfer.clone(),
        needed: links.needed,
        installed: links.installed,
        ordering_installed: handle.installed.clone(),
        diverged_tx: links.diverged,
        own_digests,
        stats: links.stats,
        metrics,
    };
    tasks.spawn("checkpoint repair", repair(r));
}

/// The repair task's inputs and outputs.
struct Repair {
    id: u16,
    status: watch::Receiver<bft::transport::DriverStatus>,
    /// The ordering's state-transfer requests.
    ordering_needs: watch::Receiver<Option<bft::CheckpointClaim>>,
    /// What the fetcher fetches.
    needed: watch::Sender<Option<bft::CheckpointClaim>>,
    /// States the fetcher installed.
    installed: mpsc::Receiver<bft::Transferred>,
    /// Installs reported to the ordering.
    ordering_installed: mpsc::Sender<bft::Transferred>,
    /// Where execution stopped on a divergence (0: never).
    diverged_tx: watch::Sender<u64>,
    own_digests: OwnDigests,
    stats: Arc<Mutex<TransferStats>>,
    metrics: Arc<Metrics>,
}

/// A batch stalled this long (s) gives way to the certified state past it (see [`repair`]).
const STUCK_BATCH_TRANSFER_S: u64 = 20;

/// Keeps this replica in agreement with the certified checkpoints: passes the ordering's
/// state-transfer requests to the fetcher; compares the replica's own digest at each stable
/// checkpoint with the certified one and, when they differ, stops execution
/// (`diverged_tx`) and has the next certified checkpoint after the executed position fetched
/// and installed; reports installs to the ordering when it still needs them; and shows all of
/// it in the status (`sdns cluster status`, metrics).
async fn repair(r: Repair) {
    let Repair { id, mut status, mut ordering_needs, needed, mut installed, ordering_installed, diverged_tx, own_digests, stats, metrics } = r;
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
