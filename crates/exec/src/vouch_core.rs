//! The decisions of vouched reads at a gateway, without IO: which reads a probe round
//! covers, when a read's own answer may go to its client, when that answer is taken again or
//! the read ordered after all, and how long the gateway waits for its peers ([`VouchClock`]).
//! The wrapper's `reads::vouched` drives it (its module doc says why the decisions are
//! linearizable; docs/DETERMINISM.md, "Vouched reads", at length).
//!
//! Events come in as calls, time as an argument (`now_us`: the driver's monotonic clock in
//! microseconds), decisions go out as [`Action`]s. The core reads no clock, holds no lock and
//! starts no task; [`VouchCore::poll_timeout`] says when [`VouchCore::handle_timeout`] is due.
//! It depends on std and [`crate::vouch`] only, and sits in the deterministic crate: the
//! compiler keeps tokio and the clock out of it.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use crate::vouch::{verdict, Barriers, Fault, ReadWire, Verdict};

/// Reads awaiting their peers at this gateway; beyond, reads are ordered directly.
pub const MAX_WAITING: usize = 4096;
/// Timed-out reads kept for their rounds' late barriers at most (see `VouchCore::late`);
/// beyond, the oldest is forgotten.
const MAX_LATE: usize = MAX_WAITING;
/// Reads one probe round covers at most; the listener's turn starts another beyond.
pub const MAX_ROUND_READS: usize = 256;
/// Vouched reads per learning window of the [`VouchClock`] (a window also closes after
/// [`WINDOW_PERIOD`] with fewer).
pub const WINDOW: usize = 256;
/// A learning window closes after this long whatever it holds; one in which nothing was
/// vouched moves the timeout halfway back to its floor.
pub const WINDOW_PERIOD: Duration = Duration::from_secs(1);
/// The timeout is [`MARGIN`] times this percentile of a window's waits.
const PERCENTILE: usize = 95;
const MARGIN: u64 = 4;

/// What the gateway is to do. `R` is the client's request, handed back in the end.
#[derive(Debug, PartialEq, Eq)]
pub enum Action<R> {
    /// Send probe round `round` to every peer (metrics: nothing).
    Probe { round: u64 },
    /// Take read `id`'s own answer again once executed up to `position` (from the read cache,
    /// else named; `VouchCore::request` has its question), and report it with
    /// [`VouchCore::own_answer`] within `wait` (or `None`). Metrics: taken again.
    Fetch { id: u64, position: u64, wait: Duration },
    /// Send the client this answer, the gateway's own. Metrics: vouched, and a read served.
    Answer { request: R, answer: Vec<u8> },
    /// Order the read after all. Metrics: fell back.
    Order { request: R },
    /// The vouch timeout changed (metrics: its gauge).
    Timeout(Duration),
}

/// How a core is set up.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Replicas in the cluster, and faults tolerated.
    pub n: u16,
    pub t: u16,
    /// The vouch timeout's floor and cap (`cluster.vouch_timeout_ms..=vouch_timeout_max_ms`).
    pub floor: Duration,
    pub cap: Duration,
    /// The longest the driver may take to report a read's own answer ([`VouchCore::take`]):
    /// past it the read is ordered, whatever the driver still does.
    pub own_wait: Duration,
    pub fault: Fault,
    /// Where this process numbers its probe rounds from: anywhere (the driver draws it). A
    /// peer's barrier can reach a gateway that restarted since it was asked (the peer's queue
    /// outlives the connection); an old round's barrier, taken before the new round's reads
    /// began, must not count for them.
    pub first_round: u64,
}

/// The reads one listener gathers in a turn: one probe round for all of them, sent by
/// [`VouchCore::end_turn`] (at once, or after the other reads the listener has at hand).
#[derive(Debug, Default)]
pub struct Turn {
    round: Option<u64>,
    reads: usize,
}

impl Turn {
    /// No round open (nothing taken since the last probe).
    pub fn is_empty(&self) -> bool {
        self.round.is_none()
    }

    /// The round covers [`MAX_ROUND_READS`]: end the turn before taking another read.
    pub fn is_full(&self) -> bool {
        self.reads >= MAX_ROUND_READS
    }
}

/// This replica's answer to a peer's probe of round `round`, `barrier` being its read barrier
/// as the probe arrived; `None`: a silent replica sends none.
pub fn answer_probe(fault: Fault, round: u64, barrier: u64) -> Option<ReadWire> {
    (fault != Fault::Silent).then(|| ReadWire::Barrier { round, barrier: fault.barrier(round, barrier) })
}

/// One probe round: its peers' barriers and the reads it covers that are still undecided.
struct Round {
    barriers: Barriers,
    reads: Vec<u64>,
}

struct Waiting<R> {
    request: R,
    round: u64,
    /// The gateway's barrier as the read arrived.
    barrier: u64,
    /// The gateway's own answer, once in, and the executed position it reflects.
    answer: Option<(Vec<u8>, u64)>,
    /// When the first own answer came in (the vouch timeout counts from there).
    own_at: Option<u64>,
    /// The own answer proved behind and is being taken again.
    again: bool,
    /// When the read is ordered unless decided: [`Settings::own_wait`] after it was taken while
    /// its own answer is not in, the vouch timeout after that answer came in.
    deadline: u64,
}

impl<R> Waiting<R> {
    fn verdict(&self, barriers: &Barriers) -> Verdict {
        verdict(barriers, self.barrier, self.answer.as_ref().map(|(_, at)| *at))
    }
}

/// Timed-out reads whose round may still decide them: by round, the round's barriers and its
/// reads, and the reads in the order they timed out.
#[derive(Default)]
struct LateReads {
    rounds: HashMap<u64, (Barriers, Vec<LateRead>)>,
    order: VecDeque<(u64, u64, u64)>,
}

/// A timed-out read as its round's late barriers need it.
struct LateRead {
    id: u64,
    /// The gateway's barrier as the read arrived.
    barrier: u64,
    /// The executed position its own answer reflected, and when that answer came in.
    at: u64,
    own_at: u64,
}

