//! Dormant procedures (issue 16): a procedure that cannot run — waiting for an event,
//! its children, a lock or a time — has no task and no running slot, keeps its for-life
//! locks, and runs again, with a slot, once what it waits for happens.
//!
//! Task counts come from tokio's runtime metrics: before dormancy every waiting procedure
//! was one task, so the counts below would be in the hundred thousands.

mod common;

use common::Bounded;
use common::TestStore;
use futures_util::future::join_all;
use procflow::ProcedureId;
use procflow::executor::{Config, Executor, Outcome, Status};
use procflow::locks::{Lock, LockKeyError, Locks};
use procflow::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Barrier;

/// What the handlers share: the accounts whose storage is ready, and a barrier the busy
/// procedures meet at.
#[derive(Default)]
struct Env {
    ready: Mutex<HashSet<u64>>,
    meet: Mutex<Option<Arc<Barrier>>>,
}

impl Env {
    fn open(&self, n: u64) {
        self.ready.lock().unwrap().insert(n);
    }
    fn is_open(&self, n: u64) -> bool {
        self.ready.lock().unwrap().contains(&n)
    }
}

/// Waits for event `ready-{n}` holding shared `acct` and exclusive `acct/{n}` for life.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Account, env = Env)]
enum AccountState {
    #[initial]
    #[transition(to = [Done])]
    Wait,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Account {
    n: u64,
}

impl AccountStateHandlers for Account {
    async fn wait(&mut self, ctx: &Context<Env>) -> Step<account_state::Wait> {
        if ctx.env().is_open(self.n) {
            return Ok(account_state::Wait::Done.into());
        }
        Ok(Flow::suspend(ready(self.n)))
    }
    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new([
            Lock::shared("acct")?,
            Lock::exclusive(format!("acct/{}", self.n))?,
        ]))
    }
}

fn ready(n: u64) -> String {
    format!("ready-{n}")
}

