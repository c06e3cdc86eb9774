use super::*;

/// A configuration as `named-checkconf -p` prints it (Debian's 9.18), with the cases the
/// adoption must tell apart.
const CONF: &str = r#"acl "dhcp-servers" {
	key "dhcp-key";
};
options {
	directory "/var/cache/bind";
	allow-transfer {
		"none";
	};
};
key "dhcp-key" {
	algorithm "hmac-sha256";
	secret "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=";
};
key "ops-key" {
	algorithm "hmac-sha512";
	secret "b3BzLXNlY3JldA==";
};
key "old-key" {
	algorithm "hmac-md5";
	secret "b2xk";
};
zone "example.com" {
	type master;
	file "/etc/bind/db.example.com";
	update-policy {
		grant "dhcp-key" zonesub "A" "AAAA" "TXT";
		deny "*" name "www.example.com." "A";
		grant "ops-key." subdomain "hosts.example.com" "ANY";
	};
	allow-transfer {
		key "ops-key";
		192.0.2.1/32;
	};
	also-notify {
		192.0.2.9;
	};
};
zone "2.0.192.in-addr.arpa" IN {
	type primary;
	file "db.192";
	allow-update {
		"dhcp-servers";
	};
	notify no;
	serial-update-method unixtime;
	check-names warn;
};
zone "signed.example" {
	type primary;
	file "db.signed";
	inline-signing yes;
	dnssec-policy "default";
};
zone "odd.example" {
	type primary;
	file "db.odd";
	update-policy {
		grant "ops-key" self "." "A";
		grant "nobody" zonesub "TXT";
	};
	allow-query-on {
		127.0.0.1/32;
	};
};
zone "byaddr.example" {
	type primary;
	file "db.byaddr";
	allow-update {
		192.0.2.0/24;
		key "old-key";
	};
};
zone "secondary.example" {
	type slave;
	file "db.secondary";
	masters {
		192.0.2.1;
	};
};
zone "localhost" {
	type master;
	file "/etc/bind/db.local";
};
"#;

fn zones() -> Vec<ZoneReport> {
    inventory(&bindconf::parse(CONF).unwrap(), Path::new("/etc/bind"), 8).zones
}

fn find<'a>(zones: &'a [ZoneReport], name: &str) -> &'a Verdict {
    &zones.iter().find(|z| z.name == name).unwrap_or_else(|| panic!("no {name}")).verdict
}

#[test]
fn takes_keys_policy_and_file_of_a_primary_zone() {
    let zones = zones();
    assert_eq!(zones.len(), 7);
    let Verdict::Adoptable(plan) = find(&zones, "example.com.") else { panic!("{:?}", find(&zones, "example.com.")) };
    assert_eq!(plan.file.as_deref(), Some(Path::new("/etc/bind/db.example.com")));
    assert_eq!(plan.update_keys, vec!["dhcp-key", "ops-key"]);
    assert_eq!(plan.transfer_keys, vec!["ops-key"]);
    assert_eq!(plan.policy, vec!["grant dhcp-key zonesub A AAAA TXT", "deny * name www.example.com. A", "grant ops-key. subdomain hosts.example.com ANY"]);
    assert_eq!(plan.transfer_addresses, vec!["192.0.2.1/32"]);
    let notes = plan.notes.join("\n");
    assert!(notes.contains("NOTIFY"), "{notes}");
    // Every rule parses the way the replicas will read it from replica.toml.
    for rule in &plan.policy {
        named_glue::conf::PolicyRule::parse(&rule.split_whitespace().collect::<Vec<_>>()).unwrap();
    }
}

#[test]
fn allow_update_keys_through_an_acl_become_zonesub_grants() {
    let zones = zones();
    let Verdict::Adoptable(plan) = find(&zones, "2.0.192.in-addr.arpa.") else { panic!() };
    // Relative file names resolve against options { directory }.
    assert_eq!(plan.file.as_deref(), Some(Path::new("/var/cache/bind/db.192")));
    assert_eq!(plan.update_keys, vec!["dhcp-key"]);
    assert_eq!(plan.policy, vec!["grant dhcp-key zonesub ANY"]);
    // The global allow-transfer { none; }: no keys, no note.
    assert!(plan.transfer_keys.is_empty());
    assert!(!plan.notes.iter().any(|n| n.contains("NOTIFY")), "{:?}", plan.notes);
    assert!(plan.notes.iter().any(|n| n.ends_with("own settings): serial-update-method, check-names")), "{:?}", plan.notes);
}

