//! Differential conformance: a replica answers exactly as its own named would.
//!
//! A corpus of probe messages (built with hickory-proto, raw bytes for the malformed
//! ones) goes to a replica and to that replica's named on its private port (read from
//! the replica's config). Answers are compared byte for byte, the message id and a
//! TSIG's time, MAC and other data aside. Every difference that remains is listed in
//! docs/CONFORMANCE.md with its reason, and `EXPECTED_DIFFERENCES` holds exactly that
//! list: an unexplained new difference, or a listed one that went away, fails.
//!
//! Writes change the zone, and the replica and its named share one zone. So every
//! update probe goes to the replica first and then, same bytes, to named: an update
//! whose prerequisites or policy refuse it changes nothing, and one that applies
//! through the replica is a no-op when it reaches named a second time (named answers
//! NOERROR without a new serial), so both answers must be identical too. Reads
//! follow the writes, on the zone both sides then share.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::str::FromStr;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::SOA;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use named_glue::forward::TransferEnd;
use named_glue::rrwire::{RawMessage, TYPE_AXFR, TYPE_IXFR, TYPE_SOA};
use sdns_system_tests::{Cluster, ClusterOpts, Replicas};

/// Probes whose answers differ, each with the reason (docs/CONFORMANCE.md).
const EXPECTED_DIFFERENCES: &[(&str, &str)] = &[
    ("update: RRset does not exist fails", UPDATES_GO_THROUGH_A_LOCAL_KEY),
    ("update: RRset exists (value) fails", UPDATES_GO_THROUGH_A_LOCAL_KEY),
    ("update: RRset exists fails", UPDATES_GO_THROUGH_A_LOCAL_KEY),
    ("update: add big TXTs over TCP", UPDATES_GO_THROUGH_A_LOCAL_KEY),
    ("update: add over TCP", UPDATES_GO_THROUGH_A_LOCAL_KEY),
    ("update: add the odd NAPTR", UPDATES_GO_THROUGH_A_LOCAL_KEY),
    ("update: add typed records", UPDATES_GO_THROUGH_A_LOCAL_KEY),
    ("update: name in use fails", UPDATES_GO_THROUGH_A_LOCAL_KEY),
    ("update: name not in use fails", UPDATES_GO_THROUGH_A_LOCAL_KEY),
    ("update: odd NAPTR with a prerequisite on it", UPDATES_GO_THROUGH_A_LOCAL_KEY),
    ("update: prerequisite holds, add", UPDATES_GO_THROUGH_A_LOCAL_KEY),
];

/// See docs/CONFORMANCE.md, "Updates".
const UPDATES_GO_THROUGH_A_LOCAL_KEY: &str = "named grants updates only to the replica's local key: the wrapper authenticates the client's TSIG at the agreed time and forwards the update re-signed with that key, so named asked directly with the client's key refuses (REFUSED) what the replica answers with the real outcome";

const ZONE: &str = "example.test.";

struct Probe {
    label: String,
    bytes: Vec<u8>,
    tcp: bool,
}

fn probe(label: impl Into<String>, bytes: Vec<u8>, tcp: bool) -> Probe {
    Probe { label: label.into(), bytes, tcp }
}

fn name(s: &str) -> Name {
    Name::from_str(s).expect("test name")
}

fn wire_name(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for l in s.trim_end_matches('.').split('.').filter(|l| !l.is_empty()) {
        out.push(l.len() as u8);
        out.extend_from_slice(l.as_bytes());
    }
    out.push(0);
    out
}

#[derive(Clone, Copy)]
struct EdnsOpts {
    size: u16,
    version: u8,
    dnssec_ok: bool,
}

fn query(id: u16, qname: &str, rtype: u16, class: u16, edns: Option<EdnsOpts>) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    let mut q = Query::query(name(qname), RecordType::from(rtype));
    q.set_query_class(DNSClass::from(class));
    m.add_query(q);
    if let Some(e) = edns {
        let mut opt = Edns::new();
        opt.set_max_payload(e.size.max(512));
        opt.set_version(e.version);
        opt.set_dnssec_ok(e.dnssec_ok);
        m.set_edns(opt);
    }
    let mut bytes = m.to_vec().expect("encode probe");
    if let Some(e) = edns.filter(|e| e.size < 512) {
        // hickory clamps the payload size to 512; below that is still legal bytes.
        let at = bytes.len() - 11 + 3;
        bytes[at..at + 2].copy_from_slice(&e.size.to_be_bytes());
    }
    bytes
}

fn set_counts(bytes: &mut [u8], qd: u16, an: u16, ns: u16, ar: u16) {
    for (i, c) in [qd, an, ns, ar].into_iter().enumerate() {
        bytes[4 + 2 * i..6 + 2 * i].copy_from_slice(&c.to_be_bytes());
    }
}

/// A raw record: owner, type, class, ttl, rdata.
fn rr(owner: &str, rtype: u16, class: u16, ttl: u32, rdata: &[u8]) -> Vec<u8> {
    let mut out = wire_name(owner);
    out.extend_from_slice(&rtype.to_be_bytes());
    out.extend_from_slice(&class.to_be_bytes());
    out.extend_from_slice(&ttl.to_be_bytes());
    out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    out.extend_from_slice(rdata);
    out
}

