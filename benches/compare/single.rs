//! Workload 1 measured interleaved: the raw loop and one procedure at a time take turns
//! in short slices, so both see the same disk.
//!
//! Why: this VM's disk changes speed by 10-30 % from one second to the next (the raw
//! loop alone gives anything from 5,800 to 8,600 writes/s in consecutive one-second
//! runs). Measured one after the other, a one-second cell of each made the ratio swing
//! from 0.64 to 0.95 between runs of the same code. Alternating every `slice` puts the
//! same drift into both sides of the ratio.

use crate::drive::{Rate, alternate, run_procedures, start_executor};
use crate::raw::RawLog;
use procflow_store::{Store, WalConfig, WalStore};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;

/// The two sides of workload 1, each summed over its slices.
pub struct Interleaved {
    /// How long each side ran per round (procflow's slices end with their last
    /// procedure, a little later).
    pub slice: Duration,
    /// Raw write+fdatasync: writes, and the time they took.
    pub raw: (u64, Duration),
    /// The same into space written with zeros ahead, as the WAL writes (run right after `raw`,
    /// in the same turn).
    pub raw_preallocated: (u64, Duration),
    /// One procedure at a time on a durable `WalStore`.
    pub procflow: Rate,
    /// The store's commits and fsyncs during the procflow slices.
    pub commits: u64,
    pub syncs: u64,
    /// Each round's ratio, to show the spread the interleaving absorbs.
    pub rounds: Vec<f64>,
}

impl Interleaved {
    pub fn raw_per_sec(&self) -> f64 {
        self.raw.0 as f64 / self.raw.1.as_secs_f64()
    }

    /// Steps/s over raw writes/s: the summary's `single_vs_raw`.
    pub fn ratio(&self) -> f64 {
        self.procflow.steps_per_sec() / self.raw_per_sec()
    }

    pub fn raw_preallocated_per_sec(&self) -> f64 {
        self.raw_preallocated.0 as f64 / self.raw_preallocated.1.as_secs_f64()
    }

    /// Steps/s over the writes/s of the raw loop into preallocated space: what the
    /// executor and the WAL cost over the disk, with the WAL's preallocation taken out.
    pub fn ratio_to_preallocated(&self) -> f64 {
        self.procflow.steps_per_sec() / self.raw_preallocated_per_sec()
    }
}

/// Runs `rounds` rounds of `slice` of the raw loop (`record`-byte writes), `slice` of
/// the raw loop into preallocated space, then `slice` of one procedure at a time, in
/// `base/single`.
pub fn run(
    runtime: &Runtime,
    base: &Path,
    record: usize,
    slice: Duration,
    rounds: u32,
) -> Interleaved {
    let dir = base.join("single");
    std::fs::create_dir_all(&dir).expect("create the workload 1 directory");
    let mut raw_log = RawLog::create(&dir, record);
    let mut preallocated_log = RawLog::preallocated(&dir, record);
    let mut preallocated = (0, Duration::ZERO);
    let store = Arc::new(WalStore::open(dir.join("wal"), WalConfig::default()).expect("open WAL"));
    let dyn_store: Arc<dyn Store> = store.clone();
    runtime.block_on(async {
        let executor = start_executor(dyn_store).await;
        let before = store.stats();
        let raw_side = |slice| {
            let (writes, elapsed) = raw_log.run(slice);
            let (more, took) = preallocated_log.run(slice);
            preallocated.0 += more;
            preallocated.1 += took;
            std::future::ready(Rate {
                steps: writes,
                procedures: writes,
                elapsed,
            })
        };
        let procflow_side = |slice| run_procedures(&executor, 1, slice);
        let turns = alternate(rounds, slice, raw_side, procflow_side).await;
        let mut total = Interleaved {
            slice,
            raw: (turns.a.steps, turns.a.elapsed),
            raw_preallocated: preallocated,
            procflow: turns.b,
            commits: 0,
            syncs: 0,
            rounds: turns
                .rounds
                .iter()
                .map(|(raw, procflow)| procflow.steps_per_sec() / raw.steps_per_sec())
                .collect(),
        };
        let after = store.stats();
        total.commits = after.commits - before.commits;
        total.syncs = after.group_syncs - before.group_syncs;
        executor.shutdown().await.expect("shutdown");
        total
    })
}