#[test]
fn zones_it_cannot_take_are_named_with_every_reason() {
    let zones = zones();
    let why = |name| match find(&zones, name) {
        Verdict::Unsupported(why) => why.join("\n"),
        other => panic!("{name}: {other:?}"),
    };
    let signed = why("signed.example.");
    // Signed by named is not a reason any more (the rollover takes it); inline signing is.
    assert!(signed.contains("inline-signing") && !signed.contains("dnssec-policy"), "{signed}");
    let odd = why("odd.example.");
    assert!(odd.contains("`self` is not supported"), "{odd}");
    assert!(odd.contains("`nobody`, which is not a TSIG key"), "{odd}");
    assert!(odd.contains("option `allow-query-on`"), "{odd}");
    let byaddr = why("byaddr.example.");
    assert!(byaddr.contains("allow-update by address (`192.0.2.0/24`)"), "{byaddr}");
    assert!(byaddr.contains("hmac-md5 is not supported"), "{byaddr}");
    assert!(matches!(find(&zones, "secondary.example."), Verdict::NotCandidate(w) if w.contains("type slave")));
    assert!(matches!(find(&zones, "localhost."), Verdict::NotCandidate(w) if w.contains("built-in")));

    let report = render_report(&zones, Some(&["example.com.".to_string()]));
    for line in [
        "adopted    example.com.  (update keys: dhcp-key, ops-key; transfer keys: ops-key; 3 update rule(s))",
        "not taken  2.0.192.in-addr.arpa.",
        "not chosen: give --zone 2.0.192.in-addr.arpa. too",
        "cannot     signed.example.",
        "because: option `allow-query-on` is not supported",
        "skipped    secondary.example.  (type slave: only primary zones are adopted)",
    ] {
        assert!(report.contains(line), "missing {line:?} in\n{report}");
    }
}

#[test]
fn allow_transfer_addresses_are_carried_unless_negated() {
    let conf = |list: &str| format!("zone \"a.test\" {{\n\ttype master;\n\tfile \"db\";\n\tallow-transfer {{\n{list}\t}};\n}};\n");
    let plan = |list: &str| match &inventory(&bindconf::parse(&conf(list)).unwrap(), Path::new("/"), 8).zones[0].verdict {
        Verdict::Adoptable(p) => p.clone(),
        other => panic!("{other:?}"),
    };
    let p = plan("\t\t\"any\";\n\t\t\"localhost\";\n\t\t2001:db8::/32;\n\t\t\"localnets\";\n");
    assert_eq!(p.transfer_addresses, vec!["0.0.0.0/0", "::/0", "127.0.0.1", "::1", "2001:db8::/32"]);
    assert!(p.notes.iter().any(|n| n.contains("not carried over: localnets")), "{:?}", p.notes);
    let p = plan("\t\t! 192.0.2.1/32;\n\t\t192.0.2.0/24;\n");
    assert!(p.transfer_addresses.is_empty());
    assert!(p.notes.iter().any(|n| n.contains("negation (! 192.0.2.1/32)")), "{:?}", p.notes);
    let none = "zone \"a.test\" {\n\ttype master;\n\tfile \"db\";\n};\n";
    let Verdict::Adoptable(p) = &inventory(&bindconf::parse(none).unwrap(), Path::new("/"), 8).zones[0].verdict else { panic!() };
    assert!(p.transfer_addresses.is_empty() && p.notes.iter().any(|n| n.contains("no allow-transfer")), "{:?}", p.notes);
}

