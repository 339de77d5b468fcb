//! Crash tests for your own procedures (feature `testing`).
//!
//! After a crash the executor runs the interrupted step again, so every execute and
//! rollback handler must be idempotent: running it twice must leave the world as running
//! it once does. These checks tell you whether yours are, the way HBase's
//! `ProcedureTestingUtility` does for HBase's own procedures:
//!
//! - [`CrashTest::double_execution`] runs a procedure once cleanly, then again while the
//!   executor dies right before every other store write (and, in a third pass, right
//!   after), restarting it on the same store each time. The outcome and what you observe
//!   of your environment must match the clean run.
//! - [`CrashTest::rollback_double_execution`] does the same for a procedure that rolls
//!   back (it fails, or is aborted at step N), dying before every rollback write.
//! - [`StepByStep`] runs one step at a time and hands back the persisted state after each.
//! - [`golden`] fails when the stored form of a procedure type changes without a data
//!   version bump, and checks that older versions' samples still migrate.
//!
//! Every pass also checks lock exclusivity ([`lock_conflict`]): at every store write and
//! after every restart, no two procedures of the tree (a procedure and its children hold
//! locks; children may share their ancestors') hold conflicting locks.
//!
//! Every pass runs on a fresh [`MemStore`]; the environment is built anew for each pass
//! (it stands for the outside world, which survives the restarts within a pass).
//!
//! # Examples
//!
//! ```
//! use procflow::prelude::*;
//! use procflow::testing::CrashTest;
//! use std::sync::Mutex;
//!
//! #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state_machine(procedure = Deposit, env = Bank)]
//! enum DepositState {
//!     #[initial] #[transition(to = [Done])] Credit,
//!     #[terminal] Done,
//! }
//!
//! #[derive(Default)]
//! struct Bank { balance: Mutex<u64>, applied: Mutex<Vec<u64>> }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Deposit { cents: u64 }
//!
//! impl DepositStateHandlers for Deposit {
//!     async fn credit(&mut self, ctx: &Context<Bank>) -> Step<deposit_state::Credit> {
//!         // Idempotent: the deposit is applied once per procedure id.
//!         let mut applied = ctx.env().applied.lock().unwrap();
//!         if !applied.contains(&ctx.id().get()) {
//!             applied.push(ctx.id().get());
//!             *ctx.env().balance.lock().unwrap() += self.cents;
//!         }
//!         Ok(deposit_state::Credit::Done.into())
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let test = CrashTest::new(|builder| builder.register::<DepositState>());
//! let report = test
//!     .double_execution::<DepositState, _>(
//!         Bank::default,
//!         || Deposit { cents: 500 },
//!         |bank| *bank.balance.lock().unwrap(),
//!     )
//!     .await?;
//! assert_eq!(report.observed, 500);
//! assert!(report.killed_before.kills > 0);
//! # Ok::<(), procflow::testing::CrashTestError>(())
//! # }).unwrap();
//! ```

mod exclusive;
mod golden;

pub use exclusive::{LockConflict, lock_conflict};
pub use golden::{BLESS, Golden, GoldenError, golden};

use crate::codec;
use crate::executor::{
    Config, Executor, ExecutorBuilder, ExecutorError, Outcome, RetryPolicy, StoreWrite,
    SubmitError, SubmitOptions, WriteKind, WritePoint,
};
use crate::{Cursor, ProcedureId, StateMachine};
use procflow_store::{MemStore, Store};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The nonce every pass submits with: a restart finds the procedure if its submit was
/// persisted, and submits it again if not.
const NONCE: &str = "procflow-crash-test";
/// The id of the one procedure a pass submits to its fresh store.
const FIRST_ID: u64 = 1;
/// A pass restarts the executor at most this often.
const MAX_RESTARTS: u32 = 10_000;

type Setup<E> = dyn Fn(ExecutorBuilder<E>) -> ExecutorBuilder<E> + Send + Sync;

/// Runs procedures through crashes; see the [module docs](self).
pub struct CrashTest<E> {
    setup: Arc<Setup<E>>,
    config: Config,
    patience: Duration,
}

/// How one pass went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// How the procedure ended.
    pub outcome: Outcome,
    /// How many times the executor was killed (and restarted).
    pub kills: u32,
}

