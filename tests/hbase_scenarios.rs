//! The test scenarios of Apache HBase's procedure framework (`hbase-procedure`,
//! package `procedure2`) re-created on procflow, with HBase's counts. Each test names the
//! HBase test class it corresponds to. Several use `procflow::testing`'s crash checks.
//! Two more live beside the code they exercise: locks held for life
//! (`TestProcedureSuspended#testSuspendWhileHoldingLocks`) in `procflow/tests/locks.rs`,
//! and the byte-level store cuts (`TestWALProcedureStore`) in
//! `procflow-store/tests/bytes.rs`; the executor-level cut is at the end of this file.
//!
//! One semantic difference shapes two of them: HBase also calls `rollbackState` for the
//! state whose step failed (or that was set but not yet run); procflow undoes completed
//! steps only (a failing step cleans up before returning its error). Where HBase counts
//! the failing state's rollback, the procflow machine below completes one more
//! `#[rollback]` state before failing, so the counts still match.

#[path = "../procflow/tests/common/bounded.rs"]
mod bounded;

use bounded::Bounded;
use procflow::executor::{Config, Executor, Outcome, Status, SubmitOptions};
use procflow::prelude::*;
use procflow::store::MemStore;
use procflow::testing::CrashTest;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What handlers did, in order.
#[derive(Default)]
struct Journal(Mutex<Vec<String>>);

impl Journal {
    fn push(&self, event: impl Into<String>) {
        self.0.lock().unwrap().push(event.into());
    }
    fn count(&self, prefix: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.starts_with(prefix))
            .count()
    }
    fn events(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

// ---------------------------------------------------------------------------------------
// The counter machine: adds 3, 5, 7, 11 to a persisted counter across four states.

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Sum, env = Journal)]
enum SumState {
    #[initial]
    #[transition(to = [B])]
    #[rollback]
    A,
    #[transition(to = [C])]
    #[rollback]
    B,
    #[transition(to = [D])]
    #[rollback]
    C,
    #[transition(to = [Done])]
    D,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize, Clone)]
struct Sum {
    total: u64,
}

impl Sum {
    fn add(&mut self, ctx: &Context<Journal>, state: &str, n: u64) {
        ctx.env().push(format!("execute {state}"));
        self.total += n; // The counter is procedure data: persisted with the step.
        ctx.env().push(format!("total {}", self.total));
    }
}

impl SumStateHandlers for Sum {
    async fn a(&mut self, ctx: &Context<Journal>) -> Step<sum_state::A> {
        self.add(ctx, "A", 3);
        Ok(sum_state::A::B.into())
    }
    async fn b(&mut self, ctx: &Context<Journal>) -> Step<sum_state::B> {
        self.add(ctx, "B", 5);
        Ok(sum_state::B::C.into())
    }
    async fn c(&mut self, ctx: &Context<Journal>) -> Step<sum_state::C> {
        self.add(ctx, "C", 7);
        Ok(sum_state::C::D.into())
    }
    async fn d(&mut self, ctx: &Context<Journal>) -> Step<sum_state::D> {
        self.add(ctx, "D", 11);
        Ok(sum_state::D::Done.into())
    }
    async fn rollback_a(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback A");
        Ok(())
    }
    async fn rollback_b(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback B");
        Ok(())
    }
    async fn rollback_c(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback C");
        Ok(())
    }
}

fn last_total(journal: &Journal) -> Option<String> {
    journal
        .events()
        .into_iter()
        .rfind(|e| e.starts_with("total"))
}