#[test]
fn zones_signed_with_the_operators_key_are_adopted_with_a_rollover() {
    let conf = "options {\n\tdirectory \"/var/cache/bind\";\n\tkey-directory \"/etc/bind/keys\";\n};\n\
                zone \"policy.test\" {\n\ttype primary;\n\tfile \"db.policy\";\n\tdnssec-policy \"rsa\";\n\tkey-directory \"zone-keys\";\n\tupdate-policy {\n\t\tgrant \"k\" zonesub \"ANY\";\n\t};\n};\n\
                zone \"auto.test\" {\n\ttype primary;\n\tfile \"db.auto\";\n\tauto-dnssec maintain;\n};\n\
                zone \"plain.test\" {\n\ttype primary;\n\tfile \"db.plain\";\n\tdnssec-policy \"none\";\n};\n\
                key \"k\" {\n\talgorithm \"hmac-sha256\";\n\tsecret \"c2VjcmV0\";\n};\n";
    let zones = inventory(&bindconf::parse(conf).unwrap(), Path::new("/etc/bind"), 8).zones;
    let plan = |name| match find(&zones, name) {
        Verdict::Adoptable(p) => p.clone(),
        other => panic!("{name}: {other:?}"),
    };
    let policy = plan("policy.test.");
    assert_eq!(policy.signed.as_deref(), Some("dnssec-policy \"rsa\""));
    // The zone's key-directory, relative to options { directory }.
    assert_eq!(policy.key_directory, Path::new("/var/cache/bind/zone-keys"));
    assert!(policy.notes.iter().any(|n| n.contains("double-KSK rollover")), "{:?}", policy.notes);
    let auto = plan("auto.test.");
    assert_eq!(auto.signed.as_deref(), Some("auto-dnssec maintain"));
    assert_eq!(auto.key_directory, Path::new("/etc/bind/keys"), "the global key-directory");
    // named.conf does not say auto-dnssec's algorithm: the list says where it is checked.
    assert!(auto.notes.iter().any(|n| n.contains("algorithm is read from the zone's data")), "{:?}", auto.notes);
    let plain = plan("plain.test.");
    assert_eq!(plain.signed, None);
    assert!(!plain.notes.iter().any(|n| n.contains("rollover")));
}

#[test]
fn the_old_ksk_is_one_ksk_of_the_threshold_keys_algorithm_with_its_private_file() {
    const KEY: &str = "AwEAAcMnWBKLuvG/LwnPVykcmpvnntwxfshHlHRhlY0F3oz8AMcuF8gw9McCw+BoC2YxWaiTpNPuxjSNhUlBtcbqXFj+rbR6DkymPPHPe9Y4+Xk6ah0m2HHVVFZJjNlH8Q==";
    let dir = tempfile::tempdir().unwrap();
    let plan = Plan { signed: Some("dnssec-policy \"rsa\"".into()), key_directory: dir.path().to_owned(), ..Plan::default() };
    let soa = "signed.test. 600 IN SOA ns.signed.test. h.signed.test. 1 3600 900 604800 300\n";
    let ksk = format!("signed.test. 600 IN DNSKEY 257 3 8 {KEY}\n");
    let zsk = format!("signed.test. 600 IN DNSKEY 256 3 8 {KEY}\n");
    let err = |text: &str, alg| old_ksk(text, "signed.test.", &["DNSKEY"], &plan, alg, None).unwrap_err().to_string();
    // No KSK in the data (a zone file without named's journal, say).
    assert!(err(&format!("{soa}{zsk}"), 8).contains("holds no KSK") && err(soa, 8).contains("--server"));
    // Two KSKs: the operator's own rollover is under way.
    let other = ksk.replace("AwEAAc", "AwEAAd");
    assert!(err(&format!("{soa}{ksk}{other}"), 8).contains("publishes 2 KSKs"));
    // Another algorithm than the threshold key's.
    assert!(err(&format!("{soa}{ksk}{zsk}"), 10).contains("uses DNSSEC algorithm 8, the threshold key 10"));
    // The private key must be where named.conf (or --key-dir) says.
    let text = format!("{soa}{zsk}{ksk}");
    assert!(err(&text, 8).contains("is not there (give the key directory with --key-dir)"));
    let stem = rollover::Dnskey::parse(ksk.trim()).unwrap().file_stem().unwrap();
    for ext in ["key", "private"] {
        std::fs::write(dir.path().join(format!("{stem}.{ext}")), "").unwrap();
    }
    let (found, key_dir) = old_ksk(&text, "signed.test.", &["DNSKEY"], &plan, 8, None).unwrap();
    assert_eq!((found.flags, key_dir.as_path()), (257, dir.path()));
    // --key-dir wins over named.conf's key-directory.
    let elsewhere = tempfile::tempdir().unwrap();
    assert!(old_ksk(&text, "signed.test.", &["DNSKEY"], &plan, 8, Some(elsewhere.path())).is_err());
}

