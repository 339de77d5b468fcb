//! Test machines and stores shared by the executor tests.
#![allow(dead_code)] // Each test file uses a different part.

pub mod bounded;
pub mod ops;

#[allow(unused_imports)] // Each test file uses a different part.
pub use bounded::{Bounded, PATIENCE};

use procflow::executor::{Config, Executor, ExecutorBuilder, RetryPolicy};
use procflow::prelude::*;
use procflow_store::{
    Batch, BoxFuture, Limits, Loaded, MemStore, ProcId, Record, RecordInfo, Store, StoreError,
    SyncMode, WalConfig, WalStore,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What handlers did, shared by every executor of one test (it outlives restarts, like a
/// real external system would).
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<LedgerInner>>);

#[derive(Default)]
pub struct LedgerInner {
    pub events: Vec<String>,
    /// Idempotent effects: one value per key, written with "set".
    pub values: HashMap<String, u64>,
}

impl Ledger {
    pub fn push(&self, event: impl Into<String>) {
        self.0.lock().unwrap().events.push(event.into());
    }
    pub fn set(&self, key: impl Into<String>, value: u64) {
        self.0.lock().unwrap().values.insert(key.into(), value);
    }
    pub fn events(&self) -> Vec<String> {
        self.0.lock().unwrap().events.clone()
    }
    pub fn count(&self, event: &str) -> usize {
        self.events().iter().filter(|e| *e == event).count()
    }
    pub fn value(&self, key: &str) -> Option<u64> {
        self.0.lock().unwrap().values.get(key).copied()
    }
}

/// HBase's counter machine: adds 3, 5, 7, 11 to a persisted counter across four states.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Counter, env = Ledger)]
pub enum CounterState {
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
    #[transition(to = [Done])]
    Four,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize, Default, Clone)]
pub struct Counter {
    pub name: String,
    pub value: u64,
    /// The step (1..=4) that fails fatally.
    pub fail_at: Option<u8>,
    /// Retryable failures of step `fail_at` before it succeeds (when `fatal` is false).
    pub transient: u32,
    pub fatal: bool,
    pub panic_at: Option<u8>,
    /// Transient failures of every rollback step before it succeeds.
    pub rollback_transient: u32,
    /// Step at which the handler suspends once, on event `name`.
    pub suspend_at: Option<u8>,
    pub suspend_timeout_ms: Option<u64>,
    #[serde(skip)]
    pub suspended: bool,
    pub slow_ms: u64,
}

impl Counter {
    pub fn named(name: &str) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    async fn step(&mut self, ctx: &Context<Ledger>, n: u8, add: u64) -> Result<bool, Error> {
        let ledger = ctx.env();
        ledger.push(format!("{} execute {n}", self.name));
        ledger.set(
            format!("{} step {n} attempt {}", self.name, ctx.attempt()),
            1,
        );
        if self.slow_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.slow_ms)).await;
        }
        assert!(self.panic_at != Some(n), "boom at step {n}");
        if self.fail_at == Some(n) {
            if self.fatal {
                return Err(Error::fatal(format!("step {n} failed")));
            }
            if self.transient > 0 {
                self.transient -= 1;
                return Err(Error::retryable(format!("step {n} busy")));
            }
        }
        if self.suspend_at == Some(n) && !ledger.events().contains(&format!("{} woken", self.name))
        {
            ledger.push(format!("{} suspend {n}", self.name));
            return Ok(false);
        }
        self.value += add;
        ledger.set(format!("{} value", self.name), self.value);
        Ok(true)
    }

    fn suspend<T>(&self) -> Flow<T> {
        match self.suspend_timeout_ms {
            Some(ms) => Flow::suspend_for(self.name.clone(), Duration::from_millis(ms)),
            None => Flow::suspend(self.name.clone()),
        }
    }

    fn undo(&mut self, ctx: &Context<Ledger>, n: u8) -> Result<(), Error> {
        ctx.env().push(format!("{} rollback {n}", self.name));
        if self.rollback_transient > 0 {
            self.rollback_transient -= 1;
            return Err(Error::retryable("rollback busy"));
        }
        Ok(())
    }
}

impl CounterStateHandlers for Counter {
    async fn one(&mut self, ctx: &Context<Ledger>) -> Step<counter_state::One> {
        Ok(match self.step(ctx, 1, 3).await? {
            true => counter_state::One::Two.into(),
            false => self.suspend(),
        })
    }
    async fn two(&mut self, ctx: &Context<Ledger>) -> Step<counter_state::Two> {
        Ok(match self.step(ctx, 2, 5).await? {
            true => counter_state::Two::Three.into(),
            false => self.suspend(),
        })
    }
    async fn three(&mut self, ctx: &Context<Ledger>) -> Step<counter_state::Three> {
        Ok(match self.step(ctx, 3, 7).await? {
            true => counter_state::Three::Four.into(),
            false => self.suspend(),
        })
    }
    async fn four(&mut self, ctx: &Context<Ledger>) -> Step<counter_state::Four> {
        Ok(match self.step(ctx, 4, 11).await? {
            true => counter_state::Four::Done.into(),
            false => self.suspend(),
        })
    }
    async fn rollback_one(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        self.undo(ctx, 1)
    }
    async fn rollback_two(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        self.undo(ctx, 2)
    }
    async fn rollback_three(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        self.undo(ctx, 3)
    }
}

/// Grows its data by 100 × n² bytes at step n (100, then 400 more: the second step's
/// state is over a small store limit at once, while the first still fits), up to ten
/// steps, holding an exclusive lock `grow` for life. For stores that refuse big values.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Grow, env = Ledger)]
pub enum GrowState {
    #[initial]
    #[transition(to = [Grow, Done])]
    Grow,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize, Default)]
