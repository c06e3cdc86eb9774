//! The sdns wrapper: the paper's `Wrapper`, one per replica.
pub mod classify;
pub mod config;
pub mod envelope;
pub mod files;
pub mod listener;
pub mod metrics;
pub mod pending;
