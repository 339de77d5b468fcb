//! How far the log is written and how far it is durable, by sequence number, when
//! committing threads write their own records ([`WalConfig::caller_writes`]).
//!
//! Each commit reserves its records' sequence numbers and file range under the log's
//! lock, then writes them on its own thread without the lock, so ranges reach the file
//! out of order. A crash can then leave an unwritten range between two written ones;
//! recovery stops at that gap (it reads as a torn tail) and drops every record after it.
//! So nothing past a gap may be acknowledged: the sync thread syncs only the *written
//! prefix*, the records below the first sequence number not yet written, and publishes
//! that as the durable position, which the commits wait for.
//!
//! [`WalConfig::caller_writes`]: crate::WalConfig::caller_writes

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::error::StoreError;
use crate::io::LogFile;

/// The durable position, as the commits that wait for it see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Durable {
    /// Every record with a smaller sequence number is durable.
    below: u64,
    /// The store is poisoned: what is not durable yet never will be.
    failed: bool,
}

/// The written prefix and the durable position of one store.
pub(crate) struct Progress {
    written: Mutex<Written>,
    /// Signalled when the written prefix moves, or the store fails.
    moved: Condvar,
    durable: watch::Sender<Durable>,
    /// The error that poisoned the store, told to every commit that waited for a
    /// durable position it never reached.
    failure: Mutex<Option<StoreError>>,
    /// The active segment's file and path, for the sync thread: kept here, not only in
    /// the writer, so that a sync need not wait for the log's lock, which a commit of a
    /// large round holds while it applies its batches.
    active: Mutex<Option<Active>>,
}

/// The active segment's file and its path (for error messages).
pub(crate) type Active = (Arc<dyn LogFile>, PathBuf);

struct Written {
    /// Every record with a smaller sequence number is written.
    below: u64,
    /// Ranges written past a gap: start → end (exclusive).
    past_gap: BTreeMap<u64, u64>,
    failed: bool,
    /// The store is closed or dropped: the sync thread ends.
    stopped: bool,
}