/// A zone named signs with ECDSA (BIND's `dnssec-policy default`) or Ed25519 is not listed
/// adoptable into an RSA cluster: the list gives the reason the adoption refuses it with.
#[test]
fn the_list_refuses_a_policys_algorithm_as_the_adoption_does() {
    let conf = "dnssec-policy \"ec\" {\n\tkeys {\n\t\tksk key-directory lifetime unlimited algorithm ecdsap256sha256;\n\t\tzsk lifetime P90D algorithm 13;\n\t};\n};\n\
                dnssec-policy \"ed\" {\n\tkeys {\n\t\tcsk lifetime unlimited algorithm ED25519;\n\t};\n};\n\
                dnssec-policy \"rsa\" {\n\tkeys {\n\t\tksk lifetime unlimited algorithm rsasha256 2048;\n\t\tzsk lifetime unlimited algorithm 8 1024;\n\t};\n};\n\
                key \"k\" {\n\talgorithm \"hmac-sha256\";\n\tsecret \"c2VjcmV0\";\n};\n";
    let zone = |name: &str, policy: &str| {
        format!("zone \"{name}\" {{\n\ttype primary;\n\tfile \"db.{name}\";\n\tupdate-policy {{\n\t\tgrant \"k\" zonesub \"ANY\";\n\t}};\n\tdnssec-policy \"{policy}\";\n}};\n")
    };
    let conf = format!("{conf}{}{}{}{}", zone("default.test", "default"), zone("ec.test", "ec"), zone("ed.test", "ed"), zone("rsa.test", "rsa"));
    let zones = inventory(&bindconf::parse(&conf).unwrap(), Path::new("/etc/bind"), 8).zones;
    // The adoption's own refusal of a KSK of algorithm 13, from the zone's data.
    const KEY13: &str = "mdsswUyr3DPW132mOi8V9xESWE8jTo0dxCjjnopKl+GqJxpVXckHAeF+KkxLbxILfDLUT0rAK9iUzy1L53eKGQ==";
    let plan = Plan { signed: Some("dnssec-policy \"default\"".into()), ..Plan::default() };
    let data = format!("default.test. 600 IN SOA ns.default.test. h.default.test. 1 3600 900 604800 300\ndefault.test. 600 IN DNSKEY 257 3 13 {KEY13}\n");
    let refusal = old_ksk(&data, "default.test.", &["DNSKEY"], &plan, 8, None).unwrap_err().to_string();
    assert!(refusal.contains("uses DNSSEC algorithm 13, the threshold key 8") && refusal.contains("--algorithm 13 adopts it"), "{refusal}");
    let why = |name: &str| match find(&zones, name) {
        Verdict::Unsupported(why) => why.join("\n"),
        other => panic!("{name}: {other:?}"),
    };
    for (name, alg) in [("default.test.", 13), ("ec.test.", 13), ("ed.test.", 15)] {
        assert_eq!(why(name), algorithm_refusal(alg, 8).unwrap(), "{name}");
    }
    assert!(refusal.ends_with(&why("default.test.")), "the list's reason is the adoption's:\n{refusal}\n{}", why("default.test."));
    assert!(matches!(find(&zones, "rsa.test."), Verdict::Adoptable(_)));
    let report = render_report(&zones, None);
    assert!(report.contains("cannot     default.test.\n           because: your KSK uses DNSSEC algorithm 13"), "{report}");
    assert!(report.contains("adoptable  rsa.test."), "{report}");
    // Into a cluster of RSASHA512 keys the RSASHA256 policy's zone is refused too, the
    // ECDSA zones with the same reason as before.
    let zones = inventory(&bindconf::parse(&conf).unwrap(), Path::new("/etc/bind"), 10).zones;
    assert!(matches!(find(&zones, "rsa.test."), Verdict::Unsupported(w) if w == &[algorithm_refusal(8, 10).unwrap()]));
    assert_eq!(algorithm_refusal(13, 13), None);
    assert_eq!(algorithm_number("ECDSA256"), Some(13));
    // Into a cluster of algorithm-13 keys (--algorithm 13) the ECDSA zones are adoptable, BIND's
    // `default` policy's among them, and the adoption agrees: it passes the KSK's algorithm and
    // goes on to look for its private file. Ed25519 and RSA zones are refused alike by both.
    let zones = inventory(&bindconf::parse(&conf).unwrap(), Path::new("/etc/bind"), 13).zones;
    for name in ["default.test.", "ec.test."] {
        assert!(matches!(find(&zones, name), Verdict::Adoptable(_)), "{name}: {:?}", find(&zones, name));
    }
    assert!(matches!(find(&zones, "ed.test."), Verdict::Unsupported(w) if w == &[algorithm_refusal(15, 13).unwrap()]));
    assert!(matches!(find(&zones, "rsa.test."), Verdict::Unsupported(w) if w == &[algorithm_refusal(8, 13).unwrap()]));
    let missing = Path::new("/nonexistent-key-dir");
    let e = old_ksk(&data, "default.test.", &["DNSKEY"], &plan, 13, Some(missing)).unwrap_err().to_string();
    assert!(e.contains("KSK file") && e.contains("nonexistent-key-dir") && !e.contains("algorithm"), "{e}");
    assert!(algorithm_refusal(15, 13).unwrap().contains("--algorithm 15 adopts it"));
    assert!(algorithm_refusal(14, 13).unwrap().contains("no threshold key of algorithm 14 yet (8, 10, 13 and 15 only)"));
}

