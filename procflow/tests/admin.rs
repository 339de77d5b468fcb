//! The admin API over real HTTP (ureq), and the admin page in a real browser: Debian's
//! headless Chromium driven through chromedriver (fantoccini), against a running executor
//! on a WAL directory.

mod common;

use common::Bounded;
use common::ops::{Job, Log, serve, start, three_jobs, until};
use fantoccini::{Client, ClientBuilder, Locator};
use procflow::ProcedureId;
use procflow::executor::{Outcome, Status};
use procflow::operator::Catalog;
use procflow::prelude::*;
use serde_json::{Value, json};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "t0ken-for-tests";

/// The admin API of one test: its base URL, called through a real HTTP client.
struct Api(String);

impl Api {
    fn of(server: &procflow::admin::AdminServer) -> Self {
        Self(format!("http://{}/api", server.local_addr()))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call(path, None).await
    }

    /// A POST with `Authorization: Bearer <token>` when a token is given.
    async fn post(&self, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        self.call(path, Some((token.map(str::to_owned), body)))
            .await
    }

    /// (status, JSON body), off the runtime (ureq blocks).
    async fn call(&self, path: &str, post: Option<(Option<String>, Value)>) -> (u16, Value) {
        let url = format!("{}{path}", self.0);
        tokio::task::spawn_blocking(move || {
            let agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build()
                .new_agent();
            let sent = match post {
                None => agent.get(&url).call(),
                Some((Some(token), body)) => agent
                    .post(&url)
                    .header("Authorization", format!("Bearer {token}"))
                    .send_json(&body),
                Some((None, body)) => agent.post(&url).send_json(&body),
            };
            let mut response = sent.unwrap();
            let status = response.status().as_u16();
            let text = response.body_mut().read_to_string().unwrap();
            let body = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{url} answered {status} {text:?}: {e}"));
            (status, body)
        })
        .await
        .unwrap()
    }
}

