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
