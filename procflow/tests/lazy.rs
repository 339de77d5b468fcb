//! Lazy decoding (issue 16): after a restart only the runtime's part of each record is
//! decoded; a procedure's own data is decoded when it next runs. Data that no longer
//! decodes is found then: the procedure is stuck where it is (issue 30, point 4), keeping
//! its locks and its place, its record as it was.
//!
//! The procedure type counts its decodes (per test, by a tag in its data), which makes
//! "not decoded yet" observable.

mod common;

use common::Bounded;
use common::TestStore;
use procflow::executor::{Executor, ExecutorError, Outcome, Status, WriteKind, WritePoint};
use procflow::locks::{Lock, LockKeyError, Locks};
use procflow::prelude::*;
use procflow::{Cursor, ProcedureId, codec};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

on_both_stores! {
    dormant_procedures_are_not_decoded_until_they_run => dormant_procedures_are_not_decoded_until_they_run;
    p4_data_that_no_longer_decodes_is_stuck_when_woken_keeping_its_lock_and_record => data_that_no_longer_decodes_is_stuck_when_woken_keeping_its_lock_and_record;
    p4_a_ready_procedure_whose_data_no_longer_decodes_is_stuck_and_its_record_kept => a_ready_procedure_whose_data_no_longer_decodes_is_stuck_and_its_record_kept;
    p4_a_parent_whose_child_turns_out_undecodable_waits_and_a_bypass_lets_it_go_on => a_parent_whose_child_turns_out_undecodable_waits_and_a_bypass_lets_it_go_on;
    an_abort_of_a_dormant_procedure_rewrites_its_data_byte_for_byte => an_abort_of_a_dormant_procedure_rewrites_its_data_byte_for_byte;
}

/// The events whose condition holds, as `(tag, n)`.
#[derive(Default)]
struct Env {
    open: Mutex<HashSet<(u64, u64)>>,
}

impl Env {
    fn open(&self, job: &Job) {
        self.open.lock().unwrap().insert((job.tag, job.n));
    }
    fn is_open(&self, tag: u64, n: u64) -> bool {
        self.open.lock().unwrap().contains(&(tag, n))
    }
}

/// Decodes of `Job`s, by tag: tests run side by side, each with tags of its own.
static DECODES: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);
static NEXT_TAG: AtomicU64 = AtomicU64::new(1);

fn fresh_tag() -> u64 {
    NEXT_TAG.fetch_add(1, Ordering::Relaxed)
}

fn decodes(tag: u64) -> usize {
    let counts = DECODES.lock().unwrap();
    counts
        .as_ref()
        .and_then(|c| c.get(&tag))
        .copied()
        .unwrap_or(0)
}

/// Prepares, then waits for event `go-{tag}-{n}` holding `job/{tag}/{n}` for life. No
/// state has a rollback handler: an abort ends it without running one.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job, env = Env, name = "job")]
enum JobState {
    #[initial]
    #[transition(to = [Wait])]
    Prepare,
    #[transition(to = [Done])]
    Wait,
    #[terminal]
    Done,
}

#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
struct Job {
    tag: u64,
    n: u64,
}

/// Counts every decode: the restart must not do any for a procedure that does not run.
impl<'de> Deserialize<'de> for Job {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Fields {
            tag: u64,
            n: u64,
        }
        let Fields { tag, n } = Fields::deserialize(deserializer)?;
        let mut counts = DECODES.lock().unwrap();
        *counts
            .get_or_insert_with(HashMap::new)
            .entry(tag)
            .or_default() += 1;
        Ok(Self { tag, n })
    }
}

fn event(tag: u64, n: u64) -> String {
    format!("go-{tag}-{n}")
}

fn lock(tag: u64, n: u64) -> Result<Lock, LockKeyError> {
    Lock::exclusive(format!("job/{tag}/{n}"))
}

impl JobStateHandlers for Job {
    async fn prepare(&mut self, _: &Context<Env>) -> Step<job_state::Prepare> {
        Ok(job_state::Prepare::Wait.into())
    }
    async fn wait(&mut self, ctx: &Context<Env>) -> Step<job_state::Wait> {
        if ctx.env().is_open(self.tag, self.n) {
            return Ok(job_state::Wait::Done.into());
        }
        Ok(Flow::suspend(event(self.tag, self.n)))
    }
    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new([lock(self.tag, self.n)?]))
    }
}

