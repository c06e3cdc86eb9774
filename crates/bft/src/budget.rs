//! The per-origin budget of the log: a token bucket per origin, in bytes, that every replica
//! derives from the batches in sequence order (their agreed times and their requests), so an
//! honest primary proposes by it and every backup checks a pre-prepare against it.
//!
//! Why a function of the log: a rule the primary alone applies binds only an honest primary. A
//! corrupted one could fill every batch with its own (or one origin's) requests while still
//! including the others'. Derived from the log, the same state is at every honest replica after
//! the same batch, and it travels with a checkpoint's delivery base for state transfer.

use crate::types::{Config, OriginBudgets, Proposal, ReplicaId, Request, Time};

/// The rule's parameters (from [`Config`]; the same at every replica of a cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    /// Refill, bytes per second; 0: no budget.
    rate: u64,
    /// Bucket size in bytes.
    bucket: i64,
    /// Least charge per request.
    min_charge: u64,
}

impl Rule {
    pub(crate) fn new(config: &Config) -> Rule {
        Rule {
            rate: u64::try_from(config.max_origin_bytes_per_sec).unwrap_or(u64::MAX),
            bucket: i64::try_from(config.batch_max_bytes).unwrap_or(i64::MAX),
            min_charge: u64::try_from(config.min_request_charge).unwrap_or(u64::MAX),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.rate > 0
    }

    pub(crate) fn bucket(&self) -> i64 {
        self.bucket
    }

    /// What `request` costs its origin: its wire size, at least the minimum charge.
    pub(crate) fn charge(&self, request: &Request) -> i64 {
        let size = u64::try_from(request.wire_size()).unwrap_or(u64::MAX).max(self.min_charge);
        i64::try_from(size).unwrap_or(i64::MAX)
    }

    /// Microseconds until a balance of `balance` refills to `target` (0 when it is there).
    pub(crate) fn refill_us(&self, balance: i64, target: i64) -> u64 {
        let missing = u64::try_from(target.saturating_sub(balance)).unwrap_or(0);
        missing.saturating_mul(1_000_000).div_ceil(self.rate.max(1))
    }
}

impl OriginBudgets {
    /// `origin`'s balance at [`OriginBudgets::clock`].
    pub(crate) fn balance(&self, rule: &Rule, origin: ReplicaId) -> i64 {
        self.balances.get(&origin).copied().unwrap_or(rule.bucket)
    }

    /// `origin`'s balance at `time` (refilled from the clock in one step).
    pub(crate) fn balance_at(&self, rule: &Rule, origin: ReplicaId, time: Time) -> i64 {
        let balance = self.balance(rule, origin);
        let elapsed = u128::from(time.0.saturating_sub(self.clock.0));
        let refill = i64::try_from(elapsed.saturating_mul(u128::from(rule.rate)) / 1_000_000).unwrap_or(i64::MAX);
        balance.saturating_add(refill).min(rule.bucket)
    }

    /// Refills every balance to `time` (nothing when `time` is not after the clock). Each step
    /// rounds down, so skipping a batch never refills less: a replica that does not know some
    /// batch is at most more lenient than one that does (see [`OriginBudgets::apply`]).
    pub(crate) fn advance(&mut self, rule: &Rule, time: Time) {
        if time <= self.clock {
            return;
        }
        let elapsed = u128::from(time.0 - self.clock.0);
        self.clock = time;
        let refill = i64::try_from(elapsed.saturating_mul(u128::from(rule.rate)) / 1_000_000).unwrap_or(i64::MAX);
        self.balances.retain(|_, balance| {
            *balance = balance.saturating_add(refill).min(rule.bucket);
            *balance < rule.bucket
        });
    }

    /// Charges one request; false when its origin's balance was not positive before (the rule
    /// is broken). A request may overdraw a positive balance.
    pub(crate) fn take(&mut self, rule: &Rule, request: &Request) -> bool {
        let balance = self.balance(rule, request.origin);
        self.balances.insert(request.origin, balance.saturating_sub(rule.charge(request)));
        balance > 0
    }

