//! The dealer's files as a replica reads them: secrets refused unless 0600, TSIG keys in
//! BIND's format, the zone key named sees. (Writing them is `sdns keygen`'s, crates/sdns.)

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use hickory_proto::rr::Name;
use named_glue::keys::ZoneKey;
use zeroize::Zeroize;

/// Refuses a secret file that group or others may read (key share, TLS key, TSIG update and
/// transfer keys): whoever can read one can sign as this replica or as a client. What the
/// dealer writes is 0600.
pub fn check_secret_mode(path: &Path) -> Result<(), String> {
    let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        let p = path.display();
        return Err(format!("{p} is a key file readable by group or others (mode {mode:04o}); refused: run `chmod 600 {p}`"));
    }
    Ok(())
}

/// Reads a secret file as text once [`check_secret_mode`] allows it.
pub fn read_secret(path: &Path) -> Result<String, String> {
    check_secret_mode(path)?;
    fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// DNSSEC algorithms whose threshold keys are EC (crates/threshold-ec): ECDSA P-256 (13) and
/// Ed25519 (15). The other algorithms sdns signs with (5, 7, 8, 10) are Shoup's RSA.
pub fn is_ec_algorithm(algorithm: u8) -> bool {
    threshold_ec::Algorithm::try_from(algorithm).is_ok()
}

/// A zone's threshold public key: Shoup RSA or threshold EC, as its algorithm says.
#[derive(Clone, Debug)]
pub enum ThresholdPublic {
    Rsa(Arc<shoup_rsa::PublicKey>),
    Ec(Arc<threshold_ec::PublicKey>),
}

/// One replica's share of a zone's threshold key.
#[derive(Clone, Debug)]
pub enum ThresholdShare {
    Rsa(Arc<shoup_rsa::KeyShare>),
    Ec(Arc<threshold_ec::KeyShare>),
}

/// Public key files are small; a larger one is not ours.
const MAX_KEY_FILE: u64 = 16 << 20;

fn read_bounded(path: &Path) -> anyhow::Result<Vec<u8>> {
    let len = fs::metadata(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?.len();
    if len > MAX_KEY_FILE {
        anyhow::bail!("{}: larger than {MAX_KEY_FILE} bytes", path.display());
    }
    fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))
}

impl ThresholdPublic {
    /// Reads the public key file of a key of `algorithm` (shoup-rsa's format for RSA,
    /// threshold-ec's for 13 and 15, whose file must name the same algorithm).
    pub fn load(path: &Path, algorithm: u8) -> anyhow::Result<ThresholdPublic> {
        if !is_ec_algorithm(algorithm) {
            return Ok(ThresholdPublic::Rsa(Arc::new(shoup_rsa::load_public(path)?)));
        }
        let public: threshold_ec::PublicKey =
            serde_json::from_slice(&read_bounded(path)?).map_err(|e| anyhow::anyhow!("{}: not a threshold EC public key: {e}", path.display()))?;
        if public.algorithm().number() != algorithm {
            anyhow::bail!("{}: a key of algorithm {}, not {algorithm}", path.display(), public.algorithm().number());
        }
        Ok(ThresholdPublic::Ec(Arc::new(public)))
    }

    /// n, the replicas the key was dealt to.
    pub fn players(&self) -> u16 {
        match self {
            ThresholdPublic::Rsa(p) => p.players(),
            ThresholdPublic::Ec(p) => p.players(),
        }
    }

    /// k = t+1, the dealing threshold (`sdns keygen --threshold`; EC keys store t).
    pub fn threshold(&self) -> u16 {
        match self {
            ThresholdPublic::Rsa(p) => p.threshold(),
            ThresholdPublic::Ec(p) => p.threshold() + 1,
        }
    }

    /// The zone's key as named must see it.
    pub fn zone_key(&self, zone: &Name, algorithm: u8) -> anyhow::Result<ZoneKey> {
        match self {
            ThresholdPublic::Rsa(p) => zone_key(zone, algorithm, p),
            ThresholdPublic::Ec(p) => {
                if p.algorithm().number() != algorithm {
                    anyhow::bail!("zone key for named: the threshold key is of algorithm {}, not {algorithm}", p.algorithm().number());
                }
                ZoneKey::from_dnskey_field(zone, algorithm, p.dnskey_public_key().to_vec(), 3600).map_err(|e| anyhow::anyhow!("zone key for named: {e}"))
            }
        }
    }
}

impl ThresholdShare {
    /// Reads a key share of `algorithm`; one that group or others may read is refused.
    pub fn load(path: &Path, algorithm: u8) -> anyhow::Result<ThresholdShare> {
        check_secret_mode(path).map_err(|e| anyhow::anyhow!(e))?;
        if !is_ec_algorithm(algorithm) {
            return Ok(ThresholdShare::Rsa(Arc::new(shoup_rsa::load_share(path)?)));
        }
        let mut text = read_bounded(path)?;
        let share = serde_json::from_slice::<threshold_ec::KeyShare>(&text);
        text.zeroize();
        // serde's message may quote the input: never print it for a secret file.
        let share = share.map_err(|e| anyhow::anyhow!("{}: not a threshold EC key share (line {}, column {})", path.display(), e.line(), e.column()))?;
        if share.algorithm().number() != algorithm {
            anyhow::bail!("{}: a share of an algorithm-{} key, not {algorithm}", path.display(), share.algorithm().number());
        }
        Ok(ThresholdShare::Ec(Arc::new(share)))
    }
}

/// The algorithms sdns deals threshold keys of (`sdns keygen --algorithm`).
const DEALT_ALGORITHMS: [u8; 4] = [8, 10, 13, 15];

