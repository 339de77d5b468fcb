//! The executor's promises at their edges: children of a failed spawn, timeouts, locks
//! held for life across a restart, wakes, submits, the point of no return. One test (or
//! two) per point of issue 12, named `pNN_…` after the point; each failed on 2febd22.

mod common;

use common::{Bounded, Counter, CounterState, Grow, GrowState, Ledger, TestStore, test_config};
use procflow::ProcedureId;
use procflow::executor::{Config, Executor, Outcome, Status, SubmitOptions};
use procflow::locks::{Lock, LockKeyError, Locks};
use procflow::prelude::*;
use procflow::store::{Batch, Limits, MemStore, Store};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// Long enough for anything these tests wait for; a broken guarantee hangs until then.
const PATIENCE: Duration = Duration::from_secs(10);

/// A root: `Prepare` → `Spawn` (its leaves) → `Hold` (until "<name> go", then fails if
/// told to) → `Done`.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Tree, env = Ledger)]
enum TreeState {
    #[initial]
    #[transition(to = [Spawn])]
    #[rollback]
    Prepare,
    #[transition(to = [Hold])]
    #[rollback]
    Spawn,
    #[transition(to = [Done])]
    Hold,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize, Clone, Default)]
struct Tree {
    name: String,
    leaves: Vec<Leaf>,
    /// Wait in `Hold` for "<name> go" in the ledger.
    hold: bool,
    /// Fail in `Hold` once let go.
    fail_after_hold: bool,
}

impl TreeStateHandlers for Tree {
    async fn prepare(&mut self, ctx: &Context<Ledger>) -> Step<tree_state::Prepare> {
        ctx.env().push(format!("{} do prepare", self.name));
        Ok(tree_state::Prepare::Spawn.into())
    }
    async fn spawn(&mut self, ctx: &Context<Ledger>) -> Step<tree_state::Spawn> {
        ctx.env().push(format!("{} do spawn", self.name));
        let children = self
            .leaves
            .iter()
            .map(Child::new::<LeafState>)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Flow::spawn(children, tree_state::Spawn::Hold))
    }
    async fn hold(&mut self, ctx: &Context<Ledger>) -> Step<tree_state::Hold> {
        let go = format!("{} go", self.name);
        if self.hold && !ctx.env().events().contains(&go) {
            return Ok(Flow::suspend(self.name.clone()));
        }
        if self.fail_after_hold {
            return Err(Error::fatal(format!("{} failed after holding", self.name)));
        }
        Ok(tree_state::Hold::Done.into())
    }
    async fn rollback_prepare(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push(format!("{} undo prepare", self.name));
        Ok(())
    }
    async fn rollback_spawn(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push(format!("{} undo spawn", self.name));
        Ok(())
    }
}

/// A child: `Start` (undoable) → `Work` (fails, waits for "<name> go", is slow, or
/// spawns grandchildren) → `Done`.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Leaf, env = Ledger)]
enum LeafState {
    #[initial]
    #[transition(to = [Work])]
    #[rollback]
    Start,
    #[transition(to = [Done])]
    Work,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize, Clone, Default)]
struct Leaf {
    name: String,
    fail: bool,
    /// Wait in `Work` for "<name> go".
    gate: bool,
    slow_ms: u64,
    leaves: Vec<Leaf>,
}

impl Leaf {
    fn named(name: &str) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }
}

impl LeafStateHandlers for Leaf {
    async fn start(&mut self, ctx: &Context<Ledger>) -> Step<leaf_state::Start> {
        ctx.env().push(format!("{} do start", self.name));
        Ok(leaf_state::Start::Work.into())
    }
    async fn work(&mut self, ctx: &Context<Ledger>) -> Step<leaf_state::Work> {
        let go = format!("{} go", self.name);
        if self.gate && !ctx.env().events().contains(&go) {
            return Ok(Flow::suspend(self.name.clone()));
        }
        tokio::time::sleep(Duration::from_millis(self.slow_ms)).await;
        if self.fail {
            return Err(Error::fatal(format!("{} cannot work", self.name)));
        }
        ctx.env().push(format!("{} do work", self.name));
        if self.leaves.is_empty() {
            return Ok(leaf_state::Work::Done.into());
        }
        let children = self
            .leaves
            .iter()
            .map(Child::new::<LeafState>)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Flow::spawn(children, leaf_state::Work::Done))
    }
    async fn rollback_start(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push(format!("{} undo start", self.name));
        Ok(())
    }
}

