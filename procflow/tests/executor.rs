//! The executor, item by item; every scenario runs on a `MemStore` and on a durable
//! `WalStore` (`on_both_stores!`).

mod common;

use common::{Bounded, Counter, CounterState, Grow, GrowState, Ledger, TestStore, test_config};
use procflow::ProcedureId;
use procflow::executor::{
    Config, Executor, ExecutorError, Outcome, ProcedureInfo, Status, SubmitError, SubmitOptions,
    WriteKind, WritePoint,
};
use procflow::prelude::*;
use procflow_store::Batch;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

on_both_stores! {
    runs_to_success_reporting_progress => runs_to_success_reporting_progress;
    an_ended_procedures_snapshot_stays_its_end => an_ended_procedures_snapshot_stays_its_end;
    failure_rolls_back_newest_first_and_keeps_the_error => failure_rolls_back_newest_first_and_keeps_the_error;
    retryable_errors_are_retried_then_succeed => retryable_errors_are_retried_then_succeed;
    spent_retry_budget_counts_as_fatal => spent_retry_budget_counts_as_fatal;
    rollback_retried_twice_then_rolled_back => rollback_retried_twice_then_rolled_back;
    rollback_that_keeps_failing_ends_failed => rollback_that_keeps_failing_ends_failed;
    panicking_handler_fails_only_its_procedure => panicking_handler_fails_only_its_procedure;
    kill_before_every_write_still_counts_26 => kill_before_every_write_still_counts_26;
    kill_after_every_write_still_counts_26 => kill_after_every_write_still_counts_26;
    a_kill_hook_sees_the_writes_numbered_in_order => a_kill_hook_sees_the_writes_numbered_in_order;
    ids_are_monotonic_across_restarts => ids_are_monotonic_across_restarts;
    nonce_returns_the_same_id_also_after_restart => nonce_returns_the_same_id_also_after_restart;
    concurrent_submits_with_one_nonce_make_one_procedure => concurrent_submits_with_one_nonce_make_one_procedure;
    unregistered_machine_is_unloadable_and_kept => unregistered_machine_is_unloadable_and_kept;
    suspended_procedure_runs_again_when_woken => suspended_procedure_runs_again_when_woken;
    suspension_timeout_survives_restart => suspension_timeout_survives_restart;
    abort_rolls_back_at_the_next_boundary => abort_rolls_back_at_the_next_boundary;
    timeout_fails_a_stuck_procedure => timeout_fails_a_stuck_procedure;
    finished_procedures_are_removed_after_retention => finished_procedures_are_removed_after_retention;
    procedures_ended_before_a_restart_are_removed_after_retention => procedures_ended_before_a_restart_are_removed_after_retention;
    past_the_retention_limit_the_first_ended_are_removed => past_the_retention_limit_the_first_ended_are_removed;
    a_restart_past_the_retention_limit_removes_the_first_ended => a_restart_past_the_retention_limit_removes_the_first_ended;
    killed_at_a_cleanup_for_the_limit_nothing_live_is_lost => killed_at_a_cleanup_for_the_limit_nothing_live_is_lost;
    queue_full_is_an_error_not_memory => queue_full_is_an_error_not_memory;
    abort_of_a_queued_procedure_does_not_wait_for_a_slot => abort_of_a_queued_procedure_does_not_wait_for_a_slot;
    shutdown_finishes_the_step_in_flight_and_resumes_later => shutdown_finishes_the_step_in_flight_and_resumes_later;
    subscription_sees_the_terminal_state => subscription_sees_the_terminal_state;
    wait_answers_every_waiter_once_the_procedure_ends => wait_answers_every_waiter_once_the_procedure_ends;
    wait_gives_the_stop_reason_when_the_executor_stops_first => wait_gives_the_stop_reason_when_the_executor_stops_first;
    a_restart_of_many_procedures_brings_each_back_as_it_was => a_restart_of_many_procedures_brings_each_back_as_it_was;
}

async fn start(store: &TestStore, ledger: &Ledger) -> Executor<Ledger> {
    store
        .builder(ledger)
        .register::<CounterState>()
        .start()
        .await
        .unwrap()
}

/// `start` with `config` instead of the tests' default.
async fn start_with(store: &TestStore, ledger: &Ledger, config: Config) -> Executor<Ledger> {
    store
        .builder(ledger)
        .register::<CounterState>()
        .config(config)
        .start()
        .await
        .unwrap()
}

