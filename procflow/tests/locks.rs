//! Entity locks in the executor. Every scenario runs on a `MemStore` and on a durable
//! `WalStore`.

mod common;

use common::{Bounded, Ledger, TestStore};
use procflow::ProcedureId;
use procflow::executor::{Executor, Outcome, Status};
use procflow::locks::{Lock, LockKeyError, Locks};
use procflow::prelude::*;
use serde::{Deserialize, Serialize};

on_both_stores! {
    lock_held_for_life_excludes_until_the_end => lock_held_for_life_excludes_until_the_end;
    child_takes_a_lock_its_parent_holds => child_takes_a_lock_its_parent_holds;
    per_step_locks_are_free_between_steps => per_step_locks_are_free_between_steps;
    invalid_lock_key_fails_before_the_first_step => invalid_lock_key_fails_before_the_first_step;
    locks_are_taken_again_after_a_restart => locks_are_taken_again_after_a_restart;
}

/// Takes its locks, then waits on event `name` (so it holds them as long as a test needs).
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Holder, env = Ledger)]
enum HolderState {
    #[initial]
    #[transition(to = [Work])]
    Wait,
    #[transition(to = [Done])]
    Work,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize, Clone)]
struct Holder {
    name: String,
    exclusive: Vec<String>,
    per_step: bool,
    /// Wait on event `name` before working.
    block: bool,
    /// Spawn a child holding these keys exclusively.
    child_keys: Vec<String>,
}

impl Holder {
    fn new(name: &str, keys: &[&str]) -> Self {
        Self {
            name: name.into(),
            exclusive: keys.iter().map(|k| (*k).to_owned()).collect(),
            per_step: false,
            block: false,
            child_keys: Vec::new(),
        }
    }
    fn blocking(self) -> Self {
        Self {
            block: true,
            ..self
        }
    }
}

impl HolderStateHandlers for Holder {
    async fn wait(&mut self, ctx: &Context<Ledger>) -> Step<holder_state::Wait> {
        let go = format!("{} go", self.name);
        if self.block && !ctx.env().events().contains(&go) {
            return Ok(Flow::suspend(self.name.clone()));
        }
        Ok(holder_state::Wait::Work.into())
    }
    async fn work(&mut self, ctx: &Context<Ledger>) -> Step<holder_state::Work> {
        ctx.env().push(format!("{} work", self.name));
        if self.name.ends_with("fails") {
            return Err(Error::fatal("failed while holding"));
        }
        if self.child_keys.is_empty() {
            return Ok(holder_state::Work::Done.into());
        }
        let child = Holder {
            child_keys: Vec::new(),
            ..Holder::new(
                &format!("{}-child", self.name),
                &self
                    .child_keys
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            )
        };
        Ok(Flow::spawn(
            [Child::new::<HolderState>(&child)?],
            holder_state::Work::Done,
        ))
    }
    fn locks(&self) -> Result<Locks, LockKeyError> {
        let locks = self
            .exclusive
            .iter()
            .map(Lock::exclusive)
            .collect::<Result<Vec<_>, _>>()?;
        let locks = Locks::new(locks);
        Ok(if self.per_step {
            locks.per_step()
        } else {
            locks
        })
    }
}

async fn start(store: &TestStore, ledger: &Ledger) -> Executor<Ledger> {
    store
        .builder(ledger)
        .register::<HolderState>()
        .start()
        .await
        .unwrap()
}

async fn status(executor: &Executor<Ledger>, id: ProcedureId, wanted: Status) {
    let mut info = executor.subscribe(id).unwrap();
    info.wait_for(|i| i.status == wanted).await.unwrap();
}

/// Polls `condition` (for at most 5 s) until it holds.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    for _ in 0..500 {
        if condition() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

async fn suspended(executor: &Executor<Ledger>, id: ProcedureId) {
    let mut info = executor.subscribe(id).unwrap();
    info.wait_for(|i| matches!(i.status, Status::Suspended { .. }))
        .await
        .unwrap();
}

