//! Execution: performing what exec's core decides for the ordered log, against the local named.
//! `executor` is the tokio side of `exec::ExecCore`; `pending` is the gateway's table of its
//! clients' requests awaiting their ordered answer, which the executor takes them from;
//! `zoneset` holds the served zones' parts by zone index and changes them with the zone set.

pub mod executor;
pub mod pending;
pub mod zoneset;
