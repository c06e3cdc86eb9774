//! Zones added and removed at run time (`Op::ZoneSet`): t+1 replicas must ask for the same
//! change, which then executes at one point of the log, with deterministic refusals; the zone
//! set is replicated state (stable indices, never reused), covered by checkpoints.

use std::collections::BTreeMap;

use exec::envelope::Op;
use exec::{Command, Delivered, Event, ExecConfig, ExecCore, ExecState, Item, SignZoneSigner, SignZoneVerifier, Unchanged, ZoneSetAction, ZoneSetChange};

const N: u16 = 4;

/// Agreed time: today at midnight, inside the replica certificates' validity.
fn start_s() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    now - now % 86_400
}

struct Pki {
    ca_der: Vec<u8>,
    certs: Vec<mesh::pki::ReplicaCert>,
    outsider: SignZoneSigner,
}

fn pki() -> &'static Pki {
    static PKI: std::sync::OnceLock<Pki> = std::sync::OnceLock::new();
    PKI.get_or_init(|| {
        use mesh::pki::{cert_der_from_pem, generate_ca, issue_replica_cert};
        let ca = generate_ca("zones").unwrap();
        let other = generate_ca("other").unwrap();
        let o = issue_replica_cert(&other, 2).unwrap();
        Pki {
            ca_der: cert_der_from_pem(&ca.cert_pem).unwrap(),
            certs: (0..N).map(|i| issue_replica_cert(&ca, i).unwrap()).collect(),
            outsider: SignZoneSigner::new(2, "example.test", &o.cert_pem, o.key_pem.clone()).unwrap(),
        }
    })
}

/// Replica `r`'s signer for zone `zone` (its identity key; the zone matters for sign-zone
/// requests and finish claims only).
fn signer(r: u16, zone: &str) -> SignZoneSigner {
    let c = &pki().certs[usize::from(r)];
    SignZoneSigner::new(r, zone, &c.cert_pem, c.key_pem.clone()).unwrap()
}

fn config(id: u16) -> ExecConfig {
    ExecConfig {
        id,
        faults: 1,
        validity_s: 600,
        resign_after_s: 300,
        slice_interval_s: 20,
        slice_rrsets: 4,
        sign_zone_interval_s: 60,
        sign_zone_window_s: 40,
        sign_zone_verifiers: vec![SignZoneVerifier::new("example.test.", pki().ca_der.clone())],
        max_reads_in_flight: 8,
    }
}

/// Replica `r`'s request for `action` on `name` with key digest `key`, signed at `time_s`
/// (plus `nudge` µs, so that one replica's requests at one time differ).
fn ask(r: u16, action: ZoneSetAction, name: &str, key: u8, time_s: u64, nudge: u64) -> Op {
    let change = ZoneSetChange::new(action, name, [key; 32]);
    Op::ZoneSet { auth: signer(r, "example.test").sign_zone_set_at(&change, time_s * 1_000_000 + nudge).unwrap(), change }
}

fn batch(seq: u64, time_s: u64, requests: Vec<(u16, Op, Option<u64>)>) -> Delivered<u64> {
    Delivered {
        seq,
        time_us: time_s * 1_000_000,
        checkpoint_due: false,
        requests: requests.into_iter().map(|(origin, op, reply)| Item { origin, payload: op.encode(), reply }).collect(),
    }
}

fn texts(cmds: &[Command<u64>]) -> Vec<String> {
    cmds.iter()
        .filter_map(|c| match c {
            Command::Answer { bytes, .. } => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        })
        .collect()
}

fn names(zones: &BTreeMap<u16, exec::ZoneEntry>) -> Vec<(u16, &str)> {
    zones.iter().map(|(i, e)| (*i, e.name.as_str())).collect()
}

