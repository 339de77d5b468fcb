//! The executor: runs procedures on tokio, persists every step to a
//! `Store`, and after a restart resumes every unfinished procedure
//! from its last persisted step, or rolls it back.
//!
//! Use it instead of the in-memory [`Stepper`](crate::Stepper) whenever the work must
//! survive the process: every step's result is durable in the store before the next step
//! starts, so after a crash only the step that was running runs again (make steps
//! idempotent).
//!
//! # Examples
//!
//! ```
//! use procflow::prelude::*;
//! use procflow::executor::{Executor, Outcome};
//! use procflow_store::MemStore;
//! use std::sync::Arc;
//!
//! #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state_machine(procedure = Greet)]
//! enum GreetState {
//!     #[initial] #[transition(to = [Done])] Hello,
//!     #[terminal] Done,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Greet { name: String }
//!
//! impl GreetStateHandlers for Greet {
//!     async fn hello(&mut self, _: &Context<()>) -> Step<greet_state::Hello> {
//!         self.name.insert_str(0, "hello, ");
//!         Ok(greet_state::Hello::Done.into())
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = Arc::new(MemStore::new());
//! let executor = Executor::builder(store, ()).register::<GreetState>().start().await?;
//! let id = executor.submit(Greet { name: "ada".into() }).await?;
//! assert_eq!(executor.wait(id).await?, Outcome::Succeeded);
//! assert_eq!(executor.state(id).unwrap().steps, 1);
//! executor.shutdown().await?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod ahead;
mod builder;
mod cleanup;
mod config;
mod deferred;
mod erased;
mod error;
mod hooks;
mod ids;
mod inner;
mod journal;
mod lanes;
mod lazy;
pub(crate) mod packed;
mod permits;
mod requests;
mod runner;
mod signal;
pub(crate) mod status;
mod submit;
mod timers;
mod unreadable;
mod view;
mod wakes;
mod watched;

pub use builder::ExecutorBuilder;
pub use config::{Config, RetryPolicy};
pub use error::{ExecutorError, SubmitError};
pub use hooks::{KillHook, StoreWrite, WriteKind, WritePoint};
pub use requests::Handled;
pub use status::{Outcome, ProcedureInfo, Status, Unloadable};
#[cfg(feature = "admin")]
pub(crate) use view::Taken;

use crate::locks::Lock;
use crate::{Error, Procedure, ProcedureId, StateMachine};
use inner::{Inner, Mode};
use procflow_store::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Splits a stored record value into the executor's envelope and the procedure's
/// snapshot (for `procflow::testing`).
#[cfg(feature = "testing")]
pub(crate) fn split_record(value: &[u8]) -> Result<((), &[u8]), String> {
    crate::stored::record::Envelope::decode(value).map(|(_, snapshot)| ((), snapshot))
}

/// Runs procedures; cheap to clone (all clones drive the same executor).
///
/// The environment `E` is shared with every handler through
/// [`Context::env`](crate::Context::env); every registered machine must declare it with
/// `#[state_machine(env = E)]` (or leave both at `()`).
pub struct Executor<E> {
    inner: Arc<Inner<E>>,
}

impl<E> Clone for Executor<E> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// Options of [`Executor::submit_with`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubmitOptions {
    /// A client's request id: submitting the same nonce again, also after a restart,
    /// returns the first submit's procedure id instead of starting another procedure
    /// (until the procedure is past its retention).
    pub nonce: Option<String>,
    /// Fail the procedure (roll it back) if it has not ended after this long. Survives
    /// restarts (wall-clock deadline). Not enforced past a point of no return.
    pub timeout: Option<Duration>,
}

impl SubmitOptions {
    /// Sets the nonce.
    #[must_use]
    pub fn nonce(mut self, nonce: impl Into<String>) -> Self {
        self.nonce = Some(nonce.into());
        self
    }

    /// Sets the timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

impl<E: Send + Sync + 'static> Executor<E> {
    /// Starts configuring an executor persisting to `store` and sharing `env` with
    /// every handler.
    pub fn builder(store: Arc<dyn Store>, env: E) -> ExecutorBuilder<E> {
        ExecutorBuilder::new(store, Arc::new(env))
    }

