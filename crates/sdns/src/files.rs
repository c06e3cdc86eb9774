//! Writing the dealer's files: secrets 0600, created fresh, never logged.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Writes a secret file with mode 0600 from the start (no window where it is readable).
pub fn write_secret(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let _ = fs::remove_file(path);
    let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(contents)?;
    f.sync_all()?;
    // create_new honours the umask; make sure it is exactly 0600.
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
}

pub fn write_public(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    fs::write(path, contents)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
}

/// The demo zone `sdns cluster up` serves when none is given.
pub fn demo_zone(zone: &str, replicas: u16) -> String {
    let zone = zone.trim_end_matches('.');
    let mut z = format!("$ORIGIN {zone}.\n$TTL 300\n@\tIN\tSOA\tns0.{zone}. hostmaster.{zone}. ( 1 3600 900 604800 300 )\n");
    for i in 0..replicas {
        z += &format!("@\tIN\tNS\tns{i}.{zone}.\nns{i}\tIN\tA\t127.0.0.1\n");
    }
    z += "@\tIN\tMX\t10 mail\nwww\tIN\tA\t192.0.2.80\nwww\tIN\tAAAA\t2001:db8::80\nmail\tIN\tA\t192.0.2.25\n";
    z += "@\tIN\tTXT\t\"served by sdns: Byzantine-fault-tolerant, threshold-signed\"\n";
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_files_are_0600_whatever_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        fs::write(&p, b"old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        write_secret(&p, b"x").unwrap();
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read(&p).unwrap(), b"x");
        wrapper::files::check_secret_mode(&p).unwrap();
        write_public(&dir.path().join("p"), b"y").unwrap();
        assert_eq!(fs::metadata(dir.path().join("p")).unwrap().permissions().mode() & 0o777, 0o644);
    }
}
