//! procflow against the disk's limit and against what a user would write by hand, side by
//! side in one run (issue 6, docs/BENCHMARKS.md).
//!
//! ```text
//! cargo bench --bench compare              # full: 4 s per cell, 1/16/256/1024 concurrent
//! cargo bench --bench compare -- --quick   # 1 s per cell, the same concurrencies
//! cargo bench --bench compare -- --etcd    # workload 8 alone: procflow on etcd
//! cargo bench --bench compare -- --admin   # workload 9 alone: the admin at 1,000,000
//! cargo bench --bench compare -- --postgres  # workload 10 alone: procflow on PostgreSQL
//! ```
//!
//! Every workload runs the same ten-step machine with 64 bytes of state
//! (`compare/machine.rs`) in closed-loop clients: each client runs one procedure to its
//! end, then the next, for the cell's time. Ratios are throughput ratios to the
//! baseline measured in the same run (higher is better); the summary's ratios come from
//! sides that take turns in short slices where the drift of this VM between seconds
//! would otherwise decide them (`drive::alternate`). The last line is
//! `summary: single_vs_raw=X single_vs_prealloc=X wal256_vs_raw=X wal256_vs_redb=X
//! mem_vs_loop=X load_vs_read=X wal1024_vs_mem=X rss_vs_live=X`, `n/a` for what is not measured. `rss_vs_live` is lower
//! is better; every other ratio higher is better.
//!
//! Workloads 5 to 7 (HBase's store workload, restart, disk use after churn) run their own
//! machines and counts, in `compare/hbase_store.rs`, `restart.rs` and `disk_use.rs`; the
//! run ends by drawing the chart of workloads 1 to 3 (`compare/chart.rs`).
//!
//! For profiling, `-- --cell store:256` (or `wal:256`, `mem:256`) runs one cell alone for
//! the cell's time and prints its rate: `WalStore::commit` alone, the executor on the
//! durable WAL, or the executor on `MemStore`; `yield:256` the executor on a `MemStore`
//! whose commit suspends once, as a durable one's does (`compare/suspending.rs`);
//! `answered:256` one whose commits wait for a thread that answers them in groups, the
//! WAL's hand-off without the WAL (`compare/suspending.rs`); `nosync:256` the executor on
//! the WAL with `SyncMode::NoSync`;
//! `hand:256` is the hand loop persisting to
//! a `MemStore` (workload 4's second baseline), `hand-wal:256` the same loop on the
//! durable WAL (without its yields: a commit there suspends already); `batch-wal:1024` runs
//! one step of each of its procedures per round and commits the round's steps as one batch,
//! one task per worker (`compare/hand_batch.rs`), `batch-mem:1024` the same on a `MemStore`,
//! `batch-nosync:1024` on the WAL with `SyncMode::NoSync`; with `-- --duties` the rounds
//! also do what the executor does around a plain step (a history, a record as large,
//! shared counters, the table at the submit and the end: a compact executor's bound),
//! `-- --tasks N` runs N tasks of rounds in all instead of one per worker, and
//! `-- --affine` each on a thread of its own, `-- --clients` gives each procedure a
//! client task that submits it and waits for its end; `batch-par:1024 --duties` runs them on a
//! log they append to themselves, which one thread only syncs (`compare/parallel_log.rs`),
//! and `batch-own:1024` on the WAL with `WalConfig::caller_writes`, each round's batch
//! written by its own task; `wal-own:1024` is the executor on that WAL;
//! `raw:1` is the raw
//! write+fdatasync loop with records of a step's size. `-- --cell single:R` runs
//! workload 1 alone, interleaved in R rounds over the cell's time; `-- --cell gap:G`
//! runs the raw loop into preallocated space against the same loop kept busy for G microseconds after each
//! sync (what a pause between a sync and the next write costs: `compare/gap.rs`);
//! `-- --cell ahead:S` the raw loop of S-byte records into space written with zeros ahead
//! (as the WAL allocates it) against the same into `fallocate`d space, taking turns;
//! `-- --cell latency:0` the time of a dependent load by working-set size (what a cache
//! miss costs here: `compare/latency.rs`), and of a cache line handed between two threads.
//! `-- --cell durable:1024` measures `wal1024_vs_mem`
//! alone, `-- --cell overhead:N` `mem_vs_loop` at N clients (the summary's is at 256),
//! each with its two sides taking turns as in the full run. `-- --cell restart:N` builds workload 6's log of N
//! procedures, then restarts on it five times (page cache warm), each in a fresh process;
//! with `--log DIR` it keeps the log in DIR, or restarts on the one DIR already holds.
//! `-- --cell in-flight:N` prints the resident memory of a procedure in flight (N
//! procedures whose handler never returns, each keeping its task: `compare/in_flight.rs`).
//! `-- --cell-ms MS` sets every cell's time (for a run under valgrind).
//! `-- --threads` with a rate cell (`store`, `wal`, `nosync`, `mem`, `yield`, `answered`,
//! `hand`, `hand-wal`, `batch-wal`, `batch-nosync`, `batch-par`, `batch-own`, `batch-mem`, `wal-own`) also prints, per thread name, the CPUs it
//! kept busy and its CPU time and scheduler delay per step over the cell's middle half
//! (`compare/threads.rs`).
//! `-- --history N` runs every workload with `Config::history = N` (default 32), to
//! measure what the step history costs; `-- --max-running N` with
//! `Config::max_running = N` (default 10,000), to measure a smaller set of procedures
//! running at once; `-- --retention-ms MS` with finished procedures kept MS ms (default
//! 15 minutes). The hand loops on a store (`hand`, `hand-wal`) take `-- --pad BYTES`
//! (bytes added to every value) and `-- --keep-finished` (records finished, not deleted),
//! to write as the executor does (`compare/hand_store.rs`); so do the rounds
//! (`batch-wal`, `batch-nosync`, `batch-mem`). `-- --touch LINES` makes every
//! step of the ten-step machine (the executor's and the hand loops') walk LINES cache
//! lines of the procedure's own memory as a chain, to measure what a line a step finds
//! cold costs (`compare/machine.rs`).
//! `cargo bench --bench compare --features alloc-sim -- --cell KIND:N` also prints, per
//! allocation size, how often glibc's per-thread cache of seven blocks would miss
//! (`compare/alloc_sim.rs`; a measuring build, not for its rates).
//!
//! `-- --etcd` runs workload 8 alone (`compare/etcd.rs`, quick unless `--full`): the
//! executor on a local 3-member etcd at 1/16/256 clients against one client's loop of the
//! same fenced transactions, and the takeover time of a group whose leader is killed. Its
//! last line is `etcd-summary: etcd1_vs_raw=X etcd256_vs_raw=X takeover_s=X db_mib_after=X`. It needs
//! the root feature `etcd`; built without it, the bench runs itself again through cargo
//! with `--features etcd`.
//!
//! `-- --admin` runs workload 9 alone (`compare/admin.rs`; `--quick`: 100,000 procedures
//! instead of 1,000,000): the admin's filtered first page and what four polling pages cost
//! the commits. Its last line is `admin-summary: list_p99_ms=X commits_polled_vs_quiet=X`.
//! It needs the root feature `admin`; built without it, it runs itself again with it.
//!
//! `-- --postgres` runs workload 10 alone (`compare/postgres.rs`, quick unless `--full`):
//! the executor on a local PostgreSQL server at 1/16/256 clients against one client's
//! loop of the same fenced one-row transactions, and the takeover time of a group whose
//! leader is killed. Its last line is `pg-summary: pg1_vs_raw=X pg256_vs_raw=X
//! takeover_s=X`. It needs the root feature `postgres`; built without it, it runs itself
//! again with it.

