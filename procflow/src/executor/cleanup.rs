//! Retention: finished procedures stay queryable for `Config::retention`, then they (and
//! their nonces) are deleted from the store.

use super::hooks::WriteKind;
use super::inner::{Entry, Inner, Table};
use crate::stored::record::{NONCE_PREFIX, now_ms};
use procflow_store::Batch;
use std::sync::Arc;

/// Runs until the executor stops, cleaning up every `Config::cleanup_interval`.
pub(crate) async fn run<E: Send + Sync + 'static>(inner: Arc<Inner<E>>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(inner.config.cleanup_interval) => {}
            () = inner.stopping() => return,
        }
        if clean(&inner).await.is_err() {
            return;
        }
    }
}

/// Deletes the finished procedures past their retention. Nothing in the tree of a live
/// root is deleted: an ancestor may still roll back and need to undo it.
async fn clean<E>(inner: &Inner<E>) -> Result<(), super::ExecutorError> {
    let retention = u64::try_from(inner.config.retention.as_millis()).unwrap_or(u64::MAX);
    let now = now_ms();
    let expired: Vec<(u64, Option<Box<str>>)> = {
        let table = inner.table();
        table
            .procs
            .iter()
            .filter(|(_, entry)| {
                entry
                    .finished_ms
                    .is_some_and(|at| at.saturating_add(retention) <= now)
            })
            .filter(|(_, entry)| !has_live_ancestor(&table, entry))
            .map(|(id, entry)| (*id, entry.nonce.clone()))
            .collect()
    };
    if expired.is_empty() {
        return Ok(());
    }
    // A procedure and its nonce take two ops; stay within the store's batch limit (etcd
    // allows 128 operations per transaction).
    let per_batch = inner
        .store
        .limits()
        .max_ops_per_batch
        .map_or(usize::MAX, |ops| (ops / 2).max(1));
    for chunk in expired.chunks(per_batch) {
        let mut batch = Batch::new();
        for (id, nonce) in chunk {
            batch = batch.delete(*id);
            if let Some(nonce) = nonce {
                batch = batch.delete_meta(format!("{NONCE_PREFIX}{nonce}"));
            }
        }
        inner.commit(0, WriteKind::Cleanup, batch).await?;
        let mut table = inner.table();
        for (id, nonce) in chunk {
            table.procs.remove(id);
            table.noted(*id);
            if let Some(nonce) = nonce {
                table.nonces.remove(&**nonce);
            }
        }
    }
    Ok(())
}

/// Whether a procedure above `entry` in its tree is still live.
fn has_live_ancestor(table: &Table, entry: &Entry) -> bool {
    let mut at = entry.info.borrow().parent;
    // Bounded by the table's size: a damaged parent chain must not loop forever.
    for _ in 0..table.procs.len() {
        let Some(parent) = at.and_then(|id| table.procs.get(&id.get())) else {
            return false;
        };
        if parent.finished_ms.is_none() {
            return true;
        }
        at = parent.info.borrow().parent;
    }
    false
}
