//! Workload 5: HBase's store workload (its `ProcedureStorePerformanceEvaluation`), on
//! `WalStore` alone: 20 writer tasks; each procedure is an insert (a `Put` of a new id
//! with 1 KiB of state) then an update (a `Put` of the same id with new state), each
//! its own durable commit.

use procflow_store::{Batch, Store, WalConfig, WalStore};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// Writer tasks, as in HBase's evaluation.
const WRITERS: u64 = 20;

/// Bytes of state per procedure, as in HBase's evaluation.
const STATE_BYTES: usize = 1024;

/// Procedures to write (HBase's evaluation writes a million), and the time after which
/// no writer starts another: the store's speed decides whether a million fit in a full
/// run, and the table says when they did not.
fn target(quick: bool) -> (u64, Duration) {
    if quick {
        (20_000, Duration::from_secs(10))
    } else {
        (1_000_000, Duration::from_secs(180))
    }
}

/// What one run measured.
struct Figures {
    target: u64,
    budget: Duration,
    procedures: u64,
    elapsed: Duration,
    commits: u64,
    syncs: u64,
}

/// Runs workload 5 in `base/hbase-store` and prints its table.
pub fn run(quick: bool, runtime: &Runtime, base: &Path) {
    let dir = base.join("hbase-store");
    let store = Arc::new(WalStore::open(&dir, WalConfig::default()).expect("open WAL"));
    let (target, budget) = target(quick);
    let figures = runtime.block_on(write(Arc::clone(&store), target, budget));
    runtime
        .block_on(store.close())
        .expect("close the store after workload 5");
    drop(store);
    std::fs::remove_dir_all(&dir).expect("remove the workload 5 log");
    print_table(&figures);
}

/// `WRITERS` tasks take the next procedure id from a shared counter (as HBase's workers
/// do) until `target` are written or `budget` has passed.
async fn write(store: Arc<WalStore>, target: u64, budget: Duration) -> Figures {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (store, next) = (Arc::clone(&store), Arc::clone(&next));
            tokio::spawn(async move {
                let mut written = 0u64;
                while start.elapsed() < budget {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= target {
                        break;
                    }
                    // The insert, then the update with new state.
                    for version in [0u8, 1] {
                        let batch = Batch::new().put(id, None, vec![version; STATE_BYTES]);
                        store.commit(batch).await.expect("commit");
                    }
                    written += 1;
                }
                written
            })
        })
        .collect();
    let mut procedures = 0;
    for task in tasks {
        procedures += task.await.expect("writer task");
    }
    let elapsed = start.elapsed();
    let stats = store.stats();
    Figures {
        target,
        budget,
        procedures,
        elapsed,
        commits: stats.commits,
        syncs: stats.group_syncs,
    }
}

/// Prints the run's one-row table (and whether the budget cut it short).
fn print_table(f: &Figures) {
    let secs = f.elapsed.as_secs_f64();
    println!();
    println!(
        "## (5) HBase's store workload: {WRITERS} writers, insert + update of {STATE_BYTES} B per procedure, each a durable WalStore::commit"
    );
    if f.procedures < f.target {
        println!(
            "stopped at the {} s budget: {} of the {} procedures written",
            f.budget.as_secs(),
            f.procedures,
            f.target
        );
    }
    println!();
    println!("| procedures | commits | elapsed | procedures/s | commits/s | commits per fsync |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| {} | {} | {secs:.1} s | {:.0} | {:.0} | {:.1} |",
        f.procedures,
        f.commits,
        f.procedures as f64 / secs,
        f.commits as f64 / secs,
        f.commits as f64 / f.syncs.max(1) as f64,
    );
}
