//! The sans-IO signing core: sessions per digest, the three protocols, bounded stashes.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};
use shoup_rsa::{combine_basic, combine_opt_proof, combine_opt_te, CombineError, Combined, Message, PublicKey, SignatureShare};

use crate::keys::Keys;
use crate::message::{Digest, SignMessage};

/// Which of the paper's threshold-signature protocols the replicas run (Section 3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// Every share carries its proof; verify each, combine k valid ones.
    Basic,
    /// Shares without proofs; combine the first k, check the signature, fall back to proofs.
    OptProof,
    /// Shares without proofs; try k-subsets of up to 2t+1 shares until one verifies.
    OptTe,
}

/// Bounds on everything a peer can make this core hold.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Signing sessions open at once (requests from the local named). Each has at most two
    /// share computations outstanding, so this also bounds the driver's work queue.
    pub max_sessions: usize,
    /// Digests for which shares arrived before the local named asked.
    pub early_digests: usize,
    /// Of those, how many one peer may occupy, so a liar cannot evict honest shares.
    pub early_per_peer: usize,
    /// Final signatures remembered for replicas that replay old writes.
    pub finals_cache: usize,
    /// A session without a signature re-asks its peers after this long (µs).
    pub retry_after_us: u64,
    /// A share for a signature finished at least this long ago (µs) is answered with the
    /// finished signature: its sender evidently missed the broadcast one (it was stopped, or
    /// is replaying old writes). Sooner, the broadcast is still on its way and an answer would
    /// only double the traffic of every signing.
    pub late_share_after_us: u64,
    /// A shared session (see [`SignerCore::request_shared`]) still without a signature this
    /// long (µs) after it opened stops waiting for its designated replicas: it makes its own
    /// share and combines, as an ordinary session does.
    pub shared_fallback_us: u64,
    /// A designated replica that let a shared session fall back is passed over in later
    /// designations for this long (µs).
    pub suspect_for_us: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_sessions: 4096,
            early_digests: 4096,
            early_per_peer: 1024,
            finals_cache: 4096,
            retry_after_us: 500_000,
            late_share_after_us: 100_000,
            shared_fallback_us: 250_000,
            suspect_for_us: 10_000_000,
        }
    }
}

/// One expensive computation the core needs, self-contained so a driver can run it on a
/// worker thread: this replica's share (one or three constant-time exponentiations), or a
/// combination of shares by the protocol's strategy (proof verifications, subset trials).
/// Jobs are independent; feed each result to [`SignerCore::job_done`] in any order.
pub struct Job {
    pub digest: Digest,
    work: Work,
}

enum Work {
    Share { keys: Keys, message: Message, proof: bool, corrupt: bool },
    Combine { pk: Arc<PublicKey>, message: Message, protocol: Protocol, shares: Vec<SignatureShare> },
}

impl Job {
    pub fn run(self) -> JobDone {
        let result = match self.work {
            Work::Share { keys, message, proof, corrupt } => Finished::Share { proof, result: keys.my_share(&message, proof, corrupt) },
            Work::Combine { pk, message, protocol, shares } => {
                let result = match protocol {
                    Protocol::Basic => combine_basic(&pk, &message, &shares),
                    Protocol::OptProof => combine_opt_proof(&pk, &message, &shares),
                    Protocol::OptTe => combine_opt_te(&pk, &message, &shares),
                };
                Finished::Combine { tried: shares.len(), result }
            }
        };
        JobDone { digest: self.digest, result }
    }

    /// Whether this job computes this replica's share (else it combines shares).
    pub fn is_share(&self) -> bool {
        matches!(self.work, Work::Share { .. })
    }
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.work {
            Work::Share { proof: true, .. } => "share with proof",
            Work::Share { .. } => "share",
            Work::Combine { .. } => "combine",
        };
        f.debug_struct("Job").field("digest", &self.digest).field("kind", &kind).finish()
    }
}

