//! Worker processes of an executor group (`src/bin/group_worker.rs`) for
//! `tests/etcd_failover.rs`, `tests/pg_failover.rs` and the etcd and PostgreSQL workloads
//! of `benches/compare.rs`: spawns them,
//! merges their output into one channel, kills and signals them, reads their ledger.

// Each includer uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[cfg(feature = "etcd")]
use procflow_store::etcd::LocalCluster;

/// A line a worker printed, and when it was read.
pub struct Line {
    pub worker: usize,
    pub text: String,
    pub at: Instant,
}

/// `group_worker` processes `w0`, `w1`…, their output merged into one channel.
pub struct Workers {
    /// The arguments that name the store: `--endpoints E --prefix P` (etcd) or
    /// `--postgres C --schema S`.
    store: Vec<String>,
    ledger: tempfile::TempDir,
    extra: Vec<String>,
    children: Vec<Option<Child>>,
    pub lines: mpsc::Receiver<Line>,
    sender: mpsc::Sender<Line>,
    log: Vec<String>,
}

impl Workers {
    /// Starts `count` workers on `cluster` under `prefix`, each given `extra` arguments
    /// after `--endpoints`, `--prefix`, `--name` and `--ledger`.
    #[cfg(feature = "etcd")]
    pub fn start(cluster: &LocalCluster, prefix: &str, count: usize, extra: &[&str]) -> Self {
        let endpoints = cluster.endpoints().join(",");
        Self::start_on(
            &["--endpoints", &endpoints, "--prefix", prefix],
            count,
            extra,
        )
    }

    /// Starts `count` workers on the store `store` names (`--endpoints E --prefix P`, or
    /// `--postgres C --schema S`), each given `extra` arguments after those, `--name` and
    /// `--ledger`.
    pub fn start_on(store: &[&str], count: usize, extra: &[&str]) -> Self {
        let (sender, lines) = mpsc::channel();
        let mut workers = Self {
            store: store.iter().map(|s| (*s).to_owned()).collect(),
            ledger: tempfile::tempdir().unwrap(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            children: (0..count).map(|_| None).collect(),
            lines,
            sender,
            log: Vec::new(),
        };
        for i in 0..count {
            workers.spawn(i);
        }
        workers
    }

    /// Starts worker `i` (again, after a kill).
    pub fn spawn(&mut self, i: usize) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_group_worker"))
            .args(&self.store)
            .args(["--name", &format!("w{i}")])
            .arg("--ledger")
            .arg(self.ledger.path())
            .args(&self.extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("group_worker starts");
        self.forward(i, &mut child);
        self.children[i] = Some(child);
    }

    /// Starts worker `i` as `program` (another worker binary than `group_worker`), with
    /// `--endpoints`, `--prefix`, `--name w<i>` and then `args`.
    pub fn spawn_program(&mut self, i: usize, program: &str, args: &[&str]) {
        let mut child = Command::new(program)
            .args(&self.store)
            .args(["--name", &format!("w{i}")])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the worker starts");
        self.forward(i, &mut child);
        if self.children.len() <= i {
            self.children.resize_with(i + 1, || None);
        }
        self.children[i] = Some(child);
    }

    /// The directory workers keep their ledger (and other outside effects) in.
    pub fn dir(&self) -> &std::path::Path {
        self.ledger.path()
    }

    /// Sends each line `child` prints to the merged channel, as worker `i`'s.
    fn forward(&self, i: usize, child: &mut Child) {
        let stdout = child.stdout.take().unwrap();
        let sender = self.sender.clone();
        std::thread::spawn(move || {
            for text in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = sender.send(Line {
                    worker: i,
                    text,
                    at: Instant::now(),
                });
            }
        });
    }

    /// Waits up to `within` for a line matching `wanted`.
    pub fn expect(&mut self, within: Duration, what: &str, wanted: impl Fn(&Line) -> bool) -> Line {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(format!("w{}: {}", line.worker, line.text));
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no {what} within {within:?}; workers said:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }

    pub fn next_leader(&mut self, within: Duration) -> Line {
        self.expect(within, "new leader", |l| l.text.starts_with("leading "))
    }

