//! The cluster's catalog zone (RFC 9432, version 2): the list of its zones that secondaries
//! consuming catalogs (BIND's `catalog-zones`, Knot, NSD) provision themselves from.
//!
//! Its data is a function of the zone set alone, so every replica writes the same bytes
//! without agreeing on anything else: member IDs come from a hash of the member's name
//! (RFC 9432, section 4.1 lets the producer pick them), and the serial is fixed while the
//! zone set is the dealt one (no clock: a replica's clock would make the replicas' catalogs
//! differ). It is not signed by the threshold key: consumers take it by TSIG or by address
//! (RFC 9432, section 7), and no validator ever asks for it.

use hickory_proto::rr::Name;
use sha2::{Digest, Sha256};

/// The catalog's SOA serial for the zone set the cluster was dealt. A zone set changed by
/// an ordered operation takes the log position of that change ([`serial_at`];
/// docs/MULTIZONE.md, "Zones added and removed at run time").
pub const DEALT_SERIAL: u32 = 1;

/// The catalog's serial after a change of the zone set at batch `seq`: the batch's number
/// (agreed, and above every earlier change's since the log only grows), in serial-number
/// arithmetic (RFC 1982: taken modulo 2^32), never the dealt set's.
pub fn serial_at(seq: u64) -> u32 {
    let serial = (seq & 0xffff_ffff) as u32;
    if serial == DEALT_SERIAL {
        DEALT_SERIAL + 1
    } else {
        serial
    }
}

/// The member ID of `zone` (the unique label under `zones.`): the first 8 bytes of SHA-256
/// over the name's lower-case wire form, in hex. The same zone keeps its ID in any zone
/// set, which RFC 9432 asks for (a changed ID means the zone was removed and added again,
/// and a consumer would drop its data).
pub fn member_id(zone: &Name) -> String {
    let digest = Sha256::digest(wire(zone));
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// A name's lower-case wire form (labels, root label last).
fn wire(name: &Name) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.to_lowercase().iter() {
        out.push(label.len() as u8);
        out.extend_from_slice(label);
    }
    out.push(0);
    out
}

/// The catalog zone `catalog` listing `members`, as a zone file (absolute names, TTL 0 as
/// RFC 9432 suggests, the SOA and NS of its examples: a catalog is no zone to resolve in).
/// The members in canonical order, whatever the order given; an error names two members
/// whose IDs collide (64 bits: not met in practice, but then refused rather than one
/// silently lost).
pub fn zone_text(catalog: &Name, members: &[Name], serial: u32) -> Result<String, String> {
    let apex = absolute(catalog);
    let mut sorted: Vec<Name> = members.iter().map(absolute).collect();
    sorted.sort();
    let mut text = format!(
        "; The catalog of this cluster's zones (RFC 9432), written by sdns at every start.\n\
         {apex} 0 IN SOA invalid. invalid. {serial} 3600 600 2147483646 0\n\
         {apex} 0 IN NS invalid.\n\
         version.{apex} 0 IN TXT \"2\"\n"
    );
    let mut ids: Vec<(String, &Name)> = Vec::with_capacity(sorted.len());
    for member in &sorted {
        let id = member_id(member);
        if let Some((_, other)) = ids.iter().find(|(i, _)| *i == id) {
            return Err(format!("zones {other} and {member} have the same catalog member ID {id}"));
        }
        text.push_str(&format!("{id}.zones.{apex} 0 IN PTR {member}\n"));
        ids.push((id, member));
    }
    Ok(text)
}

/// Lower case, with the trailing dot.
fn absolute(name: &Name) -> Name {
    let mut n = name.to_lowercase();
    n.set_fqdn(true);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    #[test]
    fn member_ids_follow_the_name_only() {
        let id = member_id(&name("example.test."));
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{id}");
        // Case and the trailing dot do not change it; another name does.
        assert_eq!(member_id(&name("EXAMPLE.Test")), id);
        assert_ne!(member_id(&name("example.org.")), id);
        // The wire form the hash is taken over.
        assert_eq!(wire(&name("Ab.c.")), b"\x02ab\x01c\x00");
        // SHA-256 of that wire form, computed apart: \x07example\x04test\x00.
        let expected: String = Sha256::digest(b"\x07example\x04test\x00").iter().take(8).map(|b| format!("{b:02x}")).collect();
        assert_eq!(id, expected);
    }

    #[test]
    fn the_catalog_lists_every_zone_once_whatever_the_order() {
        let catalog = name("Catalog.SDNS");
        let a = zone_text(&catalog, &[name("example.test."), name("2.0.192.in-addr.arpa")], 7).unwrap();
        let b = zone_text(&catalog, &[name("2.0.192.in-addr.arpa."), name("EXAMPLE.test")], 7).unwrap();
        assert_eq!(a, b);
        let lines: Vec<&str> = a.lines().filter(|l| !l.starts_with(';')).collect();
        assert_eq!(lines[0], "catalog.sdns. 0 IN SOA invalid. invalid. 7 3600 600 2147483646 0");
        assert_eq!(lines[1], "catalog.sdns. 0 IN NS invalid.");
        assert_eq!(lines[2], "version.catalog.sdns. 0 IN TXT \"2\"");
        assert_eq!(lines[3], format!("{}.zones.catalog.sdns. 0 IN PTR 2.0.192.in-addr.arpa.", member_id(&name("2.0.192.in-addr.arpa."))));
        assert_eq!(lines[4], format!("{}.zones.catalog.sdns. 0 IN PTR example.test.", member_id(&name("example.test."))));
        assert_eq!(lines.len(), 5);
        // Another serial changes the SOA only.
        let c = zone_text(&catalog, &[name("example.test."), name("2.0.192.in-addr.arpa")], 8).unwrap();
        assert_eq!(a.replace(" 7 3600", " 8 3600"), c);
    }

    #[test]
    fn a_changed_zone_set_takes_the_changes_batch_as_serial() {
        let catalog = name("catalog.sdns.");
        // A zone added at batch 120 after the dealt set: listed, serial 120.
        let dealt = zone_text(&catalog, &[name("example.test.")], DEALT_SERIAL).unwrap();
        let added = zone_text(&catalog, &[name("example.test."), name("added.test.")], serial_at(120)).unwrap();
        assert!(added.contains("catalog.sdns. 0 IN SOA invalid. invalid. 120 3600"), "{added}");
        assert!(added.contains(&format!("{}.zones.catalog.sdns. 0 IN PTR added.test.", member_id(&name("added.test.")))), "{added}");
        // The member kept from the dealt set keeps its ID and line.
        let kept = format!("{}.zones.catalog.sdns. 0 IN PTR example.test.", member_id(&name("example.test.")));
        assert!(dealt.contains(&kept) && added.contains(&kept));
        // Removed again at batch 300: its line goes, the serial moves on.
        let removed = zone_text(&catalog, &[name("example.test.")], serial_at(300)).unwrap();
        assert_eq!(removed, dealt.replace(" 1 3600", " 300 3600"));
        // Serial arithmetic past 2^32, and never the dealt set's serial.
        assert_eq!(serial_at((1 << 32) + 5), 5);
        assert_eq!(serial_at(1), 2);
        assert_eq!(serial_at((1 << 32) + 1), 2);
    }
}
