//! The `procflow` CLI end to end, on a real WAL directory: read commands beside a running
//! executor, a bypass stored on the stopped store and carried out at the next start.

mod common;

use common::Bounded;
use common::ops::{Job, Log, start, until};
use procflow::executor::{Outcome, Status};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn procflow(args: &[&str], store: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_procflow"))
        .args(args)
        .arg("--store")
        .arg(store)
        .output()
        .unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

fn json(args: &[&str], store: &Path) -> Value {
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let (ok, stdout, stderr) = procflow(&with_json, store);
    assert!(ok, "procflow {args:?} failed: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_reads_a_live_store_and_bypasses_a_stuck_procedure_on_a_stopped_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path();
    let log = Log::default();
    let executor = start(store, &log).await;
    log.let_go("stuck");
    let stuck = executor
        .submit(Job::new("stuck").locking("ns/t1").failing_commit())
        .await
        .unwrap();
    let waiting = executor.submit(Job::new("waiting")).await.unwrap();
    until(&executor, stuck, |s| matches!(s, Status::Stuck { .. })).await;
    until(&executor, waiting, |s| {
        matches!(s, Status::Suspended { .. })
    })
    .await;

    // Read while the executor runs (it holds the store's lock).
    let list = json(&["list"], store);
    let rows = list.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{list}");
    assert_eq!(rows[0]["state"], "Commit");
    assert_eq!(rows[0]["status"]["name"], "stuck");
    assert_eq!(
        rows[0]["status"]["error"],
        "the region server refuses the commit"
    );
    assert_eq!(rows[1]["status"]["name"], "suspended");
    assert_eq!(rows[1]["status"]["event"], "go-waiting");
    let only_stuck = json(&["list", "--status", "stuck"], store);
    assert_eq!(only_stuck.as_array().unwrap().len(), 1);
    assert_eq!(
        json(&["list", "--machine", "other"], store),
        Value::Array(vec![])
    );

    let show = json(&["show", "1"], store);
    assert_eq!(show["machine"], "job");
    assert_eq!(show["locks"][0]["key"], "ns/t1");
    assert_eq!(show["holds_locks"], true);
    assert_eq!(
        show["attempts"], 1,
        "stored when it became stuck: its first fatal failure"
    );
    let history = json(&["history", "1"], store);
    let outcomes: Vec<&Value> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["outcome"])
        .collect();
    assert_eq!(outcomes[0], "Moved", "{history}");
    assert!(
        outcomes
            .iter()
            .any(|o| o["Retried"] == "the region server refuses the commit"),
        "{history}"
    );
    let (ok, diagram, _) = procflow(&["diagram", "1"], store);
    assert!(ok && diagram.starts_with("stateDiagram-v2"), "{diagram}");
    assert!(diagram.contains("class Commit current"), "{diagram}");
    assert!(diagram.contains("class Reserve,Wait visited"), "{diagram}");
    let (ok, locks, _) = procflow(&["locks"], store);
    assert!(
        ok && locks.contains("ns/t1") && locks.contains("exclusive"),
        "{locks}"
    );
    let (ok, table, _) = procflow(&["list"], store);
    assert!(
        ok && table.starts_with("ID") && table.contains("stuck"),
        "{table}"
    );
    let (ok, shown, _) = procflow(&["show", "1"], store);
    assert!(
        ok && shown.contains("\n  #1 job ") && !shown.contains("##"),
        "{shown}"
    );
    // Issue 32: the procedure's own summary (`describe`), stored with its record, read
    // by a CLI that has none of the procedure's types.
    assert!(shown.contains("\nsummary      job stuck\n"), "{shown}");
    assert_eq!(json(&["show", "2"], store)["summary"], "job waiting");

    // A write needs the store stopped: the running executor holds it.
    let (ok, _, stderr) = procflow(&["bypass", "1", "--reason", "fixed by hand"], store);
    assert!(
        !ok && stderr.contains("an executor runs on this store"),
        "{stderr}"
    );
    let commits = log.count("commit stuck");
    executor.kill();
    drop(executor);

    let (ok, _, stderr) = procflow(&["bypass", "1"], store);
    assert!(!ok && stderr.contains("--reason"), "{stderr}");
    let (ok, stdout, stderr) = procflow(
        &["bypass", "1", "--by", "erin", "--reason", "fixed by hand"],
        store,
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("stored procflow/request/"), "{stdout}");
    let (ok, _, stderr) = procflow(&["abort", "--status", "suspended", "--by", "erin"], store);
    assert!(ok, "{stderr}");

    // The next start carries both out: the stuck one does not run again, its lock is free.
    let executor = start(store, &log).await;
    assert_eq!(
        executor.wait(stuck).bounded().await.unwrap(),
        Outcome::Bypassed
    );
    assert!(matches!(
        executor.wait(waiting).bounded().await.unwrap(),
        Outcome::RolledBack(_)
    ));
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

    let show = json(&["show", "1"], store);
    assert_eq!(show["status"]["name"], "bypassed");
    assert_eq!(show["bypass"]["by"], "erin");
    assert_eq!(show["holds_locks"], false);
    let (ok, _, stderr) = procflow(&["show", "99"], store);
    assert!(!ok && stderr.contains("no procedure #99"), "{stderr}");
    let missing = dir.path().join("nothing-here");
    let (ok, _, stderr) = procflow(&["list"], &missing);
    assert!(
        !ok && stderr.contains("holds no procflow store"),
        "{stderr}"
    );
}
