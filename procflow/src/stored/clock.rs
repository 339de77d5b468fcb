//! Wall-clock times for a step's history entry, read off the monotonic clock the step
//! already read.
//!
//! A step read the clock three times: its start and its end, for
//! `procflow_step_seconds`, and the wall clock for its history entry a moment after its
//! end. On this project's VM a clock read costs about 30 ns, and the three were 6 % of a
//! step on a `MemStore` (perf; docs/BENCHMARKS.md, "Issue 33 in stop 64"). The entry now
//! takes the step's end, turned into wall-clock time through an anchor: a pair of both
//! clocks each thread reads once a second at most.
//!
//! What that costs in accuracy: between two anchors the monotonic clock runs at the
//! wall clock's rate as NTP slews it at that moment (at most 500 ppm: half a millisecond
//! a second), and a step of the wall clock (an operator setting it) shows in entries up to
//! a second late. The entries are in milliseconds and for people to read; deadlines,
//! retention and everything else that compares times still read the wall clock itself.

use super::record::now_ms;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// How long a thread's anchor serves before the thread reads the wall clock again.
const ANCHOR_FOR: Duration = Duration::from_secs(1);

thread_local! {
    /// The monotonic and the wall clock, read together by this thread.
    static ANCHOR: Cell<Option<(Instant, u64)>> = const { Cell::new(None) };
}

/// The wall-clock time, in ms since the Unix epoch, of the moment `at` of the monotonic
/// clock: read from this thread's anchor, made afresh when `at` is a second or more from
/// it.
pub(crate) fn wall_ms_at(at: Instant) -> u64 {
    let anchor = ANCHOR.get().filter(|&(then, _)| {
        at.checked_duration_since(then)
            .or_else(|| then.checked_duration_since(at))
            .is_some_and(|apart| apart < ANCHOR_FOR)
    });
    let (then, wall) = anchor.unwrap_or_else(|| {
        let anchor = (Instant::now(), now_ms());
        ANCHOR.set(Some(anchor));
        anchor
    });
    match at.checked_duration_since(then) {
        Some(after) => wall.saturating_add(millis(after)),
        None => wall.saturating_sub(millis(then - at)),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A moment just past reads as the wall clock did then, to the millisecond.
    #[test]
    fn a_moment_reads_as_the_wall_clock() {
        for _ in 0..3 {
            let before = now_ms();
            let at = Instant::now();
            let after = now_ms();
            let wall = wall_ms_at(at);
            assert!(
                (before.saturating_sub(1)..=after + 1).contains(&wall),
                "{before} ≤ {wall} ≤ {after}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Moments after the anchor read later by as much; one before it (a step that ended
    /// before another on this thread refreshed the anchor) reads earlier by as much.
    #[test]
    fn moments_keep_their_distance_on_either_side_of_the_anchor() {
        let earlier = Instant::now();
        std::thread::sleep(Duration::from_millis(30));
        let anchor = Instant::now();
        let base = wall_ms_at(anchor);
        // Each reading truncates to the millisecond: one apart at most.
        let near = |a: u64, b: u64| a.abs_diff(b) <= 1;
        let later = anchor + Duration::from_millis(400);
        assert!(near(wall_ms_at(later), base + 400));
        let back = millis(anchor - earlier);
        assert!(near(wall_ms_at(earlier), base - back));
    }

    /// A moment more than a second from the anchor has the thread read the wall clock
    /// again.
    #[test]
    fn an_old_anchor_is_made_afresh() {
        let at = Instant::now();
        let _ = wall_ms_at(at);
        let first = ANCHOR.get().expect("an anchor");
        let _ = wall_ms_at(at + Duration::from_millis(900));
        assert_eq!(
            ANCHOR.get(),
            Some(first),
            "within a second: the same anchor"
        );
        let _ = wall_ms_at(at + Duration::from_secs(5));
        assert_ne!(ANCHOR.get(), Some(first), "the anchor was read again");
    }
}