impl Progress {
    /// A log whose records below `next_seq` are all written and durable (as recovery
    /// leaves it).
    pub(crate) fn new(next_seq: u64) -> Self {
        Progress {
            written: Mutex::new(Written {
                below: next_seq,
                past_gap: BTreeMap::new(),
                failed: false,
                stopped: false,
            }),
            moved: Condvar::new(),
            durable: watch::Sender::new(Durable {
                below: next_seq,
                failed: false,
            }),
            failure: Mutex::new(None),
            active: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Written> {
        // Nothing panics while it is locked; tolerate poisoning anyway.
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The records `start..end` are written to their file: wakes the sync thread and
    /// whoever waits for them ([`Progress::wait_written`]).
    pub(crate) fn mark_written(&self, start: u64, end: u64) {
        if self.advance(start, end) {
            self.moved.notify_all();
        }
    }

    /// [`Progress::mark_written`] by the holder of the log's lock, which syncs them
    /// itself and publishes them as durable right after (`Writer::sync_active`): the
    /// sync thread is not woken to sync them a second time, and no one else waits for
    /// them (a wait for writes is always the lock holder's).
    pub(crate) fn mark_written_quietly(&self, start: u64, end: u64) {
        self.advance(start, end);
    }

    /// Notes `start..end` written; whether the written prefix moved.
    fn advance(&self, start: u64, end: u64) -> bool {
        if start == end {
            return false;
        }
        let mut written = self.lock();
        if start != written.below {
            written.past_gap.insert(start, end);
            return false;
        }
        written.below = end;
        while let Some(next) = {
            let below = written.below;
            written.past_gap.remove(&below)
        } {
            written.below = next;
        }
        true
    }

    /// The writer made `file` (at `path`) the active segment: every record reserved
    /// from now on lands in it. Called under the log's lock, before such a record.
    pub(crate) fn set_active(&self, file: Arc<dyn LogFile>, path: PathBuf) {
        *self.active.lock().unwrap_or_else(|e| e.into_inner()) = Some((file, path));
    }

    /// The active segment (if the writer said) and the written prefix, read together:
    /// every record below the prefix is in that segment or in an older one. (A roll
    /// replaces the segment here before any record lands in the new one, so a record
    /// of a newer segment is reserved after this read, past the prefix.)
    pub(crate) fn active_and_written(&self) -> (Option<Active>, u64) {
        let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        (active.clone(), self.written())
    }

    /// The written prefix: every record below it is written.
    pub(crate) fn written(&self) -> u64 {
        self.lock().below
    }

    /// Blocks until every record below `seq` is written. Called under the log's lock
    /// before a sync that must cover them (a roll, compaction, close): the commits that
    /// write them take no lock the caller holds, so they finish.
    ///
    /// # Errors
    ///
    /// [`StoreError::Poisoned`] if the store failed meanwhile: a range may never be
    /// written.
    pub(crate) fn wait_written(&self, seq: u64) -> Result<(), StoreError> {
        let mut written = self.lock();
        while written.below < seq {
            if written.failed {
                return Err(StoreError::Poisoned);
            }
            written = self.moved.wait(written).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    /// Every record below `seq` is durable.
    pub(crate) fn publish_durable(&self, seq: u64) {
        self.durable.send_if_modified(|durable| {
            let moved = seq > durable.below;
            durable.below = durable.below.max(seq);
            moved
        });
    }

    /// Every record below the returned sequence number is durable.
    pub(crate) fn durable(&self) -> u64 {
        self.durable.borrow().below
    }

    /// The store is poisoned, by `error` if it was an error (not a panic): wakes
    /// everything that waits for a write or a sync.
    pub(crate) fn fail(&self, error: Option<&StoreError>) {
        if let Some(error) = error {
            let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
            failure.get_or_insert_with(|| error.duplicate());
        }
        self.lock().failed = true;
        self.moved.notify_all();
        self.durable.send_if_modified(|durable| {
            let first = !durable.failed;
            durable.failed = true;
            first
        });
    }

    /// The sync thread's wait: until records are written past the durable position
    /// (`true`: sync them), or the store stops or fails (`false`: end). No commit asks
    /// for a sync: the written prefix moving is the request, so a sync begins as soon
    /// as the last one ends if more was written meanwhile.
    pub(crate) fn wait_for_unsynced(&self) -> bool {
        let mut written = self.lock();
        loop {
            if written.failed {
                return false;
            }
            // What was written before the stop is still synced: a dropped store's
            // last records reach the disk, as the committer's queued ones do.
            if written.below > self.durable() {
                return true;
            }
            if written.stopped {
                return false;
            }
            written = self.moved.wait(written).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Ends the sync thread's wait for good.
    pub(crate) fn stop(&self) {
        self.lock().stopped = true;
        self.moved.notify_all();
    }

    /// Waits until every record below `seq` is durable.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future only stops the wait; the records still become
    /// durable (or the store fails).
    ///
    /// # Errors
    ///
    /// The error that poisoned the store (a copy), or [`StoreError::Poisoned`], if it
    /// failed before they were durable.
    pub(crate) async fn wait_durable(&self, seq: u64) -> Result<(), StoreError> {
        let mut durable = self.durable.subscribe();
        let reached = durable
            .wait_for(|durable| durable.below >= seq || durable.failed)
            .await
            .map(|durable| durable.below >= seq);
        match reached {
            Ok(true) => Ok(()),
            // Failed, or the sender is gone with the store.
            Ok(false) | Err(_) => Err(self.failure()),
        }
    }

    fn failure(&self) -> StoreError {
        let failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        failure
            .as_ref()
            .map_or(StoreError::Poisoned, StoreError::duplicate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The written prefix stops at the first range not written yet and moves past
    /// every range written beyond it once the gap is filled.
    #[test]
    fn the_written_prefix_stops_at_a_gap() {
        let progress = Progress::new(1);
        progress.mark_written(3, 5);
        progress.mark_written(5, 6);
        assert_eq!(progress.written(), 1, "records 1 and 2 are not written");
        progress.mark_written(1, 3);
        assert_eq!(progress.written(), 6);
        progress.mark_written(7, 8);
        assert_eq!(progress.written(), 6);
    }

    /// A durable wait ends once the position passes it, and fails if the store fails
    /// first; a failure does not take back what was durable before.
    #[tokio::test]
    async fn durable_waits_end_at_the_position_or_the_failure() {
        let progress = std::sync::Arc::new(Progress::new(1));
        progress.mark_written(1, 4);
        let waiting = {
            let progress = progress.clone();
            tokio::spawn(async move { progress.wait_durable(4).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        progress.publish_durable(4);
        assert!(waiting.await.unwrap().is_ok());

        let waiting = {
            let progress = progress.clone();
            tokio::spawn(async move { progress.wait_durable(9).await })
        };
        progress.fail(None);
        assert!(matches!(waiting.await.unwrap(), Err(StoreError::Poisoned)));
        assert!(progress.wait_durable(3).await.is_ok());
        assert!(matches!(
            progress.wait_written(9),
            Err(StoreError::Poisoned)
        ));
    }

    /// The sync thread waits while nothing is written past the durable position, is
    /// let go when something is, and ends once the store stops.
    #[test]
    fn the_sync_thread_waits_for_writes_past_the_durable_position() {
        let progress = std::sync::Arc::new(Progress::new(1));
        let syncer = {
            let progress = progress.clone();
            std::thread::spawn(move || {
                let mut rounds = 0;
                while progress.wait_for_unsynced() {
                    progress.publish_durable(progress.written());
                    rounds += 1;
                }
                rounds
            })
        };
        progress.mark_written(2, 3);
        progress.mark_written(1, 2);
        let waited = progress.wait_durable(3);
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(waited)
            .unwrap();
        progress.stop();
        assert!(syncer.join().unwrap() >= 1);
    }
}
