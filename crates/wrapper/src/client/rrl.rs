//! Response rate limiting for UDP answers, modelled on BIND's RRL: the answers to one
//! client prefix (/24 IPv4, /56 IPv6 by default) are counted per kind of answer (the
//! same name and type; all NXDOMAINs; all errors). Each such account earns
//! `responses_per_second` credits per second, up to one second's worth, and pays one
//! per answer; it may go into debt down to `window_s` seconds' worth, so a flood is
//! limited as long as its average over the window exceeds the rate. A limited answer is
//! dropped, except every `slip`-th, which goes out truncated (TC=1, no records) so a
//! real client behind a spoofed flood can retry over TCP.
//!
//! Off by default (`responses_per_second = 0`), as in BIND, where rate-limit must be
//! configured; the other defaults are BIND's (window 15, slip 2, prefixes 24 and 56,
//! table 20000). Sans-IO: the caller passes the time; the listener's hook is a few lines.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use exec::auth::wire;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RrlConfig {
    /// Answers per second per prefix and answer; 0 turns rate limiting off.
    pub responses_per_second: u32,
    /// Seconds over which a flood's rate is averaged (BIND: window, 1..=3600).
    pub window_s: u32,
    /// Every Nth limited answer goes out truncated; 0: none, 1: all.
    pub slip: u32,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    /// Accounts kept at most; when full, accounts idle for a window are forgotten first.
    pub max_table: usize,
}

impl Default for RrlConfig {
    fn default() -> Self {
        RrlConfig { responses_per_second: 0, window_s: 15, slip: 2, ipv4_prefix: 24, ipv6_prefix: 56, max_table: 20_000 }
    }
}

impl RrlConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=3600).contains(&self.window_s) {
            return Err(format!("window_s {} is outside 1..=3600", self.window_s));
        }
        if self.slip > 10 {
            return Err(format!("slip {} is above 10 (BIND's limit)", self.slip));
        }
        if self.ipv4_prefix > 32 || self.ipv6_prefix > 128 {
            return Err("prefix length too long".into());
        }
        if self.max_table == 0 {
            return Err("max_table must be at least 1".into());
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Send,
    /// Send the truncated form instead.
    Slip,
    Drop,
}

/// What answers are counted together.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A positive answer (or NODATA) for this name (lower-case wire) and type.
    Answer(Vec<u8>, u16),
    NxDomain,
    Error,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Account {
    prefix: IpAddr,
    kind: Kind,
}

#[derive(Clone, Debug)]
struct Bucket {
    /// In thousandths of an answer.
    balance: i64,
    last_ms: u64,
    limited: u64,
}

pub struct Rrl {
    config: RrlConfig,
    table: HashMap<Account, Bucket>,
    /// Answers not limited because the table was full of busy accounts.
    pub table_full: u64,
}

impl Rrl {
    pub fn new(config: RrlConfig) -> Rrl {
        Rrl { config, table: HashMap::new(), table_full: 0 }
    }

    pub fn enabled(&self) -> bool {
        self.config.responses_per_second > 0
    }

    fn prefix(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(a) => {
                let bits = u32::from(self.config.ipv4_prefix);
                let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let bits = u32::from(self.config.ipv6_prefix);
                let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
                IpAddr::V6((u128::from(a) & mask).into())
            }
        }
    }

    /// Decides one answer to `client` of this kind at `now_ms` (monotonic).
    pub fn check(&mut self, client: IpAddr, kind: Kind, now_ms: u64) -> Action {
        if !self.enabled() {
            return Action::Send;
        }
        let rate = i64::from(self.config.responses_per_second) * 1000;
        let floor = -rate * i64::from(self.config.window_s);
        let account = Account { prefix: self.prefix(client), kind };
        if !self.table.contains_key(&account) && self.table.len() >= self.config.max_table {
            let window_ms = u64::from(self.config.window_s) * 1000;
            self.table.retain(|_, b| now_ms.saturating_sub(b.last_ms) < window_ms);
            if self.table.len() >= self.config.max_table {
                self.table_full += 1;
                return Action::Send;
            }
        }
        let b = self.table.entry(account).or_insert(Bucket { balance: rate, last_ms: now_ms, limited: 0 });
        let elapsed = now_ms.saturating_sub(b.last_ms) as i64;
        b.last_ms = now_ms;
        // Credit: `rate` thousandths per second, i.e. responses_per_second per ms.
        let credit = elapsed.saturating_mul(i64::from(self.config.responses_per_second));
        b.balance = b.balance.saturating_add(credit).min(rate);
        b.balance = (b.balance - 1000).max(floor);
        if b.balance >= 0 {
            return Action::Send;
        }
        b.limited += 1;
        match self.config.slip {
            0 => Action::Drop,
            s if b.limited.is_multiple_of(u64::from(s)) => Action::Slip,
            _ => Action::Drop,
        }
    }
}

