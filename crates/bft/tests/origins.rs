//! Origins are authenticated end to end: a Byzantine primary cannot put a request under another
//! origin into the log, and a Byzantine origin cannot make an honest primary's batch stall.

use std::collections::{BTreeSet, VecDeque};

use bft::{Action, Batch, Config, Message, Replica, ReplicaId, Request, Time};

fn request(origin: u16, client: u64, number: u64) -> Request {
    Request { origin, client, number, payload: vec![origin as u8; 10] }
}

/// What replica `from` really sends to `to` in place of `message`.
type Rewrite = dyn FnMut(ReplicaId, ReplicaId, Message) -> Vec<Message>;

/// Instant, lossless delivery with `rewrite` applied to every message; idle rounds move the
/// clock by 10 ms so timers fire. Returns delivered batches per replica.
fn run(replicas: &mut [Replica], now: &mut Time, rounds: usize, rewrite: &mut Rewrite) -> Vec<Vec<Batch>> {
    let n = replicas.len();
    let mut delivered = vec![Vec::new(); n];
    let mut queue: VecDeque<(u16, u16, Vec<u8>)> = VecDeque::new();
    for _ in 0..rounds {
        for (index, replica) in replicas.iter_mut().enumerate() {
            while let Some(action) = replica.poll_action() {
                let (targets, message): (Vec<usize>, Message) = match action {
                    Action::Send { to, message } => (vec![usize::from(to)], message),
                    Action::Broadcast { message } => ((0..n).filter(|to| *to != index).collect(), message),
                    Action::Deliver(batch) => {
                        if batch.checkpoint_due {
                            replica.checkpoint(batch.seq, [batch.seq as u8; 32]).unwrap();
                        }
                        delivered[index].push(batch);
                        continue;
                    }
                    _ => continue,
                };
                for to in targets {
                    for message in rewrite(index as u16, to as u16, message.clone()) {
                        queue.push_back((index as u16, to as u16, message.encode()));
                    }
                }
            }
        }
        if queue.is_empty() {
            *now = Time(now.0 + 10_000);
            for replica in replicas.iter_mut() {
                replica.handle_timeout(*now);
            }
        }
        while let Some((from, to, bytes)) = queue.pop_front() {
            let message = Message::decode(&bytes, replicas[usize::from(to)].config().limits()).unwrap();
            replicas[usize::from(to)].handle_message(*now, from, message);
        }
    }
    delivered
}

fn honest(_: ReplicaId, _: ReplicaId, message: Message) -> Vec<Message> {
    vec![message]
}

