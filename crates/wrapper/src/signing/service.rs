//! The signing core under tokio: named's requests come in through named-glue's
//! signing socket (as `Signer::sign`), peers' messages through mesh channel 1.
//!
//! The core's jobs (this replica's shares, combinations with their proof checks) run on the
//! blocking thread pool, at most `workers` at once (one per core by default), so the shares of
//! different signing sessions are computed in parallel and the loop never waits on one.
//! Outstanding jobs are bounded by the core's session limit (at most three per session).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use mesh::{MeshSender, CHANNEL_SIGNING};
use named_glue::signer::{SignError, SignFuture, SignRequest, Signer};
use threshold::{JobDone, Output, SignerCore};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::wire::{SignMessage, WireFormat};
use super::Digest;
use crate::byzantine::SigningFault;
use crate::metrics::Metrics;

enum Command {
    /// `shared`: a whole-zone signing's request, which every replica makes at about the same
    /// time (`SignerCore::request_shared`).
    Sign { algorithm: u8, data: Vec<u8>, shared: bool, reply: oneshot::Sender<Result<Vec<u8>, SignError>> },
}

/// named-glue's `Signer`, backed by the task that runs the threshold protocol.
pub struct ThresholdSigner {
    commands: mpsc::Sender<Command>,
    zone_key_tag: u16,
}

impl Signer for ThresholdSigner {
    fn sign(&self, request: SignRequest) -> SignFuture {
        self.sign_as(request, false)
    }
}

impl ThresholdSigner {
    fn sign_as(&self, request: SignRequest, shared: bool) -> SignFuture {
        let commands = self.commands.clone();
        let expected_tag = self.zone_key_tag;
        Box::pin(async move {
            if request.key_tag != expected_tag {
                return Err(SignError::UnknownKey { algorithm: request.algorithm, key_tag: request.key_tag });
            }
            let (reply, answer) = oneshot::channel();
            commands.send(Command::Sign { algorithm: request.algorithm, data: request.data, shared, reply }).await.map_err(|_| SignError::ShuttingDown)?;
            answer.await.map_err(|_| SignError::ShuttingDown)?
        })
    }
}

/// The signer of background whole-zone signings: the same threshold signer, each
/// signature counted for the signing's progress. Every replica asks for every signature of
/// the zone, so these are shared sessions: k designated replicas make the shares and one
/// combines for all (docs/ARCHITECTURE.md, "Shared signing").
pub struct Counting {
    pub inner: Arc<ThresholdSigner>,
    pub metrics: Arc<Metrics>,
}

