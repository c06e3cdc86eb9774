//! The automatic finish of an adopted zone's double-KSK rollover: each replica asks the
//! resolvers of `[rollover] parent_resolvers` for the zone's DS at the parent and, once one of
//! them shows the threshold key's DS (and the DS TTL it saw has passed since, so caches that
//! held the old DS RRset have let it go), orders a report signed with its identity key
//! (`exec::envelope::Op::RolloverReport`). The execution core counts each replica once and
//! finishes the rollover at the point of the log where the t+1-th report is ordered
//! (`exec::core`): a lying replica or a lying resolver alone cannot make it happen, and a
//! resolver that never answers holds up only the replica that asks it. Every socket has a
//! timeout; nothing here decides what the replicas execute.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dnswire::rrwire::RawMessage;
use exec::SignZoneSigner;
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use named_glue::forward::Forwarder;
use named_glue::keys::ZoneKey;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::front::gateway::Gateway;

const TYPE_TXT: u16 = 16;
const TYPE_DS: u16 = 43;

/// `[rollover]` in `replica.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloverSection {
    /// Resolvers (ADDRESS:PORT) asked for the zone's DS at the parent; none: the rollover
    /// ends only by `sdns cluster rollover-finish` (or its two ordered steps).
    pub parent_resolvers: Vec<SocketAddr>,
    /// Seconds between two rounds of questions.
    pub poll_interval_s: u64,
    /// How long one question may take (UDP, and TCP when the answer is truncated).
    pub timeout_ms: u64,
}

impl Default for RolloverSection {
    fn default() -> Self {
        RolloverSection { parent_resolvers: Vec::new(), poll_interval_s: 60, timeout_ms: 2000 }
    }
}

/// Resolvers one replica may ask.
pub const MAX_RESOLVERS: usize = 16;

impl RolloverSection {
    pub fn is_default(&self) -> bool {
        *self == RolloverSection::default()
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.parent_resolvers.len() > MAX_RESOLVERS {
            return Err(format!("parent_resolvers: at most {MAX_RESOLVERS}, {} given", self.parent_resolvers.len()));
        }
        if !(1..=86_400).contains(&self.poll_interval_s) {
            return Err(format!("poll_interval_s: 1..=86400, {} given", self.poll_interval_s));
        }
        if !(100..=30_000).contains(&self.timeout_ms) {
            return Err(format!("timeout_ms: 100..=30000, {} given", self.timeout_ms));
        }
        Ok(())
    }
}

/// The DS rdata (key tag, algorithm, SHA-256, digest) the parent holds for `key` once it
/// trusts the threshold key.
pub fn expected_ds(key: &ZoneKey) -> Vec<u8> {
    let mut out = key.key_tag().to_be_bytes().to_vec();
    out.extend_from_slice(&[key.algorithm, dnswire::dnssec::DS_DIGEST_SHA256]);
    out.extend_from_slice(&key.ds_digest());
    out
}

/// A recursive query for `name` `rtype` under header id `id`.
pub fn query(name: &Name, rtype: RecordType, id: u16) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name.clone(), rtype));
    m.to_vec().unwrap_or_default()
}

/// What an answer to [`query`] (`id`, for `apex` DS) says: `Some(ttl)` when its DS RRset
/// at `apex` (lowercased wire name) holds `expected`, with that record's TTL; `None` for
/// anything else (another id or question, an error, no such DS, bytes that do not parse).
pub fn ds_covers(answer: &[u8], id: u16, apex: &[u8], expected: &[u8]) -> Option<u32> {
    let m = RawMessage::parse(answer).ok()?;
    if m.header.id != id || !m.header.is_response() || m.header.rcode() != 0 {
        return None;
    }
    if !matches!(m.questions.as_slice(), [q] if q.name == apex && q.qtype == TYPE_DS) {
        return None;
    }
    m.answers.iter().find(|r| r.rtype == TYPE_DS && r.owner == apex && r.rdata == expected).map(|r| r.ttl)
}