/// HBase `TestStateMachineProcedure` / `ProcedureTestingUtility.testRecoveryAndDoubleExecution`:
/// killed before (then after) every store write and restarted each time, the counter still
/// ends at exactly 26; killed before its write, every step runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_execution_counter_ends_at_26() {
    let test = CrashTest::new(|b| b.register::<SumState>());
    let report = test
        .double_execution::<SumState, _>(
            Journal::default,
            || Sum { total: 0 },
            |journal| {
                let runs: Vec<usize> = ["A", "B", "C", "D"]
                    .iter()
                    .map(|s| journal.count(&format!("execute {s}")))
                    .collect();
                (last_total(journal), runs.iter().all(|n| *n >= 1))
            },
        )
        .await
        .unwrap();
    assert_eq!(report.observed, (Some("total 26".into()), true));
    assert_eq!(report.clean.outcome, Outcome::Succeeded);
    // Submit, three steps and the end carrying the fourth (terminal) step: five writes,
    // each killed once before it.
    assert_eq!(report.killed_before.kills, 5);
    assert_eq!(report.killed_after.kills, 3);
}

/// HBase `ProcedureTestingUtility.testRollbackAndDoubleExecution` and
/// `TestStateMachineProcedure` (abort): aborted after the third state, killed before every
/// rollback write: the rollback still completes, undoing C, B, A once each in effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_double_execution_after_abort_at_the_third_state() {
    let test = CrashTest::new(|b| b.register::<SumState>());
    let report = test
        .rollback_double_execution::<SumState, _>(
            Journal::default,
            || Sum { total: 0 },
            Some(3),
            |journal| {
                let mut undone: Vec<String> = journal
                    .events()
                    .into_iter()
                    .filter(|e| e.starts_with("rollback"))
                    .collect();
                undone.dedup(); // A rollback step run twice in a row is one undo.
                undone
            },
        )
        .await
        .unwrap();
    assert_eq!(
        report.clean.outcome,
        Outcome::RolledBack(Error::fatal("aborted on request"))
    );
    assert_eq!(report.observed, ["rollback C", "rollback B", "rollback A"]);
    // The rollback's start and its three steps: four writes, each killed once.
    assert_eq!(report.killed_before.kills, 4);
}

/// HBase `TestStateMachineProcedure` (aborted at the third state): rollbacks C, B, A run
/// once each in an undisturbed run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_at_the_third_state_rolls_back_each_state_once() {
    let test = CrashTest::new(|b| b.register::<SumState>());
    let (run, journal) = test
        .run::<SumState>(Journal::default(), Sum { total: 0 }, Some(3))
        .await
        .unwrap();
    assert!(matches!(run.outcome, Outcome::RolledBack(_)));
    let counts = ["rollback A", "rollback B", "rollback C", "execute D"].map(|e| journal.count(e));
    assert_eq!(counts, [1, 1, 1, 0]);
}

// ---------------------------------------------------------------------------------------
// STEP_1 → STEP_2, where STEP_2 spawns a child.

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = TwoSteps, env = Journal)]
enum TwoStepsState {
    #[initial]
    #[transition(to = [Step2])]
    #[rollback]
    Step1,
    #[transition(to = [Done])]
    #[rollback]
    Step2,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize, Clone)]
struct TwoSteps {
    child_fails: bool,
}

impl TwoStepsStateHandlers for TwoSteps {
    async fn step1(&mut self, ctx: &Context<Journal>) -> Step<two_steps_state::Step1> {
        ctx.env().push("execute STEP_1");
        Ok(two_steps_state::Step1::Step2.into())
    }
    async fn step2(&mut self, ctx: &Context<Journal>) -> Step<two_steps_state::Step2> {
        ctx.env().push("execute STEP_2");
        let child = Child::new::<ChildState>(&ChildProc {
            fails: self.child_fails,
        })?;
        Ok(Flow::spawn([child], two_steps_state::Step2::Done))
    }
    async fn rollback_step1(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback STEP_1");
        Ok(())
    }
    async fn rollback_step2(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback STEP_2");
        Ok(())
    }
}