    /// Applies batch `proposal`: refills to its time, then charges its requests in order.
    /// Returns the first origin whose balance was not positive before one of its requests (the
    /// batch breaks the rule), after charging everything. A null batch changes nothing. With
    /// the rule off, nothing is kept.
    ///
    /// Monotone: a state with higher balances stays at least as high after the same batch, and
    /// leaving a batch out never lowers what follows. So a backup that checks a pre-prepare
    /// against the batches it knows before it (a subset of what the primary proposed) is never
    /// stricter than an honest primary that proposed by the same rule.
    pub(crate) fn apply(&mut self, rule: &Rule, proposal: &Proposal) -> Option<ReplicaId> {
        if !rule.enabled() || proposal.is_null() {
            return None;
        }
        self.advance(rule, proposal.time);
        let mut broken = None;
        for request in &proposal.requests {
            if !self.take(rule, request) && broken.is_none() {
                broken = Some(request.origin);
            }
        }
        broken
    }

    /// Whether this state could be an honest replica's: known origins, no balance above the
    /// bucket.
    pub(crate) fn plausible(&self, rule: &Rule, n: u16) -> bool {
        self.balances.iter().all(|(origin, balance)| *origin < n && *balance <= rule.bucket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(origin: ReplicaId, number: u64, payload: usize) -> Request {
        Request { origin, client: 1, number, payload: vec![0; payload] }
    }

    fn rule() -> Rule {
        let mut config = Config::new(4, 0);
        config.batch_max_bytes = 4096;
        config.max_origin_bytes_per_sec = 1024;
        config.min_request_charge = 512;
        Rule::new(&config)
    }

    #[test]
    fn small_requests_pay_the_minimum_and_the_bucket_refills_by_batch_time() {
        let rule = rule();
        let mut budgets = OriginBudgets::default();
        // Eight tiny requests empty a 4096-byte bucket at 512 each; the ninth breaks the rule.
        let batch = Proposal { time: Time(1_000_000), requests: (1..=9).map(|i| request(1, i, 10)).collect() };
        assert_eq!(budgets.apply(&rule, &batch), Some(1));
        assert_eq!(budgets.balance(&rule, 1), -512);
        assert_eq!(budgets.balance(&rule, 2), 4096, "other origins untouched");
        // One second later 1024 bytes are back: two requests go, a third breaks it.
        let later = Proposal { time: Time(2_000_000), requests: vec![request(1, 10, 10), request(2, 1, 10)] };
        assert_eq!(budgets.apply(&rule, &later), None);
        assert_eq!(budgets.balance(&rule, 1), 0);
        let again = Proposal { time: Time(2_000_001), requests: vec![request(1, 11, 10)] };
        assert_eq!(budgets.apply(&rule, &again), Some(1));
        // Refilled balances stop at the bucket and are forgotten there.
        budgets.advance(&rule, Time(100_000_000));
        assert!(budgets.balances.is_empty());
    }

    #[test]
    fn leaving_a_batch_out_is_never_stricter() {
        let rule = rule();
        let batches: Vec<Proposal> =
            (0..6u64).map(|i| Proposal { time: Time(1_000_000 + i * 300_000), requests: (0..5).map(|k| request(1, i * 5 + k, 700)).collect() }).collect();
        let mut full = OriginBudgets::default();
        for batch in &batches {
            full.apply(&rule, batch);
        }
        for skip in 0..batches.len() - 1 {
            let mut partial = OriginBudgets::default();
            for (i, batch) in batches.iter().enumerate() {
                if i != skip {
                    partial.apply(&rule, batch);
                }
            }
            assert!(partial.balance(&rule, 1) >= full.balance(&rule, 1), "skipping batch {skip}");
        }
    }
}
