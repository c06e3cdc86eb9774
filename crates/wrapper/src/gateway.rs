//! The gateway: turns classified client requests into ordered requests.
//!
//! Request identity is (this replica, incarnation, number). The incarnation is fixed
//! at start-up from the clock, so after a restart the numbers of a new incarnation are
//! never mistaken for retries the ordering has already delivered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bft::Request;
use named_glue::forward::Forwarder;
use tokio::sync::mpsc;
use tracing::debug;

use crate::answer::servfail;
use crate::envelope::Op;
use crate::metrics::Metrics;
use crate::pending::{payload_digest, Pending};
use crate::read::ReadCache;
use crate::reply::{ClientRequest, ReplyTo};

pub struct Gateway {
    pub id: u16,
    pub incarnation: u64,
    pub pending: Arc<Pending>,
    pub submit: mpsc::Sender<Request>,
    pub named: Forwarder,
    /// Shared with the executor, which empties it around every change of the zone.
    pub cache: Arc<ReadCache>,
    pub metrics: Arc<Metrics>,
    pub client_timeout: Duration,
    pub next_number: AtomicU64,
}

impl Gateway {
    /// Orders what `requests` brings (a voting client's read is answered without ordering),
    /// and the reads `fallback` brings back from the vouched path. Reads that can be vouched
    /// for never come here: the listeners hand them to `crate::vouched` themselves.
    pub async fn run(self: Arc<Self>, mut requests: mpsc::Receiver<ClientRequest>, mut fallback: mpsc::Receiver<ClientRequest>) {
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                r = requests.recv() => {
                    let Some(r) = r else { return };
                    // A voting client's read is answered without ordering (voting_read.rs).
                    let Some(r) = crate::voting_read::answer_unordered(&self.named, &self.cache, &self.metrics, r) else { continue };
                    self.order(Op::Dns { tcp: r.tcp, message: r.bytes }, r.reply).await;
                }
                Some(r) = fallback.recv() => self.order(Op::Dns { tcp: r.tcp, message: r.bytes }, r.reply).await,
                _ = sweep.tick() => {
                    let n = self.pending.sweep();
                    if n > 0 {
                        debug!(replica = self.id, expired = n, "client requests expired before ordering");
                    }
                }
            }
        }
    }

    /// Orders `op` with `reply` waiting for its answer. Also used by the admin path.
    pub async fn order(&self, op: Op, reply: ReplyTo) {
        let number = self.next_number.fetch_add(1, Ordering::Relaxed) + 1;
        let key = (self.incarnation, number);
        let (message, ttl) = match &op {
            Op::Dns { message, .. } => (Some(message.clone()), self.client_timeout),
            // Signing a whole zone takes as long as it takes; the admin caller waits.
            Op::SignZone(_) | Op::Resign | Op::SignZoneFinish(_) | Op::SignZoneIn { .. } | Op::ResignZone(_) | Op::SignZoneFinishIn { .. } => {
                (None, Duration::from_secs(600))
            }
        };
        let payload = op.encode();
        if !self.pending.insert(key, reply.clone(), ttl, payload_digest(&payload)) {
            self.metrics.inc_dropped("pending_full");
            if let Some(a) = message.as_deref().and_then(servfail) {
                reply.send(a).await;
            }
            return;
        }
        let request = Request { origin: self.id, client: self.incarnation, number, payload };
        if self.submit.send(request).await.is_err() {
            self.pending.take(&key);
        }
    }
}