async fn runs_to_success_reporting_progress(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let id = executor.submit(Counter::named("p")).await.unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    let info = executor.state(id).unwrap();
    let ProcedureInfo {
        id: info_id,
        parent,
        machine,
        status,
        state,
        steps,
        error,
        updated,
        ..
    } = info.clone();
    assert_eq!(
        (info_id, parent, machine, status, state, steps, error),
        (id, None, "Counter", Status::Succeeded, "Done", 4, None)
    );
    let record = executor.record(id).await.unwrap().unwrap();
    assert_eq!(updated, record.updated, "the time of its last write");
    assert_eq!(ledger.value("p value"), Some(26));
    assert_eq!(executor.list(), [info]);
    executor.shutdown().bounded().await.unwrap();
}

/// A step's snapshot, kept until its lane's poll ends (`executor/deferred.rs`), never
/// replaces the end that the same poll published after it: long after every procedure
/// has ended, each one's snapshot still says so.
async fn an_ended_procedures_snapshot_stays_its_end(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let mut ids = Vec::new();
    for n in 0..200 {
        ids.push(
            executor
                .submit(Counter::named(&format!("p{n}")))
                .await
                .unwrap(),
        );
    }
    for &id in &ids {
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
    }
    // Every lane's poll that ran these procedures has ended by now.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for id in ids {
        let info = executor.state(id).unwrap();
        assert_eq!((info.status, info.steps), (Status::Succeeded, 4), "{id:?}");
    }
    executor.shutdown().bounded().await.unwrap();
}

async fn failure_rolls_back_newest_first_and_keeps_the_error(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        fail_at: Some(4),
        fatal: true,
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    let outcome = executor.wait(id).bounded().await.unwrap();
    assert_eq!(outcome, Outcome::RolledBack(Error::fatal("step 4 failed")));
    let rollbacks: Vec<_> = ledger
        .events()
        .into_iter()
        .filter(|e| e.contains("rollback"))
        .collect();
    assert_eq!(rollbacks, ["p rollback 3", "p rollback 2", "p rollback 1"]);
    assert_eq!(executor.state(id).unwrap().status, Status::RolledBack);
}

async fn retryable_errors_are_retried_then_succeed(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        fail_at: Some(2),
        transient: 3,
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!(ledger.count("p execute 2"), 4, "3 failures, then success");
    // `Context::attempt` numbered the tries 1 to 4; the next step starts at 1 again.
    for attempt in 1..=4 {
        assert!(
            ledger
                .value(&format!("p step 2 attempt {attempt}"))
                .is_some()
        );
    }
    assert!(ledger.value("p step 2 attempt 5").is_none());
    assert!(ledger.value("p step 3 attempt 1").is_some());
    assert!(ledger.value("p step 3 attempt 2").is_none());
    assert_eq!(
        ledger.count("p execute 1"),
        1,
        "retries do not rerun earlier steps"
    );
}

async fn spent_retry_budget_counts_as_fatal(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    // The test budget is 5 attempts; 10 transient failures spend it.
    let counter = Counter {
        fail_at: Some(3),
        transient: 10,
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    let outcome = executor.wait(id).bounded().await.unwrap();
    assert_eq!(outcome, Outcome::RolledBack(Error::fatal("step 3 busy")));
    assert_eq!(ledger.count("p execute 3"), 5);
    assert_eq!(ledger.count("p rollback 2"), 1);
}

/// HBase `TestProcedureExecution#testRollbackRetriableFailure`: a rollback failing twice
/// transiently still ends rolled back, reporting the original failure.
async fn rollback_retried_twice_then_rolled_back(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        fail_at: Some(2),
        fatal: true,
        rollback_transient: 2,
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    let outcome = executor.wait(id).bounded().await.unwrap();
    assert_eq!(outcome, Outcome::RolledBack(Error::fatal("step 2 failed")));
    assert_eq!(ledger.count("p rollback 1"), 3);
}

async fn rollback_that_keeps_failing_ends_failed(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        fail_at: Some(2),
        fatal: true,
        rollback_transient: 100,
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    let outcome = executor.wait(id).bounded().await.unwrap();
    assert_eq!(outcome, Outcome::Failed(Error::fatal("step 2 failed")));
    assert_eq!(ledger.count("p rollback 1"), 5, "the rollback budget");
}

async fn panicking_handler_fails_only_its_procedure(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        panic_at: Some(3),
        ..Counter::named("bad")
    };
    let bad = executor.submit(counter).await.unwrap();
    let Outcome::RolledBack(error) = executor.wait(bad).bounded().await.unwrap() else {
        panic!("expected a rollback");
    };
    assert!(
        error.to_string().contains("panicked: boom at step 3"),
        "{error}"
    );
    assert!(error.is_fatal());
    let good = executor.submit(Counter::named("good")).await.unwrap();
    assert_eq!(
        executor.wait(good).bounded().await.unwrap(),
        Outcome::Succeeded
    );
}

