//! The voting client against a real cluster: `sdns query`, `sdns update` and `sdns stub`
//! with a lying replica, a silent replica, and more than t faulty ones; and on zones signed
//! with threshold ECDSA P-256 and Ed25519 (issue 27).
//!
//! The faulty replicas are stand-ins at their own addresses: a liar that relays each query to
//! a real replica and rewrites every A record in the answer, and a silent socket that never
//! answers. The voting client is given the stand-in's address in the replica's place.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use hickory_proto::op::Message;
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::RData;
use sdns_system_tests::{bind, run, sdns_bin, text, Cluster, ClusterOpts, Replicas};
use testkit::FakeDns;

const LIE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 66);

/// A fake replica: relays every query to `upstream` over UDP and rewrites each A record of the
/// answer to [`LIE`] (UDP and TCP). Stops when dropped.
fn start_liar(upstream: SocketAddr) -> FakeDns {
    FakeDns::start(move |query| relay_and_lie(query, upstream))
}

fn relay_and_lie(query: &[u8], upstream: SocketAddr) -> Option<Vec<u8>> {
    let sock = UdpSocket::bind("127.0.0.1:0").ok()?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    sock.send_to(query, upstream).ok()?;
    let mut buf = vec![0u8; 65_535];
    let (n, _) = sock.recv_from(&mut buf).ok()?;
    let mut answer = Message::from_vec(&buf[..n]).ok()?;
    for r in answer.answers.iter_mut() {
        if matches!(r.data, RData::A(_)) {
            r.data = RData::A(A(LIE));
        }
    }
    answer.to_vec().ok()
}

/// A replica that never answers: its sockets are bound, nobody reads them.
struct Silent {
    addr: SocketAddr,
    _udp: UdpSocket,
    _tcp: TcpListener,
}

impl Silent {
    fn start() -> Silent {
        // The kernel's free UDP port may be taken for TCP: try a few.
        for _ in 0..100 {
            let udp = UdpSocket::bind("127.0.0.1:0").expect("silent udp");
            let addr = udp.local_addr().expect("addr");
            if let Ok(tcp) = TcpListener::bind(addr) {
                return Silent { addr, _udp: udp, _tcp: tcp };
            }
        }
        panic!("no loopback port free for both UDP and TCP")
    }
}

/// A loopback port free for both UDP and TCP at the time of asking.
fn free_udp_and_tcp_port() -> SocketAddr {
    for _ in 0..100 {
        let Ok(udp) = UdpSocket::bind("127.0.0.1:0") else { continue };
        let Ok(addr) = udp.local_addr() else { continue };
        if TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free loopback port for the stub");
}

fn replica(c: &Cluster, i: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], c.client_port(i)))
}

