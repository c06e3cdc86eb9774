//! Cluster PKI: the dealer creates one CA per cluster and one certificate per replica.
//!
//! A replica certificate binds its replica id as the single DNS subject alternative name
//! `replica-<id>.sdns.invalid` (the `.invalid` TLD can never resolve, so the name is only an
//! identity). The mesh maps an authenticated peer certificate back to the id with
//! [`replica_id_from_cert_der`]; a certificate that names no replica, or more than one, is
//! rejected. Keys are ECDSA P-256.

use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};

use crate::error::{PeerError, TransportError};

/// Domain under which replica identities are named.
pub const REPLICA_NAME_SUFFIX: &str = ".sdns.invalid";
const REPLICA_NAME_PREFIX: &str = "replica-";
/// Validity of generated certificates, in years from now (the cluster is re-dealt to rotate).
const VALIDITY_YEARS: i32 = 20;

/// The cluster CA: its certificate (distributed to every replica) and its signing key (kept by
/// the dealer only).
#[derive(Clone)]
pub struct CaBundle {
    pub cert_pem: String,
    pub key_pem: String,
}

/// One replica's certificate and private key.
#[derive(Clone)]
pub struct ReplicaCert {
    pub replica_id: u16,
    pub cert_pem: String,
    pub key_pem: String,
}

// Keys must not end up in logs through a stray `{:?}`.
impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle").field("key_pem", &"<redacted>").finish_non_exhaustive()
    }
}
impl std::fmt::Debug for ReplicaCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaCert").field("replica_id", &self.replica_id).field("key_pem", &"<redacted>").finish_non_exhaustive()
    }
}

/// The DNS name a replica's certificate carries, and that a dialer expects from it.
pub fn replica_dns_name(replica_id: u16) -> String {
    format!("{REPLICA_NAME_PREFIX}{replica_id}{REPLICA_NAME_SUFFIX}")
}

/// Parses `replica-<id>.sdns.invalid` (canonical decimal only, so one id has one name).
pub fn parse_replica_dns_name(name: &str) -> Option<u16> {
    let digits = name.strip_prefix(REPLICA_NAME_PREFIX)?.strip_suffix(REPLICA_NAME_SUFFIX)?;
    let canonical = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && (digits == "0" || !digits.starts_with('0'));
    if !canonical {
        return None;
    }
    digits.parse().ok()
}

fn current_year() -> i32 {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    // Mean Gregorian year; a day off at a year boundary does not matter for the window below.
    1970 + (secs / 31_556_952) as i32
}

fn set_validity(params: &mut CertificateParams) {
    let year = current_year();
    // Start a year back so replicas with skewed clocks still accept the certificate.
    params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + VALIDITY_YEARS, 1, 1);
}

fn gen_err(e: rcgen::Error) -> TransportError {
    TransportError::CertGen(e.to_string())
}

fn ca_params(cluster_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, format!("sdns cluster CA {cluster_name}"));
    params.distinguished_name.push(DnType::OrganizationName, cluster_name.to_string());
    // Path length 0: the CA signs replica certificates only, never other CAs.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    set_validity(&mut params);
    params
}

