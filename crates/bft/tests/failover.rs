//! How fast a crashed primary is replaced, in virtual time: the adaptive request timeout
//! (Config::min_request_timeout), its backoff when suspicions bring no progress, and its
//! growth with the ordering latency the replicas observe.
//!
//! Deterministic: a small event-driven network with a fixed one-way delay per message, time
//! advanced to the next message or timer. Nothing here reads a clock.

use std::collections::BTreeMap;
use std::time::Duration;

use bft::{Action, Batch, Config, Message, Replica, Request, Time};

const START: Time = Time(1_000_000_000);

fn request(origin: u16, client: u64, number: u64) -> Request {
    Request { origin, client, number, payload: vec![7; 10] }
}

struct Net {
    replicas: Vec<Replica>,
    /// (arrival time, sequence) -> (from, to, encoded message).
    queue: BTreeMap<(Time, u64), (u16, u16, Vec<u8>)>,
    sent: u64,
    delay_us: u64,
    /// Crashed replicas: they neither send nor receive.
    down: Vec<bool>,
    /// Whether replicas report their checkpoint digests (false: the application "lags",
    /// so no checkpoint becomes stable and the window fills).
    confirm_checkpoints: bool,
    now: Time,
    delivered: Vec<Vec<Batch>>,
    /// (time, replica, view) whenever a replica's view changed.
    views: Vec<(Time, usize, u64)>,
    last_view: Vec<u64>,
}

impl Net {
    fn new(configure: impl Fn(&mut Config), delay: Duration) -> Net {
        let replicas: Vec<Replica> = (0..4)
            .map(|id| {
                let mut config = Config::new(4, id);
                config.persist = false;
                configure(&mut config);
                Replica::new(config, START).unwrap()
            })
            .collect();
        Net {
            replicas,
            queue: BTreeMap::new(),
            sent: 0,
            delay_us: delay.as_micros() as u64,
            down: vec![false; 4],
            confirm_checkpoints: true,
            now: START,
            delivered: vec![Vec::new(); 4],
            views: Vec::new(),
            last_view: vec![0; 4],
        }
    }

    fn flush(&mut self) {
        for index in 0..self.replicas.len() {
            while let Some(action) = self.replicas[index].poll_action() {
                match action {
                    Action::Send { to, message } => self.post(index as u16, to, &message),
                    Action::Broadcast { message } => {
                        for to in (0..4u16).filter(|to| usize::from(*to) != index) {
                            self.post(index as u16, to, &message);
                        }
                    }
                    Action::Deliver(batch) => {
                        if batch.checkpoint_due && self.confirm_checkpoints {
                            self.replicas[index].checkpoint(batch.seq, [batch.seq as u8; 32]).unwrap();
                        }
                        self.delivered[index].push(batch);
                    }
                    _ => {}
                }
            }
            let view = self.replicas[index].status().view;
            if view != self.last_view[index] {
                self.last_view[index] = view;
                self.views.push((self.now, index, view));
            }
        }
    }

    fn post(&mut self, from: u16, to: u16, message: &Message) {
        if self.down[usize::from(from)] || self.down[usize::from(to)] {
            return;
        }
        self.sent += 1;
        self.queue.insert((Time(self.now.0 + self.delay_us), self.sent), (from, to, message.encode()));
    }

    /// Runs until `until`: messages in arrival order, timers when due.
    fn run_until(&mut self, until: Time) {
        loop {
            self.flush();
            let next_message = self.queue.keys().next().map(|(at, _)| *at);
            let next_timer = (0..4).filter(|i| !self.down[*i]).filter_map(|i| self.replicas[i].poll_timeout()).min();
            let Some(next) = [next_message, next_timer].into_iter().flatten().min() else { break };
            if next > until {
                break;
            }
            self.now = next.max(self.now);
            if next_message == Some(next) {
                let key = *self.queue.keys().next().unwrap();
                let (from, to, bytes) = self.queue.remove(&key).unwrap();
                let limits = self.replicas[usize::from(to)].config().limits();
                let message = Message::decode(&bytes, limits).unwrap();
                self.replicas[usize::from(to)].handle_message(self.now, from, message);
            } else {
                for i in (0..4).filter(|i| !self.down[*i]) {
                    if self.replicas[i].poll_timeout().is_some_and(|t| t <= self.now) {
                        self.replicas[i].handle_timeout(self.now);
                    }
                }
            }
        }
        self.now = until;
    }

    fn submit(&mut self, at: usize, request: Request) {
        self.replicas[at].submit(self.now, request).unwrap();
    }

    fn delivered_numbers(&self, replica: usize, client: u64) -> Vec<u64> {
        self.delivered[replica].iter().flat_map(|b| b.requests.iter()).filter(|r| r.client == client).map(|r| r.number).collect()
    }