/// The child runs one step; when it is to fail, it first completes an undoable step
/// (HBase would undo its failing step itself; see the module docs).
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = ChildProc, env = Journal)]
enum ChildState {
    #[initial]
    #[transition(to = [Done, Fail])]
    #[rollback]
    Work,
    #[transition(to = [Done])]
    Fail,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct ChildProc {
    fails: bool,
}

impl ChildStateHandlers for ChildProc {
    async fn work(&mut self, ctx: &Context<Journal>) -> Step<child_state::Work> {
        ctx.env().push("execute CHILD");
        Ok(if self.fails {
            child_state::Work::Fail
        } else {
            child_state::Work::Done
        }
        .into())
    }
    async fn fail(&mut self, _: &Context<Journal>) -> Step<child_state::Fail> {
        Err(Error::fatal("child failed"))
    }
    async fn rollback_work(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback CHILD");
        Ok(())
    }
}

fn two_steps() -> CrashTest<Journal> {
    CrashTest::new(|b| b.register::<TwoStepsState>().register::<ChildState>())
}

/// HBase `TestStateMachineProcedure#testChildOnLastStep` and
/// `#testChildOnLastStepDoubleExecution`: 3 executions and 0 rollbacks in a plain run; 6
/// executions when the executor dies before every store write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_on_last_step_runs_3_times_and_6_with_double_execution() {
    let report = two_steps()
        .double_execution::<TwoStepsState, _>(
            Journal::default,
            || TwoSteps { child_fails: false },
            // What was done, not how often: the same with and without kills.
            |journal| {
                journal
                    .events()
                    .into_iter()
                    .collect::<std::collections::BTreeSet<_>>()
            },
        )
        .await
        .map(|r| r.clean)
        .unwrap();
    assert_eq!(report.outcome, Outcome::Succeeded);
    // The counts, on their own passes: 6 executions when killed before every write…
    let (run, journal) = two_steps()
        .run_killed::<TwoStepsState>(
            Journal::default(),
            TwoSteps { child_fails: false },
            procflow::executor::WritePoint::Before,
        )
        .await
        .unwrap();
    assert_eq!(run.outcome, Outcome::Succeeded);
    assert_eq!(journal.count("execute"), 6, "{:?}", journal.events());
    // … and 3 executions, 0 rollbacks, undisturbed.
    let plain = Arc::new(Journal::default());
    let executor = Executor::builder_shared(Arc::new(MemStore::new()), Arc::clone(&plain))
        .register::<TwoStepsState>()
        .register::<ChildState>()
        .start()
        .await
        .unwrap();
    let id = executor
        .submit(TwoSteps { child_fails: false })
        .await
        .unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!((plain.count("execute"), plain.count("rollback")), (3, 0));
}

/// HBase `TestStateMachineProcedure#testChildOnLastStepWithRollback` (and
/// `TestChildProcedures#testChildLoadWithRollback`): the child fails; 3 rollbacks (the
/// child, STEP_2, STEP_1), and the parent reports the child's original error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_child_makes_3_rollbacks_and_keeps_the_error() {
    let report = two_steps()
        .rollback_double_execution::<TwoStepsState, _>(
            Journal::default,
            || TwoSteps { child_fails: true },
            None,
            |journal| {
                let mut undone: Vec<String> = journal
                    .events()
                    .into_iter()
                    .filter(|e| e.starts_with("rollback"))
                    .collect();
                undone.dedup();
                undone
            },
        )
        .await
        .unwrap();
    assert_eq!(
        report.clean.outcome,
        Outcome::RolledBack(Error::fatal("child failed"))
    );
    assert_eq!(
        report.observed,
        ["rollback CHILD", "rollback STEP_2", "rollback STEP_1"]
    );
}