/// The attack: as primary, replica 0 adds to every pre-prepare, for each other origin,
/// a request of that origin's client numbered 2^32 - 1 above its highest, one just within the
/// jump, one just above its highest, one far below it and one with the key of a delivered
/// request under other bytes. None of them is ever delivered, the primary is replaced by a
/// view change, and the honest origins' later requests are all delivered.
#[test]
fn a_primary_cannot_forge_requests_of_other_origins() {
    let mut now = Time(1_000_000);
    let mut replicas: Vec<Replica> = (0..4).map(|id| Replica::new(Config::new(4, id), now).unwrap()).collect();
    let jump = replicas[0].config().max_number_jump;
    let mut submitted: BTreeSet<(u16, u64, u64, Vec<u8>)> = BTreeSet::new();
    // Every origin gets its client's number 10 delivered first, honestly.
    for origin in 1..4u16 {
        let r = request(origin, 1, 10);
        replicas[usize::from(origin)].submit(now, r.clone()).unwrap();
        submitted.insert((r.origin, r.client, r.number, r.payload));
    }
    let first = run(&mut replicas, &mut now, 50, &mut honest);
    assert!(first.iter().all(|batches| batches.iter().map(|b| b.requests.len()).sum::<usize>() == 3), "{first:?}");

    let high = 10u64;
    let mut forge = move |from: ReplicaId, _to: ReplicaId, message: Message| -> Vec<Message> {
        match message {
            Message::PrePrepare { sender, view, seq, mut proposal } if from == 0 => {
                for origin in 1..4u16 {
                    for number in [high + (1 << 32) - 1, high + jump, high + 1, 1] {
                        proposal.requests.push(Request { origin, client: 1, number, payload: vec![0xf0; 10] });
                    }
                    proposal.requests.push(Request { origin, client: 1, number: high, payload: vec![0xf1; 10] });
                }
                vec![Message::PrePrepare { sender, view, seq, proposal }]
            }
            other => vec![other],
        }
    };
    for number in 11..=13 {
        for origin in 1..4u16 {
            let r = request(origin, 1, number);
            replicas[usize::from(origin)].submit(now, r.clone()).unwrap();
            submitted.insert((r.origin, r.client, r.number, r.payload));
        }
    }
    let second = run(&mut replicas, &mut now, 2_000, &mut forge);
    for id in 1..4 {
        let all: Vec<&Request> = first[id].iter().chain(&second[id]).flat_map(|b| &b.requests).collect();
        for r in &all {
            if r.origin != 0 {
                assert!(submitted.contains(&(r.origin, r.client, r.number, r.payload.clone())), "replica {id} delivered a forged {r:?}");
            }
        }
        let keys: BTreeSet<(u16, u64, u64)> = all.iter().map(|r| (r.origin, r.client, r.number)).collect();
        let expected: BTreeSet<(u16, u64, u64)> = submitted.iter().map(|(o, c, n, _)| (*o, *c, *n)).collect();
        assert_eq!(keys, expected, "replica {id} delivered every honest request");
        assert!(replicas[id].status().view >= 1, "the forging primary was replaced");
    }
    // And the honest origins go on being served after it.
    for origin in 1..4u16 {
        replicas[usize::from(origin)].submit(now, request(origin, 1, 14)).unwrap();
    }
    let third = run(&mut replicas, &mut now, 500, &mut forge);
    for batches in &third[1..] {
        assert_eq!(batches.iter().map(|b| b.requests.len()).sum::<usize>(), 3, "{batches:?}");
    }
}

/// A Byzantine origin (replica 3) sends a request to the primary only: an honest primary does
/// not propose it (its backups could not vouch for it and the batch would stall), so the
/// others' requests are ordered in view 0, without a view change. Once the request reaches
/// 2f replicas besides the primary it is ordered.
#[test]
fn a_request_given_to_the_primary_alone_does_not_stall_its_batches() {
    let mut now = Time(1_000_000);
    let mut replicas: Vec<Replica> = (0..4).map(|id| Replica::new(Config::new(4, id), now).unwrap()).collect();
    let hidden = request(3, 9, 1);
    replicas[0].handle_message(now, 3, Message::Request { sender: 3, request: hidden.clone() });
    for origin in 1..3u16 {
        replicas[usize::from(origin)].submit(now, request(origin, 1, 1)).unwrap();
    }
    let delivered = run(&mut replicas, &mut now, 300, &mut honest);
    for (id, batches) in delivered.iter().enumerate().take(3) {
        let keys: Vec<(u16, u64)> = batches.iter().flat_map(|b| b.requests.iter().map(|r| (r.origin, r.client))).collect();
        assert_eq!(keys.len(), 2, "replica {id}: {keys:?}");
        assert!(!keys.contains(&(3, 9)), "replica {id} delivered the hidden request");
        assert_eq!(replicas[id].status().view, 0, "no view change");
    }
    // Replica 3 now gives it to replica 1 as well: the primary holds it from 2f = 2 replicas
    // (the origin and replica 1), so it is ordered.
    replicas[1].handle_message(now, 3, Message::Request { sender: 3, request: hidden });
    let delivered = run(&mut replicas, &mut now, 300, &mut honest);
    for batches in &delivered[..3] {
        let keys: Vec<(u16, u64)> = batches.iter().flat_map(|b| b.requests.iter().map(|r| (r.origin, r.client))).collect();
        assert_eq!(keys, vec![(3, 9)]);
    }
}