/// An UPDATE for the zone with raw prerequisite and update records.
fn update(id: u16, zone: &str, prereqs: &[Vec<u8>], updates: &[Vec<u8>]) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Update);
    let mut q = Query::query(name(zone), RecordType::SOA);
    q.set_query_class(DNSClass::IN);
    m.add_query(q);
    let mut bytes = m.to_vec().expect("encode update");
    set_counts(&mut bytes, 1, prereqs.len() as u16, updates.len() as u16, 0);
    for r in prereqs.iter().chain(updates) {
        bytes.extend_from_slice(r);
    }
    bytes
}

struct Key {
    name: String,
    secret: Vec<u8>,
}

fn load_key(c: &Cluster) -> Key {
    use base64::Engine;
    let text = std::fs::read_to_string(c.path("tsig.key")).expect("tsig.key");
    let quoted = |marker: &str| {
        let start = text.find(marker).expect(marker) + marker.len();
        text[start..start + text[start..].find('"').expect("closing quote")].to_string()
    };
    let secret = base64::engine::general_purpose::STANDARD.decode(quoted("secret \"")).expect("base64 secret");
    Key { name: quoted("key \""), secret }
}

#[derive(Clone, Copy)]
enum Tamper {
    None,
    Mac,
    UnknownKey,
    Time(i64),
}

/// Appends a TSIG (RFC 8945, hmac-sha256) to `msg`, possibly spoilt as `tamper` says. The TSIG
/// code is the replicas' own (dnswire); named, which checks every probe sent to it directly,
/// is the independent judge.
fn sign(msg: &[u8], key: &Key, tamper: Tamper) -> Vec<u8> {
    use dnswire::tsig;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() as i64;
    let (key_name, time) = match tamper {
        Tamper::UnknownKey => ("no-such-key.".to_string(), now),
        Tamper::Time(skew) => (key.name.clone(), now + skew),
        _ => (key.name.clone(), now),
    };
    let k = tsig::Key::new(&key_name, tsig::Algorithm::HmacSha256, &key.secret).expect("key name");
    let mut out = tsig::sign(msg, &k, time as u64, 300, 0, Vec::new(), None);
    if let Tamper::Mac = tamper {
        // The MAC is followed by original id, error and other length (6 bytes).
        let mac_start = out.len() - 6 - 32;
        out[mac_start] ^= 0xff;
    }
    out
}

/// The replica's named port, from the replica's own config.
fn named_port(c: &Cluster) -> u16 {
    let text = std::fs::read_to_string(c.path("replica-0/replica.toml")).expect("replica.toml");
    let section = &text[text.find("[named]").expect("[named] section")..];
    section.lines().find_map(|l| l.strip_prefix("port = ")).and_then(|p| p.trim().parse().ok()).expect("[named] port")
}

/// Sends every probe over UDP at once (one socket each) and collects the first
/// datagram each gets back before `wait` is over.
fn udp_all(addr: SocketAddr, probes: &[&Probe], wait: Duration) -> Vec<Option<Vec<u8>>> {
    let socks: Vec<UdpSocket> = probes
        .iter()
        .map(|p| {
            let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
            s.set_nonblocking(true).expect("nonblocking");
            s.send_to(&p.bytes, addr).expect("send");
            s
        })
        .collect();
    let mut out: Vec<Option<Vec<u8>>> = vec![None; probes.len()];
    let deadline = Instant::now() + wait;
    let mut buf = vec![0u8; 65535];
    while Instant::now() < deadline {
        for (i, s) in socks.iter().enumerate() {
            if out[i].is_none() {
                if let Ok(n) = s.recv(&mut buf) {
                    out[i] = Some(buf[..n].to_vec());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    out
}

fn udp_one(addr: SocketAddr, bytes: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.set_read_timeout(Some(wait)).expect("timeout");
    s.send_to(bytes, addr).expect("send");
    let mut buf = vec![0u8; 65535];
    s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
}

/// One TCP exchange: every message of a transfer (ended as the protocol says), one
/// message otherwise; nothing if the server closes or stays silent.
fn tcp(addr: SocketAddr, bytes: &[u8]) -> Vec<Vec<u8>> {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(3)) else { return vec![] };
    s.set_read_timeout(Some(Duration::from_secs(6))).expect("timeout");
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(bytes);
    if s.write_all(&framed).is_err() {
        return vec![];
    }
    let request = RawMessage::parse(bytes).ok();
    let transfer = request.as_ref().is_some_and(|m| m.questions.first().is_some_and(|q| q.qtype == TYPE_AXFR || q.qtype == TYPE_IXFR));
    let mut end = request.as_ref().map(TransferEnd::for_request);
    let mut out = Vec::new();
    for _ in 0..10_000 {
        let mut len = [0u8; 2];
        if s.read_exact(&mut len).is_err() {
            break;
        }
        let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if s.read_exact(&mut msg).is_err() {
            break;
        }
        out.push(msg);
        if !transfer {
            break;
        }
        let Some(end) = end.as_mut() else { break };
        match RawMessage::parse(out.last().expect("just pushed")) {
            Ok(m) if end.message(&m).is_ok() && !end.finished() => {}
            _ => break,
        }
    }
    out
}

/// A TCP exchange of one message from a given local (loopback) address.
fn tcp_from(local: [u8; 4], addr: SocketAddr, bytes: &[u8]) -> Vec<Vec<u8>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket");
    socket.bind(&SocketAddr::from((local, 0)).into()).expect("bind the source address");
    socket.connect_timeout(&addr.into(), Duration::from_secs(3)).expect("connect");
    let mut s: TcpStream = socket.into();
    s.set_read_timeout(Some(Duration::from_secs(6))).expect("timeout");
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(bytes);
    s.write_all(&framed).expect("send");
    let mut len = [0u8; 2];
    if s.read_exact(&mut len).is_err() {
        return vec![];
    }
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut msg).expect("message");
    vec![msg]
}

/// An answer with the id and a TSIG's time, MAC and other data zeroed.
fn normalized(answer: &[u8]) -> Vec<u8> {
    let mut a = answer.to_vec();
    if a.len() >= 2 {
        a[0] = 0;
        a[1] = 0;
    }
    if let Ok(m) = RawMessage::parse(answer) {
        if let Some(t) = m.tsig() {
            let rdata_start = t.span.end - t.rdata.len();
            let mut p = rdata_start;
            while p < a.len() && a[p] != 0 {
                p += 1 + usize::from(a[p]);
            }
            p += 1; // after the algorithm name
            if p + 10 <= a.len() {
                a[p..p + 6].fill(0);
                let mac_len = usize::from(u16::from_be_bytes([a[p + 8], a[p + 9]]));
                let mac = p + 10;
                if mac + mac_len + 6 <= a.len() {
                    a[mac..mac + mac_len].fill(0);
                    // Original id (the request's), error, then other data (BADTIME's server time).
                    let other = mac + mac_len + 6;
                    a[other..t.span.end].fill(0);
                }
            }
        }
    }
    a
}

fn describe(answer: &Option<Vec<u8>>) -> String {
    match answer {
        None => "no answer".into(),
        Some(a) => match Message::from_vec(a) {
            Ok(m) => format!(
                "{} bytes, {:?}, an {} ns {} ar {}, tc {}",
                a.len(),
                m.metadata.response_code,
                m.answers.len(),
                m.authorities.len(),
                m.additionals.len(),
                m.metadata.truncation
            ),
            Err(_) => format!("{} bytes (undecodable) {:02x?}", a.len(), &a[..a.len().min(16)]),
        },
    }
}

/// Record types named knows (and a few it does not), by number.
const TYPES: &[u16] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 33, 35, 36, 37, 38, 39, 42, 43, 44, 45,
    46, 47, 48, 49, 50, 51, 52, 53, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 249, 255, 256, 257, 258,
    260, 32768, 32769, 65534, 65280,
];

