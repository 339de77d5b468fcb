//! Workload 6: restart. A log of N procedures with five updates each and 1 KiB of state,
//! half of them ended and deleted, half parked (HBase's loader evaluation); then the time
//! from `WalStore::open` to the executor's `start` returning with every unfinished
//! procedure loaded, against reading the same segment files sequentially.
//!
//! The restart runs in a fresh process, as a real one does: the bench starts its own
//! binary with `--restart-child DIR N` ([`child_main`]). Measured in the process that
//! generated the log, the same restart took up to twice as long, the allocator still
//! holding that process's scattered free memory.

use crate::parked::{self, FiveUpdates};
use procflow::executor::Executor;
use procflow_store::{SyncMode, WalConfig, WalStore};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// Procedures in the log: HBase's loader evaluation uses a million.
pub fn procedures(quick: bool) -> u64 {
    if quick { 50_000 } else { 1_000_000 }
}

/// Clients generating the log: enough to keep both cores busy without fsyncs.
const GENERATORS: u64 = 512;

/// Rounds of each pass: a read of the log, then a restart on it, taking turns.
///
/// Why more than one: measured once each, a cold pass gave what the disk, or the host's
/// cache under it, did at that moment. The same log's cold read took 1.77 s in one stop's
/// full run and 0.74 s in the next's, and a quick run's cold open 44 to 92 ms
/// (docs/BENCHMARKS.md, stops 58 and 59). Three turns put the same drift into both sides.
const ROUNDS: u32 = 3;

/// Reading the log and loading it [`ROUNDS`] times, taking turns, from disk or from the
/// page cache: the means of each side's times.
#[derive(Default)]
struct Pass {
    read: Duration,
    open: Duration,
    ready: Duration,
    live: usize,
    /// The restarted process's resident memory once ready, in bytes: the largest of the
    /// rounds.
    rss: u64,
    /// `load_vs_read` of each round.
    rounds: Vec<f64>,
}

impl Pass {
    /// Read throughput over load throughput of the same bytes (higher is better).
    fn ratio(&self) -> f64 {
        self.read.as_secs_f64() / self.ready.as_secs_f64()
    }

    /// Resident memory over the live procedures' data, `live` × 1 KiB (lower is better).
    fn rss_vs_live(&self) -> f64 {
        self.rss as f64 / (self.live as f64 * parked::STATE_BYTES as f64)
    }
}

/// What workload 6 contributes to the summary line.
pub struct Restarted {
    /// Cold if the page cache can be dropped, else warm.
    pub load_vs_read: f64,
    /// Of the same pass.
    pub rss_vs_live: f64,
}

/// Runs workload 6 in `base/restart`, prints its table and returns `load_vs_read` and
/// `rss_vs_live`: the cold pass's if the page cache can be dropped, else the warm one's.
pub fn run(quick: bool, runtime: &Runtime, base: &Path) -> Restarted {
    let dir = base.join("restart");
    let n = procedures(quick);
    let generated = Instant::now();
    generate(runtime, &dir, n);
    let generated = generated.elapsed();
    let files = segment_files(&dir);
    let bytes: u64 = files
        .iter()
        .map(|f| f.metadata().expect("stat").len())
        .sum();

    // Cold first: the generation left the files in the page cache.
    let cold = if drop_page_cache() {
        Some(measure(&dir, &files, n, true))
    } else {
        println!("(6) cannot drop the page cache (not root?): the restart is measured warm only");
        None
    };
    let warm = measure(&dir, &files, n, false);
    print_table(n, generated, files.len(), bytes, cold.as_ref(), &warm);
    print_check_cost(&dir, n);
    std::fs::remove_dir_all(&dir).expect("remove the restart log");
    let pass = cold.as_ref().unwrap_or(&warm);
    Restarted {
        load_vs_read: pass.ratio(),
        rss_vs_live: pass.rss_vs_live(),
    }
}

/// `--cell restart:N`: builds the log of `n` procedures once, then restarts on it five
/// times with a warm page cache, each in a fresh process, printing each time. Run the
/// child alone (`--restart-child DIR N`) under a profiler.
///
/// With `--log DIR` (`dir` is then DIR) a log already in `dir` is used as it is: a restart
/// reads it and writes nothing, so builds can be compared on the same log, and the log
/// is kept for other tools (`procflow-store`'s `open_rss` example).
pub fn profile(runtime: &Runtime, dir: &Path, n: u64) {
    if dir.exists() && !segment_files(dir).is_empty() {
        println!("restart:{n}: on the log already in {}", dir.display());
    } else {
        generate(runtime, dir, n);
        // The log was written without fsync: write it back now, not during the restarts.
        let _ = std::process::Command::new("sync").status();
    }
    for _ in 0..5 {
        let loaded = load_in_child(dir, n, false);
        println!(
            "restart:{n}: open {:.3} s, ready {:.3} s, {} live, RSS {:.1} MB, {} of {} segments left mapped",
            loaded.open.as_secs_f64(),
            loaded.ready.as_secs_f64(),
            loaded.live,
            loaded.rss as f64 / 1e6,
            loaded.mapped,
            segment_files(dir).len()
        );
    }
    print_check_cost(dir, n);
}

