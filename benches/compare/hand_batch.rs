//! `--cell batch-wal:N` and `--cell batch-mem:N`: the ten-step machine's handlers driven
//! the way HBase's procedure workers drive theirs, as a bound for a redesign of the
//! executor (docs/BENCHMARKS.md, "Issue 33 in stop 68").
//!
//! One task per worker thread owns its share of the `N` procedures as plain data (state,
//! payload, context). Each round it runs one step of every procedure it owns, puts every
//! new state into one batch and commits that batch: one commit and one suspension per
//! round, not one per step. A procedure that ends is deleted in the same batch and
//! replaced by a new one, so `N` stay in flight as in the closed loops.
//!
//! Against the executor on a `MemStore` (`mem:N`), it tells whether the durable store or
//! what the executor does around a step holds `wal1024_vs_mem` down: if this loop on the
//! write-ahead log outruns the executor on a `MemStore`, the log is not the limit.
//! `-- --pad BYTES` adds bytes to every value, to write as much as the executor's records
//! (which carry the step history) do; `-- --keep-finished` finishes an ended procedure's
//! record (`Op::Finish`, kept for good) instead of deleting it, as the executor keeps
//! finished procedures for `Config::retention`.
//!
//! `-- --duties` (docs/BENCHMARKS.md, "Issue 33 in stop 73") makes the rounds do, on the
//! same compact data, what the executor does around a plain forward step ([`Duties`]):
//! the bound of a runner redesigned that way, all its per-step work included. `-- --tasks
//! N` runs N tasks of rounds in all (default: one per worker), so that one task's commit
//! overlaps another's steps; `-- --affine` runs each task on a thread of its own (a
//! current-thread runtime), so that it and its procedures' memory stay on one CPU. With a
//! [`ParallelLog`] (`--cell batch-par:N`) each round also appends its records to that log
//! and waits for the sync that covers them. `-- --clients` gives each procedure a client
//! task, as the executor's cells have: it submits, waits for the end, submits again.

use crate::machine::{Payload, TenSteps, encode};
use crate::parallel_log::{self, ParallelLog};
use procflow::prelude::*;
use procflow_store::{Batch, Store};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One procedure owned by a round's task.
struct Owned {
    id: u64,
    state: TenSteps,
    payload: Payload,
    ctx: Context<()>,
}

impl Owned {
    fn new(id: u64, env: &Arc<()>) -> Self {
        Owned {
            id,
            state: TenSteps::INITIAL,
            payload: Payload::new(id),
            ctx: Context::new(ProcedureId::new(id), Arc::clone(env)),
        }
    }

    /// The value its record holds now.
    fn value(&self, pad: usize) -> Vec<u8> {
        let mut value = encode(self.state, &self.payload);
        value.resize(value.len() + pad, 0);
        value
    }
}

/// Runs `clients` procedures for `duration` in rounds, one task per worker thread of
/// the runtime (fewer if there are fewer procedures); returns the steps taken and the
/// steps per second.
pub async fn rounds_on_store(
    store: Arc<dyn Store>,
    log: Option<Arc<ParallelLog>>,
    clients: u64,
    duration: Duration,
) -> (u64, f64) {
    let pad = crate::flag_value("--pad", "--pad BYTES").unwrap_or(0);
    let keep_finished = std::env::args().any(|arg| arg == "--keep-finished");
    let duties = std::env::args()
        .any(|arg| arg == "--duties")
        .then(|| Arc::new(Duties::new()));
    assert!(
        clients > 0,
        "--cell batch-wal:N and batch-mem:N need N of 1 or more"
    );
    // No task without a procedure: it would commit empty batches in a busy loop.
    let workers = tokio::runtime::Handle::current().metrics().num_workers() as u64;
    // `--tasks N`: N tasks in all, whose rounds overlap (one's commit with another's steps).
    let tasks = crate::flag_value("--tasks", "--tasks N")
        .unwrap_or(workers)
        .min(clients)
        .max(1);
    // `--affine`: each task of rounds on a thread of its own (a current-thread runtime).
    let affine = std::env::args().any(|arg| arg == "--affine");
    let start = Instant::now();
    let deadline = start + duration;
    let rounds: Vec<_> = (0..tasks)
        .map(|task| {
            let owned = clients / tasks + u64::from(task < clients % tasks);
            // Ids apart per task, as the hand loops number theirs per client.
            let first = (task << 40) + 1;
            if let Some(duties) = &duties {
                let rounds = rounds_with_duties(
                    (Arc::clone(&store), log.clone()),
                    owned,
                    (Arc::clone(duties), pad),
                    deadline,
                );
                if affine {
                    // A thread of its own, never sharing a worker or moving between them.
                    return tokio::task::spawn_blocking(move || {
                        tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .expect("a runtime for one task of rounds")
                            .block_on(rounds)
                    });
                }
                return tokio::spawn(rounds);
            }
            assert!(log.is_none(), "--cell batch-par:N needs --duties");
            tokio::spawn(rounds_of_one_task(
                Arc::clone(&store),
                first,
                owned,
                (pad, keep_finished),
                deadline,
            ))
        })
        .collect();
    let mut steps = 0;
    for task in rounds {
        steps += task.await.expect("a round's task panicked");
    }
    (steps, steps as f64 / start.elapsed().as_secs_f64())
}