// ---------------------------------------------------------------------------------------

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Flaky, env = Journal)]
enum FlakyState {
    #[initial]
    #[transition(to = [Fail])]
    #[rollback]
    Work,
    #[transition(to = [Done])]
    Fail,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Flaky {
    rollback_failures: u32,
}

impl FlakyStateHandlers for Flaky {
    async fn work(&mut self, ctx: &Context<Journal>) -> Step<flaky_state::Work> {
        ctx.env().push("execute Work");
        Ok(flaky_state::Work::Fail.into())
    }
    async fn fail(&mut self, _: &Context<Journal>) -> Step<flaky_state::Fail> {
        Err(Error::fatal("the original failure"))
    }
    async fn rollback_work(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback Work");
        if self.rollback_failures > 0 {
            self.rollback_failures -= 1;
            return Err(Error::retryable("rollback hit a transient error"));
        }
        Ok(())
    }
}

fn quick_config() -> Config {
    let quick = procflow::executor::RetryPolicy {
        initial: Duration::from_millis(1),
        max_delay: Duration::from_millis(10),
        ..procflow::executor::RetryPolicy::default()
    };
    Config {
        retry: quick.clone(),
        rollback_retry: quick,
        ..Config::default()
    }
}

async fn executor_with(journal: &Arc<Journal>) -> Executor<Journal> {
    Executor::builder_shared(Arc::new(MemStore::new()), Arc::clone(journal))
        .config(quick_config())
        .register::<FlakyState>()
        .register::<StuckState>()
        .register::<TimeoutsState>()
        .register::<TurnsState>()
        .register::<SumState>()
        .start()
        .await
        .unwrap()
}

/// HBase `TestProcedureExecution#testRollbackRetriableFailure`: a rollback that fails
/// twice with a transient error and then succeeds; the procedure ends rolled back and
/// still reports the original failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_failing_twice_then_succeeding_keeps_the_original_failure() {
    let journal = Arc::new(Journal::default());
    let executor = executor_with(&journal).await;
    let id = executor
        .submit(Flaky {
            rollback_failures: 2,
        })
        .await
        .unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::RolledBack(Error::fatal("the original failure"))
    );
    assert_eq!(journal.count("rollback Work"), 3);
}

// ---------------------------------------------------------------------------------------

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Stuck, env = Journal)]
enum StuckState {
    #[initial]
    #[transition(to = [Hang])]
    #[rollback]
    Start,
    #[transition(to = [Done])]
    Hang,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Stuck;

impl StuckStateHandlers for Stuck {
    async fn start(&mut self, _: &Context<Journal>) -> Step<stuck_state::Start> {
        Ok(stuck_state::Start::Hang.into())
    }
    async fn hang(&mut self, _: &Context<Journal>) -> Step<stuck_state::Hang> {
        std::future::pending().await
    }
    async fn rollback_start(&mut self, ctx: &Context<Journal>) -> Result<(), Error> {
        ctx.env().push("rollback Start");
        Ok(())
    }
}

/// HBase `TestProcedureExecution#testAbortTimeout`: a timeout of 2.5 s fails a stuck
/// procedure and rolls it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_of_2_5_s_fails_a_stuck_procedure() {
    let journal = Arc::new(Journal::default());
    let executor = executor_with(&journal).await;
    let started = Instant::now();
    let options = SubmitOptions::default().timeout(Duration::from_millis(2500));
    let id = executor.submit_with(Stuck, options).await.unwrap();
    let Outcome::RolledBack(error) = executor.wait(id).bounded().await.unwrap() else {
        panic!("expected a rollback");
    };
    let elapsed = started.elapsed();
    assert!(error.to_string().contains("timed out"), "{error}");
    assert!(elapsed >= Duration::from_millis(2500), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert_eq!(journal.count("rollback Start"), 1);
}

// ---------------------------------------------------------------------------------------

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Timeouts, env = Journal)]
enum TimeoutsState {
    #[initial]
    #[transition(to = [Done])]
    Wait,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Timeouts {
    woken: u32,
    started: bool,
}

impl TimeoutsStateHandlers for Timeouts {
    async fn wait(&mut self, ctx: &Context<Journal>) -> Step<timeouts_state::Wait> {
        if self.started {
            self.woken += 1;
            ctx.env().push("woken by timeout");
        }
        self.started = true;
        if self.woken == 6 {
            return Err(Error::fatal("aborted after 6 timeouts"));
        }
        Ok(Flow::suspend_for("never-fires", Duration::from_millis(500)))
    }
}

/// HBase `TestProcedureEvents#testTimeoutEventProcedure`: a procedure suspends on an event
/// with a 500 ms timeout, is woken by its timeout 6 times and then aborts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspended_procedure_woken_by_its_timeout_6_times_then_aborts() {
    let journal = Arc::new(Journal::default());
    let executor = executor_with(&journal).await;
    let started = Instant::now();
    let id = executor
        .submit(Timeouts {
            woken: 0,
            started: false,
        })
        .await
        .unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::RolledBack(Error::fatal("aborted after 6 timeouts"))
    );
    assert_eq!(journal.count("woken by timeout"), 6);
    assert!(started.elapsed() >= Duration::from_millis(3000));
}

