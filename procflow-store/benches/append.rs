//! Append throughput of `WalStore` with durable commits, beside a raw write+fdatasync loop
//! on the same disk.
//!
//! `cargo bench -p procflow-store` runs every cell for 2 s; add `-- --quick` for 0.3 s.
//! Writers commit one-op batches (a `Put` of a fixed-size value) as fast as they can;
//! "records/fsync" is commits divided by the fsyncs group commit made.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use procflow_store::{Batch, Store, WalConfig, WalStore};

const WRITERS: [u64; 3] = [1, 16, 256];
const SIZES: [usize; 2] = [64, 1024];

/// Writes `size`-byte records with an `fdatasync` after each, for `duration`.
fn raw_loop(dir: &Path, size: usize, duration: Duration) -> f64 {
    let path = dir.join(format!("raw-{size}"));
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("open raw file");
    let record = vec![0xA5; size];
    let start = Instant::now();
    let mut count = 0u64;
    while start.elapsed() < duration {
        file.write_all(&record).expect("write");
        file.sync_data().expect("fdatasync");
        count += 1;
    }
    count as f64 / start.elapsed().as_secs_f64()
}

/// Runs `writers` concurrent committers for `duration`; returns (commits/s, records/fsync).
async fn store_cell(dir: &Path, writers: u64, size: usize, duration: Duration) -> (f64, f64) {
    let store = Arc::new(WalStore::open(dir, WalConfig::default()).expect("open store"));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            let (store, done) = (store.clone(), done.clone());
            tokio::spawn(async move {
                let value = vec![writer as u8; size];
                while start.elapsed() < duration {
                    store
                        .commit(Batch::new().put(writer, None, value.clone()))
                        .await
                        .expect("commit");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer task");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let stats = store.stats();
    store.close().await.expect("close");
    let commits = done.load(Ordering::Relaxed) as f64;
    (
        commits / elapsed,
        commits / (stats.group_syncs.max(1)) as f64,
    )
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let duration = Duration::from_millis(if quick { 300 } else { 2000 });
    let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(512)
        .build()
        .expect("runtime");

    println!(
        "WalStore append benchmark, SyncMode::Durable, {} ms per cell, in {}",
        duration.as_millis(),
        base.path().display()
    );
    println!();
    println!("| writers | record | appends/s | records/fsync |");
    println!("| ---: | ---: | ---: | ---: |");
    for size in SIZES {
        let raw = raw_loop(base.path(), size, duration);
        println!("| raw write+fdatasync | {size} B | {raw:.0} | 1 |");
        for writers in WRITERS {
            let dir = base.path().join(format!("store-{writers}-{size}"));
            let (rate, per_sync) = runtime.block_on(store_cell(&dir, writers, size, duration));
            println!("| {writers} | {size} B | {rate:.0} | {per_sync:.1} |");
        }
    }
}
