//! Deterministic Byzantine simulator for the PBFT core. Each seed: a safety phase with network
//! faults, crashes and Byzantine nodes, then a liveness phase after stabilisation. Invariants:
//! honest replicas agree on every seq, deliver every request submitted to an honest replica
//! once, with strictly increasing agreed times, and never blame an honest replica.
//!
//! Seeds follow the workspace's convention (crates/testkit): every test below is a campaign;
//! `SIM_SEEDS=N` runs N seeds in the campaigns a command selects (a larger cluster size runs
//! the fraction its test says), `SIM_SEED=S` replays seed S, and a failure prints the line that
//! replays it.
//! Soak: `SIM_SEEDS=100000 cargo test --release -p bft --test sim -- soak --ignored --nocapture`.

mod byzantine;
mod cluster;
mod scenarios;

use byzantine::Behaviour;
use cluster::{Cluster, Failure, Reboots};

const SAFETY_US: u64 = 1_500_000;
const LIVENESS_US: u64 = 60_000_000;

fn run_seed(n: u16, seed: u64, forced: Option<Behaviour>) -> Result<cluster::Stats, String> {
    let mut cluster = Cluster::with_behaviour(n, seed, forced);
    let description = cluster.describe();
    cluster.run(SAFETY_US, LIVENESS_US).map_err(|failure| {
        let kind = match &failure {
            Failure::Safety(_) => "SAFETY",
            Failure::Liveness(_) => "LIVENESS",
        };
        format!("n={n} {kind} failure: {failure:?}\n  {description}")
    })
}

/// The running test's campaign, with `ci_count` seeds unless `SIM_SEEDS` says otherwise.
fn campaign(ci_count: u64) -> testkit::Campaign {
    testkit::Campaign::here("bft", "sim", ci_count)
}

/// Runs `seeds` at cluster size `n` on two threads; panics listing every failing seed.
fn run_many(n: u16, campaign: &testkit::Campaign, seeds: Vec<u64>) {
    run_many_with(n, campaign, seeds, None);
}

/// Like [`run_many`] with exactly f replicas behaving as `forced`.
fn run_many_with(n: u16, campaign: &testkit::Campaign, seeds: Vec<u64>, forced: Option<Behaviour>) {
    campaign.run_seeds(seeds, 2, |seed| run_seed(n, seed, forced).map(|_| ()));
}

/// Seeds per cluster size for each named actor: 100 at n = 4 (`SIM_SEEDS` overrides it), a
/// third of it at n = 7.
fn run_actor(behaviour: Behaviour) {
    let c = campaign(100);
    run_many_with(4, &c, c.seeds(), Some(behaviour));
    run_many_with(7, &c, c.seeds_divided(3), Some(behaviour));
}

#[test]
fn actor_poisoner() {
    run_actor(Behaviour::Poisoner);
}

#[test]
fn actor_forged_relays() {
    run_actor(Behaviour::ForgedRelays);
}

#[test]
fn actor_flooder() {
    run_actor(Behaviour::Flooder);
}

#[test]
fn actor_status_spammer() {
    run_actor(Behaviour::StatusSpammer);
}

#[test]
fn actor_silent_primary() {
    run_actor(Behaviour::Nuller);
}

#[test]
fn actor_equivocator() {
    run_actor(Behaviour::Equivocator);
}

#[test]
fn actor_conflicter() {
    run_actor(Behaviour::Conflicter);
}

#[test]
fn actor_impersonator() {
    run_actor(Behaviour::Impersonator);
}

#[test]
fn actor_replayer() {
    run_actor(Behaviour::Replayer);
}

/// The generated adversary: a primary whose batches are drawn from a grammar of hostile
/// batches (see `byzantine::hostile`). `SIM_SEEDS=N` runs a longer campaign (n = 4, and a
/// third of it for n = 7).
#[test]
fn actor_hostile_primary() {
    run_actor(Behaviour::HostilePrimary);
}

