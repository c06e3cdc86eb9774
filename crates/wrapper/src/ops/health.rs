//! Whether this replica makes progress, as it can see for itself: its gateway's own requests
//! are delivered, and its executor keeps up with what the ordering delivered. A replica that
//! answers reads and reports a current view can still be stalled (a corrupted primary refusing
//! every request of its origin, named stopped under the executor); `sdns cluster status`,
//! `/status` and the metrics then say so instead of `ok`.
//!
//! Local observations for the operator only: nothing here decides an outcome.

use std::time::{Duration, Instant};

/// How long this gateway's requests have waited without one of them being delivered.
#[derive(Clone, Copy, Debug, Default)]
pub struct OwnRequests {
    /// The first submission since the last delivery of one of this gateway's requests (or,
    /// with requests still waiting at that delivery, the delivery itself).
    since: Option<Instant>,
    /// The last time requests expired undelivered.
    last_expired: Option<Instant>,
}

impl OwnRequests {
    /// A request of this gateway submitted now.
    pub fn submitted(&mut self, now: Instant) {
        self.since.get_or_insert(now);
    }

    /// One of this gateway's requests was delivered; `waiting`: others still wait.
    pub fn delivered(&mut self, now: Instant, waiting: bool) {
        self.since = waiting.then_some(now);
    }

    /// Requests expired undelivered (the client gave up). The wait goes on: an expiry is
    /// no delivery.
    pub fn expired(&mut self, now: Instant) {
        self.last_expired = Some(now);
    }

    /// How long requests have gone undelivered, while that matters: some still wait, or
    /// some expired undelivered within `bound`. A gateway idle since its last requests gave up
    /// has nothing to report once `bound` has passed (the next one reports it at once if it
    /// is not delivered either).
    pub fn waiting(&self, now: Instant, still_waiting: bool, bound: Duration) -> Option<Duration> {
        let since = self.since?;
        let recent_expiry = self.last_expired.is_some_and(|e| now.saturating_duration_since(e) < bound);
        (still_waiting || recent_expiry).then(|| now.saturating_duration_since(since))
    }
}

/// How long the executor has not moved while the ordering had delivered past it.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecutorLag {
    executed: u64,
    since: Option<Instant>,
}

impl ExecutorLag {
    /// The executed and delivered positions seen at `now`; returns how long the executor has
    /// been behind without advancing.
    pub fn observe(&mut self, executed: u64, delivered: u64, now: Instant) -> Option<Duration> {
        if executed >= delivered {
            self.since = None;
        } else if self.since.is_none() || executed != self.executed {
            self.since = Some(now);
        }
        self.executed = executed;
        self.since.map(|s| now.saturating_duration_since(s))
    }
}

/// What the health check knows at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// How long this gateway's requests have gone undelivered ([`OwnRequests::waiting`]).
    pub own_waiting: Option<Duration>,
    /// Requests the ordering refused at submit since the start.
    pub refused: u64,
    /// How long the executor has not moved while behind the log ([`ExecutorLag::observe`]).
    pub executor_behind: Option<Duration>,
    pub executed: u64,
    pub delivered: u64,
}

/// Why this replica is stalled, or `None` while it makes progress. Anything shorter than
/// `bound` is normal load (a view change, a whole-zone signing's install, a write waiting for
/// its signatures), so the bound is a few client request timeouts.
pub fn stalled(o: &Observed, bound: Duration) -> Option<String> {
    let mut why = Vec::new();
    if let Some(behind) = o.executor_behind.filter(|d| *d >= bound) {
        why.push(format!("executor behind the log (executed {}, delivered {}) for {} s", o.executed, o.delivered, behind.as_secs()));
    }
    if let Some(waiting) = o.own_waiting.filter(|d| *d >= bound) {
        let refused = if o.refused > 0 { format!(" ({} refused by the ordering since start)", o.refused) } else { String::new() };
        why.push(format!("own requests not delivered for {} s{refused}", waiting.as_secs()));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(30);

    fn at(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn own_requests_delivered_now_and_then_are_healthy() {
        let t0 = Instant::now();
        let mut own = OwnRequests::default();
        assert_eq!(own.waiting(t0, false, BOUND), None, "nothing submitted");
        // Steady load: a delivery every 20 s with requests always waiting never reaches the bound.
        for s in (0..200).step_by(20) {
            own.submitted(at(t0, s));
            own.delivered(at(t0, s + 20), true);
            let waiting = own.waiting(at(t0, s + 29), true, BOUND).unwrap();
            assert!(waiting < BOUND, "{waiting:?}");
            assert_eq!(stalled(&Observed { own_waiting: Some(waiting), ..Default::default() }, BOUND), None);
        }
        own.delivered(at(t0, 300), false);
        assert_eq!(own.waiting(at(t0, 1000), false, BOUND), None, "all delivered");
    }

    #[test]
    fn own_requests_refused_for_longer_than_the_bound_are_stalled() {
        let t0 = Instant::now();
        let mut own = OwnRequests::default();
        // Each request waits its 15 s and expires; nothing is ever delivered.
        for s in (0..60).step_by(15) {
            own.submitted(at(t0, s));
            own.expired(at(t0, s + 15));
        }
        let waiting = own.waiting(at(t0, 61), false, BOUND);
        assert_eq!(waiting, Some(Duration::from_secs(61)), "expired requests count as undelivered");
        let why = stalled(&Observed { own_waiting: waiting, refused: 4, ..Default::default() }, BOUND).unwrap();
        assert_eq!(why, "own requests not delivered for 61 s (4 refused by the ordering since start)");
        // Idle for a bound after the last expiry: nothing to report; a new request not
        // delivered reports the whole wait again.
        assert_eq!(own.waiting(at(t0, 60 + 30), false, BOUND), None);
        own.submitted(at(t0, 100));
        assert_eq!(own.waiting(at(t0, 101), true, BOUND), Some(Duration::from_secs(101)));
        // One delivery and the replica is healthy again.
        own.delivered(at(t0, 102), false);
        assert_eq!(own.waiting(at(t0, 103), false, BOUND), None);
    }

    #[test]
    fn an_executor_that_does_not_move_behind_the_log_is_stalled() {
        let t0 = Instant::now();
        let mut lag = ExecutorLag::default();
        assert_eq!(lag.observe(10, 10, t0), None, "caught up");
        assert_eq!(lag.observe(10, 12, at(t0, 1)), Some(Duration::ZERO));
        // Advancing while behind (replaying the log) is progress: the clock starts again.
        assert_eq!(lag.observe(11, 40, at(t0, 20)), Some(Duration::ZERO));
        let behind = lag.observe(11, 45, at(t0, 50));
        assert_eq!(behind, Some(Duration::from_secs(30)));
        let o = Observed { executor_behind: behind, executed: 11, delivered: 45, ..Default::default() };
        assert_eq!(stalled(&o, BOUND).as_deref(), Some("executor behind the log (executed 11, delivered 45) for 30 s"));
        assert_eq!(stalled(&o, BOUND * 2), None, "under the bound");
        // Both at once are both said.
        let both = Observed { own_waiting: Some(BOUND), ..o };
        assert!(stalled(&both, BOUND).unwrap().contains("; own requests not delivered for 30 s"));
        assert_eq!(lag.observe(45, 45, at(t0, 51)), None, "caught up again");
    }
}
