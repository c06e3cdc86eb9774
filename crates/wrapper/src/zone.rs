//! Operations on the whole zone that the executor runs at an ordered point:
//! the content digest for checkpoints and the paper's sign-zone command.

use std::path::PathBuf;
use std::sync::Arc;

use hickory_proto::rr::{Name, RecordType};
use named_glue::conf::NamedConf;
use named_glue::forward::{build_query, Forwarder};
use named_glue::keys::ZoneKey;
use named_glue::rrwire::RawMessage;
use named_glue::signer::SignatureTimes;
use named_glue::signzone::sign_zone_file;
use named_glue::supervisor::Supervisor;
use named_glue::tools::BindTools;


#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZoneError {
    #[error("zone transfer from named failed: {0}")]
    Transfer(String),
    #[error("named-compilezone failed: {0}")]
    Compile(String),
    #[error("signing the zone failed: {0}")]
    Sign(String),
    #[error("io on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("named did not come back after loading the signed zone: {0}")]
    Restart(String),
}

/// The digest of a zone's records (canonical wire form, as [`ZoneMaintenance::zone_records`]
/// returns them), the same on every honest replica: sorted, duplicates (the AXFR's closing
/// SOA) dropped, each hashed with its length. Leaves `records` sorted and deduplicated.
pub fn zone_digest_of(records: &mut Vec<Vec<u8>>) -> [u8; 32] {
    use sha2::{Digest as _, Sha256};
    records.sort();
    records.dedup();
    let mut h = Sha256::new();
    for r in records.iter() {
        h.update((r.len() as u32).to_be_bytes());
        h.update(r);
    }
    h.finalize().into()
}

/// Record types dnssec-signzone makes itself; a re-sign starts from the zone without them.
const DNSSEC_TYPES: [&str; 5] = ["RRSIG", "NSEC", "NSEC3", "NSEC3PARAM", "DNSKEY"];

pub struct ZoneMaintenance {
    pub tools: BindTools,
    pub zone: Name,
    pub named: Forwarder,
    pub conf: NamedConf,
    pub key: ZoneKey,
    pub signer_socket: PathBuf,
    pub supervisor: Arc<Supervisor>,
}

impl ZoneMaintenance {
    /// The zone's records, each in canonical wire form (owner and the names of
    /// compressible rdata decompressed and lowercased, every other rdata as named
    /// sent it), from an AXFR of the local named. Read with `rrwire`, so a record
    /// named accepts but a full decoder rejects still counts.
    pub async fn zone_records(&self) -> Result<Vec<Vec<u8>>, ZoneError> {
        let request = build_query(0, &self.zone, RecordType::AXFR).map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let stream = self.named.axfr(&request).await.map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let messages = stream.collect().await.map_err(|e| ZoneError::Transfer(e.to_string()))?;
        let mut out = Vec::new();
        for bytes in messages {
            let m = RawMessage::parse(&bytes).map_err(|e| ZoneError::Transfer(e.to_string()))?;
            if m.header.rcode() != 0 {
                return Err(ZoneError::Transfer(format!("named answered the AXFR with rcode {}", m.header.rcode())));
            }
            out.extend(m.answers.iter().map(|r| r.to_wire()));
        }
        Ok(out)
    }

    /// Signs the zone's current content (file plus journal) with the distributed key,
    /// then restarts named on the signed file. Every replica does this at the same
    /// point of the log with the same agreed times, so all get the same signed zone.
    pub async fn sign_zone(&self, times: SignatureTimes) -> Result<(), ZoneError> {
        let dir = &self.conf.directory;
        let merged = dir.join("resign.merged");
        let unsigned = dir.join("resign.unsigned");
        let signed = dir.join("resign.signed");
        let zone_text = self.zone.to_ascii();

        // BIND's own tool folds the journal into the file, in full one-RR-per-line style.
        let out = tokio::process::Command::new(self.tools.bin("named-compilezone"))
            .args(["-q", "-j", "-s", "full", "-o"])
            .arg(&merged)
            .arg(&zone_text)
            .arg(&self.conf.zone_file)
            .output()
            .await
            .map_err(|e| ZoneError::Compile(e.to_string()))?;
        if !out.status.success() {
            return Err(ZoneError::Compile(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))));
        }
        let text = tokio::fs::read_to_string(&merged).await.map_err(|source| ZoneError::Io { path: merged.clone(), source })?;
        let stripped = strip_dnssec(&text);
        tokio::fs::write(&unsigned, stripped).await.map_err(|source| ZoneError::Io { path: unsigned.clone(), source })?;

        sign_zone_file(&self.tools, &self.zone, &unsigned, &signed, &self.conf.key_directory, &self.key, &self.signer_socket, times)
            .await
            .map_err(|e| ZoneError::Sign(e.to_string()))?;

        tokio::fs::rename(&signed, &self.conf.zone_file)
            .await
            .map_err(|source| ZoneError::Io { path: self.conf.zone_file.clone(), source })?;
        match tokio::fs::remove_file(&self.conf.journal).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(ZoneError::Io { path: self.conf.journal.clone(), source }),
        }
        for p in [&merged, &unsigned] {
            let _ = tokio::fs::remove_file(p).await;
        }
        self.supervisor.restart().await.map_err(|e| ZoneError::Restart(e.to_string()))?;
        self.supervisor.wait_ready().await.map_err(|e| ZoneError::Restart(e.to_string()))
    }
}

/// Drops DNSSEC records from a zone in named-compilezone's full style
/// (`owner ttl class type rdata`, one record per line).
fn strip_dnssec(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let rtype = line.split_whitespace().nth(3).unwrap_or("");
        if DNSSEC_TYPES.contains(&rtype) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_only_dnssec_types() {
        let text = "example.test. 300 IN SOA ns0.example.test. h.example.test. 1 3600 900 604800 300\n\
                    example.test. 300 IN RRSIG SOA 8 2 300 20300101000000 20200101000000 1 example.test. AAAA\n\
                    example.test. 300 IN DNSKEY 257 3 8 AwEAAQ==\n\
                    example.test. 300 IN NSEC www.example.test. SOA RRSIG NSEC DNSKEY\n\
                    www.example.test. 300 IN A 192.0.2.80\n\
                    txt.example.test. 300 IN TXT \"RRSIG in text is data\"\n";
        let s = strip_dnssec(text);
        assert_eq!(s.lines().count(), 3, "{s}");
        assert!(s.contains(" SOA ") && s.contains(" A 192.0.2.80") && s.contains("RRSIG in text"));
    }
}
