//! The tokio driver: runs one sans-IO [`Replica`] over a network of replicas.
//!
//! One task owns the replica and loops: wait for the next event (a message from a peer, a
//! request submitted locally, a checkpoint digest from the application, or the core's single
//! timer), feed it to the core with the current wall-clock time, then flush the core's actions:
//! `Send`/`Broadcast` are encoded with [`Message::encode`] and go out on the ordering channel,
//! `Deliver` goes to the application's batch receiver, `Persist` is written to the replica's
//! [`Store`] (and made durable) before any later action is carried out. Nothing else lives here.
//!
//! A persist that fails stops the replica: going on would let it send or deliver what its
//! durable state does not show, and contradict itself after a restart.
//!
//! Bytes from a peer that do not decode are logged and counted, never fatal. The claimed sender
//! inside a decoded message is the core's to check against `from`, which the mesh proved.
//!
//! Deliveries use an unbounded channel on purpose: the core delivers at most a watermark window
//! beyond the last checkpoint the application confirmed, so the application bounds the backlog
//! by confirming checkpoints only for batches it has executed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use mesh::{MeshSender, CHANNEL_ORDERING};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::byzantine::Byzantine;
use super::store::Store;
use crate::{Action, Batch, CheckpointClaim, Digest, Limits, Message, Replica, Request, Status, SubmitError, Time, Transferred};

/// At most this many queued inputs are fed to the core before its actions are flushed, so one
/// busy source cannot starve the others and output is flushed in reasonably sized bursts.
const MAX_INPUTS_PER_TURN: usize = 256;
/// How often the published [`DriverStatus`] is refreshed at most.
const STATUS_INTERVAL: Duration = Duration::from_millis(20);

/// Where encoded ordering messages go: the TLS mesh, or an in-memory network for baselines.
pub trait Outbound: Send + Sync + 'static {
    fn send(&self, to: u16, bytes: Bytes);
    fn broadcast(&self, bytes: Bytes);
}

impl Outbound for MeshSender {
    fn send(&self, to: u16, bytes: Bytes) {
        if let Err(e) = MeshSender::send(self, to, CHANNEL_ORDERING, bytes) {
            tracing::warn!(to, error = %e, "ordering message not sent");
        }
    }

    fn broadcast(&self, bytes: Bytes) {
        if let Err(e) = MeshSender::broadcast(self, CHANNEL_ORDERING, bytes) {
            tracing::warn!(error = %e, "ordering broadcast not sent");
        }
    }
}

/// The core's status plus the driver's own counters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DriverStatus {
    pub core: Status,
    /// Messages from peers that did not decode.
    pub decode_errors: u64,
    /// The same, per sending peer (attribution).
    pub decode_errors_by_peer: BTreeMap<u16, u64>,
    /// When each peer's last ordering message arrived (absent: none since the start). Honest
    /// peers send a status report every retransmit interval, so a long silence names a
    /// crashed or silent peer.
    pub last_heard: BTreeMap<u16, Instant>,
    /// Requests the core refused at submit (queue full, too large, duplicate).
    pub submit_rejected: u64,
    /// Checkpoint digests the core refused (the application's mistake).
    pub checkpoint_rejected: u64,
    pub batches_delivered: u64,
    /// Set when the core reported that it needs the state of this checkpoint from its peers.
    pub state_transfer_needed: Option<u64>,
    /// Set when writing the ordering state failed; the replica stopped.
    pub persist_failed: Option<String>,
}

