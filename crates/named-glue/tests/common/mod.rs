//! Harness for tests against the real patched named: one replica = a temp
//! dir, key files, a signing service with a test signer (threshold RSA with
//! one share, or a local ECDSA P-256 / Ed25519 key), a signed zone and a
//! supervised named on a free loopback port.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::rr::Name;
use named_glue::conf::{check_conf, NamedConf, TsigKey};
use named_glue::keys::{ZoneKey, ALG_ECDSAP256SHA256, ALG_ED25519, ALG_RSASHA256};
use named_glue::signer::{ServiceLimits, SignError, SignFuture, SignRequest, SignatureTimes, Signer, SigningService, TimeSource};
use named_glue::signzone::sign_zone_file;
use named_glue::supervisor::{NamedSpec, Supervisor};
use named_glue::tools::BindTools;

pub const ZONE: &str = "example.test.";
pub const VALIDITY_DAYS: u32 = 30;

/// The build under test; fails the test (never skips) when it is missing.
pub fn tools() -> BindTools {
    match BindTools::locate() {
        Ok(t) => t,
        Err(e) => panic!("{e}\nThe named-glue tests need the patched BIND: run patches/bind9/build.sh first."),
    }
}

pub fn zone() -> Name {
    Name::from_ascii(ZONE).unwrap()
}

/// A single-replica signer (n = 1, k = 1): Shoup threshold RSA with one
/// share, combined and checked exactly as the wrapper does with t+1 shares.
pub struct RsaSigner {
    pub public: shoup_rsa::PublicKey,
    pub share: shoup_rsa::KeyShare,
    pub key_tag: u16,
    /// Signatures made so far.
    pub signed: std::sync::atomic::AtomicU64,
}

/// One 1024-bit key per test binary: safe-prime search is the slow part.
static KEY: std::sync::OnceLock<(shoup_rsa::PublicKey, Vec<shoup_rsa::KeyShare>)> = std::sync::OnceLock::new();

impl RsaSigner {
    pub fn generate() -> (Arc<RsaSigner>, ZoneKey) {
        let (public, shares) = KEY
            .get_or_init(|| {
                use rand_core::SeedableRng;
                let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(0x5d45_0004);
                shoup_rsa::generate(1024, 1, 1, &mut rng, &mut |_| {}).unwrap()
            })
            .clone();
        let zone_key = ZoneKey::rsa(&zone(), ALG_RSASHA256, &public.public_exponent().to_be_bytes(), &public.modulus().to_bytes_be(), 3600).unwrap();
        // The glue's DNSKEY encoding agrees with shoup-rsa's.
        assert_eq!(zone_key.rdata(), public.dnskey_rdata(257, ALG_RSASHA256).unwrap());
        assert_eq!(zone_key.key_tag(), public.key_tag(257, ALG_RSASHA256).unwrap());
        let share = shares.into_iter().next().unwrap();
        (Arc::new(RsaSigner { public, share, key_tag: zone_key.key_tag(), signed: Default::default() }), zone_key)
    }

    fn sign_now(&self, request: &SignRequest) -> Result<Vec<u8>, SignError> {
        if request.key_tag != self.key_tag {
            return Err(SignError::UnknownKey { algorithm: request.algorithm, key_tag: request.key_tag });
        }
        let alg =
            shoup_rsa::HashAlg::from_dnssec_alg(request.algorithm).ok_or(SignError::UnknownKey { algorithm: request.algorithm, key_tag: request.key_tag })?;
        let fail = |e: &dyn std::fmt::Display| SignError::Failed(e.to_string());
        let message = self.public.encode_message(alg, &request.data).map_err(|e| fail(&e))?;
        let share = self.share.sign(&self.public, &message).map_err(|e| fail(&e))?;
        let signature = self.public.combine(&message, &[share]).map_err(|e| fail(&e))?;
        if !self.public.verify(&message, &signature) {
            return Err(SignError::Failed("combined signature does not verify".into()));
        }
        self.signed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(signature.into_bytes())
    }

