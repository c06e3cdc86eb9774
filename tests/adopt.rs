//! `sdns adopt` against a BIND installation laid out as Debian's bind9 package lays it
//! out (/etc/bind/named.conf including named.conf.options and named.conf.local, key
//! files from tsig-keygen), read with Debian's own named-checkconf and named-compilezone
//! (bind9-utils): two primary zones, a forward one with an update-policy and a reverse
//! one with allow-update, are adopted each into a 4-replica cluster that then takes
//! updates signed with the operator's original key files; zones the adoption cannot take
//! are reported with their reasons. The reverse zone is taken by AXFR from a running named
//! (the BIND build's; Debian's named is not installed in CI) after a dynamic update there.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sdns_system_tests::{bind, bind_dir, free_port_block, metric_value, metrics_page, ports, run, sdns_bin, text, Nsupdate, Replicas};

/// Debian's bind9-utils: the operator's BIND tools, not the patched build.
const SYSTEM_BIN: &str = "/usr/bin";

fn system_tool(name: &str) -> PathBuf {
    let p = Path::new(SYSTEM_BIN).join(name);
    assert!(p.is_file(), "no {} (Debian's bind9-utils; scripts/install-deps.sh installs it)", p.display());
    p
}

/// An /etc/bind as the operator has it, under `root`.
fn operator_bind(root: &Path) -> PathBuf {
    let etc = root.join("etc/bind");
    let cache = root.join("var/cache/bind");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    // The operator's keys, made by BIND's tsig-keygen as the DHCP server's setup does.
    for (name, alg, file) in [("dhcp-key", "hmac-sha256", "dhcp.key"), ("ops-key", "hmac-sha512", "ops.key")] {
        let out = run(Command::new(bind_dir().join("sbin/tsig-keygen")).args(["-a", alg, name]));
        assert!(out.status.success(), "tsig-keygen: {}", text(&out));
        std::fs::write(etc.join(file), &out.stdout).unwrap();
    }
    let e = etc.display();
    std::fs::write(
        etc.join("named.conf"),
        format!("include \"{e}/named.conf.options\";\ninclude \"{e}/named.conf.local\";\ninclude \"{e}/named.conf.default-zones\";\n"),
    )
    .unwrap();
    std::fs::write(
        etc.join("named.conf.options"),
        format!("options {{\n\tdirectory \"{}\";\n\tdnssec-validation auto;\n\tlisten-on-v6 {{ any; }};\n}};\n", cache.display()),
    )
    .unwrap();
    std::fs::write(
        etc.join("named.conf.default-zones"),
        format!(
            "zone \"localhost\" {{\n\ttype master;\n\tfile \"{e}/db.local\";\n}};\nzone \"127.in-addr.arpa\" {{\n\ttype master;\n\tfile \"{e}/db.127\";\n}};\n"
        ),
    )
    .unwrap();
    std::fs::write(
        etc.join("named.conf.local"),
        format!(
            "include \"{e}/dhcp.key\";\ninclude \"{e}/ops.key\";\n\
             // The DHCP server may register hosts; the operators may change anything.\n\
             zone \"corp.test\" {{\n\ttype master;\n\tfile \"{e}/db.corp.test\";\n\
             \tupdate-policy {{\n\t\tgrant dhcp-key zonesub A AAAA TXT;\n\t\tgrant ops-key zonesub ANY;\n\t}};\n\
             \tallow-transfer {{ key ops-key; }};\n}};\n\
             zone \"2.0.192.in-addr.arpa\" {{\n\ttype master;\n\tfile \"db.192.0.2\";\n\tallow-update {{ key dhcp-key; }};\n\tnotify no;\n}};\n\
             zone \"signed.test\" {{\n\ttype master;\n\tfile \"{e}/db.signed.test\";\n\tdnssec-policy default;\n\tinline-signing yes;\n}};\n\
             zone \"legacy.test\" {{\n\ttype master;\n\tfile \"{e}/db.legacy.test\";\n\tallow-update {{ 192.0.2.0/24; }};\n}};\n\
             zone \"partner.test\" {{\n\ttype slave;\n\tfile \"partner.test.db\";\n\tmasters {{ 192.0.2.1; }};\n}};\n"
        ),
    )
    .unwrap();
    std::fs::write(
        etc.join("db.corp.test"),
        "$TTL 3600\n@\tIN\tSOA\tns1.corp.test. hostmaster.corp.test. ( 2024060101 3600 900 604800 300 )\n\
         \tIN\tNS\tns1\n\tIN\tMX\t10 mail\nns1\tIN\tA\t192.0.2.53\nmail\tIN\tA\t192.0.2.25\nwww\tIN\tA\t192.0.2.80\n",
    )
    .unwrap();
    // Relative to options { directory }, as Debian's own examples put zone files.
    std::fs::write(
        cache.join("db.192.0.2"),
        "$TTL 3600\n@\tIN\tSOA\tns1.corp.test. hostmaster.corp.test. 7 3600 900 604800 300\n\
         \tIN\tNS\tns1.corp.test.\n53\tIN\tPTR\tns1.corp.test.\n80\tIN\tPTR\twww.corp.test.\n",
    )
    .unwrap();
    etc.join("named.conf")
}

