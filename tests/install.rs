//! scripts/install.sh staged into a temporary root (DESTDIR): the FHS places, the
//! systemd unit (checked by `systemd-analyze verify` against that root), replica
//! directories with their secrets still private and their paths pointed at the installed
//! BIND and /var/lib/sdns, and nothing anywhere else (no /etc/bind, no ldconfig entry).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sdns_system_tests::{bind_dir, run, sdns_bin, text};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh")
}

fn install(destdir: &Path, args: &[&str]) -> (bool, String) {
    let out = run(Command::new(script()).env("DESTDIR", destdir).arg("--sdns").arg(sdns_bin()).arg("--bind-dir").arg(bind_dir()).args(args));
    (out.status.success(), text(&out))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777
}

/// Every path under `root`, relative, sorted.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// `sdns keygen` for four replicas and `zones` into `work/dealt`, and an empty `work/root` to
/// install into: (dealt, root).
fn deal(work: &Path, zones: &[&str]) -> (PathBuf, PathBuf) {
    let dealt = work.join("dealt");
    let mut cmd = Command::new(sdns_bin());
    cmd.args(["keygen", "--replicas", "4", "--bits", "1024"]);
    for zone in zones {
        cmd.args(["--zone", zone]);
    }
    let out = run(cmd.arg("--bind-dir").arg(bind_dir()).arg("--out").arg(&dealt));
    assert!(out.status.success(), "keygen: {}", text(&out));
    let root = work.join("root");
    std::fs::create_dir(&root).unwrap();
    (dealt, root)
}
#[test]
fn install_script_stages_an_fhs_layout_and_touches_nothing_else() {
    let work = tempfile::tempdir().unwrap();
    let (dealt, root) = deal(work.path(), &["corp.test"]);
    let r0 = dealt.join("replica-0");
    let r1 = dealt.join("replica-1");
    let (ok, said) = install(&root, &["--replica", r0.to_str().unwrap(), "--replica", r1.to_str().unwrap()]);
    assert!(ok, "{said}");
    assert!(said.contains("Nothing under /etc/bind"), "{said}");

    // Only the FHS places: no /etc/bind, no ld.so.conf.d entry, nothing in /usr proper.
    let paths = tree(&root);
    for p in &paths {
        let allowed = ["etc/sdns", "etc/systemd/system", "usr/local/bin", "usr/local/lib/sdns", "usr/local/share/doc/sdns", "var/lib/sdns"];
        let parents = ["etc", "etc/systemd", "usr", "usr/local", "usr/local/lib", "usr/local/share", "usr/local/share/doc", "var", "var/lib"];
        assert!(allowed.iter().any(|a| p == a || p.starts_with(&format!("{a}/"))) || parents.contains(&p.as_str()), "install.sh wrote {p}");
    }
    assert!(!root.join("etc/bind").exists() && !root.join("etc/ld.so.conf.d").exists());

    let bin = root.join("usr/local/bin/sdns");
    assert_eq!(mode(&bin), 0o755);
    assert!(text(&run(Command::new(&bin).arg("--version"))).contains("sdns"));
    // The patched named runs from its installed place with the unit's library path.
    let lib = root.join("usr/local/lib/sdns/bind9/lib");
    let named = run(Command::new(root.join("usr/local/lib/sdns/bind9/sbin/named")).arg("-v").env("LD_LIBRARY_PATH", &lib));
    assert!(named.status.success() && text(&named).contains("BIND 9.18"), "{}", text(&named));
    for tool in ["named-checkconf", "named-compilezone", "dnssec-signzone", "dnssec-keygen"] {
        assert!(root.join("usr/local/lib/sdns/bind9/bin").join(tool).is_file(), "no {tool}");
    }
    assert!(root.join("usr/local/share/doc/sdns/README.md").is_file());

    let unit = std::fs::read_to_string(root.join("etc/systemd/system/sdns-replica@.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/sdns run --config /etc/sdns/%i/replica.toml"), "{unit}");
    assert!(unit.contains("Environment=LD_LIBRARY_PATH=/usr/local/lib/sdns/bind9/lib") && unit.contains("StateDirectory=sdns/%i"), "{unit}");
    assert!(!unit.contains("@PREFIX@"), "{unit}");

    for name in ["replica-0", "replica-1"] {
        let dir = root.join("etc/sdns").join(name);
        assert_eq!(mode(&dir), 0o700, "{name}");
        for secret in ["share.json", "tls.key", "tsig.key", "transfer.key"] {
            assert_eq!(mode(&dir.join(secret)), 0o600, "{name}/{secret}");
        }
        assert!(!dir.join("state").exists());
        let settings = wrapper::config::Settings::load(&dir.join("replica.toml")).unwrap();
        assert_eq!(settings.named.bind_dir, Path::new("/usr/local/lib/sdns/bind9"));
        assert_eq!(settings.state_dir, PathBuf::from(format!("/var/lib/sdns/{name}")));
        assert_eq!(settings.zones[0].key_share, dir.join("share.json"));
    }
    assert!(!root.join("etc/sdns/replica-2").exists());

    // An installed replica is not replaced unless asked; the package manager's prefix is refused.
    let (ok, said) = install(&root, &["--replica", r0.to_str().unwrap()]);
    assert!(!ok && said.contains("--force replaces it"), "{said}");
    let (ok, said) = install(&root, &["--replica", r0.to_str().unwrap(), "--force"]);
    assert!(ok, "{said}");
    let (ok, said) = install(&root, &["--prefix", "/usr"]);
    assert!(!ok && said.contains("package manager"), "{said}");
    let (ok, said) = install(&root, &["--replica", dealt.to_str().unwrap()]);
    assert!(!ok && said.contains("is not a replica directory"), "{said}");

    // systemd's own check of the unit, against the staged root (its ExecStart must exist
    // there); the root gets the host's targets and slices the unit refers to.
    if Command::new("systemd-analyze").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let units = root.join("usr/lib/systemd/system");
        std::fs::create_dir_all(&units).unwrap();
        for e in std::fs::read_dir("/usr/lib/systemd/system").unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "target" || x == "slice") && p.is_file() {
                std::fs::copy(&p, units.join(p.file_name().unwrap())).unwrap();
            }
        }
        let verify = run(Command::new("systemd-analyze").arg("verify").arg(format!("--root={}", root.display())).arg("sdns-replica@replica-0.service"));
        assert!(verify.status.success() && text(&verify).trim().is_empty(), "systemd-analyze verify:\n{}", text(&verify));
        // The same check fails when the binary is missing, so it does check something.
        std::fs::remove_file(&bin).unwrap();
        let verify = run(Command::new("systemd-analyze").arg("verify").arg(format!("--root={}", root.display())).arg("sdns-replica@replica-0.service"));
        assert!(!verify.status.success() && text(&verify).contains("/usr/local/bin/sdns"), "{}", text(&verify));
    } else {
        eprintln!("systemd-analyze not installed: the unit was not verified by systemd");
    }
}