/// Creates a fresh cluster CA (ECDSA P-256, self-signed).
pub fn generate_ca(cluster_name: &str) -> Result<CaBundle, TransportError> {
    if cluster_name.is_empty() {
        return Err(TransportError::Config { field: "cluster_name", reason: "empty".into() });
    }
    let key = KeyPair::generate().map_err(gen_err)?;
    let cert = ca_params(cluster_name).self_signed(&key).map_err(gen_err)?;
    Ok(CaBundle { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// Issues the certificate of replica `replica_id`, signed by the cluster CA. It is valid for
/// both TLS roles because every replica both dials and accepts.
pub fn issue_replica_cert(ca: &CaBundle, replica_id: u16) -> Result<ReplicaCert, TransportError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|e| TransportError::Pem { what: "CA key", reason: e.to_string() })?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(|e| TransportError::Pem { what: "CA certificate", reason: e.to_string() })?;
    let name = replica_dns_name(replica_id);
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name.clone());
    params.subject_alt_names = vec![SanType::DnsName(name.try_into().map_err(gen_err)?)];
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params);
    let key = KeyPair::generate().map_err(gen_err)?;
    let cert = params.signed_by(&key, &issuer).map_err(gen_err)?;
    Ok(ReplicaCert { replica_id, cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// The replica id bound into a certificate: its subject alternative names must contain exactly
/// one `replica-<id>.sdns.invalid` name. Call this only on a certificate whose chain to the
/// cluster CA has been verified; the function itself checks no signature.
pub fn replica_id_from_cert_der(der: &[u8]) -> Result<u16, PeerError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| PeerError::BadIdentity(format!("unparsable certificate: {e}")))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| PeerError::BadIdentity(format!("bad subjectAltName: {e}")))?
        .ok_or_else(|| PeerError::BadIdentity("no subjectAltName".into()))?;
    let mut ids = san.value.general_names.iter().filter_map(|name| match name {
        x509_parser::extensions::GeneralName::DNSName(dns) => parse_replica_dns_name(dns),
        _ => None,
    });
    match (ids.next(), ids.next()) {
        (Some(id), None) => Ok(id),
        (None, _) => Err(PeerError::BadIdentity("no replica name".into())),
        (Some(a), Some(b)) => Err(PeerError::BadIdentity(format!("names replicas {a} and {b}"))),
    }
}

/// Writes the dealer's output for a cluster of `n` replicas into `dir`: `ca.pem`, `ca.key`,
/// and `replica-<i>.pem` / `replica-<i>.key` for i in 0..n. Key files are created mode 0600.
pub fn write_cluster_pki(dir: &Path, cluster_name: &str, n: u16) -> Result<(), TransportError> {
    let io_err = |source| TransportError::Io { during: "writing PKI files", source };
    std::fs::create_dir_all(dir).map_err(io_err)?;
    let ca = generate_ca(cluster_name)?;
    write_file(&dir.join("ca.pem"), &ca.cert_pem, false).map_err(io_err)?;
    write_file(&dir.join("ca.key"), &ca.key_pem, true).map_err(io_err)?;
    for id in 0..n {
        let cert = issue_replica_cert(&ca, id)?;
        write_file(&dir.join(format!("replica-{id}.pem")), &cert.cert_pem, false).map_err(io_err)?;
        write_file(&dir.join(format!("replica-{id}.key")), &cert.key_pem, true).map_err(io_err)?;
    }
    Ok(())
}

fn write_file(path: &Path, contents: &str, secret: bool) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    let mut file = options.open(path)?;
    // A pre-existing file keeps its old mode under `open`; tighten it explicitly.
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    file.write_all(contents.as_bytes())
}

/// The DER of the first certificate in `pem`.
pub fn cert_der_from_pem(pem: &str) -> Result<Vec<u8>, TransportError> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .map(|c| c.to_vec())
        .map_err(|e| TransportError::Pem { what: "certificate", reason: e.to_string() })
}

/// Signs `msg` with a replica's identity key (the PEM key of its mesh certificate): ECDSA
/// P-256 with SHA-256, ASN.1 DER. Messages signed this way must start with a label of
/// their own, so that no signature is ever valid in two contexts.
pub fn sign_as_replica(key_pem: &str, msg: &[u8]) -> Result<Vec<u8>, TransportError> {
    use rcgen::SigningKey as _;
    let key = KeyPair::from_pem(key_pem).map_err(|e| TransportError::Pem { what: "replica key", reason: e.to_string() })?;
    key.sign(msg).map_err(|e| TransportError::Tls(format!("signing with the replica key: {e}")))
}

