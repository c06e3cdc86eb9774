//! Threshold ECDSA P-256 (RFC 6605, DNSSEC algorithm 13) in two rounds.
//!
//! 1. Commitments of every PRSS value the session uses (k plainly, a, z1, z2 as Pedersen
//!    commitments) together with μ_i = k_i·a_i + z1_i and its proof: μ_i depends on nothing
//!    from the other replicas, so it travels with the commitments instead of in a round of its
//!    own (docs/DETERMINISM.md).
//! 2. σ_i = a_i·μ⁻¹·(e + r·x_i) + z2_i and its proof; any 2t+1 valid σ_j give s.
//!
//! Checking is lazy: μ is taken without proofs when all n μ_j lie on one degree-2t
//! polynomial, and s without proofs when the combined signature verifies against the exact R.

use std::collections::BTreeMap;

use ff::Field;
use p256::elliptic_curve::bigint::U256;
use p256::elliptic_curve::ops::Reduce;
use p256::elliptic_curve::point::AffineCoordinates;
use p256::{ProjectivePoint, Scalar};
use sha2::{Digest as _, Sha256};
use zeroize::Zeroize;

use crate::commit::CommitTable;
use crate::curve::{interpolate, on_one_polynomial, p256_h, Curve, P256};
use crate::intake::Intake;
use crate::proof::{self, Statement, PROOF_LEN};
use crate::prss::{prf, random_commitment, random_share, zero_commitment, zero_share, Label};
use crate::{Algorithm, Blame, Error, Fault, KeyShare, PublicKey};

const TAG_ROUND1: u8 = 1;
const TAG_SIGMA: u8 = 2;
const POINT: usize = 33;

/// A message of the ECDSA protocol, with its wire form ([`EcdsaMessage::to_bytes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EcdsaMessage {
    /// For every t-set T ∌ sender, in subset order: V_T (k), C_T (a, blinded by b), then
    /// C_{T,ℓ} for z1 and for z2 (ℓ = 1..=t, blinded by y1, y2); then μ_i and its proof.
    Round1 { commitments: Vec<[u8; POINT]>, mu: [u8; 32], proof: [u8; PROOF_LEN] },
    /// σ_i and its proof.
    Sigma { sigma: [u8; 32], proof: [u8; PROOF_LEN] },
}

impl EcdsaMessage {
    /// Tag byte; Round1: u16 point count, points, μ, proof; Sigma: σ, proof.
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            EcdsaMessage::Round1 { commitments, mu, proof } => {
                let mut out = vec![TAG_ROUND1];
                out.extend((commitments.len() as u16).to_be_bytes());
                commitments.iter().for_each(|p| out.extend(p));
                out.extend(mu);
                out.extend(proof);
                out
            }
            EcdsaMessage::Sigma { sigma, proof } => {
                let mut out = vec![TAG_SIGMA];
                out.extend(sigma);
                out.extend(proof);
                out
            }
        }
    }

    /// Parses the framing only (tag, lengths); points, scalars and proofs are the session's.
    pub fn from_bytes(bytes: &[u8]) -> Option<EcdsaMessage> {
        let (&tag, rest) = bytes.split_first()?;
        match tag {
            TAG_ROUND1 => {
                let (count, rest) = rest.split_at_checked(2)?;
                let count = usize::from(u16::from_be_bytes(count.try_into().ok()?));
                if rest.len() != count * POINT + 32 + PROOF_LEN {
                    return None;
                }
                let (points, rest) = rest.split_at(count * POINT);
                let commitments = points.chunks_exact(POINT).map(|c| c.try_into().unwrap_or([0; POINT])).collect();
                Some(EcdsaMessage::Round1 { commitments, mu: rest[..32].try_into().ok()?, proof: rest[32..].try_into().ok()? })
            }
            TAG_SIGMA if rest.len() == 32 + PROOF_LEN => Some(EcdsaMessage::Sigma { sigma: rest[..32].try_into().ok()?, proof: rest[32..].try_into().ok()? }),
            _ => None,
        }
    }
}

