//! Byzantine behaviours for real processes, for tests and demonstrations only: the driver runs
//! an honest [`crate::Replica`] and, when given a [`Byzantine`], passes every message it would
//! send through [`Byzantine::rewrite`]. The behaviours are the simulator's actors
//! (`tests/sim/byzantine.rs`) carried over to a running replica; an honest driver (no
//! `Byzantine`) never reaches this code.
//!
//! Only the deployment decides whether a replica may run one (the wrapper refuses unless its
//! configuration marks the cluster as a test cluster).

use crate::{Config, Message, Proposal, ReplicaId, Request, StatusReport, Time};

/// What a Byzantine replica does with the ordering messages it sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Behaviour {
    /// Sends nothing at all.
    Silent,
    /// As primary, sends a different pre-prepare (other time, other request order) to
    /// odd-numbered backups.
    Equivocator,
    /// Silent as primary; every view change it sends claims made-up requests prepared just
    /// above and far beyond its stable checkpoint, backed by a made-up checkpoint claim.
    Poisoner,
    /// Besides its honest traffic, relays requests naming another replica as origin with huge
    /// numbers, and its own requests with such numbers.
    ForgedRelays,
    /// With every message, also sends requests at the size limit from ever new clients and
    /// now and then a committed batch at the batch limit for a seq just ahead of the receiver.
    Flooder,
    /// With every message, also sends status reports claiming it delivered nothing.
    StatusSpammer,
    /// As primary, adds to each pre-prepare, for every other origin it has proposed requests
    /// of, a request of that origin's client numbered 2^32 - 1 above the latest one and one
    /// just within `max_number_jump` (see [`crate::actors::forge_origins`]). Backups never
    /// prepare such a batch (they hold no such request from its origin), so the view changes.
    OriginForger,
    /// As primary, fills every pre-prepare up to the batch limits with requests of its own
    /// origin, keeping the others' (see [`crate::actors::hog_batch`]). Backups refuse such a
    /// batch once it breaks the per-origin budget of the log, blame the primary and change
    /// views.
    BudgetHog,
}

/// The client the budget hog's own requests go under.
const HOG_CLIENT: u64 = 0xb0d6_e700;

/// One Byzantine replica's behaviour and the little state it keeps.
pub struct Byzantine {
    behaviour: Behaviour,
    me: ReplicaId,
    n: u16,
    window: u64,
    interval: u64,
    max_request_bytes: usize,
    batch_max_bytes: usize,
    max_number_jump: u64,
    counter: u64,
    rng: u64,
    /// The origin forger: each other origin's latest (client, number) it proposed.
    seen: std::collections::BTreeMap<ReplicaId, (u64, u64)>,
    batch_max_requests: usize,
    /// The budget hog: the batches it sent per (view, seq), the latest two windows (sent alike
    /// to every backup, and again so when retransmitted).
    hogged: std::collections::BTreeMap<(u64, u64), Proposal>,
}

impl Byzantine {
    /// For the replica configured by `config` (its id, window and limits shape the attacks).
    pub fn new(behaviour: Behaviour, config: &Config) -> Byzantine {
        Byzantine {
            behaviour,
            me: config.id,
            n: config.n,
            window: config.watermark_window,
            interval: config.checkpoint_interval,
            max_request_bytes: config.max_request_bytes,
            batch_max_bytes: config.batch_max_bytes,
            max_number_jump: config.max_number_jump,
            counter: 0,
            rng: 0x9e37_79b9_7f4a_7c15 ^ u64::from(config.id),
            seen: std::collections::BTreeMap::new(),
            batch_max_requests: config.batch_max_requests,
            hogged: std::collections::BTreeMap::new(),
        }
    }

    pub fn behaviour(&self) -> Behaviour {
        self.behaviour
    }

