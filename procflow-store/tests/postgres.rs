//! `PgStore` on a real PostgreSQL server on 127.0.0.1 (started per test by
//! `LocalPostgres`; `sudo apt-get install -y postgresql` if it is missing): the store
//! contract that MemStore, WalStore and EtcdStore pass, group commit, loads at one
//! snapshot, unknown outcomes, the schema's version, and a server restarted mid-run.

mod common;
#[path = "common/proxy.rs"]
mod proxy;

use std::sync::Arc;
use std::time::Duration;

use common::contract::Subject;
use procflow_store::postgres::{LocalPostgres, PgConfig, PgStore};
use procflow_store::{Batch, Store, StoreError};
use proxy::Proxy;

fn server() -> LocalPostgres {
    LocalPostgres::start().unwrap_or_else(|e| panic!("{e}"))
}

/// A schema no other store of the test uses.
fn fresh_schema() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("test_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn store(server: &LocalPostgres, config: impl FnOnce(PgConfig) -> PgConfig) -> PgStore {
    let config = config(PgConfig::new(server.connection_string(), fresh_schema()));
    PgStore::connect(config).await.unwrap()
}

/// Makes a new owner, as a takeover of `PgElection` does: the next term.
async fn new_owner(config: PgConfig) -> u64 {
    let client = config.connect().await.unwrap();
    let sql = format!(
        "UPDATE {} SET term = term + 1 WHERE id = 1 RETURNING term",
        config.leader_table()
    );
    let term: i64 = client.query_one(&sql, &[]).await.unwrap().get(0);
    u64::try_from(term).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_store_contract() {
    let server = server();
    common::contract::run_all(|| async {
        let store = store(&server, |c| c).await;
        let config = store.config().clone();
        Subject {
            store: Arc::new(store),
            new_owner: Box::new(move || Box::pin(new_owner(config.clone()))),
        }
    })
    .await;
}

/// Each transaction stamps the rows it writes with its id (`xmin`): 256 writers putting
/// one record each at once are persisted by far fewer transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commits_share_transactions() {
    let server = server();
    let store = Arc::new(store(&server, |c| c).await);
    let tasks: Vec<_> = (0..256u64)
        .map(|id| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let batch = Batch::new()
                    .put(id, None, id.to_le_bytes().to_vec())
                    .put_meta("last_writer", id.to_le_bytes().to_vec());
                store.commit(batch).await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let client = store.config().connect().await.unwrap();
    let sql = format!(
        "SELECT count(DISTINCT xmin::text) FROM {}.records",
        store.config().schema()
    );
    let transactions: i64 = client.query_one(&sql, &[]).await.unwrap().get(0);
    println!("256 batches in {transactions} transactions");
    assert!(
        transactions < 128,
        "256 batches took {transactions} transactions"
    );
    assert_eq!(store.load().await.unwrap().records.len(), 256);
}

/// A batch refused in a group (its `Finish` names no record) leaves the others of the
/// group committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_does_not_take_its_group_down() {
    let server = server();
    let store = Arc::new(store(&server, |c| c).await);
    let tasks: Vec<_> = (0..64u64)
        .map(|id| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let batch = if id % 8 == 0 {
                    Batch::new().finish(10_000 + id, vec![])
                } else {
                    Batch::new().put(id, None, vec![1])
                };
                (id, store.commit(batch).await)
            })
        })
        .collect();
    for task in tasks {
        match task.await.unwrap() {
            (id, Err(StoreError::UnknownProcedure(unknown))) if id % 8 == 0 => {
                assert_eq!(unknown, 10_000 + id);
            }
            (id, Ok(())) if id % 8 != 0 => {}
            (id, other) => panic!("batch {id}: {other:?}"),
        }
    }
    assert_eq!(store.list().await.unwrap().len(), 56);
}

