//! Workload 9 (issue 32): the admin over a million procedures (`cargo bench --bench
//! compare -- --admin`, root feature `admin`; `--quick`: 100,000).
//!
//! * The store: a WAL holding that many parked procedures (workload 6's machine), and the
//!   executor that runs them, serving its admin on loopback.
//! * `list_p99_ms`: the p99 latency of a filtered first page (`GET /api/summaries?
//!   status=suspended&q=…&limit=100`, 200 requests one after the other), over HTTP, as
//!   a page that polls one filter asks it.
//! * For the record, not in the summary line: the same with a filter never asked before
//!   at each request (`q=never-7`, `never-70`, `never-71`, …), whose match count takes a
//!   pass over every row (a page that polls one filter pays that once per snapshot).
//! * `commits_polled_vs_quiet`: durable steps/s of 256 closed-loop clients of the
//!   ten-step machine while four pages poll the list every second (as the page does:
//!   with `since`, a full answer whenever something changed, which at this rate is every
//!   time), divided by the same with no poll. The two sides take turns (`alternate`, ten
//!   rounds of 2 s each).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use procflow::admin::Admin;
use procflow::executor::Executor;
use procflow::store::{WalConfig, WalStore};
use tokio::runtime::Runtime;

use crate::drive::{alternate, run_procedures};
use crate::machine::TenSteps;
use crate::parked::{self, FiveUpdates};

/// The figures of the `admin-summary` line.
pub struct Summary {
    pub list_p99_ms: f64,
    pub commits_polled_vs_quiet: f64,
}

impl Summary {
    pub fn line(&self) -> String {
        format!(
            "admin-summary: list_p99_ms={:.1} commits_polled_vs_quiet={:.2}",
            self.list_p99_ms, self.commits_polled_vs_quiet
        )
    }
}

pub fn run(quick: bool, runtime: &Runtime) -> Summary {
    let procedures: u64 = if quick { 100_000 } else { 1_000_000 };
    let dir = tempfile::tempdir().expect("a temp dir");
    runtime.block_on(async {
        let store = Arc::new(WalStore::open(dir.path(), WalConfig::default()).expect("open"));
        let executor = Executor::builder(store, ())
            .register::<FiveUpdates>()
            .register::<TenSteps>()
            .config(parked::config(procedures))
            .start()
            .await
            .expect("start the executor");
        let filling = Instant::now();
        parked::populate(&executor, 0, procedures, 256, |_| true).await;
        println!(
            "{procedures} parked procedures in {:.1} s",
            filling.elapsed().as_secs_f64()
        );
        let server = Admin::new(executor.clone())
            .bind("127.0.0.1:0".parse().expect("an address"))
            .serve()
            .await
            .expect("serve the admin");
        let addr = server.local_addr();

        let list_p99_ms = list_p99(addr).await;
        list_new_filters_p99(addr).await;
        let polled = polled_vs_quiet(&executor, addr).await;
        server.shutdown().await.expect("admin shutdown");
        executor.shutdown().await.expect("shutdown");
        Summary {
            list_p99_ms,
            commits_polled_vs_quiet: polled,
        }
    })
}

/// The p99 of 200 filtered first pages, after one to build the list.
async fn list_p99(addr: SocketAddr) -> f64 {
    // A text that matches about one procedure in ten (their events' names).
    let path = "/api/summaries?status=suspended&q=never-7&limit=100";
    let (status, body) = get(addr, path).await;
    assert_eq!(status, 200, "{body}");
    let mut times = Vec::with_capacity(200);
    for _ in 0..200 {
        let started = Instant::now();
        let (status, _) = get(addr, path).await;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(status, 200);
    }
    times.sort_by(f64::total_cmp);
    let p50 = times[times.len() / 2];
    let p99 = times[times.len() * 99 / 100];
    println!("filtered first page over HTTP: p50 {p50:.1} ms, p99 {p99:.1} ms (200 requests)");
    p99
}

/// The p99 of 200 filtered first pages, each with a text no request asked before.
async fn list_new_filters_p99(addr: SocketAddr) {
    let mut times = Vec::with_capacity(200);
    for i in 0..200 {
        let path = format!("/api/summaries?status=suspended&q=never-7{i}&limit=100");
        let started = Instant::now();
        let (status, _) = get(addr, &path).await;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(status, 200);
    }
    times.sort_by(f64::total_cmp);
    let p50 = times[times.len() / 2];
    let p99 = times[times.len() * 99 / 100];
    println!(
        "filtered first page, a new filter each time (its count a pass over every row): p50 {p50:.1} ms, p99 {p99:.1} ms (200 requests)"
    );
}

/// Steps/s of 256 clients with four pages polling, over steps/s with none.
async fn polled_vs_quiet(executor: &Executor<()>, addr: SocketAddr) -> f64 {
    let polling = Arc::new(AtomicBool::new(false));
    let pollers: Vec<_> = (0..4)
        .map(|_| tokio::spawn(poll_like_a_page(addr, Arc::clone(&polling))))
        .collect();
    // Ten rounds: one round's ratio swings by a third either way on this VM (the WAL's
    // fsyncs), and the build a poll starts lands in one side's slice or the next.
    let turns = alternate(
        10,
        Duration::from_secs(2),
        |slice| {
            polling.store(true, Ordering::SeqCst);
            let executor = executor.clone();
            async move { run_procedures(&executor, 256, slice).await }
        },
        |slice| {
            polling.store(false, Ordering::SeqCst);
            let executor = executor.clone();
            async move { run_procedures(&executor, 256, slice).await }
        },
    )
    .await;
    polling.store(false, Ordering::SeqCst);
    for poller in pollers {
        poller.abort();
    }
    let ratio = turns.a.steps_per_sec() / turns.b.steps_per_sec();
    let (lo, hi) = turns.spread();
    println!(
        "256 clients: {:.0} steps/s while four pages poll, {:.0} with none: {ratio:.2} (rounds {lo:.2}–{hi:.2})",
        turns.a.steps_per_sec(),
        turns.b.steps_per_sec()
    );
    ratio
}

/// Polls the first page every second while `polling` is set, with the version it shows.
async fn poll_like_a_page(addr: SocketAddr, polling: Arc<AtomicBool>) {
    let mut version: Option<u64> = None;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !polling.load(Ordering::SeqCst) {
            continue;
        }
        let since = version.map_or(String::new(), |v| format!("&since={v}"));
        let (_, body) = get(addr, &format!("/api/summaries?limit=100{since}")).await;
        version = body
            .split("\"version\":")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok());
    }
}

/// One HTTP GET on a fresh connection: the status and the body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).expect("connect to the admin");
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).expect("send");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("read");
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        let body = answer
            .split_once("\r\n\r\n")
            .map_or(String::new(), |(_, body)| body.to_owned());
        (status, body)
    })
    .await
    .expect("the request task")
}
