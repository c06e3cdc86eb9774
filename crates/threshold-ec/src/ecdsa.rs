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
//!
//! Cost: what is per key (the decoded key, verification points, a fixed-base table of Y) is
//! in [`EcdsaKey`]; a replica's own commitments and statements are all combinations of G and
//! H with scalars it knows, so they come from fixed-base tables, and the points it sends are
//! encoded with one field inversion in all. Peers' commitments are decoded only as far as
//! R needs (the k-points of the sets this replica does not hold), the rest only when a proof
//! must be checked.

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use ff::Field;
use p256::elliptic_curve::bigint::U256;
use p256::elliptic_curve::ops::Reduce;
use p256::elliptic_curve::point::AffineCoordinates;
use p256::{ProjectivePoint, Scalar};
use sha2::{Digest as _, Sha256};
use zeroize::Zeroize;

use crate::commit::CommitTable;
use crate::curve::{encode_points, interpolate, on_one_polynomial, pedersen, Curve, P256Table, P256};
use crate::intake::Intake;
use crate::proof::{self, Statement, PROOF_LEN};
use crate::prss::{f_t, prf, random_commitment, zero_commitment, Label};
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

/// What sessions need of a P-256 key, decoded and checked once per key and shared by the
/// key's sessions.
pub(crate) struct EcdsaKey {
    pk: Arc<PublicKey>,
    share: Arc<KeyShare>,
    /// Y's fixed-base table: the final check u1·G + u2·Y = R is two table walks.
    y_table: P256Table,
    xs: Vec<ProjectivePoint>,
    x: Scalar,
    /// f_T(i) of this replica for the sets it holds, in key order (one inversion each).
    f_own: Vec<Scalar>,
}

impl Drop for EcdsaKey {
    fn drop(&mut self) {
        self.x.zeroize();
    }
}

impl EcdsaKey {
    pub(crate) fn new(pk: Arc<PublicKey>, share: Arc<KeyShare>) -> Result<EcdsaKey, Error> {
        if pk.algorithm() != Algorithm::EcdsaP256Sha256 {
            return Err(Error::Algorithm(pk.algorithm().number()));
        }
        share.check(&pk)?;
        let y = pk.y_p256().ok_or(Error::Malformed("public key"))?;
        let xs = pk.verification_points::<P256>().ok_or(Error::Malformed("verification points"))?;
        let x = share.secret_scalar::<P256>().ok_or(Error::Malformed("secret"))?;
        let f_own = share.prss_keys().iter().map(|(set, _)| f_t::<Scalar>(*set, share.index())).collect();
        Ok(EcdsaKey { y_table: P256Table::new(&y), pk, share, xs, x, f_own })
    }

    /// (n, t, this replica's 1-based index).
    pub(crate) fn players(&self) -> (u16, u16, u16) {
        (self.pk.players(), self.pk.threshold(), self.share.index())
    }
}

/// This replica's secret shares for one session, wiped on drop.
#[derive(Default)]
struct Secrets {
    k: Scalar,
    a: Scalar,
    b: Scalar,
    z1: Scalar,
    y1: Scalar,
    z2: Scalar,
    y2: Scalar,
}

impl Drop for Secrets {
    fn drop(&mut self) {
        for s in [&mut self.k, &mut self.a, &mut self.b, &mut self.z1, &mut self.y1, &mut self.z2, &mut self.y2] {
            s.zeroize();
        }
    }
}

/// A presignature's online secrets (see [`EcdsaSession::online_secrets`]), wiped on drop.
pub(crate) struct OnlineSecrets {
    pub(crate) r: Scalar,
    pub(crate) w: Scalar,
    pub(crate) wx: Scalar,
    pub(crate) z2: Scalar,
}

impl Drop for OnlineSecrets {
    fn drop(&mut self) {
        for s in [&mut self.w, &mut self.wx, &mut self.z2] {
            s.zeroize();
        }
    }
}

