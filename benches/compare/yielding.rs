//! `--cell yield:N`: the executor on a `MemStore` whose commit suspends its caller once
//! before it applies the batch, as a commit that waits for a disk does. On a plain
//! `MemStore` a commit never suspends, so a procedure runs its ten steps in one poll, its
//! state in the cache throughout; on a durable store every step waits while the other
//! procedures run theirs. This cell is the second case without a disk: what interleaving
//! alone costs the executor (docs/BENCHMARKS.md, "Issue 33 in stop 44").

use procflow_store::{
    Batch, BoxFuture, Limits, Loaded, MemStore, ProcId, Record, RecordInfo, Store, StoreError,
};
use std::collections::BTreeMap;

/// A `MemStore` whose commits yield to the scheduler once first.
#[derive(Default)]
pub struct Yielding(MemStore);

impl Store for Yielding {
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            self.0.commit(batch).await
        })
    }

    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        self.0.load()
    }

    fn get(&self, id: ProcId) -> BoxFuture<'_, Result<Option<Record>, StoreError>> {
        self.0.get(id)
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<RecordInfo>, StoreError>> {
        self.0.list()
    }

    fn meta(&self, prefix: &str) -> BoxFuture<'_, Result<BTreeMap<String, Vec<u8>>, StoreError>> {
        self.0.meta(prefix)
    }

    fn limits(&self) -> Limits {
        self.0.limits()
    }

    fn close(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.0.close()
    }
}
