//! The process `tests/kill9.rs` kills with SIGKILL, over and over.
//!
//! ```text
//! crash_worker --dir DIR [--procedures 200] [--steps 20] [--step-ms 10] [--non-idempotent]
//!              [--segment-kib 65536] [--pad 0] [--suspend-every 0] [--caller-writes]
//! ```
//!
//! Runs `--procedures` procedures of `--steps` steps on a durable `WalStore` in
//! `DIR/wal`. Every step appends its number to the procedure's ledger file
//! `DIR/ledger/<n>`, outside the store, idempotently: a step that finds its number
//! already last in the file (it ran before a crash, its result was not persisted) does not
//! append it again. `--non-idempotent` appends unconditionally, which a crash turns into a
//! duplicate line: the test must catch that. Submits carry a nonce, so a restarted worker
//! picks up the same procedures. `--segment-kib` sets the WAL's segment size and `--pad`
//! adds that many bytes to every procedure's state: small segments of large values make
//! segments the open keeps mapped (`WalConfig::map_segments`), and compactions of them.
//! Prints `open: mapped_segments=K` once the store is open, and appends `K R S` to
//! `DIR/opens` where `/proc/self/smaps` tells R and S, the resident and whole size in KiB
//! of its mappings of the log's files. `--suspend-every K` has every K-th step first wait
//! for an event of its own, which a task of the worker sends a while later: a kill then
//! leaves procedures suspended, which the next start loads dormant; each start appends
//! how many it loaded so to `DIR/dormant`. `--caller-writes` opens the store with
//! `WalConfig::caller_writes`: each commit writes its own record, out of order with the
//! others, so a kill can leave a gap before records written after it. Prints `done N succeeded M` and exits 0 once
//! all ended; exits 1 on any error.

use procflow::executor::{Executor, Outcome, Status, SubmitOptions};
use procflow::prelude::*;
use procflow::store::{WalConfig, WalStore};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Chain, env = Ledger, name = "chain")]
enum ChainState {
    #[initial]
    #[transition(to = [Work, Done])]
    Work,
    #[terminal]
    Done,
}

/// Where steps record their effects.
struct Ledger {
    dir: PathBuf,
    step_delay: Duration,
    idempotent: bool,
    /// Every this many steps, a step first waits for its event (0: never).
    suspend_every: u32,
}

impl Ledger {
    fn record(&self, procedure: u32, step: u32) -> std::io::Result<()> {
        let path = self.dir.join(procedure.to_string());
        if self.idempotent {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().last() == Some(step.to_string().as_str()) {
                return Ok(()); // Done before a crash: the effect is already there.
            }
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        // One write call: a kill lands before or after it, never inside a line.
        file.write_all(format!("{step}\n").as_bytes())
    }
}

#[derive(Serialize, Deserialize)]
struct Chain {
    index: u32,
    steps: u32,
    done: u32,
    /// The last step that waited for its event.
    waited: u32,
    pad: Vec<u8>,
}

impl ChainStateHandlers for Chain {
    async fn work(&mut self, ctx: &Context<Ledger>) -> Step<chain_state::Work> {
        let step = self.done + 1;
        let every = ctx.env().suspend_every;
        if every > 0 && step.is_multiple_of(every) && self.waited != step {
            self.waited = step;
            return Ok(Flow::suspend(format!("chain-{}-{step}", self.index)));
        }
        ctx.env().record(self.index, step).retryable()?;
        // The effect is out, the step's result not yet persisted: a kill here is the case
        // that needs idempotence, so make it likely.
        tokio::time::sleep(ctx.env().step_delay).await;
        self.done = step;
        Ok(if step == self.steps {
            chain_state::Work::Done
        } else {
            chain_state::Work::Work
        }
        .into())
    }
}

struct Args {
    dir: PathBuf,
    procedures: u32,
    steps: u32,
    step_ms: u64,
    idempotent: bool,
    segment_kib: u64,
    pad: usize,
    suspend_every: u32,
    caller_writes: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        dir: PathBuf::new(),
        procedures: 200,
        steps: 20,
        step_ms: 10,
        idempotent: true,
        segment_kib: WalConfig::default().segment_size / 1024,
        pad: 0,
        suspend_every: 0,
        caller_writes: false,
    };
    let mut dir = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{arg}: {e}"));
        match arg.as_str() {
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--procedures" => {
                args.procedures = u32::try_from(number(value()?)?).map_err(|e| e.to_string())?
            }
            "--steps" => {
                args.steps = u32::try_from(number(value()?)?).map_err(|e| e.to_string())?
            }
            "--step-ms" => args.step_ms = number(value()?)?,
            "--non-idempotent" => args.idempotent = false,
            "--segment-kib" => args.segment_kib = number(value()?)?,
            "--pad" => args.pad = usize::try_from(number(value()?)?).map_err(|e| e.to_string())?,
            "--suspend-every" => {
                args.suspend_every = u32::try_from(number(value()?)?).map_err(|e| e.to_string())?
            }
            "--caller-writes" => args.caller_writes = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    args.dir = dir.ok_or("--dir is required")?;
    Ok(args)
}

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("crash_worker: {error}");
        std::process::exit(1);
    }
}