// The crate root is benches/compare.rs: its modules live in benches/compare/.
#[cfg(feature = "admin")]
#[path = "compare/admin.rs"]
mod admin;
#[cfg(feature = "alloc-sim")]
#[path = "compare/alloc_sim.rs"]
mod alloc_sim;
#[path = "compare/chart.rs"]
mod chart;
#[path = "compare/disk_use.rs"]
mod disk_use;
#[path = "compare/drive.rs"]
mod drive;
#[cfg(feature = "etcd")]
#[path = "compare/etcd.rs"]
mod etcd;
#[path = "compare/gap.rs"]
mod gap;
#[cfg(any(feature = "etcd", feature = "postgres"))]
#[path = "compare/group.rs"]
mod group;
#[path = "compare/hand_batch.rs"]
mod hand_batch;
#[path = "compare/hand_redb.rs"]
mod hand_redb;
#[path = "compare/hand_store.rs"]
mod hand_store;
#[path = "compare/hbase_store.rs"]
mod hbase_store;
#[path = "compare/in_flight.rs"]
mod in_flight;
#[path = "compare/latency.rs"]
mod latency;
#[path = "compare/machine.rs"]
mod machine;
#[path = "compare/parallel_log.rs"]
mod parallel_log;
#[path = "compare/parked.rs"]
mod parked;
#[cfg(feature = "postgres")]
#[path = "compare/postgres.rs"]
mod postgres;
#[path = "compare/raw.rs"]
mod raw;
#[path = "compare/restart.rs"]
mod restart;
#[path = "compare/single.rs"]
mod single;
#[path = "compare/suspending.rs"]
mod suspending;
#[path = "compare/threads.rs"]
mod threads;
#[cfg(not(all(feature = "etcd", feature = "postgres", feature = "admin")))]
#[path = "../tests/support/with_feature.rs"]
mod with_feature;
#[cfg(any(feature = "etcd", feature = "postgres"))]
#[path = "../tests/support/workers.rs"]
mod workers;

use drive::{
    Rate, closed_loop, executor_closed_loop, run_procedures, start_executor, store_commit_loop,
};
use machine::{Payload, STATE_BYTES, STEPS, TenSteps, drive as drive_by_hand};
use procflow::executor::{Executor, Outcome};
use procflow::{Context, ProcedureId};
use procflow_store::{MemStore, Store, SyncMode, WalConfig, WalStore};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;

/// What one run measures, by mode.
struct Plan {
    quick: bool,
    cell: Duration,
    concurrency: &'static [u64],
}

impl Plan {
    fn from_args() -> Self {
        // cargo passes `--bench`; anything else but `--quick` is ignored too.
        let quick = std::env::args().any(|arg| arg == "--quick");
        Plan {
            quick,
            cell: Duration::from_millis(cell_ms_arg().unwrap_or(if quick { 1000 } else { 4000 })),
            // 1024 in both modes: `wal1024_vs_mem` is part of the summary.
            concurrency: &[1, 16, 256, 1024],
        }
    }
}

