//! The machine's memory latency by working-set size (`--cell latency`): the time of one
//! load that depends on the one before, chasing a random cycle through every cache line
//! of a buffer of each size.
//!
//! Why in this bench: a durable step at 1,024 procedures finds most of its procedure's
//! data gone from the core's cache, and what a miss costs on this VM (which has no
//! hardware counters) turns a count of simulated misses into time (docs/BENCHMARKS.md,
//! "Issue 33 in stop 54").
//!
//! It also times a cache line handed between two threads ([`transfer_ns`]): what each
//! hand-off between a Tokio worker and the store's committer thread costs per line the
//! other wrote last (docs/BENCHMARKS.md, "Issue 33 in stop 69").

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// Round trips of [`transfer_ns`].
const ROUND_TRIPS: u64 = 1_000_000;

/// Nanoseconds for a cache line written on one thread to be read on another, one way:
/// two threads take turns raising one counter, each spinning until the other has, and
/// each turn moves the counter's line from one core to the other. On a machine of one
/// CPU the turns are the scheduler's, not the caches'.
pub fn transfer_ns() -> f64 {
    let counter = Arc::new(AtomicU64::new(0));
    let other = Arc::clone(&counter);
    let answering = std::thread::spawn(move || {
        for turn in 0..ROUND_TRIPS {
            wait_for(&other, 2 * turn + 1);
            other.store(2 * turn + 2, Ordering::Release);
        }
    });
    let start = Instant::now();
    for turn in 0..ROUND_TRIPS {
        counter.store(2 * turn + 1, Ordering::Release);
        wait_for(&counter, 2 * turn + 2);
    }
    let took = start.elapsed();
    answering.join().expect("the answering thread");
    took.as_secs_f64() * 1e9 / (2 * ROUND_TRIPS) as f64
}

/// Spins until `counter` holds `value`, yielding now and then so that one CPU can serve
/// both threads.
fn wait_for(counter: &AtomicU64, value: u64) {
    let mut spins = 0u32;
    while counter.load(Ordering::Acquire) != value {
        spins += 1;
        if spins.is_multiple_of(1024) {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
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
