//! Deterministic execution of the ordered log.
//!
//! [`core::ExecCore`] is the sans-IO state machine (batches and events in, commands
//! out) that decides everything an ordered request does; [`gate`] is the question it
//! asks before forwarding a write; [`state::ExecState`] is the replicated state it
//! keeps and checkpoints attest; [`authority`] proves which replica asked for a
//! whole-zone signing. `crate::executor` performs the commands.

pub mod authority;
pub mod core;
pub mod gate;
pub mod state;

pub use self::core::{Command, Delivered, Event, ExecConfig, ExecCore, Item, Resume, UNAUTHORIZED_WRITES, UNFORWARDABLE_WRITES};
pub use authority::{SignFinishAuth, SignZoneAuth, SignZoneSigner, SignZoneVerifier};
pub use gate::{Unchanged, UpdateDecision, UpdateGate};
pub use state::{ExecState, SigningRun, WriteIntent};
