//! Client-address access control, enforced by the wrapper.
//!
//! named sees every client as the loopback address (the wrapper forwards for all
//! of them), so address ACLs in named.conf would mean nothing; the generated
//! named.conf has none, and these take their place. `[access]` in replica.toml:
//!
//! ```toml
//! [access]
//! allow_query = ["0.0.0.0/0", "::/0"]      # the default: anyone may query
//! allow_transfer = ["192.0.2.53/32"]       # the default is empty: no transfer by address
//! ```
//!
//! A request a list does not allow gets the REFUSED named would give for the same
//! bytes (`answer::error_answer`). `allow_query` covers queries and transfers (as
//! in named, a client that may not query may not transfer); `allow_transfer`
//! covers AXFR/IXFR over TCP. Updates are not address-controlled: named's
//! update-policy decides by TSIG key. Other grants (a transfer allowed by a TSIG
//! key) compose with these as "address or key".

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::classify::Kind;

/// An address prefix, `192.0.2.0/24`, `2001:db8::/32`, or a bare address (a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Prefix {
    addr: IpAddr,
    len: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrefixError {
    #[error("{0:?} is not an address or address/length")]
    BadAddress(String),
    #[error("{0:?}: prefix length above {1}")]
    BadLength(String, u8),
    #[error("{0:?}: bits set after the prefix length (did you mean {1}?)")]
    HostBits(String, String),
}

fn bits(addr: IpAddr) -> (u128, u8) {
    match addr {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    }
}

fn mask(len: u8, width: u8) -> u128 {
    if len == 0 {
        return 0;
    }
    let all = if width == 128 { u128::MAX } else { (1u128 << width) - 1 };
    // len >= 1, so the shift is below 128.
    all & !((1u128 << (width - len)) - 1)
}

impl Prefix {
    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 client on a dual-stack socket arrives as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        if ip.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        let (net, width) = bits(self.addr);
        let (host, _) = bits(ip);
        let m = mask(self.len, width);
        net & m == host & m
    }
}

impl FromStr for Prefix {
    type Err = PrefixError;
    fn from_str(s: &str) -> Result<Self, PrefixError> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| PrefixError::BadAddress(s.to_string()))?;
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => width,
            Some(l) => l.trim().parse::<u8>().map_err(|_| PrefixError::BadAddress(s.to_string()))?,
        };
        if len > width {
            return Err(PrefixError::BadLength(s.to_string(), width));
        }
        let (b, _) = bits(addr);
        if b & !mask(len, width) != 0 {
            let net = b & mask(len, width);
            let net_addr = if addr.is_ipv4() { IpAddr::V4(std::net::Ipv4Addr::from(net as u32)) } else { IpAddr::V6(std::net::Ipv6Addr::from(net)) };
            return Err(PrefixError::HostBits(s.to_string(), format!("{net_addr}/{len}")));
        }
        Ok(Prefix { addr, len })
    }
}

impl TryFrom<String> for Prefix {
    type Error = PrefixError;
    fn try_from(s: String) -> Result<Self, PrefixError> {
        s.parse()
    }
}

impl From<Prefix> for String {
    fn from(p: Prefix) -> String {
        p.to_string()
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// `[access]` of the replica configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessSection {
    /// Clients that may query (and, if also in `allow_transfer`, transfer).
    pub allow_query: Vec<Prefix>,
    /// Clients that may transfer the zone by address.
    pub allow_transfer: Vec<Prefix>,
}

impl Default for AccessSection {
    fn default() -> Self {
        AccessSection { allow_query: vec!["0.0.0.0/0".parse().expect("literal"), "::/0".parse().expect("literal")], allow_transfer: Vec::new() }
    }
}

impl AccessSection {
    /// Whether a client at `ip` may have a request of this kind executed by address.
    pub fn allows(&self, ip: IpAddr, kind: Kind) -> bool {
        let query = self.allow_query.iter().any(|p| p.contains(ip));
        match kind {
            Kind::Write => true,
            Kind::Read => query,
            Kind::Transfer => query && self.allow_transfer.iter().any(|p| p.contains(ip)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_parse_and_match() {
        let p: Prefix = "192.0.2.0/24".parse().unwrap();
        assert!(p.contains(ip("192.0.2.200")) && !p.contains(ip("192.0.3.1")));
        assert!(p.contains(ip("::ffff:192.0.2.9")), "v4-mapped clients match v4 prefixes");
        assert!(!p.contains(ip("2001:db8::1")));
        let one: Prefix = "127.0.0.1".parse().unwrap();
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let v6: Prefix = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:1::5")) && !v6.contains(ip("2001:db9::1")));
        let all: Prefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.7")));
        assert_eq!(v6.to_string(), "2001:db8::/32");
        assert!(matches!("192.0.2.1/24".parse::<Prefix>(), Err(PrefixError::HostBits(_, s)) if s == "192.0.2.0/24"));
        assert!(matches!("10.0.0.0/33".parse::<Prefix>(), Err(PrefixError::BadLength(..))));
        assert!(matches!("example.test".parse::<Prefix>(), Err(PrefixError::BadAddress(_))));
    }

    #[test]
    fn defaults_allow_queries_and_no_transfers() {
        let a = AccessSection::default();
        assert!(a.allows(ip("198.51.100.1"), Kind::Read));
        assert!(a.allows(ip("2001:db8::1"), Kind::Read));
        assert!(!a.allows(ip("127.0.0.1"), Kind::Transfer));
        assert!(a.allows(ip("198.51.100.1"), Kind::Write));
        let a = AccessSection { allow_query: vec!["192.0.2.0/24".parse().unwrap()], allow_transfer: vec!["192.0.2.53".parse().unwrap()] };
        assert!(a.allows(ip("192.0.2.53"), Kind::Transfer));
        assert!(!a.allows(ip("192.0.2.54"), Kind::Transfer));
        assert!(!a.allows(ip("198.51.100.1"), Kind::Read));
    }

    #[test]
    fn config_rejects_bad_prefixes_naming_them() {
        let ok: AccessSection = toml::from_str("allow_transfer = [\"192.0.2.53/32\", \"::1\"]").unwrap();
        assert_eq!(ok.allow_transfer.len(), 2);
        assert_eq!(ok.allow_query, AccessSection::default().allow_query);
        let err = toml::from_str::<AccessSection>("allow_query = [\"10.1.2.3/8\"]").unwrap_err().to_string();
        assert!(err.contains("10.0.0.0/8"), "{err}");
    }
}
