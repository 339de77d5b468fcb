//! What the executor reports about a procedure.

use crate::{Error, ProcedureId};
use std::time::SystemTime;

/// Where a procedure is in its life.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// Waiting for a worker, a running slot or a retry, or running a step.
    Runnable,
    /// Waiting for its children to end.
    WaitingChildren,
    /// Waiting for the locks it declared (holding no worker).
    WaitingForLock,
    /// Parked until `event` is woken (or its timeout elapses).
    Suspended {
        /// The event's name.
        event: String,
    },
    /// Its current step failed for good and it cannot roll back: past a point of no
    /// return (`#[no_rollback]`) the step fails fatally or has spent its retry budget, or
    /// the store refuses even the record of its rollback. It stays live, at its last
    /// stored step, and keeps retrying with capped backoff until the step succeeds or an
    /// operator acts. `wait` does not return while it is stuck.
    Stuck {
        /// The last failure of the step.
        error: Error,
        /// When it became stuck.
        since: SystemTime,
        /// Failed attempts of the current step so far.
        attempts: u32,
    },
    /// Undoing its completed steps after a failure.
    RollingBack,
    /// Reached a terminal state.
    Succeeded,
    /// Failed and undid every completed `#[rollback]` step.
    RolledBack,
    /// Failed and could not (or was not allowed to) roll back fully.
    Failed,
}

impl Status {
    /// Whether the procedure has ended.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        matches!(self, Self::Succeeded | Self::RolledBack | Self::Failed)
    }
}

/// A snapshot of one procedure, as [`Executor::state`](super::Executor::state),
/// [`list`](super::Executor::list) and [`subscribe`](super::Executor::subscribe) report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcedureInfo {
    /// Its id.
    pub id: ProcedureId,
    /// The procedure that spawned it.
    pub parent: Option<ProcedureId>,
    /// The stable name of its machine.
    pub machine: &'static str,
    /// Its life status.
    pub status: Status,
    /// The current step: the state that runs next (or ran last, once finished).
    pub state: &'static str,
    /// Steps completed so far (forward and rollback): its progress.
    pub steps: u64,
    /// The original failure while rolling back or once failed; the last retried error
    /// while a step is being retried.
    pub error: Option<Error>,
}

impl ProcedureInfo {
    /// How the procedure ended, once it has.
    #[must_use]
    pub fn outcome(&self) -> Option<Outcome> {
        let error = || {
            self.error
                .clone()
                .unwrap_or_else(|| Error::fatal("unknown"))
        };
        match self.status {
            Status::Succeeded => Some(Outcome::Succeeded),
            Status::RolledBack => Some(Outcome::RolledBack(error())),
            Status::Failed => Some(Outcome::Failed(error())),
            _ => None,
        }
    }
}

/// How a procedure ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It reached a terminal state.
    Succeeded,
    /// It failed with this error and every completed `#[rollback]` step was undone.
    RolledBack(Error),
    /// It failed with this error and was not rolled back fully (past a point of no return,
    /// or a rollback step kept failing).
    Failed(Error),
}

/// A stored procedure the executor could not load: its machine is not registered, or its
/// record cannot be read by this build. It stays in the store untouched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unloadable {
    /// Its id.
    pub id: ProcedureId,
    /// The machine name in its record (`?` when not even that could be read).
    pub machine: String,
    /// Why it could not be loaded.
    pub reason: String,
}
