//! File helpers: one share per file (mode 0600, refused if group/other can read it) and the
//! public key, as versioned JSON.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use crate::keys::KeyShareRepr;
use crate::{Error, KeyShare, PublicKey};

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

fn corrupt(path: &Path, reason: impl ToString) -> Error {
    Error::Corrupt { path: path.to_path_buf(), reason: reason.to_string() }
}

/// Writes `contents` to a temporary file with `mode` next to `path`, then renames it over.
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), Error> {
    let mut tmp = PathBuf::from(path);
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    tmp.set_file_name(name);
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    let mut file = options.open(&tmp).map_err(io(&tmp))?;
    #[cfg(unix)]
    {
        // The file may have existed with a wider mode.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(mode)).map_err(io(&tmp))?;
    }
    file.write_all(contents).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(io(path))
}

/// Saves one key share, readable by the owner only (0600).
pub fn save_share(path: impl AsRef<Path>, share: &KeyShare) -> Result<(), Error> {
    let path = path.as_ref();
    let text = Zeroizing::new(serde_json::to_string_pretty(&share.to_repr()).map_err(|e| corrupt(path, e))?);
    write_atomic(path, text.as_bytes(), 0o600)
}

/// Loads a key share. Refuses a file that group or others may read. Call
/// [`KeyShare::validate`] with the public key afterwards.
pub fn load_share(path: impl AsRef<Path>) -> Result<KeyShare, Error> {
    let path = path.as_ref();
    let metadata = fs::metadata(path).map_err(io(path))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(Error::InsecurePermissions { path: path.to_path_buf(), mode });
        }
    }
    if metadata.len() > 1 << 20 {
        return Err(corrupt(path, "file larger than 1 MiB"));
    }
    let text = Zeroizing::new(fs::read(path).map_err(io(path))?);
    let repr: KeyShareRepr = serde_json::from_slice(&text).map_err(|e| corrupt(path, e))?;
    KeyShare::from_repr(repr).map_err(|reason| corrupt(path, reason))
}

/// Saves the public key (mode 0644).
pub fn save_public(path: impl AsRef<Path>, pk: &PublicKey) -> Result<(), Error> {
    let path = path.as_ref();
    let mut text = serde_json::to_string_pretty(pk).map_err(|e| corrupt(path, e))?;
    text.push('\n');
    write_atomic(path, text.as_bytes(), 0o644)
}

/// Loads and validates a public key.
pub fn load_public(path: impl AsRef<Path>) -> Result<PublicKey, Error> {
    let path = path.as_ref();
    let metadata = fs::metadata(path).map_err(io(path))?;
    if metadata.len() > 16 << 20 {
        return Err(corrupt(path, "file larger than 16 MiB"));
    }
    let text = fs::read(path).map_err(io(path))?;
    serde_json::from_slice(&text).map_err(|e| corrupt(path, e))
}
