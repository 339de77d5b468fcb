//! Dormant procedures: a procedure that cannot run has no task and no running slot.
//!
//! A procedure waiting for an event, its children, a lock, a retry's backoff or a timer
//! asks to park ([`Runner::park_until`]). At the end of its turn its task gives back the
//! running slot and leaves the procedure in its table entry
//! ([`Parked`](crate::executor::inner::Parked)), then ends. Whatever it waits for
//! rouses it ([`Entry::rouse`](crate::executor::inner::Entry::rouse)): a wake of its
//! event, a child that ends, a granted lock, an abort or bypass, or the executor's timer
//! ([`timers`](crate::executor::timers)) at the time it named. Roused, it gets a task
//! again, which takes a running slot (first come, first served, with new submits) and
//! looks at what it waited for: a rouse is only a prompt, so a stale one costs a look.
//!
//! What is parked is the procedure's `Runner`, in the box its task ran it from, when it
//! parks as it runs: it may know more than the store (a failed try, a retry's time). A procedure
//! loaded suspended at start is parked as its value in the store ([`Reload`]): the
//! store's bytes, shared, and what the table entry holds. A restart of a million
//! dormant procedures thus costs about their stored bytes.
//!
//! A dormant procedure keeps its for-life locks: the lock table holds them, not a task.

use super::{Exit, Launch, Ready, Runner};
use crate::executor::builder::{Read, launch_stored};
use crate::executor::inner::{Entry, Inner, Parked, Sleeper, Table};
use crate::executor::signal::Signal;
use crate::stored::record::now_ms;
use procflow_store::Bytes;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
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
        self: Box<Self>,
        until_ms: Option<u64>,
    ) -> Result<(), Box<Self>> {
        self.park(until_ms)
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
    pub(super) fn park(mut self: Box<Self>, until_ms: Option<u64>) -> Result<(), Box<Self>> {
        // A dormant procedure keeps no more than it needs: its next write makes them again.
        self.procedure.forget_written();
        let inner = Arc::clone(&self.inner);
        let id = self.id;
        lay_down(&inner, id, until_ms, self)
    }

    /// [`run`](Runner::run), in the span a procedure's task runs in: what a task of a
    /// new or resumed procedure, and of a parked one roused, runs.
    pub(super) fn run_in_span(self: Box<Self>) -> impl Future<Output = ()> + Send + use<E> {
        let span = tracing::info_span!(
            "procedure",
            id = self.id,
            machine = self.procedure.machine()
        );
        self.run().instrument(span)
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

/// Parks `sleeper` (procedure `id`) in its table entry, to be roused by what it waits
/// for, and at `until_ms` at the latest if given. `Err` gives it back when it must not
/// sleep: it was roused since its last look (a permit is waiting), or its entry is gone.
/// When the executor no longer runs, it is dropped: the procedure resumes at the next
/// start.
fn lay_down<E, S: Sleeper + 'static>(
    inner: &Inner<E>,
    id: u64,
    until_ms: Option<u64>,
    sleeper: Box<S>,
) -> Result<(), Box<S>> {
    let mut table = inner.table();
    // Under the table's lock: a stop drops the parked procedures after it changed the
    // mode, so one parking now would never be dropped.
    if !inner.is_running() {
        drop(table);
        // Outside the table's lock: dropping a procedure may run the user's `Drop`.
        drop(sleeper);
        return Ok(());
    }
    lay_down_in(&mut table, inner, id, until_ms, sleeper)
}

/// [`lay_down`] in a table already locked, the executor known to run.
fn lay_down_in<E, S: Sleeper + 'static>(
    table: &mut Table,
    inner: &Inner<E>,
    id: u64,
    until_ms: Option<u64>,
    sleeper: Box<S>,
) -> Result<(), Box<S>> {
    let Some(entry) = table.procs.get_mut(&id) else {
        return Err(sleeper);
    };
    // Rousers notify under this lock too: a rouse since the last look left a permit.
    if entry.take_permit() {
        return Err(sleeper);
    }
    lay_in(entry, inner, id, until_ms, sleeper);
    Ok(())
}

/// Leaves `sleeper` in `entry`, procedure `id`'s, to be roused at `until_ms` at the
/// latest if given.
fn lay_in<E, S: Sleeper + 'static>(
    entry: &mut Entry,
    inner: &Inner<E>,
    id: u64,
    until_ms: Option<u64>,
    sleeper: Box<S>,
) {
    if let Some(at) = until_ms {
        inner.timers.add(at, id);
    }
    tracing::trace!(id, ?until_ms, "dormant");
    entry.parked = Some(Parked(sleeper));
}

/// A procedure that parked while it ran sleeps as its whole `Runner` (which may know
/// more than its stored value: tries, a retry's time, a refused write), in the box its
/// task ran it from.
impl<E: Send + Sync + 'static> Sleeper for Runner<E> {
    fn rouse(self: Box<Self>, _entry: &mut Entry) {
        let runner = self;
        tracing::trace!(id = runner.id, "roused");
        runner.rejoin_admission();
        let inner = Arc::clone(&runner.inner);
        inner.spawn(runner.run_in_span());
    }
}

/// A procedure loaded dormant, parked as its value in the store: what a `Runner` adds
/// to that value, for one just loaded (88 bytes, against about 800 for a parked `Runner`
/// with its envelope, its procedure's cursor and its history decoded). So a restart's
/// dormant procedures cost the store's bytes and their table entries. Rebuilt from the
/// value, as at start, when roused.
pub(crate) struct Reload<E> {
    inner: Arc<Inner<E>>,
    id: u64,
    /// Its parent and ancestors; `None` for a root, as most are: one pointer, not the
    /// 32 bytes of an optional parent and an empty list (a million dormant procedures,
    /// 24 MB).
    lineage: Option<Box<Lineage>>,
    /// Whether it holds its locks (for life, given back at start).
    holding: bool,
    /// Its value as the store holds it (shared, not a copy).
    value: Bytes,
}

