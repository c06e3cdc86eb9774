//! Threshold Ed25519 (RFC 8032, DNSSEC algorithm 15): a commitment round for the PRSS nonce,
//! then one share round; any t+1 valid shares give the same signature.

use std::collections::BTreeMap;

use curve25519_dalek::{EdwardsPoint, Scalar};
use sha2::{Digest as _, Sha512};
use zeroize::Zeroize;

use crate::commit::CommitTable;
use crate::curve::{interpolate, Curve, Ed25519};
use crate::intake::Intake;
use crate::prss::{random_commitment, random_share, Label};
use crate::{Algorithm, Blame, Error, Fault, KeyShare, PublicKey};

const TAG_COMMITMENTS: u8 = 1;
const TAG_SHARE: u8 = 2;

/// A message of the Ed25519 protocol, with its wire form ([`EdMessage::to_bytes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EdMessage {
    /// V_T = F(ρ_T, "k", h, 0)·G for every t-set T the sender is not in, in subset order.
    Commitments(Vec<[u8; 32]>),
    /// s_i = k_i + c·x_i.
    Share([u8; 32]),
}

impl EdMessage {
    /// Tag byte, then the points or the scalar.
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            EdMessage::Commitments(points) => {
                let mut out = vec![TAG_COMMITMENTS];
                points.iter().for_each(|p| out.extend(p));
                out
            }
            EdMessage::Share(s) => {
                let mut out = vec![TAG_SHARE];
                out.extend(s);
                out
            }
        }
    }

    /// Parses the framing only (tag, lengths); points and scalars are checked by the session.
    pub fn from_bytes(bytes: &[u8]) -> Option<EdMessage> {
        let (&tag, rest) = bytes.split_first()?;
        match tag {
            TAG_COMMITMENTS if rest.len() % 32 == 0 => Some(EdMessage::Commitments(rest.chunks_exact(32).map(|c| c.try_into().unwrap_or([0; 32])).collect())),
            TAG_SHARE => Some(EdMessage::Share(rest.try_into().ok()?)),
            _ => None,
        }
    }
}

/// What the commitment round fixed: R, c, and the per-set commitments for share checks.
struct Nonce {
    r: [u8; 32],
    c: Scalar,
    sets: Vec<(u32, EdwardsPoint)>,
}

/// One replica's part in signing one piece of data. Pure computation: the driver delivers
/// peers' messages ([`EdSession::receive`]) and sends what the session produces.
pub struct EdSession {
    n: u16,
    t: u16,
    index: u16,
    data: Vec<u8>,
    verifying_key: ed25519_dalek::VerifyingKey,
    xs: Vec<EdwardsPoint>,
    k_i: Scalar,
    x_i: Scalar,
    table: CommitTable,
    intake: Intake,
    nonce: Option<Nonce>,
    shares: BTreeMap<u16, Scalar>,
    /// Shares checked individually: valid or not.
    checked: BTreeMap<u16, bool>,
    failed: Option<Error>,
    signature: Option<[u8; 64]>,
}

impl Drop for EdSession {
    fn drop(&mut self) {
        self.k_i.zeroize();
        self.x_i.zeroize();
    }
}

impl std::fmt::Debug for EdSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdSession").field("index", &self.index).field("shares", &self.shares.len()).field("blamed", &self.intake.blamed).finish_non_exhaustive()
    }
}

impl EdSession {
    /// Starts signing `data` (the RRSIG's to-be-signed bytes): computes this replica's nonce
    /// share and the commitments to broadcast to every peer.
    pub fn new(pk: &PublicKey, share: &KeyShare, data: &[u8]) -> Result<(EdSession, EdMessage), Error> {
        if pk.algorithm() != Algorithm::Ed25519 {
            return Err(Error::Algorithm(pk.algorithm().number()));
        }
        share.check(pk)?;
        let y = pk.y_ed().ok_or(Error::Malformed("public key"))?;
        let verifying_key = ed25519_dalek::VerifyingKey::from(y);
        let xs = pk.verification_points::<Ed25519>().ok_or(Error::Malformed("verification points"))?;
        let h = pk.session_hash(data);
        let i = share.index();
        let keys = share.prss_keys();
        let k_i = random_share::<Ed25519>(keys, i, Label::K, &h);
        let x_i = share.secret_scalar::<Ed25519>().ok_or(Error::Malformed("secret"))?;
        let commitments: Vec<[u8; 32]> =
            keys.iter().map(|(_, rho)| Ed25519::mul_base(&crate::prss::prf::<Ed25519>(rho, Label::K, &h, 0)).compress().to_bytes()).collect();
        let mut session = EdSession {
            n: pk.players(),
            t: pk.threshold(),
            index: i,
            data: data.to_vec(),
            verifying_key,
            xs,
            k_i,
            x_i,
            table: CommitTable::new(pk.players(), pk.threshold()),
            intake: Intake::default(),
            nonce: None,
            shares: BTreeMap::new(),
            checked: BTreeMap::new(),
            failed: None,
            signature: None,
        };
        let message = EdMessage::Commitments(commitments);
        session.add(i, message.clone()).map_err(|_| Error::Malformed("own commitments"))?;
        Ok((session, message))
    }

