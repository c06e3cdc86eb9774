//! The double-KSK rollover of an adopted signed zone, from the operator's key to the
//! threshold key.
//!
//! The adopted zone publishes both keys: the operator's KSK (the key the parent's DS names
//! today) and the threshold key. The operator's private KSK signs the DNSKEY RRset
//! {operator KSK, threshold key} once, at adoption, with a long validity; the threshold key
//! signs everything, the DNSKEY RRset included. A validator that trusts the old DS goes
//! old DS -> old KSK -> DNSKEY RRset -> threshold key -> data; one that trusts the new DS
//! goes straight to the threshold key. Nothing in sdns re-signs or removes that signature:
//! DNSKEY is never updated, re-sign slices take only the threshold key's signatures, and
//! a whole-zone signing carries the operator's records over (see
//! `exec::signer_input::signer_records`) while
//! the zone holds the marker record ([`marker_name`]). Deleting the marker (an ordered
//! update) and signing the zone (an ordered sign-zone) finishes the rollover; so do t+1
//! replicas' reports that the parent's DS covers the threshold key (`exec::core`).
//!
//! During the rollover the zone also publishes CDS and CDNSKEY for the threshold key
//! (RFC 7344, RFC 8078), so a parent that scans for them can put the new DS in by itself.
//! RFC 7344 4.1 wants them signed by a key the parent's current DS covers: their content is
//! fixed at the adoption (the threshold key is dealt by then), so the operator's KSK signs
//! them there, with the DNSKEY RRset, for the same validity. The threshold key signs them
//! too, like every RRset; a validator that trusts the old DS accepts either (old DS -> old
//! KSK -> DNSKEY RRset, which holds the threshold key -> CDS). A whole-zone signing after
//! the marker is gone drops them (docs/DETERMINISM.md, "CDS and the automatic finish").

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;

// One definition for the runtime and this command (the runtime never depends on the CLI).
pub use exec::names::marker_name;

/// What the adoption writes next to the dealer's files about the rollover.
pub const ROLLOVER_FILE: &str = "rollover.txt";
/// The old key's DS (the one the parent has now), alone, for tools and tests.
pub const OLD_DS_FILE: &str = "ds-old.txt";

/// A DNSKEY record read from zone text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dnskey {
    pub owner: String,
    pub ttl: u32,
    pub flags: u16,
    pub algorithm: u8,
    /// The public key field, base64 as in the zone text (spaces removed).
    pub public_b64: String,
}

impl Dnskey {
    /// Parses `owner ttl class DNSKEY flags protocol algorithm key...` (named-compilezone's
    /// full style); `None` for any other line.
    pub fn parse(line: &str) -> Option<Dnskey> {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || !f[3].eq_ignore_ascii_case("DNSKEY") || !f[2].eq_ignore_ascii_case("IN") || f[5] != "3" {
            return None;
        }
        Some(Dnskey {
            owner: crate::adopted::absolute_name(f[0]),
            ttl: f[1].parse().ok()?,
            flags: f[4].parse().ok()?,
            algorithm: f[6].parse().ok()?,
            public_b64: f[7..].concat(),
        })
    }

    /// The DNSKEY rdata; `None` when the key field is not base64.
    pub fn rdata(&self) -> Option<Vec<u8>> {
        let key = base64::engine::general_purpose::STANDARD.decode(&self.public_b64).ok()?;
        let mut out = self.flags.to_be_bytes().to_vec();
        out.extend_from_slice(&[3, self.algorithm]);
        out.extend_from_slice(&key);
        Some(out)
    }

    pub fn key_tag(&self) -> Option<u16> {
        self.rdata().map(|r| named_glue::keys::key_tag(&r))
    }

    /// A key-signing key (SEP flag set, zone key, not revoked).
    pub fn is_ksk(&self) -> bool {
        self.flags & 0x0101 == 0x0101 && self.flags & 0x0080 == 0
    }

