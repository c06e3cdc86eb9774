//! The gateway's table of client requests awaiting their ordered answer.
//!
//! Keyed by the ordering's request identity (client incarnation, request number),
//! so the executor finds the client when the request comes back delivered. Bounded;
//! entries older than the client timeout are swept (the client has retried or given up).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::listener::ReplyTo;

pub struct PendingEntry {
    pub reply: ReplyTo,
    pub arrived: Instant,
    deadline: Instant,
}

pub struct Pending {
    map: Mutex<HashMap<(u64, u64), PendingEntry>>,
    max: usize,
}

impl Pending {
    pub fn new(max: usize) -> Pending {
        Pending { map: Mutex::new(HashMap::new()), max }
    }

    /// False when the table is full: the caller answers SERVFAIL or drops.
    /// The entry is swept once `ttl` has passed.
    pub fn insert(&self, key: (u64, u64), reply: ReplyTo, ttl: Duration) -> bool {
        let Ok(mut map) = self.map.lock() else { return false };
        if map.len() >= self.max {
            return false;
        }
        let arrived = Instant::now();
        map.insert(key, PendingEntry { reply, arrived, deadline: arrived + ttl });
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
        before - map.len()
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
    use tokio::sync::mpsc;

    fn reply() -> ReplyTo {
        ReplyTo::Tcp { writer: mpsc::channel(1).0 }
    }

    #[test]
    fn bounded_take_once_and_sweep() {
        let p = Pending::new(3);
        let long = Duration::from_secs(60);
        assert!(p.insert((1, 1), reply(), long));
        assert!(p.insert((1, 2), reply(), long));
        assert!(p.insert((1, 3), reply(), Duration::ZERO));
        assert!(!p.insert((1, 4), reply(), long), "table is bounded");
        assert!(p.take(&(1, 1)).is_some());
        assert!(p.take(&(1, 1)).is_none(), "an answer goes out once");
        assert_eq!(p.sweep(), 1, "only the expired entry goes");
        assert!(p.contains(&(1, 2)));
        assert_eq!(p.len(), 1);
    }
}