/// A child's place in its tree, for [`Reload`].
struct Lineage {
    parent: u64,
    ancestors: Vec<u64>,
}

impl<E: Send + Sync + 'static> Reload<E> {
    /// `launch`, just loaded from `value`, as its stored value.
    pub(super) fn of(inner: &Arc<Inner<E>>, launch: Launch<E>, value: Bytes) -> Box<Self> {
        let mut reload = Self::new(inner, (launch.id, launch.parent, launch.ancestors), value);
        reload.holding = launch.holding;
        reload
    }

    /// Procedure `id`, a child of `parent` (with `ancestors`) if given, as its stored
    /// `value`, holding no locks yet.
    pub(super) fn new(
        inner: &Arc<Inner<E>>,
        (id, parent, ancestors): (u64, Option<u64>, Vec<u64>),
        value: Bytes,
    ) -> Box<Self> {
        Box::new(Reload {
            inner: Arc::clone(inner),
            id,
            lineage: parent.map(|parent| Box::new(Lineage { parent, ancestors })),
            holding: false,
            value,
        })
    }

    fn parent(&self) -> Option<u64> {
        self.lineage.as_ref().map(|lineage| lineage.parent)
    }

    /// Marks it as holding its locks (given back at start).
    pub(super) fn set_holding(&mut self) {
        self.holding = true;
    }

    /// Parks it at once, out of the admission count, until roused or `until_ms`; if it
    /// must not sleep, it runs.
    pub(super) fn park(self: Box<Self>, until_ms: Option<u64>) {
        let inner = Arc::clone(&self.inner);
        leave_admission(&inner, self.parent());
        if let Err(reload) = lay_down(&inner, self.id, until_ms, self) {
            let wake = super::signal_of(&inner, reload.id);
            (*reload).start(wake);
        }
    }

    /// Parks it in `table` as the start loads it, before any task runs: never counted
    /// in the admission count, which the start makes of what it leaves running. `Err`
    /// gives it back if it must not sleep, or if the executor no longer runs (its start
    /// then drops it, outside the table's lock).
    ///
    /// `inner` is its executor's, passed in rather than cloned from its own: the start's
    /// second thread clones that `Arc` for every dormant procedure it makes, and a clone
    /// here too moved the count's cache line between the two threads for every record
    /// (perf: nine tenths of the time this took).
    pub(super) fn park_loaded(
        self: Box<Self>,
        inner: &Inner<E>,
        table: &mut Table,
        until_ms: Option<u64>,
    ) -> Result<(), Box<Self>> {
        if !inner.is_running() {
            return Err(self);
        }
        lay_down_in(table, inner, self.id, until_ms, self)
    }

    /// [`park_loaded`](Self::park_loaded) into `entry`, made for it at start and not in
    /// the table yet: nothing can have roused it, so no permit waits in it.
    pub(super) fn park_in_new(
        self: Box<Self>,
        inner: &Inner<E>,
        entry: &mut Entry,
        until_ms: Option<u64>,
    ) -> Result<(), Box<Self>> {
        if !inner.is_running() {
            return Err(self);
        }
        lay_in(entry, inner, self.id, until_ms, self);
        Ok(())
    }

    /// Gives it a task, counted in again, whose runner `wake` wakes.
    fn start(self, wake: Arc<Signal>) {
        tracing::trace!(id = self.id, "roused");
        rejoin_admission(&self.inner, self.parent());
        let inner = Arc::clone(&self.inner);
        inner.spawn(self.run(wake));
    }

    /// Its task: the procedure decoded from its value (in the task, not on the thread
    /// that roused it), then run.
    fn run(self, wake: Arc<Signal>) -> impl Future<Output = ()> + Send + 'static + use<E> {
        super::run_when_ready(futures_util::future::lazy(move |_| self.rebuild(wake)))
    }

    /// What its task runs, decoded from its value; `None` if that value no longer
    /// decodes (the procedure is then reported, and left in the store).
    fn rebuild(self, wake: Arc<Signal>) -> Option<Ready<E>> {
        let Reload {
            inner,
            id,
            lineage,
            holding,
            value,
        } = self;
        let (parent, ancestors) = match lineage {
            Some(lineage) => (Some(lineage.parent), lineage.ancestors),
            None => (None, Vec::new()),
        };
        let loaded = launch_stored(&inner, id, parent, ancestors, &value, false, Read::Whole);
        match loaded {
            Ok(mut launch) => {
                launch.holding = holding;
                Some((inner, launch, wake))
            }
            // The same bytes decoded at start but for the history (`Read::AtStart`), so
            // this is not expected; if it happens the procedure is reported, as one
            // whose data no longer decodes is.
            Err((machine, reason)) => {
                tracing::error!(id, %machine, %reason, "a parked procedure's stored value no longer decodes; left in the store");
                super::unloadable::give_up(&inner, id, parent, holding, &machine, reason);
                None
            }
        }
    }
}

impl<E: Send + Sync + 'static> Sleeper for Reload<E> {
    fn rouse(self: Box<Self>, entry: &mut Entry) {
        (*self).start(entry.signal());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::runner::{SMALL_TASK, output_size};

    /// A roused dormant procedure's task holds its stored value until it is decoded,
    /// then the running procedure, never both (as one `async fn` it was 3,008 bytes).
    #[test]
    fn a_roused_procedures_task_is_small() {
        let size = output_size(|(reload, wake): (Reload<()>, Arc<Signal>)| reload.run(wake));
        assert!(
            size <= SMALL_TASK,
            "a roused procedure's task is {size} bytes"
        );
    }
}
