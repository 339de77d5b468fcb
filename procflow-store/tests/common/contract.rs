//! Behaviour every `Store` implementation must show.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use procflow_store::{Batch, BoxFuture, Bytes, Loaded, Op, Record, RecordInfo, Store, StoreError};

/// A store under test, and how to make a new owner of it: a fencing token that supersedes
/// every earlier one.
pub struct Subject {
    pub store: Arc<dyn Store>,
    pub new_owner: Box<dyn Fn() -> BoxFuture<'static, u64> + Send + Sync>,
}

impl Subject {
    /// For stores that keep the highest token committed (MemStore, WalStore): any larger
    /// number is a newer owner.
    pub fn counting(store: Arc<dyn Store>) -> Self {
        let next = Arc::new(AtomicU64::new(10));
        Subject {
            store,
            new_owner: Box::new(move || {
                let token = next.fetch_add(1, Ordering::Relaxed);
                Box::pin(async move { token })
            }),
        }
    }
}

/// Runs every contract check, each on a fresh store from `new_subject`.
pub async fn run_all<F: Future<Output = Subject>>(new_subject: impl Fn() -> F) {
    put_finish_delete(new_subject().await.store.as_ref()).await;
    meta(new_subject().await.store.as_ref()).await;
    unknown_finish_rejects_whole_batch(new_subject().await.store.as_ref()).await;
    create_meta_is_create_only(new_subject().await.store).await;
    fencing(new_subject().await).await;
    close_stops_writes(new_subject().await.store.as_ref()).await;
    concurrent_commits(new_subject().await.store).await;
}

fn record(id: u64, parent: Option<u64>, finished: bool, value: &[u8]) -> Record {
    Record {
        id,
        parent,
        finished,
        value: Bytes::copy_from_slice(value),
    }
}

pub async fn put_finish_delete(store: &dyn Store) {
    store
        .commit(
            Batch::new()
                .put(2, None, b"two".to_vec())
                .put(1, Some(2), b"one".to_vec()),
        )
        .await
        .unwrap();
    store
        .commit(Batch::new().finish(1, b"done".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        store.get(1).await.unwrap(),
        Some(record(1, Some(2), true, b"done"))
    );
    assert_eq!(
        store.list().await.unwrap(),
        vec![
            RecordInfo {
                id: 1,
                parent: Some(2),
                finished: true,
                value_len: 4
            },
            RecordInfo {
                id: 2,
                parent: None,
                finished: false,
                value_len: 3
            },
        ]
    );
    // Put replaces, Delete of an unknown id is a no-op.
    store
        .commit(Batch::new().put(2, None, b"2".to_vec()).delete(77))
        .await
        .unwrap();
    store.commit(Batch::new().delete(1)).await.unwrap();
    assert_eq!(store.get(1).await.unwrap(), None);
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded.records, vec![record(2, None, false, b"2")]);
}

pub async fn meta(store: &dyn Store) {
    let mut batch = Batch::new();
    batch.push(Op::PutMeta {
        key: "hwm".into(),
        value: vec![1],
    });
    batch.push(Op::PutMeta {
        key: "nonce".into(),
        value: vec![2],
    });
    store.commit(batch).await.unwrap();
    store
        .commit(Batch::new().delete_meta("nonce").delete_meta("absent"))
        .await
        .unwrap();
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded.meta, BTreeMap::from([("hwm".to_string(), vec![1])]));

    // A prefix read sees its range only, and what was just committed.
    let batch = Batch::new()
        .put_meta("req/1", vec![3])
        .put_meta("req/2", vec![4])
        .put_meta("req", vec![5])
        .put_meta("reqs/x", vec![6]);
    store.commit(batch).await.unwrap();
    let requests = store.meta("req/").await.unwrap();
    let expected = [
        ("req/1".to_string(), vec![3]),
        ("req/2".to_string(), vec![4]),
    ];
    assert_eq!(requests, BTreeMap::from(expected));
    assert_eq!(store.meta("").await.unwrap().len(), 5);
    assert!(store.meta("zzz").await.unwrap().is_empty());
}

