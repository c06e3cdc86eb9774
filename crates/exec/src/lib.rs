//! Deterministic execution of the ordered log.
//!
//! [`core::ExecCore`] is the sans-IO state machine (batches and events in, commands
//! out) that decides everything an ordered request does; [`gate`] is the question it
//! asks before forwarding a write, which [`auth`] answers (TSIG and SIG(0), from the
//! message and the agreed time); [`state::ExecState`] is the replicated state it keeps
//! and checkpoints attest; [`authority`] proves which replica asked for a whole-zone
//! signing; [`classify`] says what a client's message is; [`envelope`] is what is
//! ordered; [`zone_plan`] computes digests, diffs and re-signing slices from a zone's
//! records; [`vouch_core::VouchCore`] decides vouched reads (answered without ordering once
//! 2t peers' read barriers allow it), over [`vouch`]'s messages and quorum rule. The wrapper's
//! executor and vouched-read driver perform the commands and read the clock.
//!
//! The crate is the determinism boundary: no tokio, hyper or clap in its dependency tree,
//! and no clock read in its sources; whatever depends on time takes it as an argument.
#![forbid(unsafe_code)]

pub mod access;
pub mod answer;
pub mod auth;
pub mod authority;
pub mod classify;
pub mod codec;
pub mod core;
pub mod envelope;
pub mod gate;
pub mod names;
pub mod signer_input;
pub mod state;
pub mod vouch;
pub mod vouch_core;
pub mod zone_plan;

pub use self::core::{Command, Delivered, Event, ExecConfig, ExecCore, Item, RequestCounts, Resume, UNAUTHORIZED_WRITES, UNFORWARDABLE_WRITES};
pub use authority::{SignFinishAuth, SignZoneAuth, SignZoneSigner, SignZoneVerifier, ZoneSetAction, ZoneSetChange};
pub use gate::{Unchanged, UpdateDecision, UpdateGate};
pub use state::{ExecState, SigningRun, WriteIntent, ZoneEntry, MAX_ZONES};
