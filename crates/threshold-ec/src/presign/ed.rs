//! An Ed25519 presignature: two PRSS nonces k and k′ committed in the background; online the
//! binding factor ρ = H(slot, Y, R₁, R₂, M) fixes R = R₁ + ρ·R₂ (FROST's defence against the
//! ROS attack) and s_i = k_i + ρ·k′_i + c·x_i (docs/DETERMINISM.md, "Presignatures").

use std::collections::BTreeMap;
use std::sync::Arc;

use curve25519_dalek::edwards::CompressedEdwardsY;
use curve25519_dalek::{EdwardsPoint, Scalar};
use sha2::{Digest as _, Sha512};
use zeroize::Zeroize;

use super::combine::{FullSet, Step};
use crate::commit::CommitTable;
use crate::curve::{interpolate, Curve, Ed25519};
use crate::ed::EdKey;
use crate::intake::Intake;
use crate::prss::{prf, random_commitment, Label};
use crate::{Blame, Error, Fault};

const KIND_ROUND1: u8 = 1;
const KIND_SHARE: u8 = 3;
/// A set's bundle: V_T = F(ρ_T, "k")·G then V′_T = F(ρ_T, "k2")·G.
const BUNDLE: usize = 64;

/// R₁, R₂ and the per-set commitments of both nonces, once every set's bundle is accepted.
struct Nonces {
    r1: EdwardsPoint,
    r2: EdwardsPoint,
    k_sets: Vec<(u32, EdwardsPoint)>,
    k2_sets: Vec<(u32, EdwardsPoint)>,
}

/// What the data fixed: ρ, R (point and encoding) and c.
struct Bound {
    rho: Scalar,
    r_point: EdwardsPoint,
    r: [u8; 32],
    c: Scalar,
}

pub(crate) struct EdPre {
    n: u16,
    t: u16,
    index: u16,
    key: Arc<EdKey>,
    slot_h: [u8; 32],
    k: Scalar,
    k2: Scalar,
    own: Vec<(u32, Vec<u8>, EdwardsPoint, EdwardsPoint)>,
    round1: Vec<u8>,
    table: CommitTable,
    intake: Intake,
    nonces: Option<Nonces>,
    failed: Option<Error>,
    bound: Option<Bound>,
    shares: BTreeMap<u16, Scalar>,
    checked: BTreeMap<u16, bool>,
    full: Arc<FullSet<Scalar>>,
}

impl Drop for EdPre {
    fn drop(&mut self) {
        self.k.zeroize();
        self.k2.zeroize();
        if let Some(own) = self.shares.get_mut(&self.index) {
            own.zeroize();
        }
    }
}

impl EdPre {
    pub(crate) fn new(key: Arc<EdKey>, slot_h: [u8; 32], full: Arc<FullSet<Scalar>>) -> Result<EdPre, Error> {
        let (n, t, i) = (key.pk.players(), key.pk.threshold(), key.share.index());
        let (mut k, mut k2) = (Scalar::ZERO, Scalar::ZERO);
        let own: Vec<(u32, Vec<u8>, EdwardsPoint, EdwardsPoint)> = key
            .share
            .prss_keys()
            .iter()
            .zip(&key.f_own)
            .map(|((set, rho), f)| {
                let (mut v, mut v2) = (prf::<Ed25519>(rho, Label::K, &slot_h, 0), prf::<Ed25519>(rho, Label::K2, &slot_h, 0));
                k += v * f;
                k2 += v2 * f;
                let (p, p2) = (Ed25519::mul_base(&v), Ed25519::mul_base(&v2));
                v.zeroize();
                v2.zeroize();
                let mut bytes = p.compress().to_bytes().to_vec();
                bytes.extend(p2.compress().to_bytes());
                (*set, bytes, p, p2)
            })
            .collect();
        let round1: Vec<u8> = own.iter().flat_map(|(_, b, _, _)| b.clone()).collect();
        let mut pre = EdPre {
            n,
            t,
            index: i,
            key,
            slot_h,
            k,
            k2,
            own,
            round1: round1.clone(),
            table: CommitTable::new(n, t),
            intake: Intake::default(),
            nonces: None,
            failed: None,
            bound: None,
            shares: BTreeMap::new(),
            checked: BTreeMap::new(),
            full,
        };
        pre.receive_round1(i, &round1).map_err(|_| Error::Malformed("own commitments"))?;
        Ok(pre)
    }