/// One step that meets the others at the environment's barrier.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Busy, env = Env)]
enum BusyState {
    #[initial]
    #[transition(to = [Done])]
    Meet,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Busy;

impl BusyStateHandlers for Busy {
    async fn meet(&mut self, ctx: &Context<Env>) -> Step<busy_state::Meet> {
        let barrier = ctx.env().meet.lock().unwrap().clone();
        if let Some(barrier) = barrier {
            barrier.wait().bounded().await;
        }
        Ok(busy_state::Meet::Done.into())
    }
}

async fn start(store: &TestStore, env: &Arc<Env>, config: Config) -> Executor<Env> {
    Executor::builder_shared(Arc::clone(&store.store), Arc::clone(env))
        .register::<AccountState>()
        .register::<BusyState>()
        .config(config)
        .start()
        .await
        .unwrap()
}

/// Tasks alive on this runtime (procedures' and everyone else's).
fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Submits accounts `range`, a few submitters at once.
async fn submit_accounts(
    executor: &Executor<Env>,
    range: std::ops::Range<u64>,
) -> Vec<ProcedureId> {
    let submitters = 8;
    let chunks = (0..submitters).map(|k| {
        let executor = executor.clone();
        let range = range.clone();
        async move {
            let mut ids = Vec::new();
            for n in range.skip(k).step_by(submitters) {
                ids.push(executor.submit(Account { n }).await.unwrap());
            }
            ids
        }
    });
    join_all(chunks).await.into_iter().flatten().collect()
}

async fn status_is(executor: &Executor<Env>, id: ProcedureId, wanted: impl Fn(&Status) -> bool) {
    common::status_is(executor, id, Duration::from_secs(60), wanted).await;
}

async fn all_suspended(executor: &Executor<Env>, ids: &[ProcedureId]) {
    for &id in ids {
        status_is(executor, id, |s| matches!(s, Status::Suspended { .. })).await;
    }
}

/// Polls until only a few tasks are alive (a parking task ends just after it reports
/// its new status); returns the last count.
async fn settle_tasks(below: usize) -> usize {
    let mut alive = tasks();
    for _ in 0..500 {
        if alive < below {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        alive = tasks();
    }
    alive
}

/// Opens and wakes accounts `range`, a few at once; every wake finds its procedure.
async fn wake_accounts(executor: &Executor<Env>, env: &Env, range: std::ops::Range<u64>) {
    let wakers = 8;
    let chunks = (0..wakers).map(|k| {
        let range = range.clone();
        async move {
            for n in range.skip(k).step_by(wakers) {
                env.open(n);
                assert_eq!(executor.wake(&ready(n)).await.unwrap(), 1, "wake {n}");
            }
        }
    });
    join_all(chunks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_suspended_procedures_have_no_task_keep_their_locks_and_all_run_after_a_wake()
 {
    const N: u64 = 100_000;
    let store = TestStore::memory();
    let env = Arc::new(Env::default());
    // Far fewer running slots than procedures: dormant ones give theirs back.
    let config = Config {
        max_running: 1_000,
        ..common::test_config()
    };
    let executor = start(&store, &env, config).await;
    let ids = submit_accounts(&executor, 0..N).await;
    all_suspended(&executor, &ids).await;

    let alive = settle_tasks(50).await;
    assert!(
        alive < 50,
        "{alive} tasks alive for {N} suspended procedures"
    );
    // Every one keeps its two locks while dormant.
    assert_eq!(executor.held_locks().len(), 2 * N as usize);
    // One wanting an account's lock queues behind it, dormant too.
    let rival = executor.submit(Account { n: 7 }).await.unwrap();
    status_is(&executor, rival, |s| *s == Status::WaitingForLock).await;
    assert_eq!(executor.lock_waiters(), vec![rival]);
    let alive = settle_tasks(50).await;
    assert!(
        alive < 50,
        "{alive} tasks alive with one more waiting for a lock"
    );

    wake_accounts(&executor, &env, 0..N).await;
    for &id in &ids {
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded,
            "{id}"
        );
    }
    // Account 7's end granted the rival its locks; it finds its account ready.
    assert_eq!(
        executor.wait(rival).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert!(executor.held_locks().is_empty());
    assert_eq!(executor.state(ids[0]).unwrap().steps, 1);
    executor.shutdown().bounded().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_running_slots_still_run_four_new_procedures_at_once_beside_a_thousand_suspended() {
    let store = TestStore::memory();
    let env = Arc::new(Env::default());
    let config = Config {
        max_running: 4,
        ..common::test_config()
    };
    let executor = start(&store, &env, config).await;
    let ids = submit_accounts(&executor, 0..1_000).await;
    all_suspended(&executor, &ids).await;

    // Each busy procedure's only step waits until all four are in it: they can only
    // pass if all four run at once.
    *env.meet.lock().unwrap() = Some(Arc::new(Barrier::new(4)));
    let mut busy = Vec::new();
    for _ in 0..4 {
        busy.push(executor.submit(Busy).await.unwrap());
    }
    for &id in &busy {
        let ended = tokio::time::timeout(Duration::from_secs(30), executor.wait(id)).await;
        assert_eq!(
            ended.expect("the four never ran at once").unwrap(),
            Outcome::Succeeded
        );
    }

    wake_accounts(&executor, &env, 0..1_000).await;
    for &id in &ids {
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
    }
    executor.shutdown().bounded().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procedures_loaded_suspended_after_a_restart_are_dormant_and_keep_their_locks() {
    const N: u64 = 2_000;
    let store = TestStore::wal();
    let env = Arc::new(Env::default());
    let executor = start(&store, &env, common::test_config()).await;
    let ids = submit_accounts(&executor, 0..N).await;
    all_suspended(&executor, &ids).await;
    executor.shutdown().bounded().await.unwrap();
    drop(executor);

    let store = store.reopen();
    let before = tasks();
    let executor = start(&store, &env, common::test_config()).await;
    all_suspended(&executor, &ids).await;
    let alive = settle_tasks(before + 50).await;
    assert!(
        alive < before + 50,
        "{alive} tasks alive after loading {N} suspended"
    );
    assert_eq!(executor.held_locks().len(), 2 * N as usize);

    wake_accounts(&executor, &env, 0..N).await;
    for &id in &ids {
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
    }
    assert!(executor.held_locks().is_empty());
    executor.shutdown().bounded().await.unwrap();
}

/// Procedures loaded suspended at start do not count against `queue_capacity`, like
/// those that suspend while the executor runs: with one running slot and room for one
/// more in the queue, twenty of them leave room for two new procedures, and no third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procedures_loaded_suspended_after_a_restart_leave_the_queue_free() {
    let store = TestStore::wal();
    let env = Arc::new(Env::default());
    let executor = start(&store, &env, common::test_config()).await;
    let ids = submit_accounts(&executor, 0..20).await;
    all_suspended(&executor, &ids).await;
    executor.shutdown().bounded().await.unwrap();
    drop(executor);

    let store = store.reopen();
    let config = Config {
        max_running: 1,
        queue_capacity: 1,
        ..common::test_config()
    };
    let executor = start(&store, &env, config).await;
    all_suspended(&executor, &ids).await;
    // The first takes the only slot and stays at the barrier; the second queues for it.
    let barrier = Arc::new(Barrier::new(2));
    *env.meet.lock().unwrap() = Some(Arc::clone(&barrier));
    let first = executor.submit(Busy).await.unwrap();
    let second = executor.submit(Busy).await.unwrap();
    match executor.submit(Busy).await {
        Err(procflow::executor::SubmitError::QueueFull { live }) => assert_eq!(live, 2),
        other => panic!("expected QueueFull, got {other:?}"),
    }
    barrier.wait().bounded().await;
    barrier.wait().bounded().await;
    for id in [first, second] {
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
    }
    executor.shutdown().bounded().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dormant_procedure_queued_for_a_lock_rolls_back_on_abort_and_the_next_gets_the_lock() {
    let store = TestStore::memory();
    let env = Arc::new(Env::default());
    let executor = start(&store, &env, common::test_config()).await;
    let holder = executor.submit(Account { n: 1 }).await.unwrap();
    status_is(&executor, holder, |s| matches!(s, Status::Suspended { .. })).await;
    // One after the other: submitted together, their tasks may ask for the lock in
    // either order (they run on different lanes).
    let first = executor.submit(Account { n: 1 }).await.unwrap();
    status_is(&executor, first, |s| *s == Status::WaitingForLock).await;
    let second = executor.submit(Account { n: 1 }).await.unwrap();
    status_is(&executor, second, |s| *s == Status::WaitingForLock).await;
    assert_eq!(executor.lock_waiters(), vec![first, second]);

    executor.abort(first).unwrap();
    assert!(matches!(
        executor.wait(first).bounded().await.unwrap(),
        Outcome::RolledBack(_)
    ));
    assert_eq!(executor.lock_waiters(), vec![second]);

    env.open(1);
    assert_eq!(executor.wake(&ready(1)).await.unwrap(), 1);
    assert_eq!(
        executor.wait(holder).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!(
        executor.wait(second).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    executor.shutdown().bounded().await.unwrap();
}
