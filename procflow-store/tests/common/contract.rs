//! Behaviour every `Store` implementation must show.

use std::collections::BTreeMap;
use std::sync::Arc;

use procflow_store::{Batch, Bytes, Loaded, Op, Record, RecordInfo, Store, StoreError};

/// Runs every contract check, each on a fresh store from `new_store`.
pub async fn run_all(new_store: impl Fn() -> Arc<dyn Store>) {
    put_finish_delete(new_store().as_ref()).await;
    meta(new_store().as_ref()).await;
    unknown_finish_rejects_whole_batch(new_store().as_ref()).await;
    fencing(new_store().as_ref()).await;
    close_stops_writes(new_store().as_ref()).await;
    concurrent_commits(new_store()).await;
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

pub async fn fencing(store: &dyn Store) {
    store
        .commit(Batch::new().put(1, None, vec![]).with_fencing_token(10))
        .await
        .unwrap();
    let err = store
        .commit(Batch::new().delete(1).with_fencing_token(9))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Fenced {
                token: 9,
                highest: 10
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("lower than the highest committed token 10")
    );
    store
        .commit(Batch::new().put(2, None, vec![]).with_fencing_token(10))
        .await
        .unwrap();
    store
        .commit(Batch::new().put(3, None, vec![]).with_fencing_token(11))
        .await
        .unwrap();
    assert!(
        store
            .commit(Batch::new().with_fencing_token(10))
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