/// Delivers batch `seq` and completes a zone-set change and a first signing's beginning at
/// once (as a replica's executor does); returns every command.
fn run(core: &mut ExecCore<u64, Unchanged>, seq: u64, time_s: u64, requests: Vec<(u16, Op, Option<u64>)>) -> Vec<Command<u64>> {
    let mut all = Vec::new();
    let mut cmds = core.deliver(batch(seq, time_s, requests));
    while !cmds.is_empty() {
        let mut next = Vec::new();
        for c in &cmds {
            match c {
                Command::ChangeZoneSet { seq, .. } => next.extend(core.handle(Event::ZoneSetChanged { seq: *seq })),
                Command::BeginSigning { seq, .. } => next.extend(core.handle(Event::SigningBegun { seq: *seq, result: Ok(()) })),
                _ => {}
            }
        }
        all.append(&mut cmds);
        cmds = next;
    }
    assert!(core.is_idle(), "batch {seq} left waiting: {:?}", core.waiting_for());
    all
}

#[test]
fn an_added_zone_needs_t_plus_one_replicas_and_begins_signing_there() {
    let s = start_s();
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    // One replica, however often it asks, is not enough; nor is a second one asking for
    // another key.
    let cmds = run(&mut core, 1, s, vec![(3, ask(3, ZoneSetAction::Add, "New.Test", 7, s, 0), Some(1))]);
    assert_eq!(texts(&cmds), vec!["counted: 1 of the 2 replicas needed asked to add new.test."]);
    let cmds = run(&mut core, 2, s + 1, vec![(3, ask(3, ZoneSetAction::Add, "new.test", 7, s + 1, 0), Some(2))]);
    assert_eq!(texts(&cmds), vec!["counted: 1 of the 2 replicas needed asked to add new.test."]);
    let cmds = run(&mut core, 3, s + 2, vec![(1, ask(1, ZoneSetAction::Add, "new.test", 8, s + 2, 0), Some(3))]);
    assert_eq!(texts(&cmds), vec!["counted: 1 of the 2 replicas needed asked to add new.test."]);
    assert!(core.state().zone_set.is_empty(), "nothing changed yet");
    assert_eq!(core.zone_set().into_values().collect::<Vec<_>>(), vec!["example.test."]);

    // Replica 1 for the same key: the change executes here, as zone 1, and waits for the replica.
    let mut cmds = core.deliver(batch(4, s + 3, vec![(1, ask(1, ZoneSetAction::Add, "new.test.", 7, s + 3, 0), Some(4))]));
    let Some(Command::ChangeZoneSet { seq: 4, index: 1, change, zones }) = cmds.pop() else { panic!("{cmds:?}") };
    assert_eq!((change.action, change.name.as_str(), change.key_digest), (ZoneSetAction::Add, "new.test.", [7; 32]));
    assert_eq!(names(&zones), vec![(0, "example.test."), (1, "new.test.")]);
    assert_eq!(zones[&1].added_at, 4);
    assert!(core.waiting_for().is_some_and(|(seq, _)| seq == 4));
    let (_, _, _, before) = core.zone_change_at().expect("a zone-set change is a zone change");
    assert!(before.zone_set.is_empty(), "the state before the change, for a resume");
    // Served: the admin is answered and the zone's first signing begins at the same point.
    let cmds = core.handle(Event::ZoneSetChanged { seq: 4 });
    assert_eq!(texts(&cmds), vec!["added new.test. as zone 1 at seq 4; its first signing begins there"]);
    assert!(matches!(cmds.last(), Some(Command::BeginSigning { zone: 1, seq: 4, .. })), "{cmds:?}");
    let cmds = core.handle(Event::SigningBegun { seq: 4, result: Ok(()) });
    assert!(matches!(&cmds[..], [Command::Persist(st)] if st.executed == 4), "{cmds:?}");
    assert_eq!(core.state().zone(1).signing.map(|r| r.seq), Some(4));
    assert_eq!(core.state().next_zone_index, 2);
    assert!(!core.state().zone_set_requests.keys().any(|c| c.key_digest == [7; 32]), "used up");

    // The new zone is a zone like the others: finish claims signed for it install its signing.
    let fin = |r: u16| Op::sign_zone_finish(1, signer(r, "new.test").sign_finish(4).unwrap());
    let cmds = core.deliver(batch(5, s + 4, vec![(2, fin(2), None), (3, fin(3), Some(5))]));
    assert!(matches!(cmds.last(), Some(Command::FinishSigning { zone: 1, seq: 5, .. })), "{cmds:?}");
    core.handle(Event::SigningFinished { seq: 5, result: Ok(0) });
    assert_eq!(core.state().zone(1).last_signed_s, s + 3);
    // A claim signed for example.test does not count under the new zone's index.
    let cmds = run(&mut core, 6, s + 70, vec![(3, Op::sign_zone(1, signer(3, "example.test").sign_at((s + 70) * 1_000_000).unwrap()), Some(6))]);
    assert!(texts(&cmds)[0].starts_with("refused: the request does not prove"), "{cmds:?}");
}