fn error(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_reads_live_records_and_carries_out_requests_with_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    let [alpha, beta, gamma] = three_jobs(&executor, &log).await;
    let (a, b) = (alpha.get(), beta.get());
    let server = serve(&executor, TOKEN).await;
    let api = Api::of(&server);

    // Reads.
    let (status, list) = api.get("/procedures").await;
    assert_eq!(status, 200);
    let ids_and_statuses: Vec<(u64, &str)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_u64().unwrap(),
                r["status"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    let expected = [(a, "suspended"), (b, "stuck"), (gamma.get(), "succeeded")];
    assert_eq!(ids_and_statuses, expected);
    let (_, stuck) = api.get("/procedures?status=stuck&machine=job").await;
    assert_eq!(stuck.as_array().unwrap().len(), 1);
    assert_eq!(
        stuck[0]["status"]["error"],
        "the region server refuses the commit"
    );
    assert!(stuck[0]["status"]["attempts"].as_u64().unwrap() >= 1);

    let (status, record) = api.get(&format!("/procedures/{a}")).await;
    assert_eq!(status, 200);
    assert_eq!(record["state"], "Wait");
    assert_eq!(
        record["status"],
        json!({"name": "suspended", "event": "go-alpha"})
    );
    assert_eq!(record["holds_locks"], true);
    let users = json!({"key": "tables/users", "mode": "Exclusive"});
    assert_eq!(record["locks"], json!([users]));
    let (status, missing) = api.get("/procedures/99").await;
    assert_eq!(
        (status, error(&missing)),
        (404, "the store holds no procedure #99")
    );
    let (status, unknown) = api.get("/nothing/here").await;
    assert_eq!(
        (status, error(&unknown)),
        (404, "no such page or endpoint: /api/nothing/here")
    );

    let (status, diagram) = api.get(&format!("/procedures/{a}/diagram")).await;
    assert_eq!(status, 200);
    let mermaid = diagram["mermaid"].as_str().unwrap();
    assert!(mermaid.contains("class Wait current"), "{mermaid}");
    let svg = diagram["svg"].as_str().unwrap();
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(
        svg.contains(r#"class="state current" data-state="Wait""#),
        "{svg}"
    );

    let (_, locks) = api.get("/locks").await;
    assert_eq!(locks["held"], json!([{"id": a, "lock": users}]));

    // The whole catalog reads back into a Catalog (what `procflow --url` does).
    let (_, catalog) = api.get("/catalog").await;
    let read: Catalog = serde_json::from_value(catalog).unwrap();
    let live = executor.catalog().await.unwrap();
    assert_eq!(read.records().len(), 3);
    for (read, live) in read.records().iter().zip(live.records()) {
        assert_eq!((read.id, &read.state), (live.id, &live.state));
        assert_eq!(read.status.name(), live.status.name());
        assert_eq!(
            (&read.history, read.submitted),
            (&live.history, live.submitted)
        );
    }
    assert!(read.machine("job").is_some());

    // Mutations need the token, and a bypass a reason; a bad body says what to send.
    let abort = format!("/procedures/{a}/abort");
    let (status, refused) = api.post(&abort, None, json!({})).await;
    assert_eq!(status, 401);
    assert!(error(&refused).contains("Authorization: Bearer"));
    assert_eq!(api.post(&abort, Some("guess"), json!({})).await.0, 401);
    let bypass = format!("/procedures/{b}/bypass");
    let (status, no_reason) = api.post(&bypass, Some(TOKEN), json!({"by": "ops"})).await;
    assert_eq!(
        (status, error(&no_reason)),
        (
            400,
            "a bypass needs a reason: it is recorded in the procedure's history"
        )
    );
    let (status, typo) = api.post(&bypass, Some(TOKEN), json!({"resaon": "x"})).await;
    assert_eq!(status, 400);
    assert!(error(&typo).contains("unknown field `resaon`"), "{typo}");
    assert!(matches!(
        executor.state(alpha).unwrap().status,
        Status::Suspended { .. }
    ));

    // With it: beta's abort is refused past its point of no return, its bypass is done,
    // alpha's abort rolls it back, a wake of an event nobody waits for does nothing.
    let (status, refused) = api
        .post(&format!("/procedures/{b}/abort"), Some(TOKEN), json!({}))
        .await;
    assert_eq!((status, &refused["outcome"]), (409, &json!("refused")));
    let ask = json!({"by": "ops", "reason": "committed by hand"});
    let done = json!({"outcome": "done", "procedures": 1});
    assert_eq!(
        api.post(&bypass, Some(TOKEN), ask).await,
        (200, done.clone())
    );
    assert_eq!(
        executor.wait(beta).bounded().await.unwrap(),
        Outcome::Bypassed
    );
    assert_eq!(
        api.post(&abort, Some(TOKEN), Value::Null).await,
        (200, done)
    );
    assert!(matches!(
        executor.wait(alpha).bounded().await.unwrap(),
        Outcome::RolledBack(_)
    ));
    assert_eq!(log.count("undo reserve alpha"), 1);
    let nobody = api
        .post("/events/nobody/wake", Some(TOKEN), json!({}))
        .await;
    assert_eq!(nobody, (200, json!({"outcome": "done", "procedures": 0})));
    let (status, _) = api
        .post("/procedures/99/abort", Some(TOKEN), json!({}))
        .await;
    assert_eq!(status, 404);

    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

#[tokio::test]
async fn without_a_token_the_admin_is_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    let id = executor.submit(Job::new("alpha")).await.unwrap();
    until(&executor, id, |s| matches!(s, Status::Suspended { .. })).await;
    let server = serve(&executor, "").await;
    let api = Api::of(&server);
    assert_eq!(api.get(&format!("/procedures/{}", id.get())).await.0, 200);
    let abort = format!("/procedures/{}/abort", id.get());
    let (status, refused) = api.post(&abort, Some("anything"), json!({})).await;
    assert_eq!(status, 403);
    assert!(error(&refused).contains("without a token"), "{refused}");
    assert!(matches!(
        executor.state(id).unwrap().status,
        Status::Suspended { .. }
    ));
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// Sends `head` (a request's start line and headers, without the blank line) and
/// `body` on a raw connection, and returns what the server answered within 3 s: the
/// status code and the whole answer.
/// A GET of `path` with `token` as a bearer token (none if empty), through [`raw`].
/// (The head is built before the future, which then borrows nothing.)
fn raw_get(
    addr: SocketAddr,
    path: &str,
    token: &str,
) -> impl std::future::Future<Output = (u16, String)> + use<> {
    let auth = if token.is_empty() {
        String::new()
    } else {
        format!("\r\nAuthorization: Bearer {token}")
    };
    let head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1{auth}");
    raw(addr, head, vec![])
}

async fn raw(addr: SocketAddr, head: String, body: Vec<u8>) -> (u16, String) {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        stream
            .write_all(format!("{head}\r\nConnection: close\r\n\r\n").as_bytes())
            .unwrap();
        // The server may answer, and close, before taking all of it.
        let _ = stream.write_all(&body);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"));
        (status, answer)
    })
    .await
    .unwrap()
}

/// Issue 32: only the allowed `Host` names are served (loopback by default), so a page
/// that rebinds its own name to this machine reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_a_host_not_allowed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    let server = procflow::admin::Admin::new(executor.clone())
        .allow_hosts(["Admin.Example"])
        .bind("127.0.0.1:0".parse().unwrap())
        .serve()
        .await
        .unwrap();
    let addr = server.local_addr();
    let port = addr.port();
    let get = |host: String| {
        raw(
            addr,
            format!("GET /api/procedures HTTP/1.1\r\nHost: {host}"),
            vec![],
        )
    };
    let (status, answer) = get(format!("rebound.example:{port}")).await;
    assert_eq!(status, 421, "{answer}");
    assert!(answer.contains("Admin::allow_hosts"), "{answer}");
    for allowed in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "admin.example".to_owned(),
    ] {
        assert_eq!(get(allowed.clone()).await.0, 200, "{allowed}");
    }
    let (status, _) = raw(addr, "GET / HTTP/1.1\r\nHost: evil.example".into(), vec![]).await;
    assert_eq!(status, 421, "the page too");
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// Issue 32: a mutation's token is checked before its body is read (a request without
/// it is answered while its body has not even been sent), and bodies are size-limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_checked_before_the_body_is_read_and_bodies_are_limited() {
    let (executor, _log, ids) = suspended_jobs(1).await;
    let id = ids[0];
    let server = serve(&executor, TOKEN).await;
    let addr = server.local_addr();
    let abort = |token: &str, length: usize| {
        format!(
            "POST /api/procedures/{}/abort HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Authorization: Bearer {token}\r\nContent-Type: application/json\r\n\
             Content-Length: {length}",
            id.get()
        )
    };
    // A megabyte announced, nothing sent: the answer comes from the headers alone.
    let started = Instant::now();
    let (status, answer) = raw(addr, abort("guess", 1 << 20), vec![]).await;
    assert_eq!(status, 401, "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "it waited for the body"
    );
    // With the token, a body over the limit is refused, and nothing is done.
    let (status, answer) = raw(addr, abort(TOKEN, 100_000), vec![b' '; 100_000]).await;
    assert_eq!(status, 413, "{answer}");
    assert!(matches!(
        executor.state(id).unwrap().status,
        Status::Suspended { .. }
    ));
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// Issue 32: a read token guards reads (the page stays open: it holds no data) and
/// cannot mutate; a write token reads too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_guards_reads_and_cannot_mutate() {
    let (executor, _log, ids) = suspended_jobs(1).await;
    let id = ids[0];
    let server = procflow::admin::Admin::new(executor.clone())
        .token(TOKEN)
        .read_token("r3ader")
        .bind("127.0.0.1:0".parse().unwrap())
        .serve()
        .await
        .unwrap();
    let addr = server.local_addr();
    let get = |path: &str, token: &str| raw_get(addr, path, token);
    assert_eq!(get("/api/procedures", "").await.0, 401);
    assert_eq!(get("/api/procedures", "wrong").await.0, 401);
    assert_eq!(get("/api/procedures", "r3ader").await.0, 200);
    assert_eq!(
        get(&format!("/api/procedures/{}", id.get()), TOKEN).await.0,
        200
    );
    assert_eq!(get("/", "").await.0, 200, "the page itself");
    let api = Api::of(&server);
    let abort = format!("/procedures/{}/abort", id.get());
    let (status, refused) = api.post(&abort, Some("r3ader"), json!({})).await;
    assert_eq!(status, 403);
    assert!(
        error(&refused).contains("may read, not mutate"),
        "{refused}"
    );
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// Issue 32: `/metrics` serves what the application's Prometheus recorder holds of
/// procflow's series, as a read (the read token guards it), and only when asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_from_the_applications_recorder() {
    // Installed before anything is submitted: every series below is recorded into it
    // (other tests of this binary may add to the counts, never take from them).
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    let (executor, _log, ids) = suspended_jobs(2).await;
    let plain = procflow::admin::Admin::new(executor.clone())
        .bind("127.0.0.1:0".parse().unwrap())
        .serve()
        .await
        .unwrap();
    let get = |addr: SocketAddr, token: &str| raw_get(addr, "/metrics", token);
    assert_eq!(get(plain.local_addr(), "").await.0, 404, "not asked for");
    plain.shutdown().bounded().await.unwrap();

    let server = procflow::admin::Admin::new(executor.clone())
        .token(TOKEN)
        .read_token("r3ader")
        .metrics(move || prometheus.render())
        .bind("127.0.0.1:0".parse().unwrap())
        .serve()
        .await
        .unwrap();
    let api = Api::of(&server);
    let abort = format!("/procedures/{}/abort", ids[0].get());
    assert_eq!(api.post(&abort, Some(TOKEN), json!({})).await.0, 200);
    until(&executor, ids[0], |s| matches!(s, Status::RolledBack)).await;
    assert_eq!(get(server.local_addr(), "").await.0, 401, "a read");
    let (status, answer) = get(server.local_addr(), "r3ader").await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{answer}"
    );
    let value = |series: &str| -> f64 {
        answer
            .lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {answer}"))
    };
    assert!(value("procflow_submitted_total{machine=\"job\"}") >= 2.0);
    assert!(value("procflow_rolled_back_total{machine=\"job\"}") >= 1.0);
    assert!(value("procflow_step_seconds_count{machine=\"job\"}") >= 2.0);
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// A machine whose data carries secrets: two fields are redacted for operators.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Account, name = "account", env = Log, redact = ["password", "card.number"])]
enum AccountState {
    #[initial]
    #[transition(to = [Open])]
    Wait,
    #[terminal]
    Open,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Account {
    name: String,
    password: String,
    card: Card,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Card {
    number: String,
    holder: String,
}

impl AccountStateHandlers for Account {
    async fn wait(&mut self, _: &Context<Log>) -> Step<account_state::Wait> {
        Ok(Flow::suspend("never"))
    }
    fn describe(&self) -> Option<String> {
        Some(format!("account {}", self.name))
    }
}

/// A machine whose data is secret as a whole.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Vault, name = "vault", env = Log, show_data = false)]
enum VaultState {
    #[initial]
    #[transition(to = [Sealed])]
    Wait,
    #[terminal]
    Sealed,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Vault {
    key: String,
}

impl VaultStateHandlers for Vault {
    async fn wait(&mut self, _: &Context<Log>) -> Step<vault_state::Wait> {
        Ok(Flow::suspend("never"))
    }
}

/// Issue 32: a procedure's data is shown as JSON (redacted fields replaced, a hiding
/// machine's not at all), with its own summary; neither changes what is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procedure_data_is_shown_redacted_or_hidden_as_its_machine_says() {
    let executor = procflow::executor::Executor::builder(
        Arc::new(procflow_store::MemStore::new()),
        Log::default(),
    )
    .register::<AccountState>()
    .register::<VaultState>()
    .start()
    .await
    .unwrap();
    let account = executor
        .submit(Account {
            name: "acme".into(),
            password: "hunter2".into(),
            card: Card {
                number: "4111 1111 1111 1111".into(),
                holder: "Ada".into(),
            },
        })
        .await
        .unwrap();
    let vault = executor
        .submit(Vault {
            key: "s3cr3t-key".into(),
        })
        .await
        .unwrap();
    for id in [account, vault] {
        until(&executor, id, |s| matches!(s, Status::Suspended { .. })).await;
    }
    let server = procflow::admin::Admin::new(executor.clone())
        .bind("127.0.0.1:0".parse().unwrap())
        .serve()
        .await
        .unwrap();
    let api = Api::of(&server);
    let (status, record) = api.get(&format!("/procedures/{}", account.get())).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(
        record["data"],
        json!({
            "name": "acme",
            "password": "[redacted]",
            "card": {"number": "[redacted]", "holder": "Ada"},
        })
    );
    assert_eq!(record["data_note"], Value::Null);
    assert_eq!(record["summary"], "account acme");
    assert!(!record.to_string().contains("hunter2"), "{record}");

    let (status, record) = api.get(&format!("/procedures/{}", vault.get())).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["data"], Value::Null);
    assert!(
        record["data_note"]
            .as_str()
            .is_some_and(|note| note.contains("show_data = false")),
        "{record}"
    );
    assert!(!record.to_string().contains("s3cr3t"), "{record}");
    assert_eq!(record["summary"], Value::Null, "it describes nothing");
    // What is stored is the whole data: the procedure still has its password.
    let stored = executor.record(account).await.unwrap().unwrap();
    assert_eq!(stored.summary.as_deref(), Some("account acme"));
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// Issue 32: who acted is the token's name, not what the body claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_token_decides_who_acted() {
    let (executor, _log, ids) = suspended_jobs(2).await;
    let server = procflow::admin::Admin::new(executor.clone())
        .named_token("alice", "al1ce-token")
        .bind("127.0.0.1:0".parse().unwrap())
        .serve()
        .await
        .unwrap();
    let api = Api::of(&server);
    let bypass = |id: ProcedureId| format!("/procedures/{}/bypass", id.get());
    let claims = json!({"by": "mallory", "reason": "by hand"});
    assert_eq!(
        api.post(&bypass(ids[0]), Some("al1ce-token"), claims)
            .await
            .0,
        200
    );
    let plain = json!({"reason": "by hand"});
    assert_eq!(
        api.post(&bypass(ids[1]), Some("al1ce-token"), plain)
            .await
            .0,
        200
    );
    for (id, who) in ids.iter().zip(["alice (as mallory)", "alice"]) {
        executor.wait(*id).bounded().await.unwrap();
        let (_, record) = api.get(&format!("/procedures/{}", id.get())).await;
        let text = record.to_string();
        assert!(text.contains(&format!("\"by\":\"{who}\"")), "{who}: {text}");
    }
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// Issue 32: every answer carries the Content-Security-Policy (the page runs only its
/// own script and styles, by hash) and the hardening headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_a_content_security_policy() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    let server = serve(&executor, TOKEN).await;
    let addr = server.local_addr();
    for path in ["/", "/api/procedures", "/api/nothing"] {
        let (_, answer) = raw(
            addr,
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1"),
            vec![],
        )
        .await;
        let answer = answer.to_ascii_lowercase();
        assert!(
            answer.contains("content-security-policy: default-src 'none'; script-src 'sha256-"),
            "{path}: {answer}"
        );
        assert!(answer.contains("x-content-type-options: nosniff"), "{path}");
        assert!(answer.contains("x-frame-options: deny"), "{path}");
    }
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// A store that counts its whole-store loads.
struct CountingLoads {
    inner: procflow_store::MemStore,
    loads: std::sync::atomic::AtomicUsize,
}

impl procflow_store::Store for CountingLoads {
    fn commit(
        &self,
        batch: procflow_store::Batch,
    ) -> procflow_store::BoxFuture<'_, Result<(), procflow_store::StoreError>> {
        self.inner.commit(batch)
    }
    fn load(
        &self,
    ) -> procflow_store::BoxFuture<'_, Result<procflow_store::Loaded, procflow_store::StoreError>>
    {
        self.loads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.load()
    }
    fn get(
        &self,
        id: u64,
    ) -> procflow_store::BoxFuture<
        '_,
        Result<Option<procflow_store::Record>, procflow_store::StoreError>,
    > {
        self.inner.get(id)
    }
    fn list(
        &self,
    ) -> procflow_store::BoxFuture<
        '_,
        Result<Vec<procflow_store::RecordInfo>, procflow_store::StoreError>,
    > {
        self.inner.list()
    }
    fn meta(
        &self,
        prefix: &str,
    ) -> procflow_store::BoxFuture<
        '_,
        Result<std::collections::BTreeMap<String, Vec<u8>>, procflow_store::StoreError>,
    > {
        self.inner.meta(prefix)
    }
    fn limits(&self) -> procflow_store::Limits {
        self.inner.limits()
    }
    fn close(&self) -> procflow_store::BoxFuture<'_, Result<(), procflow_store::StoreError>> {
        self.inner.close()
    }
}

