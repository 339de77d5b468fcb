//! How a workload is driven: closed-loop clients, each running one procedure after the
//! other for a fixed time; the same procedures through procflow's executor; and driven by
//! hand, persisting each step as a user without procflow would.

use crate::machine::{Payload, STEPS, TenSteps, drive, encode};
use procflow::executor::{Config, Executor, ExecutorError, Outcome};
use procflow::store::Store;
use procflow::{Context, ProcedureId, StateMachine};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Steps finished and the time they took.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    pub steps: u64,
    pub procedures: u64,
    pub elapsed: Duration,
}

impl Rate {
    pub const ZERO: Rate = Rate {
        steps: 0,
        procedures: 0,
        elapsed: Duration::ZERO,
    };

    pub fn steps_per_sec(&self) -> f64 {
        self.steps as f64 / self.elapsed.as_secs_f64()
    }
}

impl std::ops::AddAssign for Rate {
    fn add_assign(&mut self, other: Rate) {
        self.steps += other.steps;
        self.procedures += other.procedures;
        self.elapsed += other.elapsed;
    }
}

/// Two sides of a ratio measured in turns: each side's rate summed over the rounds, and
/// each round's pair.
pub struct Alternated {
    pub a: Rate,
    pub b: Rate,
    pub rounds: Vec<(Rate, Rate)>,
}

impl Alternated {
    /// The lowest and highest per-round ratio of `a` over `b`.
    pub fn spread(&self) -> (f64, f64) {
        let ratios = self
            .rounds
            .iter()
            .map(|(a, b)| a.steps_per_sec() / b.steps_per_sec());
        ratios.fold((f64::INFINITY, 0.0), |(lo, hi), r| (lo.min(r), hi.max(r)))
    }
}

/// Runs `rounds` rounds of `a` for `slice`, then `b` for `slice`.
///
/// Why: this VM's speed drifts from one second to the next (docs/BENCHMARKS.md), so two
/// cells measured seconds apart compare two different machines. Taking turns puts the
/// same drift into both sides of a ratio. A side whose procedures take long to end
/// should get slices long against that time: each slice ends with its last procedure.
pub async fn alternate<A, FA, B, FB>(rounds: u32, slice: Duration, mut a: A, mut b: B) -> Alternated
where
    A: FnMut(Duration) -> FA,
    FA: Future<Output = Rate>,
    B: FnMut(Duration) -> FB,
    FB: Future<Output = Rate>,
{
    let mut total = Alternated {
        a: Rate::ZERO,
        b: Rate::ZERO,
        rounds: Vec::new(),
    };
    for _ in 0..rounds {
        let first = a(slice).await;
        let second = b(slice).await;
        total.a += first;
        total.b += second;
        total.rounds.push((first, second));
    }
    total
}

/// Runs `clients` tasks; each starts procedures one after the other (`run(client, n)`
/// runs one to its end and returns its steps) until `duration` has passed. The time
/// counted ends when the last client has finished its last procedure, so every step
/// counted is complete (durable, where the workload persists).
pub async fn closed_loop<F, Fut>(clients: u64, duration: Duration, run: F) -> Rate
where
    F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = u64> + Send + 'static,
{
    let run = Arc::new(run);
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let run = Arc::clone(&run);
            tokio::spawn(async move {
                let (mut steps, mut procedures) = (0, 0);
                while start.elapsed() < duration {
                    steps += run(client, procedures).await;
                    procedures += 1;
                }
                (steps, procedures)
            })
        })
        .collect();
    let (mut steps, mut procedures) = (0, 0);
    for task in tasks {
        let (s, p) = task.await.expect("client task");
        steps += s;
        procedures += p;
    }
    Rate {
        steps,
        procedures,
        elapsed: start.elapsed(),
    }
}

/// What a hand-written loop persists for procedure `id`, in this order.
pub enum Write {
    /// Its initial state (`machine::encode`), before the first step.
    Initial(Vec<u8>),
    /// Its state after a step.
    Step(Vec<u8>),
    /// It has ended.
    End,
}

/// How a hand loop numbers its procedures.
#[derive(Clone, Copy)]
pub enum Ids {
    /// The client's number, then its procedure's: each client's procedures are a range
    /// of their own.
    PerClient,
    /// One count for all, in the order procedures start, as the executor numbers them:
    /// records kept after their procedure ends then sit together, behind the live ones.
    Sequential,
}

