//! Wakes that arrive while a step runs: a condition variable with a generation count.
//!
//! A handler checks its condition, finds it false and returns `Suspend(event)`. If the
//! caller makes the condition true and calls `wake(event)` while that step still runs,
//! nobody is registered on `event` yet: a bare notify would be lost and the procedure
//! would wait forever. So every wake gets a generation number, and every step remembers
//! the generation it started at. A step that ends by suspending on `event` first asks
//! whether `event` was woken after it started; if so it runs again instead of waiting.
//!
//! Only wakes that a running step may still need are kept (see [`WakeLog`]).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Generations of recent wakes, and how many steps run, by epoch.
///
/// A step costs two atomic increments and no lock: it counts itself in the current
/// epoch's parity. A wake moves the epoch on once no step of the previous epoch runs,
/// and forgets that epoch's wakes. So a running step's own epoch and the next one are
/// never forgotten: between them they hold every wake since the step started.
///
/// The counts are kept in [`STRIPES`] stripes, each on cache lines of its own, and a
/// step counts itself in its thread's: with one count, the two workers' steps wrote one
/// line in turn, and the epoch's line beside it, on every step (1.9 % of a `MemStore`
/// step's samples; docs/BENCHMARKS.md, stop 50). A wake, far rarer, looks at every
/// stripe. A step stays counted in its stripe from before it reads its start until it
/// ends, so a wake that looks at the stripes after a step started sees it there.
#[derive(Debug, Default)]
pub(crate) struct WakeLog {
    /// The generation of the newest wake.
    generation: AtomicU64,
    epoch: AtomicU64,
    /// Steps running, by the parity of the epoch they started in, by stripe.
    stripes: [Stripe; STRIPES],
    /// Event → generation of its newest wake, by the parity of the epoch it came in.
    woken: Mutex<[HashMap<String, u64>; 2]>,
}

/// How many stripes the running steps are counted in: a runtime's workers rarely
/// number more; threads beyond share stripes, which is correct, only slower.
const STRIPES: usize = 8;

/// One stripe of the running steps' counts, alone on its cache lines (128 bytes: two
/// lines, as x86 prefetches lines in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe {
    running: [AtomicUsize; 2],
}

/// The stripe of the calling thread: given out in turn as threads first ask.
fn stripe_of_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Relaxed) % STRIPES;
    }
    STRIPE.with(|stripe| *stripe)
}

/// A running step's place in the log; give it back with [`WakeLog::end_step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepStart {
    epoch: u64,
    generation: u64,
    /// The stripe it is counted in (its task may end the step on another thread).
    stripe: usize,
}

fn parity(epoch: u64) -> usize {
    usize::from(epoch % 2 == 1)
}

impl WakeLog {
    fn woken(&self) -> MutexGuard<'_, [HashMap<String, u64>; 2]> {
        // Every method leaves the maps consistent between statements.
        self.woken.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that a step starts now.
    pub(crate) fn begin_step(&self) -> StepStart {
        let stripe = stripe_of_thread();
        let running = &self.stripes[stripe].running;
        loop {
            let epoch = self.epoch.load(SeqCst);
            running[parity(epoch)].fetch_add(1, SeqCst);
            // The epoch moved on meanwhile: its wakes may be forgotten; count in the new.
            if self.epoch.load(SeqCst) == epoch {
                let generation = self.generation.load(SeqCst);
                return StepStart {
                    epoch,
                    generation,
                    stripe,
                };
            }
            running[parity(epoch)].fetch_sub(1, SeqCst);
        }
    }

    /// Records that the step that began at `start` ended.
    pub(crate) fn end_step(&self, start: StepStart) {
        self.stripes[start.stripe].running[parity(start.epoch)].fetch_sub(1, SeqCst);
    }

    /// Whether any step that started in an epoch of parity `parity` still runs.
    fn any_running(&self, parity: usize) -> bool {
        self.stripes
            .iter()
            .any(|stripe| stripe.running[parity].load(SeqCst) != 0)
    }

    /// Records a wake of `event`.
    pub(crate) fn wake(&self, event: &str) {
        let mut woken = self.woken();
        let generation = self.generation.fetch_add(1, SeqCst) + 1;
        let mut epoch = self.epoch.load(SeqCst);
        // No step of the previous epoch runs: no one needs its wakes any more.
        if !self.any_running(parity(epoch + 1)) {
            woken[parity(epoch + 1)].clear();
            epoch += 1;
            self.epoch.store(epoch, SeqCst);
        }
        let map = &mut woken[parity(epoch)];
        match map.get_mut(event) {
            Some(at) => *at = generation,
            None => drop(map.insert(event.to_owned(), generation)),
        }
    }

    /// Whether `event` was woken after the step that began at `start` started.
    pub(crate) fn woken_since(&self, event: &str, start: StepStart) -> bool {
        self.woken()
            .iter()
            .any(|map| map.get(event).is_some_and(|&at| at > start.generation))
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.woken().iter().map(HashMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_during_a_step_is_seen_by_it_and_not_by_a_later_one() {
        let log = WakeLog::default();
        let first = log.begin_step();
        log.wake("open");
        assert!(log.woken_since("open", first));
        assert!(!log.woken_since("close", first));
        let second = log.begin_step();
        assert!(!log.woken_since("open", second));
        log.end_step(first);
        log.end_step(second);
    }

    #[test]
    fn a_wake_before_a_step_started_is_not_seen_by_it() {
        let log = WakeLog::default();
        log.wake("open");
        let step = log.begin_step();
        assert!(!log.woken_since("open", step));
        log.end_step(step);
    }

    /// Runs 100 short steps beside `long`, each waking an event, and checks that `long`
    /// still sees every one of those wakes.
    fn short_steps_wake_around(log: &WakeLog, long: StepStart) {
        for i in 0..100 {
            let short = log.begin_step();
            log.wake(&format!("event-{i}"));
            log.end_step(short);
        }
        for i in 0..100 {
            assert!(log.woken_since(&format!("event-{i}"), long), "event-{i}");
        }
    }

    #[test]
    fn a_long_step_keeps_its_wakes_while_epochs_move_on_around_it() {
        let log = WakeLog::default();
        let long = log.begin_step();
        short_steps_wake_around(&log, long);
        log.end_step(long);
    }

    /// A step begun on another thread is counted in that thread's stripe: the epochs
    /// that move on around it keep its wakes, and it ends from any thread.
    #[test]
    fn a_step_counted_in_another_stripe_keeps_its_wakes_and_ends_from_any_thread() {
        let log = WakeLog::default();
        let here = stripe_of_thread();
        let begin_elsewhere =
            || std::thread::scope(|scope| scope.spawn(|| log.begin_step()).join());
        let mut long = begin_elsewhere().unwrap();
        // Threads take stripes in turn: one of the next few is in another.
        while long.stripe == here {
            log.end_step(long);
            long = begin_elsewhere().unwrap();
        }
        short_steps_wake_around(&log, long);
        log.end_step(long);
        log.wake("late");
        log.wake("later");
        assert_eq!(log.remembered(), 2);
    }

    #[test]
    fn the_log_forgets_wakes_once_their_steps_ended() {
        let log = WakeLog::default();
        let long = log.begin_step();
        for i in 0..1000 {
            log.wake(&format!("event-{i}"));
        }
        // The long step may still suspend on any of them.
        assert!(log.woken_since("event-0", long));
        log.end_step(long);
        // Two wakes with no step running move two epochs on: only they are left.
        log.wake("late");
        log.wake("later");
        assert_eq!(log.remembered(), 2);
    }
}
