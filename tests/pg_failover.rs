//! An executor group of three real processes (`group_worker`) on a real PostgreSQL server
//! (`LocalPostgres`; `sudo apt-get install -y postgresql` if it is missing), electing
//! with `PgElection` and storing with `PgStore`:
//!
//! * failover: the leader is killed with SIGKILL five times mid-run; each time a standby
//!   takes over within twice the lease TTL, and at the end every procedure succeeded with
//!   every ledger entry written exactly once;
//! * fencing: a leader frozen with SIGSTOP (and built not to step down on its own) is
//!   replaced; on SIGCONT PostgreSQL refuses its next commit, it halts, and the ledger
//!   holds no write of it after the new leader's first;
//! * the database restarted mid-run (an immediate shutdown, as a crash, then crash
//!   recovery): writes resume and nothing is lost.

#![cfg(unix)]

#[path = "support/workers.rs"]
mod workers;

use std::time::{Duration, Instant};

use procflow_store::postgres::LocalPostgres;
use workers::Workers;

const PROCEDURES: u32 = 100;
const STEPS: u32 = 20;
const TTL_S: u64 = 2;

fn server() -> LocalPostgres {
    LocalPostgres::start().unwrap_or_else(|e| panic!("{e}"))
}

/// `Workers::start_on` the server's schema `schema`: `PROCEDURES` chains of `STEPS`,
/// lease `TTL_S`.
fn start_workers(server: &LocalPostgres, schema: &str, count: usize, extra: &[&str]) -> Workers {
    let connection = server.connection_string();
    let store = ["--postgres", &connection, "--schema", schema];
    let run = [
        "--procedures",
        &PROCEDURES.to_string(),
        "--steps",
        &STEPS.to_string(),
        "--ttl",
        &TTL_S.to_string(),
    ]
    .map(str::to_owned);
    let args: Vec<&str> = run
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .collect();
    Workers::start_on(&store, count, &args)
}

fn assert_ledger_exactly_once(ledger: &[(u64, u64, u64)]) {
    workers::assert_ledger_exactly_once(ledger, PROCEDURES, STEPS);
}

#[test]
fn the_group_survives_five_leader_kills_with_every_effect_exactly_once() {
    let server = server();
    let mut workers = start_workers(&server, "failover", 3, &["--step-ms", "100"]);
    workers::survive_five_leader_kills(&mut workers, TTL_S, PROCEDURES, STEPS);
}

#[test]
fn a_frozen_leader_is_fenced_by_postgres_when_it_wakes() {
    let server = server();
    let extra = ["--step-ms", "100", "--fencing-only"];
    let mut workers = start_workers(&server, "fencing", 2, &extra);
    let halted = workers::freeze_the_leader_until_fenced(&mut workers, TTL_S, PROCEDURES, STEPS);
    println!("the old leader: {halted}");
}

#[test]
fn the_group_resumes_after_the_database_restarts_and_loses_nothing() {
    let mut server = server();
    let mut workers = start_workers(&server, "restart", 3, &["--step-ms", "100"]);
    workers.next_leader(Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1000));
    let total = (PROCEDURES * STEPS) as usize;
    let before = workers.ledger().len();
    assert!(before + 100 <= total, "the run ended before the restart");
    let restarting = Instant::now();
    server.restart().unwrap();
    println!(
        "database restarted (immediate shutdown, crash recovery) in {:.2} s, {before} of {total} \
         ledger entries before",
        restarting.elapsed().as_secs_f64()
    );
    let start = Instant::now();
    while workers.ledger().len() < before + 100 {
        while let Ok(line) = workers.lines.try_recv() {
            println!("  w{}: {}", line.worker, line.text);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no progress after the restart: {} of {total} ledger entries, {before} before",
            workers.ledger().len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "  progress resumed within {:.2} s",
        start.elapsed().as_secs_f64()
    );
    workers.expect(Duration::from_secs(120), "all done", |l| {
        l.text == format!("all done {PROCEDURES}")
    });
    assert_ledger_exactly_once(&workers.ledger());
}