/// The flag that makes the bench binary a restarting process.
const CHILD_FLAG: &str = "--restart-child";
/// With it, the restarting process starts its executor with the start check
/// (`ExecutorBuilder::check_data`).
const CHECK_FLAG: &str = "--check-data";

/// The start check's cost: warm restarts with and without it, taking turns (three each),
/// each in a fresh process; prints the medians and their ratio.
fn print_check_cost(dir: &Path, n: u64) {
    let (mut plain, mut checked) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        plain.push(load_in_child(dir, n, false).ready);
        checked.push(load_in_child(dir, n, true).ready);
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let (plain, checked) = (median(&mut plain), median(&mut checked));
    println!();
    println!(
        "(6) the start check (`check_data(true)`, every live procedure's data decoded at start), \
         warm, medians of three turns: executor ready in {:.3} s with it, {:.3} s without: \
         check_vs_plain={:.2}",
        checked.as_secs_f64(),
        plain.as_secs_f64(),
        checked.as_secs_f64() / plain.as_secs_f64()
    );
}

/// If the arguments are `--restart-child DIR N`, restarts on the log in `DIR`, prints
/// the timings on one line for the parent and returns `true`.
pub fn child_main() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|arg| arg == CHILD_FLAG) else {
        return false;
    };
    let dir = PathBuf::from(args.get(at + 1).expect("--restart-child DIR N"));
    let n: u64 = args
        .get(at + 2)
        .and_then(|n| n.parse().ok())
        .expect("--restart-child DIR N");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let check = args.iter().any(|arg| arg == CHECK_FLAG);
    let loaded = load(&runtime, &dir, n, check);
    println!(
        "{CHILD_FLAG} {} {} {} {} {}",
        loaded.open.as_secs_f64(),
        loaded.ready.as_secs_f64(),
        loaded.live,
        loaded.rss,
        loaded.mapped
    );
    true
}

/// What one restart took and left.
struct Loaded {
    /// From the start to the store's open returning.
    open: Duration,
    /// From the start to the executor's start returning.
    ready: Duration,
    /// Unfinished procedures resumed.
    live: usize,
    /// The process's resident memory once ready, in bytes.
    rss: u64,
    /// Segments the open left mapped (`WalStats::mapped_segments`).
    mapped: usize,
}

/// Runs [`load`] in a fresh process: this binary with `--restart-child` (and the start
/// check if `check`).
fn load_in_child(dir: &Path, n: u64, check: bool) -> Loaded {
    let exe = std::env::current_exe().expect("the bench binary's path");
    let output = std::process::Command::new(exe)
        .arg(CHILD_FLAG)
        .arg(dir)
        .arg(n.to_string())
        .args(check.then_some(CHECK_FLAG))
        .args(["--history", &crate::drive::config().history.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("start the restarting process");
    assert!(output.status.success(), "the restarting process failed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix(CHILD_FLAG))
        .expect("the restarting process's timings");
    let fields: Vec<&str> = line.split_whitespace().collect();
    let secs = |field: &str| Duration::from_secs_f64(field.parse().expect("seconds"));
    Loaded {
        open: secs(fields[0]),
        ready: secs(fields[1]),
        live: fields[2].parse().expect("live procedures"),
        rss: fields[3].parse().expect("resident bytes"),
        mapped: fields[4].parse().expect("mapped segments"),
    }
}

/// Reads the files, then loads the store in a fresh process, [`ROUNDS`] times; when
/// `cold`, each of them starts with an empty page cache.
fn measure(dir: &Path, files: &[PathBuf], n: u64, cold: bool) -> Pass {
    let cool = || assert!(!cold || drop_page_cache(), "the page cache can be dropped");
    let mut pass = Pass::default();
    for _ in 0..ROUNDS {
        cool();
        let read = read_all(files);
        cool();
        let loaded = load_in_child(dir, n, false);
        pass.read += read / ROUNDS;
        pass.open += loaded.open / ROUNDS;
        pass.ready += loaded.ready / ROUNDS;
        pass.live = loaded.live;
        pass.rss = pass.rss.max(loaded.rss);
        pass.rounds
            .push(read.as_secs_f64() / loaded.ready.as_secs_f64());
    }
    pass
}

/// Builds the log: `n` procedures through an executor on a WAL without fsync (only the
/// log's content matters here), odd ones ending and deleted, even ones parked.
fn generate(runtime: &Runtime, dir: &Path, n: u64) {
    let config = WalConfig {
        sync: SyncMode::NoSync,
        ..WalConfig::default()
    };
    let store = Arc::new(WalStore::open(dir, config).expect("open the restart WAL"));
    runtime.block_on(async {
        let executor = Executor::builder(store.clone(), ())
            .register::<FiveUpdates>()
            .config(parked::config(n))
            .start()
            .await
            .expect("start the executor");
        parked::populate(&executor, 0, n, GENERATORS, |id| id % 2 == 0).await;
        parked::await_cleanup(store.as_ref(), n.div_ceil(2)).await;
        executor.shutdown().await.expect("shutdown");
    });
}

/// Opens the store as a restarting process would (default, durable configuration) and
/// starts an executor on it, configured as the one that wrote the `n` procedures (so
/// every parked one gets its running slot back).
fn load(runtime: &Runtime, dir: &Path, n: u64, check: bool) -> Loaded {
    runtime.block_on(async {
        let start = Instant::now();
        let store = Arc::new(WalStore::open(dir, WalConfig::default()).expect("reopen"));
        let open = start.elapsed();
        let executor = Executor::builder(store.clone(), ())
            .register::<FiveUpdates>()
            .config(parked::config(n))
            .check_data(check)
            .start()
            .await
            .expect("restart the executor");
        let ready = start.elapsed();
        let rss = resident_bytes();
        let mapped = store.stats().mapped_segments;
        assert!(executor.unloadable().is_empty(), "every procedure loads");
        let live = executor
            .list()
            .iter()
            .filter(|info| !info.status.is_finished())
            .count();
        // Parked procedures wait for an event nobody sends: shutting down stops them
        // without another step or write.
        executor.shutdown().await.expect("shutdown");
        Loaded {
            open,
            ready,
            live,
            rss,
            mapped,
        }
    })
}

/// This process's resident set size (`VmRSS` of `/proc/self/status`), in bytes.
pub fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// The store's segment files, in name (log) order.
fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("read the store directory")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "wal"))
        .collect();
    files.sort();
    files
}