/// A finished [`Job`].
#[derive(Debug)]
pub struct JobDone {
    pub digest: Digest,
    result: Finished,
}

#[derive(Debug)]
enum Finished {
    Share { proof: bool, result: Result<SignatureShare, String> },
    Combine { tried: usize, result: Result<Combined, CombineError> },
}

#[derive(Debug)]
pub enum Output {
    Send {
        to: u16,
        message: SignMessage,
    },
    Broadcast {
        message: SignMessage,
    },
    /// Run this job (on any thread); hand the result to `job_done`. Jobs are independent and
    /// may run in parallel and finish in any order.
    Compute(Job),
    /// The signature for a session is ready (and has been checked against the public key).
    Done {
        digest: Digest,
        signature: Vec<u8>,
    },
    /// The session ended without a signature (this replica's share could not be computed).
    Failed {
        digest: Digest,
        reason: String,
    },
    /// A peer sent something provably wrong (a bad share, a forged final signature).
    Misbehaved {
        peer: u16,
        what: &'static str,
    },
}

/// Counters for metrics.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub signatures: u64,
    pub from_cache: u64,
    pub fallbacks: u64,
    pub bad_shares_by_peer: BTreeMap<u16, u64>,
    pub early_dropped: u64,
    /// Late shares answered with the finished signature (a peer catching up).
    pub late_answered: u64,
    /// Shared sessions that had to fall back.
    pub shared_fallbacks: u64,
    /// Shared sessions that finished without this replica computing its share.
    pub shares_spared: u64,
    /// Retries asking this replica for its share in a shared session it was not designated
    /// for, ignored (see [`SignerCore::request_shared`]).
    pub retries_ignored: u64,
    /// OPT-TE: k-subsets of shares combined and checked (the trials), found valid or not.
    pub subsets_tried: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    #[error("{0} signing sessions are open already")]
    Busy(usize),
    #[error("cannot encode the data for algorithm {alg}: {reason}")]
    Encode { alg: u8, reason: String },
}

struct Session {
    message: Message,
    /// Shares by replica id, at most one each; replaced when a peer resends with proof.
    shares: BTreeMap<u16, SignatureShare>,
    /// Replica ids whose share was shown bad; never used again in this session.
    rejected: BTreeSet<u16>,
    /// OPT-PROOF has seen a bad combination and now wants proofs.
    fallback: bool,
    /// OPT-TE: how many shares the last failed attempt had (no point retrying with as many).
    tried_with: usize,
    /// My own share with its proof, made at most once per session (proofs are costly).
    my_proven: Option<SignatureShare>,
    /// A share computation with proof is outstanding.
    proven_pending: bool,
    /// A combination job is outstanding; `dirty`: shares arrived meanwhile, try again after.
    combining: bool,
    dirty: bool,
    /// Peers waiting for my proven share while it is computed.
    proof_waiters: BTreeSet<u16>,
    last_ask_us: u64,
    /// My share (without proof) was asked of the worker pool.
    share_requested: bool,
    /// While `Some`, only the designated replicas work on this session.
    shared: Option<Designated>,
}

/// Who works on a shared session: `makers` (k replicas) compute their shares, the first of
/// them (`combiner`) combines and broadcasts the signature; everyone else waits for it until
/// `fallback_at_us`.
#[derive(Clone, Debug)]
struct Designated {
    makers: Vec<u16>,
    combiner: u16,
    fallback_at_us: u64,
}

struct Early {
    /// The peer whose message opened this entry; the per-peer bound counts it.
    creator: u16,
    shares: BTreeMap<u16, SignatureShare>,
    finals: Vec<(u16, Vec<u8>)>,
    /// Peers that asked for our share with proof before our named asked to sign: they
    /// get it as soon as it is computed, rather than after their next retry.
    proof_wanted: BTreeSet<u16>,
}