/// What the commitment round fixed: R and r, and the accepted bundles as points once a proof
/// has to be checked.
struct Fixed {
    big_r: ProjectivePoint,
    r: Scalar,
    decoded: OnceCell<Option<Decoded>>,
}

/// The accepted per-set commitments, decoded.
struct Decoded {
    k: Vec<(u32, ProjectivePoint)>,
    a: Vec<(u32, ProjectivePoint)>,
    z1: Vec<(u32, Vec<ProjectivePoint>)>,
    z2: Vec<(u32, Vec<ProjectivePoint>)>,
}

/// A replica's own bundle for one set it holds: its bytes and points.
struct Bundle {
    set: u32,
    bytes: Vec<u8>,
    points: Vec<ProjectivePoint>,
}

impl Fixed {
    /// The accepted bundles as points: this replica's own where the bytes are its own, the
    /// others decoded (`None` if an accepted one is no point: more than t are faulty).
    fn decoded(&self, table: &CommitTable, own: &[Bundle], t: u16) -> Option<&Decoded> {
        self.decoded
            .get_or_init(|| {
                let t = usize::from(t);
                let mut d = Decoded { k: vec![], a: vec![], z1: vec![], z2: vec![] };
                for (set, bytes) in table.accepted()? {
                    let points = match own.iter().find(|b| b.set == set && b.bytes == bytes) {
                        Some(b) => b.points.clone(),
                        None => bytes.chunks(POINT).map(P256::point_from_bytes).collect::<Option<Vec<_>>>()?,
                    };
                    d.k.push((set, points[0]));
                    d.a.push((set, points[1]));
                    d.z1.push((set, points[2..2 + t].to_vec()));
                    d.z2.push((set, points[2 + t..].to_vec()));
                }
                Some(d)
            })
            .as_ref()
    }
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
    e: Scalar,
    key: Arc<EcdsaKey>,
    secrets: Secrets,
    own: Vec<Bundle>,
    table: CommitTable,
    intake: Intake,
    fixed: Option<Fixed>,
    mus: BTreeMap<u16, Received>,
    mu: Option<Scalar>,
    sigmas: BTreeMap<u16, Received>,
    failed: Option<Error>,
    signature: Option<[u8; 64]>,
    /// While set, μ waits for all n shares (taken without a proof check when they lie on one
    /// polynomial) rather than checking the proofs of the first 2t+1.
    patient: bool,
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

/// e = SHA-256(data) reduced mod q (RFC 6605 with FIPS 186's truncation, a no-op at 256 bits).
pub(crate) fn digest_scalar(data: &[u8]) -> Scalar {
    let digest: [u8; 32] = Sha256::digest(data).into();
    <Scalar as Reduce<U256>>::reduce_bytes(&digest.into())
}

fn context(what: &[u8], h: &[u8; 32], j: u16) -> Vec<u8> {
    let mut c = what.to_vec();
    c.extend(h);
    c.extend(j.to_be_bytes());
    c
}

impl EcdsaSession {
    /// Starts signing `data`: computes this replica's PRSS shares, the commitments and μ_i
    /// with its proof, all in the first message to broadcast. (Decodes and checks the key for
    /// this session alone; [`crate::EcSignerCore`] does that once per key.)
    pub fn new(pk: &PublicKey, share: &KeyShare, data: &[u8]) -> Result<(EcdsaSession, EcdsaMessage), Error> {
        EcdsaSession::with_key(Arc::new(EcdsaKey::new(Arc::new(pk.clone()), Arc::new(share.clone()))?), data)
    }

    pub(crate) fn with_key(key: Arc<EcdsaKey>, data: &[u8]) -> Result<(EcdsaSession, EcdsaMessage), Error> {
        let h = key.pk.session_hash(data);
        EcdsaSession::start(key, h, digest_scalar(data))
    }

    /// A presignature's session (src/presign): the nonce from the slot hash `h`, the data not
    /// known yet (e = 0 until [`EcdsaSession::set_data`]).
    pub(crate) fn presign(key: Arc<EcdsaKey>, h: [u8; 32]) -> Result<(EcdsaSession, EcdsaMessage), Error> {
        EcdsaSession::start(key, h, Scalar::ZERO)
    }

