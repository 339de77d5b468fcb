//! `--cell batch-wal:N` and `--cell batch-mem:N`: the ten-step machine's handlers driven
//! the way HBase's procedure workers drive theirs, as a bound for a redesign of the
//! executor (docs/BENCHMARKS.md, "Issue 33 in stop 68").
//!
//! One task per worker thread owns its share of the `N` procedures as plain data (state,
//! payload, context). Each round it runs one step of every procedure it owns, puts every
//! new state into one batch and commits that batch: one commit and one suspension per
//! round, not one per step. A procedure that ends is deleted in the same batch and
//! replaced by a new one, so `N` stay in flight as in the closed loops.
//!
//! Against the executor on a `MemStore` (`mem:N`), it tells whether the durable store or
//! what the executor does around a step holds `wal1024_vs_mem` down: if this loop on the
//! write-ahead log outruns the executor on a `MemStore`, the log is not the limit.
//! `-- --pad BYTES` adds bytes to every value, to write as much as the executor's records
//! (which carry the step history) do; `-- --keep-finished` finishes an ended procedure's
//! record (`Op::Finish`, kept for good) instead of deleting it, as the executor keeps
//! finished procedures for `Config::retention`.

use crate::machine::{Payload, TenSteps, encode};
use procflow::prelude::*;
use procflow_store::{Batch, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One procedure owned by a round's task.
struct Owned {
    id: u64,
    state: TenSteps,
    payload: Payload,
    ctx: Context<()>,
}

impl Owned {
    fn new(id: u64, env: &Arc<()>) -> Self {
        Owned {
            id,
            state: TenSteps::INITIAL,
            payload: Payload::new(id),
            ctx: Context::new(ProcedureId::new(id), Arc::clone(env)),
        }
    }

    /// The value its record holds now.
    fn value(&self, pad: usize) -> Vec<u8> {
        let mut value = encode(self.state, &self.payload);
        value.resize(value.len() + pad, 0);
        value
    }
}

/// Runs `clients` procedures for `duration` in rounds, one task per worker thread of
/// the runtime (fewer if there are fewer procedures); returns the steps taken and the
/// steps per second.
pub async fn rounds_on_store(
    store: Arc<dyn Store>,
    clients: u64,
    duration: Duration,
) -> (u64, f64) {
    let pad = crate::flag_value("--pad", "--pad BYTES").unwrap_or(0);
    let keep_finished = std::env::args().any(|arg| arg == "--keep-finished");
    assert!(
        clients > 0,
        "--cell batch-wal:N and batch-mem:N need N of 1 or more"
    );
    // No task without a procedure: it would commit empty batches in a busy loop.
    let workers = tokio::runtime::Handle::current().metrics().num_workers() as u64;
    let tasks = workers.min(clients).max(1);
    let start = Instant::now();
    let deadline = start + duration;
    let rounds: Vec<_> = (0..tasks)
        .map(|task| {
            let owned = clients / tasks + u64::from(task < clients % tasks);
            // Ids apart per task, as the hand loops number theirs per client.
            let first = (task << 40) + 1;
            tokio::spawn(rounds_of_one_task(
                Arc::clone(&store),
                first,
                owned,
                (pad, keep_finished),
                deadline,
            ))
        })
        .collect();
    let mut steps = 0;
    for task in rounds {
        steps += task.await.expect("a round's task panicked");
    }
    (steps, steps as f64 / start.elapsed().as_secs_f64())
}

/// One task's rounds over `owned` procedures numbered from `first`, each value `pad`
/// bytes longer, ended procedures finished (`keep_finished`) or deleted; returns its
/// steps.
async fn rounds_of_one_task(
    store: Arc<dyn Store>,
    first: u64,
    owned: u64,
    (pad, keep_finished): (usize, bool),
    deadline: Instant,
) -> u64 {
    let env = Arc::new(());
    let mut next_id = first;
    let mut fresh = || {
        next_id += 1;
        Owned::new(next_id - 1, &env)
    };
    let mut procedures: Vec<Owned> = (0..owned).map(|_| fresh()).collect();
    let initial = procedures.iter().fold(Batch::new(), |batch, procedure| {
        batch.put(procedure.id, None, procedure.value(pad))
    });
    store.commit(initial).await.expect("commit");
    let mut steps = 0;
    while Instant::now() < deadline {
        let mut batch = Batch::new();
        for procedure in &mut procedures {
            procedure.state = match procedure
                .state
                .execute_from_state(&mut procedure.payload, &procedure.ctx)
                .await
            {
                Ok(Flow::Next(next)) => next,
                Ok(_) => unreachable!("the bench machine's handlers only move on"),
                Err(error) => panic!("step {:?} failed: {error}", procedure.state),
            };
            steps += 1;
            if procedure.state.is_terminal() {
                batch = if keep_finished {
                    batch.finish(procedure.id, procedure.value(pad))
                } else {
                    batch.delete(procedure.id)
                };
                *procedure = fresh();
            }
            batch = batch.put(procedure.id, None, procedure.value(pad));
        }
        store.commit(batch).await.expect("commit");
    }
    steps
}
