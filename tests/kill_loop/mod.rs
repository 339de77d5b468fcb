//! The kill loop the real-process crash tests share (`tests/kill9.rs`,
//! `tests/kill9_orders.rs`): start a worker, SIGKILL it at a seeded random moment, again,
//! until enough kills landed on a running worker; then let a last run finish.

use std::ops::Range;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The seed of a run: `PROCFLOW_KILL_SEED` when set (to replay a run), else `default`.
pub fn seed(default: u64) -> u64 {
    std::env::var("PROCFLOW_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// What a kill loop did.
pub struct Killed {
    /// Kills that landed on a running worker.
    pub kills: u32,
    /// From the first start to the end of the final run.
    pub elapsed: Duration,
    /// The final run's output.
    pub last: Output,
}

/// Starts `worker()` and SIGKILLs it after a random `alive_ms` (from `seed`), until `kills`
/// kills landed on a running worker; then runs `last()` to its end.
///
/// # Panics
///
/// If a killed-to-be worker ends by itself: with an error (its stderr is shown), or
/// successfully, which means the work was too short for the kills asked for.
pub fn kill_then_finish(
    mut worker: impl FnMut() -> Command,
    last: impl FnOnce() -> Command,
    kills: u32,
    alive_ms: Range<u64>,
    seed: u64,
) -> Killed {
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();
    let mut landed = 0;
    while landed < kills {
        let mut child = worker().spawn().expect("start the worker");
        std::thread::sleep(Duration::from_millis(rng.u64(alive_ms.clone())));
        match child.try_wait().expect("poll the worker") {
            None => {
                child.kill().expect("SIGKILL the worker"); // `kill` sends SIGKILL on Unix.
                child.wait().expect("reap the worker");
                landed += 1;
            }
            Some(status) => {
                let output = child.wait_with_output().expect("the worker's output");
                assert!(
                    status.success(),
                    "the worker failed after {landed} kills: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
                panic!("the work ended after only {landed} kills; give it more work");
            }
        }
    }
    let last = run_bounded(last(), LAST_RUN_PATIENCE);
    Killed {
        kills: landed,
        elapsed: started.elapsed(),
        last,
    }
}

/// How long the final run may take: it takes seconds, and one that never ends (a
/// procedure the restarts stranded) must fail the test, not hold CI until its limit.
const LAST_RUN_PATIENCE: Duration = Duration::from_secs(300);

/// Runs `command` to its end, as [`Command::output`] does, reading its piped output
/// meanwhile.
///
/// # Panics
///
/// If it runs longer than `patience`: it is killed, and its output shown.
fn run_bounded(mut command: Command, patience: Duration) -> Output {
    use std::io::Read;
    let mut child = command.spawn().expect("start the final run");
    // Read while it runs: a full pipe would stop it, and look like a hang.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the final run") {
            break Some(status);
        }
        if started.elapsed() > patience {
            child.kill().expect("SIGKILL the final run");
            child.wait().expect("reap the final run");
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = stdout.join().expect("the final run's stdout");
    let stderr = stderr.join().expect("the final run's stderr");
    let Some(status) = status else {
        panic!(
            "the final run did not end within {patience:?}: it hangs (a procedure the \
             restarts left stranded?)\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        );
    };
    Output {
        status,
        stdout,
        stderr,
    }
}
