//! What the executor reports about a procedure.

use crate::stored::record::{Envelope, Wait};
use crate::{Error, Phase, ProcedureId};
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
    /// Ended by an operator's bypass, without running its remaining handlers (see
    /// [`Action::Bypass`](crate::operator::Action::Bypass)).
    Bypassed,
}

impl Status {
    /// Whether the procedure has ended.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::RolledBack | Self::Failed | Self::Bypassed
        )
    }

    /// A short lowercase name: `runnable`, `suspended`, `stuck`, `succeeded`… (what the
    /// CLI's `--status` filter and the admin page use).
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Runnable => "runnable",
            Self::WaitingChildren => "waiting-children",
            Self::WaitingForLock => "waiting-lock",
            Self::Suspended { .. } => "suspended",
            Self::Stuck { .. } => "stuck",
            Self::RollingBack => "rolling-back",
            Self::Succeeded => "succeeded",
            Self::RolledBack => "rolled-back",
            Self::Failed => "failed",
            Self::Bypassed => "bypassed",
        }
    }
}

/// A stored procedure's status, and its failure if it has one, from its phase and
/// envelope. The end is reported once it is recorded (`finished_ms` is set by the
/// `Finish` write): until then a procedure whose last step ended it is still finishing.
/// A stuck procedure is reported stuck only by the stored mark (the live executor knows
/// better).
pub(crate) fn status_of<'a>(phase: &'a Phase, envelope: &Envelope) -> (Status, Option<&'a Error>) {
    let ended = envelope.finished_ms.is_some();
    if envelope.bypass.is_some() {
        return (Status::Bypassed, None);
    }
    match (phase, &envelope.wait) {
        (_, Wait::Children(_)) if !ended => (Status::WaitingChildren, None),
        (_, Wait::Event { name, .. }) if !ended => (
            Status::Suspended {
                event: name.clone(),
            },
            None,
        ),
        (Phase::Running, _) => (Status::Runnable, None),
        (Phase::RollingBack { cause }, _) => (Status::RollingBack, Some(cause)),
        (Phase::Succeeded, _) if !ended => (Status::Runnable, None),
        (Phase::RolledBack { cause } | Phase::Failed { cause }, _) if !ended => {
            (Status::RollingBack, Some(cause))
        }
        (Phase::Succeeded, _) => (Status::Succeeded, None),
        (Phase::RolledBack { cause }, _) => (Status::RolledBack, Some(cause)),
        (Phase::Failed { cause }, _) => (Status::Failed, Some(cause)),
    }
}

/// A snapshot of one procedure, as [`Executor::state`](super::Executor::state),
/// [`list`](super::Executor::list) and [`subscribe`](super::Executor::subscribe) report it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    /// When it was submitted.
    pub submitted: std::time::SystemTime,
    /// When its record was last written (as of this snapshot).
    pub updated: std::time::SystemTime,
}

impl ProcedureInfo {
    /// How the procedure ended, once it has.
    #[must_use]
    pub fn outcome(&self) -> Option<Outcome> {
        outcome_of(&self.status, self.error.as_ref())
    }
}

/// How a procedure with `status` and `error` ended, once it has.
pub(crate) fn outcome_of(status: &Status, error: Option<&Error>) -> Option<Outcome> {
    let error = || error.cloned().unwrap_or_else(|| Error::fatal("unknown"));
    match status {
        Status::Succeeded => Some(Outcome::Succeeded),
        Status::RolledBack => Some(Outcome::RolledBack(error())),
        Status::Failed => Some(Outcome::Failed(error())),
        Status::Bypassed => Some(Outcome::Bypassed),
        _ => None,
    }
}

/// How a procedure ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// It reached a terminal state.
    Succeeded,
    /// It failed with this error and every completed `#[rollback]` step was undone.
    RolledBack(Error),
    /// It failed with this error and was not rolled back fully (past a point of no return,
    /// or a rollback step kept failing).
    Failed(Error),
    /// An operator bypassed it: it ended without running its remaining handlers, and
    /// nothing was undone.
    Bypassed,
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
