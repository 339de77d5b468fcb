//! The state one executor shares between its handle and its procedure tasks.

use super::config::Config;
use super::erased::Registry;
use super::error::ExecutorError;
use super::hooks::{KillHook, StoreWrite, WriteKind, WritePoint};
use super::record::NEXT_ID_KEY;
use super::status::{ProcedureInfo, Unloadable};
use crate::ProcedureId;
use crate::locks::LockTable;
use procflow_store::{Batch, Op, Store, StoreError};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::task::TaskTracker;

/// How many ids one reservation in the store covers: one metadata write per block of
/// submits, not per submit.
const ID_BLOCK: u64 = 1024;

/// [`Inner::mode_flag`] values: [`Mode`] only moves forward, running → shutting down →
/// halted (or running → halted).
pub(crate) const RUNNING: u8 = 0;
const SHUTTING_DOWN: u8 = 1;
const HALTED: u8 = 2;

/// Whether the executor runs.
#[derive(Clone, Debug)]
pub(crate) enum Mode {
    Running,
    /// No new work; steps in flight finish and are persisted, then tasks exit.
    ShuttingDown,
    /// Stopped at once: nothing more reaches the store.
    Halted(ExecutorError),
}

pub(crate) struct Inner<E> {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) env: Arc<E>,
    pub(crate) config: Config,
    pub(crate) registry: Registry<E>,
    /// Steps executing at once.
    pub(crate) workers: Semaphore,
    /// Root procedures running at once; the others wait for a permit (the queue).
    pub(crate) running: Semaphore,
    /// Root procedures live or queued, for backpressure.
    pub(crate) live_roots: AtomicUsize,
    pub(crate) table: Mutex<Table>,
    pub(crate) locks: LockTable,
    /// Serialises submits that carry a nonce, so one nonce makes one procedure.
    pub(crate) nonce_gate: tokio::sync::Mutex<()>,
    pub(crate) mode: watch::Sender<Mode>,
    /// [`Mode`]'s variant as a number, read on every step without the watch's lock.
    pub(crate) mode_flag: AtomicU8,
    pub(crate) hook: Option<Arc<dyn KillHook>>,
    pub(crate) writes: AtomicU64,
    pub(crate) tasks: TaskTracker,
}

/// Every procedure the executor knows, live or finished (until retention removes it).
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) procs: HashMap<u64, Entry>,
    pub(crate) nonces: HashMap<String, u64>,
    /// Event name → procedures suspended on it.
    /// A set, not a list: with many procedures on one event, joining and leaving must not
    /// scan the others (that made a restart of 500,000 suspended procedures quadratic).
    pub(crate) events: HashMap<String, BTreeSet<u64>>,
    pub(crate) unloadable: Vec<Unloadable>,
    /// The next id to hand out, and the first one not covered by the store's reservation.
    pub(crate) next_id: u64,
    pub(crate) reserved_id: u64,
}

pub(crate) struct Entry {
    pub(crate) info: watch::Sender<ProcedureInfo>,
    /// Wakes the procedure's task: its event fired, or one of its children ended.
    pub(crate) wake: Arc<Notify>,
    pub(crate) abort: bool,
    pub(crate) nonce: Option<String>,
    /// Wall-clock end, ms since the epoch, for retention.
    pub(crate) finished_ms: Option<u64>,
}

