//! A real deploy, with two builds (issue 30, point 7): `deploy_v1` and `deploy_v2` are
//! two releases of one application (`src/bin/deploy/`): release 2 adds a field to the
//! order, renames a state (`Reserve` → `Hold`, with an alias) and bumps the data version,
//! migrating release 1's data.
//!
//! Orders hold an exclusive stock lock for life, two orders per key, so half of them hold
//! their key and wait in `Pack` while the other half queue for it. Each build's steps
//! write their effects outside the store (idempotent lines) and lock lines around them.
//! The checks: every effect exactly once; release 2 shipped what release 1 submitted with
//! the migrated data (`note=None`); no other order wrote inside an order's lock span,
//! across kills and builds.
//!
//! - On the WAL: release 1 is killed (SIGKILL) while its orders wait holding their locks;
//!   release 2, with the start check, migrates them and finishes every order.
//! - On etcd (a real 3-member cluster): a rolling upgrade of an executor group. Release 1
//!   leads; a release 2 standby takes over when it is killed and moves the orders on.
//!   Then release 2 is killed with only a release 1 member left: it meets release 2's
//!   records, which stay stuck with their locks, and runs nothing of them. A release 2
//!   member, back, finishes everything.

#![cfg(unix)]

#[path = "support/lock_spans.rs"]
mod lock_spans;
#[cfg(feature = "etcd")]
#[path = "support/workers.rs"]
mod workers;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const ORDERS: u32 = 6;

/// Creates `DIR/signals/<event>` for each event.
fn signal(dir: &Path, events: impl IntoIterator<Item = String>) {
    let signals = dir.join("signals");
    std::fs::create_dir_all(&signals).unwrap();
    for event in events {
        std::fs::write(signals.join(event), "").unwrap();
    }
}

fn events(kind: &str, orders: impl IntoIterator<Item = u32>) -> Vec<String> {
    orders.into_iter().map(|i| format!("{kind}-{i}")).collect()
}

