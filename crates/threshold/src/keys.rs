//! The protocol's view of Shoup's threshold RSA (crates/shoup-rsa).
//!
//! Replica ids are 0-based (the ordering's); share indices are 1-based (Shoup's):
//! index = id + 1 everywhere below.

use std::sync::Arc;

use shoup_rsa::{corrupt, HashAlg, KeyShare, Message, PublicKey, Signature, SignatureShare};

/// This replica's key share and the public key, cheap to clone (share jobs carry a copy).
#[derive(Clone)]
pub struct Keys {
    public: Arc<PublicKey>,
    share: Arc<KeyShare>,
}

impl Keys {
    /// Checks that the share belongs to the public key before anything is signed with it.
    pub fn new(public: Arc<PublicKey>, share: Arc<KeyShare>) -> Result<Keys, shoup_rsa::Error> {
        share.validate(&public)?;
        Ok(Keys { public, share })
    }

    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    pub(crate) fn public_arc(&self) -> Arc<PublicKey> {
        self.public.clone()
    }

    pub fn threshold(&self) -> u16 {
        self.public.threshold()
    }

    pub(crate) fn encode(&self, alg: u8, data: &[u8]) -> Result<Message, String> {
        let hash = HashAlg::from_dnssec_alg(alg).ok_or_else(|| format!("algorithm {alg} is not RSA"))?;
        self.public.encode_message(hash, data).map_err(|e| e.to_string())
    }

    /// This replica's share; `corrupt_it` is the paper's fault injection (every bit inverted).
    pub(crate) fn my_share(&self, msg: &Message, proof: bool, corrupt_it: bool) -> Result<SignatureShare, String> {
        let share = if proof { self.share.sign_with_proof(&self.public, msg) } else { self.share.sign(&self.public, msg) };
        let share = share.map_err(|e| e.to_string())?;
        Ok(if corrupt_it { corrupt(&self.public, &share) } else { share })
    }

    pub(crate) fn verify_signature(&self, msg: &Message, signature: &[u8]) -> bool {
        self.public.verify(msg, &Signature(signature.to_vec()))
    }

    pub(crate) fn share_to_bytes(&self, share: &SignatureShare) -> Vec<u8> {
        share.to_bytes(&self.public).unwrap_or_default()
    }

    pub(crate) fn share_from_bytes(&self, bytes: &[u8]) -> Option<SignatureShare> {
        SignatureShare::from_bytes(&self.public, bytes).ok()
    }
}
