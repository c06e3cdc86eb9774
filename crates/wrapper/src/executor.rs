//! Executes ordered batches against the local named, in order.
//!
//! Writes run one at a time on every replica, with the batch's agreed time set for
//! the signing service (so every honest named signs the same bytes). Reads run only
//! on their gateway, possibly several at once, but never across a write: a read
//! ordered before a write must not see it, one ordered after must.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bft::{Batch, Digest, Request};
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::Name;
use named_glue::forward::Forwarder;
use named_glue::signer::SignatureTimes;
use sha2::{Digest as _, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::auth::{UpdateDecision, UpdateGate};
use crate::classify::{classify, Kind, Verdict};
use crate::envelope::Op;
use crate::listener::ReplyTo;
use crate::metrics::Metrics;
use crate::pending::Pending;
use crate::zone::ZoneMaintenance;

/// Reads in flight at once at this gateway.
const MAX_READS_IN_FLIGHT: usize = 64;

pub struct Executor {
    pub id: u16,
    pub zone: Name,
    pub named: Forwarder,
    pub pending: Arc<Pending>,
    pub times: watch::Sender<Option<SignatureTimes>>,
    pub validity_s: u32,
    pub checkpoints: mpsc::Sender<(u64, Digest)>,
    pub metrics: Arc<Metrics>,
    pub maintenance: ZoneMaintenance,
    /// Where the last executed sequence number is recorded.
    pub executed_file: PathBuf,
    /// Agreed time (s) of the last successful signing of the whole zone (0: never);
    /// replicated state, persisted beside `executed_file`, shared with the re-sign timer.
    pub last_signed: Arc<AtomicU64>,
    pub resign_after_s: u64,
    /// Authenticates every ordered update against the batch's agreed time.
    pub gate: Arc<dyn UpdateGate>,
}

impl Executor {
    pub async fn run(mut self, mut batches: mpsc::UnboundedReceiver<Batch>) {
        let mut reads = JoinSet::new();
        let last = read_number(&self.executed_file);
        self.last_signed.store(read_number(&self.last_signed_file()), Ordering::Relaxed);
        if last > 0 {
            info!(replica = self.id, last, "resuming after executed batch");
        }
        while let Some(batch) = batches.recv().await {
            if batch.seq <= last {
                // Already applied to named's zone before a restart.
                continue;
            }
            for request in &batch.requests {
                self.execute(request, &batch, &mut reads).await;
            }
            if batch.checkpoint_due {
                drain(&mut reads).await;
                let digest = self.zone_digest().await;
                let _ = self.checkpoints.send((batch.seq, digest)).await;
            }
            write_number(&self.executed_file, batch.seq);
            self.metrics.update_status(|s| s.last_executed = batch.seq);
        }
    }

    async fn execute(&mut self, request: &Request, batch: &Batch, reads: &mut JoinSet<()>) {
        let mine = request.origin == self.id;
        let key = (request.client, request.number);
        let op = match Op::decode(&request.payload) {
            Ok(op) => op,
            Err(e) => {
                warn!(replica = self.id, seq = batch.seq, origin = request.origin, error = %e, "ordered request does not decode; skipped");
                return;
            }
        };
        let reply = if mine { self.pending.take(&key) } else { None };
        let reply = match reply {
            Some(entry) if entry.matches(&request.payload) => {
                self.metrics.observe_ordering_us(entry.arrived.elapsed().as_micros() as u64);
                Some(entry.reply)
            }
            Some(_) => {
                // Ordered under our identity but not what we submitted: a forged request.
                // Every replica still executes it (the order is agreed); we only refuse to
                // hand its answer to our client, who will retry under a new number.
                warn!(replica = self.id, seq = batch.seq, client = request.client, number = request.number, "delivered request differs from what this gateway submitted");
                self.metrics.inc_dropped("forged_request");
                None
            }
            None => None,
        };
        match op {
            Op::Dns { tcp, message } => match classify(&message, tcp) {
                Verdict::Order(kind) => {
                    self.metrics.inc_request(kind);
                    match kind {
                        Kind::Write => {
                            drain(reads).await;
                            let answer = self.write(&message, batch).await;
                            if let (Some(reply), Some(answer)) = (reply, answer) {
                                reply.send(answer).await;
                            }
                        }
                        Kind::Read | Kind::Transfer => {
                            // Only the gateway owes an answer; the others only ordered it.
                            let Some(reply) = reply else { return };
                            while reads.len() >= MAX_READS_IN_FLIGHT {
                                reads.join_next().await;
                            }
                            let named = self.named.clone();
                            let metrics = self.metrics.clone();
                            reads.spawn(async move { read(named, message, kind, tcp, reply, metrics).await });
                        }
                    }
                }
                // A gateway answers these itself; one that orders them is lying or newer.
                Verdict::Answer(_) | Verdict::Drop(_) => {
                    debug!(replica = self.id, seq = batch.seq, origin = request.origin, "ordered request the classifier rejects; skipped");
                }
            },
            Op::SignZone => {
                let outcome = self.sign_zone(batch, reads).await;
                // The admin endpoint that submitted it waits for this line.
                if let Some(reply) = reply {
                    reply.send(outcome.into_bytes()).await;
                }
            }
            Op::Resign => {
                let now_s = batch.time.0 / 1_000_000;
                let last = self.last_signed.load(Ordering::Relaxed);
                // Decided on agreed values only: every honest replica decides alike.
                if last != 0 && now_s >= last.saturating_add(self.resign_after_s) {
                    let outcome = self.sign_zone(batch, reads).await;
                    info!(replica = self.id, seq = batch.seq, outcome, "scheduled re-sign");
                } else {
                    debug!(replica = self.id, seq = batch.seq, "re-sign not due at the agreed time; skipped");
                }
                // Release the submitting timer either way.
                if let Some(reply) = reply {
                    reply.send(b"done".to_vec()).await;
                }
            }
        }
    }

    async fn sign_zone(&mut self, batch: &Batch, reads: &mut JoinSet<()>) -> String {
        drain(reads).await;
        let times = self.agreed_times(batch);
        let _ = self.times.send(Some(times));
        let result = self.maintenance.sign_zone(times).await;
        let _ = self.times.send(None);
        match result {
            Ok(()) => {
                let now_s = batch.time.0 / 1_000_000;
                self.last_signed.store(now_s, Ordering::Relaxed);
                write_number(&self.last_signed_file(), now_s);
                info!(replica = self.id, seq = batch.seq, "zone signed with the distributed key");
                format!("signed at seq {}", batch.seq)
            }
            Err(e) => {
                self.metrics.inc_execute_error();
                warn!(replica = self.id, seq = batch.seq, error = %e, "sign-zone failed; zone left as it was");
                format!("error: {e}")
            }
        }
    }

    fn last_signed_file(&self) -> PathBuf {
        self.executed_file.with_file_name("last-signed")
    }

    fn agreed_times(&self, batch: &Batch) -> SignatureTimes {
        let t = u32::try_from(batch.time.0 / 1_000_000).unwrap_or(u32::MAX);
        SignatureTimes::from_agreed(t, self.validity_s)
    }

    /// Every replica applies the update; the answer matters only at the gateway.
    async fn write(&mut self, message: &[u8], batch: &Batch) -> Option<Vec<u8>> {
        // Authenticated against the agreed time: every honest replica decides alike.
        let forward = match self.gate.decide(message, batch.time.0 / 1_000_000) {
            UpdateDecision::Forward(bytes) => bytes,
            UpdateDecision::Refuse { rcode, answer } => {
                debug!(replica = self.id, seq = batch.seq, rcode, "update refused at the agreed time");
                return Some(answer);
            }
        };
        let times = self.agreed_times(batch);
        let _ = self.times.send(Some(times));
        // TCP to named: an update must not be retried over UDP, it could apply twice.
        let result = self.named.forward_tcp(&forward).await;
        let _ = self.times.send(None);
        match result {
            Ok(answer) => Some(self.gate.answer_for_client(message, &answer)),
            Err(e) => {
                self.metrics.inc_execute_error();
                warn!(replica = self.id, seq = batch.seq, error = %e, "named did not answer an update");
                servfail(message)
            }
        }
    }

    /// A digest of the zone's content, the same on every honest replica: the records
    /// of an AXFR, each in canonical wire form, sorted.
    async fn zone_digest(&self) -> Digest {
        match self.maintenance.zone_records().await {
            Ok(mut records) => {
                records.sort();
                records.dedup();
                let mut h = Sha256::new();
                for r in &records {
                    h.update((r.len() as u32).to_be_bytes());
                    h.update(r);
                }
                h.finalize().into()
            }
            Err(e) => {
                warn!(replica = self.id, error = %e, "zone digest unavailable; checkpoint will not match");
                Sha256::digest(format!("unavailable {}", self.id)).into()
            }
        }
    }
}

async fn drain(reads: &mut JoinSet<()>) {
    while reads.join_next().await.is_some() {}
}

async fn read(named: Forwarder, message: Vec<u8>, kind: Kind, tcp: bool, reply: ReplyTo, metrics: Arc<Metrics>) {
    match kind {
        Kind::Transfer => match named.axfr(&message).await {
            Ok(mut stream) => {
                while let Some(part) = stream.next_message().await {
                    match part {
                        Ok(bytes) => reply.send(bytes).await,
                        Err(e) => {
                            debug!(error = %e, "transfer ended early");
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                metrics.inc_execute_error();
                debug!(error = %e, "transfer failed");
                if let Some(a) = servfail(&message) {
                    reply.send(a).await;
                }
            }
        },
        _ => {
            let answer = if tcp { named.forward_tcp(&message).await } else { named.forward_udp(&message).await };
            match answer {
                Ok(a) => reply.send(a).await,
                Err(e) => {
                    metrics.inc_execute_error();
                    debug!(error = %e, "read failed");
                    if let Some(a) = servfail(&message) {
                        reply.send(a).await;
                    }
                }
            }
        }
    }
}

/// SERVFAIL for a request, keeping its id, opcode and question.
pub fn servfail(request: &[u8]) -> Option<Vec<u8>> {
    let m = Message::from_vec(request).ok()?;
    let mut a = Message::error_msg(m.metadata.id, m.metadata.op_code, ResponseCode::ServFail);
    a.metadata.message_type = MessageType::Response;
    a.add_queries(m.queries.iter().cloned());
    a.to_vec().ok()
}

fn read_number(path: &PathBuf) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// The executed sequence number and the last signing time are written after named
/// applied the batch; named's file and journal are the durable state, these only tell
/// a restarted wrapper where named stands.
fn write_number(path: &PathBuf, value: u64) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, format!("{value}\n")).and_then(|_| std::fs::rename(&tmp, path)).is_err() {
        warn!(path = %path.display(), "cannot record {value}");
    }
}