/// The figures the summary line is made of.
#[derive(Default)]
struct Summary {
    single_vs_raw: Option<f64>,
    /// Against the raw loop into space allocated ahead, as the WAL's segments are.
    single_vs_prealloc: Option<f64>,
    wal256_vs_raw: Option<f64>,
    wal256_vs_redb: Option<f64>,
    mem_vs_loop: Option<f64>,
    load_vs_read: Option<f64>,
    wal1024_vs_mem: Option<f64>,
    rss_vs_live: Option<f64>,
}

impl Summary {
    fn line(&self) -> String {
        let show = |ratio: Option<f64>| ratio.map_or("n/a".to_owned(), |r| format!("{r:.2}"));
        format!(
            "summary: single_vs_raw={} single_vs_prealloc={} wal256_vs_raw={} wal256_vs_redb={} mem_vs_loop={} load_vs_read={} wal1024_vs_mem={} rss_vs_live={}",
            show(self.single_vs_raw),
            show(self.single_vs_prealloc),
            show(self.wal256_vs_raw),
            show(self.wal256_vs_redb),
            show(self.mem_vs_loop),
            show(self.load_vs_read),
            show(self.wal1024_vs_mem),
            show(self.rss_vs_live),
        )
    }
}

fn main() {
    if restart::child_main() {
        return;
    }
    if std::env::args().any(|arg| arg == "--etcd") {
        return etcd_main();
    }
    if std::env::args().any(|arg| arg == "--postgres") {
        return postgres_main();
    }
    if std::env::args().any(|arg| arg == "--admin") {
        return admin_main();
    }
    let plan = Plan::from_args();
    let base = tempfile::Builder::new()
        .prefix("compare-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a directory under the target dir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    header(&plan, base.path());
    if let Some(cell) = cell_arg() {
        return one_cell(&cell, &plan, &runtime, base.path());
    }

    let mut summary = Summary::default();
    let record = record_size(&runtime, base.path());
    // The disk's rate drifts by 10-20 % between seconds: measure it before and after the
    // WAL cells and compare with the mean.
    let raw_before = raw::write_fdatasync_loop(base.path(), record, plan.cell);
    let pool = runtime.block_on(raw::write_fdatasync_on_blocking_pool(
        base.path(),
        record,
        plan.cell,
    ));
    let wal = wal_sweep(&plan, &runtime, base.path(), record);
    let raw_after = raw::write_fdatasync_loop(base.path(), record, plan.cell);
    let raw = (raw_before + raw_after) / 2.0;
    println!(
        "raw write+fdatasync of {record} B: {raw_before:.0}/s before the WAL cells, {raw_after:.0}/s after; mean {raw:.0}/s"
    );
    let interleaved = single::run(&runtime, base.path(), record, plan.cell / 10, 10);
    single_procedure(&interleaved, raw, pool, record, &wal[0], &mut summary);
    concurrency_sweep(raw, &wal, &mut summary);
    let redb = versus_redb(&plan, &runtime, base.path(), &wal, &mut summary);
    executor_overhead(&plan, &runtime, &wal, &mut summary);
    durability_cost(&plan, &runtime, base.path(), &mut summary);
    hbase_store::run(plan.quick, &runtime, base.path());
    let restarted = restart::run(plan.quick, &runtime, base.path());
    summary.load_vs_read = Some(restarted.load_vs_read);
    summary.rss_vs_live = Some(restarted.rss_vs_live);
    disk_use::run(plan.quick, &runtime, base.path());
    let procflow = wal.iter().map(|c| (c.clients, c.rate.steps_per_sec()));
    let figures = chart::Throughput {
        procflow: procflow.collect(),
        redb,
        raw,
    };
    println!();
    chart::write(plan.quick, &figures);

    drop(runtime);
    println!();
    println!("{}", summary.line());
}

/// Runs one workload alone (`--etcd`, `--admin`) on a runtime of its own, after a header
/// line (`what` says what it runs on), and prints the summary line `run` returns last.
#[cfg(any(feature = "etcd", feature = "postgres", feature = "admin"))]
fn alone(
    flag: &str,
    what: &str,
    quick: bool,
    run: impl FnOnce(&tokio::runtime::Runtime) -> String,
) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mode = if quick { "quick" } else { "full" };
    println!("procflow compare {flag}: {mode} mode, {cores} cores{what}");
    let line = run(&runtime);
    drop(runtime);
    println!();
    println!("{line}");
}

/// `--etcd`: workload 8 alone, procflow on a local 3-member etcd (quick unless `--full`).
#[cfg(feature = "etcd")]
fn etcd_main() {
    let quick = !std::env::args().any(|arg| arg == "--full");
    let what = format!(", ten-step machine, {STATE_BYTES} B state");
    alone("--etcd", &what, quick, |runtime| {
        etcd::run(quick, runtime).line()
    });
}

/// `--postgres`: workload 10 alone, procflow on a local PostgreSQL (quick unless
/// `--full`).
#[cfg(feature = "postgres")]
fn postgres_main() {
    let quick = !std::env::args().any(|arg| arg == "--full");
    let what = format!(", ten-step machine, {STATE_BYTES} B state");
    alone("--postgres", &what, quick, |runtime| {
        postgres::run(quick, runtime).line()
    });
}

/// `--etcd` in a build without the root package's `etcd` feature: runs the bench again
/// through cargo, with the feature.
#[cfg(not(feature = "etcd"))]
fn etcd_main() {
    rerun_with("etcd");
}

/// `--postgres` in a build without the root package's `postgres` feature: runs the
/// bench again through cargo, with the feature.
#[cfg(not(feature = "postgres"))]
fn postgres_main() {
    rerun_with("postgres");
}