// ---------------------------------------------------------------------------------------

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Turns, env = Journal)]
enum TurnsState {
    #[initial]
    #[transition(to = [Two])]
    One,
    #[transition(to = [Three])]
    Two,
    #[transition(to = [Done])]
    Three,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Turns {
    name: String,
    yielded: u32,
}

impl Turns {
    fn take<T>(&mut self, ctx: &Context<Journal>, step: u32, next: T) -> Step<T> {
        if self.yielded < step {
            self.yielded = step;
            return Ok(Flow::Yield); // Yield once before every step.
        }
        ctx.env().push(format!("{} step {step}", self.name));
        Ok(next.into())
    }
}

impl TurnsStateHandlers for Turns {
    async fn one(&mut self, ctx: &Context<Journal>) -> Step<turns_state::One> {
        self.take(ctx, 1, turns_state::One::Two)
    }
    async fn two(&mut self, ctx: &Context<Journal>) -> Step<turns_state::Two> {
        self.take(ctx, 2, turns_state::Two::Three)
    }
    async fn three(&mut self, ctx: &Context<Journal>) -> Step<turns_state::Three> {
        self.take(ctx, 3, turns_state::Three::Done)
    }
}

/// HBase `TestYieldProcedures#testYieldEachExecutionStep`: three procedures yielding
/// before each step all finish, each running its steps in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_yielding_procedures_each_run_their_steps_in_order() {
    let journal = Arc::new(Journal::default());
    let executor = executor_with(&journal).await;
    let mut ids = Vec::new();
    for name in ["p1", "p2", "p3"] {
        let turns = Turns {
            name: name.into(),
            yielded: 0,
        };
        ids.push(executor.submit(turns).await.unwrap());
    }
    for id in ids {
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
    }
    for name in ["p1", "p2", "p3"] {
        let own: Vec<_> = journal
            .events()
            .into_iter()
            .filter(|e| e.starts_with(name))
            .collect();
        assert_eq!(own, [1, 2, 3].map(|s| format!("{name} step {s}")));
    }
}

// ---------------------------------------------------------------------------------------