fn read_probes(key: &Key) -> Vec<Probe> {
    let mut p = Vec::new();
    let edns_variants = [
        None,
        Some(EdnsOpts { size: 1232, version: 0, dnssec_ok: false }),
        Some(EdnsOpts { size: 4096, version: 0, dnssec_ok: true }),
        Some(EdnsOpts { size: 512, version: 0, dnssec_ok: true }),
    ];
    // Every type at the apex and at a name with data, under each EDNS variant in turn.
    let mut id = 0x1000u16;
    for (k, &t) in TYPES.iter().enumerate() {
        for (j, qname) in ["example.test.", "www.example.test."].into_iter().enumerate() {
            id += 1;
            let e = edns_variants[(k + j) % edns_variants.len()];
            p.push(probe(format!("type {t} at {qname} edns {:?}", e.map(|e| (e.size, e.dnssec_ok))), query(id, qname, t, 1, e), false));
        }
    }
    // Names that do not exist, are delegated elsewhere, or are outside the zone.
    for (i, qname) in ["nope.example.test.", "a.b.c.www.example.test.", "mail.example.test.", "ns0.example.test.", "other.test.", "."].into_iter().enumerate() {
        for (t, e) in [(1u16, None), (28, edns_variants[2]), (255, edns_variants[2]), (43, edns_variants[1])] {
            id += 1;
            p.push(probe(format!("{qname} type {t} #{i}"), query(id, qname, t, 1, e), false));
        }
    }
    // EDNS sizes and versions, DO, unknown EDNS flags.
    for size in [0u16, 1, 100, 511, 512, 513, 1232, 1400, 4096, 65535] {
        for dnssec_ok in [false, true] {
            id += 1;
            p.push(probe(format!("ANY size {size} do {dnssec_ok}"), query(id, ZONE, 255, 1, Some(EdnsOpts { size, version: 0, dnssec_ok })), false));
        }
    }
    for version in [1u8, 2, 255] {
        id += 1;
        p.push(probe(format!("EDNS version {version}"), query(id, ZONE, 6, 1, Some(EdnsOpts { size: 1232, version, dnssec_ok: false })), false));
    }
    {
        // An unknown EDNS option and an unknown EDNS flag bit.
        id += 1;
        let mut q = query(id, ZONE, 6, 1, Some(EdnsOpts { size: 1232, version: 0, dnssec_ok: false }));
        let n = q.len();
        q[n - 2..].copy_from_slice(&6u16.to_be_bytes());
        q.extend_from_slice(&[0xfd, 0xe9, 0, 2, 0xab, 0xcd]);
        p.push(probe("unknown EDNS option", q, false));
        id += 1;
        let mut q = query(id, ZONE, 6, 1, Some(EdnsOpts { size: 1232, version: 0, dnssec_ok: false }));
        let n = q.len();
        q[n - 4] |= 0x40;
        p.push(probe("unknown EDNS flag", q, false));
        id += 1;
        let mut q = query(id, ZONE, 6, 1, Some(EdnsOpts { size: 1232, version: 0, dnssec_ok: false }));
        let opt = q[q.len() - 11..].to_vec();
        q.extend_from_slice(&opt);
        q[11] = 2;
        p.push(probe("two OPT records", q, false));
        id += 1;
        let mut q = query(id, ZONE, 6, 1, Some(EdnsOpts { size: 1232, version: 0, dnssec_ok: false }));
        let n = q.len();
        q[n - 11] = 3; // OPT owner not root
        let _ = q.splice(n - 10..n - 10, *b"abc\0");
        p.push(probe("OPT with a non-root owner", q, false));
        id += 1;
        let mut q = query(id, ZONE, 6, 1, Some(EdnsOpts { size: 1232, version: 0, dnssec_ok: false }));
        let n = q.len();
        q[n - 2..].copy_from_slice(&4u16.to_be_bytes()); // option header promised, missing
        p.push(probe("OPT rdata shorter than its length", q, false));
    }
    // Classes.
    for class in [3u16, 4, 254, 255, 1234] {
        id += 1;
        p.push(probe(format!("class {class}"), query(id, ZONE, 6, class, None), false));
    }
    id += 1;
    p.push(probe("version.bind CH TXT", query(id, "version.bind.", 16, 3, None), false));
    // Every opcode, and header bits a query should not carry.
    for opcode in 0u8..16 {
        if opcode == 5 {
            continue; // UPDATE: the write probes
        }
        id += 1;
        let mut q = query(id, ZONE, 6, 1, None);
        q[2] = (q[2] & 0x87) | (opcode << 3);
        p.push(probe(format!("opcode {opcode}"), q, false));
    }
    for (label, byte, bit) in [("AA", 2, 0x04), ("TC", 2, 0x02), ("RA", 3, 0x80), ("Z", 3, 0x40), ("AD", 3, 0x20), ("CD", 3, 0x10), ("rcode 3", 3, 0x03)] {
        id += 1;
        let mut q = query(id, "www.example.test.", 1, 1, None);
        q[byte] |= bit;
        p.push(probe(format!("query with {label}"), q, false));
    }
    // Malformed headers and names.
    let base = query(0x7001, "www.example.test.", 1, 1, None);
    let mut mal: Vec<(&str, Vec<u8>)> = Vec::new();
    mal.push(("no question", {
        let mut q = base[..12].to_vec();
        set_counts(&mut q, 0, 0, 0, 0);
        q
    }));
    mal.push(("two questions", {
        let mut q = base.clone();
        q.extend_from_slice(&base[12..]);
        set_counts(&mut q, 2, 0, 0, 0);
        q
    }));
    mal.push(("question cut short", base[..20].to_vec()));
    mal.push(("question without type", base[..base.len() - 4].to_vec()));
    mal.push(("trailing garbage", {
        let mut q = base.clone();
        q.extend_from_slice(&[1, 2, 3]);
        q
    }));
    mal.push(("counts promise an answer", {
        let mut q = base.clone();
        set_counts(&mut q, 1, 1, 0, 0);
        q
    }));
    mal.push(("counts promise 65535 additionals", {
        let mut q = base.clone();
        set_counts(&mut q, 1, 0, 0, 65535);
        q
    }));
    mal.push(("compression loop", {
        let mut q = base[..12].to_vec();
        q.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        q
    }));
    mal.push(("two-pointer loop", {
        let mut q = base[..12].to_vec();
        q.extend_from_slice(&[1, b'a', 0xc0, 16, 0xc0, 12, 0, 1, 0, 1]);
        q
    }));
    mal.push(("forward pointer", {
        let mut q = base[..12].to_vec();
        q.extend_from_slice(&[0xc0, 20, 0, 1, 0, 1, 0, 0, 3, b'w', b'w', b'w', 0]);
        q
    }));
    mal.push(("pointer past the end", {
        let mut q = base[..12].to_vec();
        q.extend_from_slice(&[0xc3, 0xff, 0, 1, 0, 1]);
        q
    }));
    mal.push(("label type 0x40", {
        let mut q = base[..12].to_vec();
        q.extend_from_slice(&[0x41, b'a', 0, 0, 1, 0, 1]);
        q
    }));
    mal.push(("label type 0x80", {
        let mut q = base[..12].to_vec();
        q.extend_from_slice(&[0x81, b'a', 0, 0, 1, 0, 1]);
        q
    }));
    mal.push(("name over 255 bytes", {
        let mut q = base[..12].to_vec();
        for _ in 0..5 {
            q.push(63);
            q.extend_from_slice(&[b'x'; 63]);
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        q
    }));
    mal.push(("label length past the end", {
        let mut q = base[..12].to_vec();
        q.extend_from_slice(&[40, b'a', b'b']);
        q
    }));
    mal.push(("binary label bytes", {
        let mut q = base[..12].to_vec();
        q.extend_from_slice(&[3, 0, 0xff, b'.']);
        q.extend_from_slice(&wire_name(ZONE));
        q.extend_from_slice(&[0, 1, 0, 1]);
        q
    }));
    mal.push(("header only", base[..12].to_vec()));
    mal.push(("eleven bytes", base[..11].to_vec()));
    mal.push(("a response", {
        let mut q = base.clone();
        q[2] |= 0x80;
        q
    }));
    for (label, q) in mal {
        p.push(probe(label, q, false));
    }
    // The odd records: the NAPTR with a 0xff flag byte (added by the write probes)
    // and what hickory cannot decode in a request: a SIG and that NAPTR as additional data.
    id += 1;
    p.push(probe("odd NAPTR", query(id, "odd.example.test.", 35, 1, Some(EdnsOpts { size: 1232, version: 0, dnssec_ok: true })), false));
    id += 1;
    p.push(probe("odd NAPTR over TCP", query(id, "odd.example.test.", 35, 1, None), true));
    id += 1;
    let mut q = query(id, "www.example.test.", 1, 1, None);
    q.extend(rr("x.example.test.", 35, 1, 0, &[0x00, 0x64, 0x00, 0x0a, 0x01, 0xff, 0, 0, 0]));
    set_counts(&mut q, 1, 0, 0, 1);
    p.push(probe("query carrying an odd NAPTR", q, false));
    id += 1;
    let mut q = query(id, "www.example.test.", 1, 1, None);
    q.extend(rr(".", 24, 255, 0, &[0; 19]));
    set_counts(&mut q, 1, 0, 0, 1);
    p.push(probe("query carrying a SIG", q, false));
    // TSIG: good, bad MAC, unknown key, outside the time window.
    for (label, tamper) in [("good", Tamper::None), ("bad MAC", Tamper::Mac), ("unknown key", Tamper::UnknownKey), ("time off", Tamper::Time(-4000))] {
        for (t, e) in [(1u16, None), (6, edns_variants[1])] {
            id += 1;
            p.push(probe(format!("TSIG {label} type {t}"), sign(&query(id, "www.example.test.", t, 1, e), key, tamper), false));
        }
    }
    // Truncation: answers larger than the advertised size, over UDP and TCP.
    for (label, e) in [
        ("no EDNS", None),
        ("EDNS 512", Some(EdnsOpts { size: 512, version: 0, dnssec_ok: true })),
        ("EDNS 1232", edns_variants[1]),
        ("EDNS 4096 DO", edns_variants[2]),
    ] {
        id += 1;
        p.push(probe(format!("big TXT {label}"), query(id, "big.example.test.", 16, 1, e), false));
        id += 1;
        p.push(probe(format!("ANY apex {label}"), query(id, ZONE, 255, 1, e.map(|e| EdnsOpts { dnssec_ok: true, ..e })), false));
        id += 1;
        p.push(probe(format!("big TXT over TCP {label}"), query(id, "big.example.test.", 16, 1, e), true));
    }
    p
}

/// Transfers over TCP (and UDP) at various serials; `serial` is the zone's current one.
fn transfer_probes(serial: u32) -> Vec<Probe> {
    let mut p = Vec::new();
    let ixfr = |id: u16, from: u32| {
        let mut m = Message::new(id, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(name(ZONE), RecordType::IXFR));
        m.add_authority(Record::from_rdata(name(ZONE), 0, RData::SOA(SOA::new(name(ZONE), name(ZONE), from, 0, 0, 0, 0))));
        m.to_vec().expect("ixfr")
    };
    p.push(probe("AXFR over TCP", query(0x9001, ZONE, 252, 1, None), true));
    p.push(probe("AXFR over UDP", query(0x9002, ZONE, 252, 1, None), false));
    p.push(probe("AXFR of another zone", query(0x9003, "other.test.", 252, 1, None), true));
    p.push(probe("AXFR of a name inside the zone", query(0x9004, "www.example.test.", 252, 1, None), true));
    for (k, from) in [serial, serial - 1, serial.wrapping_sub(3), serial.wrapping_sub(1000), serial + 1, 0].into_iter().enumerate() {
        p.push(probe(format!("IXFR over TCP from current{:+}", i64::from(from) - i64::from(serial)), ixfr(0x9100 + k as u16, from), true));
        p.push(probe(format!("IXFR over UDP from current{:+}", i64::from(from) - i64::from(serial)), ixfr(0x9200 + k as u16, from), false));
    }
    p.push(probe("IXFR without an SOA", query(0x9301, ZONE, 251, 1, None), true));
    p
}

/// (label, bytes) of every write probe, in the order they are sent.
fn write_probes(key: &Key, dnskey_rdata: &[u8]) -> Vec<Probe> {
    let mut p = Vec::new();
    let a = |owner: &str, ip: [u8; 4]| rr(owner, 1, 1, 300, &ip);
    let txt = |owner: &str, text: &str| {
        let mut d = vec![text.len() as u8];
        d.extend_from_slice(text.as_bytes());
        rr(owner, 16, 1, 300, &d)
    };
    let signed = |u: Vec<u8>| sign(&u, key, Tamper::None);
    // The odd NAPTR (named accepts what a full decoder rejects), and big TXTs for truncation.
    p.push(probe(
        "update: add the odd NAPTR",
        signed(update(0xa001, ZONE, &[], &[rr("odd.example.test.", 35, 1, 300, &[0x00, 0x64, 0x00, 0x0a, 0x01, 0xff, 0, 0, 0])])),
        false,
    ));
    // Records of types whose rdata names named compresses (MX, MINFO, PTR, SOA-like)
    // and of types it must not compress (SRV, RP, NAPTR), for the transfers below.
    let typed = vec![
        rr("typed.example.test.", 15, 1, 300, &[&[0u8, 10][..], &wire_name("mail.example.test.")].concat()),
        rr("typed.example.test.", 14, 1, 300, &[wire_name("www.example.test."), wire_name("mail.example.test.")].concat()),
        rr("typed.example.test.", 33, 1, 300, &[&[0u8, 1, 0, 2, 0, 53][..], &wire_name("www.example.test.")].concat()),
        rr("typed.example.test.", 17, 1, 300, &[wire_name("mail.example.test."), wire_name("www.example.test.")].concat()),
        rr("typed.example.test.", 35, 1, 300, &[&[0u8, 1, 0, 2, 1, b'S', 0, 0][..], &wire_name("www.example.test.")].concat()),
        rr("typed.example.test.", 257, 1, 300, &[0, 5, b'i', b's', b's', b'u', b'e', b'c', b'a', b'.', b't', b'e', b's', b't']),
        rr("ptr.example.test.", 12, 1, 300, &wire_name("WWW.Example.test.")),
    ];
    p.push(probe("update: add typed records", signed(update(0xa017, ZONE, &[], &typed)), false));
    let bigs: Vec<Vec<u8>> = (0..12).map(|i| txt("big.example.test.", &format!("{i:02}{}", "x".repeat(90)))).collect();
    p.push(probe("update: add big TXTs over TCP", signed(update(0xa002, ZONE, &[], &bigs)), true));
    // Prerequisites (RFC 2136 2.4), failing and holding.
    p.push(probe(
        "update: name in use fails",
        signed(update(0xa003, ZONE, &[rr("nope.example.test.", 255, 255, 0, &[])], &[a("p1.example.test.", [192, 0, 2, 1])])),
        false,
    ));
    p.push(probe(
        "update: name not in use fails",
        signed(update(0xa004, ZONE, &[rr("www.example.test.", 255, 254, 0, &[])], &[a("p2.example.test.", [192, 0, 2, 2])])),
        false,
    ));
    p.push(probe(
        "update: RRset exists fails",
        signed(update(0xa005, ZONE, &[rr("www.example.test.", 16, 255, 0, &[])], &[a("p3.example.test.", [192, 0, 2, 3])])),
        false,
    ));
    p.push(probe(
        "update: RRset does not exist fails",
        signed(update(0xa006, ZONE, &[rr("www.example.test.", 1, 254, 0, &[])], &[a("p4.example.test.", [192, 0, 2, 4])])),
        false,
    ));
    p.push(probe(
        "update: RRset exists (value) fails",
        signed(update(0xa007, ZONE, &[rr("www.example.test.", 1, 1, 0, &[203, 0, 113, 1])], &[a("p5.example.test.", [192, 0, 2, 5])])),
        false,
    ));
    p.push(probe("update: prerequisite outside the zone", signed(update(0xa008, ZONE, &[rr("www.other.test.", 255, 255, 0, &[])], &[])), false));
    p.push(probe(
        "update: prerequisite holds, add",
        signed(update(0xa009, ZONE, &[rr("www.example.test.", 255, 255, 0, &[])], &[a("held.example.test.", [192, 0, 2, 9])])),
        false,
    ));
    // Zones and policy.
    p.push(probe("update: another zone", signed(update(0xa00a, "other.test.", &[], &[a("x.other.test.", [192, 0, 2, 10])])), false));
    p.push(probe("update: unsigned", update(0xa00b, ZONE, &[], &[a("rogue.example.test.", [192, 0, 2, 66])]), false));
    p.push(probe("update: bad MAC", sign(&update(0xa00c, ZONE, &[], &[a("rogue.example.test.", [192, 0, 2, 66])]), key, Tamper::Mac), false));
    p.push(probe("update: unknown key", sign(&update(0xa00d, ZONE, &[], &[a("rogue.example.test.", [192, 0, 2, 66])]), key, Tamper::UnknownKey), false));
    p.push(probe("update: DNSKEY add refused by policy", signed(update(0xa00e, ZONE, &[], &[rr(ZONE, 48, 1, 300, dnskey_rdata)])), false));
    p.push(probe("update: NSEC3PARAM add refused by policy", signed(update(0xa00f, ZONE, &[], &[rr(ZONE, 51, 1, 0, &[1, 0, 0, 0])])), false));
    p.push(probe("update: delete everything at the apex", signed(update(0xa010, ZONE, &[], &[rr(ZONE, 255, 255, 0, &[])])), false));
    p.push(probe("update: delete DNSKEY RRset", signed(update(0xa011, ZONE, &[], &[rr(ZONE, 48, 255, 0, &[])])), false));
    p.push(probe("update: add outside the zone", signed(update(0xa012, ZONE, &[], &[a("x.other.test.", [192, 0, 2, 12])])), false));
    p.push(probe(
        "update: two zones",
        {
            let mut u = update(0xa013, ZONE, &[], &[]);
            let zone_section = u[12..].to_vec();
            u.extend_from_slice(&zone_section);
            set_counts(&mut u, 2, 0, 0, 0);
            signed(u)
        },
        false,
    ));
    p.push(probe(
        "update: cut short",
        {
            let u = update(0xa014, ZONE, &[], &[a("cut.example.test.", [192, 0, 2, 14])]);
            u[..u.len() - 3].to_vec()
        },
        false,
    ));
    p.push(probe(
        "update: odd NAPTR with a prerequisite on it",
        signed(update(0xa015, ZONE, &[rr("odd.example.test.", 35, 255, 0, &[])], &[txt("odd.example.test.", "naptr seen")])),
        false,
    ));
    p.push(probe("update: add over TCP", signed(update(0xa016, ZONE, &[], &[a("tcp.example.test.", [192, 0, 2, 16])])), true));
    p
}

fn exchange(addr: SocketAddr, p: &Probe, wait: Duration) -> Vec<Vec<u8>> {
    if p.tcp {
        tcp(addr, &p.bytes)
    } else {
        udp_one(addr, &p.bytes, wait).into_iter().collect()
    }
}

fn record_difference(diffs: &mut BTreeMap<String, String>, seen: &mut BTreeMap<String, Vec<Vec<u8>>>, label: &str, replica: &[Vec<u8>], named: &[Vec<u8>]) {
    seen.insert(label.to_string(), replica.to_vec());
    let r: Vec<Vec<u8>> = replica.iter().map(|a| normalized(a)).collect();
    let n: Vec<Vec<u8>> = named.iter().map(|a| normalized(a)).collect();
    if r != n {
        let show = |v: &[Vec<u8>]| v.iter().map(|a| describe(&Some(a.clone()))).collect::<Vec<_>>().join(" | ");
        diffs.insert(label.to_string(), format!("replica: [{}] named: [{}]", show(replica), show(named)));
    }
}

#[test]
fn replica_answers_as_its_named() {
    let c = Cluster::up(ClusterOpts { replicas: 1, ..Default::default() });
    let replica = SocketAddr::from(([127, 0, 0, 1], c.client_port(0)));
    let named = SocketAddr::from(([127, 0, 0, 1], named_port(&c)));
    let key = load_key(&c);
    let mut diffs = BTreeMap::new();
    let mut seen = BTreeMap::new();
    let mut labels = Vec::new();

    // The zone's DNSKEY rdata, for the update the policy must refuse.
    let dnskey = udp_one(named, &query(1, ZONE, 48, 1, None), Duration::from_secs(3)).expect("DNSKEY answer");
    let dnskey_msg = RawMessage::parse(&dnskey).expect("DNSKEY answer parses");
    let dnskey_rdata = dnskey_msg.answers.iter().find(|r| r.rtype == 48).expect("a DNSKEY").rdata.clone();

    // Writes: the replica first, then the same bytes to named.
    for p in write_probes(&key, &dnskey_rdata) {
        let r = exchange(replica, &p, Duration::from_secs(10));
        let n = exchange(named, &p, Duration::from_secs(3));
        record_difference(&mut diffs, &mut seen, &p.label, &r, &n);
        labels.push(p.label);
    }
    // Key material untouched by the refused updates.
    let after = udp_one(named, &query(2, ZONE, 48, 1, None), Duration::from_secs(3)).expect("DNSKEY answer");
    assert_eq!(RawMessage::parse(&after).expect("parses").answers.len(), dnskey_msg.answers.len(), "the apex DNSKEY RRset changed");

    // Reads over UDP, all at once: named first, then the replica (which waits out
    // named's silence before it is silent too).
    let reads = read_probes(&key);
    let (udp, tcp_probes): (Vec<&Probe>, Vec<&Probe>) = reads.iter().partition(|p| !p.tcp);
    let from_named = udp_all(named, &udp, Duration::from_secs(2));
    let from_replica = udp_all(replica, &udp, Duration::from_secs(8));
    for ((p, r), n) in udp.iter().zip(&from_replica).zip(&from_named) {
        record_difference(&mut diffs, &mut seen, &p.label, &r.iter().cloned().collect::<Vec<_>>(), &n.iter().cloned().collect::<Vec<_>>());
        labels.push(p.label.clone());
    }
    for p in tcp_probes {
        record_difference(&mut diffs, &mut seen, &p.label, &tcp(replica, &p.bytes), &tcp(named, &p.bytes));
        labels.push(p.label.clone());
    }

    // Transfers at the serial the zone now has.
    let soa = udp_one(named, &query(3, ZONE, TYPE_SOA, 1, None), Duration::from_secs(3)).expect("SOA answer");
    let serial = RawMessage::parse(&soa).expect("SOA parses").answers[0].soa_serial().expect("serial");
    for p in transfer_probes(serial) {
        let r = exchange(replica, &p, Duration::from_secs(6));
        let n = exchange(named, &p, Duration::from_secs(3));
        record_difference(&mut diffs, &mut seen, &p.label, &r, &n);
        labels.push(p.label);
    }

    // The corpus exercises what it claims: most probes are answered, with the
    // replies named gives to each kind.
    let rcode = |label: &str| -> Option<(u8, bool, usize)> {
        let a = seen.get(label)?.first()?;
        let m = RawMessage::parse(a).ok()?;
        Some((m.header.rcode(), m.header.truncated(), m.answers.len()))
    };
    let answered = seen.values().filter(|v| !v.is_empty()).count();
    println!("{} probes, {answered} answered, {} differences", labels.len(), diffs.len());
    assert!(answered * 10 >= labels.len() * 8, "only {answered} of {} probes answered", labels.len());
    assert_eq!(rcode("odd NAPTR"), Some((0, false, 2)), "the odd NAPTR and its RRSIG");
    assert_eq!(rcode("update: add the odd NAPTR"), Some((0, false, 0)));
    assert_eq!(rcode("update: add typed records"), Some((0, false, 0)));
    assert_eq!(rcode("update: name in use fails").map(|r| r.0), Some(3), "NXDOMAIN");
    assert_eq!(rcode("update: DNSKEY add refused by policy").map(|r| r.0), Some(5), "REFUSED");
    assert_eq!(rcode("update: bad MAC").map(|r| r.0), Some(9), "NOTAUTH");
    assert!(rcode("big TXT no EDNS").is_some_and(|r| r.1), "named's truncation over UDP");
    assert!(rcode("big TXT over TCP no EDNS").is_some_and(|r| !r.1 && r.2 == 12), "whole over TCP");
    assert!(seen["IXFR over TCP from current+0"].len() == 1, "up-to-date IXFR: one message");
    assert!(!seen["AXFR over TCP"].is_empty() && rcode("AXFR over TCP").is_some_and(|r| r.0 == 0 && r.2 > 10));
    let signed = |label: &str| seen.get(label).and_then(|v| v.first()).and_then(|a| RawMessage::parse(a).ok()).is_some_and(|m| m.tsig().is_some());
    assert!(rcode("TSIG good type 1").is_some_and(|r| r.0 == 0 && r.2 == 1) && signed("TSIG good type 1"), "a signed query answered and signed");
    assert_eq!(rcode("TSIG bad MAC type 1").map(|r| r.0), Some(9), "NOTAUTH (BADSIG)");
    assert!(seen["a response"].is_empty() && seen["eleven bytes"].is_empty(), "never answered");

    // The answers the wrapper makes itself have named's shape: its REFUSED to a
    // client an address ACL does not allow equals named's REFUSED to a query it
    // refuses (a name outside its zone), id and all, with and without EDNS and DO.
    for (k, e) in
        [None, Some(EdnsOpts { size: 4096, version: 0, dnssec_ok: true }), Some(EdnsOpts { size: 1232, version: 0, dnssec_ok: false })].into_iter().enumerate()
    {
        let mut q = query(0x7700 + k as u16, "www.other.test.", 1, 1, e);
        q[2] |= 0x01; // RD, which named echoes
        let from_named = udp_one(named, &q, Duration::from_secs(3)).expect("named refuses out-of-zone queries");
        assert_eq!(RawMessage::parse(&from_named).expect("parses").header.rcode(), 5);
        assert_eq!(exec::answer::error_answer(&q, exec::answer::RCODE_REFUSED).as_deref(), Some(&from_named[..]), "wrapper's REFUSED vs named's, EDNS {k}");
    }

    // Address ACLs: the cluster's config lets 127.0.0.1 transfer, not 127.0.0.2 (which
    // named, seeing only the wrapper, could not tell apart); queries are open to both.
    let axfr = query(0x7801, ZONE, TYPE_AXFR, 1, None);
    let refused = tcp_from([127, 0, 0, 2], replica, &axfr);
    assert_eq!(refused.len(), 1, "one REFUSED for a transfer from an address not allowed");
    assert_eq!(Some(&refused[0]), exec::answer::error_answer(&axfr, exec::answer::RCODE_REFUSED).as_ref());
    let allowed = tcp(replica, &axfr);
    assert!(!allowed.is_empty() && RawMessage::parse(&allowed[0]).is_ok_and(|m| m.header.rcode() == 0 && m.answers.len() > 10), "AXFR from 127.0.0.1");
    let q = query(0x7802, "www.example.test.", 1, 1, None);
    let s = UdpSocket::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    s.send_to(&q, replica).expect("send");
    let mut buf = [0u8; 4096];
    let n = s.recv(&mut buf).expect("a query from 127.0.0.2 is answered");
    assert_eq!(normalized(&buf[..n]), normalized(&udp_one(named, &q, Duration::from_secs(3)).expect("named answers")));

    // The status line `cluster up` prints, run as printed, reports this cluster (on
    // its custom ports), not one on the default ports.
    let usage = c.start_stopped();
    let status_line = usage.lines().map(str::trim).find(|l| l.contains(" cluster status ")).expect("a status line").to_string();
    assert!(status_line.contains(&format!("--client-port {}", c.client_port(0))), "{status_line}");
    let words: Vec<&str> = status_line.split_whitespace().collect();
    let out = std::process::Command::new(sdns_system_tests::sdns_bin()).args(&words[1..]).output().expect("cluster status");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && report.lines().nth(1).is_some_and(|l| l.split_whitespace().nth(8) == Some("ok")), "{status_line}\n{report}");

    let mut unique = labels.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), labels.len(), "probe labels must be unique");
    assert!(labels.len() >= 300, "a corpus of a few hundred probes, got {}", labels.len());
    let expected: BTreeMap<&str, &str> = EXPECTED_DIFFERENCES.iter().copied().collect();
    let unexplained: Vec<String> = diffs.iter().filter(|(l, _)| !expected.contains_key(l.as_str())).map(|(l, d)| format!("{l}: {d}")).collect();
    let gone: Vec<&&str> = expected.keys().filter(|l| !diffs.contains_key(**l)).collect();
    assert!(
        unexplained.is_empty() && gone.is_empty(),
        "{} probes; unexplained differences:\n{}\nlisted differences that no longer occur: {gone:?}\n{}",
        labels.len(),
        unexplained.join("\n"),
        c.logs()
    );
}
