//! Byzantine modes for real replicas, for tests and demonstrations only: `sdns cluster up
//! --byzantine ID:MODE,...` writes `[replica] byzantine = "MODE"`, and a replica refuses to
//! start with one unless `[cluster] test_cluster = true`. Each mode is a thin hook in one
//! driver (ordering: bft's transport driver; signing: the signing service; answers: the
//! listener; vouches: the vouched-read service; state-transfer requests: `statexfer::leech`);
//! a replica without a mode runs none of it.

use std::fmt;
use std::str::FromStr;

use bft::transport::Behaviour;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Sends nothing to its peers (ordering and signing); still answers its own clients.
    Silent,
    /// Runs honestly until it has delivered this many batches, then exits.
    CrashAfter(u64),
    /// As primary, sends different pre-prepares to different backups.
    Equivocator,
    /// Silent as primary, poisons every view change it sends.
    Poisoner,
    /// Relays requests under other replicas' origins and with huge numbers.
    ForgedRelays,
    /// Floods its peers with requests and batches at the size limits.
    Flooder,
    /// Asks its peers for batches and new views over and over.
    StatusSpammer,
    /// Inverts every bit of its signature shares (the paper's corrupted replica).
    CorruptShares,
    /// Sends random bytes in place of its signature shares and signatures.
    GarbageShares,
    /// Rewrites the answers it gives its own clients (A and AAAA data, TXT strings).
    WrongAnswers,
    /// Answers its peers' read probes with made-up barriers, far ahead or 0 (vouched reads).
    WrongVouches,
    /// Orders, as its own requests (past its own pre-ordering check), updates named can never
    /// take: validly signed ones too long once re-signed, and malformed ones.
    OversizedWrites,
    /// Orders unauthenticated updates (unreadable, unsigned, unknown key) as fast as the
    /// ordering takes them.
    UpdateFlooder,
    /// Asks its peers for state-transfer chunks without pause (`statexfer::leech`).
    SnapshotLeech,
    /// As primary, adds to every pre-prepare requests under the other origins it carries,
    /// numbered 2^32 - 1 above theirs and just within the number jump.
    OriginForger,
    /// As primary, fills every pre-prepare up to the batch limits with requests of its own
    /// origin (filler no replica executes), keeping the others' requests in it.
    BudgetHog,
}

impl Mode {
    /// Every mode, with `crash-after-N` at N = 20 (for listings and tests).
    pub const ALL: [Mode; 16] = [
        Mode::Silent,
        Mode::CrashAfter(20),
        Mode::Equivocator,
        Mode::Poisoner,
        Mode::ForgedRelays,
        Mode::Flooder,
        Mode::StatusSpammer,
        Mode::CorruptShares,
        Mode::GarbageShares,
        Mode::WrongAnswers,
        Mode::WrongVouches,
        Mode::OversizedWrites,
        Mode::UpdateFlooder,
        Mode::SnapshotLeech,
        Mode::OriginForger,
        Mode::BudgetHog,
    ];

    /// The ordering driver's behaviour for this mode, if it has one.
    pub fn ordering(self) -> Option<Behaviour> {
        match self {
            Mode::Silent => Some(Behaviour::Silent),
            Mode::Equivocator => Some(Behaviour::Equivocator),
            Mode::Poisoner => Some(Behaviour::Poisoner),
            Mode::ForgedRelays => Some(Behaviour::ForgedRelays),
            Mode::Flooder => Some(Behaviour::Flooder),
            Mode::StatusSpammer => Some(Behaviour::StatusSpammer),
            Mode::OriginForger => Some(Behaviour::OriginForger),
            Mode::BudgetHog => Some(Behaviour::BudgetHog),
            _ => None,
        }
    }

    /// What the vouched-read service does to this replica's probes and vouches (they travel
    /// on the mesh's reads channel, outside the ordering driver).
    pub fn reads(self) -> exec::vouch::Fault {
        match self {
            Mode::Silent => exec::vouch::Fault::Silent,
            Mode::WrongVouches => exec::vouch::Fault::WrongVouches,
            _ => exec::vouch::Fault::None,
        }
    }

    /// What the signing service does to this replica's outgoing messages.
    pub fn signing(self) -> SigningFault {
        match self {
            Mode::Silent => SigningFault::Silent,
            Mode::GarbageShares => SigningFault::Garbage,
            _ => SigningFault::None,
        }
    }
}

