//! Presignatures: the nonce work of a threshold signature done ahead of the data, in the
//! background, for slots the caller's ordered log assigns; online only a few scalar operations,
//! one round of announcements and one share (docs/DETERMINISM.md, "Presignatures: the nonce
//! from an agreed slot", which argues why a slot can never carry two messages).
//!
//! [`PresignCore`] is sans-IO like [`crate::EcSignerCore`] and beside it (that API is
//! unchanged): the driver delivers peers' messages, time and durable-write completions, and
//! carries out [`PresignOutput`]s. Replica ids at this API are 0-based, as there.
//!
//! Per slot: [`PresignCore::prepare`] starts the background round (ECDSA: commitments and μ;
//! Ed25519: commitments of two nonces) and reports [`PresignOutput::Ready`]. Online,
//! [`PresignCore::sign`] emits [`PresignOutput::Record`]: the driver must write (slot, h)
//! durably and call [`PresignCore::recorded`] before anything else of that slot leaves; only
//! then is the announcement sent, and the share only once 2t+1 replicas announced the same h.
//! A restarted core is given its records and floor ([`PresignCore::new`]).

mod combine;
mod ecdsa;
mod ed;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use crate::ecdsa::EcdsaKey;
use crate::ed::EdKey;
use crate::{Algorithm, Blame, Error, Fault, KeyShare, PublicKey, FLAGS_KSK};
use combine::{FullSet, Step};

/// A presignature's place, assigned by the ordered log: every honest replica uses the same
/// slot for the same signing request. Ordered by epoch, then counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Slot {
    pub epoch: u64,
    pub counter: u64,
}

/// What replicas' presigning cores send each other.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PresignMessage {
    /// The background round: ECDSA's first message ([`crate::EcdsaMessage::Round1`] wire
    /// form) over the slot hash, or Ed25519's two commitments per set.
    Round1 { slot: Slot, body: Vec<u8> },
    /// The sender recorded the slot for data whose session hash is `h`.
    Announce { slot: Slot, h: [u8; 32] },
    /// The sender's signature share, sent only after 2t+1 announced its `h`.
    Share { slot: Slot, share: [u8; 32] },
    /// ECDSA: a combination failed; send your σ with its proof.
    NeedProof { slot: Slot },
    /// ECDSA: σ and its proof ([`crate::EcdsaMessage::Sigma`] wire form).
    Proof { slot: Slot, body: Vec<u8> },
    /// The sender has no signature yet: a replica that finished resends its messages.
    Retry { slot: Slot },
}