/// The application's side of a running replica.
pub struct ReplicaHandle {
    /// Submit a request at this replica (this replica is its gateway).
    pub submit: mpsc::Sender<Request>,
    /// Requests the core refused at submit because they can never be delivered under their
    /// number (already delivered, or beyond `max_number_jump`): for a gateway that numbers
    /// fresh requests, a sign that a primary ordered requests under its name; it renumbers
    /// them. Take it once; bounded, refusals beyond its room are only counted.
    pub refused: Option<mpsc::Receiver<(Request, SubmitError)>>,
    /// Confirm the state digest after executing a batch whose `checkpoint_due` is set.
    pub checkpoint: mpsc::Sender<(u64, Digest)>,
    pub status: watch::Receiver<DriverStatus>,
    /// The latest checkpoint whose state this replica must fetch from its peers (the core
    /// fell behind the log they retain); `None` until the first such request.
    pub state_transfer: watch::Receiver<Option<CheckpointClaim>>,
    /// Report that the state of this checkpoint was fetched, verified and installed (with the
    /// ordering's delivery base there, from the snapshot): delivery resumes after it.
    pub installed: mpsc::Sender<Transferred>,
    /// The core's read barrier ([`Replica::read_barrier`]), published after every turn's
    /// inputs, before any of their actions is carried out: a batch is handed to the
    /// application only after the barrier covering it is visible here.
    pub read_barrier: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl ReplicaHandle {
    /// Stops the driver task (the replica's state is dropped).
    pub fn abort(&self) {
        self.task.abort();
    }

    /// Whether the driver task has ended. It runs until the handle is dropped, so before
    /// that an end is a failure (a panic included): the owner should stop the replica.
    pub fn has_stopped(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for ReplicaHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Current wall-clock time as the core's [`Time`] (microseconds since the Unix epoch).
pub fn now() -> Time {
    let micros = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0);
    Time(u64::try_from(micros).unwrap_or(u64::MAX))
}

/// Runs `replica` on the ordering channel of a mesh (`incoming` from
/// [`super::Mesh::subscribe`]`(CHANNEL_ORDERING)`) and `outbound` (a [`MeshSender`]). Returns
/// the handle and the receiver of delivered batches. Decoding uses the replica's own limits, so
/// the mesh's `max_frame_bytes` should be at least the config's `max_message_bytes`.
pub fn spawn_replica<O: Outbound>(replica: Replica, outbound: O, incoming: mpsc::Receiver<(u16, Bytes)>) -> (ReplicaHandle, mpsc::UnboundedReceiver<Batch>) {
    spawn_replica_with(replica, outbound, incoming, None, None)
}

/// Like [`spawn_replica`], writing the core's [`Action::Persist`] to `store` (without one, the
/// state lives in memory only and a restart must count against `f`), and with every message the
/// replica sends passed through `byzantine` when given (test clusters only; see
/// [`super::byzantine`]).
pub fn spawn_replica_with<O: Outbound>(
    replica: Replica,
    outbound: O,
    incoming: mpsc::Receiver<(u16, Bytes)>,
    byzantine: Option<Byzantine>,
    store: Option<Store>,
) -> (ReplicaHandle, mpsc::UnboundedReceiver<Batch>) {
    let (submit_tx, submit_rx) = mpsc::channel(4096);
    let (refused_tx, refused_rx) = mpsc::channel(1024);
    let (checkpoint_tx, checkpoint_rx) = mpsc::channel(64);
    let (deliver_tx, deliver_rx) = mpsc::unbounded_channel();
    let (transfer_tx, transfer_rx) = watch::channel(None);
    let (installed_tx, installed_rx) = mpsc::channel(4);
    let (barrier_tx, barrier_rx) = watch::channel(replica.read_barrier());
    let (status_tx, status_rx) = watch::channel(DriverStatus {
        core: replica.status(),
        decode_errors: 0,
        decode_errors_by_peer: BTreeMap::new(),
        last_heard: BTreeMap::new(),
        submit_rejected: 0,
        checkpoint_rejected: 0,
        batches_delivered: 0,
        state_transfer_needed: None,
        persist_failed: None,
    });
    let limits = replica.config().limits();
    let driver = Driver {
        replica,
        limits,
        outbound: Arc::new(outbound),
        incoming,
        submit_rx,
        refused_tx,
        checkpoint_rx,
        installed_rx,
        barrier_tx,
        transfer_tx,
        deliver_tx,
        status_tx,
        byzantine,
        decode_errors: 0,
        decode_errors_by_peer: BTreeMap::new(),
        last_heard: BTreeMap::new(),
        submit_rejected: 0,
        checkpoint_rejected: 0,
        batches_delivered: 0,
        state_transfer_needed: None,
        store,
        persist_failed: None,
    };
    let task = tokio::spawn(driver.run());
    let handle = ReplicaHandle {
        submit: submit_tx,
        refused: Some(refused_rx),
        checkpoint: checkpoint_tx,
        status: status_rx,
        state_transfer: transfer_rx,
        installed: installed_tx,
        read_barrier: barrier_rx,
        task,
    };
    (handle, deliver_rx)
}

struct Driver<O: Outbound> {
    replica: Replica,
    limits: Limits,
    outbound: Arc<O>,
    incoming: mpsc::Receiver<(u16, Bytes)>,
    submit_rx: mpsc::Receiver<Request>,
    refused_tx: mpsc::Sender<(Request, SubmitError)>,
    checkpoint_rx: mpsc::Receiver<(u64, Digest)>,
    installed_rx: mpsc::Receiver<Transferred>,
    barrier_tx: watch::Sender<u64>,
    transfer_tx: watch::Sender<Option<CheckpointClaim>>,
    deliver_tx: mpsc::UnboundedSender<Batch>,
    status_tx: watch::Sender<DriverStatus>,
    byzantine: Option<Byzantine>,
    decode_errors: u64,
    decode_errors_by_peer: BTreeMap<u16, u64>,
    last_heard: BTreeMap<u16, Instant>,
    submit_rejected: u64,
    checkpoint_rejected: u64,
    batches_delivered: u64,
    state_transfer_needed: Option<u64>,
    store: Option<Store>,
    persist_failed: Option<String>,
}

enum Input {
    Message(u16, Bytes),
    Submit(Request),
    Checkpoint(u64, Digest),
    Installed(Transferred),
    Timer,
    /// Every input source is gone: the application dropped its handle and the network is down.
    Closed,
}

impl<O: Outbound> Driver<O> {
    async fn run(mut self) {
        let mut last_status = Instant::now();
        loop {
            self.flush().await;
            if self.persist_failed.is_some() {
                self.publish_status();
                return;
            }
            if last_status.elapsed() >= STATUS_INTERVAL {
                self.publish_status();
                last_status = Instant::now();
            }
            let input = self.next_input().await;
            if matches!(input, Input::Closed) {
                self.publish_status();
                return;
            }
            // One clock reading per turn: the inputs drained together arrived together.
            let now = now();
            self.feed(now, input);
            // Drain what is already queued before flushing, bounded per turn.
            for _ in 0..MAX_INPUTS_PER_TURN {
                match self.try_next_input() {
                    Some(input) => self.feed(now, input),
                    None => break,
                }
            }
            // Before any action of these inputs is carried out (a delivery above all).
            let barrier = self.replica.read_barrier();
            self.barrier_tx.send_if_modified(|b| std::mem::replace(b, barrier) != barrier);
        }
    }

    async fn next_input(&mut self) -> Input {
        // Wake for the core's timer, and at least every STATUS_INTERVAL to refresh the status.
        let status_due = Instant::now() + STATUS_INTERVAL;
        let wake = match self.replica.poll_timeout().map(deadline_instant) {
            Some(deadline) => deadline.min(status_due),
            None => status_due,
        };
        tokio::select! {
            message = self.incoming.recv() => match message {
                Some((from, bytes)) => Input::Message(from, bytes),
                None => Input::Closed,
            },
            request = self.submit_rx.recv() => match request {
                Some(request) => Input::Submit(request),
                None => Input::Closed,
            },
            Some((seq, digest)) = self.checkpoint_rx.recv() => Input::Checkpoint(seq, digest),
            Some(claim) = self.installed_rx.recv() => Input::Installed(claim),
            _ = tokio::time::sleep_until(wake) => Input::Timer,
        }
    }

    fn try_next_input(&mut self) -> Option<Input> {
        if let Ok((from, bytes)) = self.incoming.try_recv() {
            return Some(Input::Message(from, bytes));
        }
        if let Ok(request) = self.submit_rx.try_recv() {
            return Some(Input::Submit(request));
        }
        if let Ok((seq, digest)) = self.checkpoint_rx.try_recv() {
            return Some(Input::Checkpoint(seq, digest));
        }
        None
    }

    fn feed(&mut self, now: Time, input: Input) {
        match input {
            Input::Message(from, bytes) => {
                self.last_heard.insert(from, Instant::now());
                match Message::decode(&bytes, self.limits) {
                    Ok(message) => self.replica.handle_message(now, from, message),
                    Err(e) => self.decode_error(from, bytes.len(), e),
                }
            }
            Input::Submit(request) => {
                let copy = request.clone();
                if let Err(e) = self.replica.submit(now, request) {
                    self.submit_rejected += 1;
                    if matches!(e, SubmitError::AlreadyDelivered | SubmitError::NumberTooFar) {
                        // Dropped when the gateway does not keep up: it is counted above.
                        let _ = self.refused_tx.try_send((copy, e));
                    } else {
                        tracing::debug!(error = %e, "request refused");
                    }
                }
            }
            Input::Checkpoint(seq, digest) => {
                if let Err(e) = self.replica.checkpoint(seq, digest) {
                    self.checkpoint_rejected += 1;
                    tracing::warn!(seq, error = %e, "checkpoint digest refused");
                }
            }
            Input::Installed(transferred @ Transferred { claim, .. }) => match self.replica.state_transferred(transferred) {
                Ok(()) => {
                    tracing::info!(seq = claim.seq, "state transferred; delivery resumes after it");
                    if self.state_transfer_needed.is_some_and(|seq| seq <= claim.seq) {
                        self.state_transfer_needed = None;
                    }
                }
                Err(e) => tracing::warn!(seq = claim.seq, error = %e, "installed state refused by the ordering"),
            },
            Input::Timer => {
                if self.replica.poll_timeout().is_some_and(|deadline| deadline <= now) {
                    self.replica.handle_timeout(now);
                }
            }
            Input::Closed => {}
        }
    }

    async fn flush(&mut self) {
        while let Some(action) = self.replica.poll_action() {
            if self.persist_failed.is_some() {
                // Nothing queued after a failed persist may go out.
                continue;
            }
            match action {
                Action::Persist(persist) => {
                    if let Some(mut store) = self.store.take() {
                        // The write ends in an fsync (milliseconds on many disks): it runs on
                        // the blocking pool so that the runtime's few worker threads go on
                        // serving clients and the executor; this task waits for it, so nothing
                        // queued after the persist goes out before it is durable.
                        let written = tokio::task::spawn_blocking(move || {
                            let result = store.write(&persist);
                            (store, result)
                        })
                        .await;
                        let failure = match written {
                            Ok((store, result)) => {
                                self.store = Some(store);
                                result.err().map(|e| e.to_string())
                            }
                            Err(e) => Some(format!("the persist task failed: {e}")),
                        };
                        if let Some(e) = failure {
                            tracing::error!(error = %e, "cannot persist the ordering state; this replica stops");
                            self.persist_failed = Some(e);
                        }
                    }
                }
                Action::Send { to, message } if self.byzantine.is_some() => self.send_byzantine(to, message),
                Action::Broadcast { message } if self.byzantine.is_some() => {
                    let (me, n) = (self.replica.id(), self.replica.config().n);
                    for to in (0..n).filter(|&to| to != me) {
                        self.send_byzantine(to, message.clone());
                    }
                }
                Action::Send { to, message } => self.outbound.send(to, Bytes::from(message.encode())),
                Action::Broadcast { message } => self.outbound.broadcast(Bytes::from(message.encode())),
                Action::Deliver(batch) => {
                    self.batches_delivered += 1;
                    // The application may have stopped listening; ordering goes on regardless.
                    let _ = self.deliver_tx.send(batch);
                }
                Action::NeedStateTransfer { last_delivered, checkpoint } => {
                    // The application fetches this checkpoint's state and reports it installed.
                    self.state_transfer_needed = Some(checkpoint.seq);
                    tracing::warn!(last_delivered, checkpoint = checkpoint.seq, "replica fell behind the retained log; state transfer needed");
                    self.transfer_tx.send_replace(Some(checkpoint));
                }
                #[allow(unreachable_patterns)]
                other => tracing::trace!(?other, "action ignored by the driver"),
            }
        }
    }

    fn decode_error(&mut self, from: u16, len: usize, e: crate::DecodeError) {
        self.decode_errors += 1;
        *self.decode_errors_by_peer.entry(from).or_default() += 1;
        tracing::warn!(from, len, error = %e, "undecodable message from peer");
    }

    /// A Byzantine replica's send: what its behaviour makes of the honest message.
    fn send_byzantine(&mut self, to: u16, message: Message) {
        if let Some(byzantine) = self.byzantine.as_mut() {
            for (to, message) in byzantine.rewrite(to, message) {
                self.outbound.send(to, Bytes::from(message.encode()));
            }
        }
    }

    fn publish_status(&self) {
        let core = self.replica.status();
        let before = self.status_tx.borrow();
        let (view, changing) = (before.core.view, before.core.view_changing);
        // A suspicion not published before is this view change's cause.
        let suspicion = core.last_suspicion.filter(|s| Some(*s) != before.core.last_suspicion && s.view == view);
        drop(before);
        // View changes are rare and an operator wants to see each (and so does a failed test).
        if (core.view, core.view_changing) != (view, changing) {
            if core.view_changing {
                match suspicion {
                    // Its own timer, not f+1 others: say what it waited for and how long.
                    Some(s) => tracing::info!(
                        view = core.view,
                        from = view,
                        last_delivered = core.last_delivered,
                        awaited = s.awaited,
                        oldest_wait_ms = s.oldest_wait.as_millis() as u64,
                        oldest_own = s.oldest_own,
                        timeout_ms = s.timeout.as_millis() as u64,
                        observed_ms = s.observed.as_millis() as u64,
                        "changing views: the request timer suspected the primary"
                    ),
                    None => tracing::info!(view = core.view, from = view, last_delivered = core.last_delivered, "changing views"),
                }
            } else {
                tracing::info!(view = core.view, primary = core.primary, last_delivered = core.last_delivered, "view installed");
            }
        }
        self.status_tx.send_replace(DriverStatus {
            core,
            decode_errors: self.decode_errors,
            decode_errors_by_peer: self.decode_errors_by_peer.clone(),
            last_heard: self.last_heard.clone(),
            submit_rejected: self.submit_rejected,
            checkpoint_rejected: self.checkpoint_rejected,
            batches_delivered: self.batches_delivered,
            state_transfer_needed: self.state_transfer_needed,
            persist_failed: self.persist_failed.clone(),
        });
    }
}

fn deadline_instant(deadline: Time) -> Instant {
    let now_us = now().0;
    Instant::now() + Duration::from_micros(deadline.0.saturating_sub(now_us))
}

/// An in-memory network of `n` replicas with the same interface as the mesh's ordering channel:
/// the baseline the TLS figures are compared with, and a harness for driver tests.
pub fn local_network(n: u16, queue: usize) -> Vec<(LocalOutbound, mpsc::Receiver<(u16, Bytes)>)> {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel(queue)).unzip();
    let senders = Arc::new(senders);
    receivers.into_iter().enumerate().map(|(id, rx)| (LocalOutbound { id: id as u16, peers: senders.clone() }, rx)).collect()
}

/// The sending side of [`local_network`]; drops (like the mesh) when a receiver is full.
#[derive(Clone)]
pub struct LocalOutbound {
    id: u16,
    peers: Arc<Vec<mpsc::Sender<(u16, Bytes)>>>,
}

impl Outbound for LocalOutbound {
    fn send(&self, to: u16, bytes: Bytes) {
        if let Some(peer) = self.peers.get(usize::from(to)) {
            if to != self.id {
                let _ = peer.try_send((self.id, bytes));
            }
        }
    }

    fn broadcast(&self, bytes: Bytes) {
        for (to, peer) in self.peers.iter().enumerate() {
            if to != usize::from(self.id) {
                let _ = peer.try_send((self.id, bytes.clone()));
            }
        }
    }
}
