//! The read router: the one place a client's message gets its path, decided once as it
//! arrives, from exec's classifier and this replica's read mode.
//!
//! The listener asks [`route`] and does what the [`Route`] says; a request that goes on to
//! the gateway carries its [`Lane`], so the gateway never looks at the bytes again, and one
//! tried on the vouched path carries the read cache's key the router computed. The ordered
//! log is classified once more, by exec's core at every replica: it cannot take a gateway's
//! word for what a request is.
//!
//! A read's paths: answered at once (the address ACL or the pre-ordering check refuses it);
//! local (`reads = "local"`: the listener answers it from the cache or named); voting (a
//! voting client's read: the gateway answers it at once from named); vouched (ordered mode with
//! `cluster.vouched_reads`: a plain query answered once 2t peers vouch, else ordered); ordered.
//! An update and a zone transfer are always ordered, after the same checks.

use std::net::IpAddr;

use exec::access::AccessSection;
use exec::answer::{error_answer, RCODE_REFUSED};
use exec::auth::zones::ZoneAuth;
use exec::classify::{classify, precheck, transfer_rights, Kind, Verdict};

use crate::client::reply::ReplyTo;
use crate::reads::read_cache;
use crate::reads::voting_read::is_voting_read;

/// Which read paths this replica uses (its `reads` mode and `cluster.vouched_reads`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadSetup {
    /// Every read is ordered (a voting client's aside).
    #[default]
    Ordered,
    /// Ordered mode with vouched reads: a plain query is tried without ordering first.
    Vouched,
    /// `reads = "local"`: the listeners answer every read themselves.
    Local,
}

/// Where a client's message goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// Answered at once without ordering, and counted refused: REFUSED by the address ACL
    /// (as named answers a client its ACL does not allow), or the pre-ordering check's answer
    /// (an update that cannot pass, a transfer without its key). `None`: nothing can be
    /// answered to bytes this broken.
    Answer(Option<Vec<u8>>),
    /// Ignored, as named ignores it (responses, runts): answering could feed a reflection loop.
    Drop(&'static str),
    /// `reads = "local"`: the listener answers it, from the cache or named.
    Local,
    /// Tried on the vouched path; `key` is its read cache key. Ordered if it cannot be taken.
    Vouched { key: Vec<u8> },
    /// To the gateway, on this lane.
    Gateway(Lane),
}

/// What the gateway does with a request: the router's decision, carried by [`ClientRequest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Ordered, and executed as this kind.
    Ordered(Kind),
    /// A voting client's read: answered at once from this replica's named, without ordering.
    Voting,
}

impl Lane {
    /// Whether `[order_limit]` counts it against the writes' rate (an update or a transfer).
    pub fn limited_as_write(self) -> bool {
        matches!(self, Lane::Ordered(Kind::Write | Kind::Transfer))
    }
}

/// A client message the router sent on, with the way back to its client.
#[derive(Debug)]
pub struct ClientRequest {
    pub bytes: Vec<u8>,
    pub tcp: bool,
    pub reply: ReplyTo,
    pub lane: Lane,
}

/// The path of `bytes` from `peer`. `now_s` (the local clock, seconds since the epoch) is
/// read only when the pre-ordering check runs; execution checks every ordered update again
/// at the agreed time, and that check decides.
pub fn route(bytes: &[u8], tcp: bool, peer: IpAddr, access: &AccessSection, auth: Option<&ZoneAuth>, mode: ReadSetup, now_s: impl FnOnce() -> u64) -> Route {
    let verdict = classify(bytes, tcp);
    // A transfer is allowed by address OR by a transfer key, as in BIND's allow-transfer list;
    // the key check (and the update-signature check) answers as named would. An AXFR or
    // IXFR over UDP executes as a read but needs the same.
    let transfer = transfer_rights(&verdict, bytes);
    let by_address = match verdict {
        Verdict::Order(_) if transfer => access.allows(peer, Kind::Transfer),
        Verdict::Order(kind) => access.allows(peer, kind),
        _ => true,
    };
    let verdict = match auth {
        Some(_) if !(transfer && by_address) => precheck(verdict, bytes, auth, now_s()),
        _ => verdict,
    };
    let refused_by_address = match verdict {
        // Without a key check configured, a transfer the address ACL refuses stays refused.
        Verdict::Order(_) if transfer => !by_address && auth.is_none(),
        Verdict::Order(_) => !by_address,
        _ => false,
    };
    match verdict {
        // named would see only the wrapper's address; the wrapper answers as named answers.
        Verdict::Order(_) if refused_by_address => Route::Answer(error_answer(bytes, RCODE_REFUSED)),
        Verdict::Order(Kind::Read) => read(bytes, tcp, mode),
        Verdict::Order(kind) => Route::Gateway(Lane::Ordered(kind)),
        Verdict::Answer(answer) => Route::Answer(Some(answer)),
        Verdict::Drop(why) => Route::Drop(why),
    }
}

