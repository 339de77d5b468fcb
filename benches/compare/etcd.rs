//! Workload 8 (issue 14): procflow on a local 3-member etcd (`cargo bench --bench compare
//! -- --etcd`, root feature `etcd`).
//!
//! * The executor on `EtcdStore`, fenced with a term's token as a group leader's is, at
//!   1, 16 and 256 closed-loop clients of the ten-step machine.
//! * The baseline: one client committing the same fenced transactions back to back, each
//!   one step's put (the compare of the leader key's create revision, one put of a step's
//!   record, the failure branch's read of the leader key). The one-client ratio comes from
//!   three rounds of a raw cell and the one-client executor cell side by side; the
//!   256-client ratio uses the mean of every raw cell.
//! * For the record, not as a baseline: the raw loop with the store's per-writer sequence
//!   compare-and-put added to each transaction, to show what exactly-once costs.
//! * Failover: three `group_worker` processes; the leader is killed with SIGKILL several
//!   times, and the time until another prints `leading` is the takeover.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use procflow::executor::Executor;
use procflow::group::{Election, EtcdElection, Term};
use procflow_store::etcd::etcd_client::{
    Client, Compare, CompareOp, EventType, Txn, TxnOp, WatchOptions,
};
use procflow_store::etcd::{EtcdConfig, EtcdStore, LocalCluster};
use tokio::runtime::Runtime;

use crate::drive::run_procedures;
use crate::group::{CLIENTS, Cell, ROUNDS, merge, one_client_ratio, print_cells, takeover};
use crate::machine::{Payload, TenSteps};

/// The lease TTL of the bench's own terms: long enough never to lapse mid-cell.
const BENCH_TTL: Duration = Duration::from_secs(10);

/// The figures of the `etcd-summary` line.
pub struct Summary {
    pub etcd1_vs_raw: f64,
    pub etcd256_vs_raw: f64,
    pub takeover_s: f64,
    /// etcd's database size after the executor cells (the largest member's), MiB.
    pub db_mib_after: f64,
}

impl Summary {
    pub fn line(&self) -> String {
        format!(
            "etcd-summary: etcd1_vs_raw={:.2} etcd256_vs_raw={:.2} takeover_s={:.2} db_mib_after={:.1}",
            self.etcd1_vs_raw, self.etcd256_vs_raw, self.takeover_s, self.db_mib_after
        )
    }
}

/// What the raw loop's transactions compare.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fence {
    /// The leader key's create revision: the baseline of the ratios.
    Term,
    /// That, and a writer's sequence key whose value each transaction compares and
    /// advances, as the store's transactions do (for the record: not a baseline).
    TermAndSequence,
}