/// Takes an exclusive lock on `key` (for life, or per step), records its locked step,
/// and can wait for "<name> go" before it (suspended, holding a for-life lock).
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Locker, env = Ledger)]
enum LockerState {
    #[initial]
    #[transition(to = [Work])]
    #[rollback]
    Enter,
    #[transition(to = [Done])]
    Work,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize, Clone, Default)]
struct Locker {
    name: String,
    key: String,
    per_step: bool,
    /// Wait in `Work` for "<name> go".
    gate: bool,
}

impl LockerStateHandlers for Locker {
    async fn enter(&mut self, ctx: &Context<Ledger>) -> Step<locker_state::Enter> {
        ctx.env().push(format!("{} enter", self.name));
        Ok(locker_state::Enter::Work.into())
    }
    async fn work(&mut self, ctx: &Context<Ledger>) -> Step<locker_state::Work> {
        let go = format!("{} go", self.name);
        if self.gate && !ctx.env().events().contains(&go) {
            return Ok(Flow::suspend(self.name.clone()));
        }
        ctx.env().push(format!("{} work", self.name));
        Ok(locker_state::Work::Done.into())
    }
    async fn rollback_enter(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push(format!("{} undo enter", self.name));
        Ok(())
    }
    fn locks(&self) -> Result<Locks, LockKeyError> {
        let locks = Locks::new([Lock::exclusive(&self.key)?]);
        Ok(if self.per_step {
            locks.per_step()
        } else {
            locks
        })
    }
}

fn builder(store: &TestStore, ledger: &Ledger, config: Config) -> ExecutorBuilder<Ledger> {
    store
        .builder(ledger)
        .config(config)
        .register::<TreeState>()
        .register::<LeafState>()
        .register::<LockerState>()
        .register::<CounterState>()
        .register::<PonrState>()
        .register::<GrowState>()
        .register::<WatchState>()
}

use procflow::executor::ExecutorBuilder;

async fn start(store: &TestStore, ledger: &Ledger) -> Executor<Ledger> {
    builder(store, ledger, test_config()).start().await.unwrap()
}

/// `wait`, failing the test (instead of hanging) after [`PATIENCE`].
async fn outcome(executor: &Executor<Ledger>, id: ProcedureId) -> Outcome {
    tokio::time::timeout(PATIENCE, executor.wait(id))
        .await
        .unwrap_or_else(|_| panic!("procedure {id:?} never ended: {:?}", executor.state(id)))
        .unwrap()
}

async fn status_is(executor: &Executor<Ledger>, id: ProcedureId, wanted: impl Fn(&Status) -> bool) {
    common::status_is(executor, id, PATIENCE, wanted).await;
}

/// Submit options with a timeout of `ms` milliseconds.
fn within(ms: u64) -> SubmitOptions {
    SubmitOptions::default().timeout(Duration::from_millis(ms))
}

/// Waits for `id` to end, and checks that it rolled back because it timed out.
async fn times_out(executor: &Executor<Ledger>, id: ProcedureId) {
    let Outcome::RolledBack(error) = outcome(executor, id).await else {
        panic!("expected a rollback");
    };
    assert!(error.to_string().contains("timed out"), "{error}");
}

/// Where `event` stands in the ledger (panics if it is not there).
fn position(ledger: &Ledger, event: &str) -> usize {
    ledger
        .events()
        .iter()
        .position(|e| e == event)
        .unwrap_or_else(|| panic!("`{event}` never happened: {:?}", ledger.events()))
}

