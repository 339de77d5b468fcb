//! An executor group of three real processes (`group_worker`) on a real 3-member etcd
//! cluster (`LocalCluster`; `sudo apt-get install -y etcd-server` if `etcd` is missing).
//!
//! * failover: the leader is killed with SIGKILL five times mid-run; each time a standby
//!   takes over within twice the lease TTL, and at the end every procedure succeeded with
//!   every ledger entry written exactly once;
//! * fencing: a leader frozen with SIGSTOP (and built not to step down on its own) is
//!   replaced; on SIGCONT etcd refuses its next commit, it halts, and the ledger holds no
//!   write of it after the new leader's first;
//! * etcd member loss: a follower, then etcd's own leader, is killed mid-run and the
//!   group keeps going;
//! * quorum loss: with two of three etcd members down the group stalls, its leader says
//!   why (`trouble: ...`), and once they return a leader resumes with nothing lost.

#![cfg(unix)]

#[path = "support/workers.rs"]
mod workers;

use std::time::{Duration, Instant};

use procflow_store::etcd::LocalCluster;
use workers::Workers;

const PROCEDURES: u32 = 100;
const STEPS: u32 = 20;
const TTL_S: u64 = 2;

/// `Workers::start` with this file's run: `PROCEDURES` chains of `STEPS`, lease `TTL_S`.
fn start_workers(cluster: &LocalCluster, prefix: &str, count: usize, extra: &[&str]) -> Workers {
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
    Workers::start(cluster, prefix, count, &args)
}

fn cluster() -> LocalCluster {
    LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"))
}

/// Every procedure's steps 1..=STEPS, each exactly once, in order.
fn assert_ledger_exactly_once(ledger: &[(u64, u64, u64)]) {
    workers::assert_ledger_exactly_once(ledger, PROCEDURES, STEPS);
}

#[test]
fn the_group_survives_five_leader_kills_with_every_effect_exactly_once() {
    let cluster = cluster();
    let mut workers = start_workers(&cluster, "/failover", 3, &["--step-ms", "100"]);
    workers::survive_five_leader_kills(&mut workers, TTL_S, PROCEDURES, STEPS);
}

#[test]
fn a_frozen_leader_is_fenced_by_etcd_when_it_wakes() {
    let cluster = cluster();
    let extra = ["--step-ms", "100", "--fencing-only"];
    let mut workers = start_workers(&cluster, "/fencing", 2, &extra);
    let halted = workers::freeze_the_leader_until_fenced(&mut workers, TTL_S, PROCEDURES, STEPS);
    println!("the old leader: {halted}");
}

#[test]
fn the_group_keeps_going_when_an_etcd_member_dies() {
    let mut cluster = cluster();
    // Slow steps: the run must outlast both kills and the stalls they cause.
    let mut workers = start_workers(&cluster, "/members", 3, &["--step-ms", "500"]);
    workers.next_leader(Duration::from_secs(30));
    for target in ["follower", "leader"] {
        std::thread::sleep(Duration::from_millis(500));
        let etcd_leader = cluster.leader().expect("etcd has a leader");
        let victim = if target == "leader" {
            etcd_leader
        } else {
            (etcd_leader + 1) % 3
        };
        let before = workers.ledger().len();
        let total = (PROCEDURES * STEPS) as usize;
        assert!(
            before + 50 <= total,
            "the run ended before etcd's {target} was killed"
        );
        cluster.kill(victim).unwrap();
        println!("killed etcd's {target} (member {victim})");
        let start = Instant::now();
        while workers.ledger().len() < before + 50 {
            while let Ok(line) = workers.lines.try_recv() {
                println!("  w{}: {}", line.worker, line.text);
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no progress after killing etcd's {target}: {} of {total} ledger entries, {before} before",
                workers.ledger().len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        println!(
            "  progress resumed within {:.2} s",
            start.elapsed().as_secs_f64()
        );
        cluster.restart(victim).unwrap();
    }
    workers.expect(Duration::from_secs(120), "all done", |l| {
        l.text == format!("all done {PROCEDURES}")
    });
    assert_ledger_exactly_once(&workers.ledger());
}

#[test]
fn without_an_etcd_quorum_the_group_stalls_with_a_clear_error_and_resumes_after() {
    let mut cluster = cluster();
    let mut workers = start_workers(&cluster, "/quorum", 3, &["--step-ms", "100"]);
    let old = workers.next_leader(Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(700));
    let total = (PROCEDURES * STEPS) as usize;
    assert!(workers.ledger().len() < total, "the run ended too soon");
    let etcd_leader = cluster.leader().expect("etcd has a leader");
    let victims = [etcd_leader, (etcd_leader + 1) % 3];
    for &victim in &victims {
        cluster.kill(victim).unwrap();
    }
    let killed = Instant::now();
    println!("killed etcd members {victims:?} (etcd's leader first): one of three is left");
    // The leader cannot keep its lease alive: it stops, and says why.
    let trouble = workers.expect(Duration::from_secs(4 * TTL_S), "a clear error", |l| {
        l.worker == old.worker && l.text.starts_with("trouble: ")
    });
    println!(
        "  after {:.2} s: w{}: {}",
        killed.elapsed().as_secs_f64(),
        trouble.worker,
        trouble.text
    );
    assert!(
        trouble.text.contains("leadership lost") && trouble.text.contains("keep-alive"),
        "the leader says it lost its term for want of keep-alives: {}",
        trouble.text
    );
    // Then it cannot campaign either, and says so.
    let campaign = workers.expect(Duration::from_secs(4 * TTL_S), "a campaign error", |l| {
        l.text.starts_with("trouble: election: etcd")
    });
    println!("  w{}: {}", campaign.worker, campaign.text);
    // Stalled: with no leader, no step runs.
    let stalled = workers.ledger().len();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        workers.ledger().len(),
        stalled,
        "nothing ran without a quorum"
    );
    assert!(
        stalled < total,
        "the run had not ended: {stalled} of {total}"
    );
    for &victim in &victims {
        cluster.restart(victim).unwrap();
    }
    let back = Instant::now();
    let new = workers.next_leader(Duration::from_secs(30));
    println!(
        "  members back: {} leads {:.2} s later",
        new.text,
        back.elapsed().as_secs_f64()
    );
    workers.expect(Duration::from_secs(120), "all done", |l| {
        l.text == format!("all done {PROCEDURES}")
    });
    println!("  all done {:.2} s later", back.elapsed().as_secs_f64());
    assert_ledger_exactly_once(&workers.ledger());
}
