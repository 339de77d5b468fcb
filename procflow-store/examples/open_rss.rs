//! Opens an existing `WalStore` directory and reports what recovery costs on its own: the
//! time `WalStore::open` takes and the process's resident memory once it returns, against
//! the bytes of the live values it holds. Issue 16 item 3 measured the store's share of
//! the memory after a restart with it (docs/BENCHMARKS.md).
//!
//! ```text
//! cargo run --release -p procflow-store --example open_rss -- DIR
//! ```
//!
//! `DIR` is a log such as the one `cargo bench --bench compare -- --cell restart:N`
//! generates. The store is opened as a restarting process would (default, durable
//! configuration), so a torn tail would be cut; nothing else is written.

use std::time::Instant;

use procflow_store::{Store, WalConfig, WalStore};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: open_rss DIR")?;
    let runtime = tokio::runtime::Runtime::new()?;
    let before = status_kib("VmRSS:")?;
    let start = Instant::now();
    let store = WalStore::open(&dir, WalConfig::default())?;
    let open = start.elapsed();
    // Read before anything else allocates: this is the store's own memory.
    let rss = status_kib("VmRSS:")? - before;
    let peak = status_kib("VmHWM:")? - before;
    let stats = store.stats();
    let records = runtime.block_on(store.list())?;
    let unfinished = records.iter().filter(|r| !r.finished).count();
    let value_bytes: usize = records.iter().map(|r| r.value_len).sum();
    let mb = |kib: u64| kib as f64 * 1024.0 / 1e6;
    println!(
        "open {:.3} s; {} segments, {:.1} MB on disk; {} records ({unfinished} unfinished), \
         values {:.1} MB; RSS +{:.1} MB (peak +{:.1} MB): {:.2}x the values",
        open.as_secs_f64(),
        stats.segments,
        stats.disk_bytes as f64 / 1e6,
        records.len(),
        value_bytes as f64 / 1e6,
        mb(rss),
        mb(peak),
        (rss * 1024) as f64 / value_bytes.max(1) as f64,
    );
    runtime.block_on(store.close())?;
    Ok(())
}

/// A `kB` field of `/proc/self/status`, such as `VmRSS:`.
fn status_kib(field: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let value = status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .ok_or_else(|| format!("no {field} in /proc/self/status"))?;
    Ok(value.trim().trim_end_matches("kB").trim().parse()?)
}