#[test]
fn install_script_copies_every_zones_directory() {
    let work = tempfile::tempdir().unwrap();
    let (dealt, root) = deal(work.path(), &["corp.test", "2.0.192.in-addr.arpa"]);
    let r2 = dealt.join("replica-2");
    assert!(!r2.join("share.json").exists(), "several zones keep their shares under zones/");
    let (ok, said) = install(&root, &["--replica", r2.to_str().unwrap()]);
    assert!(ok, "{said}");
    let dir = root.join("etc/sdns/replica-2");
    let settings = wrapper::config::Settings::load(&dir.join("replica.toml")).unwrap();
    assert_eq!(settings.zones.len(), 2);
    for z in &settings.zones {
        for (file, secret) in [(&z.key_share, true), (&z.public_key, false), (&z.zone_file, false)] {
            assert!(file.starts_with(dir.join("zones")) && file.is_file(), "{} of {} not installed", file.display(), z.name);
            assert_eq!(mode(&file) == 0o600, secret, "{}", file.display());
        }
        for key in &z.tsig_keys {
            assert_eq!(mode(key), 0o600, "{}", key.display());
        }
    }
    assert_eq!(mode(&dir.join("zones")), 0o700);

    // The Docker health check asks for the first [[zone]] table's SOA on this replica's
    // client address (a stand-in dig prints what it was asked).
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(bin.join("dig"), "#!/bin/sh\necho \"$@\"\n").unwrap();
    std::fs::set_permissions(bin.join("dig"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let check = Path::new(env!("CARGO_MANIFEST_DIR")).join("docker/healthcheck.sh");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = run(Command::new("sh").arg(&check).env("SDNS_CONFIG", r2.join("replica.toml")).env("PATH", &path));
    let said = text(&out);
    let client = settings.peers.iter().find(|p| p.id == 2).unwrap().client;
    let first = std::fs::read_to_string(r2.join("replica.toml")).unwrap();
    let first = first.split("[[zone]]").nth(1).and_then(|t| t.lines().find_map(|l| l.strip_prefix("name = "))).unwrap().trim_matches('"').to_owned();
    assert!(out.status.success() && said.contains(&format!("@{} -p {} {first} SOA", client.ip(), client.port())), "healthcheck.sh:\n{said}");
}