    /// The record with another TTL, in zone-file form.
    pub fn record(&self, ttl: u32) -> String {
        format!("{} {ttl} IN DNSKEY {} 3 {} {}", self.owner, self.flags, self.algorithm, self.public_b64)
    }

    /// BIND's file stem for this key: `K<zone>+<alg>+<tag>`.
    pub fn file_stem(&self) -> Option<String> {
        Some(format!("K{}+{:03}+{:05}", self.owner, self.algorithm, self.key_tag()?))
    }

    /// The DS record (SHA-256) the parent holds for this key.
    pub fn ds(&self) -> Option<String> {
        Some(format!("{} IN DS {}", self.owner, self.ds_rdata()?))
    }

    /// The DS rdata (SHA-256) in presentation form: `tag algorithm 2 DIGEST`.
    fn ds_rdata(&self) -> Option<String> {
        let owner = hickory_proto::rr::Name::from_ascii(&self.owner).ok()?.to_lowercase();
        let wire = hickory_proto::serialize::binary::BinEncodable::to_bytes(&owner).ok()?;
        let rdata = self.rdata()?;
        let digest: String = dnswire::dnssec::ds_sha256(&wire, &rdata).iter().map(|b| format!("{b:02X}")).collect();
        Some(format!("{} {} 2 {digest}", named_glue::keys::key_tag(&rdata), self.algorithm))
    }

    /// The CDS record (RFC 7344) asking the parent for this key's DS (SHA-256, the digest
    /// RFC 8624 says to use), with `ttl`.
    pub fn cds(&self, ttl: u32) -> Option<String> {
        Some(format!("{} {ttl} IN CDS {}", self.owner, self.ds_rdata()?))
    }

    /// The CDNSKEY record (RFC 7344) for this key, with `ttl`: the key itself, for parents
    /// that compute the DS themselves.
    pub fn cdnskey(&self, ttl: u32) -> String {
        format!("{} {ttl} IN CDNSKEY {} 3 {} {}", self.owner, self.flags, self.algorithm, self.public_b64)
    }
}

/// The CDS and CDNSKEY records the adopted zone publishes during the rollover: the
/// threshold key's (`threshold`, a DNSKEY line), with the DNSKEY RRset's TTL. Only the new
/// key: a CDS RRset is the whole DS set the child asks for (RFC 7344 4.1), and the old key
/// is to leave the parent.
pub fn cds_records(threshold: &str, ttl: u32) -> Result<Vec<String>> {
    let key = Dnskey::parse(threshold).ok_or_else(|| anyhow!("the threshold key's DNSKEY record does not read: {threshold}"))?;
    let cds = key.cds(ttl).ok_or_else(|| anyhow!("the threshold key's DS"))?;
    Ok(vec![cds, key.cdnskey(ttl)])
}

/// The key-signing keys at the apex of `zone` in zone text.
pub fn apex_ksks(text: &str, zone: &str) -> Vec<Dnskey> {
    let apex = crate::adopted::absolute_name(zone);
    let mut out: Vec<Dnskey> = text.lines().filter_map(Dnskey::parse).filter(|k| k.owner == apex && k.is_ksk()).collect();
    out.dedup();
    out
}

/// Record types only a signed zone holds, and named's private signing-state records
/// (TYPE65534): none of them is carried into the adopted zone as data.
const SIGNED_ONLY: [&str; 8] = ["DNSKEY", "RRSIG", "NSEC", "NSEC3", "NSEC3PARAM", "CDS", "CDNSKEY", "TYPE65534"];

/// The zone text (one record per line) without DNSSEC records.
pub fn strip_signed(text: &str) -> String {
    text.lines()
        .filter(|l| !l.split_whitespace().nth(3).is_some_and(|t| SIGNED_ONLY.iter().any(|s| t.eq_ignore_ascii_case(s))))
        .flat_map(|l| [l, "\n"])
        .collect()
}

