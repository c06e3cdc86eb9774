//! Initial signing of an unsigned zone, through the signing socket.
//!
//! The patched dnssec-signzone goes through the same dns_dnssec_sign as
//! named, so with SDNS_SIGNER_SOCKET set its every signature comes from the
//! signing service (and thus from the threshold signers). Deterministic in
//! content: no jitter, NSEC (no random salt), -s/-e from the agreed time
//! (the service overwrites them anyway), and the "File written on" comment,
//! the one line holding the wall clock, is dropped from the output. With
//! several threads the names come out in the order they were signed, so
//! only the records, not the file's bytes, are the same everywhere. The
//! tool verifies every signature before it writes the zone. RRSIGs in the
//! input are kept when they still verify (`-i 0`: unless expired).

use std::path::{Path, PathBuf};

use hickory_proto::rr::Name;
use tokio::process::Command;

use crate::keys::ZoneKey;
use crate::signer::SignatureTimes;
use crate::time::format_timestamp;
use crate::tools::BindTools;

/// More signer threads than the signing service takes requests at once
/// (`ServiceLimits::max_in_flight`'s default) would only have requests dropped and re-sent.
pub const MAX_THREADS: usize = 64;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignZoneError {
    #[error("io on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("dnssec-signzone failed ({status}): {output}")]
    Failed { status: String, output: String },
    #[error("the key is for {key_zone}, not {zone}")]
    WrongZone { key_zone: String, zone: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SignZoneError + '_ {
    move |source| SignZoneError::Io { path: path.to_path_buf(), source }
}

/// Signs `unsigned` with `key` (whose files are in `key_dir`) into `signed`.
/// Every signature is requested from the signing service at `socket`, which
/// must be answering with `times` (the agreed times) while this runs.
#[allow(clippy::too_many_arguments)]
pub async fn sign_zone_file(
    tools: &BindTools,
    zone: &Name,
    unsigned: &Path,
    signed: &Path,
    key_dir: &Path,
    key: &ZoneKey,
    socket: &Path,
    times: SignatureTimes,
    threads: usize,
) -> Result<(), SignZoneError> {
    let mut zone_lc = zone.to_lowercase();
    zone_lc.set_fqdn(true);
    if zone_lc != key.zone {
        return Err(SignZoneError::WrongZone { key_zone: key.zone_text(), zone: zone_lc.to_ascii() });
    }
    let work = signed.parent().unwrap_or_else(|| Path::new(".")).to_path_buf();
    // dnssec-signzone finds the zone's keys through the apex DNSKEY RRset,
    // so the unsigned text gets the DNSKEY appended (duplicates collapse).
    let mut text = tokio::fs::read_to_string(unsigned).await.map_err(io_err(unsigned))?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&key.dnskey_record());
    text.push('\n');
    let input = with_suffix(signed, ".input");
    let output = with_suffix(signed, ".output");
    tokio::fs::write(&input, &text).await.map_err(io_err(&input))?;

    let mut cmd = Command::new(tools.bin("dnssec-signzone"));
    // It waits for each signature as long as it takes, like named: it must not outlive us.
    crate::supervisor::die_with_parent(&mut cmd);
    let result = cmd
        .env(crate::SIGNER_SOCKET_ENV, socket)
        .current_dir(&work)
        .arg("-q")
        // Several threads keep several signatures in flight, so the threshold signers'
        // share exchanges overlap and their shares run on every core. The output differs
        // only in the order of names in the file (each name is written whole, by the thread
        // that signed it); named loads it into its sorted database, so the zone it serves is
        // the same (docs/DETERMINISM.md).
        .arg("-n")
        .arg(threads.clamp(1, MAX_THREADS).to_string())
        .args(["-j", "0", "-z"])
        // Signatures already in the input (a later round of a background signing) are kept
        // while they verify and have not expired: by default it would also re-sign those
        // within a quarter of their validity of expiring, which for the short validities of
        // tests is all of them.
        .args(["-i", "0"])
        .args(["-O", "full"])
        .arg("-K")
        .arg(key_dir)
        .arg("-d")
        .arg(&work)
        .args(["-s", &format_timestamp(u64::from(times.inception))])
        .args(["-e", &format_timestamp(u64::from(times.expiration))])
        .args(["-o", &key.zone_text()])
        .arg("-f")
        .arg(&output)
        .arg(&input)
        .arg(key_dir.join(key.file_stem()))
        .kill_on_drop(true)
        .output()
        .await
        .map_err(io_err(&tools.bin("dnssec-signzone")))?;
    let _ = tokio::fs::remove_file(&input).await;
    if !result.status.success() {
        let _ = tokio::fs::remove_file(&output).await;
        return Err(SignZoneError::Failed {
            status: result.status.to_string(),
            output: format!("{}{}", String::from_utf8_lossy(&result.stdout), String::from_utf8_lossy(&result.stderr)),
        });
    }
    let dumped = tokio::fs::read_to_string(&output).await.map_err(io_err(&output))?;
    let kept: String = dumped.lines().filter(|l| !l.starts_with("; File written on")).flat_map(|l| [l, "\n"]).collect();
    tokio::fs::write(&output, kept).await.map_err(io_err(&output))?;
    tokio::fs::rename(&output, signed).await.map_err(io_err(signed))?;
    Ok(())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}
