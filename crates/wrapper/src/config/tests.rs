//! The configuration's two forms: parsing, the layout upgrade, and every check naming its field.

use super::*;
use std::time::Duration;

pub(crate) fn sample(n: u16) -> String {
    let mut s = format!(
        r#"
[cluster]
zone = "example.test."
replicas = {n}
ca_cert = "ca.pem"
public_key = "zone.pub.json"

[replica]
id = 0
key_share = "share.json"
cert = "replica.pem"
tls_key = "replica.key"
state_dir = "state"

[named]
bind_dir = "/opt/bind"
port = 5501
zone_file = "zone.db"
tsig_keys = ["tsig.key"]
"#
    );
    for i in 0..n {
        s += &format!("\n[[peer]]\nid = {i}\nclient = \"127.0.0.1:{}\"\npeer = \"127.0.0.1:{}\"\n", 5301 + i, 5401 + i);
    }
    s
}

fn parse(text: &str) -> Result<Settings, ConfigError> {
    Settings::parse(text, Path::new("r0.toml"), Path::new("/etc/sdns"))
}

#[test]
fn sample_parses_with_defaults() {
    let c = parse(&sample(4)).unwrap();
    assert_eq!((c.replicas, c.faults), (4, 1));
    assert_eq!(c.protocol, Protocol::OptTe);
    assert_eq!(c.reads.mode, ReadMode::Ordered);
    assert!(c.reads.vouched(), "vouched reads are on by default");
    assert_eq!(c.reads.vouch_timeout, Duration::from_millis(5)..=Duration::from_millis(50));
    // Paths come out absolute, against the file's directory.
    assert_eq!(c.zones[0].key_share, Path::new("/etc/sdns/share.json"));
    assert_eq!((c.state_dir.as_path(), c.named.bind_dir.as_path()), (Path::new("/etc/sdns/state"), Path::new("/opt/bind")));
    assert_eq!(c.me.client.port(), 5301);
    assert_eq!(c.auth.mode, exec::auth::Mode::Tsig);
    assert!(c.zones[0].transfer_keys.is_empty() && !c.auth.skip_precheck);
    assert_eq!(c.rrl.responses_per_second, 0);
    let both = parse(&(sample(4) + "\n[auth]\nmode = \"both\"\nsig0_keys = [\"K.key\"]\n[rrl]\nresponses_per_second = 20\n")).unwrap();
    assert_eq!((both.auth.mode, both.rrl.responses_per_second, both.rrl.slip), (exec::auth::Mode::Both, 20, 2));
    assert!(c.zones[0].update_policy.is_none());
    let policy = parse(&sample(4).replace("tsig_keys", "update_policy = [\"grant dhcp zonesub A PTR\"]\ntsig_keys")).unwrap();
    let rules = policy.zones[0].update_policy.as_ref().unwrap();
    assert_eq!((rules[0].identity.as_str(), rules[0].types.len()), ("dhcp", 2));
    // The stall bound: twice the client timeout unless given; 0 is refused.
    assert_eq!(c.metrics.stall_after, Duration::from_secs(30));
    let stall = |v: &str| parse(&(sample(4) + &format!("\n[metrics]\nstall_after_ms = {v}\n")));
    assert_eq!(stall("5000").unwrap().metrics.stall_after, Duration::from_secs(5));
    assert!(stall("0").unwrap_err().to_string().contains("metrics.stall_after_ms"));
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (sample(4).replace("replicas = 4", "replicas = 3"), "peer"),
        (sample(4).replace("id = 0\nkey_share", "id = 9\nkey_share"), "replica.id"),
        (sample(4).replace("zone = \"example.test.\"", "zone = \"\""), "cluster.zone"),
        (sample(4).replace("replicas = 4", "replicas = 4\nfaults = 2"), "cluster.faults"),
        (sample(4).replace("port = 5501", "port = 0"), "named.port"),
        (sample(4).replace("replicas = 4", "replicas = 4\nvouch_timeout_ms = 0"), "cluster.vouch_timeout_ms"),
        (sample(4).replace("replicas = 4", "replicas = 4\nvouch_timeout_ms = 20\nvouch_timeout_max_ms = 10"), "cluster.vouch_timeout_max_ms"),
        (sample(4).replace("replicas = 4", "replicas = 4\nvouch_timeout_max_ms = 10001"), "cluster.vouch_timeout_max_ms"),
        (sample(4) + "\n[signing]\nresign_after_s = 99999999\n", "signing.resign_after_s"),
        (sample(4) + "\n[signing]\nsign_zone_window_s = 0\n", "signing.sign_zone_window_s"),
        (sample(4).replace("127.0.0.1:5402", "127.0.0.1:5401"), "peer"),
        (sample(4) + "\n[auth]\nmode = \"sig0\"\n", "auth.sig0_keys"),
        (sample(4) + "\n[rrl]\nresponses_per_second = 5\nwindow_s = 0\n", "rrl"),
        (sample(4).replace("state_dir", "byzantine = \"silent\"\nstate_dir"), "replica.byzantine"),
        (sample(4).replace("state_dir", "corrupt_shares = true\nstate_dir"), "replica.corrupt_shares"),
        (sample(4).replace("state_dir", "test_fail_writes_naming = \"hang.example.test.\"\nstate_dir"), "replica.test_fail_writes_naming"),
        (sample(4).replace("tsig_keys", "update_policy = [\"grant k self . A\"]\ntsig_keys"), "named.update_policy"),
        (sample(4) + "\n[client]\nudp_receive_buffer = 5000000000\n", "client.udp_receive_buffer"),
        (sample(4) + "\n[client]\nmax_pending = 0\n", "client"),
        (sample(4) + "\n[ordering]\nbatch_max_requests = 0\n", "ordering.batch_max_requests"),
        (sample(4) + "\n[ordering]\ncheckpoint_interval = 0\n", "ordering.checkpoint_interval"),
        (sample(4) + "\n[ordering]\nview_change_timeout_ms = 0\n", "ordering"),
        (sample(4) + "\n[signing]\ncache_entries = 0\n", "signing.cache_entries"),
        (sample(4) + "\n[signing]\nresign_slice_rrsets = 0\n", "signing.resign_slice_interval_s"),
        (sample(4) + "\n[signing]\nvalidity_s = 30\n", "signing.validity_s"),
        (sample(4).replace("port = 5501", "port = 5501\nsignature_validity_days = 2"), "named.signature_validity_days"),
        (sample(4).replace("replicas = 4", "replicas = 0"), "cluster.replicas"),
        (sample(4) + "\n[auth]\nsig0_max_validity_s = 10\n", "auth.sig0_max_validity_s"),
    ];
    for (text, field) in cases {
        match parse(&text) {
            Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
            other => panic!("expected an error naming {field}, got {other:?}"),
        }
    }
}