/// The RRSIG record line's covered type and key tag (`owner ttl class RRSIG covered alg
/// labels origttl expiration inception tag signer sig...`).
fn rrsig_fields(fields: &[&str]) -> Option<(String, u16)> {
    if fields.len() < 13 || !fields[3].eq_ignore_ascii_case("RRSIG") {
        return None;
    }
    Some((fields[4].to_ascii_uppercase(), fields[10].parse().ok()?))
}

/// The files of the operator's private key `stem` in `key_dir`.
pub fn key_files(key_dir: &Path, stem: &str) -> Result<(PathBuf, PathBuf)> {
    let (public, private) = (key_dir.join(format!("{stem}.key")), key_dir.join(format!("{stem}.private")));
    for f in [&public, &private] {
        if !f.is_file() {
            bail!("the operator's KSK file {} is not there (give the key directory with --key-dir)", f.display());
        }
    }
    Ok((public, private))
}

/// Signatures over the apex RRsets in `records` (zone-file lines: the DNSKEY RRset, and
/// the CDS and CDNSKEY RRsets, each with one TTL) made with the operator's key `ksk`, whose
/// files are in `key_dir`, by the operator's dnssec-signzone, valid from `inception` to
/// `expiration` (seconds since the epoch); one RRSIG line per type, DNSKEY's first. The key
/// files are copied to the scratch directory `work` (removed after): nothing is written
/// beside the operator's keys.
#[allow(clippy::too_many_arguments)]
pub fn sign_apex_rrsets(
    signzone: &Path,
    zone: &str,
    soa: &str,
    records: &[String],
    ksk: &Dnskey,
    key_dir: &Path,
    (inception, expiration): (u64, u64),
    work: &Path,
) -> Result<Vec<String>> {
    let stem = ksk.file_stem().ok_or_else(|| anyhow!("the operator's KSK is not base64"))?;
    let (public, private) = key_files(key_dir, &stem)?;
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let result = sign_in(signzone, zone, soa, records, ksk, &stem, (&public, &private), (inception, expiration), work);
    let _ = std::fs::remove_dir_all(work);
    result
}

#[allow(clippy::too_many_arguments)]
fn sign_in(
    signzone: &Path,
    zone: &str,
    soa: &str,
    records: &[String],
    ksk: &Dnskey,
    stem: &str,
    (public, private): (&Path, &Path),
    (inception, expiration): (u64, u64),
    work: &Path,
) -> Result<Vec<String>> {
    std::fs::copy(public, work.join(format!("{stem}.key"))).with_context(|| format!("reading {}", public.display()))?;
    std::fs::copy(private, work.join(format!("{stem}.private"))).with_context(|| format!("reading {}", private.display()))?;
    let input = work.join("dnskey.zone");
    let output = work.join("dnskey.signed");
    let mut text = format!("{soa}\n");
    for k in records {
        text.push_str(k);
        text.push('\n');
    }
    std::fs::write(&input, text)?;
    let stamp = |t: u64| named_glue::time::format_timestamp(t);
    let done = Command::new(signzone)
        .env_remove(named_glue::SIGNER_SOCKET_ENV)
        .current_dir(work)
        // -z: with no ZSK at hand, the KSK signs the scratch zone's SOA and NSECs too.
        .args(["-q", "-z", "-O", "full", "-K"])
        .arg(work)
        .args(["-s", &stamp(inception), "-e", &stamp(expiration), "-o", zone, "-f"])
        .arg(&output)
        .arg(&input)
        .arg(work.join(format!("{stem}.key")))
        .output()
        .with_context(|| format!("running {}", signzone.display()))?;
    if !done.status.success() {
        bail!(
            "{} could not sign the DNSKEY RRset with your KSK:\n{}{}",
            signzone.display(),
            String::from_utf8_lossy(&done.stdout),
            String::from_utf8_lossy(&done.stderr)
        );
    }
    let signed = std::fs::read_to_string(&output)?;
    let tag = ksk.key_tag().unwrap_or(0);
    let mut types: Vec<String> = Vec::new();
    for r in records {
        if let Some(t) = r.split_whitespace().nth(3).map(str::to_ascii_uppercase) {
            if !types.contains(&t) {
                types.push(t);
            }
        }
    }
    types
        .iter()
        .map(|t| {
            signed
                .lines()
                .find(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    matches!(rrsig_fields(&f), Some((covered, k)) if covered == *t && k == tag)
                })
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .ok_or_else(|| anyhow!("{} made no signature over the {t} RRset with key {tag}", signzone.display()))
        })
        .collect()
}

