//! Dormant procedures: a procedure that cannot run has no task and no running slot.
//!
//! A procedure waiting for an event, its children, a lock, a retry's backoff or a timer
//! asks to park ([`Runner::park_until`]). At the end of its turn its task gives back the
//! running slot and leaves the procedure in its table entry as a
//! [`Parked`](crate::executor::inner::Parked) closure, then ends. Whatever it waits for
//! rouses it ([`Entry::rouse`](crate::executor::inner::Entry::rouse)): a wake of its
//! event, a child that ends, a granted lock, an abort or bypass, or the executor's timer
//! ([`timers`](crate::executor::timers)) at the time it named. Roused, it gets a task
//! again, which takes a running slot (first come, first served, with new submits) and
//! looks at what it waited for: a rouse is only a prompt, so a stale one costs a look.
//!
//! A dormant procedure keeps its for-life locks: the lock table holds them, not a task.

use super::{Exit, Runner};
use crate::executor::builder::launch_stored;
use crate::executor::inner::{Inner, Parked};
use crate::executor::record::now_ms;
use futures_util::FutureExt;
use procflow_store::Bytes;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::Notify;
use tracing::Instrument;

impl<E: Send + Sync + 'static> Runner<E> {
    /// Asks to park at the end of this turn, to be roused by what the procedure waits
    /// for, and at `until_ms` (wall clock) at the latest if given.
    ///
    /// A root leaves the admission count here, not when it parks: its waiting status may
    /// be published before it gets there, and a caller who sees it may submit at once
    /// (as with the end of a procedure). [`Runner::run`] counts it in again if it does
    /// not park after all.
    pub(super) fn park_until(&mut self, until_ms: Option<u64>) {
        if self.parking.is_none() {
            self.leave_admission();
        }
        self.parking = Some(until_ms);
    }

    /// A root leaves the roots counted against `Config::queue_capacity`: it ended, or it
    /// waits. Children are never counted.
    pub(super) fn leave_admission(&self) {
        leave_admission(&self.inner, self.parent);
    }

    /// A root that left the count runs again: roused, or it did not park after all.
    fn rejoin_admission(&self) {
        rejoin_admission(&self.inner, self.parent);
    }

    /// [`Runner::park`] for a procedure already out of the admission count: if it must
    /// go on instead, it is counted in again.
    pub(super) fn park_counted_out(
        self,
        until_ms: Option<u64>,
        stored: Option<Bytes>,
    ) -> Result<(), Box<Self>> {
        self.park(until_ms, stored)
            .inspect_err(|runner| runner.rejoin_admission())
    }

    /// The deadline's time, while it may still end the procedure.
    pub(super) fn deadline_ms(&self) -> Option<u64> {
        self.envelope.deadline_ms.filter(|_| self.may_roll_back())
    }

    /// Parks the procedure in its table entry, ending its task. `Err` gives it back when
    /// it must not sleep: it was roused since its last look (a permit is waiting), or
    /// its entry is gone. When the executor no longer runs, the procedure is dropped: it
    /// resumes at the next start.
    ///
    /// `stored` is the procedure's value in the store when the `Runner` holds nothing
    /// that value does not (a procedure just loaded): it is then parked as that value,
    /// shared with the store, and rebuilt from it when roused ([`Reload`]), instead of
    /// as the whole `Runner`.
    pub(super) fn park(
        self,
        until_ms: Option<u64>,
        stored: Option<Bytes>,
    ) -> Result<(), Box<Self>> {
        let inner = Arc::clone(&self.inner);
        let mut table = inner.table();
        // Under the table's lock: a stop drops the parked procedures after it changed
        // the mode, so one parking now would never be dropped.
        if !inner.is_running() {
            return Ok(());
        }
        // Rousers notify under this lock too: a rouse since the last look left a permit.
        if self.wake.notified().now_or_never().is_some() {
            return Err(Box::new(self));
        }
        let Some(entry) = table.procs.get_mut(&self.id) else {
            return Err(Box::new(self));
        };
        if let Some(at) = until_ms {
            inner.timers.add(at, self.id);
        }
        tracing::trace!(id = self.id, ?until_ms, "dormant");
        let handle = tokio::runtime::Handle::current();
        let Some(value) = stored else {
            entry.parked = Some(Parked(Box::new(move || {
                tracing::trace!(id = self.id, "roused");
                self.rejoin_admission();
                let tasks = self.inner.tasks.clone();
                let span = self.span();
                handle.spawn(tasks.track_future(self.run().instrument(span)));
            })));
            return Ok(());
        };
        let reload = Reload {
            inner: Arc::clone(&self.inner),
            id: self.id,
            parent: self.parent,
            ancestors: self.ancestors.clone().into_boxed_slice(),
            holding: self.holding,
            wake: Arc::clone(&self.wake),
            value,
        };
        entry.parked = Some(Parked(Box::new(move || reload.rouse(&handle))));
        drop(table);
        // Outside the table's lock: dropping a procedure may run the user's `Drop`.
        drop(self);
        Ok(())
    }

    /// The span a procedure's task runs in.
    pub(super) fn span(&self) -> tracing::Span {
        tracing::info_span!(
            "procedure",
            id = self.id,
            machine = self.procedure.machine()
        )
    }

    /// Waits out a retry's backoff: parked until it is over; an abort or the deadline
    /// rolls back at once.
    pub(super) async fn await_retry(&mut self) -> Result<(), Exit> {
        let Some(at) = self.retry_at else {
            return Ok(());
        };
        if let Some(cause) = self.interruption() {
            self.retry_at = None;
            return self.interrupt(cause).await;
        }
        if now_ms() < at {
            self.park_until(earliest(Some(at), self.deadline_ms()));
            return Ok(());
        }
        self.retry_at = None;
        Ok(())
    }
}

