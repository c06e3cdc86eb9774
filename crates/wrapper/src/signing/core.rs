use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use sha2::{Digest as _, Sha256};

use super::crypto::{Combined, Keys, Msg, Share};
use super::wire::{Digest, SignMessage};
use crate::config::Protocol;

/// Bounds on everything a peer can make this core hold.
#[derive(Clone, Debug)]
pub struct SignerLimits {
    /// Signing sessions open at once (requests from the local named).
    pub max_sessions: usize,
    /// Digests for which shares arrived before the local named asked.
    pub early_digests: usize,
    /// Of those, how many one peer may occupy, so a liar cannot evict honest shares.
    pub early_per_peer: usize,
    /// Final signatures remembered for replicas that replay old writes.
    pub finals_cache: usize,
    /// A session without a signature re-asks its peers after this long (µs).
    pub retry_after_us: u64,
}

impl Default for SignerLimits {
    fn default() -> Self {
        Self { max_sessions: 4096, early_digests: 4096, early_per_peer: 1024, finals_cache: 4096, retry_after_us: 500_000 }
    }
}

#[derive(Debug, PartialEq)]
pub enum Output {
    Send { to: u16, message: SignMessage },
    Broadcast { message: SignMessage },
    /// The signature for a session is ready (and has been checked against the public key).
    Done { digest: Digest, signature: Vec<u8> },
    /// A peer sent something provably wrong (a bad share, a forged final signature).
    Misbehaved { peer: u16, what: &'static str },
}

/// Counters for metrics.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub signatures: u64,
    pub from_cache: u64,
    pub fallbacks: u64,
    pub bad_shares_by_peer: BTreeMap<u16, u64>,
    pub early_dropped: u64,
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
    message: Msg,
    /// Shares by replica id, at most one each; replaced when a peer resends with proof.
    shares: BTreeMap<u16, Share>,
    /// Replica ids whose share carries a proof that verified.
    proven: BTreeSet<u16>,
    /// Replica ids whose share was shown bad; never used again in this session.
    rejected: BTreeSet<u16>,
    /// OPT-PROOF has seen a bad combination and now wants proofs.
    fallback: bool,
    /// OPT-TE: how many shares the last failed attempt had (no point retrying with as many).
    tried_with: usize,
    /// My own share with its proof, made at most once per session (proofs are costly).
    my_proven: Option<Share>,
    last_ask_us: u64,
}

struct Early {
    /// The peer whose message opened this entry; the per-peer bound counts it.
    creator: u16,
    shares: BTreeMap<u16, Share>,
    finals: Vec<(u16, Vec<u8>)>,
    /// Peers that asked for our share with proof before our named asked to sign: they
    /// get it as soon as it asks, rather than after their next retry.
    proof_wanted: BTreeSet<u16>,
}

pub struct SignerCore {
    id: u16,
    n: u16,
    t: u16,
    protocol: Protocol,
    corrupt: bool,
    keys: Keys,
    limits: SignerLimits,
    sessions: HashMap<Digest, Session>,
    early: HashMap<Digest, Early>,
    early_order: VecDeque<Digest>,
    early_count: HashMap<u16, usize>,
    finals: HashMap<Digest, Vec<u8>>,
    finals_order: VecDeque<Digest>,
    outputs: VecDeque<Output>,
    stats: Stats,
}

