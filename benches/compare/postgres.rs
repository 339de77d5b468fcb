//! Workload 10 (issue 34): procflow on a local PostgreSQL server (`cargo bench --bench
//! compare -- --postgres`, root feature `postgres`).
//!
//! * The executor on `PgStore`, fenced with a `PgElection` term's token as a group
//!   leader's is, at 1, 16 and 256 closed-loop clients of the ten-step machine.
//! * The baseline: one client committing the same fenced one-row transactions back to
//!   back, the best a hand-written loop does: one prepared statement per transaction that
//!   reads the leader row's term under `FOR KEY SHARE` and upserts one step's record only
//!   if the term is the client's (one round trip, one commit). The one-client ratio comes
//!   from three rounds of a raw cell and the one-client executor cell side by side; the
//!   256-client ratio uses the mean of every raw cell.
//! * Failover: three `group_worker` processes; the leader is killed with SIGKILL several
//!   times, and the time until another prints `leading` is the takeover.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use procflow::executor::Executor;
use procflow::group::{Election, PgElection, Term};
use procflow::store::{Batch, BoxFuture, Limits, Loaded, Op, ProcId, Record, RecordInfo, Store};
use procflow_store::StoreError;
use procflow_store::postgres::{LocalPostgres, PgConfig, PgStore};
use tokio::runtime::Runtime;

use crate::drive::run_procedures;
use crate::group::{CLIENTS, Cell, ROUNDS, merge, one_client_ratio, print_cells, takeover};
use crate::machine::{Payload, TenSteps};

/// The lease TTL of the bench's own terms: long enough never to lapse mid-cell.
const BENCH_TTL: Duration = Duration::from_secs(10);

/// The figures of the `pg-summary` line.
pub struct Summary {
    pub pg1_vs_raw: f64,
    pub pg256_vs_raw: f64,
    pub takeover_s: f64,
}

impl Summary {
    pub fn line(&self) -> String {
        format!(
            "pg-summary: pg1_vs_raw={:.2} pg256_vs_raw={:.2} takeover_s={:.2}",
            self.pg1_vs_raw, self.pg256_vs_raw, self.takeover_s
        )
    }
}

pub fn run(quick: bool, runtime: &Runtime) -> Summary {
    let cell = Duration::from_millis(if quick { 1000 } else { 4000 });
    let server = LocalPostgres::start().unwrap_or_else(|error| panic!("{error}"));
    let connection = server.connection_string();
    println!(
        "PostgreSQL on 127.0.0.1:{} ({}), fsync and synchronous_commit on, {} ms per cell",
        server.port(),
        runtime.block_on(server_version(&connection)),
        cell.as_millis()
    );
    let value_len = runtime.block_on(probe(&connection));
    let mut raws = Vec::new();
    let mut singles = Vec::new();
    for _ in 0..ROUNDS {
        raws.push(runtime.block_on(raw_loop(&connection, value_len, cell)));
        singles.push(runtime.block_on(executor_cell(&connection, 1, cell)));
    }
    let mut cells: Vec<Cell> = CLIENTS[1..]
        .iter()
        .map(|&clients| runtime.block_on(executor_cell(&connection, clients, cell)))
        .collect();
    raws.push(runtime.block_on(raw_loop(&connection, value_len, cell)));
    let raw = raws.iter().sum::<f64>() / raws.len() as f64;
    let pg1_vs_raw = one_client_ratio(&raws, &singles);
    cells.insert(0, merge(&singles));
    let what = format!("fenced one-row transactions ({value_len} B)");
    print_cells(&what, &raws, &singles, &cells);
    let store = ["--postgres", &connection, "--schema", "bench_takeover"];
    let takeovers = takeover(&store, if quick { 3 } else { 5 });
    let takeover_s = takeovers.iter().sum::<f64>() / takeovers.len() as f64;
    let c256 = cells.iter().find(|c| c.clients == 256).expect("cell");
    Summary {
        pg1_vs_raw,
        pg256_vs_raw: c256.rate.steps_per_sec() / raw,
        takeover_s,
    }
}

async fn server_version(connection: &str) -> String {
    let client = PgConfig::new(connection, "unused")
        .connect()
        .await
        .expect("connect");
    let row = client
        .query_one("SHOW server_version", &[])
        .await
        .expect("version");
    format!("version {}", row.get::<_, String>(0))
}

/// The server's count of committed transactions so far (its statistics, flushed first).
async fn commits(connection: &str) -> u64 {
    let client = PgConfig::new(connection, "unused")
        .connect()
        .await
        .expect("connect");
    client
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await
        .expect("flush");
    let row = client
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("xact_commit");
    u64::try_from(row.get::<_, i64>(0)).unwrap_or(0)
}

