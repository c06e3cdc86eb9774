//! Byzantine rewrites of honest messages, shared by the seeded simulator's actors
//! (`tests/sim/byzantine.rs`) and the real-process test modes (`transport::byzantine`), so
//! the behaviour the simulator checks is the one a test cluster runs. No honest path calls
//! anything here.

use crate::{CheckpointClaim, PrePreparedEntry, PreparedEntry, Proposal, ReplicaId, Request, Time, ViewChange};

/// The view-change poisoner: claims a fake prepared batch just above the stable checkpoint and
/// one far ahead (above any checkpoint a quorum could choose, within the 4L an honest view
/// change may report), backed by a fake checkpoint claim two windows up. `window` and `interval`
/// are the configuration's watermark window and checkpoint interval.
///
/// `blatant`: the far entry lies beyond its own fake checkpoint's window, which no honest
/// replica can claim, so receivers refuse the view change and blame its sender. Otherwise the
/// far entry sits exactly at the top of that window: the view change is well-formed and
/// unprovable, and any set containing it stays undecidable, so the new primary must leave it
/// out (the subset search in `decide.rs`).
pub fn poison_view_change(vc: &mut ViewChange, me: ReplicaId, window: u64, interval: u64, blatant: bool) {
    let low = vc.stable.seq;
    let view = vc.view.saturating_sub(1);
    let fake = |seq: u64| Proposal { time: Time(1), requests: vec![Request { origin: me, client: 77, number: seq, payload: vec![0xee; 8] }] };
    let backing = (low + 2 * window + 1) / interval * interval;
    let far = if blatant { backing + window + 1 } else { backing + window };
    let near = low + 1;
    vc.prepared.retain(|e| e.seq > near && e.seq < far);
    vc.prepared.insert(0, PreparedEntry { seq: near, view, proposal: fake(near) });
    vc.prepared.push(PreparedEntry { seq: far, view, proposal: fake(far) });
    for seq in [near, far] {
        vc.pre_prepared.push(PrePreparedEntry { seq, view, digest: fake(seq).digest(seq) });
    }
    vc.checkpoints.retain(|c| c.seq < backing);
    vc.checkpoints.push(CheckpointClaim { seq: backing, time: Time(2), log_digest: [0xee; 32], state_digest: [0xee; 32] });
    let max = usize::try_from(window / interval).unwrap_or(usize::MAX) + 1;
    let skip = vc.checkpoints.len().saturating_sub(max);
    vc.checkpoints.drain(..skip);
}

/// The origin forger (the demonstration): for each other origin whose requests this
/// primary has proposed (`seen`: that origin's latest client and number, updated from
/// `proposal`), adds to `proposal` a request of that client numbered 2^32 - 1 above the number
/// seen, and one `jump - 1` above it (within `max_number_jump`). Before origins were
/// authenticated, the first made every later request of the victim look delivered.
pub fn forge_origins(proposal: &mut Proposal, me: ReplicaId, seen: &mut std::collections::BTreeMap<ReplicaId, (u64, u64)>, jump: u64) {
    for request in proposal.requests.iter().filter(|r| r.origin != me) {
        let entry = seen.entry(request.origin).or_insert((request.client, request.number));
        if (request.client, request.number) > *entry {
            *entry = (request.client, request.number);
        }
    }
    for (origin, (client, number)) in seen.iter() {
        for above in [(1u64 << 32) - 1, jump.saturating_sub(1).max(1)] {
            let forged = Request { origin: *origin, client: *client, number: number.saturating_add(above), payload: vec![0xf0; 8] };
            proposal.requests.push(forged);
        }
    }
}

/// The budget hog: fills `proposal` (an honest batch, whose requests it keeps) up to the batch
/// limits with requests of its own origin `me` (client `client`, numbered on from `*number`),
/// each as large as the room left allows, so that every batch it proposes carries as much of
/// its own as a batch can. Each is within the per-request and batch limits, and its origin is
/// the primary, so backups hold it vouched for: only the per-origin budget of the log refuses
/// it. The payload is filler no application executes (sdns skips a payload that does not
/// decode). `limits`: the batch's count and bytes and the largest request.
pub fn hog_batch(proposal: &mut Proposal, me: ReplicaId, client: u64, number: &mut u64, limits: (usize, usize, usize)) {
    let (max_requests, max_bytes, max_request_bytes) = limits;
    let overhead = Request { origin: me, client, number: 0, payload: Vec::new() }.wire_size();
    let mut used: usize = proposal.requests.iter().map(Request::wire_size).sum();
    while proposal.requests.len() < max_requests {
        let slots = max_requests - proposal.requests.len();
        let room = max_bytes.saturating_sub(used);
        // The room shared among the slots left, but never tiny: with many slots, small
        // requests each charged the per-request minimum.
        let size = (room / slots).max(overhead + 40).min(max_request_bytes);
        if size <= overhead || size > room {
            break;
        }
        *number += 1;
        let request = Request { origin: me, client, number: *number, payload: vec![0xb0; size - overhead] };
        used += request.wire_size();
        proposal.requests.push(request);
    }
}