#[test]
fn refusals_are_decided_by_the_zone_set_alone() {
    let s = start_s();
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let refused = |core: &mut ExecCore<u64, Unchanged>, seq: u64, op1: Op, op2: Op| {
        let cmds = run(core, seq, s, vec![(1, op1, Some(1)), (2, op2, Some(2))]);
        assert!(!cmds.iter().any(|c| matches!(c, Command::ChangeZoneSet { .. })), "{cmds:?}");
        texts(&cmds)
    };
    let mut seq = 0;
    let mut pair = |core: &mut ExecCore<u64, Unchanged>, action, name: &str| {
        seq += 1;
        let nudge = seq;
        refused(core, seq, ask(1, action, name, 1, s, nudge), ask(2, action, name, 1, s, nudge))
    };
    for (action, name, why) in [
        (ZoneSetAction::Add, "example.test", "refused: example.test. is served already"),
        (ZoneSetAction::Add, "www.Example.test", "refused: www.example.test. is inside or above the served zone example.test."),
        (ZoneSetAction::Add, "test", "refused: test. is inside or above the served zone example.test."),
        (ZoneSetAction::Add, "bad name.test", "refused: \"bad name.test.\" is not a zone name"),
        (ZoneSetAction::Add, ".", "refused: \".\" is not a zone name"),
        (ZoneSetAction::Remove, "other.test", "refused: other.test. is not served"),
        (ZoneSetAction::Remove, "example.test", "refused: example.test. is the last zone served"),
    ] {
        let t = pair(&mut core, action, name);
        assert!(t.len() == 2 && t.iter().all(|x| x.starts_with(why)), "{name}: {t:?}");
    }
    // Not the replica it claims, another CA, a replayed stamp, a stamp outside the window.
    let add = ask(1, ZoneSetAction::Add, "new.test", 1, s, 100);
    let Op::ZoneSet { change, auth } = add.clone() else { unreachable!() };
    let outsider = Op::ZoneSet { auth: pki().outsider.sign_zone_set_at(&change, s * 1_000_000 + 101).unwrap(), change: change.clone() };
    let stale = ask(3, ZoneSetAction::Add, "new.test", 1, s - 41, 0);
    let cmds =
        run(&mut core, 20, s, vec![(2, add.clone(), Some(1)), (2, outsider, Some(2)), (1, add.clone(), Some(3)), (1, add, Some(4)), (3, stale, Some(5))]);
    let t = texts(&cmds);
    assert!(t[0].starts_with("refused: a request signed for replica 1 was ordered as replica 2's"), "{t:?}");
    assert!(t[1].starts_with("refused: the request does not prove replica 2"), "{t:?}");
    assert!(t[2].starts_with("counted: 1 of the 2"), "{t:?}");
    assert!(t[3].starts_with("refused: replica 1's request stamped"), "a replay counts once: {t:?}");
    assert!(t[4].contains("more than 40 s apart"), "{t:?}");
    assert_eq!(auth.replica, 1);
    // Nothing was added, and the zone set was never copied into the state.
    assert!(core.state().zone_set.is_empty());
}

