//! One zone's signing core, RSA's (`threshold::SignerCore`) or EC's
//! (`threshold_ec::EcSignerCore`), behind one interface for the service's loop: the two are
//! driven alike (requests, peers' messages, jobs, timeouts, outputs); only the messages and
//! the jobs differ in type.

use std::sync::Arc;

use threshold::{Job, JobDone, Output, SignerCore};
use threshold_ec::{EcJob, EcJobDone, EcOutput, EcSignMessage, EcSignerCore};

use super::wire::{SignMessage, ZoneMessage};
use super::{Digest, Keys};

/// A zone's threshold key as the signing core takes it.
#[derive(Clone)]
pub enum ZoneKeys {
    Rsa(Keys),
    Ec { public: Arc<threshold_ec::PublicKey>, share: Arc<threshold_ec::KeyShare> },
}

/// A zone's signing core.
pub enum ZoneCore {
    Rsa(SignerCore),
    Ec(EcSignerCore),
}

/// A core's expensive step, to run on any thread.
pub enum ZoneJob {
    Rsa(Job),
    Ec(EcJob),
}

/// A finished [`ZoneJob`], for the core that made it.
pub enum ZoneJobDone {
    Rsa(JobDone),
    Ec(EcJobDone),
}

impl ZoneJob {
    pub fn run(self) -> ZoneJobDone {
        match self {
            ZoneJob::Rsa(job) => ZoneJobDone::Rsa(job.run()),
            ZoneJob::Ec(job) => ZoneJobDone::Ec(job.run()),
        }
    }

    /// The session the job belongs to.
    pub fn digest(&self) -> Digest {
        match self {
            ZoneJob::Rsa(job) => job.digest,
            ZoneJob::Ec(job) => *job.digest(),
        }
    }

    /// Whether the job combines shares into a signature (RSA); else it computes this
    /// replica's part (RSA's share; each of EC's protocol rounds, which also combine).
    pub fn is_combination(&self) -> bool {
        matches!(self, ZoneJob::Rsa(job) if !job.is_share())
    }
}

/// What a core asks its driver to do (both cores' outputs, messages wrapped).
pub enum ZoneOutput {
    Send { to: u16, message: ZoneMessage },
    Broadcast { message: ZoneMessage },
    Compute(ZoneJob),
    Done { digest: Digest, signature: Vec<u8> },
    Misbehaved { peer: u16, what: &'static str },
    Failed { digest: Digest, reason: String },
}

impl From<Output> for ZoneOutput {
    fn from(out: Output) -> Self {
        match out {
            Output::Send { to, message } => ZoneOutput::Send { to, message: ZoneMessage::Rsa(message) },
            Output::Broadcast { message } => ZoneOutput::Broadcast { message: ZoneMessage::Rsa(message) },
            Output::Compute(job) => ZoneOutput::Compute(ZoneJob::Rsa(job)),
            Output::Done { digest, signature } => ZoneOutput::Done { digest, signature },
            Output::Misbehaved { peer, what } => ZoneOutput::Misbehaved { peer, what },
            Output::Failed { digest, reason } => ZoneOutput::Failed { digest, reason },
        }
    }
}

impl From<EcOutput> for ZoneOutput {
    fn from(out: EcOutput) -> Self {
        match out {
            EcOutput::Send { to, message } => ZoneOutput::Send { to, message: ZoneMessage::Ec(message) },
            EcOutput::Broadcast { message } => ZoneOutput::Broadcast { message: ZoneMessage::Ec(message) },
            EcOutput::Compute(job) => ZoneOutput::Compute(ZoneJob::Ec(job)),
            EcOutput::Done { digest, signature } => ZoneOutput::Done { digest, signature },
            EcOutput::Misbehaved { peer, what } => ZoneOutput::Misbehaved { peer, what },
            EcOutput::Failed { digest, reason } => ZoneOutput::Failed { digest, reason },
        }
    }
}

/// A peer's message of the other kind than the zone's key: a lie (or a misconfigured peer).
#[derive(Debug, PartialEq, Eq)]
pub struct WrongKind;

impl ZoneCore {
    /// Opens (or joins) the session for `data`. `shared`: a whole-zone signing's request,
    /// which every replica makes at about the same time; RSA lets k designated replicas make
    /// the shares (`SignerCore::request_shared`). EC has no such optimisation: its nonce is
    /// derived from the data and every replica's share is a few scalar operations, so a plain
    /// request it is.
    pub fn request(&mut self, now_us: u64, algorithm: u8, data: &[u8], shared: bool) -> Result<Digest, String> {
        match self {
            ZoneCore::Rsa(core) if shared => core.request_shared(now_us, algorithm, data).map_err(|e| e.to_string()),
            ZoneCore::Rsa(core) => core.request(now_us, algorithm, data).map_err(|e| e.to_string()),
            ZoneCore::Ec(core) => core.request(now_us, algorithm, data).map_err(|e| e.to_string()),
        }
    }