pub struct Grow {
    pub data: Vec<u8>,
    pub steps: u32,
}

impl Grow {
    pub fn new() -> Self {
        Self::default()
    }
}

impl GrowStateHandlers for Grow {
    async fn grow(&mut self, ctx: &Context<Ledger>) -> Step<grow_state::Grow> {
        ctx.env().push("grow");
        self.steps += 1;
        let more = 100 * self.steps as usize * self.steps as usize;
        self.data.extend(std::iter::repeat_n(7, more));
        Ok(if self.steps < 10 {
            grow_state::Grow::Grow
        } else {
            grow_state::Grow::Done
        }
        .into())
    }
    fn locks(&self) -> Result<procflow::locks::Locks, procflow::locks::LockKeyError> {
        Ok(procflow::locks::Locks::new([
            procflow::locks::Lock::exclusive("grow")?,
        ]))
    }
}

/// A quick retry policy for tests.
pub fn fast_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        initial: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        max_attempts,
        jitter: 0.0,
        ..RetryPolicy::default()
    }
}

pub fn test_config() -> Config {
    Config {
        retry: fast_retries(5),
        rollback_retry: fast_retries(5),
        ..Config::default()
    }
}

/// One of the two stores every executor scenario runs on.
pub struct TestStore {
    pub store: Arc<dyn Store>,
    dir: Option<tempfile::TempDir>,
}

impl TestStore {
    /// A `MemStore` that outlives `close`, so a test can "restart" on it after a shutdown.
    pub fn memory() -> Self {
        Self {
            store: Arc::new(Hooked::keep_open(MemStore::new())),
            dir: None,
        }
    }

    /// [`memory`](Self::memory) refusing what is over `limits`.
    pub fn memory_with_limits(limits: Limits) -> Self {
        Self {
            store: Arc::new(Hooked::keep_open(MemStore::with_limits(limits))),
            dir: None,
        }
    }

    /// Any store (without a directory: `reopen` keeps it as it is).
    pub fn with(store: Arc<dyn Store>) -> Self {
        Self { store, dir: None }
    }

    /// A durable `WalStore` in a fresh temporary directory.
    pub fn wal() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = open_wal(dir.path());
        Self {
            store,
            dir: Some(dir),
        }
    }

    /// The same store as a new process would find it: the WAL reopened from its directory
    /// (the previous handle must be closed), the memory store as it is.
    pub fn reopen(self) -> Self {
        match self.dir {
            Some(dir) => {
                drop(self.store);
                Self {
                    store: open_wal(dir.path()),
                    dir: Some(dir),
                }
            }
            None => self,
        }
    }

    /// Whether this is the WAL variant (a test that makes fresh stores makes the same kind).
    pub fn dir_kind(&self) -> bool {
        self.dir.is_some()
    }

    pub fn builder(&self, ledger: &Ledger) -> ExecutorBuilder<Ledger> {
        Executor::builder(Arc::clone(&self.store), ledger.clone()).config(test_config())
    }
}

fn open_wal(dir: &std::path::Path) -> Arc<dyn Store> {
    let config = WalConfig {
        sync: SyncMode::Durable,
        ..WalConfig::default()
    };
    Arc::new(WalStore::open(dir.join("wal"), config).unwrap())
}

/// What a [`Hooked`] store's `commit` does: given the `MemStore` and the batch.
pub type OnCommit =
    dyn Fn(Arc<MemStore>, Batch) -> BoxFuture<'static, Result<(), StoreError>> + Send + Sync;

/// A `MemStore` whose commits go through `on_commit`, and which ignores `close` (so a
/// test can "restart" on it after a shutdown); everything else is the `MemStore`'s.
pub struct Hooked {
    pub inner: Arc<MemStore>,
    on_commit: Box<OnCommit>,
}

impl Hooked {
    pub fn new(
        inner: MemStore,
        on_commit: impl Fn(Arc<MemStore>, Batch) -> BoxFuture<'static, Result<(), StoreError>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self {
            inner: Arc::new(inner),
            on_commit: Box::new(on_commit),
        }
    }

    /// Commits go straight to the `MemStore`.
    pub fn keep_open(inner: MemStore) -> Self {
        Self::new(inner, |store, batch| {
            Box::pin(async move { store.commit(batch).await })
        })
    }
}

impl Store for Hooked {
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<(), StoreError>> {
        (self.on_commit)(Arc::clone(&self.inner), batch)
    }
    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        self.inner.load()
    }
    fn get(&self, id: ProcId) -> BoxFuture<'_, Result<Option<Record>, StoreError>> {
        self.inner.get(id)
    }
    fn list(&self) -> BoxFuture<'_, Result<Vec<RecordInfo>, StoreError>> {
        self.inner.list()
    }
    fn limits(&self) -> Limits {
        self.inner.limits()
    }
    fn close(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Runs `scenario` once on a `MemStore` and once on a durable `WalStore`.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident => $scenario:ident;)*) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$scenario($crate::common::TestStore::memory()).await;
            })*
        }
        mod wal {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$scenario($crate::common::TestStore::wal()).await;
            })*
        }
    };
}

/// Waits until procedure `id`'s status satisfies `wanted`; after `patience`, fails the
/// test with the status it is stuck in instead of hanging.
pub async fn status_is<E: Send + Sync + 'static>(
    executor: &Executor<E>,
    id: procflow::ProcedureId,
    patience: Duration,
    wanted: impl Fn(&procflow::executor::Status) -> bool,
) {
    let mut info = executor.subscribe(id).unwrap();
    tokio::time::timeout(patience, info.wait_for(|i| wanted(&i.status)))
        .await
        .unwrap_or_else(|_| panic!("{id}: status never reached: {:?}", executor.state(id)))
        .unwrap();
}