#[test]
fn single_zone_fields_are_read_as_one_zone() {
    let mut c = Config::from_toml(&sample(4), Path::new("r0.toml")).unwrap();
    assert_eq!(c.layout(), Layout::SingleZone);
    assert_eq!(c.upgrade(Path::new("r0.toml")).unwrap(), Layout::SingleZone);
    let z = c.only_zone().unwrap();
    assert_eq!(
        (z.name.as_str(), z.algorithm, z.public_key.as_path(), z.key_share.as_path(), z.zone_file.as_path()),
        ("example.test.", 8, Path::new("zone.pub.json"), Path::new("share.json"), Path::new("zone.db"))
    );
    assert_eq!(z.tsig_keys, vec![PathBuf::from("tsig.key")]);
    // Moved, not copied: one place holds each zone setting.
    assert!(c.cluster.zone.is_none() && c.replica.key_share.is_none() && c.named.tsig_keys.is_empty());
    // Upgraded once: the upgraded form reads back as zone tables, and runs alike.
    assert_eq!(c.upgrade(Path::new("r0.toml")).unwrap(), Layout::ZoneTables);
    let settings = parse(&sample(4)).unwrap();
    assert_eq!(settings.layout, Layout::SingleZone);
    assert_eq!(settings.field_of(&settings.zones[0], "key_share"), "replica.key_share");
    let again = parse(&toml::to_string(&c).unwrap()).unwrap();
    assert_eq!((again.layout, &again.zones), (Layout::ZoneTables, &settings.zones));
    assert_eq!(again.field_of(&again.zones[0], "key_share"), "[[zone]] example.test.: key_share");
    let e = parse(&sample(4).replace("zone_file = \"zone.db\"\n", "")).unwrap_err();
    assert!(matches!(&e, ConfigError::Invalid { field, .. } if field == "named.zone_file"), "{e}");
}

/// `sample(4)` with its single-zone fields replaced by these `[[zone]]` tables.
fn with_zones(zones: &[&str]) -> String {
    let mut text = sample(4);
    for line in [
        "zone = \"example.test.\"\n",
        "public_key = \"zone.pub.json\"\n",
        "key_share = \"share.json\"\n",
        "zone_file = \"zone.db\"\n",
        "tsig_keys = [\"tsig.key\"]\n",
    ] {
        text = text.replacen(line, "", 1);
    }
    for z in zones {
        let dir = z.trim_end_matches('.');
        text += &format!(
            "\n[[zone]]\nname = \"{z}\"\npublic_key = \"zones/{dir}/zone.pub.json\"\nkey_share = \"zones/{dir}/share.json\"\n\
             zone_file = \"zones/{dir}/zone.db\"\ntsig_keys = [\"zones/{dir}/tsig.key\"]\n"
        );
    }
    text
}