/// HBase TestStateMachineProcedure / ProcedureTestingUtility double execution: the
/// executor dies at every other store write (right before it, or right after it), and a
/// new one restarts on the same store each time, until the procedure ends. Every write is
/// thus killed once and then goes through. The persisted counter still ends at exactly 26;
/// killed before its write, every step runs exactly twice; killed after, exactly once.
async fn kill_at_every_write(store: TestStore, point: WritePoint) {
    let ledger = Ledger::default();
    // Shared by every executor of the test: kill, let through, kill, let through…
    let kill_next = Arc::new(AtomicBool::new(true));
    let mut id = None;
    let mut kills = 0;
    let outcome = loop {
        let toggle = Arc::clone(&kill_next);
        let executor = store
            .builder(&ledger)
            .register::<CounterState>()
            .kill_hook(move |write: &procflow::executor::StoreWrite| {
                write.point == point && toggle.fetch_xor(true, Ordering::SeqCst)
            })
            .start()
            .await
            .unwrap();
        let pid = match id {
            Some(pid) => pid,
            None => match executor.submit(Counter::named("p")).await {
                Ok(pid) => pid,
                // Killed before the submit's write: a refusal, nothing stored.
                Err(SubmitError::Executor(ExecutorError::Killed)) => {
                    assert_eq!(point, WritePoint::Before);
                    kills += 1;
                    continue;
                }
                // Killed after it: the procedure exists, and the error says it may.
                Err(SubmitError::MaybeStored {
                    id: stored,
                    source: ExecutorError::Killed,
                }) => {
                    assert_eq!(point, WritePoint::After);
                    kills += 1;
                    id = Some(stored);
                    continue;
                }
                Err(other) => panic!("{other}"),
            },
        };
        id = Some(pid);
        match executor.wait(pid).bounded().await {
            Ok(outcome) => break outcome,
            Err(ExecutorError::Killed) => kills += 1,
            Err(other) => panic!("{other}"),
        }
    };
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(ledger.value("p value"), Some(26));
    let runs = if point == WritePoint::Before { 2 } else { 1 };
    for n in 1..=4 {
        assert_eq!(ledger.count(&format!("p execute {n}")), runs, "step {n}");
    }
    // Submit, three steps and the finish (which carries the fourth, terminal step) are
    // five writes; every other one (Before: every one, each before its retry) was a kill.
    let expected = if point == WritePoint::Before { 5 } else { 3 };
    assert_eq!(kills, expected);
}

async fn kill_before_every_write_still_counts_26(store: TestStore) {
    kill_at_every_write(store, WritePoint::Before).await;
}

async fn kill_after_every_write_still_counts_26(store: TestStore) {
    kill_at_every_write(store, WritePoint::After).await;
}

/// A kill hook sees each store write twice, before and after it, numbered from 0 in
/// the order the executor issued them: the submit's, three steps' and the finish's (the
/// number is counted only when there is a hook, so this checks that it still is).
async fn a_kill_hook_sees_the_writes_numbered_in_order(store: TestStore) {
    let ledger = Ledger::default();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let executor = {
        let seen = Arc::clone(&seen);
        store
            .builder(&ledger)
            .register::<CounterState>()
            .kill_hook(move |write: &procflow::executor::StoreWrite| {
                seen.lock().unwrap().push((write.index, write.point));
                false
            })
            .start()
            .await
            .unwrap()
    };
    let id = executor.submit(Counter::named("p")).await.unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    executor.shutdown().bounded().await.unwrap();
    let expected: Vec<_> = (0..5)
        .flat_map(|index| [(index, WritePoint::Before), (index, WritePoint::After)])
        .collect();
    assert_eq!(*seen.lock().unwrap(), expected);
}

async fn ids_are_monotonic_across_restarts(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(executor.submit(Counter::named("p")).await.unwrap());
    }
    for id in &ids {
        executor.wait(*id).bounded().await.unwrap();
    }
    executor.shutdown().bounded().await.unwrap();
    // Delete every record: ids must still not be reused.
    let store = store.reopen();
    let mut batch = Batch::new();
    for id in &ids {
        batch = batch.delete(id.get());
    }
    store.store.commit(batch).await.unwrap();
    assert!(store.store.load().await.unwrap().records.is_empty());
    let executor = start(&store, &ledger).await;
    let next = executor.submit(Counter::named("q")).await.unwrap();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert!(next > *ids.last().unwrap(), "{next} after {ids:?}");
}

