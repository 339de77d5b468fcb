//! Shutdown never hangs (issue 29, point 7).
//!
//! The executor's timer task checked the mode, then subscribed to it: a stop landing in
//! between counted as seen, its `changed()` never fired, and `shutdown()` waited for the
//! timer task forever. A procedure that retries every millisecond keeps the timer task
//! turning, so repeated shutdowns land in that window.

mod common;

use common::{Counter, CounterState, Ledger, TestStore};
use procflow::executor::{Config, RetryPolicy, Status};
use std::time::Duration;

/// Retries every millisecond, forever.
fn every_millisecond() -> RetryPolicy {
    RetryPolicy {
        initial: Duration::from_millis(1),
        multiplier: 1.0,
        max_delay: Duration::from_millis(1),
        max_attempts: u32::MAX,
        jitter: 0.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p7_shutdown_never_hangs_while_a_procedure_retries_every_millisecond() {
    const ROUNDS: u64 = 400;
    let config = Config {
        retry: every_millisecond(),
        ..Config::default()
    };
    for round in 0..ROUNDS {
        let ledger = Ledger::default();
        let store = TestStore::memory();
        let executor = store
            .builder(&ledger)
            .config(config.clone())
            .register::<CounterState>()
            .start()
            .await
            .unwrap();
        let counter = Counter {
            fail_at: Some(1),
            transient: u32::MAX,
            ..Counter::named("busy")
        };
        let id = executor.submit(counter).await.unwrap();
        // Land the stop at a different moment of the retry cycle each round.
        tokio::time::sleep(Duration::from_micros(round % 13 * 150)).await;
        tokio::time::timeout(Duration::from_secs(10), executor.shutdown())
            .await
            .unwrap_or_else(|_| panic!("shutdown hung in round {round} of {ROUNDS}"))
            .unwrap();
        // It was retrying, not done: the shutdown interrupted a live procedure.
        let status = executor.state(id).map(|info| info.status);
        assert!(
            !matches!(status, Some(Status::Succeeded)),
            "round {round}: {status:?}"
        );
    }
}