#[test]
fn zone_tables_are_sorted_into_canonical_order() {
    let c = parse(&with_zones(&["example.test.", "2.0.192.in-addr.arpa.", "Alpha.example."])).unwrap();
    assert!(c.layout == Layout::ZoneTables && c.only_zone().is_none());
    let names: Vec<&str> = c.zones.iter().map(|z| z.name.as_str()).collect();
    // RFC 4034 6.1: compared label by label from the right, case ignored.
    assert_eq!(names, ["2.0.192.in-addr.arpa.", "Alpha.example.", "example.test."]);
    assert_eq!(c.zones[2].tsig_keys, vec![PathBuf::from("/etc/sdns/zones/example.test/tsig.key")]);
    // The file form sorts alike when loaded for tools.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("r0.toml");
    std::fs::write(&file, with_zones(&["example.test.", "2.0.192.in-addr.arpa.", "Alpha.example."])).unwrap();
    let loaded = Config::load(&file).unwrap();
    assert_eq!(loaded.zones.iter().map(|z| z.name.as_str()).collect::<Vec<_>>(), names);
    assert_eq!(loaded.zone(2).unwrap().tsig_keys, vec![PathBuf::from("zones/example.test/tsig.key")]);
    // The order is the file's no matter how the tables are listed.
    let again = parse(&with_zones(&["Alpha.example.", "example.test.", "2.0.192.in-addr.arpa."])).unwrap();
    assert_eq!(again.zones, c.zones);
}

#[test]
fn zone_sets_one_named_cannot_serve_are_refused() {
    let cases = [
        (with_zones(&["example.test.", "EXAMPLE.test"]), "zone[1].name", "given twice"),
        (with_zones(&["example.test.", "sub.example.test."]), "zone[1].name", "inside zone example.test."),
        (with_zones(&["sub.example.test.", "example.test."]), "zone[1].name", "sub.example.test. is inside zone example.test."),
        (with_zones(&["example.test.", "*.wild.test."]), "zone[1].name", "letters, digits"),
        (with_zones(&["example.test.", "."]), "zone[1].name", "letters, digits"),
        (with_zones(&["example.test.", "other.test."]).replace("[replica]", "[replica]\nkey_share = \"share.json\""), "replica.key_share", "single-zone field"),
        (with_zones(&["example.test."]).replacen("tsig_keys = [\"zones/example.test/tsig.key\"]\n", "", 1), "zone[0].tsig_keys", "at least one TSIG"),
        (with_zones(&["example.test."]) + "update_policy = [\"grant k self . A\"]\n", "zone[0].update_policy", "not supported"),
        (with_zones(&["example.test."]) + "algorithm = 14\n", "zone[0].algorithm", "not a DNSSEC algorithm sdns signs with"),
    ];
    for (text, field, why) in cases {
        let e = parse(&text).unwrap_err();
        match &e {
            ConfigError::Invalid { field: f, problem, .. } => assert!(f == field && problem.contains(why), "{field}/{why}: {e}"),
            ConfigError::Parse { message, .. } => assert!(field.is_empty() && message.contains(why), "{why}: {e}"),
            other => panic!("{other:?}"),
        }
    }
    // A zone beside its sibling, and a one-label difference that is not containment.
    parse(&with_zones(&["example.test.", "xexample.test."])).unwrap();
}

#[test]
fn byzantine_modes_only_in_test_clusters() {
    let text = sample(4).replace("state_dir", "byzantine = \"crash-after-5\"\nstate_dir");
    let test = text.replace("public_key = \"zone.pub.json\"", "public_key = \"zone.pub.json\"\ntest_cluster = true");
    let c = parse(&test).unwrap();
    assert_eq!(c.test.byzantine, Some(crate::byzantine::Mode::CrashAfter(5)));
    let e = parse(&test.replace("crash-after-5", "evil")).unwrap_err();
    assert!(e.to_string().contains("evil"), "{e}");
    let hook = parse(&test.replace("state_dir", "test_fail_writes_naming = \"hang.example.test.\"\nstate_dir")).unwrap();
    assert_eq!(hook.test.fail_writes_naming.map(|n| n.to_ascii()).as_deref(), Some("hang.example.test."));
    // The hook's name is checked with the file, not when the replica runs.
    let e = parse(&test.replace("state_dir", "test_fail_writes_naming = \"a..b\"\nstate_dir")).unwrap_err();
    assert!(matches!(&e, ConfigError::Invalid { field, .. } if field == "replica.test_fail_writes_naming"), "{e}");
}