/// One task's rounds over `owned` procedures numbered from `first`, each value `pad`
/// bytes longer, ended procedures finished (`keep_finished`) or deleted; returns its
/// steps.
async fn rounds_of_one_task(
    store: Arc<dyn Store>,
    first: u64,
    owned: u64,
    (pad, keep_finished): (usize, bool),
    deadline: Instant,
) -> u64 {
    let env = Arc::new(());
    let mut next_id = first;
    let mut fresh = || {
        next_id += 1;
        Owned::new(next_id - 1, &env)
    };
    let mut procedures: Vec<Owned> = (0..owned).map(|_| fresh()).collect();
    let initial = procedures.iter().fold(Batch::new(), |batch, procedure| {
        batch.put(procedure.id, None, procedure.value(pad))
    });
    store.commit(initial).await.expect("commit");
    let mut steps = 0;
    while Instant::now() < deadline {
        let mut batch = Batch::new();
        for procedure in &mut procedures {
            procedure.state = match procedure
                .state
                .execute_from_state(&mut procedure.payload, &procedure.ctx)
                .await
            {
                Ok(Flow::Next(next)) => next,
                Ok(_) => unreachable!("the bench machine's handlers only move on"),
                Err(error) => panic!("step {:?} failed: {error}", procedure.state),
            };
            steps += 1;
            if procedure.state.is_terminal() {
                batch = if keep_finished {
                    batch.finish(procedure.id, procedure.value(pad))
                } else {
                    batch.delete(procedure.id)
                };
                *procedure = fresh();
            }
            batch = batch.put(procedure.id, None, procedure.value(pad));
        }
        store.commit(batch).await.expect("commit");
    }
    steps
}

/// `--duties`: what the executor does around a plain forward step besides the handler
/// and the write, done in the rounds on compact data (docs/BENCHMARKS.md, "Issue 33 in
/// stop 73"): the test that the executor is running and a worker permit (shared
/// atomics), the step's clock reads and time, a wake-log count, the handler polled
/// under `catch_unwind`, a history entry appended to the history the record keeps (the
/// newest 32, encoded), the record encoded whole (a header like the envelope's, the
/// state, the data, the history) into a block of its own, and the shared table's entry
/// made at the submit and updated at the end, under its lock. What it leaves out: the
/// `tracing` span and the `metrics` histogram (no subscriber nor recorder is installed in
/// the bench, so the executor's are no-ops too), lock and deadline checks (the bench's
/// machine has neither), and the executor's other work once a procedure (the client's
/// side of it is `--clients`).
pub struct Duties {
    running: AtomicBool,
    permits: AtomicUsize,
    wake_log: AtomicU64,
    next_id: AtomicU64,
    table: Mutex<HashMap<u64, [u64; 6]>>,
}

impl Duties {
    fn new() -> Self {
        Duties {
            running: AtomicBool::new(true),
            permits: AtomicUsize::new(0),
            wake_log: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            table: Mutex::new(HashMap::new()),
        }
    }
}

/// The newest entries of a procedure's history, encoded, oldest first.
#[derive(Default)]
struct History {
    bytes: Vec<u8>,
    lengths: VecDeque<u16>,
    dropped: u64,
}

/// Entries a record keeps, as `Config::history` by default.
const HISTORY: usize = 32;

impl History {
    fn push(&mut self, state: &str, after_ms: u64) {
        if self.lengths.len() == HISTORY {
            let oldest = usize::from(self.lengths.pop_front().expect("full"));
            self.bytes.drain(..oldest);
            self.dropped += 1;
        }
        let before = self.bytes.len();
        varint(&mut self.bytes, state.len() as u64);
        self.bytes.extend_from_slice(state.as_bytes());
        self.bytes.push(0); // kind: Execute
        varint(&mut self.bytes, after_ms);
        self.bytes.push(0); // outcome: Moved
        self.lengths
            .push_back(u16::try_from(self.bytes.len() - before).expect("short entry"));
    }
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_millis() as u64)
}

