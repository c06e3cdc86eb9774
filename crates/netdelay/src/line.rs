//! The delay line: chunks stamped with their delivery time, in order, within a byte budget.
//!
//! A reader puts chunks in as they arrive ([`Sender::push`] waits for room, for TCP's
//! back-pressure; [`Sender::try_push`] drops instead, for UDP); a writer takes them out no
//! earlier than their delivery time ([`Receiver::next`]). The budget counts the bytes queued and
//! not yet written, so a link holds at most `budget` bytes per direction whatever the two ends do.

use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

struct Chunk {
    at: Instant,
    data: Vec<u8>,
    // Returned to the budget when the chunk has been written (dropped).
    _permit: OwnedSemaphorePermit,
}

/// The writing end of a delay line.
pub struct Sender {
    tx: mpsc::UnboundedSender<Chunk>,
    budget: Arc<Semaphore>,
    capacity: usize,
    last: Option<Instant>,
}

/// The reading end of a delay line.
pub struct Receiver {
    rx: mpsc::UnboundedReceiver<Chunk>,
}

/// A delay line holding at most `budget` bytes (at least 1).
pub fn channel(budget: usize) -> (Sender, Receiver) {
    let budget = budget.clamp(1, Semaphore::MAX_PERMITS);
    let (tx, rx) = mpsc::unbounded_channel();
    (Sender { tx, budget: Arc::new(Semaphore::new(budget)), capacity: budget, last: None }, Receiver { rx })
}

impl Sender {
    /// The budget in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.capacity - self.budget.available_permits()
    }

    // Never before the previous chunk: jitter does not reorder.
    fn stamp(&mut self, at: Instant) -> Instant {
        let at = self.last.map_or(at, |last| at.max(last));
        self.last = Some(at);
        at
    }

    /// Queues `data` for delivery at `at` (or after the previous chunk), waiting for room in
    /// the budget. A chunk larger than the whole budget must be split by the caller. Returns
    /// false once the receiving end is gone.
    pub async fn push(&mut self, at: Instant, data: Vec<u8>) -> bool {
        let n = data.len().clamp(1, self.capacity) as u32;
        let Ok(permit) = self.budget.clone().acquire_many_owned(n).await else { return false };
        let at = self.stamp(at);
        self.tx.send(Chunk { at, data, _permit: permit }).is_ok()
    }

    /// Queues `data` if the budget has room; drops it otherwise (returns false).
    pub fn try_push(&mut self, at: Instant, data: Vec<u8>) -> bool {
        let n = data.len().clamp(1, self.capacity) as u32;
        let Ok(permit) = self.budget.clone().try_acquire_many_owned(n) else { return false };
        let at = self.stamp(at);
        self.tx.send(Chunk { at, data, _permit: permit }).is_ok()
    }
}

impl Receiver {
    /// The next chunk, once its delivery time has come; None when the sender is gone and the
    /// line is empty. The chunk's bytes go back to the budget when the returned guard drops.
    pub async fn next(&mut self) -> Option<Delivered> {
        let chunk = self.rx.recv().await?;
        tokio::time::sleep_until(chunk.at).await;
        Some(Delivered(chunk))
    }
}

/// A chunk due now; its bytes count against the budget until this is dropped (after writing).
pub struct Delivered(Chunk);

impl Delivered {
    pub fn data(&self) -> &[u8] {
        &self.0.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn chunks_come_out_in_order_no_earlier_than_stamped() {
        let (mut tx, mut rx) = channel(1024);
        let t0 = Instant::now();
        assert!(tx.push(t0 + Duration::from_millis(50), b"a".to_vec()).await);
        // Stamped earlier than its predecessor: still delivered after it.
        assert!(tx.push(t0 + Duration::from_millis(10), b"b".to_vec()).await);
        drop(tx);
        let a = rx.next().await.unwrap();
        assert_eq!(a.data(), b"a");
        assert!(Instant::now() >= t0 + Duration::from_millis(50));
        let b = rx.next().await.unwrap();
        assert_eq!(b.data(), b"b");
        assert!(rx.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_bounds_what_is_queued() {
        let (mut tx, mut rx) = channel(10);
        let at = Instant::now() + Duration::from_secs(1);
        assert!(tx.try_push(at, vec![0; 6]));
        assert_eq!(tx.queued(), 6);
        // No room for 6 more: dropped, nothing queued beyond the budget.
        assert!(!tx.try_push(at, vec![0; 6]));
        assert_eq!(tx.queued(), 6);
        // A waiting push completes only once the writer has taken the first chunk out.
        let pushed = tokio::spawn(async move {
            let ok = tx.push(at, vec![1; 6]).await;
            (ok, tx)
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!pushed.is_finished());
        let first = rx.next().await.unwrap();
        assert_eq!(first.data(), &[0; 6]);
        drop(first);
        let (ok, tx) = pushed.await.unwrap();
        assert!(ok);
        assert_eq!(tx.queued(), 6);
    }
}
