//! DNS messages as wire bytes, for everything that must not depend on a full decoder:
//! zone transfers and checkpoint digests ([`rrwire`]), where a request's signature
//! record sits and what its MAC covers ([`layout`]), TSIG itself ([`tsig`]), key tags and
//! signature times ([`dnssec`]), and the length framing of DNS over TCP ([`framing`], its
//! reading and writing over tokio streams behind the default feature `tokio`).
//!
//! One implementation serves the replica (update authentication, transfers, digests),
//! the voting client (signing updates) and the system tests (signed probes), so a fix to
//! a parser or to TSIG reaches all of them.
#![forbid(unsafe_code)]

pub mod dnssec;
pub mod framing;
pub mod layout;
pub mod rrwire;
pub mod tsig;
