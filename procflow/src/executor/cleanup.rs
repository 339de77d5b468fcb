//! Retention: finished procedures stay queryable for `Config::retention`, then they (and
//! their nonces) are deleted from the store; sooner, oldest end first, while more than
//! `Config::retention_limit` are kept.

use super::hooks::WriteKind;
use super::inner::{Entry, Inner, Table};
use crate::stored::record::{NONCE_PREFIX, now_ms};
use procflow_store::Batch;
use std::cmp::Reverse;
use std::sync::Arc;
use tokio::sync::Notify;

/// `Config::retention_limit`, kept in the table: the count of ended procedures is known
/// where an end is queued ([`Table::ended_at`]), under the table's lock.
pub(crate) struct Limit {
    max: usize,
    /// Past this many queued ends the cleanup is told to run now: a sixteenth over the
    /// limit, so that a pass deletes many at once rather than one per procedure ending.
    trigger: usize,
    due: Arc<Notify>,
}

impl Default for Limit {
    fn default() -> Self {
        Self::new(usize::MAX)
    }
}

impl Limit {
    pub(crate) fn new(max: usize) -> Self {
        Limit {
            max,
            trigger: max.saturating_add(max / 16),
            due: Arc::default(),
        }
    }

    /// A pass left `kept` ends queued: the next pass for the count comes a sixteenth of
    /// the limit past them, so that ends kept whatever the count (in live trees) are not
    /// looked through again at every procedure's end.
    fn passed(&mut self, kept: usize) {
        self.trigger = kept.max(self.max).saturating_add(self.max / 16);
    }

    /// Tells the cleanup to run now if `ended` queued ends are past the trigger. The
    /// queue may hold ends that no longer hold (see [`Table::ended`]), so this may run a
    /// pass early, never late.
    pub(crate) fn check(&self, ended: usize) {
        if ended > self.trigger {
            self.due.notify_one();
        }
    }
}

/// Runs until the executor stops, cleaning up every `Config::cleanup_interval`: the
/// finished procedures past their retention, and the snapshot channels no one listens to
/// any more ([`Table::sweep_unwatched`]).
pub(crate) async fn run<E: Send + Sync + 'static>(inner: Arc<Inner<E>>) {
    let due = Arc::clone(&inner.table().retention.due);
    loop {
        tokio::select! {
            () = tokio::time::sleep(inner.config.cleanup_interval) => {}
            // Past `Config::retention_limit`: also at once after a restart that loaded
            // more ended procedures than it (`Notify` keeps the permit).
            () = due.notified() => {}
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

/// The procedures ended `retention` ms or more before `now`, and the ones that ended
/// first while more than the table's [`Limit`] are kept, with their nonces, taken from
/// the table's queue of ends ([`Table::ended`]) in the order they ended: the lock is
/// held for the expired ones, not for a pass over a table of a million procedures. A
/// queued end that no longer holds (the procedure was revived, or is gone) is dropped;
/// one whose tree still has a live root waits for the next round, and counts as kept.
fn expired(table: &mut Table, retention: u64, now: u64) -> Vec<(u64, Option<Box<str>>)> {
    let mut expired = Vec::new();
    let mut waiting = Vec::new();
    let max = table.retention.max;
    while let Some(&Reverse((at, id))) = table.ended.peek() {
        let past_retention = at.saturating_add(retention) <= now;
        // Ends the queue no longer holds count too: a procedure may go early, none is
        // kept past the limit. Ends kept for their live trees may make a pass look
        // through the whole queue: `Limit::passed` spaces such passes out.
        let over_limit = table.ended.len() + waiting.len() > max;
        if !past_retention && !over_limit {
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
    table.retention.passed(table.ended.len());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProcedureId;
    use crate::executor::packed::PackedInfo;
    use crate::executor::{ProcedureInfo, Status};
    use std::time::UNIX_EPOCH;

    /// Retention never comes in these tests: only the count deletes.
    const NEVER: u64 = u64::MAX;

    /// Adds procedure `id` (child of `parent`), ended at `ended` ms if it has.
    fn add(table: &mut Table, id: u64, parent: Option<u64>, ended: Option<u64>) {
        let info = PackedInfo::pack(ProcedureInfo {
            id: ProcedureId::new(id),
            parent: parent.map(ProcedureId::new),
            machine: "m",
            status: Status::Runnable,
            state: "S",
            steps: 0,
            error: None,
            submitted: UNIX_EPOCH,
            updated: UNIX_EPOCH,
        });
        table.procs.insert(id, Box::new(Entry::new(info, ended)));
        table.ended_at(id, ended);
    }

    fn ids(expired: &[(u64, Option<Box<str>>)]) -> Vec<u64> {
        expired.iter().map(|(id, _)| *id).collect()
    }

    #[test]
    fn past_the_limit_the_first_ended_go() {
        let mut table = Table {
            retention: Limit::new(3),
            ..Table::default()
        };
        // Ids out of end order: the end time decides, not the id.
        for (id, ended) in [(1, 40), (2, 10), (3, 60), (4, 20), (5, 50), (6, 30)] {
            add(&mut table, id, None, Some(ended));
        }
        assert_eq!(ids(&expired(&mut table, NEVER, 100)), [2, 4, 6]);
        assert_eq!(
            table.ended.len(),
            3,
            "the three that ended last stay queued"
        );
        assert!(
            expired(&mut table, NEVER, 100).is_empty(),
            "at the limit: none"
        );
    }

    #[test]
    fn retention_and_the_limit_each_delete() {
        let mut table = Table {
            retention: Limit::new(10),
            ..Table::default()
        };
        for id in 1..=4 {
            add(&mut table, id, None, Some(id * 10));
        }
        // Under the limit: only those past a retention of 50 ms at 75 ms.
        assert_eq!(ids(&expired(&mut table, 50, 75)), [1, 2]);
    }

    #[test]
    fn a_live_tree_is_kept_whatever_the_count() {
        let mut table = Table {
            retention: Limit::new(3),
            ..Table::default()
        };
        add(&mut table, 1, None, None); // a live root
        add(&mut table, 2, Some(1), Some(10));
        add(&mut table, 3, Some(1), Some(20));
        add(&mut table, 4, None, Some(30));
        add(&mut table, 5, None, Some(40));
        // 2 and 3 ended first but are kept for their root: 4 goes in their place, and
        // 5, the last to end, stays.
        assert_eq!(ids(&expired(&mut table, NEVER, 100)), [4]);
        assert_eq!(table.ended.len(), 3);
    }

    #[test]
    fn the_cleanup_is_told_a_sixteenth_past_the_limit_and_after_a_pass() {
        let mut limit = Limit::new(32);
        let told = |limit: &Limit| {
            use futures_util::FutureExt;
            limit.due.notified().now_or_never().is_some()
        };
        limit.check(34);
        assert!(!told(&limit), "34 is within 32 and a sixteenth");
        limit.check(35);
        assert!(told(&limit));
        // A pass that had to keep 40 (live trees): the next is a sixteenth past those.
        limit.passed(40);
        limit.check(42);
        assert!(!told(&limit));
        limit.check(43);
        assert!(told(&limit));
    }
}