    /// When replica `replica` first reached `view`.
    fn reached(&self, replica: usize, view: u64) -> Option<Time> {
        self.views.iter().find(|(_, r, v)| *r == replica && *v >= view).map(|(t, _, _)| *t)
    }
}

fn ms(time: Time, since: Time) -> u64 {
    (time.0 - since.0) / 1000
}

/// Orders `count` requests per backup through a healthy cluster, one at a time.
fn warm_up(net: &mut Net, count: u64) {
    for number in 1..=count {
        for at in 1..4 {
            net.submit(at, request(at as u16, 100 + at as u64, number));
        }
        let until = Time(net.now.0 + 20_000);
        net.run_until(until);
    }
    for at in 1..4 {
        assert_eq!(net.delivered_numbers(at, 100 + at as u64).len() as u64, count, "warm-up requests delivered at replica {at}");
    }
}

/// A primary that crashes in a quick cluster is suspected after `min_request_timeout`, not
/// after the full `request_timeout`, and the requests waiting for it are delivered in the
/// new view at once.
#[test]
fn a_crashed_primary_is_replaced_after_the_minimum_timeout() {
    let mut net = Net::new(|_| {}, Duration::from_millis(1));
    warm_up(&mut net, 10);
    for at in 1..4 {
        let timeout = net.replicas[at].current_request_timeout();
        assert_eq!(timeout, Duration::from_millis(250), "backup {at}'s timeout in a quick cluster");
    }
    net.down[0] = true;
    let crashed = net.now;
    for at in 1..4 {
        net.submit(at, request(at as u16, 70 + at as u64, 1));
    }
    net.run_until(Time(crashed.0 + 3_000_000));
    for at in 1..4 {
        for origin in 1..4u64 {
            assert_eq!(net.delivered_numbers(at, 70 + origin), vec![1], "replica {at}: replica {origin}'s request waiting for the crashed primary");
        }
        let view_at = net.reached(at, 1).expect("view 1");
        // Suspected after 250 ms, then a view change of a few one-way delays.
        assert!(ms(view_at, crashed) >= 250 && ms(view_at, crashed) < 300, "replica {at} changed view after {} ms", ms(view_at, crashed));
    }
    let done = net.delivered[1].iter().position(|b| b.requests.iter().any(|r| r.client == 71)).unwrap();
    assert!(net.delivered[1][done].view >= 1);
    // Each backup's timer suspected view 0's primary, and its status says what it waited for:
    // its own request (the oldest), the three requests, longer than the 250 ms it allowed.
    for at in 1..4 {
        let s = net.replicas[at].status().last_suspicion.unwrap_or_else(|| panic!("replica {at} records its suspicion"));
        assert_eq!((s.view, s.timeout, s.awaited), (0, Duration::from_millis(250), 3), "replica {at}: {s:?}");
        assert!(s.oldest_wait >= s.timeout && s.oldest_wait < Duration::from_millis(300), "replica {at}: {s:?}");
        assert!(ms(s.at, crashed) >= 250, "replica {at}: {s:?}");
    }
}

/// One backup's clients alone: the others learn its requests only from its retransmission,
/// so it sends them to everyone when it suspects, and the f+1 suspicions a view change needs
/// follow one minimum timeout later, not a retransmit interval plus the full timeout.
#[test]
fn a_lone_origin_makes_the_others_suspect_soon() {
    let mut net = Net::new(|_| {}, Duration::from_millis(1));
    warm_up(&mut net, 5);
    net.down[0] = true;
    let crashed = net.now;
    net.submit(2, request(2, 8, 1));
    net.run_until(Time(crashed.0 + 5_000_000));
    for at in 1..4 {
        assert_eq!(net.delivered_numbers(at, 8), vec![1], "replica {at}");
        let view_at = net.reached(at, 1).expect("view 1");
        assert!(ms(view_at, crashed) < 600, "replica {at} changed view after {} ms", ms(view_at, crashed));
    }
}

