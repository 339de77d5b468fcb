//! `--features alloc-sim` (with `--cell KIND:N`): how often glibc's per-thread cache
//! would miss, by size.
//!
//! glibc keeps up to seven freed blocks of each size per thread (its `tcache`) and
//! hands them back last in, first out: still in the CPU's cache. A thread that frees
//! more blocks of one size than that before it allocates them again sends the rest to
//! the arena's bins, and its next allocations of that size come from there: colder
//! blocks, under the arena's lock. At 1,024 durable procedures a cache of 1,000 per size
//! (`GLIBC_TUNABLES=glibc.malloc.tcache_count=1000`) made the executor's steps 12–18 %
//! faster (docs/BENCHMARKS.md, "Issue 33 in stop 61"); this says which sizes miss.
//!
//! The bench's allocator is then the system's behind a counter: each thread replays
//! glibc's rule on a model of its cache (seven per size, sizes in steps of 16 bytes, as
//! Rust asks for them rather than as glibc rounds them), and counts, per step of the
//! cell, the allocations and frees of each size, the allocations the model found no
//! block for, and the frees it found no room for. It counts only during the cell. A
//! measuring build: its counters cost every allocation an atomic add, so its rates are
//! not the bench's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Size classes of 16 bytes, up to 1,280 bytes (glibc's cache takes up to 1,032).
const CLASSES: usize = 80;
/// Blocks glibc's cache keeps per size and thread (`tcache_count`'s default).
const KEPT: u32 = 7;

/// Per class: allocations, frees, allocations that missed, frees that overflowed.
static COUNTS: [[AtomicU64; 4]; CLASSES] = [const { [const { AtomicU64::new(0) }; 4] }; CLASSES];
static COUNTING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The model of this thread's cache: blocks held per class.
    static HELD: RefCell<[u32; CLASSES]> = const { RefCell::new([0; CLASSES]) };
}

/// Counts from now on.
pub fn start() {
    COUNTING.store(true, Ordering::Relaxed);
}

/// Prints, per size class with at least one allocation in 50 steps, its counts per step.
pub fn print(steps: f64) {
    COUNTING.store(false, Ordering::Relaxed);
    let per_step = |count: &AtomicU64| count.load(Ordering::Relaxed) as f64 / steps;
    let (mut allocs, mut misses) = (0.0, 0.0);
    for (class, counts) in COUNTS.iter().enumerate() {
        let [alloc, free, miss, overflow] = counts.each_ref().map(per_step);
        allocs += alloc;
        misses += miss;
        if alloc >= 0.02 {
            println!(
                "alloc-sim: up to {:>4} B: per step {alloc:.3} allocations, {free:.3} frees, {miss:.3} missed, {overflow:.3} overflowed",
                class * 16
            );
        }
    }
    println!(
        "alloc-sim: per step {allocs:.2} allocations of up to 1,280 B, {misses:.2} missed the model's cache"
    );
}

fn note(size: usize, allocated: bool) {
    if !COUNTING.load(Ordering::Relaxed) {
        return;
    }
    let class = size.div_ceil(16);
    if class >= CLASSES {
        return;
    }
    // `try_`: the thread's storage may be gone (a thread ending), or busy (an allocation
    // inside the counting itself): such an allocation goes uncounted.
    let _ = HELD.try_with(|held| {
        let Ok(mut held) = held.try_borrow_mut() else {
            return;
        };
        let counts = &COUNTS[class];
        let held = &mut held[class];
        let missed = if allocated {
            counts[0].fetch_add(1, Ordering::Relaxed);
            let missed = *held == 0;
            *held = held.saturating_sub(1);
            missed.then_some(2)
        } else {
            counts[1].fetch_add(1, Ordering::Relaxed);
            let overflowed = *held == KEPT;
            *held = (*held + 1).min(KEPT);
            overflowed.then_some(3)
        };
        if let Some(at) = missed {
            counts[at].fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// The system's allocator, counted.
struct Counted;

// SAFETY: every method passes its arguments unchanged to `System`, which upholds
// `GlobalAlloc`'s contract; the counting allocates nothing and never unwinds.
unsafe impl GlobalAlloc for Counted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), true);
        // SAFETY: the caller's guarantees for `layout` are `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(layout.size(), false);
        // SAFETY: `ptr` came from `System` with `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(layout.size(), false);
        note(new_size, true);
        // SAFETY: as for `dealloc`, and `new_size` is valid as the caller guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTED: Counted = Counted;
