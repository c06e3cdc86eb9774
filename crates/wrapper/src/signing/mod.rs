//! Threshold signing between replicas, carried over the mesh. The protocols (BASIC, OPT-PROOF,
//! OPT-TE) and their sans-IO state machine live in the `threshold` crate; this module is its
//! tokio driver (`service`) and the byte framing of its messages on mesh channel 1 (`wire`).

pub mod service;
pub mod wire;

pub use threshold::{Digest, Keys, Limits as SignerLimits, SignMessage, SignerCore};
pub use wire::{SignEnvelope, WireFormat};