/// What a check found: the three passes agreed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report<T> {
    /// The pass without kills.
    pub clean: Run,
    /// The pass killed before store writes.
    pub killed_before: Run,
    /// The pass killed after store writes.
    pub killed_after: Run,
    /// What `observe` returned, the same after every pass.
    pub observed: T,
}

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CrashTestError {
    /// The executor could not start or answer.
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    /// The procedure could not be submitted.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// A pass with kills ended differently from the clean run.
    #[error("{pass}: the procedure ended {found:?}, but without kills it ended {expected:?}")]
    Outcome {
        /// Which pass.
        pass: &'static str,
        /// The clean run's outcome.
        expected: Outcome,
        /// This pass's outcome.
        found: Outcome,
    },
    /// A pass with kills left the environment different from the clean run: a handler is
    /// not idempotent.
    #[error(
        "{pass}: the environment ended as {found}, but without kills it ended as {expected} \
         (a handler that ran twice did its work twice?)"
    )]
    Environment {
        /// Which pass.
        pass: &'static str,
        /// What the clean run left (`Debug`).
        expected: String,
        /// What this pass left (`Debug`).
        found: String,
    },
    /// The clean run of a rollback check did not roll back.
    #[error("the procedure did not roll back without kills: it ended {0:?}")]
    NoRollback(Outcome),
    /// The procedure could not be read back from the store.
    #[error("cannot read the persisted procedure: {0}")]
    Persisted(String),
    /// The pass never ended.
    #[error("gave up after {0} restarts")]
    TooManyRestarts(u32),
    /// Two procedures held conflicting locks at once: at a store write or after a
    /// restart (where an executor that gave locks back to the wrong procedures would show
    /// it).
    #[error("{pass}: {conflict}")]
    LockConflict {
        /// Which pass.
        pass: &'static str,
        /// Who held what.
        conflict: LockConflict,
    },
    /// The procedure did not end within the test's patience
    /// ([`CrashTest::with_patience`]): a hang, reported instead of waited on forever.
    #[error("{pass}: the procedure did not end within {waited:?}")]
    Hung {
        /// Which pass.
        pass: &'static str,
        /// How long the test waited.
        waited: Duration,
    },
}

/// Which writes a pass dies at (every other one of them: killed once, then let through).
#[derive(Clone, Copy)]
struct Kills {
    point: WritePoint,
    only: Option<WriteKind>,
}

