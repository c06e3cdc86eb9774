//! The replica's essential tasks, owned in one place: the first one that ends (returns, fails
//! or panics) is reported by name with its reason, and `run` stops the replica with an error
//! (a non-zero exit), for systemd or Docker to start it again. A replica whose executor died
//! must not go on taking client requests that nothing executes.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::task::{Id, JoinSet};

/// The tasks a replica cannot run without. Dropping it aborts every task still running.
#[derive(Default)]
pub struct Essential {
    set: JoinSet<Result<(), String>>,
    names: HashMap<Id, &'static str>,
}

/// Which essential task is no longer running, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    pub task: &'static str,
    pub why: String,
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "essential task `{}` {}", self.task, self.why)
    }
}

impl std::error::Error for Ended {}

/// What a task's result says about how it ended.
pub trait Outcome {
    fn into_outcome(self) -> Result<(), String>;
}

impl Outcome for () {
    fn into_outcome(self) -> Result<(), String> {
        Ok(())
    }
}

impl<E: fmt::Display> Outcome for Result<(), E> {
    fn into_outcome(self) -> Result<(), String> {
        self.map_err(|e| e.to_string())
    }
}

impl Essential {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `task` as the essential task `name`; it is meant to run as long as the replica.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future + Send + 'static,
        F::Output: Outcome,
    {
        let handle = self.set.spawn(async move { task.await.into_outcome() });
        self.names.insert(handle.id(), name);
    }

    /// Watches a part that owns its tasks itself (the mesh, named's supervisor, a signing
    /// socket): `stopped` is asked every `every`, and the first `true` ends the watch as a
    /// failure of `name`.
    pub fn watch(&mut self, name: &'static str, every: Duration, stopped: impl Fn() -> bool + Send + 'static) {
        self.spawn(name, async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if stopped() {
                    return Err("stopped (its task ended or panicked)");
                }
            }
        });
    }

    /// How many essential tasks were started and have not been reported ended.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Waits for the first essential task to end and says which and why. Without tasks it
    /// never returns.
    pub async fn ended(&mut self) -> Ended {
        let Some(joined) = self.set.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let (id, why) = match joined {
            Ok((id, Ok(()))) => (id, "returned (it should run as long as the replica)".to_string()),
            Ok((id, Err(e))) => (id, format!("failed: {e}")),
            Err(e) if e.is_panic() => {
                let id = e.id();
                let payload = e.into_panic();
                let message = payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned());
                (id, format!("panicked: {}", message.unwrap_or_else(|| "(no message)".into())))
            }
            Err(e) => (e.id(), "was cancelled".to_string()),
        };
        Ended { task: self.names.remove(&id).unwrap_or("(unnamed)"), why }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn forever() -> impl Future<Output = ()> + Send + 'static {
        std::future::pending()
    }

    #[tokio::test]
    async fn the_first_task_that_returns_is_named() {
        let mut tasks = Essential::new();
        tasks.spawn("gateway", forever());
        tasks.spawn("executor", async { tokio::time::sleep(Duration::from_millis(20)).await });
        tasks.spawn("listener", forever());
        let ended = tokio::time::timeout(Duration::from_secs(10), tasks.ended()).await.expect("the executor's end is seen");
        assert_eq!(ended, Ended { task: "executor", why: "returned (it should run as long as the replica)".into() });
        assert_eq!(ended.to_string(), "essential task `executor` returned (it should run as long as the replica)");
        assert_eq!(tasks.len(), 2, "the others still run");
    }

    #[tokio::test]
    async fn failures_and_panics_say_why() {
        let mut tasks = Essential::new();
        tasks.spawn("metrics endpoint", async { Err::<(), _>(std::io::Error::other("address in use")) });
        let ended = tasks.ended().await;
        assert_eq!((ended.task, ended.why.as_str()), ("metrics endpoint", "failed: address in use"));

        tasks.spawn("state transfer", async {
            let peers: Vec<u16> = Vec::new();
            if peers.is_empty() {
                panic!("no peer {}", 7);
            }
        });
        let ended = tasks.ended().await;
        assert_eq!((ended.task, ended.why.as_str()), ("state transfer", "panicked: no peer 7"));
        fn boom() {
            panic!("static message")
        }
        tasks.spawn("static panic", async { boom() });
        assert_eq!(tasks.ended().await.why, "panicked: static message");
    }

    #[tokio::test]
    async fn dropping_the_set_stops_the_tasks() {
        let alive = Arc::new(());
        let mut tasks = Essential::new();
        let held = alive.clone();
        tasks.spawn("holder", async move {
            let _held = held;
            std::future::pending::<()>().await
        });
        tokio::task::yield_now().await;
        assert_eq!(Arc::strong_count(&alive), 2);
        drop(tasks);
        for _ in 0..100 {
            if Arc::strong_count(&alive) == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the task outlived its set");
    }

    #[tokio::test]
    async fn a_watched_part_that_stops_is_named() {
        let mut tasks = Essential::new();
        let stopped = Arc::new(AtomicBool::new(false));
        let flag = stopped.clone();
        tasks.watch("mesh", Duration::from_millis(5), move || flag.load(Ordering::Relaxed));
        assert!(tokio::time::timeout(Duration::from_millis(50), tasks.ended()).await.is_err(), "running: no end");
        stopped.store(true, Ordering::Relaxed);
        let ended = tokio::time::timeout(Duration::from_secs(10), tasks.ended()).await.expect("seen");
        assert_eq!(ended, Ended { task: "mesh", why: "failed: stopped (its task ended or panicked)".into() });
    }

    #[tokio::test]
    async fn no_task_never_ends() {
        let mut tasks = Essential::new();
        assert!(tasks.is_empty());
        assert!(tokio::time::timeout(Duration::from_millis(50), tasks.ended()).await.is_err());
    }
}
