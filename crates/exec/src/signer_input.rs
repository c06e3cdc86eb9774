//! The input of a whole-zone signing, made from named's zone transfer.
//!
//! The executor holds the log while a signing (or a later round of one) keeps the zone's
//! content, so that content is taken from one AXFR of the local named and nothing else;
//! the zone-file text dnssec-signzone reads is written from it later, in the background.
//! Each record is written in RFC 3597's generic form (`owner ttl class TYPE \# len hex`),
//! which BIND reads for every type, so the text is exact whatever the record: the signer
//! sees the very bytes named serves. Owner names and the names inside rdata keep their
//! case as named sent them (the canonical records used for digests are lowercased; the
//! zone installed after the signing must not be).

use dnswire::rrwire::{read_record_case_kept, split_record, RawRecord};

const TYPE_SOA: u16 = 6;
const TYPE_TXT: u16 = 16;
const TYPE_RRSIG: u16 = 46;
const TYPE_DNSKEY: u16 = 48;
/// CDS and CDNSKEY (RFC 7344): published at the apex only during an adopted zone's rollover.
const SYNC_TYPES: [u16; 2] = [59, 60];
/// Types dnssec-signzone makes itself: RRSIG, NSEC, DNSKEY, NSEC3, NSEC3PARAM.
const DNSSEC_TYPES: [u16; 5] = [46, 47, 48, 50, 51];

/// `r` (read from `msg` by [`dnswire::rrwire::RawMessage::parse`]) with its owner and the
/// names of compressible rdata decompressed but not lowercased; `None` if `r` does not
/// come from `msg`.
pub fn case_kept(msg: &[u8], r: &RawRecord) -> Option<RawRecord> {
    let (kept, end) = read_record_case_kept(msg, r.span.start).ok()?;
    (end == r.span.end && kept.rtype == r.rtype).then_some(RawRecord { span: 0..0, ..kept })
}

/// The records a signing starts from: everything but the DNSSEC records dnssec-signzone
/// makes, except, while an adopted zone's key rollover runs (the zone holds the marker
/// TXT record), the apex DNSKEYs other than the threshold key and their signatures over
/// the DNSKEY RRset: dnssec-signzone keeps that signature (a published key's, valid), so
/// the signed zone still serves validators that trust the operator's old DS.
/// `apex` and `marker` are lowercased wire names. [`signer_records_at`] for a zone whose
/// rollover may have been finished by the replicas' reports.
pub fn signer_records(records: Vec<RawRecord>, apex: &[u8], marker: &[u8], threshold_tag: u16) -> Vec<RawRecord> {
    signer_records_at(records, apex, marker, threshold_tag, false)
}

/// [`signer_records`], with the rollover's CDS and CDNSKEY: during the rollover the apex
/// CDS and CDNSKEY RRsets stay, with the operator's KSK's signatures over them (made at the
/// adoption, RFC 7344 4.1); outside a rollover they go (sdns publishes them only to ask the
/// parent for the threshold key's DS, and nothing else can put them in: updates of them are
/// refused). `finished`: t+1 replicas reported the parent's new DS (`ZoneExec::
/// rollover_finished_s`), which ends the rollover as deleting the marker does, and the marker
/// goes too. Every replica decides from the same records and the same state.
pub fn signer_records_at(records: Vec<RawRecord>, apex: &[u8], marker: &[u8], threshold_tag: u16, finished: bool) -> Vec<RawRecord> {
    let lower = |name: &[u8]| name.to_ascii_lowercase();
    let rollover = !finished && records.iter().any(|r| r.rtype == TYPE_TXT && lower(&r.owner) == marker);
    records
        .into_iter()
        .filter(|r| {
            let at_apex = lower(&r.owner) == apex;
            if finished && r.rtype == TYPE_TXT && lower(&r.owner) == marker {
                return false;
            }
            if at_apex && SYNC_TYPES.contains(&r.rtype) {
                return rollover;
            }
            if !DNSSEC_TYPES.contains(&r.rtype) {
                return true;
            }
            if !rollover || !at_apex {
                return false;
            }
            match r.rtype {
                TYPE_DNSKEY => dnswire::dnssec::key_tag(&r.rdata) != threshold_tag,
                TYPE_RRSIG => {
                    let covered = r.rdata.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]]));
                    let tag = r.rdata.get(16..18).map(|b| u16::from_be_bytes([b[0], b[1]]));
                    covered.is_some_and(|c| c == TYPE_DNSKEY || SYNC_TYPES.contains(&c)) && tag.is_some_and(|t| t != threshold_tag)
                }
                _ => false,
            }
        })
        .collect()
}

