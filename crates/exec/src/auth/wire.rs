//! The signature-record layout of a request (`dnswire::layout`), under the name the
//! authentication code has always used.

pub use dnswire::layout::*;
pub use dnswire::rrwire::WireError;
