//! Workload 7: disk use after churn. Long-lived idle procedures are submitted first, so
//! their records sit in the oldest segments; then many short procedures churn through a
//! WAL with small segments. A log that cannot move the idle records forward (HBase's
//! WAL procedure store, before its fix) keeps every segment since the oldest idle one;
//! `WalStore`'s compaction should keep disk use within twice the live data plus one
//! segment.

use crate::parked::{self, FiveUpdates};
use procflow::executor::Executor;
use procflow_store::{SyncMode, WalConfig, WalStore};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::runtime::Runtime;

/// Small segments, so the churn rolls and compacts the log many times.
const SEGMENT_SIZE: u64 = 1 << 20;

/// Concurrent clients running the procedures.
const CLIENTS: u64 = 256;

/// How often the store's counters are sampled during the churn.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// Long-lived idle procedures, and short procedures churned after them.
fn counts(quick: bool) -> (u64, u64) {
    if quick {
        (1_000, 10_000)
    } else {
        (10_000, 100_000)
    }
}

/// The store's own counters at one moment.
#[derive(Clone, Copy, Default)]
struct Sample {
    disk: u64,
    live: u64,
}

impl Sample {
    /// Whether the disk use is within twice the live bytes plus one segment.
    fn within_bound(&self) -> bool {
        self.disk <= bound(self.live)
    }
}

/// The most disk the log may use for `live` bytes of live data: twice the live data
/// (compaction's ratio) plus the active segment.
fn bound(live: u64) -> u64 {
    2 * live + SEGMENT_SIZE
}

/// Runs workload 7 in `base/disk-use` on the executor (durable WAL, 1 MiB segments) and
/// prints its table.
pub fn run(quick: bool, runtime: &Runtime, base: &Path) {
    let dir = base.join("disk-use");
    let (idle, churned) = counts(quick);
    let config = WalConfig {
        segment_size: SEGMENT_SIZE,
        sync: SyncMode::Durable,
        ..WalConfig::default()
    };
    let store = Arc::new(WalStore::open(&dir, config).expect("open WAL"));
    let (peak, worst, end, segments) = runtime.block_on(async {
        let executor = Executor::builder(store.clone(), ())
            .register::<FiveUpdates>()
            .config(parked::config(idle))
            .start()
            .await
            .expect("start the executor");
        parked::populate(&executor, 0, idle, CLIENTS, |_| true).await;
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = tokio::spawn(sample(Arc::clone(&store), Arc::clone(&stop)));
        parked::populate(&executor, idle, churned, CLIENTS, |_| false).await;
        parked::await_cleanup(store.as_ref(), idle).await;
        stop.store(true, Ordering::Relaxed);
        let (peak, worst) = sampler.await.expect("sampler task");
        let stats = store.stats();
        let end = Sample {
            disk: disk_bytes(&dir),
            live: stats.live_bytes,
        };
        executor.shutdown().await.expect("shutdown");
        (peak, worst, end, stats.segments)
    });
    drop(store);
    std::fs::remove_dir_all(&dir).expect("remove the workload 7 log");
    print_table(idle, churned, segments, end, peak, worst);
}

/// Samples the store's counters until `stop` is set; returns the largest disk use seen
/// and the sample with the largest disk use minus bound (the closest to the bound, or
/// the furthest over it).
async fn sample(store: Arc<WalStore>, stop: Arc<AtomicBool>) -> (Sample, Sample) {
    let (mut peak, mut worst) = (Sample::default(), Sample::default());
    let margin = |s: &Sample| s.disk as i128 - bound(s.live) as i128;
    while !stop.load(Ordering::Relaxed) {
        let stats = store.stats();
        let now = Sample {
            disk: stats.disk_bytes,
            live: stats.live_bytes,
        };
        if now.disk > peak.disk {
            peak = now;
        }
        if worst.disk == 0 || margin(&now) > margin(&worst) {
            worst = now;
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    (peak, worst)
}

/// Bytes of the segment files in `dir`, from the file system.
fn disk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read the store directory")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "wal"))
        .map(|path| path.metadata().expect("stat a segment").len())
        .sum()
}

/// Prints the end state and two samples taken during the churn against the bound.
fn print_table(idle: u64, churned: u64, segments: usize, end: Sample, peak: Sample, worst: Sample) {
    let met = |sample: &Sample| {
        if sample.within_bound() {
            "met"
        } else {
            "missed"
        }
    };
    println!();
    println!(
        "## (7) disk use after churn: {idle} idle parked procedures, then {churned} short ones (1 KiB, 5 updates, deleted at once); {} KiB segments, durable",
        SEGMENT_SIZE >> 10
    );
    println!();
    println!("| when | disk bytes | live bytes | bound: 2 × live + 1 segment | disk ≤ bound |");
    println!("| --- | ---: | ---: | ---: | --- |");
    println!(
        "| at the end ({segments} segments; disk from the files' sizes) | {} | {} | {} | {} |",
        end.disk,
        end.live,
        bound(end.live),
        met(&end)
    );
    println!(
        "| peak during the churn (WalStore::stats every {} ms) | {} | {} | {} | {} |",
        SAMPLE_EVERY.as_millis(),
        peak.disk,
        peak.live,
        bound(peak.live),
        met(&peak)
    );
    println!(
        "| worst sample during the churn (largest disk − bound) | {} | {} | {} | {} |",
        worst.disk,
        worst.live,
        bound(worst.live),
        met(&worst)
    );
}
