//! A running procedure's snapshot stays current although its plain steps are not
//! published to its table entry: `state`, `list` and a subscriber made at any time see
//! the step the procedure stored last, and a subscriber is told of every step
//! (`signal.rs` in the executor says why the steps are kept beside the task).
//!
//! Each test walks a procedure through gated steps: a step's handler waits until the
//! test opens its gate, so that the test reads the snapshot while the procedure sits in
//! a known state, its previous step stored.

mod common;

use common::Bounded;
use procflow::ProcedureId;
use procflow::executor::{Executor, ProcedureInfo, Status};
use procflow::prelude::*;
use procflow::store::MemStore;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tokio::sync::watch;

/// How many steps the handlers may take so far.
#[derive(Clone)]
struct Gate(Arc<watch::Sender<u64>>);

impl Gate {
    fn new() -> Self {
        Gate(Arc::new(watch::Sender::new(0)))
    }

    /// Lets the procedure take one more step.
    fn open_one(&self) {
        self.0.send_modify(|opened| *opened += 1);
    }

    /// Waits until `step` (1-based) may run.
    async fn pass(&self, step: u64) {
        let mut opened = self.0.subscribe();
        opened
            .wait_for(|opened| *opened >= step)
            .await
            .expect("the gate outlives the procedure");
    }
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Walk, env = Gate)]
enum WalkState {
    #[initial]
    #[transition(to = [Second])]
    First,
    #[transition(to = [Third])]
    Second,
    #[transition(to = [Fourth])]
    Third,
    #[transition(to = [Fifth])]
    Fourth,
    #[transition(to = [Done])]
    Fifth,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Walk;

/// A handler `$method` of state `$state` (in module `$states`) that waits for gate
/// `$gate`, then moves on to `$next`.
macro_rules! gated {
    ($states:ident, $($method:ident: $state:ident => $next:ident, $gate:literal;)*) => {
        $(
            async fn $method(&mut self, ctx: &Context<Gate>) -> Step<$states::$state> {
                ctx.env().pass($gate).await;
                Ok($states::$state::$next.into())
            }
        )*
    };
}

impl WalkStateHandlers for Walk {
    gated! {
        walk_state,
        first: First => Second, 1;
        second: Second => Third, 2;
        third: Third => Fourth, 3;
        fourth: Fourth => Fifth, 4;
        fifth: Fifth => Done, 5;
    }
}

/// An executor on a `MemStore` running both machines.
async fn start(gate: &Gate) -> Executor<Gate> {
    Executor::builder(Arc::new(MemStore::new()), gate.clone())
        .register::<WalkState>()
        .register::<UndoState>()
        .config(common::test_config())
        .start()
        .await
        .unwrap()
}

/// The state a walk waits in once `steps` steps are stored.
fn state_after(steps: u64) -> &'static str {
    ["First", "Second", "Third", "Fourth", "Fifth", "Done"][steps as usize]
}