/// This replica's secret shares for one session, wiped on drop.
struct Secrets {
    k: Scalar,
    a: Scalar,
    b: Scalar,
    x: Scalar,
    z2: Scalar,
    y2: Scalar,
}

impl Drop for Secrets {
    fn drop(&mut self) {
        for s in [&mut self.k, &mut self.a, &mut self.b, &mut self.x, &mut self.z2, &mut self.y2] {
            s.zeroize();
        }
    }
}

/// What the commitment round fixed.
struct Fixed {
    big_r: ProjectivePoint,
    r: Scalar,
    k: Vec<(u32, ProjectivePoint)>,
    a: Vec<(u32, ProjectivePoint)>,
    z1: Vec<(u32, Vec<ProjectivePoint>)>,
    z2: Vec<(u32, Vec<ProjectivePoint>)>,
}

/// A share with its proof, and whether the proof was checked (and held).
struct Received {
    value: Scalar,
    proof: [u8; PROOF_LEN],
    checked: Option<bool>,
}

/// One replica's part in signing one piece of data; pure computation like [`crate::EdSession`].
pub struct EcdsaSession {
    n: u16,
    t: u16,
    index: u16,
    h: [u8; 32],
    data: Vec<u8>,
    e: Scalar,
    y: ProjectivePoint,
    verifying_key: p256::ecdsa::VerifyingKey,
    xs: Vec<ProjectivePoint>,
    secrets: Secrets,
    table: CommitTable,
    intake: Intake,
    fixed: Option<Fixed>,
    mus: BTreeMap<u16, Received>,
    mu: Option<Scalar>,
    sigmas: BTreeMap<u16, Received>,
    failed: Option<Error>,
    signature: Option<[u8; 64]>,
}

impl std::fmt::Debug for EcdsaSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EcdsaSession")
            .field("index", &self.index)
            .field("mus", &self.mus.len())
            .field("sigmas", &self.sigmas.len())
            .field("blamed", &self.intake.blamed)
            .finish_non_exhaustive()
    }
}

fn context(what: &[u8], h: &[u8; 32], j: u16) -> Vec<u8> {
    let mut c = what.to_vec();
    c.extend(h);
    c.extend(j.to_be_bytes());
    c
}

fn pedersen(v: &Scalar, blind: &Scalar) -> ProjectivePoint {
    P256::mul_base(v) + p256_h() * blind
}

