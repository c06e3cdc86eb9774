//! `sdns keygen --add-zone` (issue 28): one more zone dealt for a cluster already dealt with
//! several zones. Its key shares and files land in every replica's `zones/<zone>/` and the
//! operator's; no file that was there changes (CA, TLS keys, transfer key, other zones' shares,
//! every replica.toml), and the new shares are a working threshold key of the cluster's size.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sdns_system_tests::{bind_dir, free_port_block, ports, run, sdns_bin, text, tool};

const ADDED: &str = "example.net.";

/// Every file under `dir`: its bytes and mode.
fn files(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("metadata");
            if meta.is_dir() {
                todo.push(path);
            } else {
                let rel = path.strip_prefix(dir).expect("under dir").to_path_buf();
                out.insert(rel, (std::fs::read(&path).expect("read"), meta.permissions().mode() & 0o777));
            }
        }
    }
    out
}

fn keygen(args: &[&str], out: &Path) -> std::process::Output {
    run(Command::new(sdns_bin()).arg("keygen").args(["--bits", "1024"]).args(args).arg("--bind-dir").arg(bind_dir()).arg("--out").arg(out))
}

#[test]
fn add_zone_deals_one_more_zone_and_changes_nothing_else() {
    let work = tempfile::tempdir().expect("tempdir");
    let dealt = work.path().join("dealt");
    let port_args = ports(free_port_block(4));
    let mut args: Vec<&str> = vec!["--replicas", "4", "--zone", "example.test.", "--zone", "2.0.192.in-addr.arpa."];
    args.extend(port_args.iter().map(String::as_str));
    let out = keygen(&args, &dealt);
    assert!(out.status.success(), "keygen: {}", text(&out));
    let before = files(&dealt);

    let out = keygen(&["--add-zone", "example.net"], &dealt);
    assert!(out.status.success(), "keygen --add-zone: {}", text(&out));
    let after = files(&dealt);

    // Nothing that was there changed, nor went away.
    for (path, was) in &before {
        assert!(after.get(path) == Some(was), "{} changed or went away", path.display());
    }
    // Everything new is the added zone's, at the top (the operator's) or in a replica directory.
    let zone_dir = Path::new("zones").join(ADDED.trim_end_matches('.'));
    let added: Vec<&PathBuf> = after.keys().filter(|p| !before.contains_key(*p)).collect();
    for path in &added {
        let under_zone = path.starts_with(&zone_dir) || (0..4).any(|i| path.starts_with(Path::new(&format!("replica-{i}")).join(&zone_dir)));
        assert!(under_zone, "{} is not the added zone's", path.display());
    }

    // Each replica's share: private, its own index, consistent with the public key.
    let public = shoup_rsa::load_public(dealt.join("replica-0").join(&zone_dir).join("zone.pub.json")).expect("public key");
    assert_eq!((public.players(), public.threshold()), (4, 2), "the cluster's n and k");
    let mut shares = Vec::new();
    for i in 0..4u16 {
        let rdir = Path::new(&format!("replica-{i}")).join(&zone_dir);
        for (file, mode) in [("share.json", 0o600), ("tsig.key", 0o600)] {
            let (_, m) = after.get(&rdir.join(file)).unwrap_or_else(|| panic!("no {}", rdir.join(file).display()));
            assert_eq!(*m, mode, "{}", rdir.join(file).display());
        }
        assert_eq!(after[&rdir.join("zone.pub.json")], after[&Path::new("replica-0").join(&zone_dir).join("zone.pub.json")], "replica {i}'s public key");
        let share = shoup_rsa::load_share(dealt.join(&rdir).join("share.json")).expect("share");
        assert_eq!(share.index(), i + 1);
        share.validate(&public).unwrap_or_else(|e| panic!("replica {i}'s share: {e}"));
        shares.push(share);
    }
    // Any k of them make a signature the public key verifies.
    let msg = public.encode_message(shoup_rsa::HashAlg::Sha256, b"a record set of example.net.").expect("message");
    let parts = [&shares[3], &shares[1]].map(|s| s.sign(&public, &msg).expect("share signature"));
    let signature = public.combine(&msg, &parts).expect("combine");
    assert!(public.verify(&msg, &signature));

    // The operator's DS is the one BIND derives from the dealt key file.
    let ds = String::from_utf8(after[&zone_dir.join("ds.txt")].0.clone()).expect("utf-8");
    let key_file = added
        .iter()
        .find(|p| {
            p.parent() == Some(zone_dir.as_path())
                && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("K{ADDED}+008+")))
                && p.extension().is_some_and(|e| e == "key")
        })
        .unwrap_or_else(|| panic!("no K{ADDED}+008+*.key in {added:#?}"));
    let from_key = run(Command::new(tool("dnssec-dsfromkey")).arg("-2").arg(dealt.join(key_file)));
    assert!(from_key.status.success(), "{}", text(&from_key));
    assert_eq!(String::from_utf8_lossy(&from_key.stdout).split_whitespace().collect::<Vec<_>>(), ds.split_whitespace().collect::<Vec<_>>());

    // Refused before any key is made: the zone again, and one inside a zone of the cluster.
    let again = keygen(&["--add-zone", ADDED], &dealt);
    assert!(!again.status.success() && text(&again).contains("dealt already"), "{}", text(&again));
    let inside = keygen(&["--add-zone", "www.example.test"], &dealt);
    assert!(!inside.status.success() && text(&inside).contains("inside"), "{}", text(&inside));
    assert_eq!(files(&dealt), after, "a refused --add-zone wrote something");
}