/// A primary that fills every batch with its own requests (see `byzantine::budget_hog`):
/// backups hold it to the per-origin budget of the log. `SIM_SEEDS=N` runs a longer campaign
/// (n = 4, and a third of it for n = 7).
#[test]
fn actor_budget_hog() {
    run_actor(Behaviour::BudgetHog);
}

#[test]
fn actor_twins() {
    run_actor(Behaviour::Twins);
}

/// Every behaviour in [`byzantine::ALL`] has its own `actor_*` test above.
#[test]
fn every_actor_has_a_test() {
    let source = include_str!("main.rs");
    for behaviour in byzantine::ALL {
        let call = format!("run_actor(Behaviour::{behaviour:?})");
        assert!(source.contains(&call), "no actor test runs {behaviour:?}");
    }
}

#[test]
fn seeds_n4() {
    let c = campaign(1500);
    run_many(4, &c, c.seeds());
}

#[test]
fn seeds_n7() {
    let c = campaign(500);
    run_many(7, &c, c.seeds());
}

#[test]
fn seeds_n10() {
    let c = campaign(250);
    run_many(10, &c, c.seeds());
}

/// Runs seeds in which every crash restarts the replica from its persisted state.
fn run_reboots(n: u16, campaign: &testkit::Campaign, seeds: Vec<u64>, reboots: Reboots) {
    let count = seeds.len() as u64;
    let failures: Vec<String> = seeds
        .into_iter()
        .filter_map(|seed| {
            let mut cluster = Cluster::with_reboots(n, seed, reboots);
            let description = cluster.describe();
            match cluster.run(SAFETY_US, LIVENESS_US) {
                Ok(stats) if stats.reboots == 0 => Some(format!("seed {seed}: no reboot happened ({description})")),
                Ok(_) => None,
                Err(failure) => Some(format!("{failure:?}\n  {description}\n  {}", campaign.reproduce(seed))),
            }
        })
        .collect();
    let tolerated = if reboots == Reboots::Single { count / 2 } else { count / 5 };
    // Known limit: after a power cut, a replica that was further behind than the batches its
    // peers persisted below their delivery base needs a state transfer (not in this crate);
    // such seeds are counted, not failed, as long as every check on the way held.
    let needed_transfer = |f: &&String| f.contains("Liveness") && f.contains("state transfer needed true");
    let needs_transfer = failures.iter().filter(needed_transfer).count();
    eprintln!("n={n} {reboots:?}: {needs_transfer} of {count} seeds ended needing a state transfer");
    assert!(needs_transfer as u64 <= count / 10, "{needs_transfer} of {count} seeds needed a state transfer");
    let real: Vec<&String> = failures.iter().filter(|f| !f.contains("no reboot happened") && !needed_transfer(f)).collect();
    assert!(real.is_empty(), "{} of {count} reboot seeds failed for n={n}:\n{}", real.len(), real.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"));
    // Crashes are drawn at random: most seeds must have exercised a restart.
    let idle = failures.iter().filter(|f| f.contains("no reboot happened")).count() as u64;
    assert!(idle <= tolerated, "only {} of {count} seeds rebooted a replica", count - idle);
}

#[test]
fn reboot_single_n4() {
    let c = campaign(300);
    run_reboots(4, &c, c.seeds(), Reboots::Single);
}

#[test]
fn reboot_all_n4() {
    let c = campaign(300);
    run_reboots(4, &c, c.seeds(), Reboots::All);
}

#[test]
fn reboot_all_n7() {
    let c = campaign(300);
    run_reboots(7, &c, c.seeds_divided(3), Reboots::All);
}

#[test]
fn same_seed_same_trace() {
    for (n, seed) in [(4, 11), (7, 12), (10, 13)] {
        let mut first = Cluster::new(n, seed);
        let mut second = Cluster::new(n, seed);
        let a = first.run(SAFETY_US, LIVENESS_US).map_err(|f| format!("{f:?}"));
        let b = second.run(SAFETY_US, LIVENESS_US).map_err(|f| format!("{f:?}"));
        assert_eq!(a.is_ok(), b.is_ok());
        assert_ne!(first.trace_hash(), 0xcbf2_9ce4_8422_2325, "nothing was traced");
        assert_eq!(first.trace_hash(), second.trace_hash(), "seed {seed} n={n} is not deterministic");
    }
    // Different seeds take different paths.
    let mut one = Cluster::new(4, 1);
    let mut two = Cluster::new(4, 2);
    let _ = one.run(SAFETY_US, LIVENESS_US);
    let _ = two.run(SAFETY_US, LIVENESS_US);
    assert_ne!(one.trace_hash(), two.trace_hash());
}

/// Prints how many views the liveness phase took, per actor (to choose the asserted bound).
#[test]
#[ignore = "measurement; prints a histogram"]
fn view_histogram() {
    let count = campaign(100).count();
    for n in [4u16, 7] {
        for behaviour in byzantine::ALL {
            let mut histogram = std::collections::BTreeMap::new();
            for seed in 0..count {
                let mut cluster = Cluster::with_behaviour(n, seed, Some(behaviour));
                let views = match cluster.run(SAFETY_US, LIVENESS_US) {
                    Ok(stats) => stats.views_without_delivery,
                    Err(_) => u64::MAX,
                };
                *histogram.entry(views).or_insert(0u32) += 1;
            }
            println!("n={n} {behaviour:?}: {histogram:?}");
        }
    }
}

/// Prints the highest accounted bytes an honest replica held under the flooder, against the
/// documented bound (for docs/BENCHMARKS.md).
#[test]
#[ignore = "measurement; prints figures"]
fn flooder_memory() {
    let count = campaign(100).count();
    for n in [4u16, 7] {
        let mut peak = 0;
        for seed in 0..count {
            let mut cluster = Cluster::with_behaviour(n, seed, Some(Behaviour::Flooder));
            let stats = cluster.run(SAFETY_US, LIVENESS_US).expect("flooder seed passes");
            peak = peak.max(stats.peak_held_bytes);
        }
        let sim_bound = bft::Replica::new(cluster::sim_config(n, 0), bft::Time(1)).unwrap().held_bytes_bound();
        let default_bound = bft::Replica::new(bft::Config::new(n, 0), bft::Time(1)).unwrap().held_bytes_bound();
        println!("n={n}: peak held {peak} bytes over {count} flooder seeds; bound {sim_bound} (simulator config), {default_bound} (default config)");
    }
}

#[test]
#[ignore = "long soak; SIM_SEEDS sets its length"]
fn soak() {
    let c = campaign(100_000);
    for n in [4, 7, 10] {
        run_many(n, &c, c.seeds());
    }
}

/// Prints one line per seed (cluster size, actor or reboots, seed, outcome, event-trace hash)
/// over a spread of random, actor and reboot seeds: run it before and after a refactoring of
/// the core that must not change behaviour, and diff the two outputs (the hash covers every
/// message and timer firing, so equal hashes mean the same run).
#[test]
#[ignore = "measurement; prints trace hashes"]
fn trace_hashes() {
    let count = campaign(100).count();
    let line = |label: String, seed: u64, cluster: &mut Cluster| {
        let outcome = match cluster.run(SAFETY_US, LIVENESS_US) {
            Ok(_) => "ok".to_string(),
            Err(failure) => format!("{failure:?}").chars().take(60).collect(),
        };
        println!("{label} seed={seed} {outcome} trace={:016x}", cluster.trace_hash());
    };
    for n in [4u16, 7, 10] {
        for seed in 0..count {
            line(format!("n={n}"), seed, &mut Cluster::new(n, seed));
        }
    }
    for behaviour in byzantine::ALL {
        for seed in 0..count / 4 {
            line(format!("n=4 {behaviour:?}"), seed, &mut Cluster::with_behaviour(4, seed, Some(behaviour)));
        }
    }
    for reboots in [Reboots::Single, Reboots::All] {
        for seed in 0..count / 2 {
            line(format!("n=4 {reboots:?}"), seed, &mut Cluster::with_reboots(4, seed, reboots));
        }
    }
}
