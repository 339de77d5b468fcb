//! A tiny in-memory driver: runs one procedure step by step, with no store and no
//! executor. For unit tests of handlers and for exploring a machine.

use crate::instance::{Instance, Progress};
use crate::{Child, Context, Cursor, Error, Phase, ProcedureId, StateMachine};
use std::sync::Arc;
use std::time::Duration;

/// What one call to [`Stepper::step`] did.
#[derive(Debug)]
#[non_exhaustive]
pub enum StepReport<M> {
    /// The step completed and the procedure moved from `from` to `to`.
    Moved {
        /// The state whose handler ran.
        from: M,
        /// The new current state.
        to: M,
    },
    /// The step asked for children. The stepper does not run them: they are handed
    /// back, and the procedure moved on to `to` as if they had all succeeded.
    Spawned {
        /// The children the step asked for.
        children: Vec<Child>,
        /// The new current state.
        to: M,
    },
    /// The step suspended on an event; the next `step` runs the same state again.
    Suspended {
        /// The event's name.
        event: String,
        /// The timeout the step asked for.
        timeout: Option<Duration>,
    },
    /// The step yielded; the next `step` runs the same state again.
    Yielded,
    /// The step (or rollback step) failed with an error the runtime would retry; the
    /// next `step` runs it again.
    RetryLater(Error),
    /// A failure started the rollback (the next steps undo completed states).
    RollbackStarted(Error),
    /// The rollback handler of this state ran.
    RolledBack(M),
    /// The procedure has ended; see [`Stepper::cursor`] for how.
    Finished,
}

/// Runs one procedure of machine `M` in memory, one step per call.
///
/// Failures follow the runtime's rules, minus the timing: a retryable error (or any
/// error past a point of no return) is reported as [`StepReport::RetryLater`] and the
/// same step runs at the next call; a fatal error starts the rollback.
/// [`run`](Self::run) retries each step at most `retries` times in a row (no backoff)
/// before it treats the error as fatal.
///
/// # Examples
///
/// ```
/// use procflow::prelude::*;
/// use procflow::{Phase, Stepper};
///
/// #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
/// #[state_machine(procedure = Counter)]
/// enum CounterState {
///     #[initial] #[transition(to = [Add, Done])] Start,
///     #[transition(to = [Add, Done])] #[max_repeats = 5] Add,
///     #[terminal] Done,
/// }
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Counter { value: u32 }
///
/// impl CounterStateHandlers for Counter {
///     async fn start(&mut self, _: &Context<()>) -> Step<counter_state::Start> {
///         Ok(counter_state::Start::Add.into())
///     }
///     async fn add(&mut self, _: &Context<()>) -> Step<counter_state::Add> {
///         self.value += 1;
///         Ok(if self.value < 3 { counter_state::Add::Add } else { counter_state::Add::Done }.into())
///     }
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let mut stepper = Stepper::<CounterState>::new(Counter { value: 0 }, ());
/// assert_eq!(stepper.run().await, &Phase::Succeeded);
/// assert_eq!(stepper.procedure().value, 3);
/// assert_eq!(stepper.cursor().state(), CounterState::Done);
/// # });
/// ```
pub struct Stepper<M: StateMachine> {
    instance: Instance<M>,
    ctx: Context<M::Env>,
    retries: u32,
    failures_in_a_row: u32,
}

impl<M: StateMachine> Stepper<M> {
    /// A new procedure with data `procedure` sharing environment `env`, at the initial
    /// state, with id `#0` and 3 retries per step for [`run`](Self::run).
    pub fn new(procedure: M::Procedure, env: M::Env) -> Self {
        Self::resume(procedure, Cursor::new(), Arc::new(env))
    }

    /// Continues a procedure from `cursor` (for instance one read back with
    /// [`codec::decode`](crate::codec::decode)).
    pub fn resume(procedure: M::Procedure, cursor: Cursor<M>, env: Arc<M::Env>) -> Self {
        Self {
            instance: Instance { procedure, cursor },
            ctx: Context::new(ProcedureId::new(0), env),
            retries: 3,
            failures_in_a_row: 0,
        }
    }

    /// Sets how many times in a row [`run`](Self::run) retries a failing step.
    #[must_use]
    pub fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The procedure's data.
    pub fn procedure(&self) -> &M::Procedure {
        &self.instance.procedure
    }

    /// The shared environment.
    pub fn env(&self) -> &M::Env {
        self.ctx.env()
    }

    /// The procedure's position.
    pub fn cursor(&self) -> &Cursor<M> {
        &self.instance.cursor
    }

    /// Takes the procedure's data and position back.
    pub fn into_parts(self) -> (M::Procedure, Cursor<M>) {
        (self.instance.procedure, self.instance.cursor)
    }

    /// Runs one step: the current state's execute handler while running, the next
    /// rollback handler while rolling back.
    pub async fn step(&mut self) -> StepReport<M> {
        let from = self.instance.cursor.state();
        match self.instance.step(&self.ctx).await {
            Progress::Moved { from } => StepReport::Moved {
                from,
                to: self.instance.cursor.state(),
            },
            Progress::Spawned(children) => StepReport::Spawned {
                children,
                to: self.instance.cursor.state(),
            },
            Progress::Suspended { event, timeout } => StepReport::Suspended { event, timeout },
            Progress::Yielded => StepReport::Yielded,
            Progress::RolledBack(state) => StepReport::RolledBack(state),
            Progress::Finished => StepReport::Finished,
            Progress::Failed(error) if self.rolling_back() => StepReport::RetryLater(error),
            Progress::Failed(error) => {
                debug_assert_eq!(from, self.instance.cursor.state());
                match self.instance.cursor.fail_forward(error.clone(), false) {
                    Ok(()) => StepReport::RollbackStarted(error),
                    Err(error) => StepReport::RetryLater(error),
                }
            }
        }
    }

    /// Steps until the procedure ends and returns how it ended.
    ///
    /// A step that keeps failing is retried `retries` times in a row; then a forward step
    /// rolls back (or fails, past a point of no return) and a rollback step fails the
    /// procedure, keeping the original error.
    pub async fn run(&mut self) -> &Phase {
        loop {
            match self.step().await {
                StepReport::Finished => return self.instance.cursor.phase(),
                StepReport::RetryLater(error) => self.after_failure(error),
                _ => self.failures_in_a_row = 0,
            }
        }
    }

    fn rolling_back(&self) -> bool {
        matches!(self.instance.cursor.phase(), Phase::RollingBack { .. })
    }

    fn after_failure(&mut self, error: Error) {
        self.failures_in_a_row += 1;
        if self.failures_in_a_row <= self.retries {
            return;
        }
        self.failures_in_a_row = 0;
        let cursor = &mut self.instance.cursor;
        match cursor.phase().clone() {
            Phase::RollingBack { cause } => cursor.fail(cause),
            _ => {
                if let Err(error) = self.instance.cursor.fail_forward(error, true) {
                    self.instance.cursor.fail(error);
                }
            }
        }
    }
}