impl LateReads {
    /// Forgets the reads whose own answer came in before `since`, and the oldest beyond
    /// [`MAX_LATE`].
    fn prune(&mut self, since: u64) {
        while let Some(&(at, round, id)) = self.order.front() {
            if at >= since && self.order.len() <= MAX_LATE {
                break;
            }
            self.order.pop_front();
            if let Some((_, reads)) = self.rounds.get_mut(&round) {
                reads.retain(|r| r.id != id);
                if reads.is_empty() {
                    self.rounds.remove(&round);
                }
            }
        }
    }
}

/// A gateway's vouched reads: the reads being decided, their probe rounds, their deadlines,
/// and the clock that sets those deadlines.
pub struct VouchCore<R> {
    n: u16,
    t: u16,
    fault: Fault,
    /// [`Settings::own_wait`], in microseconds.
    own_wait: u64,
    /// How long a gateway waits for its peers once its own answer is in.
    clock: VouchClock,
    reads: HashMap<u64, Waiting<R>>,
    rounds: HashMap<u64, Round>,
    /// Every undecided read's deadline, earliest first (the timeout varies, so a read taken
    /// later may be due sooner).
    deadlines: BTreeSet<(u64, u64)>,
    /// Reads ordered after all because their peers did not answer in time, kept until the
    /// cap has passed: if their round's barriers then decide them, the wait they took
    /// teaches the clock. A clock that learnt only from reads vouched in time could never rise
    /// above the floor when every answer takes longer than that.
    late: LateReads,
    next_id: u64,
    next_round: u64,
}

impl<R> VouchCore<R> {
    pub fn new(settings: Settings, now_us: u64) -> VouchCore<R> {
        VouchCore {
            n: settings.n,
            t: settings.t,
            fault: settings.fault,
            own_wait: micros(settings.own_wait),
            clock: VouchClock::new(settings.floor, settings.cap, now_us),
            reads: HashMap::new(),
            rounds: HashMap::new(),
            deadlines: BTreeSet::new(),
            late: LateReads::default(),
            next_id: 0,
            next_round: settings.first_round,
        }
    }

    /// How long a read whose own answer comes in now waits for its peers.
    pub fn timeout(&self) -> Duration {
        self.clock.timeout()
    }

    /// The read's request, while it is undecided.
    pub fn request(&self, id: u64) -> Option<&R> {
        self.reads.get(&id).map(|w| &w.request)
    }

    /// Reads undecided, and rounds holding them.
    pub fn waiting(&self) -> (usize, usize) {
        (self.reads.len(), self.rounds.len())
    }

    /// When [`Self::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// Takes a read onto the vouched path in `turn`'s round (end the turn first when it is
    /// full): `barrier` is the gateway's read barrier taken after the read arrived (at or past
    /// every write acknowledged before it), `own` its own answer if at hand, with the executed
    /// position it reflects. Without it, the caller takes that answer once executed up to
    /// `barrier` and reports it with [`Self::own_answer`] within [`Settings::own_wait`]. The read's id,
    /// or the request back when [`MAX_WAITING`] reads wait already (it is to be ordered).
    pub fn take(&mut self, turn: &mut Turn, now_us: u64, request: R, barrier: u64, own: Option<(Vec<u8>, u64)>) -> Result<(u64, Vec<Action<R>>), R> {
        if self.reads.len() >= MAX_WAITING {
            return Err(request);
        }
        let id = self.next_id;
        self.next_id += 1;
        let round = *turn.round.get_or_insert_with(|| {
            let round = self.next_round;
            self.next_round = round.wrapping_add(1);
            round
        });
        turn.reads += 1;
        let (n, t) = (self.n, self.t);
        let r = self.rounds.entry(round).or_insert_with(|| Round { barriers: Barriers::new(n, t), reads: Vec::new() });
        r.reads.push(id);
        let wait = if own.is_some() { micros(self.clock.timeout()) } else { self.own_wait };
        let deadline = now_us.saturating_add(wait);
        let w = Waiting { request, round, barrier, own_at: own.as_ref().map(|_| now_us), answer: own, again: false, deadline };
        // The barriers are not in (the probe is not even sent), unless the gateway is its
        // own quorum (t = 0).
        let verdict = w.verdict(&r.barriers);
        self.reads.insert(id, w);
        self.deadlines.insert((deadline, id));
        let mut out = Vec::new();
        self.act(id, verdict, now_us, &mut out);
        Ok((id, out))
    }

    /// Ends the listener's turn: its round's probe, to be sent before the own answers the
    /// turn still has to take from named (named works on them while the probe travels).
    pub fn end_turn(&mut self, turn: &mut Turn) -> Option<Action<R>> {
        turn.reads = 0;
        let round = turn.round.take()?;
        (self.fault != Fault::Silent).then_some(Action::Probe { round })
    }

    /// Read `id`'s own answer is in, reflecting the executed position it carries (`None`:
    /// named stayed silent, the read failed, or the executor did not get there in time: the
    /// ordered path decides).
    pub fn own_answer(&mut self, now_us: u64, id: u64, own: Option<(Vec<u8>, u64)>) -> Vec<Action<R>> {
        let mut out = Vec::new();
        let Some(own) = own else {
            self.fall_back(id, &mut out);
            return out;
        };
        let timeout = micros(self.clock.timeout());
        let Some(w) = self.reads.get_mut(&id) else { return out };
        let Some(round) = self.rounds.get(&w.round) else { return out };
        let first = w.own_at.is_none();
        w.own_at.get_or_insert(now_us);
        w.answer = Some(own);
        w.again = false;
        let verdict = w.verdict(&round.barriers);
        if first && verdict != Verdict::Vouched {
            // The own answer is in: the read falls back unless decided within the timeout.
            let deadline = now_us.saturating_add(timeout);
            self.deadlines.remove(&(w.deadline, id));
            w.deadline = deadline;
            self.deadlines.insert((deadline, id));
        }
        self.act(id, verdict, now_us, &mut out);
        out
    }

