//! The one seed convention of the workspace's simulators (the ordering simulator in bft, the
//! signing simulator in threshold, the execution simulator in exec), so that a failure found
//! by any of them is replayed the same way:
//!
//! - every simulated test is a *campaign*: seeds `0..count`, with the count CI runs written
//!   in the test;
//! - `SIM_SEEDS=N` runs N seeds instead in every campaign the command selects (a longer
//!   campaign: `SIM_SEEDS=5000 cargo test --release -p bft --test sim -- actor_equivocator`);
//! - `SIM_SEED=S` runs seed S alone in every campaign the command selects (a replay);
//! - a failing seed is reported with the line that replays it:
//!   `reproduce: SIM_SEED=S cargo test -p CRATE --test TARGET -- TEST --exact --nocapture`.
//!
//! Beside it, [`Noise`]: the one seeded generator of garbage the fuzz-like tests feed to
//! parsers and listeners (random datagrams, random bytes), so that such a test replays exactly.
//!
//! Nothing else is shared on purpose: each simulator keeps its own world (network, clocks,
//! faults), since what is simulated differs; the seed is the whole input.
#![forbid(unsafe_code)]

use std::fmt;

/// The variable that sets how many seeds a campaign runs.
pub const SEEDS_VAR: &str = "SIM_SEEDS";
/// The variable that replays one seed.
pub const SEED_VAR: &str = "SIM_SEED";

/// One campaign: the test it runs in and how many seeds CI gives it.
#[derive(Clone, Debug)]
pub struct Campaign {
    krate: &'static str,
    target: &'static str,
    test: String,
    ci_count: u64,
}

impl Campaign {
    /// The campaign of the running test (libtest names each test's thread after the test),
    /// in `cargo test -p krate --test target`, with `ci_count` seeds unless overridden.
    pub fn here(krate: &'static str, target: &'static str, ci_count: u64) -> Campaign {
        let test = std::thread::current().name().filter(|n| *n != "main").unwrap_or("").to_string();
        Campaign { krate, target, test, ci_count }
    }

    /// The same campaign with another CI count (a larger cluster runs a fraction of the seeds).
    pub fn with_count(&self, ci_count: u64) -> Campaign {
        Campaign { ci_count, ..self.clone() }
    }

    /// How many seeds run: `SIM_SEEDS`, else the CI count.
    pub fn count(&self) -> u64 {
        env_u64(SEEDS_VAR).unwrap_or(self.ci_count)
    }

    /// The seeds to run: `SIM_SEED` alone, else `0..count()`.
    pub fn seeds(&self) -> Vec<u64> {
        match env_u64(SEED_VAR) {
            Some(seed) => vec![seed],
            None => (0..self.count()).collect(),
        }
    }

    /// The seeds of [`Campaign::seeds`] scaled down by `divisor` (at least one): what a larger
    /// cluster size runs beside the smallest. A replay runs its seed whatever the divisor.
    pub fn seeds_divided(&self, divisor: u64) -> Vec<u64> {
        match env_u64(SEED_VAR) {
            Some(seed) => vec![seed],
            None => (0..(self.count() / divisor.max(1)).max(1)).collect(),
        }
    }

    /// The line that replays `seed`.
    pub fn reproduce(&self, seed: u64) -> Reproduce<'_> {
        Reproduce { campaign: self, seed }
    }

    /// Runs `check` on every seed on `threads` threads (each stops after five failures) and
    /// panics listing every failure with its replay line.
    pub fn run(&self, threads: u64, check: impl Fn(u64) -> Result<(), String> + Sync) {
        let seeds = self.seeds();
        let threads = threads.max(1);
        let failures: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|thread| {
                    let (seeds, check) = (&seeds, &check);
                    scope.spawn(move || {
                        let mut failures = Vec::new();
                        for &seed in seeds.iter().skip(thread as usize).step_by(threads as usize) {
                            if let Err(report) = check(seed) {
                                let report = format!("seed {seed}: {report}\n  {}", self.reproduce(seed));
                                eprintln!("{report}");
                                failures.push(report);
                                if failures.len() >= 5 {
                                    break;
                                }
                            }
                        }
                        failures
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().expect("simulation thread panicked")).collect()
        });
        assert!(failures.is_empty(), "{} of {} seeds failed:\n{}", failures.len(), seeds.len(), failures.join("\n"));
    }
}

