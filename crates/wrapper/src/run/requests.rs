//! The requests a replica orders on its own: re-sign slices when due, claims that a write
//! is stuck, its part of a whole-zone signing done, and (Byzantine test modes) hostile writes.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::sync::watch;

use crate::execution::executor::Background;
use crate::faults::byzantine::Mode;
use crate::front::gateway::Gateway;
use crate::ops::tasks::Essential;
use exec::auth::tsig;
use exec::SignZoneSigner;

/// What the replica's own requests are made from.
pub(super) struct OwnRequests<'a> {
    pub gateway: &'a Arc<Gateway>,
    /// The executor's stuck claim (`Executor::stuck_rx`).
    pub stuck: watch::Receiver<Option<(u64, u32)>>,
    /// A Byzantine mode that orders hostile writes, with the key they are signed with.
    pub hostile: Option<(Mode, Option<tsig::Key>)>,
}

/// What one zone's own requests are made from.
pub(super) struct ZoneRequests {
    pub zone: u16,
    /// Its last signing time (the executor publishes it).
    pub last_signed: Arc<AtomicU64>,
    /// This replica's sign-zone identity for the zone.
    pub signer: Arc<SignZoneSigner>,
    pub slice_interval_s: u64,
}

/// Spawns zone `r.zone`'s re-sign timer and sign-zone finish voter, which order through the
/// gateway once it is there; `background`'s outcome is subscribed now, before the executor
/// can resume a signing and finish its part. Aborted when the zone is removed.
pub(super) fn spawn_zone_requests(r: ZoneRequests, background: &Background, gateway: watch::Receiver<Option<Arc<Gateway>>>) -> Vec<tokio::task::AbortHandle> {
    let finished = background.finished.subscribe();
    let ZoneRequests { zone, last_signed, signer, slice_interval_s } = r;
    let mut waiting = gateway.clone();
    let timer = tokio::spawn(async move {
        if let Some(gateway) = gateway_when_up(&mut waiting).await {
            resign_timer(gateway, zone, last_signed, slice_interval_s).await;
        }
    });
    let mut waiting = gateway;
    let voter = tokio::spawn(async move {
        if let Some(gateway) = gateway_when_up(&mut waiting).await {
            finish_voter(gateway, zone, signer, finished).await;
        }
    });
    vec![timer.abort_handle(), voter.abort_handle()]
}

/// The gateway, once the replica has started it (`None`: the replica is stopping).
async fn gateway_when_up(gateway: &mut watch::Receiver<Option<Arc<Gateway>>>) -> Option<Arc<Gateway>> {
    gateway.wait_for(Option::is_some).await.ok().and_then(|g| g.clone())
}

/// Spawns the tasks that order this replica's own requests.
pub(super) fn start_own_requests(r: OwnRequests<'_>, tasks: &mut Essential) -> Result<()> {
    let gateway = r.gateway;
    if let Some((mode @ (Mode::OversizedWrites | Mode::UpdateFlooder), key)) = r.hostile {
        tasks.spawn("Byzantine writes", order_hostile_writes(gateway.clone(), mode, key));
    }
    tasks.spawn("stuck-write claimer", stuck_claimer(gateway.clone(), r.stuck));
    Ok(())
}

/// Runs `oversized-writes` or `update-flooder`: orders [`crate::faults::byzantine::hostile_write`]s as this replica's
/// own requests, straight to the ordering (no pending client, so no bound but the ordering's
/// own), as fast as it takes them. Returns when the ordering has gone.
async fn order_hostile_writes(gateway: Arc<Gateway>, mode: Mode, key: Option<tsig::Key>) {
    let mut k = 0u64;
    loop {
        let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let Some(message) = crate::faults::byzantine::hostile_write(mode, k, key.as_ref(), now_s) else { return };
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

/// Submits an ordered re-sign of zone `zone` every slice interval of this replica's clock,
/// once the zone was signed. Every replica does; the executor runs a slice only when the
/// batch's agreed time says the zone's next one is due, so extra submissions are no-ops.
async fn resign_timer(gateway: Arc<Gateway>, zone: u16, last_signed: Arc<AtomicU64>, slice_interval_s: u64) {
    let check = Duration::from_secs(slice_interval_s.max(1));
    loop {
        tokio::time::sleep(check).await;
        let last = last_signed.load(std::sync::atomic::Ordering::Relaxed);
        if last != 0 {
            let (reply, mut rx) = crate::client::reply::ReplyTo::internal();
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
                let (reply, _answer) = crate::client::reply::ReplyTo::internal();
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
            let (reply, mut rx) = crate::client::reply::ReplyTo::internal();
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