impl<E: Send + Sync + 'static> CrashTest<E> {
    /// A crash test whose executors are set up by `setup` (register every machine the
    /// procedure and its children use).
    pub fn new(
        setup: impl Fn(ExecutorBuilder<E>) -> ExecutorBuilder<E> + Send + Sync + 'static,
    ) -> Self {
        let quick = RetryPolicy {
            initial: Duration::from_millis(1),
            max_delay: Duration::from_millis(20),
            ..RetryPolicy::default()
        };
        Self {
            setup: Arc::new(setup),
            config: Config {
                retry: quick.clone(),
                rollback_retry: quick,
                ..Config::default()
            },
            patience: Duration::from_secs(60),
        }
    }

    /// How long one run of the procedure (between two kills, or to its end) may take
    /// before the test fails with [`CrashTestError::Hung`] (default 60 s).
    #[must_use]
    pub fn with_patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Uses `config` for every executor (default: [`Config::default`] with retries of
    /// 1 ms to 20 ms, so a test does not wait on backoff).
    #[must_use]
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Checks that procedure `procedure()` of machine `M` ends the same, and leaves
    /// `observe(&env)` the same, when the executor dies right before (then right after)
    /// every other store write and restarts, as when it runs undisturbed.
    ///
    /// # Errors
    ///
    /// [`CrashTestError::Outcome`] or [`CrashTestError::Environment`] when a pass
    /// differs; executor errors as they come.
    pub async fn double_execution<M, T>(
        &self,
        env: impl Fn() -> E,
        procedure: impl Fn() -> M::Procedure,
        observe: impl Fn(&E) -> T,
    ) -> Result<Report<T>, CrashTestError>
    where
        M: StateMachine<Env = E>,
        T: PartialEq + Debug,
    {
        self.check::<M, T>(&env, &procedure, &observe, None, None)
            .await
    }

    /// Checks a procedure that rolls back: it fails by itself, or is aborted once it has
    /// completed `abort_at_step` steps. The clean run must end rolled back; then the
    /// executor dies before (then after) every other rollback write, and the outcome and
    /// `observe(&env)` must match the clean run: each rollback handler's work is done
    /// once, however often it ran.
    ///
    /// # Errors
    ///
    /// [`CrashTestError::NoRollback`] if the clean run does not roll back; otherwise as
    /// [`double_execution`](Self::double_execution).
    pub async fn rollback_double_execution<M, T>(
        &self,
        env: impl Fn() -> E,
        procedure: impl Fn() -> M::Procedure,
        abort_at_step: Option<u64>,
        observe: impl Fn(&E) -> T,
    ) -> Result<Report<T>, CrashTestError>
    where
        M: StateMachine<Env = E>,
        T: PartialEq + Debug,
    {
        self.check::<M, T>(
            &env,
            &procedure,
            &observe,
            abort_at_step,
            Some(WriteKind::Rollback),
        )
        .await
    }

    async fn check<M, T>(
        &self,
        env: &dyn Fn() -> E,
        procedure: &dyn Fn() -> M::Procedure,
        observe: &dyn Fn(&E) -> T,
        abort_at: Option<u64>,
        only: Option<WriteKind>,
    ) -> Result<Report<T>, CrashTestError>
    where
        M: StateMachine<Env = E>,
        T: PartialEq + Debug,
    {
        let (clean, expected) = self
            .pass::<M, T>(Arc::new(env()), procedure, observe, abort_at, None)
            .await?;
        if only == Some(WriteKind::Rollback) && !matches!(clean.outcome, Outcome::RolledBack(_)) {
            return Err(CrashTestError::NoRollback(clean.outcome));
        }
        let mut runs = Vec::new();
        for (pass, point) in [
            ("killed before store writes", WritePoint::Before),
            ("killed after store writes", WritePoint::After),
        ] {
            let kills = Kills { point, only };
            let (run, found) = self
                .pass::<M, T>(Arc::new(env()), procedure, observe, abort_at, Some(kills))
                .await?;
            if run.outcome != clean.outcome {
                return Err(CrashTestError::Outcome {
                    pass,
                    expected: clean.outcome,
                    found: run.outcome,
                });
            }
            if found != expected {
                return Err(CrashTestError::Environment {
                    pass,
                    expected: format!("{expected:?}"),
                    found: format!("{found:?}"),
                });
            }
            runs.push(run);
        }
        let killed_after = runs.pop().expect("two passes");
        let killed_before = runs.pop().expect("two passes");
        Ok(Report {
            clean,
            killed_before,
            killed_after,
            observed: expected,
        })
    }

    /// Runs `procedure` once, without kills, aborting it once it has completed
    /// `abort_at_step` steps if given; returns how it went and the environment it acted on
    /// (to count what the handlers did in an undisturbed run).
    ///
    /// # Errors
    ///
    /// Executor or submit errors.
    pub async fn run<M>(
        &self,
        env: E,
        procedure: M::Procedure,
        abort_at_step: Option<u64>,
    ) -> Result<(Run, Arc<E>), CrashTestError>
    where
        M: StateMachine<Env = E>,
        M::Procedure: Clone,
    {
        self.single::<M>(env, procedure, abort_at_step, None).await
    }

    /// Runs `procedure` once while the executor dies right before (or after, per
    /// `point`) every other store write and restarts; returns how it went and the
    /// environment (to count how often each handler ran: twice per step with
    /// [`WritePoint::Before`]).
    ///
    /// # Errors
    ///
    /// Executor or submit errors.
    pub async fn run_killed<M>(
        &self,
        env: E,
        procedure: M::Procedure,
        point: WritePoint,
    ) -> Result<(Run, Arc<E>), CrashTestError>
    where
        M: StateMachine<Env = E>,
        M::Procedure: Clone,
    {
        let kills = Kills { point, only: None };
        self.single::<M>(env, procedure, None, Some(kills)).await
    }

    async fn single<M>(
        &self,
        env: E,
        procedure: M::Procedure,
        abort_at_step: Option<u64>,
        kills: Option<Kills>,
    ) -> Result<(Run, Arc<E>), CrashTestError>
    where
        M: StateMachine<Env = E>,
        M::Procedure: Clone,
    {
        let env = Arc::new(env);
        let make = move || procedure.clone();
        let (run, ()) = self
            .pass::<M, ()>(Arc::clone(&env), &make, &|_| (), abort_at_step, kills)
            .await?;
        Ok((run, env))
    }

    /// One pass on a fresh store: restarts after every kill until the procedure ends,
    /// checking lock exclusivity at every store write and after every restart.
    async fn pass<M, T>(
        &self,
        env: Arc<E>,
        procedure: &dyn Fn() -> M::Procedure,
        observe: &dyn Fn(&E) -> T,
        abort_at: Option<u64>,
        kills: Option<Kills>,
    ) -> Result<(Run, T), CrashTestError>
    where
        M: StateMachine<Env = E>,
    {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        // Shared by every executor of the pass: kill, let through, kill, let through…
        let kill_next = Arc::new(AtomicBool::new(true));
        // Forward steps of the procedure persisted so far (for `abort_at`).
        let steps = Arc::new(AtomicU64::new(0));
        // The first lock conflict seen, by any executor of the pass.
        let conflict: Arc<Mutex<Option<LockConflict>>> = Arc::default();
        let pass = kills.map_or("clean run", |k| match k.point {
            WritePoint::Before => "killed before store writes",
            WritePoint::After => "killed after store writes",
        });
        let mut killed = 0;
        for _ in 0..MAX_RESTARTS {
            let handle: Arc<OnceLock<Executor<E>>> = Arc::new(OnceLock::new());
            let hook = {
                let (kill_next, steps, handle, conflict) = (
                    Arc::clone(&kill_next),
                    Arc::clone(&steps),
                    Arc::clone(&handle),
                    Arc::clone(&conflict),
                );
                move |write: &StoreWrite| {
                    if let Some(executor) = handle.get() {
                        note_conflict(&conflict, executor);
                    }
                    if write.point == WritePoint::After && write.kind == WriteKind::Step {
                        let done = steps.fetch_add(1, Ordering::SeqCst) + 1;
                        if abort_at.is_some_and(|n| done >= n) {
                            if let Some(executor) = handle.get() {
                                let _ = executor.abort(write.procedure);
                            }
                        }
                    }
                    kills.is_some_and(|k| {
                        write.point == k.point
                            && k.only.is_none_or(|kind| kind == write.kind)
                            && kill_next.fetch_xor(true, Ordering::SeqCst)
                    })
                }
            };
            let mut builder = Executor::builder_shared(Arc::clone(&store), Arc::clone(&env))
                .config(self.config.clone())
                .kill_hook(hook);
            if abort_at.is_some_and(|n| steps.load(Ordering::SeqCst) >= n) {
                // Aborts are not persisted: ask again, before the procedure can run a step.
                builder = builder.abort_on_start(FIRST_ID);
            }
            let executor = (self.setup)(builder).start().await?;
            // Right after the restart: whom it gave locks back to.
            note_conflict(&conflict, &executor);
            let _ = handle.set(executor.clone());
            let options = SubmitOptions::default().nonce(NONCE);
            let id = match executor.submit_with(procedure(), options).await {
                Ok(id) => id,
                // Killed before or after the submit's write: the nonce finds it if stored.
                Err(
                    SubmitError::Executor(ExecutorError::Killed)
                    | SubmitError::MaybeStored {
                        source: ExecutorError::Killed,
                        ..
                    },
                ) => {
                    killed += 1;
                    continue;
                }
                Err(other) => return Err(other.into()),
            };
            let waited = tokio::time::timeout(self.patience, executor.wait(id)).await;
            let Ok(waited) = waited else {
                executor.kill();
                return Err(CrashTestError::Hung {
                    pass,
                    waited: self.patience,
                });
            };
            if let Some(conflict) = conflict.lock().unwrap_or_else(|e| e.into_inner()).take() {
                executor.kill();
                return Err(CrashTestError::LockConflict { pass, conflict });
            }
            match waited {
                Ok(outcome) => {
                    executor.kill(); // Stop its other tasks (retention, children).
                    let observed = observe(&env);
                    let run = Run {
                        outcome,
                        kills: killed,
                    };
                    return Ok((run, observed));
                }
                Err(ExecutorError::Killed) => killed += 1,
                Err(other) => return Err(other.into()),
            }
        }
        Err(CrashTestError::TooManyRestarts(MAX_RESTARTS))
    }
}