/// The replay line of one seed, as [`Campaign::reproduce`] formats it.
#[derive(Debug)]
pub struct Reproduce<'a> {
    campaign: &'a Campaign,
    seed: u64,
}

impl fmt::Display for Reproduce<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.campaign;
        write!(f, "reproduce: {SEED_VAR}={} cargo test -p {} --test {} -- {} --exact --nocapture", self.seed, c.krate, c.target, c.test)
    }
}

/// A seeded stream of noise for tests (xorshift64): the same seed gives the same bytes on every
/// machine. Not for anything secret.
#[derive(Clone, Debug)]
pub struct Noise(u64);

impl Noise {
    /// The stream of `seed` (0 is mapped to a fixed non-zero state: xorshift has no zero state).
    pub fn new(seed: u64) -> Noise {
        Noise(if seed == 0 { 0x9e37_79b9_7f4a_7c15 } else { seed })
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..bound` (`bound` > 0; the slight bias of a modulus is harmless here).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }

    /// `len` bytes of noise.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// A variable's value as a number; a set but unreadable value is a mistake worth stopping for.
fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|_| panic!("{name}={value:?} is not a number")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_campaign_knows_its_test_and_prints_a_replay_line_for_it() {
        let c = Campaign::here("bft", "sim", 7);
        let line = c.reproduce(42).to_string();
        assert_eq!(
            line,
            "reproduce: SIM_SEED=42 cargo test -p bft --test sim -- tests::a_campaign_knows_its_test_and_prints_a_replay_line_for_it --exact --nocapture"
        );
    }

    // The variables are read per call; these tests leave them unset (a run that sets them
    // would see its own values, which is the point of them).
    #[test]
    fn without_variables_a_campaign_runs_its_ci_count_from_zero() {
        if std::env::var_os(SEEDS_VAR).is_some() || std::env::var_os(SEED_VAR).is_some() {
            return;
        }
        let c = Campaign::here("threshold", "signing_sim", 5);
        assert_eq!(c.seeds(), vec![0, 1, 2, 3, 4]);
        assert_eq!(c.seeds_divided(3), vec![0]);
        assert_eq!(c.with_count(9).seeds_divided(3), vec![0, 1, 2]);
    }

    #[test]
    fn noise_replays_from_its_seed_and_differs_between_seeds() {
        let (mut a, mut b, mut c) = (Noise::new(7), Noise::new(7), Noise::new(8));
        let first = a.bytes(64);
        assert_eq!(first, b.bytes(64));
        assert_ne!(first, c.bytes(64));
        assert!(first.iter().any(|&x| x != first[0]), "noise is not constant");
        assert!((0..1000).all(|_| a.below(10) < 10));
        assert_ne!(Noise::new(0).next_u64(), 0, "seed 0 still makes noise");
    }

    #[test]
    fn run_reports_every_failing_seed_with_its_replay_line() {
        if std::env::var_os(SEEDS_VAR).is_some() || std::env::var_os(SEED_VAR).is_some() {
            return;
        }
        let c = Campaign::here("exec", "exec_core_sim", 10);
        let outcome = std::panic::catch_unwind(|| c.run(2, |seed| if seed % 4 == 1 { Err(format!("odd {seed}")) } else { Ok(()) }));
        let message = *outcome.expect_err("seeds 1, 5 and 9 fail").downcast::<String>().expect("a formatted panic");
        assert!(message.starts_with("3 of 10 seeds failed"), "{message}");
        for seed in [1, 5, 9] {
            assert!(message.contains(&format!("seed {seed}: odd {seed}")), "{message}");
            assert!(message.contains(&format!("SIM_SEED={seed} cargo test -p exec --test exec_core_sim")), "{message}");
        }
    }
}
