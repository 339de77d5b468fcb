//! An executor group: several processes (or tasks) share one store, one of them leads
//! and runs the procedures, the others stand by and take over when it goes.
//!
//! Each member runs a loop: campaign in the [`Election`]; on winning a [`Term`], start an
//! executor fenced with the term's token
//! ([`ExecutorBuilder::fencing_token`](crate::executor::ExecutorBuilder::fencing_token)),
//! which loads the store and resumes every unfinished procedure; run until the term is
//! lost (the executor is then killed at once), the executor stops on its own (a store
//! failure, or fenced by a newer leader: the term is resigned), or the group shuts down.
//! Fencing, not the election, keeps a stale leader from writing: an old leader that has
//! not yet noticed its loss has every write refused by the store.
//!
//! ```
//! use procflow::group::{ExecutorGroup, GroupError, LocalElection};
//! use procflow::executor::Executor;
//! # use procflow::prelude::*;
//! # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! # #[state_machine(procedure = Job)]
//! # enum JobState { #[initial] #[transition(to = [Done])] Start, #[terminal] Done }
//! # #[derive(serde::Serialize, serde::Deserialize)]
//! # struct Job;
//! # impl JobStateHandlers for Job {
//! #     async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
//! #         Ok(job_state::Start::Done.into())
//! #     }
//! # }
//! use procflow_store::MemStore;
//! use std::sync::Arc;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = Arc::new(MemStore::new());
//! let election = LocalElection::new();
//! let member = |address: &str| {
//!     let store = store.clone();
//!     ExecutorGroup::join(Arc::new(election.candidate(address)), address, move || {
//!         Executor::builder(store.clone(), ()).register::<JobState>()
//!     })
//! };
//! let a = member("a:7000");
//! let leader = a.leading().await; // `a` is alone: it leads
//! let b = member("b:7000");
//! match b.executor().await {
//!     Err(GroupError::NotLeader { leader }) => assert_eq!(leader.as_deref(), Some("a:7000")),
//!     _ => unreachable!("b stands by"),
//! }
//! let id = leader.submit(Job).await.unwrap();
//! leader.wait(id).await.unwrap();
//! a.shutdown().await.unwrap(); // resigns: b takes over
//! b.leading().await;
//! b.shutdown().await.unwrap();
//! # });
//! ```

mod election;
#[cfg(feature = "etcd")]
mod etcd;
mod local;
#[cfg(all(feature = "postgres", unix))]
mod postgres;

pub use election::{Election, ElectionError, Term};
#[cfg(feature = "etcd")]
pub use etcd::EtcdElection;
pub use local::{LocalCandidate, LocalElection};
#[cfg(all(feature = "postgres", unix))]
pub use postgres::PgElection;

