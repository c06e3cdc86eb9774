//! The dealer's files as a replica reads them: secrets refused unless 0600, TSIG keys in
//! BIND's format, the zone key named sees. (Writing them is `sdns keygen`'s, crates/sdns.)

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

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
}
