//! The gateway's table of client requests awaiting their ordered answer.
//!
//! Keyed by the ordering's request identity (client incarnation, request number),
//! so the executor finds the client when the request comes back delivered. Bounded;
//! entries older than the client timeout are swept (the client has retried or given up).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::client::reply::ReplyTo;

pub struct PendingEntry {
    pub reply: ReplyTo,
    pub arrived: Instant,
    deadline: Instant,
    /// SHA-256 of the payload this gateway submitted: a request delivered under this
    /// identity with other bytes was forged by a lying primary and gets no answer.
    pub payload_digest: [u8; 32],
}

impl PendingEntry {
    /// Whether `payload` is what this gateway submitted under the entry's identity.
    pub fn matches(&self, payload: &[u8]) -> bool {
        self.payload_digest == payload_digest(payload)
    }
}

pub fn payload_digest(payload: &[u8]) -> [u8; 32] {
    use sha2::{Digest as _, Sha256};
    Sha256::digest(payload).into()
}

pub struct Pending {
    map: Mutex<HashMap<(u64, u64), PendingEntry>>,
    max: usize,
    /// Whether this gateway's requests are delivered at all (`crate::ops::health`).
    own: Mutex<crate::ops::health::OwnRequests>,
}

impl Pending {
    pub fn new(max: usize) -> Pending {
        Pending { map: Mutex::new(HashMap::new()), max, own: Mutex::default() }
    }

    /// False when the table is full: the caller answers SERVFAIL or drops.
    /// The entry is swept once `ttl` has passed.
    pub fn insert(&self, key: (u64, u64), reply: ReplyTo, ttl: Duration, payload_digest: [u8; 32]) -> bool {
        let Ok(mut map) = self.map.lock() else { return false };
        if map.len() >= self.max {
            return false;
        }
        let arrived = Instant::now();
        map.insert(key, PendingEntry { reply, arrived, deadline: arrived + ttl, payload_digest });
        if let Ok(mut own) = self.own.lock() {
            own.submitted(arrived);
        }
        true
    }

    /// Puts back an entry taken under another key (a renumbered request); false when full.
    pub fn reinsert(&self, key: (u64, u64), entry: PendingEntry) -> bool {
        let Ok(mut map) = self.map.lock() else { return false };
        if map.len() >= self.max {
            return false;
        }
        map.insert(key, entry);
        true
    }

    pub fn take(&self, key: &(u64, u64)) -> Option<PendingEntry> {
        self.map.lock().ok()?.remove(key)
    }

    pub fn contains(&self, key: &(u64, u64)) -> bool {
        self.map.lock().map(|m| m.contains_key(key)).unwrap_or(false)
    }

    /// Removes entries past their deadline; returns how many.
    pub fn sweep(&self) -> usize {
        let Ok(mut map) = self.map.lock() else { return 0 };
        let before = map.len();
        let now = Instant::now();
        map.retain(|_, e| now < e.deadline);
        let expired = before - map.len();
        if expired > 0 {
            if let Ok(mut own) = self.own.lock() {
                own.expired(now);
            }
        }
        expired
    }

    /// One of this gateway's requests came back delivered as it was submitted (the
    /// executor took its entry).
    pub fn delivered(&self) {
        let waiting = !self.is_empty();
        if let Ok(mut own) = self.own.lock() {
            own.delivered(Instant::now(), waiting);
        }
    }

    /// How long this gateway's requests have gone undelivered, while that matters
    /// ([`crate::ops::health::OwnRequests::waiting`]).
    pub fn undelivered_for(&self, bound: Duration) -> Option<Duration> {
        let waiting = !self.is_empty();
        self.own.lock().ok()?.waiting(Instant::now(), waiting, bound)
    }

    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply() -> ReplyTo {
        ReplyTo::internal().0
    }

    #[test]
    fn bounded_take_once_and_sweep() {
        let p = Pending::new(3);
        let long = Duration::from_secs(60);
        assert!(p.insert((1, 1), reply(), long, [0; 32]));
        assert!(p.insert((1, 2), reply(), long, [0; 32]));
        assert!(p.insert((1, 3), reply(), Duration::ZERO, [0; 32]));
        assert!(!p.insert((1, 4), reply(), long, [0; 32]), "table is bounded");
        assert!(p.take(&(1, 1)).is_some());
        assert!(p.take(&(1, 1)).is_none(), "an answer goes out once");
        assert_eq!(p.sweep(), 1, "only the expired entry goes");
        assert!(p.contains(&(1, 2)));
        assert_eq!(p.len(), 1);
    }
}

#[cfg(test)]
mod forged {
    use super::*;

    #[test]
    fn only_the_submitted_payload_gets_the_answer() {
        let p = Pending::new(4);
        let reply = ReplyTo::internal().0;
        assert!(p.insert((9, 1), reply, Duration::from_secs(60), payload_digest(b"what the client asked")));
        let entry = p.take(&(9, 1)).unwrap();
        assert!(entry.matches(b"what the client asked"));
        assert!(!entry.matches(b"what a lying primary ordered instead"));
    }
}