fn list(addrs: &[SocketAddr]) -> String {
    addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// `sdns query` with short timeouts (silent replicas cost a few of them).
fn query(addrs: &[SocketAddr], args: &[&str]) -> (Option<i32>, String) {
    let out = run(Command::new(sdns_bin()).args(["query", "--timeout-ms", "400", "--tries", "2", "--replicas", &list(addrs)]).args(args));
    (out.status.code(), text(&out))
}

fn update(c: &Cluster, addrs: &[SocketAddr], command: &str) -> (Option<i32>, String) {
    let out = run(Command::new(sdns_bin())
        .args(["update", "--timeout-ms", "1000", "--zone", "example.test", "-k"])
        .arg(c.path("tsig.key"))
        .args(["--replicas", &list(addrs)])
        .args(command.split_whitespace()));
    (out.status.code(), text(&out))
}

fn dig_at(addr: SocketAddr, args: &[&str]) -> String {
    bind::dig_at(addr, &["+norec", "+time=3", "+tries=2"], args)
}

struct Stub(Child);

impl Drop for Stub {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn voting_client_outvotes_liars_survives_silence_and_sees_its_updates() {
    let c = Cluster::up(ClusterOpts::default());
    let honest: Vec<SocketAddr> = (0..c.n).map(|i| replica(&c, i)).collect();
    let liar = start_liar(replica(&c, 3));
    let silent = Silent::start();

    // A liar in replica 3's place: dig against it shows the lie...
    let lie = dig_at(liar.addr(), &["www.example.test", "A", "+short"]);
    assert_eq!(lie.trim(), LIE.to_string(), "dig through the fake replica:\n{lie}");
    // ...the voting client returns the truth and names the liar (G1).
    let with_liar = [honest[0], honest[1], honest[2], liar.addr()];
    let (code, out) = query(&with_liar, &["www.example.test", "A"]);
    assert_eq!(code, Some(0), "{out}\n{}", c.logs());
    assert!(out.contains("192.0.2.80") && !out.contains(&format!("A\t{LIE}")), "accepted the wrong answer:\n{out}");
    assert!(out.contains(&format!("DISAGREED: replica 3 ({})", liar.addr())) && out.contains(&LIE.to_string()), "the liar is not named:\n{out}");
    // Answered by the unordered voting read: 2t+1 = 3 replicas agreed without ordering.
    assert!(out.contains("voting read: 4 of 4 replicas answered") && !out.contains("ordered read"), "{out}");
    // +dnssec: RRSIGs are compared as data and the signed answer is accepted.
    let (code, out) = query(&with_liar, &["mail.example.test", "A", "+dnssec"]);
    assert!(code == Some(0) && out.contains("RRSIG") && out.contains("192.0.2.25"), "{out}");

    // The replica set from a replica's config file instead of --replicas.
    let out = run(Command::new(sdns_bin()).args(["query", "--config"]).arg(c.path("replica-0/replica.toml")).args(["mail.example.test", "A", "+short"]));
    assert_eq!((out.status.code(), text(&out).trim()), (Some(0), "192.0.2.25"), "query --config");

    // A silent replica in replica 2's place: still an answer (G2).
    let with_silent = [honest[0], honest[1], silent.addr, honest[3]];
    let (code, out) = query(&with_silent, &["www.example.test", "A", "+short"]);
    assert_eq!((code, out.trim()), (Some(0), "192.0.2.80"), "with a silent replica");

    // More than t faulty: two liars (agreeing on the same lie) against two honest replicas, or
    // a liar and a silent replica. No quorum, no guess, and a distinct exit status.
    let liar2 = start_liar(replica(&c, 2));
    for (what, set) in
        [("two liars", [honest[0], honest[1], liar2.addr(), liar.addr()]), ("a liar and a silent replica", [honest[0], honest[1], silent.addr, liar.addr()])]
    {
        let (code, out) = query(&set, &["www.example.test", "A"]);
        assert_eq!(code, Some(3), "{what}: expected exit 3 (no quorum):\n{out}");
        assert!(out.contains("NO QUORUM") && !out.contains("ANSWER SECTION"), "{what}:\n{out}");
    }
    // Two silent replicas: too few answers, exit 4.
    let silent2 = Silent::start();
    let (code, out) = query(&[honest[0], honest[1], silent.addr, silent2.addr], &["www.example.test", "A"]);
    assert_eq!(code, Some(4), "two silent replicas: expected exit 4 (timeout):\n{out}");

    // Updates: n - t matching acknowledgements, even with a silent replica; afterwards no voting read
    // returns the old data.
    let (code, out) = update(&c, &with_silent, "add voted.example.test 300 A 192.0.2.77");
    assert_eq!(code, Some(0), "sdns update failed:\n{out}\n{}", c.logs());
    for _ in 0..5 {
        let (code, out) = query(&honest, &["voted.example.test", "A", "+short"]);
        assert_eq!((code, out.trim()), (Some(0), "192.0.2.77"), "a voting read after the update");
    }
    let (code, out) = update(&c, &honest, "delete www.example.test A");
    assert_eq!(code, Some(0), "sdns update (delete) failed:\n{out}\n{}", c.logs());
    for _ in 0..5 {
        let (code, out) = query(&honest, &["www.example.test", "A"]);
        assert!(code == Some(0) && out.contains("ANSWER: 0") && !out.contains("192.0.2.80"), "old data after the delete:\n{out}");
    }
    // Without the key every named refuses, and the replicas agree on that (exit 1).
    let out = run(Command::new(sdns_bin()).args([
        "update",
        "--zone",
        "example.test",
        "--replicas",
        &list(&honest),
        "add",
        "rogue.example.test",
        "300",
        "A",
        "192.0.2.66",
    ]));
    assert_eq!(out.status.code(), Some(1), "an unsigned update must be refused:\n{}", text(&out));
    assert!(text(&out).contains("REFUSED"), "{}", text(&out));

    // The stub: dig against it gets the truth while replica 3 lies, over UDP and TCP.
    let stub_addr = free_udp_and_tcp_port();
    let stub_log = c.path("stub.log");
    let mut stub = Stub(
        Command::new(sdns_bin())
            .args(["stub", "--listen", &stub_addr.to_string(), "--replicas", &list(&with_liar)])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stub_log).expect("stub log"))
            .spawn()
            .expect("sdns stub"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = dig_at(stub_addr, &["mail.example.test", "A", "+short"]);
        if out.trim() == "192.0.2.25" {
            break;
        }
        let exited = stub.0.try_wait().ok().flatten();
        let log = std::fs::read_to_string(&stub_log).unwrap_or_default();
        assert!(exited.is_none() && Instant::now() < deadline, "the stub never answered ({exited:?}):\n{out}\n{log}");
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(dig_at(liar.addr(), &["mail.example.test", "A", "+short"]).trim(), LIE.to_string());
    let out = dig_at(stub_addr, &["voted.example.test", "A", "+tcp"]);
    assert!(out.contains("status: NOERROR") && out.contains("192.0.2.77") && !out.contains(&LIE.to_string()), "stub over TCP:\n{out}");
    let out = dig_at(stub_addr, &["nothere.example.test", "A"]);
    assert!(out.contains("status: NXDOMAIN"), "stub passes the agreed NXDOMAIN on:\n{out}");
}

/// The RRSIG over type `covered` (1 for A) in an `sdns query` answer, which prints RRSIG rdata
/// as base64: (algorithm, signature length in bytes).
fn rrsig_of(answer: &str, covered: u16) -> Option<(u8, usize)> {
    use base64::Engine;
    answer.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let at = f.iter().position(|w| *w == "RRSIG")?;
        let rdata = base64::engine::general_purpose::STANDARD.decode(f.get(at + 1..)?.concat()).ok()?;
        // Type covered, algorithm, labels, TTL, expiration, inception, key tag; the signer's
        // name; the signature.
        let mut end = 18;
        while *rdata.get(end)? != 0 {
            end += 1 + usize::from(rdata[end]);
        }
        (u16::from_be_bytes([*rdata.first()?, *rdata.get(1)?]) == covered).then(|| (rdata[2], rdata.len() - end - 1))
    })
}

