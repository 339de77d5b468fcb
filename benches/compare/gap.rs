//! What the time between a sync's return and the next write costs: the raw loop into
//! preallocated space, without a pause and with one, in alternating rounds.
//!
//! One procedure cannot write its next step before the last is durable and the step has
//! run: the executor's work sits between one `fdatasync`'s return and the next write. On
//! this project's VM a pause of a few microseconds there costs the raw loop once to
//! twice its length per write (docs/BENCHMARKS.md), so this cell tells how much of
//! `single_vs_prealloc`'s gap is the disk's answer to any pause at all.

use crate::raw::{self, RawLog};
use std::path::Path;
use std::time::Duration;

/// Per-write times of the two loops, summed over the rounds.
pub struct Gap {
    /// Microseconds per write without a pause.
    pub plain_us: f64,
    /// Microseconds per write with the pause.
    pub pausing_us: f64,
}

/// Runs `rounds` rounds of `slice` of each loop (`record`-byte writes) in `base/gap`,
/// the pausing one kept busy for `pause` after each sync.
pub fn run(base: &Path, record: usize, pause: Duration, slice: Duration, rounds: u32) -> Gap {
    let dir = base.join("gap");
    std::fs::create_dir_all(&dir).expect("create the gap directory");
    let mut plain = RawLog::preallocated(&dir, record);
    let mut pausing = RawLog::preallocated_pausing(&dir, record, pause);
    let (plain_total, pausing_total) = raw::take_turns(&mut plain, &mut pausing, slice, rounds);
    Gap {
        plain_us: per_write_us(plain_total),
        pausing_us: per_write_us(pausing_total),
    }
}

fn per_write_us((writes, took): (u64, Duration)) -> f64 {
    took.as_secs_f64() * 1e6 / writes.max(1) as f64
}
