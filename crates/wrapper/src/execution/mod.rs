//! Execution: performing what exec's core decides for the ordered log, against the local named.
//! `executor` is the tokio side of `exec::ExecCore`; `pending` is the gateway's table of its
//! clients' requests awaiting their ordered answer, which the executor takes them from.

pub mod executor;
pub mod pending;
