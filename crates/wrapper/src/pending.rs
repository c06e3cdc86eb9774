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
    pub fn insert(&self, key: (u64, u64), reply: ReplyTo) -> bool {
        let Ok(mut map) = self.map.lock() else { return false };
        if map.len() >= self.max {
            return false;
        }
        map.insert(key, PendingEntry { reply, arrived: Instant::now() });
        true
    }

    pub fn take(&self, key: &(u64, u64)) -> Option<PendingEntry> {
        self.map.lock().ok()?.remove(key)
    }

    pub fn contains(&self, key: &(u64, u64)) -> bool {
        self.map.lock().map(|m| m.contains_key(key)).unwrap_or(false)
    }

    /// Removes entries older than `age`; returns how many.
    pub fn sweep(&self, age: Duration) -> usize {
        let Ok(mut map) = self.map.lock() else { return 0 };
        let before = map.len();
        let now = Instant::now();
        map.retain(|_, e| now.duration_since(e.arrived) < age);
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
        let p = Pending::new(2);
        assert!(p.insert((1, 1), reply()));
        assert!(p.insert((1, 2), reply()));
        assert!(!p.insert((1, 3), reply()), "table is bounded");
        assert!(p.take(&(1, 1)).is_some());
        assert!(p.take(&(1, 1)).is_none(), "an answer goes out once");
        assert_eq!(p.sweep(Duration::from_secs(60)), 0);
        assert_eq!(p.sweep(Duration::ZERO), 1);
        assert!(p.is_empty());
    }
}