/// A request submitted at a backup goes to every replica at once and is ordered; a fresh
/// request numbered beyond the jump is refused at submit, so the gateway can renumber.
#[test]
fn backup_requests_are_ordered_and_far_numbers_refused() {
    let mut now = Time(1_000_000);
    let mut replicas: Vec<Replica> = (0..4).map(|id| Replica::new(Config::new(4, id), now).unwrap()).collect();
    let jump = replicas[2].config().max_number_jump;
    assert_eq!(replicas[2].submit(now, request(2, 1, jump + 1)), Err(bft::SubmitError::NumberTooFar));
    replicas[2].submit(now, request(2, 1, jump)).unwrap();
    let sent: Vec<Action> = std::iter::from_fn(|| replicas[2].poll_action()).collect();
    assert!(sent.iter().any(|a| matches!(a, Action::Broadcast { message: Message::Request { .. } })), "to everyone at once: {sent:?}");
    let delivered = run(&mut replicas, &mut now, 100, &mut honest);
    assert!(delivered.iter().all(|batches| batches.len() == 1 && batches[0].requests[0].number == jump), "{delivered:?}");
}

/// A backup's `Holds` claim that overtakes the request it claims (the origin sends to every
/// replica at once, over different links) is kept by the primary and counted when the
/// request comes. With replica 3 down, the origin (replica 1) and replica 2 are the only 2f
/// holders the primary can have; dropping the early claim left the request waiting for
/// replica 2's repeat an interval later, and backups suspected the primary meanwhile
/// (tests/statexfer.rs saw it on real processes).
#[test]
fn a_holds_claim_that_overtakes_its_request_is_kept() {
    let mut now = Time(1_000_000);
    let mut replicas: Vec<Replica> = (0..4).map(|id| Replica::new(Config::new(4, id), now).unwrap()).collect();
    let interval_us = replicas[0].config().retransmit_interval.as_micros() as u64;
    // Replica 3 is down; the origin's request to the primary is held back until replica 2's
    // claim has arrived.
    let held_back = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let stash = held_back.clone();
    let mut rewrite = move |from: ReplicaId, to: ReplicaId, message: Message| -> Vec<Message> {
        if from == 3 || to == 3 {
            return Vec::new();
        }
        if from == 1 && to == 0 && matches!(message, Message::Request { .. }) {
            stash.borrow_mut().push(message);
            return Vec::new();
        }
        vec![message]
    };
    let r = request(1, 1, 1);
    replicas[1].submit(now, r.clone()).unwrap();
    let start = now;
    let first = run(&mut replicas, &mut now, 3, &mut rewrite);
    assert!(first.iter().all(Vec::is_empty), "nothing ordered before the primary holds it");
    let late: Vec<Message> = held_back.borrow_mut().drain(..).collect();
    assert_eq!(late.len(), 1, "the origin's request to the primary was held back");
    for message in late {
        replicas[0].handle_message(now, 1, message);
    }
    // A few message rounds, well within one retransmit interval of virtual time: the claim
    // must come from what the primary kept, not from the claimer's repeat.
    let delivered = run(&mut replicas, &mut now, 8, &mut rewrite);
    assert!(now.0 - start.0 < interval_us, "the run stayed within one interval ({} us)", now.0 - start.0);
    for (id, batches) in delivered.iter().enumerate().take(3) {
        let keys: Vec<(u16, u64, u64)> = batches.iter().flat_map(|b| b.requests.iter().map(|r| (r.origin, r.client, r.number))).collect();
        assert_eq!(keys, vec![(1, 1, 1)], "replica {id}");
        assert_eq!(replicas[id].status().view, 0, "no view change at replica {id}");
    }
}

/// A small budget so that a test reaches it: a bucket of 8 KiB (one batch's bytes).
fn budget_config(id: ReplicaId, rate: usize) -> Config {
    let mut config = Config::new(4, id);
    config.batch_max_bytes = 8 * 1024;
    config.max_request_bytes = 4 * 1024;
    config.max_origin_bytes_per_sec = rate;
    config.min_request_charge = 512;
    config
}

