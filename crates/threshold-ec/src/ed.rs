//! Threshold Ed25519 (RFC 8032, DNSSEC algorithm 15): a commitment round for the PRSS nonce,
//! then one share round; any t+1 valid shares give the same signature.

use std::collections::BTreeMap;
use std::sync::Arc;

use curve25519_dalek::edwards::CompressedEdwardsY;
use curve25519_dalek::{EdwardsPoint, Scalar};
use sha2::{Digest as _, Sha512};
use zeroize::Zeroize;

use crate::commit::CommitTable;
use crate::curve::{interpolate, Curve, Ed25519};
use crate::intake::Intake;
use crate::prss::{f_t, prf, random_commitment, Label};
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
    r_point: EdwardsPoint,
    c: Scalar,
    sets: Vec<(u32, EdwardsPoint)>,
}

/// What sessions need of an Ed25519 key, decoded and checked once per key (the public key's
/// and the verification points' torsion checks are full scalar multiplications each) and
/// shared by every session of the key.
pub(crate) struct EdKey {
    pub(crate) pk: Arc<PublicKey>,
    pub(crate) share: Arc<KeyShare>,
    pub(crate) y: EdwardsPoint,
    pub(crate) verifying_key: ed25519_dalek::VerifyingKey,
    pub(crate) xs: Vec<EdwardsPoint>,
    pub(crate) x_i: Scalar,
    /// f_T(i) of this replica for the sets it holds, in key order (one inversion each).
    pub(crate) f_own: Vec<Scalar>,
}

impl Drop for EdKey {
    fn drop(&mut self) {
        self.x_i.zeroize();
    }
}

impl EdKey {
    pub(crate) fn new(pk: Arc<PublicKey>, share: Arc<KeyShare>) -> Result<EdKey, Error> {
        if pk.algorithm() != Algorithm::Ed25519 {
            return Err(Error::Algorithm(pk.algorithm().number()));
        }
        share.check(&pk)?;
        let y = pk.y_ed().ok_or(Error::Malformed("public key"))?;
        let verifying_key = ed25519_dalek::VerifyingKey::from(y);
        let xs = pk.verification_points::<Ed25519>().ok_or(Error::Malformed("verification points"))?;
        let x_i = share.secret_scalar::<Ed25519>().ok_or(Error::Malformed("secret"))?;
        let f_own = share.prss_keys().iter().map(|(set, _)| f_t::<Scalar>(*set, share.index())).collect();
        Ok(EdKey { pk, share, y, verifying_key, xs, x_i, f_own })
    }
}

/// One replica's part in signing one piece of data. Pure computation: the driver delivers
/// peers' messages ([`EdSession::receive`]) and sends what the session produces.
pub struct EdSession {
    n: u16,
    t: u16,
    index: u16,
    data: Vec<u8>,
    key: Arc<EdKey>,
    k_i: Scalar,
    /// This replica's commitments as points and bytes, for the sets it holds.
    own: Vec<(u32, [u8; 32], EdwardsPoint)>,
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
    /// (Decodes and checks the key for this session alone; [`crate::EcSignerCore`] does that
    /// once per key.)
    pub fn new(pk: &PublicKey, share: &KeyShare, data: &[u8]) -> Result<(EdSession, EdMessage), Error> {
        EdSession::with_key(Arc::new(EdKey::new(Arc::new(pk.clone()), Arc::new(share.clone()))?), data)
    }

