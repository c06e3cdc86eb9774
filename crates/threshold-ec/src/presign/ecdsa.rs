//! An ECDSA P-256 presignature: the first round of [`crate::EcdsaSession`] run over a slot hash
//! in the background, then online σ_i without a proof (docs/DETERMINISM.md, "Presignatures").

use std::collections::BTreeMap;
use std::sync::Arc;

use ff::Field;
use p256::Scalar;

use super::combine::{FullSet, Step};
use crate::curve::{interpolate, Curve, P256};
use crate::ecdsa::{digest_scalar, EcdsaKey, OnlineSecrets};
use crate::intake::Intake;
use crate::{Blame, EcdsaMessage, EcdsaSession, Error, Fault};

const KIND_SHARE: u8 = 3;
const KIND_PROOF: u8 = 5;

pub(crate) struct EcdsaPre {
    n: u16,
    t: u16,
    index: u16,
    session: EcdsaSession,
    round1: Vec<u8>,
    online: Option<OnlineSecrets>,
    /// e of the data once bound; σ shares are for it.
    e: Option<Scalar>,
    shares: BTreeMap<u16, Scalar>,
    /// Shares whose proof was checked: valid or not (this replica's own is valid).
    proven: BTreeMap<u16, bool>,
    /// The share set last combined without proofs, so a failed one is not tried again.
    tried: Vec<u16>,
    proof_answer: Option<Vec<u8>>,
    intake: Intake,
    full: Arc<FullSet<Scalar>>,
}

impl EcdsaPre {
    pub(crate) fn new(key: Arc<EcdsaKey>, slot_h: [u8; 32], full: Arc<FullSet<Scalar>>) -> Result<EcdsaPre, Error> {
        let (mut session, first) = EcdsaSession::presign(key.clone(), slot_h)?;
        // μ waits for all n shares (then no proof is checked) until the core's patience ends.
        session.set_patient(true);
        let (n, t, index) = key.players();
        let mut pre = EcdsaPre {
            n,
            t,
            index,
            session,
            round1: first.to_bytes(),
            online: None,
            e: None,
            shares: BTreeMap::new(),
            proven: BTreeMap::new(),
            tried: Vec::new(),
            proof_answer: None,
            intake: Intake::default(),
            full,
        };
        pre.refresh();
        Ok(pre)
    }

    pub(crate) fn round1(&self) -> &[u8] {
        &self.round1
    }

    pub(crate) fn receive_round1(&mut self, from: u16, body: &[u8]) -> Result<(), Blame> {
        // Only first-round messages belong here; a σ in this slot travels as a share.
        if EcdsaMessage::from_bytes(body).is_some_and(|m| !matches!(m, EcdsaMessage::Round1 { .. })) {
            return Err(self.intake.blame(from, Fault::Malformed));
        }
        let result = self.session.receive(from, body);
        self.refresh();
        result
    }

    /// Picks up μ once the session fixed it (a patient session waits for all n μ shares).
    fn refresh(&mut self) {
        if self.online.is_none() {
            self.online = self.session.online_secrets();
        }
    }

    /// Stops waiting for all n μ shares: the proofs of those present are checked.
    pub(crate) fn impatient(&mut self) {
        self.session.set_patient(false);
        self.refresh();
    }

    pub(crate) fn ready(&self) -> bool {
        self.online.is_some()
    }

    /// Fixes the data and computes this replica's σ_i = w_i·e + r·(w_i·x_i) + z2_i.
    pub(crate) fn bind(&mut self, data: &[u8]) -> Option<[u8; 32]> {
        let online = self.online.as_ref()?;
        if self.e.is_none() {
            self.session.set_data(data);
            let e = digest_scalar(data);
            let mut sigma = online.w * e + online.r * online.wx + online.z2;
            self.shares.insert(self.index, sigma);
            self.proven.insert(self.index, true);
            self.e = Some(e);
            let bytes = P256::scalar_to_bytes(&sigma);
            zeroize::Zeroize::zeroize(&mut sigma);
            self.intake.own(self.index, KIND_SHARE, || bytes.to_vec());
        }
        self.shares.get(&self.index).map(P256::scalar_to_bytes)
    }

