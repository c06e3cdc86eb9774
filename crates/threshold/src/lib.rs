//! Threshold signing between replicas: the paper's BASIC, OPT-PROOF and OPT-TE protocols
//! (Sections 3.3 and 3.5) as one sans-IO state machine, [`SignerCore`], over shoup-rsa's
//! combination strategies (`combine_basic`, `combine_opt_proof`, `combine_opt_te`).
//!
//! Inputs: a signing request from the local named ([`SignerCore::request`]), a message from a
//! peer ([`SignerCore::handle_message`]), a finished job ([`SignerCore::job_done`]), time
//! passing ([`SignerCore::handle_timeout`]). Outputs ([`SignerCore::poll_output`]): messages
//! to send, finished signatures, and jobs ([`Output::Compute`]): every expensive step (this
//! replica's share, with or without proof; a combination, with its proof checks and subset
//! trials) is a self-contained [`Job`] the driver may run on any thread, many at once, feeding
//! each result back. The core itself stays deterministic: its state changes only on inputs,
//! in the order the driver delivers them. No sockets, no clock, no threads: the same core runs
//! under tokio (the wrapper's signing service) and in the seeded simulator
//! (tests/signing_sim.rs).
//!
//! Why a crate of its own rather than a module of shoup-rsa: shoup-rsa is the arithmetic (keys,
//! shares, proofs, combination) with no notion of peers, sessions or time; this crate is the
//! distributed protocol (sessions, retries, bounded stashes for peers running ahead, blame),
//! and keeps the arithmetic crate small and independently reviewable.
//!
//! Safety rule: a replica issues its share only for data its own named asked it to sign. Peers
//! learn only a digest and shares, so t corrupted replicas can never obtain a signature on data
//! the honest replicas did not themselves ask for.

#![forbid(unsafe_code)]

mod core;
mod keys;
mod message;

pub use self::core::{Job, JobDone, Limits, Output, Protocol, RequestError, SignerCore, Stats};
pub use keys::Keys;
pub use message::{Digest, SignMessage};