pub fn run(quick: bool, runtime: &Runtime) -> Summary {
    let cell = Duration::from_millis(if quick { 1000 } else { 4000 });
    let cluster = LocalCluster::start(3).unwrap_or_else(|error| panic!("{error}"));
    let endpoints = cluster.endpoints().to_vec();
    println!(
        "etcd: 3 members on 127.0.0.1 ({}), {} ms per cell",
        etcd_version(),
        cell.as_millis()
    );
    let value_len = runtime.block_on(probe(&endpoints));
    // The one-client ratio is the one noise moves most (the raw loop's own rate drifts by
    // up to a quarter over a run): it is measured in rounds of a raw cell and the
    // one-client executor cell, side by side, and the ratio is taken over their sums.
    let mut raws = Vec::new();
    let mut singles = Vec::new();
    for _ in 0..ROUNDS {
        raws.push(runtime.block_on(raw_loop(&endpoints, value_len, cell, Fence::Term)));
        singles.push(runtime.block_on(executor_cell(&endpoints, 1, cell)));
    }
    let mut cells: Vec<Cell> = CLIENTS[1..]
        .iter()
        .map(|&clients| runtime.block_on(executor_cell(&endpoints, clients, cell)))
        .collect();
    raws.push(runtime.block_on(raw_loop(&endpoints, value_len, cell, Fence::Term)));
    let sequenced = runtime.block_on(raw_loop(
        &endpoints,
        value_len,
        cell,
        Fence::TermAndSequence,
    ));
    let raw = raws.iter().sum::<f64>() / raws.len() as f64;
    println!(
        "the raw loop with a writer's sequence compare-and-put in each transaction, as the store sends them: {sequenced:.0}/s, {:.2} of the plain raw mean",
        sequenced / raw
    );
    let etcd1_vs_raw = one_client_ratio(&raws, &singles);
    cells.insert(0, merge(&singles));
    let what = format!("fenced one-put transactions ({value_len} B)");
    print_cells(&what, &raws, &singles, &cells);
    let db_mib_after = runtime.block_on(db_mib(&endpoints));
    println!(
        "etcd's database after the cells: {db_mib_after:.1} MiB (the largest member's; the stores compact every minute, keeping five)"
    );
    let endpoints = cluster.endpoints().join(",");
    let store = ["--endpoints", &endpoints, "--prefix", "/bench/takeover"];
    let takeovers = takeover(&store, if quick { 3 } else { 5 });
    let takeover_s = takeovers.iter().sum::<f64>() / takeovers.len() as f64;
    let c256 = cells.iter().find(|c| c.clients == 256).expect("cell");
    Summary {
        etcd1_vs_raw,
        etcd256_vs_raw: c256.rate.steps_per_sec() / raw,
        takeover_s,
        db_mib_after,
    }
}

/// The largest member's database size, in MiB (etcd's `status`, member by member).
async fn db_mib(endpoints: &[String]) -> f64 {
    let mut largest = 0;
    for endpoint in endpoints {
        let mut client = Client::connect([endpoint], None).await.expect("connect");
        let status = client.status().await.expect("status");
        largest = largest.max(status.db_size());
    }
    largest as f64 / f64::from(1 << 20)
}

/// `etcd --version`'s first line.
fn etcd_version() -> String {
    let binary = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into());
    std::process::Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "version unknown".into())
}

/// Wins a term on `config`'s leader key, as a group's leader would.
async fn lead(client: &Client, config: &EtcdConfig, name: &str) -> (EtcdElection, Term) {
    let election = EtcdElection::new(client.clone(), config, name, BENCH_TTL);
    let term = election.campaign().await.expect("campaign");
    (election, term)
}

/// etcd's current revision: one more per transaction that writes.
async fn revision(client: &Client) -> i64 {
    let mut client = client.clone();
    let response = client.get("revision-probe", None).await.expect("get");
    response.header().expect("a header").revision()
}

/// Runs one procedure on the etcd store and watches what it wrote: the transactions
/// and the size of each record put. Returns the mean size, the raw loop's value size.
async fn probe(endpoints: &[String]) -> usize {
    let config = EtcdConfig::new(endpoints.to_vec(), "/bench/probe");
    let store = Arc::new(EtcdStore::connect(config.clone()).await.expect("connect"));
    let client = store.client();
    let (election, term) = lead(&client, &config, "probe").await;
    let executor = fenced_executor(Arc::clone(&store), term).await;
    let before = revision(&client).await;
    let id = executor.submit(Payload::new(0)).await.expect("submit");
    executor.wait(id).await.expect("wait");
    // Before the shutdown: closing the store deletes its sequence key, one more revision.
    let after = revision(&client).await;
    executor.shutdown().await.expect("shutdown");
    let mut watcher = client.clone();
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(before + 1);
    let mut stream = watcher
        .watch("/bench/probe/p/", Some(options))
        .await
        .expect("watch");
    let mut sizes = Vec::new();
    let next = Duration::from_secs(5);
    'events: while let Ok(message) = tokio::time::timeout(next, stream.message()).await {
        let Some(response) = message.expect("watch") else {
            break;
        };
        for event in response.events() {
            let kv = event.kv().expect("an event's key");
            if event.event_type() == EventType::Put {
                sizes.push(kv.value().len());
            }
            if kv.mod_revision() >= after {
                break 'events;
            }
        }
    }
    let _ = election.resign(term).await;
    let mean = sizes.iter().sum::<usize>() / sizes.len().max(1);
    println!(
        "one procedure alone = {} transactions putting records of {:?} B; the raw loop puts {mean} B",
        after - before,
        sizes
    );
    mean
}

