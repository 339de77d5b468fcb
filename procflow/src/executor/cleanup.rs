//! Retention: finished procedures stay queryable for `Config::retention`, then they (and
//! their nonces) are deleted from the store.

use super::hooks::WriteKind;
use super::inner::{Entry, Inner, Table};
use crate::stored::record::{NONCE_PREFIX, now_ms};
use procflow_store::Batch;
use std::cmp::Reverse;
use std::sync::Arc;

/// Runs until the executor stops, cleaning up every `Config::cleanup_interval`: the
/// finished procedures past their retention, and the snapshot channels no one listens to
/// any more ([`Table::sweep_unwatched`]).
pub(crate) async fn run<E: Send + Sync + 'static>(inner: Arc<Inner<E>>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(inner.config.cleanup_interval) => {}
            () = inner.stopping() => return,
        }
        inner.table().sweep_unwatched();
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
    let expired = expired(&mut inner.table(), retention, now);
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
        inner.commit(0, WriteKind::Cleanup, batch, None).await?;
        let mut table = inner.table();
        for (id, nonce) in chunk {
            table.remove(*id);
            if let Some(nonce) = nonce {
                table.nonces.remove(&**nonce);
            }
        }
    }
    Ok(())
}

/// The procedures ended `retention` ms or more before `now`, with their nonces, taken
/// from the table's queue of ends ([`Table::ended`]) in the order they ended: the
/// lock is held for the expired ones, not for a pass over a table of a million
/// procedures. A queued end that no longer holds (the procedure was revived, or is
/// gone) is dropped; one whose tree still has a live root waits for the next round.
fn expired(table: &mut Table, retention: u64, now: u64) -> Vec<(u64, Option<Box<str>>)> {
    let mut expired = Vec::new();
    let mut waiting = Vec::new();
    while let Some(&Reverse((at, id))) = table.ended.peek() {
        if at.saturating_add(retention) > now {
            break;
        }
        table.ended.pop();
        let Some(entry) = table.procs.get(&id) else {
            continue;
        };
        // Revived since (its next end is queued when it comes), or queued twice.
        if entry.finished_ms != Some(at) || expired.last().is_some_and(|(last, _)| *last == id) {
            continue;
        }
        if has_live_ancestor(table, entry) {
            waiting.push(Reverse((at, id)));
        } else {
            expired.push((id, table.nonce_of.get(&id).cloned()));
        }
    }
    table.ended.extend(waiting);
    expired
}

/// Whether a procedure above `entry` in its tree is still live.
fn has_live_ancestor(table: &Table, entry: &Entry) -> bool {
    let mut at = entry.info.borrow().parent();
    // Bounded by the table's size: a damaged parent chain must not loop forever.
    for _ in 0..table.procs.len() {
        let Some(parent) = at.and_then(|id| table.procs.get(&id.get())) else {
            return false;
        };
        if parent.finished_ms.is_none() {
            return true;
        }
        at = parent.info.borrow().parent();
    }
    false
}
