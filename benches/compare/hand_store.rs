//! Workload 4's second baseline: the same handlers driven by hand, persisting every step's
//! state to a procflow `Store` (a `MemStore` in the bench) as a user without the executor
//! would. Against the executor on the same store, the ratio is what the executor itself
//! adds: the bookkeeping around each step, not the writes both make.

use crate::drive::{Ids, Rate, Write, hand_persisting_loop};
use crate::machine::STATE_BYTES;
use procflow_store::{Batch, Store};
use std::sync::Arc;
use std::time::Duration;

/// Runs `clients` closed-loop clients on `store`: each procedure's initial state is
/// committed before its first step, its state after every step (each with a
/// `yield_now`, so procedures interleave as on the executor), and its record is deleted
/// once it ends.
pub async fn closed_loop_on_store(store: Arc<dyn Store>, clients: u64, duration: Duration) -> Rate {
    closed_loop_yielding(store, clients, duration, true).await
}

/// `--cell hand-wal:N`: the same loop on a durable `WalStore`, whose commits suspend
/// their task already, so without the `yield_now`. Each client is a task that runs one
/// procedure after another, holding nothing but the handlers' state: about the least a
/// durable step can be made of, to set beside the executor's on the same store
/// (docs/BENCHMARKS.md, "Issue 33 in stop 62").
pub async fn closed_loop_durable(store: Arc<dyn Store>, clients: u64, duration: Duration) -> Rate {
    closed_loop_yielding(store, clients, duration, false).await
}

async fn closed_loop_yielding(
    store: Arc<dyn Store>,
    clients: u64,
    duration: Duration,
    yields: bool,
) -> Rate {
    let shape = Shape::from_args();
    // Finished records kept: numbered as the executor numbers procedures, so that they
    // pile up behind the live ones, not among them.
    let ids = if shape.keep {
        Ids::Sequential
    } else {
        Ids::PerClient
    };
    hand_persisting_loop(clients, duration, ids, move |id, write| {
        let store = Arc::clone(&store);
        async move {
            let step = matches!(write, Write::Step(_));
            let batch = match write {
                Write::Initial(mut value) | Write::Step(mut value) => {
                    value.resize(value.len() + shape.pad, 0);
                    Batch::new().put(id, None, value)
                }
                Write::End if shape.keep => {
                    Batch::new().finish(id, vec![0; STATE_BYTES + shape.pad])
                }
                Write::End => Batch::new().delete(id),
            };
            store.commit(batch).await.expect("commit");
            if step && yields {
                tokio::task::yield_now().await;
            }
        }
    })
    .await
}

/// What the hand loops write, from the command line: by default the handlers' state
/// alone, deleted when the procedure ends. The executor writes more: each record carries
/// the step history (`--history`), and a finished procedure stays in the store for
/// `Config::retention`. These two flags give the hand loops as much, to tell what each
/// costs a durable step apart from the executor (docs/BENCHMARKS.md, "Issue 33 in stop
/// 62").
#[derive(Clone, Copy)]
struct Shape {
    /// `--pad BYTES`: bytes added to every value written.
    pad: usize,
    /// `--keep-finished`: a procedure's end finishes its record (`Op::Finish`) instead of
    /// deleting it, so finished records pile up as the executor's do (and procedures are
    /// numbered in one sequence, as the executor's are).
    keep: bool,
}

impl Shape {
    fn from_args() -> Self {
        Shape {
            pad: crate::flag_value("--pad", "--pad BYTES").unwrap_or(0),
            keep: std::env::args().any(|arg| arg == "--keep-finished"),
        }
    }
}