    pub(crate) fn round1(&self) -> &[u8] {
        &self.round1
    }

    pub(crate) fn receive_round1(&mut self, from: u16, body: &[u8]) -> Result<(), Blame> {
        if !self.intake.admit(self.n, from, KIND_ROUND1, body.to_vec())? {
            return Ok(());
        }
        if body.len() != self.table.held_by(from) * BUNDLE {
            return Err(self.intake.blame(from, Fault::Malformed));
        }
        let liars = self.table.add(from, body.chunks(BUNDLE).map(|c| c.to_vec()).collect());
        let result = self.intake.blame_liars(from, liars);
        self.fix_nonces();
        result
    }

    /// Once every set's bundle is accepted (t+1 holders agreed, so an honest one sent it):
    /// R₁ = Σ V_T, R₂ = Σ V′_T. Own sets' points are reused; the others are decompressed only.
    fn fix_nonces(&mut self) {
        if self.nonces.is_some() || self.failed.is_some() || !self.table.complete() {
            return;
        }
        let Some(accepted) = self.table.accepted() else { return };
        let decode = |set: u32, bytes: &[u8]| -> Option<(EdwardsPoint, EdwardsPoint)> {
            if let Some((_, _, p, p2)) = self.own.iter().find(|(s, b, _, _)| *s == set && b.as_slice() == bytes) {
                return Some((*p, *p2));
            }
            let p = CompressedEdwardsY::from_slice(bytes.get(..32)?).ok()?.decompress()?;
            let p2 = CompressedEdwardsY::from_slice(bytes.get(32..)?).ok()?.decompress()?;
            Some((p, p2))
        };
        let mut nonces = Nonces { r1: EdwardsPoint::default(), r2: EdwardsPoint::default(), k_sets: vec![], k2_sets: vec![] };
        for (set, bytes) in accepted {
            let Some((p, p2)) = decode(set, bytes) else {
                // t+1 holders agreed on bytes that are no point: more than t are faulty.
                self.failed = Some(Error::Malformed("accepted commitment is not a point"));
                return;
            };
            nonces.r1 += p;
            nonces.r2 += p2;
            nonces.k_sets.push((set, p));
            nonces.k2_sets.push((set, p2));
        }
        self.nonces = Some(nonces);
    }

    pub(crate) fn impatient(&mut self) {}

    pub(crate) fn ready(&self) -> bool {
        self.nonces.is_some()
    }

    /// Fixes the data: ρ, R = R₁ + ρ·R₂ (public points, so variable time), c, and this
    /// replica's s_i = k_i + ρ·k′_i + c·x_i.
    pub(crate) fn bind(&mut self, data: &[u8]) -> Option<[u8; 32]> {
        let nonces = self.nonces.as_ref()?;
        if self.bound.is_none() {
            let y = self.key.verifying_key.as_bytes();
            let wide: [u8; 64] = Sha512::new()
                .chain_update(b"sdns presign binding factor v1\0")
                .chain_update(self.slot_h)
                .chain_update(y)
                .chain_update(nonces.r1.compress().as_bytes())
                .chain_update(nonces.r2.compress().as_bytes())
                .chain_update(data)
                .finalize()
                .into();
            let rho = Scalar::from_bytes_mod_order_wide(&wide);
            let r_point = nonces.r1 + EdwardsPoint::vartime_double_scalar_mul_basepoint(&rho, &nonces.r2, &Scalar::ZERO);
            let r = r_point.compress().to_bytes();
            let c_wide: [u8; 64] = Sha512::new().chain_update(r).chain_update(y).chain_update(data).finalize().into();
            let c = Scalar::from_bytes_mod_order_wide(&c_wide);
            let s_i = self.k + rho * self.k2 + c * self.key.x_i;
            self.shares.insert(self.index, s_i);
            self.checked.insert(self.index, true);
            self.intake.own(self.index, KIND_SHARE, || s_i.to_bytes().to_vec());
            self.bound = Some(Bound { rho, r_point, r, c });
        }
        self.shares.get(&self.index).map(|s| s.to_bytes())
    }

