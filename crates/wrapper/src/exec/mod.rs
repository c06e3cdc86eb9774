//! Deterministic execution of the ordered log.
//!
//! [`core::ExecCore`] is the sans-IO state machine (batches and events in, commands
//! out) that decides everything an ordered request does; [`gate`] is the question it
//! asks before forwarding a write; [`state::ExecState`] is the replicated state it
//! keeps and checkpoints attest. `crate::executor` performs the commands.

pub mod core;
pub mod gate;
pub mod state;

pub use self::core::{Command, Delivered, Event, ExecConfig, ExecCore, Item};
pub use gate::{Unchanged, UpdateDecision, UpdateGate};
pub use state::ExecState;