impl<E> Inner<E> {
    pub(crate) fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave the table half-updated in a way that
        // matters more than stopping every procedure would.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode.borrow().clone()
    }

    pub(crate) fn is_halted(&self) -> bool {
        self.mode_flag.load(Ordering::Acquire) == HALTED
    }

    /// Why the executor halted, if it did. Reads the watch only then: it is checked
    /// around every store write.
    fn halt_reason(&self) -> Option<ExecutorError> {
        if !self.is_halted() {
            return None;
        }
        match &*self.mode.borrow() {
            Mode::Halted(reason) => Some(reason.clone()),
            _ => None,
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.mode_flag.load(Ordering::Acquire) == RUNNING
    }

    /// Stops everything at once (a kill, or a store failure); the first reason wins.
    pub(crate) fn halt(&self, reason: ExecutorError) {
        self.mode.send_if_modified(|mode| {
            if matches!(mode, Mode::Halted(_)) {
                return false;
            }
            tracing::warn!(%reason, "executor halted");
            *mode = Mode::Halted(reason);
            self.mode_flag.store(HALTED, Ordering::Release);
            true
        });
    }

    /// Stops taking new work; returns whether the executor was running.
    pub(crate) fn begin_shutdown(&self) -> bool {
        self.mode.send_if_modified(|mode| {
            let running = matches!(mode, Mode::Running);
            if running {
                *mode = Mode::ShuttingDown;
                self.mode_flag.store(SHUTTING_DOWN, Ordering::Release);
            }
            running
        })
    }

    /// Hands out `n` fresh ids; when they run past the reservation in the store, returns
    /// the metadata op extending it, to commit with the batch that uses them.
    pub(crate) fn allocate_ids(&self, n: u64) -> (Vec<u64>, Option<Op>) {
        let mut table = self.table();
        let first = table.next_id;
        table.next_id += n;
        let ids = (first..table.next_id).collect();
        if table.next_id <= table.reserved_id {
            return (ids, None);
        }
        table.reserved_id = table.next_id + ID_BLOCK;
        let op = Op::PutMeta {
            key: NEXT_ID_KEY.to_owned(),
            value: table.reserved_id.to_le_bytes().to_vec(),
        };
        (ids, Some(op))
    }

    /// Commits `batch`, consulting the kill hook right before and right after.
    ///
    /// # Errors
    ///
    /// The reason the executor halted: killed here or earlier, or this store write failed
    /// (which halts the executor).
    pub(crate) async fn commit(
        &self,
        procedure: u64,
        kind: WriteKind,
        batch: Batch,
    ) -> Result<(), ExecutorError> {
        if let Some(reason) = self.halt_reason() {
            return Err(reason);
        }
        let index = self.writes.fetch_add(1, Ordering::Relaxed);
        let write = |point| StoreWrite {
            procedure: ProcedureId::new(procedure),
            kind,
            point,
            index,
        };
        self.kill_at(&write(WritePoint::Before))?;
        match self.store.commit(batch).await {
            Ok(()) => {}
            // A refused batch changed nothing: only its procedure is affected.
            Err(error @ StoreError::TooLarge { .. }) => {
                return Err(ExecutorError::Rejected(Arc::new(error)));
            }
            Err(error) => {
                let error = ExecutorError::Store(Arc::new(error));
                self.halt(error.clone());
                return Err(error);
            }
        }
        self.kill_at(&write(WritePoint::After))
    }

    fn kill_at(&self, write: &StoreWrite) -> Result<(), ExecutorError> {
        if self.hook.as_ref().is_some_and(|hook| hook.kill(write)) {
            self.halt(ExecutorError::Killed);
        }
        self.halt_reason().map_or(Ok(()), Err)
    }

    /// Publishes a procedure's new snapshot to its subscribers, if it changed: nothing is
    /// woken for a snapshot they have already seen (a resumed procedure republishes the
    /// one its entry was created with).
    pub(crate) fn publish(&self, info: ProcedureInfo) {
        if let Some(entry) = self.table().procs.get(&info.id.get()) {
            entry.info.send_if_modified(|current| {
                let changed = *current != info;
                if changed {
                    *current = info;
                }
                changed
            });
        }
    }

    /// Resolves when the mode leaves `Running`.
    pub(crate) async fn stopping(&self) {
        let mut mode = self.mode.subscribe();
        // An error means the sender is gone: the executor is being dropped.
        let _ = mode.wait_for(|mode| !matches!(mode, Mode::Running)).await;
    }
}
