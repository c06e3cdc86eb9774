//! Debian's stock named as a catalog consumer (RFC 9432): told only the catalog zone and the
//! replicas as default primaries, it provisions and drops member zones by itself.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;

use super::bind::{dig_at, loopback, spawn_named, transfer_records};
use super::log_tail;

/// The consumer transfers from this address, which the local cluster's [access] ACL does not
/// list (it lists 127.0.0.1): every transfer it makes must pass by the transfer key.
pub const CONSUMER_SOURCE: &str = "127.0.0.2";

/// Debian's named consuming the catalog, in a directory of its own; killed on drop.
pub struct Consumer {
    pub addr: SocketAddr,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Consumer {
    /// `catalog` as its only zone on 127.0.0.1:`port`; every member zone comes from the
    /// catalog, transferred from the replicas with the transfer key (`default-primaries`).
    pub fn start(port: u16, catalog: &str, replicas: &[SocketAddr], transfer_key: &Path) -> Consumer {
        let named = PathBuf::from("/usr/sbin/named");
        assert!(named.is_file(), "no /usr/sbin/named: install Debian's bind9 package (scripts/install-deps.sh)");
        let key_text = std::fs::read_to_string(transfer_key).unwrap_or_else(|e| panic!("{}: {e}", transfer_key.display()));
        let key_name = key_text.split('"').nth(1).unwrap_or_else(|| panic!("no key name in {}", transfer_key.display())).to_string();
        let dir = tempfile::Builder::new().prefix("sdns-catalog-consumer-").tempdir().expect("tempdir");
        let d = dir.path().display();
        let primaries: String = replicas.iter().map(|p| format!(" {} port {} key \"{key_name}\";", p.ip(), p.port())).collect();
        let conf = dir.path().join("named.conf");
        std::fs::write(
            &conf,
            format!(
                "{key_text}\noptions {{\n\tdirectory \"{d}\";\n\tpid-file \"{d}/named.pid\";\n\tsession-keyfile \"{d}/session.key\";\n\
                 \tlisten-on port {port} {{ 127.0.0.1; }};\n\tlisten-on-v6 {{ none; }};\n\trecursion no;\n\tdnssec-validation no;\n\
                 \tnotify no;\n\ttransfer-source {CONSUMER_SOURCE};\n\tallow-transfer {{ 127.0.0.1; }};\n\
                 \tcatalog-zones {{\n\t\tzone \"{catalog}\" default-primaries {{{primaries} }};\n\t}};\n}};\ncontrols {{ }};\n\
                 zone \"{catalog}\" {{\n\ttype secondary;\n\tfile \"catalog.db\";\n\tprimaries {{{primaries} }};\n}};\n"
            ),
        )
        .expect("write named.conf");
        let log = dir.path().join("named.log");
        let child = spawn_named(&named, &conf, &log);
        Consumer { addr: loopback(port), child, log, _dir: dir }
    }

    /// The serial of `zone` the consumer serves, if it serves it.
    pub fn serial(&self, zone: &str) -> Option<u32> {
        serial_of(&dig_at(self.addr, &["+norec", "+time=1", "+tries=1"], &[zone, "SOA", "+short"]))
    }

    /// `zone` as AXFR from the consumer, sorted; `None` unless the transfer is whole.
    pub fn zone_sorted(&self, zone: &str) -> Option<Vec<String>> {
        let mut lines = transfer_records(&dig_at(self.addr, &["+norec", "+time=5", "+tries=2"], &[zone, "AXFR", "+nocmd", "+nostats", "+nocomments"]))?;
        lines.sort();
        Some(lines)
    }

    pub fn log_tail(&self) -> String {
        format!("--- consumer named ({})\n{}", self.log.display(), log_tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 30))
    }
}

/// The serial of a `dig +short SOA` answer.
pub fn serial_of(short: &str) -> Option<u32> {
    short.lines().find_map(|l| l.split_whitespace().nth(2)?.parse().ok())
}