impl EcdsaSession {
    /// Starts signing `data`: computes this replica's PRSS shares, the commitments and μ_i
    /// with its proof, all in the first message to broadcast.
    pub fn new(pk: &PublicKey, share: &KeyShare, data: &[u8]) -> Result<(EcdsaSession, EcdsaMessage), Error> {
        if pk.algorithm() != Algorithm::EcdsaP256Sha256 {
            return Err(Error::Algorithm(pk.algorithm().number()));
        }
        share.check(pk)?;
        let y = pk.y_p256().ok_or(Error::Malformed("public key"))?;
        let verifying_key = p256::ecdsa::VerifyingKey::from_affine(y.to_affine()).map_err(|_| Error::Malformed("public key"))?;
        let xs = pk.verification_points::<P256>().ok_or(Error::Malformed("verification points"))?;
        let (n, t, i) = (pk.players(), pk.threshold(), share.index());
        let h = pk.session_hash(data);
        let digest: [u8; 32] = Sha256::digest(data).into();
        let e = <Scalar as Reduce<U256>>::reduce_bytes(&digest.into());
        let keys = share.prss_keys();
        let secrets = Secrets {
            k: random_share::<P256>(keys, i, Label::K, &h),
            a: random_share::<P256>(keys, i, Label::A, &h),
            b: random_share::<P256>(keys, i, Label::B, &h),
            x: share.secret_scalar::<P256>().ok_or(Error::Malformed("secret"))?,
            z2: zero_share::<P256>(keys, t, i, Label::Z2, &h),
            y2: zero_share::<P256>(keys, t, i, Label::Y2, &h),
        };
        let mut z1 = zero_share::<P256>(keys, t, i, Label::Z1, &h);
        let mut y1 = zero_share::<P256>(keys, t, i, Label::Y1, &h);

        let mut commitments = Vec::new();
        for (_, rho) in keys {
            let f = |label: Label, l: u16| prf::<P256>(rho, label, &h, l);
            let mut point = |p: ProjectivePoint| commitments.push(<[u8; POINT]>::try_from(P256::point_to_bytes(&p).as_slice()).unwrap_or([0; POINT]));
            point(P256::mul_base(&f(Label::K, 0)));
            point(pedersen(&f(Label::A, 0), &f(Label::B, 0)));
            for l in 1..=t {
                point(pedersen(&f(Label::Z1, l), &f(Label::Y1, l)));
            }
            for l in 1..=t {
                point(pedersen(&f(Label::Z2, l), &f(Label::Y2, l)));
            }
        }

        // μ_i = k_i·a_i + z1_i; the statement: K_i = k_i·G and μ_i·G − Z1_i = k_i·CA_i − β·H.
        let s = &secrets;
        let mut mu_i = s.k * s.a + z1;
        let ca_i = pedersen(&s.a, &s.b);
        let statement = Statement { b1: ProjectivePoint::GENERATOR, p1: P256::mul_base(&s.k), b2: ca_i, p2: P256::mul_base(&mu_i) - pedersen(&z1, &y1) };
        let mut beta = s.k * s.b + y1;
        let proof = proof::prove(&statement, &s.k, &beta, &context(b"mu", &h, i));
        let message = EcdsaMessage::Round1 { commitments, mu: P256::scalar_to_bytes(&mu_i), proof };
        for v in [&mut z1, &mut y1, &mut beta, &mut mu_i] {
            v.zeroize();
        }

        let mut session = EcdsaSession {
            n,
            t,
            index: i,
            h,
            data: data.to_vec(),
            e,
            y,
            verifying_key,
            xs,
            secrets,
            table: CommitTable::new(n, t),
            intake: Intake::default(),
            fixed: None,
            mus: BTreeMap::new(),
            mu: None,
            sigmas: BTreeMap::new(),
            failed: None,
            signature: None,
        };
        session.add(i, message.clone()).map_err(|_| Error::Malformed("own first message"))?;
        if let Some(own) = session.mus.get_mut(&i) {
            own.checked = Some(true);
        }
        Ok((session, message))
    }

    /// Delivers a peer's message in its wire form.
    pub fn receive(&mut self, from: u16, bytes: &[u8]) -> Result<(), Blame> {
        match EcdsaMessage::from_bytes(bytes) {
            Some(message) => self.add(from, message),
            None if from == 0 || from > self.n => Err(Blame { replica: from, fault: Fault::UnknownReplica }),
            None => Err(self.blame(from, Fault::Malformed)),
        }
    }

    /// Delivers a peer's message; an error names the sender's fault (also kept in
    /// [`EcdsaSession::blamed`]).
    pub fn add(&mut self, from: u16, message: EcdsaMessage) -> Result<(), Blame> {
        let kind = match message {
            EcdsaMessage::Round1 { .. } => TAG_ROUND1,
            EcdsaMessage::Sigma { .. } => TAG_SIGMA,
        };
        if !self.intake.admit(self.n, from, kind, message.to_bytes())? {
            return Ok(());
        }
        let per_set = 2 + 2 * usize::from(self.t);
        match message {
            EcdsaMessage::Round1 { commitments, mu, proof } => {
                let Some(mu) = P256::scalar_from_bytes(&mu) else { return Err(self.blame(from, Fault::Malformed)) };
                if commitments.len() != self.table.held_by(from) * per_set {
                    return Err(self.blame(from, Fault::Malformed));
                }
                self.mus.insert(from, Received { value: mu, proof, checked: None });
                let bundles = commitments.chunks(per_set).map(|c| c.concat()).collect();
                let liars = self.table.add(from, bundles);
                let result = self.intake.blame_liars(from, liars);
                self.advance();
                result
            }
            EcdsaMessage::Sigma { sigma, proof } => {
                let Some(sigma) = P256::scalar_from_bytes(&sigma) else { return Err(self.blame(from, Fault::Malformed)) };
                self.sigmas.insert(from, Received { value: sigma, proof, checked: None });
                Ok(())
            }
        }
    }

