//! The dealer's files as a replica reads them: secrets refused unless 0600, TSIG keys in
//! BIND's format, the zone key named sees. (Writing them is `sdns keygen`'s, crates/sdns.)

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use base64::Engine as _;
use hickory_proto::rr::Name;
use named_glue::keys::ZoneKey;

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

/// A TSIG key in BIND's format, usable as `nsupdate -k FILE` and includable in named.conf.
pub struct TsigKey {
    pub name: String,
    /// BIND's algorithm name, e.g. `hmac-sha256`.
    pub algorithm: String,
    pub secret_b64: String,
}

// The secret must not reach a log through a stray `{:?}`.
impl std::fmt::Debug for TsigKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TsigKey").field("name", &self.name).field("algorithm", &self.algorithm).field("secret_b64", &"<redacted>").finish()
    }
}

impl TsigKey {
    pub fn generate(name: &str) -> std::io::Result<TsigKey> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| std::io::Error::other(format!("no OS randomness: {e}")))?;
        Ok(TsigKey { name: name.to_owned(), algorithm: "hmac-sha256".to_owned(), secret_b64: base64::engine::general_purpose::STANDARD.encode(secret) })
    }

    pub fn to_bind(&self) -> String {
        format!("key \"{}\" {{\n\talgorithm {};\n\tsecret \"{}\";\n}};\n", self.name, self.algorithm, self.secret_b64)
    }

    /// Reads back a key statement written by `to_bind` (named needs the name for its
    /// update-policy and the secret to check signatures).
    pub fn from_bind(text: &str) -> Result<TsigKey, String> {
        let quoted_after = |marker: &str| -> Option<String> {
            let start = text.find(marker)? + marker.len();
            let end = start + text[start..].find('"')?;
            Some(text[start..end].to_owned())
        };
        let name = quoted_after("key \"").ok_or("no `key \"NAME\"` statement")?;
        let secret_b64 = quoted_after("secret \"").ok_or("no `secret \"...\"`")?;
        base64::engine::general_purpose::STANDARD.decode(&secret_b64).map_err(|e| format!("secret is not base64: {e}"))?;
        // `algorithm NAME;` (tsig-keygen always writes it); hmac-sha256 when absent.
        let algorithm = text
            .find("algorithm")
            .map(|at| text[at + "algorithm".len()..].split(';').next().unwrap_or("").trim().to_ascii_lowercase())
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| "hmac-sha256".to_owned());
        if algorithm.chars().any(|c| !(c.is_ascii_alphanumeric() || c == '-')) {
            return Err(format!("algorithm {algorithm:?} is not a TSIG algorithm name"));
        }
        Ok(TsigKey { name, algorithm, secret_b64 })
    }

    pub fn secret(&self) -> Vec<u8> {
        // from_bind and generate only ever hold valid base64.
        base64::engine::general_purpose::STANDARD.decode(&self.secret_b64).unwrap_or_default()
    }
}

/// The zone's key as named must see it, from the threshold public key.
pub fn zone_key(zone: &Name, algorithm: u8, public: &shoup_rsa::PublicKey) -> anyhow::Result<ZoneKey> {
    let e = public.public_exponent().to_be_bytes();
    let first = e.iter().position(|&b| b != 0).unwrap_or(e.len() - 1);
    ZoneKey::rsa(zone, algorithm, &e[first..], &public.modulus().to_bytes_be(), 3600).map_err(|e| anyhow::anyhow!("zone key for named: {e}"))
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn tsig_key_round_trips() {
        let k = TsigKey::generate("sdns-update").unwrap();
        let back = TsigKey::from_bind(&k.to_bind()).unwrap();
        assert_eq!(back.name, "sdns-update");
        assert_eq!(back.algorithm, "hmac-sha256");
        let sha512 = TsigKey::from_bind("key \"k\" {\n\talgorithm hmac-sha512;\n\tsecret \"AAAA\";\n};\n").unwrap();
        assert_eq!(sha512.algorithm, "hmac-sha512");
        assert_eq!(back.secret(), k.secret());
        assert_eq!(k.secret().len(), 32);
        assert!(TsigKey::from_bind("secret \"AAAA\";").unwrap_err().contains("key"));
        assert!(TsigKey::from_bind("key \"k\" { };").unwrap_err().contains("secret"));
        assert!(TsigKey::from_bind("key \"k\" { secret \"**\"; };").unwrap_err().contains("base64"));
    }
}
