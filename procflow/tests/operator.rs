//! Operators' view and requests: readable records, durable abort / wake / bypass.

mod common;

use common::Bounded;
use common::ops::{Job, JobState, Log, start, until};
use procflow::ProcedureId;
use procflow::executor::{
    Executor, ExecutorError, Handled, Outcome, Status, WriteKind, WritePoint,
};
use procflow::operator::{Action, Catalog, HistoryEntry, Request, StepKind, StepOutcome};
use procflow::store::{Store, WalConfig, WalStore};
use std::sync::Arc;
use std::time::Duration;

fn suspended(status: &Status) -> bool {
    matches!(status, Status::Suspended { .. })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_request_survives_a_kill_before_it_is_acted_on() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let store = Arc::new(WalStore::open(dir.path(), WalConfig::default()).unwrap());
    // Dies right before the rollback's first write: the request is stored, not acted on.
    let executor = Executor::builder_shared(store.clone(), Arc::new(log.clone()))
        .register::<JobState>()
        .kill_hook(|w: &procflow::executor::StoreWrite| {
            w.kind == WriteKind::Rollback && w.point == WritePoint::Before
        })
        .start()
        .await
        .unwrap();
    let id = executor.submit(Job::new("a")).await.unwrap();
    until(&executor, id, suspended).await;
    let abort = Request::new(Action::Abort(id.get()), "alice", "wrong table");
    let result = executor.request(abort).await;
    assert!(matches!(result, Err(ExecutorError::Killed)), "{result:?}");
    drop(executor);
    store.close().await.unwrap();
    drop(store);

    let at_rest = Catalog::from_loaded(&WalStore::read_only(dir.path()).unwrap());
    let pending = at_rest.pending_requests();
    assert_eq!(pending.len(), 1, "the request outlives the kill");
    assert_eq!(pending[0].1.by, "alice");
    assert_eq!(
        at_rest.get(id).unwrap().state,
        "Wait",
        "and was not acted on"
    );

    let executor = start(dir.path(), &log).await;
    let outcome = executor.wait(id).bounded().await.unwrap();
    assert_eq!(
        outcome,
        Outcome::RolledBack(procflow::Error::fatal("aborted by alice: wrong table"))
    );
    assert_eq!(log.count("undo reserve a"), 1);
    let catalog = executor.catalog().await.unwrap();
    // Deleted once done (the delete follows the rollback's writes).
    for _ in 0..200 {
        if executor
            .catalog()
            .await
            .unwrap()
            .pending_requests()
            .is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        executor
            .catalog()
            .await
            .unwrap()
            .pending_requests()
            .is_empty()
    );
    let record = catalog.get(id).unwrap();
    let interrupted = record.history.iter().find(|e| e.kind == StepKind::Control);
    assert_eq!(
        interrupted.map(|e| &e.outcome),
        Some(&StepOutcome::Interrupted(
            "aborted by alice: wrong table".into()
        ))
    );
    // The rollback entry names the state it undid, not the one the abort found it in;
    // the diagram draws that state undone.
    let undone = record.history.iter().find(|e| e.kind == StepKind::Rollback);
    let undone = undone.map(|e| (e.state.as_str(), &e.outcome));
    assert_eq!(undone, Some(("Reserve", &StepOutcome::Undone)));
    assert_eq!(catalog.path(id).unwrap().undone, ["Reserve"]);
    executor.shutdown().bounded().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypass_ends_a_stuck_procedure_frees_its_locks_and_records_who() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    log.let_go("stuck");
    let stuck = executor
        .submit(Job::new("stuck").locking("ns/t1").failing_commit())
        .await
        .unwrap();
    // Stuck, and retried once since.
    until(
        &executor,
        stuck,
        |s| matches!(s, Status::Stuck { attempts, .. } if *attempts >= 2),
    )
    .await;
    let next = executor
        .submit(Job::new("next").locking("ns/t1"))
        .await
        .unwrap();
    until(&executor, next, |s| *s == Status::WaitingForLock).await;

    // Seen from outside: stuck (stored when it became stuck), holding its lock.
    let live = executor.record(stuck).await.unwrap().unwrap();
    assert!(
        matches!(live.status, Status::Stuck { .. }),
        "{:?}",
        live.status
    );
    assert!(live.holds_locks && live.attempts >= 2);
    assert_eq!(
        live.last_error.as_deref(),
        Some("the region server refuses the commit")
    );
    assert!(
        executor
            .record(next)
            .await
            .unwrap()
            .unwrap()
            .waits_for_locks
    );
    let at_rest = Catalog::from_loaded(&WalStore::read_only(dir.path()).unwrap());
    assert!(matches!(
        at_rest.get(stuck).unwrap().status,
        Status::Stuck { .. }
    ));

    let bypass = Action::Bypass {
        id: stuck.get(),
        recursive: false,
    };
    let handled = executor
        .request(Request::new(bypass, "bob", "commit done by hand"))
        .await
        .unwrap();
    assert_eq!(handled, Handled::Done { procedures: 1 });
    assert_eq!(
        executor.wait(stuck).bounded().await.unwrap(),
        Outcome::Bypassed
    );
    // Its lock is free: the waiter gets it and runs (once let go).
    log.let_go("next");
    until(&executor, next, |s| suspended(s) || s.is_finished()).await;
    executor.wake("go-next").await.unwrap();
    assert_eq!(
        executor.wait(next).bounded().await.unwrap(),
        Outcome::Succeeded
    );

    let record = executor.record(stuck).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Bypassed);
    let bypassed = record.bypass.as_ref().unwrap();
    assert_eq!(
        (bypassed.by.as_str(), bypassed.reason.as_str()),
        ("bob", "commit done by hand")
    );
    let last = record.history.last().unwrap();
    assert_eq!(
        last.outcome,
        StepOutcome::Bypassed {
            by: "bob".into(),
            reason: "commit done by hand".into()
        }
    );
    executor.shutdown().bounded().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_past_the_point_of_no_return_is_refused_and_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    log.let_go("p");
    let id = executor
        .submit(Job::new("p").failing_commit())
        .await
        .unwrap();
    until(&executor, id, |s| matches!(s, Status::Stuck { .. })).await;
    let handled = executor
        .request(Request::new(Action::Abort(id.get()), "carol", "give up"))
        .await
        .unwrap();
    assert!(
        matches!(&handled, Handled::Refused(why) if why.contains("point of no return")),
        "{handled:?}"
    );
    assert!(
        executor
            .catalog()
            .await
            .unwrap()
            .pending_requests()
            .is_empty()
    );
    executor.shutdown().bounded().await.unwrap();
}