/// Issue 32: one procedure's diagram is drawn from its record and its machine's graph,
/// read by key: opening a procedure never loads the whole store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diagram_is_drawn_without_loading_the_whole_store() {
    let store = Arc::new(CountingLoads {
        inner: procflow_store::MemStore::new(),
        loads: Default::default(),
    });
    let log = Log::default();
    let executor = procflow::executor::Executor::builder_shared(
        Arc::clone(&store) as Arc<dyn procflow_store::Store>,
        Arc::new(log.clone()),
    )
    .register::<common::ops::JobState>()
    .start()
    .await
    .unwrap();
    let id = executor.submit(Job::new("alpha")).await.unwrap();
    until(&executor, id, |s| matches!(s, Status::Suspended { .. })).await;
    let server = serve(&executor, TOKEN).await;
    let api = Api::of(&server);
    let before = store.loads.load(std::sync::atomic::Ordering::SeqCst);
    let (status, diagram) = api.get(&format!("/procedures/{}/diagram", id.get())).await;
    assert_eq!(status, 200, "{diagram}");
    assert!(
        diagram["svg"].as_str().unwrap().contains("current"),
        "{diagram}"
    );
    assert!(
        diagram["mermaid"].as_str().unwrap().contains("class "),
        "{diagram}"
    );
    assert_eq!(api.get("/procedures/999/diagram").await.0, 404);
    assert_eq!(
        store.loads.load(std::sync::atomic::Ordering::SeqCst),
        before,
        "drawing one procedure loaded the whole store"
    );
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// An executor of `JobState` on a `MemStore` (fast to fill) with `n` jobs suspended,
/// named `job-0` … `job-{n-1}`.
async fn suspended_jobs(n: usize) -> (procflow::executor::Executor<Log>, Log, Vec<ProcedureId>) {
    let log = Log::default();
    let executor = procflow::executor::Executor::builder(
        Arc::new(procflow_store::MemStore::new()),
        log.clone(),
    )
    .register::<common::ops::JobState>()
    .start()
    .await
    .unwrap();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(
            executor
                .submit(Job::new(&format!("job-{i}")))
                .await
                .unwrap(),
        );
    }
    for &id in [ids[0], ids[n - 1]].iter() {
        until(&executor, id, |s| matches!(s, Status::Suspended { .. })).await;
    }
    (executor, log, ids)
}