    /// Delivers a peer's message in its wire form.
    pub fn receive(&mut self, from: u16, bytes: &[u8]) -> Result<(), Blame> {
        match EdMessage::from_bytes(bytes) {
            Some(message) => self.add(from, message),
            None if from == 0 || from > self.n => Err(Blame { replica: from, fault: Fault::UnknownReplica }),
            None => Err(self.blame(from, Fault::Malformed)),
        }
    }

    /// Delivers a peer's message. An error names the sender's fault (also kept in
    /// [`EdSession::blamed`]); the session goes on either way.
    pub fn add(&mut self, from: u16, message: EdMessage) -> Result<(), Blame> {
        let kind = match message {
            EdMessage::Commitments(_) => TAG_COMMITMENTS,
            EdMessage::Share(_) => TAG_SHARE,
        };
        if !self.intake.admit(self.n, from, kind, message.to_bytes())? {
            return Ok(());
        }
        match message {
            EdMessage::Commitments(points) => {
                if points.len() != self.table.held_by(from) {
                    return Err(self.blame(from, Fault::Malformed));
                }
                let liars = self.table.add(from, points.into_iter().map(|p| p.to_vec()).collect());
                let result = self.intake.blame_liars(from, liars);
                self.fix_nonce();
                result
            }
            EdMessage::Share(bytes) => match Ed25519::scalar_from_bytes(&bytes) {
                Some(s) => {
                    self.shares.insert(from, s);
                    Ok(())
                }
                None => Err(self.blame(from, Fault::Malformed)),
            },
        }
    }

    fn blame(&mut self, replica: u16, fault: Fault) -> Blame {
        self.intake.blame(replica, fault)
    }

    /// Once every set's commitment is accepted: R = Σ V_T, c = SHA-512(R ‖ Y ‖ M), and this
    /// replica's own share.
    fn fix_nonce(&mut self) {
        if self.nonce.is_some() || self.failed.is_some() || !self.table.complete() {
            return;
        }
        let Some(accepted) = self.table.accepted() else { return };
        let sets: Option<Vec<(u32, EdwardsPoint)>> = accepted.iter().map(|(s, b)| Ed25519::point_from_bytes(b).map(|p| (*s, p))).collect();
        let Some(sets) = sets else {
            // t+1 holders agreed on bytes that are no point: more than t are faulty.
            self.failed = Some(Error::Malformed("accepted commitment is not a point"));
            return;
        };
        let r_point: EdwardsPoint = sets.iter().map(|(_, p)| *p).sum();
        let r = r_point.compress().to_bytes();
        let c_wide: [u8; 64] = Sha512::new().chain_update(r).chain_update(self.verifying_key.as_bytes()).chain_update(&self.data).finalize().into();
        let c = Scalar::from_bytes_mod_order_wide(&c_wide);
        self.shares.insert(self.index, self.k_i + c * self.x_i);
        self.checked.insert(self.index, true);
        self.nonce = Some(Nonce { r, c, sets });
    }

    /// Whether the commitment round is over, so that [`EdSession::my_share`] has a share.
    pub fn ready_for_shares(&self) -> bool {
        self.nonce.is_some()
    }

    /// This replica's share s_i to broadcast, once [`EdSession::ready_for_shares`].
    pub fn my_share(&self) -> Option<EdMessage> {
        self.nonce.as_ref()?;
        self.shares.get(&self.index).map(|s| EdMessage::Share(s.to_bytes()))
    }

