//! Several zones per cluster (docs/MULTIZONE.md): `sdns keygen` deals a forward and a
//! reverse zone, each with its own threshold key and update keys; a replica given that
//! dealing writes one named.conf serving both, which the patched build's named-checkconf
//! loads, and starts on it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sdns_system_tests::{bind, bind_dir, free_port_block, ports, run, sdns_bin, text, tool, Cluster, ClusterOpts, Replicas};

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
        let settings = wrapper::config::Settings::load(&rdir.join("replica.toml")).unwrap();
        let names: Vec<&str> = settings.zones.iter().map(|z| z.name.as_str()).collect();
        assert_eq!(names, [REVERSE, FORWARD]);
        for z in &settings.zones {
            assert_eq!(mode(&z.key_share), 0o600, "replica {i} {}", z.name);
            assert!(z.public_key.is_file() && z.zone_file.is_file());
            assert!(z.sig0_keys[0].is_file());
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

const FORWARD_ZONE: &str = "$ORIGIN example.test.\n$TTL 300\n\
    @ IN SOA ns0 hostmaster ( 1 3600 900 604800 300 )\n@ IN NS ns0\nns0 IN A 127.0.0.1\nwww IN A 192.0.2.80\n";

/// Replica `i`'s answer to `dig +short`, trimmed.
fn short(c: &Cluster, i: u16, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["+short", "+time=2", "+tries=2"]);
    c.dig(i, &all).trim().to_string()
}

/// `nsupdate -k key` against replica `i` for `zone`; (success, output).
fn update(c: &Cluster, i: u16, zone: &str, commands: &str, key: &Path) -> (bool, String) {
    c.nsupdate_in(i, zone, key, commands)
}

/// Replica `i`'s transfer of `zone` (the cluster's transfer key), records sorted.
fn axfr(c: &Cluster, i: u16, zone: &str) -> Vec<String> {
    c.transfer_sorted(i, zone)
}

fn delv(c: &Cluster, i: u16, anchor: &Path, name: &str, rtype: &str, root: &str) -> String {
    bind::delv(c.client_port(i), anchor, name, rtype, root)
}

fn wait_short(c: &Cluster, i: u16, args: &[&str], want: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while short(c, i, args) != want {
        assert!(Instant::now() < deadline, "replica {i} never answered {args:?} with {want}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The newest checkpoint every replica kept a snapshot of, and each replica's snapshot of it.
fn common_snapshots(c: &Cluster) -> Option<(u64, Vec<wrapper::statexfer::Snapshot>)> {
    let seqs = |i: u16| -> Vec<u64> {
        std::fs::read_dir(c.path(&format!("replica-{i}/state/snapshots")))
            .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".snap")?.parse().ok()).collect())
            .unwrap_or_default()
    };
    let first = seqs(0);
    let seq = first.into_iter().filter(|s| (1..c.n).all(|i| seqs(i).contains(s))).max()?;
    let snaps = (0..c.n)
        .map(|i| {
            let bytes = std::fs::read(c.path(&format!("replica-{i}/state/snapshots/{seq:020}.snap"))).ok()?;
            wrapper::statexfer::Snapshot::decode(&bytes, 64 << 20).ok()
        })
        .collect::<Option<Vec<_>>>()?;
    Some((seq, snaps))
}

