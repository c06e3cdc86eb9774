//! The sans-IO network core of threshold ECDSA P-256 and Ed25519 signing: what the wrapper's
//! signing service drives, as it drives `threshold::SignerCore` for RSA.
//!
//! One session per digest (SHA-256 over algorithm and data), opened only when the local named
//! asks ([`EcSignerCore::request`]): peers learn digests and protocol messages, never data, and
//! a replica contributes to nothing its own named did not ask it to sign. Peers' messages for
//! digests not yet requested wait in a bounded stash. A session's state travels in [`EcJob`]s:
//! every expensive step (creating the session with its commitments, own shares, combination and
//! verification, checking a peer's final signature) runs in a job the driver may hand to any
//! thread, while the core keeps the session's inbox; the core itself never computes on a curve
//! and is deterministic in its inputs.
//!
//! A peer's final signature ends the wait only when it is exactly the session's signature
//! (docs/DETERMINISM.md): Ed25519 through `verify_strict` and the session's R; ECDSA by
//! s·R = e·G + r·Y with the session's R, since the standard verifier also accepts −s. Before R
//! is known (a replica that missed the commitment round), an ECDSA final that verifies counts
//! as a vote, and t+1 peers sending the same bytes settle it: one of them is honest, and honest
//! replicas only ever hold the protocol's s.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use crate::ecdsa::EcdsaKey;
use crate::ed::EdKey;
use crate::prss::{contains, subsets};
use crate::{Algorithm, EcdsaMessage, EcdsaSession, EdMessage, EdSession, Error, Fault, KeyShare, PublicKey};

/// SHA-256 over (DNSSEC algorithm, data): names a session on every replica.
pub type Digest = [u8; 32];

/// The digest of a signing request, as every replica computes it.
pub fn digest_of(algorithm: u8, data: &[u8]) -> Digest {
    Sha256::new().chain_update([algorithm]).chain_update(data).finalize().into()
}

/// What replicas' EC signers send each other. The byte framing is the transport's business.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EcSignMessage {
    /// One of the sender's protocol messages for the session: an [`crate::EdMessage`] or
    /// [`crate::EcdsaMessage`] in its wire form (tag 1: commitments, tag 2: share).
    Round { digest: Digest, body: Vec<u8> },
    /// The sender has no signature yet: resend your messages, or the signature if you have it.
    Retry { digest: Digest },
    /// The finished signature (64 bytes, DNSSEC wire form).
    Final { digest: Digest, signature: Vec<u8> },
}

impl EcSignMessage {
    pub fn digest(&self) -> &Digest {
        match self {
            EcSignMessage::Round { digest, .. } | EcSignMessage::Retry { digest } | EcSignMessage::Final { digest, .. } => digest,
        }
    }
}

/// Bounds on everything a peer can make this core hold, and the retry pace.
#[derive(Clone, Debug)]
pub struct EcLimits {
    /// Signing sessions open at once (requests from the local named); each has at most one
    /// job outstanding, so this also bounds the driver's work queue.
    pub max_sessions: usize,
    /// Digests for which messages arrived before the local named asked.
    pub early_digests: usize,
    /// Of those, how many one peer may have opened, so a liar cannot evict honest ones.
    pub early_per_peer: usize,
    /// Bytes of early messages, all digests together (an ECDSA first message grows with
    /// C(n−1, t): 527 bytes at n = 4, 3.1 kB at n = 7). Oldest digests go first.
    pub early_bytes: usize,
    /// Final signatures remembered for replicas that replay old writes and peers that lag
    /// (for ECDSA with this replica's own protocol messages, see `Finished`).
    pub finals_cache: usize,
    /// A session without a signature re-asks its peers after this long (µs); a peer's
    /// re-ask is answered at most once per half of it.
    pub retry_after_us: u64,
    /// ECDSA: how long (µs) a session waits for all n first messages, whose μ shares are
    /// then taken without checking a proof, before it checks the proofs of those it has
    /// (several scalar multiplications per share). Not waited for while a peer is suspected.
    pub patience_us: u64,
    /// A peer that misbehaved, or whose first message had not come when a session ended, is
    /// not waited for (see `patience_us`) for this long (µs).
    pub suspect_for_us: u64,
}

impl Default for EcLimits {
    fn default() -> Self {
        Self {
            max_sessions: 4096,
            early_digests: 4096,
            early_per_peer: 1024,
            early_bytes: 32 << 20,
            finals_cache: 4096,
            retry_after_us: 500_000,
            patience_us: 20_000,
            suspect_for_us: 10_000_000,
        }
    }
}

