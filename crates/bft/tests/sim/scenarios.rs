//! Scripted runs of faults the nemesis campaign and the WAN benchmark found, each seeded and
//! checked against a bound of simulated time (the random mix draws such faults too, see
//! `Cluster::with_behaviour`).

use crate::cluster::Cluster;

/// Two hours, in microseconds: the campaign's `--faults skew`.
const TWO_HOURS_US: u64 = 2 * 3_600 * 1_000_000;
/// The simulator's push rate to a laggard: `PUSH_BURST` (64) batches per status report, but a
/// laggard takes pushes only within a window (32 here) of what it delivered, one report per
/// retransmit interval (100 ms): some 320 batches a second (400 measured).
const PUSH_RATE: u64 = 320;

fn delivered(cluster: &Cluster, ids: &[usize]) -> Vec<u64> {
    ids.iter().map(|id| cluster.status(*id).last_delivered).collect()
}

/// A backup killed, down for a second under a load that orders about three times as fast as
/// the peers push to a laggard, started again with its clock two hours ahead: it refuses every proposal's
/// time, so it vouches for nothing, but it must deliver every batch the others delivered
/// within a bounded time (it keeps the bodies it refused and delivers them on 2f+1 commits).
/// Before that it learned batches only from pushes and fell further behind (seed 1: 2147
/// delivered at the end against the others' 5656; every seed here failed, with `PUSH_BURST`
/// at 64 as now or at 16).
fn skewed_restart(seed: u64) -> Result<(), String> {
    let mut cluster = Cluster::scripted(4, seed);
    cluster.set_load(3);
    let fail = |failure| format!("seed {seed}: {failure:?}");
    cluster.run_until(500_000).map_err(fail)?;
    cluster.stop(3);
    let stopped = delivered(&cluster, &[0])[0];
    cluster.run_until(1_500_000).map_err(fail)?;
    cluster.start(3, TWO_HOURS_US);
    let behind = delivered(&cluster, &[0])[0] - cluster.status(3).last_delivered;
    cluster.run_until(5_500_000).map_err(fail)?;
    let ordered = delivered(&cluster, &[0])[0] - stopped;
    // Faster than the pushes (three times here), or the test shows nothing.
    if ordered * 1_000_000 < 2 * PUSH_RATE * 5_000_000 {
        return Err(format!("seed {seed}: the load ordered only {ordered} batches in 5 s"));
    }
    // The load stops; one retransmit interval lets the batches in flight finish (pushes
    // could bring one burst in that time, far fewer than a laggard misses).
    cluster.set_load(0);
    cluster.run_until(5_600_000).map_err(fail)?;
    let all = delivered(&cluster, &[0, 1, 2, 3]);
    eprintln!("seed {seed}: replica 3 restarted {behind} batches behind; {ordered} batches ordered in 5 s; delivered {all:?}");
    if all[3] < all[0].max(all[1]).max(all[2]) {
        return Err(format!("seed {seed}: the skewed replica did not catch up within 4 s of its restart: delivered {all:?}"));
    }
    cluster.check_all_delivered().map_err(fail)?;
    let (held, bound) = cluster.held_bytes(3);
    if held > bound {
        return Err(format!("seed {seed}: the skewed replica holds {held} bytes, above its bound {bound}"));
    }
    Ok(())
}

