//! Small deterministic scenarios: one replica alone, four replicas without faults, codec round trips.

use std::collections::VecDeque;

use bft::{Action, Batch, Config, Message, Replica, Request, Time};

fn request(origin: u16, client: u64, number: u64) -> Request {
    Request { origin, client, number, payload: vec![7; 10] }
}

/// Runs replicas with instant, lossless delivery; returns delivered batches per replica.
fn run(replicas: &mut [Replica], mut now: Time, rounds: usize) -> Vec<Vec<Batch>> {
    let mut delivered = vec![Vec::new(); replicas.len()];
    let mut queue: VecDeque<(u16, u16, Vec<u8>)> = VecDeque::new();
    for _ in 0..rounds {
        for (index, replica) in replicas.iter_mut().enumerate() {
            while let Some(action) = replica.poll_action() {
                match action {
                    Action::Send { to, message } => queue.push_back((index as u16, to, message.encode())),
                    Action::Broadcast { message } => {
                        let bytes = message.encode();
                        for to in 0..replicas_len(index, &delivered) {
                            if to != index {
                                queue.push_back((index as u16, to as u16, bytes.clone()));
                            }
                        }
                    }
                    Action::Deliver(batch) => {
                        if batch.checkpoint_due {
                            replica.checkpoint(batch.seq, [batch.seq as u8; 32]).unwrap();
                        }
                        delivered[index].push(batch)
                    }
                    // Nothing restarts here, so what a replica would persist is not kept.
                    Action::Persist(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        if queue.is_empty() {
            now = Time(now.0 + 1000);
            for replica in replicas.iter_mut() {
                if replica.poll_timeout().is_some_and(|t| t <= now) {
                    replica.handle_timeout(now);
                }
            }
        }
        while let Some((from, to, bytes)) = queue.pop_front() {
            let limits = replicas[to as usize].config().limits();
            let message = Message::decode(&bytes, limits).unwrap();
            assert_eq!(message.encode(), bytes);
            replicas[to as usize].handle_message(now, from, message);
        }
    }
    delivered
}

fn replicas_len(_index: usize, delivered: &[Vec<Batch>]) -> usize {
    delivered.len()
}

#[test]
fn single_replica_orders_alone() {
    let mut config = Config::new(1, 0);
    config.checkpoint_interval = 2;
    config.watermark_window = 4;
    let mut replica = Replica::new(config, Time(1_000_000)).unwrap();
    for number in 1..=10 {
        replica.submit(Time(1_000_000 + number), request(0, 1, number)).unwrap();
    }
    let delivered = run(std::slice::from_mut(&mut replica), Time(1_000_100), 50);
    let numbers: Vec<u64> = delivered[0].iter().flat_map(|b| b.requests.iter().map(|r| r.number)).collect();
    assert_eq!(numbers, (1..=10).collect::<Vec<_>>());
    assert!(replica.status().stable_checkpoint >= 2);
}

#[test]
fn four_replicas_agree_without_faults() {
    let start = Time(1_000_000);
    let mut replicas: Vec<Replica> = (0..4).map(|id| Replica::new(Config::new(4, id), start).unwrap()).collect();
    for number in 1..=300u64 {
        let at = (number % 4) as usize;
        replicas[at].submit(start, request(at as u16, 9, number)).unwrap();
    }
    let delivered = run(&mut replicas, start, 400);
    for batches in &delivered {
        assert_eq!(batches, &delivered[0]);
    }
    let total: usize = delivered[0].iter().map(|b| b.requests.len()).sum();
    assert_eq!(total, 300);
    assert!(delivered[0].windows(2).all(|w| w[0].time < w[1].time && w[0].seq + 1 == w[1].seq));
    assert!(replicas.iter().all(|r| r.status().misbehaviour.iter().all(|c| *c == 0)));
}

#[test]
fn duplicate_submission_is_delivered_once() {
    let start = Time(5_000_000);
    let mut replicas: Vec<Replica> = (0..4).map(|id| Replica::new(Config::new(4, id), start).unwrap()).collect();
    replicas[1].submit(start, request(1, 3, 1)).unwrap();
    let delivered = run(&mut replicas, start, 50);
    assert_eq!(delivered[1].iter().map(|b| b.requests.len()).sum::<usize>(), 1);
    assert_eq!(replicas[1].submit(start, request(1, 3, 1)), Err(bft::SubmitError::AlreadyDelivered));
}

#[test]
fn claimed_sender_must_match_channel() {
    let mut replica = Replica::new(Config::new(4, 1), Time(0)).unwrap();
    let message = Message::Prepare { sender: 2, view: 0, seq: 1, digest: [0; 32] };
    replica.handle_message(Time(0), 3, message);
    assert_eq!(replica.status().misbehaviour, vec![0, 0, 0, 1]);
}

#[test]
fn bad_configs_are_refused() {
    let mut config = Config::new(4, 0);
    config.f = 2;
    assert!(Replica::new(config, Time(0)).is_err());
    assert!(Replica::new(Config::new(4, 4), Time(0)).is_err());
    let mut config = Config::new(4, 0);
    config.watermark_window = 100;
    assert!(Replica::new(config, Time(0)).is_err());
}

/// Rounds of message delays from submission to delivery at every replica, with instant links.
fn latency_rounds(n: u16, submit_at: u16) -> usize {
    let start = Time(1_000_000);
    let mut replicas: Vec<Replica> = (0..n).map(|id| Replica::new(Config::new(n, id), start).unwrap()).collect();
    replicas[usize::from(submit_at)].submit(start, request(submit_at, 1, 1)).unwrap();
    let mut delivered = vec![false; usize::from(n)];
    for round in 0..20 {
        let mut queue = Vec::new();
        for (index, replica) in replicas.iter_mut().enumerate() {
            while let Some(action) = replica.poll_action() {
                match action {
                    Action::Send { to, message } => queue.push((index as u16, to, message)),
                    Action::Broadcast { message } => {
                        for to in (0..n).filter(|to| usize::from(*to) != index) {
                            queue.push((index as u16, to, message.clone()));
                        }
                    }
                    Action::Deliver(_) => delivered[index] = true,
                    _ => {}
                }
            }
        }
        if delivered.iter().all(|d| *d) {
            return round;
        }
        for (from, to, message) in queue {
            replicas[usize::from(to)].handle_message(start, from, message);
        }
    }
    usize::MAX
}

#[test]
fn normal_case_takes_three_message_delays() {
    // pre-prepare, prepare, commit; two more when a backup is the origin: its request to every
    // replica, then the others' `Holds` to the primary (which proposes another origin's
    // request only once 2f replicas hold it, so that its backups can vouch for it).
    for n in [4, 7] {
        assert_eq!(latency_rounds(n, 0), 3, "n={n} at the primary");
        assert_eq!(latency_rounds(n, 1), 5, "n={n} at a backup");
    }
}

/// Peers may send any well-formed message; none may panic the core or break its invariants
/// (debug assertions run at the end of every step in test builds).
#[test]
fn random_peer_messages_never_panic() {
    use bft::{CheckpointClaim, NewView, PrePreparedEntry, PreparedEntry, Proposal, StatusReport, ViewChange};
    use rand_chacha::rand_core::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(77);
    let mut small = move |bound: u64| rng.next_u64() % bound;
    for id in 0..4u16 {
        let mut config = Config::new(4, id);
        config.checkpoint_interval = 4;
        config.watermark_window = 8;
        let mut replica = Replica::new(config, Time(1_000_000)).unwrap();
        let mut now = 1_000_000u64;
        for step in 0..20_000u64 {
            now += small(50_000);
            let from = small(4) as u16;
            let view = small(4);
            let seq = small(24);
            let digest = [small(3) as u8; 32];
            let proposal =
                Proposal { time: Time(now + small(3) * 1000), requests: (0..small(3)).map(|k| request(small(4) as u16, small(3), k + small(5))).collect() };
            let claim = CheckpointClaim { seq: small(4) * 4, time: Time(small(3)), log_digest: [small(2) as u8; 32], state_digest: [small(2) as u8; 32] };
            let message = match small(10) {
                0 => Message::Request { sender: from, request: request(from, small(3), small(20)) },
                1 => Message::PrePrepare { sender: from, view, seq, proposal },
                2 => Message::Prepare { sender: from, view, seq, digest },
                3 => Message::Commit { sender: from, view, seq, digest },
                4 => Message::Checkpoint { sender: from, checkpoint: claim },
                5 => Message::ViewChange(ViewChange {
                    sender: from,
                    view: view + 1,
                    stable: claim,
                    checkpoints: vec![],
                    prepared: vec![PreparedEntry { seq: claim.seq + 1, view, proposal }],
                    pre_prepared: vec![PrePreparedEntry { seq: claim.seq + 1, view, digest }],
                }),
                6 => Message::NewView {
                    sender: from,
                    new_view: NewView {
                        view: view + 1,
                        view_changes: vec![(0, digest), (1, digest), (2, digest)],
                        checkpoint: claim,
                        proposals: vec![(claim.seq + 1, proposal)],
                    },
                },
                7 => Message::Status(StatusReport {
                    sender: from,
                    view,
                    view_changing: small(2) == 0,
                    last_delivered: seq,
                    stable_seq: claim.seq,
                    oldest_retained: small(10),
                }),
                8 => Message::Committed { sender: from, seq, proposal },
                _ => {
                    replica.handle_timeout(Time(now));
                    continue;
                }
            };
            replica.handle_message(Time(now), from, message);
            if step % 7 == 0 {
                let _ = replica.submit(Time(now), request(id, 9, step));
            }
            while let Some(action) = replica.poll_action() {
                if let Action::Deliver(batch) = action {
                    if batch.checkpoint_due {
                        let _ = replica.checkpoint(batch.seq, [1; 32]);
                    }
                }
            }
        }
    }
}

#[test]
fn state_transfer_is_requested_when_the_log_is_gone() {
    let mut config = Config::new(4, 3);
    config.checkpoint_interval = 4;
    config.watermark_window = 8;
    let mut replica = Replica::new(config, Time(0)).unwrap();
    let claim = bft::CheckpointClaim { seq: 40, time: Time(40), log_digest: [4; 32], state_digest: [5; 32] };
    for peer in 0..3u16 {
        replica.handle_message(Time(1), peer, Message::Checkpoint { sender: peer, checkpoint: claim });
    }
    assert_eq!(replica.status().stable_checkpoint, 40);
    for peer in 0..2u16 {
        let report = bft::StatusReport { sender: peer, view: 0, view_changing: false, last_delivered: 45, stable_seq: 40, oldest_retained: 30 };
        replica.handle_message(Time(2), peer, Message::Status(report));
    }
    let mut requested = Vec::new();
    while let Some(action) = replica.poll_action() {
        if let Action::NeedStateTransfer { last_delivered, checkpoint } = action {
            requested.push((last_delivered, checkpoint));
        }
    }
    assert_eq!(requested, vec![(0, claim)]);
}

/// Replica 3 of four (checkpoints every 4 batches), behind checkpoint 40, which peers 0 to 2
/// certified with `clients` as their deduplication table there and sent it to state transfer.
fn replica_behind_checkpoint_40(clients: Vec<bft::ClientEntry>) -> (Replica, bft::Transferred) {
    let mut config = Config::new(4, 3);
    config.checkpoint_interval = 4;
    config.watermark_window = 8;
    let mut replica = Replica::new(config, Time(0)).unwrap();
    let application_digest = [5; 32];
    let base = bft::DeliveryBase { seq: 40, time: Time(40), log_digest: [4; 32], clients, budgets: Default::default() };
    let state_digest = bft::checkpoint_state_digest(&application_digest, &base);
    let claim = bft::CheckpointClaim { seq: 40, time: Time(40), log_digest: [4; 32], state_digest };
    for peer in 0..3u16 {
        replica.handle_message(Time(1), peer, Message::Checkpoint { sender: peer, checkpoint: claim });
    }
    let report = |peer| bft::StatusReport { sender: peer, view: 0, view_changing: false, last_delivered: 45, stable_seq: 40, oldest_retained: 30 };
    for peer in 0..2u16 {
        replica.handle_message(Time(2), peer, Message::Status(report(peer)));
    }
    while replica.poll_action().is_some() {}
    (replica, bft::Transferred { claim, application_digest, base })
}

/// Batch 41, pushed by f+1 peers: the (seq, number of requests) the replica delivers.
fn push_batch_41(replica: &mut Replica, requests: Vec<Request>) -> Vec<(u64, usize)> {
    let proposal = bft::Proposal { time: Time(50), requests };
    for peer in 0..2u16 {
        replica.handle_message(Time(3), peer, Message::Committed { sender: peer, seq: 41, proposal: proposal.clone() });
    }
    let mut delivered = Vec::new();
    while let Some(action) = replica.poll_action() {
        if let Action::Deliver(batch) = action {
            delivered.push((batch.seq, batch.requests.len()));
        }
    }
    delivered
}

#[test]
fn an_installed_checkpoint_resumes_delivery_after_it() {
    let (mut replica, transferred) = replica_behind_checkpoint_40(Vec::new());
    let claim = transferred.claim;

    // Only the certified checkpoint can be installed, and only ahead of the log.
    let forged = bft::CheckpointClaim { state_digest: [6; 32], ..claim };
    assert!(matches!(replica.state_transferred(bft::Transferred { claim: forged, ..transferred.clone() }), Err(bft::StateTransferError::NotCertified { .. })));
    assert_eq!(replica.status().last_delivered, 0);
    replica.state_transferred(transferred.clone()).unwrap();
    assert_eq!(replica.status().last_delivered, 40);
    assert!(matches!(replica.state_transferred(transferred), Err(bft::StateTransferError::NotAhead { .. })));

    // What it persists now resumes at the installed checkpoint (the application executed up to
    // there), so a restart right after the transfer starts cleanly.
    let persisted = match replica.poll_action() {
        Some(Action::Persist(bft::Persist::Snapshot { bytes, .. })) => bft::PersistedState::decode_snapshot(&bytes).unwrap(),
        other => panic!("expected a snapshot of the ordering state after the transfer, got {other:?}"),
    };
    assert_eq!(persisted.deliverable(), 40);
    assert_eq!(persisted.stable_checkpoint(), claim);
    let mut restarted = Replica::restore(replica.config().clone(), Time(3), persisted).unwrap();
    assert_eq!(restarted.status().last_delivered, 40);
    assert!(std::iter::from_fn(|| restarted.poll_action()).all(|a| !matches!(a, Action::Deliver(_))), "nothing to deliver again below the checkpoint");

    // Batches after the checkpoint, pushed by f+1 peers, are delivered from 41 on.
    assert_eq!(push_batch_41(&mut replica, vec![request(1, 7, 1)]), vec![(41, 1)]);
    assert!(replica.status().last_time >= Time(50));
}

#[test]
fn a_request_that_could_never_be_delivered_is_not_ordered() {
    // Replica 3 sends the primary its own requests with numbers no honest gateway uses:
    // ordering them would cost the cluster a batch each while delivering nothing.
    let start = Time(1_000_000);
    let mut replicas: Vec<Replica> = (0..4).map(|id| Replica::new(Config::new(4, id), start).unwrap()).collect();
    let jump = replicas[0].config().max_number_jump;
    for number in [jump + 1, u64::MAX] {
        replicas[0].handle_message(start, 3, Message::Request { sender: 3, request: request(3, 5, number) });
    }
    assert_eq!(replicas[0].status().misbehaviour, vec![0, 0, 0, 2], "the sender is blamed for each");
    replicas[3].submit(start, request(3, 5, jump)).unwrap();
    let delivered = run(&mut replicas, start, 50);
    for batches in &delivered {
        let numbers: Vec<u64> = batches.iter().flat_map(|b| b.requests.iter().map(|r| r.number)).collect();
        assert_eq!(numbers, vec![jump], "only the deliverable request is ordered");
        assert_eq!(batches.len(), 1, "no batch was spent on the others");
    }
}

/// Request (origin 1, client 7, number 1) was delivered in batch 37, which this replica
/// skipped by installing checkpoint 40. A Byzantine primary proposes it again in batch 41:
/// the replica does not deliver it again, as its peers (whose table has it) do not.
#[test]
fn a_transferred_replica_does_not_deliver_a_request_of_the_skipped_part_again() {
    let delivered_at_37 = bft::ClientEntry { origin: 1, client: 7, high: 1, mask: 1, last_seq: 37 };
    let (mut replica, transferred) = replica_behind_checkpoint_40(vec![delivered_at_37]);

    // A table other than the certified one (a lying peer's snapshot) is refused, and nothing
    // is installed.
    let mut emptied = transferred.clone();
    emptied.base.clients.clear();
    assert!(matches!(replica.state_transferred(emptied), Err(bft::StateTransferError::BadBase { .. })));
    let mut moved = transferred.clone();
    moved.base.log_digest = [9; 32];
    assert!(matches!(replica.state_transferred(moved), Err(bft::StateTransferError::BadBase { .. })));
    assert_eq!(replica.status().last_delivered, 0);

    replica.state_transferred(transferred).unwrap();
    assert_eq!(push_batch_41(&mut replica, vec![request(1, 7, 1), request(1, 7, 2)]), vec![(41, 1)], "only the new number is delivered");
}

/// The read barrier covers every seq a replica sent a commit for or delivered, and shows in
/// its status (the wrapper's vouched reads answer only after executing up to it).
#[test]
fn read_barrier_covers_what_was_committed() {
    let start = Time(1_000_000);
    let mut replicas: Vec<Replica> = (0..4).map(|id| Replica::new(Config::new(4, id), start).unwrap()).collect();
    assert_eq!(replicas[1].read_barrier(), 0);
    replicas[1].submit(start, request(1, 1, 1)).unwrap();
    let delivered = run(&mut replicas, start, 20);
    assert!(delivered.iter().all(|d| d.len() == 1), "{delivered:?}");
    for replica in &replicas {
        assert_eq!(replica.read_barrier(), 1);
        assert_eq!(replica.status().read_barrier, 1);
    }
}