/// A request the core refuses; the caller reports it to named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EcRequestError {
    #[error("{0} signing sessions are open already")]
    TooManySessions(usize),
    #[error("this key signs with DNSSEC algorithm {expected}, the request is for {got}")]
    WrongAlgorithm { expected: u8, got: u8 },
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct EcStats {
    /// Signatures finished (combined here or taken from a peer's final signature).
    pub signatures: u64,
    /// Of those, peers' final signatures that ended a session.
    pub finals_accepted: u64,
    /// Requests answered from the finals cache.
    pub from_cache: u64,
    /// Jobs handed to the driver.
    pub jobs: u64,
    pub retries_sent: u64,
    pub retries_answered: u64,
    /// Messages stashed for digests not yet requested, and those dropped by the bounds.
    pub early_stashed: u64,
    pub early_dropped: u64,
    /// Copies of a message beyond the two a session takes from a peer (a copy and an
    /// equivocation), dropped.
    pub excess_dropped: u64,
    pub misbehaved: u64,
    pub open_sessions: u64,
    /// ECDSA sessions begun waiting for all first messages (the cheap path, no proof checks).
    pub patient_sessions: u64,
}

#[derive(Debug)]
pub enum EcOutput {
    /// `to`: 0-based replica id.
    Send {
        to: u16,
        message: EcSignMessage,
    },
    Broadcast {
        message: EcSignMessage,
    },
    /// Run this job (on any thread); hand the result to [`EcSignerCore::job_done`]. Jobs are
    /// independent and may finish in any order.
    Compute(EcJob),
    /// The signature for a session (64 bytes, r ‖ s or R ‖ S), checked as described above.
    Done {
        digest: Digest,
        signature: Vec<u8>,
    },
    /// A peer sent something provably wrong.
    Misbehaved {
        peer: u16,
        what: &'static str,
    },
    /// The session ended without a signature (a negligible-probability dead end).
    Failed {
        digest: Digest,
        reason: String,
    },
}

/// The key as the sessions and the final checks use it, decoded once.
struct Key {
    pk: Arc<PublicKey>,
    sessions: SessionKey,
    /// The standard verifier of the public key.
    verifier: Verifier,
    t: u16,
    /// Exact lengths of the two protocol messages (tag included).
    first_len: usize,
    second_len: usize,
}

enum SessionKey {
    Ed(Arc<EdKey>),
    Ecdsa(Arc<EcdsaKey>),
}

enum Verifier {
    Ed(ed25519_dalek::VerifyingKey),
    Ecdsa(p256::ecdsa::VerifyingKey),
}

impl Verifier {
    fn verifies(&self, data: &[u8], signature: &[u8; 64]) -> bool {
        match self {
            Verifier::Ed(key) => key.verify_strict(data, &ed25519_dalek::Signature::from_bytes(signature)).is_ok(),
            Verifier::Ecdsa(key) => {
                use p256::ecdsa::signature::Verifier as _;
                p256::ecdsa::Signature::from_slice(signature).is_ok_and(|s| key.verify(data, &s).is_ok())
            }
        }
    }
}

/// Either protocol's session.
#[allow(clippy::large_enum_variant)] // one per session, inside the boxed `State` jobs carry
enum Proto {
    Ed(EdSession),
    Ecdsa(EcdsaSession),
}

impl Proto {
    fn start(key: &Key, data: &[u8], patient: bool) -> Result<(Proto, Vec<u8>), Error> {
        Ok(match &key.sessions {
            SessionKey::Ed(k) => {
                let (s, m) = EdSession::with_key(k.clone(), data)?;
                (Proto::Ed(s), m.to_bytes())
            }
            SessionKey::Ecdsa(k) => {
                let (mut s, m) = EcdsaSession::with_key(k.clone(), data)?;
                s.set_patient(patient);
                (Proto::Ecdsa(s), m.to_bytes())
            }
        })
    }

    fn impatient(&mut self) {
        if let Proto::Ecdsa(s) = self {
            s.set_patient(false);
        }
    }

    /// `from` 1-based; a fault is recorded in the session's blame list.
    fn receive(&mut self, from: u16, body: &[u8]) {
        let _ = match self {
            Proto::Ed(s) => s.receive(from, body),
            Proto::Ecdsa(s) => s.receive(from, body),
        };
    }

    fn my_share(&mut self) -> Option<Vec<u8>> {
        match self {
            Proto::Ed(s) => s.ready_for_shares().then(|| s.my_share()).flatten().map(|m| m.to_bytes()),
            Proto::Ecdsa(s) => s.ready_for_shares().then(|| s.my_share()).flatten().map(|m| m.to_bytes()),
        }
    }

    fn try_finish(&mut self) -> Option<Result<[u8; 64], Error>> {
        match self {
            Proto::Ed(s) => s.try_finish(),
            Proto::Ecdsa(s) => s.try_finish(),
        }
    }

    fn blamed(&self) -> &BTreeMap<u16, Fault> {
        match self {
            Proto::Ed(s) => s.blamed(),
            Proto::Ecdsa(s) => s.blamed(),
        }
    }

    /// `None` while an ECDSA session has no R to check against.
    fn accepts_final(&self, signature: &[u8; 64]) -> Option<bool> {
        match self {
            Proto::Ed(s) => Some(s.accepts_final(signature)),
            Proto::Ecdsa(s) => s.accepts_final(signature),
        }
    }
}