/// `--admin` in a build without the root package's `admin` feature: runs the bench again
/// through cargo, with the feature.
#[cfg(not(feature = "admin"))]
fn admin_main() {
    rerun_with("admin");
}

/// Runs this bench again through cargo with `feature`, and the same arguments.
#[cfg(not(all(feature = "etcd", feature = "postgres", feature = "admin")))]
fn rerun_with(feature: &str) {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| arg != "--bench")
        .collect();
    with_feature::rerun(feature, "bench", &["--bench", "compare"], &args);
}

/// `--admin`: workload 9 alone, the admin over a million parked procedures (`--quick`:
/// 100,000).
#[cfg(feature = "admin")]
fn admin_main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    alone("--admin", "", quick, |runtime| {
        admin::run(quick, runtime).line()
    });
}

/// The value after `flag` on the command line, if the flag is given; `usage` is the
/// panic's message when the value is missing or does not parse.
pub fn flag_value<T: std::str::FromStr>(flag: &str, usage: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|arg| arg == flag)?;
    Some(
        args.get(at + 1)
            .and_then(|value| value.parse().ok())
            .expect(usage),
    )
}

/// The value of `--cell`, if given.
fn cell_arg() -> Option<String> {
    flag_value("--cell", "--cell KIND:CONCURRENCY")
}

/// `--cell-ms MS`: each cell's time, for a run under a simulator (valgrind runs the bench
/// about 50 times slower, so a second's cell holds a few thousand steps).
fn cell_ms_arg() -> Option<u64> {
    flag_value("--cell-ms", "--cell-ms MS")
}

/// The value of `--log`: where `--cell restart:N` keeps its log, or finds one.
fn log_arg() -> Option<PathBuf> {
    flag_value("--log", "--log DIR")
}