/// One 4-replica cluster serving a forward and a reverse zone, each with its own threshold
/// key and update key: updates with a zone's own key work on that zone and the other zone's
/// key is refused; delv validates each zone with its own trust anchor; the reverse zone
/// answers PTR; the replicas' checkpoints agree (their snapshots of one checkpoint carry both
/// zones and the same digest); a replica stopped while the others move past the log they
/// keep comes back with both zones; sign-zone asks for one zone alone.
#[test]
fn a_forward_and_a_reverse_zone_are_served_by_one_cluster() {
    let files = tempfile::tempdir().unwrap();
    let (forward_file, reverse_file) = (files.path().join("forward.db"), files.path().join("reverse.db"));
    std::fs::write(&forward_file, FORWARD_ZONE).unwrap();
    std::fs::write(&reverse_file, REVERSE_ZONE).unwrap();
    let mut extra: Vec<String> = ["--checkpoint-interval", "8", "--retained-batches", "16", "--zone", FORWARD, "--zone", REVERSE].map(String::from).to_vec();
    for f in [&forward_file, &reverse_file] {
        extra.push("--zone-file".into());
        extra.push(f.to_str().expect("utf-8 path").into());
    }
    let c = Cluster::up(ClusterOpts { extra, sign_zone_interval_s: Some(1), ..ClusterOpts::default() });
    let zone_dir = |z: &str| c.path(&format!("zones/{}", z.trim_end_matches('.')));
    let (fkey, rkey) = (zone_dir(FORWARD).join("tsig.key"), zone_dir(REVERSE).join("tsig.key"));
    let (fanchor, ranchor) = (zone_dir(FORWARD).join("trust-anchor.conf"), zone_dir(REVERSE).join("trust-anchor.conf"));

    // Each zone's own key, through different replicas.
    let (ok, out) = update(&c, 0, FORWARD, "update add new.example.test. 300 A 192.0.2.7", &fkey);
    assert!(ok, "forward update with its own key:\n{out}\n{}", c.logs());
    let (ok, out) = update(&c, 1, REVERSE, "update add 7.2.0.192.in-addr.arpa. 300 PTR new.example.test.", &rkey);
    assert!(ok, "reverse update with its own key:\n{out}\n{}", c.logs());
    // The other zone's key grants nothing.
    let (ok, out) = update(&c, 2, FORWARD, "update add evil.example.test. 300 A 10.0.0.1", &rkey);
    assert!(!ok, "the reverse zone's key updated the forward zone:\n{out}");
    let (ok, out) = update(&c, 3, REVERSE, "update add 9.2.0.192.in-addr.arpa. 300 PTR evil.example.test.", &fkey);
    assert!(!ok, "the forward zone's key updated the reverse zone:\n{out}");
    for i in 0..c.n {
        assert_eq!(short(&c, i, &["new.example.test", "A"]), "192.0.2.7", "replica {i}\n{}", c.logs());
        assert_eq!(short(&c, i, &["-x", "192.0.2.7"]), "new.example.test.", "replica {i}");
        assert_eq!(short(&c, i, &["-x", "192.0.2.80"]), "www.example.test.", "replica {i}");
        assert_eq!(short(&c, i, &["evil.example.test", "A"]), "", "replica {i}");
        assert_eq!(short(&c, i, &["-x", "192.0.2.9"]), "", "replica {i}");
    }

    // Each zone validates with its own trust anchor, and not with the other's.
    let v = delv(&c, 1, &fanchor, "new.example.test", "A", FORWARD);
    assert!(v.contains("; fully validated") && v.contains("192.0.2.7"), "forward zone, its anchor:\n{v}");
    let v = delv(&c, 2, &ranchor, "7.2.0.192.in-addr.arpa", "PTR", REVERSE);
    assert!(v.contains("; fully validated") && v.contains("new.example.test."), "reverse zone, its anchor:\n{v}");
    let v = delv(&c, 2, &ranchor, "www.example.test", "A", FORWARD);
    assert!(!v.contains("; fully validated"), "the forward zone validated under the reverse zone's anchor:\n{v}");

    // `cluster status` has a line per zone, the replicas agreeing on it.
    // The cluster's port block starts one below replica 0's client port.
    let base = c.client_port(0) - 1;
    let out = run(Command::new(sdns_bin())
        .args(["cluster", "status", "--replicas", "4"])
        .arg("--dir")
        .arg(c.dir.path())
        .args(ports(base))
        .args(["--zone", FORWARD, "--zone", REVERSE]));
    let said = text(&out);
    for zone in [FORWARD, REVERSE] {
        assert!(said.contains(&format!("zone {zone}: serial")), "cluster status:\n{said}");
    }
    // Per-zone metrics carry the zone's name.
    let metrics = c.metrics(0);
    assert!(metrics.contains(&format!("zone=\"{REVERSE}\"")) && metrics.contains(&format!("zone=\"{FORWARD}\"")), "{metrics}");

    // sign-zone for the reverse zone alone. At most one signing per agreed second
    // (`sign_zone_interval_s: 1`): everything above can fit in the second of the first one.
    std::thread::sleep(Duration::from_millis(1100));
    let mut cmd = Command::new(sdns_bin());
    cmd.args(["sign-zone", "--zone", REVERSE]);
    for i in 0..c.n {
        cmd.arg("--admin").arg(format!("127.0.0.1:{}", c.metrics_port(i))).arg("--token").arg(c.admin_token(i));
    }
    let out = run(&mut cmd);
    let said = text(&out);
    assert!(out.status.success() && said.contains(&format!("zone {REVERSE}: signed at")), "sign-zone --zone:\n{said}\n{}", c.logs());
    assert!(!said.contains(&format!("zone {FORWARD}:")), "only the zone asked for: {said}");

    // Replica 3 is stopped while the others write to both zones and order far more batches
    // than they keep; it comes back with both zones.
    c.stop(3);
    let (ok, out) = update(&c, 0, FORWARD, "update add missed.example.test. 300 A 192.0.2.11", &fkey);
    assert!(ok, "{out}\n{}", c.logs());
    let (ok, out) = update(&c, 1, REVERSE, "update add 11.2.0.192.in-addr.arpa. 300 PTR missed.example.test.", &rkey);
    assert!(ok, "{out}\n{}", c.logs());
    for k in 0..120u16 {
        let i = k % 3;
        assert_eq!(short(&c, i, &["www.example.test", "A"]), "192.0.2.80", "read {k} through replica {i}\n{}", c.logs());
    }
    c.start_stopped();
    wait_short(&c, 3, &["missed.example.test", "A"], "192.0.2.11");
    wait_short(&c, 3, &["-x", "192.0.2.11"], "missed.example.test.");
    let log = std::fs::read_to_string(c.path("replica-3/sdns.log")).unwrap_or_default();
    assert!(log.contains("transferred state installed"), "replica 3 did not catch up by state transfer\n{}", c.logs());
    let v = delv(&c, 3, &ranchor, "11.2.0.192.in-addr.arpa", "PTR", REVERSE);
    assert!(v.contains("; fully validated"), "the transferred reverse zone at replica 3:\n{v}");

    // Both zones the same everywhere, and the checkpoints agree: every replica's snapshot of
    // the newest checkpoint they all kept has the same digest and both zones, in index order.
    let (ok, out) = update(&c, 3, FORWARD, "update add after.example.test. 300 A 192.0.2.12", &fkey);
    assert!(ok, "update through the caught-up replica:\n{out}\n{}", c.logs());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let zones: Vec<(Vec<String>, Vec<String>)> = (0..c.n).map(|i| (axfr(&c, i, FORWARD), axfr(&c, i, REVERSE))).collect();
        if zones.iter().all(|z| z == &zones[0]) {
            break;
        }
        assert!(Instant::now() < deadline, "the replicas' zones differ\n{}", c.logs());
        std::thread::sleep(Duration::from_secs(1));
    }
    for k in 0..24u16 {
        short(&c, k % 4, &["www.example.test", "A"]);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let (seq, snaps) = loop {
        if let Some(found) = common_snapshots(&c).filter(|(seq, _)| *seq > 0) {
            break found;
        }
        assert!(Instant::now() < deadline, "no checkpoint all replicas kept\n{}", c.logs());
        std::thread::sleep(Duration::from_secs(1));
    };
    for (i, s) in snaps.iter().enumerate() {
        let names: Vec<&str> = s.zones.iter().map(|z| z.name.as_str()).collect();
        assert_eq!(names, [REVERSE, FORWARD], "replica {i}'s snapshot of checkpoint {seq}");
        assert_eq!(s.digest, snaps[0].digest, "replica {i}'s digest of checkpoint {seq} differs from replica 0's");
    }
}

