//! Fencing: an executor started with a higher token takes the store over while the old
//! one is still alive (a paused process, not a dead one); the old one's next write is
//! refused by the store and it stops, and the new one resumes every procedure.

#[path = "common/bounded.rs"]
mod bounded;

use bounded::Bounded;
use procflow::executor::{Executor, ExecutorError, Outcome, SubmitError};
use procflow::prelude::*;
use procflow_store::{MemStore, Store, WalConfig, WalStore};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// What the handlers did, and the gate that holds the `Work` step.
struct Env {
    /// (procedure id, state, the executor's token) per handler run.
    ledger: Mutex<Vec<(u64, &'static str, Option<u64>)>>,
    /// `Work` takes a permit before it returns.
    gate: Semaphore,
}

impl Env {
    fn new(open: bool) -> Arc<Self> {
        Arc::new(Self {
            ledger: Mutex::new(Vec::new()),
            gate: Semaphore::new(if open { Semaphore::MAX_PERMITS } else { 0 }),
        })
    }

    fn record(&self, ctx: &Context<Env>, state: &'static str) {
        let entry = (ctx.id().get(), state, ctx.fencing_token());
        self.ledger.lock().unwrap().push(entry);
    }

    fn entered(&self, state: &str) -> usize {
        let ledger = self.ledger.lock().unwrap();
        ledger.iter().filter(|(_, s, _)| *s == state).count()
    }

    fn tokens(&self) -> Vec<Option<u64>> {
        let ledger = self.ledger.lock().unwrap();
        ledger.iter().map(|(_, _, token)| *token).collect()
    }
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Move, env = Env)]
enum MoveState {
    #[initial]
    #[transition(to = [Work])]
    Prepare,
    #[transition(to = [Moved])]
    Work,
    #[terminal]
    Moved,
}

#[derive(Serialize, Deserialize)]
struct Move;

impl MoveStateHandlers for Move {
    async fn prepare(&mut self, ctx: &Context<Env>) -> Step<move_state::Prepare> {
        ctx.env().record(ctx, "Prepare");
        Ok(move_state::Prepare::Work.into())
    }

    async fn work(&mut self, ctx: &Context<Env>) -> Step<move_state::Work> {
        ctx.env().record(ctx, "Work");
        ctx.env().gate.acquire().await.expect("gate").forget();
        Ok(move_state::Work::Moved.into())
    }
}

async fn executor(
    store: Arc<dyn Store>,
    env: Arc<Env>,
    token: u64,
) -> Result<Executor<Env>, ExecutorError> {
    Executor::builder_shared(store, env)
        .register::<MoveState>()
        .fencing_token(token)
        .start()
        .await
}

/// Polls `check` every 5 ms for up to 10 s.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_newer_executor_fences_the_old_one_which_stops_at_its_next_write() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let old_env = Env::new(false);
    let old = executor(Arc::clone(&store), Arc::clone(&old_env), 1)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(old.submit(Move).await.unwrap());
    }
    // Each is inside `Work`, held by the closed gate: the old owner is alive but paused.
    eventually("three procedures in Work", || old_env.entered("Work") == 3).await;

    // The new owner takes the store over and resumes them from their last stored step.
    let new_env = Env::new(true);
    let new = executor(Arc::clone(&store), Arc::clone(&new_env), 2)
        .await
        .unwrap();
    for &id in &ids {
        assert!(matches!(
            new.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        ));
    }
    assert_eq!(new_env.entered("Work"), 3, "the new owner reran Work");
    assert!(new_env.tokens().iter().all(|token| *token == Some(2)));

    // The old owner wakes up: its steps end, their writes are refused, it stops.
    old_env.gate.add_permits(3);
    eventually("the old executor to halt", || old.halted().is_some()).await;
    assert!(
        matches!(
            old.halted(),
            Some(ExecutorError::Fenced {
                token: 1,
                highest: 2
            })
        ),
        "{:?}",
        old.halted()
    );
    assert!(old_env.tokens().iter().all(|token| *token == Some(1)));
    assert!(matches!(
        old.submit(Move).await,
        Err(SubmitError::Executor(ExecutorError::Fenced { .. }))
    ));
    // What the store holds is the new owner's: every procedure finished.
    let loaded = store.load().await.unwrap();
    for &id in &ids {
        let record = loaded.records.iter().find(|r| r.id == id.get()).unwrap();
        assert!(record.finished, "procedure {id} is finished in the store");
    }
    new.shutdown().bounded().await.unwrap();
}

#[tokio::test]
async fn starting_with_a_lower_token_than_the_store_has_seen_is_refused() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let newer = executor(Arc::clone(&store), Env::new(true), 5)
        .await
        .unwrap();
    let older = executor(Arc::clone(&store), Env::new(true), 3).await;
    assert!(
        matches!(
            older,
            Err(ExecutorError::Fenced {
                token: 3,
                highest: 5
            })
        ),
        "{:?}",
        older.err()
    );
    // The refused start changed nothing: the newer owner goes on.
    let id = newer.submit(Move).await.unwrap();
    assert!(matches!(
        newer.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    ));
    newer.shutdown().bounded().await.unwrap();
}

#[tokio::test]
async fn the_fence_survives_reopening_a_write_ahead_log() {
    let dir = tempfile::tempdir().unwrap();
    let open = || -> Arc<dyn Store> {
        Arc::new(WalStore::open(dir.path(), WalConfig::default()).expect("open the WAL"))
    };
    {
        let store = open();
        let newer = executor(Arc::clone(&store), Env::new(true), 9)
            .await
            .unwrap();
        newer.shutdown().bounded().await.unwrap();
        store.close().await.unwrap();
    }
    let store = open();
    let older = executor(Arc::clone(&store), Env::new(true), 8).await;
    assert!(
        matches!(
            older,
            Err(ExecutorError::Fenced {
                token: 8,
                highest: 9
            })
        ),
        "{:?}",
        older.err()
    );
    // The same token again is the same owner coming back: allowed.
    let again = executor(store, Env::new(true), 9).await.unwrap();
    again.shutdown().bounded().await.unwrap();
}