/// The budget hog: as primary, replica 0 fills every pre-prepare with small requests of its own
/// (charged 512 bytes each, far over its bucket) while keeping the honest ones. Backups refuse
/// the batch, blame the primary for it and change views; the honest requests are delivered by
/// the next primary and none of the hog's requests beyond its bucket is.
#[test]
fn a_primary_over_an_origin_budget_is_refused_blamed_and_replaced() {
    let mut now = Time(1_000_000);
    let mut replicas: Vec<Replica> = (0..4).map(|id| Replica::new(budget_config(id, 10_000), now).unwrap()).collect();
    let config = replicas[0].config().clone();
    for origin in 1..4u16 {
        replicas[usize::from(origin)].submit(now, request(origin, 1, 1)).unwrap();
    }
    let mut hog = move |from: ReplicaId, _to: ReplicaId, message: Message| -> Vec<Message> {
        match message {
            Message::PrePrepare { sender, view, seq, mut proposal } if from == 0 => {
                // The same batch to every backup: rewritten once per (view, seq) by numbering
                // from the seq.
                let mut number = seq * 1_000;
                bft::actors::hog_batch(&mut proposal, 0, 77, &mut number, (config.batch_max_requests, config.batch_max_bytes, config.max_request_bytes));
                vec![Message::PrePrepare { sender, view, seq, proposal }]
            }
            other => vec![other],
        }
    };
    let delivered = run(&mut replicas, &mut now, 2_000, &mut hog);
    for id in 1..4 {
        let status = replicas[id].status();
        assert!(status.faults.get(&(0, "batch over the origin budget")).is_some_and(|count| *count > 0), "replica {id} blamed the hog: {:?}", status.faults);
        assert!(status.view >= 1, "the hog was replaced");
        let requests: Vec<&Request> = delivered[id].iter().flat_map(|b| &b.requests).collect();
        for origin in 1..4u16 {
            assert!(requests.iter().any(|r| r.origin == origin && r.number == 1), "replica {id} delivered origin {origin}'s request");
        }
        let hogged: usize = requests.iter().filter(|r| r.origin == 0).map(|r| r.wire_size().max(512)).sum();
        assert!(hogged <= config.batch_max_bytes + config.max_request_bytes, "replica {id} delivered {hogged} bytes of the hog's, beyond its bucket");
    }
}

/// An honest origin that submits far more than its budget (200 small requests, charged 512
/// bytes each: 100 KiB at 40 KB/s, from an 8 KiB bucket) is served at the budget's rate: an
/// honest primary proposes by the rule the backups check, so none of its batches is refused
/// (nobody is blamed), every request is delivered, and the log carries no more than the
/// budget over its span.
#[test]
fn an_honest_origin_over_its_budget_is_served_at_its_rate_and_nobody_is_blamed() {
    let rate = 40_000usize;
    let mut now = Time(1_000_000);
    let mut replicas: Vec<Replica> = (0..4).map(|id| Replica::new(budget_config(id, rate), now).unwrap()).collect();
    for number in 1..=200 {
        replicas[1].submit(now, request(1, 1, number)).unwrap();
    }
    replicas[2].submit(now, request(2, 1, 1)).unwrap();
    let delivered = run(&mut replicas, &mut now, 20_000, &mut honest);
    for (id, replica) in replicas.iter().enumerate() {
        let status = replica.status();
        assert!(status.misbehaviour.iter().all(|count| *count == 0), "replica {id} blamed someone: {:?}", status.faults);
        let batches = &delivered[id];
        let requests: Vec<&Request> = batches.iter().flat_map(|b| &b.requests).collect();
        assert_eq!(requests.iter().filter(|r| r.origin == 1).count(), 200, "replica {id} delivered all of origin 1's requests");
        assert!(requests.iter().any(|r| r.origin == 2), "replica {id} delivered origin 2's request");
        let first = batches.first().map_or(0, |b| b.time.0);
        let last = batches.last().map_or(0, |b| b.time.0);
        let allowed = 8 * 1024 + (last - first) as usize * rate / 1_000_000 + 512;
        assert!(200 * 512 <= allowed, "replica {id}: 102,400 bytes of origin 1 in {} us, more than the budget's {allowed}", last - first);
    }
}
