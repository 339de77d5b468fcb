//! A machine for the operator tests (`operator.rs`, `cli.rs`, `cli_shared.rs`): it takes a lock, waits
//! for an event, then crosses a point of no return that can be made to fail for good.

use procflow::executor::{Config, Executor, Outcome, RetryPolicy, Status};
use procflow::prelude::*;
use procflow::store::{Store, WalConfig, WalStore};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the handlers did, and which jobs may go on past `Wait`.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<(Vec<String>, Vec<String>)>>);

impl Log {
    pub fn push(&self, event: String) {
        self.0.lock().unwrap().0.push(event);
    }
    pub fn events(&self) -> Vec<String> {
        self.0.lock().unwrap().0.clone()
    }
    pub fn count(&self, event: &str) -> usize {
        self.events().iter().filter(|e| *e == event).count()
    }
    /// Lets job `name` past `Wait` (its condition; a wake makes it look again).
    pub fn let_go(&self, name: &str) {
        self.0.lock().unwrap().1.push(name.to_owned());
    }
    fn may_go(&self, name: &str) -> bool {
        self.0.lock().unwrap().1.iter().any(|n| n == name)
    }
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job, name = "job", env = Log)]
pub enum JobState {
    #[initial]
    #[transition(to = [Wait])]
    #[rollback]
    Reserve,
    #[transition(to = [Commit])]
    Wait,
    #[transition(to = [Done])]
    #[no_rollback]
    Commit,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
pub struct Job {
    pub name: String,
    /// An exclusive lock held for life.
    pub lock: Option<String>,
    /// `Commit` fails fatally: past the point of no return, the job is stuck.
    pub fail_commit: bool,
}

impl Job {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            lock: None,
            fail_commit: false,
        }
    }
    pub fn locking(mut self, key: &str) -> Self {
        self.lock = Some(key.to_owned());
        self
    }
    pub fn failing_commit(mut self) -> Self {
        self.fail_commit = true;
        self
    }
}

impl JobStateHandlers for Job {
    async fn reserve(&mut self, ctx: &Context<Log>) -> Step<job_state::Reserve> {
        ctx.env().push(format!("reserve {}", self.name));
        Ok(job_state::Reserve::Wait.into())
    }
    async fn rollback_reserve(&mut self, ctx: &Context<Log>) -> Result<(), Error> {
        ctx.env().push(format!("undo reserve {}", self.name));
        Ok(())
    }
    async fn wait(&mut self, ctx: &Context<Log>) -> Step<job_state::Wait> {
        if ctx.env().may_go(&self.name) {
            return Ok(job_state::Wait::Commit.into());
        }
        Ok(Flow::suspend(format!("go-{}", self.name)))
    }
    async fn commit(&mut self, ctx: &Context<Log>) -> Step<job_state::Commit> {
        ctx.env().push(format!("commit {}", self.name));
        if self.fail_commit {
            return Err(Error::fatal("the region server refuses the commit"));
        }
        Ok(job_state::Commit::Done.into())
    }
    fn locks(&self) -> Result<Locks, LockKeyError> {
        let locks = self.lock.iter().map(Lock::exclusive);
        Ok(Locks::new(locks.collect::<Result<Vec<_>, _>>()?))
    }
    fn describe(&self) -> Option<String> {
        Some(format!("job {}", self.name))
    }
}

/// An executor of `JobState` on the WAL in `dir`, retrying within milliseconds.
pub async fn start(dir: &Path, log: &Log) -> Executor<Log> {
    start_on(
        Arc::new(WalStore::open(dir, WalConfig::default()).unwrap()),
        log,
    )
    .await
}

/// An executor of `JobState` on `store`, retrying within milliseconds.
pub async fn start_on(store: Arc<dyn Store>, log: &Log) -> Executor<Log> {
    let config = Config {
        retry: RetryPolicy {
            initial: Duration::from_millis(5),
            max_delay: Duration::from_millis(20),
            max_attempts: 2,
            ..RetryPolicy::default()
        },
        ..Config::default()
    };
    Executor::builder_shared(store, Arc::new(log.clone()))
        .register::<JobState>()
        .config(config)
        .start()
        .await
        .unwrap()
}