/// A read's path once it may be executed: local reads take every one; otherwise a voting
/// client's read is answered unordered, and a plain query the cache can key is tried on the
/// vouched path.
fn read(bytes: &[u8], tcp: bool, mode: ReadSetup) -> Route {
    match mode {
        ReadSetup::Local => Route::Local,
        _ if is_voting_read(bytes) => Route::Gateway(Lane::Voting),
        ReadSetup::Vouched => match read_cache::key(bytes, tcp) {
            Some(key) => Route::Vouched { key },
            None => Route::Gateway(Lane::Ordered(Kind::Read)),
        },
        ReadSetup::Ordered => Route::Gateway(Lane::Ordered(Kind::Read)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::{Name, RecordType};
    use std::str::FromStr;

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn query(rtype: RecordType, voting: bool) -> Vec<u8> {
        vote::client::build_query(9, &Name::from_str("www.example.test.").unwrap(), rtype, false, voting).to_vec().unwrap()
    }

    fn update() -> Vec<u8> {
        let mut u = query(RecordType::SOA, false);
        u[2] = 5 << 3;
        u
    }

    /// Routed from an address that may query and transfer, without update authentication.
    fn at(bytes: &[u8], tcp: bool, mode: ReadSetup) -> Route {
        let access: AccessSection = toml::from_str("allow_transfer = [\"127.0.0.1/32\"]").unwrap();
        route(bytes, tcp, PEER, &access, None, mode, || panic!("no pre-ordering check without update authentication"))
    }

    /// Each mode's paths, decided once: what the listener, the vouched path and the gateway
    /// used to decide each for itself.
    #[test]
    fn each_read_mode_routes_reads_its_way_and_orders_the_rest() {
        let (plain, voting, axfr) = (query(RecordType::A, false), query(RecordType::A, true), query(RecordType::AXFR, false));
        for mode in [ReadSetup::Ordered, ReadSetup::Vouched, ReadSetup::Local] {
            assert_eq!(at(&update(), false, mode), Route::Gateway(Lane::Ordered(Kind::Write)), "{mode:?}");
            assert_eq!(at(&axfr, true, mode), Route::Gateway(Lane::Ordered(Kind::Transfer)), "{mode:?}");
            assert_eq!(at(&plain[..5], false, mode), Route::Drop("shorter than a DNS header"));
        }
        assert_eq!(at(&plain, false, ReadSetup::Local), Route::Local);
        assert_eq!(at(&voting, false, ReadSetup::Local), Route::Local, "local reads answer voting clients too");
        assert_eq!(at(&plain, false, ReadSetup::Ordered), Route::Gateway(Lane::Ordered(Kind::Read)));
        assert_eq!(at(&voting, false, ReadSetup::Ordered), Route::Gateway(Lane::Voting));
        assert_eq!(at(&voting, false, ReadSetup::Vouched), Route::Gateway(Lane::Voting));
        assert_eq!(at(&plain, true, ReadSetup::Vouched), Route::Vouched { key: read_cache::key(&plain, true).unwrap() });
        // An AXFR over UDP is a read the cache cannot key: ordered.
        assert_eq!(at(&axfr, false, ReadSetup::Vouched), Route::Gateway(Lane::Ordered(Kind::Read)));
    }

    /// The address ACL answers REFUSED before any read path; writes are not limited by it.
    #[test]
    fn the_address_acl_refuses_before_any_path() {
        let none: AccessSection = toml::from_str("allow_query = []").unwrap();
        let (plain, axfr) = (query(RecordType::A, false), query(RecordType::AXFR, false));
        for mode in [ReadSetup::Ordered, ReadSetup::Vouched, ReadSetup::Local] {
            let Route::Answer(Some(answer)) = route(&plain, false, PEER, &none, None, mode, || 0) else { panic!("refused") };
            assert_eq!((answer[3] & 0x0f, &answer[..2]), (RCODE_REFUSED, &plain[..2]));
            assert_eq!(route(&update(), false, PEER, &none, None, mode, || 0), Route::Gateway(Lane::Ordered(Kind::Write)));
            // A transfer (over TCP, or an AXFR over UDP) needs allow_transfer too.
            for tcp in [true, false] {
                assert!(matches!(route(&axfr, tcp, PEER, &AccessSection::default(), None, mode, || 0), Route::Answer(Some(_))), "{mode:?} tcp={tcp}");
            }
        }
        assert!(Lane::Ordered(Kind::Transfer).limited_as_write() && !Lane::Voting.limited_as_write());
    }
}