    /// [`builder`](Self::builder) with an environment the caller keeps a handle on (to
    /// read it after the procedures ran, or to share it between executors, as a crash
    /// test does across restarts).
    pub fn builder_shared(store: Arc<dyn Store>, env: Arc<E>) -> ExecutorBuilder<E> {
        ExecutorBuilder::new(store, env)
    }

    /// The environment shared with every handler.
    #[must_use]
    pub fn env(&self) -> &Arc<E> {
        &self.inner.env
    }

    /// Starts a procedure at its machine's initial state. Returns once the procedure is
    /// durable in the store.
    ///
    /// The machine is inferred from the procedure's type (the derive implements
    /// [`Procedure`] on it): `executor.submit(CreateTable { .. })`. To
    /// name the machine at the call site, use [`submit_as`](Self::submit_as).
    ///
    /// # Errors
    ///
    /// [`SubmitError`]: `M` not registered, the executor full, the data not serializable,
    /// the store refused the procedure, or the executor not running: refusals, nothing
    /// was stored. And one error that is not a refusal: [`SubmitError::MaybeStored`], the
    /// store's answer to the write was lost, so the procedure may be stored and run after
    /// the next start; retry with the same nonce, which finds it if so.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Once the procedure's id is taken, its write and its start happen in a
    /// task of the executor that dropping this future does not cancel: a dropped submit
    /// either never happened or runs, and only its id is lost to the caller (a nonce finds
    /// it again).
    pub async fn submit<P, M>(&self, procedure: P) -> Result<ProcedureId, SubmitError>
    where
        P: Procedure<Machine = M>,
        M: StateMachine<Env = E, Procedure = P>,
    {
        self.submit_with(procedure, SubmitOptions::default()).await
    }

    /// [`submit`](Self::submit) with the machine named: `executor.submit_as::<JobState>(job)`.
    /// The same call, for readers who want the machine at the call site and for generic
    /// code that holds an `M` rather than a procedure type.
    ///
    /// # Errors
    ///
    /// As [`submit`](Self::submit).
    ///
    /// # Cancel safety
    ///
    /// As [`submit`](Self::submit).
    pub async fn submit_as<M>(&self, procedure: M::Procedure) -> Result<ProcedureId, SubmitError>
    where
        M: StateMachine<Env = E>,
    {
        self.submit(procedure).await
    }

    /// [`submit`](Self::submit) with a nonce and/or a timeout.
    ///
    /// One nonce never makes two procedures: a submit with a nonce that another submit is
    /// still persisting waits for it and returns its id.
    ///
    /// # Errors
    ///
    /// As [`submit`](Self::submit).
    ///
    /// # Cancel safety
    ///
    /// As [`submit`](Self::submit).
    pub async fn submit_with<P, M>(
        &self,
        procedure: P,
        options: SubmitOptions,
    ) -> Result<ProcedureId, SubmitError>
    where
        P: Procedure<Machine = M>,
        M: StateMachine<Env = E, Procedure = P>,
    {
        submit::submit::<M, E>(&self.inner, procedure, options).await
    }

    /// Waits until procedure `id` ends and returns how.
    ///
    /// # Errors
    ///
    /// [`ExecutorError::NotFound`] for an unknown id, and for a procedure that cannot be
    /// loaded ([`unloadable`](Self::unloadable)), also one found so while waited for; the
    /// executor's stop reason if it stops first ([`ExecutorError::Killed`],
    /// [`ExecutorError::Store`], [`ExecutorError::ShutDown`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future only stops the waiting.
    pub async fn wait(&self, id: ProcedureId) -> Result<Outcome, ExecutorError> {
        // Told once, at the end: not woken at every step, as a subscriber is.
        let outcome = {
            let mut table = self.inner.table();
            let entry = table.procs.get_mut(&id.get());
            match entry.ok_or(ExecutorError::NotFound(id))?.await_outcome() {
                Ok(outcome) => outcome,
                Err(ended) => return Ok(ended),
            }
        };
        let mut mode = self.inner.mode.subscribe();
        tokio::select! {
            // An end and a stop both ready: the end is the answer.
            biased;
            outcome = outcome => outcome.map_err(|_| ExecutorError::NotFound(id)),
            stopped = mode.wait_for(|mode| !matches!(mode, Mode::Running)) => match stopped {
                Ok(mode) => match &*mode {
                    Mode::Halted(reason) => Err(reason.clone()),
                    _ => Err(ExecutorError::ShutDown),
                },
                Err(_) => Err(ExecutorError::ShutDown),
            },
        }
    }