/// Checks a signature made with [`sign_as_replica`] and returns the replica it proves:
/// `cert_der` must chain to the cluster CA (`ca_der`) with the usages the mesh requires,
/// valid at `time_s` (seconds since the epoch; pass an agreed time where every replica must
/// decide alike: nothing here reads a clock), name exactly one replica, and its key must
/// have signed `msg`. The same identity the mesh authenticates, so no replica can sign for
/// another.
pub fn verify_replica_signature(ca_der: &[u8], cert_der: &[u8], time_s: u64, msg: &[u8], signature: &[u8]) -> Result<u16, PeerError> {
    use rustls_pki_types::{CertificateDer, UnixTime};
    let bad = |what: &str, e: webpki::Error| PeerError::NotProven(format!("{what}: {e:?}"));
    let ca = CertificateDer::from(ca_der);
    let anchor = webpki::anchor_from_trusted_cert(&ca).map_err(|e| bad("cluster CA", e))?;
    let cert = CertificateDer::from(cert_der);
    let end = webpki::EndEntityCert::try_from(&cert).map_err(|e| bad("replica certificate", e))?;
    end.verify_for_usage(
        &[webpki::ring::ECDSA_P256_SHA256],
        &[anchor],
        &[],
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(time_s)),
        webpki::KeyUsage::client_auth(),
        None,
        None,
    )
    .map_err(|e| bad("replica certificate not issued by the cluster CA", e))?;
    let id = replica_id_from_cert_der(cert_der)?;
    end.verify_signature(webpki::ring::ECDSA_P256_SHA256, msg, signature).map_err(|e| bad("signature", e))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_names_round_trip_and_reject_non_canonical() {
        for id in [0u16, 1, 9, 10, 65535] {
            assert_eq!(parse_replica_dns_name(&replica_dns_name(id)), Some(id));
        }
        for bad in [
            "replica-.sdns.invalid",
            "replica-01.sdns.invalid",
            "replica-65536.sdns.invalid",
            "replica-1.sdns.invalid.",
            "replica-+1.sdns.invalid",
            "replica-1.other.invalid",
            "x",
        ] {
            assert_eq!(parse_replica_dns_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn issued_certificate_binds_the_replica_id() {
        let ca = generate_ca("test").unwrap();
        let cert = issue_replica_cert(&ca, 7).unwrap();
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(cert.cert_pem.as_bytes()).map(|c: rustls_pki_types::CertificateDer<'static>| c).unwrap();
        assert_eq!(replica_id_from_cert_der(&der), Ok(7));
        // The CA certificate names no replica.
        let ca_der: rustls_pki_types::CertificateDer<'static> = rustls_pki_types::pem::PemObject::from_pem_slice(ca.cert_pem.as_bytes()).unwrap();
        assert!(replica_id_from_cert_der(&ca_der).is_err());
        assert!(replica_id_from_cert_der(b"garbage").is_err());
    }

    #[test]
    fn replica_signatures_prove_the_signer_and_nothing_else() {
        let ca = generate_ca("test").unwrap();
        let ca_der = cert_der_from_pem(&ca.cert_pem).unwrap();
        let r3 = issue_replica_cert(&ca, 3).unwrap();
        let der3 = cert_der_from_pem(&r3.cert_pem).unwrap();
        let now = 1_800_000_000;
        let sig = sign_as_replica(&r3.key_pem, b"label: message").unwrap();
        assert_eq!(verify_replica_signature(&ca_der, &der3, now, b"label: message", &sig), Ok(3));
        assert!(verify_replica_signature(&ca_der, &der3, now, b"label: other", &sig).is_err());
        let mut flipped = sig.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(verify_replica_signature(&ca_der, &der3, now, b"label: message", &flipped).is_err());
        // Replica 1's key does not sign for replica 3's certificate.
        let r1 = issue_replica_cert(&ca, 1).unwrap();
        let sig1 = sign_as_replica(&r1.key_pem, b"label: message").unwrap();
        assert!(verify_replica_signature(&ca_der, &der3, now, b"label: message", &sig1).is_err());
        // A certificate for "replica 3" from another CA does not count.
        let other = generate_ca("other").unwrap();
        let fake = issue_replica_cert(&other, 3).unwrap();
        let fake_der = cert_der_from_pem(&fake.cert_pem).unwrap();
        let fake_sig = sign_as_replica(&fake.key_pem, b"label: message").unwrap();
        assert!(verify_replica_signature(&ca_der, &fake_der, now, b"label: message", &fake_sig).is_err());
        // Judged at the time given, not the clock: long after the certificate expired, it fails.
        assert!(verify_replica_signature(&ca_der, &der3, now + 100 * 31_556_952, b"label: message", &sig).is_err());
        assert!(verify_replica_signature(&ca_der, b"garbage", now, b"label: message", &sig).is_err());
    }
}
