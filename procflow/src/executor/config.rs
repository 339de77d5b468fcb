//! How an executor runs: workers, limits, retries, retention.

use std::time::Duration;

/// The executor's settings. Every field has a default ([`Config::default`]); set the ones
/// you need with struct update syntax.
///
/// ```
/// use procflow::executor::{Config, RetryPolicy};
///
/// let config = Config {
///     workers: 4,
///     retry: RetryPolicy { max_attempts: 3, ..RetryPolicy::default() },
///     ..Config::default()
/// };
/// assert_eq!(config.max_running, 10_000);
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    /// How many steps may execute at the same moment. Procedures waiting (for children,
    /// an event, a timer, a lock or a retry) hold no worker. Default: 16.
    pub workers: usize,
    /// How many root procedures may run at once. A procedure that waits — for an event,
    /// its children, a lock, a retry's backoff or a timeout — is dormant: it has no task
    /// and gives its slot back (keeping its locks), so a million waiting procedures do
    /// not keep new ones from running. Once it can go on it queues for a slot again, first
    /// come, first served with new submits. Children take no slot: they run on their
    /// root's behalf. Default: 10 000.
    pub max_running: usize,
    /// How many root procedures may wait for a running slot (submitted, or roused from
    /// dormancy); a submit beyond it fails with
    /// [`SubmitError::QueueFull`](crate::executor::SubmitError::QueueFull). Dormant
    /// procedures do not count. Default: 100 000.
    pub queue_capacity: usize,
    /// Retries of a step that failed with a retryable error (and of any step past a point
    /// of no return). Default: [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// Retries of a rollback step that failed. When they are spent the procedure ends
    /// [`Failed`](crate::Phase::Failed), keeping the original error. Default: 10 attempts,
    /// otherwise as [`RetryPolicy::default`].
    pub rollback_retry: RetryPolicy,
    /// How long a finished procedure (outcome and step history) stays queryable before it
    /// is deleted from the store, with its nonce. Default: 15 minutes.
    pub retention: Duration,
    /// How often finished procedures past their retention are looked for. Default: 10 s.
    pub cleanup_interval: Duration,
    /// The most finished procedures kept at once. Past it, the ones that ended first are
    /// deleted before their [`retention`](Self::retention) is over: the cleanup runs as
    /// soon as the count passes the limit by a sixteenth, not at its next interval, so
    /// memory and the store stay bounded at any rate of procedures. (With the default
    /// 15 minutes and 1,000 procedures ending a second, retention alone would keep
    /// 900,000.) A finished procedure in the tree of a live root is kept whatever the
    /// count: an ancestor may still roll back and undo it. A deleted procedure is gone as
    /// after its retention: [`Executor::wait`](super::Executor::wait) and
    /// [`Executor::state`](super::Executor::state) no longer find it. Default: 100 000.
    pub retention_limit: usize,
    /// How many entries of its step history each stored procedure keeps (the newest; the
    /// record counts the ones it dropped). Each entry adds about 15 bytes to every write
    /// of the procedure; 0 keeps none. Default: 32.
    pub history: usize,
    /// How often the store is read for operator requests another process left in it
    /// ([`leave_request`](crate::operator::leave_request): a tool or service sharing an
    /// etcd store); `None` never reads them while running. Requests through
    /// [`Executor::request`](super::Executor::request), and those found at start, do not
    /// wait for it. A WAL store is locked by its executor, so nothing else writes there;
    /// reading its few request keys costs next to nothing. Default: 1 s.
    pub request_poll: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            workers: 16,
            max_running: 10_000,
            queue_capacity: 100_000,
            retry: RetryPolicy::default(),
            rollback_retry: RetryPolicy {
                max_attempts: 10,
                ..RetryPolicy::default()
            },
            retention: Duration::from_secs(15 * 60),
            cleanup_interval: Duration::from_secs(10),
            retention_limit: 100_000,
            history: 32,
            request_poll: Some(Duration::from_secs(1)),
        }
    }
}

/// Exponential backoff with jitter, and a budget of attempts per step.
///
/// The wait before retry `n` (from 1) is `initial × multiplier^(n-1)`, capped at
/// `max_delay`, then moved by up to `±jitter` of itself so that procedures failing
/// together do not retry together.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// The first wait. Default: 100 ms.
    pub initial: Duration,
    /// The factor between two consecutive waits. Default: 2.
    pub multiplier: f64,
    /// The longest wait. Default: 10 s.
    pub max_delay: Duration,
    /// How many times one step may fail before the failure counts as fatal (a point of no
    /// return retries without limit). Counted per step, not per procedure. Default: 10.
    pub max_attempts: u32,
    /// The share of each wait that is randomised, from 0 to 1. Default: 0.2.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            multiplier: 2.0,
            max_delay: Duration::from_secs(10),
            max_attempts: 10,
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `attempt` (1 for the first retry).
    #[must_use]
    pub fn delay(&self, attempt: u32) -> Duration {
        let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = base.min(self.max_delay.as_secs_f64());
        let jitter = self.jitter.clamp(0.0, 1.0) * capped * (fastrand::f64() * 2.0 - 1.0);
        Duration::from_secs_f64((capped + jitter).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let policy = RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        assert_eq!(policy.delay(1), Duration::from_millis(100));
        assert_eq!(policy.delay(4), Duration::from_millis(800));
        assert_eq!(policy.delay(30), Duration::from_secs(10));
        assert_eq!(policy.delay(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn jitter_stays_within_its_share() {
        let policy = RetryPolicy::default();
        for _ in 0..1000 {
            let d = policy.delay(2).as_secs_f64();
            assert!((0.16..=0.24).contains(&d), "{d}");
        }
    }
}
