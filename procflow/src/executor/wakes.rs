//! Wakes that arrive while a step runs: a condition variable with a generation count.
//!
//! A handler checks its condition, finds it false and returns `Suspend(event)`. If the
//! caller makes the condition true and calls `wake(event)` while that step still runs,
//! nobody is registered on `event` yet: a bare notify would be lost and the procedure
//! would wait forever. So every wake gets a generation number, and every step remembers
//! the generation it started at. A step that ends by suspending on `event` first asks
//! whether `event` was woken after it started; if so it runs again instead of waiting.
//!
//! Only wakes that a running step may still need are kept: the log forgets a wake once
//! every step that started before it has ended.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The smallest log worth pruning: below it, keeping stale entries costs less than
/// scanning them.
const PRUNE_FLOOR: usize = 64;

/// Generations of recent wakes, and the steps running now.
#[derive(Debug, Default)]
pub(crate) struct WakeLog {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The generation of the newest wake.
    generation: u64,
    /// Event → generation of its newest wake, for wakes a running step may need.
    woken: HashMap<String, u64>,
    /// Start generation → how many running steps started at it.
    running: BTreeMap<u64, usize>,
    /// Prune `woken` once it holds this many events (amortised: doubled after a prune
    /// that kept most of them).
    prune_at: usize,
}

impl Default for State {
    fn default() -> Self {
        Self {
            generation: 0,
            woken: HashMap::new(),
            running: BTreeMap::new(),
            prune_at: PRUNE_FLOOR,
        }
    }
}

/// A running step's place in the log; give it back with [`WakeLog::end_step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepStart(u64);

impl WakeLog {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every method leaves the state consistent between statements.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that a step starts now.
    pub(crate) fn begin_step(&self) -> StepStart {
        let mut state = self.state();
        let at = state.generation;
        *state.running.entry(at).or_default() += 1;
        StepStart(at)
    }

    /// Records that the step that began at `start` ended.
    pub(crate) fn end_step(&self, start: StepStart) {
        let mut state = self.state();
        if let Some(count) = state.running.get_mut(&start.0) {
            *count -= 1;
            if *count == 0 {
                state.running.remove(&start.0);
            }
        }
        state.prune();
    }

    /// Records a wake of `event`. Nothing is kept when no step runs: a step that starts
    /// later sees the condition the waker set before waking.
    pub(crate) fn wake(&self, event: &str) {
        let mut state = self.state();
        state.generation += 1;
        if state.running.is_empty() {
            return;
        }
        let generation = state.generation;
        match state.woken.get_mut(event) {
            Some(at) => *at = generation,
            None => drop(state.woken.insert(event.to_owned(), generation)),
        }
        if state.woken.len() >= state.prune_at {
            state.prune();
        }
    }

    /// Whether `event` was woken after the step that began at `start` started.
    pub(crate) fn woken_since(&self, event: &str, start: StepStart) -> bool {
        self.state()
            .woken
            .get(event)
            .is_some_and(|&at| at > start.0)
    }
}

impl State {
    /// Forgets the wakes every running step started after (they need none of them).
    fn prune(&mut self) {
        let Some((&oldest, _)) = self.running.first_key_value() else {
            self.woken.clear();
            self.prune_at = PRUNE_FLOOR;
            return;
        };
        if self.woken.len() < self.prune_at {
            return;
        }
        self.woken.retain(|_, at| *at > oldest);
        self.prune_at = (self.woken.len() * 2).max(PRUNE_FLOOR);
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
    fn wakes_with_no_step_running_are_not_kept() {
        let log = WakeLog::default();
        log.wake("open");
        let step = log.begin_step();
        assert!(!log.woken_since("open", step));
        log.end_step(step);
        assert!(log.state().woken.is_empty());
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
        let step = log.begin_step();
        log.wake("late");
        log.end_step(step);
        assert!(log.state().woken.is_empty());
    }
}
