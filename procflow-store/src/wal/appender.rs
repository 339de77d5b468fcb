//! Commits that write their own records ([`WalConfig::caller_writes`]): the committing
//! thread checks, numbers and applies its batches under the log's lock, writes their
//! records at the range they were given after letting the lock go, and waits for the
//! sync thread ([`spawn_sync`]) to publish a durable position past them
//! (`progress.rs` says why not sooner). The committer thread then only closes.
//!
//! Why: a thread that steps many procedures should write their records itself, in one
//! `write`, rather than hand each to another thread and be woken for each answer
//! (docs/DESIGN.md, "Where the durable path has to go"; docs/BENCHMARKS.md, stop 73,
//! measured a log like this one as the only one that let such threads reach half their
//! in-memory speed).
//!
//! [`WalConfig::caller_writes`]: crate::WalConfig::caller_writes

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::LocalKey;

use smallvec::SmallVec;

use super::committer::{self, Fault};
use super::early::{self, Early};
use super::writer::BUFFER_KEPT;
use super::{Inner, Log, compaction, fit_values, segment};
use crate::error::StoreError;
use crate::slot::Leftovers;
use crate::store::Batch;

/// How many of a compaction's records (of at most 1 MiB of changes each) are landed in
/// one hold of the log's lock ([`Inner::land`]).
const RUNS_PER_LANDING: usize = 4;

thread_local! {
    /// The records of this thread's last commit, emptied: the buffer it hands the
    /// writer for the next commit's records (`Writer::take_unwritten`), so a commit
    /// allocates none.
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };

    /// The records of this thread's last commit as encoded before the log's lock
    /// (`early.rs`), emptied: kept for the next commit's, so encoding allocates none.
    static ENCODED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Inner {
    /// Commits `batch` on this thread and waits until it is durable.
    pub(super) async fn commit_own(&self, mut batch: Batch) -> Result<(), StoreError> {
        fit_values(&mut batch);
        let mut outcome = Ok(());
        let end = self.write_own([batch], |result| outcome = result);
        outcome?;
        self.progress.wait_durable(end).await
    }

    /// Commits `batches` on this thread, each as a record of its own, written together,
    /// and waits until they are durable. The outcome of each, in order.
    pub(super) async fn commit_all_own(
        &self,
        mut batches: Vec<Batch>,
    ) -> Vec<Result<(), StoreError>> {
        batches.iter_mut().for_each(fit_values);
        let mut outcomes: Vec<Result<(), StoreError>> = Vec::with_capacity(batches.len());
        let end = self.write_own(batches, |result| outcomes.push(result));
        if !outcomes.iter().any(Result::is_ok) {
            return outcomes;
        }
        if let Err(e) = self.progress.wait_durable(end).await {
            // Every batch taken shares the one error that kept it from being durable.
            for outcome in outcomes.iter_mut().filter(|o| o.is_ok()) {
                *outcome = Err(e.duplicate());
            }
        }
        outcomes
    }

    /// Appends `batches` as records and applies them, under the log's lock, then writes
    /// the records without it. `each` gets every batch's outcome, in order: a batch
    /// taken (`Ok`) is durable once every record below the returned sequence number
    /// is. What needs nothing of the log, checking and encoding, is done before its
    /// lock is taken (`early.rs`).
    ///
    /// Not `async`: nothing between taking a range and writing it may be cancelled, or
    /// the range would stay a gap that holds back every later commit.
    fn write_own(
        &self,
        batches: impl IntoIterator<Item = Batch>,
        mut each: impl FnMut(Result<(), StoreError>),
    ) -> u64 {
        let mut encoded = ENCODED.with_borrow_mut(std::mem::take);
        let early: SmallVec<[Early; 1]> = batches
            .into_iter()
            .map(|batch| early::encode(batch, &mut encoded))
            .collect();
        // A panic from here on (under the lock, or between taking a range and writing
        // it) leaves the log unknown: as on the committer thread, the store is poisoned.
        let _failing = PoisonOnUnwind(self);
        let mut records = BUFFER.with_borrow_mut(std::mem::take);
        // Freed after the lock, on this thread (`committer.rs` says why not under it).
        let mut leftovers: SmallVec<[Leftovers; 1]> = SmallVec::new();
        let (unwritten, end, planned) = {
            let mut log = self.lock_log();
            for batch in early {
                match committer::write_early(self, &mut log, batch, &encoded) {
                    Ok(left) => {
                        leftovers.push(left);
                        each(Ok(()));
                    }
                    Err(Fault::Refused(e) | Fault::Io(e)) => each(Err(e)),
                }
            }
            let planned = if leftovers.is_empty() || log.writer.deleting() {
                None
            } else {
                log.plan_compaction()
            };
            (
                log.writer.take_unwritten(&mut records),
                log.writer.next_seq(),
                planned,
            )
        };
        if let Some(unwritten) = unwritten {
            match unwritten.file.write_at(unwritten.offset, &records) {
                Ok(()) => {
                    let (start, stop) = unwritten.seqs;
                    if planned.is_some() {
                        // This thread syncs them, with the compaction's records
                        // (`compact_planned`): one sync, not one for each.
                        self.progress.mark_written_quietly(start, stop);
                    } else {
                        // Wakes the sync thread (`Progress::wait_for_unsynced`).
                        self.progress.mark_written(start, stop);
                    }
                }
                Err(e) => {
                    let path = segment::path(&self.dir, unwritten.segment);
                    self.poison(StoreError::io("appending a record", path, e));
                }
            }
        }
        if let Some(plan) = planned {
            self.compact_planned(plan, end);
        }
        keep(&BUFFER, records);
        keep(&ENCODED, encoded);
        drop(leftovers);
        end
    }

    /// Lands the compaction this commit planned, syncs its records with the commit's
    /// own (written below `end`, marked written without waking the sync thread: one
    /// sync, not one for each), and deletes the compacted segment's file once they are
    /// durable. If the landing stopped (the store poisoned or closed), the commit's own
    /// records are still synced here.
    fn compact_planned(&self, plan: compaction::Plan, end: u64) {
        let landed = self.land(plan);
        let below = landed.unwrap_or(end);
        if self.progress.wait_written(below).is_err() {
            return; // Poisoned.
        }
        sync_written(self);
        if landed.is_some() && self.progress.durable() >= below {
            self.delete_doomed();
        }
    }

    /// Lands a compaction this commit planned, [`RUNS_PER_LANDING`] records at a
    /// time: each hold of the log's lock lands the records encoded since the last one
    /// and reads the values of the next few, which are encoded without the lock, so
    /// that the other threads' commits go on between. The sequence number below which
    /// its records lie, once the segment is out of the log; `None` if the store was
    /// poisoned or closed meanwhile (the segment then stays, and is read at the next
    /// open like any other).
    fn land(&self, plan: compaction::Plan) -> Option<u64> {
        let mut encoded = Vec::new();
        let mut chunks = (0..plan.records())
            .step_by(RUNS_PER_LANDING)
            .map(|start| start..plan.records().min(start + RUNS_PER_LANDING));
        let mut landing: Option<(compaction::Fetched, Vec<Range<usize>>)> = None;
        loop {
            let fetched = {
                let mut log = self.lock_log();
                if log.closed || self.is_poisoned() {
                    return None;
                }
                let Log {
                    state,
                    index,
                    writer,
                    ..
                } = &mut *log;
                if let Some((fetched, at)) = landing.take() {
                    let landed = plan.land(&fetched, (&encoded, &at), index, writer);
                    if let Err(e) = landed {
                        self.poison(e);
                        return None;
                    }
                }
                let Some(which) = chunks.next() else {
                    plan.finish(writer);
                    return Some(writer.next_seq());
                };
                plan.fetch(which, state, index)
            };
            encoded.clear();
            let at = plan.encode(&fetched, &mut encoded);
            landing = Some((fetched, at));
        }
    }
}