/// The SHA-256 DS digests (RFC 4509) that the public key file at `path` gives `zone`, with
/// the algorithm of each: what `sdns keygen` writes to the zone's `ds.txt`. One per
/// algorithm the file reads as: an RSA key file does not say whether it was dealt for 8 or
/// 10 (both are listed), an EC one names its own.
pub fn ds_digests(path: &Path, zone: &Name) -> anyhow::Result<Vec<(u8, [u8; 32])>> {
    let mut digests = Vec::new();
    let mut last_error = None;
    for algorithm in DEALT_ALGORITHMS {
        match ThresholdPublic::load(path, algorithm).and_then(|public| public.zone_key(zone, algorithm)) {
            Ok(key) => digests.push((algorithm, key.ds_digest())),
            Err(e) => last_error = Some(e),
        }
    }
    match (digests.is_empty(), last_error) {
        (true, Some(e)) => Err(e.context(format!("{}: not a threshold public key sdns deals", path.display()))),
        _ => Ok(digests),
    }
}

/// The zone's key as named must see it, from the threshold RSA public key.
pub fn zone_key(zone: &Name, algorithm: u8, public: &shoup_rsa::PublicKey) -> anyhow::Result<ZoneKey> {
    let e = public.public_exponent().to_be_bytes();
    let first = e.iter().position(|&b| b != 0).unwrap_or(e.len() - 1);
    ZoneKey::rsa(zone, algorithm, &e[first..], &public.modulus().to_bytes_be(), 3600).map_err(|e| anyhow::anyhow!("zone key for named: {e}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn secret_files_are_0600_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        fs::write(&p, b"x").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(check_secret_mode(&p).is_ok());
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        let e = check_secret_mode(&p).unwrap_err();
        assert!(e.contains("0640"), "{e}");
        // Any group or other bit refuses the file, with the file and the fix named; owner
        // bits alone do not.
        for mode in [0o604, 0o620, 0o644, 0o660, 0o601, 0o610] {
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            let e = read_secret(&p).unwrap_err();
            assert!(e.contains(&format!("chmod 600 {}", p.display())) && e.contains(&format!("{mode:04o}")), "{e}");
        }
        for mode in [0o600, 0o400, 0o700] {
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(read_secret(&p).unwrap(), "x", "mode {mode:04o}");
        }
        assert!(read_secret(&dir.path().join("absent")).unwrap_err().contains("absent"));
    }

    /// A seeded generator of rand_core 0.6's traits, the version threshold_ec::deal takes
    /// (the dev-dependency rand_chacha is of another): test keys only.
    pub(crate) struct TestRng(pub u64);

    impl threshold_ec::rand_core::RngCore for TestRng {
        fn next_u32(&mut self) -> u32 {
            self.next_u64() as u32
        }
        fn next_u64(&mut self) -> u64 {
            // splitmix64
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            for chunk in dest.chunks_mut(8) {
                let v = self.next_u64().to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
        }
        fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), threshold_ec::rand_core::Error> {
            self.fill_bytes(dest);
            Ok(())
        }
    }

    impl threshold_ec::rand_core::CryptoRng for TestRng {}

    #[test]
    fn ec_keys_load_by_algorithm_and_give_named_their_dnskey() {
        let dir = tempfile::tempdir().unwrap();
        let zone = Name::from_ascii("example.test.").unwrap();
        for alg in [threshold_ec::Algorithm::EcdsaP256Sha256, threshold_ec::Algorithm::Ed25519] {
            let (pk, shares) = threshold_ec::deal(alg, 4, 1, &mut TestRng(u64::from(alg.number()))).unwrap();
            let (pub_path, share_path) = (dir.path().join("pub.json"), dir.path().join("share.json"));
            fs::write(&pub_path, serde_json::to_string(&pk).unwrap()).unwrap();
            fs::write(&share_path, serde_json::to_string(&shares[2]).unwrap()).unwrap();
            fs::set_permissions(&share_path, fs::Permissions::from_mode(0o640)).unwrap();
            let n = alg.number();
            // A share others may read is refused before it is parsed.
            assert!(ThresholdShare::load(&share_path, n).unwrap_err().to_string().contains("chmod 600"));
            fs::set_permissions(&share_path, fs::Permissions::from_mode(0o600)).unwrap();
            let ThresholdShare::Ec(share) = ThresholdShare::load(&share_path, n).unwrap() else { panic!("not an EC share") };
            assert_eq!(share.index(), 3);
            let public = ThresholdPublic::load(&pub_path, n).unwrap();
            assert_eq!(public.players(), 4);
            let key = public.zone_key(&zone, n).unwrap();
            assert_eq!((key.algorithm, key.signature_len(), key.key_tag()), (n, 64, pk.key_tag(threshold_ec::FLAGS_KSK)));
            assert_eq!(key.rdata(), pk.dnskey_rdata(threshold_ec::FLAGS_KSK));
            // The file's algorithm must be the configured one, and an RSA file is no EC key.
            let other = if n == 13 { 15 } else { 13 };
            assert!(ThresholdPublic::load(&pub_path, other).is_err());
            assert!(ThresholdShare::load(&share_path, other).is_err());
            assert!(ThresholdPublic::load(&pub_path, 8).is_err());
            assert!(public.zone_key(&zone, other).is_err());
            // The DS digest an added zone's request names: the file's own algorithm only.
            assert_eq!(ds_digests(&pub_path, &zone).unwrap(), vec![(n, key.ds_digest())]);
        }
        fs::write(dir.path().join("junk.json"), "{}").unwrap();
        assert!(ds_digests(&dir.path().join("junk.json"), &zone).is_err());
    }
}