fn fault_text(fault: Fault) -> &'static str {
    match fault {
        Fault::UnknownReplica => "not a replica of this key",
        Fault::Malformed => "malformed protocol message",
        Fault::LyingCommitment => "commitment other than the one t+1 holders agree on",
        Fault::Equivocation => "two different messages of one kind",
        Fault::BadShare => "signature share fails its check",
    }
}

/// A peer's input to a session (`from` 0-based), or the core's word that waiting is over.
enum Input {
    Round { from: u16, body: Vec<u8> },
    Final { from: u16, signature: [u8; 64] },
    Impatient,
}

impl Input {
    fn from(&self) -> u16 {
        match self {
            Input::Round { from, .. } | Input::Final { from, .. } => *from,
            Input::Impatient => u16::MAX,
        }
    }

    /// Kind for the per-peer bounds: the protocol message's tag, 0 for a final signature.
    fn kind(&self) -> u8 {
        match self {
            Input::Round { body, .. } => body.first().copied().unwrap_or(0),
            Input::Final { .. } | Input::Impatient => 0,
        }
    }

    fn size(&self) -> usize {
        match self {
            Input::Round { body, .. } => body.len(),
            Input::Final { .. } => 64,
            Input::Impatient => 0,
        }
    }
}

/// What a job reports back.
#[derive(Debug)]
enum Event {
    /// One of this replica's protocol messages, to broadcast (and to resend on request).
    Own(Vec<u8>),
    Blame {
        peer: u16,
        what: &'static str,
    },
    /// `announce`: combined here, so peers get it as a final signature.
    Signature {
        signature: [u8; 64],
        announce: bool,
    },
    Failed(String),
}

/// A session's state: it travels in jobs, the core keeps only the inbox meanwhile.
struct State {
    key: Arc<Key>,
    me: u16,
    data: Vec<u8>,
    /// `None` until the first job created it (or found a peer's signature first).
    proto: Option<Proto>,
    /// ECDSA: wait for all first messages (see [`EcLimits::patience_us`]).
    patient: bool,
    sent_share: bool,
    /// ECDSA finals that verify but could not be checked exactly yet: bytes → senders.
    votes: BTreeMap<[u8; 64], BTreeSet<u16>>,
    /// Peers reported in this session (once each).
    reported: BTreeSet<u16>,
    /// The paper's fault injection: this replica's own values go out corrupted.
    corrupt: bool,
}

impl State {
    fn step(&mut self, inputs: Vec<Input>, events: &mut Vec<Event>) {
        // Peers' signatures first: one that holds spares all the rest (the other finals are
        // then judged by their bytes).
        let mut rounds = Vec::new();
        let mut settled: Option<[u8; 64]> = None;
        for input in inputs {
            match input {
                Input::Impatient => self.patient = false,
                Input::Final { from, signature } => match settled {
                    Some(known) if known != signature => self.blame(from, "final signature is not the session's", events),
                    Some(_) => {}
                    None if self.consider_final(from, signature, events) => settled = Some(signature),
                    None => {}
                },
                Input::Round { from, body } => rounds.push((from, body)),
            }
        }
        if settled.is_some() {
            return;
        }
        if self.proto.is_none() {
            match Proto::start(&self.key, &self.data, self.patient) {
                Ok((proto, first)) => {
                    self.proto = Some(proto);
                    events.push(Event::Own(outgoing(self.corrupt, &self.key, first)));
                }
                Err(e) => {
                    events.push(Event::Failed(e.to_string()));
                    return;
                }
            }
        }
        let Some(proto) = self.proto.as_mut() else { return };
        for (from, body) in rounds {
            proto.receive(from + 1, &body);
        }
        if !self.patient {
            proto.impatient();
        }
        if !self.sent_share {
            if let Some(share) = proto.my_share() {
                self.sent_share = true;
                events.push(Event::Own(outgoing(self.corrupt, &self.key, share)));
            }
        }
        let finished = proto.try_finish();
        self.report_session_blames(events);
        match finished {
            Some(Ok(signature)) => {
                self.settle_votes(&signature, events);
                events.push(Event::Signature { signature, announce: true });
            }
            Some(Err(e)) => events.push(Event::Failed(e.to_string())),
            None => self.recheck_votes(events),
        }
    }