    /// Peer `from`'s barrier for round `round` (the mesh proved the sender): the reads of the
    /// round it decides are acted on, and a timed-out round it decides teaches the clock.
    pub fn barrier(&mut self, now_us: u64, from: u16, round: u64, barrier: u64) -> Vec<Action<R>> {
        let mut decided = Vec::new();
        if let Some(r) = self.rounds.get_mut(&round) {
            if r.barriers.reply(from, barrier) {
                for id in &r.reads {
                    let Some(w) = self.reads.get(id) else { continue };
                    match w.verdict(&r.barriers) {
                        Verdict::Pending => {}
                        Verdict::Behind(_) if w.again => {}
                        v => decided.push((*id, v)),
                    }
                }
            }
        }
        let mut out = Vec::new();
        self.count_late_barrier(now_us, from, round, barrier, &mut out);
        for (id, verdict) in decided {
            self.act(id, verdict, now_us, &mut out);
        }
        out
    }

    /// Orders the reads whose deadline has passed.
    pub fn handle_timeout(&mut self, now_us: u64) -> Vec<Action<R>> {
        let mut out = Vec::new();
        let mut due = Vec::new();
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now_us {
                break;
            }
            self.deadlines.pop_first();
            due.push(id);
        }
        // Time passing with nothing vouched relaxes the timeout (never raises it).
        if self.clock.tick(now_us) {
            out.push(Action::Timeout(self.clock.timeout()));
        }
        for id in due {
            self.time_out(id, now_us, &mut out);
        }
        out
    }

    /// Takes read `id` out (whoever does acts on it, once), with its deadline, and out of its
    /// round; a round with no read left is closed (its late answers find nothing).
    fn remove(&mut self, id: u64) -> Option<Waiting<R>> {
        let w = self.reads.remove(&id)?;
        self.deadlines.remove(&(w.deadline, id));
        if let Some(round) = self.rounds.get_mut(&w.round) {
            round.reads.retain(|r| *r != id);
            if round.reads.is_empty() {
                self.rounds.remove(&w.round);
            }
        }
        Some(w)
    }

    /// Acts on a read's verdict: answers it, or takes its own answer again once executed far
    /// enough (once per answer that proved behind).
    fn act(&mut self, id: u64, verdict: Verdict, now_us: u64, out: &mut Vec<Action<R>>) {
        match verdict {
            Verdict::Pending => {}
            Verdict::Vouched => {
                let Some(w) = self.remove(id) else { return };
                self.answer(w, now_us, out);
            }
            Verdict::Behind(position) => {
                let Some(w) = self.reads.get_mut(&id) else { return };
                if w.again {
                    return;
                }
                w.again = true;
                // Never longer than the cap: the read's deadline orders it by then anyway.
                out.push(Action::Fetch { id, position, wait: self.clock.cap() });
            }
        }
    }

    fn answer(&mut self, w: Waiting<R>, now_us: u64, out: &mut Vec<Action<R>>) {
        let Some((answer, _)) = w.answer else { return };
        // Only vouched reads teach the timeout (the wrapper's `reads::vouched` says why).
        if let Some(at) = w.own_at {
            if self.clock.vouched(Duration::from_micros(now_us.saturating_sub(at)), now_us) {
                out.push(Action::Timeout(self.clock.timeout()));
            }
        }
        out.push(Action::Answer { request: w.request, answer });
    }

    /// Orders the read after all, if it is still undecided.
    fn fall_back(&mut self, id: u64, out: &mut Vec<Action<R>>) {
        if let Some(w) = self.remove(id) {
            out.push(Action::Order { request: w.request });
        }
    }

    /// A read's deadline passed: it is ordered after all, and kept for the barriers that may
    /// still come when its own answer was in (they teach the clock, see `late`).
    fn time_out(&mut self, id: u64, now_us: u64, out: &mut Vec<Action<R>>) {
        let Some(round) = self.reads.get(&id).map(|w| w.round) else { return };
        let barriers = self.rounds.get(&round).map(|r| r.barriers.clone());
        let Some(w) = self.remove(id) else { return };
        if let (Some(own_at), Some((_, at)), Some(barriers), false) = (w.own_at, &w.answer, barriers, w.again) {
            let late = &mut self.late;
            late.rounds.entry(w.round).or_insert_with(|| (barriers, Vec::new())).1.push(LateRead { id, barrier: w.barrier, at: *at, own_at });
            late.order.push_back((own_at, w.round, id));
            late.prune(now_us.saturating_sub(micros(self.clock.cap())));
        }
        out.push(Action::Order { request: w.request });
    }

    /// A barrier for a round whose reads timed out: one it now decides as vouched, within the
    /// cap, teaches the clock the wait it took (a liar's barrier can decide that only where it
    /// could have decided an in-time one, and never past the cap).
    fn count_late_barrier(&mut self, now_us: u64, from: u16, round: u64, barrier: u64, out: &mut Vec<Action<R>>) {
        let Some((barriers, reads)) = self.late.rounds.get_mut(&round) else { return };
        if !barriers.reply(from, barrier) {
            return;
        }
        let mut waits = Vec::new();
        reads.retain(|r| match verdict(barriers, r.barrier, Some(r.at)) {
            Verdict::Pending => true,
            Verdict::Vouched => {
                waits.push(now_us.saturating_sub(r.own_at));
                false
            }
            Verdict::Behind(_) => false,
        });
        if reads.is_empty() {
            self.late.rounds.remove(&round);
        }
        let cap = micros(self.clock.cap());
        let mut changed = false;
        for wait in waits.into_iter().filter(|w| *w <= cap) {
            changed |= self.clock.vouched(Duration::from_micros(wait), now_us);
        }
        if changed {
            out.push(Action::Timeout(self.clock.timeout()));
        }
    }
}