/// Lets job `name` (suspended as `id`) go on, wakes its event through an operator's
/// request, waits for it to succeed and shuts the executor down.
async fn wake_to_the_end(executor: Executor<Log>, log: &Log, name: &str, id: ProcedureId) {
    log.let_go(name);
    let woken = executor
        .request(Request::new(Action::Wake(format!("go-{name}")), "dave", ""))
        .await
        .unwrap();
    assert_eq!(woken, Handled::Done { procedures: 1 });
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    executor.shutdown().bounded().await.unwrap();
}

/// Each history entry's state and outcome.
fn steps_of(history: &[HistoryEntry]) -> Vec<(String, StepOutcome)> {
    history
        .iter()
        .map(|entry| (entry.state.clone(), entry.outcome.clone()))
        .collect()
}

/// The history of job `name` suspended on its event, woken, and run to its end.
fn a_woken_jobs_steps(name: &str) -> Vec<(String, StepOutcome)> {
    [
        ("Reserve", StepOutcome::Moved),
        ("Wait", StepOutcome::Suspended(format!("go-{name}"))),
        ("Wait", StepOutcome::Moved),
        ("Commit", StepOutcome::Moved),
        ("Done", StepOutcome::Ended),
    ]
    .into_iter()
    .map(|(state, outcome)| (state.to_owned(), outcome))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_at_rest_has_the_history_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    let id = executor.submit(Job::new("h")).await.unwrap();
    until(&executor, id, suspended).await;
    wake_to_the_end(executor, &log, "h", id).await;

    let catalog = Catalog::from_loaded(&WalStore::read_only(dir.path()).unwrap());
    let record = catalog.get(id).unwrap();
    assert_eq!(steps_of(&record.history), a_woken_jobs_steps("h"));
    assert!(record.submitted <= record.updated && record.finished.is_some());
    assert_eq!(record.visited, ["Reserve", "Wait", "Commit", "Done"]);
    let diagram = catalog.diagram(id).unwrap();
    assert!(
        diagram.contains("class Reserve,Wait,Commit visited"),
        "{diagram}"
    );
    assert!(diagram.contains("class Done current"), "{diagram}");
}