/// How long a step may take to show: far longer than a step of these tests takes.
const SHOWN_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits until `state` shows `steps` steps stored, and returns that snapshot.
async fn stored(executor: &Executor<Gate>, id: ProcedureId, steps: u64) -> ProcedureInfo {
    let deadline = tokio::time::Instant::now() + SHOWN_WITHIN;
    loop {
        let info = executor.state(id).expect("the procedure is known");
        if info.steps >= steps {
            return info;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the snapshot stayed at {} steps, wanted {steps}: {info:?}",
            info.steps
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Opens the gate of step `steps` and waits until `info`, a subscriber, is told of it:
/// told without anyone reading `state`, so the step published to the channel.
async fn told_of_step(gate: &Gate, info: &mut watch::Receiver<ProcedureInfo>, steps: u64) {
    gate.open_one();
    let seen = info
        .wait_for(|i| i.steps >= steps)
        .bounded()
        .await
        .unwrap()
        .clone();
    assert_eq!((seen.steps, seen.state), (steps, state_after(steps)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_list_show_each_stored_step_without_a_subscriber() {
    let gate = Gate::new();
    let executor = start(&gate).await;
    let id = executor.submit(Walk).await.unwrap();
    for steps in 1..=4 {
        gate.open_one();
        let info = stored(&executor, id, steps).await;
        assert_eq!(info.steps, steps, "{info:?}");
        assert_eq!(info.state, state_after(steps));
        assert_eq!(info.status, Status::Runnable);
        assert!(info.updated >= info.submitted);
        let listed = executor.list().into_iter().find(|i| i.id == id).unwrap();
        assert_eq!(listed, info);
    }
    gate.open_one();
    executor.wait(id).bounded().await.unwrap();
    let info = executor.state(id).unwrap();
    assert_eq!(
        (info.status, info.state, info.steps),
        (Status::Succeeded, "Done", 5)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_made_between_steps_starts_from_the_last_stored_one() {
    let gate = Gate::new();
    let executor = start(&gate).await;
    let id = executor.submit(Walk).await.unwrap();
    for _ in 0..3 {
        gate.open_one();
    }
    stored(&executor, id, 3).await;
    let mut info = executor.subscribe(id).unwrap();
    let first = info.borrow_and_update().clone();
    assert_eq!((first.steps, first.state), (3, state_after(3)));
    // From now on every step reaches the subscriber.
    for steps in 4..=5 {
        told_of_step(&gate, &mut info, steps).await;
    }
    let last = info
        .wait_for(|i| i.status == Status::Succeeded)
        .bounded()
        .await
        .unwrap()
        .clone();
    assert_eq!(last.steps, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_from_the_start_is_told_of_every_step() {
    let gate = Gate::new();
    let executor = start(&gate).await;
    let id = executor.submit(Walk).await.unwrap();
    let mut info = executor.subscribe(id).unwrap();
    for steps in 1..=4 {
        told_of_step(&gate, &mut info, steps).await;
    }
    gate.open_one();
    executor.wait(id).bounded().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_after_the_subscriber_left_still_show() {
    let gate = Gate::new();
    let executor = start(&gate).await;
    let id = executor.submit(Walk).await.unwrap();
    let mut info = executor.subscribe(id).unwrap();
    gate.open_one();
    info.wait_for(|i| i.steps >= 1).bounded().await.unwrap();
    drop(info);
    for steps in 2..=4 {
        gate.open_one();
        let info = stored(&executor, id, steps).await;
        assert_eq!((info.steps, info.state), (steps, state_after(steps)));
    }
    gate.open_one();
    executor.wait(id).bounded().await.unwrap();
}

/// Once the admin's list reads changes (its first list took the table whole), every step
/// is published whole, so that the list is told of it.
#[cfg(feature = "admin")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admins_list_is_told_of_each_step_once_it_reads_changes() {
    let gate = Gate::new();
    let executor = start(&gate).await;
    let id = executor.submit(Walk).await.unwrap();
    let server = procflow::admin::Admin::new(executor.clone())
        .bind("127.0.0.1:0".parse().unwrap())
        .serve()
        .await
        .unwrap();
    let url = format!(
        "http://{}/api/summaries?limit=10&fresh=true",
        server.local_addr()
    );
    let row = |url: String| async move {
        let list = tokio::task::spawn_blocking(move || {
            let mut response = ureq::get(&url).call().unwrap();
            response.body_mut().read_to_string().unwrap()
        })
        .await
        .unwrap();
        let list: serde_json::Value = serde_json::from_str(&list).unwrap();
        list["rows"][0].clone()
    };
    assert_eq!(row(url.clone()).await["steps"], 0); // The first list: the whole table.
    for steps in 1..=4 {
        gate.open_one();
        stored(&executor, id, steps).await;
        let shown = row(url.clone()).await;
        assert_eq!(shown["steps"], steps, "{shown}");
        assert_eq!(shown["state"], state_after(steps), "{shown}");
    }
    gate.open_one();
    executor.wait(id).bounded().await.unwrap();
    server.shutdown().bounded().await.unwrap();
}

/// `Work` → `More` → `Fail`, which fails; then `More` and `Work` are undone, each undo
/// behind a gate of its own (gates 3 and 4: the first two let `Work` and `More` run).
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Undo, env = Gate)]
enum UndoState {
    #[initial]
    #[transition(to = [More])]
    #[rollback]
    Work,
    #[transition(to = [Fail])]
    #[rollback]
    More,
    #[transition(to = [Done])]
    Fail,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Undo;

impl UndoStateHandlers for Undo {
    gated! {
        undo_state,
        work: Work => More, 1;
        more: More => Fail, 2;
    }
    async fn fail(&mut self, _: &Context<Gate>) -> Step<undo_state::Fail> {
        Err(Error::fatal("no"))
    }
    async fn rollback_more(&mut self, ctx: &Context<Gate>) -> Result<(), Error> {
        ctx.env().pass(3).await;
        Ok(())
    }
    async fn rollback_work(&mut self, ctx: &Context<Gate>) -> Result<(), Error> {
        ctx.env().pass(4).await;
        Ok(())
    }
}

/// A rollback's undo steps show as they are stored, with the status and the cause they
/// have (a snapshot with an error is published whole), never under the status before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollbacks_steps_show_with_its_status() {
    let gate = Gate::new();
    let executor = start(&gate).await;
    let id = executor.submit(Undo).await.unwrap();
    gate.open_one();
    gate.open_one();
    // `Work` and `More` done; `Fail` failed; the undo of `More` waits at gate 3.
    let deadline = tokio::time::Instant::now() + SHOWN_WITHIN;
    let rolling = loop {
        let info = executor.state(id).unwrap();
        if info.status == Status::RollingBack {
            break info;
        }
        assert!(
            info.status == Status::Runnable && info.steps <= 2,
            "before its rollback: {info:?}"
        );
        assert!(tokio::time::Instant::now() < deadline, "{info:?}");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    };
    assert_eq!(rolling.error, Some(Error::fatal("no")));
    gate.open_one();
    let info = stored(&executor, id, rolling.steps + 1).await;
    assert_eq!(info.steps, rolling.steps + 1, "{info:?}");
    assert_eq!(
        (&info.status, &info.error),
        (&Status::RollingBack, &rolling.error)
    );
    gate.open_one();
    let outcome = executor.wait(id).bounded().await.unwrap();
    assert_eq!(
        outcome,
        procflow::executor::Outcome::RolledBack(Error::fatal("no"))
    );
    let info = executor.state(id).unwrap();
    assert_eq!(
        (info.status, info.steps),
        (Status::RolledBack, rolling.steps + 2)
    );
}
