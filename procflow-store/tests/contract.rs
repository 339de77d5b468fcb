//! Contract tests every [`Store`] must pass; run here against `MemStore` and, in
//! `tests/wal.rs`, against `WalStore` on both I/O backends.

use std::sync::Arc;

use procflow_store::{Batch, Limits, Loaded, MemStore, Record, RecordInfo, Store, StoreError};

mod common;

use common::contract::Subject;

#[tokio::test]
async fn mem_store_contract() {
    common::contract::run_all(|| async { Subject::counting(Arc::new(MemStore::new())) }).await;
}

#[tokio::test]
async fn mem_store_emulates_etcd_limits() {
    let limits = Limits {
        max_ops_per_batch: Some(128),
        max_value_bytes: Some(1_536 * 1024),
        max_batch_bytes: None,
    };
    let store = MemStore::with_limits(limits);
    assert_eq!(store.limits(), limits);
    let mut big = Batch::new();
    for id in 0..129 {
        big = big.put(id, None, vec![]);
    }
    let err = store.commit(big).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::TooLarge {
                size: 129,
                limit: 128,
                ..
            }
        ),
        "{err}"
    );
    let err = store
        .commit(Batch::new().put(1, None, vec![0; 1_536 * 1024 + 1]))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
    // A rejected batch changes nothing.
    assert_eq!(store.load().await.unwrap(), Loaded::default());
    store
        .commit(Batch::new().put(1, None, vec![0; 1_536 * 1024]))
        .await
        .unwrap();
    assert_eq!(
        store.list().await.unwrap(),
        vec![RecordInfo {
            id: 1,
            parent: None,
            finished: false,
            value_len: 1_536 * 1024
        }]
    );
    assert_eq!(
        store.get(1).await.unwrap(),
        Some(Record {
            id: 1,
            parent: None,
            finished: false,
            value: vec![0; 1_536 * 1024].into()
        })
    );
}
