//! The sdns wrapper: the paper's `Wrapper`, one per replica.
//!
//! The deterministic decisions (classification, update authentication, the execution core,
//! the zone plan) live in the `exec` crate; this one performs them with tokio and named.
//!
//! A read: listener -> classify -> gateway -> ordering (bft) -> executor -> named -> client;
//! in ordered mode a plain query first tries `vouched` (answered without ordering once 2t
//! peers' read barriers show the gateway's own answer recent enough).
//! An update: the same path, executed by every replica; while named executes it,
//! its signing requests come through named-glue's socket to `signing`, which runs
//! the threshold protocol with the other replicas over the mesh.
#![forbid(unsafe_code)]

pub mod client;
pub mod config;
pub mod execution;
pub mod faults;
pub mod front;
pub mod ops;
pub mod reads;
pub mod run;
pub mod signing;
pub mod statexfer;
pub mod zone;

// The paths the configuration (config.rs, config/) and the operator's tools (crates/sdns)
// name, kept as they were before the modules went into folders.
pub use faults::byzantine;
pub use client::rrl;
pub use front::endpoint;
pub use ops::{files, metrics};