/// The kind of an answer, from its bytes: rcode and question.
pub fn kind_of(answer: &[u8]) -> Option<Kind> {
    let rcode = *answer.get(3)? & 0x0f;
    match rcode {
        0 => {
            let (name, end) = wire::read_name(answer, wire::HEADER_LEN).ok()?;
            let qtype = wire::u16_at(answer, end)?;
            Some(Kind::Answer(name, qtype))
        }
        3 => Some(Kind::NxDomain),
        _ => Some(Kind::Error),
    }
}

/// The answer's header and question with TC set and no records.
pub fn truncated(answer: &[u8]) -> Option<Vec<u8>> {
    let qd = wire::u16_at(answer, 4)?;
    let mut end = wire::HEADER_LEN;
    for _ in 0..qd {
        let (_, e) = wire::read_name(answer, end).ok()?;
        end = e + 4;
    }
    let mut out = answer.get(..end)?.to_vec();
    out[2] |= 0x02;
    out[6..12].fill(0);
    Some(out)
}

/// The limiter shared by a replica's UDP replies.
pub struct Limiter {
    rrl: Mutex<Rrl>,
    start: Instant,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").finish_non_exhaustive()
    }
}

impl Limiter {
    pub fn new(config: RrlConfig) -> Option<Limiter> {
        let rrl = Rrl::new(config);
        rrl.enabled().then(|| Limiter { rrl: Mutex::new(rrl), start: Instant::now() })
    }

    /// What to send to `client` instead of `answer`: itself, its truncated form, or nothing.
    pub fn filter(&self, client: IpAddr, answer: Vec<u8>) -> Option<Vec<u8>> {
        let Some(kind) = kind_of(&answer) else { return Some(answer) };
        let now_ms = self.start.elapsed().as_millis() as u64;
        let action = match self.rrl.lock() {
            Ok(mut r) => r.check(client, kind, now_ms),
            Err(_) => Action::Send,
        };
        match action {
            Action::Send => Some(answer),
            Action::Slip => truncated(&answer),
            Action::Drop => None,
        }
    }
}

/// `[order_limit]`: how many requests per second one client prefix may have ordered.
/// Every ordered update costs every replica a write to named, a durable record and a flushed
/// read cache, so a key holder's flood (unauthenticated updates are never ordered) would
/// otherwise slow every other client's updates; ordered reads cost the ordering only, and are
/// limited only when `reads_per_second` is set. Counted as RRL counts answers (the same
/// credits and debt, per /24 and /56 by default); a request over the limit is answered
/// REFUSED without being ordered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrderLimitConfig {
    /// Updates and zone transfers per second per client prefix; 0: no limit.
    pub writes_per_second: u32,
    /// Ordered reads per second per client prefix; 0 (the default): no limit.
    pub reads_per_second: u32,
    /// Seconds over which a flood's rate is averaged (1..=3600).
    pub window_s: u32,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    /// Prefixes tracked at most; when full, those idle for a window are forgotten first.
    pub max_table: usize,
}

impl Default for OrderLimitConfig {
    fn default() -> Self {
        // 200 updates/s from one /24 is some 50 times what nsupdate loops reach here
        // (docs/BENCHMARKS.md); the window is short so that a client over it is back soon.
        OrderLimitConfig { writes_per_second: 200, reads_per_second: 0, window_s: 5, ipv4_prefix: 24, ipv6_prefix: 56, max_table: 20_000 }
    }
}

impl OrderLimitConfig {
    fn rrl(&self, per_second: u32) -> RrlConfig {
        RrlConfig {
            responses_per_second: per_second,
            window_s: self.window_s,
            slip: 0,
            ipv4_prefix: self.ipv4_prefix,
            ipv6_prefix: self.ipv6_prefix,
            max_table: self.max_table,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        self.rrl(self.writes_per_second).validate()
    }
}

/// The per-prefix limit on ordered requests, shared by a replica's listeners.
pub struct OrderLimiter {
    writes: Mutex<Rrl>,
    reads: Mutex<Rrl>,
    start: Instant,
}

impl std::fmt::Debug for OrderLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderLimiter").finish_non_exhaustive()
    }
}