#[test]
fn relative_config_paths_resolve_to_absolute_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("r0.toml");
    std::fs::write(&file, sample(4)).unwrap();
    let cwd = std::env::current_dir().unwrap();
    // Load through a path relative to the current directory, as `--dir .cluster` gives.
    let rel = pathdiff(&file, &cwd);
    let c = Settings::load(&rel).unwrap();
    assert!(c.state_dir.is_absolute(), "{:?}", c.state_dir);
    assert_eq!(c.state_dir.parent().unwrap().join("r0.toml").canonicalize().unwrap(), file.canonicalize().unwrap());
}

/// `to` relative to `from` (both absolute), with `..` as needed.
fn pathdiff(to: &Path, from: &Path) -> PathBuf {
    let to: Vec<_> = to.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut p = PathBuf::new();
    for _ in common..from.len() {
        p.push("..");
    }
    for c in &to[common..] {
        p.push(c);
    }
    p
}

#[test]
fn unknown_and_mistyped_fields_are_parse_errors() {
    let e = parse(&sample(4).replace("[named]", "[named]\nbogus = 1")).unwrap_err();
    assert!(e.to_string().contains("bogus"), "{e}");
    let e = parse(&sample(4).replace("port = 5501", "port = \"x\"")).unwrap_err();
    assert!(e.to_string().contains("port"), "{e}");
    let e = parse(&sample(4).replace("[cluster]", "[cluster]\nprotocol = \"fast\"")).unwrap_err();
    assert!(e.to_string().contains("protocol") || e.to_string().contains("fast"), "{e}");
}

#[test]
fn each_component_takes_its_part() {
    let s = parse(&(sample(4) + "\n[ordering]\ncheckpoint_interval = 8\nbatch_delay_ms = 3\n[client]\nrequest_timeout_ms = 2000\n")).unwrap();
    let ordering = bft::Config::from(&s);
    assert_eq!((ordering.n, ordering.f, ordering.checkpoint_interval, ordering.watermark_window), (4, 1, 8, 32));
    assert_eq!(ordering.batch_delay, Duration::from_millis(3));
    let gateway = GatewayConfig::from(&s);
    assert_eq!((gateway.client, gateway.client_timeout, gateway.max_pending), (s.me.client, Duration::from_secs(2), 4096));
    let transfer = TransferConfig::from(&s);
    assert_eq!((transfer.peers.as_slice(), transfer.snapshot_dir.as_path()), (&[1, 2, 3][..], Path::new("/etc/sdns/state/snapshots")));
    // One zone keeps the layout of every earlier state directory.
    let signing = SigningConfig::from(&s);
    assert_eq!(signing.socket, Path::new("/etc/sdns/state/signer.sock"));
    assert_eq!(signing.background_sockets, [PathBuf::from("/etc/sdns/state/signzone.sock")]);
    let zone = s.maintenance(0).unwrap();
    assert_eq!((zone.work_dir.as_path(), zone.slice_journal.as_path()), (Path::new("/etc/sdns/state/named"), Path::new("/etc/sdns/state/resign.pending")));
    assert!(s.maintenance(1).is_none());
    // Several zones: a directory and a background socket each, in zone index order.
    let two = parse(&with_zones(&["example.test.", "2.0.192.in-addr.arpa."])).unwrap();
    let zone = two.maintenance(1).unwrap();
    assert_eq!(zone.zone.to_ascii(), "example.test.");
    assert_eq!(zone.slice_journal, Path::new("/etc/sdns/state/named/zones/example.test/resign.pending"));
    assert_eq!(SigningConfig::from(&two).background_sockets[1], Path::new("/etc/sdns/state/signzone-1.sock"));
}

