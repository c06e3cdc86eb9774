//! Threshold signing between replicas, carried over the mesh. The protocols live in the
//! `threshold` crate (RSA: BASIC, OPT-PROOF, OPT-TE) and the `threshold-ec` crate (ECDSA P-256
//! and Ed25519), each with its sans-IO state machine; this module is their tokio driver
//! (`service`, one core per zone through `zone_core`) and the byte framing of their messages
//! on mesh channel 1 (`wire`); `split` divides a signature's time for the metrics.

pub mod service;
pub mod split;
pub mod wire;
pub mod zone_core;

pub use threshold::{Digest, Keys, Limits as SignerLimits, SignMessage, SignerCore};
pub use wire::{SignEnvelope, WireFormat, ZoneMessage};
pub use zone_core::{ZoneCore, ZoneKeys};