/// Runs one cell alone (for a profiler).
fn one_cell(cell: &str, plan: &Plan, runtime: &Runtime, base: &Path) {
    let (kind, clients) = cell.split_once(':').expect("--cell KIND:CONCURRENCY");
    let clients: u64 = clients.parse().expect("a concurrency");
    let dir = base.join("cell");
    // The parallel log's space is written ahead before the cell, outside its window.
    let parallel_log = (kind == "batch-par").then(|| {
        // Room for the cell at 1.5 million steps/s of 300-byte frames.
        let capacity = (plan.cell.as_secs_f64() * 1.5e6 * 300.0) as u64 + (64 << 20);
        parallel_log::ParallelLog::create(&dir, capacity)
    });
    // `--threads`: where the cell's CPU goes (see `threads.rs`); for the cells whose
    // figure is a rate, whose setup is short beside the cell.
    let window = (std::env::args().any(|arg| arg == "--threads")
        && matches!(
            kind,
            "store"
                | "wal"
                | "nosync"
                | "wal-own"
                | "mem"
                | "yield"
                | "answered"
                | "hand"
                | "hand-wal"
                | "batch-wal"
                | "batch-nosync"
                | "batch-par"
                | "batch-own"
                | "batch-mem"
        ))
    .then(|| threads::Window::start(plan.cell));
    #[cfg(feature = "alloc-sim")]
    alloc_sim::start();
    let rate = match kind {
        "store" => {
            let store = Arc::new(WalStore::open(&dir, WalConfig::default()).expect("open WAL"));
            runtime
                .block_on(store_commit_loop(store, clients, 168, plan.cell))
                .0
        }
        "wal" | "nosync" | "wal-own" | "mem" | "yield" | "answered" => runtime.block_on(async {
            let wal = match kind {
                "wal" => Some(WalStore::open(&dir, WalConfig::default()).expect("open WAL")),
                "wal-own" => Some(WalStore::open(&dir, caller_writes()).expect("open WAL")),
                "nosync" => Some(WalStore::open(&dir, no_sync()).expect("open WAL")),
                _ => None,
            }
            .map(Arc::new);
            let store: Arc<dyn Store> = match (&wal, kind) {
                (Some(wal), _) => wal.clone(),
                (None, "answered") => Arc::new(suspending::Suspending::answered()),
                (None, "yield") => Arc::new(suspending::Suspending::yielding()),
                (None, _) => Arc::new(MemStore::new()),
            };
            let (rate, executor) = executor_closed_loop(store, clients, plan.cell).await;
            executor.shutdown().await.expect("shutdown");
            if let Some(wal) = wal {
                // How large the groups were: what one `fdatasync` is shared by.
                let stats = wal.stats();
                let per_sync = stats.commits as f64 / stats.group_syncs.max(1) as f64;
                let steps_per_sync = rate.steps as f64 / stats.group_syncs.max(1) as f64;
                println!(
                    "{cell}: {per_sync:.1} commits per sync, {steps_per_sync:.0} steps per sync"
                );
            }
            rate.steps_per_sec()
        }),
        "hand" => runtime.block_on(async {
            let store: Arc<dyn Store> = Arc::new(MemStore::new());
            hand_store::closed_loop_on_store(store, clients, plan.cell)
                .await
                .steps_per_sec()
        }),
        "batch-par" => runtime.block_on(async {
            let log = parallel_log.expect("made for batch-par");
            let store: Arc<dyn Store> = Arc::new(MemStore::new());
            let (steps, rate) =
                hand_batch::rounds_on_store(store, Some(Arc::clone(&log)), clients, plan.cell)
                    .await;
            log.stop();
            let per_sync = steps as f64 / log.syncs().max(1) as f64;
            println!("{cell}: {per_sync:.0} steps per sync");
            rate
        }),
        "batch-wal" | "batch-nosync" | "batch-own" | "batch-mem" => runtime.block_on(async {
            let config = match kind {
                "batch-wal" => Some(WalConfig::default()),
                "batch-own" => Some(caller_writes()),
                "batch-nosync" => Some(no_sync()),
                _ => None,
            };
            let wal =
                config.map(|config| Arc::new(WalStore::open(&dir, config).expect("open WAL")));
            let store: Arc<dyn Store> = match &wal {
                Some(wal) => wal.clone(),
                None => Arc::new(MemStore::new()),
            };
            let (steps, rate) = hand_batch::rounds_on_store(store, None, clients, plan.cell).await;
            if let Some(wal) = wal {
                // Set beside the executor's `wal` cell: how many steps one sync carries.
                let per_sync = steps as f64 / wal.stats().group_syncs.max(1) as f64;
                println!("{cell}: {per_sync:.0} steps per sync");
            }
            rate
        }),
        "hand-wal" => runtime.block_on(async {
            let store = WalStore::open(&dir, WalConfig::default()).expect("open WAL");
            hand_store::closed_loop_durable(Arc::new(store), clients, plan.cell)
                .await
                .steps_per_sec()
        }),
        "raw" => {
            std::fs::create_dir_all(&dir).expect("create the cell directory");
            raw::write_fdatasync_loop(&dir, record_size(runtime, base), plan.cell)
        }
        "restart" => {
            let dir = log_arg().unwrap_or(dir);
            return restart::profile(runtime, &dir, clients);
        }
        "single" => {
            let rounds = u32::try_from(clients).expect("rounds").max(1);
            let record = record_size(runtime, base);
            let run = single::run(runtime, base, record, plan.cell / rounds, rounds);
            let rounds: Vec<_> = run.rounds.iter().map(|r| format!("{r:.2}")).collect();
            println!(
                "single:{}: single_vs_raw={:.2} (rounds {}); against the raw loop into preallocated space {:.2}",
                rounds.len(),
                run.ratio(),
                rounds.join(" "),
                run.ratio_to_preallocated()
            );
            return;
        }
        "gap" => {
            // The count after the colon is the pause, in microseconds.
            let pause = Duration::from_micros(clients);
            let record = record_size(runtime, base);
            let gap = gap::run(base, record, pause, plan.cell / 10, 10);
            println!(
                "gap:{clients}: raw loop into preallocated space {:.1} us per write; pausing {clients} us after each sync {:.1} us per write (+{:.1} us, {:.2}x the pause)",
                gap.plain_us,
                gap.pausing_us,
                gap.pausing_us - gap.plain_us,
                (gap.pausing_us - gap.plain_us) / pause.as_secs_f64().max(1e-9) / 1e6
            );
            return;
        }
        "ahead" => {
            // The count after the colon is the record's size in bytes.
            std::fs::create_dir_all(&dir).expect("create the cell directory");
            let size = usize::try_from(clients).expect("a record size").max(1);
            let (zeros, fallocated) = raw::ahead_rates(&dir, size, plan.cell / 20, 10);
            println!(
                "ahead:{size}: write+fdatasync into zeros written ahead {zeros:.0}/s, into fallocated space {fallocated:.0}/s, zeros / fallocated {:.2}",
                zeros / fallocated
            );
            return;
        }
        "latency" => {
            // The count after the colon is ignored.
            for bytes in latency::SIZES {
                let ns = latency::ns_per_load(bytes);
                println!(
                    "latency: {:>7} KiB: {ns:.1} ns per dependent load",
                    bytes >> 10
                );
            }
            println!(
                "latency: a cache line written on one thread, read on another: {:.1} ns one way",
                latency::transfer_ns()
            );
            return;
        }
        "durable" => {
            // `wal1024_vs_mem` alone (the count after the colon is ignored).
            durability_cost(plan, runtime, base, &mut Summary::default());
            return;
        }
        "in-flight" => {
            let bytes = runtime.block_on(in_flight::bytes_per_procedure(clients));
            println!(
                "in-flight:{clients}: {bytes:.0} bytes of resident memory per procedure in flight"
            );
            return;
        }
        "overhead" => {
            // `mem_vs_loop` alone, at the given count of clients.
            let turns = runtime.block_on(executor_against_hand_store(clients, plan.cell));
            let (executor, hand) = (turns.a.steps_per_sec(), turns.b.steps_per_sec());
            println!(
                "overhead:{clients}: executor {executor:.0}/s, hand loop {hand:.0}/s, mem_vs_loop={:.2}",
                executor / hand
            );
            return;
        }
        other => panic!(
            "unknown cell kind {other}: store, wal, nosync, mem, yield, answered, hand, hand-wal, batch-wal, batch-nosync, batch-par, batch-own, batch-mem, wal-own, raw, single, gap, ahead, latency, restart, durable, overhead or in-flight"
        ),
    };
    println!("{cell}: {rate:.0}/s");
    #[cfg(feature = "alloc-sim")]
    alloc_sim::print(rate * plan.cell.as_secs_f64());
    if let Some(window) = window {
        window.print(cell, rate);
    }
}