/// The records the adoption adds to the zone for the rollover: the operator's KSK (with the
/// DNSKEY RRset's TTL), the CDS and CDNSKEY records `cds` for the threshold key, the
/// operator's KSK's signatures `rrsigs` over the DNSKEY, CDS and CDNSKEY RRsets, and the
/// marker.
pub fn rollover_records(zone: &str, ksk: &Dnskey, ttl: u32, cds: &[String], rrsigs: &[String]) -> String {
    let tag = ksk.key_tag().unwrap_or(0);
    let mut out = format!("{}\n", ksk.record(ttl));
    for line in cds.iter().chain(rrsigs) {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&format!(
        "{} {ttl} IN TXT \"sdns: the DNSKEY RRset keeps the old KSK {tag} until this record is deleted and the zone signed\"\n",
        marker_name(zone)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // An RSA public key field (e = 65537, a short made-up modulus).
    const KEY: &str = "AwEAAcMnWBKLuvG/LwnPVykcmpvnntwxfshHlHRhlY0F3oz8AMcuF8gw9McCw+BoC2YxWaiTpNPuxjSNhUlBtcbqXFj+rbR6DkymPPHPe9Y4+Xk6ah0m2HHVVFZJjNlH8Q==";

    fn ksk() -> Dnskey {
        Dnskey::parse(&format!("signed.test. 600 IN DNSKEY 257 3 8 {KEY}")).unwrap()
    }

    #[test]
    fn dnskey_lines_parse_with_their_tag_and_ds() {
        let k = ksk();
        assert!(k.is_ksk());
        assert_eq!((k.owner.as_str(), k.ttl, k.flags, k.algorithm), ("signed.test.", 600, 257, 8));
        let rdata = k.rdata().unwrap();
        assert_eq!(&rdata[..4], &[1, 1, 3, 8]);
        let tag = named_glue::keys::key_tag(&rdata);
        assert_eq!(k.key_tag(), Some(tag));
        assert_eq!(k.file_stem().unwrap(), format!("Ksigned.test.+008+{tag:05}"));
        // The key field split by spaces, as some styles print it, is the same key.
        let (a, b) = KEY.split_at(20);
        assert_eq!(Dnskey::parse(&format!("signed.test. 600 IN DNSKEY 257 3 8 {a} {b}")).unwrap(), k);
        let ds = k.ds().unwrap();
        assert!(ds.starts_with(&format!("signed.test. IN DS {tag} 8 2 ")), "{ds}");
        assert_eq!(ds.split_whitespace().last().unwrap().len(), 64);
        // A ZSK, a revoked key and other types are not KSKs.
        let zsk = Dnskey::parse(&format!("signed.test. 600 IN DNSKEY 256 3 8 {KEY}")).unwrap();
        assert!(!zsk.is_ksk());
        assert!(!Dnskey::parse(&format!("signed.test. 600 IN DNSKEY 385 3 8 {KEY}")).unwrap().is_ksk());
        assert!(Dnskey::parse("signed.test. 600 IN TXT \"DNSKEY 257 3 8 x\"").is_none());
    }

    /// BIND's `dnssec-policy default` CSK (algorithm 13) and an Ed25519 key parse as RSA keys
    /// do; their tag, DS and record are those of named-glue's zone key of the same field.
    #[test]
    fn ec_dnskeys_parse_with_their_tag_and_ds() {
        const KEY13: &str = "mdsswUyr3DPW132mOi8V9xESWE8jTo0dxCjjnopKl+GqJxpVXckHAeF+KkxLbxILfDLUT0rAK9iUzy1L53eKGQ==";
        const KEY15: &str = "l02Woi0iS8Aa25FQkUd9RMzZHJpBoRQwAQEX1SxZJA4=";
        for (alg, key) in [(13u8, KEY13), (15, KEY15)] {
            let k = Dnskey::parse(&format!("signed.test. 3600 IN DNSKEY 257 3 {alg} {key}")).unwrap();
            assert!(k.is_ksk());
            let field = base64::engine::general_purpose::STANDARD.decode(key).unwrap();
            let zone = hickory_proto::rr::Name::from_ascii("signed.test.").unwrap();
            let expected = named_glue::keys::ZoneKey::from_dnskey_field(&zone, alg, field, 3600).unwrap();
            assert_eq!(k.key_tag(), Some(expected.key_tag()));
            assert_eq!(k.rdata().unwrap(), expected.rdata());
            assert_eq!(k.ds().unwrap(), expected.ds_record());
            assert_eq!(k.record(3600), expected.dnskey_record());
            assert_eq!(k.file_stem().unwrap(), expected.file_stem());
        }
    }

    #[test]
    fn apex_ksks_are_found_and_dnssec_records_stripped() {
        let text = format!(
            "signed.test. 600 IN SOA ns.signed.test. h.signed.test. 1 3600 900 604800 300\n\
             signed.test. 600 IN DNSKEY 256 3 8 {KEY}\n\
             signed.test. 600 IN DNSKEY 257 3 8 {KEY}\n\
             sub.signed.test. 600 IN DNSKEY 257 3 8 {KEY}\n\
             signed.test. 600 IN RRSIG DNSKEY 8 2 600 20300101000000 20200101000000 1234 signed.test. AAAA\n\
             signed.test. 0 IN TYPE65534 \\# 5 08B6200000\n\
             signed.test. 600 IN NSEC www.signed.test. SOA RRSIG NSEC DNSKEY\n\
             www.signed.test. 600 IN A 192.0.2.1\n"
        );
        assert_eq!(apex_ksks(&text, "Signed.Test"), vec![ksk()]);
        let s = strip_signed(&text);
        assert_eq!(s.lines().count(), 2, "{s}");
        assert!(s.contains(" SOA ") && s.contains(" A 192.0.2.1"));
    }

    #[test]
    fn the_rollover_records_are_the_old_key_the_cds_their_signatures_and_the_marker() {
        let rrsig = "signed.test. 3600 IN RRSIG DNSKEY 8 2 3600 20300101000000 20200101000000 4242 signed.test. AAAA";
        let cds_sig = "signed.test. 3600 IN RRSIG CDS 8 2 3600 20300101000000 20200101000000 4242 signed.test. AAAA";
        let threshold = format!("signed.test. 3600 IN DNSKEY 257 3 8 {KEY}");
        let cds = cds_records(&threshold, 3600).unwrap();
        let text = rollover_records("signed.test", &ksk(), 3600, &cds, &[rrsig.to_string(), cds_sig.to_string()]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6);
        assert_eq!(Dnskey::parse(lines[0]).unwrap(), Dnskey { ttl: 3600, ..ksk() }, "the RRset's TTL, which the signature covers");
        // The CDS is the DS the parent is asked for: the one `ds` gives, with the TTL.
        let ds = ksk().ds().unwrap();
        assert_eq!(lines[1], ds.replacen(" IN DS ", " 3600 IN CDS ", 1));
        assert_eq!(lines[2], format!("signed.test. 3600 IN CDNSKEY 257 3 8 {KEY}"));
        assert_eq!((lines[3], lines[4]), (rrsig, cds_sig));
        assert!(lines[5].starts_with("_sdns-rollover.signed.test. 3600 IN TXT \""), "{}", lines[5]);
        assert!(cds_records("signed.test. 3600 IN TXT x", 3600).is_err());
    }
}