/// Keeps `buffer`, emptied, as this thread's `kept` for the next commit, unless one
/// large round made it larger than a buffer is worth keeping.
fn keep(kept: &'static LocalKey<RefCell<Vec<u8>>>, mut buffer: Vec<u8>) {
    buffer.clear();
    if buffer.capacity() <= BUFFER_KEPT {
        kept.with_borrow_mut(|kept| *kept = buffer);
    }
}

/// Poisons the store if a commit panics while it writes: a range taken and never
/// written would hold back every later commit, and a batch half applied would be read.
struct PoisonOnUnwind<'a>(&'a Inner);

impl Drop for PoisonOnUnwind<'_> {
    fn drop(&mut self) {
        self.0.poison_if_panicking();
    }
}

/// Starts the sync thread of a store whose commits write their own records: it syncs
/// whenever the written prefix passes the durable position, until the store stops.
pub(super) fn spawn_sync(inner: Arc<Inner>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("procflow-wal-sync".into())
        .spawn(move || {
            while inner.progress.wait_for_unsynced() {
                sync_written(&inner);
            }
        })
}

/// Syncs the active segment if the written prefix has moved past the durable position,
/// and publishes the prefix it synced as durable.
///
/// Every record below the prefix, read with the active segment, is in that segment or
/// in an older one, which its roll synced before it was closed
/// ([`Progress::active_and_written`](super::progress::Progress::active_and_written)).
pub(super) fn sync_written(inner: &Inner) {
    let (active, below) = inner.progress.active_and_written();
    let Some((file, path)) = active else {
        return;
    };
    if below <= inner.progress.durable() || inner.is_poisoned() {
        return;
    }
    if inner.durable() {
        if let Err(e) = file.sync_data() {
            inner.poison(StoreError::io("syncing a segment", path, e));
            return;
        }
        inner.group_syncs.fetch_add(1, Ordering::Relaxed);
    }
    inner.progress.publish_durable(below);
}
