//! Several zones per cluster (docs/MULTIZONE.md): `sdns keygen` deals a forward and a
//! reverse zone, each with its own threshold key and update keys; a replica given that
//! dealing writes one named.conf serving both, which the patched build's named-checkconf
//! loads, and starts on it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use sdns_system_tests::{bind_dir, free_port_block, ports, run, sdns_bin, text, tool};

const REVERSE: &str = "2.0.192.in-addr.arpa.";
const FORWARD: &str = "example.test.";
const REVERSE_ZONE: &str = "$ORIGIN 2.0.192.in-addr.arpa.\n$TTL 300\n\
    @ IN SOA ns0.example.test. hostmaster.example.test. ( 7 3600 900 604800 300 )\n\
    @ IN NS ns0.example.test.\n80 IN PTR www.example.test.\n25 IN PTR mail.example.test.\n";

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777
}

/// The key tag in a DS line (`<owner> IN DS <tag> <alg> <digest type> <digest>`).
fn ds_tag(ds: &str) -> String {
    let words: Vec<&str> = ds.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "DS").unwrap_or_else(|| panic!("no DS in {ds:?}"));
    words[at + 1].to_string()
}

#[test]
fn a_forward_and_a_reverse_zone_are_dealt_apart_and_named_serves_both() {
    let work = tempfile::tempdir().unwrap();
    let dealt = work.path().join("dealt");
    let reverse_file = work.path().join("reverse.db");
    std::fs::write(&reverse_file, REVERSE_ZONE).unwrap();
    let forward_file = work.path().join("forward.db");
    std::fs::write(
        &forward_file,
        format!("$ORIGIN {FORWARD}\n$TTL 300\n@ IN SOA ns0 hostmaster ( 1 3600 900 604800 300 )\n@ IN NS ns0\nns0 IN A 127.0.0.1\nwww IN A 192.0.2.80\n"),
    )
    .unwrap();
    // Listed forward first: the zone index is the canonical order, not the command line's.
    // Free ports: the replica started below binds its own.
    let out = run(Command::new(sdns_bin())
        .args(["keygen", "--replicas", "4", "--bits", "1024", "--update-auth", "both"])
        .args(ports(free_port_block(4)))
        .args(["--zone", FORWARD, "--zone", REVERSE, "--zone-file"])
        .arg(&forward_file)
        .arg("--zone-file")
        .arg(&reverse_file)
        .arg("--bind-dir")
        .arg(bind_dir())
        .arg("--out")
        .arg(&dealt));
    assert!(out.status.success(), "keygen: {}", text(&out));

    // The operator's files, per zone: its own update key, DS, trust anchor and data.
    let mut tags = Vec::new();
    for zone in [FORWARD, REVERSE] {
        let dir = dealt.join("zones").join(zone.trim_end_matches('.'));
        assert_eq!(mode(&dir.join("tsig.key")), 0o600, "{zone}");
        assert!(read(&dir.join("tsig.key")).contains(&format!("key \"sdns-update.{}\"", zone.trim_end_matches('.'))), "{zone}");
        let ds = read(&dir.join("ds.txt"));
        assert!(ds.to_ascii_lowercase().starts_with(zone), "{zone}: {ds}");
        let tag = ds_tag(&ds);
        assert!(read(&dir.join("trust-anchor.conf")).contains(zone.trim_end_matches('.')), "{zone}");
        // BIND's own tool derives the same DS from the key file the dealer wrote.
        let key_file = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&format!("K{zone}+008+")) && p.extension().is_some_and(|e| e == "key"))
            .unwrap_or_else(|| panic!("no K{zone}+008+*.key in {}", dir.display()));
        let from_key = run(Command::new(tool("dnssec-dsfromkey")).args(["-2"]).arg(&key_file));
        assert!(from_key.status.success(), "{}", text(&from_key));
        assert_eq!(String::from_utf8_lossy(&from_key.stdout).split_whitespace().collect::<Vec<_>>(), ds.split_whitespace().collect::<Vec<_>>(), "{zone}");
        // Its SIG(0) pair is the zone's own, the private half only here.
        let sig0_private = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "private"));
        assert_eq!(mode(&sig0_private.unwrap_or_else(|| panic!("no SIG(0) private key for {zone}"))), 0o600);
        tags.push(tag);
    }
    assert_ne!(tags[0], tags[1], "one threshold key per zone");
    assert!(!dealt.join("tsig.key").exists() && dealt.join("transfer.key").exists());

    // Every replica: its shares private, its configuration the two zones in canonical order.
    for i in 0..4 {
        let rdir = dealt.join(format!("replica-{i}"));
        let config = wrapper::config::Config::load(&rdir.join("replica.toml")).unwrap();
        let names: Vec<&str> = config.zones.iter().map(|z| z.name.as_str()).collect();
        assert_eq!(names, [REVERSE, FORWARD]);
        for z in &config.zones {
            assert_eq!(mode(&config.resolve(&z.key_share)), 0o600, "replica {i} {}", z.name);
            assert!(config.resolve(&z.public_key).is_file() && config.resolve(&z.zone_file).is_file());
            assert!(config.resolve(&z.sig0_keys[0]).is_file());
        }
        assert!(!rdir.join("share.json").exists(), "no single-zone share beside the zones");
    }

    // A replica writes one named.conf for both zones and has it checked, then starts on it
    // (it waits for its peers; stopped here once its named runs).
    let r0 = dealt.join("replica-0");
    let log = std::fs::File::create(work.path().join("replica-0.log")).unwrap();
    let mut replica =
        Command::new(sdns_bin()).args(["run", "--config"]).arg(r0.join("replica.toml")).stdout(log.try_clone().unwrap()).stderr(log).spawn().expect("sdns run");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let said = || std::fs::read_to_string(work.path().join("replica-0.log")).unwrap_or_default();
    while !said().contains("replica running") {
        if let Ok(Some(status)) = replica.try_wait() {
            panic!("the replica with two zones ended ({status}): {}", said());
        }
        assert!(std::time::Instant::now() < deadline, "the replica with two zones did not start: {}", said());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _ = Command::new("kill").arg(replica.id().to_string()).status();
    let _ = replica.wait();
    let named = r0.join("state/named");
    let conf = read(&named.join("named.conf"));
    let reverse_at = conf.find("zone \"2.0.192.in-addr.arpa.\" {").unwrap_or_else(|| panic!("{conf}"));
    let forward_at = conf.find("zone \"example.test.\" {").unwrap_or_else(|| panic!("{conf}"));
    let (reverse_stmt, forward_stmt) =
        if reverse_at < forward_at { (&conf[reverse_at..forward_at], &conf[forward_at..]) } else { (&conf[reverse_at..], &conf[forward_at..reverse_at]) };
    // Each zone grants its own identities (TSIG and SIG(0)) and not the other's.
    for (stmt, own, other) in [(reverse_stmt, "-0-", "-1-"), (forward_stmt, "-1-", "-0-")] {
        for kind in ["tsig", "sig0"] {
            assert!(stmt.contains(&format!("grant \"{kind}{own}0.sdns-local\" zonesub ANY;")), "{stmt}");
            assert!(!stmt.contains(&format!("{kind}{other}")), "{stmt}");
        }
    }
    // Each zone's DNSKEY is in its own key directory, with the tag its DS names.
    assert!(named.join(format!("zones/2.0.192.in-addr.arpa/keys/K{REVERSE}+008+{:0>5}.key", tags[1])).is_file(), "{}", tags[1]);
    assert!(named.join(format!("zones/example.test/keys/K{FORWARD}+008+{:0>5}.key", tags[0])).is_file(), "{}", tags[0]);
    let loaded = run(Command::new(tool("named-checkconf")).arg("-z").arg(named.join("named.conf")));
    let loaded_text = text(&loaded);
    assert!(loaded.status.success(), "{loaded_text}");
    assert!(loaded_text.contains("zone 2.0.192.in-addr.arpa/IN: loaded serial 7"), "{loaded_text}");
    assert!(loaded_text.contains("zone example.test/IN: loaded serial 1"), "{loaded_text}");
}