    fn blame(&mut self, replica: u16, fault: Fault) -> Blame {
        self.intake.blame(replica, fault)
    }

    /// Moves the session on as far as the messages so far allow: the commitments (R, r), then μ.
    fn advance(&mut self) {
        if self.failed.is_some() {
            return;
        }
        if self.fixed.is_none() && self.table.complete() {
            match self.fix_commitments() {
                Ok(fixed) => self.fixed = Some(fixed),
                Err(e) => {
                    self.failed = Some(e);
                    return;
                }
            }
        }
        if self.mu.is_none() {
            if let Some(fixed) = self.fixed.take() {
                self.fix_mu(&fixed);
                self.fixed = Some(fixed);
            }
        }
    }

    fn fix_commitments(&self) -> Result<Fixed, Error> {
        let accepted = self.table.accepted().ok_or(Error::Malformed("commitments incomplete"))?;
        let t = usize::from(self.t);
        let mut fixed = Fixed { big_r: ProjectivePoint::IDENTITY, r: Scalar::ZERO, k: vec![], a: vec![], z1: vec![], z2: vec![] };
        for (set, bytes) in accepted {
            // t+1 holders agreed on these bytes, so at least one honest replica sent them.
            let points: Vec<ProjectivePoint> =
                bytes.chunks(POINT).map(P256::point_from_bytes).collect::<Option<_>>().ok_or(Error::Malformed("accepted commitment is not a point"))?;
            fixed.k.push((set, points[0]));
            fixed.a.push((set, points[1]));
            fixed.z1.push((set, points[2..2 + t].to_vec()));
            fixed.z2.push((set, points[2 + t..].to_vec()));
        }
        fixed.big_r = fixed.k.iter().map(|(_, p)| *p).sum();
        let x = fixed.big_r.to_affine().x();
        fixed.r = <Scalar as Reduce<U256>>::reduce_bytes(&x);
        if bool::from(fixed.r.is_zero()) {
            return Err(Error::Degenerate);
        }
        Ok(fixed)
    }

    fn mu_statement(&self, fixed: &Fixed, j: u16, mu_j: &Scalar) -> Statement {
        let k_j = random_commitment::<P256>(&fixed.k, j);
        let ca_j = random_commitment::<P256>(&fixed.a, j);
        let z1_j = zero_commitment::<P256>(&fixed.z1, j);
        Statement { b1: ProjectivePoint::GENERATOR, p1: k_j, b2: ca_j, p2: P256::mul_base(mu_j) - z1_j }
    }

    fn sigma_statement(&self, fixed: &Fixed, mu_inv: &Scalar, j: u16, sigma_j: &Scalar) -> Option<Statement> {
        let x_j = *self.xs.get(usize::from(j).checked_sub(1)?)?;
        let cw_j = random_commitment::<P256>(&fixed.a, j) * mu_inv;
        let z2_j = zero_commitment::<P256>(&fixed.z2, j);
        Some(Statement { b1: ProjectivePoint::GENERATOR, p1: x_j, b2: cw_j * fixed.r, p2: P256::mul_base(sigma_j) - z2_j - cw_j * self.e })
    }

    /// μ from all n shares on one degree-2t polynomial (no proof checked), else from 2t+1 with
    /// valid proofs (checking every unchecked one, blaming bad senders).
    fn fix_mu(&mut self, fixed: &Fixed) {
        let need = 2 * usize::from(self.t) + 1;
        let all: Vec<(u16, Scalar)> = self.mus.iter().map(|(j, m)| (*j, m.value)).collect();
        let mu = if all.len() == usize::from(self.n) && on_one_polynomial(&all, need - 1) {
            interpolate(&all[..need], Scalar::ZERO)
        } else {
            if self.mus.values().filter(|m| m.checked != Some(false)).count() < need {
                return;
            }
            self.check_mus(fixed);
            let valid: Vec<(u16, Scalar)> = self.mus.iter().filter(|(_, m)| m.checked == Some(true)).map(|(j, m)| (*j, m.value)).take(need).collect();
            if valid.len() < need {
                return;
            }
            interpolate(&valid, Scalar::ZERO)
        };
        if bool::from(mu.is_zero()) {
            self.failed = Some(Error::Degenerate);
            return;
        }
        self.mu = Some(mu);
    }