#[test]
fn secondaries_default_cluster_wide_and_zones_may_name_their_own() {
    let notify = "port = 5501\nalso_notify = [\"192.0.2.53:53\", \"[2001:db8::53]:5300\"]";
    let default: Vec<std::net::SocketAddr> = vec!["192.0.2.53:53".parse().unwrap(), "[2001:db8::53]:5300".parse().unwrap()];
    // One zone: the cluster's list is the zone's.
    let one = parse(&sample(4).replace("port = 5501", notify)).unwrap();
    assert_eq!((&one.named.also_notify, &one.zones[0].also_notify), (&default, &default));
    assert!(parse(&sample(4)).unwrap().zones[0].also_notify.is_empty(), "no secondaries unless given");
    // Several: a zone without its own list takes the default; `[]` is none for that zone.
    let text = with_zones(&["example.test.", "other.test.", "quiet.test."]).replace("port = 5501", notify);
    let at = text.find("name = \"other.test.\"").unwrap();
    let text = format!("{}also_notify = [\"198.51.100.7:5353\"]\n{}", &text[..at], &text[at..]);
    let text = text.replace("name = \"quiet.test.\"", "name = \"quiet.test.\"\nalso_notify = []");
    let several = parse(&text).unwrap();
    let of = |name: &str| several.zones.iter().find(|z| z.name == name).unwrap().also_notify.clone();
    assert_eq!(of("example.test."), default);
    assert_eq!(of("other.test."), vec!["198.51.100.7:5353".parse::<std::net::SocketAddr>().unwrap()]);
    assert!(of("quiet.test.").is_empty());
    // Each list is checked, the error naming where it is.
    let cases = [
        (sample(4).replace("port = 5501", "port = 5501\nalso_notify = [\"0.0.0.0:53\"]"), "named.also_notify", "not an address"),
        (sample(4).replace("port = 5501", "port = 5501\nalso_notify = [\"192.0.2.1:0\"]"), "named.also_notify", "not an address"),
        (sample(4).replace("port = 5501", "port = 5501\nalso_notify = [\"192.0.2.1:53\", \"192.0.2.1:53\"]"), "named.also_notify", "twice"),
        (sample(4).replace("port = 5501", "port = 5501\nalso_notify = [\"127.0.0.1:5302\"]"), "named.also_notify", "replica 1's own"),
        (with_zones(&["example.test."]) + "also_notify = [\"224.0.0.1:53\"]\n", "zone[0].also_notify", "not an address"),
    ];
    for (text, field, why) in cases {
        match parse(&text) {
            Err(ConfigError::Invalid { field: f, problem, .. }) => assert!(f == field && problem.contains(why), "{field}/{why}: {f}: {problem}"),
            other => panic!("expected an error naming {field}, got {other:?}"),
        }
    }
}

#[test]
fn the_catalog_takes_every_zones_secondaries_and_transfer_keys() {
    assert!(parse(&sample(4)).unwrap().catalog.is_none(), "no catalog unless named");
    let text = with_zones(&["example.test.", "other.test."]).replace("port = 5501", "port = 5501\nalso_notify = [\"192.0.2.53:53\"]");
    // other.test. has a secondary of its own besides the default, and a transfer key of its own.
    let text = text.replace("name = \"example.test.\"", "name = \"example.test.\"\ntransfer_keys = [\"transfer.key\"]");
    let text = text.replace(
        "name = \"other.test.\"",
        "name = \"other.test.\"\nalso_notify = [\"198.51.100.7:5353\", \"192.0.2.53:53\"]\ntransfer_keys = [\"transfer.key\", \"other-xfr.key\"]",
    );
    let with_catalog = |name: &str| parse(&format!("{text}\n[catalog]\nzone = \"{name}\"\n"));
    let c = with_catalog("Catalog.SDNS").unwrap().catalog.unwrap();
    assert_eq!((c.name.as_str(), c.apex.to_ascii().to_ascii_lowercase().as_str()), ("Catalog.SDNS", "catalog.sdns."));
    let notify: Vec<std::net::SocketAddr> = vec!["192.0.2.53:53".parse().unwrap(), "198.51.100.7:5353".parse().unwrap()];
    assert_eq!(c.also_notify, notify, "every zone's secondaries, each once");
    assert_eq!(c.transfer_keys, [Path::new("/etc/sdns/transfer.key"), Path::new("/etc/sdns/other-xfr.key")], "every zone's transfer keys, each once");
    // A name one named cannot serve beside the zones is refused, naming the field.
    for (name, why) in [("example.test.", "twice"), ("cat.example.test.", "inside"), ("test.", "inside"), ("", "not a domain name")] {
        match with_catalog(name) {
            Err(ConfigError::Invalid { field, problem, .. }) => assert!(field == "catalog.zone" && problem.contains(why), "{name}: {field}: {problem}"),
            other => panic!("catalog {name:?}: expected an error naming catalog.zone, got {other:?}"),
        }
    }
    assert!(matches!(parse(&format!("{text}\n[catalog]\nzone = \"c.sdns.\"\nserial = 3\n")), Err(ConfigError::Parse { .. })));
}
