//! PBFT ordering core for sdns: a sans-IO state machine (Castro and Liskov, "Practical Byzantine
//! Fault Tolerance and Proactive Recovery", TOCS 2002) that orders client requests into batches
//! with an agreed time, among `n >= 3f + 1` replicas of which `f` may be Byzantine.
//!
//! The crate is fully deterministic: no sockets, no tokio, no clock. Time is an argument
//! ([`Time`], microseconds since the Unix epoch, read by the driver from the wall clock), output
//! is polled. A driver loops:
//!
//! ```text
//! let mut replica = Replica::new(config, now)?;
//! loop {
//!     // feed events
//!     replica.submit(now, request)?;                    // a request from a local client
//!     replica.handle_message(now, peer, message);       // `peer` = authenticated channel id
//!     replica.handle_timeout(now);                      // when poll_timeout() is due (spurious calls are fine)
//!     replica.checkpoint(seq, state_digest)?;           // after executing a batch with checkpoint_due
//!     // drain
//!     while let Some(action) = replica.poll_action() { /* Send, Broadcast, Deliver, NeedStateTransfer */ }
//!     let wake_at = replica.poll_timeout();
//! }
//! ```
//!
//! Messages travel as bytes: [`Message::encode`] and [`Message::decode`] (versioned, size limits
//! checked before allocation, never panics on arbitrary input).
//!
//! # Protocol
//! - Normal case: pre-prepare, prepare, commit; batching bounded by count, bytes and delay
//!   (a batch goes at once when nothing is in flight); water marks `(stable, stable + L]`.
//! - Agreed time: the primary stamps each batch; a backup accepts a stamp only within
//!   `max_clock_skew` of its own clock and between the neighbouring batches' stamps. Delivered
//!   times strictly increase (a stamp not above the previous delivered time is raised to it plus
//!   one microsecond, deterministically, which also covers null batches after a view change).
//! - Requests are deduplicated by `(origin, client, number)`; a backup relays requests to the
//!   primary and suspects it when one is not ordered within `request_timeout`.
//! - View change in the MAC variant of the paper: the transport authenticates senders but
//!   messages carry no signatures, so a view change is trusted only for its own sender's claims
//!   (P and Q sets, checkpoint claims) and a new-view names the view changes it used by digest;
//!   backups recompute the decision from view changes they received directly. A replica that
//!   missed a new-view accepts it once f+1 replicas relay the same one. Timeouts double per
//!   failed view.
//! - Checkpoints every K with a quorum of matching `(seq, time, state digest)`; the log below the
//!   stable checkpoint is collected, `retained_batches` committed batches are kept below it.
//! - Catch-up: replicas broadcast a status report every `retransmit_interval`; peers push the
//!   committed batches a laggard misses, and the laggard accepts a batch once f+1 distinct peers
//!   sent the same one (with unsigned messages an embedded commit certificate could be forged
//!   by one Byzantine responder, so f+1 matching direct copies replace it). When the batches are
//!   gone on f+1 replicas the core emits [`Action::NeedStateTransfer`]: fetching application
//!   state is the application's business (the core does not yet offer a way to resume after it,
//!   see the crate's open issues).
//!
//! # Transport (feature `transport`, off by default)
//! [`transport`] holds the network side, kept out of the core: a cluster PKI (`transport::pki`),
//! a mutually authenticated TLS mesh with numbered channels (`transport::mesh`), and the tokio
//! driver that runs a [`Replica`] over it (`transport::driver`).
//!
//! # Known limits
//! - A request's `origin` is not authenticated end to end: a Byzantine primary can order forged
//!   requests under any origin (it could equally refuse to order), and forged high numbers make
//!   older numbers of that client look delivered.
//! - A Byzantine replica that sends different view changes to different replicas can stall a
//!   view that uses its message; backups then time out and move to the next view.
//!
//! # Testing
//! `tests/sim/` holds a deterministic simulator (virtual time, seeded ChaCha RNG, loss,
//! duplication, reordering, partitions, crashes with and without state loss, Byzantine actors).
//! `cargo test -p bft` runs thousands of seeds; `BFT_SOAK_SEEDS=100000 cargo test --release -p
//! bft --test sim -- soak --ignored` runs a long soak; `BFT_SEED=<seed> BFT_N=<n> cargo test -p bft
//! --test sim -- seed_repro` replays one seed.

mod codec;
mod decide;
mod message;
mod replica;
mod types;

pub use codec::{new_view_digest, view_change_digest, DecodeError, WIRE_VERSION};
pub use message::{
    CheckpointClaim, Message, NewView, PrePreparedEntry, PreparedEntry, StatusReport, ViewChange,
};
pub use replica::{Action, Replica, Status};
pub use types::{
    Batch, CheckpointError, Config, ConfigError, Digest, Limits, Proposal, ReplicaId, Request, RequestKey,
    SubmitError, Time, DEDUP_WINDOW,
};

#[cfg(feature = "transport")]
pub mod transport;
