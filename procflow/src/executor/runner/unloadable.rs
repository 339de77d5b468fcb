//! A procedure whose stored data no longer decodes, found as it is about to run.
//!
//! A procedure loaded from the store keeps its data encoded until its next step (see
//! [`lazy`](crate::executor::lazy)). If this build's procedure type cannot read that
//! data, the procedure is treated as one found unloadable at start: listed by
//! [`Executor::unloadable`](crate::executor::Executor::unloadable), logged, and left in
//! the store as it is, for an operator or a build that reads it.

use super::Runner;
use crate::ProcedureId;
use crate::executor::inner::{Inner, Settled};
use crate::executor::status::Unloadable;

impl<E: Send + Sync + 'static> Runner<E> {
    /// Lets the procedure go without writing it (see [`give_up`]).
    pub(super) fn give_up_unloadable(&mut self, reason: String) {
        let machine = self.procedure.machine();
        tracing::error!(
            id = self.id,
            machine,
            state = self.procedure.state(),
            %reason,
            "procedure data cannot be decoded; left in the store"
        );
        self.withdraw_lock_request();
        let holding = std::mem::take(&mut self.holding);
        give_up(&self.inner, self.id, self.parent, holding, machine, reason);
    }
}

/// Lets procedure `id` go without writing it: the store keeps its last record. Its locks
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
    let entry = table.procs.remove(&id);
    if let Some(parent) = parent.and_then(|parent| table.procs.get_mut(&parent)) {
        parent.rouse();
    }
    drop(table);
    // Outside the table's lock: dropping the entry tells its subscribers and the callers
    // of `wake` waiting on it.
    drop(entry);
}
