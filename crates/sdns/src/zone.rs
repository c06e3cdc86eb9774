//! `sdns zone add|remove`: asks replicas, through their admin endpoints, for a change of the
//! cluster's zone set. Each replica signs its own request with its identity key and orders
//! it; the change runs at one point of the log everywhere once t+1 replicas asked for the
//! same zone and key (docs/MULTIZONE.md, "Adding and removing a zone at run time").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

/// What the replicas asked made of the request.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A replica reports the change executed.
    Executed,
    /// Counted, but fewer than t+1 replicas asked so far: ask more within the window.
    Counted,
}

/// The key digest an add names: given (64 hex digits) or read from the dealer's
/// `DIR/zones/<zone>/ds.txt` (`sdns keygen --add-zone`), whose owner must be the zone.
pub fn key_digest(zone: &str, digest: Option<&str>, dealt: Option<&Path>) -> Result<[u8; 32]> {
    match (digest, dealt) {
        (Some(hex), None) => {
            wrapper::endpoint::parse_digest(hex.trim()).ok_or_else(|| anyhow::anyhow!("--key-digest {hex:?}: give the SHA-256 DS digest, 64 hex digits"))
        }
        (None, Some(dir)) => {
            let path = dir.join(wrapper::config::zone_dir_name(zone)).join("ds.txt");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {} (was {zone} dealt with keygen --add-zone --out {}?)", path.display(), dir.display()))?;
            ds_digest(zone, &text).with_context(|| path.display().to_string())
        }
        _ => bail!("give the zone's key as --key-digest HEX or --dir DEALT_DIR"),
    }
}

/// The digest of a `<owner> IN DS <tag> <alg> 2 <hex>` line for `zone`.
fn ds_digest(zone: &str, text: &str) -> Result<[u8; 32]> {
    let canonical = |n: &str| n.trim_end_matches('.').to_ascii_lowercase();
    for line in text.lines().filter(|l| !l.trim_start().starts_with(';')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| w.eq_ignore_ascii_case("DS")) else { continue };
        if words.first().map(|o| canonical(o)) != Some(canonical(zone)) {
            bail!("its DS is for {:?}, not {zone}", words.first().unwrap_or(&""));
        }
        if words.get(at + 3) != Some(&"2") {
            bail!("its DS is not of digest type 2 (SHA-256)");
        }
        let hex: String = words.get(at + 4..).unwrap_or_default().concat();
        return wrapper::endpoint::parse_digest(&hex).ok_or_else(|| anyhow::anyhow!("its DS digest {hex:?} is not 64 hex digits"));
    }
    bail!("no DS record in it")
}

/// Asks every replica in `admins` at once (the token in the matching file of `tokens`) to
/// add (`digest` given) or remove `zone`; prints each replica's answer. `Executed` once one
/// replica reports the change ran; `Counted` when the requests were counted but fewer than
/// t+1 so far; an error (with every answer) when all refused or failed.
pub fn change(admins: &[SocketAddr], tokens: &[PathBuf], zone: &str, digest: Option<[u8; 32]>) -> Result<Outcome> {
    if admins.len() != tokens.len() || admins.is_empty() {
        bail!("give one --token file per --admin address ({} addresses, {} tokens)", admins.len(), tokens.len());
    }
    let tokens = tokens.iter().map(|t| crate::cluster::read_token(t)).collect::<Result<Vec<_>>>()?;
    let zone = zone.trim_end_matches('.');
    let path = match digest {
        Some(d) => format!("/admin/zone?action=add&zone={zone}&key={}", d.iter().map(|b| format!("{b:02X}")).collect::<String>()),
        None => format!("/admin/zone?action=remove&zone={zone}"),
    };
    let path = &path;
    let answers: Vec<Result<(u16, String)>> = std::thread::scope(|s| {
        let asks: Vec<_> = admins.iter().zip(&tokens).map(|(&addr, token)| s.spawn(move || wrapper::endpoint::post_zone_set(addr, path, token))).collect();
        asks.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the request thread panicked")))).collect()
    });
    for (addr, answer) in admins.iter().zip(&answers) {
        match answer {
            Ok((code, text)) => println!("{addr}: {} (HTTP {code})", text.replace('\n', "\n    ")),
            Err(e) => println!("{addr}: error: {e:#}"),
        }
    }
    outcome(&answers).ok_or_else(|| anyhow::anyhow!("the zone set was not changed (each replica's answer above)"))
}

/// Every replica's answer asked at once: the one that executed the change decides (the
/// others find it done and refuse, or were counted before it); else a count; else `None`.
fn outcome(answers: &[Result<(u16, String)>]) -> Option<Outcome> {
    let answered = || answers.iter().filter_map(|a| a.as_ref().ok());
    if answered().any(|(code, _)| *code == 200) {
        return Some(Outcome::Executed);
    }
    answered().any(|(code, _)| *code == 202).then_some(Outcome::Counted)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "4BD6F3F5E6F2C4B9D1B0B6E4E1F4D8A3C2B1A0F9E8D7C6B5A4938271605F4E3D";

    #[test]
    fn the_digest_is_read_from_the_dealt_ds_line() {
        let line = format!("example.org. IN DS 12345 8 2 {HEX}\n");
        let digest = ds_digest("Example.ORG", &line).unwrap();
        assert_eq!(digest, wrapper::endpoint::parse_digest(HEX).unwrap());
        // A digest split in two words (as some tools print it) reads the same.
        assert_eq!(ds_digest("example.org.", &format!("example.org. 3600 IN DS 12345 8 2 {} {}", &HEX[..32], &HEX[32..])).unwrap(), digest);
        assert!(ds_digest("example.net", &line).unwrap_err().to_string().contains("not example.net"));
        assert!(ds_digest("example.org", &format!("example.org. IN DS 12345 8 1 {}", &HEX[..40])).unwrap_err().to_string().contains("digest type 2"));
        assert!(ds_digest("example.org", "; nothing\n").is_err());
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("zones/example.org")).unwrap();
        std::fs::write(dir.path().join("zones/example.org/ds.txt"), &line).unwrap();
        assert_eq!(key_digest("example.org.", None, Some(dir.path())).unwrap(), digest);
        assert_eq!(key_digest("example.org", Some(&HEX.to_ascii_lowercase()), None).unwrap(), digest);
        assert!(key_digest("example.net", None, Some(dir.path())).unwrap_err().to_string().contains("keygen --add-zone"));
        assert!(key_digest("example.org", Some("12"), None).is_err());
        assert!(key_digest("example.org", None, None).is_err());
    }

    #[test]
    fn the_replica_that_executed_decides_then_a_count() {
        let ok = |code: u16, text: &str| Ok((code, text.to_string()));
        let executed =
            [ok(202, "counted: 1 of the 2 replicas needed asked to add z."), ok(200, "added z. as zone 2 at seq 9"), ok(409, "refused: z. is served already")];
        assert_eq!(outcome(&executed), Some(Outcome::Executed));
        assert_eq!(outcome(&[ok(202, "counted: 1 of the 2"), Err(anyhow::anyhow!("no answer"))]), Some(Outcome::Counted));
        assert_eq!(outcome(&[ok(409, "refused: z. is not served"), ok(400, "error: dealt another key")]), None);
        assert_eq!(outcome(&[Err(anyhow::anyhow!("connection refused"))]), None);
    }
}
