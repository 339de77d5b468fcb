//! `--cell in-flight:N`: the memory of a procedure in flight, one whose task is alive.
//!
//! N procedures are submitted on a `MemStore` and each stays in its first step's handler
//! (a future that never ends), so each keeps its task: the lane's future, its `Runner`,
//! its entry in the table, its data. The cell prints the process's resident memory
//! grown per procedure. (Parked procedures have no task: workload 6's `rss_vs_live`
//! measures those.)

use procflow::executor::Executor;
use procflow::prelude::*;
use procflow_store::MemStore;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// One step that never ends.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Stays, name = "bench_in_flight")]
pub enum InFlight {
    #[initial]
    #[transition(to = [Done])]
    Busy,
    #[terminal]
    Done,
}

/// The procedure's data: a number, so each one's record differs.
#[derive(Serialize, Deserialize)]
pub struct Stays {
    n: u64,
}

impl InFlightHandlers for Stays {
    async fn busy(&mut self, _: &Context<()>) -> Step<in_flight::Busy> {
        std::future::pending::<()>().await;
        Ok(in_flight::Busy::Done.into())
    }
}

/// Submits `n` procedures that stay in flight; returns the resident bytes grown per
/// procedure once they all run or wait for a running slot.
pub async fn bytes_per_procedure(n: u64) -> f64 {
    let executor = Executor::builder(Arc::new(MemStore::new()), ())
        .register::<InFlight>()
        .start()
        .await
        .expect("start the executor");
    let before = crate::restart::resident_bytes();
    for n in 0..n {
        executor.submit(Stays { n }).await.expect("submit");
    }
    // Every task has been polled into its handler (or its wait for a slot).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let grown = crate::restart::resident_bytes().saturating_sub(before);
    executor.kill();
    grown as f64 / n as f64
}
