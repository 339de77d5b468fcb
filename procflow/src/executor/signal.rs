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

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

/// See the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct Signal {
    wake: Notify,
    /// An abort or a bypass was asked since the signal was made (or before, if the
    /// entry held one then).
    asked_to_stop: AtomicBool,
}

impl Signal {
    /// A signal whose flag starts up if `asked_to_stop`.
    pub(crate) fn new(asked_to_stop: bool) -> Self {
        Signal {
            wake: Notify::new(),
            asked_to_stop: AtomicBool::new(asked_to_stop),
        }
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
