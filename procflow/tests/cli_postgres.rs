//! `procflow --postgres`: the CLI reads a PostgreSQL store while an executor runs on it
//! (a real server on 127.0.0.1, started by `LocalPostgres`; `sudo apt-get install -y
//! postgresql` if it is missing), leaves requests the running executor carries out, and
//! says what is wrong with a schema that holds no store.

mod common;

use common::Bounded;
use common::ops::{Job, Log, start_on, until};
use procflow::executor::{Outcome, Status};
use procflow::store::Store;
use procflow::store::postgres::{LocalPostgres, PgConfig, PgStore};
use serde_json::Value;
use std::process::Command;
use std::sync::Arc;

/// Runs the CLI; `(succeeded, stdout, stderr)`.
fn procflow(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_procflow"))
        .args(args)
        .output()
        .unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

/// `args` on the store, with `--json`, parsed.
fn json(args: &[&str], connection: &str) -> Value {
    let mut all = args.to_vec();
    all.extend(["--postgres", connection, "--schema", "ops", "--json"]);
    let (ok, stdout, stderr) = procflow(&all);
    assert!(ok, "procflow {args:?} failed: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_reads_a_postgres_store_beside_its_executor_and_leaves_requests_it_carries_out() {
    let server = LocalPostgres::start().unwrap_or_else(|e| panic!("{e}"));
    let connection = server.connection_string();
    let config = PgConfig::new(connection.clone(), "ops");
    let store: Arc<dyn Store> = Arc::new(PgStore::connect(config).await.unwrap());
    let log = Log::default();
    let executor = start_on(Arc::clone(&store), &log).await;
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

    // What the executor stored, read from outside it while it runs.
    let list = json(&["list"], &connection);
    let rows = list.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{list}");
    assert_eq!(rows[0]["state"], "Commit");
    assert_eq!(rows[0]["status"]["name"], "stuck");
    assert_eq!(rows[1]["status"]["name"], "suspended");
    assert_eq!(rows[1]["status"]["event"], "go-waiting");
    let only_stuck = json(&["list", "--status", "stuck"], &connection);
    assert_eq!(only_stuck.as_array().unwrap().len(), 1);
    let show = json(&["show", "1"], &connection);
    assert_eq!(show["machine"], "job");
    assert_eq!(show["summary"], "job stuck");
    assert_eq!(show["locks"][0]["key"], "ns/t1");
    let history = json(&["history", "1"], &connection);
    assert_eq!(history[0]["outcome"], "Moved", "{history}");
    let at = ["--postgres", connection.as_str(), "--schema", "ops"];
    let (ok, diagram, stderr) = procflow(&[&["diagram", "1"][..], &at].concat());
    assert!(ok, "{stderr}");
    assert!(diagram.contains("class Commit current"), "{diagram}");
    let (ok, locks, stderr) = procflow(&[&["locks"][..], &at].concat());
    assert!(ok && locks.contains("ns/t1"), "{locks}{stderr}");

    // Requests left in the shared store: the running executor finds them within its
    // request poll and carries them out.
    let bypass = ["bypass", "1", "--by", "erin", "--reason", "fixed by hand"];
    let (ok, stdout, stderr) = procflow(&[&bypass[..], &at].concat());
    assert!(ok, "{stderr}");
    assert!(stdout.contains("stored procflow/request/"), "{stdout}");
    assert!(stdout.contains("within its request poll"), "{stdout}");
    let abort = ["abort", "--status", "suspended", "--by", "erin"];
    let (ok, _, stderr) = procflow(&[&abort[..], &at].concat());
    assert!(ok, "{stderr}");
    assert_eq!(
        executor.wait(stuck).bounded().await.unwrap(),
        Outcome::Bypassed
    );
    assert!(matches!(
        executor.wait(waiting).bounded().await.unwrap(),
        Outcome::RolledBack(_)
    ));
    // Stuck, it kept retrying `Commit` every few milliseconds; bypassed, it runs nothing.
    let commits = log.count("commit stuck");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        log.count("commit stuck"),
        commits,
        "a bypass runs no handler"
    );
    let show = json(&["show", "1"], &connection);
    assert_eq!(show["status"]["name"], "bypassed");
    assert_eq!(show["bypass"]["by"], "erin");
    assert_eq!(show["holds_locks"], false);
    let (ok, _, stderr) = procflow(&[&["abort", "99"][..], &at].concat());
    assert!(!ok && stderr.contains("no procedure #99"), "{stderr}");

    // Wrong or missing places say what to write.
    let missing = [
        "--postgres",
        connection.as_str(),
        "--schema",
        "nothing_here",
    ];
    let (ok, _, stderr) = procflow(&[&["list"][..], &missing].concat());
    assert!(
        !ok && stderr.contains("holds no procflow store"),
        "{stderr}"
    );
    let (ok, _, stderr) = procflow(&[&["wake", "go"][..], &missing].concat());
    assert!(
        !ok && stderr.contains("holds no procflow store"),
        "{stderr}"
    );
    let client = PgConfig::new(connection.clone(), "ops")
        .connect()
        .await
        .unwrap();
    let made = "SELECT count(*) FROM pg_namespace WHERE nspname = 'nothing_here'";
    let count: i64 = client.query_one(made, &[]).await.unwrap().get(0);
    assert_eq!(count, 0, "a mistyped schema was created");
    let (ok, _, stderr) = procflow(&["list", "--postgres", &connection]);
    assert!(!ok && stderr.contains("give --schema NAME"), "{stderr}");
    let (ok, _, stderr) = procflow(&["list", "--store", "/nonexistent", "--schema", "ops"]);
    assert!(
        !ok && stderr.contains("--schema names the schema of a --postgres store"),
        "{stderr}"
    );
    let (ok, _, stderr) = procflow(&[
        "list",
        "--postgres",
        "host=127.0.0.1 port=1",
        "--schema",
        "ops",
    ]);
    assert!(
        !ok && stderr.contains("port=1") && stderr.contains("Connection refused"),
        "names where it looked: {stderr}"
    );

    executor.shutdown().bounded().await.unwrap();
}