    pub(crate) fn add_share(&mut self, from: u16, bytes: &[u8; 32]) -> Result<(), Blame> {
        if !self.intake.admit(self.n, from, KIND_SHARE, bytes.to_vec())? {
            return Ok(());
        }
        let Some(s) = Ed25519::scalar_from_bytes(bytes) else { return Err(self.intake.blame(from, Fault::Malformed)) };
        self.shares.insert(from, s);
        Ok(())
    }

    /// Ed25519 shares are checked against public commitments; there are no proofs to ask for.
    pub(crate) fn add_proof(&mut self, _from: u16, _body: &[u8]) -> Result<(), Blame> {
        Ok(())
    }

    pub(crate) fn proof_answer(&mut self) -> Option<Vec<u8>> {
        None
    }

    /// All n shares on one degree-t polynomial give s with no check (t+1 of them are honest);
    /// otherwise t+1 combined and checked (s·G = R + c·Y), else every share checked alone.
    pub(crate) fn finish(&mut self, patient: bool) -> Step {
        if let Some(e) = &self.failed {
            return Step::Failed(e.clone());
        }
        let (Some(bound), Some(nonces)) = (self.bound.as_ref(), self.nonces.as_ref()) else { return Step::Wait };
        if let Some(s) = self.full.combine(&self.shares) {
            return Step::Done(signature(&bound.r, &s));
        }
        if patient && self.shares.len() < usize::from(self.n) {
            return Step::Wait;
        }
        let need = usize::from(self.t) + 1;
        let usable: Vec<(u16, Scalar)> = self.shares.iter().filter(|(j, _)| self.checked.get(*j) != Some(&false)).map(|(j, s)| (*j, *s)).take(need).collect();
        if usable.len() < need {
            return Step::Wait;
        }
        let s = interpolate(&usable, Scalar::ZERO);
        if EdwardsPoint::vartime_double_scalar_mul_basepoint(&-bound.c, &self.key.y, &s) == bound.r_point {
            return Step::Done(signature(&bound.r, &s));
        }
        // s_j·G = K_j + ρ·K′_j + c·X_j.
        let unchecked: Vec<(u16, Scalar)> = self.shares.iter().filter(|(j, _)| !self.checked.contains_key(*j)).map(|(j, s)| (*j, *s)).collect();
        let mut bad = Vec::new();
        for (j, s_j) in unchecked {
            let Some(x_j) = self.key.xs.get(usize::from(j).wrapping_sub(1)) else { continue };
            let expected = random_commitment::<Ed25519>(&nonces.k_sets, j) + random_commitment::<Ed25519>(&nonces.k2_sets, j) * bound.rho + x_j * bound.c;
            let ok = EdwardsPoint::mul_base(&s_j) == expected;
            self.checked.insert(j, ok);
            if !ok {
                bad.push(j);
            }
        }
        for j in bad {
            self.intake.blame(j, Fault::BadShare);
        }
        let valid: Vec<(u16, Scalar)> = self.shares.iter().filter(|(j, _)| self.checked.get(*j) == Some(&true)).map(|(j, s)| (*j, *s)).take(need).collect();
        if valid.len() < need {
            return Step::Wait;
        }
        let (Some(bound), s) = (self.bound.as_ref(), interpolate(&valid, Scalar::ZERO)) else { return Step::Wait };
        if EdwardsPoint::vartime_double_scalar_mul_basepoint(&-bound.c, &self.key.y, &s) == bound.r_point {
            Step::Done(signature(&bound.r, &s))
        } else {
            Step::Failed(Error::Degenerate)
        }
    }

    pub(crate) fn blamed(&self) -> impl Iterator<Item = (u16, Fault)> + '_ {
        self.intake.blamed.iter().map(|(j, f)| (*j, *f))
    }
}

fn signature(r: &[u8; 32], s: &Scalar) -> [u8; 64] {
    let mut out = [0u8; 64];
    out[..32].copy_from_slice(r);
    out[32..].copy_from_slice(&s.to_bytes());
    out
}