/// `clients` closed-loop clients driving the ten-step machine's handlers by hand, each
/// procedure's writes made by `persist(id, write)`.
pub async fn hand_persisting_loop<P, Fut>(
    clients: u64,
    duration: Duration,
    ids: Ids,
    persist: P,
) -> Rate
where
    P: Fn(u64, Write) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let persist = Arc::new(persist);
    let env = Arc::new(());
    let next = Arc::new(std::sync::atomic::AtomicU64::new(1));
    closed_loop(clients, duration, move |client, n| {
        let id = match ids {
            Ids::PerClient => client << 32 | n,
            Ids::Sequential => next.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        let ctx = Context::new(ProcedureId::new(id), Arc::clone(&env));
        let persist = Arc::clone(&persist);
        async move {
            let mut payload = Payload::new(id);
            persist(id, Write::Initial(encode(TenSteps::INITIAL, &payload))).await;
            let steps = drive(&mut payload, &ctx, |state, payload| {
                persist(id, Write::Step(encode(state, payload)))
            })
            .await;
            persist(id, Write::End).await;
            steps
        }
    })
    .await
}

/// Starts an executor on `store` and runs `clients` closed-loop clients submitting the
/// ten-step procedure and waiting for it. Returns the rate and the executor, still
/// running (read the store's counters, then shut it down).
pub async fn executor_closed_loop(
    store: Arc<dyn Store>,
    clients: u64,
    duration: Duration,
) -> (Rate, Executor<()>) {
    let executor = start_executor(store).await;
    let rate = run_procedures(&executor, clients, duration).await;
    (rate, executor)
}

/// The executor's settings in every workload: the defaults, but for `-- --history N`,
/// the step-history entries each record keeps (to measure what the history costs),
/// `-- --max-running N`, the root procedures that may run at once, and
/// `-- --retention-ms MS`, how long a finished procedure is kept (looked for as often,
/// at least every 50 ms), to measure what finished procedures kept in the store cost.
pub fn config() -> Config {
    let history = crate::flag_value("--history", "--history N: the entries each record keeps");
    let default = Config::default();
    let max_running = crate::flag_value(
        "--max-running",
        "--max-running N: root procedures running at once",
    );
    let mut config = Config {
        history: history.unwrap_or(default.history),
        max_running: max_running.unwrap_or(default.max_running),
        ..default
    };
    let retention = crate::flag_value(
        "--retention-ms",
        "--retention-ms MS: how long finished procedures are kept",
    );
    if let Some(ms) = retention {
        config.retention = Duration::from_millis(ms);
        config.cleanup_interval = Duration::from_millis(ms.max(50));
    }
    config
}

/// Whether the cells keep finished procedures for less than the default retention
/// (`--retention-ms`): they may then be gone before a client waits for them.
fn short_retention() -> bool {
    static SHORT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SHORT.get_or_init(|| config().retention < Config::default().retention)
}

/// An executor on `store` that runs the ten-step machine.
pub async fn start_executor(store: Arc<dyn Store>) -> Executor<()> {
    Executor::builder(store, ())
        .register::<TenSteps>()
        .config(config())
        .start()
        .await
        .expect("start the executor")
}

/// `clients` closed-loop clients submitting the ten-step procedure to `executor` and
/// waiting for it, for `duration`.
pub async fn run_procedures(executor: &Executor<()>, clients: u64, duration: Duration) -> Rate {
    let handle = executor.clone();
    closed_loop(clients, duration, move |client, n| {
        let executor = handle.clone();
        async move {
            let id = executor
                .submit(Payload::new(client << 32 | n))
                .await
                .expect("submit");
            match executor.wait(id).await {
                Ok(outcome) => assert_eq!(outcome, Outcome::Succeeded),
                // Ended and deleted already: only a retention shorter than the wait for
                // `wait` (`--retention-ms`) gets here.
                Err(ExecutorError::NotFound(_)) if short_retention() => {}
                Err(error) => panic!("wait: {error:?}"),
            }
            STEPS
        }
    })
    .await
}

/// `WalStore::commit` alone, without the executor: `writers` tasks each committing
/// one-`Put` batches of `value_len` bytes back to back for `duration`. Returns commits/s
/// and commits per group-commit fsync.
pub async fn store_commit_loop(
    store: Arc<procflow::store::WalStore>,
    writers: u64,
    value_len: usize,
    duration: Duration,
) -> (f64, f64) {
    let handle = Arc::clone(&store);
    let rate = closed_loop(writers, duration, move |writer, _| {
        let store = Arc::clone(&handle);
        async move {
            let batch = procflow::store::Batch::new().put(writer, None, vec![7; value_len]);
            store.commit(batch).await.expect("commit");
            1
        }
    })
    .await;
    let stats = store.stats();
    store.close().await.expect("close");
    (
        rate.steps_per_sec(),
        stats.commits as f64 / stats.group_syncs.max(1) as f64,
    )
}