/// The wall-clock time `delay` from now, in ms (the delay rounded up).
pub(super) fn after(delay: Duration) -> u64 {
    let ms = u64::try_from(delay.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
    now_ms().saturating_add(ms)
}

/// The earlier of two optional times.
pub(super) fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A root leaves the roots counted against `Config::queue_capacity`. Children are never
/// counted.
pub(super) fn leave_admission<E>(inner: &Inner<E>, parent: Option<u64>) {
    if parent.is_none() {
        inner.live_roots.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A root that left the admission count runs again.
fn rejoin_admission<E>(inner: &Inner<E>, parent: Option<u64>) {
    if parent.is_none() {
        inner.live_roots.fetch_add(1, Ordering::AcqRel);
    }
}

/// A procedure parked as its value in the store: what a `Runner` adds to that value,
/// for one just loaded. About a tenth of a parked `Runner` (with its envelope, its
/// procedure's cursor and its history decoded), so that a restart's dormant procedures
/// cost the store's bytes and their table entries.
struct Reload<E> {
    inner: Arc<Inner<E>>,
    id: u64,
    parent: Option<u64>,
    ancestors: Box<[u64]>,
    /// Whether it holds its locks (for life, given back at start).
    holding: bool,
    wake: Arc<Notify>,
    /// Its value as the store holds it (shared, not a copy).
    value: Bytes,
}

impl<E: Send + Sync + 'static> Reload<E> {
    /// Gives the procedure a task again: it decodes the value and runs.
    fn rouse(self, handle: &tokio::runtime::Handle) {
        tracing::trace!(id = self.id, "roused");
        rejoin_admission(&self.inner, self.parent);
        let tasks = self.inner.tasks.clone();
        handle.spawn(tasks.track_future(self.run()));
    }

    async fn run(self) {
        let Reload {
            inner,
            id,
            parent,
            ancestors,
            holding,
            wake,
            value,
        } = self;
        let loaded = launch_stored(&inner, id, parent, ancestors.into_vec(), &value, false);
        match loaded {
            Ok(mut launch) => {
                launch.holding = holding;
                let runner = Runner::new(&inner, launch, wake);
                let span = runner.span();
                runner.run().instrument(span).await;
            }
            // The same bytes decoded at start, so this is not expected; if it happens
            // the procedure is reported, as one whose data no longer decodes is.
            Err((machine, reason)) => {
                tracing::error!(id, %machine, %reason, "a parked procedure's stored value no longer decodes; left in the store");
                super::unloadable::give_up(&inner, id, parent, holding, &machine, reason);
            }
        }
    }
}
