//! One procedure of machine `M`, and the single step logic every driver shares (the
//! in-memory [`Stepper`](crate::Stepper) and the executor).

use crate::{Child, Context, Cursor, Error, Flow, Phase, StateMachine};
use std::time::Duration;

/// What one step did.
#[derive(Debug)]
pub(crate) enum Progress<M> {
    /// An execute step completed and the cursor moved from `from` to the current state.
    Moved { from: M },
    /// An execute step asked for children; the cursor moved to the state after them.
    Spawned(Vec<Child>),
    /// The step suspended on an event; the same state runs again when it is woken.
    Suspended {
        event: String,
        timeout: Option<Duration>,
    },
    /// The step yielded; the same state runs again.
    Yielded,
    /// The rollback handler of this state ran and the state was popped.
    RolledBack(M),
    /// The step (or rollback step) failed; the cursor is where it was, except after a
    /// step cycle (the current step completed but the move was refused).
    Failed(Error),
    /// Nothing to do: the procedure has ended.
    Finished,
}

/// A procedure's data and position.
pub(crate) struct Instance<M: StateMachine> {
    pub(crate) procedure: M::Procedure,
    pub(crate) cursor: Cursor<M>,
}

impl<M: StateMachine> Instance<M> {
    /// Runs one step: the current state's execute handler while running, the next
    /// rollback handler while rolling back.
    pub(crate) async fn step(&mut self, ctx: &Context<M::Env>) -> Progress<M> {
        match self.cursor.phase() {
            Phase::Running => self.execute(ctx).await,
            Phase::RollingBack { .. } => self.undo(ctx).await,
            _ => Progress::Finished,
        }
    }

    async fn execute(&mut self, ctx: &Context<M::Env>) -> Progress<M> {
        let from = self.cursor.state();
        let flow = match from.execute_from_state(&mut self.procedure, ctx).await {
            Ok(flow) => flow,
            Err(error) => return Progress::Failed(error),
        };
        match flow {
            Flow::Next(to) => self.advance(to, Progress::Moved { from }),
            Flow::Spawn { children, then } => self.advance(then, Progress::Spawned(children)),
            Flow::Suspend { event, timeout } => Progress::Suspended { event, timeout },
            Flow::Yield => Progress::Yielded,
        }
    }

    fn advance(&mut self, to: M, done: Progress<M>) -> Progress<M> {
        match self.cursor.advance(to) {
            Ok(()) => done,
            Err(cycle) => Progress::Failed(cycle),
        }
    }

    async fn undo(&mut self, ctx: &Context<M::Env>) -> Progress<M> {
        let Some(state) = self.cursor.pending_rollback() else {
            return Progress::Finished;
        };
        match state.rollback_state(&mut self.procedure, ctx).await {
            Ok(()) => {
                self.cursor.rolled_back();
                Progress::RolledBack(state)
            }
            Err(error) => Progress::Failed(error),
        }
    }
}