/// Reads every file to its end, one after the other, in 4 MiB reads.
fn read_all(files: &[PathBuf]) -> Duration {
    let mut buffer = vec![0; 4 << 20];
    let start = Instant::now();
    for path in files {
        let mut file = std::fs::File::open(path).expect("open a segment");
        while file.read(&mut buffer).expect("read a segment") > 0 {}
    }
    start.elapsed()
}

/// Writes back dirty pages and drops the page cache, so the next read comes from the
/// disk. Needs root; returns whether it worked.
fn drop_page_cache() -> bool {
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|status| status.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Prints the log's size and one row per pass.
fn print_table(
    n: u64,
    generated: Duration,
    files: usize,
    bytes: u64,
    cold: Option<&Pass>,
    warm: &Pass,
) {
    let mb = bytes as f64 / 1e6;
    println!();
    println!(
        "## (6) restart: {n} procedures of 1 KiB, each submitted then updated 5 times; half ended and were deleted, half parked"
    );
    println!();
    println!(
        "log: {files} segment files, {mb:.1} MB on disk (generated in {:.1} s without fsync)",
        generated.as_secs_f64()
    );
    println!();
    println!(
        "| page cache | read time | read MB/s | WalStore::open | executor ready | load MB/s | live procedures | load_vs_read | RSS when ready | live data | rss_vs_live |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let row = |label: &str, pass: &Pass| {
        println!(
            "| {label} | {:.3} s | {:.0} | {:.3} s | {:.3} s | {:.0} | {} | {:.2} | {:.1} MB | {:.1} MB | {:.2} |",
            pass.read.as_secs_f64(),
            mb / pass.read.as_secs_f64(),
            pass.open.as_secs_f64(),
            pass.ready.as_secs_f64(),
            mb / pass.ready.as_secs_f64(),
            pass.live,
            pass.ratio(),
            pass.rss as f64 / 1e6,
            (pass.live * parked::STATE_BYTES) as f64 / 1e6,
            pass.rss_vs_live(),
        );
    };
    match cold {
        Some(pass) => row("cold (dropped)", pass),
        None => {
            println!(
                "| cold | not measured: the page cache could not be dropped | | | | | | | | | |"
            )
        }
    }
    row("warm", warm);
    println!();
    let spread = |pass: &Pass| {
        let low = pass.rounds.iter().copied().fold(f64::INFINITY, f64::min);
        let high = pass.rounds.iter().copied().fold(0.0, f64::max);
        format!("{low:.2}–{high:.2}")
    };
    println!(
        "Each row: the means of {ROUNDS} rounds of a read, then a restart, taking turns. load_vs_read per round: {}warm {}.",
        cold.map_or(String::new(), |pass| format!("cold {}, ", spread(pass))),
        spread(warm)
    );
}