/// Zone-file text of `records` (each in [`RawRecord::to_wire`] form), the apex SOA
/// first, one record per line. Records that do not split are left out (they cannot
/// come from [`RawRecord::to_wire`]).
pub fn zone_text(records: &[Vec<u8>]) -> String {
    let mut lines: Vec<(bool, String)> = Vec::with_capacity(records.len());
    for record in records {
        let Some((owner, rtype, class, ttl, rdata)) = split_record(record) else { continue };
        let mut line = String::with_capacity(owner.len() + 40 + 2 * rdata.len());
        name_text(owner, &mut line);
        line.push_str(&format!(" {ttl} {} {} \\# {}", class_text(class), type_text(rtype), rdata.len()));
        if !rdata.is_empty() {
            line.push(' ');
            for b in rdata {
                line.push_str(&format!("{b:02x}"));
            }
        }
        line.push('\n');
        lines.push((rtype != TYPE_SOA, line));
    }
    // Stable: the SOA first, the rest in the order given.
    lines.sort_by_key(|(rest, _)| *rest);
    lines.into_iter().map(|(_, l)| l).collect()
}

/// An uncompressed wire name in master-file form: letters, digits, '-', '_' and '*' as
/// they are, every other byte as `\DDD`, so no label can read as anything else.
fn name_text(wire: &[u8], out: &mut String) {
    let mut pos = 0;
    while let Some(&len) = wire.get(pos) {
        if len == 0 {
            break;
        }
        let label = wire.get(pos + 1..pos + 1 + usize::from(len)).unwrap_or_default();
        for &b in label {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'*' {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("\\{b:03}"));
            }
        }
        out.push('.');
        pos += 1 + usize::from(len);
    }
    if pos == 0 {
        out.push('.');
    }
}

fn class_text(class: u16) -> String {
    match class {
        1 => "IN".to_string(),
        c => format!("CLASS{c}"),
    }
}

/// Mnemonics BIND prints and reads, for the common types: the signer's output names
/// types so, and a kept signature is matched to its RRset by that name. Any other type is
/// written `TYPEnnn`, which BIND reads for every type (its signature is then made again
/// in a later round rather than kept: the same bytes, a little more work).
const MNEMONICS: [(u16, &str); 36] = [
    (1, "A"),
    (2, "NS"),
    (5, "CNAME"),
    (6, "SOA"),
    (12, "PTR"),
    (13, "HINFO"),
    (15, "MX"),
    (16, "TXT"),
    (17, "RP"),
    (18, "AFSDB"),
    (28, "AAAA"),
    (29, "LOC"),
    (33, "SRV"),
    (35, "NAPTR"),
    (36, "KX"),
    (37, "CERT"),
    (39, "DNAME"),
    (42, "APL"),
    (43, "DS"),
    (44, "SSHFP"),
    (45, "IPSECKEY"),
    (46, "RRSIG"),
    (47, "NSEC"),
    (48, "DNSKEY"),
    (49, "DHCID"),
    (50, "NSEC3"),
    (51, "NSEC3PARAM"),
    (52, "TLSA"),
    (53, "SMIMEA"),
    (59, "CDS"),
    (60, "CDNSKEY"),
    (61, "OPENPGPKEY"),
    (64, "SVCB"),
    (65, "HTTPS"),
    (256, "URI"),
    (257, "CAA"),
];

