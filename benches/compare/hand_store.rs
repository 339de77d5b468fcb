//! Workload 4's second baseline: the same handlers driven by hand, persisting every step's
//! state to a procflow `Store` (a `MemStore` in the bench) as a user without the executor
//! would. Against the executor on the same store, the ratio is what the executor itself
//! adds: the bookkeeping around each step, not the writes both make.

use crate::drive::{Rate, closed_loop};
use crate::machine::{Payload, TenSteps, drive, encode};
use procflow::{Context, ProcedureId, StateMachine};
use procflow_store::{Batch, Store};
use std::sync::Arc;
use std::time::Duration;

/// Runs `clients` closed-loop clients on `store`: each procedure's initial state is
/// committed before its first step, its state after every step (each with a
/// `yield_now`, so procedures interleave as on the executor), and its record is deleted
/// once it ends.
pub async fn closed_loop_on_store(store: Arc<dyn Store>, clients: u64, duration: Duration) -> Rate {
    let env = Arc::new(());
    closed_loop(clients, duration, move |client, n| {
        let id = client << 32 | n;
        let ctx = Context::new(ProcedureId::new(id), Arc::clone(&env));
        let store = Arc::clone(&store);
        async move {
            let mut payload = Payload::new(id);
            let first = encode(TenSteps::INITIAL, &payload);
            commit(&store, Batch::new().put(id, None, first)).await;
            let steps = drive(&mut payload, &ctx, |state, payload| {
                let (store, value) = (Arc::clone(&store), encode(state, payload));
                async move {
                    commit(&store, Batch::new().put(id, None, value)).await;
                    tokio::task::yield_now().await;
                }
            })
            .await;
            commit(&store, Batch::new().delete(id)).await;
            steps
        }
    })
    .await
}

async fn commit(store: &Arc<dyn Store>, batch: Batch) {
    store.commit(batch).await.expect("commit");
}
