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
