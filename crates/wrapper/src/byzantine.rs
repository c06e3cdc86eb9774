//! Byzantine modes for real replicas, for tests and demonstrations only: `sdns cluster up
//! --byzantine ID:MODE,...` writes `[replica] byzantine = "MODE"`, and a replica refuses to
//! start with one unless `[cluster] test_cluster = true`. Each mode is a thin hook in one
//! driver (ordering: bft's transport driver; signing: the signing service; answers: the
//! listener; vouches: the vouched-read service); a replica without a mode runs none of it.

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
    /// As primary, adds to every pre-prepare requests under the other origins it carries,
    /// numbered 2^32 - 1 above theirs and just within the number jump.
    OriginForger,
}

impl Mode {
    /// Every mode, with `crash-after-N` at N = 20 (for listings and tests).
    pub const ALL: [Mode; 12] = [
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
        Mode::OriginForger,
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
            _ => None,
        }
    }

    /// What the vouched-read service does to this replica's probes and vouches (they travel
    /// on the mesh's reads channel, outside the ordering driver).
    pub fn reads(self) -> crate::vouch::Fault {
        match self {
            Mode::Silent => crate::vouch::Fault::Silent,
            Mode::WrongVouches => crate::vouch::Fault::WrongVouches,
            _ => crate::vouch::Fault::None,
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

/// The signing service's hook (bit-inverted shares are the signing core's own `corrupt`).
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
            Mode::OriginForger => f.write_str("origin-forger"),
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
            "origin-forger" => Mode::OriginForger,
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
