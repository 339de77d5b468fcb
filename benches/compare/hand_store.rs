//! Workload 4's second baseline: the same handlers driven by hand, persisting every step's
//! state to a procflow `Store` (a `MemStore` in the bench) as a user without the executor
//! would. Against the executor on the same store, the ratio is what the executor itself
//! adds: the bookkeeping around each step, not the writes both make.

use crate::drive::{Rate, Write, hand_persisting_loop};
use procflow_store::{Batch, Store};
use std::sync::Arc;
use std::time::Duration;

/// Runs `clients` closed-loop clients on `store`: each procedure's initial state is
/// committed before its first step, its state after every step (each with a
/// `yield_now`, so procedures interleave as on the executor), and its record is deleted
/// once it ends.
pub async fn closed_loop_on_store(store: Arc<dyn Store>, clients: u64, duration: Duration) -> Rate {
    hand_persisting_loop(clients, duration, move |id, write| {
        let store = Arc::clone(&store);
        async move {
            let step = matches!(write, Write::Step(_));
            let batch = match write {
                Write::Initial(value) | Write::Step(value) => Batch::new().put(id, None, value),
                Write::End => Batch::new().delete(id),
            };
            store.commit(batch).await.expect("commit");
            if step {
                tokio::task::yield_now().await;
            }
        }
    })
    .await
}