    fn check_mus(&mut self, fixed: &Fixed) {
        let unchecked: Vec<u16> = self.mus.iter().filter(|(_, m)| m.checked.is_none()).map(|(j, _)| *j).collect();
        for j in unchecked {
            let Some(m) = self.mus.get(&j) else { continue };
            let ok = proof::verify(&self.mu_statement(fixed, j, &m.value), &m.proof, &context(b"mu", &self.h, j));
            if let Some(m) = self.mus.get_mut(&j) {
                m.checked = Some(ok);
            }
            if !ok {
                self.blame(j, Fault::BadShare);
            }
        }
    }

    fn check_sigmas(&mut self, fixed: &Fixed, mu_inv: &Scalar) {
        let unchecked: Vec<u16> = self.sigmas.iter().filter(|(_, m)| m.checked.is_none()).map(|(j, _)| *j).collect();
        for j in unchecked {
            let Some(m) = self.sigmas.get(&j) else { continue };
            let ok = self.sigma_statement(fixed, mu_inv, j, &m.value).is_some_and(|st| proof::verify(&st, &m.proof, &context(b"sigma", &self.h, j)));
            if let Some(m) = self.sigmas.get_mut(&j) {
                m.checked = Some(ok);
            }
            if !ok {
                self.blame(j, Fault::BadShare);
            }
        }
    }

    /// Whether R and μ are fixed, so that [`EcdsaSession::my_share`] has σ_i.
    pub fn ready_for_shares(&self) -> bool {
        self.fixed.is_some() && self.mu.is_some()
    }

    /// This replica's σ_i and its proof, once [`EcdsaSession::ready_for_shares`].
    pub fn my_share(&mut self) -> Option<EcdsaMessage> {
        let fixed = self.fixed.as_ref()?;
        let mu_inv = Option::<Scalar>::from(self.mu?.invert())?;
        let s = &self.secrets;
        let mut w = s.a * mu_inv;
        let mut sigma = w * (self.e + fixed.r * s.x) + s.z2;
        // σ_i·G − Z2_i − e·CW_i = x_i·(r·CW_i) − β·H with CW_i = μ⁻¹·CA_i.
        let cw = pedersen(&s.a, &s.b) * mu_inv;
        let statement = Statement {
            b1: ProjectivePoint::GENERATOR,
            p1: P256::mul_base(&s.x),
            b2: cw * fixed.r,
            p2: P256::mul_base(&sigma) - pedersen(&s.z2, &s.y2) - cw * self.e,
        };
        let mut beta = (self.e + fixed.r * s.x) * mu_inv * s.b + s.y2;
        let proof = proof::prove(&statement, &s.x, &beta, &context(b"sigma", &self.h, self.index));
        let message = EcdsaMessage::Sigma { sigma: P256::scalar_to_bytes(&sigma), proof };
        let own = Received { value: sigma, proof, checked: Some(true) };
        w.zeroize();
        sigma.zeroize();
        beta.zeroize();
        self.sigmas.entry(self.index).or_insert(own);
        self.intake.own(self.index, TAG_SIGMA, || message.to_bytes());
        Some(message)
    }

