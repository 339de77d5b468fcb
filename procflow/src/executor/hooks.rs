//! Kill hooks: stop the executor right before or right after a store write, to prove that
//! what was persisted is enough to resume.

use crate::ProcedureId;

/// Which side of a store write a [`StoreWrite`] is reported on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WritePoint {
    /// The write has not been issued: killing here loses it, as a crash would.
    Before,
    /// The write is durable: killing here loses only what comes after it.
    After,
}

/// What a store write is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WriteKind {
    /// A new procedure (with its nonce and id reservation).
    Submit,
    /// A forward step completed.
    Step,
    /// A step started children (persisted together with them).
    Spawn,
    /// A step suspended on an event, or a suspended procedure was woken.
    Suspend,
    /// A rollback started or a rollback step completed.
    Rollback,
    /// The procedure ended.
    Finish,
    /// Finished procedures past their retention were deleted.
    Cleanup,
    /// An operator's request was stored, or deleted once carried out.
    Request,
    /// The procedure was granted the locks it holds for life: recorded before the first
    /// step that runs under them, so a restart gives them back to it.
    Lock,
}

/// One store write, as a [`KillHook`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreWrite {
    /// The procedure the write is for (the parent, for [`WriteKind::Spawn`]).
    pub procedure: ProcedureId,
    /// What the write is for.
    pub kind: WriteKind,
    /// Before or after it.
    pub point: WritePoint,
    /// The number of store writes this executor issued before this one.
    pub index: u64,
}

/// Decides, at every store write, whether the executor dies there.
///
/// Once it returns `true` the executor stops as if the process had crashed: the write
/// (for [`WritePoint::Before`]) and everything after it never reach the store, handlers
/// still running finish without their result being persisted, and waiters get
/// [`ExecutorError::Killed`](super::ExecutorError::Killed). Start a new executor on the
/// same store to recover. Any `Fn(&StoreWrite) -> bool` is a hook.
pub trait KillHook: Send + Sync + 'static {
    /// Whether to die at `write`.
    fn kill(&self, write: &StoreWrite) -> bool;
}

impl<F: Fn(&StoreWrite) -> bool + Send + Sync + 'static> KillHook for F {
    fn kill(&self, write: &StoreWrite) -> bool {
        self(write)
    }
}
