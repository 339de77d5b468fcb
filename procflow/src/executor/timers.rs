//! One timer for every dormant procedure: rouses it when its wait may be over.
//!
//! A procedure that waits for an event with a timeout, for a retry's backoff or with a
//! deadline has no task to sleep in (see [`Parked`](super::inner::Parked)): it leaves the
//! time it must look again here. One task sleeps until the earliest of them and rouses
//! the procedures whose time has come. A rouse is only a prompt to look: the procedure
//! checks what it waits for itself, so a stale or early entry costs one look and never
//! needs removing.

use super::inner::{Inner, Mode};
use crate::stored::record::now_ms;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// When to rouse which procedure: `(wall-clock ms, procedure id)`, earliest first.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    due: Mutex<BTreeSet<(u64, u64)>>,
    /// Told when an entry earlier than all others arrives: the sleeper sleeps too long.
    earlier: Notify,
}

impl Timers {
    fn due(&self) -> MutexGuard<'_, BTreeSet<(u64, u64)>> {
        // Inserts and removals leave the set consistent.
        self.due.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Rouses procedure `id` at `at_ms` (wall clock, ms since the epoch).
    pub(crate) fn add(&self, at_ms: u64, id: u64) {
        let mut due = self.due();
        let first = due.first().is_none_or(|&(next, _)| at_ms < next);
        due.insert((at_ms, id));
        drop(due);
        if first {
            self.earlier.notify_one();
        }
    }

    /// Takes out every entry due by `now_ms`; returns them and how long until the next.
    fn take_due(&self, now_ms: u64) -> (Vec<u64>, Option<Duration>) {
        let mut due = self.due();
        let later = due.split_off(&(now_ms.saturating_add(1), 0));
        let fired = std::mem::replace(&mut *due, later);
        let next = due
            .first()
            .map(|&(at, _)| Duration::from_millis(at.saturating_sub(now_ms)));
        (fired.into_iter().map(|(_, id)| id).collect(), next)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.due().len()
    }
}

/// The sleeper: rouses due procedures until the executor stops (or is gone). Holds the
/// executor only while rousing, so a dropped executor is not kept alive by it.
pub(crate) async fn run<E: Send + Sync + 'static>(timers: Arc<Timers>, inner: Weak<Inner<E>>) {
    loop {
        let (next, mut stopping) = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            if !inner.is_running() {
                return;
            }
            let (fired, next) = timers.take_due(now_ms());
            for id in fired {
                inner.rouse(id);
            }
            (next, inner.mode.subscribe())
        };
        // `wait_for` looks at the mode first: a stop that landed between the check above
        // and `subscribe` (a receiver starts with the current mode marked seen, so
        // `changed` would wait for a change that already happened) ends the sleep at once.
        let stopped = stopping.wait_for(|mode| !matches!(mode, Mode::Running));
        let sleep = async {
            match next {
                Some(next) => tokio::time::sleep(next).await,
                None => std::future::pending().await,
            }
        };
        // An entry added since `take_due` left a permit in `earlier`: no sleep too long.
        tokio::select! {
            () = sleep => {}
            () = timers.earlier.notified() => {}
            _ = stopped => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_entries_come_out_in_order_and_later_ones_stay() {
        let timers = Timers::default();
        timers.add(30, 3);
        timers.add(10, 1);
        timers.add(20, 2);
        timers.add(20, 2); // The same rouse twice is one entry.
        let (fired, next) = timers.take_due(20);
        assert_eq!(fired, vec![1, 2]);
        assert_eq!(next, Some(Duration::from_millis(10)));
        assert_eq!(timers.len(), 1);
        let (fired, next) = timers.take_due(100);
        assert_eq!(fired, vec![3]);
        assert_eq!(next, None);
    }
}
