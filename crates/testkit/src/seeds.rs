//! The seed convention (see the crate's documentation): campaigns, `SIM_SEEDS`, `SIM_SEED`
//! and replay lines.

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
        self.run_seeds(self.seeds(), threads, check);
    }

    /// [`Campaign::run`] over the given seeds ([`Campaign::seeds_divided`], say).
    pub fn run_seeds(&self, seeds: Vec<u64>, threads: u64, check: impl Fn(u64) -> Result<(), String> + Sync) {
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
            "reproduce: SIM_SEED=42 cargo test -p bft --test sim -- seeds::tests::a_campaign_knows_its_test_and_prints_a_replay_line_for_it --exact --nocapture"
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