fn header(plan: &Plan, dir: &Path) {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "procflow compare: {} mode, {} ms per cell, {cores} cores, ten-step machine, {STATE_BYTES} B state, {} history entries kept per record",
        if plan.quick { "quick" } else { "full" },
        plan.cell.as_millis(),
        drive::config().history,
    );
    match raw::file_system(dir) {
        Some((mount, kind, source)) => {
            println!(
                "bench dir {} on {source} ({kind}, mounted at {mount})",
                dir.display()
            );
            if kind == "tmpfs" {
                println!("WARNING: tmpfs; fdatasync costs nothing here, the figures mean little");
            }
        }
        None => println!("bench dir {} (file system unknown)", dir.display()),
    }
}

/// The WAL whose commits write their own records, the committer thread only closing.
fn caller_writes() -> WalConfig {
    WalConfig {
        caller_writes: true,
        ..WalConfig::default()
    }
}

/// The WAL's settings without `fdatasync`.
fn no_sync() -> WalConfig {
    WalConfig {
        sync: SyncMode::NoSync,
        ..WalConfig::default()
    }
}

/// Runs one procedure on a WAL (without fsync) and measures its records, so the raw loop
/// writes what a step writes. Returns the mean record size in bytes.
fn record_size(runtime: &Runtime, base: &Path) -> usize {
    let dir = base.join("probe");
    let store = Arc::new(WalStore::open(&dir, no_sync()).expect("open the probe WAL"));
    runtime.block_on(async {
        let executor = Executor::builder(store, ())
            .register::<TenSteps>()
            .config(drive::config())
            .start()
            .await
            .expect("start the executor");
        let id = executor.submit(Payload::new(0)).await.expect("submit");
        assert_eq!(executor.wait(id).await.expect("wait"), Outcome::Succeeded);
        executor.shutdown().await.expect("shutdown");
    });
    let sizes = raw::wal_record_sizes(&dir);
    let mean = sizes.iter().sum::<usize>() / sizes.len();
    println!(
        "one procedure = {} WAL records (the submit, each step, the last one with the finish) of {:?} B; the raw loop writes {mean} B",
        sizes.len(),
        sizes
    );
    mean
}

/// A WAL cell's figures.
struct WalCell {
    clients: u64,
    rate: Rate,
    commits: u64,
    syncs: u64,
    /// `WalStore::commit` alone at the same concurrency: commits/s, commits per fsync.
    store_alone: (f64, f64),
}

impl WalCell {
    fn commits_per_sec(&self) -> f64 {
        self.commits as f64 / self.rate.elapsed.as_secs_f64()
    }

    fn commits_per_fsync(&self) -> f64 {
        self.commits as f64 / self.syncs.max(1) as f64
    }
}

/// Workloads 1 and 2: the executor on a durable WAL, at each concurrency.
fn wal_sweep(plan: &Plan, runtime: &Runtime, base: &Path, record: usize) -> Vec<WalCell> {
    plan.concurrency
        .iter()
        .map(|&clients| {
            let dir = base.join(format!("store-{clients}"));
            let store = Arc::new(WalStore::open(&dir, WalConfig::default()).expect("open WAL"));
            // A one-`Put` batch's record is 40 bytes longer than its value.
            let value_len = record.saturating_sub(40);
            let store_alone =
                runtime.block_on(store_commit_loop(store, clients, value_len, plan.cell));
            let dir = base.join(format!("wal-{clients}"));
            let store = Arc::new(WalStore::open(&dir, WalConfig::default()).expect("open WAL"));
            let dyn_store: Arc<dyn Store> = store.clone();
            runtime.block_on(async {
                let (rate, executor) = executor_closed_loop(dyn_store, clients, plan.cell).await;
                let stats = store.stats();
                executor.shutdown().await.expect("shutdown");
                WalCell {
                    clients,
                    rate,
                    commits: stats.commits,
                    syncs: stats.group_syncs,
                    store_alone,
                }
            })
        })
        .collect()
}