impl PresignMessage {
    pub fn slot(&self) -> Slot {
        match self {
            PresignMessage::Round1 { slot, .. }
            | PresignMessage::Announce { slot, .. }
            | PresignMessage::Share { slot, .. }
            | PresignMessage::NeedProof { slot }
            | PresignMessage::Proof { slot, .. }
            | PresignMessage::Retry { slot } => *slot,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresignOutput {
    /// `to`: 0-based replica id.
    Send {
        to: u16,
        message: PresignMessage,
    },
    Broadcast {
        message: PresignMessage,
    },
    /// Write (slot, h) durably, then call [`PresignCore::recorded`]; until then nothing of
    /// this slot's signing leaves the core. A restarted core must be given every record.
    Record {
        slot: Slot,
        h: [u8; 32],
    },
    /// The slot's background round is done: signing it costs only the online part.
    Ready {
        slot: Slot,
    },
    /// The signature for the slot's data (64 bytes, r ‖ s or R ‖ S).
    Done {
        slot: Slot,
        signature: [u8; 64],
    },
    /// 2t+1 replicas announced other data for the slot than this replica recorded: the slot is
    /// spent without a signature for this replica's data (a caller that let honest replicas
    /// disagree); sign it in another slot.
    Conflict {
        slot: Slot,
        h: [u8; 32],
    },
    /// The slot cannot be signed (a negligible-probability dead end, or more than t faulty).
    Failed {
        slot: Slot,
        error: Error,
    },
    /// A peer (0-based) sent something provably wrong.
    Misbehaved {
        peer: u16,
        fault: Fault,
    },
}

/// Requests the core refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PresignError {
    #[error("slot {0:?} is below the floor or recorded for other data: it is never signed again")]
    Spent(Slot),
    #[error("{0} slots are prepared or signing already")]
    PoolFull(usize),
}

/// Bounds on what the pool and peers can make the core hold, and its pace.
#[derive(Clone, Debug)]
pub struct PresignLimits {
    /// Slots prepared or signing at once (each holds its first-round messages: ECDSA at n = 4
    /// about 0.6 kB per replica, at n = 7 about 3 kB).
    pub max_slots: usize,
    /// Bytes of all slots' first-round messages together (estimated from n and t).
    pub max_bytes: usize,
    /// Slots for which peers' messages arrived before this replica prepared them.
    pub max_early: usize,
    /// Finished slots kept to answer peers' retries, oldest dropped first.
    pub max_finished: usize,
    /// An unfinished slot resends this replica's messages after this long (µs).
    pub retry_after_us: u64,
    /// How long (µs) to wait for all n shares (then nothing is checked) before combining
    /// fewer with checks; not waited for once a peer misbehaved in the slot.
    pub patience_us: u64,
}

impl Default for PresignLimits {
    fn default() -> Self {
        Self { max_slots: 256, max_bytes: 8 << 20, max_early: 256, max_finished: 1024, retry_after_us: 500_000, patience_us: 20_000 }
    }
}

/// One slot's pre-computation, per algorithm.
enum Pre {
    Ecdsa(Box<ecdsa::EcdsaPre>),
    Ed(Box<ed::EdPre>),
}

macro_rules! each {
    ($pre:expr, $p:ident => $e:expr) => {
        match $pre {
            Pre::Ecdsa($p) => $e,
            Pre::Ed($p) => $e,
        }
    };
}

enum Key {
    Ecdsa(Arc<EcdsaKey>, Arc<FullSet<p256::Scalar>>),
    Ed(Arc<EdKey>, Arc<FullSet<curve25519_dalek::Scalar>>),
}

/// A slot this replica signs: its data, and how far the release has come.
struct Signing {
    h: [u8; 32],
    data: Vec<u8>,
    recorded: bool,
    share: Option<[u8; 32]>,
    shared_at_us: u64,
    asked_proofs: bool,
    conflict: bool,
}

struct SlotState {
    pre: Pre,
    ready_reported: bool,
    /// First announcement per replica (1-based); a second, different one is equivocation.
    announces: BTreeMap<u16, [u8; 32]>,
    signing: Option<Signing>,
    done: Option<[u8; 64]>,
    last_sent_us: u64,
    /// When each peer's retry was last answered (a finished slot answers each peer at most
    /// once per half retry interval).
    answered: BTreeMap<u16, u64>,
    reported: BTreeSet<u16>,
}

/// The sans-IO presigning core of one replica and key.
pub struct PresignCore {
    me: u16,
    n: u16,
    t: u16,
    pk: Arc<PublicKey>,
    key: Key,
    limits: PresignLimits,
    floor: Slot,
    records: BTreeMap<Slot, [u8; 32]>,
    slots: BTreeMap<Slot, SlotState>,
    finished: VecDeque<Slot>,
    early: BTreeMap<Slot, Vec<(u16, PresignMessage)>>,
    outputs: VecDeque<PresignOutput>,
    now_us: u64,
}

impl PresignCore {
    /// `me` is 0-based. `floor`: every slot below it is spent (the driver's compaction of old
    /// records); `records`: every (slot, h) this replica ever recorded at or above the floor.
    pub fn new(
        me: u16,
        pk: Arc<PublicKey>,
        share: Arc<KeyShare>,
        limits: PresignLimits,
        floor: Slot,
        records: impl IntoIterator<Item = (Slot, [u8; 32])>,
    ) -> Result<PresignCore, Error> {
        let (n, t) = (pk.players(), pk.threshold());
        if share.index() != me + 1 {
            return Err(Error::ShareIndex { expected: me + 1, found: share.index() });
        }
        let key = match pk.algorithm() {
            Algorithm::EcdsaP256Sha256 => Key::Ecdsa(Arc::new(EcdsaKey::new(pk.clone(), share)?), Arc::new(FullSet::new(n, 2 * t))),
            Algorithm::Ed25519 => Key::Ed(Arc::new(EdKey::new(pk.clone(), share)?), Arc::new(FullSet::new(n, t))),
        };
        let records = records.into_iter().filter(|(slot, _)| *slot >= floor).collect();
        Ok(PresignCore {
            me,
            n,
            t,
            pk,
            key,
            limits,
            floor,
            records,
            slots: BTreeMap::new(),
            finished: VecDeque::new(),
            early: BTreeMap::new(),
            outputs: VecDeque::new(),
            now_us: 0,
        })
    }

    /// The PRSS input of a slot. The leading 0xff is no algorithm number, so no slot hash is
    /// ever a data session's hash (SHA-256(algorithm ‖ key tag ‖ data)).
    pub fn slot_hash(&self, slot: Slot) -> [u8; 32] {
        Sha256::new()
            .chain_update([0xff])
            .chain_update(b"sdns presign v1\0")
            .chain_update([self.pk.algorithm().number()])
            .chain_update(self.pk.key_tag(FLAGS_KSK).to_be_bytes())
            .chain_update(slot.epoch.to_be_bytes())
            .chain_update(slot.counter.to_be_bytes())
            .finalize()
            .into()
    }

    /// The h a slot is recorded and announced with for `data` (the data session's hash).
    pub fn data_hash(&self, data: &[u8]) -> [u8; 32] {
        self.pk.session_hash(data)
    }

    fn spent(&self, slot: Slot, h: Option<&[u8; 32]>) -> bool {
        slot < self.floor || h.is_some_and(|h| self.records.get(&slot).is_some_and(|r| r != h))
    }

    /// Slots prepared or signing (not finished).
    pub fn active(&self) -> usize {
        self.slots.values().filter(|s| s.done.is_none()).count()
    }

    /// Estimated bytes of one slot's first-round messages from all n replicas.
    fn slot_bytes(&self) -> usize {
        let held = crate::prss::subsets(self.n, self.t).len() * usize::from(self.n - self.t) / usize::from(self.n);
        let per = match self.key {
            Key::Ecdsa(..) => held * (2 + 2 * usize::from(self.t)) * 33 + 32 + 96,
            Key::Ed(..) => held * 64,
        };
        per * usize::from(self.n) + 512
    }

    /// Starts the background round of `slot` (nothing if it is prepared already).
    pub fn prepare(&mut self, now_us: u64, slot: Slot) -> Result<(), PresignError> {
        self.now_us = self.now_us.max(now_us);
        if self.slots.contains_key(&slot) {
            return Ok(());
        }
        if self.spent(slot, None) {
            return Err(PresignError::Spent(slot));
        }
        let active = self.active();
        if active >= self.limits.max_slots || (active + 1) * self.slot_bytes() > self.limits.max_bytes {
            return Err(PresignError::PoolFull(active));
        }
        let h = self.slot_hash(slot);
        let pre = match &self.key {
            Key::Ecdsa(key, full) => ecdsa::EcdsaPre::new(key.clone(), h, full.clone()).map(|p| Pre::Ecdsa(Box::new(p))),
            Key::Ed(key, full) => ed::EdPre::new(key.clone(), h, full.clone()).map(|p| Pre::Ed(Box::new(p))),
        };
        let pre = match pre {
            Ok(pre) => pre,
            Err(error) => {
                self.outputs.push_back(PresignOutput::Failed { slot, error });
                return Ok(());
            }
        };
        let body = each!(&pre, p => p.round1().to_vec());
        let state = SlotState {
            pre,
            ready_reported: false,
            announces: BTreeMap::new(),
            signing: None,
            done: None,
            last_sent_us: self.now_us,
            answered: BTreeMap::new(),
            reported: BTreeSet::new(),
        };
        self.slots.insert(slot, state);
        self.outputs.push_back(PresignOutput::Broadcast { message: PresignMessage::Round1 { slot, body } });
        for (from, message) in self.early.remove(&slot).unwrap_or_default() {
            self.handle_message(self.now_us, from, message);
        }
        self.advance(slot);
        Ok(())
    }

    /// Signs `data` in `slot` (preparing it first if needed). Refused for a slot below the
    /// floor or recorded for other data; the same data again is signed again (same bytes).
    pub fn sign(&mut self, now_us: u64, slot: Slot, data: &[u8]) -> Result<(), PresignError> {
        self.now_us = self.now_us.max(now_us);
        let h = self.data_hash(data);
        if self.spent(slot, Some(&h)) {
            return Err(PresignError::Spent(slot));
        }
        if let Some(signature) = self.slots.get(&slot).and_then(|s| s.done) {
            self.outputs.push_back(PresignOutput::Done { slot, signature });
            return Ok(());
        }
        self.prepare(now_us, slot)?;
        let recorded = self.records.get(&slot) == Some(&h);
        let Some(state) = self.slots.get_mut(&slot) else { return Ok(()) };
        if let Some(signing) = &state.signing {
            // Asked before, perhaps with its record still being written: other data is refused.
            return if signing.h == h { Ok(()) } else { Err(PresignError::Spent(slot)) };
        }
        state.signing = Some(Signing { h, data: data.to_vec(), recorded: false, share: None, shared_at_us: 0, asked_proofs: false, conflict: false });
        if recorded {
            // Written before a restart: durable already.
            self.recorded(slot);
        } else {
            self.outputs.push_back(PresignOutput::Record { slot, h });
        }
        Ok(())
    }

    /// The driver wrote the slot's record durably: the announcement may leave.
    pub fn recorded(&mut self, slot: Slot) {
        let me = self.me + 1;
        let Some(state) = self.slots.get_mut(&slot) else { return };
        let Some(signing) = state.signing.as_mut() else { return };
        if signing.recorded {
            return;
        }
        signing.recorded = true;
        let h = signing.h;
        self.records.insert(slot, h);
        state.announces.entry(me).or_insert(h);
        self.outputs.push_back(PresignOutput::Broadcast { message: PresignMessage::Announce { slot, h } });
        self.advance(slot);
    }

    /// Delivers a peer's message (`from` 0-based).
    pub fn handle_message(&mut self, now_us: u64, from: u16, message: PresignMessage) {
        self.now_us = self.now_us.max(now_us);
        if from >= self.n || from == self.me {
            return;
        }
        let slot = message.slot();
        if slot < self.floor {
            return;
        }
        let Some(state) = self.slots.get_mut(&slot) else {
            self.stash(from, message);
            return;
        };
        let j = from + 1;
        let result: Result<(), Blame> = match &message {
            PresignMessage::Round1 { body, .. } => each!(&mut state.pre, p => p.receive_round1(j, body)),
            PresignMessage::Announce { h, .. } => match state.announces.get(&j) {
                Some(first) if first != h => Err(Blame { replica: j, fault: Fault::Equivocation }),
                _ => {
                    state.announces.insert(j, *h);
                    Ok(())
                }
            },
            PresignMessage::Share { share, .. } => each!(&mut state.pre, p => p.add_share(j, share)),
            PresignMessage::Proof { body, .. } => each!(&mut state.pre, p => p.add_proof(j, body)),
            PresignMessage::NeedProof { .. } => {
                // Only a replica that released its share for the slot proves it.
                if state.signing.as_ref().is_some_and(|s| s.share.is_some()) {
                    if let Some(body) = each!(&mut state.pre, p => p.proof_answer()) {
                        self.outputs.push_back(PresignOutput::Send { to: from, message: PresignMessage::Proof { slot, body } });
                    }
                }
                Ok(())
            }
            PresignMessage::Retry { .. } => {
                let half = self.limits.retry_after_us / 2;
                if state.done.is_some() && state.answered.get(&j).is_none_or(|at| self.now_us >= at + half) {
                    state.answered.insert(j, self.now_us);
                    let own = Self::own_messages(slot, state);
                    self.outputs.extend(own.into_iter().map(|message| PresignOutput::Send { to: from, message }));
                }
                Ok(())
            }
        };
        if let Err(blame) = result {
            if state.reported.insert(blame.replica) && blame.replica != 0 {
                self.outputs.push_back(PresignOutput::Misbehaved { peer: blame.replica - 1, fault: blame.fault });
            }
        }
        self.advance(slot);
    }

    /// Keeps a message for a slot not prepared yet, within `max_early` slots and one message
    /// per peer and kind (more is a peer's repetition or lie, which the retries make up for).
    fn stash(&mut self, from: u16, message: PresignMessage) {
        let slot = message.slot();
        if !self.early.contains_key(&slot) && self.early.len() >= self.limits.max_early {
            return;
        }
        let kept = self.early.entry(slot).or_default();
        let kind = std::mem::discriminant(&message);
        if !kept.iter().any(|(f, m)| *f == from && std::mem::discriminant(m) == kind) {
            kept.push((from, message));
        }
    }

    /// This replica's messages of a slot so far, to resend.
    fn own_messages(slot: Slot, state: &SlotState) -> Vec<PresignMessage> {
        let mut out = vec![PresignMessage::Round1 { slot, body: each!(&state.pre, p => p.round1().to_vec()) }];
        if let Some(signing) = state.signing.as_ref().filter(|s| s.recorded) {
            out.push(PresignMessage::Announce { slot, h: signing.h });
            if let Some(share) = signing.share {
                out.push(PresignMessage::Share { slot, share });
            }
            if signing.asked_proofs && state.done.is_none() {
                out.push(PresignMessage::NeedProof { slot });
            }
        }
        out
    }

    /// Time passes: patience ends, unfinished slots resend their messages and ask for retries.
    pub fn handle_timeout(&mut self, now_us: u64) {
        self.now_us = self.now_us.max(now_us);
        let slots: Vec<Slot> = self.slots.iter().filter(|(_, s)| s.done.is_none()).map(|(slot, _)| *slot).collect();
        for slot in slots {
            let Some(state) = self.slots.get_mut(&slot) else { continue };
            if self.now_us >= state.last_sent_us + self.limits.patience_us {
                each!(&mut state.pre, p => p.impatient());
            }
            if self.now_us >= state.last_sent_us + self.limits.retry_after_us {
                state.last_sent_us = self.now_us;
                let mut own = Self::own_messages(slot, state);
                own.push(PresignMessage::Retry { slot });
                self.outputs.extend(own.into_iter().map(|message| PresignOutput::Broadcast { message }));
            }
            self.advance(slot);
        }
    }

    /// When [`PresignCore::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.slots
            .values()
            .filter(|s| s.done.is_none())
            .map(|s| {
                let patience = s.signing.as_ref().and_then(|g| g.share.map(|_| g.shared_at_us + self.limits.patience_us));
                let retry = s.last_sent_us + self.limits.retry_after_us;
                patience.filter(|p| *p > self.now_us).map_or(retry, |p| p.min(retry))
            })
            .min()
    }

    pub fn poll_output(&mut self) -> Option<PresignOutput> {
        self.outputs.pop_front()
    }

    /// Whether the slot's background round is done.
    pub fn is_ready(&self, slot: Slot) -> bool {
        self.slots.get(&slot).is_some_and(|s| each!(&s.pre, p => p.ready()))
    }

    /// Slots held for peers' messages that arrived before this replica prepared them.
    pub fn early_held(&self) -> usize {
        self.early.len()
    }

    /// Reports the slot's newly blamed replicas.
    fn report(state: &mut SlotState, out: &mut Vec<PresignOutput>) {
        let blamed: Vec<(u16, Fault)> = each!(&state.pre, p => p.blamed().collect());
        for (j, fault) in blamed {
            if j >= 1 && state.reported.insert(j) {
                out.push(PresignOutput::Misbehaved { peer: j - 1, fault });
            }
        }
    }

    /// Moves a slot on: Ready, the share once 2t+1 announced this replica's h, the
    /// combination; reports new blames and conflicts.
    fn advance(&mut self, slot: Slot) {
        let (quorum, now, patience) = (2 * usize::from(self.t) + 1, self.now_us, self.limits.patience_us);
        let Some(state) = self.slots.get_mut(&slot) else { return };
        if state.done.is_some() {
            return;
        }
        let mut out = Vec::new();
        let ready = each!(&state.pre, p => p.ready());
        if ready && !state.ready_reported {
            state.ready_reported = true;
            out.push(PresignOutput::Ready { slot });
        }
        let mut counts: BTreeMap<[u8; 32], usize> = BTreeMap::new();
        state.announces.values().for_each(|h| *counts.entry(*h).or_default() += 1);
        Self::report(state, &mut out);
        let suspect = !state.reported.is_empty();
        if let Some(signing) = state.signing.as_mut().filter(|s| s.recorded && !s.conflict) {
            if let Some((other, _)) = counts.iter().find(|(h, c)| **h != signing.h && **c >= quorum) {
                signing.conflict = true;
                out.push(PresignOutput::Conflict { slot, h: *other });
            } else if ready && counts.get(&signing.h).copied().unwrap_or(0) >= quorum {
                if signing.share.is_none() {
                    signing.share = each!(&mut state.pre, p => p.bind(&signing.data));
                    signing.shared_at_us = now;
                    if let Some(share) = signing.share {
                        out.push(PresignOutput::Broadcast { message: PresignMessage::Share { slot, share } });
                    }
                }
                let patient = !suspect && now < signing.shared_at_us + patience;
                match each!(&mut state.pre, p => p.finish(patient)) {
                    Step::Wait => {}
                    Step::NeedProofs => {
                        if !signing.asked_proofs {
                            signing.asked_proofs = true;
                            out.push(PresignOutput::Broadcast { message: PresignMessage::NeedProof { slot } });
                        }
                    }
                    Step::Done(signature) => {
                        state.done = Some(signature);
                        out.push(PresignOutput::Done { slot, signature });
                    }
                    Step::Failed(error) => {
                        signing.conflict = true;
                        out.push(PresignOutput::Failed { slot, error });
                    }
                }
            }
        }
        // Checks made while combining may have caught a share.
        Self::report(state, &mut out);
        let finished = state.done.is_some();
        self.outputs.extend(out);
        if finished {
            self.finished.push_back(slot);
            while self.finished.len() > self.limits.max_finished {
                if let Some(old) = self.finished.pop_front() {
                    self.slots.remove(&old);
                }
            }
        }
    }
}