    fn next(&mut self) -> u64 {
        // xorshift64: reproducible per replica, no dependency.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// What is really sent instead of `message` to `to`.
    pub fn rewrite(&mut self, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        match self.behaviour {
            Behaviour::Silent => Vec::new(),
            Behaviour::Equivocator => vec![(to, equivocate(to, message))],
            Behaviour::Poisoner => self.poison(to, message),
            Behaviour::ForgedRelays => self.forge(to, message),
            Behaviour::Flooder => self.flood(to, message),
            Behaviour::OriginForger => match message {
                Message::PrePrepare { sender, view, seq, mut proposal } => {
                    // The same forgery to every backup (the driver rewrites per receiver).
                    crate::actors::forge_origins(&mut proposal, self.me, &mut self.seen, self.max_number_jump);
                    vec![(to, Message::PrePrepare { sender, view, seq, proposal })]
                }
                other => vec![(to, other)],
            },
            Behaviour::BudgetHog => match message {
                Message::PrePrepare { sender, view, seq, mut proposal } => {
                    match self.hogged.get(&(view, seq)) {
                        Some(hogged) => proposal = hogged.clone(),
                        None => {
                            let limits = (self.batch_max_requests, self.batch_max_bytes, self.max_request_bytes);
                            // Its own client, numbered on across batches.
                            crate::actors::hog_batch(&mut proposal, self.me, HOG_CLIENT, &mut self.counter, limits);
                            self.hogged.insert((view, seq), proposal.clone());
                            while self.hogged.len() as u64 > 2 * self.window {
                                self.hogged.pop_first();
                            }
                        }
                    }
                    vec![(to, Message::PrePrepare { sender, view, seq, proposal })]
                }
                other => vec![(to, other)],
            },
            Behaviour::StatusSpammer => {
                let report = StatusReport { sender: self.me, view: 0, view_changing: true, last_delivered: 0, stable_seq: 0, oldest_retained: 1 };
                let mut out = vec![(to, message)];
                out.extend((0..4).map(|_| (to, Message::Status(report))));
                out
            }
        }
    }

    fn poison(&mut self, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        match message {
            Message::PrePrepare { .. } | Message::NewView { .. } => Vec::new(),
            Message::ViewChange(mut vc) => {
                // Blatant in odd views (the first view change, to view 1, names it at once),
                // well-formed in even ones (left out by the new primary's search).
                let blatant = vc.view % 2 == 1;
                crate::actors::poison_view_change(&mut vc, self.me, self.window, self.interval, blatant);
                vec![(to, Message::ViewChange(vc))]
            }
            other => vec![(to, other)],
        }
    }

    fn forge(&mut self, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        let mut out = vec![(to, message)];
        if self.n > 1 && self.next() % 10 < 3 {
            self.counter += 1;
            let victim = ((u64::from(self.me) + 1 + self.next() % u64::from(self.n - 1)) % u64::from(self.n)) as ReplicaId;
            let number = if self.next() % 2 == 0 { u64::MAX } else { (1 << 40) + self.counter };
            let client = self.next() % 3;
            let forged = Request { origin: victim, client, number, payload: vec![0xf0; 8] };
            out.push((to, Message::Request { sender: self.me, request: forged }));
            let own = Request { origin: self.me, client, number, payload: vec![0xf1; 8] };
            out.push((to, Message::Request { sender: self.me, request: own }));
        }
        out
    }

    fn flood(&mut self, to: ReplicaId, message: Message) -> Vec<(ReplicaId, Message)> {
        let seq_hint = match &message {
            Message::PrePrepare { seq, .. } | Message::Prepare { seq, .. } | Message::Commit { seq, .. } => Some(*seq),
            Message::Status(report) => Some(report.last_delivered),
            _ => None,
        };
        let mut out = vec![(to, message)];
        let payload = self.max_request_bytes.saturating_sub(24);
        for _ in 0..2 {
            self.counter += 1;
            let request = Request { origin: self.me, client: 1_000 + self.counter, number: 1, payload: vec![0xf2; payload] };
            out.push((to, Message::Request { sender: self.me, request }));
        }
        if self.next() % 20 == 0 {
            // One byte over the limit: refused and blamed.
            self.counter += 1;
            let request = Request { origin: self.me, client: 7, number: self.counter, payload: vec![0xf3; payload + 1] };
            out.push((to, Message::Request { sender: self.me, request }));
        }
        if let Some(seq) = seq_hint {
            if self.next() % 2 == 0 {
                let per = self.max_request_bytes.max(25);
                let count = (self.batch_max_bytes.saturating_sub(16) / per).max(1);
                let fill = self.next() as u8;
                let requests = (0..count).map(|i| Request { origin: self.me, client: 9, number: i as u64 + 1, payload: vec![fill; per - 24] }).collect();
                let ahead = seq + 1 + self.next() % self.window.max(1);
                out.push((to, Message::Committed { sender: self.me, seq: ahead, proposal: Proposal { time: Time(3), requests } }));
            }
        }
        out
    }
}

fn equivocate(to: ReplicaId, message: Message) -> Message {
    match message {
        Message::PrePrepare { sender, view, seq, mut proposal } if to % 2 == 1 => {
            proposal.time = Time(proposal.time.0 + 1);
            proposal.requests.reverse();
            Message::PrePrepare { sender, view, seq, proposal }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepare(seq: u64) -> Message {
        Message::Prepare { sender: 1, view: 0, seq, digest: [1; 32] }
    }

    #[test]
    fn behaviours_rewrite_as_documented() {
        let config = Config::new(4, 1);
        let mut silent = Byzantine::new(Behaviour::Silent, &config);
        assert!(silent.rewrite(0, prepare(1)).is_empty());

        let mut flooder = Byzantine::new(Behaviour::Flooder, &config);
        let out = flooder.rewrite(2, prepare(5));
        assert_eq!(out[0], (2, prepare(5)));
        assert!(out.len() >= 3 && out.iter().all(|(to, _)| *to == 2));
        assert!(matches!(&out[1].1, Message::Request { request, .. } if request.payload.len() + 24 == config.max_request_bytes));

        let mut spammer = Byzantine::new(Behaviour::StatusSpammer, &config);
        assert_eq!(spammer.rewrite(3, prepare(1)).len(), 5);

        let mut forger = Byzantine::new(Behaviour::ForgedRelays, &config);
        let forged =
            (0..50).flat_map(|_| forger.rewrite(0, prepare(1))).filter(|(_, m)| matches!(m, Message::Request { request, .. } if request.origin != 1)).count();
        assert!(forged > 0, "forged relays name another origin");

        let proposal = Proposal {
            time: Time(10),
            requests: vec![Request { origin: 0, client: 1, number: 1, payload: vec![1] }, Request { origin: 0, client: 1, number: 2, payload: vec![2] }],
        };
        let mut forger = Byzantine::new(Behaviour::OriginForger, &Config::new(4, 0));
        let mut carried = proposal.clone();
        carried.requests.push(Request { origin: 2, client: 5, number: 7, payload: vec![3] });
        let out = forger.rewrite(1, Message::PrePrepare { sender: 0, view: 0, seq: 1, proposal: carried });
        let Message::PrePrepare { proposal: forged, .. } = &out[0].1 else { panic!("{out:?}") };
        let numbers: Vec<u64> = forged.requests.iter().filter(|r| r.origin == 2).map(|r| r.number).collect();
        assert_eq!(numbers, vec![7, 7 + (1 << 32) - 1, 7 + Config::new(4, 0).max_number_jump - 1], "origin 2's client, above its latest number");
        let pp = Message::PrePrepare { sender: 0, view: 0, seq: 1, proposal };
        let mut eq = Byzantine::new(Behaviour::Equivocator, &Config::new(4, 0));
        let to_even = eq.rewrite(2, pp.clone());
        let to_odd = eq.rewrite(1, pp.clone());
        assert_eq!(to_even, vec![(2, pp.clone())]);
        assert_ne!(to_odd, vec![(1, pp)]);
    }

    #[test]
    fn the_budget_hog_fills_each_batch_to_the_limits_alike_for_every_backup() {
        let config = Config::new(4, 0);
        let mut hog = Byzantine::new(Behaviour::BudgetHog, &config);
        let honest = Request { origin: 2, client: 5, number: 1, payload: vec![1; 100] };
        let pp = Message::PrePrepare { sender: 0, view: 0, seq: 3, proposal: Proposal { time: Time(10), requests: vec![honest.clone()] } };
        let to_one = hog.rewrite(1, pp.clone());
        let to_two = hog.rewrite(2, pp.clone());
        assert_eq!(to_one[0].1, to_two[0].1, "the same batch to every backup");
        let Message::PrePrepare { proposal, .. } = &to_one[0].1 else { panic!("{to_one:?}") };
        assert_eq!(proposal.requests[0], honest, "the others' requests are kept");
        let own: Vec<&Request> = proposal.requests.iter().filter(|r| r.origin == 0).collect();
        assert!(!own.is_empty() && proposal.requests.len() <= config.batch_max_requests);
        let bytes: usize = proposal.requests.iter().map(Request::wire_size).sum();
        assert!(bytes <= config.batch_max_bytes && bytes + config.max_request_bytes > config.batch_max_bytes, "{bytes} bytes: full");
        assert!(own.iter().all(|r| r.wire_size() <= config.max_request_bytes));
    }
}
