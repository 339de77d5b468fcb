//! The `procflow` CLI end to end, on a real WAL directory: read commands beside a running
//! executor, a bypass stored on the stopped store and carried out at the next start.

mod common;
#[path = "common/cli.rs"]
mod run;

use common::Bounded;
use common::ops::{Job, Log, bypassed_and_rolled_back, start, stuck_and_waiting};
use procflow::executor::Outcome;
use run::{json, procflow, reads_stuck_and_waiting};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_reads_a_live_store_and_bypasses_a_stuck_procedure_on_a_stopped_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path();
    let at = ["--store", store.to_str().unwrap()];
    let log = Log::default();
    let executor = start(store, &log).await;
    let (stuck, waiting) = stuck_and_waiting(&executor, &log).await;

    // Read while the executor runs (it holds the store's lock).
    reads_stuck_and_waiting(&at);

    // A write needs the store stopped: the running executor holds it.
    let (ok, _, stderr) = procflow(&["bypass", "1", "--reason", "fixed by hand"], &at);
    assert!(
        !ok && stderr.contains("an executor runs on this store"),
        "{stderr}"
    );
    let commits = log.count("commit stuck");
    executor.kill();
    drop(executor);

    let (ok, _, stderr) = procflow(&["bypass", "1"], &at);
    assert!(!ok && stderr.contains("--reason"), "{stderr}");
    let (ok, stdout, stderr) = procflow(
        &["bypass", "1", "--by", "erin", "--reason", "fixed by hand"],
        &at,
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("stored procflow/request/"), "{stdout}");
    let (ok, _, stderr) = procflow(&["abort", "--status", "suspended", "--by", "erin"], &at);
    assert!(ok, "{stderr}");

    // The next start carries both out: the stuck one does not run again, its lock is free.
    let executor = start(store, &log).await;
    bypassed_and_rolled_back(&executor, stuck, waiting).await;
    assert_eq!(
        log.count("commit stuck"),
        commits,
        "a bypassed procedure runs no handler"
    );
    log.let_go("next");
    let next = executor
        .submit(Job::new("next").locking("ns/t1"))
        .await
        .unwrap();
    assert_eq!(
        executor.wait(next).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    executor.shutdown().bounded().await.unwrap();

    let show = json(&["show", "1"], &at);
    assert_eq!(show["status"]["name"], "bypassed");
    assert_eq!(show["bypass"]["by"], "erin");
    assert_eq!(show["holds_locks"], false);
    let (ok, _, stderr) = procflow(&["show", "99"], &at);
    assert!(!ok && stderr.contains("no procedure #99"), "{stderr}");
    let missing = dir.path().join("nothing-here");
    let (ok, _, stderr) = procflow(&["list", "--store", missing.to_str().unwrap()], &[]);
    assert!(
        !ok && stderr.contains("holds no procflow store"),
        "{stderr}"
    );
}