    /// The current snapshot of procedure `id`: status, current step, steps done, error.
    #[must_use]
    pub fn state(&self, id: ProcedureId) -> Option<ProcedureInfo> {
        self.inner
            .table()
            .procs
            .get(&id.get())
            .map(|entry| entry.snapshot().unpack())
    }

    /// Every procedure the executor knows (live, and finished within their retention),
    /// by id.
    #[must_use]
    pub fn list(&self) -> Vec<ProcedureInfo> {
        let mut all: Vec<_> = self
            .inner
            .table()
            .procs
            .values()
            .map(|entry| entry.snapshot().unpack())
            .collect();
        all.sort_by_key(|info| info.id);
        all
    }

    /// A receiver of procedure `id`'s snapshots. It always holds the latest one, so the
    /// final (finished) snapshot is never missed, however late the receiver looks.
    ///
    /// Receivers share one channel per procedure. Once all of them are dropped the
    /// channel is freed, at the procedure's next change or within
    /// [`Config::cleanup_interval`], so watching a procedure for a while costs nothing
    /// after.
    #[must_use]
    pub fn subscribe(&self, id: ProcedureId) -> Option<watch::Receiver<ProcedureInfo>> {
        self.inner.table().subscribe(id.get())
    }

    /// Wakes every procedure suspended on `event`, and returns how many it woke once
    /// each of them has persisted its wake-up: from then on a crash does not lose the
    /// wake, the procedure runs its suspended step again after a restart.
    ///
    /// A wake is never lost. Procedures suspended on `event` are known from the moment the
    /// executor has loaded the store. A procedure whose step is running when the wake
    /// arrives is not counted, but if that step then suspends on `event`, it runs again at
    /// once instead of waiting (condition-variable style: a handler checks its condition,
    /// and the caller makes the condition true before it wakes). A woken step may find its
    /// condition still false (another wake, a timeout, a crash): it suspends again.
    ///
    /// # Errors
    ///
    /// The reason the executor stopped ([`ExecutorError::Killed`],
    /// [`ExecutorError::Store`], [`ExecutorError::ShutDown`]), if it stops before the
    /// woken procedures persisted their wake-up.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the wake-ups happen when the call is made; dropping the future only
    /// stops waiting for them to be durable.
    pub async fn wake(&self, event: &str) -> Result<usize, ExecutorError> {
        self.running()?;
        let acks = self.inner.wake(event);
        let woken = acks.len();
        for ack in acks {
            tokio::select! {
                acked = ack => {
                    if acked.is_err() {
                        // The procedure's task ended without persisting the wake-up.
                        self.running()?;
                    }
                }
                () = self.inner.stopping() => return Err(self.stop_reason()),
            }
        }
        Ok(woken)
    }

    /// Asks procedure `id` to roll back. Honoured where rollback is supported (before a
    /// point of no return): at its next step boundary, or at once while it waits (for a
    /// lock, an event, a retry or its children, which are stopped first; a procedure still
    /// queued for a running slot rolls back at once, without one). The rollback
    /// undoes the current state too if its handler ran (it may have partly acted). A
    /// running step is not cancelled.
    ///
    /// The request is not persisted: if the process dies before the procedure honours it,
    /// it is lost. [`request`](Self::request) with
    /// [`Action::Abort`](crate::operator::Action::Abort) stores it first and returns once
    /// the rollback is stored.
    ///
    /// # Errors
    ///
    /// [`ExecutorError::NotFound`] for an unknown id.
    pub fn abort(&self, id: ProcedureId) -> Result<(), ExecutorError> {
        let mut table = self.inner.table();
        let entry = table
            .procs
            .get_mut(&id.get())
            .ok_or(ExecutorError::NotFound(id))?;
        entry.ask_abort(|| Error::fatal("aborted on request"));
        entry.rouse();
        Ok(())
    }