    /// The data a presignature signs: e for σ, its proof and the exact check.
    pub(crate) fn set_data(&mut self, data: &[u8]) {
        self.e = digest_scalar(data);
    }

    fn start(key: Arc<EcdsaKey>, h: [u8; 32], e: Scalar) -> Result<(EcdsaSession, EcdsaMessage), Error> {
        let (pk, share) = (&key.pk, &key.share);
        let (n, t, i) = (pk.players(), pk.threshold(), share.index());
        let (secrets, own) = Self::prss(&key, &h, t, i);

        // μ_i = k_i·a_i + z1_i. Statement: K_i = k_i·G and μ_i·G − Z1_i = k_i·CA_i − β·H, with
        // CA_i = a_i·G + b_i·H and β = k_i·b_i + y1_i, so μ_i·G − Z1_i = (μ_i − z1_i)·G − y1_i·H.
        let s = &secrets;
        let mut mu_i = s.k * s.a + s.z1;
        let statement = Statement { b1: ProjectivePoint::GENERATOR, p1: P256::mul_base(&s.k), b2: pedersen(&s.a, &s.b), p2: pedersen(&(mu_i - s.z1), &-s.y1) };
        let mut beta = s.k * s.b + s.y1;
        let proof = proof::prove(&statement, &s.k, &beta, (&s.a, &s.b), &context(b"mu", &h, i));
        let commitments = own.iter().flat_map(|b| b.bytes.chunks(POINT).map(|c| <[u8; POINT]>::try_from(c).unwrap_or([0; POINT]))).collect();
        let message = EcdsaMessage::Round1 { commitments, mu: P256::scalar_to_bytes(&mu_i), proof };
        mu_i.zeroize();
        beta.zeroize();

        let mut session = EcdsaSession {
            n,
            t,
            index: i,
            h,
            e,
            key: key.clone(),
            secrets,
            own,
            table: CommitTable::new(n, t),
            intake: Intake::default(),
            fixed: None,
            mus: BTreeMap::new(),
            mu: None,
            sigmas: BTreeMap::new(),
            failed: None,
            signature: None,
            patient: false,
        };
        session.add(i, message.clone()).map_err(|_| Error::Malformed("own first message"))?;
        if let Some(own) = session.mus.get_mut(&i) {
            own.checked = Some(true);
        }
        Ok((session, message))
    }

    /// This replica's PRSS shares (docs/DETERMINISM.md: u_i = Σ_T F_T·f_T(i), zero shares
    /// Σ_T f_T(i)·Σ_ℓ F_{T,ℓ}·i^ℓ) and, per set it holds, the bundle V_T, C_T, C_{T,ℓ} (z1),
    /// C_{T,ℓ} (z2): one pass over the sets, each PRF value used for both.
    fn prss(key: &EcdsaKey, h: &[u8; 32], t: u16, i: u16) -> (Secrets, Vec<Bundle>) {
        let mut s = Secrets::default();
        let mut points = Vec::new();
        let x = Scalar::from(u64::from(i));
        for ((_, rho), f) in key.share.prss_keys().iter().zip(&key.f_own) {
            let v = |label: Label, l: u16| prf::<P256>(rho, label, h, l);
            let (mut k, mut a, mut b) = (v(Label::K, 0), v(Label::A, 0), v(Label::B, 0));
            s.k += k * f;
            s.a += a * f;
            s.b += b * f;
            points.push(P256::mul_base(&k));
            points.push(pedersen(&a, &b));
            for v_z in [(Label::Z1, Label::Y1), (Label::Z2, Label::Y2)] {
                let mut power = *f;
                for l in 1..=t {
                    power *= x;
                    let (mut z, mut y) = (v(v_z.0, l), v(v_z.1, l));
                    if v_z.0 == Label::Z1 {
                        s.z1 += z * power;
                        s.y1 += y * power;
                    } else {
                        s.z2 += z * power;
                        s.y2 += y * power;
                    }
                    points.push(pedersen(&z, &y));
                    z.zeroize();
                    y.zeroize();
                }
            }
            for v in [&mut k, &mut a, &mut b] {
                v.zeroize();
            }
        }
        let per_set = 2 + 2 * usize::from(t);
        let encoded = encode_points(&points);
        let own = key
            .share
            .prss_keys()
            .iter()
            .zip(encoded.chunks(per_set).zip(points.chunks(per_set)))
            .map(|((set, _), (bytes, points))| Bundle { set: *set, bytes: bytes.concat(), points: points.to_vec() })
            .collect();
        (s, own)
    }