/// `GET /api/summaries` until `check` accepts an answer (the list may be up to a second
/// behind a busy executor).
async fn summaries(api: &Api, query: &str, check: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let (status, list) = api.get(&format!("/summaries?{query}")).await;
        assert_eq!(status, 200, "{list}");
        if check(&list) {
            return list;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{query}: {list}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 32: the list comes from the executor's memory, filtered, paged and counted on
/// the server; an unchanged list costs a comparison.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_is_filtered_paged_and_counted_on_the_server() {
    let (executor, _log, ids) = suspended_jobs(250).await;
    let server = serve(&executor, TOKEN).await;
    let api = Api::of(&server);
    let all_suspended = |list: &Value| list["counts"]["status"]["suspended"] == 250;
    let first = summaries(&api, "limit=100", all_suspended).await;
    assert_eq!(
        (first["total"].as_u64(), first["matched"].as_u64()),
        (Some(250), Some(250))
    );
    assert_eq!(first["counts"]["machine"]["job"], 250);
    let rows = first["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 100);
    assert_eq!(rows[0]["id"], ids[0].get());
    assert_eq!(rows[0]["detail"], "on go-job-0");
    assert!(
        rows[0].get("history").is_none(),
        "summary rows carry no history"
    );
    assert_eq!(first["next"], ids[99].get());
    let second = summaries(&api, &format!("limit=100&after={}", ids[99].get()), |_| {
        true
    })
    .await;
    assert_eq!(second["rows"][0]["id"], ids[100].get());
    let last = summaries(&api, &format!("limit=100&after={}", ids[199].get()), |_| {
        true
    })
    .await;
    assert_eq!(last["rows"].as_array().unwrap().len(), 50);
    assert!(last["next"].is_null());
    let newest = summaries(&api, "limit=1&order=desc", |_| true).await;
    assert_eq!(newest["rows"][0]["id"], ids[249].get());
    // Filters: text (an event name), status, machine and state.
    let one = summaries(&api, "q=GO-JOB-137", |_| true).await;
    assert_eq!(one["matched"], 1);
    assert_eq!(one["rows"][0]["id"], ids[137].get());
    let none = summaries(&api, "status=succeeded", |_| true).await;
    assert_eq!(
        (
            none["matched"].as_u64(),
            none["rows"].as_array().unwrap().len()
        ),
        (Some(0), 0)
    );
    let waits = summaries(
        &api,
        "machine=job&state=Wait&status=suspended&limit=5",
        |_| true,
    )
    .await;
    assert_eq!(waits["matched"], 250);
    // Unchanged since the version the caller shows: no rows. (The change count is the
    // process's: other tests' executors move it, and the list may be rebuilt between two
    // requests; a request right after the one that told the version gets the same.)
    let mut version = waits["version"].as_u64().unwrap();
    let mut unchanged = Value::Null;
    for _ in 0..20 {
        unchanged = summaries(&api, &format!("since={version}"), |_| true).await;
        if unchanged["unchanged"] == true {
            break;
        }
        version = unchanged["version"].as_u64().unwrap();
    }
    assert_eq!(unchanged, json!({"version": version, "unchanged": true}));
    // A change shows, within the second a busy list may lag.
    executor
        .request(procflow::operator::Request::new(
            procflow::operator::Action::Abort(ids[3].get()),
            "test",
            "",
        ))
        .await
        .unwrap();
    executor.wait(ids[3]).bounded().await.unwrap();
    let after = summaries(&api, "status=rolled-back", |l| l["matched"] == 1).await;
    assert_eq!(after["rows"][0]["id"], ids[3].get());
    // Bad input says what to send.
    let (status, bad) = api.get("/summaries?order=sideways").await;
    assert_eq!(status, 400);
    assert!(error(&bad).contains("`asc` or `desc`"), "{bad}");
    let (status, bad) = api.get("/summaries?colour=red").await;
    assert_eq!(status, 400);
    assert!(error(&bad).contains("the parameters are"), "{bad}");
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// Issue 32: after its first build, the list is brought up to date from the procedures
/// that changed (the executor notes them), not rebuilt: after wakes, aborts, new
/// procedures, stuck ones and retention's removals it shows exactly what the executor
/// does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_kept_up_to_date_from_changes_shows_what_the_executor_does() {
    let log = Log::default();
    let config = procflow::executor::Config {
        retention: Duration::from_secs(3),
        cleanup_interval: Duration::from_millis(100),
        ..procflow::executor::Config::default()
    };
    let executor = procflow::executor::Executor::builder(
        Arc::new(procflow_store::MemStore::new()),
        log.clone(),
    )
    .register::<common::ops::JobState>()
    .config(config)
    .start()
    .await
    .unwrap();
    let mut ids = Vec::new();
    for i in 0..300 {
        ids.push(
            executor
                .submit(Job::new(&format!("job-{i}")))
                .await
                .unwrap(),
        );
    }
    for &id in [ids[0], ids[299]].iter() {
        until(&executor, id, |s| matches!(s, Status::Suspended { .. })).await;
    }
    let server = serve(&executor, TOKEN).await;
    let api = Api::of(&server);
    summaries(&api, "limit=1", |l| l["total"] == 300).await; // The first, whole build.
    // Every kind of change: woken and done, aborted, new (in later chunks of ids), stuck;
    // the ended ones then leave the table with their retention.
    for i in 0..60 {
        log.let_go(&format!("job-{i}"));
        executor.wake(&format!("go-job-{i}")).await.unwrap();
    }
    for &id in &ids[60..90] {
        let abort = procflow::operator::Action::Abort(id.get());
        executor
            .request(procflow::operator::Request::new(abort, "test", ""))
            .await
            .unwrap();
    }
    for i in 300..400 {
        let job = Job::new(&format!("job-{i}"));
        let job = if i % 5 == 0 {
            log.let_go(&format!("job-{i}"));
            job.failing_commit()
        } else {
            job
        };
        ids.push(executor.submit(job).await.unwrap());
    }
    // The list sees them ended (then, below, gone).
    let started = Instant::now();
    let ended = |id| {
        executor
            .state(id)
            .is_none_or(|info| info.status.is_finished())
    };
    while !ids[..90].iter().all(|&id| ended(id)) {
        assert!(started.elapsed() < Duration::from_secs(20), "ending");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = summaries(&api, "limit=1&fresh=true", |_| true).await;
    let counts = &seen["counts"]["status"];
    assert_eq!(
        (&counts["succeeded"], &counts["rolled-back"]),
        (&json!(60), &json!(30))
    );
    while ids[..90].iter().any(|&id| executor.state(id).is_some()) {
        assert!(started.elapsed() < Duration::from_secs(20), "retention");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What the executor shows, and what the list shows.
    let want: Vec<String> = (ids.iter())
        .filter_map(|&id| executor.state(id))
        .map(|info| {
            format!(
                "{} {} {} {}",
                info.id.get(),
                info.state,
                info.status.name(),
                info.steps
            )
        })
        .collect();
    assert_eq!(want.len(), 310);
    let shown = |list: &Value| -> Vec<String> {
        let rows = list["rows"].as_array().unwrap().iter();
        let row = |r: &Value| {
            let field = |name: &str| r[name].as_str().map_or(r[name].to_string(), str::to_owned);
            let status = r["status"]["name"].as_str().unwrap_or_default().to_owned();
            format!(
                "{} {} {status} {}",
                field("id"),
                field("state"),
                field("steps")
            )
        };
        rows.map(row).collect()
    };
    let list = summaries(&api, "limit=1000", |list| shown(list) == want).await;
    assert_eq!(list["total"], 310);
    assert_eq!(list["counts"]["status"]["stuck"], 20);
    assert_eq!(list["counts"]["status"]["suspended"], 290);
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// Issue 32: the page over 100,000 procedures pages and filters on the server: it
/// filters to one, opens it, and aborts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_over_100000_procedures_filters_to_one_opens_it_and_aborts_it() {
    let driver = Driver::start();
    let (executor, log, ids) = suspended_jobs(100_000).await;
    let server = serve(&executor, TOKEN).await;
    let profile = tempfile::tempdir().unwrap();
    let browser = driver.browser(profile.path()).await;
    browser
        .goto(&format!("http://{}/", server.local_addr()))
        .await
        .unwrap();
    text_becomes(&browser, "#count", "(100000 matching of 100000)").await;
    let shown = browser
        .find_all(Locator::Css("#procedures tbody tr"))
        .await
        .unwrap();
    assert_eq!(shown.len(), 100, "one page, not the whole list");

    let needle = ids[77_777];
    type_into(&browser, "#filter", "go-job-77777").await;
    text_becomes(&browser, "#count", "(1 matching of 100000)").await;
    let row = format!("#procedures tr[data-id=\"{}\"]", needle.get());
    click(&browser, &format!("{row} td.id")).await;
    text_becomes(&browser, "#detail-title", &format!("{needle} job")).await;
    let current = attr(&browser, "#diagram svg g.state.current", "data-state").await;
    assert_eq!(current.as_deref(), Some("Wait"));
    // Its data, as JSON, and its own summary.
    text_becomes(&browser, "dd.field-summary", "job job-77777").await;
    let data = browser.find(Locator::Css("#data")).await.unwrap();
    let data: Value = serde_json::from_str(&data.text().await.unwrap()).unwrap();
    assert_eq!(
        data,
        json!({"name": "job-77777", "lock": null, "fail_commit": false})
    );

    let shot = browser.screenshot().await.unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("admin-page-100k.png");
    std::fs::write(&path, &shot).unwrap();
    eprintln!("screenshot: {}", path.display());

    type_into(&browser, "#token", TOKEN).await;
    type_into(&browser, "#reason", "found it").await;
    click(&browser, "#abort").await;
    text_becomes(&browser, "#action-result", "done for 1 procedure(s)").await;
    assert!(matches!(
        executor.wait(needle).bounded().await.unwrap(),
        Outcome::RolledBack(_)
    ));
    assert_eq!(log.count("undo reserve job-77777"), 1);
    // Rolled back, it no longer waits on its event: found by its status now.
    browser
        .find(Locator::Css("#filter"))
        .await
        .unwrap()
        .clear()
        .await
        .unwrap();
    browser
        .find(Locator::Css("#status-filter"))
        .await
        .unwrap()
        .select_by_label("rolled-back")
        .await
        .unwrap();
    text_becomes(&browser, "#count", "(1 matching of 100000)").await;
    text_becomes(&browser, &format!("{row} td.status"), "rolled-back").await;
    assert!(matches!(
        executor.state(ids[77_776]).unwrap().status,
        Status::Suspended { .. }
    ));

    browser.close().await.unwrap();
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}

/// chromedriver on a free port, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Self {
        for program in ["chromium", "chromedriver"] {
            let found = Command::new(program).arg("--version").output();
            assert!(
                found.is_ok_and(|out| out.status.success()),
                "`{program}` is not installed: the admin page is tested in Debian's headless \
                 Chromium. Install it with `sudo apt-get install -y chromium chromium-driver` \
                 (scripts/install-test-deps.sh does)"
            );
        }
        let port = procflow_store::free_local_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        while TcpStream::connect(addr).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("http://{addr}"),
        }
    }

    /// A headless Chromium session with a fresh profile, no network beyond localhost.
    async fn browser(&self, profile: &std::path::Path) -> Client {
        let options = json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1500,1000",
                format!("--user-data-dir={}", profile.display()),
            ],
        });
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".into(), options);
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .unwrap()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The text of the first element `css` finds, once it equals `want` (up to 10 s).
async fn text_becomes(browser: &Client, css: &str, want: &str) {
    let started = Instant::now();
    loop {
        let text = match browser.find(Locator::Css(css)).await {
            Ok(found) => found.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if text == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "`{css}` shows {text:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn click(browser: &Client, css: &str) {
    let found = browser.find(Locator::Css(css)).await.unwrap();
    found.click().await.unwrap();
}

async fn type_into(browser: &Client, css: &str, text: &str) {
    let found = browser.find(Locator::Css(css)).await.unwrap();
    found.send_keys(text).await.unwrap();
}

async fn attr(browser: &Client, css: &str, name: &str) -> Option<String> {
    let found = browser.wait().for_element(Locator::Css(css)).await.unwrap();
    found.attr(name).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_in_headless_chromium_shows_the_table_and_diagram_and_aborts() {
    let driver = Driver::start();
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let executor = start(dir.path(), &log).await;
    let [alpha, beta, gamma] = three_jobs(&executor, &log).await;
    let server = serve(&executor, TOKEN).await;
    let profile = tempfile::tempdir().unwrap();
    let browser = driver.browser(profile.path()).await;

    let page = format!(
        "http://{}/#/procedures/{}",
        server.local_addr(),
        alpha.get()
    );
    browser.goto(&page).await.unwrap();

    // The table: one row per procedure, the status coloured by its class.
    let row =
        |id: ProcedureId, cell: &str| format!("#procedures tr[data-id=\"{}\"] td.{cell}", id.get());
    text_becomes(&browser, &row(alpha, "status"), "suspended").await;
    text_becomes(&browser, &row(alpha, "state"), "Wait").await;
    text_becomes(&browser, &row(alpha, "detail"), "on go-alpha").await;
    text_becomes(&browser, &row(beta, "status"), "stuck").await;
    text_becomes(&browser, &row(gamma, "status"), "succeeded").await;
    text_becomes(&browser, &row(gamma, "machine"), "job").await;
    let badge = attr(&browser, &format!("{} span", row(beta, "status")), "class").await;
    assert_eq!(badge.as_deref(), Some("status status-stuck"));

    // The procedure view: its diagram drawn with the current state highlighted.
    text_becomes(&browser, "#detail-title", &format!("{alpha} job")).await;
    let current = attr(&browser, "#diagram svg g.state.current", "data-state").await;
    assert_eq!(current.as_deref(), Some("Wait"));
    let visited = browser
        .find_all(Locator::Css("#diagram g.state.visited"))
        .await
        .unwrap();
    let mut names = Vec::new();
    for state in visited {
        names.push(state.attr("data-state").await.unwrap().unwrap_or_default());
    }
    assert_eq!(names, ["Reserve"]);
    let fill = browser
        .execute(
            "return getComputedStyle(document.querySelector('#diagram g.state.current rect')).fill",
            vec![],
        )
        .await
        .unwrap();
    assert_ne!(
        fill.as_str(),
        Some("rgb(255, 255, 255)"),
        "the current state is not highlighted"
    );
    text_becomes(&browser, "#locks .lock-state", "held, for life").await;

    let shot = browser.screenshot().await.unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("admin-page.png");
    std::fs::write(&path, &shot).unwrap();
    assert!(shot.starts_with(b"\x89PNG"), "not a PNG");
    eprintln!("screenshot: {}", path.display());

    // Abort without the token is refused, and nothing happens.
    click(&browser, "#abort").await;
    let refused = browser
        .wait()
        .for_element(Locator::Css("#action-result.error"))
        .await
        .unwrap();
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("needs the admin token")
    );
    assert!(matches!(
        executor.state(alpha).unwrap().status,
        Status::Suspended { .. }
    ));

    // With it, the click rolls alpha back.
    type_into(&browser, "#token", TOKEN).await;
    type_into(&browser, "#reason", "wrong region").await;
    click(&browser, "#abort").await;
    text_becomes(&browser, "#action-result", "done for 1 procedure(s)").await;
    assert!(matches!(
        executor.wait(alpha).bounded().await.unwrap(),
        Outcome::RolledBack(_)
    ));
    assert_eq!(log.count("undo reserve alpha"), 1);
    text_becomes(&browser, &row(alpha, "status"), "rolled-back").await;
    text_becomes(
        &browser,
        "#history tbody tr:first-child td:last-child",
        "ended",
    )
    .await;
    let history = browser
        .find(Locator::Css("#history"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(history.contains("Reserve rollback undone"), "{history}");

    browser.close().await.unwrap();
    server.shutdown().bounded().await.unwrap();
    executor.shutdown().bounded().await.unwrap();
}