/// `message` to `to` over UDP, and again over TCP when the answer is truncated; the whole
/// exchange within `timeout`. Only an answer from `to` with the query's id is taken.
pub async fn ask(to: SocketAddr, message: &[u8], timeout: Duration) -> Result<Vec<u8>, String> {
    tokio::time::timeout(timeout, exchange(to, message)).await.map_err(|_| format!("{to}: no answer within {} ms", timeout.as_millis()))?
}

async fn exchange(to: SocketAddr, message: &[u8]) -> Result<Vec<u8>, String> {
    let id = message.get(..2).ok_or("an empty query")?;
    let bind: SocketAddr = if to.is_ipv4() { (std::net::Ipv4Addr::UNSPECIFIED, 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let socket = tokio::net::UdpSocket::bind(bind).await.map_err(|e| e.to_string())?;
    socket.connect(to).await.map_err(|e| e.to_string())?;
    socket.send(message).await.map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 4096];
    let answer = loop {
        let n = socket.recv(&mut buf).await.map_err(|e| e.to_string())?;
        let a = buf.get(..n).unwrap_or_default();
        // Another id is noise (a late answer to an earlier question, or a spoofing try).
        if a.get(..2) == Some(id) {
            break a.to_vec();
        }
    };
    if !dnswire::rrwire::RawHeader::parse(&answer).is_ok_and(|h| h.truncated()) {
        return Ok(answer);
    }
    let mut tcp = tokio::net::TcpStream::connect(to).await.map_err(|e| e.to_string())?;
    let len = u16::try_from(message.len()).map_err(|_| "a query too long for TCP")?;
    tcp.write_all(&[&len.to_be_bytes()[..], message].concat()).await.map_err(|e| e.to_string())?;
    let n = tcp.read_u16().await.map_err(|e| e.to_string())?;
    let mut answer = vec![0u8; usize::from(n)];
    tcp.read_exact(&mut answer).await.map_err(|e| e.to_string())?;
    Ok(answer)
}

/// What one replica watches for one zone.
pub struct ParentWatch {
    pub zone: u16,
    pub apex: Name,
    pub key: ZoneKey,
    pub settings: RolloverSection,
    /// The local named (the rollover marker is asked of it).
    pub named: Forwarder,
    pub gateway: Arc<Gateway>,
    pub signer: Arc<SignZoneSigner>,
}

/// Whether the local named holds `apex`'s rollover marker: `None` when it did not say.
async fn marked(named: &Forwarder, apex: &Name) -> Option<bool> {
    let marker = Name::from_ascii(exec::names::marker_name(&apex.to_ascii())).ok()?;
    let id = random_id();
    let answer = named.forward_udp(&query(&marker, RecordType::TXT, id)).await.ok()?;
    let m = RawMessage::parse(&answer).ok()?;
    match m.header.rcode() {
        0 => Some(m.answers.iter().any(|r| r.rtype == TYPE_TXT)),
        3 => Some(false),
        _ => None,
    }
}

fn random_id() -> u16 {
    let mut b = [0u8; 2];
    // A fixed id when the system has no randomness: the answer is still checked against it.
    let _ = getrandom::fill(&mut b);
    u16::from_be_bytes(b)
}

/// Asks every resolver once (at once); the largest TTL among the answers that show the new
/// DS, `None` when none does.
async fn round(w: &ParentWatch, apex_wire: &[u8], expected: &[u8]) -> Option<u32> {
    let timeout = Duration::from_millis(w.settings.timeout_ms);
    let asks = w.settings.parent_resolvers.iter().map(|r| {
        let id = random_id();
        let q = query(&w.apex, RecordType::DS, id);
        async move {
            match ask(*r, &q, timeout).await {
                Ok(answer) => ds_covers(&answer, id, apex_wire, expected),
                Err(e) => {
                    tracing::debug!(resolver = %r, error = %e, "a parent resolver did not answer");
                    None
                }
            }
        }
    });
    join_all(asks.collect()).await.into_iter().flatten().max()
}

/// Every future of `futures` driven together to its end (each question has its own
/// timeout, so a round takes at most one).
async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in pinned.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// Watches the parent for one zone until its rollover is over (then idles: the replica's
/// essential tasks must not end). A zone without the marker has no rollover to finish.
pub async fn watch_parent(w: ParentWatch) {
    let poll = Duration::from_secs(w.settings.poll_interval_s);
    let mut apex = w.apex.to_lowercase();
    apex.set_fqdn(true);
    let apex_wire = hickory_proto::serialize::binary::BinEncodable::to_bytes(&apex).unwrap_or_default();
    let expected = expected_ds(&w.key);
    // When this replica first saw the new DS, and the largest TTL seen since.
    let mut seen: Option<(Instant, u32)> = None;
    loop {
        tokio::time::sleep(poll).await;
        match marked(&w.named, &w.apex).await {
            Some(true) => {}
            // No marker: never adopted with a rollover, or finished (by either way).
            Some(false) => break,
            None => continue,
        }
        let Some(ttl) = round(&w, &apex_wire, &expected).await else {
            // Gone again (or nobody answered): the hold starts over when it shows.
            seen = None;
            continue;
        };
        let (since, held) = *seen.get_or_insert((Instant::now(), ttl));
        let held = held.max(ttl);
        seen = Some((since, held));
        if since.elapsed() < Duration::from_secs(u64::from(held)) {
            tracing::info!(zone = %w.apex, wait_s = u64::from(held).saturating_sub(since.elapsed().as_secs()), "the parent's DS covers the threshold key; reporting once its TTL has passed");
            continue;
        }
        let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        let auth = match w.signer.sign_rollover(now_us) {
            Ok(auth) => auth,
            Err(e) => {
                tracing::error!(zone = %w.apex, error = %e, "cannot sign this replica's rollover report");
                continue;
            }
        };
        tracing::info!(zone = %w.apex, "the parent's DS covers the threshold key: ordering this replica's report");
        let (reply, mut rx) = crate::client::reply::ReplyTo::internal();
        w.gateway.order(exec::envelope::Op::RolloverReport { zone: w.zone, auth }, reply).await;
        let text = match tokio::time::timeout(Duration::from_secs(600), rx.recv()).await {
            Ok(Some(a)) => String::from_utf8_lossy(&a.bytes).into_owned(),
            _ => String::new(),
        };
        tracing::info!(zone = %w.apex, answer = %text, "rollover report");
        if text.starts_with("finished") || text.starts_with("signed at") {
            break;
        }
    }
    std::future::pending::<()>().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ZoneKey {
        let name = Name::from_ascii("example.test.").unwrap();
        ZoneKey::rsa(&name, 8, &[1, 0, 1], &[0xc3; 64], 3600).unwrap()
    }

    fn answer_with(id: u16, question: &str, qtype: u16, records: &[(&str, u16, u32, Vec<u8>)], rcode: u8) -> Vec<u8> {
        let wire = |n: &str| hickory_proto::serialize::binary::BinEncodable::to_bytes(&Name::from_ascii(n).unwrap()).unwrap();
        let mut m = id.to_be_bytes().to_vec();
        m.extend_from_slice(&[0x81, 0x80 | rcode, 0, 1]);
        m.extend_from_slice(&(records.len() as u16).to_be_bytes());
        m.extend_from_slice(&[0, 0, 0, 0]);
        m.extend_from_slice(&wire(question));
        m.extend_from_slice(&qtype.to_be_bytes());
        m.extend_from_slice(&[0, 1]);
        for (owner, rtype, ttl, rdata) in records {
            m.extend_from_slice(&wire(owner));
            m.extend_from_slice(&rtype.to_be_bytes());
            m.extend_from_slice(&[0, 1]);
            m.extend_from_slice(&ttl.to_be_bytes());
            m.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            m.extend_from_slice(rdata);
        }
        m
    }

    #[test]
    fn an_answer_covers_the_new_key_only_with_its_exact_ds_for_the_question_asked() {
        let k = key();
        let ds = expected_ds(&k);
        assert_eq!((u16::from_be_bytes([ds[0], ds[1]]), ds[2], ds[3], ds.len()), (k.key_tag(), 8, 2, 36));
        assert!(k.ds_record().ends_with(&ds[4..].iter().map(|b| format!("{b:02X}")).collect::<String>()));
        let apex = hickory_proto::serialize::binary::BinEncodable::to_bytes(&Name::from_ascii("example.test.").unwrap()).unwrap();
        let mut old = ds.clone();
        old[0] ^= 1;
        // The old DS and the new: covered, with the new one's TTL.
        let both = answer_with(7, "example.test.", TYPE_DS, &[("example.test.", TYPE_DS, 86400, old.clone()), ("example.test.", TYPE_DS, 300, ds.clone())], 0);
        assert_eq!(ds_covers(&both, 7, &apex, &ds), Some(300));
        // Only the old DS; another id; another question; an error; a DS elsewhere: not covered.
        assert_eq!(ds_covers(&answer_with(7, "example.test.", TYPE_DS, &[("example.test.", TYPE_DS, 300, old)], 0), 7, &apex, &ds), None);
        assert_eq!(ds_covers(&both, 8, &apex, &ds), None);
        assert_eq!(ds_covers(&answer_with(7, "example.test.", 48, &[("example.test.", TYPE_DS, 300, ds.clone())], 0), 7, &apex, &ds), None);
        assert_eq!(ds_covers(&answer_with(7, "example.test.", TYPE_DS, &[("example.test.", TYPE_DS, 300, ds.clone())], 2), 7, &apex, &ds), None);
        assert_eq!(ds_covers(&answer_with(7, "example.test.", TYPE_DS, &[("other.test.", TYPE_DS, 300, ds.clone())], 0), 7, &apex, &ds), None);
        assert_eq!(ds_covers(&both[..both.len() - 3], 7, &apex, &ds), None);
        // The query asks for recursion, for the name and type given.
        let q = RawMessage::parse(&query(&Name::from_ascii("example.test.").unwrap(), RecordType::DS, 9)).unwrap();
        assert_eq!((q.header.id, q.header.flags & 0x0100 != 0, q.questions[0].qtype), (9, true, TYPE_DS));
    }

    #[test]
    fn the_section_is_checked() {
        let ok = RolloverSection { parent_resolvers: vec!["127.0.0.1:53".parse().unwrap()], ..RolloverSection::default() };
        assert_eq!(ok.validate(), Ok(()));
        assert!(RolloverSection::default().is_default() && !ok.is_default());
        assert!(RolloverSection { poll_interval_s: 0, ..ok.clone() }.validate().is_err());
        assert!(RolloverSection { timeout_ms: 50, ..ok.clone() }.validate().is_err());
        assert!(RolloverSection { parent_resolvers: vec!["127.0.0.1:53".parse().unwrap(); MAX_RESOLVERS + 1], ..ok }.validate().is_err());
        let parsed: RolloverSection = toml::from_str("parent_resolvers = [\"192.0.2.1:53\"]\npoll_interval_s = 5\n").unwrap();
        assert_eq!((parsed.parent_resolvers.len(), parsed.poll_interval_s, parsed.timeout_ms), (1, 5, 2000));
        assert!(toml::from_str::<RolloverSection>("resolvers = []").is_err());
    }

    #[tokio::test]
    async fn a_resolver_that_never_answers_times_out_and_one_that_answers_is_heard() {
        let silent = testkit::fake_dns::FakeDns::start(|_| None);
        let name = Name::from_ascii("example.test.").unwrap();
        let q = query(&name, RecordType::DS, 42);
        // Returns (with an error) rather than waiting for ever.
        assert!(ask(silent.addr(), &q, Duration::from_millis(300)).await.unwrap_err().contains("no answer within 300 ms"));
        let k = key();
        let ds = expected_ds(&k);
        let answering = testkit::fake_dns::FakeDns::start(move |m| {
            let id = u16::from_be_bytes([m[0], m[1]]);
            Some(answer_with(id, "example.test.", TYPE_DS, &[("example.test.", TYPE_DS, 60, ds.clone())], 0))
        });
        let a = ask(answering.addr(), &q, Duration::from_secs(5)).await.unwrap();
        let apex = hickory_proto::serialize::binary::BinEncodable::to_bytes(&name).unwrap();
        assert_eq!(ds_covers(&a, 42, &apex, &expected_ds(&k)), Some(60));
    }
}
