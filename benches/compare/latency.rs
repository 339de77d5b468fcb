//! The machine's memory latency by working-set size (`--cell latency`): the time of one
//! load that depends on the one before, chasing a random cycle through every cache line
//! of a buffer of each size.
//!
//! Why in this bench: a durable step at 1,024 procedures finds most of its procedure's
//! data gone from the core's cache, and what a miss costs on this VM (which has no
//! hardware counters) turns a count of simulated misses into time (docs/BENCHMARKS.md,
//! "Issue 33 in stop 54").

use std::time::Instant;

/// `u64`s per 64-byte cache line.
const LINE: usize = 8;

/// Working-set sizes in bytes, from one core's first-level cache to far past the last.
pub const SIZES: [usize; 8] = [
    32 << 10,
    256 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
    256 << 20,
];

/// Nanoseconds per dependent load over a buffer of `bytes`.
pub fn ns_per_load(bytes: usize) -> f64 {
    let lines = (bytes / 64).max(2);
    let chain = random_cycle(lines);
    let mut at = 0usize;
    // Once round the cycle first: the pages are mapped and the caches hold what fits.
    for _ in 0..lines {
        at = chain[at * LINE] as usize;
    }
    let loads = 4_000_000;
    let start = Instant::now();
    for _ in 0..loads {
        at = chain[at * LINE] as usize;
    }
    let took = start.elapsed();
    std::hint::black_box(at);
    took.as_secs_f64() * 1e9 / loads as f64
}

/// A buffer of `lines` cache lines whose first word in each names the next line of one
/// random cycle through all of them.
fn random_cycle(lines: usize) -> Vec<u64> {
    let mut order: Vec<usize> = (0..lines).collect();
    let mut rng = fastrand::Rng::with_seed(42);
    rng.shuffle(&mut order);
    let mut chain = vec![0u64; lines * LINE];
    for (i, &line) in order.iter().enumerate() {
        let next = order[(i + 1) % lines];
        chain[line * LINE] = next as u64;
    }
    chain
}