/// HBase `TestProcedureSuspended#testSuspendWhileHoldingLocks`: p1 and p2 need lock A, p3
/// needs lock B. p2
/// never runs before p1 ends, p3 runs meanwhile, p1 failing releases A.
async fn lock_held_for_life_excludes_until_the_end(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let p1 = executor
        .submit(Holder::new("p1-fails", &["A"]).blocking())
        .await
        .unwrap();
    suspended(&executor, p1).await;
    let p2 = executor.submit(Holder::new("p2", &["A"])).await.unwrap();
    status(&executor, p2, Status::WaitingForLock).await;
    let p3 = executor.submit(Holder::new("p3", &["B"])).await.unwrap();
    assert_eq!(
        executor.wait(p3).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!(executor.lock_waiters(), [p2]);
    assert_eq!(ledger.count("p2 work"), 0);
    // p1 fails (it holds A while suspended, and while rolling back); then p2 runs.
    ledger.push("p1-fails go");
    executor.wake("p1-fails").await.unwrap();
    assert!(matches!(
        executor.wait(p1).bounded().await.unwrap(),
        Outcome::RolledBack(_)
    ));
    assert_eq!(
        executor.wait(p2).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    let order: Vec<_> = ledger
        .events()
        .into_iter()
        .filter(|e| e.ends_with("work"))
        .collect();
    assert_eq!(order, ["p3 work", "p1-fails work", "p2 work"]);
    assert!(executor.held_locks().is_empty());
}

/// GreptimeDB deadlocked here: the parent holds `ns/t1` for life and waits for a child
/// that needs `ns/t1/r1` (and `ns/t1` itself).
async fn child_takes_a_lock_its_parent_holds(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let parent = Holder {
        child_keys: vec!["ns/t1/r1".into(), "ns/t1".into()],
        ..Holder::new("parent", &["ns/t1"])
    };
    let id = executor.submit(parent).await.unwrap();
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(10), executor.wait(id))
        .await
        .expect("no deadlock");
    assert_eq!(outcome.unwrap(), Outcome::Succeeded);
    assert_eq!(ledger.count("parent-child work"), 1);
}

async fn per_step_locks_are_free_between_steps(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let p1 = Holder {
        per_step: true,
        ..Holder::new("p1", &["A"]).blocking()
    };
    let p1 = executor.submit(p1).await.unwrap();
    suspended(&executor, p1).await;
    eventually("p1 releases A while suspended", || {
        executor.held_locks().is_empty()
    })
    .await;
    let p2 = executor.submit(Holder::new("p2", &["A"])).await.unwrap();
    assert_eq!(
        executor.wait(p2).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    ledger.push("p1 go");
    executor.wake("p1").await.unwrap();
    assert_eq!(
        executor.wait(p1).bounded().await.unwrap(),
        Outcome::Succeeded
    );
}

async fn invalid_lock_key_fails_before_the_first_step(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let id = executor
        .submit(Holder::new("bad", &["ns//t1"]))
        .await
        .unwrap();
    let Outcome::RolledBack(error) = executor.wait(id).bounded().await.unwrap() else {
        panic!("expected a rollback");
    };
    assert!(error.to_string().contains("ns//t1"), "{error}");
    assert_eq!(ledger.count("bad work"), 0);
}

async fn locks_are_taken_again_after_a_restart(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let p1 = executor
        .submit(Holder::new("p1", &["A"]).blocking())
        .await
        .unwrap();
    suspended(&executor, p1).await;
    executor.kill();
    let executor = start(&store, &ledger).await;
    let a = Lock::exclusive("A").unwrap();
    eventually("p1 takes A again", || {
        executor.held_locks() == [(p1, a.clone())]
    })
    .await;
    assert!(matches!(
        executor.state(p1).unwrap().status,
        Status::Suspended { .. }
    ));
    let p2 = executor.submit(Holder::new("p2", &["A"])).await.unwrap();
    status(&executor, p2, Status::WaitingForLock).await;
    ledger.push("p1 go");
    executor.wake("p1").await.unwrap();
    assert_eq!(
        executor.wait(p2).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!(
        executor.wait(p1).bounded().await.unwrap(),
        Outcome::Succeeded
    );
}