/// Every effect of every order exactly once, and what each order shipped.
fn effects(dir: &Path) -> BTreeMap<String, String> {
    let mut shipped = BTreeMap::new();
    for i in 0..ORDERS {
        let name = format!("o{i}");
        let text = std::fs::read_to_string(dir.join("effects").join(&name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for verb in ["reserve", "pack", "ship"] {
            let done: Vec<&&str> = lines.iter().filter(|l| l.starts_with(verb)).collect();
            assert_eq!(
                done.len(),
                1,
                "{name}: `{verb}` {} times: {lines:?}",
                done.len()
            );
        }
        let ship = lines.iter().find(|l| l.starts_with("ship")).unwrap();
        shipped.insert(name, (*ship).to_owned());
    }
    shipped
}

/// No order wrote inside another's lock span.
fn lock_spans_hold(dir: &Path) {
    let revived = Default::default();
    for entry in std::fs::read_dir(dir.join("locks")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let problems = lock_spans::check_locks(&text, &revived);
        assert!(problems.is_empty(), "{problems:#?}");
    }
}

/// A deploy worker on the WAL in `dir`, its output lines sent to `lines`.
fn on_wal(program: &str, dir: &Path, extra: &[&str], lines: &mpsc::Sender<String>) -> Child {
    let mut child = Command::new(program)
        .arg("--wal")
        .arg(dir)
        .args(["--orders", &ORDERS.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the worker starts");
    let stdout = child.stdout.take().unwrap();
    let sender = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    child
}

/// Waits up to `within` for `wanted`, returning every line read meanwhile on failure.
fn expect(lines: &mpsc::Receiver<String>, within: Duration, wanted: &str) {
    let deadline = std::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line == wanted => return,
            Ok(line) => seen.push(line),
            Err(_) => panic!("no `{wanted}` within {within:?}; the worker said {seen:#?}"),
        }
    }
}

#[test]
fn p7_a_deploy_on_the_wal_finishes_what_a_killed_release_left_holding_its_locks() {
    let dir = tempfile::tempdir().unwrap();
    let (sender, lines) = mpsc::channel();
    let mut v1 = on_wal(env!("CARGO_BIN_EXE_deploy_v1"), dir.path(), &[], &sender);
    // Half hold their key and wait in `Pack`, half queue behind them.
    expect(
        &lines,
        Duration::from_secs(60),
        "status v1 suspended=3 waiting=3 stuck=0 done=0",
    );
    v1.kill().unwrap(); // SIGKILL
    v1.wait().unwrap();

    signal(dir.path(), events("pack", 0..ORDERS));
    signal(dir.path(), events("pay", 0..ORDERS));
    let mut v2 = on_wal(
        env!("CARGO_BIN_EXE_deploy_v2"),
        dir.path(),
        &["--check"],
        &sender,
    );
    expect(&lines, Duration::from_secs(60), &format!("done {ORDERS}"));
    assert!(v2.wait().unwrap().success());

    // Every order was submitted by release 1 and shipped by release 2, migrated.
    for (name, shipped) in effects(dir.path()) {
        let index: u32 = name[1..].parse().unwrap();
        assert_eq!(shipped, format!("ship {name} qty={} note=None", index + 1));
    }
    lock_spans_hold(dir.path());
}

#[cfg(feature = "etcd")]
mod on_etcd {
    use super::*;

    use super::workers::Workers;
    use procflow_store::etcd::LocalCluster;

    const V1: &str = env!("CARGO_BIN_EXE_deploy_v1");
    const V2: &str = env!("CARGO_BIN_EXE_deploy_v2");

    fn spawn(workers: &mut Workers, i: usize, program: &str, extra: &[&str]) {
        let dir = workers.dir().to_path_buf();
        let mut args = vec!["--dir", dir.to_str().unwrap(), "--orders", "6"];
        args.extend_from_slice(extra);
        workers.spawn_program(i, program, &args);
    }

    /// Polls `done` until it holds; fails naming `what` after `within`.
    fn until(within: Duration, what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + within;
        while !done() {
            assert!(
                std::time::Instant::now() < deadline,
                "no {what} within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn expect(workers: &mut Workers, worker: usize, within: Duration, wanted: &str) {
        workers.expect(within, wanted, |line| {
            line.worker == worker && line.text == wanted
        });
    }

    #[test]
    fn p7_a_rolling_upgrade_on_etcd_and_back_loses_nothing_and_runs_nothing_with_a_field_dropped() {
        let cluster = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
        let mut workers = Workers::start(&cluster, "/deploy", 0, &[]);
        let dir = workers.dir().to_path_buf();
        let holders = [0, 2, 4];
        let queued = [1, 3, 5];

        // Release 1 leads: three orders hold their keys in `Pack`, three queue.
        spawn(&mut workers, 0, V1, &[]);
        expect(&mut workers, 0, Duration::from_secs(30), "leading w0 v1");
        let settled = "status v1 suspended=3 waiting=3 stuck=0 done=0";
        expect(&mut workers, 0, Duration::from_secs(30), settled);
        // A release 2 standby, with the start check, takes over when release 1 dies.
        spawn(&mut workers, 1, V2, &["--check"]);
        workers.kill(0);
        expect(&mut workers, 1, Duration::from_secs(10), "leading w1 v2");
        // Release 2 moves the holders on to `Ship`: their records are release 2's now.
        signal(&dir, events("pack", holders));
        for i in holders {
            let effects = dir.join(format!("effects/o{i}"));
            until(Duration::from_secs(30), &format!("o{i} packed"), || {
                std::fs::read_to_string(&effects).is_ok_and(|t| t.contains("pack"))
            });
        }

        // Rolled back: only a release 1 member is left. It meets release 2's records:
        // stuck, their keys held, nothing of them run, though they are paid.
        spawn(&mut workers, 2, V1, &[]);
        workers.kill(1);
        expect(&mut workers, 2, Duration::from_secs(10), "leading w2 v1");
        expect(
            &mut workers,
            2,
            Duration::from_secs(30),
            "status v1 suspended=0 waiting=3 stuck=3 done=0",
        );
        signal(&dir, events("pay", holders));
        std::thread::sleep(Duration::from_secs(1));
        for i in holders {
            let text = std::fs::read_to_string(dir.join(format!("effects/o{i}"))).unwrap();
            assert!(!text.contains("ship"), "release 1 ran o{i}: {text}");
        }

        // Release 2 again: nothing was lost, everything ships, once.
        spawn(&mut workers, 3, V2, &["--check"]);
        workers.kill(2);
        expect(&mut workers, 3, Duration::from_secs(10), "leading w3 v2");
        signal(&dir, events("pack", queued));
        signal(&dir, events("pay", queued));
        expect(
            &mut workers,
            3,
            Duration::from_secs(60),
            &format!("done {ORDERS}"),
        );
        for (name, shipped) in effects(&dir) {
            let index: u32 = name[1..].parse().unwrap();
            let submitted_by_v1 = format!("ship {name} qty={} note=None", index + 1);
            assert_eq!(shipped, submitted_by_v1, "{name}");
        }
        lock_spans_hold(&dir);
    }
}
