//! A procedure whose stored data this build cannot decode, found as it is about to run.
//!
//! A procedure loaded from the store keeps its data encoded until its next step (see
//! [`lazy`](crate::executor::lazy)). If this build's procedure type cannot read that
//! data (a type changed without a migration, or a newer build wrote it), the procedure
//! is **stuck**, where it is: it keeps its locks and its place, its parent keeps waiting
//! for it, nothing is written, and it is reported [`Status::Stuck`] with why. An
//! operator can bypass it (that needs none of its data), or deploy a build that reads
//! the data; an abort is recorded, and its rollback runs once a build can decode it.
//!
//! Why not let it go, as it did: a procedure that gives up its for-life locks and leaves
//! the table is a half-done operation whose lock a competitor then takes, and a parent
//! that finds its child gone rolls back, undoing siblings that had succeeded.
//!
//! [`Status::Stuck`]: crate::executor::Status::Stuck

use super::Runner;
use crate::executor::inner::{Inner, Settled};
use crate::executor::status::Unloadable;
use crate::{Error, ProcedureId};

impl<E: Send + Sync + 'static> Runner<E> {
    /// Keeps the procedure stuck where it is, holding what it holds, until something
    /// rouses it (an operator's bypass or abort, a wake): it then tries again.
    pub(super) fn stuck_undecodable(&mut self, reason: &str) {
        let error = Error::fatal(format!(
            "its data cannot be decoded by this build: {reason}"
        ));
        self.become_stuck(&error);
        self.last_error = Some(Box::new(error));
        self.publish();
        self.park_until(None);
    }

    /// A newer build wrote its record, in a format this build reads only in part: it is
    /// stuck before it runs anything, and operators' requests on it are refused, since
    /// acting would rewrite the record in this build's format and drop what it cannot
    /// read. It keeps its locks (its envelope said which).
    pub(super) fn stuck_newer(&mut self, why: &str) {
        let error = Error::fatal(why.to_owned());
        self.become_stuck(&error);
        self.last_error = Some(Box::new(error));
        let refused = Settled::Refused(format!("{why} (this build does not rewrite it)"));
        self.settle_requests(&refused);
        self.publish();
        self.park_until(None);
    }
}

/// Lets procedure `id` go without writing it: the store keeps its last record. For a
/// parked procedure whose stored value no longer loads when roused (not expected: the
/// same bytes loaded at start). Its locks
/// are given back (if `holding`) and its entry leaves the table, as if it had never
/// loaded: `wait` and subscribers see it gone ([`NotFound`]), a parent finds its child
/// missing (and fails naming it), an operator's pending request is refused.
///
/// [`NotFound`]: crate::executor::ExecutorError::NotFound
pub(super) fn give_up<E>(
    inner: &Inner<E>,
    id: u64,
    parent: Option<u64>,
    holding: bool,
    machine: &str,
    reason: String,
) {
    if holding {
        inner.locks.release(id);
    }
    let refused = Settled::Refused(format!("it cannot be loaded: {reason}"));
    super::waits::settle_requests(inner, id, &refused);
    super::dormant::leave_admission(inner, parent);
    let mut table = inner.table();
    table.unloadable.push(Unloadable {
        id: ProcedureId::new(id),
        machine: machine.to_owned(),
        reason,
    });
    let entry = table.remove(id);
    if let Some(parent) = parent.and_then(|parent| table.procs.get_mut(&parent)) {
        parent.rouse();
    }
    drop(table);
    // Outside the table's lock: dropping the entry tells its subscribers and the callers
    // of `wake` waiting on it.
    drop(entry);
}
