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
    // A list right after shows it: the CLI asks for a list with every change so far,
    // not the one the polling pages share (which may be a rebuild behind).
    let (ok, out, err) = procflow(&["list", "--status", "rolled-back"], &url).await;
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|line| line.starts_with(&format!("{} ", alpha.get()))),
        "{out}"
    );

    let (ok, _, err) = procflow(&["list"], "http://127.0.0.1:9").await;
    assert!(!ok && err.contains("cannot reach the admin API"), "{err}");

    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// Issue 32: the CLI uses the endpoints the page uses (the list from memory, one
/// procedure by key), never the whole catalog, which reads the whole store: its reads,
/// and its writes, whether they name ids or select by filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_reads_use_the_list_and_by_key_endpoints_not_the_catalog() {
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    let [alpha, beta, _] = three_jobs(&executor, &log).await;
    // The admin's router, behind a layer that records every path asked.
    let asked = Arc::new(Mutex::new(Vec::<String>::new()));
    let recorder = Arc::clone(&asked);
    let app = procflow::admin::Admin::new(executor.clone())
        .token(TOKEN)
        .router()
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let recorder = Arc::clone(&recorder);
                async move {
                    let path = request.uri().path().to_owned();
                    recorder.lock().unwrap().push(path);
                    next.run(request).await
                }
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let served = tokio::spawn(async move { axum::serve(listener, app).await });

    let id = alpha.get().to_string();
    for args in [
        &["list"][..],
        &["list", "--status", "suspended", "--older-than", "0s"],
        &["show", &id],
        &["history", &id],
        &["diagram", &id],
        &["locks"],
    ] {
        let (ok, out, err) = procflow(args, &url).await;
        assert!(ok && !out.is_empty(), "{args:?}: {err}");
    }
    let (_, shown, _) = procflow(&["show", &id], &url).await;
    assert!(shown.contains("summary      job alpha"), "{shown}");
    let (_, listed, _) = procflow(&["list", "--status", "suspended"], &url).await;
    assert!(
        listed.contains("UPDATED") && listed.contains("on go-alpha"),
        "{listed}"
    );
    // Writes: by id, and in bulk by filter (which selects from the list, and only the
    // procedures that have not ended).
    let beta_id = beta.get().to_string();
    let bypass = ["bypass", &beta_id, "--reason", "by hand", "--token", TOKEN];
    let (ok, out, err) = procflow(&bypass[..], &url).await;
    assert!(ok && out.contains("done for 1 procedure(s)"), "{out} {err}");
    assert_eq!(
        executor.wait(beta).bounded().await.unwrap(),
        Outcome::Bypassed
    );
    let bulk = [
        "abort",
        "--status",
        "suspended",
        "--machine",
        "job",
        "--older-than",
        "0s",
        "--token",
        TOKEN,
        "--reason",
        "bulk",
    ];
    let (ok, out, err) = procflow(&bulk, &url).await;
    assert!(ok && out.contains("done for 1 procedure(s)"), "{out} {err}");
    assert!(matches!(
        executor.wait(alpha).bounded().await.unwrap(),
        Outcome::RolledBack(_)
    ));
    let (ok, _, err) = procflow(&["abort", "--status", "succeeded", "--token", TOKEN], &url).await;
    assert!(
        !ok && err.contains("no procedure matches"),
        "ended ones are not selected: {err}"
    );
    let (ok, _, err) = procflow(&["abort", "99", "--token", TOKEN], &url).await;
    assert!(!ok && err.contains("no procedure #99"), "{err}");
    let asked = asked.lock().unwrap().clone();
    assert!(!asked.iter().any(|p| p == "/api/catalog"), "{asked:?}");
    assert!(!asked.iter().any(|p| p == "/api/procedures"), "{asked:?}");
    for used in [
        "/api/summaries".to_owned(),
        format!("/api/procedures/{id}"),
        format!("/api/procedures/{id}/diagram"),
        "/api/locks".to_owned(),
    ] {
        assert!(asked.contains(&used), "{used} in {asked:?}");
    }
    served.abort();
    executor.shutdown().bounded().await.unwrap();
}