/// Pages of a load all read one snapshot: a writer that moves records around while
/// loads run (each of its commits deletes one record and adds another) never lets a load
/// see one record too many or too few.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paged_load_reads_one_snapshot() {
    let server = server();
    let store = Arc::new(store(&server, |c| c.page_size(3)).await);
    let mut batch = Batch::new();
    for id in 0..200u64 {
        batch = batch.put(id, None, id.to_le_bytes().to_vec());
    }
    store.commit(batch).await.unwrap();
    let writer = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            for round in 0..5u64 {
                for id in 0..200u64 {
                    let from = round * 1000 + id;
                    let batch = Batch::new().delete(from).put(from + 1000, None, vec![]);
                    store.commit(batch).await.unwrap();
                }
            }
        })
    };
    let mut loads = 0;
    while !writer.is_finished() {
        let loaded = store.load().await.unwrap();
        assert_eq!(loaded.records.len(), 200, "load {loads}");
        assert_eq!(store.list().await.unwrap().len(), 200, "list {loads}");
        loads += 1;
    }
    writer.await.unwrap();
    println!("{loads} loads and lists in pages of 3 while the writer ran");
    assert!(loads > 0);
    let ids: Vec<u64> = store.list().await.unwrap().iter().map(|r| r.id).collect();
    assert_eq!(ids, (5000..5200).collect::<Vec<_>>());
}

/// A commit whose answer is lost is reported as unknown; it did apply, and the store
/// goes on over a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_an_unknown_outcome_and_the_store_goes_on() {
    let server = server();
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap()).await;
    let (_, port) = proxy
        .endpoint()
        .rsplit_once(':')
        .map(|(h, p)| (h.to_owned(), p.to_owned()))
        .unwrap();
    let connection = format!("host=127.0.0.1 port={port} user=procflow dbname=postgres");
    let config = PgConfig::new(connection, fresh_schema()).request_timeout(Duration::from_secs(1));
    let store = PgStore::connect(config).await.unwrap();
    store
        .commit(Batch::new().put(1, None, vec![1]))
        .await
        .unwrap();
    proxy.lose_answers();
    let error = store
        .commit(Batch::new().put(2, None, vec![2]))
        .await
        .unwrap_err();
    assert!(error.may_have_applied(), "{error}");
    assert!(error.to_string().contains("outcome is unknown"), "{error}");
    println!("answer lost: {error}");
    // New connections pass: the store dropped the one it could not trust.
    store
        .commit(Batch::new().put(3, None, vec![3]))
        .await
        .unwrap();
    let ids: Vec<u64> = store.list().await.unwrap().iter().map(|r| r.id).collect();
    assert_eq!(ids, [1, 2, 3], "the lost answer's commit had applied");
}

/// A step's commit (one record put, nothing else) takes a statement of its own, without
/// the `apply` function: it is fenced the same, and says so the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_record_put_is_fenced_like_any_batch() {
    let server = server();
    let store = store(&server, |c| c).await;
    let config = store.config().clone();
    let first = new_owner(config.clone()).await;
    let step = |id, token| {
        Batch::new()
            .put(id, Some(9), vec![1])
            .with_fencing_token(token)
    };
    store.commit(step(1, first)).await.unwrap();
    let second = new_owner(config).await;
    let error = store.commit(step(2, first)).await.unwrap_err();
    assert!(
        matches!(error, StoreError::Fenced { token, highest } if token == first && highest == second),
        "{error}"
    );
    store.commit(step(2, second)).await.unwrap();
    let ids: Vec<(u64, Option<u64>)> = store
        .list()
        .await
        .unwrap()
        .iter()
        .map(|r| (r.id, r.parent))
        .collect();
    assert_eq!(ids, [(1, Some(9)), (2, Some(9))]);
}

