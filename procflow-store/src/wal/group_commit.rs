//! Group commit: concurrent writers share one `fdatasync`.
//!
//! Each writer appends its record under the log lock and learns the log position its
//! record ends at. It then waits until the log is "synced through" that position. The
//! first waiter that finds no sync in progress becomes the syncer: it syncs everything
//! written so far — its own record and those of every writer queued behind it — and
//! publishes the new synced-through position to all of them.

use std::sync::{Condvar, Mutex, MutexGuard};

use crate::error::StoreError;

/// The shared sync state.
#[derive(Debug, Default)]
pub(crate) struct GroupCommit {
    state: Mutex<SyncState>,
    synced: Condvar,
}

#[derive(Debug, Default)]
struct SyncState {
    /// Everything before this log position is durable.
    synced_through: u64,
    /// A syncer is at work.
    syncing: bool,
    /// A sync failed: nothing more will become durable.
    failed: bool,
}

impl GroupCommit {
    fn lock(&self) -> MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that everything before `through` is durable (the writer synced itself).
    pub(crate) fn mark_synced(&self, through: u64) {
        let mut state = self.lock();
        if through > state.synced_through {
            state.synced_through = through;
            self.synced.notify_all();
        }
    }

    /// Wakes every waiter with [`StoreError::Poisoned`] unless its data is already durable.
    pub(crate) fn fail(&self) {
        self.lock().failed = true;
        self.synced.notify_all();
    }

    /// Blocks until everything before `end` is durable. If no sync is in progress the
    /// caller becomes the syncer and runs `sync`, which must make durable everything
    /// written so far and return the position it covers.
    ///
    /// # Errors
    ///
    /// The syncer gets `sync`'s error; every other waiter whose data is not yet durable
    /// gets [`StoreError::Poisoned`].
    pub(crate) fn wait_durable(
        &self,
        end: u64,
        sync: impl Fn() -> Result<u64, StoreError>,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        loop {
            if state.synced_through >= end {
                return Ok(());
            }
            if state.failed {
                return Err(StoreError::Poisoned);
            }
            if state.syncing {
                state = self.synced.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state.syncing = true;
            drop(state);
            let result = sync();
            state = self.lock();
            state.syncing = false;
            self.synced.notify_all();
            match result {
                Ok(through) => state.synced_through = state.synced_through.max(through),
                Err(e) => {
                    state.failed = true;
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn waiters_share_syncs() {
        let group = Arc::new(GroupCommit::default());
        let written = Arc::new(AtomicU64::new(0));
        let syncs = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (group, written, syncs) = (group.clone(), written.clone(), syncs.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let end = written.fetch_add(1, Ordering::SeqCst) + 1;
                        group
                            .wait_durable(end, || {
                                let through = written.load(Ordering::SeqCst);
                                std::thread::sleep(std::time::Duration::from_millis(1));
                                syncs.fetch_add(1, Ordering::SeqCst);
                                Ok(through)
                            })
                            .unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(syncs.load(Ordering::SeqCst) < 400, "no sync was shared");
    }

    #[test]
    fn a_failed_sync_poisons_later_waiters_only() {
        let group = GroupCommit::default();
        group.mark_synced(10);
        let err = group
            .wait_durable(11, || Err(StoreError::Poisoned))
            .unwrap_err();
        assert!(matches!(err, StoreError::Poisoned));
        assert!(group.wait_durable(10, || Ok(20)).is_ok());
        assert!(matches!(
            group.wait_durable(12, || Ok(20)),
            Err(StoreError::Poisoned)
        ));
    }
}