    pub(crate) fn add_share(&mut self, from: u16, bytes: &[u8; 32]) -> Result<(), Blame> {
        if !self.intake.admit(self.n, from, KIND_SHARE, bytes.to_vec())? {
            return Ok(());
        }
        let Some(sigma) = P256::scalar_from_bytes(bytes) else { return Err(self.intake.blame(from, Fault::Malformed)) };
        // Its proof may have come first (the share was lost or is late): a share other than
        // the proven one is a second σ.
        if self.shares.get(&from).is_some_and(|s| *s != sigma) {
            self.proven.insert(from, false);
            return Err(self.intake.blame(from, Fault::Equivocation));
        }
        self.shares.insert(from, sigma);
        Ok(())
    }

    /// A peer's σ with its proof, asked for after a combination failed.
    pub(crate) fn add_proof(&mut self, from: u16, body: &[u8]) -> Result<(), Blame> {
        if self.e.is_none() || self.proven.contains_key(&from) || from == 0 || from > self.n {
            return Ok(());
        }
        let result = self.check_proof(from, body);
        if result.is_err() {
            // Whatever the fault, this sender's share is not used without a valid proof.
            self.proven.insert(from, false);
        }
        result
    }

    fn check_proof(&mut self, from: u16, body: &[u8]) -> Result<(), Blame> {
        if !self.intake.admit(self.n, from, KIND_PROOF, body.to_vec())? {
            return Ok(());
        }
        let Some(EcdsaMessage::Sigma { sigma, proof }) = EcdsaMessage::from_bytes(body) else { return Err(self.intake.blame(from, Fault::Malformed)) };
        let Some(sigma) = P256::scalar_from_bytes(&sigma) else { return Err(self.intake.blame(from, Fault::Malformed)) };
        if self.shares.get(&from).is_some_and(|s| *s != sigma) {
            return Err(self.intake.blame(from, Fault::Equivocation));
        }
        self.shares.insert(from, sigma);
        if self.session.sigma_proof_valid(from, &sigma, &proof) != Some(true) {
            return Err(self.intake.blame(from, Fault::BadShare));
        }
        self.proven.insert(from, true);
        Ok(())
    }

    /// This replica's σ_i and its proof, for a peer that asks (computed once).
    pub(crate) fn proof_answer(&mut self) -> Option<Vec<u8>> {
        self.e?;
        if self.proof_answer.is_none() {
            self.proof_answer = self.session.my_share().map(|m| m.to_bytes());
        }
        self.proof_answer.clone()
    }

    /// All n σ on one degree-2t polynomial give s with no check (2t+1 of them are honest and
    /// fix it); otherwise 2t+1 combined and checked exactly, else proven shares only.
    pub(crate) fn finish(&mut self, patient: bool) -> Step {
        if self.e.is_none() {
            return Step::Wait;
        }
        if let Some(s) = self.full.combine(&self.shares) {
            return self.done(&s);
        }
        if patient && self.shares.len() < usize::from(self.n) {
            return Step::Wait;
        }
        let need = 2 * usize::from(self.t) + 1;
        let usable: Vec<(u16, Scalar)> = self.shares.iter().filter(|(j, _)| self.proven.get(*j) != Some(&false)).map(|(j, s)| (*j, *s)).take(need).collect();
        if usable.len() < need {
            return Step::Wait;
        }
        let set: Vec<u16> = usable.iter().map(|(j, _)| *j).collect();
        if set != self.tried {
            self.tried = set;
            if let Some(signature) = self.session.signature_if_exact(&interpolate(&usable, Scalar::ZERO)) {
                return Step::Done(signature);
            }
        }
        let valid: Vec<(u16, Scalar)> = self.shares.iter().filter(|(j, _)| self.proven.get(*j) == Some(&true)).map(|(j, s)| (*j, *s)).take(need).collect();
        if valid.len() < need {
            return Step::NeedProofs;
        }
        // Proven shares lie on the honest polynomial: failing here is an s of zero.
        match self.session.signature_if_exact(&interpolate(&valid, Scalar::ZERO)) {
            Some(signature) => Step::Done(signature),
            None => Step::Failed(Error::Degenerate),
        }
    }

    fn done(&self, s: &Scalar) -> Step {
        if bool::from(s.is_zero()) {
            return Step::Failed(Error::Degenerate);
        }
        Step::Done(self.session.signature_bytes(s))
    }

    /// Every replica blamed in this slot: in the first round or for its σ.
    pub(crate) fn blamed(&self) -> impl Iterator<Item = (u16, Fault)> + '_ {
        self.session.blamed().iter().chain(&self.intake.blamed).map(|(j, f)| (*j, *f))
    }
}
