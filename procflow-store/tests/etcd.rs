//! `EtcdStore` on a real 3-member etcd cluster on 127.0.0.1 (started per test by
//! `LocalCluster`; `sudo apt-get install -y etcd-server` if `etcd` is missing): the store
//! contract that MemStore and WalStore pass, etcd's limits, group commit and paged loads.

mod common;
#[path = "common/proxy.rs"]
mod proxy;

use std::sync::Arc;

use common::contract::Subject;
use procflow_store::etcd::etcd_client::Client;
use procflow_store::etcd::{ClusterOptions, Compaction, EtcdConfig, EtcdStore, LocalCluster};
use procflow_store::{Batch, Loaded, Store, StoreError};
use proxy::Proxy;

fn cluster() -> LocalCluster {
    LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"))
}

/// A store under a prefix no other store of the test uses.
async fn store(
    cluster: &LocalCluster,
    config: impl FnOnce(EtcdConfig) -> EtcdConfig,
) -> (EtcdStore, EtcdConfig) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let prefix = format!("/test/{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let config = config(EtcdConfig::new(cluster.endpoints(), prefix));
    (EtcdStore::connect(config.clone()).await.unwrap(), config)
}

/// Makes a new leader key: its create revision supersedes every earlier one.
async fn new_owner(client: Client, leader_key: String) -> u64 {
    let mut client = client;
    client.delete(leader_key.clone(), None).await.unwrap();
    let put = client.put(leader_key, "owner", None).await.unwrap();
    u64::try_from(put.header().unwrap().revision()).unwrap()
}