    pub fn handle_message(&mut self, now_us: u64, from: u16, message: ZoneMessage) -> Result<(), WrongKind> {
        match (self, message) {
            (ZoneCore::Rsa(core), ZoneMessage::Rsa(m)) => core.handle_message(now_us, from, m),
            (ZoneCore::Ec(core), ZoneMessage::Ec(m)) => core.handle_message(now_us, from, m),
            _ => return Err(WrongKind),
        }
        Ok(())
    }

    /// A job's result; jobs come from this core's own outputs, so the kinds always match.
    pub fn job_done(&mut self, done: ZoneJobDone) {
        match (self, done) {
            (ZoneCore::Rsa(core), ZoneJobDone::Rsa(d)) => core.job_done(d),
            (ZoneCore::Ec(core), ZoneJobDone::Ec(d)) => core.job_done(d),
            _ => {}
        }
    }

    pub fn handle_timeout(&mut self, now_us: u64) {
        match self {
            ZoneCore::Rsa(core) => core.handle_timeout(now_us),
            ZoneCore::Ec(core) => core.handle_timeout(now_us),
        }
    }

    pub fn poll_timeout(&self) -> Option<u64> {
        match self {
            ZoneCore::Rsa(core) => core.poll_timeout(),
            ZoneCore::Ec(core) => core.poll_timeout(),
        }
    }

    pub fn poll_output(&mut self) -> Option<ZoneOutput> {
        match self {
            ZoneCore::Rsa(core) => core.poll_output().map(ZoneOutput::from),
            ZoneCore::Ec(core) => core.poll_output().map(ZoneOutput::from),
        }
    }

    pub fn abandon(&mut self, digest: &Digest) {
        match self {
            ZoneCore::Rsa(core) => core.abandon(digest),
            ZoneCore::Ec(core) => core.abandon(digest),
        }
    }