    pub fn signed(&self) -> u64 {
        self.signed.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Signer for RsaSigner {
    fn sign(&self, request: SignRequest) -> SignFuture {
        let result = self.sign_now(&request);
        Box::pin(async move { result })
    }
}

/// The local key of an [`EcSigner`].
enum LocalKey {
    P256(ring::signature::EcdsaKeyPair),
    Ed25519(ring::signature::Ed25519KeyPair),
}

/// A signer for algorithm 13 or 15 holding an ordinary local key: what the threshold
/// signers produce together, one party computes here, in the same wire form (r || s for
/// ECDSA, RFC 8032 for Ed25519). It checks each signature before answering, as the wrapper
/// must, and can be told to answer with signatures of a wrong length.
pub struct EcSigner {
    key: LocalKey,
    /// The DNSKEY public key field: x || y, or the Ed25519 key.
    pub public: Vec<u8>,
    pub algorithm: u8,
    pub key_tag: u16,
    signed: std::sync::atomic::AtomicU64,
    /// When set: (good signatures still to make, then the length of every later one).
    wrong_length: Mutex<Option<(u64, usize)>>,
}

impl EcSigner {
    /// A fresh key of `algorithm` (13 or 15) for the test zone, with its zone key.
    pub fn generate(algorithm: u8) -> (Arc<EcSigner>, ZoneKey) {
        use ring::signature::KeyPair;
        let rng = ring::rand::SystemRandom::new();
        let (key, public) = match algorithm {
            ALG_ECDSAP256SHA256 => {
                let alg = &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING;
                let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
                let pair = ring::signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
                // SEC 1 uncompressed: 0x04 || x || y; the DNSKEY holds x || y.
                let sec1 = pair.public_key().as_ref().to_vec();
                assert_eq!((sec1.len(), sec1[0]), (65, 4));
                (LocalKey::P256(pair), sec1[1..].to_vec())
            }
            ALG_ED25519 => {
                let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
                let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
                let public = pair.public_key().as_ref().to_vec();
                (LocalKey::Ed25519(pair), public)
            }
            other => panic!("no EC test signer for algorithm {other}"),
        };
        let zone_key = match algorithm {
            ALG_ECDSAP256SHA256 => ZoneKey::ecdsa_p256(&zone(), &public, 3600).unwrap(),
            _ => ZoneKey::ed25519(&zone(), &public, 3600).unwrap(),
        };
        let signer = EcSigner { key, public, algorithm, key_tag: zone_key.key_tag(), signed: Default::default(), wrong_length: Mutex::new(None) };
        (Arc::new(signer), zone_key)
    }

    /// From now on: `good` more correct signatures, then only signatures of `len` bytes.
    pub fn answer_wrong_length_after(&self, good: u64, len: usize) {
        *self.wrong_length.lock().unwrap() = Some((good, len));
    }

    /// Correct signatures again.
    pub fn answer_correctly(&self) {
        *self.wrong_length.lock().unwrap() = None;
    }

    /// Checks a signature as a validator would.
    pub fn verify(&self, data: &[u8], signature: &[u8]) -> bool {
        use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, ED25519};
        match self.key {
            LocalKey::P256(_) => {
                let sec1: Vec<u8> = std::iter::once(4).chain(self.public.iter().copied()).collect();
                UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, sec1).verify(data, signature).is_ok()
            }
            LocalKey::Ed25519(_) => UnparsedPublicKey::new(&ED25519, &self.public).verify(data, signature).is_ok(),
        }
    }

    fn sign_now(&self, request: &SignRequest) -> Result<Vec<u8>, SignError> {
        if (request.algorithm, request.key_tag) != (self.algorithm, self.key_tag) {
            return Err(SignError::UnknownKey { algorithm: request.algorithm, key_tag: request.key_tag });
        }
        let signature = match &self.key {
            LocalKey::P256(pair) => {
                pair.sign(&ring::rand::SystemRandom::new(), &request.data).map_err(|_| SignError::Failed("ECDSA signing".into()))?.as_ref().to_vec()
            }
            LocalKey::Ed25519(pair) => pair.sign(&request.data).as_ref().to_vec(),
        };
        if signature.len() != named_glue::keys::EC_SIGNATURE_LEN || !self.verify(&request.data, &signature) {
            return Err(SignError::Failed("signature does not verify".into()));
        }
        self.signed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut wrong = self.wrong_length.lock().unwrap();
        match wrong.as_mut() {
            Some((0, len)) => Ok(signature.iter().copied().cycle().take(*len).collect()),
            Some((good, _)) => {
                *good -= 1;
                Ok(signature)
            }
            None => Ok(signature),
        }
    }

