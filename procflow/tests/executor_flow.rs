//! Executor behaviour specific to flow controls and failure rules: points of no return,
//! step cycles, yields. Every scenario runs on a `MemStore` and on a durable `WalStore`.

mod common;

use common::{Bounded, Ledger, TestStore};
use procflow::executor::{Executor, Outcome};
use procflow::prelude::*;
use serde::{Deserialize, Serialize};

on_both_stores! {
    failures_past_a_point_of_no_return_are_retried_not_rolled_back => failures_past_a_point_of_no_return_are_retried_not_rolled_back;
    fatal_error_before_the_point_of_no_return_rolls_back => fatal_error_before_the_point_of_no_return_rolls_back;
    step_cycle_is_fatal => step_cycle_is_fatal;
    yielding_procedures_interleave_and_keep_their_order => yielding_procedures_interleave_and_keep_their_order;
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Commit, env = Ledger)]
enum CommitState {
    #[initial]
    #[transition(to = [Publish])]
    #[rollback]
    Reserve,
    #[transition(to = [Done])]
    #[no_rollback]
    Publish,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Commit {
    /// Fatal failures `Publish` returns before it succeeds.
    publish_failures: u32,
    /// `Reserve` fails fatally.
    reserve_fails: bool,
}

impl CommitStateHandlers for Commit {
    async fn reserve(&mut self, ctx: &Context<Ledger>) -> Step<commit_state::Reserve> {
        ctx.env().push("reserve");
        if self.reserve_fails {
            return Err(Error::fatal("no capacity"));
        }
        Ok(commit_state::Reserve::Publish.into())
    }
    async fn rollback_reserve(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push("rollback reserve");
        Ok(())
    }
    async fn publish(&mut self, ctx: &Context<Ledger>) -> Step<commit_state::Publish> {
        ctx.env().push("publish");
        if self.publish_failures > 0 {
            self.publish_failures -= 1;
            return Err(Error::fatal("downstream refused"));
        }
        Ok(commit_state::Publish::Done.into())
    }
}

async fn commit_executor(store: &TestStore, ledger: &Ledger) -> Executor<Ledger> {
    store
        .builder(ledger)
        .register::<CommitState>()
        .register::<LoopState>()
        .register::<TurnsState>()
        .start()
        .await
        .unwrap()
}

async fn failures_past_a_point_of_no_return_are_retried_not_rolled_back(store: TestStore) {
    let ledger = Ledger::default();
    let executor = commit_executor(&store, &ledger).await;
    // More fatal failures than the retry budget (5): past the point of no return the
    // budget does not apply.
    let id = executor
        .submit(Commit {
            publish_failures: 8,
            reserve_fails: false,
        })
        .await
        .unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!(ledger.count("publish"), 9);
    assert_eq!(ledger.count("rollback reserve"), 0);
}

async fn fatal_error_before_the_point_of_no_return_rolls_back(store: TestStore) {
    let ledger = Ledger::default();
    let executor = commit_executor(&store, &ledger).await;
    let id = executor
        .submit(Commit {
            publish_failures: 0,
            reserve_fails: true,
        })
        .await
        .unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::RolledBack(Error::fatal("no capacity"))
    );
    assert_eq!(ledger.count("reserve"), 1, "fatal: not retried");
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Loop, env = Ledger)]
enum LoopState {
    #[initial]
    #[transition(to = [Spin, Done])]
    #[max_repeats = 3]
    Spin,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Loop;

impl LoopStateHandlers for Loop {
    async fn spin(&mut self, ctx: &Context<Ledger>) -> Step<loop_state::Spin> {
        ctx.env().push("spin");
        Ok(loop_state::Spin::Spin.into())
    }
}

async fn step_cycle_is_fatal(store: TestStore) {
    let ledger = Ledger::default();
    let executor = commit_executor(&store, &ledger).await;
    let id = executor.submit(Loop).await.unwrap();
    let outcome = executor.wait(id).bounded().await.unwrap();
    assert_eq!(
        outcome,
        Outcome::RolledBack(Error::StepCycle {
            state: "Spin".into(),
            repeats: 4,
            max: 3
        })
    );
    assert_eq!(ledger.count("spin"), 4, "a step cycle is not retried");
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Turns, env = Ledger)]
enum TurnsState {
    #[initial]
    #[transition(to = [B])]
    A,
    #[transition(to = [C])]
    B,
    #[transition(to = [Done])]
    C,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Turns {
    name: String,
    yielded: Vec<String>,
}

impl Turns {
    /// Yields once before each step, then records the step.
    fn turn<T>(&mut self, ctx: &Context<Ledger>, step: &str, next: T) -> Step<T> {
        if !self.yielded.iter().any(|s| s == step) {
            self.yielded.push(step.to_owned());
            return Ok(Flow::Yield);
        }
        ctx.env().push(format!("{} {step}", self.name));
        Ok(next.into())
    }
}

impl TurnsStateHandlers for Turns {
    async fn a(&mut self, ctx: &Context<Ledger>) -> Step<turns_state::A> {
        self.turn(ctx, "A", turns_state::A::B)
    }
    async fn b(&mut self, ctx: &Context<Ledger>) -> Step<turns_state::B> {
        self.turn(ctx, "B", turns_state::B::C)
    }
    async fn c(&mut self, ctx: &Context<Ledger>) -> Step<turns_state::C> {
        self.turn(ctx, "C", turns_state::C::Done)
    }
}

/// HBase TestYieldProcedures: three procedures yielding before each step all finish, each
/// running its steps in order.
async fn yielding_procedures_interleave_and_keep_their_order(store: TestStore) {
    let ledger = Ledger::default();
    let executor = commit_executor(&store, &ledger).await;
    let mut ids = Vec::new();
    for name in ["p1", "p2", "p3"] {
        let turns = Turns {
            name: name.into(),
            yielded: Vec::new(),
        };
        ids.push(executor.submit(turns).await.unwrap());
    }
    for id in ids {
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
    }
    for name in ["p1", "p2", "p3"] {
        let own: Vec<_> = ledger
            .events()
            .into_iter()
            .filter(|e| e.starts_with(name))
            .collect();
        assert_eq!(
            own,
            [
                format!("{name} A"),
                format!("{name} B"),
                format!("{name} C")
            ]
        );
    }
}