/// An executor of the ten-step machine on `store`, fenced with `term`'s token.
async fn fenced_executor(store: Arc<EtcdStore>, term: Term) -> Executor<()> {
    Executor::builder(store, ())
        .register::<TenSteps>()
        .fencing_token(term.token)
        .start()
        .await
        .expect("start the executor")
}

/// The executor on a fresh prefix, `clients` closed-loop clients for `cell`.
async fn executor_cell(endpoints: &[String], clients: u64, cell: Duration) -> Cell {
    static CELLS: AtomicUsize = AtomicUsize::new(0);
    let n = CELLS.fetch_add(1, Ordering::Relaxed);
    let config = EtcdConfig::new(endpoints.to_vec(), format!("/bench/executor{clients}-{n}"));
    let store = Arc::new(EtcdStore::connect(config.clone()).await.expect("connect"));
    let client = store.client();
    let (election, term) = lead(&client, &config, "bench").await;
    let executor = fenced_executor(store, term).await;
    let before = revision(&client).await;
    let rate = run_procedures(&executor, clients, cell).await;
    let after = revision(&client).await;
    executor.shutdown().await.expect("shutdown");
    let _ = election.resign(term).await;
    Cell {
        clients,
        rate,
        txns: u64::try_from(after - before).unwrap_or(0),
    }
}

/// One client committing fenced one-put transactions back to back for `cell`, each
/// waiting for the last. Returns transactions (steps) per second.
async fn raw_loop(endpoints: &[String], value_len: usize, cell: Duration, fence: Fence) -> f64 {
    static LOOPS: AtomicUsize = AtomicUsize::new(0);
    let prefix = format!("/bench/raw{}", LOOPS.fetch_add(1, Ordering::Relaxed));
    let config = EtcdConfig::new(endpoints.to_vec(), prefix.clone());
    let mut client = Client::connect(endpoints, None).await.expect("connect");
    let (election, term) = lead(&client, &config, "raw").await;
    let leader = config.leader_key();
    let token = i64::try_from(term.token).expect("a revision");
    let sequence_key = format!("{prefix}/w/raw");
    let mut sequence = 0u64;
    client
        .put(sequence_key.clone(), sequence.to_le_bytes().to_vec(), None)
        .await
        .expect("put the sequence key");
    let value = vec![7u8; value_len];
    let start = Instant::now();
    let mut txns = 0u64;
    while start.elapsed() < cell {
        // As many keys as the 256-client cell has live procedures.
        let key = format!("{prefix}/p/{:020}", txns % 256);
        let mut compares = vec![Compare::create_revision(
            leader.clone(),
            CompareOp::Equal,
            token,
        )];
        let mut puts = vec![TxnOp::put(key, value.clone(), None)];
        if fence == Fence::TermAndSequence {
            let (now, next) = (sequence.to_le_bytes(), (sequence + 1).to_le_bytes());
            compares.push(Compare::value(
                sequence_key.clone(),
                CompareOp::Equal,
                now.to_vec(),
            ));
            puts.push(TxnOp::put(sequence_key.clone(), next.to_vec(), None));
            sequence += 1;
        }
        let txn = Txn::new()
            .when(compares)
            .and_then(puts)
            .or_else([TxnOp::get(leader.clone(), None)]);
        let response = client.txn(txn).await.expect("txn");
        assert!(response.succeeded(), "the raw loop's term is current");
        txns += 1;
    }
    let rate = txns as f64 / start.elapsed().as_secs_f64();
    let _ = election.resign(term).await;
    rate
}