    /// Shared signings' (shares spared, fallbacks) so far: RSA's only.
    pub fn shared_counts(&self) -> (u64, u64) {
        match self {
            ZoneCore::Rsa(core) => (core.stats().shares_spared, core.stats().shared_fallbacks),
            ZoneCore::Ec(_) => (0, 0),
        }
    }
}

/// A Byzantine replica's rewrite of what it sends (test clusters only): `bytes` replaces
/// each byte field of a share, protocol round or signature (garbage-shares: random bytes of
/// the same length). The session digest stays, so that peers take the message for the
/// session and blame its sender.
pub fn rewrite(message: ZoneMessage, bytes: &mut dyn FnMut(&mut [u8])) -> ZoneMessage {
    match message {
        ZoneMessage::Rsa(SignMessage::Share { digest, mut share }) => {
            bytes(&mut share);
            ZoneMessage::Rsa(SignMessage::Share { digest, share })
        }
        ZoneMessage::Rsa(SignMessage::Final { digest, mut signature }) => {
            bytes(&mut signature);
            ZoneMessage::Rsa(SignMessage::Final { digest, signature })
        }
        ZoneMessage::Rsa(other) => ZoneMessage::Rsa(other),
        ZoneMessage::Ec(m) => ZoneMessage::Ec(rewrite_ec(m, bytes)),
    }
}

/// An EC message's protocol body (its tag and fields) or final signature rewritten.
fn rewrite_ec(message: EcSignMessage, bytes: &mut dyn FnMut(&mut [u8])) -> EcSignMessage {
    match message {
        EcSignMessage::Round { digest, mut body } => {
            bytes(&mut body);
            EcSignMessage::Round { digest, body }
        }
        EcSignMessage::Final { digest, mut signature } => {
            bytes(&mut signature);
            EcSignMessage::Final { digest, signature }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::files::tests::TestRng;
    use crate::signing::wire::{SignEnvelope, WireFormat};
    use std::collections::{BTreeMap, BTreeSet, VecDeque};

    /// Four EC cores; replica `corrupt`'s core corrupts its own shares (`--corrupt`).
    fn ec_cores(alg: threshold_ec::Algorithm, corrupt: u16) -> Vec<ZoneCore> {
        let (pk, shares) = threshold_ec::deal(alg, 4, 1, &mut TestRng(u64::from(alg.number()) + 100)).unwrap();
        let pk = Arc::new(pk);
        let core = |i: usize, s| EcSignerCore::new(i as u16, pk.clone(), Arc::new(s), Default::default()).unwrap().with_corrupt(i == usize::from(corrupt));
        shares.into_iter().enumerate().map(|(i, s)| ZoneCore::Ec(core(i, s))).collect()
    }

    /// Each core's signatures, and (reporter, accused) pairs.
    type Outcome = (Vec<Vec<Vec<u8>>>, BTreeSet<(u16, u16)>);

    /// Four EC cores sign the same data, their messages carried as the mesh carries them (the
    /// envelope's bytes); replica `bad`'s messages are rewritten by `fault`, and replica
    /// `corrupt`'s core corrupts its shares. Returns each core's signatures and who was
    /// reported misbehaving by whom.
    fn sign_with(alg: threshold_ec::Algorithm, bad: u16, corrupt: u16, fault: &mut dyn FnMut(&mut [u8])) -> Outcome {
        let mut cores = ec_cores(alg, corrupt);
        let data = b"\x00\x01\x0d\x02 an RRset's to-be-signed bytes";
        for core in &mut cores {
            core.request(0, alg.number(), data, true).unwrap();
        }
        let mut wire: VecDeque<(u16, u16, Vec<u8>)> = VecDeque::new();
        let mut done: BTreeMap<u16, Vec<Vec<u8>>> = BTreeMap::new();
        let mut blamed = BTreeSet::new();
        let mut now = 1;
        for _ in 0..10_000 {
            let mut progress = false;
            for (i, core) in cores.iter_mut().enumerate() {
                let me = i as u16;
                while let Some(out) = core.poll_output() {
                    progress = true;
                    let mut send = |to: Option<u16>, message: ZoneMessage| {
                        let message = if me == bad { rewrite(message, fault) } else { message };
                        let bytes = SignEnvelope { zone: 0, message }.encode();
                        for peer in (0..4).filter(|&p| p != me && to.is_none_or(|t| t == p)) {
                            wire.push_back((me, peer, bytes.clone()));
                        }
                    };
                    match out {
                        ZoneOutput::Send { to, message } => send(Some(to), message),
                        ZoneOutput::Broadcast { message } => send(None, message),
                        ZoneOutput::Compute(job) => core.job_done(job.run()),
                        ZoneOutput::Done { signature, .. } => done.entry(me).or_default().push(signature),
                        ZoneOutput::Misbehaved { peer, .. } => {
                            blamed.insert((me, peer));
                        }
                        ZoneOutput::Failed { reason, .. } => panic!("replica {me} failed: {reason}"),
                    }
                }
            }
            if let Some((from, to, bytes)) = wire.pop_front() {
                progress = true;
                let envelope = SignEnvelope::decode(&bytes).unwrap();
                cores[usize::from(to)].handle_message(now, from, envelope.message).unwrap();
            }
            if progress {
                continue;
            }
            // Quiet: every honest core done, or time moves on to the next retry (a core still
            // waits for messages the garbage replica spoiled).
            if (0..4).all(|i| i == bad || i == corrupt || done.contains_key(&i)) {
                break;
            }
            let Some(next) = cores.iter().filter_map(ZoneCore::poll_timeout).min() else { break };
            now = now.max(next);
            cores.iter_mut().for_each(|c| c.handle_timeout(now));
        }
        ((0..4).map(|i| done.remove(&i).unwrap_or_default()).collect(), blamed)
    }

    #[test]
    fn ec_cores_sign_through_the_envelope_and_name_a_replica_sending_garbage() {
        for alg in [threshold_ec::Algorithm::EcdsaP256Sha256, threshold_ec::Algorithm::Ed25519] {
            let (honest, blamed) = sign_with(alg, 9, 9, &mut |_| {});
            assert!(blamed.is_empty(), "{alg:?}: {blamed:?}");
            assert!(honest.iter().all(|d| d.len() == 1 && d[0] == honest[0][0] && d[0].len() == 64), "{alg:?}: {honest:?}");
            // Replica 2 sends garbage (the garbage-shares mode's rewrite), then bit-inverted
            // messages, then (its core's own `--corrupt`) corrupted shares: the others still
            // sign, the same bytes as without it, and name replica 2 and no one else.
            let mut state = 0x2545_f491_4f6c_dd1du64;
            let mut garbage = |b: &mut [u8]| {
                b.iter_mut().for_each(|x| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    *x = state as u8;
                })
            };
            let mut invert = |b: &mut [u8]| b.iter_mut().for_each(|x| *x = !*x);
            let mut nothing = |_: &mut [u8]| {};
            for (what, rewritten, corrupt, fault) in
                [("garbage", 2, 9, &mut garbage as &mut dyn FnMut(&mut [u8])), ("inverted", 2, 9, &mut invert), ("corrupt core", 9, 2, &mut nothing)]
            {
                let (signed, blamed) = sign_with(alg, rewritten, corrupt, fault);
                for i in [0usize, 1, 3] {
                    assert_eq!(signed[i], honest[0], "{alg:?} {what}: replica {i}");
                }
                assert!(!blamed.is_empty() && blamed.iter().all(|&(by, peer)| peer == 2 && by != 2), "{alg:?} {what}: {blamed:?}");
            }
        }
    }

    #[test]
    fn rewriting_keeps_the_digest_and_changes_every_byte_field() {
        let mut cores = ec_cores(threshold_ec::Algorithm::Ed25519, 9);
        let digest = cores[0].request(0, 15, b"data", false).unwrap();
        let message = loop {
            match cores[0].poll_output().expect("the core sends its first message") {
                ZoneOutput::Compute(job) => cores[0].job_done(job.run()),
                ZoneOutput::Broadcast { message } | ZoneOutput::Send { message, .. } => break message,
                _ => {}
            }
        };
        let ZoneMessage::Ec(original) = &message else { panic!("an RSA message from an EC core") };
        assert_eq!(original.digest(), &digest);
        let inverted = rewrite(message.clone(), &mut |b| b.iter_mut().for_each(|x| *x = !*x));
        let ZoneMessage::Ec(changed) = &inverted else { panic!("kind changed") };
        assert_eq!(changed.digest(), &digest);
        assert_ne!(changed, original);
        // Inverting twice gives the message back.
        assert_eq!(rewrite(inverted, &mut |b| b.iter_mut().for_each(|x| *x = !*x)), message);
        // RSA: share and signature bytes, never the digest or a Retry.
        let share = ZoneMessage::Rsa(SignMessage::Share { digest, share: vec![1, 2] });
        assert_eq!(rewrite(share, &mut |b| b.fill(0)), ZoneMessage::Rsa(SignMessage::Share { digest, share: vec![0, 0] }));
        let retry = ZoneMessage::Rsa(SignMessage::Retry { digest, proof: true });
        assert_eq!(rewrite(retry.clone(), &mut |b| b.fill(0)), retry);
    }
}