/// Keeps the first lock conflict `executor` shows now.
fn note_conflict<E: Send + Sync + 'static>(
    first: &Mutex<Option<LockConflict>>,
    executor: &Executor<E>,
) {
    let mut first = first.lock().unwrap_or_else(|e| e.into_inner());
    if first.is_none() {
        *first = lock_conflict(executor);
    }
}

/// A procedure as the store holds it after a step.
pub struct Persisted<M: StateMachine> {
    /// Its data.
    pub procedure: M::Procedure,
    /// Its position.
    pub cursor: Cursor<M>,
    /// Whether the store marks it finished (its last write).
    pub finished: bool,
}

/// Runs one procedure one persisted step at a time, handing back its stored form after
/// each; see the [module docs](self).
///
/// ```
/// # use procflow::prelude::*;
/// # use procflow::testing::StepByStep;
/// # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
/// # #[state_machine(procedure = Job)]
/// # enum JobState {
/// #     #[initial] #[transition(to = [Two])] One,
/// #     #[transition(to = [Done])] Two,
/// #     #[terminal] Done,
/// # }
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct Job { log: Vec<u8> }
/// # impl JobStateHandlers for Job {
/// #     async fn one(&mut self, _: &Context<()>) -> Step<job_state::One> { self.log.push(1); Ok(job_state::One::Two.into()) }
/// #     async fn two(&mut self, _: &Context<()>) -> Step<job_state::Two> { self.log.push(2); Ok(job_state::Two::Done.into()) }
/// # }
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let mut steps = StepByStep::<JobState>::start(|b| b.register::<JobState>(), (), Job { log: vec![] }).await?;
/// let after_one = steps.step().await?.unwrap();
/// assert_eq!(after_one.cursor.state(), JobState::Two);
/// assert_eq!(after_one.procedure.log, [1]);
/// // The step into the terminal state is written with the end: one write.
/// let end = steps.step().await?.unwrap();
/// assert_eq!(end.cursor.state(), JobState::Done);
/// assert_eq!(end.procedure.log, [1, 2]);
/// assert!(end.finished);
/// assert!(steps.step().await?.is_none());
/// # Ok::<(), procflow::testing::CrashTestError>(())
/// # }).unwrap();
/// ```
pub struct StepByStep<M: StateMachine> {
    setup: Arc<Setup<M::Env>>,
    store: Arc<dyn Store>,
    env: Arc<M::Env>,
    id: ProcedureId,
}