/// A restart reads a dormant procedure without its history (`Envelope::decode_head`);
/// woken after the restart, it reads its value whole again, and its record at rest
/// still holds the steps from before the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_procedure_dormant_across_a_restart_keeps_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    let id = executor.submit(Job::new("r")).await.unwrap();
    until(&executor, id, suspended).await;
    executor.shutdown().bounded().await.unwrap();

    let executor = start(dir.path(), &log).await;
    until(&executor, id, suspended).await;
    wake_to_the_end(executor, &log, "r", id).await;

    let catalog = Catalog::from_loaded(&WalStore::read_only(dir.path()).unwrap());
    let history = &catalog.get(id).unwrap().history;
    assert_eq!(steps_of(history), a_woken_jobs_steps("r"));
}

/// On etcd, any process may leave a request: the running executor reads it within
/// `Config::request_poll` and carries it out, without a restart.
#[cfg(feature = "etcd")]
mod on_etcd {
    use super::*;
    use procflow::executor::Config;
    use procflow::operator::leave_request;
    use procflow_store::etcd::{EtcdConfig, EtcdStore, LocalCluster};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_another_process_leaves_in_etcd_is_carried_out_while_running() {
        let cluster = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
        let config = EtcdConfig::new(cluster.endpoints(), "/operator/requests");
        let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(config.clone()).await.unwrap());
        let log = Log::default();
        let executor = Executor::builder_shared(store, Arc::new(log.clone()))
            .register::<JobState>()
            .config(Config {
                request_poll: Some(Duration::from_millis(50)),
                ..Config::default()
            })
            .start()
            .await
            .unwrap();
        let alpha = executor.submit(Job::new("alpha")).await.unwrap();
        let bravo = executor.submit(Job::new("bravo")).await.unwrap();
        until(&executor, alpha, suspended).await;
        until(&executor, bravo, suspended).await;

        // Another connection, as another process has: it shares nothing with the
        // executor but etcd.
        let other = EtcdStore::connect(config.clone()).await.unwrap();
        let abort = Request::new(Action::Abort(alpha.get()), "alice", "wrong table");
        leave_request(&other, &abort).await.unwrap();
        log.let_go("bravo");
        let wake = Request::new(Action::Wake("go-bravo".into()), "bob", "");
        leave_request(&other, &wake).await.unwrap();

        let rolled_back = tokio::time::timeout(Duration::from_secs(10), executor.wait(alpha));
        assert_eq!(
            rolled_back.await.unwrap().unwrap(),
            Outcome::RolledBack(procflow::Error::fatal("aborted by alice: wrong table"))
        );
        let woken = tokio::time::timeout(Duration::from_secs(10), executor.wait(bravo));
        assert_eq!(woken.await.unwrap().unwrap(), Outcome::Succeeded);
        assert_eq!(log.count("undo reserve alpha"), 1);
        assert_eq!(log.count("commit bravo"), 1);

        // Each is deleted once done, and carried out once: later polls find nothing.
        for _ in 0..200 {
            if other.meta("procflow/request/").await.unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(other.meta("procflow/request/").await.unwrap().is_empty());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(log.count("undo reserve alpha"), 1);
        executor.shutdown().bounded().await.unwrap();
        other.close().await.unwrap();
    }
}
