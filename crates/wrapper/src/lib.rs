//! The sdns wrapper: the paper's `Wrapper`, one per replica.
//!
//! The deterministic decisions (classification, update authentication, the execution core,
//! the zone plan, the vouched-read core) live in the `exec` crate; this one performs them with
//! tokio and named, in rooms by job: `front` (listeners, gateway, HTTP endpoint), `reads` (the
//! read router and every read path), `execution` (the executor), `zone`, `statexfer`,
//! `signing`, `client` (the way back to a client), `rollover` (the parent's DS watched for an
//! adopted zone's rollover), `ops`, `faults` (tests only), `catalog` (the catalog zone listing
//! the zones), `config` and `run` (the composition root). docs/ARCHITECTURE.md draws them.
//!
//! A read: `front::listener` -> `reads::route` (classify, once) -> local (`reads::read`),
//! vouched (`reads::vouched`: answered without ordering once 2t peers' read barriers show the
//! gateway's own answer recent enough), voting (`front::gateway` -> `reads::voting_read`), or
//! ordered: `front::gateway` -> ordering (bft) -> `execution::executor` -> `reads::read` ->
//! named -> `client::reply`.
//! An update: the ordered path, executed by every replica; while named executes it, its
//! signing requests come through named-glue's socket to `signing`, which runs the threshold
//! protocol with the other replicas over the mesh.
#![forbid(unsafe_code)]

pub mod catalog;
pub mod client;
pub mod config;
pub mod execution;
pub mod faults;
pub mod front;
pub mod ops;
pub mod reads;
pub mod rollover;
pub mod run;
pub mod signing;
pub mod statexfer;
pub mod zone;

// The paths the configuration (config.rs, config/) and the operator's tools (crates/sdns)
// name, kept as they were before the modules went into folders.
pub use client::rrl;
pub use faults::byzantine;
pub use front::endpoint;
pub use ops::{files, metrics};
