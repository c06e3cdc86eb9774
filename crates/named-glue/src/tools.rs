//! Locating the patched BIND build (patches/bind9/build.sh output).

use std::path::{Path, PathBuf};

/// Environment variable naming the build's install prefix.
pub const BIND_DIR_ENV: &str = "SDNS_BIND_DIR";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolsError {
    #[error("patched named not found at {0}: run patches/bind9/build.sh (or set SDNS_BIND_DIR)")]
    Missing(PathBuf),
}

/// The install prefix of the patched BIND: `sbin/named`, `bin/dig`, ...
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindTools {
    pub prefix: PathBuf,
}

impl BindTools {
    pub fn new(prefix: &Path) -> Self {
        BindTools { prefix: prefix.to_path_buf() }
    }

    /// `$SDNS_BIND_DIR`, else `<workspace>/target/bind9` where the
    /// workspace root is found from this crate's manifest directory.
    pub fn locate() -> Result<Self, ToolsError> {
        let prefix = match std::env::var_os(BIND_DIR_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bind9"),
        };
        let tools = BindTools::new(&prefix);
        tools.check()?;
        Ok(tools)
    }

    /// Checks that the named binary and the tools exist.
    pub fn check(&self) -> Result<(), ToolsError> {
        for path in [self.named(), self.bin("dnssec-signzone"), self.bin("named-checkconf")] {
            if !path.is_file() {
                return Err(ToolsError::Missing(path));
            }
        }
        Ok(())
    }

    pub fn named(&self) -> PathBuf {
        self.prefix.join("sbin/named")
    }

    /// Writes `text` (a zone file in text, for `zone`) to `raw` in BIND's raw format, through
    /// a temporary file renamed into place. named-compilezone checks the zone as named
    /// would load it; its complaint is the error.
    pub fn compile_raw(&self, zone: &str, text: &Path, raw: &Path) -> Result<(), String> {
        let tmp = raw.with_extension("compiling");
        let out = std::process::Command::new(self.bin("named-compilezone"))
            .args(["-q", "-f", "text", "-F", "raw", "-o"])
            .arg(&tmp)
            .arg(zone)
            .arg(text)
            .output()
            .map_err(|e| format!("named-compilezone: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("named-compilezone {}: {}{}", text.display(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
        }
        std::fs::rename(&tmp, raw).map_err(|e| format!("{}: {e}", raw.display()))
    }

    /// A tool from `bin/` (dig, nsupdate, delv, dnssec-*, named-checkconf),
    /// falling back to `sbin/` (tsig-keygen, ddns-confgen).
    pub fn bin(&self, name: &str) -> PathBuf {
        let bin = self.prefix.join("bin").join(name);
        if bin.is_file() {
            bin
        } else {
            self.prefix.join("sbin").join(name)
        }
    }
}

/// Whether `path` holds a zone in BIND's raw format: its header starts with the format
/// number 2 (`dns_masterformat_raw`), four bytes in network order; a text zone file starts
/// with text.
pub fn is_raw_zone_file(path: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let mut head = [0u8; 4];
    let mut file = std::fs::File::open(path)?;
    match file.read_exact(&mut head) {
        Ok(()) => Ok(head == [0, 0, 0, 2]),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_build_names_the_build_script() {
        let err = BindTools::new(Path::new("/nonexistent/bind9")).check().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("patches/bind9/build.sh") && text.contains("/nonexistent/bind9/sbin/named"), "{text}");
    }
}