fn type_text(rtype: u16) -> String {
    match MNEMONICS.binary_search_by_key(&rtype, |(t, _)| *t) {
        Ok(i) => MNEMONICS[i].1.to_string(),
        Err(_) => format!("TYPE{rtype}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnswire::rrwire::RawMessage;

    fn wire(name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for label in name.trim_end_matches('.').split('.').filter(|l| !l.is_empty()) {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
        out
    }

    fn record(owner: &[u8], rtype: u16, rdata: &[u8]) -> Vec<u8> {
        RawRecord { owner: owner.to_vec(), rtype, class: 1, ttl: 300, rdata: rdata.to_vec(), span: 0..0 }.to_wire()
    }

    #[test]
    fn text_is_generic_rdata_with_escaped_names_and_the_soa_first() {
        let mut odd = wire("example.test.");
        // A label "a.b c" (a dot and a space inside) before the zone.
        let mut label = vec![5u8];
        label.extend_from_slice(b"a.b c");
        label.extend_from_slice(&odd);
        odd = label;
        let records =
            vec![record(&odd, 1, &[192, 0, 2, 1]), record(&wire("Example.test."), TYPE_SOA, &[0, 0, 1, 2]), record(&wire("*.example.test."), 16, &[])];
        let text = zone_text(&records);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Example.test. 300 IN SOA \\# 4 00000102");
        assert_eq!(lines[1], "a\\046b\\032c.example.test. 300 IN A \\# 4 c0000201");
        assert_eq!(lines[2], "*.example.test. 300 IN TXT \\# 0");
        assert_eq!(type_text(65280), "TYPE65280");
        assert_eq!(type_text(28), "AAAA");
        assert!(MNEMONICS.windows(2).all(|w| w[0].0 < w[1].0), "sorted, for the binary search");
    }

    #[test]
    fn case_is_kept_through_compression() {
        // A response: question Mail.Example.TEST. MX; answer owner compressed to the
        // question, MX exchange "MX1" + pointer to "Example.TEST.".
        let mut m = vec![0, 1, 0x84, 0, 0, 1, 0, 1, 0, 0, 0, 0];
        m.extend_from_slice(&wire("Mail.Example.TEST."));
        m.extend_from_slice(&[0, 15, 0, 1]);
        m.extend_from_slice(&[0xc0, 12, 0, 15, 0, 1, 0, 0, 1, 44]);
        let rdata = [&[0u8, 10][..], &[3], b"MX1", &[0xc0, 17]].concat();
        m.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        m.extend_from_slice(&rdata);
        let parsed = RawMessage::parse(&m).unwrap();
        let r = &parsed.answers[0];
        assert_eq!(r.owner, wire("mail.example.test."), "dnswire lowercases");
        let kept = case_kept(&m, r).unwrap();
        assert_eq!(kept.owner, wire("Mail.Example.TEST."));
        assert_eq!(kept.rdata, [&[0u8, 10][..], &wire("MX1.Example.TEST.")].concat());
        assert_eq!(kept.to_wire().to_ascii_lowercase(), r.to_wire().to_ascii_lowercase());
    }

    #[test]
    fn dnssec_records_go_except_the_operators_key_during_a_rollover() {
        let apex = wire("example.test.");
        let marker = wire("_sdns-rollover.example.test.");
        let dnskey = |pubkey: u8| RawRecord { owner: apex.clone(), rtype: TYPE_DNSKEY, class: 1, ttl: 300, rdata: vec![1, 1, 3, 8, pubkey], span: 0..0 };
        let threshold_tag = dnswire::dnssec::key_tag(&dnskey(1).rdata);
        let operator_tag = dnswire::dnssec::key_tag(&dnskey(2).rdata);
        let rrsig = |tag: u16| {
            let mut rdata = vec![0, 48, 8, 2, 0, 0, 1, 44, 0, 0, 0, 9, 0, 0, 0, 1];
            rdata.extend_from_slice(&tag.to_be_bytes());
            RawRecord { owner: apex.clone(), rtype: TYPE_RRSIG, class: 1, ttl: 300, rdata, span: 0..0 }
        };
        let a = RawRecord { owner: apex.clone(), rtype: 1, class: 1, ttl: 300, rdata: vec![192, 0, 2, 1], span: 0..0 };
        let all = vec![a.clone(), dnskey(1), dnskey(2), rrsig(threshold_tag), rrsig(operator_tag)];
        assert_eq!(signer_records(all.clone(), &apex, &marker, threshold_tag), vec![a.clone()]);
        let txt = RawRecord { owner: marker.clone(), rtype: TYPE_TXT, class: 1, ttl: 300, rdata: vec![1, b'x'], span: 0..0 };
        let mut with_marker = all;
        with_marker.push(txt.clone());
        assert_eq!(signer_records(with_marker, &apex, &marker, threshold_tag), vec![a, dnskey(2), rrsig(operator_tag), txt]);
    }

    #[test]
    fn the_cds_stay_with_the_operators_signatures_until_the_rollover_is_over() {
        let apex = wire("example.test.");
        let marker = wire("_sdns-rollover.example.test.");
        let rec = |owner: &[u8], rtype: u16, rdata: Vec<u8>| RawRecord { owner: owner.to_vec(), rtype, class: 1, ttl: 300, rdata, span: 0..0 };
        let threshold = rec(&apex, TYPE_DNSKEY, vec![1, 1, 3, 8, 1]);
        let operator = rec(&apex, TYPE_DNSKEY, vec![1, 1, 3, 8, 2]);
        let (threshold_tag, operator_tag) = (dnswire::dnssec::key_tag(&threshold.rdata), dnswire::dnssec::key_tag(&operator.rdata));
        let rrsig = |covered: u16, tag: u16| {
            let mut rdata = covered.to_be_bytes().to_vec();
            rdata.extend_from_slice(&[8, 2, 0, 0, 1, 44, 0, 0, 0, 9, 0, 0, 0, 1]);
            rdata.extend_from_slice(&tag.to_be_bytes());
            rec(&apex, TYPE_RRSIG, rdata)
        };
        let cds = rec(&apex, 59, vec![0x12, 0x34, 8, 2, 0xaa]);
        let cdnskey = rec(&apex, 60, vec![1, 1, 3, 8, 1]);
        // A CDS below the apex is ordinary data (not sdns's to manage).
        let deep = rec(&wire("sub.example.test."), 59, vec![0x12, 0x34, 8, 2, 0xbb]);
        let txt = rec(&marker, TYPE_TXT, vec![1, b'x']);
        let a = rec(&apex, 1, vec![192, 0, 2, 1]);
        let all = vec![
            a.clone(),
            threshold,
            operator.clone(),
            cds.clone(),
            cdnskey.clone(),
            deep.clone(),
            rrsig(TYPE_DNSKEY, operator_tag),
            rrsig(59, operator_tag),
            rrsig(60, operator_tag),
            rrsig(59, threshold_tag),
            rrsig(1, operator_tag),
            txt.clone(),
        ];
        // During the rollover: the old key, the CDS and CDNSKEY, and the old key's
        // signatures over the three apex RRsets (none over other data, none by the new key).
        let during = signer_records_at(all.clone(), &apex, &marker, threshold_tag, false);
        assert_eq!(
            during,
            vec![
                a.clone(),
                operator,
                cds,
                cdnskey,
                deep.clone(),
                rrsig(TYPE_DNSKEY, operator_tag),
                rrsig(59, operator_tag),
                rrsig(60, operator_tag),
                txt.clone()
            ]
        );
        // Finished by the reports: all of it goes, the marker too.
        assert_eq!(signer_records_at(all.clone(), &apex, &marker, threshold_tag, true), vec![a.clone(), deep.clone()]);
        // Finished by deleting the marker (`rollover-finish`): the same.
        let unmarked: Vec<RawRecord> = all.into_iter().filter(|r| *r != txt).collect();
        assert_eq!(signer_records(unmarked, &apex, &marker, threshold_tag), vec![a, deep]);
    }
}