pub struct SignerCore {
    id: u16,
    n: u16,
    protocol: Protocol,
    corrupt: bool,
    keys: Keys,
    limits: Limits,
    sessions: HashMap<Digest, Session>,
    early: HashMap<Digest, Early>,
    early_order: VecDeque<Digest>,
    early_count: HashMap<u16, usize>,
    finals: HashMap<Digest, FinalSig>,
    finals_order: VecDeque<Digest>,
    outputs: VecDeque<Output>,
    stats: Stats,
    /// The latest time any input carried: when a combination job finishes (an input without
    /// a time) the signature counts as finished then. Only inputs move it, so runs replay.
    now_us: u64,
    /// Peers passed over in designations until the time given (at most n entries).
    suspects: BTreeMap<u16, u64>,
}

struct FinalSig {
    signature: Vec<u8>,
    finished_us: u64,
}

impl SignerCore {
    /// `id` is this replica (0-based) of `n`; `corrupt` is the paper's fault injection.
    pub fn new(id: u16, n: u16, protocol: Protocol, corrupt: bool, keys: Keys, limits: Limits) -> SignerCore {
        assert!(id < n && keys.public().players() == n, "validated by the caller's config");
        SignerCore {
            id,
            n,
            protocol,
            corrupt,
            keys,
            limits,
            sessions: HashMap::new(),
            early: HashMap::new(),
            early_order: VecDeque::new(),
            early_count: HashMap::new(),
            finals: HashMap::new(),
            finals_order: VecDeque::new(),
            outputs: VecDeque::new(),
            stats: Stats::default(),
            now_us: 0,
            suspects: BTreeMap::new(),
        }
    }

    pub fn digest(alg: u8, data: &[u8]) -> Digest {
        let mut h = Sha256::new();
        h.update([alg]);
        h.update(data);
        h.finalize().into()
    }

    /// The local named asks for a signature on `data` (already carrying the agreed
    /// times). Returns the session's digest; the result comes as `Output::Done`.
    pub fn request(&mut self, now_us: u64, alg: u8, data: &[u8]) -> Result<Digest, RequestError> {
        self.open(now_us, alg, data, false)
    }

    /// As [`request`](Self::request), for data every replica is asking to sign at about the
    /// same time (a whole-zone signing), where throughput matters more than latency: only k
    /// designated replicas (chosen from the digest, passing over suspects) compute their
    /// shares, the first of them combines, and the others wait for its signature, which they
    /// check as any final signature. A session that waits longer than
    /// `Limits::shared_fallback_us` proceeds as an ordinary one and the designated replicas
    /// that kept it waiting are suspected for `Limits::suspect_for_us`. The signature is the
    /// same either way (RSA PKCS#1 v1.5 is deterministic); only who spends the CPU differs:
    /// per signature the cluster computes k shares and one combination instead of n of each.
    /// A peer's `Retry` reaches only the designated replicas' shares: the others ignore it
    /// until their own session falls back.
    pub fn request_shared(&mut self, now_us: u64, alg: u8, data: &[u8]) -> Result<Digest, RequestError> {
        self.open(now_us, alg, data, true)
    }