    /// The signature r ‖ s once 2t+1 σ shares combine into one that verifies; `None` while
    /// more messages are needed. The combination must satisfy s·R = e·G + r·Y for the exact R
    /// of the commitment round, not only the standard verifier (which compares x-coordinates
    /// and so also accepts −s: a replica that has seen the honest σ shares could otherwise
    /// steer one replica's interpolation to −s and break byte-identity).
    pub fn try_finish(&mut self) -> Option<Result<[u8; 64], Error>> {
        if let Some(signature) = self.signature {
            return Some(Ok(signature));
        }
        if let Some(e) = &self.failed {
            return Some(Err(e.clone()));
        }
        self.advance();
        if let Some(e) = &self.failed {
            return Some(Err(e.clone()));
        }
        let mu_inv = Option::<Scalar>::from(self.mu?.invert())?;
        if !self.sigmas.contains_key(&self.index) {
            self.my_share()?;
        }
        let fixed = self.fixed.take()?;
        let result = self.finish_with(&fixed, &mu_inv);
        self.fixed = Some(fixed);
        if let Some(Ok(signature)) = result {
            self.signature = Some(signature);
        }
        result
    }

    fn combine(&self, fixed: &Fixed, shares: &[(u16, Scalar)]) -> Option<[u8; 64]> {
        let s = interpolate(shares, Scalar::ZERO);
        let mut signature = [0u8; 64];
        signature[..32].copy_from_slice(&P256::scalar_to_bytes(&fixed.r));
        signature[32..].copy_from_slice(&P256::scalar_to_bytes(&s));
        self.exact(fixed, &s, &signature).then_some(signature)
    }

    /// s ≠ 0, s·R = e·G + r·Y for the exact R, and the standard verifier accepts r ‖ s.
    fn exact(&self, fixed: &Fixed, s: &Scalar, signature: &[u8; 64]) -> bool {
        if bool::from(s.is_zero()) || fixed.big_r * s != P256::mul_base(&self.e) + self.y * fixed.r {
            return false;
        }
        use p256::ecdsa::signature::Verifier as _;
        let Ok(standard) = p256::ecdsa::Signature::from_slice(signature) else { return false };
        self.verifying_key.verify(&self.data, &standard).is_ok()
    }

    /// Whether `signature` (a peer's final signature) is exactly this session's: r of the
    /// fixed R and the s the shares define, not its twin −s that the standard verifier also
    /// accepts. `None` until the commitment round has fixed R.
    pub fn accepts_final(&self, signature: &[u8; 64]) -> Option<bool> {
        let fixed = self.fixed.as_ref()?;
        let scalar = |bytes: &[u8]| bytes.try_into().ok().and_then(|b: [u8; 32]| P256::scalar_from_bytes(&b));
        let (Some(r), Some(s)) = (scalar(&signature[..32]), scalar(&signature[32..])) else { return Some(false) };
        Some(r == fixed.r && self.exact(fixed, &s, signature))
    }

    fn finish_with(&mut self, fixed: &Fixed, mu_inv: &Scalar) -> Option<Result<[u8; 64], Error>> {
        let need = 2 * usize::from(self.t) + 1;
        let usable: Vec<(u16, Scalar)> = self.sigmas.iter().filter(|(_, m)| m.checked != Some(false)).map(|(j, m)| (*j, m.value)).take(need).collect();
        if usable.len() < need {
            return None;
        }
        if let Some(signature) = self.combine(fixed, &usable) {
            return Some(Ok(signature));
        }
        self.check_sigmas(fixed, mu_inv);
        let valid: Vec<(u16, Scalar)> = self.sigmas.iter().filter(|(_, m)| m.checked == Some(true)).map(|(j, m)| (*j, m.value)).take(need).collect();
        if valid.len() < need {
            return None;
        }
        // Valid shares lie on the polynomial whose constant is s: failing here is a bug or
        // an s of zero (negligible), not a peer's fault.
        Some(self.combine(fixed, &valid).ok_or(Error::Degenerate))
    }

    /// Checks every μ and σ proof received and not yet checked, blaming bad senders.
    pub fn audit(&mut self) {
        let Some(fixed) = self.fixed.take() else { return };
        self.check_mus(&fixed);
        if let Some(mu_inv) = self.mu.and_then(|mu| Option::<Scalar>::from(mu.invert())) {
            self.check_sigmas(&fixed, &mu_inv);
        }
        self.fixed = Some(fixed);
    }

    /// The replicas blamed so far, each with the first fault seen.
    pub fn blamed(&self) -> &BTreeMap<u16, Fault> {
        &self.intake.blamed
    }
}
