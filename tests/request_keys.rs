//! Operators' requests never overwrite each other (issue 29, point 9).
//!
//! Two processes in separate PID namespaces (both pid 1, as two containers are) leave a
//! request each in one etcd store, in the same millisecond. Keys used to be
//! `<at_ms>-<pid>-<n>`, written with a blind put: the second overwrote the first. Now a
//! key ends in a random tag and is written create-only: both requests are stored.
//!
//! Needs `etcd` (`sudo apt-get install -y etcd-server`) and `unshare` (util-linux) with
//! the right to make PID namespaces (root, as in CI).

#![cfg(unix)]

use procflow_store::Store;
use procflow_store::etcd::{EtcdConfig, EtcdStore, LocalCluster};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

const PREFIX: &str = "/requests/same-ms";
/// Pairs of writers; each pair aims at one millisecond, and at least one must hit it.
const ROUNDS: usize = 3;

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

/// Runs two writers, both pid 1, aiming at one millisecond; returns their keys.
fn pair(endpoints: &str, round: usize) -> [String; 2] {
    let at_ms = now_ms() + 1_500;
    let writers = ["a", "b"].map(|writer| {
        Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child"])
            .arg(env!("CARGO_BIN_EXE_request_writer"))
            .args(["--endpoints", endpoints, "--prefix", PREFIX])
            .args(["--at-ms", &at_ms.to_string()])
            .args(["--event", &format!("{writer}{round}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run `unshare` (util-linux): {e}"))
    });
    writers.map(|writer| {
        let output = writer.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "a writer failed (unshare needs the right to make PID namespaces): {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.starts_with("pid 1 "), "not pid 1: {stdout}");
        stdout.trim().rsplit(' ').next().unwrap().to_owned()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p9_two_writers_with_one_pid_in_one_millisecond_both_store_their_request() {
    let cluster = LocalCluster::start(1).unwrap_or_else(|e| panic!("{e}"));
    let endpoints = cluster.endpoints().join(",");
    // The key's time part: the millisecond the request was made in.
    let millisecond = |key: &str| key.rsplit('/').next().unwrap()[..16].to_owned();
    let mut same_ms = 0;
    for round in 0..ROUNDS {
        let keys = pair(&endpoints, round);
        println!("round {round}: {keys:?}");
        same_ms += usize::from(millisecond(&keys[0]) == millisecond(&keys[1]));
    }
    assert!(
        same_ms > 0,
        "no pair wrote in one millisecond: the test could not tell"
    );
    let store = EtcdStore::connect(EtcdConfig::new(cluster.endpoints(), PREFIX))
        .await
        .unwrap();
    let requests = store.meta("procflow/request/").await.unwrap();
    assert_eq!(
        requests.len(),
        2 * ROUNDS,
        "requests overwrote each other ({same_ms} pairs in one millisecond): {:?}",
        requests.keys().collect::<Vec<_>>()
    );
}