#[test]
fn a_removed_zones_index_is_never_used_again() {
    let s = start_s();
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let both = |action, name: &str, key: u8, t: u64| vec![(0, ask(0, action, name, key, t, 0), None), (2, ask(2, action, name, key, t, 0), Some(9))];
    run(&mut core, 1, s, both(ZoneSetAction::Add, "new.test", 1, s));
    assert_eq!(names(&core.state().zone_set), vec![(0, "example.test."), (1, "new.test.")]);
    // Removing new.test drops its schedule (its signing was running).
    assert!(core.state().zone(1).signing.is_some());
    let cmds = run(&mut core, 2, s + 1, both(ZoneSetAction::Remove, "NEW.test", 0, s + 1));
    let change = cmds.iter().find_map(|c| match c {
        Command::ChangeZoneSet { index, zones, .. } => Some((*index, names(zones).len())),
        _ => None,
    });
    assert_eq!(change, Some((1, 1)));
    assert!(texts(&cmds).contains(&"removed new.test. (zone 1) at seq 2".to_string()), "{cmds:?}");
    assert!(!core.state().zones.contains_key(&1) && !cmds.iter().any(|c| matches!(c, Command::BeginSigning { .. })));
    // Added again: a new index. Then the configured zone goes, and its index with it.
    run(&mut core, 3, s + 2, both(ZoneSetAction::Add, "new.test", 2, s + 2));
    run(&mut core, 4, s + 3, both(ZoneSetAction::Remove, "example.test", 0, s + 3));
    assert_eq!(names(&core.state().zone_set), vec![(2, "new.test.")]);
    assert_eq!(core.state().zone_set[&2].key_digest, [2; 32]);
    let cmds = run(&mut core, 5, s + 70, vec![(3, Op::SignZone(signer(3, "example.test").sign_at((s + 70) * 1_000_000).unwrap()), Some(1))]);
    assert_eq!(texts(&cmds), vec!["refused: no zone has index 0"]);
    // The last zone stays.
    let cmds = run(&mut core, 6, s + 71, both(ZoneSetAction::Remove, "new.test", 0, s + 71));
    assert!(texts(&cmds).iter().all(|t| t.starts_with("refused: new.test. is the last zone served")), "{cmds:?}");
}

#[test]
fn a_change_waits_for_earlier_reads_and_is_counted_once() {
    let s = start_s();
    let mut core = ExecCore::new(config(0), Unchanged, ExecState::default());
    let query = {
        use hickory_proto::op::{Message, MessageType, OpCode, Query};
        use hickory_proto::rr::{Name, RecordType};
        let mut m = Message::new(5, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_ascii("www.example.test.").unwrap(), RecordType::A));
        Op::Dns { tcp: false, message: m.to_vec().unwrap() }
    };
    // A read of this gateway in flight, then the t+1-th request in the same batch.
    run(&mut core, 1, s, vec![(1, ask(1, ZoneSetAction::Add, "new.test", 1, s, 0), None)]);
    let cmds = core.deliver(batch(2, s, vec![(0, query.clone(), Some(5)), (2, ask(2, ZoneSetAction::Add, "new.test", 1, s, 0), Some(6))]));
    let Some(id) = cmds.iter().find_map(|c| match c {
        Command::Read { id, .. } => Some(*id),
        _ => None,
    }) else {
        panic!("the read is issued: {cmds:?}")
    };
    assert!(!cmds.iter().any(|c| matches!(c, Command::ChangeZoneSet { .. })), "the change waits for the read: {cmds:?}");
    let cmds = core.handle(Event::ReadDone { id });
    assert!(matches!(cmds.last(), Some(Command::ChangeZoneSet { seq: 2, index: 1, .. })), "{cmds:?}");
    core.handle(Event::ZoneSetChanged { seq: 2 });
    core.handle(Event::SigningBegun { seq: 2, result: Ok(()) });
    assert_eq!(core.state().zone_set_stamps.len(), 2, "each request counted once, waiting or not");
    assert_eq!(names(&core.state().zone_set), vec![(0, "example.test."), (1, "new.test.")]);
}