/// A commit whose statement is held in a slow link times out (unknown); the store ends
/// that connection's server process before it sends anything else, so the statement,
/// delivered late, cannot overwrite a newer value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_held_in_a_slow_link_cannot_apply_after_a_later_one() {
    let server = server();
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap()).await;
    let port = proxy.endpoint().rsplit_once(':').unwrap().1.to_owned();
    let connection = format!("host=127.0.0.1 port={port} user=procflow dbname=postgres");
    let config = PgConfig::new(connection, fresh_schema()).request_timeout(Duration::from_secs(1));
    let store = PgStore::connect(config).await.unwrap();
    store
        .commit(Batch::new().put(1, None, b"v1".to_vec()))
        .await
        .unwrap();
    proxy.hold();
    let error = store
        .commit(Batch::new().put(1, None, b"late".to_vec()))
        .await
        .unwrap_err();
    assert!(error.may_have_applied(), "{error}");
    store
        .commit(Batch::new().put(1, None, b"v3".to_vec()))
        .await
        .unwrap();
    let late = proxy.deliver().await;
    assert!(late > 0, "the held statement was delivered");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let record = store.get(1).await.unwrap().unwrap();
    assert_eq!(&record.value[..], b"v3", "the late statement did not apply");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_versioned_and_a_newer_one_is_refused() {
    let server = server();
    let store = store(&server, |c| c).await;
    let config = store.config().clone();
    let client = config.connect().await.unwrap();
    let version = format!("SELECT version FROM {}.schema_version", config.schema());
    let found: i32 = client.query_one(&version, &[]).await.unwrap().get(0);
    assert_eq!(found, 1);
    // A second store on it finds what the first made.
    store
        .commit(Batch::new().put(7, None, vec![]))
        .await
        .unwrap();
    let again = PgStore::connect(config.clone()).await.unwrap();
    assert_eq!(again.list().await.unwrap().len(), 1);
    let bump = format!("UPDATE {}.schema_version SET version = 99", config.schema());
    client.execute(&bump, &[]).await.unwrap();
    let error = PgStore::connect(config).await.err().unwrap();
    assert!(
        error
            .to_string()
            .contains("version 99, written by a newer procflow"),
        "{error}"
    );
    let bad = PgConfig::new(server.connection_string(), "Robert'); DROP TABLE x; --");
    let error = PgStore::connect(bad).await.err().unwrap();
    assert!(
        error
            .to_string()
            .contains("cannot name a PostgreSQL schema"),
        "{error}"
    );
}

/// `read_only` reads what a running store wrote, as `load` does, and creates nothing: a
/// schema that holds no store stays absent, and a newer one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_reads_a_running_store_and_creates_nothing() {
    let server = server();
    let store = store(&server, |c| c).await;
    let config = store.config().clone();
    common::reads_what_load_reads(&store, || PgStore::read_only(config.clone())).await;

    let absent = PgConfig::new(server.connection_string(), fresh_schema());
    let error = PgStore::read_only(absent.clone()).await.err().unwrap();
    assert!(
        error.to_string().contains("holds no procflow store"),
        "{error}"
    );
    let client = config.connect().await.unwrap();
    let exists = "SELECT count(*) FROM pg_namespace WHERE nspname = $1";
    let count: i64 = client
        .query_one(exists, &[&absent.schema()])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 0, "reading created the schema");

    let bump = format!("UPDATE {}.schema_version SET version = 99", config.schema());
    client.execute(&bump, &[]).await.unwrap();
    let error = PgStore::read_only(config).await.err().unwrap();
    assert!(
        error
            .to_string()
            .contains("version 99, written by a newer procflow"),
        "{error}"
    );
}

/// The server killed (an immediate shutdown: crash recovery at its start) and started
/// again while writers commit: writes fail while it is down, then resume, and every
/// acknowledged write is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_resume_after_the_server_restarts_and_nothing_acknowledged_is_lost() {
    let mut server = server();
    let store = Arc::new(store(&server, |c| c.request_timeout(Duration::from_secs(2))).await);
    let acknowledged = Arc::new(std::sync::Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..4u64)
        .map(|writer| {
            let (store, acknowledged) = (Arc::clone(&store), Arc::clone(&acknowledged));
            tokio::spawn(async move {
                let mut failures = 0;
                for i in 0..150u64 {
                    let id = writer * 1000 + i;
                    loop {
                        match store.commit(Batch::new().put(id, None, vec![1])).await {
                            Ok(()) => break,
                            Err(error) => {
                                assert!(error.may_have_applied(), "{error}");
                                failures += 1;
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                    acknowledged.lock().unwrap().push(id);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                failures
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = acknowledged.lock().unwrap().len();
    // Kept until the end: dropping it stops the server.
    let _server = tokio::task::spawn_blocking(move || {
        server.restart().unwrap();
        server
    })
    .await
    .unwrap();
    let mut failures = 0;
    for writer in writers {
        failures += writer.await.unwrap();
    }
    println!("{before} writes before the restart; {failures} failed commits retried");
    assert!(before < 600, "the writers finished before the restart");
    assert!(failures > 0, "no commit saw the server go");
    let stored: Vec<u64> = store.list().await.unwrap().iter().map(|r| r.id).collect();
    for id in acknowledged.lock().unwrap().iter() {
        assert!(stored.contains(id), "acknowledged write {id} lost");
    }
    assert_eq!(stored.len(), 600);
}