    /// The locks held right now, by procedure, in the order they were granted.
    #[must_use]
    pub fn held_locks(&self) -> Vec<(ProcedureId, Lock)> {
        self.inner
            .locks
            .holders()
            .into_iter()
            .map(|(owner, lock)| (ProcedureId::new(owner), lock))
            .collect()
    }

    /// The procedures waiting for locks, oldest first.
    #[must_use]
    pub fn lock_waiters(&self) -> Vec<ProcedureId> {
        self.inner
            .locks
            .waiters()
            .into_iter()
            .map(ProcedureId::new)
            .collect()
    }

    /// Resolves when the executor stops running: halted (see [`halted`](Self::halted)) or
    /// shutting down. Cancel safe.
    pub async fn stopped(&self) {
        self.inner.stopping().await;
    }

    /// Why the executor stopped on its own, if it did: a store failure
    /// ([`ExecutorError::Store`]), a newer owner of the store
    /// ([`ExecutorError::Fenced`]), a lost group term ([`ExecutorError::LeadershipLost`])
    /// or a kill ([`ExecutorError::Killed`]). `None` while it
    /// runs and after a [`shutdown`](Self::shutdown).
    #[must_use]
    pub fn halted(&self) -> Option<ExecutorError> {
        self.inner.halt_reason()
    }

    /// Stored procedures this executor cannot load, left in the store untouched: found at
    /// start (their machine is not registered, or their record cannot be read), or when
    /// about to run (their data, kept encoded since the start, no longer decodes; see
    /// [`ExecutorBuilder::start`]). Such a procedure is not in [`list`](Self::list) or
    /// [`state`](Self::state) (it leaves them when found), its locks are free, and a
    /// parent waiting for it fails, naming it.
    #[must_use]
    pub fn unloadable(&self) -> Vec<Unloadable> {
        self.inner.table().unloadable.clone()
    }

    /// Stops the executor at once, as a crash would: nothing more reaches the store. For
    /// crash tests; start a new executor on the same store to recover.
    pub fn kill(&self) {
        self.inner.halt(ExecutorError::Killed);
    }

    /// Stops the executor at once, as [`kill`](Self::kill) does, with `reason`.
    pub(crate) fn halt(&self, reason: ExecutorError) {
        self.inner.halt(reason);
    }

    /// Stops accepting submits, lets the steps in flight finish and persist, stops every
    /// procedure task, and closes the store. Unfinished procedures resume at the next
    /// start.
    ///
    /// # Errors
    ///
    /// The reason the executor had already stopped, or the store's error when closing.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the shutdown goes on; calling it again waits for it.
    pub async fn shutdown(&self) -> Result<(), ExecutorError> {
        self.drain().await?;
        self.inner
            .store
            .close()
            .await
            .map_err(|e| ExecutorError::Store(Arc::new(e)))
    }

    /// Shuts down like [`shutdown`](Self::shutdown) but leaves the store open: a group
    /// member stepping down shares its store with the member taking over. Cancel safe.
    pub(crate) async fn drain(&self) -> Result<(), ExecutorError> {
        self.inner.begin_shutdown();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        self.inner.drop_parked();
        match self.inner.mode() {
            Mode::Halted(reason) => Err(reason),
            _ => Ok(()),
        }
    }

    fn running(&self) -> Result<(), ExecutorError> {
        self.inner.running()
    }

    /// Why the executor is not running (or [`ExecutorError::ShutDown`] if it still is).
    fn stop_reason(&self) -> ExecutorError {
        self.running().err().unwrap_or(ExecutorError::ShutDown)
    }
}