impl Signer for Counting {
    fn sign(&self, request: SignRequest) -> SignFuture {
        let (signing, metrics) = (self.inner.sign_as(request, true), self.metrics.clone());
        Box::pin(async move {
            let signature = signing.await?;
            metrics.inc_zone_signed();
            Ok(signature)
        })
    }
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Share computations and combinations running at once: one per core.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Starts the task; returns the `Signer` to hand to named-glue's `SigningService` and the
/// task (it runs as long as the mesh and a signer are there: an earlier end is a failure).
pub fn spawn(
    core: SignerCore,
    zone_key_tag: u16,
    mesh: MeshSender,
    incoming: mpsc::Receiver<(u16, Bytes)>,
    metrics: Arc<Metrics>,
    fault: SigningFault,
) -> (Arc<ThresholdSigner>, JoinHandle<()>) {
    let (commands, rx) = mpsc::channel(1024);
    let task = tokio::spawn(run(core, mesh, incoming, rx, metrics, default_workers(), fault));
    (Arc::new(ThresholdSigner { commands, zone_key_tag }), task)
}

struct Waiter {
    reply: oneshot::Sender<Result<Vec<u8>, SignError>>,
    since: Instant,
}

async fn run(
    mut core: SignerCore,
    mesh: MeshSender,
    mut incoming: mpsc::Receiver<(u16, Bytes)>,
    mut commands: mpsc::Receiver<Command>,
    metrics: Arc<Metrics>,
    workers: usize,
    fault: SigningFault,
) {
    let mut garbage = Garbage(0x2545_f491_4f6c_dd1d);
    let mut waiters: HashMap<Digest, Vec<Waiter>> = HashMap::new();
    let permits = Arc::new(Semaphore::new(workers.max(1)));
    // Finished jobs; a job's task waits for room here, the loop never does.
    let (done_tx, mut done_rx) = mpsc::channel::<JobDone>(1024);
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    let mut shared_seen = (0u64, 0u64);
    loop {
        let timer = core.poll_timeout().map(|t| Duration::from_micros(t.saturating_sub(now_us())));
        tokio::select! {
            command = commands.recv() => {
                let Some(Command::Sign { algorithm, data, shared, reply }) = command else { return };
                let opened = if shared { core.request_shared(now_us(), algorithm, &data) } else { core.request(now_us(), algorithm, &data) };
                match opened {
                    Ok(digest) => waiters.entry(digest).or_default().push(Waiter { reply, since: Instant::now() }),
                    Err(e) => { let _ = reply.send(Err(SignError::Failed(e.to_string()))); }
                }
            }
            message = incoming.recv() => {
                let Some((from, bytes)) = message else { return };
                match SignMessage::decode(&bytes) {
                    Ok(m) => core.handle_message(now_us(), from, m),
                    Err(e) => {
                        debug!(peer = from, error = %e, "undecodable signing message");
                        metrics.add_bad_share(from);
                    }
                }
            }
            done = done_rx.recv() => {
                // done_tx lives in this function, so the channel never closes.
                if let Some(done) = done {
                    core.job_done(done);
                }
            }
            _ = async { tokio::time::sleep(timer.unwrap_or(Duration::from_secs(3600))).await }, if timer.is_some() => {
                core.handle_timeout(now_us());
            }
            _ = sweep.tick() => {
                // Nobody waits for these any more (the signing service went away); stop
                // working on them.
                waiters.retain(|digest, ws| {
                    ws.retain(|w| !w.reply.is_closed());
                    if ws.is_empty() { core.abandon(digest); false } else { true }
                });
            }
        }
        while let Some(out) = core.poll_output() {
            match out {
                Output::Broadcast { .. } | Output::Send { .. } if fault == SigningFault::Silent => {}
                Output::Broadcast { message } => {
                    let message = if fault == SigningFault::Garbage { garbage.apply(message) } else { message };
                    if let Err(e) = mesh.broadcast(CHANNEL_SIGNING, Bytes::from(message.encode())) {
                        warn!(error = %e, "signing broadcast not sent");
                    }
                }
                Output::Send { to, message } => {
                    let message = if fault == SigningFault::Garbage { garbage.apply(message) } else { message };
                    if let Err(e) = mesh.send(to, CHANNEL_SIGNING, Bytes::from(message.encode())) {
                        debug!(to, error = %e, "signing message not sent");
                    }
                }
                Output::Done { digest, signature } => {
                    for w in waiters.remove(&digest).unwrap_or_default() {
                        metrics.observe_signing_us(w.since.elapsed().as_micros() as u64);
                        let _ = w.reply.send(Ok(signature.clone()));
                    }
                }
                Output::Misbehaved { peer, what } => {
                    warn!(peer, what, "peer misbehaved in threshold signing");
                    metrics.add_bad_share(peer);
                }
                Output::Compute(job) => {
                    let (permits, done_tx) = (permits.clone(), done_tx.clone());
                    tokio::spawn(async move {
                        let Ok(_permit) = permits.acquire_owned().await else { return };
                        match tokio::task::spawn_blocking(move || job.run()).await {
                            Ok(done) => {
                                let _ = done_tx.send(done).await;
                            }
                            Err(e) => warn!(error = %e, "signing job panicked"),
                        }
                    });
                }
                Output::Failed { digest, reason } => {
                    warn!(reason, "this replica's signature share could not be computed");
                    for w in waiters.remove(&digest).unwrap_or_default() {
                        let _ = w.reply.send(Err(SignError::Failed(reason.clone())));
                    }
                }
            }
        }
        let stats = core.stats();
        let now = (stats.shares_spared, stats.shared_fallbacks);
        if now != shared_seen {
            metrics.add_shared_signing(now.0 - shared_seen.0, now.1 - shared_seen.1);
            shared_seen = now;
        }
    }
}

/// A garbage-shares replica's rewrite: random bytes of the same length in place of its
/// shares and signatures (test clusters only).
struct Garbage(u64);

impl Garbage {
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0 as u8
            })
            .collect()
    }

    fn apply(&mut self, message: SignMessage) -> SignMessage {
        match message {
            SignMessage::Share { digest, share } => SignMessage::Share { digest, share: self.bytes(share.len()) },
            SignMessage::Final { digest, signature } => SignMessage::Final { digest, signature: self.bytes(signature.len()) },
            other => other,
        }
    }
}