impl<M: StateMachine> StepByStep<M> {
    /// Persists `procedure` (not running any step yet).
    ///
    /// # Errors
    ///
    /// Executor or submit errors.
    pub async fn start(
        setup: impl Fn(ExecutorBuilder<M::Env>) -> ExecutorBuilder<M::Env> + Send + Sync + 'static,
        env: M::Env,
        procedure: M::Procedure,
    ) -> Result<Self, CrashTestError> {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let env = Arc::new(env);
        let stop_after_submit =
            |w: &StoreWrite| w.kind == WriteKind::Submit && w.point == WritePoint::After;
        let builder = Executor::builder_shared(Arc::clone(&store), Arc::clone(&env))
            .kill_hook(stop_after_submit);
        let executor = setup(builder).start().await?;
        let id = match executor.submit_as::<M>(procedure).await {
            // Stopped right after the submit's write, as the hook asks: it is stored.
            Err(SubmitError::MaybeStored {
                id,
                source: ExecutorError::Killed,
            }) => id,
            Ok(id) => id,
            Err(other) => return Err(other.into()),
        };
        Ok(Self {
            setup: Arc::new(setup),
            store,
            env,
            id,
        })
    }

    /// Runs until the procedure's next store write (a step, a rollback step, a spawn, a
    /// suspension or its end) and returns what the store then holds; `None` once it had
    /// already ended.
    ///
    /// # Errors
    ///
    /// Executor errors, or a record that cannot be read back.
    pub async fn step(&mut self) -> Result<Option<Persisted<M>>, CrashTestError> {
        let id = self.id;
        if self.read().await?.finished {
            return Ok(None);
        }
        let stop_after_own_write = move |w: &StoreWrite| {
            w.procedure == id && w.point == WritePoint::After && w.kind != WriteKind::Submit
        };
        let builder = Executor::builder_shared(Arc::clone(&self.store), Arc::clone(&self.env))
            .kill_hook(stop_after_own_write);
        let executor = (self.setup)(builder).start().await?;
        let _ = executor.wait(id).await;
        executor.kill();
        self.read().await.map(Some)
    }

    /// The environment the handlers act on.
    #[must_use]
    pub fn env(&self) -> &M::Env {
        &self.env
    }

    async fn read(&self) -> Result<Persisted<M>, CrashTestError> {
        let record = self
            .store
            .get(self.id.get())
            .await
            .map_err(|e| CrashTestError::Persisted(e.to_string()))?
            .ok_or_else(|| CrashTestError::Persisted(format!("no record for {}", self.id)))?;
        let (_, snapshot) =
            crate::executor::split_record(&record.value).map_err(CrashTestError::Persisted)?;
        let (procedure, cursor) =
            codec::decode::<M>(snapshot).map_err(|e| CrashTestError::Persisted(e.to_string()))?;
        Ok(Persisted {
            procedure,
            cursor,
            finished: record.finished,
        })
    }
}