/// The same machine in a later build whose data type reads what `Job` wrote no more
/// (a field was added without a default).
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = JobV2, env = Env, name = "job")]
enum JobV2State {
    #[initial]
    #[transition(to = [Wait])]
    Prepare,
    #[transition(to = [Done])]
    Wait,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct JobV2 {
    tag: u64,
    n: u64,
    owner: String,
}

impl JobV2StateHandlers for JobV2 {
    async fn prepare(&mut self, _: &Context<Env>) -> Step<job_v2_state::Prepare> {
        Ok(job_v2_state::Prepare::Wait.into())
    }
    async fn wait(&mut self, ctx: &Context<Env>) -> Step<job_v2_state::Wait> {
        if ctx.env().is_open(self.tag, self.n) {
            return Ok(job_v2_state::Wait::Done.into());
        }
        Ok(Flow::suspend(event(self.tag, self.n)))
    }
    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new([lock(self.tag, self.n)?]))
    }
}

/// Spawns job `(tag, 0)` and waits for it.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Parent, env = Env, name = "parent")]
enum ParentState {
    #[initial]
    #[transition(to = [Done])]
    Spawn,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Parent {
    tag: u64,
}

impl ParentStateHandlers for Parent {
    async fn spawn(&mut self, _: &Context<Env>) -> Step<parent_state::Spawn> {
        let child = Child::new::<JobState>(&Job {
            tag: self.tag,
            n: 0,
        })?;
        Ok(Flow::spawn([child], parent_state::Spawn::Done))
    }
}

/// Which data type the executor reads `job` records with.
#[derive(Clone, Copy)]
enum Build {
    Old,
    New,
}

async fn start(store: &TestStore, env: &Arc<Env>, build: Build) -> Executor<Env> {
    let builder = Executor::builder_shared(Arc::clone(&store.store), Arc::clone(env))
        .config(common::test_config())
        .register::<ParentState>();
    let builder = match build {
        Build::Old => builder.register::<JobState>(),
        Build::New => builder.register::<JobV2State>(),
    };
    builder.start().await.unwrap()
}

/// Stops `executor` and starts another on the same store, as a new process would.
async fn restart(
    executor: Executor<Env>,
    store: TestStore,
    env: &Arc<Env>,
    build: Build,
) -> (Executor<Env>, TestStore) {
    executor.shutdown().bounded().await.unwrap();
    drop(executor);
    let store = store.reopen();
    let executor = start(&store, env, build).await;
    (executor, store)
}

async fn status_is(executor: &Executor<Env>, id: ProcedureId, wanted: impl Fn(&Status) -> bool) {
    common::status_is(executor, id, Duration::from_secs(30), wanted).await;
}

fn suspended(status: &Status) -> bool {
    matches!(status, Status::Suspended { .. })
}

/// Submits jobs `(tag, 0..count)` and waits until each is suspended.
async fn submit_jobs(executor: &Executor<Env>, tag: u64, count: u64) -> Vec<ProcedureId> {
    let mut ids = Vec::new();
    for n in 0..count {
        ids.push(executor.submit(Job { tag, n }).await.unwrap());
    }
    for &id in &ids {
        status_is(executor, id, suspended).await;
    }
    ids
}

/// The stored value of procedure `id`.
async fn stored(store: &TestStore, id: ProcedureId) -> procflow::store::Bytes {
    let record = store.store.get(id.get()).await.unwrap();
    record.expect("the record is in the store").value
}

/// Whether `status` is stuck because the data cannot be decoded.
fn stuck_undecodable(status: &Status) -> bool {
    matches!(status, Status::Stuck { error, .. } if error.to_string().contains("cannot be decoded"))
}

async fn dormant_procedures_are_not_decoded_until_they_run(store: TestStore) {
    const N: u64 = 500;
    let tag = fresh_tag();
    let env = Arc::new(Env::default());
    let executor = start(&store, &env, Build::Old).await;
    let ids = submit_jobs(&executor, tag, N).await;
    // A submitted procedure is the caller's value: it is never decoded.
    assert_eq!(decodes(tag), 0);

    let (executor, store) = restart(executor, store, &env, Build::Old).await;
    for &id in &ids {
        status_is(&executor, id, suspended).await;
    }
    assert_eq!(decodes(tag), 0, "the restart decoded dormant procedures");
    // Their locks came back from their envelopes.
    assert_eq!(executor.held_locks().len(), N as usize);

    // Woken, one is decoded for its step, once.
    let job = Job { tag, n: 7 };
    env.open(&job);
    assert_eq!(executor.wake(&event(tag, 7)).await.unwrap(), 1);
    assert_eq!(
        executor.wait(ids[7]).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!(decodes(tag), 1);
    assert_eq!(executor.held_locks().len(), N as usize - 1);

    // Another restart decodes neither the finished one nor the dormant ones.
    let (executor, _store) = restart(executor, store, &env, Build::Old).await;
    for &id in ids.iter().filter(|&&id| id != ids[7]) {
        status_is(&executor, id, suspended).await;
    }
    assert_eq!(executor.state(ids[7]).unwrap().status, Status::Succeeded);
    assert_eq!(decodes(tag), 1);
    assert!(executor.unloadable().is_empty());
    executor.shutdown().bounded().await.unwrap();
}

async fn data_that_no_longer_decodes_is_stuck_when_woken_keeping_its_lock_and_record(
    store: TestStore,
) {
    let tag = fresh_tag();
    let env = Arc::new(Env::default());
    let executor = start(&store, &env, Build::Old).await;
    let ids = submit_jobs(&executor, tag, 3).await;
    let before = stored(&store, ids[1]).await;

    // A build whose `job` data reads these records no more starts without complaint:
    // nothing it loaded needed their data.
    let (executor, store) = restart(executor, store, &env, Build::New).await;
    for &id in &ids {
        status_is(&executor, id, suspended).await;
    }
    assert!(executor.unloadable().is_empty());
    assert_eq!(executor.held_locks().len(), 3);

    // Woken, job 1 is about to run: stuck where it is, with why.
    env.open(&Job { tag, n: 1 });
    assert_eq!(executor.wake(&event(tag, 1)).await.unwrap(), 1);
    status_is(&executor, ids[1], stuck_undecodable).await;
    assert!(executor.unloadable().is_empty(), "it is not let go");
    // It keeps its lock: a competitor of this build queues behind it.
    assert_eq!(executor.held_locks().len(), 3);
    let fresh = JobV2 {
        tag,
        n: 1,
        owner: "ops".into(),
    };
    let fresh = executor.submit(fresh).await.unwrap();
    status_is(&executor, fresh, |s| *s == Status::WaitingForLock).await;
    for id in [ids[0], ids[2]] {
        status_is(&executor, id, suspended).await;
    }

    // Stored as it was, but for the durable wake-up (it waits for nothing now): the
    // snapshot — cursor and data — is byte for byte the one written before the restart.
    let after = stored(&store, ids[1]).await;
    let snapshot = codec::encode::<JobState>(&Job { tag, n: 1 }, &waiting_cursor()).unwrap();
    assert!(before.ends_with(&snapshot));
    assert!(after.ends_with(&snapshot));
    assert_ne!(before, after, "the wake-up is stored");

    // A build that reads it again runs it to its end.
    let (executor, _store) = restart(executor, store, &env, Build::Old).await;
    assert_eq!(
        executor.wait(ids[1]).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    executor.shutdown().bounded().await.unwrap();
}

/// A job's cursor while it waits for its event.
fn waiting_cursor() -> Cursor<JobState> {
    let mut cursor = Cursor::new();
    cursor.advance(JobState::Wait).unwrap();
    cursor
}

async fn a_ready_procedure_whose_data_no_longer_decodes_is_stuck_and_its_record_kept(
    store: TestStore,
) {
    let tag = fresh_tag();
    let env = Arc::new(Env::default());
    let job = Job { tag, n: 0 };
    env.open(&job);
    // Killed as it writes its end: it is stored ready to run its last step again.
    let executor = Executor::builder_shared(Arc::clone(&store.store), Arc::clone(&env))
        .config(common::test_config())
        .register::<JobState>()
        .kill_hook(|w: &procflow::executor::StoreWrite| {
            w.kind == WriteKind::Finish && w.point == WritePoint::Before
        })
        .start()
        .await
        .unwrap();
    let id = executor.submit(job).await.unwrap();
    executor.stopped().await;
    assert!(matches!(executor.halted(), Some(ExecutorError::Killed)));
    // Its tasks end after the mode changed; until they have, they hold the WAL open (the
    // reopen below would find it locked). A halted executor's shutdown waits for them.
    let _ = executor.shutdown().bounded().await;
    drop(executor);
    let before = stored(&store, id).await;

    let store = store.reopen();
    let executor = start(&store, &env, Build::New).await;
    status_is(&executor, id, stuck_undecodable).await;
    assert!(executor.unloadable().is_empty());
    assert_eq!(executor.held_locks().len(), 1, "it keeps its lock");
    executor.shutdown().bounded().await.unwrap();
    assert_eq!(stored(&store, id).await, before, "the record was written");
}

/// A parent whose child's data cannot be decoded does not fail (which would undo the
/// siblings that succeeded): it waits. An operator's bypass of the child, which needs
/// none of its data, lets it go on.
async fn a_parent_whose_child_turns_out_undecodable_waits_and_a_bypass_lets_it_go_on(
    store: TestStore,
) {
    use procflow::operator::{Action, Request};
    let tag = fresh_tag();
    let env = Arc::new(Env::default());
    let executor = start(&store, &env, Build::Old).await;
    let parent = executor.submit(Parent { tag }).await.unwrap();
    status_is(&executor, parent, |s| *s == Status::WaitingChildren).await;
    let child = executor
        .list()
        .into_iter()
        .find(|info| info.parent == Some(parent))
        .expect("the child is listed")
        .id;
    status_is(&executor, child, suspended).await;

    let (executor, _store) = restart(executor, store, &env, Build::New).await;
    env.open(&Job { tag, n: 0 });
    assert_eq!(executor.wake(&event(tag, 0)).await.unwrap(), 1);
    status_is(&executor, child, stuck_undecodable).await;
    assert_eq!(
        executor.state(parent).unwrap().status,
        Status::WaitingChildren
    );
    let bypass = Action::Bypass {
        id: child.get(),
        recursive: false,
    };
    let asked = Request::new(bypass, "ops", "its data is from a build we rolled back");
    executor.request(asked).await.unwrap();
    assert_eq!(
        executor.wait(child).bounded().await.unwrap(),
        Outcome::Bypassed
    );
    assert_eq!(
        executor.wait(parent).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert!(
        executor.held_locks().is_empty(),
        "the bypass gave its lock back"
    );
    executor.shutdown().bounded().await.unwrap();
}

async fn an_abort_of_a_dormant_procedure_rewrites_its_data_byte_for_byte(store: TestStore) {
    let tag = fresh_tag();
    let env = Arc::new(Env::default());
    let executor = start(&store, &env, Build::Old).await;
    let job = Job { tag, n: 0 };
    let id = submit_jobs(&executor, tag, 1).await[0];

    let (executor, store) = restart(executor, store, &env, Build::Old).await;
    status_is(&executor, id, suspended).await;
    executor.abort(id).unwrap();
    let Outcome::RolledBack(cause) = executor.wait(id).bounded().await.unwrap() else {
        panic!("the abort did not roll it back");
    };
    // Written twice (the rollback, then the end) without its data ever being decoded...
    assert_eq!(decodes(tag), 0);
    // ...as a decode and encode would have written it.
    let mut cursor = waiting_cursor();
    cursor.start_rollback(cause);
    let snapshot = codec::encode::<JobState>(&job, &cursor).unwrap();
    assert!(stored(&store, id).await.ends_with(&snapshot));
    assert!(executor.held_locks().is_empty());
    executor.shutdown().bounded().await.unwrap();
}