/// The records of a dig AXFR, DNSSEC and TSIG records left out, one normalised line each
/// (the SOA without its serial), sorted and deduplicated (AXFR repeats the SOA).
fn records(axfr: &str) -> Vec<String> {
    let mut out: Vec<String> = axfr
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .filter_map(|l| {
            let mut f: Vec<String> = l.split_whitespace().map(str::to_ascii_lowercase).collect();
            let t = f.get(3)?.to_ascii_uppercase();
            if ["RRSIG", "NSEC", "NSEC3", "NSEC3PARAM", "DNSKEY", "TSIG", "TYPE65534"].contains(&t.as_str()) {
                return None;
            }
            if t == "SOA" && f.len() > 6 {
                f.remove(6);
            }
            Some(f.join(" "))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn sdns(args: &[&str]) -> Output {
    run(Command::new(sdns_bin()).args(args))
}

fn adopt_args<'a>(conf: &'a str, zone: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "adopt",
        "--named-conf",
        conf,
        "--zone",
        zone,
        "--out",
        out,
        "--bits",
        "1024",
        "--named-checkconf",
        "/usr/bin/named-checkconf",
        "--named-compilezone",
        "/usr/bin/named-compilezone",
    ]
}

/// A cluster started with `sdns cluster up` on an adopted directory; stopped on drop.
struct Adopted {
    dir: PathBuf,
    zone: String,
    base: u16,
}

impl Adopted {
    /// Adopts `zone` from `conf` into `dir` (with `extra` adopt arguments, and `cluster`
    /// arguments for both the adoption and `cluster up`) and starts its four replicas.
    fn up(conf: &Path, zone: &str, dir: PathBuf, extra: &[&str], cluster: &[&str]) -> Adopted {
        Adopted::up_zones(conf, &[zone], dir, extra, cluster)
    }

    /// Adopts every zone of `zones` into one cluster (the first is `zone` for the helpers
    /// that take no zone) and starts it.
    fn up_zones(conf: &Path, zones: &[&str], dir: PathBuf, extra: &[&str], cluster: &[&str]) -> Adopted {
        let base = free_port_block(4);
        let port_args = ports(base);
        let mut args = adopt_args(conf.to_str().unwrap(), zones[0], dir.to_str().unwrap());
        for z in &zones[1..] {
            args.extend(["--zone", z]);
        }
        args.extend(extra);
        args.extend(cluster);
        let bind = bind_dir();
        args.extend(["--bind-dir", bind.to_str().unwrap()]);
        args.extend(port_args.iter().map(String::as_str));
        let out = sdns(&args);
        assert!(out.status.success(), "sdns adopt --zone {}:\n{}", zones.join(" --zone "), text(&out));
        let report = String::from_utf8_lossy(&out.stdout).into_owned();
        for zone in zones {
            assert!(report.contains(&format!("adopted    {zone}.")), "{report}");
        }
        let mut up = vec!["cluster", "up", "--replicas", "4", "--dir", dir.to_str().unwrap(), "--bind-dir", bind.to_str().unwrap()];
        for z in zones {
            up.extend(["--zone", z]);
        }
        up.extend(port_args.iter().map(String::as_str));
        up.extend(cluster);
        let started = Adopted { dir: dir.clone(), zone: zones[0].to_owned(), base };
        let out = sdns(&up);
        assert!(out.status.success(), "cluster up:\n{}\n{}", text(&out), started.logs());
        started
    }

    fn port(&self, i: u16) -> u16 {
        self.client_port(i)
    }

    /// A counter or gauge from replica `i`'s /metrics (0 when absent).
    fn metric(&self, i: u16, name: &str) -> u64 {
        metric_value(&metrics_page(self.base + 301 + i), name)
    }

    /// nsupdate -k KEY through replica `i` to the first zone: (success, output).
    fn update(&self, i: u16, key: &Path, commands: &str) -> (bool, String) {
        self.nsupdate_in(i, &self.zone, key, commands)
    }
}

impl Replicas for Adopted {
    fn count(&self) -> u16 {
        4
    }

    fn client_port(&self, i: u16) -> u16 {
        self.base + 1 + i
    }

    fn zone(&self) -> &str {
        &self.zone
    }

    /// The key `sdns adopt` dealt for the cluster (the operator's own keys are given by name).
    fn update_key(&self) -> PathBuf {
        self.dir.join("tsig.key")
    }

    /// The dealer's transfer key transfers every zone.
    fn transfer_key(&self) -> PathBuf {
        self.dir.join("transfer.key")
    }

    fn logs(&self) -> String {
        (0..4).map(|i| std::fs::read_to_string(self.dir.join(format!("replica-{i}/sdns.log"))).unwrap_or_default()).collect::<Vec<_>>().join("\n---\n")
    }
}

impl Drop for Adopted {
    fn drop(&mut self) {
        let _ = Command::new(sdns_bin()).args(["cluster", "down", "--replicas", "4"]).arg("--dir").arg(&self.dir).output();
    }
}

/// A plain named (the BIND build's, without any sdns part) serving the reverse zone from a
/// copy of the operator's file, as the operator's server does before the adoption.
struct RunningNamed {
    child: std::process::Child,
    port: u16,
    dir: PathBuf,
}

impl RunningNamed {
    fn start(root: &Path, etc: &Path) -> RunningNamed {
        let dir = root.join("running-named");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(root.join("var/cache/bind/db.192.0.2"), dir.join("db.192.0.2")).unwrap();
        let port = free_port_block(1) + 1;
        let d = dir.display();
        std::fs::write(
            dir.join("named.conf"),
            format!(
                "options {{
	directory \"{d}\";
	pid-file \"{d}/named.pid\";
	session-keyfile \"{d}/session.key\";
                 	listen-on port {port} {{ 127.0.0.1; }};
	listen-on-v6 {{ none; }};
	recursion no;
	dnssec-validation no;
}};
                 controls {{ }};
include \"{}/dhcp.key\";
                 zone \"2.0.192.in-addr.arpa\" {{
	type primary;
	file \"{d}/db.192.0.2\";
	allow-update {{ key dhcp-key; }};
                 	allow-transfer {{ 127.0.0.1; }};
	notify no;
}};
",
                etc.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("named.log")).unwrap();
        let child = Command::new(bind_dir().join("sbin/named"))
            .args(["-g", "-4", "-n", "1", "-c"])
            .arg(dir.join("named.conf"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("named");
        let named = RunningNamed { child, port, dir };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let soa = bind::dig(port, &["+short", "+time=1", "+tries=1", "2.0.192.in-addr.arpa", "SOA"]);
            if soa.contains("hostmaster.corp.test.") {
                return named;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the running named never answered:\n{}",
                std::fs::read_to_string(named.dir.join("named.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    fn nsupdate(&self, key: &Path, commands: &str) -> (bool, String) {
        Nsupdate::to(self.port, "2.0.192.in-addr.arpa").key(key).timeout_s(10).send(commands)
    }
}

impl Drop for RunningNamed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_report_names_every_zone_and_why() {
    let root = tempfile::tempdir().unwrap();
    let conf = operator_bind(root.path());
    let out = sdns(&["adopt", "--list", "--named-conf", conf.to_str().unwrap(), "--named-checkconf", system_tool("named-checkconf").to_str().unwrap()]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    for line in [
        "adoptable  corp.test.  (update keys: dhcp-key, ops-key; transfer keys: ops-key; 2 update rule(s))",
        "adoptable  2.0.192.in-addr.arpa.  (update keys: dhcp-key; transfer keys: none; 1 update rule(s))",
        "cannot     signed.test.",
        "because: inline-signing yes",
        // BIND's default policy signs with ECDSA P-256: listed with the adoption's refusal.
        "because: your KSK uses DNSSEC algorithm 13, the threshold key 8 (--algorithm)",
        "cannot     legacy.test.",
        "because: allow-update by address (`192.0.2.0/24`)",
        "skipped    partner.test.  (type slave: only primary zones are adopted)",
        "skipped    localhost.  (a built-in local zone",
    ] {
        assert!(report.contains(line), "missing {line:?} in\n{report}");
    }

    // Asked for a zone it cannot take: the reasons, exit status 2, nothing dealt.
    let dealt = root.path().join("signed");
    let out = sdns(&adopt_args(conf.to_str().unwrap(), "signed.test", dealt.to_str().unwrap()));
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("zone signed.test. cannot be adopted: inline-signing yes"), "{said}");
    assert!(!dealt.join("replica-0").exists());
    // Several zones, two of them not adoptable: each named with its reasons, nothing dealt.
    let mut args = adopt_args(conf.to_str().unwrap(), "corp.test", dealt.to_str().unwrap());
    args.extend(["--zone", "signed.test", "--zone", "legacy.test"]);
    let out = sdns(&args);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("zone signed.test. cannot be adopted: inline-signing yes"), "{said}");
    assert!(said.contains("zone legacy.test. cannot be adopted: allow-update by address"), "{said}");
    assert!(!dealt.join("replica-0").exists() && !dealt.join("adopted.toml").exists());
    let out = sdns(&adopt_args(conf.to_str().unwrap(), "nowhere.test", dealt.to_str().unwrap()));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("defines no zone nowhere.test."), "{}", text(&out));

    // A configuration BIND's parser refuses is refused with BIND's words.
    let broken = root.path().join("broken.conf");
    std::fs::write(&broken, "zone \"x.test\" { type master; file \"x\" };\n").unwrap();
    let out = sdns(&["adopt", "--list", "--named-conf", broken.to_str().unwrap(), "--named-checkconf", "/usr/bin/named-checkconf"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("named-checkconf -p") && text(&out).contains("missing ';'"), "{}", text(&out));
}

#[test]
fn adopted_zones_take_updates_signed_with_the_operators_keys() {
    let root = tempfile::tempdir().unwrap();
    let conf = operator_bind(root.path());
    let etc = conf.parent().unwrap().to_owned();
    let dhcp_key = etc.join("dhcp.key");
    let ops_key = etc.join("ops.key");

    // The forward zone, with its update-policy.
    let corp = Adopted::up(&conf, "corp.test", root.path().join("corp"), &[], &[]);
    let file = run(Command::new(system_tool("named-compilezone")).args(["-q", "-s", "full", "-o", "-", "corp.test"]).arg(etc.join("db.corp.test")));
    let before = records(&String::from_utf8_lossy(&file.stdout));
    assert!(before.len() == 6, "{before:?}");
    let key = corp.dir.join("transfer.key");
    for i in 0..4 {
        assert_eq!(records(&corp.dig(i, &["-k", key.to_str().unwrap(), "corp.test", "AXFR"])), before, "replica {i}'s zone differs from the zone file");
    }
    let (ok, said) = corp.update(1, &dhcp_key, "update add laptop-7.corp.test 300 A 192.0.2.107");
    assert!(ok, "the DHCP server's key must still register hosts: {said}\n{}", corp.logs());
    for i in 0..4 {
        let answer = corp.dig(i, &["laptop-7.corp.test", "A", "+dnssec"]);
        assert!(answer.contains("192.0.2.107") && answer.contains("RRSIG\tA 8 3 300"), "replica {i}:\n{answer}");
    }
    let delv = bind::delv(corp.port(2), &corp.dir.join("trust-anchor.conf"), "laptop-7.corp.test", "A", "corp.test");
    assert!(delv.contains("; fully validated") && delv.contains("192.0.2.107"), "{delv}");
    // The policy is the operator's: the DHCP key may not touch MX, the operators' key may.
    let (ok, said) = corp.update(2, &dhcp_key, "update add corp.test 300 MX 20 mail.corp.test.");
    assert!(!ok && said.contains("REFUSED"), "{said}");
    let (ok, said) = corp.update(3, &ops_key, "update add corp.test 300 MX 20 mail.corp.test.");
    assert!(ok, "{said}");
    assert!(corp.dig(0, &["corp.test", "MX"]).contains("20 mail.corp.test."));
    // The dealer's own key is known, but the operator's policy grants it nothing.
    let (ok, said) = corp.update(0, &corp.dir.join("tsig.key"), "update add dealer.corp.test 300 A 192.0.2.9");
    assert!(!ok && said.contains("REFUSED"), "{said}");
    // allow-transfer { key ops-key; }: the operator's key transfers the zone.
    let axfr = corp.dig(0, &["-k", ops_key.to_str().unwrap(), "corp.test", "AXFR"]);
    assert!(axfr.contains("laptop-7.corp.test.") && axfr.contains("DNSKEY"), "{axfr}");

    // Taking the zone by AXFR from a running server works, and a zone that arrives signed
    // by a key whose private half is not at hand is refused: the rollover needs it.
    let again = root.path().join("again");
    let server = format!("127.0.0.1:{}", corp.port(0));
    let mut args = adopt_args(conf.to_str().unwrap(), "corp.test", again.to_str().unwrap());
    args.extend(["--server", &server, "--axfr-key", ops_key.to_str().unwrap()]);
    let out = sdns(&args);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("KSK file") && text(&out).contains("is not there (give the key directory with --key-dir)"), "{}", text(&out));
    drop(corp);

    // The reverse zone, with allow-update, in a cluster of its own, taken by AXFR from the
    // named that serves it now: a host the DHCP server registered there since the zone file
    // was written comes along.
    let running = RunningNamed::start(root.path(), &etc);
    let (ok, said) = running.nsupdate(&dhcp_key, "update add 99.2.0.192.in-addr.arpa 300 PTR printer.corp.test.");
    assert!(ok, "update on the running named: {said}");
    let server = format!("127.0.0.1:{}", running.port);
    let before = records(&bind::dig(running.port, &["2.0.192.in-addr.arpa", "AXFR"]));
    assert!(before.iter().any(|r| r.contains("printer.corp.test.")), "{before:?}");
    let reverse = Adopted::up(&conf, "2.0.192.in-addr.arpa", root.path().join("reverse"), &["--server", &server], &[]);
    drop(running);
    // Every record the old server gave is served by every replica, DNSSEC records aside
    // (and the SOA serial, which the signing moved on).
    let key = reverse.dir.join("transfer.key");
    for i in 0..4 {
        let after = records(&reverse.dig(i, &["-k", key.to_str().unwrap(), "2.0.192.in-addr.arpa", "AXFR"]));
        assert_eq!(after, before, "replica {i}'s zone differs from the old server's");
    }
    let answer = reverse.dig(1, &["80.2.0.192.in-addr.arpa", "PTR", "+dnssec"]);
    assert!(answer.contains("www.corp.test.") && answer.contains("RRSIG\tPTR"), "{answer}");
    let (ok, said) = reverse.update(2, &dhcp_key, "update add 107.2.0.192.in-addr.arpa 300 PTR laptop-7.corp.test.");
    assert!(ok, "{said}\n{}", reverse.logs());
    for i in 0..4 {
        assert!(reverse.dig(i, &["107.2.0.192.in-addr.arpa", "PTR"]).contains("laptop-7.corp.test."), "replica {i}");
    }
    // The operators' key is not in this zone's allow-update.
    let (ok, said) = reverse.update(0, &ops_key, "update add 108.2.0.192.in-addr.arpa 300 PTR x.corp.test.");
    assert!(!ok, "{said}");
    assert!(!reverse.dig(0, &["108.2.0.192.in-addr.arpa", "PTR"]).contains("x.corp.test."));
}

/// The operator's named for a zone it signs itself with `dnssec-policy` (a KSK and a ZSK,
/// RSASHA256; or BIND's `default`, one CSK of ECDSAP256SHA256): Debian's /usr/sbin/named (the
/// bind9 package) where installed, else the BIND build's named, which is the same 9.18
/// without the signing socket.
struct SigningNamed {
    child: std::process::Child,
    port: u16,
    dir: PathBuf,
    conf: PathBuf,
}

impl SigningNamed {
    fn start(root: &Path) -> SigningNamed {
        SigningNamed::start_with(root, false)
    }

    /// With `reverse`, the same named also serves the unsigned reverse zone
    /// 2.0.192.in-addr.arpa, whose update-policy grants the DHCP server's key (dhcp.key) PTR.
    fn start_with(root: &Path, reverse: bool) -> SigningNamed {
        SigningNamed::start_policy(root, reverse, "rsa")
    }

    /// The zone signed under `policy`: "rsa" (defined here) or BIND's built-in "default".
    fn start_policy(root: &Path, reverse: bool, policy: &str) -> SigningNamed {
        let (policy_statement, alg) = match policy {
            "rsa" => (
                "dnssec-policy \"rsa\" {\n\tkeys {\n\t\tksk lifetime unlimited algorithm rsasha256 2048;\n\
                 \t\tzsk lifetime unlimited algorithm rsasha256 2048;\n\t};\n};\n",
                8,
            ),
            _ => ("", 13),
        };
        let dir = root.join("signing-named");
        std::fs::create_dir_all(dir.join("keys")).unwrap();
        for (name, file) in [("ops-key", "ops.key"), ("dhcp-key", "dhcp.key")] {
            let out = run(Command::new(bind_dir().join("sbin/tsig-keygen")).args(["-a", "hmac-sha256", name]));
            assert!(out.status.success(), "tsig-keygen: {}", text(&out));
            std::fs::write(dir.join(file), &out.stdout).unwrap();
        }
        std::fs::write(
            dir.join("db.192.0.2"),
            "$TTL 3600\n@\tIN\tSOA\tns1.signed.test. hostmaster.signed.test. 7 3600 900 604800 300\n\
             \tIN\tNS\tns1.signed.test.\n53\tIN\tPTR\tns1.signed.test.\n80\tIN\tPTR\twww.signed.test.\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("db.signed.test"),
            "$TTL 3600\n@\tIN\tSOA\tns1.signed.test. hostmaster.signed.test. 2024060101 3600 900 604800 300\n\
             \tIN\tNS\tns1\nns1\tIN\tA\t192.0.2.53\nwww\tIN\tA\t192.0.2.80\n",
        )
        .unwrap();
        let port = free_port_block(1) + 1;
        let d = dir.display();
        let conf = dir.join("named.conf");
        let reverse = if reverse {
            format!(
                "include \"{d}/dhcp.key\";\nzone \"2.0.192.in-addr.arpa\" {{\n\ttype primary;\n\tfile \"{d}/db.192.0.2\";\n\
                 \tupdate-policy {{\n\t\tgrant dhcp-key zonesub PTR TXT;\n\t}};\n\tallow-transfer {{ key ops-key; }};\n\tnotify no;\n}};\n"
            )
        } else {
            String::new()
        };
        std::fs::write(
            &conf,
            format!(
                "options {{\n\tdirectory \"{d}\";\n\tpid-file \"{d}/named.pid\";\n\tsession-keyfile \"{d}/session.key\";\n\
                 \tlisten-on port {port} {{ 127.0.0.1; }};\n\tlisten-on-v6 {{ none; }};\n\trecursion no;\n\tdnssec-validation no;\n}};\n\
                 controls {{ }};\ninclude \"{d}/ops.key\";\n{policy_statement}\
                 zone \"signed.test\" {{\n\ttype primary;\n\tfile \"{d}/db.signed.test\";\n\tkey-directory \"{d}/keys\";\n\
                 \tdnssec-policy \"{policy}\";\n\tupdate-policy {{\n\t\tgrant ops-key zonesub ANY;\n\t}};\n\
                 \tallow-transfer {{ key ops-key; }};\n\tnotify no;\n}};\n{reverse}"
            ),
        )
        .unwrap();
        let debian = Path::new("/usr/sbin/named");
        let named = if debian.is_file() { debian.to_owned() } else { bind_dir().join("sbin/named") };
        let child = sdns_system_tests::bind::spawn_named(&named, &conf, &dir.join("named.log"));
        let n = SigningNamed { child, port, dir, conf };
        // Signed when the apex DNSKEY RRset and an A RRset carry signatures.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let keys = n.dig(&["signed.test", "DNSKEY", "+dnssec"]);
            let www = n.dig(&["www.signed.test", "A", "+dnssec"]);
            if keys.contains(&format!("DNSKEY\t257 3 {alg}")) && keys.contains(&format!("RRSIG\tDNSKEY {alg}")) && www.contains(&format!("RRSIG\tA {alg}")) {
                return n;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the operator's named never signed the zone:\n{keys}\n{www}\n{}",
                std::fs::read_to_string(n.dir.join("named.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    }

    fn dig(&self, args: &[&str]) -> String {
        bind::dig(self.port, &[&["+time=2", "+tries=1"], args].concat())
    }
}

impl SigningNamed {
    /// The DS of the operator's KSK, by Debian's dnssec-dsfromkey from the operator's key file.
    fn old_ds(&self) -> String {
        let ksk_file = std::fs::read_dir(self.dir.join("keys"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "key") && std::fs::read_to_string(p).unwrap().contains("DNSKEY 257 "))
            .expect("the operator's KSK file");
        let ds = run(Command::new(system_tool("dnssec-dsfromkey")).args(["-2"]).arg(&ksk_file));
        assert!(ds.status.success(), "{}", text(&ds));
        String::from_utf8_lossy(&ds.stdout).trim().to_owned()
    }
}

impl Drop for SigningNamed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A validating Unbound on a free port, unprivileged, that trusts `anchor` (a DS record)
/// for signed.test. and asks replica port `stub` for it (test. is one of Unbound's
/// built-in local zones, switched off here).
struct Unbound {
    child: std::process::Child,
    port: u16,
    dir: PathBuf,
}

impl Unbound {
    fn start(root: &Path, name: &str, anchor: &str, stub: u16) -> Unbound {
        let bin = Path::new("/usr/sbin/unbound");
        assert!(bin.is_file(), "no {} (Debian's unbound; scripts/install-deps.sh installs it)", bin.display());
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port_block(1) + 1;
        let d = dir.display();
        let conf = dir.join("unbound.conf");
        std::fs::write(
            &conf,
            format!(
                "server:\n\tinterface: 127.0.0.1\n\tport: {port}\n\tdo-ip6: no\n\tdo-not-query-localhost: no\n\
                 \tusername: \"\"\n\tchroot: \"\"\n\tdirectory: \"{d}\"\n\tpidfile: \"{d}/unbound.pid\"\n\
                 \tuse-syslog: no\n\tlogfile: \"{d}/unbound.log\"\n\tverbosity: 1\n\tval-log-level: 2\n\
                 \tmodule-config: \"validator iterator\"\n\ttrust-anchor: \"{anchor}\"\n\
                 \tlocal-zone: \"test.\" nodefault\n\
                 remote-control:\n\tcontrol-enable: no\n\
                 stub-zone:\n\tname: \"signed.test.\"\n\tstub-addr: 127.0.0.1@{stub}\n"
            ),
        )
        .unwrap();
        let check = run(Command::new("/usr/sbin/unbound-checkconf").arg(&conf));
        assert!(check.status.success(), "unbound-checkconf: {}", text(&check));
        let child =
            Command::new(bin).arg("-d").arg("-c").arg(&conf).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("unbound");
        let u = Unbound { child, port, dir };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !u.query("signed.test", "SOA").contains("status:") {
            assert!(std::time::Instant::now() < deadline, "unbound never answered:\n{}", u.log());
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        u
    }

    fn query(&self, name: &str, rtype: &str) -> String {
        bind::dig_at(SocketAddr::from(([127, 0, 0, 1], self.port)), &["+dnssec", "+time=5", "+tries=2"], &[name, rtype])
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("unbound.log")).unwrap_or_default()
    }

    /// Asks until the answer is validated (the AD flag) with `want` in it.
    fn validates(&self, name: &str, rtype: &str, want: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let answer = self.query(name, rtype);
            let ad = answer.lines().any(|l| {
                l.contains(";; flags:") && l.split("flags:").nth(1).is_some_and(|f| f.split(';').next().unwrap_or("").split_whitespace().any(|w| w == "ad"))
            });
            if ad && answer.contains("status: NOERROR") && answer.contains(want) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{} does not validate {name} {rtype}:\n{answer}\n{}", self.dir.display(), self.log());
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
}

impl Drop for Unbound {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The zone as replica `i` serves it (AXFR with the transfer key), TSIG left out: for
/// dnssec-verify and for comparing replicas.
fn zone_text(cluster: &Adopted, i: u16) -> String {
    zone_records(cluster, i, &cluster.zone).join("\n") + "\n"
}

/// `zone`'s records as replica `i` transfers them, with the SOA once (the form
/// dnssec-verify reads).
fn zone_records(cluster: &Adopted, i: u16, zone: &str) -> Vec<String> {
    let mut records = cluster.transfer(i, zone).unwrap_or_else(|| panic!("AXFR of {zone} from replica {i} failed\n{}", cluster.logs()));
    records.pop();
    records
}

/// The zone's records, sorted, to compare replicas.
fn sorted_zone(cluster: &Adopted, i: u16) -> Vec<String> {
    sorted_zone_of(cluster, i, &cluster.zone)
}

/// `zone` as replica `i` serves it, sorted (the operator's transfer key is not needed: the
/// dealer's transfer key transfers every zone).
fn sorted_zone_of(cluster: &Adopted, i: u16, zone: &str) -> Vec<String> {
    let mut lines = zone_records(cluster, i, zone);
    lines.sort();
    lines
}

/// dnssec-verify (Debian's) on replica `i`'s zone.
fn verify(cluster: &Adopted, i: u16, root: &Path) -> String {
    let file = root.join(format!("verify-{i}.db"));
    std::fs::write(&file, zone_text(cluster, i)).unwrap();
    // -z: the threshold key is a KSK that signs everything (no ZSK).
    let out = run(Command::new(system_tool("dnssec-verify")).args(["-z", "-o", &cluster.zone]).arg(&file));
    assert!(out.status.success() && text(&out).contains("Zone fully signed"), "dnssec-verify on replica {i}'s zone:\n{}", text(&out));
    text(&out)
}

fn dnskeys(answer: &str) -> usize {
    answer.lines().filter(|l| !l.starts_with(';') && l.split_whitespace().nth(3) == Some("DNSKEY")).count()
}

#[test]
fn a_zone_signed_with_the_operators_key_rolls_over_without_a_validation_outage() {
    let root = tempfile::tempdir().unwrap();
    let named = SigningNamed::start(root.path());
    let keys = named.dig(&["signed.test", "DNSKEY"]);
    let old_ksk = keys.lines().find(|l| l.contains("DNSKEY\t257 ")).unwrap_or_else(|| panic!("{keys}")).to_owned();
    // The old DS, as the parent has it now.
    let old_ds = named.old_ds();

    // Adopted from the zone file with its journal, where named keeps its signing.
    let conf = named.conf.clone();
    // The finish signs the zone again soon after the first signing: no hour between them.
    // Re-signing slices run every second and take what expires within 25 days (30-day
    // validity, renewed 5 days in): the old KSK's signature (20 days) is due by its date,
    // the threshold key's are not, so a slice that took any key's signatures would take it.
    let cluster = Adopted::up(
        &conf,
        "signed.test",
        root.path().join("cluster"),
        &["--dnssec-signzone", system_tool("dnssec-signzone").to_str().unwrap(), "--rollover-validity-days", "20"],
        &["--sign-zone-interval-s", "1", "--resign-after-s", "432000", "--resign-slice-interval-s", "1"],
    );
    drop(named);
    let said_old = std::fs::read_to_string(cluster.dir.join("ds-old.txt")).unwrap();
    let norm = |ds: &str| ds.split_whitespace().filter(|w| *w != "IN").map(str::to_ascii_uppercase).collect::<Vec<_>>().join(" ");
    assert_eq!(norm(&said_old), norm(&old_ds), "the old DS the adoption prints is the parent's");
    let new_ds = std::fs::read_to_string(cluster.dir.join("ds.txt")).unwrap().trim().to_owned();
    let steps = std::fs::read_to_string(cluster.dir.join("rollover.txt")).unwrap();
    assert!(steps.contains(&new_ds) && steps.contains("rollover-finish"), "{steps}");

    // Both KSKs published, the DNSKEY RRset signed by both; the ZSK and the operator's
    // other signatures are gone. Every replica holds the same zone, and it verifies.
    let old_key = old_ksk.split_whitespace().skip(4).collect::<Vec<_>>().join(" ");
    let old_tag = old_ds.split_whitespace().nth(3).unwrap().to_owned();
    for i in 0..4 {
        let answer = cluster.dig(i, &["signed.test", "DNSKEY", "+dnssec", "+multiline"]);
        assert_eq!(dnskeys(&cluster.dig(i, &["signed.test", "DNSKEY"])), 2, "replica {i}:\n{answer}");
        assert!(answer.contains(&format!(" {old_tag} signed.test.")), "replica {i}: no signature by the old KSK {old_tag}\n{answer}");
    }
    assert!(cluster.dig(0, &["signed.test", "DNSKEY"]).replace('\t', " ").contains(&old_key.replace('\t', " ")), "the old KSK is the operator's");
    let first = sorted_zone(&cluster, 0);
    for i in 1..4 {
        assert_eq!(sorted_zone(&cluster, i), first, "replica {i}'s zone differs from replica 0's");
    }
    let said = verify(&cluster, 0, root.path());
    assert!(said.contains("RSASHA256"), "{said}");

    // A validator that trusts the OLD DS validates the adopted zone, and so does one that
    // trusts the new DS.
    let old = Unbound::start(root.path(), "unbound-old", &old_ds, cluster.port(1));
    old.validates("www.signed.test", "A", "192.0.2.80");
    let new = Unbound::start(root.path(), "unbound-new", &new_ds, cluster.port(2));
    new.validates("www.signed.test", "A", "192.0.2.80");
    // The CDS and CDNSKEY ask the parent for the new key's DS; a validator that trusts only
    // the old DS accepts them, and they carry the old KSK's signatures (RFC 7344 4.1).
    cds_published(&cluster, &old, &new_ds, &old_tag);
    // A dynamic update is signed by the threshold key and validates through the old DS.
    let (ok, said) = cluster.update(3, &cluster.dir.join("key-ops-key.key"), "update add laptop.signed.test 300 A 192.0.2.107");
    assert!(ok, "{said}\n{}", cluster.logs());
    old.validates("laptop.signed.test", "A", "192.0.2.107");
    // Slices ran meanwhile (a few more are waited for) and left the old KSK's signature.
    for i in 0..4 {
        let ran = || cluster.metric(i, "sdns_resign_slices_total");
        let (start, deadline) = (ran(), std::time::Instant::now() + std::time::Duration::from_secs(30));
        while ran() < start + 3 {
            assert!(std::time::Instant::now() < deadline, "replica {i} runs no re-signing slices:\n{}", cluster.logs());
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        let answer = cluster.dig(i, &["signed.test", "DNSKEY", "+dnssec", "+multiline"]);
        assert!(answer.contains(&format!(" {old_tag} signed.test.")), "replica {i} lost the old KSK's signature to a slice:\n{answer}");
    }
    let first = sorted_zone(&cluster, 0);
    for i in 1..4 {
        assert_eq!(sorted_zone(&cluster, i), first, "replica {i}'s zone differs from replica 0's");
    }
    old.validates("www.signed.test", "A", "192.0.2.80");
    drop(old);

    // The finish: the old KSK and its signature leave every replica's zone, by ordered
    // operations, and the zone is the same everywhere.
    finish_by_hand(&cluster, &old_tag);
    let first = finished_everywhere(&cluster, 3, root.path());
    assert!(first.iter().any(|l| l.starts_with("laptop.signed.test.")), "{first:?}");
    // The new-DS validator keeps validating (a fresh one too); one that only knows the old
    // DS no longer can: the old key is really gone.
    new.validates("www.signed.test", "A", "192.0.2.80");
    only_the_new_ds_validates(&cluster, root.path(), &new_ds, &old_ds, 0, ("laptop.signed.test", "192.0.2.107"));
}

/// `sdns cluster rollover-finish` for signed.test; waits until every replica publishes only
/// the threshold key and no signature by the old KSK `old_tag`.
fn finish_by_hand(cluster: &Adopted, old_tag: &str) {
    let port_args = ports(cluster.base);
    let mut args =
        vec!["cluster", "rollover-finish", "--replicas", "4", "--zone", "signed.test", "--dir", cluster.dir.to_str().unwrap(), "--sign-zone-interval-s", "1"];
    args.extend(port_args.iter().map(String::as_str));
    let out = sdns(&args);
    assert!(out.status.success(), "rollover-finish:\n{}\n{}", text(&out), cluster.logs());
    for i in 0..4 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while dnskeys(&cluster.dig(i, &["signed.test", "DNSKEY"])) != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "replica {i} still publishes the old KSK:\n{}",
                cluster.dig(i, &["signed.test", "DNSKEY", "+dnssec"])
            );
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        assert!(!cluster.dig(i, &["signed.test", "DNSKEY", "+dnssec", "+multiline"]).contains(&format!(" {old_tag} signed.test.")), "replica {i}");
    }
}

/// After a rollover's finish: no marker, CDS or CDNSKEY left in replica 0's zone, every
/// replica's zone the same, and dnssec-verify accepts it (a transfer from replica `at`).
/// Replica 0's zone, sorted.
fn finished_everywhere(cluster: &Adopted, at: u16, root: &Path) -> Vec<String> {
    let first = sorted_zone(cluster, 0);
    assert!(!first.iter().any(|l| l.contains("_sdns-rollover")), "the marker leaves with the rollover: {first:?}");
    assert!(!first.iter().any(|l| is_sync_record(l)), "the CDS and CDNSKEY leave with the rollover: {first:?}");
    for i in 1..4 {
        assert_eq!(sorted_zone(cluster, i), first, "replica {i}'s zone differs from replica 0's after the finish");
    }
    verify(cluster, at, root);
    first
}

/// A fresh validator trusting the new DS validates `name` A `address` through replica `i`; one
/// trusting only the old DS gets SERVFAIL.
fn only_the_new_ds_validates(cluster: &Adopted, root: &Path, new_ds: &str, old_ds: &str, i: u16, (name, address): (&str, &str)) {
    let fresh = Unbound::start(root, "unbound-new-2", new_ds, cluster.port(i));
    fresh.validates(name, "A", address);
    let stale = Unbound::start(root, "unbound-old-2", old_ds, cluster.port(0));
    let answer = stale.query("www.signed.test", "A");
    assert!(answer.contains("status: SERVFAIL"), "{answer}");
}

/// An apex CDS or CDNSKEY record line (of an AXFR or dig answer).
fn is_sync_record(line: &str) -> bool {
    matches!(line.split_whitespace().nth(3), Some(t) if t.eq_ignore_ascii_case("CDS") || t.eq_ignore_ascii_case("CDNSKEY"))
}

/// During the rollover every replica publishes the CDS (the threshold key's DS, `new_ds`) and
/// CDNSKEY, each signed by the old KSK `old_tag`; `old` (trusting the old DS only) validates both.
fn cds_published(cluster: &Adopted, old: &Unbound, new_ds: &str, old_tag: &str) {
    let ds: Vec<&str> = new_ds.split_whitespace().collect();
    let (new_tag, digest) = (ds[ds.len() - 4], ds[ds.len() - 1].to_ascii_uppercase());
    for i in 0..4 {
        let cds = cluster.dig(i, &["signed.test", "CDS", "+dnssec"]);
        let line = cds.lines().find(|l| !l.starts_with(';') && is_sync_record(l)).unwrap_or_else(|| panic!("replica {i} publishes no CDS:\n{cds}"));
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((f[4], f[6], f[7..].concat().to_ascii_uppercase()), (new_tag, "2", digest.clone()), "replica {i}: {line}");
        assert_eq!(cds.lines().filter(|l| !l.starts_with(';') && is_sync_record(l)).count(), 1, "only the new key's DS: {cds}");
        for rtype in ["CDS", "CDNSKEY"] {
            let answer = cluster.dig(i, &["signed.test", rtype, "+dnssec", "+multiline"]);
            assert!(answer.contains(&format!(" {old_tag} signed.test.")), "replica {i}: no signature by the old KSK over {rtype}\n{answer}");
        }
    }
    old.validates("signed.test", "CDS", &format!("CDS\t{new_tag} "));
    old.validates("signed.test", "CDNSKEY", "CDNSKEY\t257 3 ");
}

/// A DS rdata from its presentation form (`... DS tag algorithm digest-type HEX`).
fn ds_rdata(ds: &str) -> Vec<u8> {
    let f: Vec<&str> = ds.split_whitespace().collect();
    let n = f.len();
    let mut out = f[n - 4].parse::<u16>().unwrap().to_be_bytes().to_vec();
    out.push(f[n - 3].parse().unwrap());
    out.push(f[n - 2].parse().unwrap());
    let hex = f[n - 1];
    out.extend((0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()));
    out
}

/// A resolver's answer to `query`: its question echoed, recursion available, and `ds` (DS
/// rdatas) as the zone's DS RRset with TTL 1; `None` for anything that is not a query.
fn ds_answer(query: &[u8], ds: &[Vec<u8>]) -> Option<Vec<u8>> {
    let m = dnswire::rrwire::RawMessage::parse(query).ok()?;
    let q = m.questions.first()?;
    let mut out = query.get(..2)?.to_vec();
    out.extend_from_slice(&[0x81, 0x80, 0, 1]);
    let answers = if q.qtype == 43 { ds.len() as u16 } else { 0 };
    out.extend_from_slice(&answers.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(query.get(q.span.clone())?);
    for rdata in ds.iter().take(usize::from(answers)) {
        out.extend_from_slice(&[0xc0, 12, 0, 43, 0, 1, 0, 0, 0, 1]);
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(rdata);
    }
    Some(out)
}

/// The bar: a rollover with CDS/CDNSKEY, where the parent's DS change is noticed by
/// the replicas and the finish happens without an operator. The parent's resolvers are fake:
/// one never answers (it must not hold anything up), the other answers the DS the "parent"
/// holds, the old one first, then the old and the new. While only the old DS is there the
/// rollover stays; once the new DS shows, t+1 replicas report it and the finish executes at one
/// point of the log everywhere: old KSK, CDS, CDNSKEY and marker gone, every zone the same, a
/// validator trusting the new DS validates and one trusting only the old DS no longer does.
#[test]
fn the_rollover_finishes_by_itself_once_the_parent_serves_the_new_ds() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    let root = tempfile::tempdir().unwrap();
    let named = SigningNamed::start(root.path());
    let old_ds = named.old_ds();
    let parent_ds = Arc::new(Mutex::new(vec![ds_rdata(&old_ds)]));
    let asked = Arc::new(AtomicUsize::new(0));
    let parent = {
        let (parent_ds, asked) = (parent_ds.clone(), asked.clone());
        testkit::fake_dns::FakeDns::start(move |q| {
            asked.fetch_add(1, Ordering::Relaxed);
            ds_answer(q, &parent_ds.lock().unwrap())
        })
    };
    let silent = testkit::fake_dns::FakeDns::start(|_| None);
    let (silent_addr, parent_addr) = (silent.addr().to_string(), parent.addr().to_string());
    let conf = named.conf.clone();
    let cluster = Adopted::up(
        &conf,
        "signed.test",
        root.path().join("cluster"),
        &["--dnssec-signzone", system_tool("dnssec-signzone").to_str().unwrap(), "--rollover-validity-days", "20"],
        &["--sign-zone-interval-s", "1", "--parent-resolver", &silent_addr, "--parent-resolver", &parent_addr, "--rollover-poll-s", "1"],
    );
    drop(named);
    let new_ds = std::fs::read_to_string(cluster.dir.join("ds.txt")).unwrap().trim().to_owned();
    let old_tag = old_ds.split_whitespace().nth(3).unwrap().to_owned();
    let config = std::fs::read_to_string(cluster.dir.join("replica-0/replica.toml")).unwrap();
    assert!(config.contains("[rollover]") && config.contains(&parent_addr), "{config}");

    // Every replica signs its zone with the rollover's records, and both validators validate.
    for i in 0..4 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while dnskeys(&cluster.dig(i, &["signed.test", "DNSKEY"])) != 2 {
            assert!(std::time::Instant::now() < deadline, "replica {i} does not serve both keys:\n{}", cluster.logs());
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
    let old = Unbound::start(root.path(), "unbound-old", &old_ds, cluster.port(1));
    let new = Unbound::start(root.path(), "unbound-new", &new_ds, cluster.port(2));
    old.validates("www.signed.test", "A", "192.0.2.80");
    new.validates("www.signed.test", "A", "192.0.2.80");
    cds_published(&cluster, &old, &new_ds, &old_tag);

    // The parent still has only the old DS: asked many times over (every replica, every
    // second), nobody finishes.
    let start = asked.load(Ordering::Relaxed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while asked.load(Ordering::Relaxed) < start + 12 {
        assert!(std::time::Instant::now() < deadline, "the replicas do not ask the parent's resolver:\n{}", cluster.logs());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    for i in 0..4 {
        assert_eq!(dnskeys(&cluster.dig(i, &["signed.test", "DNSKEY"])), 2, "replica {i} finished with the old DS alone at the parent");
    }

    // The parent takes the new DS (the old one stays, as in a double-KSK rollover).
    parent_ds.lock().unwrap().push(ds_rdata(&new_ds));
    for i in 0..4 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        while dnskeys(&cluster.dig(i, &["signed.test", "DNSKEY"])) != 1 {
            assert!(std::time::Instant::now() < deadline, "replica {i} still publishes the old KSK:\n{}", cluster.logs());
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        let cds = cluster.dig(i, &["signed.test", "CDS"]);
        assert!(!cds.lines().any(|l| !l.starts_with(';') && is_sync_record(l)), "replica {i} still publishes a CDS:\n{cds}");
        assert!(!cluster.dig(i, &["signed.test", "DNSKEY", "+dnssec", "+multiline"]).contains(&format!(" {old_tag} signed.test.")), "replica {i}");
    }
    finished_everywhere(&cluster, 2, root.path());
    new.validates("www.signed.test", "A", "192.0.2.80");
    only_the_new_ds_validates(&cluster, root.path(), &new_ds, &old_ds, 3, ("www.signed.test", "192.0.2.80"));
    drop(old);
}

/// Issue 27: a zone BIND signs under its `dnssec-policy default` (one CSK, ECDSA P-256) is
/// listed adoptable into a cluster of threshold ECDSA P-256 keys (`--algorithm 13`), refused
/// into an RSA one with the hint, and adopted with the double-KSK rollover: Unbound trusting
/// the old DS and Unbound trusting the new DS validate (an update too), every replica holds
/// the same zone and dnssec-verify accepts it. `cluster rollover-finish` then removes the old
/// KSK everywhere: the zones stay identical and verified, the new-DS validators (the running
/// one and a fresh one) validate, one trusting only the old DS no longer does.
#[test]
fn a_dnssec_policy_default_zone_is_adopted_into_threshold_ecdsa() {
    let root = tempfile::tempdir().unwrap();
    let named = SigningNamed::start_policy(root.path(), false, "default");
    let old_ds = named.old_ds();
    let conf = named.conf.clone();
    let list = |algorithm: &str| {
        let out = sdns(&[
            "adopt",
            "--list",
            "--named-conf",
            conf.to_str().unwrap(),
            "--named-checkconf",
            system_tool("named-checkconf").to_str().unwrap(),
            "--algorithm",
            algorithm,
        ]);
        assert!(out.status.success(), "{}", text(&out));
        text(&out)
    };
    let report = list("13");
    assert!(report.contains("adoptable  signed.test."), "{report}");
    let report = list("8");
    assert!(report.contains("cannot     signed.test.") && report.contains("--algorithm 13 adopts it"), "{report}");

    let cluster = Adopted::up(
        &conf,
        "signed.test",
        root.path().join("cluster"),
        &["--dnssec-signzone", system_tool("dnssec-signzone").to_str().unwrap()],
        // The finish signs the zone again soon after the first signing: no hour between them.
        &["--algorithm", "13", "--sign-zone-interval-s", "1"],
    );
    drop(named);
    let new_ds = std::fs::read_to_string(cluster.dir.join("ds.txt")).unwrap().trim().to_owned();
    assert_eq!(new_ds.split_whitespace().nth(4), Some("13"), "{new_ds}");
    let old_tag = old_ds.split_whitespace().nth(3).unwrap().to_owned();
    for i in 0..4 {
        let answer = cluster.dig(i, &["signed.test", "DNSKEY"]);
        let keys: Vec<&str> = answer.lines().filter(|l| !l.starts_with(';') && l.split_whitespace().nth(3) == Some("DNSKEY")).collect();
        assert!(
            keys.len() == 2 && keys.iter().all(|k| k.split_whitespace().nth(6) == Some("13")),
            "replica {i}: two algorithm-13 KSKs
{answer}"
        );
        let signed = cluster.dig(i, &["signed.test", "DNSKEY", "+dnssec", "+multiline"]);
        assert!(
            signed.contains(&format!(" {old_tag} signed.test.")),
            "replica {i}: no signature by the old KSK {old_tag}
{signed}"
        );
    }
    let first = sorted_zone(&cluster, 0);
    for i in 1..4 {
        assert_eq!(sorted_zone(&cluster, i), first, "replica {i}'s zone differs from replica 0's");
    }
    assert!(verify(&cluster, 0, root.path()).contains("ECDSAP256SHA256"));
    let old = Unbound::start(root.path(), "unbound-old", &old_ds, cluster.port(1));
    old.validates("www.signed.test", "A", "192.0.2.80");
    let new = Unbound::start(root.path(), "unbound-new", &new_ds, cluster.port(2));
    new.validates("www.signed.test", "A", "192.0.2.80");
    let (ok, said) = cluster.update(3, &cluster.dir.join("key-ops-key.key"), "update add laptop.signed.test 300 A 192.0.2.107");
    assert!(
        ok,
        "{said}
{}",
        cluster.logs()
    );
    old.validates("laptop.signed.test", "A", "192.0.2.107");
    new.validates("laptop.signed.test", "A", "192.0.2.107");
    drop(old);

    finish_by_hand(&cluster, &old_tag);
    let first = finished_everywhere(&cluster, 1, root.path());
    assert!(first.iter().any(|l| l.starts_with("laptop.signed.test.")), "{first:?}");
    let keys = cluster.dig(0, &["signed.test", "DNSKEY"]);
    assert!(keys.lines().any(|l| l.split_whitespace().nth(3) == Some("DNSKEY") && l.split_whitespace().nth(6) == Some("13")), "{keys}");
    new.validates("laptop.signed.test", "A", "192.0.2.107");
    only_the_new_ds_validates(&cluster, root.path(), &new_ds, &old_ds, 2, ("www.signed.test", "192.0.2.80"));
}

/// delv through replica `i` for `name` `rtype`, trusting `anchors` (a trust-anchors file).
fn delv(cluster: &Adopted, i: u16, anchors: &Path, name: &str, rtype: &str, root: &str) -> String {
    bind::delv(cluster.port(i), anchors, name, rtype, root)
}

/// The test: one stock named serves a forward zone it signs with its own key
/// (dnssec-policy) and an unsigned reverse zone with a TSIG key and an update-policy; both
/// are adopted in one run into one 4-replica cluster. Every RRset the old server gave
/// (DNSSEC records aside) is served the same by every replica, nsupdate with the operator's
/// original key files works on both zones, the reverse zone answers PTR, and the forward
/// zone's double-KSK rollover validates with delv trusting the OLD key's DS.
#[test]
fn a_signed_forward_zone_and_a_reverse_zone_are_adopted_into_one_cluster() {
    let root = tempfile::tempdir().unwrap();
    let named = SigningNamed::start_with(root.path(), true);
    let ops_key = named.dir.join("ops.key");
    let dhcp_key = named.dir.join("dhcp.key");
    // A host the DHCP server registered since the zone file was written (in named's journal).
    let (ok, said) =
        Nsupdate::to(named.port, "2.0.192.in-addr.arpa").key(&dhcp_key).timeout_s(10).send("update add 99.2.0.192.in-addr.arpa 300 PTR printer.signed.test.");
    assert!(ok, "update on the operator's named: {said}");
    // What the old server gives, per zone; the rollover's marker (sdns's own record, deleted
    // at the finish) and the DNSSEC records are left out of the comparison.
    let old_records = |zone: &str| records(&named.dig(&["-k", ops_key.to_str().unwrap(), zone, "AXFR"]));
    let without_marker = |r: Vec<String>| -> Vec<String> {
        r.into_iter().filter(|l| !l.starts_with("_sdns-rollover.") && !l.contains(" cds ") && !l.contains(" cdnskey ")).collect()
    };
    let zones = ["signed.test", "2.0.192.in-addr.arpa"];
    let before: Vec<Vec<String>> = zones.iter().map(|z| without_marker(old_records(z))).collect();
    assert!(before[0].iter().any(|r| r.starts_with("www.signed.test.")), "{:?}", before[0]);
    assert!(before[1].iter().any(|r| r.contains("printer.signed.test.")), "{:?}", before[1]);
    // The old DS, as the parent has it.
    let old_ds = named.old_ds();

    let conf = named.conf.clone();
    let cluster = Adopted::up_zones(
        &conf,
        &zones,
        root.path().join("cluster"),
        &["--dnssec-signzone", system_tool("dnssec-signzone").to_str().unwrap(), "--rollover-validity-days", "20"],
        // The finish signs the forward zone again soon after the first signing.
        &["--sign-zone-interval-s", "1"],
    );
    drop(named);
    // One threshold key per zone, in the zone's own directory; the rollover's files are the
    // forward zone's.
    let fwd = cluster.dir.join("zones/signed.test");
    let rev = cluster.dir.join("zones/2.0.192.in-addr.arpa");
    let norm = |ds: &str| ds.split_whitespace().filter(|w| *w != "IN").map(str::to_ascii_uppercase).collect::<Vec<_>>().join(" ");
    assert_eq!(norm(&std::fs::read_to_string(fwd.join("ds-old.txt")).unwrap()), norm(&old_ds));
    assert!(!rev.join("ds-old.txt").exists() && !rev.join("rollover.txt").exists());
    let steps = std::fs::read_to_string(fwd.join("rollover.txt")).unwrap();
    assert!(steps.contains("sign-zone --zone signed.test."), "{steps}");
    assert_ne!(std::fs::read_to_string(fwd.join("ds.txt")).unwrap(), std::fs::read_to_string(rev.join("ds.txt")).unwrap());
    let record = std::fs::read_to_string(cluster.dir.join("adopted.toml")).unwrap();
    assert_eq!(record.matches("[[zone]]").count(), 2, "{record}");

    // Every RRset the old server gave, at every replica (AXFR with the operator's transfer key).
    for (z, zone) in zones.iter().enumerate() {
        for i in 0..4 {
            let after = without_marker(records(&cluster.dig(i, &["-k", ops_key.to_str().unwrap(), zone, "AXFR"])));
            assert_eq!(after, before[z], "replica {i}'s {zone} differs from the old server's\n{}", cluster.logs());
        }
    }
    // The reverse zone answers PTR, signed by its own threshold key.
    for i in 0..4 {
        let answer = cluster.dig(i, &["99.2.0.192.in-addr.arpa", "PTR", "+dnssec"]);
        assert!(answer.contains("printer.signed.test.") && answer.contains("RRSIG\tPTR"), "replica {i}:\n{answer}");
    }
    // nsupdate with the operator's original key files, in each zone; each key only where
    // its update-policy grants it.
    let (ok, said) = cluster.nsupdate_in(1, "signed.test", &ops_key, "update add laptop.signed.test 300 A 192.0.2.107");
    assert!(ok, "{said}\n{}", cluster.logs());
    let (ok, said) = cluster.nsupdate_in(2, "2.0.192.in-addr.arpa", &dhcp_key, "update add 107.2.0.192.in-addr.arpa 300 PTR laptop.signed.test.");
    assert!(ok, "{said}\n{}", cluster.logs());
    let (ok, said) = cluster.nsupdate_in(3, "2.0.192.in-addr.arpa", &ops_key, "update add 108.2.0.192.in-addr.arpa 300 PTR x.signed.test.");
    assert!(!ok && said.contains("REFUSED"), "ops-key is not in the reverse zone's policy: {said}");
    let (ok, said) = cluster.nsupdate_in(0, "signed.test", &dhcp_key, "update add dhcp.signed.test 300 A 192.0.2.9");
    // (a key the zone does not know at all: BADKEY, as named answers it)
    assert!(!ok && (said.contains("REFUSED") || said.contains("BADKEY")), "dhcp-key is not in the forward zone's policy: {said}");
    for i in 0..4 {
        assert!(cluster.dig(i, &["107.2.0.192.in-addr.arpa", "PTR"]).contains("laptop.signed.test."), "replica {i}");
        assert!(cluster.dig(i, &["laptop.signed.test", "A"]).contains("192.0.2.107"), "replica {i}");
    }
    // During the rollover delv validates the forward zone trusting the OLD key's DS, and
    // the new one trusting the threshold key; the reverse zone with its own anchor.
    let f: Vec<String> = old_ds.split_whitespace().filter(|w| *w != "IN").map(str::to_owned).collect();
    assert_eq!(f.get(1).map(String::as_str), Some("DS"), "{old_ds}");
    let old_anchor = root.path().join("old-ds.conf");
    std::fs::write(&old_anchor, format!("trust-anchors {{\n\t\"{}\" static-ds {} {} {} \"{}\";\n}};\n", f[0], f[2], f[3], f[4], f[5..].concat())).unwrap();
    for (i, name) in [(0, "www.signed.test"), (3, "laptop.signed.test")] {
        let said = delv(&cluster, i, &old_anchor, name, "A", "signed.test");
        assert!(said.contains("; fully validated") && said.contains("192.0.2."), "old DS, replica {i}, {name}:\n{said}");
    }
    let said = delv(&cluster, 1, &fwd.join("trust-anchor.conf"), "www.signed.test", "A", "signed.test");
    assert!(said.contains("; fully validated"), "{said}");
    let said = delv(&cluster, 2, &rev.join("trust-anchor.conf"), "107.2.0.192.in-addr.arpa", "PTR", "2.0.192.in-addr.arpa");
    assert!(said.contains("; fully validated") && said.contains("laptop.signed.test."), "{said}");
    // The old key's trust does not reach the reverse zone (it has no rollover).
    let said = delv(&cluster, 2, &fwd.join("trust-anchor.conf"), "80.2.0.192.in-addr.arpa", "PTR", "2.0.192.in-addr.arpa");
    assert!(!said.contains("; fully validated"), "{said}");
    // A validating resolver (Debian's Unbound) that trusts the OLD key's DS validates the
    // forward zone through the rollover, an update made meanwhile included.
    let new_ds = std::fs::read_to_string(fwd.join("ds.txt")).unwrap().trim().to_owned();
    let old_resolver = Unbound::start(root.path(), "unbound-old", &old_ds, cluster.port(3));
    old_resolver.validates("laptop.signed.test", "A", "192.0.2.107");
    old_resolver.validates("www.signed.test", "A", "192.0.2.");
    drop(old_resolver);
    // The finish, for the forward zone alone: its old KSK leaves every replica, the reverse
    // zone is not touched, the new DS validates and the old one no longer does.
    let reverse_before = sorted_zone_of(&cluster, 0, "2.0.192.in-addr.arpa");
    let port_args = ports(cluster.base);
    let mut args =
        vec!["cluster", "rollover-finish", "--replicas", "4", "--zone", "signed.test", "--dir", cluster.dir.to_str().unwrap(), "--sign-zone-interval-s", "1"];
    args.extend(port_args.iter().map(String::as_str));
    let out = sdns(&args);
    assert!(out.status.success(), "rollover-finish:\n{}\n{}", text(&out), cluster.logs());
    for i in 0..4 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while dnskeys(&cluster.dig(i, &["signed.test", "DNSKEY"])) != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "replica {i} still publishes the old KSK:\n{}",
                cluster.dig(i, &["signed.test", "DNSKEY", "+dnssec"])
            );
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
    let first = sorted_zone_of(&cluster, 0, "signed.test");
    assert!(!first.iter().any(|l| l.contains("_sdns-rollover")) && first.iter().any(|l| l.starts_with("laptop.signed.test.")), "{first:?}");
    for i in 1..4 {
        assert_eq!(sorted_zone_of(&cluster, i, "signed.test"), first, "replica {i}'s forward zone differs after the finish");
    }
    assert_eq!(sorted_zone_of(&cluster, 0, "2.0.192.in-addr.arpa"), reverse_before, "the finish touched the reverse zone");
    let said = delv(&cluster, 1, &fwd.join("trust-anchor.conf"), "laptop.signed.test", "A", "signed.test");
    assert!(said.contains("; fully validated"), "{said}");
    let said = delv(&cluster, 1, &old_anchor, "www.signed.test", "A", "signed.test");
    assert!(!said.contains("; fully validated"), "the old DS still validates after the finish:\n{said}");
    // And an Unbound that trusts the NEW DS validates after it.
    let new_resolver = Unbound::start(root.path(), "unbound-new", &new_ds, cluster.port(0));
    new_resolver.validates("laptop.signed.test", "A", "192.0.2.107");
    // The reverse zone has no rollover to finish.
    let mut args = vec!["cluster", "rollover-finish", "--replicas", "4", "--zone", "2.0.192.in-addr.arpa", "--dir", cluster.dir.to_str().unwrap()];
    args.extend(port_args.iter().map(String::as_str));
    let out = sdns(&args);
    assert!(!out.status.success() && text(&out).contains("holds no rollover of 2.0.192.in-addr.arpa."), "{}", text(&out));
}
