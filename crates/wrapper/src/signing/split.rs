//! Where the time of one signature goes (the paper's Table 3): this replica's share
//! computation, waiting for its peers (their shares, or their finished signature), combining
//! and verifying, and the rest (waiting for a worker thread, the loop, message handling).
//!
//! The service records when each of a session's jobs ran on a worker; when the signature is
//! done it splits the span from named's request to the signature among the four, clipping
//! every job to that span (a peer may have opened the session, and its share job run, before
//! this replica's named asked). The four add up to the whole span, except when a combination
//! ran beside this replica's own share computation (jobs run on a pool of workers): then the
//! two overlap and nothing is left for waiting or the rest.

use std::time::{Duration, Instant};

/// The jobs of one signing session as they ran on the workers.
#[derive(Debug, Default, Clone)]
pub struct JobTimes {
    /// This replica's share computations (EC: its protocol rounds), each (start, end).
    pub share: Vec<(Instant, Instant)>,
    /// Combinations of shares (with the proof or signature checks the protocol makes).
    pub combine: Vec<(Instant, Instant)>,
    /// When the session was last touched, for dropping records nobody waits for.
    pub last: Option<Instant>,
}

/// One signature's time, split; the parts sum to the span from request to signature.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub share: Duration,
    pub wait: Duration,
    pub combine: Duration,
    pub other: Duration,
}

fn clipped(spans: &[(Instant, Instant)], from: Instant, to: Instant) -> Duration {
    spans.iter().map(|&(a, b)| b.min(to).saturating_duration_since(a.max(from))).sum()
}

impl JobTimes {
    pub fn share_ran(&mut self, start: Instant, end: Instant) {
        self.share.push((start, end));
        self.last = Some(end);
    }

    pub fn combine_ran(&mut self, start: Instant, end: Instant) {
        self.combine.push((start, end));
        self.last = Some(end);
    }

    /// The split of a signature requested at `asked` and finished at `done`. Waiting for
    /// peers runs from the end of this replica's own share (or the request, if it made none)
    /// to the start of the last combination (or the signature, when a peer sent it whole),
    /// less the combinations tried in between.
    pub fn split(&self, asked: Instant, done: Instant) -> Split {
        let total = done.saturating_duration_since(asked);
        let share = clipped(&self.share, asked, done);
        let combine = clipped(&self.combine, asked, done);
        let own_done = self.share.iter().map(|&(_, end)| end.min(done)).max().map_or(asked, |end| end.max(asked));
        let last_combine = self.combine.iter().map(|&(start, _)| start.clamp(asked, done)).max().unwrap_or(done);
        let earlier_combines = clipped(&self.combine, own_done, last_combine);
        let wait = last_combine.saturating_duration_since(own_done).saturating_sub(earlier_combines);
        // Overlaps (a combination begun while the own share still ran) would count twice:
        // whatever exceeds the whole comes off the wait.
        let wait = wait.min(total.saturating_sub(share + combine));
        let other = total.saturating_sub(share + combine + wait);
        Split { share, wait, combine, other }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_signature_splits_into_its_share_the_wait_the_combination_and_the_rest() {
        let t = Instant::now();
        let mut jobs = JobTimes::default();
        // Asked at 0; a worker free at 2; share 2..12; peers' shares in by 40; combined 41..45; done 46.
        jobs.share_ran(t + ms(2), t + ms(12));
        jobs.combine_ran(t + ms(41), t + ms(45));
        let s = jobs.split(t, t + ms(46));
        assert_eq!(s, Split { share: ms(10), wait: ms(29), combine: ms(4), other: ms(3) });
    }

    #[test]
    fn a_failed_combination_counts_as_combining_not_waiting() {
        let t = Instant::now();
        let mut jobs = JobTimes::default();
        jobs.share_ran(t, t + ms(10));
        jobs.combine_ran(t + ms(20), t + ms(25)); // OPT-TE with a bad share: no signature
        jobs.combine_ran(t + ms(50), t + ms(55));
        let s = jobs.split(t, t + ms(55));
        assert_eq!(s, Split { share: ms(10), wait: ms(35), combine: ms(10), other: ms(0) });
    }

    #[test]
    fn a_signature_a_peer_sent_whole_is_waiting_and_work_before_the_request_is_not_counted() {
        let t = Instant::now();
        let mut jobs = JobTimes::default();
        // A peer's request made this replica compute its share before its own named asked at 5.
        jobs.share_ran(t, t + ms(8));
        let s = jobs.split(t + ms(5), t + ms(30));
        assert_eq!(s, Split { share: ms(3), wait: ms(22), combine: ms(0), other: ms(0) });
        // No jobs at all (a shared signing another replica combined): all of it is waiting.
        let s = JobTimes::default().split(t, t + ms(7));
        assert_eq!(s, Split { wait: ms(7), ..Split::default() });
    }

    #[test]
    fn the_parts_never_exceed_the_whole() {
        let t = Instant::now();
        let mut jobs = JobTimes::default();
        // A combination of peers' shares begun while the own share still ran.
        jobs.share_ran(t, t + ms(20));
        jobs.combine_ran(t + ms(5), t + ms(15));
        let s = jobs.split(t, t + ms(20));
        assert_eq!(s, Split { share: ms(20), wait: ms(0), combine: ms(10), other: ms(0) });
    }
}
