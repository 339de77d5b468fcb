//! Bounded waits for tests: an executor's `wait` or `shutdown` that hangs fails the test
//! with a message, never runs until CI kills it. Shared by procflow's tests (`common`) and
//! the workspace's (`#[path]`).

use std::future::Future;
use std::time::Duration;

/// How long a test lets an executor's `wait` or `shutdown` take before it fails: a hang
/// is a failure with a message, never a test that runs until CI kills it.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// `.bounded()` on a future: the future's output, or a panic after [`PATIENCE`].
pub trait Bounded: Future + Sized {
    fn bounded(self) -> impl Future<Output = Self::Output> {
        async move {
            tokio::time::timeout(PATIENCE, self)
                .await
                .unwrap_or_else(|_| panic!("still waiting after {PATIENCE:?}: it hangs"))
        }
    }
}

impl<F: Future> Bounded for F {}
