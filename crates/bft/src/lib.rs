//! bft (work in progress).

#[cfg(feature = "transport")]
pub mod transport;