/// Workload 1: one procedure at a time on the durable WAL vs one fdatasync per step,
/// from the interleaved measurement (`compare/single.rs`); the sweep's separate cells
/// are shown too.
fn single_procedure(
    interleaved: &single::Interleaved,
    raw: f64,
    pool: f64,
    record: usize,
    single: &WalCell,
    summary: &mut Summary,
) {
    assert_eq!(single.clients, 1);
    let ratio = interleaved.ratio();
    let (slices, slice) = (interleaved.rounds.len(), interleaved.slice);
    println!();
    println!("## (1) single procedure: durable WalStore vs raw write+fdatasync ({record} B)");
    println!();
    println!(
        "Interleaved: {slices} rounds of {} ms of the raw loop, {} ms of the raw loop into \
         preallocated space, then {} ms of procflow, summed.",
        slice.as_millis(),
        slice.as_millis(),
        slice.as_millis(),
    );
    println!();
    println!("| what | steps/s | durable writes/s | writes/fsync | ratio |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let raw_now = interleaved.raw_per_sec();
    println!(
        "| raw write+fdatasync loop, interleaved | {raw_now:.0} | {raw_now:.0} | 1.0 | 1.00 |"
    );
    let raw_pre = interleaved.raw_preallocated_per_sec();
    println!(
        "| the same into preallocated space (zeros written ahead, as the WAL does), interleaved | \
         {raw_pre:.0} | {raw_pre:.0} | 1.0 | {:.2} |",
        raw_pre / raw_now
    );
    let steps = interleaved.procflow.steps_per_sec();
    let elapsed = interleaved.procflow.elapsed.as_secs_f64();
    println!(
        "| procflow executor, WalStore durable, interleaved | {steps:.0} | {:.0} | {:.1} | {ratio:.2} |",
        interleaved.commits as f64 / elapsed,
        interleaved.commits as f64 / interleaved.syncs.max(1) as f64,
    );
    let spread = |pick: fn(f64, f64) -> f64| {
        interleaved
            .rounds
            .iter()
            .copied()
            .reduce(pick)
            .unwrap_or(0.0)
    };
    println!();
    println!(
        "Per round the ratio ranged from {:.2} to {:.2}. Measured apart, in one-second cells:",
        spread(f64::min),
        spread(f64::max)
    );
    println!();
    println!("| what | steps/s | durable writes/s | writes/fsync | ratio |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!(
        "| raw write+fdatasync loop (mean of before and after the sweep) | {raw:.0} | {raw:.0} | 1.0 | 1.00 |"
    );
    println!(
        "| the same, each write on tokio's blocking pool | {pool:.0} | {pool:.0} | 1.0 | {:.2} |",
        pool / raw
    );
    let (alone, per_sync) = single.store_alone;
    println!(
        "| WalStore::commit alone, 1 writer | {alone:.0} | {alone:.0} | {per_sync:.1} | {:.2} |",
        alone / raw
    );
    let cell_steps = single.rate.steps_per_sec();
    println!(
        "| procflow executor, WalStore durable (the sweep's cell) | {cell_steps:.0} | {:.0} | {:.1} | {:.2} |",
        single.commits_per_sec(),
        single.commits_per_fsync(),
        cell_steps / raw,
    );
    println!();
    // Measured, not assumed: the store's commits over the procedures that ran.
    let writes = interleaved.commits as f64 / interleaved.procflow.procedures.max(1) as f64;
    println!(
        "A procedure made {writes:.1} durable writes for its {STEPS} steps (the submit, each step \
         before the last, and the last step together with the finish): one procedure at a time \
         can reach at most {:.2} of the raw loop's steps/s.",
        STEPS as f64 / writes
    );
    println!();
    println!(
        "The WAL allocates its segments' space ahead of its records, which the raw loop does \
         not: against the raw loop into preallocated space, procflow's ratio is {:.2}.",
        interleaved.ratio_to_preallocated()
    );
    summary.single_vs_raw = Some(ratio);
    summary.single_vs_prealloc = Some(interleaved.ratio_to_preallocated());
}

/// Workload 2: the executor on the durable WAL at each concurrency vs the raw loop.
fn concurrency_sweep(raw: f64, wal: &[WalCell], summary: &mut Summary) {
    println!();
    println!("## (2) concurrency sweep: durable WalStore vs the raw single-writer loop");
    println!();
    println!(
        "| concurrent | steps/s | procedures/s | durable writes/s | writes/fsync | vs raw | WalStore::commit alone/s | its writes/fsync |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!("| raw loop (mean) | {raw:.0} | | {raw:.0} | 1.0 | 1.00 | | |");
    for cell in wal {
        let steps = cell.rate.steps_per_sec();
        println!(
            "| {} | {steps:.0} | {:.0} | {:.0} | {:.1} | {:.2} | {:.0} | {:.1} |",
            cell.clients,
            cell.rate.procedures as f64 / cell.rate.elapsed.as_secs_f64(),
            cell.commits_per_sec(),
            cell.commits_per_fsync(),
            steps / raw,
            cell.store_alone.0,
            cell.store_alone.1,
        );
        if cell.clients == 256 {
            summary.wal256_vs_raw = Some(steps / raw);
        }
    }
}

/// Workload 3: the executor on the durable WAL vs the same machine persisted to redb by
/// hand, at the same concurrency. Returns redb's (clients, steps/s), for the chart.
fn versus_redb(
    plan: &Plan,
    runtime: &Runtime,
    base: &Path,
    wal: &[WalCell],
    summary: &mut Summary,
) -> Vec<(u64, f64)> {
    println!();
    println!("## (3) hand-rolled alternative: each step committed to a redb table (durable)");
    println!();
    println!("| concurrent | procflow steps/s | redb steps/s | procflow / redb |");
    println!("| ---: | ---: | ---: | ---: |");
    let mut figures = Vec::new();
    for cell in wal {
        let dir = base.join(format!("redb-{}", cell.clients));
        let redb = runtime.block_on(hand_redb::closed_loop_on_redb(
            &dir,
            cell.clients,
            plan.cell,
        ));
        let (p, r) = (cell.rate.steps_per_sec(), redb.steps_per_sec());
        println!("| {} | {p:.0} | {r:.0} | {:.2} |", cell.clients, p / r);
        if cell.clients == 256 {
            summary.wal256_vs_redb = Some(p / r);
        }
        figures.push((cell.clients, r));
    }
    figures
}

/// Workload 4: the executor on a `MemStore` vs the same handlers driven by hand, making
/// the same writes to a `MemStore` (the baseline of `mem_vs_loop`), the two taking
/// turns; the loops that persist nothing are extra columns, measured apart, and so is
/// the last column, workload 2's durable WAL cell over this executor.
fn executor_overhead(plan: &Plan, runtime: &Runtime, wal: &[WalCell], summary: &mut Summary) {
    println!();
    println!("## (4) executor overhead: executor on MemStore vs a hand-written tokio loop");
    println!();
    println!(
        "| concurrent | executor steps/s | loop persisting each step to a MemStore | ratio | loop, await point per step, no store | ratio | loop, no await point, no store | ratio | durable WAL executor (2) / this |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut spreads = Vec::new();
    for &clients in plan.concurrency {
        let (turns, yielding, straight) = runtime.block_on(async {
            let turns = executor_against_hand_store(clients, plan.cell).await;
            let yielding = hand_loop(clients, plan.cell, true).await;
            let straight = hand_loop(clients, plan.cell, false).await;
            (turns, yielding, straight)
        });
        spreads.push((clients, turns.spread()));
        let (e, y, s, p) = (
            turns.a.steps_per_sec(),
            yielding.steps_per_sec(),
            straight.steps_per_sec(),
            turns.b.steps_per_sec(),
        );
        let durable = wal
            .iter()
            .find(|cell| cell.clients == clients)
            .map(|cell| cell.rate.steps_per_sec() / e);
        let durable_text = durable.map_or("n/a".to_owned(), |d| format!("{d:.2}"));
        println!(
            "| {clients} | {e:.0} | {p:.0} | {:.2} | {y:.0} | {:.2} | {s:.0} | {:.2} | {durable_text} |",
            e / p,
            e / y,
            e / s
        );
        if clients == 256 {
            summary.mem_vs_loop = Some(e / p);
        }
    }
    println!();
    let spreads: Vec<String> = spreads
        .iter()
        .map(|(clients, (lo, hi))| format!("{lo:.2}–{hi:.2} at {clients}"))
        .collect();
    println!(
        "The executor and the loop persisting to a MemStore took turns: {TURNS} rounds of {} ms each, summed per side. The executor / loop ratio per round: {}.",
        (plan.cell / TURNS).as_millis(),
        spreads.join(", ")
    );
}

/// Rounds in which the two sides of `mem_vs_loop` take turns.
const TURNS: u32 = 10;

/// Rounds in which the two sides of `wal1024_vs_mem` take turns: fewer and longer than
/// [`TURNS`], since at 1,024 clients a procedure on the durable WAL takes tens of ms
/// and each slice waits for its last one.
const DURABLE_TURNS: u32 = 4;

/// `wal1024_vs_mem`: the executor at 1,024 clients on a durable `WalStore` and on a
/// `MemStore`, taking turns ([`drive::alternate`]): `DURABLE_TURNS` rounds of half a
/// cell each.
fn durability_cost(plan: &Plan, runtime: &Runtime, base: &Path, summary: &mut Summary) {
    const CLIENTS: u64 = 1024;
    let dir = base.join("durability");
    let wal = Arc::new(WalStore::open(&dir, WalConfig::default()).expect("open WAL"));
    let turns = runtime.block_on(async {
        let wal_executor = start_executor(wal.clone()).await;
        let mem_executor = start_executor(Arc::new(MemStore::new())).await;
        let turns = drive::alternate(
            DURABLE_TURNS,
            plan.cell / 2,
            |slice| run_procedures(&wal_executor, CLIENTS, slice),
            |slice| run_procedures(&mem_executor, CLIENTS, slice),
        )
        .await;
        wal_executor.shutdown().await.expect("shutdown");
        mem_executor.shutdown().await.expect("shutdown");
        turns
    });
    let (durable, memory) = (turns.a.steps_per_sec(), turns.b.steps_per_sec());
    let (lo, hi) = turns.spread();
    println!();
    println!(
        "## (4b) the cost of durability: the executor at {CLIENTS} clients on a durable WalStore vs on a MemStore, taking turns"
    );
    println!();
    println!("| executor on | steps/s | ratio |");
    println!("| --- | ---: | ---: |");
    println!("| MemStore | {memory:.0} | 1.00 |");
    println!(
        "| WalStore, durable | {durable:.0} | {:.2} |",
        durable / memory
    );
    println!();
    println!(
        "{DURABLE_TURNS} rounds of {} ms each, summed per side; per round the ratio ranged from {lo:.2} to {hi:.2}.",
        (plan.cell / 2).as_millis()
    );
    summary.wal1024_vs_mem = Some(durable / memory);
}

/// The executor on a `MemStore` and the same handlers driven by hand persisting to
/// another `MemStore`, taking turns ([`drive::alternate`]) for `cell` in all.
async fn executor_against_hand_store(clients: u64, cell: Duration) -> drive::Alternated {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let executor = start_executor(store).await;
    let hand_store: Arc<dyn Store> = Arc::new(MemStore::new());
    let turns = drive::alternate(
        TURNS,
        cell / TURNS,
        |slice| run_procedures(&executor, clients, slice),
        |slice| hand_store::closed_loop_on_store(Arc::clone(&hand_store), clients, slice),
    )
    .await;
    executor.shutdown().await.expect("shutdown");
    turns
}

/// The same handlers driven by a loop in `clients` tokio tasks, persisting nothing. With
/// `yield_each_step` every step ends with `tokio::task::yield_now`, so the clients'
/// procedures interleave step by step as they do on the executor; without it a task
/// never gives up its thread, and the clients run one after the other.
async fn hand_loop(clients: u64, duration: Duration, yield_each_step: bool) -> Rate {
    let env = Arc::new(());
    closed_loop(clients, duration, move |client, n| {
        let ctx = Context::new(ProcedureId::new(client << 32 | n), Arc::clone(&env));
        async move {
            let mut payload = Payload::new(client << 32 | n);
            drive_by_hand(&mut payload, &ctx, move |_, _| async move {
                if yield_each_step {
                    tokio::task::yield_now().await;
                }
            })
            .await
        }
    })
    .await
}