/// HBase `TestProcedureNonce#testCompletedProcWithSameNonce` /
/// `#testRunningProcWithSameNonce` / `#testConcurrentNonceRegistration`: the same nonce
/// returns the same id before and after a restart, for running and completed procedures;
/// concurrent submits with one nonce create one procedure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonce_returns_the_same_id_running_completed_and_after_restart() {
    let journal = Arc::new(Journal::default());
    let store = Arc::new(MemStore::new());
    let start = || async {
        Executor::builder_shared(store.clone(), Arc::clone(&journal))
            .register::<TimeoutsState>()
            .register::<SumState>()
            .start()
            .await
            .unwrap()
    };
    let executor = start().await;
    // Running: a procedure parked on a long timeout.
    let parked = || Timeouts {
        woken: 0,
        started: false,
    };
    let running_nonce = SubmitOptions::default().nonce("running");
    let concurrent = (0..8).map(|_| {
        let executor = executor.clone();
        let options = running_nonce.clone();
        tokio::spawn(async move { executor.submit_with(parked(), options).await.unwrap() })
    });
    let mut running_ids = Vec::new();
    for handle in concurrent {
        running_ids.push(handle.await.unwrap());
    }
    running_ids.dedup();
    assert_eq!(running_ids.len(), 1, "one procedure for one nonce");
    let running = running_ids[0];
    // Completed.
    let done_nonce = SubmitOptions::default().nonce("completed");
    let completed = executor
        .submit_with(Sum { total: 0 }, done_nonce.clone())
        .await
        .unwrap();
    executor.wait(completed).bounded().await.unwrap();
    executor.kill();

    let executor = start().await;
    let again_running = executor.submit_with(parked(), running_nonce).await.unwrap();
    let again_completed = executor
        .submit_with(Sum { total: 0 }, done_nonce)
        .await
        .unwrap();
    assert_eq!((again_running, again_completed), (running, completed));
    assert!(matches!(
        executor.state(running).unwrap().status,
        Status::Suspended { .. } | Status::Runnable
    ));
    assert_eq!(executor.state(completed).unwrap().status, Status::Succeeded);
    assert_eq!(journal.count("execute A"), 1, "no second procedure ran");
}

// ---------------------------------------------------------------------------------------

/// Never gets past its first step: only its submit is ever written.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Parked, env = Journal)]
enum ParkedState {
    #[initial]
    #[transition(to = [Done])]
    Wait,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Parked;

impl ParkedStateHandlers for Parked {
    async fn wait(&mut self, _: &Context<Journal>) -> Step<parked_state::Wait> {
        std::future::pending().await
    }
}

/// HBase `TestWALProcedureStore#testCorruptedTrailer` / `#testLoadChildren` (a log cut in
/// the middle): the write-ahead log cut at every byte offset opens without panicking and
/// loads exactly the procedures whose submit ended before the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_cut_at_every_byte_loads_every_procedure_before_the_cut() {
    use procflow::store::{WalConfig, WalStore};
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let store = Arc::new(WalStore::open(&wal, WalConfig::default()).unwrap());
    let journal = Arc::new(Journal::default());
    let executor = Executor::builder_shared(store.clone(), Arc::clone(&journal))
        .register::<ParkedState>()
        .start()
        .await
        .unwrap();
    let segment = || {
        let mut files: Vec<_> = std::fs::read_dir(&wal)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "wal"))
            .collect();
        assert_eq!(files.len(), 1);
        files.pop().unwrap()
    };
    // Where each acknowledged submit ends in the log: where the segment's records end,
    // not the file's length (the WAL allocates its space ahead, zeros past the records).
    let records_end = || {
        let stats = store.stats();
        stats.disk_bytes - stats.ahead_bytes
    };
    let mut ends = Vec::new();
    for _ in 0..3 {
        executor.submit(Parked).await.unwrap();
        ends.push(records_end());
    }
    executor.kill();
    let mut bytes = std::fs::read(segment()).unwrap();
    bytes.truncate(records_end() as usize);
    let name = segment().file_name().unwrap().to_owned();
    for cut in 0..=bytes.len() {
        let copy = tempfile::tempdir().unwrap();
        let copy_wal = copy.path().join("wal");
        std::fs::create_dir(&copy_wal).unwrap();
        std::fs::write(copy_wal.join(&name), &bytes[..cut]).unwrap();
        let Ok(store) = WalStore::open(&copy_wal, WalConfig::default()) else {
            // Only a cut inside the segment header (which is created whole, then renamed)
            // may fail to open; it is reported, never a panic.
            assert!(cut < 32, "cut at {cut} did not open");
            continue;
        };
        let executor = Executor::builder_shared(Arc::new(store), Arc::clone(&journal))
            .register::<ParkedState>()
            .start()
            .await
            .unwrap();
        let expected = ends.iter().filter(|end| **end <= cut as u64).count();
        assert_eq!(executor.list().len(), expected, "cut at byte {cut}");
        executor.kill();
    }
}