/// The cluster's current revision: each transaction that writes adds one.
async fn revision(client: &Client) -> i64 {
    let mut client = client.clone();
    let status = client.get("/", None).await.unwrap();
    status.header().unwrap().revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_store_contract() {
    let cluster = cluster();
    common::contract::run_all(|| async {
        let (store, config) = store(&cluster, |c| c).await;
        let (client, leader) = (store.client(), config.leader_key());
        Subject {
            store: Arc::new(store),
            new_owner: Box::new(move || Box::pin(new_owner(client.clone(), leader.clone()))),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_at_the_limits_commit_and_one_over_is_too_large_and_writes_nothing() {
    let cluster = cluster();
    let (store, config) = store(&cluster, |c| c).await;
    let limits = store.limits();
    let (max_ops, max_bytes) = (
        limits.max_ops_per_batch.unwrap(),
        limits.max_batch_bytes.unwrap(),
    );
    assert_eq!(
        max_ops, 126,
        "etcd's 128 ops per transaction, less the fencing and the sequence compares"
    );
    assert!(
        max_bytes > 1_400_000,
        "close to etcd's 1.5 MiB: {max_bytes}"
    );
    let token = new_owner(store.client(), config.leader_key()).await;

    // Exactly at both limits, fenced, with the most compares a batch can need: every op a
    // `Finish` of a record written by an earlier batch.
    let ops = max_ops as u64;
    let mut puts = Batch::new();
    for id in 0..ops {
        puts = puts.put(id, Some(1000 + id), vec![]);
    }
    store.commit(puts.with_fencing_token(token)).await.unwrap();
    let per_op = max_bytes / max_ops;
    let mut full = Batch::new();
    for id in 0..ops {
        let extra = if id == 0 {
            max_bytes - per_op * max_ops
        } else {
            0
        };
        full = full.finish(id, vec![7; per_op + extra]);
    }
    assert_eq!((full.ops.len(), full.payload_bytes()), (max_ops, max_bytes));
    store.commit(full.with_fencing_token(token)).await.unwrap();
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded.records.len(), max_ops);
    assert!(
        loaded
            .records
            .iter()
            .all(|r| r.finished && r.parent == Some(1000 + r.id))
    );

    // One op over.
    let mut too_many = Batch::new();
    for id in 0..=ops {
        too_many = too_many.put(500 + id, None, vec![]);
    }
    let err = store.commit(too_many).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::TooLarge {
                what: "ops per batch",
                size: 127,
                limit: 126
            }
        ),
        "{err}"
    );
    // One byte over, across several values; and one value over.
    let half = max_bytes / 2;
    let too_big =
        Batch::new()
            .put(900, None, vec![0; half])
            .put(901, None, vec![0; max_bytes - half + 1]);
    let err = store.commit(too_big).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::TooLarge {
                what: "batch bytes",
                ..
            }
        ),
        "{err}"
    );
    let err = store
        .commit(Batch::new().put(902, None, vec![0; max_bytes + 1]))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
    assert_eq!(
        store.load().await.unwrap(),
        loaded,
        "nothing of the refused batches was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commits_share_transactions() {
    let cluster = cluster();
    let (store, _) = store(&cluster, |c| c).await;
    let store = Arc::new(store);
    let client = store.client();
    let before = revision(&client).await;
    let mut tasks = Vec::new();
    for writer in 0..64u64 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            for step in 0..10u64 {
                // Every writer also bumps the same metadata key: merged, not refused.
                let batch = Batch::new()
                    .put(writer, None, step.to_le_bytes().to_vec())
                    .put_meta("last_writer", writer.to_le_bytes().to_vec());
                store.commit(batch).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let transactions = revision(&client).await - before;
    println!("640 batches in {transactions} transactions");
    assert!(
        transactions < 320,
        "640 batches took {transactions} transactions"
    );
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded.records.len(), 64);
    assert!(
        loaded
            .records
            .iter()
            .all(|r| r.value == 9u64.to_le_bytes()[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_reads_in_pages_at_one_revision() {
    let cluster = cluster();
    let (store, config) = store(&cluster, |c| c.page_size(7)).await;
    let mut expected = Loaded::default();
    for chunk in 0..10u64 {
        let mut batch = Batch::new();
        for id in chunk * 10..chunk * 10 + 10 {
            batch = batch.put(id, id.checked_sub(1), id.to_le_bytes().to_vec());
        }
        batch = batch.put_meta(format!("k{chunk}"), vec![chunk as u8]);
        store.commit(batch).await.unwrap();
    }
    for id in 0..100u64 {
        expected.records.push(procflow_store::Record {
            id,
            parent: id.checked_sub(1),
            finished: false,
            value: id.to_le_bytes().to_vec().into(),
        });
    }
    for chunk in 0..10u8 {
        expected.meta.insert(format!("k{chunk}"), vec![chunk]);
    }
    assert_eq!(store.load().await.unwrap(), expected);
    // Another store on the same prefix (a new leader) sees the same.
    let other = EtcdStore::connect(config).await.unwrap();
    assert_eq!(other.load().await.unwrap(), expected);
    assert_eq!(other.list().await.unwrap().len(), 100);
    // It finishes a record it never wrote: the parent is read from etcd.
    other
        .commit(Batch::new().finish(42, b"done".to_vec()))
        .await
        .unwrap();
    let record = store.get(42).await.unwrap().unwrap();
    assert!(record.finished);
    assert_eq!(record.parent, Some(41));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_quorum_is_an_unknown_outcome_then_recovers() {
    let mut cluster = cluster();
    let (store, _) = store(&cluster, |c| {
        c.request_timeout(std::time::Duration::from_secs(2))
    })
    .await;
    store
        .commit(Batch::new().put(1, None, vec![1]))
        .await
        .unwrap();
    cluster.kill(1).unwrap();
    cluster.kill(2).unwrap();
    let err = store
        .commit(Batch::new().put(2, None, vec![2]))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    println!("without quorum: {err}");
    cluster.restart(1).unwrap();
    cluster.restart(2).unwrap();
    // Committed or not, the store takes writes again and lost nothing acknowledged.
    let mut attempts = 0;
    while let Err(error) = store.commit(Batch::new().put(3, None, vec![3])).await {
        attempts += 1;
        assert!(
            attempts < 20,
            "no write after the members came back: {error}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let ids: Vec<u64> = store
        .load()
        .await
        .unwrap()
        .records
        .iter()
        .map(|r| r.id)
        .collect();
    assert!(ids == [1, 3] || ids == [1, 2, 3], "{ids:?}");
}

/// A store whose only endpoint is a proxy to member 0, with a short request timeout so
/// that a broken link is noticed quickly.
async fn store_behind_proxy(cluster: &LocalCluster) -> (EtcdStore, Proxy, String) {
    let proxy = Proxy::start(cluster.endpoint(0).parse().unwrap()).await;
    let prefix = format!("/proxied/{}", fastrand_suffix());
    let config = EtcdConfig::new([proxy.endpoint()], prefix.clone())
        .request_timeout(std::time::Duration::from_secs(2));
    (EtcdStore::connect(config).await.unwrap(), proxy, prefix)
}

fn fastrand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The record's stored value and etcd's count of writes to its key.
async fn record_and_version(cluster: &LocalCluster, prefix: &str, id: u64) -> (Vec<u8>, i64) {
    let mut client = Client::connect(cluster.endpoints(), None).await.unwrap();
    let response = client
        .get(format!("{prefix}/p/{id:020}"), None)
        .await
        .unwrap();
    let kv = &response.kvs()[0];
    (kv.value().to_vec(), kv.version())
}

/// Commits `batch` while `proxy` misbehaves as it was told, and breaks the link (the
/// client's side) 300 ms later, so that the store sends again over a new connection.
async fn commit_over_a_link_that_breaks(
    store: &Arc<EtcdStore>,
    proxy: &Proxy,
    batch: Batch,
) -> Result<(), StoreError> {
    let committing = {
        let store = Arc::clone(store);
        tokio::spawn(async move { store.commit(batch).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    proxy.cut();
    committing.await.unwrap()
}

/// Issue 31: a transaction held in a slow link, resent, followed by later transactions
/// of the same writer, then delivered: the late copy fails its compare and the record
/// keeps its newest value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_transaction_is_refused_and_the_record_keeps_its_newest_value() {
    let cluster = cluster();
    let (store, proxy, prefix) = store_behind_proxy(&cluster).await;
    let store = Arc::new(store);
    store
        .commit(Batch::new().put(1, None, b"v1".to_vec()))
        .await
        .unwrap();

    // v2's first attempt is held in the link; the link breaks; the store resends.
    proxy.hold();
    commit_over_a_link_that_breaks(&store, &proxy, Batch::new().put(1, None, b"v2".to_vec()))
        .await
        .expect("the resend (or the settled retry) applies v2");
    store
        .commit(Batch::new().put(1, None, b"v3".to_vec()))
        .await
        .unwrap();
    let (value, version) = record_and_version(&cluster, &prefix, 1).await;
    assert!(value.ends_with(b"v3"));

    // Now the first attempt of v2 arrives.
    let delivered = proxy.release().await;
    assert!(delivered > 0, "the held attempt carried the transaction");
    let (late_value, late_version) = record_and_version(&cluster, &prefix, 1).await;
    assert_eq!(
        (late_version, late_value.ends_with(b"v3")),
        (version, true),
        "the late copy of v2 applied over v3"
    );
    assert_eq!(store.get(1).await.unwrap().unwrap().value, b"v3".as_slice());
}

/// Issue 31: a transaction that applied but whose answer was lost is resent; the resend
/// is recognised as applied (a definite `Ok`, not an unknown outcome) and writes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_whose_first_attempt_applied_is_recognised_as_applied() {
    let cluster = cluster();
    let (store, proxy, prefix) = store_behind_proxy(&cluster).await;
    let store = Arc::new(store);
    store
        .commit(Batch::new().put(9, None, b"other".to_vec()))
        .await
        .unwrap();

    proxy.lose_answers();
    commit_over_a_link_that_breaks(&store, &proxy, Batch::new().put(1, None, b"once".to_vec()))
        .await
        .expect("an applied transaction whose answer was lost is reported applied");
    let (value, version) = record_and_version(&cluster, &prefix, 1).await;
    assert!(value.ends_with(b"once"));
    assert_eq!(version, 1, "the record was written once");
    // The writer goes on at the right number.
    store
        .commit(Batch::new().put(1, None, b"twice".to_vec()))
        .await
        .unwrap();
    assert_eq!(record_and_version(&cluster, &prefix, 1).await.1, 2);
}

const QUOTA: u64 = 16 << 20;

/// 32 writers each put a 4 KiB record 512 times: 64 MiB of values, four times the quota.
async fn write_four_quotas(store: Arc<EtcdStore>) -> Result<(), StoreError> {
    let mut tasks = Vec::new();
    for writer in 0..32u64 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            for step in 0..512u64 {
                let mut value = vec![u8::try_from(step % 251).unwrap(); 4096];
                value[..8].copy_from_slice(&step.to_le_bytes());
                store.commit(Batch::new().put(writer, None, value)).await?;
            }
            Ok::<_, StoreError>(())
        }));
    }
    for task in tasks {
        task.await.unwrap()?;
    }
    Ok(())
}

/// Issue 31: etcd with a 16 MiB quota takes 64 MiB of steps when the store compacts its
/// history; every record ends at its last step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_keeps_a_small_quota_from_filling_with_history() {
    let cluster = LocalCluster::start_with(3, ClusterOptions::new().quota_bytes(QUOTA))
        .unwrap_or_else(|e| panic!("{e}"));
    let compaction = Compaction::new(
        std::time::Duration::from_millis(200),
        std::time::Duration::ZERO,
    );
    let (store, _) = store(&cluster, |c| c.compaction(compaction)).await;
    let store = Arc::new(store);
    write_four_quotas(Arc::clone(&store))
        .await
        .expect("no write refused: the history was compacted");
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded.records.len(), 32);
    assert!(
        loaded
            .records
            .iter()
            .all(|r| r.value[..8] == 511u64.to_le_bytes())
    );
    let mut client = store.client();
    let status = client.status().await.unwrap();
    println!(
        "etcd's database: {} KiB of a {} KiB quota",
        status.db_size() >> 10,
        QUOTA >> 10
    );
}

/// The same workload without compaction fills the quota: etcd refuses writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_compaction_the_same_workload_exceeds_the_quota() {
    let cluster = LocalCluster::start_with(3, ClusterOptions::new().quota_bytes(QUOTA))
        .unwrap_or_else(|e| panic!("{e}"));
    let (store, _) = store(&cluster, |c| c.compaction(Compaction::off())).await;
    let error = write_four_quotas(Arc::new(store))
        .await
        .expect_err("64 MiB of history fit in a 16 MiB quota");
    assert!(
        error.to_string().contains("database space exceeded"),
        "{error}"
    );
}

/// Puts `count` records in batches of 100.
async fn fill(store: &EtcdStore, count: u64) {
    for chunk in (0..count).step_by(100) {
        let mut batch = Batch::new();
        for id in chunk..(chunk + 100).min(count) {
            batch = batch.put(id, None, id.to_le_bytes().to_vec());
        }
        store.commit(batch).await.unwrap();
    }
}

/// Issue 31: a store compacting every 10 ms, and writing all along, never compacts the
/// revision its own (slow, one key per page) load reads at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_is_never_broken_by_its_own_stores_compaction() {
    let cluster = cluster();
    let compaction = Compaction::new(
        std::time::Duration::from_millis(10),
        std::time::Duration::ZERO,
    );
    let (store, _) = store(&cluster, |c| c.compaction(compaction).page_size(1)).await;
    let store = Arc::new(store);
    fill(&store, 1000).await;
    let writing = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            for step in 0u64.. {
                let batch = Batch::new().put(5000, None, step.to_le_bytes().to_vec());
                store.commit(batch).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    for _ in 0..2 {
        let loaded = store
            .load()
            .await
            .expect("the load was not compacted under");
        assert_eq!(loaded.records.len(), 1001);
    }
    writing.abort();
}

/// Issue 31: another process compacts the history a load reads at: the load starts
/// again, at a newer revision, and returns a whole snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_whose_revision_another_process_compacts_starts_again() {
    let cluster = cluster();
    let (store, _) = store(&cluster, |c| c.compaction(Compaction::off()).page_size(1)).await;
    fill(&store, 2000).await;
    let store = Arc::new(store);
    let loading = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.load().await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let mut client = store.client();
    let put = client.put("/elsewhere", "x", None).await.unwrap();
    let revision = put.header().unwrap().revision();
    client.compact(revision, None).await.unwrap();
    assert!(
        !loading.is_finished(),
        "the load ended before the compaction"
    );
    let loaded = loading.await.unwrap().expect("the load started again");
    assert_eq!(loaded.records.len(), 2000);
}

/// `read_only` reads what a running store wrote, as `load` does, and writes nothing (the
/// cluster's revision does not move); an empty prefix is an error that names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_reads_a_running_store_and_writes_nothing() {
    let cluster = cluster();
    let (store, config) = store(&cluster, |c| c).await;
    common::reads_what_load_reads(&store, || EtcdStore::read_only(config.clone())).await;
    let client = store.client();
    let before = revision(&client).await;
    EtcdStore::read_only(config).await.unwrap();
    assert_eq!(revision(&client).await, before, "reading wrote to etcd");

    let empty = EtcdConfig::new(cluster.endpoints(), "/nothing/here");
    let error = EtcdStore::read_only(empty).await.err().unwrap();
    assert!(
        error
            .to_string()
            .contains("nothing is stored under prefix `/nothing/here`"),
        "{error}"
    );
}