    pub fn signal(&self, i: usize, signal: &str) {
        let pid = self.children[i].as_ref().unwrap().id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Every ledger line: (procedure, step, token), in the order they were written.
    pub fn ledger(&self) -> Vec<(u64, u64, u64)> {
        let text = std::fs::read_to_string(self.ledger.path().join("ledger")).unwrap_or_default();
        text.lines()
            .map(|line| {
                let f: Vec<u64> = line.split(' ').map(|f| f.parse().unwrap()).collect();
                (f[0], f[1], f[2])
            })
            .collect()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            if let Some(child) = self.children[i].as_mut() {
                let _ = Command::new("kill")
                    .args(["-CONT", &child.id().to_string()])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Every procedure's steps `1..=steps`, each exactly once, in order, of `procedures`
/// procedures; and tokens that never go back.
pub fn assert_ledger_exactly_once(ledger: &[(u64, u64, u64)], procedures: u32, steps: u32) {
    let mut seen: std::collections::BTreeMap<u64, Vec<u64>> = std::collections::BTreeMap::new();
    for &(procedure, step, _) in ledger {
        seen.entry(procedure).or_default().push(step);
    }
    assert_eq!(seen.len(), procedures as usize, "every procedure wrote");
    let expected: Vec<u64> = (1..=u64::from(steps)).collect();
    for (procedure, steps) in seen {
        assert_eq!(steps, expected, "procedure {procedure}'s ledger");
    }
    assert!(
        ledger.windows(2).all(|w| w[0].2 <= w[1].2),
        "tokens never go back"
    );
}

/// The number at the end of a `leading NAME token T` line.
pub fn token(line: &Line) -> u64 {
    line.text.rsplit(' ').next().unwrap().parse().unwrap()
}

impl Workers {
    /// Kills the leader `kills` times, each once it has worked for 700 ms, and starts the
    /// victim again; returns each takeover (from the kill until another worker leads, at
    /// most `within`) and the worker that then led. Prints each.
    pub fn kill_leaders(&mut self, kills: usize, ttl_s: u64, within: Duration) -> Vec<f64> {
        let mut leader = self.next_leader(Duration::from_secs(30));
        let mut takeovers = Vec::new();
        for kill in 1..=kills {
            std::thread::sleep(Duration::from_millis(700));
            let victim = leader.worker;
            self.kill(victim);
            let killed = Instant::now();
            leader = self.next_leader(within);
            assert_ne!(leader.worker, victim, "the killed worker cannot lead");
            let seconds = (leader.at - killed).as_secs_f64();
            println!(
                "kill {kill} of the leader w{victim}: takeover: {seconds:.2} s (lease ttl {ttl_s} s) by w{} ({})",
                leader.worker, leader.text
            );
            takeovers.push(seconds);
            self.spawn(victim);
        }
        takeovers
    }
}

/// The failover scenario of `tests/etcd_failover.rs` and `tests/pg_failover.rs` on
/// `workers` (three, running `procedures` chains of `steps`): five leader kills, each
/// takeover within twice the TTL, then every procedure done with every ledger entry
/// written exactly once, by six leaders at least.
pub fn survive_five_leader_kills(workers: &mut Workers, ttl_s: u64, procedures: u32, steps: u32) {
    let takeovers = workers.kill_leaders(5, ttl_s, Duration::from_secs(4 * ttl_s));
    workers.expect(Duration::from_secs(120), "all done", |l| {
        l.text == format!("all done {procedures}")
    });
    let ledger = workers.ledger();
    assert_ledger_exactly_once(&ledger, procedures, steps);
    let tokens: std::collections::BTreeSet<u64> = ledger.iter().map(|l| l.2).collect();
    assert!(tokens.len() >= 6, "six leaders wrote: {tokens:?}");
    for takeover in takeovers {
        assert!(
            takeover <= 2.0 * ttl_s as f64,
            "takeover {takeover:.2} s > 2 × ttl"
        );
    }
}

/// The fencing scenario on `workers` (two, started with `--fencing-only`): the leader is
/// frozen with SIGSTOP until the other has won and written, then woken; the store
/// refuses its next commit, it halts saying `fenced`, and the ledger holds no write of
/// its token after the new leader's first. Returns the old leader's `halted:` line.
pub fn freeze_the_leader_until_fenced(
    workers: &mut Workers,
    ttl_s: u64,
    procedures: u32,
    steps: u32,
) -> String {
    let old = workers.next_leader(Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(700));
    workers.signal(old.worker, "-STOP");
    // Its lease runs out; the other worker wins and persists progress.
    let new = workers.next_leader(Duration::from_secs(4 * ttl_s));
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
    workers.expect(Duration::from_secs(120), "all done", |l| {
        l.worker == new.worker && l.text == format!("all done {procedures}")
    });
    let ledger = workers.ledger();
    let first_new = ledger.iter().position(|l| l.2 == new_token).unwrap();
    let old_token = token(&old);
    assert!(
        ledger[first_new..].iter().all(|l| l.2 != old_token),
        "no write of the old leader after the new leader's first"
    );
    assert_ledger_exactly_once(&ledger, procedures, steps);
    halted.text
}