/// Suspicions that bring no progress double the timeout: here the application never confirms
/// a checkpoint, so the window fills and no primary can order anything; the replicas change
/// views ever more slowly, up to `request_timeout`, instead of every 250 ms.
#[test]
fn suspicions_without_progress_back_off_to_the_full_timeout() {
    let mut net = Net::new(
        |config| {
            config.checkpoint_interval = 2;
            config.watermark_window = 4;
            config.batch_max_requests = 1;
        },
        Duration::from_millis(1),
    );
    net.confirm_checkpoints = false;
    let start = net.now;
    for number in 1..=10 {
        net.submit(1, request(1, 5, number));
        net.submit(2, request(2, 6, number));
    }
    net.run_until(Time(start.0 + 12_000_000));
    let changes: Vec<Time> = (1..=5u64).map_while(|view| net.reached(1, view)).collect();
    assert!(changes.len() >= 4, "views reached by replica 1: {:?}", net.views);
    let gaps: Vec<u64> = changes.windows(2).map(|w| ms(w[1], w[0])).collect();
    // 250, 500, 1000, 2000 (capped), each plus the view change itself.
    for pair in gaps.windows(2) {
        assert!(pair[1] >= pair[0] * 3 / 2 || pair[1] >= 2000, "view changes do not back off: gaps {gaps:?} ms");
    }
    assert!(gaps.last().is_some_and(|g| *g >= 1000), "gaps {gaps:?} ms");
    // Nothing beyond the window was delivered, and the replicas agree.
    assert!(net.delivered[1].len() <= 4);
    assert_eq!(net.delivered[1], net.delivered[2]);
}

/// A slow but working primary is not abandoned: with 150 ms one-way delays, ordering takes
/// about 600 ms (request, three phases), which the backups observe; their timeout grows to
/// four times that (capped at `request_timeout`), and no view changes. (The minimum must
/// exceed the ordering latency of a cluster's first requests, before anything is observed:
/// 1 s here, where 250 ms suits replicas a few milliseconds apart.)
#[test]
fn the_timeout_follows_the_observed_ordering_latency() {
    let mut net = Net::new(|config| config.min_request_timeout = Duration::from_secs(1), Duration::from_millis(150));
    for number in 1..=8 {
        for at in 1..4 {
            net.submit(at, request(at as u16, 100 + at as u64, number));
        }
        let until = Time(net.now.0 + 1_000_000);
        net.run_until(until);
    }
    for at in 1..4 {
        assert_eq!(net.delivered_numbers(at, 100 + at as u64).len(), 8, "replica {at}");
        assert_eq!(net.replicas[at].status().view, 0, "replica {at} changed view under a slow, working primary");
        let timeout = net.replicas[at].current_request_timeout();
        assert!(timeout >= Duration::from_millis(1500), "replica {at}'s timeout {timeout:?}");
    }
}

/// A replica that resumes after a pause (a stopped process, a host that slept) fires its
/// request timer at once, before any fresh status report says its peers went on without it.
/// It must not suspect the working primary alone (a view change nobody else makes would
/// keep it out of the ordering): it waits for reports, catches up, and its request is
/// ordered in the view everyone is in.
#[test]
fn a_replica_resuming_after_a_pause_does_not_suspect_a_working_primary_alone() {
    let mut net = Net::new(|_| {}, Duration::from_millis(1));
    warm_up(&mut net, 5);
    net.down[3] = true;
    // Its own request, sent as it stops: the relay is lost with it.
    net.submit(3, request(3, 9, 1));
    for number in 1..=20 {
        net.submit(1, request(1, 10, number));
        let until = Time(net.now.0 + 250_000);
        net.run_until(until);
    }
    net.down[3] = false;
    let resumed = net.now;
    net.run_until(Time(resumed.0 + 3_000_000));
    assert_eq!(net.reached(3, 1), None, "replica 3 changed views alone after its pause: {:?}", net.views);
    for at in 0..4 {
        assert_eq!(net.replicas[at].status().view, 0, "replica {at}");
        assert_eq!(net.delivered_numbers(at, 9), vec![1], "replica {at}: the resumed replica's request");
    }
    assert_eq!(net.delivered_numbers(3, 10).len(), 20, "replica 3 caught up");
}

/// The same for a replica that starts again with no state while the others are ahead: its
/// first status report goes out at once, the answers say it is behind, and it catches up
/// instead of suspecting (with the first report one interval later it suspected alone).
#[test]
fn a_restarted_replica_does_not_suspect_a_working_primary_alone() {
    let mut net = Net::new(|_| {}, Duration::from_millis(1));
    warm_up(&mut net, 5);
    let mut config = Config::new(4, 3);
    config.persist = false;
    net.replicas[3] = Replica::new(config, net.now).unwrap();
    net.delivered[3].clear();
    net.submit(3, request(3, 9, 1));
    let started = net.now;
    net.run_until(Time(started.0 + 3_000_000));
    assert_eq!(net.replicas[3].status().view, 0, "views: {:?}", net.views);
    assert!(!net.views.iter().any(|(at, r, v)| *r == 3 && *v > 0 && *at >= started), "replica 3 changed views alone: {:?}", net.views);
    for at in 0..4 {
        assert_eq!(net.delivered_numbers(at, 9), vec![1], "replica {at}: the restarted replica's request");
    }
}
