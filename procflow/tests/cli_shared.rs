//! `procflow --postgres` and `procflow --etcd`: the CLI reads a shared store while an
//! executor runs on it, leaves requests that the running executor carries out, and says
//! what is wrong with a place that holds no store. On real servers on 127.0.0.1, started
//! per test (`LocalPostgres`: `sudo apt-get install -y postgresql`; `LocalCluster`:
//! `sudo apt-get install -y etcd-server`; `scripts/install-test-deps.sh` installs both).

mod common;
#[path = "common/cli.rs"]
mod run;

use common::Bounded;
use common::ops::{Log, bypassed_and_rolled_back, start_on, stuck_and_waiting};
use procflow::store::Store;
use procflow::store::etcd::{EtcdConfig, EtcdStore, LocalCluster};
use procflow::store::postgres::{LocalPostgres, PgConfig, PgStore};
use run::{json, procflow, reads_stuck_and_waiting};
use std::sync::Arc;
use std::time::Duration;

/// The same on every shared store: an executor on `store` makes a stuck and a suspended
/// procedure; the CLI at `place` reads them, and bypasses and aborts them through requests
/// the executor carries out. At `nowhere` (the same server, a place with no store) it says
/// so and leaves nothing.
async fn reads_and_leaves_requests(store: Arc<dyn Store>, place: &[&str], nowhere: &[&str]) {
    let log = Log::default();
    let executor = start_on(Arc::clone(&store), &log).await;
    let (stuck, waiting) = stuck_and_waiting(&executor, &log).await;

    // What the executor stored, read from outside it while it runs.
    reads_stuck_and_waiting(place);

    // Requests left in the shared store: the running executor finds them within its
    // request poll and carries them out.
    let bypass = ["bypass", "1", "--by", "erin", "--reason", "fixed by hand"];
    let (ok, stdout, stderr) = procflow(&bypass, place);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("stored procflow/request/"), "{stdout}");
    assert!(stdout.contains("within its request poll"), "{stdout}");
    let (ok, _, stderr) = procflow(&["abort", "--status", "suspended", "--by", "erin"], place);
    assert!(ok, "{stderr}");
    bypassed_and_rolled_back(&executor, stuck, waiting).await;
    // Stuck, it kept retrying `Commit` every few milliseconds; bypassed, it runs nothing.
    let commits = log.count("commit stuck");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        log.count("commit stuck"),
        commits,
        "a bypass runs no handler"
    );
    let show = json(&["show", "1"], place);
    assert_eq!(show["status"]["name"], "bypassed");
    assert_eq!(show["bypass"]["by"], "erin");
    assert_eq!(show["holds_locks"], false);
    let (ok, _, stderr) = procflow(&["abort", "99"], place);
    assert!(!ok && stderr.contains("no procedure #99"), "{stderr}");

    // A place that holds no store: reads and writes say so, and nothing is made there.
    for command in [&["list"][..], &["wake", "go"]] {
        let (ok, _, stderr) = procflow(command, nowhere);
        assert!(
            !ok && stderr.contains("holds no procflow store"),
            "{stderr}"
        );
    }
    executor.shutdown().bounded().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_the_cli_reads_beside_the_executor_and_leaves_requests_it_carries_out() {
    let server = LocalPostgres::start().unwrap_or_else(|e| panic!("{e}"));
    let connection = server.connection_string();
    let config = PgConfig::new(connection.clone(), "ops");
    let store: Arc<dyn Store> = Arc::new(PgStore::connect(config.clone()).await.unwrap());
    let place = ["--postgres", &connection, "--schema", "ops"];
    let nowhere = ["--postgres", &connection, "--schema", "nothing_here"];
    reads_and_leaves_requests(store, &place, &nowhere).await;

    let client = config.connect().await.unwrap();
    let made = "SELECT count(*) FROM pg_namespace WHERE nspname = 'nothing_here'";
    let count: i64 = client.query_one(made, &[]).await.unwrap().get(0);
    assert_eq!(count, 0, "a mistyped schema was created");
    let (ok, _, stderr) = procflow(&["list", "--postgres", &connection], &[]);
    assert!(!ok && stderr.contains("give --schema NAME"), "{stderr}");
    let (ok, _, stderr) = procflow(&["list", "--store", "/nonexistent", "--schema", "ops"], &[]);
    assert!(
        !ok && stderr.contains("--schema names the schema of a --postgres store"),
        "{stderr}"
    );
    let refused = ["--postgres", "host=127.0.0.1 port=1", "--schema", "ops"];
    let (ok, _, stderr) = procflow(&["list"], &refused);
    assert!(
        !ok && stderr.contains("port=1") && stderr.contains("Connection refused"),
        "names where it looked, and why it failed: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_the_cli_reads_beside_the_executor_and_leaves_requests_it_carries_out() {
    let cluster = LocalCluster::start(1).unwrap_or_else(|e| panic!("{e}"));
    let endpoints = cluster.endpoints().join(",");
    let config = EtcdConfig::new(cluster.endpoints(), "/ops");
    let store = EtcdStore::connect(config).await.unwrap();
    let client = store.client();
    let store: Arc<dyn Store> = Arc::new(store);
    let place = ["--etcd", &endpoints, "--prefix", "/ops"];
    let nowhere = ["--etcd", &endpoints, "--prefix", "/nothing-here"];
    reads_and_leaves_requests(store, &place, &nowhere).await;

    let mut kv = client.kv_client();
    let options = procflow::store::etcd::etcd_client::GetOptions::new().with_prefix();
    let under = kv.get("/nothing-here", Some(options)).await.unwrap();
    assert_eq!(under.kvs().len(), 0, "a mistyped prefix was written to");
    let (ok, _, stderr) = procflow(&["list", "--etcd", &endpoints], &[]);
    assert!(!ok && stderr.contains("give --prefix PREFIX"), "{stderr}");
    let (ok, _, stderr) = procflow(
        &["list", "--store", "/nonexistent", "--prefix", "/ops"],
        &[],
    );
    assert!(
        !ok && stderr.contains("--prefix names the prefix of an --etcd store"),
        "{stderr}"
    );
}