#[test]
fn a_replica_restarted_with_its_clock_hours_ahead_catches_up_under_load() {
    let failures: Vec<String> = (1..=4).filter_map(|seed| skewed_restart(seed).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Replica 3's links are slower than its request timeout at start-up (WAN delays while the
/// mesh is dialled): it suspects the primary before the others even see its request and
/// starts a view change alone. Once its links are back to normal it must be in the view the
/// others order in (or they all moved together) and its clients' requests must be served.
/// Before the fix 8 of these 24 seeds ended with a replica changing views alone for good
/// (2, 7, 8, 10, 11, 15, 18, 19; seed 2: replica 3 in view 1 changing, the others ordering in
/// view 0; seed 10: replica 1, which timed out on replica 3's late requests).
fn lone_view_change(seed: u64) -> Result<(), String> {
    let mut cluster = Cluster::scripted(4, seed);
    let fail = |failure| format!("seed {seed}: {failure:?}");
    for peer in 0..3 {
        cluster.set_link_delay(3, peer, 400_000);
    }
    for id in 0..4 {
        cluster.submit(id);
    }
    cluster.run_until(1_500_000).map_err(fail)?;
    let early = cluster.status(3);
    for peer in 0..3 {
        cluster.set_link_delay(3, peer, 1_000);
    }
    cluster.set_load(1);
    cluster.run_until(4_000_000).map_err(fail)?;
    cluster.set_load(0);
    cluster.run_until(5_000_000).map_err(fail)?;
    let statuses: Vec<bft::Status> = (0..4).map(|id| cluster.status(id)).collect();
    let views: Vec<(u64, bool)> = statuses.iter().map(|s| (s.view, s.view_changing)).collect();
    eprintln!("seed {seed}: at 1.5 s replica 3 in view {} changing {}; at the end (view, changing) {views:?}", early.view, early.view_changing);
    // Every replica, not only replica 3: the requests it relayed late make others time out
    // alone too.
    if views.iter().any(|(view, changing)| *changing || *view != views[0].0) {
        return Err(format!("seed {seed}: the replicas are not all ordering in one view: (view, changing) {views:?}"));
    }
    cluster.check_all_delivered().map_err(fail)?;
    let (count, longest) = cluster.served(3, 3_000_000);
    match longest {
        Some(longest) if count > 0 && longest <= 500_000 => Ok(()),
        _ => Err(format!("seed {seed}: replica 3's {count} requests from 3 s on: longest wait {longest:?} us (bound 500 ms)")),
    }
}

#[test]
fn a_replica_alone_in_a_view_change_at_start_up_rejoins_and_serves_its_clients() {
    let failures: Vec<String> = (1..=24).filter_map(|seed| lone_view_change(seed).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Prints a skewed replica's catch-up after a restart, one line per 100 ms: delivered seq of
/// each replica and its held bytes (`BFT_LOAD` requests per 2 ms tick, `BFT_DOWN_US` down,
/// `BFT_SKEW_US` its clock ahead).
#[test]
#[ignore = "measurement; prints a timeline"]
fn skewed_catch_up_timeline() {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (load, down, skew) = (env("BFT_LOAD", 1) as usize, env("BFT_DOWN_US", 1_000_000), env("BFT_SKEW_US", TWO_HOURS_US));
    let mut cluster = Cluster::scripted(4, 1);
    cluster.set_load(load);
    cluster.run_until(500_000).unwrap();
    cluster.stop(3);
    cluster.run_until(500_000 + down).unwrap();
    cluster.start(3, skew);
    let mut t = 500_000 + down;
    for _ in 0..60 {
        t += 100_000;
        cluster.run_until(t).unwrap();
        let (held, bound) = cluster.held_bytes(3);
        eprintln!("t={t} delivered {:?} held {held} bound {bound}", delivered(&cluster, &[0, 1, 2, 3]));
    }
}

/// One-way delays (ms) of the WAN benchmark's default topology (scripts/bench/topology.toml)
/// between its seven replicas: Zurich (0 and 1), New York, San Jose, Austin, London, Tokyo.
const TABLE2_ONE_WAY_MS: [[f64; 7]; 7] = [
    [0.0, 0.5, 45.0, 75.0, 60.0, 10.0, 120.0],
    [0.5, 0.0, 45.0, 75.0, 60.0, 10.0, 120.0],
    [45.0, 45.0, 0.0, 35.0, 25.0, 35.0, 85.0],
    [75.0, 75.0, 35.0, 0.0, 20.0, 70.0, 55.0],
    [60.0, 60.0, 25.0, 20.0, 0.0, 55.0, 70.0],
    [10.0, 10.0, 35.0, 70.0, 55.0, 0.0, 115.0],
    [120.0, 120.0, 85.0, 55.0, 70.0, 115.0, 0.0],
];

/// The (7,2) WAN benchmark's ordering: replica 0 is the gateway every client request goes to
/// and the primary of view 0; its clients send one request after the other (nsupdate's SOA
/// read, then the update), and every replica orders a request of its own now and then (the
/// wrapper's re-sign timer, every 10 s). Returns the views each replica went through and when
/// (simulated ms), and the request timeouts of replicas 1 and 5 just before `probe_ms`.
fn table2_wan_run(seed: u64, floor_ms: u64, end_ms: u64) -> (Vec<(u64, usize, u64)>, Vec<u64>) {
    let mut cluster = Cluster::scripted_with(7, seed, |config| {
        // The deployment's settings (wrapper `OrderingSection`), but the floor.
        config.min_request_timeout = std::time::Duration::from_millis(floor_ms);
        config.request_timeout = std::time::Duration::from_secs(2);
        config.view_change_timeout = std::time::Duration::from_secs(2);
        config.retransmit_interval = std::time::Duration::from_millis(500);
        config.max_clock_skew = std::time::Duration::from_secs(30);
    });
    cluster.exact_delays();
    for (a, row) in TABLE2_ONE_WAY_MS.iter().enumerate() {
        for (b, ms) in row.iter().enumerate().filter(|(b, _)| *b > a) {
            cluster.set_link_delay(a, b, (ms * 1000.0) as u64);
        }
    }
    let mut changes = Vec::new();
    let mut views = [0u64; 7];
    let mut timeouts = Vec::new();
    let step_ms = 5;
    let mut next_gateway = 1_000;
    for ms in (step_ms..=end_ms).step_by(step_ms as usize) {
        // Every replica's own request every 10 s, replica r at r * 100 ms into each period.
        if ms >= 2_000 && (ms - 2_000) % 10_000 < 700 && (ms - 2_000) % 100 == 0 && (ms - 2_000) % 10_000 >= 100 {
            cluster.submit(usize::try_from(((ms - 2_000) % 10_000) / 100).unwrap_or(0));
        }
        if ms >= next_gateway && cluster.outstanding(0) == 0 {
            cluster.submit(0);
            // The client's round trip and nsupdate's own time before its next request.
            next_gateway = ms + 20;
        }
        cluster.run_until(ms * 1000).unwrap_or_else(|failure| panic!("seed {seed}: {failure:?}"));
        for (id, view) in views.iter_mut().enumerate() {
            let status = cluster.status(id);
            if status.view != *view {
                *view = status.view;
                changes.push((ms, id, status.view));
            }
        }
        if ms % 10_000 == 2_000 {
            timeouts.extend([1, 5].map(|id| cluster.request_timeout(id).as_millis() as u64));
        }
    }
    (changes, timeouts)
}

#[test]
#[ignore = "measurement; prints the view changes of the (7,2) WAN ordering"]
fn table2_wan_timeline() {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (changes, timeouts) = table2_wan_run(env("BFT_SEED", 1), env("BFT_FLOOR_MS", 250), env("BFT_END_MS", 40_000));
    eprintln!("view changes (ms, replica, view): {changes:?}\nrequest timeouts of replicas 1 and 5 at each round (ms): {timeouts:?}");
}

/// Issue 30's view change at 09:15:34 of the (7,2) WAN run, replayed: another origin's request
/// (a re-sign) waits for 2f holders and then the ordering, 230–250 ms at most replicas on this
/// topology, while the gateway's own requests (which backups never await) took the observed
/// latency back to the floor between two rounds of re-signs: f+1 backups suspected a working
/// primary. The floor is 240 ms, below those waits as the run's 250 ms was below them plus its
/// local costs (the simulator has none). A replica without any observation yet may still time
/// out alone in the first round (the run's start-up lone view changes; it rejoins); after that
/// the cluster must stay in view 0. Before the fix every seed changed views at the second round
/// (12.35 s: replicas 5, 2, 4, 3, then the rest, as in the run).
fn table2_wan_stays_in_view(seed: u64) -> Result<(), String> {
    let (changes, timeouts) = table2_wan_run(seed, 240, 32_000);
    let late: Vec<_> = changes.iter().filter(|(ms, _, _)| *ms >= 5_000).collect();
    if late.is_empty() {
        Ok(())
    } else {
        Err(format!("seed {seed}: view changes after start-up (ms, replica, view) {late:?}; request timeouts of replicas 1 and 5 per round {timeouts:?}"))
    }
}

#[test]
fn backups_keep_the_latency_of_other_origins_requests_between_them() {
    let failures: Vec<String> = (1..=4).filter_map(|seed| table2_wan_stays_in_view(seed).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