    fn open(&mut self, now_us: u64, alg: u8, data: &[u8], shared: bool) -> Result<Digest, RequestError> {
        self.tick(now_us);
        let digest = Self::digest(alg, data);
        if let Some(f) = self.finals.get(&digest) {
            self.stats.from_cache += 1;
            self.outputs.push_back(Output::Done { digest, signature: f.signature.clone() });
            return Ok(digest);
        }
        if self.sessions.contains_key(&digest) {
            return Ok(digest);
        }
        if self.sessions.len() >= self.limits.max_sessions {
            return Err(RequestError::Busy(self.sessions.len()));
        }
        let message = self.keys.encode(alg, data).map_err(|reason| RequestError::Encode { alg, reason })?;
        let with_proof = self.protocol == Protocol::Basic;
        let shared = if shared { self.designate(&digest, now_us) } else { None };
        let makes_share = shared.as_ref().is_none_or(|d| d.makers.contains(&self.id));
        let session = Session {
            message,
            shares: BTreeMap::new(),
            rejected: BTreeSet::new(),
            fallback: false,
            tried_with: 0,
            my_proven: None,
            proven_pending: with_proof && makes_share,
            combining: false,
            dirty: false,
            proof_waiters: BTreeSet::new(),
            last_ask_us: now_us,
            share_requested: makes_share,
            shared,
        };
        self.sessions.insert(digest, session);

        let early = self.take_early(&digest);
        // A replica catching up often holds the finished signature already (peers broadcast
        // it while this one was behind): checked against the public key, it spares the share.
        if let Some(early) = &early {
            for (peer, signature) in &early.finals {
                self.on_final(*peer, digest, signature.clone());
                if !self.sessions.contains_key(&digest) {
                    // Those who asked for our share get the signature itself.
                    for &peer in &early.proof_wanted {
                        self.on_retry(peer, digest, true);
                    }
                    return Ok(digest);
                }
            }
        }
        if let Some(s) = self.sessions.get(&digest) {
            if makes_share {
                let message = s.message.clone();
                self.compute(digest, &message, with_proof);
            }
        }
        if let Some(early) = early {
            if let Some(s) = self.sessions.get_mut(&digest) {
                for (peer, share) in early.shares {
                    s.shares.entry(peer).or_insert(share);
                }
            }
            for peer in early.proof_wanted {
                self.on_retry(peer, digest, true);
            }
        }
        self.progress(digest);
        Ok(digest)
    }

    /// A job asked for by `Output::Compute` finished.
    pub fn job_done(&mut self, done: JobDone) {
        match done.result {
            Finished::Share { proof, result } => self.share_done(done.digest, proof, result),
            Finished::Combine { tried, result } => self.combine_done(done.digest, tried, result),
        }
    }

    fn share_done(&mut self, digest: Digest, proof: bool, result: Result<SignatureShare, String>) {
        let Some(s) = self.sessions.get_mut(&digest) else { return };
        let share = match result {
            Ok(share) => share,
            Err(reason) => {
                self.sessions.remove(&digest);
                self.outputs.push_back(Output::Failed { digest, reason });
                return;
            }
        };
        let bytes = self.keys.share_to_bytes(&share);
        if proof {
            s.proven_pending = false;
            s.my_proven = Some(share.clone());
            s.shares.insert(self.id, share);
            let waiters = std::mem::take(&mut s.proof_waiters);
            if self.protocol == Protocol::Basic || s.fallback {
                // Everyone needs proven shares now.
                self.outputs.push_back(Output::Broadcast { message: SignMessage::Share { digest, share: bytes } });
            } else {
                for to in waiters {
                    self.outputs.push_back(Output::Send { to, message: SignMessage::Share { digest, share: bytes.clone() } });
                }
            }
        } else {
            if s.shares.contains_key(&self.id) {
                // The proven one was ready first and went out already.
                return;
            }
            s.shares.insert(self.id, share);
            self.outputs.push_back(Output::Broadcast { message: SignMessage::Share { digest, share: bytes } });
        }
        self.progress(digest);
    }

    /// The local requester gave up (named timed out); forget the session.
    pub fn abandon(&mut self, digest: &Digest) {
        self.sessions.remove(digest);
    }

    /// `from` is the peer proven by the authenticated link, never a field of the message.
    pub fn handle_message(&mut self, now_us: u64, from: u16, message: SignMessage) {
        if from >= self.n || from == self.id {
            return;
        }
        self.tick(now_us);
        match message {
            SignMessage::Share { digest, share } => match self.keys.share_from_bytes(&share) {
                Some(share) => self.on_share(from, digest, share),
                None => self.blame(from, "undecodable share"),
            },
            SignMessage::Final { digest, signature } => self.on_final(from, digest, signature),
            SignMessage::Retry { digest, proof } => self.on_retry(from, digest, proof),
        }
    }