async fn nonce_returns_the_same_id_also_after_restart(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let options = SubmitOptions::default().nonce("req-42");
    let first = executor
        .submit_with(Counter::named("p"), options.clone())
        .await
        .unwrap();
    let again = executor
        .submit_with(Counter::named("p"), options.clone())
        .await
        .unwrap();
    assert_eq!(first, again);
    executor.wait(first).bounded().await.unwrap();
    executor.kill();
    let executor = start(&store, &ledger).await;
    let after_restart = executor
        .submit_with(Counter::named("p"), options)
        .await
        .unwrap();
    assert_eq!(after_restart, first);
    assert_eq!(executor.list().len(), 1);
    assert_eq!(ledger.count("p execute 1"), 1);
}

async fn concurrent_submits_with_one_nonce_make_one_procedure(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let submits = (0..8).map(|_| {
        let executor = executor.clone();
        tokio::spawn(async move {
            executor
                .submit_with(Counter::named("p"), SubmitOptions::default().nonce("same"))
                .await
                .unwrap()
        })
    });
    let ids: Vec<_> = futures_join(submits).await;
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    assert_eq!(executor.list().len(), 1);
}

async fn futures_join<T: Send + 'static>(
    handles: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

/// A machine this test binary never registers.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Orphan, env = Ledger, name = "orphan")]
enum OrphanState {
    #[initial]
    #[transition(to = [Done])]
    Start,
    #[terminal]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Orphan;

impl OrphanStateHandlers for Orphan {
    async fn start(&mut self, _: &Context<Ledger>) -> Step<orphan_state::Start> {
        Ok(orphan_state::Start::Done.into())
    }
}

async fn unregistered_machine_is_unloadable_and_kept(store: TestStore) {
    let ledger = Ledger::default();
    // An executor that knows `orphan` persists one and dies before running it.
    let writer = store
        .builder(&ledger)
        .register::<OrphanState>()
        .kill_hook(|w: &procflow::executor::StoreWrite| {
            w.kind == WriteKind::Submit && w.point == WritePoint::After
        })
        .start()
        .await
        .unwrap();
    assert!(writer.submit(Orphan).await.is_err());
    let before = store.store.load().await.unwrap().records;
    assert_eq!(before.len(), 1);

    // The next one does not know it: reported, kept, and everything else goes on.
    let executor = start(&store, &ledger).await;
    let unloadable = executor.unloadable();
    assert_eq!(unloadable.len(), 1, "{unloadable:?}");
    assert_eq!(unloadable[0].id.get(), before[0].id);
    assert_eq!(unloadable[0].machine, "orphan");
    assert!(unloadable[0].reason.contains("not registered"));
    let id = executor.submit(Counter::named("p")).await.unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    let after = store.store.load().await.unwrap().records;
    assert_eq!(
        after.iter().find(|r| r.id == before[0].id),
        Some(&before[0])
    );
}

async fn suspended_procedure_runs_again_when_woken(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        suspend_at: Some(2),
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    let mut info = executor.subscribe(id).unwrap();
    info.wait_for(|i| matches!(i.status, Status::Suspended { .. }))
        .await
        .unwrap();
    assert_eq!(
        executor.state(id).unwrap().status,
        Status::Suspended { event: "p".into() }
    );
    ledger.push("p woken");
    assert_eq!(executor.wake("p").await.unwrap(), 1);
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!(ledger.count("p execute 2"), 2);
    assert_eq!(ledger.value("p value"), Some(26));
}

async fn suspension_timeout_survives_restart(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        suspend_at: Some(1),
        suspend_timeout_ms: Some(300),
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    let mut info = executor.subscribe(id).unwrap();
    info.wait_for(|i| matches!(i.status, Status::Suspended { .. }))
        .await
        .unwrap();
    executor.kill();
    // The timer is persisted: the new executor fires it (the handler then moves on).
    ledger.push("p woken");
    let executor = start(&store, &ledger).await;
    assert!(matches!(
        executor.state(id).unwrap().status,
        Status::Suspended { .. }
    ));
    let started = std::time::Instant::now();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(ledger.count("p execute 1"), 2);
}

async fn abort_rolls_back_at_the_next_boundary(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        suspend_at: Some(3),
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    let mut info = executor.subscribe(id).unwrap();
    info.wait_for(|i| matches!(i.status, Status::Suspended { .. }))
        .await
        .unwrap();
    executor.abort(id).unwrap();
    let outcome = executor.wait(id).bounded().await.unwrap();
    assert_eq!(
        outcome,
        Outcome::RolledBack(Error::fatal("aborted on request"))
    );
    // Steps 1 and 2 completed, step 3 suspended (it ran, so it may have acted): each is
    // rolled back once, newest first.
    let rollbacks: Vec<_> = ledger
        .events()
        .into_iter()
        .filter(|e| e.contains("rollback"))
        .collect();
    assert_eq!(rollbacks, ["p rollback 3", "p rollback 2", "p rollback 1"]);
}

async fn timeout_fails_a_stuck_procedure(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        slow_ms: 60_000,
        ..Counter::named("p")
    };
    let options = SubmitOptions::default().timeout(Duration::from_millis(250));
    let id = executor.submit_with(counter, options).await.unwrap();
    let Outcome::RolledBack(error) = executor.wait(id).bounded().await.unwrap() else {
        panic!("expected a rollback");
    };
    assert!(error.to_string().contains("timed out"), "{error}");
}