impl OrderLimiter {
    /// `None` when neither limit is set.
    pub fn new(config: &OrderLimitConfig) -> Option<OrderLimiter> {
        let (writes, reads) = (Rrl::new(config.rrl(config.writes_per_second)), Rrl::new(config.rrl(config.reads_per_second)));
        (writes.enabled() || reads.enabled()).then(|| OrderLimiter { writes: Mutex::new(writes), reads: Mutex::new(reads), start: Instant::now() })
    }

    /// Whether a request from `client` may be ordered now (`write`: an update or a transfer).
    pub fn allow(&self, client: IpAddr, write: bool) -> bool {
        self.allow_at(client, write, self.start.elapsed().as_millis() as u64)
    }

    fn allow_at(&self, client: IpAddr, write: bool, now_ms: u64) -> bool {
        let rrl = if write { &self.writes } else { &self.reads };
        // An IPv4 client on a dual-stack socket counts in its IPv4 prefix.
        let client = match client {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(client),
            v4 => v4,
        };
        match rrl.lock() {
            Ok(mut r) => r.check(client, Kind::Error, now_ms) == Action::Send,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_requests_are_limited_per_prefix_writes_and_reads_apart() {
        let config = OrderLimitConfig { writes_per_second: 10, window_s: 2, ..OrderLimitConfig::default() };
        assert_eq!(config.validate(), Ok(()));
        assert!(OrderLimitConfig { window_s: 0, ..config.clone() }.validate().is_err());
        assert!(OrderLimitConfig { ipv6_prefix: 129, ..config.clone() }.validate().is_err());
        assert!(OrderLimiter::new(&OrderLimitConfig { writes_per_second: 0, ..config.clone() }).is_none(), "both off: no limiter");
        let l = OrderLimiter::new(&config).unwrap();
        // A burst of a second's worth passes, the rest of a flood does not.
        let passed = (0..1000).filter(|_| l.allow_at(ip("192.0.2.1"), true, 0)).count();
        assert_eq!(passed, 10);
        // The same /24 (and the same address mapped into IPv6) shares the account; another
        // /24 does not; reads are not limited by default.
        assert!(!l.allow_at(ip("192.0.2.77"), true, 0));
        assert!(!l.allow_at(ip("::ffff:192.0.2.9"), true, 0));
        assert!(l.allow_at(ip("192.0.3.1"), true, 0));
        assert!((0..1000).all(|_| l.allow_at(ip("192.0.2.1"), false, 0)));
        // The debt lasts at most the window: three seconds later the rate passes again.
        assert_eq!((0..10).filter(|_| l.allow_at(ip("192.0.2.1"), true, 3_000)).count(), 10);
        // Steady updates at the rate are never refused.
        let l = OrderLimiter::new(&config).unwrap();
        assert!((0..100u64).all(|i| l.allow_at(ip("198.51.100.2"), true, i * 100)));
        // The default is generous for nsupdate: 200 at once from one address pass.
        let l = OrderLimiter::new(&OrderLimitConfig::default()).unwrap();
        assert!((0..200).all(|_| l.allow_at(ip("127.0.0.1"), true, 0)));
    }

    fn rrl(rps: u32, window_s: u32, slip: u32) -> Rrl {
        Rrl::new(RrlConfig { responses_per_second: rps, window_s, slip, ..RrlConfig::default() })
    }

    fn www() -> Kind {
        Kind::Answer(wire::name_to_wire("www.example.test.").unwrap(), 1)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn off_by_default() {
        let mut r = Rrl::new(RrlConfig::default());
        assert!(!r.enabled());
        for _ in 0..1000 {
            assert_eq!(r.check(ip("192.0.2.1"), www(), 0), Action::Send);
        }
    }

    #[test]
    fn a_burst_beyond_the_rate_is_limited_with_every_second_slipping() {
        let mut r = rrl(5, 15, 2);
        let actions: Vec<Action> = (0..11).map(|_| r.check(ip("192.0.2.1"), www(), 1000)).collect();
        assert_eq!(&actions[..5], &[Action::Send; 5]);
        assert_eq!(&actions[5..], &[Action::Drop, Action::Slip, Action::Drop, Action::Slip, Action::Drop, Action::Slip]);
    }

    #[test]
    fn accounts_are_per_prefix_and_per_answer() {
        let mut r = rrl(1, 15, 0);
        assert_eq!(r.check(ip("192.0.2.1"), www(), 0), Action::Send);
        // Same /24: same account, limited.
        assert_eq!(r.check(ip("192.0.2.200"), www(), 0), Action::Drop);
        // Another /24, another name, NXDOMAIN vs errors: separate accounts.
        assert_eq!(r.check(ip("192.0.3.1"), www(), 0), Action::Send);
        assert_eq!(r.check(ip("192.0.2.1"), Kind::Answer(wire::name_to_wire("mail.example.test.").unwrap(), 1), 0), Action::Send);
        assert_eq!(r.check(ip("192.0.2.1"), Kind::NxDomain, 0), Action::Send);
        assert_eq!(r.check(ip("192.0.2.1"), Kind::Error, 0), Action::Send);
        // IPv6: /56 shares, the next /56 does not.
        assert_eq!(r.check(ip("2001:db8:0:100::1"), www(), 0), Action::Send);
        assert_eq!(r.check(ip("2001:db8:0:1ff::2"), www(), 0), Action::Drop);
        assert_eq!(r.check(ip("2001:db8:0:200::1"), www(), 0), Action::Send);
    }

    #[test]
    fn debt_lasts_about_a_window_then_the_rate_is_served_again() {
        let mut r = rrl(10, 2, 0);
        // A flood of 100 answers at once: 10 pass, the account sinks to the floor (-2 s).
        let sent = (0..100).filter(|_| r.check(ip("198.51.100.7"), www(), 0) == Action::Send).count();
        assert_eq!(sent, 10);
        // One second later the debt is not yet paid off.
        assert_eq!(r.check(ip("198.51.100.7"), www(), 1000), Action::Drop);
        // Three seconds after the flood, the full rate passes again (the window bounds the debt).
        let later = (0..10).filter(|_| r.check(ip("198.51.100.7"), www(), 4000) == Action::Send).count();
        assert_eq!(later, 10);
        // Steady traffic at the rate is never limited.
        let mut r = rrl(10, 15, 2);
        for i in 0..200u64 {
            assert_eq!(r.check(ip("198.51.100.7"), www(), i * 100), Action::Send, "{i}");
        }
    }

    #[test]
    fn the_table_is_bounded() {
        let mut r = Rrl::new(RrlConfig { responses_per_second: 1, max_table: 4, ..RrlConfig::default() });
        for i in 0..4u8 {
            r.check(IpAddr::from([10, 0, i, 1]), www(), 0);
        }
        // Full of accounts active in the window: a new one is not tracked (and not limited).
        assert_eq!(r.check(ip("10.9.9.9"), www(), 0), Action::Send);
        assert_eq!(r.table_full, 1);
        // After a window of silence the old accounts make room.
        assert_eq!(r.check(ip("10.9.9.9"), www(), 16_000), Action::Send);
        assert_eq!(r.check(ip("10.9.9.9"), www(), 16_000), Action::Drop);
        assert!(r.table.len() <= 4);
    }

    #[test]
    fn truncated_answers_keep_the_question_only() {
        // id, flags (QR AA), 1 question, 1 answer.
        let mut a = vec![0x12, 0x34, 0x84, 0x00, 0, 1, 0, 1, 0, 0, 0, 0];
        a.extend_from_slice(&wire::name_to_wire("www.example.test.").unwrap());
        a.extend_from_slice(&[0, 1, 0, 1]);
        let q_end = a.len();
        a.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 80]);
        assert_eq!(kind_of(&a), Some(www()));
        let t = truncated(&a).unwrap();
        assert_eq!(t.len(), q_end);
        assert_eq!(t[2] & 0x02, 0x02);
        assert_eq!(&t[4..12], &[0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(truncated(&a[..14]), None);
        let l = Limiter::new(RrlConfig { responses_per_second: 1, slip: 1, ..RrlConfig::default() }).unwrap();
        assert_eq!(l.filter(ip("192.0.2.1"), a.clone()), Some(a.clone()));
        assert_eq!(l.filter(ip("192.0.2.1"), a.clone()), Some(t));
        assert!(Limiter::new(RrlConfig::default()).is_none());
    }
}