/// The signing service's hook (corrupted shares are not: RSA's and EC's signing cores each
/// corrupt their own, `corrupt`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigningFault {
    None,
    Silent,
    Garbage,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Silent => f.write_str("silent"),
            Mode::CrashAfter(n) => write!(f, "crash-after-{n}"),
            Mode::Equivocator => f.write_str("equivocating-primary"),
            Mode::Poisoner => f.write_str("view-change-poisoner"),
            Mode::ForgedRelays => f.write_str("forged-relays"),
            Mode::Flooder => f.write_str("peer-flooder"),
            Mode::StatusSpammer => f.write_str("status-spammer"),
            Mode::CorruptShares => f.write_str("corrupt-shares"),
            Mode::GarbageShares => f.write_str("garbage-shares"),
            Mode::WrongAnswers => f.write_str("wrong-answers"),
            Mode::WrongVouches => f.write_str("wrong-vouches"),
            Mode::OversizedWrites => f.write_str("oversized-writes"),
            Mode::UpdateFlooder => f.write_str("update-flooder"),
            Mode::SnapshotLeech => f.write_str("snapshot-leech"),
            Mode::OriginForger => f.write_str("origin-forger"),
            Mode::BudgetHog => f.write_str("budget-hog"),
        }
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        Ok(match s {
            "silent" => Mode::Silent,
            "equivocating-primary" | "equivocator" => Mode::Equivocator,
            "view-change-poisoner" | "poisoner" => Mode::Poisoner,
            "forged-relays" => Mode::ForgedRelays,
            "peer-flooder" | "flooder" => Mode::Flooder,
            "status-spammer" => Mode::StatusSpammer,
            "corrupt-shares" | "corrupt" => Mode::CorruptShares,
            "garbage-shares" => Mode::GarbageShares,
            "wrong-answers" => Mode::WrongAnswers,
            "wrong-vouches" => Mode::WrongVouches,
            "oversized-writes" => Mode::OversizedWrites,
            "update-flooder" => Mode::UpdateFlooder,
            "snapshot-leech" => Mode::SnapshotLeech,
            "origin-forger" => Mode::OriginForger,
            "budget-hog" => Mode::BudgetHog,
            other => match other.strip_prefix("crash-after-").map(str::parse::<u64>) {
                Some(Ok(n)) => Mode::CrashAfter(n),
                _ => {
                    let names: Vec<String> = Mode::ALL.iter().map(|m| m.to_string().replace("-20", "-N")).collect();
                    return Err(format!("unknown Byzantine mode {other:?} (known: {})", names.join(", ")));
                }
            },
        })
    }
}

impl Serialize for Mode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Mode, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Parses one `ID:MODE` of `--byzantine`.
pub fn parse_assignment(s: &str) -> Result<(u16, Mode), String> {
    let (id, mode) = s.split_once(':').ok_or_else(|| format!("{s:?}: expected ID:MODE, e.g. 3:peer-flooder"))?;
    let id = id.trim().parse::<u16>().map_err(|e| format!("{s:?}: replica id: {e}"))?;
    Ok((id, mode.trim().parse()?))
}

/// The updates `oversized-writes` and `update-flooder` order, the `k`-th of a cycle through
/// their forms; `key`: a zone update key, `now_s` the time to sign at. `None` for other modes.
pub fn hostile_write(mode: Mode, k: u64, key: Option<&exec::auth::tsig::Key>, now_s: u64) -> Option<Vec<u8>> {
    use exec::auth::{tsig, wire};
    let id = (k as u16).to_be_bytes();
    // Opcode UPDATE, zone example-ish section of `qd` entries, `up` update records.
    let update = |qd: u16, up: u16| {
        let mut m = vec![id[0], id[1], 0x28, 0];
        m.extend_from_slice(&qd.to_be_bytes());
        m.extend_from_slice(&[0, 0]);
        m.extend_from_slice(&up.to_be_bytes());
        m.extend_from_slice(&[0, 0]);
        m
    };
    let zone = wire::name_to_wire("example.test.").unwrap_or_default();
    let form = match mode {
        Mode::UpdateFlooder => k % 3,
        Mode::OversizedWrites => 3 + k % 3,
        _ => return None,
    };
    Some(match form {
        // A header announcing a question that is not there.
        0 => update(1, 0),
        // A well-formed update, unsigned.
        1 => {
            let mut m = update(1, 1);
            m.extend_from_slice(&zone);
            m.extend_from_slice(&[0, 6, 0, 1, 0xc0, 12, 0, 1, 0, 1, 0, 0, 1, 44, 0, 4, 192, 0, 2, 13]);
            m
        }
        // Signed with a key nobody configured.
        2 => {
            let mut m = update(1, 0);
            m.extend_from_slice(&zone);
            m.extend_from_slice(&[0, 6, 0, 1]);
            match tsig::Key::new("no-such-key.", tsig::Algorithm::HmacSha256, &[7; 32]) {
                Some(stranger) => tsig::sign(&m, &stranger, now_s, 300, 0, Vec::new(), None),
                None => m,
            }
        }
        // Validly signed, 65,530 bytes: too long for TCP once re-signed with a longer name.
        3 => {
            let Some(key) = key else { return Some(update(1, 0)) };
            let mut m = update(1, 1);
            m.extend_from_slice(&zone);
            m.extend_from_slice(&[0, 6, 0, 1, 0xc0, 12, 0, 16, 0, 1, 0, 0, 1, 44]);
            let growth = tsig::sign(&m, key, now_s, 300, 0, Vec::new(), None).len() - m.len();
            let rdlen = 65_530usize.saturating_sub(m.len() + 2 + growth);
            m.extend_from_slice(&u16::try_from(rdlen).unwrap_or(u16::MAX).to_be_bytes());
            m.extend((0..rdlen).map(|i| if i % 256 == 0 { 255 } else { b'o' }));
            tsig::sign(&m, key, now_s, 300, 0, Vec::new(), None)
        }
        // A compression loop in the zone section.
        4 => {
            let mut m = update(1, 0);
            m.extend_from_slice(&[0xc0, 12, 0, 6, 0, 1]);
            m
        }
        // Counts far beyond the records there, and truncated mid-record.
        _ => {
            let mut m = update(1, 0xffff);
            m.extend_from_slice(&zone);
            m.extend_from_slice(&[0, 6, 0, 1, 0xc0, 12, 0, 1]);
            m
        }
    })
}