pub async fn unknown_finish_rejects_whole_batch(store: &dyn Store) {
    let err = store
        .commit(Batch::new().put(1, None, vec![]).finish(5, vec![]))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::UnknownProcedure(5)), "{err}");
    assert_eq!(store.load().await.unwrap(), Loaded::default());
    // Put then Finish in one batch is fine.
    store
        .commit(Batch::new().put(5, None, vec![]).finish(5, vec![9]))
        .await
        .unwrap();
    assert_eq!(
        store.get(5).await.unwrap(),
        Some(record(5, None, true, &[9]))
    );
}

/// `CreateMeta` writes a key only if it is absent, and a refused batch writes nothing;
/// of writers racing to create one key, exactly one wins.
pub async fn create_meta_is_create_only(store: Arc<dyn Store>) {
    store
        .commit(Batch::new().create_meta("req/a", vec![1]))
        .await
        .unwrap();
    let err = store
        .commit(
            Batch::new()
                .put(1, None, vec![])
                .create_meta("req/a", vec![2]),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::MetaExists { key } if key == "req/a"),
        "{err}"
    );
    assert!(!err.may_have_applied());
    let loaded = store.load().await.unwrap();
    assert!(loaded.records.is_empty(), "nothing of a refused batch");
    assert_eq!(loaded.meta["req/a"], vec![1], "the first value stays");
    // Deleted, it can be created again.
    store
        .commit(Batch::new().delete_meta("req/a"))
        .await
        .unwrap();
    store
        .commit(Batch::new().create_meta("req/a", vec![3]))
        .await
        .unwrap();
    assert_eq!(store.meta("req/").await.unwrap()["req/a"], vec![3]);
    // Racing writers, with other writes between them: one create wins.
    let tasks: Vec<_> = (0..8u8)
        .map(|writer| {
            let store = store.clone();
            tokio::spawn(async move {
                let batch = Batch::new()
                    .put(100 + u64::from(writer), None, vec![])
                    .create_meta("req/race", vec![writer]);
                store.commit(batch).await
            })
        })
        .collect();
    let mut won = Vec::new();
    for (writer, task) in tasks.into_iter().enumerate() {
        match task.await.unwrap() {
            Ok(()) => won.push(writer),
            Err(StoreError::MetaExists { .. }) => {}
            Err(other) => panic!("writer {writer}: {other}"),
        }
    }
    assert_eq!(won.len(), 1, "exactly one create wins: {won:?}");
    let loaded = store.load().await.unwrap();
    let winner = u8::try_from(won[0]).unwrap();
    assert_eq!(loaded.meta["req/race"], vec![winner]);
    assert_eq!(
        loaded.records.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![100 + u64::from(winner)],
        "the losers' batches wrote nothing"
    );
}

pub async fn fencing(subject: Subject) {
    let store = subject.store.as_ref();
    let first = (subject.new_owner)().await;
    store
        .commit(Batch::new().put(1, None, vec![]).with_fencing_token(first))
        .await
        .unwrap();
    let second = (subject.new_owner)().await;
    assert!(second > first, "tokens grow: {first} then {second}");
    store
        .commit(Batch::new().put(2, None, vec![]).with_fencing_token(second))
        .await
        .unwrap();
    let err = store
        .commit(Batch::new().delete(1).with_fencing_token(first))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Fenced { token, highest } if token == first && highest == second),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("is stale; the store's owner token is {second}")),
        "{err}"
    );
    store
        .commit(Batch::new().put(3, None, vec![]).with_fencing_token(second))
        .await
        .unwrap();
    assert!(
        store
            .commit(Batch::new().put(4, None, vec![]).with_fencing_token(first))
            .await
            .is_err()
    );
    assert_eq!(store.list().await.unwrap().len(), 3);
}

pub async fn close_stops_writes(store: &dyn Store) {
    store
        .commit(Batch::new().put(1, None, vec![1]))
        .await
        .unwrap();
    store.close().await.unwrap();
    let err = store
        .commit(Batch::new().put(2, None, vec![]))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Closed), "{err}");
}

pub async fn concurrent_commits(store: Arc<dyn Store>) {
    let mut tasks = Vec::new();
    for writer in 0..16u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..20u64 {
                let id = writer * 1000 + i;
                store
                    .commit(Batch::new().put(id, None, id.to_le_bytes().to_vec()))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded.records.len(), 16 * 20);
    assert!(loaded.records.windows(2).all(|w| w[0].id < w[1].id));
}