    /// s_j·G = K_j + c·X_j, K_j = Σ_{T ∌ j} f_T(j)·V_T.
    fn share_valid(&self, nonce: &Nonce, j: u16, s: &Scalar) -> bool {
        let Some(x_j) = self.xs.get(usize::from(j).wrapping_sub(1)) else { return false };
        let k_j = random_commitment::<Ed25519>(&nonce.sets, j);
        EdwardsPoint::mul_base(s) == k_j + x_j * nonce.c
    }

    fn verifies(&self, signature: &[u8; 64]) -> bool {
        self.verifying_key.verify_strict(&self.data, &ed25519_dalek::Signature::from_bytes(signature)).is_ok()
    }

    /// Whether `signature` (a peer's final signature) is this session's: the standard verifier
    /// accepts it and, once the commitment round has fixed R, it carries that R. Only the
    /// group can sign, and honest replicas contribute only to the one nonce per data, so a
    /// signature that verifies is the session's; the R comparison costs nothing.
    pub fn accepts_final(&self, signature: &[u8; 64]) -> bool {
        if self.nonce.as_ref().is_some_and(|n| signature[..32] != n.r) {
            return false;
        }
        self.verifies(signature)
    }

    fn combine(&self, nonce: &Nonce, shares: &[(u16, Scalar)]) -> [u8; 64] {
        let s = interpolate(shares, Scalar::ZERO);
        let mut signature = [0u8; 64];
        signature[..32].copy_from_slice(&nonce.r);
        signature[32..].copy_from_slice(&s.to_bytes());
        signature
    }

    /// The signature (R ‖ s), once t+1 shares combine into one the standard verifier accepts;
    /// `None` while more messages are needed. Optimistic: the first t+1 shares not known to be
    /// bad are combined; only if that fails is every share checked and its sender blamed.
    pub fn try_finish(&mut self) -> Option<Result<[u8; 64], Error>> {
        if let Some(signature) = self.signature {
            return Some(Ok(signature));
        }
        if let Some(e) = &self.failed {
            return Some(Err(e.clone()));
        }
        let nonce = self.nonce.take()?;
        let result = self.finish_with(&nonce);
        self.nonce = Some(nonce);
        if let Some(Ok(signature)) = result {
            self.signature = Some(signature);
        }
        result
    }

    fn finish_with(&mut self, nonce: &Nonce) -> Option<Result<[u8; 64], Error>> {
        let need = usize::from(self.t) + 1;
        let usable: Vec<(u16, Scalar)> = self.shares.iter().filter(|(j, _)| self.checked.get(*j) != Some(&false)).map(|(j, s)| (*j, *s)).take(need).collect();
        if usable.len() < need {
            return None;
        }
        let signature = self.combine(nonce, &usable);
        if self.verifies(&signature) {
            return Some(Ok(signature));
        }
        self.check_all(nonce);
        let valid: Vec<(u16, Scalar)> = self.shares.iter().filter(|(j, _)| self.checked.get(*j) == Some(&true)).map(|(j, s)| (*j, *s)).take(need).collect();
        if valid.len() < need {
            return None;
        }
        let signature = self.combine(nonce, &valid);
        // Valid shares lie on k(z) + c·x(z): failing here would be a bug, not a peer's fault.
        Some(if self.verifies(&signature) { Ok(signature) } else { Err(Error::Degenerate) })
    }

    fn check_all(&mut self, nonce: &Nonce) {
        let unchecked: Vec<(u16, Scalar)> = self.shares.iter().filter(|(j, _)| !self.checked.contains_key(*j)).map(|(j, s)| (*j, *s)).collect();
        for (j, s) in unchecked {
            let ok = self.share_valid(nonce, j, &s);
            self.checked.insert(j, ok);
            if !ok {
                self.blame(j, Fault::BadShare);
            }
        }
    }

    /// Checks every share received and not yet checked, blaming bad senders: for a driver that
    /// wants every faulty replica named even when its share was never needed.
    pub fn audit(&mut self) {
        if let Some(nonce) = self.nonce.take() {
            self.check_all(&nonce);
            self.nonce = Some(nonce);
        }
    }

    /// The replicas blamed so far, each with the first fault seen.
    pub fn blamed(&self) -> &BTreeMap<u16, Fault> {
        &self.intake.blamed
    }
}