    /// Signing requests answered so far (wrong-length answers included).
    pub fn signed(&self) -> u64 {
        self.signed.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Signer for EcSigner {
    fn sign(&self, request: SignRequest) -> SignFuture {
        let result = self.sign_now(&request);
        Box::pin(async move { result })
    }
}

/// A port free on 127.0.0.1 for both UDP and TCP (at the time of asking).
pub fn free_port() -> u16 {
    for _ in 0..100 {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port");
}

pub const UNSIGNED_ZONE: &str = "$TTL 300
@ IN SOA ns1.example.test. hostmaster.example.test. 1 3600 600 86400 300
@ IN NS ns1.example.test.
ns1 IN A 127.0.0.1
www IN A 192.0.2.1
mail IN MX 10 www.example.test.
";

/// Agreed times shared by the test and the signing service.
#[derive(Clone, Default)]
pub struct Times(pub Arc<Mutex<Option<SignatureTimes>>>);

impl Times {
    pub fn set_agreed(&self, t: u32) {
        *self.0.lock().unwrap() = Some(SignatureTimes::from_agreed(t, VALIDITY_DAYS * 86_400));
    }
    pub fn source(&self) -> TimeSource {
        let inner = self.0.clone();
        Arc::new(move || *inner.lock().unwrap())
    }
}

/// One replica; its signer is threshold RSA unless a test gives another.
pub struct Replica<S: Signer = RsaSigner> {
    pub dir: tempfile::TempDir,
    pub tools: BindTools,
    pub port: u16,
    pub socket: PathBuf,
    pub service: Option<SigningService>,
    pub named: Option<Supervisor>,
    pub tsig_file: PathBuf,
    pub key: ZoneKey,
    pub times: Times,
    pub signer: Arc<S>,
}

pub fn tsig() -> TsigKey {
    TsigKey::hmac_sha256("update-key", (1..=32).collect())
}

impl<S: Signer> Replica<S> {
    /// Signs the zone at agreed time `t0` and starts named.
    pub async fn start(signer: Arc<S>, key: ZoneKey, t0: u32, signer_resend_ms: Option<u32>) -> Replica<S> {
        let tools = tools();
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let key_dir = base.join("keys");
        std::fs::create_dir(&key_dir).unwrap();
        key.write_files(&key_dir, named_glue::time::unix_now() - 86_400).unwrap();
        let socket = base.join("run/signer.sock");
        let times = Times::default();
        times.set_agreed(t0);
        let service = SigningService::bind(&socket, signer.clone(), times.source(), ServiceLimits::default()).unwrap();

        let unsigned = base.join("zone.unsigned");
        std::fs::write(&unsigned, UNSIGNED_ZONE).unwrap();
        let port = free_port();
        let tsig = tsig();
        let conf = NamedConf::new(base, port, &zone(), vec![tsig.clone()]);
        sign_zone_file(
            &tools,
            &zone(),
            &unsigned,
            &conf.zones[0].zone_file,
            &key_dir,
            &key,
            &socket,
            SignatureTimes::from_agreed(t0, VALIDITY_DAYS * 86_400),
            1,
        )
        .await
        .unwrap();
        let conf_path = base.join("named.conf");
        conf.write(&conf_path).unwrap();
        check_conf(&tools, &conf_path).unwrap();
        let tsig_file = base.join("update-key.conf");
        tsig.write_key_file(&tsig_file).unwrap();

        let mut spec = NamedSpec::new(tools.named(), conf_path, port, zone(), base.join("named.log"));
        spec.signer_socket = Some(socket.clone());
        spec.signer_resend_ms = signer_resend_ms;
        spec.stop_grace = Duration::from_secs(3);
        let named = match Supervisor::start(spec).await {
            Ok(n) => n,
            Err(e) => panic!("{e}\n{}", std::fs::read_to_string(base.join("named.log")).unwrap_or_default()),
        };
        Replica { dir, tools, port, socket, service: Some(service), named: Some(named), tsig_file, key, times, signer }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("named.log")).unwrap_or_default()
    }

    /// Runs nsupdate -k (over TCP, patient) in a task of its own: for an update that
    /// waits for its signatures while the test changes the signer.
    pub fn nsupdate_in_background(&self, lines: &[&str]) -> tokio::task::JoinHandle<Output> {
        let mut script = format!("server 127.0.0.1 {}\nzone {ZONE}\n", self.port);
        for l in lines {
            script.push_str(l);
            script.push('\n');
        }
        script.push_str("send\n");
        let mut cmd = tokio::process::Command::new(self.tools.bin("nsupdate"));
        cmd.arg("-v").arg("-k").arg(&self.tsig_file).args(["-t", "120"]);
        tokio::spawn(async move {
            let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true).spawn().unwrap();
            use tokio::io::AsyncWriteExt;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(script.as_bytes()).await.unwrap();
            drop(stdin);
            tokio::time::timeout(Duration::from_secs(150), child.wait_with_output()).await.unwrap().unwrap()
        })
    }

    /// Runs nsupdate -k with the given update lines; returns its output.
    pub async fn nsupdate(&self, lines: &[&str]) -> Output {
        let mut script = format!("server 127.0.0.1 {}\nzone {ZONE}\n", self.port);
        for l in lines {
            script.push_str(l);
            script.push('\n');
        }
        script.push_str("send\n");
        let mut child = tokio::process::Command::new(self.tools.bin("nsupdate"))
            .arg("-k")
            .arg(&self.tsig_file)
            .args(["-t", "20"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(script.as_bytes()).await.unwrap();
        drop(stdin);
        tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await.unwrap().unwrap()
    }

    /// The zone by AXFR (dig), records only, in transfer order.
    pub async fn axfr(&self) -> String {
        let out = self.dig(&[ZONE, "AXFR", "+nocomments", "+nostats", "+nocmd"]).await;
        assert!(out.status.success(), "dig axfr failed: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(!text.contains("Transfer failed"), "{text}");
        text.lines().filter(|l| !l.starts_with(';') && !l.trim().is_empty()).map(|l| format!("{l}\n")).collect()
    }

    pub async fn dig(&self, args: &[&str]) -> Output {
        let out =
            tokio::process::Command::new(self.tools.bin("dig")).arg("@127.0.0.1").args(["-p", &self.port.to_string()]).args(args).kill_on_drop(true).output();
        tokio::time::timeout(Duration::from_secs(30), out).await.unwrap().unwrap()
    }

    /// Writes the AXFR to a file and runs dnssec-verify on it.
    pub fn verify_zone(&self, axfr: &str) -> Output {
        let file = self.path().join("axfr.db");
        std::fs::write(&file, axfr).unwrap();
        Command::new(self.tools.bin("dnssec-verify")).args(["-z", "-o", ZONE]).arg(&file).output().unwrap()
    }

    /// delv with the zone's key as trust anchor.
    pub fn delv(&self, name: &str, rtype: &str) -> Output {
        let anchor = self.path().join("anchor.conf");
        std::fs::write(&anchor, self.key.trust_anchor()).unwrap();
        Command::new(self.tools.bin("delv"))
            .arg("-a")
            .arg(&anchor)
            .arg("@127.0.0.1")
            .args(["-p", &self.port.to_string()])
            .arg(format!("+root={ZONE}"))
            .args([name, rtype])
            .output()
            .unwrap()
    }

    /// Waits (up to 5 s) until named's log holds `needle` at least `count`
    /// times: the log reaches the file through a pipe, slightly late.
    pub async fn wait_log_count(&self, needle: &str, count: usize) {
        for _ in 0..50 {
            if self.log().matches(needle).count() >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("named's log does not show {needle:?} {count} times:\n{}", self.log());
    }

    pub fn stop_service(&mut self) {
        self.service = None;
        assert!(!self.socket.exists());
    }

    pub fn start_service(&mut self) {
        self.service = Some(SigningService::bind(&self.socket, self.signer.clone(), self.times.source(), ServiceLimits::default()).unwrap());
    }

    pub async fn shutdown(mut self) {
        if let Some(n) = self.named.take() {
            n.stop().await;
        }
    }
}

pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// How a fake signer misbehaves.
#[derive(Clone)]
pub enum Fake {
    /// Never answers.
    Silent,
    /// Answers with these bytes, the request id written at offset 8 when
    /// `patch_id` is set.
    Reply { bytes: Vec<u8>, patch_id: bool },
    /// Answers with each of these in turn (bytes, patch_id), from its bound socket.
    Replies(Vec<(Vec<u8>, bool)>),
    /// Answers with these bytes (the id patched) from another, unbound socket, as
    /// any local process could: named must not take it.
    Spoofed(Vec<u8>),
}

/// A misbehaving signer bound on the signing socket path.
pub struct FakeSigner {
    task: tokio::task::JoinHandle<()>,
    path: PathBuf,
    pub requests: Arc<Mutex<u32>>,
    /// The id of every request received (named's re-sends carry the same id).
    pub ids: Arc<Mutex<Vec<u64>>>,
    /// Requests that did not decode as the wire format says.
    pub undecodable: Arc<Mutex<Vec<String>>>,
    /// (algorithm, key tag, signer) of each decoded request.
    pub seen: Arc<Mutex<Vec<(u8, u16, String)>>>,
}

impl FakeSigner {
    pub fn bind(path: &Path, fake: Fake) -> FakeSigner {
        let _ = std::fs::remove_file(path);
        // Like the real signing service, reply from the bound socket: named accepts
        // datagrams from the signer's path only.
        let bound = std::os::unix::net::UnixDatagram::bind(path).unwrap();
        bound.set_nonblocking(true).unwrap();
        let replies = bound.try_clone().unwrap();
        let socket = tokio::net::UnixDatagram::from_std(bound).unwrap();
        let stranger = std::os::unix::net::UnixDatagram::unbound().unwrap();
        let requests = Arc::new(Mutex::new(0));
        let counter = requests.clone();
        let undecodable = Arc::new(Mutex::new(Vec::new()));
        let bad = undecodable.clone();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        let ids = Arc::new(Mutex::new(Vec::new()));
        let ids2 = ids.clone();
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 300_000];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else { return };
                *counter.lock().unwrap() += 1;
                match named_glue::wire::Request::decode(&buf[..n]) {
                    Ok(req) => {
                        ids2.lock().unwrap().push(req.id);
                        seen2.lock().unwrap().push((req.algorithm, req.key_tag, req.signer.to_ascii()))
                    }
                    Err(e) => bad.lock().unwrap().push(e.to_string()),
                }
                let to: std::os::unix::net::SocketAddr = from.into();
                let patched = |bytes: &Vec<u8>, patch_id: bool| {
                    let mut reply = bytes.clone();
                    if patch_id && n >= 16 && reply.len() >= 16 {
                        reply[8..16].copy_from_slice(&buf[8..16]);
                    }
                    reply
                };
                match &fake {
                    Fake::Silent => {}
                    Fake::Reply { bytes, patch_id } => {
                        let _ = replies.send_to_addr(&patched(bytes, *patch_id), &to);
                    }
                    Fake::Replies(list) => {
                        for (bytes, patch_id) in list {
                            let _ = replies.send_to_addr(&patched(bytes, *patch_id), &to);
                        }
                    }
                    Fake::Spoofed(bytes) => {
                        // The kernel refuses this (named's socket is connected to the signer).
                        let _ = stranger.send_to_addr(&patched(bytes, true), &to);
                    }
                }
            }
        });
        FakeSigner { task, path: path.to_path_buf(), requests, ids, undecodable, seen }
    }
}

impl Drop for FakeSigner {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

pub fn vector(name: &str) -> Vec<u8> {
    let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    named_glue::wire::from_hex(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The zone's records sorted: AXFR order within a name follows named's
/// insertion history (a journal replay after a restart reorders RRsets at a
/// node), so replicas with different histories compare in this form.
pub fn canonical(axfr: &str) -> Vec<String> {
    let mut lines: Vec<String> = axfr.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    lines.sort();
    lines.dedup();
    lines
}

/// Asserts equal zones, printing only the differing lines.
pub fn assert_same_zone(a: &str, b: &str, what: &str) {
    if a == b {
        return;
    }
    let only_a: Vec<&str> = a.lines().filter(|l| !b.lines().any(|m| m == *l)).collect();
    let only_b: Vec<&str> = b.lines().filter(|l| !a.lines().any(|m| m == *l)).collect();
    panic!("{what}: zones differ\nonly in first: {only_a:#?}\nonly in second: {only_b:#?}\n(same lines in another order if both are empty)");
}