    /// While `patient`, μ waits for all n first messages (no proof is checked when they agree)
    /// rather than checking proofs as soon as 2t+1 are in; a driver sets it when the session
    /// starts and clears it when waiting longer would cost more than the checks.
    pub fn set_patient(&mut self, patient: bool) {
        self.patient = patient;
        if !patient {
            self.advance();
        }
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

    /// R = Σ_T V_T from the accepted bundles: the sets this replica holds give their points
    /// from its own bundles (when the accepted bytes are its own), the others' V_T are decoded
    /// (t+1 holders agreed on them, so an honest replica sent them).
    fn fix_commitments(&self) -> Result<Fixed, Error> {
        let accepted = self.table.accepted().ok_or(Error::Malformed("commitments incomplete"))?;
        let mut big_r = ProjectivePoint::IDENTITY;
        for (set, bytes) in accepted {
            big_r += match self.own.iter().find(|b| b.set == set && b.bytes == bytes) {
                Some(b) => b.points[0],
                None => bytes.get(..POINT).and_then(P256::point_from_bytes).ok_or(Error::Malformed("accepted commitment is not a point"))?,
            };
        }
        let x = big_r.to_affine().x();
        let r = <Scalar as Reduce<U256>>::reduce_bytes(&x);
        if bool::from(r.is_zero()) {
            return Err(Error::Degenerate);
        }
        Ok(Fixed { big_r, r, decoded: OnceCell::new() })
    }

    fn mu_statement(&self, d: &Decoded, j: u16, mu_j: &Scalar) -> Statement {
        let k_j = random_commitment::<P256>(&d.k, j);
        let ca_j = random_commitment::<P256>(&d.a, j);
        let z1_j = zero_commitment::<P256>(&d.z1, j);
        Statement { b1: ProjectivePoint::GENERATOR, p1: k_j, b2: ca_j, p2: P256::mul_base(mu_j) - z1_j }
    }

    fn sigma_statement(&self, fixed: &Fixed, d: &Decoded, mu_inv: &Scalar, j: u16, sigma_j: &Scalar) -> Option<Statement> {
        let x_j = *self.key.xs.get(usize::from(j).checked_sub(1)?)?;
        let cw_j = random_commitment::<P256>(&d.a, j) * mu_inv;
        let z2_j = zero_commitment::<P256>(&d.z2, j);
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
            if self.patient && all.len() < usize::from(self.n) {
                return;
            }
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
        let Some(d) = fixed.decoded(&self.table, &self.own, self.t) else {
            self.failed = Some(Error::Malformed("accepted commitment is not a point"));
            return;
        };
        let results: Vec<(u16, bool)> = self
            .mus
            .iter()
            .filter(|(_, m)| m.checked.is_none())
            .map(|(j, m)| (*j, proof::verify(&self.mu_statement(d, *j, &m.value), &m.proof, &context(b"mu", &self.h, *j))))
            .collect();
        for (j, ok) in results {
            if let Some(m) = self.mus.get_mut(&j) {
                m.checked = Some(ok);
            }
            if !ok {
                self.blame(j, Fault::BadShare);
            }
        }
    }

    fn check_sigmas(&mut self, fixed: &Fixed, mu_inv: &Scalar) {
        let Some(d) = fixed.decoded(&self.table, &self.own, self.t) else {
            self.failed = Some(Error::Malformed("accepted commitment is not a point"));
            return;
        };
        let results: Vec<(u16, bool)> = self
            .sigmas
            .iter()
            .filter(|(_, m)| m.checked.is_none())
            .map(|(j, m)| {
                let ok = self.sigma_statement(fixed, d, mu_inv, *j, &m.value).is_some_and(|st| proof::verify(&st, &m.proof, &context(b"sigma", &self.h, *j)));
                (*j, ok)
            })
            .collect();
        for (j, ok) in results {
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
        let (s, x, r, e) = (&self.secrets, &self.key.x, fixed.r, self.e);
        // CW_i = μ⁻¹·CA_i = u·G + v·H with u = a_i·μ⁻¹, v = b_i·μ⁻¹; σ_i = u·(e + r·x_i) + z2_i.
        // Statement: X_i = x_i·G and σ_i·G − Z2_i − e·CW_i = x_i·(r·CW_i) − β·H, whose left
        // side is (σ_i − z2_i − e·u)·G − (y2_i + e·v)·H, and β = (e + r·x_i)·v + y2_i.
        let (mut u, mut v) = (s.a * mu_inv, s.b * mu_inv);
        let mut sigma = u * (e + r * x) + s.z2;
        let (mut ru, mut rv) = (r * u, r * v);
        let mut g_part = sigma - s.z2 - e * u;
        let mut h_part = -(s.y2 + e * v);
        let p1 = *self.key.xs.get(usize::from(self.index).wrapping_sub(1))?;
        let statement = Statement { b1: ProjectivePoint::GENERATOR, p1, b2: pedersen(&ru, &rv), p2: pedersen(&g_part, &h_part) };
        let mut beta = (e + r * x) * v + s.y2;
        let proof = proof::prove(&statement, x, &beta, (&ru, &rv), &context(b"sigma", &self.h, self.index));
        let message = EcdsaMessage::Sigma { sigma: P256::scalar_to_bytes(&sigma), proof };
        let own = Received { value: sigma, proof, checked: Some(true) };
        for secret in [&mut u, &mut v, &mut sigma, &mut ru, &mut rv, &mut g_part, &mut h_part, &mut beta] {
            secret.zeroize();
        }
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
        if !self.exact(fixed, &s) {
            return None;
        }
        let mut signature = [0u8; 64];
        signature[..32].copy_from_slice(&P256::scalar_to_bytes(&fixed.r));
        signature[32..].copy_from_slice(&P256::scalar_to_bytes(&s));
        Some(signature)
    }

    /// s ≠ 0 and s⁻¹·e·G + s⁻¹·r·Y is exactly the session's R (so s·R = e·G + r·Y). This is
    /// what the standard verifier computes, with the whole point compared where it compares
    /// x(R) mod q with r, which holds by construction (r was taken from this R, and r ≠ 0):
    /// everything it accepts, the standard verifier accepts, but not the twin −s.
    fn exact(&self, fixed: &Fixed, s: &Scalar) -> bool {
        let Some(s_inv) = Option::<Scalar>::from(s.invert()) else { return false };
        P256::mul_base(&(self.e * s_inv)) + self.key.y_table.mul(&(fixed.r * s_inv)) == fixed.big_r
    }

    /// Whether `signature` (a peer's final signature) is exactly this session's: r of the
    /// fixed R and the s the shares define, not its twin −s that the standard verifier also
    /// accepts. `None` until the commitment round has fixed R.
    pub fn accepts_final(&self, signature: &[u8; 64]) -> Option<bool> {
        let fixed = self.fixed.as_ref()?;
        let scalar = |bytes: &[u8]| bytes.try_into().ok().and_then(|b: [u8; 32]| P256::scalar_from_bytes(&b));
        let (Some(r), Some(s)) = (scalar(&signature[..32]), scalar(&signature[32..])) else { return Some(false) };
        Some(r == fixed.r && self.exact(fixed, &s))
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

    /// What a presignature needs online, once R and μ are fixed: r and the secrets
    /// w_i = a_i·μ⁻¹, w_i·x_i and z2_i, so that σ_i is two multiplications.
    pub(crate) fn online_secrets(&self) -> Option<OnlineSecrets> {
        let fixed = self.fixed.as_ref()?;
        let mu_inv = Option::<Scalar>::from(self.mu?.invert())?;
        let w = self.secrets.a * mu_inv;
        Some(OnlineSecrets { r: fixed.r, w, wx: w * self.key.x, z2: self.secrets.z2 })
    }

    /// Whether s combines into exactly this session's signature (see [`EcdsaSession::exact`]).
    pub(crate) fn signature_if_exact(&self, s: &Scalar) -> Option<[u8; 64]> {
        let fixed = self.fixed.as_ref()?;
        self.exact(fixed, s).then(|| self.signature_bytes(s))
    }

    /// r ‖ s without any check: for an s that all n shares agreed on (src/presign).
    pub(crate) fn signature_bytes(&self, s: &Scalar) -> [u8; 64] {
        let mut signature = [0u8; 64];
        if let Some(fixed) = &self.fixed {
            signature[..32].copy_from_slice(&P256::scalar_to_bytes(&fixed.r));
        }
        signature[32..].copy_from_slice(&P256::scalar_to_bytes(s));
        signature
    }

    /// Whether replica j's σ_j and proof hold for the data set ([`EcdsaSession::set_data`]);
    /// `None` before μ is fixed.
    pub(crate) fn sigma_proof_valid(&self, j: u16, sigma: &Scalar, proof: &[u8; PROOF_LEN]) -> Option<bool> {
        let fixed = self.fixed.as_ref()?;
        let mu_inv = Option::<Scalar>::from(self.mu?.invert())?;
        let d = fixed.decoded(&self.table, &self.own, self.t)?;
        Some(self.sigma_statement(fixed, d, &mu_inv, j, sigma).is_some_and(|st| proof::verify(&st, proof, &context(b"sigma", &self.h, j))))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prss::{random_share, zero_share};

    #[test]
    fn one_pass_shares_and_bundles_are_the_prss_definitions() {
        let mut rng = <rand_chacha::ChaCha20Rng as rand_core::SeedableRng>::seed_from_u64(5);
        for (n, t) in [(4u16, 1u16), (7, 2)] {
            let (pk, shares) = crate::deal(Algorithm::EcdsaP256Sha256, n, t, &mut rng).unwrap();
            let share = &shares[2];
            let key = EcdsaKey::new(Arc::new(pk), Arc::new(share.clone())).unwrap();
            let h = [9u8; 32];
            let (s, own) = EcdsaSession::prss(&key, &h, t, 3);
            let keys = share.prss_keys();
            assert_eq!(s.k, random_share::<P256>(keys, 3, Label::K, &h));
            assert_eq!(s.a, random_share::<P256>(keys, 3, Label::A, &h));
            assert_eq!(s.b, random_share::<P256>(keys, 3, Label::B, &h));
            for (value, label) in [(s.z1, Label::Z1), (s.y1, Label::Y1), (s.z2, Label::Z2), (s.y2, Label::Y2)] {
                assert_eq!(value, zero_share::<P256>(keys, t, 3, label, &h), "{label:?}");
            }
            assert_eq!(own.len(), keys.len());
            let (set, rho) = &keys[1];
            let f = |label: Label, l: u16| prf::<P256>(rho, label, &h, l);
            assert_eq!(own[1].set, *set);
            assert_eq!(own[1].points[0], P256::mul_base(&f(Label::K, 0)));
            assert_eq!(own[1].points[1], pedersen(&f(Label::A, 0), &f(Label::B, 0)));
            assert_eq!(own[1].points[2 + usize::from(t)], pedersen(&f(Label::Z2, 1), &f(Label::Y2, 1)));
            assert_eq!(own[1].bytes, own[1].points.iter().flat_map(P256::point_to_bytes).collect::<Vec<u8>>());
        }
    }
}