/// A procedure's record as the duties write it: an envelope-like head, the state and
/// data, the history.
fn record(procedure: &Owned, history: &History, submitted_ms: u64, updated_ms: u64) -> Vec<u8> {
    const MACHINE: &str = "bench_ten_steps";
    let mut value = Vec::with_capacity(96 + procedure.payload.data.len() + history.bytes.len());
    value.push(1); // version
    varint(&mut value, procedure.id);
    varint(&mut value, MACHINE.len() as u64);
    value.extend_from_slice(MACHINE.as_bytes());
    varint(&mut value, submitted_ms);
    varint(&mut value, updated_ms);
    value.extend_from_slice(&[0; 24]); // wait, trouble, deadline, locks, nonce, summary
    value.push(u8::try_from(procedure.state.index()).expect("fewer than 256 states"));
    varint(&mut value, procedure.payload.data.len() as u64);
    value.extend_from_slice(&procedure.payload.data);
    varint(&mut value, history.dropped);
    varint(&mut value, history.lengths.len() as u64);
    value.extend_from_slice(&history.bytes);
    value
}

/// One procedure of the duties' rounds: the compact data and what the executor keeps
/// beside it.
struct Kept {
    procedure: Owned,
    history: History,
    submitted_ms: u64,
    /// Its client, told of its end (`--clients`).
    client: Option<Ended>,
}

impl Kept {
    fn submit(duties: &Duties, env: &Arc<()>) -> Self {
        Self::submit_for(duties, env, None)
    }

    /// A procedure submitted by `client`, if given.
    fn submit_for(duties: &Duties, env: &Arc<()>, client: Option<Ended>) -> Self {
        let id = duties.next_id.fetch_add(1, Ordering::Relaxed);
        let submitted_ms = wall_ms();
        duties
            .table
            .lock()
            .expect("table")
            .insert(id, [id, submitted_ms, 0, 0, 0, 0]);
        Kept {
            procedure: Owned::new(id, env),
            history: History::default(),
            submitted_ms,
            client,
        }
    }

    /// Its record now, `pad` bytes longer (`--pad`, to write as much as the executor).
    fn value(&self, updated_ms: u64, pad: usize) -> Vec<u8> {
        let mut value = record(
            &self.procedure,
            &self.history,
            self.submitted_ms,
            updated_ms,
        );
        value.resize(value.len() + pad, 0);
        value
    }

    /// One step with the duties around it; `false` if the executor stopped.
    async fn step(&mut self, duties: &Duties) -> bool {
        if !duties.running.load(Ordering::Acquire) {
            return false;
        }
        duties.permits.fetch_add(1, Ordering::AcqRel);
        let started = Instant::now();
        duties.wake_log.fetch_add(1, Ordering::Relaxed);
        let procedure = &mut self.procedure;
        let state = procedure.state;
        let mut handler =
            std::pin::pin!(state.execute_from_state(&mut procedure.payload, &procedure.ctx));
        let outcome = std::future::poll_fn(|cx| {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                handler.as_mut().poll(cx)
            })) {
                Ok(poll) => poll,
                Err(_) => panic!("a bench handler panicked"),
            }
        })
        .await;
        duties.permits.fetch_sub(1, Ordering::AcqRel);
        let took = started.elapsed();
        std::hint::black_box(took.as_secs_f64());
        procedure.state = match outcome {
            Ok(Flow::Next(next)) => next,
            Ok(_) => unreachable!("the bench machine's handlers only move on"),
            Err(error) => panic!("step {state:?} failed: {error}"),
        };
        let now = wall_ms();
        self.history
            .push(state.name(), now.saturating_sub(self.submitted_ms));
        true
    }

    /// The end: the table's entry updated, under its lock.
    fn end(&self, duties: &Duties, now: u64) {
        if let Some(entry) = duties
            .table
            .lock()
            .expect("table")
            .get_mut(&self.procedure.id)
        {
            entry[2] = now;
            entry[3] = 1;
        }
    }
}

