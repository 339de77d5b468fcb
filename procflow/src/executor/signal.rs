//! A procedure's signal: what wakes its task, and whether an operator or its parent may
//! have asked it to stop, readable without the table's lock.
//!
//! Every turn of a procedure looks whether it was asked to abort or be bypassed
//! (`Runner::interruption`). The requests live in its table entry, under the lock of the
//! whole table, and that look took the lock on every step: with the snapshot published
//! after the step, two of each step's acquisitions of the one lock both workers share.
//! The signal, which the task holds anyway, now carries a flag set (under the table's
//! lock) by every such request; the task takes the lock only once the flag is up. A
//! request that comes just after the look is seen at the next turn, as before: one
//! that came just after the locked look was too.
//!
//! The flag is never lowered: a procedure asked once looks under the lock from then on,
//! as every procedure did before. It is rolling back, or ending, by then.
//!
//! The signal also holds the procedure's [`Progress`]: what a forward step of a running
//! procedure changes in its snapshot. Such a step used to publish its whole
//! snapshot to its table entry, at the end of its lane's poll: the table's lock, a
//! lookup in a map of every procedure, and the entry's lines, all cold at 1,024
//! procedures in flight, for a snapshot in which only the state, the step count and the
//! time had changed. On the durable WAL at 1,024 clients that publication cost 5–14 % of
//! the steps (docs/BENCHMARKS.md, stop 63). The task now writes those three here, in a
//! block it reads at every turn anyway; readers of the entry apply them
//! ([`Entry::snapshot`](super::inner::Entry::snapshot)). A step publishes whole as
//! before when its status changes, when it carries an error, when someone subscribed
//! to the procedure (the channel is told every change), or while the admin's journal
//! notes changes.

use std::ops::Deref;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

use super::packed::Progress;

/// See the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct Signal {
    wake: Notify,
    /// An abort or a bypass was asked since the signal was made (or before, if the
    /// entry held one then).
    asked_to_stop: AtomicBool,
    /// Someone subscribed to the procedure's snapshots: every step publishes whole.
    /// Raised under the table's lock when the channel is made, lowered when it is
    /// dropped.
    watched: AtomicBool,
    /// The progress of its last steps since its last whole publication, if any.
    progress: Mutex<Option<Progress>>,
}

impl Signal {
    /// A signal whose flag starts up if `asked_to_stop`, watched if `watched`.
    pub(crate) fn new(asked_to_stop: bool, watched: bool) -> Self {
        Signal {
            wake: Notify::new(),
            asked_to_stop: AtomicBool::new(asked_to_stop),
            watched: AtomicBool::new(watched),
            progress: Mutex::new(None),
        }
    }

    /// Marks the procedure as subscribed to, or not any more.
    pub(crate) fn set_watched(&self, watched: bool) {
        self.watched.store(watched, Ordering::Release);
    }

    /// Whether someone subscribed to the procedure's snapshots.
    pub(crate) fn is_watched(&self) -> bool {
        self.watched.load(Ordering::Acquire)
    }

    /// Keeps `progress` (`None`: forgets it, as a whole publication does).
    pub(crate) fn keep_progress(&self, progress: Option<Progress>) {
        *self.lock_progress() = progress;
    }

    /// The progress kept, if any.
    pub(crate) fn progress(&self) -> Option<Progress> {
        *self.lock_progress()
    }

    fn lock_progress(&self) -> std::sync::MutexGuard<'_, Option<Progress>> {
        // Nothing panics while it is locked; tolerate poisoning anyway.
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Raises the flag. Called under the table's lock, after the request is in the
    /// entry: a task that sees the flag and takes the lock finds the request.
    pub(crate) fn ask_to_stop(&self) {
        self.asked_to_stop.store(true, Ordering::Release);
    }

    /// Whether an abort or a bypass may be waiting in the entry.
    pub(crate) fn may_be_asked_to_stop(&self) -> bool {
        self.asked_to_stop.load(Ordering::Acquire)
    }
}

/// The signal wakes as a `Notify` does.
impl Deref for Signal {
    type Target = Notify;

    fn deref(&self) -> &Notify {
        &self.wake
    }
}
