//! The cluster's catalog zone (RFC 9432, issue 28): a cluster of two zones serves a catalog
//! listing both, the same at every replica, and Debian's stock named, configured with the
//! catalog only (`catalog-zones`, no zone statement of a member), provisions both zones from
//! it and serves exactly the replicas' signed data.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sdns_system_tests::bind::{loopback, transfer_records};
use sdns_system_tests::consumer::{serial_of, Consumer, CONSUMER_SOURCE};
use sdns_system_tests::{free_port_block, Cluster, ClusterOpts, Replicas};

const CATALOG: &str = "catalog.sdns.";
const ZONES: [&str; 2] = ["example.test.", "example.net."];

/// The type field of a record line as dig prints it.
fn rtype(line: &str) -> Option<&str> {
    line.split_whitespace().nth(3)
}

#[test]
fn a_stock_named_provisions_every_zone_from_the_catalog_alone() {
    let consumer_port = free_port_block(1) + 1;
    let mut extra: Vec<String> = ZONES.iter().flat_map(|z| ["--zone".to_string(), z.to_string()]).collect();
    extra.extend(["--catalog-zone".to_string(), CATALOG.to_string(), "--also-notify".to_string(), format!("127.0.0.1:{consumer_port}")]);
    let cluster = Cluster::up(ClusterOpts { extra, ..ClusterOpts::default() });
    let key = cluster.transfer_key();
    let key_arg = key.to_str().expect("utf-8 path");

    // The catalog, by the transfer key from an address the ACL does not list: the same at
    // every replica, version 2, one member per zone under a hashed ID, and not signed.
    let catalog_at = |i: u16| -> Vec<String> {
        let out = cluster.dig(i, &["-b", CONSUMER_SOURCE, "-k", key_arg, CATALOG, "AXFR", "+nocmd", "+nostats", "+nocomments"]);
        let mut lines = transfer_records(&out).unwrap_or_else(|| panic!("AXFR of the catalog from replica {i} failed:\n{out}\n{}", cluster.logs()));
        lines.sort();
        lines
    };
    let catalog = catalog_at(0);
    for i in 1..cluster.n {
        assert_eq!(catalog_at(i), catalog, "replica {i}'s catalog differs from replica 0's");
    }
    assert!(catalog.iter().any(|l| l.starts_with(&format!("version.{CATALOG}")) && rtype(l) == Some("TXT") && l.ends_with("\"2\"")), "{catalog:#?}");
    let members: Vec<&String> = catalog.iter().filter(|l| rtype(l) == Some("PTR")).collect();
    assert_eq!(members.len(), ZONES.len(), "{catalog:#?}");
    for zone in ZONES {
        let member = members.iter().find(|l| l.ends_with(&format!("\t{zone}"))).unwrap_or_else(|| panic!("no member {zone} in {catalog:#?}"));
        let id = member.split('.').next().unwrap_or_default();
        assert!(member.starts_with(&format!("{id}.zones.{CATALOG}")) && id.len() == 16, "{member}");
    }
    assert!(!catalog.iter().any(|l| matches!(rtype(l), Some("RRSIG" | "DNSKEY" | "NSEC" | "NSEC3"))), "the catalog is signed: {catalog:#?}");
    // Without a key, from that address: refused, as a member zone's transfer is.
    let plain = cluster.dig(1, &["-b", CONSUMER_SOURCE, CATALOG, "AXFR"]);
    assert!(plain.contains("Transfer failed") && !plain.contains("\tSOA\t"), "AXFR of the catalog without a key must be refused:\n{plain}");

    // The consumer: the catalog is all it is told.
    let primaries: Vec<SocketAddr> = (0..cluster.n).map(|i| loopback(cluster.client_port(i))).collect();
    let consumer = Consumer::start(consumer_port, CATALOG, &primaries, &key);
    let logs = || format!("{}\n{}", consumer.log_tail(), cluster.logs());
    let deadline = Instant::now() + Duration::from_secs(90);
    for zone in ZONES {
        let serial = serial_of(&cluster.dig(0, &[zone, "SOA", "+short"])).unwrap_or_else(|| panic!("no SOA of {zone} from replica 0\n{}", cluster.logs()));
        while consumer.serial(zone) != Some(serial) {
            assert!(Instant::now() < deadline, "the consumer never served {zone} at serial {serial}\n{}", logs());
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    // Each zone at the consumer is exactly every replica's, signatures and all.
    for zone in ZONES {
        let reference = cluster.transfer_sorted(0, zone);
        for i in 1..cluster.n {
            assert_eq!(cluster.transfer_sorted(i, zone), reference, "replica {i}'s {zone} differs from replica 0's");
        }
        assert!(reference.iter().any(|l| rtype(l) == Some("RRSIG")) && reference.iter().any(|l| rtype(l) == Some("DNSKEY")), "{zone} is not signed");
        let served = consumer.zone_sorted(zone).unwrap_or_else(|| panic!("AXFR of {zone} from the consumer failed\n{}", logs()));
        let missing: Vec<&String> = reference.iter().filter(|l| !served.contains(l)).collect();
        let extra: Vec<&String> = served.iter().filter(|l| !reference.contains(l)).collect();
        assert!(served == reference, "the consumer's {zone} differs from the replicas': missing {missing:#?}\nextra {extra:#?}\n{}", logs());
    }
}
