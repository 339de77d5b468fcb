//! `procflow --url`: the CLI through a running executor's admin API, whose requests are
//! carried out at once (the executor keeps its store locked all along).

mod common;

use common::Bounded;
use common::ops::{Log, serve, start, three_jobs};
use procflow::executor::{Outcome, Status};
use serde_json::Value;
use std::process::Command;

const TOKEN: &str = "cli-t0ken";

/// Runs `procflow ARGS --url URL` off the runtime: (success, stdout, stderr).
async fn procflow(args: &[&str], url: &str) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_procflow"));
    command
        .args(args)
        .arg("--url")
        .arg(url)
        .env_remove("PROCFLOW_TOKEN");
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_reads_and_acts_through_the_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    let [alpha, beta, _] = three_jobs(&executor, &log).await;
    let server = serve(&executor, TOKEN).await;
    let url = format!("http://{}", server.local_addr());

    // Reads: the live view, as JSON and as tables.
    let (ok, out, err) = procflow(&["list", "--json"], &url).await;
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    let statuses: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["suspended", "stuck", "succeeded"]);
    let (ok, out, _) = procflow(&["list", "--status", "stuck"], &url).await;
    assert!(
        ok && out.contains("Commit") && !out.contains("Wait"),
        "{out}"
    );
    let (ok, out, _) = procflow(&["diagram", &alpha.get().to_string()], &url).await;
    assert!(ok && out.contains("class Wait current"), "{out}");
    let (ok, out, _) = procflow(&["locks"], &url).await;
    assert!(ok && out.contains("tables/users"), "{out}");
    let (ok, _, err) = procflow(&["show", "99"], &url).await;
    assert!(!ok && err.contains("no procedure #99"), "{err}");

    // Writes need the token, and are carried out before the CLI returns.
    let (ok, _, err) = procflow(&["abort", &alpha.get().to_string()], &url).await;
    assert!(!ok && err.contains("--token"), "{err}");
    assert!(matches!(
        executor.state(alpha).unwrap().status,
        Status::Suspended { .. }
    ));
    let (ok, _, err) = procflow(&["abort", &beta.get().to_string(), "--token", TOKEN], &url).await;
    assert!(!ok && err.contains("refused"), "{err}");
    let bypass = [
        "bypass",
        "--status",
        "stuck",
        "--reason",
        "fixed by hand",
        "--token",
        TOKEN,
    ];
    let (ok, out, err) = procflow(&bypass, &url).await;
    assert!(ok, "{err}");
    assert!(out.contains("done for 1 procedure(s)"), "{out}");
    assert_eq!(
        executor.wait(beta).bounded().await.unwrap(),
        Outcome::Bypassed
    );
    let abort = [
        "abort",
        &alpha.get().to_string(),
        "--token",
        TOKEN,
        "--reason",
        "wrong table",
    ];
    let (ok, _, err) = procflow(&abort, &url).await;
    assert!(ok, "{err}");
    assert!(matches!(
        executor.wait(alpha).bounded().await.unwrap(),
        Outcome::RolledBack(_)
    ));
    assert_eq!(log.count("undo reserve alpha"), 1);

    let (ok, _, err) = procflow(&["list"], "http://127.0.0.1:9").await;
    assert!(!ok && err.contains("cannot reach the admin API"), "{err}");

    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}