/// Rewrites a DNS answer as a lying replica would: every A record says 192.0.2.66, every
/// AAAA 2001:db8::66, every TXT "lie". Anything that does not parse goes out unchanged.
pub fn lie(answer: Vec<u8>) -> Vec<u8> {
    use hickory_proto::rr::rdata::{A, AAAA, TXT};
    use hickory_proto::rr::RData;
    let Ok(mut message) = hickory_proto::op::Message::from_vec(&answer) else { return answer };
    let mut changed = false;
    for record in message.answers.iter_mut() {
        let fake = match record.data {
            RData::A(_) => RData::A(A::new(192, 0, 2, 66)),
            RData::AAAA(_) => RData::AAAA(AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x66)),
            RData::TXT(_) => RData::TXT(TXT::new(vec!["lie".into()])),
            _ => continue,
        };
        record.data = fake;
        changed = true;
    }
    if !changed {
        return answer;
    }
    message.to_vec().unwrap_or(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_and_assignments_parse() {
        for mode in Mode::ALL {
            assert_eq!(mode.to_string().parse::<Mode>(), Ok(mode));
        }
        assert_eq!(parse_assignment("3:peer-flooder"), Ok((3, Mode::Flooder)));
        assert_eq!(parse_assignment("0:crash-after-7"), Ok((0, Mode::CrashAfter(7))));
        assert!(parse_assignment("3").is_err());
        assert!(parse_assignment("x:silent").is_err());
        let e = parse_assignment("1:evil").unwrap_err();
        assert!(e.contains("crash-after-N") && e.contains("wrong-answers"), "{e}");
        assert_eq!(parse_assignment("0:oversized-writes"), Ok((0, Mode::OversizedWrites)));
        assert_eq!(parse_assignment("0:update-flooder"), Ok((0, Mode::UpdateFlooder)));
        assert_eq!(parse_assignment("0:budget-hog"), Ok((0, Mode::BudgetHog)));
    }

    /// Every form the two write modes order is an update no honest gateway orders: refused
    /// before ordering, or (the signed oversized one) too long for named once re-signed.
    #[test]
    fn hostile_writes_are_what_an_honest_gateway_refuses() {
        use exec::auth::{tsig, Authenticator, TsigSecret};
        let secret = TsigSecret { name: "sdns-update.".into(), algorithm: tsig::Algorithm::HmacSha256, secret: vec![3; 32] };
        let key = tsig::Key::new(&secret.name, secret.algorithm, &secret.secret).unwrap();
        let auth = Authenticator::new(exec::auth::Mode::Tsig, std::slice::from_ref(&secret), &[], Vec::new(), named_glue::time::unix_now).unwrap();
        let now = 1_800_000_000;
        assert_eq!(hostile_write(Mode::Silent, 0, Some(&key), now), None);
        for mode in [Mode::OversizedWrites, Mode::UpdateFlooder] {
            for k in 0..6 {
                let m = hostile_write(mode, k, Some(&key), now).unwrap();
                assert_eq!(exec::classify::classify(&m, true), exec::classify::Verdict::Order(exec::classify::Kind::Write), "{mode} {k}");
                assert!(auth.precheck(&m, false, now).is_some(), "{mode} form {k} would be ordered by an honest gateway");
            }
        }
        let big = hostile_write(Mode::OversizedWrites, 0, Some(&key), now).unwrap();
        assert_eq!(big.len(), 65_530);
        let exec::UpdateDecision::Forward(resigned) = exec::UpdateGate::decide(&auth, &big, now) else { panic!("validly signed") };
        assert!(!exec::gate::forwardable(&resigned));
    }

    #[test]
    fn lies_change_addresses_and_keep_the_rest() {
        use hickory_proto::op::{Message, MessageType, OpCode, Query};
        use hickory_proto::rr::{rdata::A, Name, RData, Record, RecordType};
        let name = Name::from_ascii("www.example.test.").unwrap();
        let mut m = Message::new(7, MessageType::Response, OpCode::Query);
        m.add_query(Query::query(name.clone(), RecordType::A));
        m.add_answer(Record::from_rdata(name, 300, RData::A(A::new(192, 0, 2, 1))));
        let lied = Message::from_vec(&lie(m.to_vec().unwrap())).unwrap();
        assert_eq!(lied.metadata.id, 7);
        assert_eq!(lied.answers[0].data, RData::A(A::new(192, 0, 2, 66)));
        assert_eq!(lie(vec![1, 2, 3]), vec![1, 2, 3]);
    }
}
