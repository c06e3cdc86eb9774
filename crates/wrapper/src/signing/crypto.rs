//! The signing core's view of Shoup's threshold RSA (crates/shoup-rsa).
//!
//! Replica ids are 0-based (the ordering's); share indices are 1-based (Shoup's):
//! index = id + 1 everywhere below.

use std::sync::Arc;

use shoup_rsa::{combine_opt_te, corrupt, HashAlg, KeyShare, Message, PublicKey, Signature, SignatureShare};

pub type Share = SignatureShare;
pub type Msg = Message;

/// A signature that verified, and the replicas whose shares were shown bad on the way.
pub struct Combined {
    pub signature: Vec<u8>,
    pub bad: Vec<u16>,
}

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

    pub fn threshold(&self) -> u16 {
        self.public.threshold()
    }

    pub fn encode(&self, alg: u8, data: &[u8]) -> Result<Msg, String> {
        let hash = HashAlg::from_dnssec_alg(alg).ok_or_else(|| format!("algorithm {alg} is not RSA"))?;
        self.public.encode_message(hash, data).map_err(|e| e.to_string())
    }

    /// This replica's share; `corrupt` is the paper's fault injection (every bit inverted).
    pub fn my_share(&self, msg: &Msg, proof: bool, corrupt_it: bool) -> Result<Share, String> {
        let share = if proof { self.share.sign_with_proof(&self.public, msg) } else { self.share.sign(&self.public, msg) };
        let share = share.map_err(|e| e.to_string())?;
        Ok(if corrupt_it { corrupt(&self.public, &share) } else { share })
    }

    pub fn share_replica(share: &Share) -> Option<u16> {
        share.index.checked_sub(1)
    }

    pub fn has_proof(share: &Share) -> bool {
        share.proof.is_some()
    }

    pub fn verify_share(&self, msg: &Msg, share: &Share) -> bool {
        self.public.verify_share(msg, share).is_ok()
    }

    /// Combines exactly the first k shares; `None` unless the result verifies.
    pub fn combine_checked(&self, msg: &Msg, shares: &[Share]) -> Option<Combined> {
        let signature = self.public.combine(msg, shares).ok()?;
        self.public.verify(msg, &signature).then(|| Combined { signature: signature.into_bytes(), bad: Vec::new() })
    }

    /// OPT-TE: k-subsets of `shares` until one verifies; `None` means wait for more.
    pub fn combine_trial(&self, msg: &Msg, shares: &[Share]) -> Option<Combined> {
        let c = combine_opt_te(&self.public, msg, shares).ok()?;
        if !self.public.verify(msg, &c.signature) {
            return None;
        }
        let bad = c.bad.iter().filter_map(|&i| i.checked_sub(1)).collect();
        Some(Combined { signature: c.signature.into_bytes(), bad })
    }

    pub fn verify_signature(&self, msg: &Msg, signature: &[u8]) -> bool {
        self.public.verify(msg, &Signature(signature.to_vec()))
    }

    pub fn share_to_bytes(&self, share: &Share) -> Vec<u8> {
        share.to_bytes(&self.public).unwrap_or_default()
    }

    pub fn share_from_bytes(&self, bytes: &[u8]) -> Option<Share> {
        SignatureShare::from_bytes(&self.public, bytes).ok()
    }
}