    /// A peer's final signature: `true` when it ends the session.
    fn consider_final(&mut self, from: u16, signature: [u8; 64], events: &mut Vec<Event>) -> bool {
        let verdict = match (&self.proto, &self.key.verifier) {
            (Some(proto), _) => proto.accepts_final(&signature),
            // Ed25519 needs no session to check exactly; ECDSA needs its R.
            (None, Verifier::Ed(_)) => Some(self.key.verifier.verifies(&self.data, &signature)),
            (None, Verifier::Ecdsa(_)) => None,
        };
        match verdict {
            Some(true) => {
                self.settle_votes(&signature, events);
                events.push(Event::Signature { signature, announce: false });
                true
            }
            Some(false) => {
                self.blame(from, "final signature is not the session's", events);
                false
            }
            None if !self.key.verifier.verifies(&self.data, &signature) => {
                self.blame(from, "final signature is not the session's", events);
                false
            }
            None => {
                let voters = self.votes.entry(signature).or_default();
                voters.insert(from);
                if voters.len() > usize::from(self.key.t) {
                    self.settle_votes(&signature, events);
                    events.push(Event::Signature { signature, announce: false });
                    return true;
                }
                false
            }
        }
    }

    /// The signature is known: whoever voted for other bytes lied.
    fn settle_votes(&mut self, signature: &[u8; 64], events: &mut Vec<Event>) {
        let votes = std::mem::take(&mut self.votes);
        for (bytes, voters) in votes {
            if bytes != *signature {
                for peer in voters {
                    self.blame(peer, "final signature is not the session's", events);
                }
            }
        }
    }

    /// Once R is fixed, the votes can be checked exactly.
    fn recheck_votes(&mut self, events: &mut Vec<Event>) {
        let Some(proto) = &self.proto else { return };
        let mut valid = None;
        for bytes in self.votes.keys() {
            if proto.accepts_final(bytes) == Some(true) {
                valid = Some(*bytes);
            }
        }
        if let Some(signature) = valid {
            self.settle_votes(&signature, events);
            events.push(Event::Signature { signature, announce: false });
        } else if self.votes.keys().next().is_some_and(|b| proto.accepts_final(b).is_some()) {
            // R is known and no vote is the session's signature: every voter lied.
            let liars: Vec<u16> = std::mem::take(&mut self.votes).into_values().flatten().collect();
            for peer in liars {
                self.blame(peer, "final signature is not the session's", events);
            }
        }
    }

    fn report_session_blames(&mut self, events: &mut Vec<Event>) {
        let Some(proto) = &self.proto else { return };
        let new: Vec<(u16, Fault)> = proto.blamed().iter().filter_map(|(i, f)| Some((i.checked_sub(1)?, *f))).collect();
        for (peer, fault) in new {
            self.blame(peer, fault_text(fault), events);
        }
    }

    fn blame(&mut self, peer: u16, what: &'static str, events: &mut Vec<Event>) {
        if peer != self.me && self.reported.insert(peer) {
            events.push(Event::Blame { peer, what });
        }
    }
}

/// One of this replica's protocol messages as it goes out: as computed, or `corrupted`.
fn outgoing(corrupt: bool, key: &Key, body: Vec<u8>) -> Vec<u8> {
    if corrupt {
        corrupted(key.pk.algorithm(), body)
    } else {
        body
    }
}

/// A corrupted replica's message (the paper's fault injection, [`EcSignerCore::with_corrupt`]):
/// every bit of each value computed from its key share inverted (Ed25519: s_i; ECDSA: μ_i and
/// σ_i), then reduced to a canonical scalar so that the message still parses and fails only
/// its share check or proof, as a corrupted RSA share fails its proof. Commitments and proofs
/// are left as they were. Messages of other shapes pass unchanged.
fn corrupted(algorithm: Algorithm, body: Vec<u8>) -> Vec<u8> {
    fn ed(value: &[u8; 32]) -> [u8; 32] {
        curve25519_dalek::Scalar::from_bytes_mod_order(value.map(|b| !b)).to_bytes()
    }
    fn p256(value: &[u8; 32]) -> [u8; 32] {
        use p256::elliptic_curve::{bigint::U256, ops::Reduce, PrimeField};
        <p256::Scalar as Reduce<U256>>::reduce_bytes(&value.map(|b| !b).into()).to_repr().into()
    }
    match algorithm {
        Algorithm::Ed25519 => match EdMessage::from_bytes(&body) {
            Some(EdMessage::Share(s)) => EdMessage::Share(ed(&s)).to_bytes(),
            _ => body,
        },
        Algorithm::EcdsaP256Sha256 => match EcdsaMessage::from_bytes(&body) {
            Some(EcdsaMessage::Round1 { commitments, mu, proof }) => EcdsaMessage::Round1 { commitments, mu: p256(&mu), proof }.to_bytes(),
            Some(EcdsaMessage::Sigma { sigma, proof }) => EcdsaMessage::Sigma { sigma: p256(&sigma), proof }.to_bytes(),
            None => body,
        },
    }
}

/// One expensive, self-contained step of one session: run it anywhere (it is `Send +
/// 'static`) and hand the result to [`EcSignerCore::job_done`].
pub struct EcJob {
    digest: Digest,
    id: u64,
    state: Box<State>,
    inputs: Vec<Input>,
}

impl EcJob {
    pub fn run(self) -> EcJobDone {
        let EcJob { digest, id, mut state, inputs } = self;
        let mut events = Vec::new();
        state.step(inputs, &mut events);
        EcJobDone { digest, id, state, events }
    }

