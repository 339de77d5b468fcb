//! An unknown outcome is never reported as a refusal (issue 29, point 8).
//!
//! A store write whose answer is lost (an etcd transaction that timed out, a WAL fsync
//! that failed after the write) may or may not have applied. A submit that ends so says
//! "may have been stored" (`SubmitError::MaybeStored`), never a plain refusal: a caller
//! that retried a refusal without a nonce would run the work twice. Retried with the same
//! nonce, it finds the procedure the first write stored, and the work runs once.

mod common;

use common::{Bounded, Counter, CounterState, Hooked, Ledger, TestStore};
use procflow::executor::{ExecutorError, Outcome, SubmitError, SubmitOptions};
use procflow_store::{Limits, MemStore, Store, StoreError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Applies each batch to a `MemStore`, then, once `armed`, reports the next one failed,
/// as a store whose answer was lost after the write landed.
fn applies_then_fails(armed: Arc<AtomicBool>) -> Hooked {
    Hooked::new(MemStore::new(), move |inner, batch| {
        let armed = Arc::clone(&armed);
        Box::pin(async move {
            inner.commit(batch).await?;
            if armed.swap(false, Ordering::SeqCst) {
                return Err(StoreError::Io {
                    context: "committing (the answer was lost)",
                    path: "test".into(),
                    source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                });
            }
            Ok(())
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p8_a_submit_whose_write_may_have_applied_says_so_and_a_retry_with_its_nonce_runs_it_once()
{
    let armed = Arc::new(AtomicBool::new(false));
    let ledger = Ledger::default();
    let test_store = TestStore::with(Arc::new(applies_then_fails(Arc::clone(&armed))));
    let first = test_store
        .builder(&ledger)
        .register::<CounterState>()
        .start()
        .await
        .unwrap();
    armed.store(true, Ordering::SeqCst);
    let options = || SubmitOptions::default().nonce("order-7");
    let err = first
        .submit_with(Counter::named("c"), options())
        .await
        .unwrap_err();
    let SubmitError::MaybeStored { id, source } = &err else {
        panic!("reported as {err:?}, not as possibly stored");
    };
    assert!(matches!(source, ExecutorError::Store(_)), "{source:?}");
    assert!(err.to_string().contains("same nonce"), "{err}");
    // The store failure stopped the executor, as every store failure does.
    assert!(first.halted().is_some());
    first.shutdown().bounded().await.ok();

    // A new executor on the same store: the retry with the nonce finds the procedure.
    let second = test_store
        .builder(&ledger)
        .register::<CounterState>()
        .start()
        .await
        .unwrap();
    let again = second
        .submit_with(Counter::named("c"), options())
        .await
        .unwrap();
    assert_eq!(again, *id, "the nonce found the one the lost write stored");
    assert_eq!(
        second.wait(again).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    for step in 1..=4 {
        assert_eq!(ledger.count(&format!("c execute {step}")), 1, "step {step}");
    }
    assert_eq!(second.list().len(), 1, "one procedure, not two");
    second.shutdown().bounded().await.unwrap();
}

/// A refusal stays a refusal: nothing was stored, and the error says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p8_a_refused_submit_is_reported_as_a_refusal() {
    let store = TestStore::memory_with_limits(Limits {
        max_value_bytes: Some(1024),
        ..Limits::default()
    });
    let ledger = Ledger::default();
    let executor = store
        .builder(&ledger)
        .register::<CounterState>()
        .start()
        .await
        .unwrap();
    let err = executor
        .submit(Counter::named(&"far too long a name to fit ".repeat(64)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SubmitError::Executor(ExecutorError::Rejected(_))),
        "{err:?}"
    );
    assert!(store.store.load().await.unwrap().records.is_empty());
    executor.shutdown().bounded().await.unwrap();
}