use crate::executor::{Executor, ExecutorBuilder, ExecutorError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Why a group call could not be answered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// This member does not lead; `leader` is the address the current leader advertises
    /// (`None` while an election is under way). The application decides how to forward.
    #[error("not the leader; the leader is {}", leader.as_deref().unwrap_or("being elected"))]
    NotLeader {
        /// The current leader's address.
        leader: Option<String>,
    },
    /// The election could not be asked.
    #[error(transparent)]
    Election(#[from] ElectionError),
    /// The leader's executor failed while shutting down.
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    /// The group has been shut down.
    #[error("the executor group is shut down")]
    ShutDown,
}

/// What a member publishes about itself.
enum Role<E> {
    Standby,
    Leading(Term, Executor<E>),
    ShutDown,
}

// Not derived: that would need `E: Clone`, and an `Executor<E>` clones without it.
impl<E> Clone for Role<E> {
    fn clone(&self) -> Self {
        match self {
            Role::Standby => Role::Standby,
            Role::Leading(term, executor) => Role::Leading(*term, executor.clone()),
            Role::ShutDown => Role::ShutDown,
        }
    }
}

/// One member of an executor group; see the [module docs](self).
pub struct ExecutorGroup<E> {
    election: Arc<dyn Election>,
    address: String,
    role: watch::Receiver<Role<E>>,
    trouble: watch::Receiver<Option<Arc<GroupError>>>,
    stop: watch::Sender<bool>,
    task: tokio::sync::Mutex<Option<JoinHandle<Result<(), ExecutorError>>>>,
}

/// How long a member waits before campaigning again after a failed campaign or a term
/// that ended.
const RETRY: Duration = Duration::from_millis(200);

impl<E: Send + Sync + 'static> ExecutorGroup<E> {
    /// Joins the group as a member advertising `address`: spawns the member's loop on the
    /// current tokio runtime. `builder` makes the executor this member runs when it leads
    /// (the same store and machines on every member); the group adds the fencing token.
    pub fn join(
        election: Arc<dyn Election>,
        address: impl Into<String>,
        builder: impl Fn() -> ExecutorBuilder<E> + Send + Sync + 'static,
    ) -> Self {
        let (role_tx, role) = watch::channel(Role::Standby);
        let (trouble_tx, trouble) = watch::channel(None);
        let (stop, stop_rx) = watch::channel(false);
        let member = Member {
            election: Arc::clone(&election),
            builder: Box::new(builder),
            role: role_tx,
            trouble: trouble_tx,
        };
        let task = tokio::spawn(member.run(stop_rx));
        Self {
            election,
            address: address.into(),
            role,
            trouble,
            stop,
            task: tokio::sync::Mutex::new(Some(task)),
        }
    }

    /// The address this member advertises.
    #[must_use]
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The executor, if this member leads.
    ///
    /// # Errors
    ///
    /// [`GroupError::NotLeader`] naming the leader, [`GroupError::ShutDown`].
    pub async fn executor(&self) -> Result<Executor<E>, GroupError> {
        let role = self.role.borrow().clone();
        match role {
            Role::Leading(_, executor) => Ok(executor),
            Role::ShutDown => Err(GroupError::ShutDown),
            Role::Standby => Err(GroupError::NotLeader {
                leader: self.election.leader().await?,
            }),
        }
    }

    /// The current term's token, if this member leads.
    #[must_use]
    pub fn term(&self) -> Option<Term> {
        match &*self.role.borrow() {
            Role::Leading(term, _) => Some(*term),
            _ => None,
        }
    }

    /// Why this member last failed to win or keep a term: a failed campaign (the election
    /// service unreachable, say: [`GroupError::Election`]) or the reason its executor
    /// stopped ([`GroupError::Executor`]: a store failure, fenced, leadership lost).
    /// `None` until something went wrong; cleared when the member starts leading. A member
    /// that cannot lead keeps retrying on its own; this is what to show an operator.
    #[must_use]
    pub fn last_error(&self) -> Option<Arc<GroupError>> {
        self.trouble.borrow().clone()
    }

    /// Waits until this member leads, and returns its executor.
    ///
    /// Cancel safe. Waits forever if the group is shut down.
    pub async fn leading(&self) -> Executor<E> {
        let mut role = self.role.clone();
        loop {
            if let Role::Leading(_, executor) = &*role.borrow_and_update() {
                return executor.clone();
            }
            if role.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Leaves the group: shuts this member's executor down if it leads (its procedures
    /// resume on the next leader) and resigns. The store is left open: it belongs to the
    /// `builder` given to [`join`](Self::join).
    ///
    /// # Errors
    ///
    /// The executor's shutdown error, if it had stopped on its own.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the member stops anyway; calling it again waits for it.
    pub async fn shutdown(&self) -> Result<(), GroupError> {
        self.stop.send_replace(true);
        let mut task = self.task.lock().await;
        let Some(handle) = task.as_mut() else {
            return Ok(());
        };
        let result = handle.await;
        *task = None;
        match result {
            Ok(result) => result.map_err(GroupError::from),
            Err(join) => Err(GroupError::Election(ElectionError::with_source(
                "the member's task failed",
                join,
            ))),
        }
    }
}

type Builder<E> = Box<dyn Fn() -> ExecutorBuilder<E> + Send + Sync>;

/// The member's loop and what it publishes.
struct Member<E> {
    election: Arc<dyn Election>,
    builder: Builder<E>,
    role: watch::Sender<Role<E>>,
    trouble: watch::Sender<Option<Arc<GroupError>>>,
}

impl<E: Send + Sync + 'static> Member<E> {
    /// Campaign, lead, lose, again, until `stop`.
    async fn run(self, mut stop: watch::Receiver<bool>) -> Result<(), ExecutorError> {
        let result = loop {
            let term = tokio::select! {
                term = self.election.campaign() => term,
                () = stop_requested(&mut stop) => break Ok(()),
            };
            let term = match term {
                Ok(term) => term,
                Err(error) => {
                    tracing::warn!(%error, "campaign failed; retrying");
                    self.trouble(error.into());
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            match self.lead(term, &mut stop).await {
                // A member that just lost its term is the likeliest to be in trouble (a
                // slow network, a paused process): waiting lets a standby win the next
                // one first.
                Lead::Lost => tokio::select! {
                    () = tokio::time::sleep(RETRY) => {}
                    () = stop_requested(&mut stop) => break Ok(()),
                },
                Lead::Stopped(result) => break result,
            }
        };
        self.role.send_replace(Role::ShutDown);
        result
    }

    /// Runs one term: starts the fenced executor and keeps it until the term ends.
    async fn lead(&self, term: Term, stop: &mut watch::Receiver<bool>) -> Lead {
        let executor = match (self.builder)().fencing_token(term.token).start().await {
            Ok(executor) => executor,
            Err(error) => {
                tracing::warn!(%error, token = term.token, "could not start the leader's executor");
                self.trouble(error.into());
                self.resign(term).await;
                return Lead::Lost;
            }
        };
        tracing::info!(token = term.token, "leading the executor group");
        self.trouble.send_replace(None);
        self.role
            .send_replace(Role::Leading(term, executor.clone()));
        let lead = tokio::select! {
            reason = self.election.lost(term) => {
                tracing::warn!(token = term.token, %reason, "leadership lost: stopping the executor");
                executor.halt(ExecutorError::LeadershipLost(Arc::new(reason)));
                self.stopped(&executor);
                // The lease may still be alive (a lost keep-alive answer, a watch that
                // saw the key change): revoking it lets a standby win now rather than
                // when the lease runs out, up to a TTL later.
                self.resign(term).await;
                Lead::Lost
            }
            () = executor.stopped() => {
                tracing::warn!(token = term.token, reason = ?executor.halted(), "the executor stopped: resigning");
                self.stopped(&executor);
                self.resign(term).await;
                Lead::Lost
            }
            () = stop_requested(stop) => {
                self.role.send_replace(Role::Standby);
                // The store is the builder's, shared with the next leader: not closed here.
                let result = executor.drain().await;
                self.resign(term).await;
                Lead::Stopped(result)
            }
        };
        self.role.send_replace(Role::Standby);
        lead
    }

    /// Publishes why the executor stopped on its own.
    fn stopped(&self, executor: &Executor<E>) {
        if let Some(reason) = executor.halted() {
            self.trouble(reason.into());
        }
    }

    fn trouble(&self, error: GroupError) {
        self.trouble.send_replace(Some(Arc::new(error)));
    }

    async fn resign(&self, term: Term) {
        if let Err(error) = self.election.resign(term).await {
            tracing::warn!(%error, token = term.token, "could not resign; the term ends with its lease");
        }
    }
}

/// How a term ended.
enum Lead {
    /// Lost, resigned or failed: campaign again.
    Lost,
    /// The group shut down, with the executor's shutdown result.
    Stopped(Result<(), ExecutorError>),
}

/// Resolves once the group is asked to stop (or its handle is gone).
async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, before any later `.await`.
    let _ = stop.wait_for(|stop| *stop).await;
}