#[test]
fn replicas_that_execute_the_same_log_agree_and_checkpoints_cover_the_zone_set() {
    let s = start_s();
    let log = |core: &mut ExecCore<u64, Unchanged>, gateway: u16| {
        let reply = |origin: u16, n: u64| (origin == gateway).then_some(n);
        run(core, 1, s, vec![(3, ask(3, ZoneSetAction::Add, "a.test", 1, s, 0), reply(3, 1)), (0, ask(0, ZoneSetAction::Add, "b.test", 2, s, 0), reply(0, 2))]);
        run(
            core,
            2,
            s + 1,
            vec![(1, ask(1, ZoneSetAction::Add, "b.test", 2, s + 1, 0), reply(1, 3)), (2, ask(2, ZoneSetAction::Add, "a.test", 1, s + 1, 0), reply(2, 4))],
        );
        run(core, 3, s + 2, vec![(1, ask(1, ZoneSetAction::Remove, "example.test", 0, s + 2, 0), reply(1, 5))]);
        let cmds = run(core, 4, s + 3, vec![(3, ask(3, ZoneSetAction::Remove, "example.test", 0, s + 3, 0), reply(3, 6))]);
        assert!(cmds.iter().any(|c| matches!(c, Command::ChangeZoneSet { index: 0, .. })), "{cmds:?}");
    };
    let mut cores: Vec<_> = (0..N).map(|i| ExecCore::new(config(i), Unchanged, ExecState::default())).collect();
    for (i, core) in cores.iter_mut().enumerate() {
        log(core, i as u16);
    }
    let want = cores[0].state().clone();
    // b.test's t+1-th request came first (batch 2's first item): it has the lower new index.
    assert_eq!(names(&want.zone_set), vec![(1, "b.test."), (2, "a.test.")]);
    for core in &cores[1..] {
        assert_eq!(core.state(), &want);
    }
    assert_eq!(ExecState::decode(&want.encode()).unwrap(), want);
    // The checkpoint digests the zones in index order (1, 2), and covers the zone set itself.
    let mut ckpt = cores.remove(0);
    let cmds = ckpt.deliver(Delivered { checkpoint_due: true, ..batch(5, s + 4, Vec::new()) });
    assert!(matches!(cmds.last(), Some(Command::DigestZone { seq: 5 })), "{cmds:?}");
    let cmds = ckpt.handle(Event::ZoneDigest { seq: 5, digests: Some(vec![[1; 32], [2; 32]]) });
    let Some(Command::Checkpoint { digest, state, .. }) = cmds.first() else { panic!("{cmds:?}") };
    assert_eq!(*digest, state.checkpoint_digest(&[[1; 32], [2; 32]]));
    let mut other = state.clone();
    other.zone_set.get_mut(&2).unwrap().key_digest = [9; 32];
    assert_ne!(*digest, other.checkpoint_digest(&[[1; 32], [2; 32]]), "the key agreed on is attested");
    let mut other = state.clone();
    other.next_zone_index += 1;
    assert_ne!(*digest, other.checkpoint_digest(&[[1; 32], [2; 32]]));
    // A digest list of the wrong length is this replica's own failure, not a match.
    let mut bad = ExecCore::new(config(0), Unchanged, want.clone());
    bad.deliver(Delivered { checkpoint_due: true, ..batch(5, s + 4, Vec::new()) });
    let cmds = bad.handle(Event::ZoneDigest { seq: 5, digests: Some(vec![[1; 32]]) });
    let Some(Command::Checkpoint { digest: d, .. }) = cmds.first() else { panic!("{cmds:?}") };
    assert_ne!(d, digest);
    // A core started from the persisted state serves the same zone set.
    let restarted = ExecCore::<u64, _>::new(config(2), Unchanged, want.clone());
    assert_eq!(restarted.zone_set().into_values().collect::<Vec<_>>(), vec!["b.test.", "a.test."]);
    assert_eq!(restarted.zone_count(), 2);
}

#[test]
fn a_counted_request_alone_changes_the_checkpoint_digest_but_not_an_untouched_state() {
    let mut s = ExecState::default();
    let base = s.checkpoint_digest(&[[3; 32]]);
    s.zone_set_stamps.insert(1, 5);
    assert_ne!(base, s.checkpoint_digest(&[[3; 32]]));
    let mut s = ExecState::default();
    s.zone_set_requests.entry(ZoneSetChange::new(ZoneSetAction::Add, "x.test", [1; 32])).or_default().insert(2, 9);
    assert_ne!(base, s.checkpoint_digest(&[[3; 32]]));
    assert_eq!(ExecState::decode(&s.encode()).unwrap(), s);
}
