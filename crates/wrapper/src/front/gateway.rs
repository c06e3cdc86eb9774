//! The gateway: turns the requests the read router sends it into ordered requests, and
//! answers voting clients' reads without ordering.
//!
//! Request identity is (this replica, incarnation, number). The incarnation is taken at
//! start-up from the clock, so after a restart the numbers of a new incarnation are
//! never mistaken for retries the ordering has already delivered. A fresh request the
//! ordering refuses as already delivered (or numbered beyond its jump) means that a primary
//! ordered requests under this gateway's name, or that numbers were lost: the gateway warns,
//! counts it, moves to the next incarnation and submits the request again under it
//! ([`Gateway::renumber`]), so its client is still answered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bft::Request;
use bft::SubmitError;
use exec::answer::servfail;
use exec::envelope::Op;
use named_glue::forward::Forwarder;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::client::reply::ReplyTo;
use crate::execution::pending::{payload_digest, Pending};
use crate::ops::metrics::Metrics;
use crate::reads::read::ReadCache;
use crate::reads::route::{ClientRequest, Lane};

pub struct Gateway {
    pub id: u16,
    /// The client incarnation fresh requests are numbered under (see the module docs).
    pub incarnation: AtomicU64,
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
    /// Orders what `requests` brings on the ordered lane and answers what comes on the
    /// voting lane without ordering (the read router, `crate::reads::route`, chose the lane),
    /// and orders the reads `fallback` brings back from the vouched path. Reads that can be
    /// vouched for never come here: the listeners hand them to `crate::reads::vouched`.
    pub async fn run(self: Arc<Self>, mut requests: mpsc::Receiver<ClientRequest>, mut fallback: mpsc::Receiver<ClientRequest>) {
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                r = requests.recv() => {
                    let Some(r) = r else { return };
                    match r.lane {
                        Lane::Voting => crate::reads::voting_read::answer_unordered(&self.named, &self.cache, &self.metrics, r.bytes, r.tcp, r.reply),
                        Lane::Ordered(_) => self.order(Op::Dns { tcp: r.tcp, message: r.bytes }, r.reply).await,
                    }
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

    /// The (incarnation, number) the next fresh request of this gateway is submitted under.
    pub fn next_key(&self) -> (u64, u64) {
        let incarnation = self.incarnation.load(Ordering::Relaxed);
        (incarnation, self.next_number.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Orders `op` with `reply` waiting for its answer. Also used by the admin path.
    pub async fn order(&self, op: Op, reply: ReplyTo) {
        let key @ (incarnation, number) = self.next_key();
        let (message, ttl) = match &op {
            Op::Dns { message, .. } => (Some(message.clone()), self.client_timeout),
            // Signing a whole zone takes as long as it takes; the admin caller waits.
            Op::SignZone(_) | Op::Resign | Op::SignZoneFinish(_) | Op::SignZoneIn { .. } | Op::ResignZone(_) | Op::SignZoneFinishIn { .. } => {
                (None, Duration::from_secs(600))
            }
            // Said again every few seconds while the write is stuck; each copy's answer
            // comes only once the executor is past it.
            Op::Stuck { .. } => (None, Duration::from_secs(30)),
            // Answered at once when counted; the finishing one when its signing is installed.
            Op::RolloverReport { .. } => (None, Duration::from_secs(600)),
            // Answered when counted, or once the replica serves the changed zone set.
            Op::ZoneSet { .. } => (None, Duration::from_secs(600)),
        };
        let payload = op.encode();
        if !self.pending.insert(key, reply.clone(), ttl, payload_digest(&payload)) {
            self.metrics.inc_dropped("pending_full");
            if let Some(a) = message.as_deref().and_then(servfail) {
                reply.send(a).await;
            }
            return;
        }
        let request = Request { origin: self.id, client: incarnation, number, payload };
        if self.submit.send(request).await.is_err() {
            self.pending.take(&key);
        }
    }

    /// Takes the ordering's refusals of this gateway's fresh requests (see the module docs)
    /// and renumbers each under a new incarnation; runs until the ordering stops.
    pub async fn renumber_refused(self: Arc<Self>, mut refused: mpsc::Receiver<(Request, SubmitError)>) {
        while let Some((request, error)) = refused.recv().await {
            self.renumber(request, &error).await;
        }
    }

    /// One refused request: warned and counted, then submitted again under the next
    /// incarnation (numbering from 1) if its client still waits for it.
    pub async fn renumber(&self, request: Request, error: &SubmitError) {
        self.metrics.inc_own_request_refused();
        let old = (request.client, request.number);
        warn!(replica = self.id, client = old.0, number = old.1, %error, "the ordering refused a fresh request of this gateway (a primary may have ordered requests under its name); renumbering");
        let Some(entry) = self.pending.take(&old) else { return };
        // Moves on once per refused incarnation: requests refused under an older one meanwhile
        // join the current one.
        let current = self.incarnation.load(Ordering::Relaxed);
        if current == request.client {
            let _ = self.incarnation.compare_exchange(current, current.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed);
            self.next_number.store(0, Ordering::Relaxed);
        }
        let key @ (incarnation, number) = self.next_key();
        if !self.pending.reinsert(key, entry) {
            self.metrics.inc_dropped("pending_full");
            return;
        }
        let request = Request { origin: self.id, client: incarnation, number, payload: request.payload };
        if self.submit.send(request).await.is_err() {
            self.pending.take(&key);
        }
    }
}