/// [`rounds_of_one_task`] with the executor's duties (`--duties`). With `--clients`,
/// each of the `owned` procedures has a client task, as the executor's cells do: it
/// submits a procedure through a channel the rounds take from at the start of each round,
/// waits for its end on a channel of its own, and submits the next.
async fn rounds_with_duties(
    (store, log): (Arc<dyn Store>, Option<Arc<ParallelLog>>),
    owned: u64,
    (duties, pad): (Arc<Duties>, usize),
    deadline: Instant,
) -> u64 {
    let env = Arc::new(());
    let clients = std::env::args().any(|arg| arg == "--clients");
    let (submit, mut submitted) = tokio::sync::mpsc::unbounded_channel();
    let mut procedures: Vec<Kept> = if clients {
        for _ in 0..owned {
            tokio::spawn(client(submit.clone(), deadline));
        }
        Vec::new()
    } else {
        (0..owned).map(|_| Kept::submit(&duties, &env)).collect()
    };
    drop(submit);
    let mut round = Round::new(log.is_some());
    let now = wall_ms();
    for kept in &procedures {
        round.put(kept.procedure.id, kept.value(now, pad));
    }
    store.commit(round.take()).await.expect("commit");
    let mut steps = 0;
    while Instant::now() < deadline {
        if clients {
            // With nothing to step, wait for one submit; then take every one waiting.
            let first = if procedures.is_empty() {
                match submitted.recv().await {
                    Some(first) => Some(first),
                    None => break,
                }
            } else {
                None
            };
            let waiting = std::iter::from_fn(|| submitted.try_recv().ok());
            for client in first.into_iter().chain(waiting) {
                let kept = Kept::submit_for(&duties, &env, Some(client));
                round.put(kept.procedure.id, kept.value(wall_ms(), pad));
                procedures.push(kept);
            }
        }
        let mut at = 0;
        while at < procedures.len() {
            let kept = &mut procedures[at];
            if !kept.step(&duties).await {
                return steps;
            }
            steps += 1;
            let now = wall_ms();
            let value = kept.value(now, pad);
            if !kept.procedure.state.is_terminal() {
                round.put(kept.procedure.id, value);
                at += 1;
                continue;
            }
            // The last step's record is the finish, kept for the retention window.
            round.finish(kept.procedure.id, value);
            kept.end(&duties, now);
            if clients {
                if let Some(client) = procedures.swap_remove(at).client {
                    let _ = client.send(());
                }
            } else {
                *kept = Kept::submit(&duties, &env);
                round.put(kept.procedure.id, kept.value(now, pad));
                at += 1;
            }
        }
        let frames_end = log.as_ref().map(|log| log.append(&round.frames));
        store.commit(round.take()).await.expect("commit");
        if let (Some(log), Some(end)) = (&log, frames_end) {
            // The round's records are on the file: wait for the sync that covers them.
            log.durable(end).await;
        }
    }
    println!(
        "duties: records of {} B on average",
        round.bytes / round.values.max(1)
    );
    steps
}

/// The writes of one round: a batch for the store, and the same records framed for the
/// parallel log if there is one.
struct Round {
    batch: Batch,
    frames: Vec<u8>,
    framed: bool,
    /// The bytes and number of values written, over every round.
    bytes: usize,
    values: usize,
}

impl Round {
    fn new(framed: bool) -> Self {
        Round {
            batch: Batch::new(),
            frames: Vec::new(),
            framed,
            bytes: 0,
            values: 0,
        }
    }

    fn count(&mut self, id: u64, value: &[u8]) {
        self.bytes += value.len();
        self.values += 1;
        if self.framed {
            parallel_log::frame(&mut self.frames, id, value);
        }
    }

    fn put(&mut self, id: u64, value: Vec<u8>) {
        self.count(id, &value);
        self.batch = std::mem::take(&mut self.batch).put(id, None, value);
    }

    fn finish(&mut self, id: u64, value: Vec<u8>) {
        self.count(id, &value);
        self.batch = std::mem::take(&mut self.batch).finish(id, value);
    }

    /// The round's batch; its frames are cleared for the next round.
    fn take(&mut self) -> Batch {
        self.frames.clear();
        std::mem::take(&mut self.batch)
    }
}

/// A client of `--clients`: submits a procedure, waits for its end, again until
/// `deadline`.
async fn client(submit: tokio::sync::mpsc::UnboundedSender<Ended>, deadline: Instant) {
    while Instant::now() < deadline {
        let (ended, end) = tokio::sync::oneshot::channel();
        if submit.send(ended).is_err() || end.await.is_err() {
            return;
        }
    }
}

/// Where a procedure's client hears of its end.
type Ended = tokio::sync::oneshot::Sender<()>;