/// The resident and the whole size, in KiB, of this process's mappings of files in
/// `dir`, from `/proc/self/smaps`; `None` where there is no such file.
fn mapped_kib(dir: &std::path::Path) -> Option<(u64, u64)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let dir = dir.to_str()?;
    // A mapping's first line starts with its address range (`start-end`, hexadecimal)
    // and ends with its file, if any; its fields follow, one per line.
    let first_line = |line: &str| {
        let range = line.split_whitespace().next().unwrap_or("");
        range.contains('-') && range.split('-').all(|a| u64::from_str_radix(a, 16).is_ok())
    };
    let kib = |line: &str, name: &str| {
        let value = line
            .strip_prefix(name)?
            .trim()
            .trim_end_matches("kB")
            .trim();
        value.parse::<u64>().ok()
    };
    let (mut resident, mut size, mut in_dir) = (0, 0, false);
    for line in smaps.lines() {
        if first_line(line) {
            in_dir = line.contains(dir);
        } else if in_dir {
            size += kib(line, "Size:").unwrap_or(0);
            resident += kib(line, "Rss:").unwrap_or(0);
        }
    }
    Some((resident, size))
}

fn suspended(status: &Status) -> bool {
    matches!(status, Status::Suspended { .. })
}

/// Every 100 ms, sends the event of each procedure waiting for one: long enough that a
/// kill finds some waiting.
async fn send_events(executor: Executor<Ledger>) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for info in executor.list() {
            if let Status::Suspended { event } = info.status
                && executor.wake(&event).await.is_err()
            {
                return; // Shutting down.
            }
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let ledger_dir = args.dir.join("ledger");
    std::fs::create_dir_all(&ledger_dir)?;
    let config = WalConfig {
        segment_size: args.segment_kib * 1024,
        caller_writes: args.caller_writes,
        ..WalConfig::default()
    };
    let store = Arc::new(WalStore::open(args.dir.join("wal"), config)?);
    let mapped = store.stats().mapped_segments;
    println!("open: mapped_segments={mapped}");
    if let Some((resident, size)) = mapped_kib(&args.dir.join("wal")) {
        // Every open's, for a test that looks at all the restarts of a kill loop.
        let mut opens = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(args.dir.join("opens"))?;
        writeln!(opens, "{mapped} {resident} {size}")?;
    }
    let ledger = Ledger {
        dir: ledger_dir,
        step_delay: Duration::from_millis(args.step_ms),
        idempotent: args.idempotent,
        suspend_every: args.suspend_every,
    };
    let executor = Executor::builder(store, ledger)
        .register::<ChainState>()
        .start()
        .await?;
    if args.suspend_every > 0 {
        let dormant = executor
            .list()
            .iter()
            .filter(|i| suspended(&i.status))
            .count();
        let mut starts = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(args.dir.join("dormant"))?;
        writeln!(starts, "{dormant}")?;
        tokio::spawn(send_events(executor.clone()));
    }
    let mut ids = Vec::new();
    for index in 0..args.procedures {
        let chain = Chain {
            index,
            steps: args.steps,
            done: 0,
            waited: 0,
            pad: vec![index as u8; args.pad],
        };
        let options = SubmitOptions::default().nonce(format!("chain-{index}"));
        ids.push(executor.submit_with(chain, options).await?);
    }
    let mut succeeded = 0;
    for id in &ids {
        if executor.wait(*id).await? == Outcome::Succeeded {
            succeeded += 1;
        }
    }
    executor.shutdown().await?;
    println!("done {} succeeded {succeeded}", ids.len());
    Ok(())
}