async fn finished_procedures_are_removed_after_retention(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start_with(
        &store,
        &ledger,
        Config {
            retention: Duration::from_millis(100),
            cleanup_interval: Duration::from_millis(20),
            ..test_config()
        },
    )
    .await;
    let options = SubmitOptions::default().nonce("n1");
    let id = executor
        .submit_with(Counter::named("p"), options.clone())
        .await
        .unwrap();
    executor.wait(id).bounded().await.unwrap();
    assert!(executor.state(id).is_some(), "kept right after it ends");
    for _ in 0..100 {
        if executor.state(id).is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(executor.state(id).is_none(), "removed after retention");
    let loaded = store.store.load().await.unwrap();
    assert!(loaded.records.is_empty());
    assert!(!loaded.meta.keys().any(|k| k.contains("nonce")));
    // The nonce went with it: the same nonce now starts a new procedure.
    let again = executor
        .submit_with(Counter::named("p"), options)
        .await
        .unwrap();
    assert_ne!(again, id);
}

/// Retention takes ended procedures from a queue by end time: those loaded ended at a
/// restart are queued too.
async fn procedures_ended_before_a_restart_are_removed_after_retention(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let ended = executor.submit(Counter::named("p")).await.unwrap();
    executor.wait(ended).bounded().await.unwrap();
    executor.kill();
    let config = Config {
        retention: Duration::from_millis(100),
        cleanup_interval: Duration::from_millis(20),
        ..test_config()
    };
    let executor = start_with(&store, &ledger, config).await;
    let later = executor.submit(Counter::named("q")).await.unwrap();
    executor.wait(later).bounded().await.unwrap();
    for _ in 0..100 {
        if executor.list().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(executor.list(), [], "both removed after retention");
    assert!(store.store.load().await.unwrap().records.is_empty());
    executor.shutdown().bounded().await.unwrap();
}

/// Retention that never comes within a test, and a cleanup interval as long: only
/// `Config::retention_limit` deletes.
fn limited_to(limit: usize) -> Config {
    Config {
        retention: Duration::from_secs(3600),
        cleanup_interval: Duration::from_secs(3600),
        retention_limit: limit,
        ..test_config()
    }
}

/// Runs procedures named `names` one after the other, each to its end.
async fn run_each(executor: &Executor<Ledger>, names: &[&str]) -> Vec<ProcedureId> {
    let mut ids = Vec::new();
    for name in names {
        let id = executor.submit(Counter::named(name)).await.unwrap();
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
        ids.push(id);
    }
    ids
}

/// Waits until the executor lists exactly `ids` (in id order), and checks the store
/// holds exactly their records.
async fn until_only(executor: &Executor<Ledger>, store: &TestStore, ids: &[ProcedureId]) {
    let listed = || executor.list().iter().map(|i| i.id).collect::<Vec<_>>();
    for _ in 0..250 {
        if listed() == ids {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(listed(), ids);
    let mut stored: Vec<_> = (store.store.load().await.unwrap().records)
        .iter()
        .map(|r| ProcedureId::new(r.id))
        .collect();
    stored.sort();
    assert_eq!(stored, ids, "the store holds what the executor lists");
}

/// Past `Config::retention_limit` the procedures that ended first are deleted, long
/// before their retention, and without waiting for the cleanup's interval.
async fn past_the_retention_limit_the_first_ended_are_removed(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start_with(&store, &ledger, limited_to(3)).await;
    let ids = run_each(&executor, &["a", "b", "c", "d", "e", "f"]).await;
    until_only(&executor, &store, &ids[3..]).await;
    let gone = executor.wait(ids[0]).await;
    assert!(
        matches!(gone, Err(ExecutorError::NotFound(id)) if id == ids[0]),
        "gone as after its retention: {gone:?}"
    );
    executor.shutdown().bounded().await.unwrap();
}

/// A restart that loads more ended procedures than the limit deletes the first ended at
/// once: it does not wait for the cleanup's interval, nor for another to end.
async fn a_restart_past_the_retention_limit_removes_the_first_ended(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let ids = run_each(&executor, &["a", "b", "c", "d", "e"]).await;
    executor.shutdown().bounded().await.unwrap();
    let store = store.reopen();
    let executor = start_with(&store, &ledger, limited_to(2)).await;
    until_only(&executor, &store, &ids[3..]).await;
    executor.shutdown().bounded().await.unwrap();
}

/// Killed at a cleanup for the limit, before or after its delete is stored, the executor
/// loses nothing live: the suspended procedure comes back and ends, and the restart
/// deletes down to the limit the ended ones the killed cleanup left.
async fn killed_at_a_cleanup_for_the_limit_nothing_live_is_lost(mut store: TestStore) {
    for point in [WritePoint::Before, WritePoint::After] {
        let ledger = Ledger::default();
        let suspended = Counter {
            suspend_at: Some(1),
            ..Counter::named("live")
        };
        let executor = store
            .builder(&ledger)
            .register::<CounterState>()
            .config(limited_to(2))
            .kill_hook(move |write: &procflow::executor::StoreWrite| {
                write.kind == WriteKind::Cleanup && write.point == point
            })
            .start()
            .await
            .unwrap();
        let live = executor.submit(suspended).await.unwrap();
        let mut info = executor.subscribe(live).unwrap();
        info.wait_for(|i| matches!(i.status, Status::Suspended { .. }))
            .await
            .unwrap();
        // The third end passes the limit: the cleanup's delete is killed.
        let ended = run_each(&executor, &["a", "b", "c"]).await;
        let stopped = executor.wait(live).bounded().await;
        assert!(
            matches!(stopped, Err(ExecutorError::Killed)),
            "{point:?}: {stopped:?}"
        );
        let executor = start_with(&store, &ledger, limited_to(2)).await;
        let mut kept = vec![live];
        kept.extend_from_slice(&ended[1..]);
        until_only(&executor, &store, &kept).await;
        // Ends are ordered by their millisecond, then by id: `live`, the first
        // submitted, must end in a later millisecond than `c` to be the last ended.
        tokio::time::sleep(Duration::from_millis(5)).await;
        // (What the counter's handler looks for to go on instead of suspending again.)
        ledger.push("live woken");
        assert_eq!(executor.wake("live").await.unwrap(), 1);
        assert_eq!(
            executor.wait(live).bounded().await.unwrap(),
            Outcome::Succeeded,
            "{point:?}"
        );
        assert_eq!(ledger.value("live value"), Some(26));
        // Clean for the next point: the live one ended, so the count now deletes `b`.
        until_only(&executor, &store, &[live, ended[2]]).await;
        executor.shutdown().bounded().await.unwrap();
        store = store.reopen();
        let executor = start_with(&store, &ledger, limited_to(0)).await;
        until_only(&executor, &store, &[]).await;
        executor.shutdown().bounded().await.unwrap();
        store = store.reopen();
    }
}

async fn queue_full_is_an_error_not_memory(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start_with(
        &store,
        &ledger,
        Config {
            max_running: 1,
            queue_capacity: 1,
            ..test_config()
        },
    )
    .await;
    // Suspended procedures are dormant: they hold no running slot and do not count.
    for _ in 0..3 {
        let dormant = executor
            .submit(Counter {
                suspend_at: Some(1),
                ..Counter::named("dormant")
            })
            .await
            .unwrap();
        let mut info = executor.subscribe(dormant).unwrap();
        info.wait_for(|i| matches!(i.status, Status::Suspended { .. }))
            .await
            .unwrap();
    }
    // One running (in a slow step, holding the only slot), one queued for it.
    let slow = || Counter {
        slow_ms: 500,
        ..Counter::named("slow")
    };
    let a = executor.submit(slow()).await.unwrap();
    let _b = executor.submit(slow()).await.unwrap();
    match executor.submit(slow()).await {
        Err(SubmitError::QueueFull { live }) => assert_eq!(live, 2),
        other => panic!("expected QueueFull, got {other:?}"),
    }
    // Room again once one ends.
    executor.wait(a).bounded().await.unwrap();
    executor.submit(slow()).await.unwrap();
}

async fn abort_of_a_queued_procedure_does_not_wait_for_a_slot(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start_with(
        &store,
        &ledger,
        Config {
            max_running: 1,
            ..test_config()
        },
    )
    .await;
    // `held` takes the only running slot and keeps it: its first step runs a minute.
    let held = executor
        .submit(Counter {
            slow_ms: 60_000,
            ..Counter::named("held")
        })
        .await
        .unwrap();
    while ledger.count("held execute 1") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let queued = executor.submit(Counter::named("queued")).await.unwrap();
    executor.abort(queued).unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), executor.wait(queued))
        .await
        .expect("the abort of a queued procedure is honoured without a running slot")
        .unwrap();
    assert!(matches!(outcome, Outcome::RolledBack(_)), "{outcome:?}");
    assert_eq!(ledger.count("queued execute 1"), 0, "it never ran");
    assert_eq!(
        executor.state(held).unwrap().steps,
        0,
        "still in its first step"
    );
    // The step in flight is not waited for: the test ends here.
    executor.kill();
}

async fn shutdown_finishes_the_step_in_flight_and_resumes_later(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let counter = Counter {
        slow_ms: 200,
        ..Counter::named("p")
    };
    let id = executor.submit(counter).await.unwrap();
    // Shut down while step 1 (200 ms long) is in flight.
    for _ in 0..500 {
        if ledger.count("p execute 1") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(ledger.count("p execute 1"), 1, "step 1 started");
    executor.shutdown().bounded().await.unwrap();
    // The step in flight (1) completed and was persisted; nothing else ran.
    assert_eq!(ledger.count("p execute 1"), 1);
    assert_eq!(ledger.count("p execute 2"), 0);
    assert!(matches!(
        executor.submit(Counter::named("q")).await,
        Err(SubmitError::Executor(ExecutorError::ShutDown))
    ));
    let store = store.reopen();
    let executor = start(&store, &ledger).await;
    assert_eq!(executor.state(id).unwrap().steps, 1);
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!(ledger.count("p execute 1"), 1, "not run again");
}

async fn subscription_sees_the_terminal_state(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let id = executor.submit(Counter::named("p")).await.unwrap();
    let mut receiver = executor.subscribe(id).unwrap();
    // Read nothing until well after the end: the receiver still holds the final snapshot.
    executor.wait(id).bounded().await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let last = receiver.borrow_and_update().clone();
    assert_eq!((last.status, last.steps), (Status::Succeeded, 4));
    // And a receiver that follows every change ends on it too.
    let late = executor.submit(Counter::named("q")).await.unwrap();
    let mut follower = executor.subscribe(late).unwrap();
    let mut seen = Vec::new();
    loop {
        let info = follower.borrow_and_update().clone();
        seen.push(info.steps);
        if info.status.is_finished() {
            break;
        }
        follower.changed().await.unwrap();
    }
    assert_eq!(follower.borrow().status, Status::Succeeded);
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "progress only grows: {seen:?}"
    );
}

/// A store that refuses big values (etcd refuses requests over ~1.5 MiB): the refusal
/// fails the one procedure (or submit) concerned, never the executor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_the_store_refuses_fails_only_its_procedure() {
    use procflow::store::{Limits, MemStore};
    let ledger = Ledger::default();
    let limits = Limits {
        max_ops_per_batch: None,
        max_value_bytes: Some(400),
        max_batch_bytes: None,
    };
    let store = Arc::new(MemStore::with_limits(limits));
    let executor = Executor::builder(
        Arc::clone(&store) as Arc<dyn procflow::store::Store>,
        ledger.clone(),
    )
    .config(test_config())
    .register::<CounterState>()
    .register::<GrowState>()
    .start()
    .await
    .unwrap();
    // Too big from the start: the submit is refused, nothing else happens.
    let huge = Counter::named(&"x".repeat(400));
    match executor.submit(huge).await {
        Err(SubmitError::Executor(ExecutorError::Rejected(_))) => {}
        other => panic!("expected a refused submit, got {other:?}"),
    }
    // Fits at first, outgrows the limit at its second step: it rolls back from its last
    // stored step, durably (the store says it ended: no restart resumes it).
    let grow = Grow::new();
    let id = executor.submit(grow).await.unwrap();
    match executor.wait(id).bounded().await.unwrap() {
        Outcome::RolledBack(error) => {
            assert!(error.to_string().contains("cannot be stored"), "{error}");
        }
        other => panic!("expected the procedure to roll back, got {other:?}"),
    }
    assert_eq!(
        ledger.count("grow"),
        2,
        "it stopped where it could not be stored"
    );
    let stored = procflow::store::Store::get(&*store, id.get())
        .await
        .unwrap()
        .unwrap();
    assert!(
        stored.finished,
        "the outcome `wait` returned is the stored one"
    );
    // The executor goes on.
    let ok = executor.submit(Counter::named("small")).await.unwrap();
    assert_eq!(
        executor.wait(ok).bounded().await.unwrap(),
        Outcome::Succeeded
    );
}

/// What a spawned `wait` returned; a waiter never answered fails the test.
async fn answer(
    waiter: tokio::task::JoinHandle<Result<Outcome, ExecutorError>>,
) -> Result<Outcome, ExecutorError> {
    tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter was never answered")
        .unwrap()
}

/// Suspends a counter on event `name` and returns its id once it waits there.
async fn suspended_counter(executor: &Executor<Ledger>, name: &str) -> ProcedureId {
    let counter = Counter {
        suspend_at: Some(2),
        ..Counter::named(name)
    };
    let id = executor.submit(counter).await.unwrap();
    let suspended = |status: &Status| matches!(status, Status::Suspended { .. });
    common::status_is(executor, id, Duration::from_secs(30), suspended).await;
    id
}

/// `wait` is told the outcome at the end: every waiter (several at once, and one that
/// gave up many times under a timeout first) gets it, a wait after the end gets it at
/// once, and an unknown id is `NotFound`.
async fn wait_answers_every_waiter_once_the_procedure_ends(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let id = suspended_counter(&executor, "p").await;
    for _ in 0..200 {
        let waited = tokio::time::timeout(Duration::from_micros(100), executor.wait(id)).await;
        assert!(waited.is_err(), "no outcome while it is suspended");
    }
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let executor = executor.clone();
            tokio::spawn(async move { executor.wait(id).bounded().await })
        })
        .collect();
    ledger.push("p woken");
    assert_eq!(executor.wake("p").await.unwrap(), 1);
    for waiter in waiters {
        assert_eq!(answer(waiter).await.unwrap(), Outcome::Succeeded);
    }
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    let unknown = ProcedureId::new(id.get() + 1_000);
    assert!(matches!(
        executor.wait(unknown).bounded().await,
        Err(ExecutorError::NotFound(missing)) if missing == unknown
    ));
    executor.shutdown().bounded().await.unwrap();
}

