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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Generations of recent wakes, and how many steps run, by epoch.
///
/// A step costs two atomic increments and no lock: it counts itself in the current
/// epoch's parity. A wake moves the epoch on once no step of the previous epoch runs,
/// and forgets that epoch's wakes. So a running step's own epoch and the next one are
/// never forgotten: between them they hold every wake since the step started.
#[derive(Debug, Default)]
pub(crate) struct WakeLog {
    /// The generation of the newest wake.
    generation: AtomicU64,
    epoch: AtomicU64,
    /// Steps running, by the parity of the epoch they started in.
    running: [AtomicUsize; 2],
    /// Event → generation of its newest wake, by the parity of the epoch it came in.
    woken: Mutex<[HashMap<String, u64>; 2]>,
}

/// A running step's place in the log; give it back with [`WakeLog::end_step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepStart {
    epoch: u64,
    generation: u64,
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
        loop {
            let epoch = self.epoch.load(SeqCst);
            self.running[parity(epoch)].fetch_add(1, SeqCst);
            // The epoch moved on meanwhile: its wakes may be forgotten; count in the new.
            if self.epoch.load(SeqCst) == epoch {
                let generation = self.generation.load(SeqCst);
                return StepStart { epoch, generation };
            }
            self.running[parity(epoch)].fetch_sub(1, SeqCst);
        }
    }

    /// Records that the step that began at `start` ended.
    pub(crate) fn end_step(&self, start: StepStart) {
        self.running[parity(start.epoch)].fetch_sub(1, SeqCst);
    }

    /// Records a wake of `event`.
    pub(crate) fn wake(&self, event: &str) {
        let mut woken = self.woken();
        let generation = self.generation.fetch_add(1, SeqCst) + 1;
        let mut epoch = self.epoch.load(SeqCst);
        // No step of the previous epoch runs: no one needs its wakes any more.
        if self.running[parity(epoch + 1)].load(SeqCst) == 0 {
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

    #[test]
    fn a_long_step_keeps_its_wakes_while_epochs_move_on_around_it() {
        let log = WakeLog::default();
        let long = log.begin_step();
        for i in 0..100 {
            let short = log.begin_step();
            log.wake(&format!("event-{i}"));
            log.end_step(short);
        }
        for i in 0..100 {
            assert!(log.woken_since(&format!("event-{i}"), long), "event-{i}");
        }
        log.end_step(long);
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