    pub fn digest(&self) -> &Digest {
        &self.digest
    }
}

impl fmt::Debug for EcJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EcJob").field("digest", &self.digest).field("inputs", &self.inputs.len()).finish_non_exhaustive()
    }
}

/// A finished [`EcJob`].
pub struct EcJobDone {
    digest: Digest,
    id: u64,
    state: Box<State>,
    events: Vec<Event>,
}

impl fmt::Debug for EcJobDone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The state holds secret shares: never printed.
        f.debug_struct("EcJobDone").field("digest", &self.digest).field("events", &self.events).finish_non_exhaustive()
    }
}

struct Session {
    /// Tells a job of this session from one of an abandoned session on the same digest.
    id: u64,
    /// The state, unless a job holds it.
    state: Option<Box<State>>,
    inbox: Vec<Input>,
    /// Inputs taken per (peer, kind): at most two (a copy, and an equivocation to blame).
    taken: BTreeMap<(u16, u8), u8>,
    /// This replica's own protocol messages, to answer a peer's retry.
    own: Vec<Vec<u8>>,
    last_ask_us: u64,
    /// ECDSA: when the session stops waiting for all first messages, until it has.
    patience_at: Option<u64>,
    /// ECDSA: the session waited for all first messages and stopped waiting: only then does
    /// a missing peer become a suspect (a session that never waited says nothing about it).
    patience_ran_out: bool,
    /// When each peer's retry was last answered.
    answered: BTreeMap<u16, u64>,
}

/// A finished session, kept to answer replays and peers that lag behind.
struct Finished {
    signature: [u8; 64],
    /// ECDSA: this replica's protocol messages. A replica that missed the commitment round
    /// cannot check a final signature exactly without R, and if fewer than t+1 peers hold the
    /// signature it must learn R from the commitments of t+1 holders per set, some of whom
    /// may have finished already. (Ed25519 finals are checked without R: empty.)
    own: Vec<Vec<u8>>,
}

struct Early {
    /// The peer whose message opened this entry; the per-peer bound counts it.
    creator: u16,
    /// Tells this entry from an earlier one on the same digest in `early_order`.
    seq: u64,
    inputs: Vec<Input>,
    bytes: usize,
}

/// The signing core of one EC key at one replica.
pub struct EcSignerCore {
    me: u16,
    n: u16,
    key: Arc<Key>,
    limits: EcLimits,
    sessions: BTreeMap<Digest, Session>,
    next_id: u64,
    early: HashMap<Digest, Early>,
    early_order: VecDeque<(Digest, u64)>,
    early_count: HashMap<u16, usize>,
    early_bytes: usize,
    finals: HashMap<Digest, Finished>,
    finals_order: VecDeque<Digest>,
    outputs: VecDeque<EcOutput>,
    stats: EcStats,
    /// The latest time an input carried (job results carry none).
    now_us: u64,
    /// Peers not waited for until the time given (at most n entries).
    suspects: BTreeMap<u16, u64>,
    /// See [`EcSignerCore::with_corrupt`].
    corrupt: bool,
}