#[test]
fn zones_in_views_are_reported() {
    let conf = "view \"inside\" {\n\tzone \"example.com\" {\n\t\ttype master;\n\t\tfile \"db\";\n\t};\n};\n";
    let zones = inventory(&bindconf::parse(conf).unwrap(), Path::new("/etc/bind"), 8).zones;
    assert_eq!(zones[0].view.as_deref(), Some("inside"));
    assert!(matches!(&zones[0].verdict, Verdict::Unsupported(w) if w[0].contains("in view \"inside\"")));
}

#[test]
fn adoption_record_round_trips_and_guards_the_zone() {
    let dir = tempfile::tempdir().unwrap();
    assert!(record::adopted_zones(dir.path(), &["example.com.".into()]).unwrap().is_none());
    let a = Adopted {
        zone: "example.com.".into(),
        tsig_keys: vec!["tsig.key".into(), "key-dhcp \"x\".key".into()],
        transfer_keys: vec!["transfer.key".into()],
        update_policy: vec!["grant dhcp-key zonesub A".into()],
        allow_transfer: vec!["192.0.2.0/24".into()],
    };
    let text = a.to_toml("a test's record").unwrap();
    std::fs::write(dir.path().join(ADOPTED_FILE), text).unwrap();
    assert_eq!(record::adopted_zones(dir.path(), &["EXAMPLE.com".into()]).unwrap(), Some(vec![a]));
    let e = record::adopted_zones(dir.path(), &["example.test.".into()]).unwrap_err().to_string();
    assert!(e.contains("give --zone example.com."), "{e}");
}

#[test]
fn key_files_get_safe_distinct_names() {
    let taken = ["key-a_b.key".to_string()];
    assert_eq!(key_file_name("a/b", taken.iter()), "key-a_b-2.key");
    assert_eq!(key_file_name("dhcp-key", taken.iter()), "key-dhcp-key.key");
    assert_eq!(dnssec_types("a. 300 IN A 192.0.2.1\na. 300 IN RRSIG A 8 1 300 x\na. 300 IN NSEC b. A\n"), vec!["RRSIG", "NSEC"]);
}

mod fuzz {
    use super::*;
    use bindconf::Item;
    use proptest::prelude::*;

