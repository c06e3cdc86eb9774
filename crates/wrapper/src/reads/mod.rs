//! Reads: every way a client's query is answered, and the one place that chooses the way
//! (`route`, the read router, which the listener asks once per message). Ordered reads (the
//! executor hands them here), local reads (`reads = "local"`), voting clients' reads
//! (`voting_read`) and vouched reads (`vouched`, the tokio driver of exec's `vouch_core`) all
//! answer through `read` and its cache (`read_cache`); zone transfers are relayed by
//! `transfer`.

pub mod read;
pub mod read_cache;
pub mod route;
pub mod transfer;
pub mod voting_read;
pub mod vouched;
