//! The workspace's test kit, a dev-dependency of every crate whose tests need it:
//!
//! - [`seeds`]: the one seed convention of the simulators (the ordering simulator in bft, the
//!   signing simulator in threshold, the execution simulator in exec), so that a failure found
//!   by any of them is replayed the same way:
//!   - every simulated test is a *campaign*: seeds `0..count`, with the count CI runs written
//!     in the test;
//!   - `SIM_SEEDS=N` runs N seeds instead in every campaign the command selects (a longer
//!     campaign: `SIM_SEEDS=5000 cargo test --release -p bft --test sim -- actor_equivocator`);
//!   - `SIM_SEED=S` runs seed S alone in every campaign the command selects (a replay);
//!   - a failing seed is reported with the line that replays it:
//!     `reproduce: SIM_SEED=S cargo test -p CRATE --test TARGET -- TEST --exact --nocapture`.
//! - [`Noise`]: the one seeded generator of garbage the fuzz-like tests feed to parsers and
//!   listeners (random datagrams, random bytes), so that such a test replays exactly.
//! - [`FakeDns`]: the one fake DNS server (UDP and TCP on one loopback port, an answer
//!   function, threads that stop on drop) for tests of clients and of anything that asks a
//!   name server.
//!
//! The system tests' drivers of BIND's tools and the cluster harnesses are in tests/support
//! (the root package), since they run the real processes. Each simulator keeps its own world
//! (network, clocks, faults), since what is simulated differs; the seed is the whole input.
#![forbid(unsafe_code)]

pub mod fake_dns;
pub mod noise;
pub mod seeds;

pub use fake_dns::FakeDns;
pub use noise::Noise;
pub use seeds::{Campaign, Reproduce, SEEDS_VAR, SEED_VAR};
