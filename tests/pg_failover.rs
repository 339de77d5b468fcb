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
use workers::{Line, Workers};

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

fn token(line: &Line) -> u64 {
    line.text.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn the_group_survives_five_leader_kills_with_every_effect_exactly_once() {
    let server = server();
    let mut workers = start_workers(&server, "failover", 3, &["--step-ms", "100"]);
    let mut leader = workers.next_leader(Duration::from_secs(30));
    let mut takeovers = Vec::new();
    for kill in 1..=5 {
        // Let the leader make progress, then kill it mid-run.
        std::thread::sleep(Duration::from_millis(700));
        let victim = leader.worker;
        workers.kill(victim);
        let killed_at = Instant::now();
        leader = workers.next_leader(Duration::from_secs(4 * TTL_S));
        assert_ne!(leader.worker, victim);
        let takeover = leader.at - killed_at;
        println!(
            "kill {kill}: takeover: {:.2} s (lease ttl {TTL_S} s) by {}",
            takeover.as_secs_f64(),
            leader.text
        );
        takeovers.push(takeover);
        workers.spawn(victim);
    }
    workers.expect(Duration::from_secs(120), "all done", |l| {
        l.text == format!("all done {PROCEDURES}")
    });
    let ledger = workers.ledger();
    assert_ledger_exactly_once(&ledger);
    let tokens: std::collections::BTreeSet<u64> = ledger.iter().map(|l| l.2).collect();
    assert!(tokens.len() >= 6, "six leaders wrote: {tokens:?}");
    for takeover in takeovers {
        assert!(
            takeover <= Duration::from_secs(2 * TTL_S),
            "takeover {takeover:?} > 2 × ttl"
        );
    }
}

#[test]
fn a_frozen_leader_is_fenced_by_postgres_when_it_wakes() {
    let server = server();
    let mut workers = start_workers(
        &server,
        "fencing",
        2,
        &["--step-ms", "100", "--fencing-only"],
    );
    let old = workers.next_leader(Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(700));
    workers.signal(old.worker, "-STOP");
    // Its lease runs out; the other worker wins and persists progress.
    let new = workers.next_leader(Duration::from_secs(4 * TTL_S));
    assert_ne!(new.worker, old.worker);
    let new_token = token(&new);
    let start = Instant::now();
    while !workers.ledger().iter().any(|l| l.2 == new_token) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the new leader wrote nothing"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    workers.signal(old.worker, "-CONT");
    let halted = workers.expect(Duration::from_secs(10), "the old leader halting", |l| {
        l.worker == old.worker && l.text.starts_with("halted: ")
    });
    assert!(halted.text.contains("fenced"), "{}", halted.text);
    println!("the old leader: {}", halted.text);
    workers.expect(Duration::from_secs(120), "all done", |l| {
        l.worker == new.worker && l.text == format!("all done {PROCEDURES}")
    });
    let ledger = workers.ledger();
    let first_new = ledger.iter().position(|l| l.2 == new_token).unwrap();
    let old_token = token(&old);
    assert!(
        ledger[first_new..].iter().all(|l| l.2 != old_token),
        "no write of the old leader after the new leader's first"
    );
    assert_ledger_exactly_once(&ledger);
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