/// Issue 27: the voting client on a zone whose key is threshold ECDSA P-256 (13) or Ed25519
/// (15). The accepted `+dnssec` answer carries the algorithm's 64-byte RRSIG, the same bytes
/// from every replica (a voting read compares RRSIGs as data: no replica disagreed), while a
/// liar in replica 3's place is outvoted and named; `sdns update` is acknowledged by n - t
/// replicas, voting reads return the new name at once, and delv validates it.
fn voting_on(algorithm: u8) {
    let c = Cluster::up(ClusterOpts { extra: vec!["--algorithm".into(), algorithm.to_string()], ..ClusterOpts::default() });
    let honest: Vec<SocketAddr> = (0..c.n).map(|i| replica(&c, i)).collect();

    let (code, out) = query(&honest, &["mail.example.test", "A", "+dnssec"]);
    assert_eq!(code, Some(0), "{out}\n{}", c.logs());
    assert!(out.contains("192.0.2.25") && out.contains("voting read: 4 of 4 replicas answered") && !out.contains("DISAGREED"), "{out}");
    assert_eq!(rrsig_of(&out, 1), Some((algorithm, 64)), "a 64-byte RRSIG of algorithm {algorithm}:\n{out}");

    let liar = start_liar(replica(&c, 3));
    let with_liar = [honest[0], honest[1], honest[2], liar.addr()];
    let (code, out) = query(&with_liar, &["mail.example.test", "A", "+dnssec"]);
    assert_eq!(code, Some(0), "{out}\n{}", c.logs());
    assert!(out.contains("192.0.2.25") && !out.contains(&format!("A\t{LIE}")), "accepted the wrong answer:\n{out}");
    assert!(out.contains(&format!("DISAGREED: replica 3 ({})", liar.addr())), "the liar is not named:\n{out}");

    let (code, out) = update(&c, &honest, "add voted.example.test 300 A 192.0.2.77");
    assert_eq!(code, Some(0), "sdns update failed:\n{out}\n{}", c.logs());
    for _ in 0..3 {
        let (code, out) = query(&with_liar, &["voted.example.test", "A", "+dnssec"]);
        assert_eq!(code, Some(0), "a voting read after the update:\n{out}");
        assert!(out.contains("192.0.2.77") && !out.contains(&format!("A\t{LIE}")), "a voting read after the update:\n{out}");
        assert_eq!(rrsig_of(&out, 1), Some((algorithm, 64)), "the update's RRSIG:\n{out}");
    }
    let out = c.delv(2, "voted.example.test", "A");
    assert!(out.contains("; fully validated") && out.contains("192.0.2.77"), "delv through replica 2:\n{out}");
}

#[test]
fn voting_client_on_an_ecdsa_p256_zone() {
    voting_on(13);
}

#[test]
fn voting_client_on_an_ed25519_zone() {
    voting_on(15);
}