impl EcSignerCore {
    /// me: this replica's 0-based id (key share index = me + 1). Validates the public key and
    /// the share against it once; what is per key is decoded here, not per session.
    pub fn new(me: u16, pk: Arc<PublicKey>, share: Arc<KeyShare>, limits: EcLimits) -> Result<EcSignerCore, Error> {
        pk.validate()?;
        if share.index() != me.wrapping_add(1) {
            return Err(Error::ShareIndex { expected: me.wrapping_add(1), found: share.index() });
        }
        share.check(&pk)?;
        let (n, t) = (pk.players(), pk.threshold());
        let verifier = match pk.algorithm() {
            Algorithm::Ed25519 => {
                let bytes: [u8; 32] = pk.dnskey_public_key().try_into().map_err(|_| Error::Malformed("public key"))?;
                Verifier::Ed(ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|_| Error::Malformed("public key"))?)
            }
            Algorithm::EcdsaP256Sha256 => {
                let mut sec1 = vec![4u8];
                sec1.extend(pk.dnskey_public_key());
                Verifier::Ecdsa(p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1).map_err(|_| Error::Malformed("public key"))?)
            }
        };
        // Every replica holds the keys of C(n−1, t) sets: the first message's length is fixed.
        let held = subsets(n, t).into_iter().filter(|s| !contains(*s, share.index())).count();
        let (first_len, second_len) = match pk.algorithm() {
            Algorithm::Ed25519 => (1 + 32 * held, 1 + 32),
            Algorithm::EcdsaP256Sha256 => (1 + 2 + held * (2 + 2 * usize::from(t)) * 33 + 32 + crate::proof::PROOF_LEN, 1 + 32 + crate::proof::PROOF_LEN),
        };
        let sessions = match pk.algorithm() {
            Algorithm::Ed25519 => SessionKey::Ed(Arc::new(EdKey::new(pk.clone(), share)?)),
            Algorithm::EcdsaP256Sha256 => SessionKey::Ecdsa(Arc::new(EcdsaKey::new(pk.clone(), share)?)),
        };
        let key = Arc::new(Key { pk, sessions, verifier, t, first_len, second_len });
        Ok(EcSignerCore {
            me,
            n,
            key,
            limits,
            sessions: BTreeMap::new(),
            next_id: 0,
            early: HashMap::new(),
            early_order: VecDeque::new(),
            early_count: HashMap::new(),
            early_bytes: 0,
            finals: HashMap::new(),
            finals_order: VecDeque::new(),
            outputs: VecDeque::new(),
            stats: EcStats::default(),
            now_us: 0,
            suspects: BTreeMap::new(),
            corrupt: false,
        })
    }

    /// The paper's fault injection (test clusters only, `--corrupt`): this replica sends
    /// every share it computes from its key share corrupted (see `corrupted`), so that honest
    /// replicas must detect the bad shares, name this replica and sign without it.
    #[must_use]
    pub fn with_corrupt(mut self, corrupt: bool) -> EcSignerCore {
        self.corrupt = corrupt;
        self
    }

    pub fn algorithm(&self) -> Algorithm {
        self.key.pk.algorithm()
    }

    /// The local named asks for a signature on `data`. Returns the session's digest; the
    /// signature comes as [`EcOutput::Done`] (at once when it is cached).
    pub fn request(&mut self, now_us: u64, algorithm: u8, data: &[u8]) -> Result<Digest, EcRequestError> {
        self.now_us = self.now_us.max(now_us);
        let expected = self.algorithm().number();
        if algorithm != expected {
            return Err(EcRequestError::WrongAlgorithm { expected, got: algorithm });
        }
        let digest = digest_of(algorithm, data);
        if let Some(finished) = self.finals.get(&digest) {
            self.stats.from_cache += 1;
            self.outputs.push_back(EcOutput::Done { digest, signature: finished.signature.to_vec() });
            return Ok(digest);
        }
        if self.sessions.contains_key(&digest) {
            return Ok(digest);
        }
        if self.sessions.len() >= self.limits.max_sessions {
            return Err(EcRequestError::TooManySessions(self.sessions.len()));
        }
        self.suspects.retain(|_, until| *until > now_us);
        let patient = self.algorithm() == Algorithm::EcdsaP256Sha256 && self.suspects.is_empty() && self.limits.patience_us > 0;
        let state = State {
            key: self.key.clone(),
            me: self.me,
            data: data.to_vec(),
            proto: None,
            patient,
            sent_share: false,
            votes: BTreeMap::new(),
            reported: BTreeSet::new(),
            corrupt: self.corrupt,
        };
        let mut session = Session {
            id: self.next_id,
            state: Some(Box::new(state)),
            inbox: Vec::new(),
            taken: BTreeMap::new(),
            own: Vec::new(),
            last_ask_us: now_us,
            patience_at: patient.then(|| now_us.saturating_add(self.limits.patience_us)),
            patience_ran_out: false,
            answered: BTreeMap::new(),
        };
        self.stats.patient_sessions += u64::from(patient);
        self.next_id += 1;
        if let Some(early) = self.take_early(&digest) {
            for input in early.inputs {
                *session.taken.entry((input.from(), input.kind())).or_default() += 1;
                session.inbox.push(input);
            }
        }
        self.sessions.insert(digest, session);
        // The first job creates the session even with an empty inbox.
        self.dispatch(digest, true);
        Ok(digest)
    }

    /// `from` is the peer proven by the authenticated link (0-based), never a field of the
    /// message.
    pub fn handle_message(&mut self, now_us: u64, from: u16, message: EcSignMessage) {
        if from >= self.n || from == self.me {
            return;
        }
        self.now_us = self.now_us.max(now_us);
        match message {
            EcSignMessage::Round { digest, body } => {
                let expected = match body.first() {
                    Some(1) => Some(self.key.first_len),
                    Some(2) => Some(self.key.second_len),
                    _ => None,
                };
                if expected != Some(body.len()) {
                    self.misbehaved(from, "malformed protocol message");
                    return;
                }
                if !self.finals.contains_key(&digest) {
                    self.deliver(digest, Input::Round { from, body });
                }
            }
            EcSignMessage::Final { digest, signature } => {
                let Ok(signature) = <[u8; 64]>::try_from(signature.as_slice()) else {
                    self.misbehaved(from, "final signature of the wrong length");
                    return;
                };
                match self.finals.get(&digest) {
                    // Every honest replica holds the same bytes: other bytes are a lie.
                    Some(held) if held.signature != signature => self.misbehaved(from, "final signature is not the session's"),
                    Some(_) => {}
                    None => self.deliver(digest, Input::Final { from, signature }),
                }
            }
            EcSignMessage::Retry { digest } => self.on_retry(now_us, from, digest),
        }
    }

    fn deliver(&mut self, digest: Digest, input: Input) {
        let Some(session) = self.sessions.get_mut(&digest) else {
            self.stash_early(digest, input);
            return;
        };
        let taken = session.taken.entry((input.from(), input.kind())).or_default();
        if *taken >= 2 {
            self.stats.excess_dropped += 1;
            return;
        }
        *taken += 1;
        session.inbox.push(input);
        self.dispatch(digest, false);
    }

    /// Hands the session's state and inbox to a job, unless a job holds the state already or
    /// there is nothing to do.
    fn dispatch(&mut self, digest: Digest, first: bool) {
        let Some(session) = self.sessions.get_mut(&digest) else { return };
        if session.inbox.is_empty() && !first {
            return;
        }
        let Some(state) = session.state.take() else { return };
        let inputs = std::mem::take(&mut session.inbox);
        self.stats.jobs += 1;
        self.outputs.push_back(EcOutput::Compute(EcJob { digest, id: session.id, state, inputs }));
    }

    fn on_retry(&mut self, now_us: u64, from: u16, digest: Digest) {
        if let Some(finished) = self.finals.get(&digest) {
            self.stats.retries_answered += 1;
            self.outputs.push_back(EcOutput::Send { to: from, message: EcSignMessage::Final { digest, signature: finished.signature.to_vec() } });
            for body in &finished.own {
                self.outputs.push_back(EcOutput::Send { to: from, message: EcSignMessage::Round { digest, body: body.clone() } });
            }
            return;
        }
        // Not asked by our named (yet): nothing to give; our messages go out when it asks.
        let Some(session) = self.sessions.get_mut(&digest) else { return };
        let half = self.limits.retry_after_us / 2;
        if session.own.is_empty() || session.answered.get(&from).is_some_and(|&at| now_us.saturating_sub(at) < half) {
            return;
        }
        session.answered.insert(from, now_us);
        self.stats.retries_answered += 1;
        for body in &session.own {
            self.outputs.push_back(EcOutput::Send { to: from, message: EcSignMessage::Round { digest, body: body.clone() } });
        }
    }

    /// A job asked for by [`EcOutput::Compute`] finished.
    pub fn job_done(&mut self, done: EcJobDone) {
        let EcJobDone { digest, id, state, events } = done;
        let Some(session) = self.sessions.get_mut(&digest).filter(|s| s.id == id) else { return };
        let mut end = None;
        let mut blames = Vec::new();
        for event in events {
            match event {
                Event::Own(body) => {
                    session.own.push(body.clone());
                    self.outputs.push_back(EcOutput::Broadcast { message: EcSignMessage::Round { digest, body } });
                }
                Event::Blame { peer, what } => blames.push((peer, what)),
                Event::Signature { signature, announce } => end = Some(Ok((signature, announce))),
                Event::Failed(reason) => end = Some(Err(reason)),
            }
        }
        session.state = Some(state);
        for (peer, what) in blames {
            self.misbehaved(peer, what);
        }
        match end {
            Some(Ok((signature, announce))) => self.finish(digest, signature, announce),
            Some(Err(reason)) => {
                self.sessions.remove(&digest);
                self.outputs.push_back(EcOutput::Failed { digest, reason });
            }
            None => self.dispatch(digest, false),
        }
    }

    fn finish(&mut self, digest: Digest, signature: [u8; 64], announce: bool) {
        let Some(session) = self.sessions.remove(&digest) else { return };
        // A peer whose first message this session waited for in vain is not waited for a
        // while. Sessions that did not wait renew nothing: renewing from them kept a peer that
        // was only once slow suspected for good under load, and every session on the path
        // that checks proofs (docs/BENCHMARKS.md, "Writes and whole-zone signing with
        // algorithm 13").
        if session.patience_ran_out {
            let until = self.now_us.saturating_add(self.limits.suspect_for_us);
            for peer in (0..self.n).filter(|p| *p != self.me && !session.taken.contains_key(&(*p, 1))) {
                self.suspects.insert(peer, until);
            }
        }
        // Finals still waiting in the inbox are judged by their bytes now: every honest
        // replica holds these very bytes.
        let reported = session.state.as_ref().map(|s| s.reported.clone()).unwrap_or_default();
        let liars: BTreeSet<u16> = session
            .inbox
            .iter()
            .filter_map(|i| match i {
                Input::Final { from, signature: other } if *other != signature && !reported.contains(from) => Some(*from),
                _ => None,
            })
            .collect();
        for peer in liars {
            self.misbehaved(peer, "final signature is not the session's");
        }
        let own = if self.algorithm() == Algorithm::EcdsaP256Sha256 { session.own } else { Vec::new() };
        self.stats.signatures += 1;
        if announce {
            // Peers that lost messages (or hear only liars) end their wait with it.
            self.outputs.push_back(EcOutput::Broadcast { message: EcSignMessage::Final { digest, signature: signature.to_vec() } });
        } else {
            self.stats.finals_accepted += 1;
        }
        if self.finals.insert(digest, Finished { signature, own }).is_none() {
            self.finals_order.push_back(digest);
        }
        while self.finals_order.len() > self.limits.finals_cache {
            if let Some(old) = self.finals_order.pop_front() {
                self.finals.remove(&old);
            }
        }
        self.outputs.push_back(EcOutput::Done { digest, signature: signature.to_vec() });
    }

    /// Re-asks peers for sessions without a signature for `retry_after_us`.
    pub fn handle_timeout(&mut self, now_us: u64) {
        self.now_us = self.now_us.max(now_us);
        let mut impatient = Vec::new();
        for (digest, session) in self.sessions.iter_mut() {
            if session.patience_at.is_some_and(|at| at <= now_us) {
                session.patience_at = None;
                session.patience_ran_out = true;
                session.inbox.push(Input::Impatient);
                impatient.push(*digest);
            }
            if now_us.saturating_sub(session.last_ask_us) >= self.limits.retry_after_us {
                session.last_ask_us = now_us;
                self.stats.retries_sent += 1;
                self.outputs.push_back(EcOutput::Broadcast { message: EcSignMessage::Retry { digest: *digest } });
            }
        }
        for digest in impatient {
            self.dispatch(digest, false);
        }
    }

    pub fn poll_timeout(&self) -> Option<u64> {
        self.sessions
            .values()
            .map(|s| {
                let ask = s.last_ask_us.saturating_add(self.limits.retry_after_us);
                s.patience_at.map_or(ask, |at| ask.min(at))
            })
            .min()
    }

    pub fn poll_output(&mut self) -> Option<EcOutput> {
        self.outputs.pop_front()
    }

    /// The local requester gave up: forget the session (a job still out is ignored).
    pub fn abandon(&mut self, digest: &Digest) {
        self.sessions.remove(digest);
    }

    pub fn stats(&self) -> EcStats {
        EcStats { open_sessions: self.sessions.len() as u64, ..self.stats }
    }

    /// Digests and bytes held for digests not yet requested (for tests and metrics).
    pub fn early_held(&self) -> (usize, usize) {
        (self.early.len(), self.early_bytes)
    }

    fn misbehaved(&mut self, peer: u16, what: &'static str) {
        self.stats.misbehaved += 1;
        self.suspects.insert(peer, self.now_us.saturating_add(self.limits.suspect_for_us));
        self.outputs.push_back(EcOutput::Misbehaved { peer, what });
    }

    /// Keeps a peer's message for a digest our named has not asked for: one per peer and kind
    /// per digest, `early_per_peer` digests opened per peer, `early_digests` and `early_bytes`
    /// in all (oldest dropped first).
    fn stash_early(&mut self, digest: Digest, input: Input) {
        let (from, kind, size) = (input.from(), input.kind(), input.size());
        if let Some(entry) = self.early.get_mut(&digest) {
            if entry.inputs.iter().any(|i| i.from() == from && i.kind() == kind) {
                self.stats.early_dropped += 1;
                return;
            }
            entry.inputs.push(input);
            entry.bytes += size;
        } else {
            if self.early_count.get(&from).copied().unwrap_or(0) >= self.limits.early_per_peer {
                self.stats.early_dropped += 1;
                return;
            }
            while self.early.len() >= self.limits.early_digests.max(1) && self.evict_oldest() {}
            let seq = self.next_id;
            self.next_id += 1;
            self.early.insert(digest, Early { creator: from, seq, inputs: vec![input], bytes: size });
            self.early_order.push_back((digest, seq));
            if self.early_order.len() > 2 * self.early.len() + 16 {
                // Entries taken by requests leave stale places behind: drop them now and then.
                let early = &self.early;
                self.early_order.retain(|(d, s)| early.get(d).is_some_and(|e| e.seq == *s));
            }
            *self.early_count.entry(from).or_default() += 1;
        }
        self.early_bytes += size;
        self.stats.early_stashed += 1;
        while self.early_bytes > self.limits.early_bytes && self.evict_oldest() {}
    }

    /// Drops the oldest early entry; `false` when there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some((digest, seq)) = self.early_order.pop_front() {
            if self.early.get(&digest).is_some_and(|e| e.seq == seq) {
                if let Some(e) = self.take_early(&digest) {
                    self.stats.early_dropped += e.inputs.len() as u64;
                }
                return true;
            }
        }
        false
    }

    fn take_early(&mut self, digest: &Digest) -> Option<Early> {
        let e = self.early.remove(digest)?;
        self.early_bytes -= e.bytes;
        if let Some(c) = self.early_count.get_mut(&e.creator) {
            *c = c.saturating_sub(1);
        }
        // Its place in `early_order` goes stale (the seq no longer matches).
        Some(e)
    }
}