/// The gateway's vouch timeout: [`MARGIN`] times the [`PERCENTILE`]th percentile of the
/// waits (own answer in, to the read decided) of its recently vouched reads, within
/// `floor..=cap` (`cluster.vouch_timeout_ms..=vouch_timeout_max_ms`). Learnt window by window
/// ([`WINDOW`] vouched reads or [`WINDOW_PERIOD`]): up at once, down by halves. Only vouched
/// reads teach it; the wrapper's `reads::vouched` says why a Byzantine peer cannot raise it
/// beyond what its honest peers' own waits justify, nor ever past the cap.
#[derive(Debug)]
pub struct VouchClock {
    floor_us: u64,
    cap_us: u64,
    current_us: u64,
    /// Waits (us) of the reads vouched in the open window, each at most the cap.
    window: Vec<u64>,
    /// When the open window opened (us, the caller's clock).
    opened: u64,
}

impl VouchClock {
    pub fn new(floor: Duration, cap: Duration, now_us: u64) -> VouchClock {
        let floor_us = micros(floor).max(1);
        let cap_us = micros(cap).max(floor_us);
        VouchClock { floor_us, cap_us, current_us: floor_us, window: Vec::with_capacity(WINDOW), opened: now_us }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_micros(self.current_us)
    }

    pub fn cap(&self) -> Duration {
        Duration::from_micros(self.cap_us)
    }

    /// A read was vouched `wait` after the gateway's own answer was in. `true`: the timeout
    /// changed.
    pub fn vouched(&mut self, wait: Duration, now_us: u64) -> bool {
        self.window.push(micros(wait).min(self.cap_us));
        if self.window.len() >= WINDOW {
            return self.close(now_us);
        }
        self.tick(now_us)
    }

    /// Closes the window once its period is over. `true`: the timeout changed.
    pub fn tick(&mut self, now_us: u64) -> bool {
        now_us.saturating_sub(self.opened) >= micros(WINDOW_PERIOD) && self.close(now_us)
    }

    fn close(&mut self, now_us: u64) -> bool {
        let target = if self.window.is_empty() {
            self.floor_us
        } else {
            // Nearest rank: the smallest wait at or above PERCENTILE % of the window's.
            let rank = (self.window.len() * PERCENTILE).div_ceil(100).max(1) - 1;
            let (_, wait, _) = self.window.select_nth_unstable(rank);
            wait.saturating_mul(MARGIN).clamp(self.floor_us, self.cap_us)
        };
        self.window.clear();
        self.opened = now_us;
        let before = self.current_us;
        // Up at once: a read that times out costs an ordering round, far more than waiting.
        // Down by halves: one quick window does not undo what a lasting load taught.
        self.current_us = if target >= before { target } else { target + (before - target) / 2 };
        self.current_us != before
    }
}

pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn us(v: u64) -> Duration {
        Duration::from_micros(v)
    }

    const PERIOD: u64 = 1_000_000;
    /// The longest the tests' drivers take to report an own answer.
    const OWN_WAIT: Duration = Duration::from_secs(1);

    /// One window of vouched reads that all waited `wait`.
    fn window_of(clock: &mut VouchClock, wait: Duration, now: u64) {
        for _ in 0..WINDOW {
            clock.vouched(wait, now);
        }
    }

    /// Vouches that come just within the timeout (the slower ones fell back, unseen) raise it
    /// window by window, up to the cap and never past it; a few slow ones do not.
    #[test]
    fn the_timeout_grows_under_slow_vouches_up_to_the_cap() {
        let mut c = VouchClock::new(ms(5), ms(50), 0);
        assert_eq!(c.timeout(), ms(5));
        // Quick vouches (4 x 0.5 ms): the floor holds.
        window_of(&mut c, us(500), 0);
        assert_eq!(c.timeout(), ms(5));
        window_of(&mut c, us(4_500), 0);
        assert_eq!(c.timeout(), ms(18));
        window_of(&mut c, ms(15), 0);
        assert_eq!(c.timeout(), ms(50), "4 x 15 ms, capped");
        // A vouch counted after its deadline passed (before the timer ran) counts as the cap.
        window_of(&mut c, ms(10_000), 0);
        assert_eq!(c.timeout(), ms(50));
        // The 95th percentile, not the slowest: 12 slow reads of 256 leave it where the rest put it.
        let mut c = VouchClock::new(ms(5), ms(50), 0);
        for i in 0..WINDOW {
            c.vouched(if i < 12 { ms(40) } else { ms(2) }, 0);
        }
        assert_eq!(c.timeout(), ms(8));
        // A cap at the floor is a fixed timeout.
        let mut c = VouchClock::new(ms(5), ms(5), 0);
        window_of(&mut c, ms(4), 0);
        assert_eq!(c.timeout(), ms(5));
    }

    /// Quick vouches bring it back to the floor, by halves; a whole period with nothing vouched
    /// relaxes it too, and a window still open does not.
    #[test]
    fn the_timeout_shrinks_back_when_vouches_are_quick_again() {
        let mut c = VouchClock::new(ms(5), ms(50), 0);
        window_of(&mut c, ms(30), 0);
        assert_eq!(c.timeout(), ms(50));
        window_of(&mut c, us(100), 0);
        assert_eq!(c.timeout(), us(27_500), "halfway down, not at once");
        let mut windows = 1;
        while c.timeout() > ms(5) {
            let before = c.timeout();
            window_of(&mut c, us(100), 0);
            assert!(c.timeout() < before);
            windows += 1;
        }
        assert_eq!((c.timeout(), windows), (ms(5), 16));
        // Nothing vouched: unchanged while the period runs, then halfway back to the floor.
        window_of(&mut c, ms(10), 0);
        assert_eq!(c.timeout(), ms(40));
        assert!(!c.tick(PERIOD / 2));
        assert_eq!(c.timeout(), ms(40));
        assert!(c.tick(PERIOD));
        assert_eq!(c.timeout(), us(22_500));
        // A few reads vouched in a period that is over: the window closes with what it has.
        c.vouched(ms(1), 2 * PERIOD);
        c.vouched(ms(1), 2 * PERIOD);
        assert!(c.vouched(ms(1), 3 * PERIOD));
        assert!(c.timeout() < us(22_500));
    }

    /// A gateway (n = 4, t = 1, timeout 5..=50 ms) on the test's clock: what it decided, in
    /// order, as the driver would do it. Requests are numbered by the test.
    struct Gate {
        core: VouchCore<u32>,
        now: u64,
        requests: u32,
        answered: Vec<(u32, Vec<u8>)>,
        ordered: Vec<(u32, u64)>,
        fetches: Vec<(u64, u64)>,
        /// The timeout's gauge, as the driver would set it.
        gauge: Duration,
    }

    /// A barrier that lets the reads of [`Gate::read`] pass, and one that does not.
    const NOW: u64 = 0;
    const AHEAD: u64 = 7;

    impl Gate {
        fn new(floor: Duration, cap: Duration) -> Gate {
            let settings = Settings { n: 4, t: 1, floor, cap, own_wait: OWN_WAIT, fault: Fault::None, first_round: 1 << 40 };
            let core = VouchCore::new(settings, 0);
            let gauge = core.timeout();
            Gate { core, now: 0, requests: 0, answered: Vec::new(), ordered: Vec::new(), fetches: Vec::new(), gauge }
        }

        fn absorb(&mut self, actions: Vec<Action<u32>>) {
            for action in actions {
                match action {
                    Action::Probe { .. } => {}
                    Action::Fetch { id, position, .. } => self.fetches.push((id, position)),
                    Action::Answer { request, answer } => self.answered.push((request, answer)),
                    Action::Order { request } => self.ordered.push((request, self.now)),
                    Action::Timeout(timeout) => self.gauge = timeout,
                }
            }
        }

        /// Lets `d` pass, firing each deadline at its own time.
        fn advance(&mut self, d: Duration) {
            let until = self.now + micros(d);
            while let Some(at) = self.core.poll_timeout().filter(|at| *at <= until) {
                self.now = self.now.max(at);
                let actions = self.core.handle_timeout(self.now);
                self.absorb(actions);
            }
            self.now = until;
        }

        /// A read whose own answer (executed position 0, barrier 0) is at hand, in a round of
        /// its own: its id and round.
        fn read(&mut self) -> (u64, u64) {
            self.requests += 1;
            let mut turn = Turn::default();
            let answer = self.requests.to_be_bytes().to_vec();
            let (id, actions) = self.core.take(&mut turn, self.now, self.requests, NOW, Some((answer, NOW))).expect("room");
            self.absorb(actions);
            let Some(Action::Probe { round }) = self.core.end_turn(&mut turn) else { panic!("a probe") };
            (id, round)
        }

        fn barrier(&mut self, peer: u16, round: u64, barrier: u64) {
            let actions = self.core.barrier(self.now, peer, round, barrier);
            self.absorb(actions);
        }
    }

    /// Peers that answer just within the timeout raise it to the cap, never past it, and the
    /// gauge shows it; quick answers bring it back to the floor.
    #[test]
    fn slow_vouches_raise_the_timeout_to_the_cap_and_quick_ones_lower_it() {
        let mut g = Gate::new(ms(5), ms(50));
        let mut reads = 0;
        while g.core.timeout() < ms(50) {
            let wait = g.core.timeout() * 9 / 10;
            let (_, round) = g.read();
            g.advance(wait);
            g.barrier(1, round, NOW);
            g.barrier(2, round, NOW);
            reads += 1;
            assert!(g.core.timeout() <= ms(50));
            assert!(reads < 10 * WINDOW, "stuck at {:?}", g.core.timeout());
        }
        assert_eq!((g.answered.len(), g.ordered.len()), (reads, 0));
        assert_eq!(g.gauge, ms(50));
        while g.core.timeout() > ms(5) {
            let (_, round) = g.read();
            g.advance(us(200));
            g.barrier(3, round, NOW);
            g.barrier(2, round, NOW);
            reads += 1;
            assert!(reads < 40 * WINDOW, "stuck at {:?}", g.core.timeout());
        }
        assert_eq!(g.gauge, ms(5));
        assert!(g.ordered.is_empty());
    }

    /// Reads that fall back teach nothing unless their round's barriers still let them pass:
    /// not those that time out with too few, not those whose answer proved behind.
    #[test]
    fn reads_that_fall_back_do_not_move_the_timeout() {
        let mut g = Gate::new(ms(5), ms(50));
        // Raised first, so that it could move either way.
        for _ in 0..WINDOW {
            let (_, round) = g.read();
            g.advance(us(4_500));
            g.barrier(1, round, NOW);
            g.barrier(3, round, NOW);
        }
        assert_eq!(g.core.timeout(), ms(18));
        // Timed out: one barrier only, the second after the read was ordered and ahead.
        for _ in 0..20 {
            let (_, round) = g.read();
            g.barrier(1, round, NOW);
            g.advance(ms(18));
            assert_eq!(g.ordered.last().map(|o| o.0), Some(g.requests), "ordered at the timeout");
            g.barrier(2, round, AHEAD);
        }
        // Behind, never caught up: two peers ahead, then, after the read was ordered, the third
        // at the gateway's position (a read whose answer proved behind is not kept to teach,
        // though the 2t smallest would now let its first answer pass). Few enough that the
        // window's period (1 s) is not over: that alone would lower the timeout.
        for _ in 0..20 {
            let (id, round) = g.read();
            g.barrier(1, round, AHEAD);
            g.barrier(2, round, AHEAD);
            assert_eq!(g.fetches.last(), Some(&(id, AHEAD)), "taken again once executed that far");
            g.advance(ms(18));
            assert_eq!(g.ordered.last().map(|o| o.0), Some(g.requests));
            g.barrier(3, round, NOW);
        }
        assert_eq!((g.ordered.len(), g.answered.len()), (40, WINDOW));
        assert_eq!(g.core.timeout(), ms(18));
    }

    /// Every peer answers later than the floor: the first reads time out, and their rounds'
    /// barriers, coming late, raise the timeout above the waits, after which reads are vouched.
    #[test]
    fn vouches_that_always_come_late_raise_the_timeout_from_the_floor() {
        let mut g = Gate::new(ms(5), ms(50));
        let mut timed_out = 0;
        while g.core.timeout() < ms(8) {
            let (_, round) = g.read();
            g.advance(ms(5));
            assert_eq!(g.ordered.len(), timed_out + 1, "timed out at the floor");
            timed_out += 1;
            g.advance(ms(3));
            g.barrier(1, round, NOW);
            g.barrier(2, round, NOW);
            assert!(timed_out <= WINDOW, "the late barriers taught nothing: {:?}", g.core.timeout());
        }
        // 8 ms waits: 4 x 8 = 32 ms.
        assert_eq!(g.core.timeout(), ms(32));
        let (_, round) = g.read();
        g.advance(ms(8));
        g.barrier(1, round, NOW);
        g.barrier(2, round, NOW);
        assert_eq!((g.answered.len(), g.ordered.len()), (1, timed_out));
        // Late beyond the cap: nothing learnt from those.
        let (_, round) = g.read();
        g.advance(ms(60));
        assert_eq!(g.ordered.len(), timed_out + 1);
        g.barrier(1, round, NOW);
        g.barrier(2, round, NOW);
        assert_eq!(g.core.timeout(), ms(32));
        assert!(g.core.late.rounds.is_empty(), "the late reads are forgotten");
    }

    /// Peer 3 is Byzantine. While the honest peers agree, its barrier never decides a read:
    /// late or never, far ahead or not, the timeout follows the honest peers' waits. Where it
    /// does decide (an honest peer is ahead of the gateway's answer, e.g. racing a write, and
    /// the gateway does not catch up) and it answers as late as it can, every time, the
    /// timeout reaches the cap and stays there.
    #[test]
    fn a_silent_or_lying_peer_cannot_raise_the_timeout_past_the_cap() {
        let mut g = Gate::new(ms(5), ms(50));
        for i in 0..(3 * WINDOW) {
            let (_, round) = g.read();
            let deadline = g.core.timeout();
            // Far ahead at once; or withheld (silent); or right, but after the honest ones.
            if i % 3 == 0 {
                g.barrier(3, round, u64::MAX);
            }
            g.advance(ms(1));
            g.barrier(1, round, NOW);
            g.barrier(2, round, NOW);
            if i % 3 == 2 {
                g.advance(deadline - ms(2));
                g.barrier(3, round, NOW);
            }
        }
        assert_eq!(g.answered.len(), 3 * WINDOW);
        assert_eq!(g.core.timeout(), ms(5), "4 x the honest peers' 1 ms is below the floor");
        // Its barrier decides: honest peer 2 is ahead.
        for _ in 0..(4 * WINDOW) {
            let (_, round) = g.read();
            let deadline = g.core.timeout();
            g.barrier(1, round, NOW);
            g.barrier(2, round, AHEAD);
            g.advance(deadline - us(1));
            g.barrier(3, round, NOW);
            assert!(g.core.timeout() <= ms(50));
        }
        assert!(g.ordered.is_empty());
        assert_eq!(g.core.timeout(), ms(50), "at the cap, not past it");
        // Silent now, where it decided: those reads fall back after the cap exactly.
        let start = g.now;
        let (_, round) = g.read();
        g.barrier(1, round, NOW);
        g.barrier(2, round, AHEAD);
        g.advance(ms(100));
        assert_eq!(g.ordered, vec![(g.requests, start + 50_000)]);
        assert_eq!(g.core.timeout(), ms(50));
    }

    /// The timeout varies, so a read taken later may be due sooner: it falls back at its own
    /// deadline, not after the earlier read's.
    #[test]
    fn a_read_due_sooner_falls_back_first() {
        let mut g = Gate::new(ms(5), ms(50));
        g.core.clock.current_us = 50_000;
        g.read();
        g.core.clock.current_us = 5_000;
        g.read();
        g.advance(ms(60));
        assert_eq!(g.ordered, vec![(2, 5_000), (1, 50_000)]);
    }

    /// A barrier made up far ahead holds a read only until the last peer answered: the two
    /// smallest decide. One made up far behind changes nothing: the gateway takes its answer
    /// again once it has executed as far as the honest peer's barrier.
    #[test]
    fn a_made_up_barrier_counts_only_among_the_2t_smallest() {
        let mut g = Gate::new(ms(2_000), ms(2_000));
        let (first, round) = g.read();
        g.barrier(3, round, u64::MAX);
        g.barrier(1, round, NOW);
        assert_eq!((g.answered.len(), g.fetches.clone()), (0, vec![(first, u64::MAX)]), "held while the lie is among the 2t smallest");
        g.barrier(2, round, NOW);
        assert_eq!(g.answered, vec![(1, 1u32.to_be_bytes().to_vec())], "the answer taken first, once every peer answered");
        let (id, round) = g.read();
        g.barrier(3, round, 0);
        g.barrier(2, round, 6);
        assert_eq!((g.answered.len(), g.fetches[1]), (1, (id, 6)), "the lie does not lower what the honest peer requires");
        // An answer taken again that is still behind is taken again; one far enough goes out.
        let actions = g.core.own_answer(g.now, id, Some((b"at 5".to_vec(), 5)));
        g.absorb(actions);
        assert_eq!((g.answered.len(), g.fetches.len()), (1, 3));
        let actions = g.core.own_answer(g.now, id, Some((b"at 6".to_vec(), 6)));
        g.absorb(actions);
        assert_eq!(g.answered[1], (2, b"at 6".to_vec()));
        assert!(g.ordered.is_empty());
        assert_eq!(g.core.waiting(), (0, 0));
    }

    /// A silent replica sends no probe and answers none; a wrong voucher answers with a
    /// barrier far ahead for even rounds and 0 for odd ones.
    #[test]
    fn faults_shape_probes_and_answers() {
        let settings = Settings { n: 4, t: 1, floor: ms(5), cap: ms(5), own_wait: OWN_WAIT, fault: Fault::Silent, first_round: 0 };
        let mut core = VouchCore::new(settings, 0);
        let mut turn = Turn::default();
        core.take(&mut turn, 0, 1u32, 0, None).expect("room");
        assert_eq!(core.end_turn(&mut turn), None);
        assert_eq!(answer_probe(Fault::Silent, 4, 9), None);
        assert_eq!(answer_probe(Fault::None, 4, 9), Some(ReadWire::Barrier { round: 4, barrier: 9 }));
        let lie = crate::vouch::WRONG_BARRIER_AHEAD;
        assert_eq!(answer_probe(Fault::WrongVouches, 4, 9), Some(ReadWire::Barrier { round: 4, barrier: 9 + lie }));
        assert_eq!(answer_probe(Fault::WrongVouches, 5, 9), Some(ReadWire::Barrier { round: 5, barrier: 0 }));
    }

    /// One round per turn, up to [`MAX_ROUND_READS`]; reads beyond [`MAX_WAITING`] are handed
    /// back to be ordered; a read whose own answer never comes is ordered after [`OWN_WAIT`].
    #[test]
    fn turns_bounds_and_the_own_wait() {
        let mut g = Gate::new(ms(5), ms(50));
        let mut turn = Turn::default();
        for r in 0..MAX_ROUND_READS as u32 {
            assert!(!turn.is_full());
            g.core.take(&mut turn, 0, r, 0, None).expect("room");
        }
        assert!(turn.is_full());
        let Some(Action::Probe { round }) = g.core.end_turn(&mut turn) else { panic!("a probe") };
        assert!(turn.is_empty() && !turn.is_full());
        assert_eq!(g.core.waiting(), (MAX_ROUND_READS, 1));
        assert!(g.core.end_turn(&mut turn).is_none(), "nothing taken, nothing to probe");
        for r in MAX_ROUND_READS..MAX_WAITING {
            let _ = g.core.take(&mut turn, 0, r as u32, 0, None).expect("room");
            if turn.is_full() {
                let _ = g.core.end_turn(&mut turn);
            }
        }
        assert_eq!(g.core.take(&mut turn, 0, 99_999, 0, None).err(), Some(99_999), "full");
        g.advance(OWN_WAIT - us(1));
        assert!(g.ordered.is_empty());
        g.advance(us(1));
        assert_eq!(g.ordered.len(), MAX_WAITING);
        assert_eq!(g.core.waiting(), (0, 0));
        // Its round's barriers, now, find nothing.
        g.barrier(1, round, 0);
        assert!(g.answered.is_empty());
    }

    /// splitmix64: reproducible without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }

        fn take<T>(&mut self, v: &mut Vec<T>) -> Option<T> {
            (!v.is_empty()).then(|| v.swap_remove(self.below(v.len() as u64) as usize))
        }
    }

    /// How a Byzantine peer answers probes in a [`World`].
    #[derive(Clone, Copy, Debug)]
    enum Lie {
        /// Far ahead of anything executed.
        High,
        /// 0: as if it had committed nothing.
        Low,
        /// No answer at all.
        Silent,
        /// Anything, twice, late or early.
        Noise,
    }

    /// What became of one read.
    struct Fate {
        /// The highest write acknowledged when the read was taken: its answer must reflect it.
        acked: u64,
        taken_at: u64,
        ended_at: Option<u64>,
    }

    /// A cluster around one gateway (replica 0, honest) under seeded chaos: writes committed
    /// by random quorums and acknowledged, replicas catching up at random, up to t Byzantine
    /// peers, probes and barriers delivered in any order or never, the gateway's own answers
    /// coming late or failing, time jumping. What a read's answer reflects is carried in its
    /// bytes (the executed position), so the test can hold it against the writes acknowledged
    /// before the read began.
    struct World {
        rng: Rng,
        n: u16,
        core: VouchCore<usize>,
        now: u64,
        acked: u64,
        /// Each replica's read barrier (an honest one's only grows).
        barriers: Vec<u64>,
        /// The gateway's executed position, never past its barrier.
        executed: u64,
        liars: Vec<(u16, Lie)>,
        reads: Vec<Fate>,
        /// Probes on their way to peers, barriers on their way back.
        probes: Vec<(u16, u64)>,
        replies: Vec<(u16, u64, u64)>,
        /// Own answers the gateway is taking: read id, request, position, give up at.
        fetches: Vec<(u64, u64, u64)>,
        cap: u64,
        answered: usize,
        ordered: usize,
    }

    impl World {
        fn new(seed: u64) -> World {
            let mut rng = Rng(seed);
            let n = [4u16, 7, 10][rng.below(3) as usize];
            let t = (n - 1) / 3;
            let (floor, cap) = (1 + rng.below(5), 5 + rng.below(50));
            let settings = Settings { n, t, floor: ms(floor), cap: ms(cap), own_wait: OWN_WAIT, fault: Fault::None, first_round: rng.next() };
            let kinds = [Lie::High, Lie::Low, Lie::Silent, Lie::Noise];
            let liars = (0..rng.below(u64::from(t) + 1)).map(|i| (1 + i as u16 * 2, kinds[rng.below(4) as usize])).collect();
            World {
                core: VouchCore::new(settings, 0),
                rng,
                n,
                now: 0,
                acked: 0,
                barriers: vec![0; usize::from(n)],
                executed: 0,
                liars,
                reads: Vec::new(),
                probes: Vec::new(),
                replies: Vec::new(),
                fetches: Vec::new(),
                cap: cap * 1000,
                answered: 0,
                ordered: 0,
            }
        }

        fn lie(&self, peer: u16) -> Option<Lie> {
            self.liars.iter().find(|(p, _)| *p == peer).map(|(_, lie)| *lie)
        }

        fn absorb(&mut self, actions: Vec<Action<usize>>) {
            for action in actions {
                match action {
                    Action::Probe { round } => self.probes.extend((1..self.n).map(|p| (p, round))),
                    Action::Fetch { id, position, wait } => self.fetches.push((id, position, self.now + micros(wait))),
                    Action::Answer { request, answer } => {
                        let at = u64::from_be_bytes(answer.try_into().expect("an executed position"));
                        let fate = &self.reads[request];
                        assert!(at >= fate.acked, "read {request} answered at {at}, before the write acknowledged at {} ahead of it", fate.acked);
                        self.end(request);
                        self.answered += 1;
                    }
                    Action::Order { request } => {
                        self.end(request);
                        self.ordered += 1;
                    }
                    Action::Timeout(timeout) => assert!(timeout <= us(self.cap) && timeout >= ms(1), "{timeout:?}"),
                }
            }
        }

        fn end(&mut self, request: usize) {
            let fate = &mut self.reads[request];
            assert!(fate.ended_at.is_none(), "read {request} ended twice");
            assert!(self.now <= fate.taken_at + micros(OWN_WAIT) + self.cap, "read {request} ended late");
            fate.ended_at = Some(self.now);
        }

        /// A write is committed by 2t+1 replicas (any of them, liars included), then
        /// acknowledged; or a replica catches up with what is committed.
        fn write(&mut self) {
            let seq = self.acked + 1;
            let quorum = usize::from(self.n - (self.n - 1) / 3);
            let mut ids: Vec<usize> = (0..usize::from(self.n)).collect();
            for _ in 0..quorum {
                let i = self.rng.take(&mut ids).expect("n > quorum");
                self.barriers[i] = self.barriers[i].max(seq);
            }
            self.acked = seq;
        }

        fn catch_up(&mut self) {
            let i = self.rng.below(u64::from(self.n)) as usize;
            self.barriers[i] = self.barriers[i].max(self.acked - self.rng.below(self.acked.min(3) + 1));
        }

        /// The gateway takes one to three reads in a turn, some answered from its cache.
        fn take(&mut self) {
            let mut turn = Turn::default();
            for _ in 0..=self.rng.below(3) {
                let request = self.reads.len();
                self.reads.push(Fate { acked: self.acked, taken_at: self.now, ended_at: None });
                let barrier = self.barriers[0];
                let hit = self.executed >= barrier && self.rng.below(2) == 0;
                let own = hit.then(|| (self.executed.to_be_bytes().to_vec(), self.executed));
                let (id, actions) = self.core.take(&mut turn, self.now, request, barrier, own).expect("room");
                if !hit {
                    self.fetches.push((id, barrier, self.now + micros(OWN_WAIT)));
                }
                self.absorb(actions);
            }
            let probe = self.core.end_turn(&mut turn);
            self.absorb(probe.into_iter().collect());
        }

        /// A probe reaches its peer, which answers with its barrier as it arrived (or lies).
        fn probe(&mut self) {
            let Some((peer, round)) = self.rng.take(&mut self.probes) else { return };
            let honest = self.barriers[usize::from(peer)];
            let answers = match self.lie(peer) {
                None => vec![honest],
                Some(Lie::High) => vec![honest + (1 << 20)],
                Some(Lie::Low) => vec![0],
                Some(Lie::Silent) => vec![],
                Some(Lie::Noise) => vec![self.rng.next(), self.rng.below(honest + 2)],
            };
            self.replies.extend(answers.into_iter().map(|b| (peer, round, b)));
        }

        fn reply(&mut self) {
            let Some((peer, round, barrier)) = self.rng.take(&mut self.replies) else { return };
            let actions = self.core.barrier(self.now, peer, round, barrier);
            self.absorb(actions);
        }

        /// The gateway executes further, and an own answer it was taking comes in (reflecting
        /// what is executed then), fails, or waits.
        fn own(&mut self) {
            self.executed = self.executed.max(self.barriers[0] - self.rng.below(self.barriers[0].min(2) + 1));
            let Some((id, position, _)) = self.rng.take(&mut self.fetches) else { return };
            let own = match self.rng.below(8) {
                0 => None,
                _ if self.executed >= position => Some((self.executed.to_be_bytes().to_vec(), self.executed)),
                _ => return self.fetches.push((id, position, self.now + micros(OWN_WAIT))),
            };
            let actions = self.core.own_answer(self.now, id, own);
            self.absorb(actions);
        }

        /// Time passes; the core's deadlines fire at their time, the driver's waits give up.
        fn advance(&mut self, d: u64) {
            let until = self.now + d;
            while let Some(at) = self.core.poll_timeout().filter(|at| *at <= until) {
                self.now = self.now.max(at);
                let actions = self.core.handle_timeout(self.now);
                self.absorb(actions);
            }
            self.now = until;
            let (due, kept): (Vec<_>, Vec<_>) = self.fetches.drain(..).partition(|f| f.2 <= until);
            self.fetches = kept;
            for (id, _, _) in due {
                let actions = self.core.own_answer(self.now, id, None);
                self.absorb(actions);
            }
        }

        fn step(&mut self) {
            match self.rng.below(20) {
                0..=1 => self.write(),
                2..=3 => self.catch_up(),
                4..=6 => self.take(),
                7..=10 => self.probe(),
                11..=14 => self.reply(),
                15..=17 => self.own(),
                _ => {
                    let d = [self.rng.below(200), self.rng.below(5_000), self.rng.below(60_000)][self.rng.below(3) as usize];
                    self.advance(d);
                }
            }
        }
    }

    /// Seeded interleavings (300 worlds of 2,000 steps each): every answer a client
    /// gets reflects every write acknowledged before its read began, whatever the liars send;
    /// every read ends, answered or ordered, within the own wait and the cap; and both happen.
    #[test]
    fn seeded_worlds_answer_only_recent_enough_and_end_every_read() {
        let (mut answered, mut ordered) = (0, 0);
        for seed in 0..300 {
            let mut w = World::new(seed);
            for _ in 0..2_000 {
                w.step();
            }
            // The network goes quiet: every read still open is decided by its deadline.
            w.probes.clear();
            w.replies.clear();
            w.advance(micros(OWN_WAIT) + w.cap + 1);
            assert_eq!(w.core.waiting(), (0, 0), "seed {seed}: reads left undecided");
            assert!(w.reads.iter().all(|f| f.ended_at.is_some()), "seed {seed}: a read never ended");
            assert_eq!(w.answered + w.ordered, w.reads.len(), "seed {seed}");
            answered += w.answered;
            ordered += w.ordered;
        }
        assert!(answered > 0 && ordered > 0, "vouched {answered}, ordered {ordered}: a world that never does one proves little");
    }
}
