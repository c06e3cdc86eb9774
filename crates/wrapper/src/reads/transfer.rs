//! Relaying a zone transfer (AXFR/IXFR over TCP) from named to the client without
//! holding up the executor.
//!
//! An ordered transfer must show the zone as of its place in the order: no write
//! ordered after it may show, every one ordered before it must. named fixes the zone
//! version a transfer sends when it starts (the database version for AXFR, the
//! journal range for IXFR), before its first message. So the executor waits only for
//! that first message; the rest streams on in a task of its own, bounded by the
//! transfer's deadline (`Forwarder::transfer_timeout`), and writes go on meanwhile.
//! A transfer named ends early (a re-sign restarts named) leaves the client with a
//! broken transfer, which it retries.

use std::sync::Arc;

use exec::answer::{error_answer, RCODE_SERVFAIL};
use named_glue::forward::{AxfrStream, Forwarder};
use tokio::sync::Semaphore;
use tracing::debug;

use crate::client::reply::ReplyTo;
use crate::ops::metrics::Metrics;

/// Transfers streaming on at once beyond their first message; past this, a transfer
/// is relayed whole before the executor goes on (still bounded by its deadline).
const MAX_BACKGROUND_TRANSFERS: usize = 32;
static BACKGROUND: Semaphore = Semaphore::const_new(MAX_BACKGROUND_TRANSFERS);
/// How long one later message of a transfer may wait for room in its connection's queue
/// (the client reads slowly); past it the transfer is given up, never the executor held.
const TRANSFER_SEND_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Relays named's answer to the transfer `request`; returns once named's first
/// message went to the client (or the transfer failed).
pub async fn relay(named: &Forwarder, request: Vec<u8>, reply: ReplyTo, metrics: Arc<Metrics>) {
    let mut stream = match named.axfr(&request).await {
        Ok(s) => s,
        Err(e) => {
            metrics.inc_execute_error();
            debug!(error = %e, "transfer failed");
            if let Some(a) = error_answer(&request, RCODE_SERVFAIL) {
                reply.send(a).await;
            }
            return;
        }
    };
    match stream.next_message().await {
        Some(Ok(first)) => reply.send(first).await,
        Some(Err(e)) => {
            metrics.inc_execute_error();
            debug!(error = %e, "transfer failed before its first message");
            if let Some(a) = error_answer(&request, RCODE_SERVFAIL) {
                reply.send(a).await;
            }
            return;
        }
        None => return,
    }
    let deadline = named.transfer_timeout;
    match BACKGROUND.try_acquire() {
        Ok(permit) => {
            tokio::spawn(async move {
                let _permit = permit;
                let _ = tokio::time::timeout(deadline, rest(stream, &reply)).await;
            });
        }
        Err(_) => {
            let _ = tokio::time::timeout(deadline, rest(stream, &reply)).await;
        }
    }
}

async fn rest(mut stream: AxfrStream, reply: &ReplyTo) {
    while let Some(part) = stream.next_message().await {
        match part {
            Ok(bytes) => {
                if let crate::client::reply::Delivery::Dropped(why) = reply.send_within(bytes, TRANSFER_SEND_WAIT).await {
                    debug!(why, "transfer given up: the client does not read");
                    return;
                }
            }
            Err(e) => {
                debug!(error = %e, "transfer ended early");
                return;
            }
        }
    }
}