// ---------------------------------------------------------------------------------------
// 1. A failing child stops its running siblings; the parent rolls back after all ended.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p01_failing_child_stops_running_siblings_and_all_are_undone_before_the_parent() {
    let store = TestStore::memory();
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let tree = Tree {
        name: "t".into(),
        leaves: vec![
            Leaf {
                fail: true,
                slow_ms: 50,
                ..Leaf::named("failing")
            },
            // Suspended while its sibling fails: it must be stopped, not left waiting.
            Leaf {
                gate: true,
                ..Leaf::named("waiting")
            },
            // Still running its slow step when its sibling fails.
            Leaf {
                slow_ms: 400,
                ..Leaf::named("slow")
            },
        ],
        ..Tree::default()
    };
    let id = executor.submit(tree).await.unwrap();
    let Outcome::RolledBack(error) = outcome(&executor, id).await else {
        panic!("the tree must roll back");
    };
    assert!(error.to_string().contains("failing cannot work"), "{error}");
    let parent_undo = position(&ledger, "t undo spawn");
    for leaf in ["failing", "waiting", "slow"] {
        let undo = format!("{leaf} undo start");
        assert_eq!(ledger.count(&undo), 1, "{leaf}: {:?}", ledger.events());
        assert!(
            position(&ledger, &undo) < parent_undo,
            "{:?}",
            ledger.events()
        );
    }
    assert!(position(&ledger, "t undo spawn") < position(&ledger, "t undo prepare"));
    for child in executor.list().into_iter().filter(|i| i.parent == Some(id)) {
        assert!(child.status.is_finished(), "{child:?}");
        assert_ne!(
            child.status,
            Status::Succeeded,
            "a sibling was left done: {child:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 2. Retention keeps a live root's whole tree; a child missing for undo is an error.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p02_retention_keeps_grandchildren_of_a_live_root_for_its_rollback() {
    let store = TestStore::memory();
    let ledger = Ledger::default();
    let config = Config {
        retention: Duration::from_millis(20),
        cleanup_interval: Duration::from_millis(10),
        ..test_config()
    };
    let executor = builder(&store, &ledger, config).start().await.unwrap();
    let tree = Tree {
        name: "root".into(),
        leaves: vec![Leaf {
            leaves: vec![Leaf::named("grandchild")],
            ..Leaf::named("child")
        }],
        hold: true,
        fail_after_hold: true,
    };
    let id = executor.submit(tree).await.unwrap();
    status_is(&executor, id, |s| matches!(s, Status::Suspended { .. })).await;
    // Child and grandchild have finished; several retention periods pass.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ledger.push("root go");
    executor.wake("root").await.unwrap();
    assert!(matches!(
        outcome(&executor, id).await,
        Outcome::RolledBack(_)
    ));
    assert_eq!(
        ledger.count("grandchild undo start"),
        1,
        "{:?}",
        ledger.events()
    );
    assert_eq!(ledger.count("child undo start"), 1, "{:?}", ledger.events());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p02_a_child_missing_for_undo_fails_the_parent_naming_it() {
    let store = TestStore::memory();
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let tree = Tree {
        name: "root".into(),
        leaves: vec![Leaf::named("lost")],
        hold: true,
        fail_after_hold: true,
    };
    let id = executor.submit(tree).await.unwrap();
    status_is(&executor, id, |s| matches!(s, Status::Suspended { .. })).await;
    let child = executor
        .list()
        .into_iter()
        .find(|i| i.parent == Some(id))
        .unwrap();
    executor.shutdown().bounded().await.unwrap();
    // The child's record is gone (a damaged store, a hand-made deletion).
    store
        .store
        .commit(Batch::new().delete(child.id.get()))
        .await
        .unwrap();
    let executor = start(&store, &ledger).await;
    ledger.push("root go");
    executor.wake("root").await.unwrap();
    let Outcome::Failed(error) = outcome(&executor, id).await else {
        panic!("a rollback that cannot undo a child must not end rolled back");
    };
    let message = error.to_string();
    assert!(message.contains("cannot be found"), "{message}");
    assert!(
        message.contains(&format!("#{}", child.id.get())),
        "{message}"
    );
}

// ---------------------------------------------------------------------------------------
// 3. The deadline ends the procedure wherever it waits.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p03_deadline_ends_a_procedure_waiting_for_an_event() {
    let ledger = Ledger::default();
    let executor = start(&TestStore::memory(), &ledger).await;
    let counter = Counter {
        suspend_at: Some(2),
        ..Counter::named("p")
    };
    let id = executor.submit_with(counter, within(200)).await.unwrap();
    times_out(&executor, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p03_deadline_ends_a_procedure_waiting_for_children() {
    let ledger = Ledger::default();
    let executor = start(&TestStore::memory(), &ledger).await;
    let tree = Tree {
        name: "t".into(),
        leaves: vec![Leaf {
            gate: true,
            ..Leaf::named("never")
        }],
        ..Tree::default()
    };
    let id = executor.submit_with(tree, within(200)).await.unwrap();
    times_out(&executor, id).await;
    assert_eq!(ledger.count("never undo start"), 1, "{:?}", ledger.events());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p03_deadline_ends_a_procedure_waiting_for_a_lock() {
    let ledger = Ledger::default();
    let executor = start(&TestStore::memory(), &ledger).await;
    let holder = Locker {
        name: "holder".into(),
        key: "t".into(),
        gate: true,
        ..Locker::default()
    };
    let holder = executor.submit(holder).await.unwrap();
    status_is(&executor, holder, |s| matches!(s, Status::Suspended { .. })).await;
    let waiter = Locker {
        name: "waiter".into(),
        key: "t".into(),
        ..Locker::default()
    };
    let waiter = executor.submit_with(waiter, within(200)).await.unwrap();
    times_out(&executor, waiter).await;
    assert_eq!(ledger.count("waiter enter"), 0, "it never held the lock");
    assert_eq!(executor.lock_waiters(), [], "its request left the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p03_deadline_ends_a_procedure_queued_for_a_running_slot() {
    let ledger = Ledger::default();
    let config = Config {
        max_running: 1,
        ..test_config()
    };
    let executor = builder(&TestStore::memory(), &ledger, config)
        .start()
        .await
        .unwrap();
    // `busy` holds the only running slot: its first step runs a minute. (A suspended
    // procedure would not: it is dormant, without a slot.)
    let busy = Counter {
        slow_ms: 60_000,
        ..Counter::named("busy")
    };
    executor.submit(busy).await.unwrap();
    while ledger.count("busy execute 1") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let queued = executor
        .submit_with(Counter::named("queued"), within(200))
        .await
        .unwrap();
    times_out(&executor, queued).await;
    assert_eq!(ledger.count("queued execute 1"), 0, "it never ran");
    executor.kill(); // The step in flight is not waited for.
}

// ---------------------------------------------------------------------------------------
// 4. A timeout undoes the state it interrupted (running or suspended).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p04_timeout_cancels_the_running_step_and_undoes_its_state() {
    let ledger = Ledger::default();
    let executor = start(&TestStore::memory(), &ledger).await;
    let counter = Counter {
        slow_ms: 60_000,
        ..Counter::named("p")
    };
    let id = executor.submit_with(counter, within(200)).await.unwrap();
    times_out(&executor, id).await;
    // Step 1 was cut off mid-handler: it may have acted, so it is undone.
    assert_eq!(ledger.count("p rollback 1"), 1, "{:?}", ledger.events());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p04_timeout_undoes_a_suspended_rollback_state() {
    let ledger = Ledger::default();
    let executor = start(&TestStore::memory(), &ledger).await;
    let counter = Counter {
        suspend_at: Some(3),
        ..Counter::named("p")
    };
    let id = executor.submit_with(counter, within(300)).await.unwrap();
    times_out(&executor, id).await;
    let rollbacks: Vec<_> = ledger
        .events()
        .into_iter()
        .filter(|e| e.contains("rollback"))
        .collect();
    assert_eq!(rollbacks, ["p rollback 3", "p rollback 2", "p rollback 1"]);
}

// ---------------------------------------------------------------------------------------
// 5. After a restart, for-life holders get their locks back before anyone else.

/// Current-thread: tasks start in id order, so a lower-id waiter is polled first and
/// would take the lock if the holder's were not restored before any task runs.
#[tokio::test]
async fn p05_for_life_locks_are_restored_before_a_lower_id_waiter_runs() {
    let store = TestStore::wal();
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    // The waiter, first: per-step locks, suspended before its locked step (holding none).
    let waiter = Locker {
        name: "waiter".into(),
        key: "t".into(),
        per_step: true,
        gate: true,
    };
    let waiter = executor.submit(waiter).await.unwrap();
    status_is(&executor, waiter, |s| matches!(s, Status::Suspended { .. })).await;
    // The holder, second: holds `t` for life, suspended.
    let holder = Locker {
        name: "holder".into(),
        key: "t".into(),
        gate: true,
        ..Locker::default()
    };
    let holder = executor.submit(holder).await.unwrap();
    status_is(&executor, holder, |s| matches!(s, Status::Suspended { .. })).await;
    // The waiter may go on: it queues behind the holder.
    ledger.push("waiter go");
    executor.wake("waiter").await.unwrap();
    status_is(&executor, waiter, |s| *s == Status::WaitingForLock).await;
    executor.shutdown().bounded().await.unwrap();

    let store = store.reopen();
    let executor = start(&store, &ledger).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        ledger.count("waiter work"),
        0,
        "the waiter ran inside the holder's life"
    );
    assert_eq!(
        executor.held_locks(),
        [(holder, Lock::exclusive("t").unwrap())]
    );
    ledger.push("holder go");
    executor.wake("holder").await.unwrap();
    assert_eq!(outcome(&executor, holder).await, Outcome::Succeeded);
    assert_eq!(outcome(&executor, waiter).await, Outcome::Succeeded);
    assert!(position(&ledger, "holder work") < position(&ledger, "waiter work"));
}

// ---------------------------------------------------------------------------------------
// 6. A write the store refuses: the outcome `wait` returns is the stored one.

fn limited_store(max_value_bytes: usize) -> TestStore {
    let limits = Limits {
        max_ops_per_batch: None,
        max_value_bytes: Some(max_value_bytes),
        max_batch_bytes: None,
    };
    TestStore::memory_with_limits(limits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p06_a_refused_write_ends_the_procedure_durably_before_its_locks_go() {
    let store = limited_store(400);
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let id = executor.submit(Grow::new()).await.unwrap();
    let Outcome::RolledBack(error) = outcome(&executor, id).await else {
        panic!("expected a rollback");
    };
    assert!(error.to_string().contains("cannot be stored"), "{error}");
    let stored = store.store.get(id.get()).await.unwrap().unwrap();
    assert!(
        stored.finished,
        "`wait` said it ended, so the store must too"
    );
    assert_eq!(executor.held_locks(), []);
    executor.shutdown().bounded().await.unwrap();
    // A restart does not bring it back.
    let executor = start(&store, &ledger).await;
    assert_eq!(outcome(&executor, id).await, Outcome::RolledBack(error));
    assert_eq!(ledger.count("grow"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p06_a_procedure_whose_rollback_cannot_be_stored_stays_stuck_holding_its_locks() {
    // The first step's state fits; the rollback's record (that state and the error)
    // does not.
    let store = limited_store(190);
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let id = executor.submit(Grow::new()).await.unwrap();
    status_is(&executor, id, |s| matches!(s, Status::Stuck { .. })).await;
    let stored = store.store.get(id.get()).await.unwrap().unwrap();
    assert!(!stored.finished);
    assert_eq!(
        executor.held_locks(),
        [(id, Lock::exclusive("grow").unwrap())],
        "a live procedure keeps its for-life lock"
    );
}

// ---------------------------------------------------------------------------------------
// 7 and 8. A wake is never lost, and it is durable.

/// Current-thread: `start` returns before any task has run.
#[tokio::test]
async fn p07_a_wake_right_after_a_restart_reaches_suspended_procedures() {
    let store = TestStore::wal();
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        suspend_at: Some(2),
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    status_is(&executor, id, |s| matches!(s, Status::Suspended { .. })).await;
    executor.shutdown().bounded().await.unwrap();

    let store = store.reopen();
    let executor = start(&store, &ledger).await;
    ledger.push("p woken");
    assert_eq!(executor.wake("p").await.unwrap(), 1);
    assert_eq!(outcome(&executor, id).await, Outcome::Succeeded);
}

/// Checks its condition, then (still in the step) lets the test make it true and wake,
/// then suspends.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Watch, env = Ledger)]
enum WatchState {
    #[initial]
    #[transition(to = [Done])]
    Check,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Watch;

impl WatchStateHandlers for Watch {
    async fn check(&mut self, ctx: &Context<Ledger>) -> Step<watch_state::Check> {
        let ready = ctx.env().events().contains(&"ready".to_owned());
        if ready {
            return Ok(watch_state::Check::Done.into());
        }
        ctx.env().push("checked");
        // The caller sets the condition and wakes while this step is still running.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(Flow::suspend("ready"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p08_a_wake_while_the_step_runs_is_not_lost_when_it_then_suspends() {
    let ledger = Ledger::default();
    let executor = start(&TestStore::memory(), &ledger).await;
    let id = executor.submit(Watch).await.unwrap();
    while !ledger.events().contains(&"checked".to_owned()) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ledger.push("ready");
    // Nobody is suspended on it yet: the step that will be is still running.
    assert_eq!(executor.wake("ready").await.unwrap(), 0);
    assert_eq!(outcome(&executor, id).await, Outcome::Succeeded);
}

/// Current-thread: after `wake` returns, a kill before any other task runs.
#[tokio::test]
async fn p08_a_wake_is_durable_once_wake_returns() {
    let store = TestStore::wal();
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        suspend_at: Some(2),
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    status_is(&executor, id, |s| matches!(s, Status::Suspended { .. })).await;
    ledger.push("p woken");
    assert_eq!(executor.wake("p").await.unwrap(), 1);
    executor.kill();
    let _ = executor.shutdown().bounded().await;
    drop(executor);

    let store = store.reopen();
    let executor = start(&store, &ledger).await;
    // No second wake: the first one was persisted.
    assert_eq!(outcome(&executor, id).await, Outcome::Succeeded);
}

// ---------------------------------------------------------------------------------------
// 9 and 10. Submits: cancel safe, one procedure per nonce, ids never reused.

/// A `MemStore` whose commits take `delay` and, like the WAL's committer thread, land
/// whether or not the caller still waits for them (so a test can drop a submit
/// mid-write).
fn slow_store(delay: Duration) -> common::Hooked {
    common::Hooked::new(MemStore::new(), move |inner, batch| {
        let write = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            inner.commit(batch).await
        });
        Box::pin(async move { write.await.expect("the write task") })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p09_a_dropped_submit_never_makes_a_second_procedure_for_its_nonce() {
    let store = TestStore::with(Arc::new(slow_store(Duration::from_millis(100))));
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let options = SubmitOptions::default().nonce("order-1");
    // The caller gives up while the write is in flight.
    let dropped = tokio::time::timeout(
        Duration::from_millis(30),
        executor.submit_with(Counter::named("p"), options.clone()),
    )
    .await;
    assert!(dropped.is_err(), "the submit was still writing");
    // Its retry, with the same nonce.
    let id = executor
        .submit_with(Counter::named("p"), options)
        .await
        .unwrap();
    assert_eq!(outcome(&executor, id).await, Outcome::Succeeded);
    let stored = store.store.list().await.unwrap();
    assert_eq!(stored.len(), 1, "one nonce, one procedure: {stored:?}");
    assert_eq!(executor.list().len(), 1);
    assert_eq!(ledger.count("p execute 1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p10_ids_are_never_reused_after_a_refused_batch_and_a_restart() {
    let store = limited_store(300);
    let ledger = Ledger::default();
    let config = Config {
        retention: Duration::from_millis(1),
        cleanup_interval: Duration::from_millis(10),
        ..test_config()
    };
    let executor = builder(&store, &ledger, config.clone())
        .start()
        .await
        .unwrap();
    // Refused: it carried the first id reservation.
    let huge = Counter::named(&"x".repeat(400));
    assert!(executor.submit(huge).await.is_err());
    let first = executor.submit(Counter::named("a")).await.unwrap();
    assert_eq!(outcome(&executor, first).await, Outcome::Succeeded);
    // Retention deletes it: nothing in the store shows its id was used.
    while !store.store.list().await.unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    executor.shutdown().bounded().await.unwrap();
    let executor = builder(&store, &ledger, config).start().await.unwrap();
    let next = executor.submit(Counter::named("b")).await.unwrap();
    assert!(next > first, "id {next:?} handed out again after {first:?}");
}

// ---------------------------------------------------------------------------------------
// 11. Past the point of no return, a fatal error is visible: `Stuck`.

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Ponr, env = Ledger)]
enum PonrState {
    #[initial]
    #[transition(to = [Commit])]
    #[rollback]
    Prepare,
    #[transition(to = [Done])]
    #[no_rollback]
    Commit,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Ponr;

impl PonrStateHandlers for Ponr {
    async fn prepare(&mut self, _: &Context<Ledger>) -> Step<ponr_state::Prepare> {
        Ok(ponr_state::Prepare::Commit.into())
    }
    async fn rollback_prepare(&mut self, _: &Context<Ledger>) -> Result<(), Error> {
        Ok(())
    }
    async fn commit(&mut self, ctx: &Context<Ledger>) -> Step<ponr_state::Commit> {
        if !ctx.env().events().contains(&"fixed".to_owned()) {
            return Err(Error::fatal("the remote rejected the commit"));
        }
        Ok(ponr_state::Commit::Done.into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p11_a_fatal_error_past_the_point_of_no_return_is_reported_stuck() {
    let ledger = Ledger::default();
    let executor = start(&TestStore::memory(), &ledger).await;
    let id = executor.submit(Ponr).await.unwrap();
    status_is(&executor, id, |s| matches!(s, Status::Stuck { .. })).await;
    let Some(Status::Stuck {
        error, attempts, ..
    }) = executor.state(id).map(|i| i.status)
    else {
        panic!("stuck");
    };
    assert!(error.to_string().contains("remote rejected"), "{error}");
    assert!(attempts >= 1);
    // It keeps retrying: once the cause is fixed, it goes through.
    ledger.push("fixed");
    assert_eq!(outcome(&executor, id).await, Outcome::Succeeded);
}