    pub fn handle_timeout(&mut self, now_us: u64) {
        self.tick(now_us);
        let mut overdue: Vec<Digest> =
            self.sessions.iter().filter(|(_, s)| s.shared.as_ref().is_some_and(|d| d.fallback_at_us <= now_us)).map(|(d, _)| *d).collect();
        overdue.sort();
        for digest in overdue {
            self.fall_back(digest);
        }
        self.suspects.retain(|_, until| *until > now_us);
        let mut asks = Vec::new();
        for (digest, s) in self.sessions.iter_mut() {
            if now_us.saturating_sub(s.last_ask_us) >= self.limits.retry_after_us {
                s.last_ask_us = now_us;
                asks.push((*digest, s.fallback || self.protocol == Protocol::Basic));
            }
        }
        asks.sort();
        for (digest, proof) in asks {
            self.outputs.push_back(Output::Broadcast { message: SignMessage::Retry { digest, proof } });
        }
    }

    pub fn poll_timeout(&self) -> Option<u64> {
        self.sessions
            .values()
            .map(|s| {
                let ask = s.last_ask_us + self.limits.retry_after_us;
                s.shared.as_ref().map_or(ask, |d| ask.min(d.fallback_at_us))
            })
            .min()
    }

    /// The designated replicas of a shared session on `digest`: k of the peers not suspected
    /// (this replica never suspects itself), in the order of ids from a start taken from the
    /// digest, so the work spreads evenly. `None` (an ordinary session) when fewer than k
    /// are left.
    fn designate(&self, digest: &Digest, now_us: u64) -> Option<Designated> {
        let k = usize::from(self.keys.threshold());
        let start = u16::from_be_bytes([digest[0], digest[1]]) % self.n;
        let makers: Vec<u16> = (0..self.n)
            .map(|offset| (start + offset) % self.n)
            .filter(|&peer| peer == self.id || self.suspects.get(&peer).is_none_or(|&until| until <= now_us))
            .take(k)
            .collect();
        if makers.len() < k {
            return None;
        }
        Some(Designated { combiner: makers[0], makers, fallback_at_us: now_us + self.limits.shared_fallback_us })
    }