    /// Words named.conf uses where the adoption looks, and a few it must survive.
    fn word() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "zone",
                "view",
                "key",
                "acl",
                "options",
                "type",
                "primary",
                "master",
                "slave",
                "file",
                "directory",
                "update-policy",
                "allow-update",
                "allow-transfer",
                "allow-query",
                "grant",
                "deny",
                "zonesub",
                "name",
                "subdomain",
                "self",
                "*",
                "local",
                "algorithm",
                "secret",
                "hmac-sha256",
                "hmac-md5",
                "dhcp-key",
                "none",
                "any",
                "!",
                "IN",
                "CH",
                "dnssec-policy",
                "inline-signing",
                "yes",
                "notify",
                "no",
                "masterfile-format",
                "example.com",
                "A",
                "ANY",
                "192.0.2.0/24",
                "",
            ])
            .prop_map(str::to_owned),
            "[ -~]{0,8}",
        ]
    }

    fn statement() -> impl Strategy<Value = Statement> {
        let leaf = prop::collection::vec(word().prop_map(Item::Word), 0..5).prop_map(|items| Statement { line: 1, items });
        leaf.prop_recursive(4, 48, 6, |inner| {
            (prop::collection::vec(word(), 0..3), prop::collection::vec(inner, 0..6), prop::collection::vec(word(), 0..2)).prop_map(|(before, block, after)| {
                let mut items: Vec<Item> = before.into_iter().map(Item::Word).collect();
                items.push(Item::Block(block));
                items.extend(after.into_iter().map(Item::Word));
                Statement { line: 1, items }
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        /// Whatever named.conf holds, the inventory and its report never panic, and every
        /// policy rule of an adoptable zone parses the way the replicas will read it.
        #[test]
        fn inventory_never_panics(statements in prop::collection::vec(statement(), 0..8)) {
            let inv = inventory(&statements, Path::new("/etc/bind"), 8);
            let _ = render_report(&inv.zones, None);
            let _ = render_report(&inv.zones, Some(&["example.com.".to_string(), "a.test.".to_string()]));
            for z in &inv.zones {
                if let Verdict::Adoptable(plan) = &z.verdict {
                    for rule in &plan.policy {
                        prop_assert!(named_glue::conf::PolicyRule::parse(&rule.split_whitespace().collect::<Vec<_>>()).is_ok(), "{}", rule);
                    }
                    for k in plan.update_keys.iter().chain(&plan.transfer_keys) {
                        prop_assert!(inv.keys.contains_key(k));
                    }
                }
            }
        }
    }
}

#[test]
fn a_record_of_several_zones_names_each_and_guards_the_set() {
    let dir = tempfile::tempdir().unwrap();
    let zone = |name: &str, key: &str| Adopted {
        zone: name.into(),
        tsig_keys: vec![format!("zones/{}/tsig.key", name.trim_end_matches('.')), key.into()],
        transfer_keys: vec!["transfer.key".into()],
        update_policy: vec![format!("grant {} zonesub ANY", key.trim_start_matches("key-").trim_end_matches(".key"))],
        allow_transfer: Vec::new(),
    };
    let all = record::AdoptedZones { zone: vec![zone("example.com.", "key-ops.key"), zone("2.0.192.in-addr.arpa.", "key-dhcp.key")] };
    std::fs::write(dir.path().join(ADOPTED_FILE), all.to_toml("two zones").unwrap()).unwrap();
    assert_eq!(Adopted::load_all(dir.path()).unwrap(), Some(all.zone.clone()));
    // In the order the zones are configured, whatever the record's order.
    let got = record::adopted_zones(dir.path(), &["2.0.192.in-addr.arpa".into(), "EXAMPLE.com.".into()]).unwrap().unwrap();
    assert_eq!(got, vec![all.zone[1].clone(), all.zone[0].clone()]);
    for zones in [vec!["example.com.".to_string()], vec!["example.com.".into(), "other.test.".into()]] {
        let e = record::adopted_zones(dir.path(), &zones).unwrap_err().to_string();
        assert!(e.contains("give --zone example.com. --zone 2.0.192.in-addr.arpa."), "{e}");
    }
    // The single-zone reader refuses it, with the zones named.
    let e = Adopted::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("several zones (example.com., 2.0.192.in-addr.arpa.)"), "{e}");
    // A zone twice, or no table at all, is an error, not a panic.
    let twice = record::AdoptedZones { zone: vec![zone("example.com.", "key-ops.key"), zone("Example.COM", "key-dhcp.key")] };
    std::fs::write(dir.path().join(ADOPTED_FILE), twice.to_toml("").unwrap()).unwrap();
    assert!(Adopted::load_all(dir.path()).unwrap_err().to_string().contains("recorded twice"));
    std::fs::write(dir.path().join(ADOPTED_FILE), "zone = []\n").unwrap();
    assert!(Adopted::load_all(dir.path()).unwrap_err().to_string().contains("no [[zone]] table"));
}