/// The expiration of the RRSIG over `name`'s `rtype` RRset at replica `i` (YYYYMMDDHHMMSS).
fn sig_expiration(c: &Cluster, i: u16, name: &str, rtype: &str) -> Option<String> {
    let out = c.dig(i, &[name, "RRSIG", "+short"]);
    let line = out.lines().find(|l| l.starts_with(&format!("{rtype} ")))?;
    line.split_whitespace().nth(4).map(str::to_string)
}

/// Replica `i`'s `sdns_zone_resigned_rrsets_total` for `zone`.
fn resigned(c: &Cluster, i: u16, zone: &str) -> u64 {
    let label = format!("zone=\"{zone}\"");
    c.metrics(i)
        .lines()
        .find(|l| l.starts_with("sdns_zone_resigned_rrsets_total") && l.contains(&label))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Both zones with one-minute signatures: each is re-signed in its own ordered slices, so
/// past the first signatures' expiration both still validate at every replica, with newer
/// signatures, and every replica counts re-signed RRsets under each zone's label.
#[test]
fn both_zones_are_re_signed_in_their_own_slices() {
    let files = tempfile::tempdir().unwrap();
    let (forward_file, reverse_file) = (files.path().join("forward.db"), files.path().join("reverse.db"));
    std::fs::write(&forward_file, FORWARD_ZONE).unwrap();
    std::fs::write(&reverse_file, REVERSE_ZONE).unwrap();
    let mut extra: Vec<String> =
        ["--signature-validity-s", "60", "--resign-slice-interval-s", "2", "--resign-slice-rrsets", "6", "--zone", FORWARD, "--zone", REVERSE]
            .map(String::from)
            .to_vec();
    for f in [&forward_file, &reverse_file] {
        extra.push("--zone-file".into());
        extra.push(f.to_str().expect("utf-8 path").into());
    }
    let c = Cluster::up(ClusterOpts { extra, resign_after_s: Some(20), ..ClusterOpts::default() });
    let zone_dir = |z: &str| c.path(&format!("zones/{}", z.trim_end_matches('.')));
    let (fanchor, ranchor) = (zone_dir(FORWARD).join("trust-anchor.conf"), zone_dir(REVERSE).join("trust-anchor.conf"));
    let first_www = sig_expiration(&c, 0, "www.example.test", "A").expect("www A is signed");
    let first_ptr = sig_expiration(&c, 0, "80.2.0.192.in-addr.arpa", "PTR").expect("the PTR is signed");

    // Past the first signatures' expiration (60 s after the signing).
    std::thread::sleep(Duration::from_secs(75));
    for i in 0..c.n {
        let www = sig_expiration(&c, i, "www.example.test", "A").unwrap_or_default();
        let ptr = sig_expiration(&c, i, "80.2.0.192.in-addr.arpa", "PTR").unwrap_or_default();
        assert!(www > first_www && ptr > first_ptr, "replica {i}: www A {first_www} -> {www}, PTR {first_ptr} -> {ptr}\n{}", c.logs());
        let v = delv(&c, i, &fanchor, "www.example.test", "A", FORWARD);
        assert!(v.contains("; fully validated"), "forward zone at replica {i}:\n{v}");
        let v = delv(&c, i, &ranchor, "80.2.0.192.in-addr.arpa", "PTR", REVERSE);
        assert!(v.contains("; fully validated"), "reverse zone at replica {i}:\n{v}");
        for zone in [FORWARD, REVERSE] {
            assert!(resigned(&c, i, zone) > 0, "replica {i} re-signed nothing of {zone}:\n{}", c.metrics(i));
        }
    }
}
