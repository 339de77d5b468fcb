//! The generated dispatch, end to end through the in-memory `Stepper`: a five-state run
//! to its terminal, a failure at step 4 undoing steps 3, 2, 1, and a runaway loop stopped
//! by its `max_repeats` bound.

use procflow::prelude::*;
use procflow::{Phase, StepReport, Stepper};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;

/// What the handlers did, in order, shared through the environment.
#[derive(Default)]
struct Journal(Mutex<Vec<String>>);

impl Journal {
    fn push(&self, entry: impl Into<String>) {
        self.0.lock().unwrap().push(entry.into());
    }
    fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Five, env = Journal)]
enum FiveState {
    #[initial]
    #[transition(to = [Two])]
    #[rollback]
    One,
    #[transition(to = [Three])]
    #[rollback]
    Two,
    #[transition(to = [Four])]
    #[rollback]
    Three,
    #[transition(to = [Five])]
    Four,
    #[terminal]
    Five,
}

#[derive(Serialize, Deserialize)]
struct Five {
    /// The step whose handler fails fatally, if any.
    fail_at: Option<u32>,
    /// Retryable failures to return before the failing step gives up.
    transient: u32,
}

impl Five {
    fn step(&mut self, ctx: &Context<Journal>, n: u32) -> Result<(), Error> {
        if self.fail_at == Some(n) {
            if self.transient > 0 {
                self.transient -= 1;
                ctx.env().push(format!("retry {n}"));
                return Err(Error::retryable("busy"));
            }
            return Err(Error::fatal(format!("step {n} failed")));
        }
        ctx.env().push(format!("execute {n}"));
        Ok(())
    }
}

impl FiveStateHandlers for Five {
    async fn one(&mut self, ctx: &Context<Journal>) -> Step<five_state::One> {
        self.step(ctx, 1)?;
        Ok(five_state::One::Two.into())
    }
    async fn two(&mut self, ctx: &Context<Journal>) -> Step<five_state::Two> {
        self.step(ctx, 2)?;
        Ok(five_state::Two::Three.into())
    }
    async fn three(&mut self, ctx: &Context<Journal>) -> Step<five_state::Three> {
        self.step(ctx, 3)?;
        Ok(five_state::Three::Four.into())
    }
    async fn four(&mut self, ctx: &Context<Journal>) -> Step<five_state::Four> {
        self.step(ctx, 4)?;
        Ok(five_state::Four::Five.into())
    }
    async fn rollback_one(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback 1");
        Ok(())
    }
    async fn rollback_two(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback 2");
        Ok(())
    }
    async fn rollback_three(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback 3");
        Ok(())
    }
}

fn five(fail_at: Option<u32>, transient: u32) -> Stepper<FiveState> {
    Stepper::new(Five { fail_at, transient }, Journal::default())
}

#[tokio::test]
async fn five_states_run_to_the_terminal() {
    let mut run = five(None, 0);
    assert_eq!(run.run().await, &Phase::Succeeded);
    assert_eq!(run.cursor().state(), FiveState::Five);
    assert_eq!(run.cursor().steps(), 4);
    assert_eq!(
        run.env().entries(),
        ["execute 1", "execute 2", "execute 3", "execute 4"]
    );
}

#[tokio::test]
async fn failure_at_step_four_rolls_back_three_two_one() {
    let mut run = five(Some(4), 0);
    let Phase::RolledBack { cause } = run.run().await.clone() else {
        panic!("expected a rollback, got {:?}", run.cursor().phase());
    };
    assert_eq!(cause, Error::fatal("step 4 failed"));
    assert_eq!(
        run.env().entries(),
        [
            "execute 1",
            "execute 2",
            "execute 3",
            "rollback 3",
            "rollback 2",
            "rollback 1"
        ]
    );
}

#[tokio::test]
async fn only_rollback_states_are_undone() {
    // Failing at step 4 after step 4 itself has no rollback handler, and failing at step 2:
    // only `One` completed, so only it is undone.
    let mut run = five(Some(2), 0);
    assert!(matches!(run.run().await, Phase::RolledBack { .. }));
    assert_eq!(run.env().entries(), ["execute 1", "rollback 1"]);
}

#[tokio::test]
async fn retryable_errors_retry_the_same_step_then_count_as_fatal() {
    let mut run = five(Some(2), 2).with_retries(3);
    assert!(matches!(run.step().await, StepReport::Moved { .. }));
    assert!(matches!(run.step().await, StepReport::RetryLater(e) if e.is_retryable()));
    assert_eq!(run.cursor().state(), FiveState::Two, "a retry stays put");
    // Two transient failures, then the fatal one: still rolled back, with the last error.
    assert!(matches!(run.run().await, Phase::RolledBack { cause } if cause.is_fatal()));
    assert_eq!(
        run.env().entries(),
        ["execute 1", "retry 2", "retry 2", "rollback 1"]
    );
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Spinner, max_repeats = 1000)]
enum SpinnerState {
    #[initial]
    #[transition(to = [Spin])]
    #[rollback]
    Start,
    #[transition(to = [Spin, Done])]
    #[max_repeats = 5]
    Spin,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize, Default)]
struct Spinner {
    spins: u32,
    undone: bool,
}

impl SpinnerStateHandlers for Spinner {
    async fn start(&mut self, _: &Context<()>) -> Step<spinner_state::Start> {
        Ok(spinner_state::Start::Spin.into())
    }
    async fn spin(&mut self, _: &Context<()>) -> Step<spinner_state::Spin> {
        self.spins += 1;
        Ok(spinner_state::Spin::Spin.into())
    }
    async fn rollback_start(&mut self, _: &Context<()>) -> Result<(), Error> {
        self.undone = true;
        Ok(())
    }
}

#[tokio::test]
async fn a_self_loop_past_its_bound_fails_with_step_cycle_and_rolls_back() {
    let mut run = Stepper::<SpinnerState>::new(Spinner::default(), ());
    let Phase::RolledBack { cause } = run.run().await.clone() else {
        panic!("expected a rollback, got {:?}", run.cursor().phase());
    };
    assert_eq!(
        cause,
        Error::StepCycle {
            state: "Spin".into(),
            repeats: 6,
            max: 5
        }
    );
    // Entered once, re-entered five times (allowed), the sixth re-entry is refused.
    assert_eq!(run.procedure().spins, 6);
    assert!(run.procedure().undone);
    assert_eq!(SpinnerState::Start.max_repeats(), 1000, "enum default");
}

/// The user's own item already has the name the targets module would get (`job_state`).
mod job_state {
    pub const OWNED_BY_THE_USER: &str = "user";
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job, module = "job_steps")]
enum JobState {
    #[initial]
    #[transition(to = [Done])]
    Start,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Job;

impl JobStateHandlers for Job {
    async fn start(&mut self, _: &Context<()>) -> Step<job_steps::Start> {
        Ok(job_steps::Start::Done.into())
    }
}

#[tokio::test]
async fn module_renames_the_targets_module_when_its_default_name_is_taken() {
    let mut run = Stepper::<JobState>::new(Job, ());
    assert_eq!(run.run().await, &Phase::Succeeded);
    assert_eq!(run.cursor().state(), JobState::Done);
    assert_eq!(job_state::OWNED_BY_THE_USER, "user");
}