/// A procedure that has not ended when the executor stops: `wait` returns why it stopped
/// (a shutdown, a kill), for a waiter already waiting and for one that comes after.
async fn wait_gives_the_stop_reason_when_the_executor_stops_first(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let id = suspended_counter(&executor, "p").await;
    let waiting = {
        let executor = executor.clone();
        tokio::spawn(async move { executor.wait(id).bounded().await })
    };
    executor.shutdown().bounded().await.unwrap();
    assert!(matches!(
        answer(waiting).await,
        Err(ExecutorError::ShutDown)
    ));
    assert!(matches!(
        executor.wait(id).bounded().await,
        Err(ExecutorError::ShutDown)
    ));
    drop(executor);

    let store = store.reopen();
    let executor = start(&store, &ledger).await;
    let waiting = {
        let executor = executor.clone();
        tokio::spawn(async move { executor.wait(id).bounded().await })
    };
    executor.kill();
    assert!(matches!(answer(waiting).await, Err(ExecutorError::Killed)));
    assert!(matches!(
        executor.wait(id).bounded().await,
        Err(ExecutorError::Killed)
    ));
}

/// A restart of more procedures than the start readies on its own thread (from 512 on, a
/// second thread decodes them ahead): each comes back as it was. The ended ones keep
/// their snapshot and their nonce, the suspended ones run when woken, and the records
/// that cannot be loaded are reported in id order.
async fn a_restart_of_many_procedures_brings_each_back_as_it_was(store: TestStore) {
    const EACH: u64 = 200;
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let mut ended = Vec::new();
    for n in 0..EACH {
        let options = SubmitOptions::default().nonce(format!("req-{n}"));
        let counter = Counter::named(&format!("e{n}"));
        ended.push(executor.submit_with(counter, options).await.unwrap());
    }
    for &id in &ended {
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
    }
    let mut suspended = Vec::new();
    for n in 0..EACH {
        suspended.push(suspended_counter(&executor, &format!("s{n}")).await);
    }
    let before = executor.list();
    executor.shutdown().bounded().await.unwrap();
    drop(executor);

    let store = store.reopen();
    // Records no build can read, after every procedure's id.
    let last = suspended.iter().max().unwrap().get();
    let unreadable: Vec<u64> = (1..=EACH).map(|n| last + 2 * n).collect();
    let mut batch = Batch::new();
    for &id in &unreadable {
        batch = batch.put(id, None, vec![0xff; 8]);
    }
    store.store.commit(batch).await.unwrap();
    let executor = start(&store, &ledger).await;

    let reported: Vec<u64> = executor.unloadable().iter().map(|u| u.id.get()).collect();
    assert_eq!(reported, unreadable);
    assert_eq!(executor.list(), before);
    for (n, &id) in (0..EACH).zip(&ended) {
        let options = SubmitOptions::default().nonce(format!("req-{n}"));
        let again = executor.submit_with(Counter::named("x"), options).await;
        assert_eq!(again.unwrap(), id, "nonce req-{n}");
    }
    for n in 0..EACH {
        ledger.push(format!("s{n} woken"));
        assert_eq!(executor.wake(&format!("s{n}")).await.unwrap(), 1, "s{n}");
    }
    for &id in &suspended {
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
    }
    executor.shutdown().bounded().await.unwrap();
}
