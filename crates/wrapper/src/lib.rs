//! The sdns wrapper: the paper's `Wrapper`, one per replica.
pub mod classify;
pub mod config;
