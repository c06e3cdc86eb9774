//! EMSA-PKCS1-v1_5 encoding (RFC 8017 Section 9.2) for the DNSSEC RSA algorithms.

use num_bigint::BigUint;
use num_integer::Integer;
use num_traits::{One, Zero};
use sha2::Digest;

use crate::util::to_fixed_be;
use crate::{Error, PublicKey};

/// The hash of a DNSSEC RSA algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HashAlg {
    /// Algorithms 5 (RSASHA1) and 7 (RSASHA1-NSEC3-SHA1).
    Sha1,
    /// Algorithm 8 (RSASHA256).
    Sha256,
    /// Algorithm 10 (RSASHA512).
    Sha512,
}

impl HashAlg {
    pub fn from_dnssec_alg(alg: u8) -> Option<HashAlg> {
        match alg {
            5 | 7 => Some(HashAlg::Sha1),
            8 => Some(HashAlg::Sha256),
            10 => Some(HashAlg::Sha512),
            _ => None,
        }
    }

    /// The DER DigestInfo prefix (AlgorithmIdentifier with NULL parameters, OCTET STRING header).
    fn digest_info_prefix(self) -> &'static [u8] {
        match self {
            HashAlg::Sha1 => &[0x30, 0x21, 0x30, 0x09, 0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a, 0x05, 0x00, 0x04, 0x14],
            HashAlg::Sha256 => &[0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20],
            HashAlg::Sha512 => &[0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05, 0x00, 0x04, 0x40],
        }
    }

    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        match self {
            HashAlg::Sha1 => sha1::Sha1::digest(data).to_vec(),
            HashAlg::Sha256 => sha2::Sha256::digest(data).to_vec(),
            HashAlg::Sha512 => sha2::Sha512::digest(data).to_vec(),
        }
    }
}

/// A message ready for signing: the PKCS#1 v1.5 encoding of a hash, as an integer x in Z_N*.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub(crate) x: BigUint,
    pub(crate) alg: HashAlg,
    pub(crate) fingerprint: [u8; 32],
}

impl Message {
    /// The encoded integer x.
    pub fn representative(&self) -> &BigUint {
        &self.x
    }
    pub fn hash_alg(&self) -> HashAlg {
        self.alg
    }
}

impl PublicKey {
    /// Hashes `data` (e.g. the RRSIG to-be-signed bytes of RFC 4034 3.1.8.1) with `alg` and
    /// encodes the digest as 0x00 0x01 FF..FF 0x00 DigestInfo to |N| bytes.
    pub fn encode_message(&self, alg: HashAlg, data: &[u8]) -> Result<Message, Error> {
        self.encode_digest(alg, &alg.digest(data))
    }

    /// Like [`PublicKey::encode_message`] for an already computed digest.
    pub fn encode_digest(&self, alg: HashAlg, digest: &[u8]) -> Result<Message, Error> {
        let prefix = alg.digest_info_prefix();
        let t_len = prefix.len() + digest.len();
        let block = self.bytes;
        // RFC 8017: at least 8 bytes of padding.
        if prefix.last().map(|&l| usize::from(l)) != Some(digest.len()) || block < t_len + 11 {
            return Err(Error::MessageTooLong { len: t_len, block });
        }
        let mut em = vec![0xffu8; block];
        em[0] = 0x00;
        em[1] = 0x01;
        em[block - t_len - 1] = 0x00;
        em[block - t_len..block - digest.len()].copy_from_slice(prefix);
        em[block - digest.len()..].copy_from_slice(digest);
        let x = BigUint::from_bytes_be(&em);
        if x.is_zero() || x >= self.n || !x.gcd(&self.n).is_one() {
            return Err(Error::MessageNotInvertible);
        }
        Ok(Message { x, alg, fingerprint: self.fingerprint })
    }

    /// The encoded block of `msg` as |N| big-endian bytes.
    pub fn encoded_block(&self, msg: &Message) -> Vec<u8> {
        to_fixed_be(&msg.x, self.bytes).unwrap_or_default()
    }
}
