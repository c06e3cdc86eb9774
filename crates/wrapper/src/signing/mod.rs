//! Threshold signing between replicas: the paper's BASIC, OPT-PROOF and OPT-TE
//! protocols (Sections 3.3 and 3.5) as a sans-IO state machine.
//!
//! Inputs: a signing request from the local named (`request`), a message from a
//! peer (`handle_message`), time passing (`handle_timeout`). Outputs: messages to
//! send and finished signatures (`poll_output`). No sockets, no clock, no tasks:
//! the same core runs under tokio (service.rs) and in the seeded simulator
//! (tests/signing_sim.rs).
//!
//! Safety rule: a replica issues its share only for data its own named asked it to
//! sign. Peers learn only a digest and shares, so t corrupted replicas can never
//! obtain a signature on data the honest replicas did not themselves ask for.

mod core;
pub mod crypto;
pub mod wire;

pub use self::core::{Output, SignerCore, SignerLimits, Stats};
pub mod service;
pub use wire::{Digest, SignMessage};