    /// A shared session stops waiting for its designated replicas: those that sent nothing
    /// it needed are suspected, and it goes on as an ordinary session (my share, and a
    /// combination as soon as there are enough shares).
    fn fall_back(&mut self, digest: Digest) {
        let until = self.now_us + self.limits.suspect_for_us;
        let Some(s) = self.sessions.get_mut(&digest) else { return };
        let Some(designated) = s.shared.take() else { return };
        self.stats.shared_fallbacks += 1;
        for &peer in &designated.makers {
            // A maker's share is what it owed; the combiner also owed the signature, which
            // has not come (the session would be over).
            if peer != self.id && (!s.shares.contains_key(&peer) || peer == designated.combiner) {
                self.suspects.insert(peer, until);
            }
        }
        // A proven share already on its way (a peer asked for it) serves as mine.
        if !s.share_requested && !s.proven_pending {
            s.share_requested = true;
            let with_proof = self.protocol == Protocol::Basic || s.fallback;
            if with_proof {
                s.proven_pending = true;
            }
            let message = s.message.clone();
            self.compute(digest, &message, with_proof);
        }
        self.progress(digest);
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn open_sessions(&self) -> usize {
        self.sessions.len()
    }

    fn tick(&mut self, now_us: u64) {
        self.now_us = self.now_us.max(now_us);
    }

    fn compute(&mut self, digest: Digest, message: &Message, proof: bool) {
        let work = Work::Share { keys: self.keys.clone(), message: message.clone(), proof, corrupt: self.corrupt };
        self.outputs.push_back(Output::Compute(Job { digest, work }));
    }

    /// Makes sure my proven share is (being) computed; returns it if it exists.
    fn want_my_proven(&mut self, digest: Digest) -> Option<SignatureShare> {
        let s = self.sessions.get_mut(&digest)?;
        if let Some(share) = &s.my_proven {
            return Some(share.clone());
        }
        if !s.proven_pending {
            s.proven_pending = true;
            s.share_requested = true;
            let message = s.message.clone();
            self.compute(digest, &message, true);
        }
        None
    }

    fn on_share(&mut self, from: u16, digest: Digest, share: SignatureShare) {
        if share.index.checked_sub(1) != Some(from) {
            // A share carrying another replica's index: impersonation.
            self.blame(from, "share with another replica's index");
            return;
        }
        if let Some(f) = self.finals.get(&digest) {
            // The sender still works on a signature finished here a while ago: end its wait
            // now rather than at its next retry. It checks the signature against the public
            // key, and one share earns one answer, so this amplifies nothing.
            if self.now_us.saturating_sub(f.finished_us) >= self.limits.late_share_after_us {
                self.stats.late_answered += 1;
                let message = SignMessage::Final { digest, signature: f.signature.clone() };
                self.outputs.push_back(Output::Send { to: from, message });
            }
            return;
        }
        let Some(s) = self.sessions.get_mut(&digest) else {
            self.stash_early(from, digest, |e| {
                e.shares.insert(from, share);
            });
            return;
        };
        if s.rejected.contains(&from) {
            return;
        }
        let replace = match s.shares.get(&from) {
            None => true,
            // A resend with proof supersedes the optimistic share.
            Some(old) => old.proof.is_none() && share.proof.is_some(),
        };
        if replace {
            s.shares.insert(from, share);
            self.progress(digest);
        }
    }

    fn on_final(&mut self, from: u16, digest: Digest, signature: Vec<u8>) {
        if self.finals.contains_key(&digest) {
            return;
        }
        let Some(s) = self.sessions.get(&digest) else {
            self.stash_early(from, digest, |e| {
                if e.finals.len() < 2 {
                    e.finals.push((from, signature));
                }
            });
            return;
        };
        if self.keys.verify_signature(&s.message, &signature) {
            self.finish(digest, signature, false);
        } else {
            // A designated combiner that lies is not waited for any longer.
            let from_combiner = s.shared.as_ref().is_some_and(|d| d.combiner == from);
            self.blame(from, "final signature does not verify");
            if from_combiner {
                self.fall_back(digest);
            }
        }
    }

    fn on_retry(&mut self, from: u16, digest: Digest, proof: bool) {
        if let Some(f) = self.finals.get(&digest) {
            let message = SignMessage::Final { digest, signature: f.signature.clone() };
            self.outputs.push_back(Output::Send { to: from, message });
            return;
        }
        let want_proof = proof || self.protocol == Protocol::Basic;
        let Some(s) = self.sessions.get_mut(&digest) else {
            // Not asked by our own named (yet): we issue nothing now, but remember who
            // wants a proven share so it goes out the moment ours is computed.
            if want_proof {
                self.stash_early(from, digest, |e| {
                    e.proof_wanted.insert(from);
                });
            }
            return;
        };
        if s.shared.as_ref().is_some_and(|d| !d.makers.contains(&self.id)) {
            // Not designated: this replica's share was not asked for, and a peer's retry must
            // not make it compute one (a proven share costs three exponentiations). It is not
            // blamed: the peer may have fallen back already, or designated otherwise (its
            // suspects are its own). Once this session falls back here too, the share is made
            // and later retries are answered.
            self.stats.retries_ignored += 1;
            return;
        }
        let share = if want_proof {
            s.proof_waiters.insert(from);
            let share = self.want_my_proven(digest);
            if share.is_some() {
                if let Some(s) = self.sessions.get_mut(&digest) {
                    s.proof_waiters.remove(&from);
                }
            }
            share
        } else {
            // Still being computed: it is broadcast when done.
            s.shares.get(&self.id).cloned()
        };
        if let Some(share) = share {
            let share = self.keys.share_to_bytes(&share);
            self.outputs.push_back(Output::Send { to: from, message: SignMessage::Share { digest, share } });
        }
    }

    /// Tries to finish a session with what it holds, per the protocol, through shoup-rsa's
    /// strategy for it (run as a job). One combination per session at a time; shares that
    /// arrive meanwhile trigger another once it is back.
    fn progress(&mut self, digest: Digest) {
        let k = usize::from(self.keys.threshold());
        let t = usize::from(self.keys.public().max_faults());
        let (suspects, now_us) = (&self.suspects, self.now_us);
        let Some(s) = self.sessions.get_mut(&digest) else { return };
        if s.combining {
            s.dirty = true;
            return;
        }
        if s.shared.as_ref().is_some_and(|d| d.combiner != self.id) {
            // The designated combiner's signature is on its way; shares wait for a fallback.
            return;
        }
        // BASIC, and OPT-PROOF after its fallback, count only shares with proofs; shares
        // still without one are waited for (their senders are asked again).
        let proofs_only = self.protocol == Protocol::Basic || s.fallback;
        let mut candidates: Vec<SignatureShare> =
            s.shares.iter().filter(|(i, sh)| !s.rejected.contains(i) && (!proofs_only || sh.proof.is_some())).map(|(_, sh)| sh.clone()).collect();
        if self.protocol == Protocol::OptTe {
            // Any 2t+1 shares hold t+1 good ones; try subsets of at most that many (or k,
            // when the dealer chose a threshold above 2t+1), and only with more shares than
            // the last failed attempt had. Shares of peers shown bad in recent sessions go
            // last (stably, by id otherwise): the subsets are tried in order, so with the
            // corrupted signers known the first one tried combines, instead of the trials
            // starting with the nearest signers' shares, bad or not, and a check of every
            // other share after a success that was not the first.
            let suspected = |share: &SignatureShare| share.index.checked_sub(1).is_some_and(|peer| suspects.get(&peer).is_some_and(|&until| until > now_us));
            candidates.sort_by_key(suspected);
            candidates.truncate((2 * t + 1).max(k));
            if candidates.len() <= s.tried_with {
                return;
            }
        }
        if candidates.len() < k {
            return;
        }
        s.combining = true;
        s.dirty = false;
        let work = Work::Combine { pk: self.keys.public_arc(), message: s.message.clone(), protocol: self.protocol, shares: candidates };
        self.outputs.push_back(Output::Compute(Job { digest, work }));
    }

    fn combine_done(&mut self, digest: Digest, tried: usize, result: Result<Combined, CombineError>) {
        let Some(s) = self.sessions.get_mut(&digest) else { return };
        s.combining = false;
        let optimistic = self.protocol == Protocol::OptProof && !s.fallback;
        let what = match self.protocol {
            Protocol::Basic => "share proof does not verify",
            Protocol::OptProof if s.fallback => "share proof does not verify",
            Protocol::OptProof => "malformed share or bad proof",
            Protocol::OptTe => "share did not combine",
        };
        if self.protocol == Protocol::OptTe && result.is_err() {
            s.tried_with = tried;
        }
        if let (Protocol::OptTe, Ok(Combined { attempts, .. }) | Err(CombineError::NeedMoreShares { attempts, .. })) = (self.protocol, &result) {
            self.stats.subsets_tried += attempts;
        }
        match result {
            Ok(Combined { signature, bad, .. }) => {
                self.reject(digest, &bad, what);
                self.finish(digest, signature.into_bytes(), true);
                return;
            }
            Err(CombineError::NotEnoughValidShares { bad, .. }) if !optimistic => self.reject(digest, &bad, what),
            Err(CombineError::NeedMoreShares { bad, .. }) => self.reject(digest, &bad, what),
            // OPT-PROOF's optimism failed (and the proofs at hand, if any, are too few):
            // ask everyone for proofs, send ours with proof.
            Err(CombineError::NeedProofs { bad, .. } | CombineError::NotEnoughValidShares { bad, .. }) => {
                self.reject(digest, &bad, what);
                if let Some(s) = self.sessions.get_mut(&digest) {
                    s.fallback = true;
                    s.dirty = true;
                    self.stats.fallbacks += 1;
                }
                if let Some(mine) = self.want_my_proven(digest) {
                    let share = self.keys.share_to_bytes(&mine);
                    self.outputs.push_back(Output::Broadcast { message: SignMessage::Share { digest, share } });
                }
                self.outputs.push_back(Output::Broadcast { message: SignMessage::Retry { digest, proof: true } });
            }
            // Not enough shares yet; anything else cannot come from peers' data.
            Err(_) => {}
        }
        if self.sessions.get(&digest).is_some_and(|s| s.dirty) {
            self.progress(digest);
        }
    }

    /// Shoup indices shown bad in a session: never used again there; their senders blamed.
    fn reject(&mut self, digest: Digest, bad: &[u16], what: &'static str) {
        for &index in bad {
            let Some(peer) = index.checked_sub(1) else { continue };
            if peer == self.id {
                continue;
            }
            if let Some(s) = self.sessions.get_mut(&digest) {
                s.rejected.insert(peer);
            }
            self.blame(peer, what);
        }
    }

    fn finish(&mut self, digest: Digest, signature: Vec<u8>, announce: bool) {
        let Some(session) = self.sessions.remove(&digest) else { return };
        self.stats.signatures += 1;
        if !session.share_requested {
            self.stats.shares_spared += 1;
        }
        if announce {
            // Others may lack honest shares (a corrupted peer's, a lost frame); the
            // finished signature ends their wait as in OPT-PROOF.
            self.outputs.push_back(Output::Broadcast { message: SignMessage::Final { digest, signature: signature.clone() } });
        }
        self.remember_final(digest, signature.clone());
        self.outputs.push_back(Output::Done { digest, signature });
    }

    fn remember_final(&mut self, digest: Digest, signature: Vec<u8>) {
        let entry = FinalSig { signature, finished_us: self.now_us };
        if self.finals.insert(digest, entry).is_none() {
            self.finals_order.push_back(digest);
        }
        while self.finals_order.len() > self.limits.finals_cache {
            if let Some(old) = self.finals_order.pop_front() {
                self.finals.remove(&old);
            }
        }
    }

    fn blame(&mut self, peer: u16, what: &'static str) {
        *self.stats.bad_shares_by_peer.entry(peer).or_default() += 1;
        // Provably faulty: not designated for shared sessions for a while, so its bad shares
        // stop costing fallbacks. Only a peer's own messages can get it blamed.
        self.suspects.insert(peer, self.now_us + self.limits.suspect_for_us);
        self.outputs.push_back(Output::Misbehaved { peer, what });
    }

    fn stash_early(&mut self, from: u16, digest: Digest, put: impl FnOnce(&mut Early)) {
        let is_new = !self.early.contains_key(&digest);
        if is_new {
            if self.early_count.get(&from).copied().unwrap_or(0) >= self.limits.early_per_peer {
                self.stats.early_dropped += 1;
                return;
            }
            while self.early.len() >= self.limits.early_digests {
                let Some(old) = self.early_order.pop_front() else { break };
                self.drop_early(&old);
                self.stats.early_dropped += 1;
            }
            self.early_order.push_back(digest);
            *self.early_count.entry(from).or_default() += 1;
        }
        put(self.early.entry(digest).or_insert_with(|| Early { creator: from, shares: BTreeMap::new(), finals: Vec::new(), proof_wanted: BTreeSet::new() }));
    }

    fn take_early(&mut self, digest: &Digest) -> Option<Early> {
        let e = self.early.remove(digest)?;
        self.early_order.retain(|d| d != digest);
        self.uncount(&e);
        Some(e)
    }

    fn drop_early(&mut self, digest: &Digest) {
        if let Some(e) = self.early.remove(digest) {
            self.uncount(&e);
        }
    }

    fn uncount(&mut self, e: &Early) {
        if let Some(c) = self.early_count.get_mut(&e.creator) {
            *c = c.saturating_sub(1);
        }
    }
}