/// Wins a term on `config`'s leader row, as a group's leader would.
async fn lead(config: &PgConfig, name: &str) -> (PgElection, Term) {
    let election = PgElection::new(config, name, BENCH_TTL);
    let term = election.campaign().await.expect("campaign");
    (election, term)
}

/// A fresh schema's store, connected (which creates the schema).
async fn fresh_store(connection: &str, name: &str) -> (Arc<PgStore>, PgConfig) {
    static SCHEMAS: AtomicUsize = AtomicUsize::new(0);
    let schema = format!("bench_{name}_{}", SCHEMAS.fetch_add(1, Ordering::Relaxed));
    let config = PgConfig::new(connection, schema);
    let store = PgStore::connect(config.clone()).await.expect("connect");
    (Arc::new(store), config)
}

/// A store that notes the size of every record value it is asked to put.
struct Sizes {
    inner: Arc<PgStore>,
    puts: Mutex<Vec<usize>>,
}

impl Store for Sizes {
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut puts = self.puts.lock().unwrap();
        for op in &batch.ops {
            if let Op::Put { value, .. } = op {
                puts.push(value.len());
            }
        }
        self.inner.commit(batch)
    }
    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        self.inner.load()
    }
    fn get(&self, id: ProcId) -> BoxFuture<'_, Result<Option<Record>, StoreError>> {
        self.inner.get(id)
    }
    fn list(&self) -> BoxFuture<'_, Result<Vec<RecordInfo>, StoreError>> {
        self.inner.list()
    }
    fn limits(&self) -> Limits {
        self.inner.limits()
    }
    fn close(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.close()
    }
}

/// Runs one procedure on the store and notes the size of each record it puts. Returns
/// the mean, the raw loop's value size.
async fn probe(connection: &str) -> usize {
    let (store, config) = fresh_store(connection, "probe").await;
    let sizes = Arc::new(Sizes {
        inner: store,
        puts: Mutex::new(Vec::new()),
    });
    let (election, term) = lead(&config, "probe").await;
    let executor = fenced_executor(Arc::clone(&sizes) as Arc<dyn Store>, term).await;
    let id = executor.submit(Payload::new(0)).await.expect("submit");
    executor.wait(id).await.expect("wait");
    executor.shutdown().await.expect("shutdown");
    let _ = election.resign(term).await;
    let puts = sizes.puts.lock().unwrap().clone();
    let mean = puts.iter().sum::<usize>() / puts.len().max(1);
    println!("one procedure alone puts records of {puts:?} B; the raw loop puts {mean} B");
    mean
}

/// An executor of the ten-step machine on `store`, fenced with `term`'s token.
async fn fenced_executor(store: Arc<dyn Store>, term: Term) -> Executor<()> {
    Executor::builder_shared(store, Arc::new(()))
        .register::<TenSteps>()
        .fencing_token(term.token)
        .start()
        .await
        .expect("start the executor")
}

/// The executor on a fresh schema, `clients` closed-loop clients for `cell`.
async fn executor_cell(connection: &str, clients: u64, cell: Duration) -> Cell {
    let (store, config) = fresh_store(connection, &format!("executor{clients}")).await;
    let (election, term) = lead(&config, "bench").await;
    let executor = fenced_executor(store, term).await;
    let before = commits(connection).await;
    let rate = run_procedures(&executor, clients, cell).await;
    let after = commits(connection).await;
    executor.shutdown().await.expect("shutdown");
    let _ = election.resign(term).await;
    Cell {
        clients,
        rate,
        txns: after.saturating_sub(before),
    }
}

/// One client committing fenced one-row transactions back to back for `cell`, each
/// waiting for the last. Returns transactions (steps) per second.
async fn raw_loop(connection: &str, value_len: usize, cell: Duration) -> f64 {
    let (_store, config) = fresh_store(connection, "raw").await;
    let (election, term) = lead(&config, "raw").await;
    let client = config.connect().await.expect("connect");
    let schema = config.schema();
    let statement = client
        .prepare(&format!(
            "WITH fence AS (SELECT term FROM {schema}.leader WHERE id = 1 AND term = $1 FOR KEY SHARE) \
             INSERT INTO {schema}.records (id, parent, finished, value) \
             SELECT $2, NULL, false, $3 FROM fence \
             ON CONFLICT (id) DO UPDATE SET value = excluded.value"
        ))
        .await
        .expect("prepare");
    let token = i64::try_from(term.token).expect("a term");
    let value = vec![7u8; value_len];
    let start = Instant::now();
    let mut txns = 0i64;
    while start.elapsed() < cell {
        // As many rows as the 256-client cell has live procedures.
        let id = txns % 256;
        let written = client
            .execute(&statement, &[&token, &id, &value])
            .await
            .expect("a transaction");
        assert_eq!(written, 1, "the raw loop's term is current");
        txns += 1;
    }
    let rate = txns as f64 / start.elapsed().as_secs_f64();
    let _ = election.resign(term).await;
    rate
}