    pub(crate) fn with_key(key: Arc<EdKey>, data: &[u8]) -> Result<(EdSession, EdMessage), Error> {
        let (pk, share) = (&key.pk, &key.share);
        let h = pk.session_hash(data);
        let i = share.index();
        // k_i = Σ_T F(ρ_T, "k", h, 0)·f_T(i), and each F·G is the commitment for T.
        let mut k_i = Scalar::ZERO;
        let own: Vec<(u32, [u8; 32], EdwardsPoint)> = share
            .prss_keys()
            .iter()
            .zip(&key.f_own)
            .map(|((set, rho), f)| {
                let mut v = prf::<Ed25519>(rho, Label::K, &h, 0);
                k_i += v * f;
                let point = Ed25519::mul_base(&v);
                v.zeroize();
                (*set, point.compress().to_bytes(), point)
            })
            .collect();
        let commitments: Vec<[u8; 32]> = own.iter().map(|(_, bytes, _)| *bytes).collect();
        let (n, t) = (pk.players(), pk.threshold());
        let mut session = EdSession {
            n,
            t,
            index: i,
            data: data.to_vec(),
            key: key.clone(),
            k_i,
            own,
            table: CommitTable::new(n, t),
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
        // Accepted bytes were reported by t+1 holders, so by an honest one: a canonical
        // multiple of the base point. For the sets this replica holds they are its own point;
        // the others need decompression only (a torsion check is a full scalar
        // multiplication, and only bytes nobody vouches for need it).
        let decode = |set: u32, bytes: &[u8]| -> Option<EdwardsPoint> {
            if let Some((_, _, point)) = self.own.iter().find(|(s, b, _)| *s == set && b.as_slice() == bytes) {
                return Some(*point);
            }
            CompressedEdwardsY::from_slice(bytes).ok()?.decompress()
        };
        let sets: Option<Vec<(u32, EdwardsPoint)>> = accepted.iter().map(|(s, b)| decode(*s, b).map(|p| (*s, p))).collect();
        let Some(sets) = sets else {
            // t+1 holders agreed on bytes that are no point: more than t are faulty.
            self.failed = Some(Error::Malformed("accepted commitment is not a point"));
            return;
        };
        let r_point: EdwardsPoint = sets.iter().map(|(_, p)| *p).sum();
        let r = r_point.compress().to_bytes();
        let c_wide: [u8; 64] = Sha512::new().chain_update(r).chain_update(self.key.verifying_key.as_bytes()).chain_update(&self.data).finalize().into();
        let c = Scalar::from_bytes_mod_order_wide(&c_wide);
        self.shares.insert(self.index, self.k_i + c * self.key.x_i);
        self.checked.insert(self.index, true);
        self.nonce = Some(Nonce { r, r_point, c, sets });
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
        let Some(x_j) = self.key.xs.get(usize::from(j).wrapping_sub(1)) else { return false };
        let k_j = random_commitment::<Ed25519>(&nonce.sets, j);
        EdwardsPoint::mul_base(s) == k_j + x_j * nonce.c
    }

    fn verifies(&self, signature: &[u8; 64]) -> bool {
        self.key.verifying_key.verify_strict(&self.data, &ed25519_dalek::Signature::from_bytes(signature)).is_ok()
    }

    /// s·B = R + c·Y for the session's own R and c: what `verify_strict` checks of R ‖ s
    /// (R is this session's canonical encoding of a point of large order, s a reduced
    /// scalar), without decoding R and hashing again.
    fn combined_valid(&self, nonce: &Nonce, s: &Scalar) -> bool {
        EdwardsPoint::vartime_double_scalar_mul_basepoint(&-nonce.c, &self.key.y, s) == nonce.r_point
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

    /// The signature from `shares`, if it is valid.
    fn combine(&self, nonce: &Nonce, shares: &[(u16, Scalar)]) -> Option<[u8; 64]> {
        let s = interpolate(shares, Scalar::ZERO);
        let mut signature = [0u8; 64];
        signature[..32].copy_from_slice(&nonce.r);
        signature[32..].copy_from_slice(&s.to_bytes());
        self.combined_valid(nonce, &s).then_some(signature)
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
        if let Some(signature) = self.combine(nonce, &usable) {
            return Some(Ok(signature));
        }
        self.check_all(nonce);
        let valid: Vec<(u16, Scalar)> = self.shares.iter().filter(|(j, _)| self.checked.get(*j) == Some(&true)).map(|(j, s)| (*j, *s)).take(need).collect();
        if valid.len() < need {
            return None;
        }
        // Valid shares lie on k(z) + c·x(z): failing here would be a bug, not a peer's fault.
        Some(self.combine(nonce, &valid).ok_or(Error::Degenerate))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prss::random_share;

    #[test]
    fn the_nonce_share_is_the_prss_definition() {
        let mut rng = <rand_chacha::ChaCha20Rng as rand_core::SeedableRng>::seed_from_u64(6);
        let (pk, shares) = crate::deal(Algorithm::Ed25519, 7, 2, &mut rng).unwrap();
        let (session, _) = EdSession::new(&pk, &shares[4], b"data").unwrap();
        let h = pk.session_hash(b"data");
        assert_eq!(session.k_i, random_share::<Ed25519>(shares[4].prss_keys(), 5, Label::K, &h));
    }
}