impl SignerCore {
    pub fn new(id: u16, n: u16, t: u16, protocol: Protocol, corrupt: bool, keys: Keys, limits: SignerLimits) -> SignerCore {
        assert!(id < n && u32::from(n) > 3 * u32::from(t), "validated by the config");
        SignerCore {
            id,
            n,
            t,
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
        let digest = Self::digest(alg, data);
        if let Some(sig) = self.finals.get(&digest) {
            self.stats.from_cache += 1;
            self.outputs.push_back(Output::Done { digest, signature: sig.clone() });
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
        let mine = self.keys.my_share(&message, with_proof, self.corrupt).map_err(|reason| RequestError::Encode { alg, reason })?;
        let mut session = Session {
            message,
            shares: BTreeMap::new(),
            proven: BTreeSet::new(),
            rejected: BTreeSet::new(),
            fallback: false,
            tried_with: 0,
            my_proven: with_proof.then(|| mine.clone()),
            last_ask_us: now_us,
        };
        session.shares.insert(self.id, mine.clone());
        let bytes = self.keys.share_to_bytes(&mine);
        self.outputs.push_back(Output::Broadcast { message: SignMessage::Share { digest, share: bytes } });
        self.sessions.insert(digest, session);

        if let Some(early) = self.take_early(&digest) {
            for (peer, signature) in early.finals {
                self.on_final(peer, digest, signature);
                if !self.sessions.contains_key(&digest) {
                    return Ok(digest);
                }
            }
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

    /// The local requester gave up (named timed out); forget the session.
    pub fn abandon(&mut self, digest: &Digest) {
        self.sessions.remove(digest);
    }

    /// `from` is the peer proven by the authenticated link, never a field of the message.
    pub fn handle_message(&mut self, _now_us: u64, from: u16, message: SignMessage) {
        if from >= self.n || from == self.id {
            return;
        }
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
        self.sessions.values().map(|s| s.last_ask_us + self.limits.retry_after_us).min()
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

    fn on_share(&mut self, from: u16, digest: Digest, share: Share) {
        if Keys::share_replica(&share) != Some(from) {
            // A share carrying another replica's index: impersonation.
            self.blame(from, "share with another replica's index");
            return;
        }
        if self.finals.contains_key(&digest) {
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
            Some(old) => !Keys::has_proof(old) && Keys::has_proof(&share),
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
            self.blame(from, "final signature does not verify");
        }
    }

    fn on_retry(&mut self, from: u16, digest: Digest, proof: bool) {
        if let Some(sig) = self.finals.get(&digest) {
            self.outputs.push_back(Output::Send { to: from, message: SignMessage::Final { digest, signature: sig.clone() } });
            return;
        }
        let want_proof = proof || self.protocol == Protocol::Basic;
        let (id, corrupt) = (self.id, self.corrupt);
        let Some(s) = self.sessions.get_mut(&digest) else {
            // Not asked by our own named (yet): we issue nothing now, but remember who
            // wants a proven share so it goes out the moment our named asks.
            if want_proof {
                self.stash_early(from, digest, |e| {
                    e.proof_wanted.insert(from);
                });
            }
            return;
        };
        let share = if want_proof {
            if s.my_proven.is_none() {
                s.my_proven = self.keys.my_share(&s.message, true, corrupt).ok();
            }
            s.my_proven.clone()
        } else {
            s.shares.get(&id).cloned()
        };
        if let Some(share) = share {
            let share = self.keys.share_to_bytes(&share);
            self.outputs.push_back(Output::Send { to: from, message: SignMessage::Share { digest, share } });
        }
    }

    /// Try to finish a session with what it holds, per the configured protocol.
    fn progress(&mut self, digest: Digest) {
        let k = usize::from(self.keys.threshold());
        let Some(s) = self.sessions.get_mut(&digest) else { return };
        let proofs_mode = self.protocol == Protocol::Basic || (self.protocol == Protocol::OptProof && s.fallback);
        let mut blamed = Vec::new();
        let outcome: Option<Combined> = if proofs_mode {
            // Verify each share's proof once; combine k proven ones.
            let unchecked: Vec<u16> =
                s.shares.keys().copied().filter(|i| !s.proven.contains(i) && !s.rejected.contains(i)).collect();
            for i in unchecked {
                let ok = s.shares.get(&i).is_some_and(|sh| Keys::has_proof(sh) && self.keys.verify_share(&s.message, sh));
                if ok {
                    s.proven.insert(i);
                } else if s.shares.get(&i).is_some_and(Keys::has_proof) {
                    s.rejected.insert(i);
                    blamed.push((i, "share proof does not verify"));
                }
            }
            if s.proven.len() >= k {
                let chosen: Vec<Share> = s.proven.iter().take(k).filter_map(|i| s.shares.get(i).cloned()).collect();
                self.keys.combine_checked(&s.message, &chosen)
            } else {
                None
            }
        } else if self.protocol == Protocol::OptProof {
            let usable: Vec<Share> = s.shares.iter().filter(|(i, _)| !s.rejected.contains(i)).map(|(_, sh)| sh.clone()).collect();
            if usable.len() >= k {
                let first: Vec<Share> = usable.into_iter().take(k).collect();
                match self.keys.combine_checked(&s.message, &first) {
                    Some(c) => Some(c),
                    None => {
                        // Optimism failed: ask everyone for proofs, send ours with proof.
                        s.fallback = true;
                        self.stats.fallbacks += 1;
                        if let Ok(mine) = self.keys.my_share(&s.message, true, self.corrupt) {
                            s.my_proven = Some(mine.clone());
                            s.shares.insert(self.id, mine.clone());
                            let share = self.keys.share_to_bytes(&mine);
                            self.outputs.push_back(Output::Broadcast { message: SignMessage::Share { digest, share } });
                        }
                        self.outputs.push_back(Output::Broadcast { message: SignMessage::Retry { digest, proof: true } });
                        None
                    }
                }
            } else {
                None
            }
        } else {
            // OPT-TE: any 2t+1 shares hold t+1 good ones; try subsets of at most that many
            // (or k, when the dealer chose a threshold above 2t+1).
            let window = (2 * usize::from(self.t) + 1).max(k);
            let usable: Vec<Share> = s
                .shares
                .iter()
                .filter(|(i, _)| !s.rejected.contains(i))
                .take(window)
                .map(|(_, sh)| sh.clone())
                .collect();
            if usable.len() >= k && usable.len() > s.tried_with {
                let result = self.keys.combine_trial(&s.message, &usable);
                if result.is_none() {
                    s.tried_with = usable.len();
                }
                result
            } else {
                None
            }
        };
        for (peer, what) in blamed {
            self.blame(peer, what);
        }
        if let Some(c) = outcome {
            for bad in c.bad {
                if bad != self.id {
                    self.blame(bad, "share did not combine");
                }
            }
            self.finish(digest, c.signature, true);
        }
    }

    fn finish(&mut self, digest: Digest, signature: Vec<u8>, announce: bool) {
        if self.sessions.remove(&digest).is_none() {
            return;
        }
        self.stats.signatures += 1;
        if announce {
            // Others may lack honest shares (a corrupted peer's, a lost frame); the
            // finished signature ends their wait as in OPT-PROOF.
            self.outputs.push_back(Output::Broadcast { message: SignMessage::Final { digest, signature: signature.clone() } });
        }
        self.remember_final(digest, signature.clone());
        self.outputs.push_back(Output::Done { digest, signature });
    }

    fn remember_final(&mut self, digest: Digest, signature: Vec<u8>) {
        if self.finals.insert(digest, signature).is_none() {
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
