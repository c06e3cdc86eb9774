//! The replica's status (for `/status`, metrics and `sdns cluster status`), and how it
//! ends: on a signal, when an essential task ends, or (Byzantine test mode) on purpose.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use bft::transport::driver::ReplicaHandle;
use mesh::Mesh;
use tokio::sync::watch;
use tracing::info;

use super::signing::WATCH_EVERY;
use crate::execution::pending::Pending;
use crate::faults::byzantine::Mode;
use crate::ops::metrics::{self, Metrics};
use crate::ops::tasks::Essential;
use crate::statexfer::TransferStats;

/// What the status loop watches.
pub(super) struct StatusSources {
    pub id: u16,
    pub replicas: u16,
    pub status: watch::Receiver<bft::transport::DriverStatus>,
    pub mesh: Mesh,
    /// State transfer's counts (peers' requests over the rate).
    pub transfers: Arc<Mutex<TransferStats>>,
    /// This gateway's own requests, for the stall check.
    pub own_requests: Arc<Pending>,
    pub stall_after: Duration,
}

/// Spawns the status loop, and keeps the mesh watched.
pub(super) fn start_status(src: StatusSources, metrics: Arc<Metrics>, tasks: &mut Essential) {
    let mesh = Arc::new(src.mesh);
    let watched = mesh.clone();
    tasks.watch("mesh", WATCH_EVERY, move || watched.has_stopped());
    let StatusSources { id, replicas, mut status, transfers, own_requests, stall_after, .. } = src;
    let started = tokio::time::Instant::now();
    tasks.spawn("status", async move {
        let mut last_view = 0;
        let mut attribution = Attribution::default();
        let mut progress = Progress::default();
        loop {
            {
                let s = status.borrow_and_update().clone();
                if s.core.view > last_view {
                    metrics.inc_view_change();
                    last_view = s.core.view;
                }
                let connected = mesh.peer_status().iter().filter(|p| p.connected).count();
                let over_rate = transfers.lock().map(|t| t.over_rate.clone()).unwrap_or_default();
                let (faults, silent) = attribution.update(id, replicas, &s, &metrics.bad_shares(), &over_rate, &metrics.hostile_writes(), started);
                let observed = progress.observe(id, &s, metrics.status().last_executed, &own_requests, stall_after);
                metrics.update_status(|st| {
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
}

/// Runs until the replica stops: on SIGTERM or Ctrl-C (`Ok`), or when an essential task
/// ends or the Byzantine mode crash-after-N says so (an error: its service manager starts
/// it again). The ordering driver is watched with the other tasks from here on.
pub(super) async fn until_stopped(id: u16, mut tasks: Essential, handle: ReplicaHandle, byzantine: Option<Mode>) -> (anyhow::Result<()>, Essential) {
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
    (outcome, tasks)
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

/// The health check's memory between status rounds (`crate::ops::health`), and whether it last
/// found this replica stalled (logged when that changes).
#[derive(Default)]
struct Progress {
    lag: crate::ops::health::ExecutorLag,
    stalled: bool,
}

impl Progress {
    /// Why this replica is stalled (if it is), how long its own requests have gone
    /// undelivered and how long its executor has not moved behind the log (s).
    fn observe(&mut self, me: u16, s: &bft::transport::DriverStatus, executed: u64, pending: &Pending, bound: Duration) -> (Option<String>, u64, u64) {
        let delivered = s.core.last_delivered;
        let observed = crate::ops::health::Observed {
            own_waiting: pending.undelivered_for(bound),
            refused: s.submit_rejected,
            executor_behind: self.lag.observe(executed, delivered, std::time::Instant::now()),
            executed,
            delivered,
        };
        let why = crate::ops::health::stalled(&observed, bound);
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
