//! `sdns adopt` against a BIND installation laid out as Debian's bind9 package lays it
//! out (/etc/bind/named.conf including named.conf.options and named.conf.local, key
//! files from tsig-keygen), read with Debian's own named-checkconf and named-compilezone
//! (bind9-utils): two primary zones, a forward one with an update-policy and a reverse
//! one with allow-update, are adopted each into a 4-replica cluster that then takes
//! updates signed with the operator's original key files; zones the adoption cannot take
//! are reported with their reasons. The reverse zone is taken by AXFR from a running named
//! (the BIND build's; Debian's named is not installed in CI) after a dynamic update there.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sdns_system_tests::{bind_dir, free_port_block, ports, run, sdns_bin, text, tool};

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
    /// Adopts `zone` from `conf` into `dir` (with `extra` adopt arguments) and starts its
    /// four replicas.
    fn up(conf: &Path, zone: &str, dir: PathBuf, extra: &[&str]) -> Adopted {
        let base = free_port_block(4);
        let port_args = ports(base);
        let mut args = adopt_args(conf.to_str().unwrap(), zone, dir.to_str().unwrap());
        args.extend(extra);
        let bind = bind_dir();
        args.extend(["--bind-dir", bind.to_str().unwrap()]);
        args.extend(port_args.iter().map(String::as_str));
        let out = sdns(&args);
        assert!(out.status.success(), "sdns adopt --zone {zone}:\n{}", text(&out));
        let report = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(report.contains(&format!("adopted    {zone}.")), "{report}");
        let mut up = vec!["cluster", "up", "--replicas", "4", "--zone", zone, "--dir", dir.to_str().unwrap(), "--bind-dir", bind.to_str().unwrap()];
        up.extend(port_args.iter().map(String::as_str));
        let started = Adopted { dir: dir.clone(), zone: zone.to_owned(), base };
        let out = sdns(&up);
        assert!(out.status.success(), "cluster up:\n{}\n{}", text(&out), started.logs());
        started
    }

    fn port(&self, i: u16) -> u16 {
        self.base + 1 + i
    }

    fn logs(&self) -> String {
        (0..4).map(|i| std::fs::read_to_string(self.dir.join(format!("replica-{i}/sdns.log"))).unwrap_or_default()).collect::<Vec<_>>().join("\n---\n")
    }

    fn dig(&self, i: u16, args: &[&str]) -> String {
        text(&run(Command::new(tool("dig")).arg("@127.0.0.1").arg("-p").arg(self.port(i).to_string()).args(["+norec", "+time=5", "+tries=2"]).args(args)))
    }

    /// nsupdate -k KEY through replica `i`: (success, output).
    fn nsupdate(&self, i: u16, key: &Path, commands: &str) -> (bool, String) {
        use std::io::Write;
        let mut child = Command::new(tool("nsupdate"))
            .arg("-k")
            .arg(key)
            .args(["-t", "20"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("nsupdate");
        let script = format!("server 127.0.0.1 {}\nzone {}\n{commands}\nsend\n", self.port(i), self.zone);
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.success(), text(&out))
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
            let soa = text(&run(Command::new(tool("dig")).arg("@127.0.0.1").arg("-p").arg(port.to_string()).args([
                "+short",
                "+time=1",
                "+tries=1",
                "2.0.192.in-addr.arpa",
                "SOA",
            ])));
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
        use std::io::Write;
        let mut child = Command::new(tool("nsupdate"))
            .arg("-k")
            .arg(key)
            .args(["-t", "10"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("nsupdate");
        let script = format!("server 127.0.0.1 {}\nzone 2.0.192.in-addr.arpa\n{commands}\nsend\n", self.port);
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.success(), text(&out))
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
        "because: dnssec-policy \"default\": the zone is signed by named with your own key",
        "because: inline-signing yes",
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
    assert!(said.contains("zone signed.test. cannot be adopted: dnssec-policy \"default\""), "{said}");
    assert!(!dealt.join("replica-0").exists());
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
    let corp = Adopted::up(&conf, "corp.test", root.path().join("corp"), &[]);
    let file = run(Command::new(system_tool("named-compilezone")).args(["-q", "-s", "full", "-o", "-", "corp.test"]).arg(etc.join("db.corp.test")));
    let before = records(&String::from_utf8_lossy(&file.stdout));
    assert!(before.len() == 6, "{before:?}");
    let key = corp.dir.join("transfer.key");
    for i in 0..4 {
        assert_eq!(records(&corp.dig(i, &["-k", key.to_str().unwrap(), "corp.test", "AXFR"])), before, "replica {i}'s zone differs from the zone file");
    }
    let (ok, said) = corp.nsupdate(1, &dhcp_key, "update add laptop-7.corp.test 300 A 192.0.2.107");
    assert!(ok, "the DHCP server's key must still register hosts: {said}\n{}", corp.logs());
    for i in 0..4 {
        let answer = corp.dig(i, &["laptop-7.corp.test", "A", "+dnssec"]);
        assert!(answer.contains("192.0.2.107") && answer.contains("RRSIG\tA 8 3 300"), "replica {i}:\n{answer}");
    }
    let delv = text(&run(Command::new(tool("delv"))
        .arg("-a")
        .arg(corp.dir.join("trust-anchor.conf"))
        .arg("@127.0.0.1")
        .arg("-p")
        .arg(corp.port(2).to_string())
        .args(["laptop-7.corp.test", "A", "+root=corp.test"])));
    assert!(delv.contains("; fully validated") && delv.contains("192.0.2.107"), "{delv}");
    // The policy is the operator's: the DHCP key may not touch MX, the operators' key may.
    let (ok, said) = corp.nsupdate(2, &dhcp_key, "update add corp.test 300 MX 20 mail.corp.test.");
    assert!(!ok && said.contains("REFUSED"), "{said}");
    let (ok, said) = corp.nsupdate(3, &ops_key, "update add corp.test 300 MX 20 mail.corp.test.");
    assert!(ok, "{said}");
    assert!(corp.dig(0, &["corp.test", "MX"]).contains("20 mail.corp.test."));
    // The dealer's own key is known, but the operator's policy grants it nothing.
    let (ok, said) = corp.nsupdate(0, &corp.dir.join("tsig.key"), "update add dealer.corp.test 300 A 192.0.2.9");
    assert!(!ok && said.contains("REFUSED"), "{said}");
    // allow-transfer { key ops-key; }: the operator's key transfers the zone.
    let axfr = corp.dig(0, &["-k", ops_key.to_str().unwrap(), "corp.test", "AXFR"]);
    assert!(axfr.contains("laptop-7.corp.test.") && axfr.contains("DNSKEY"), "{axfr}");

    // Taking the zone by AXFR from a running server works, and a zone that arrives signed
    // is refused: its signatures are someone else's key.
    let again = root.path().join("again");
    let server = format!("127.0.0.1:{}", corp.port(0));
    let mut args = adopt_args(conf.to_str().unwrap(), "corp.test", again.to_str().unwrap());
    args.extend(["--server", &server, "--axfr-key", ops_key.to_str().unwrap()]);
    let out = sdns(&args);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("its data holds DNSKEY/RRSIG/NSEC records"), "{}", text(&out));
    drop(corp);

    // The reverse zone, with allow-update, in a cluster of its own, taken by AXFR from the
    // named that serves it now: a host the DHCP server registered there since the zone file
    // was written comes along.
    let running = RunningNamed::start(root.path(), &etc);
    let (ok, said) = running.nsupdate(&dhcp_key, "update add 99.2.0.192.in-addr.arpa 300 PTR printer.corp.test.");
    assert!(ok, "update on the running named: {said}");
    let server = format!("127.0.0.1:{}", running.port);
    let before =
        records(&text(&run(Command::new(tool("dig")).arg("@127.0.0.1").arg("-p").arg(running.port.to_string()).args(["2.0.192.in-addr.arpa", "AXFR"]))));
    assert!(before.iter().any(|r| r.contains("printer.corp.test.")), "{before:?}");
    let reverse = Adopted::up(&conf, "2.0.192.in-addr.arpa", root.path().join("reverse"), &["--server", &server]);
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
    let (ok, said) = reverse.nsupdate(2, &dhcp_key, "update add 107.2.0.192.in-addr.arpa 300 PTR laptop-7.corp.test.");
    assert!(ok, "{said}\n{}", reverse.logs());
    for i in 0..4 {
        assert!(reverse.dig(i, &["107.2.0.192.in-addr.arpa", "PTR"]).contains("laptop-7.corp.test."), "replica {i}");
    }
    // The operators' key is not in this zone's allow-update.
    let (ok, said) = reverse.nsupdate(0, &ops_key, "update add 108.2.0.192.in-addr.arpa 300 PTR x.corp.test.");
    assert!(!ok, "{said}");
    assert!(!reverse.dig(0, &["108.2.0.192.in-addr.arpa", "PTR"]).contains("x.corp.test."));
}