/// Waits (up to 10 s) until `id`'s status satisfies `done`.
pub async fn until(executor: &Executor<Log>, id: ProcedureId, done: impl Fn(&Status) -> bool) {
    for _ in 0..2000 {
        if executor.state(id).is_some_and(|info| done(&info.status)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("#{id} never got there: {:?}", executor.state(id));
}

/// Three jobs: `alpha` suspended holding `tables/users`, `beta` stuck past its point of
/// no return (its commit fails for good), `gamma` succeeded.
pub async fn three_jobs(executor: &Executor<Log>, log: &Log) -> [ProcedureId; 3] {
    let alpha = bounded(
        "submit alpha",
        executor.submit(Job::new("alpha").locking("tables/users")),
    )
    .await;
    log.let_go("beta");
    let beta = bounded(
        "submit beta",
        executor.submit(Job::new("beta").failing_commit()),
    )
    .await;
    log.let_go("gamma");
    let gamma = bounded("submit gamma", executor.submit(Job::new("gamma"))).await;
    until(executor, alpha, |s| matches!(s, Status::Suspended { .. })).await;
    until(executor, beta, |s| matches!(s, Status::Stuck { .. })).await;
    let done = bounded("wait for gamma", executor.wait(gamma)).await;
    assert_eq!(
        done,
        procflow::executor::Outcome::Succeeded,
        "{:?}",
        executor.state(gamma)
    );
    [alpha, beta, gamma]
}

/// The value of `answer`, which must come within 30 s: an answer that never comes fails
/// the test, naming `what`, instead of hanging the run (seen once in CI in stop 26, in
/// `three_jobs`, not reproduced since).
async fn bounded<T, E: std::fmt::Debug>(
    what: &str,
    answer: impl std::future::Future<Output = Result<T, E>>,
) -> T {
    match tokio::time::timeout(Duration::from_secs(30), answer).await {
        Ok(answer) => answer.unwrap_or_else(|e| panic!("{what}: {e:?}")),
        Err(_) => panic!("{what}: no answer within 30 s"),
    }
}

/// The executor's admin on a free loopback port, with `token` (empty: read-only).
#[cfg(feature = "admin")]
pub async fn serve(executor: &Executor<Log>, token: &str) -> procflow::admin::AdminServer {
    procflow::admin::Admin::new(executor.clone())
        .token(token)
        .bind("127.0.0.1:0".parse().unwrap())
        .serve()
        .await
        .unwrap()
}

/// A stuck procedure (#1: holds `ns/t1`, its `Commit` fails for good and is retried) and
/// a suspended one (#2: waits for `go-waiting`), submitted to `executor` and waited for.
pub async fn stuck_and_waiting(executor: &Executor<Log>, log: &Log) -> (ProcedureId, ProcedureId) {
    log.let_go("stuck");
    let stuck = executor
        .submit(Job::new("stuck").locking("ns/t1").failing_commit())
        .await
        .unwrap();
    let waiting = executor.submit(Job::new("waiting")).await.unwrap();
    until(executor, stuck, |s| matches!(s, Status::Stuck { .. })).await;
    until(executor, waiting, |s| matches!(s, Status::Suspended { .. })).await;
    (stuck, waiting)
}

/// Waits until `stuck_and_waiting`'s procedures ended as a bypass and an abort of them
/// make them end: bypassed, and rolled back.
pub async fn bypassed_and_rolled_back(
    executor: &Executor<Log>,
    stuck: ProcedureId,
    waiting: ProcedureId,
) {
    use super::Bounded;
    let outcome = executor.wait(stuck).bounded().await.unwrap();
    assert_eq!(outcome, Outcome::Bypassed);
    let outcome = executor.wait(waiting).bounded().await.unwrap();
    assert!(matches!(outcome, Outcome::RolledBack(_)), "{outcome:?}");
}
