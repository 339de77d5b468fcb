//! [`WalStore`]: the embedded write-ahead log, procflow's default store.
//!
//! Files by concept: [`record`] encodes one record and its checksums, [`segment`] names
//! and creates segment files, [`writer`] appends and rolls, [`committer`] is the thread
//! that writes queued batches and shares one fsync among them, [`appender`] the commits
//! that write their own records ([`WalConfig::caller_writes`]) and the thread that then
//! only syncs, [`early`] what such a commit checks and encodes before the log's lock,
//! [`progress`] how far such a log is written without a gap and how far it
//! is durable, [`recovery`] scans and
//! replays at open (with [`verify`] checking checksums ahead of it), [`compaction`]
//! reclaims space, [`config`] holds the knobs. The bytes are described in
//! `docs/FORMAT.md`.

mod appender;
mod arena;
mod committer;
mod compaction;
mod config;
mod early;
mod index_beside;
mod progress;
mod record;
mod recovery;
mod segment;
mod verify;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

pub use config::{SyncMode, WalConfig};

use self::arena::Kept;
use self::committer::{Queue, Reply, Request, SlotReply};
use self::compaction::LiveIndex;
use self::progress::Progress;
use self::writer::Writer;
use crate::error::StoreError;
use crate::io::{DirLock, FsBackend, IoBackend};
use crate::slot::{Answer, CommitIn, CommitSlot};
use crate::state::State;
use crate::store::{
    Batch, BoxFuture, Limits, Loaded, Op, ProcId, Record, RecordInfo, Store, with_prefix,
};
use std::collections::BTreeMap;

/// A [`Store`] that appends every batch as one checksummed record to a log of segment
/// files in a directory, keeps the whole state in memory, and replays the log at open.
///
/// Use it whenever procedures must survive a restart of a single process; for tests
/// [`MemStore`](crate::MemStore) is simpler, and a replicated store (etcd) is needed
/// when several machines must be able to take over.
///
/// * **Atomic batches**: one batch is one record; after a crash it is there entirely or
///   not at all.
/// * **Group commit**: one thread of the store's own (`procflow-wal`) writes every
///   queued batch and makes them durable with one `fdatasync`; commits wait for it
///   without blocking a Tokio worker. A commit alone in flight, found with nothing
///   queued, is written and synced by its caller instead, which blocks the caller's
///   thread for that time but saves two hand-offs between threads
///   ([`WalConfig::inline_lone_commit`]; never on a runtime with a single worker
///   thread).
/// * **Or commits that write their own records** ([`WalConfig::caller_writes`]): each
///   commit takes its range of the log under a lock, writes it on its own thread, and
///   waits for a sync thread to make every record up to its own durable; a thread that
///   commits many batches at once ([`WalStore::commit_all`]) writes them in one `write`.
///   No commit is acknowledged past a range another thread has not written yet.
/// * **Space allocated ahead**: with [`SyncMode::Durable`], the active segment's file is
///   written with zeros ahead of its records
///   ([`LogFile::reserve`](crate::io::LogFile::reserve)), so an `fdatasync` writes the
///   data without a new file length, or blocks to convert from unwritten, as well.
///   The zeros past the last record are cut off at a roll, at close, and by
///   recovery after a crash.
/// * **Compaction**: segments roll at [`WalConfig::segment_size`]; live entries left in
///   old segments are rewritten forward so old segments can be deleted, keeping disk use
///   within about twice the live data plus one segment.
/// * **Recovery**: a torn tail of the last segment is cut off; any other damage fails
///   the open with [`StoreError::Corrupt`] naming the file and offset.
/// * **Exclusive**: the directory is locked; a second opener gets [`StoreError::Locked`].
///   Files are created with mode 0600, the directory with 0700.
/// * **Poisoning**: after a failed write or fsync every later commit fails with
///   [`StoreError::Poisoned`] until the store is reopened. Reads keep answering from
///   memory, which may include the batches whose commit failed; reopening shows what
///   really reached the disk.
///
/// # Examples
///
/// ```
/// use procflow_store::{Batch, Store, WalConfig, WalStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let dir = tempfile::tempdir()?;
/// let store = WalStore::open(dir.path(), WalConfig::default())?;
/// store.commit(Batch::new().put(1, None, b"step 1".to_vec())).await?;
/// store.close().await?;
///
/// let store = WalStore::open(dir.path(), WalConfig::default())?;
/// assert_eq!(store.get(1).await?.unwrap().value, &b"step 1"[..]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct WalStore {
    inner: Arc<Inner>,
    /// The committer thread, joined on drop so the directory lock is released when the
    /// store is gone.
    committer: Option<JoinHandle<()>>,
    /// The sync thread of a store whose commits write their own records
    /// ([`WalConfig::caller_writes`]).
    syncer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for WalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalStore")
            .field("dir", &self.inner.dir)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Counters describing a [`WalStore`], from [`WalStore::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WalStats {
    /// Batches committed since open.
    pub commits: u64,
    /// `fdatasync` calls made for groups of commits since open (not counting those at
    /// segment rolls and compaction).
    pub group_syncs: u64,
    /// Segment files in the log.
    pub segments: usize,
    /// Bytes in all segment files, the space allocated ahead of the active segment's
    /// records included.
    pub disk_bytes: u64,
    /// Of `disk_bytes`, the space allocated ahead of the active segment's records
    /// (zeros; at most 4 MiB and up to the segment size): `disk_bytes - ahead_bytes`
    /// is where the log's records end.
    pub ahead_bytes: u64,
    /// Estimated bytes of live data (records and metadata, with per-entry overhead).
    pub live_bytes: u64,
    /// Segments whose recovered values the open left in their mapping rather than copy
    /// them ([`WalConfig::map_segments`]), and that compaction has not deleted yet (it
    /// copies their values out first).
    pub mapped_segments: usize,
}

struct Inner {
    dir: PathBuf,
    config: WalConfig,
    log: Mutex<Log>,
    queue: Queue,
    /// Commits and closes waiting for the committer.
    in_flight: AtomicUsize,
    /// Whether a commit alone in flight polls for its answer ([`WalConfig::spin_wait`]).
    spin: bool,
    poisoned: AtomicBool,
    commits: AtomicU64,
    group_syncs: AtomicU64,
    /// The written prefix and the durable position ([`WalConfig::caller_writes`]).
    progress: Arc<Progress>,
}

struct Log {
    state: State,
    /// Mapped segments whose recovered values were left in place (`arena.rs`): copied
    /// out when compaction deletes the segment.
    kept: Kept,
    index: LiveIndex,
    writer: Writer,
    closed: bool,
    /// Held until close or drop.
    lock: Option<DirLock>,
}

impl Log {
    /// Plans a compaction if one is due (`compaction::plan`).
    fn plan_compaction(&mut self) -> Option<compaction::Plan> {
        compaction::plan(
            &mut self.state,
            &mut self.kept,
            &self.index,
            &mut self.writer,
        )
    }

    /// Compacts, if due, in this hold of the lock (`compaction::compact`); the segments
    /// it took out of the log.
    fn compact(&mut self) -> Result<usize, StoreError> {
        compaction::compact(
            &mut self.state,
            &mut self.kept,
            &mut self.index,
            &mut self.writer,
        )
    }
}

impl WalStore {
    /// Opens (or creates) the store in `dir` on the real file system, recovering its
    /// contents. Blocks while it reads the log.
    ///
    /// # Errors
    ///
    /// [`StoreError::Locked`] if the directory is in use, [`StoreError::Corrupt`] if the
    /// log is damaged other than by a torn tail, [`StoreError::Io`] otherwise.
    pub fn open(dir: impl AsRef<Path>, config: WalConfig) -> Result<Self, StoreError> {
        Self::open_with_backend(dir, config, Arc::new(FsBackend))
    }

    /// Like [`WalStore::open`] on another [`IoBackend`], e.g. a
    /// [`SimBackend`](crate::io::SimBackend) to simulate crashes.
    ///
    /// # Errors
    ///
    /// As [`WalStore::open`].
    pub fn open_with_backend(
        dir: impl AsRef<Path>,
        config: WalConfig,
        backend: Arc<dyn IoBackend>,
    ) -> Result<Self, StoreError> {
        let dir = dir.as_ref();
        let sync = config.sync == SyncMode::Durable;
        create_store_dir(backend.as_ref(), dir, sync)?;
        let lock = backend
            .lock_dir(dir)
            .map_err(|e| StoreError::io("locking the store directory", dir, e))?
            .ok_or_else(|| StoreError::Locked {
                dir: dir.to_path_buf(),
            })?;
        let recovered = recovery::recover(backend.as_ref(), dir, sync, config.map_segments)?;
        let progress = Arc::new(Progress::new(recovered.next_seq));
        let writer = Writer::new(
            backend,
            dir,
            config.segment_size,
            sync,
            recovered.segments,
            recovered.active,
            recovered.next_seq,
            config.caller_writes,
            progress.clone(),
        );
        let spin = committer::spinning_helps();
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            config,
            log: Mutex::new(Log {
                state: recovered.state,
                kept: recovered.kept,
                index: recovered.index,
                writer,
                closed: false,
                lock: Some(lock),
            }),
            queue: Queue::new(spin),
            in_flight: AtomicUsize::new(0),
            spin,
            poisoned: AtomicBool::new(false),
            commits: AtomicU64::new(0),
            group_syncs: AtomicU64::new(0),
            progress,
        });
        let committer = committer::spawn(inner.clone())
            .map_err(|e| StoreError::io("starting the committer thread", dir, e))?;
        let mut store = WalStore {
            inner,
            committer: Some(committer),
            syncer: None,
        };
        if store.inner.config.caller_writes {
            let syncer = appender::spawn_sync(store.inner.clone())
                .map_err(|e| StoreError::io("starting the sync thread", dir, e))?;
            store.syncer = Some(syncer);
        }
        Ok(store)
    }

    /// Reads everything the store in `dir` holds, as [`Store::load`] would, without
    /// opening it: it takes no lock and writes nothing, so it works while an executor runs
    /// on the store (the `procflow` CLI's read commands use it). It sees the log as far as
    /// the writer has appended; a record being appended is not seen.
    ///
    /// # Errors
    ///
    /// [`StoreError::NotAStore`] if `dir` holds no log segment, [`StoreError::Corrupt`]
    /// if the log is damaged, [`StoreError::Io`] otherwise.
    pub fn read_only(dir: impl AsRef<Path>) -> Result<Loaded, StoreError> {
        Self::read_only_with_backend(dir, &FsBackend)
    }

    /// [`WalStore::read_only`] on another [`IoBackend`].
    ///
    /// # Errors
    ///
    /// As [`WalStore::read_only`].
    pub fn read_only_with_backend(
        dir: impl AsRef<Path>,
        backend: &dyn IoBackend,
    ) -> Result<Loaded, StoreError> {
        Ok(recovery::read_only(backend, dir.as_ref())?.load())
    }

    /// Commits `batches`, each as a record of its own, and waits until every one taken
    /// is durable: the outcome of each, in order. A batch refused (an invalid one, a
    /// stale fencing token) does not hold back the others.
    ///
    /// With [`WalConfig::caller_writes`] the records are checked, applied and written on
    /// the calling thread, all in one `write`, and synced together: what a thread that
    /// steps many procedures in a round needs. Without it they are queued for the
    /// committer thread together.
    ///
    /// # Cancel safety
    ///
    /// As [`Store::commit`]: dropping the future does not take back a batch. With
    /// `caller_writes` every batch is written before the first poll returns, and the
    /// future only waits for the sync.
    ///
    /// # Examples
    ///
    /// ```
    /// use procflow_store::{Batch, Store, WalConfig, WalStore};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let dir = tempfile::tempdir()?;
    /// let config = WalConfig { caller_writes: true, ..WalConfig::default() };
    /// let store = WalStore::open(dir.path(), config)?;
    /// let round = (1..=3).map(|id| Batch::new().put(id, None, vec![id as u8])).collect();
    /// for outcome in store.commit_all(round).await {
    ///     outcome?;
    /// }
    /// assert_eq!(store.get(2).await?.unwrap().value, &[2u8][..]);
    /// store.close().await?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn commit_all(&self, batches: Vec<Batch>) -> Vec<Result<(), StoreError>> {
        if self.inner.config.caller_writes {
            return self.inner.commit_all_own(batches).await;
        }
        let _in_flight = InFlight::enter(&self.inner.in_flight);
        let mut answers = Vec::with_capacity(batches.len());
        for mut batch in batches {
            fit_values(&mut batch);
            let (reply, answer) = tokio::sync::oneshot::channel();
            let queued = self
                .inner
                .queue
                .push(Request::Commit(batch, Reply::Channel(reply)));
            answers.push(queued.ok().map(|()| answer));
        }
        let mut outcomes = Vec::with_capacity(answers.len());
        for answer in answers {
            let outcome = match answer {
                Some(answer) => answer.await.map_or(Err(StoreError::Poisoned), |a| a.result),
                None if self.inner.is_poisoned() => Err(StoreError::Poisoned),
                None => Err(StoreError::Closed),
            };
            outcomes.push(outcome);
        }
        outcomes
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Current counters.
    pub fn stats(&self) -> WalStats {
        let log = self.inner.lock_log();
        WalStats {
            commits: self.inner.commits.load(Ordering::Relaxed),
            group_syncs: self.inner.group_syncs.load(Ordering::Relaxed),
            segments: log.writer.segments().len(),
            disk_bytes: log.writer.segments().iter().map(|s| s.len).sum::<u64>()
                + log.writer.ahead(),
            ahead_bytes: log.writer.ahead(),
            live_bytes: log.index.live_bytes(),
            mapped_segments: log.kept.len(),
        }
    }
}

/// Creates `dir` if needed and, with `sync`, makes the entry of every directory it
/// created durable in its parent: without that a power loss after the first commits can
/// take the whole new store directory, synced segments and all, with it.
fn create_store_dir(backend: &dyn IoBackend, dir: &Path, sync: bool) -> Result<(), StoreError> {
    let created = backend
        .create_dir_all(dir)
        .map_err(|e| StoreError::io("creating the store directory", dir, e))?;
    if !sync {
        return Ok(());
    }
    for new in &created {
        let parent = match new.parent() {
            Some(parent) if parent.as_os_str().is_empty() => Path::new("."),
            Some(parent) => parent,
            None => continue,
        };
        backend
            .sync_dir(parent)
            .map_err(|e| StoreError::io("syncing the parent directory", parent, e))?;
    }
    Ok(())
}

impl Inner {
    fn lock_log(&self) -> MutexGuard<'_, Log> {
        // Log state is only modified after the I/O it depends on succeeded, and an I/O
        // failure poisons the store, so a panic while locked leaves nothing half-done
        // that could be acknowledged.
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the store poisoned and passes `error` through.
    fn poison(&self, error: StoreError) -> StoreError {
        self.poisoned.store(true, Ordering::SeqCst);
        self.progress.fail(Some(&error));
        error
    }

    /// Poisons the store if this thread is unwinding: a panic while serving commits
    /// (on the committer thread or inline) leaves the log in an unknown state.
    fn poison_if_panicking(&self) {
        if std::thread::panicking() {
            self.poisoned.store(true, Ordering::SeqCst);
            self.progress.fail(None);
        }
    }

    fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }

    /// Deletes the files of the segments compaction took out of the log
    /// (`Writer::doom_oldest`), without the log's lock. Only once the records that
    /// carry their live changes forward are durable: the caller synced them. A failure
    /// poisons the store, as a failed deletion did under the lock.
    ///
    /// Why not under the lock, where compaction runs: deleting a 64 MiB segment took
    /// 18-20 ms, and the sync before it 10-18 ms, every commit waiting meanwhile
    /// (docs/BENCHMARKS.md, stop 75).
    fn delete_doomed(&self) {
        let Some(doomed) = self.lock_log().writer.doomed() else {
            return;
        };
        if self.is_poisoned() {
            return;
        }
        match doomed.delete() {
            Ok(()) => self.lock_log().writer.forget_doomed(&doomed),
            Err(e) => drop(self.poison(e)),
        }
    }

    /// Whether commits wait for `fdatasync`.
    fn durable(&self) -> bool {
        self.config.sync == SyncMode::Durable
    }

    /// Commits `batch`: on this thread if it is the only commit in flight and nothing is
    /// being served ([`WalConfig::inline_lone_commit`]), else through the committer.
    async fn commit(&self, mut batch: Batch) -> Result<(), StoreError> {
        if self.config.caller_writes {
            return self.commit_own(batch).await;
        }
        fit_values(&mut batch);
        let in_flight = InFlight::enter(&self.in_flight);
        if in_flight.may_hold_thread && self.config.inline_lone_commit {
            batch = match self.serve_inline(batch) {
                // The answer's leftovers are freed here, on this task's thread.
                Ok(answer) => return answer.result,
                Err(queued) => queued,
            };
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let request = Request::Commit(batch, Reply::Channel(reply));
        self.hand_over(request, answer, in_flight, Err(StoreError::Closed))
            .await
    }

    /// [`commit`](Self::commit) with the answer coming back through `slot`: queued for
    /// the committer thread with no future of its own to box and no channel to
    /// allocate (`slot.rs` says why that matters). A commit that may be alone takes
    /// [`commit`](Self::commit)'s way instead, where it may be served inline or poll
    /// for its answer.
    fn commit_in<'a>(&'a self, mut batch: Batch, slot: &'a Arc<CommitSlot>) -> CommitIn<'a> {
        if self.config.caller_writes
            || self.in_flight.load(Ordering::Acquire) == 0 && another_worker_runs()
        {
            return CommitIn::from_future(Box::pin(self.commit(batch)));
        }
        fit_values(&mut batch);
        // Counted until the committer thread answers (`committer::send`): the wait on
        // the slot holds no count that its drop could give back too early or twice.
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let ticket = slot.next_ticket();
        let reply = Reply::Slot(SlotReply::new(Arc::clone(slot), ticket));
        match self.queue.push(Request::Commit(batch, reply)) {
            Ok(()) => CommitIn::in_slot(slot, ticket),
            Err(request) => {
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                if let Request::Commit(_, Reply::Slot(reply)) = request {
                    reply.defuse();
                }
                let why = if self.is_poisoned() {
                    StoreError::Poisoned
                } else {
                    StoreError::Closed
                };
                CommitIn::ready(Err(why))
            }
        }
    }

    /// Asks the committer thread to close the store and waits for its answer.
    async fn close(&self) -> Result<(), StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let in_flight = InFlight::enter(&self.in_flight);
        // Closing twice is fine: the second finds the committer stopped.
        self.hand_over(Request::Close(reply), answer, in_flight, Ok(()))
            .await
    }

    /// Hands `request` to the committer thread and waits for `answer`, its reply.
    /// `closed` is the answer if the committer has stopped after a close.
    async fn hand_over(
        &self,
        request: Request,
        answer: tokio::sync::oneshot::Receiver<Answer>,
        in_flight: InFlight<'_>,
        closed: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        if self.queue.push(request).is_err() {
            return if self.is_poisoned() {
                Err(StoreError::Poisoned)
            } else {
                closed
            };
        }
        let answer = if in_flight.may_hold_thread && self.spin {
            spin_wait(answer, self.config.spin_wait).await
        } else {
            answer.await.ok()
        };
        // A dropped reply means the committer thread died: nothing it had is durable.
        // The answer's leftovers are freed here, on this task's thread.
        answer.map_or(Err(StoreError::Poisoned), |answer| answer.result)
    }
}

/// Drops the spare capacity of the batch's values, on the committing task's thread.
///
/// Why: the committer thread keeps each value as `Bytes`, and `Bytes::from` a vector
/// with spare capacity allocates a shared header there, on the committer thread, that a
/// worker thread frees when the value is replaced. Each such free waits for the lock of
/// the committer thread's allocator arena while the committer thread allocates. An exact
/// vector becomes `Bytes` without an allocation.
fn fit_values(batch: &mut Batch) {
    for op in &mut batch.ops {
        if let Op::Put { value, .. } | Op::Finish { value, .. } = op {
            value.shrink_to_fit();
        }
    }
}

/// Whether the runtime has another worker thread to run the tasks a commit holds up if
/// it holds its thread (outside a runtime, the caller's thread waits for it anyway).
///
/// Why it matters: on a runtime with one worker, the commit that holds the thread is the
/// only task that runs, so it stays alone in flight, and so does the next one: every
/// other procedure waits while commits go to disk one `fdatasync` each. At 1,024
/// procedures on one worker the executor made 9,300 steps/s that way, against 271,000
/// with every commit queued for the committer (docs/BENCHMARKS.md).
fn another_worker_runs() -> bool {
    tokio::runtime::Handle::try_current().map_or(true, |h| h.metrics().num_workers() > 1)
}

/// Counts a request in flight while it lives (also when its future is dropped).
struct InFlight<'a> {
    count: &'a AtomicUsize,
    /// No other request was in flight when this one started, and another worker runs the
    /// runtime's other tasks: it may hold its thread, to be served inline or to poll for
    /// its answer.
    may_hold_thread: bool,
}

impl<'a> InFlight<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        let alone = count.fetch_add(1, Ordering::AcqRel) == 0;
        InFlight {
            count,
            may_hold_thread: alone && another_worker_runs(),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long [`spin_wait`] polls without yielding: about one `fdatasync` and a half on
/// the disk of docs/BENCHMARKS.md (140 µs), so most answers come within one burst.
const SPIN_BURST: std::time::Duration = std::time::Duration::from_micros(200);

/// Polls `answer` for up to `limit`, in bursts of [`SPIN_BURST`] with a yield between
/// them, then waits for it asleep. `None` if the sender was dropped without answering.
///
/// Why: one procedure at a time spends its life waiting for fsyncs. Sleeping through
/// each one means the committer thread must wake a parked worker thread when it ends,
/// which measured 20 % of a single procedure's throughput (docs/BENCHMARKS.md). Why in
/// bursts: the first version yielded between every two polls, and each yield made Tokio
/// wake its other worker thread to look for work (`perf trace`: 33,000 futex calls for
/// 2,485 commits), which took the CPU the committer thread needed. A burst blocks this
/// worker for at most 200 µs, and only while this commit is the only one in flight.
async fn spin_wait<T>(
    mut answer: tokio::sync::oneshot::Receiver<T>,
    limit: std::time::Duration,
) -> Option<T> {
    use std::time::Instant;
    use tokio::sync::oneshot::error::TryRecvError;
    let until = Instant::now() + limit;
    loop {
        let now = Instant::now();
        if now >= until {
            break;
        }
        let burst_end = until.min(now + SPIN_BURST);
        loop {
            match answer.try_recv() {
                Ok(value) => return Some(value),
                // Not `answer.await`: a receiver that reported `Closed` is spent, and
                // polling it again panics ("called after complete").
                Err(TryRecvError::Closed) => return None,
                Err(TryRecvError::Empty) if Instant::now() < burst_end => std::hint::spin_loop(),
                Err(TryRecvError::Empty) => break,
            }
        }
        tokio::task::yield_now().await;
    }
    answer.await.ok()
}

impl Drop for WalStore {
    fn drop(&mut self) {
        self.inner.queue.stop();
        if let Some(committer) = self.committer.take() {
            // It serves what is queued (commits whose futures were dropped), then exits.
            let _ = committer.join();
        }
        self.inner.progress.stop();
        if let Some(syncer) = self.syncer.take() {
            // It syncs what was written, then exits.
            let _ = syncer.join();
        }
    }
}

/// Runs `f` on Tokio's blocking pool.
fn blocking<T: Send + 'static>(
    inner: &Arc<Inner>,
    f: impl FnOnce(&Inner) -> T + Send + 'static,
) -> BoxFuture<'static, T> {
    let inner = inner.clone();
    Box::pin(async move {
        match tokio::task::spawn_blocking(move || f(&inner)).await {
            Ok(value) => value,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    })
}

/// # Panics
///
/// [`Store::load`], [`Store::get`] and [`Store::list`] must be called within a Tokio
/// runtime: they copy from the in-memory state on its blocking thread pool. `commit` and
/// `close` need no runtime: they talk to the store's own thread, or a lone commit writes
/// and syncs on the calling thread.
///
/// # Cancel safety
///
/// Dropping a `commit` future does not cancel the commit: once polled, it completes in
/// the background and may or may not become durable. (A commit served inline is durable,
/// or has failed, before its first poll returns.)
impl Store for WalStore {
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.inner.commit(batch))
    }

    fn commit_in<'a>(&'a self, batch: Batch, slot: &'a Arc<CommitSlot>) -> CommitIn<'a> {
        self.inner.commit_in(batch, slot)
    }

    fn uses_commit_slots(&self) -> bool {
        // Commits that write their own records have no answer to put in a slot.
        !self.inner.config.caller_writes
    }

    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        blocking(&self.inner, |inner| Ok(inner.lock_log().state.load()))
    }

    fn get(&self, id: ProcId) -> BoxFuture<'_, Result<Option<Record>, StoreError>> {
        blocking(&self.inner, move |inner| Ok(inner.lock_log().state.get(id)))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<RecordInfo>, StoreError>> {
        blocking(&self.inner, |inner| Ok(inner.lock_log().state.list()))
    }

    fn meta(&self, prefix: &str) -> BoxFuture<'_, Result<BTreeMap<String, Vec<u8>>, StoreError>> {
        let prefix = prefix.to_owned();
        blocking(&self.inner, move |inner| {
            Ok(with_prefix(&inner.lock_log().state.meta, &prefix))
        })
    }

    fn limits(&self) -> Limits {
        Limits::default()
    }

    fn close(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.inner.close())
    }
}

/// A store in `dir` that never syncs, for the tests whose subject is not durability.
#[cfg(test)]
pub(crate) fn open_unsynced(dir: &Path) -> WalStore {
    let config = WalConfig {
        sync: SyncMode::NoSync,
        ..WalConfig::default()
    };
    WalStore::open(dir, config).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 12, point 13: a reply dropped while a lone commit polls for it (the
    /// committer failed or died) must be reported as `None`, not panic.
    #[tokio::test]
    async fn p13_spin_wait_returns_none_when_the_reply_is_dropped() {
        let (reply, answer) = tokio::sync::oneshot::channel::<()>();
        let dropper = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(reply);
        });
        let got = spin_wait(answer, std::time::Duration::from_secs(10)).await;
        dropper.join().unwrap();
        assert_eq!(got, None);
    }

    /// A record larger than the writer's kept buffer (a compaction's, or a huge batch's)
    /// does not leave the buffer that large once it is written.
    #[tokio::test]
    async fn a_large_record_does_not_pin_the_writers_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_unsynced(dir.path());
        let large = vec![7; 3 * writer::BUFFER_KEPT];
        store
            .commit(Batch::new().put(1, None, large))
            .await
            .unwrap();
        let capacity = store.inner.lock_log().writer.buffer_capacity();
        assert!(
            capacity <= writer::BUFFER_KEPT,
            "{capacity} bytes kept after a {} byte record",
            3 * writer::BUFFER_KEPT
        );
        store
            .commit(Batch::new().put(2, None, vec![1; 100]))
            .await
            .unwrap();
        assert_eq!(
            store.get(1).await.unwrap().unwrap().value.len(),
            3 * writer::BUFFER_KEPT
        );
    }

    /// `commit_in` queues a commit with its slot when another commit is in flight (here,
    /// one counted by hand), and takes the lone commit's way otherwise; either way the
    /// batch is applied. A dropped wait leaves its commit to complete, and does not
    /// answer the next commit of its slot. A closed store refuses it, counted out again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_in_queues_with_its_slot_while_another_commit_is_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let store = WalStore::open(dir.path(), WalConfig::default()).unwrap();
        let slot = Arc::new(CommitSlot::new());
        let in_flight = || store.inner.in_flight.load(Ordering::Acquire);

        store
            .commit_in(slot.batch().put(1, None, vec![1]), &slot)
            .await
            .unwrap();
        assert_eq!(
            slot.batch().ops.capacity(),
            0,
            "alone, it took `commit`'s way"
        );

        store.inner.in_flight.fetch_add(1, Ordering::AcqRel);
        store
            .commit_in(slot.batch().put(1, None, vec![2]), &slot)
            .await
            .unwrap();
        assert!(
            slot.batch().ops.capacity() >= 1,
            "queued, its op list came back"
        );
        assert_eq!(in_flight(), 1, "the queued commit was counted out");

        let dropped = store.commit_in(slot.batch().put(2, None, vec![3]), &slot);
        drop(dropped);
        store
            .commit_in(slot.batch().put(1, None, vec![4]), &slot)
            .await
            .unwrap();
        assert_eq!(store.get(2).await.unwrap().unwrap().value, vec![3u8]);
        assert_eq!(store.get(1).await.unwrap().unwrap().value, vec![4u8]);

        store.close().await.unwrap();
        let refused = store
            .commit_in(slot.batch().put(1, None, vec![5]), &slot)
            .await;
        assert!(matches!(refused, Err(StoreError::Closed)), "{refused:?}");
        assert_eq!(in_flight(), 1);
        store.inner.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Segments of 4 KiB, not synced: a few commits roll them and compact the first.
    fn small_segments() -> WalConfig {
        WalConfig {
            segment_size: 4096,
            sync: SyncMode::NoSync,
            ..WalConfig::default()
        }
    }

    /// Puts 1,000 bytes to procedure `id` again and again until the oldest segment is
    /// compacted away.
    async fn churn_until_compacted(store: &WalStore, id: u64) {
        let first_segment = || store.inner.lock_log().writer.segments()[0].number;
        let oldest = first_segment();
        for n in 0..=u8::MAX {
            assert!(n < u8::MAX, "the first segment was never compacted");
            let batch = Batch::new().put(id, None, vec![n; 1000]);
            store.commit(batch).await.unwrap();
            if first_segment() != oldest {
                return;
            }
        }
    }

    /// The value procedure `id` of [`put_idle`] keeps.
    fn idle(id: u64) -> Vec<u8> {
        vec![id as u8; 100]
    }

    /// Puts 100 bytes to procedures 10 to 29, which then never change.
    async fn put_idle(store: &WalStore) {
        for id in 10..30 {
            store
                .commit(Batch::new().put(id, None, idle(id)))
                .await
                .unwrap();
        }
    }

    /// Stop 75: a compaction landed while the log's lock was let go since it read the
    /// values it carries (as commits that write their own records land theirs) drops
    /// the copy of a key written meanwhile: landed after the newer change, the copy
    /// would bring the old value back at the next open.
    #[tokio::test]
    async fn a_change_written_while_a_compaction_lands_is_not_brought_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = WalStore::open(dir.path(), small_segments()).unwrap();
        put_idle(&store).await;
        // No compaction of the store's own until the test plans one.
        store.inner.lock_log().writer.set_compacting(true);
        for n in 0..20u8 {
            let batch = Batch::new().put(1, None, vec![n; 1000]);
            store.commit(batch).await.unwrap();
        }
        let (plan, fetched) = {
            let mut log = store.inner.lock_log();
            log.writer.set_compacting(false);
            let plan = log.plan_compaction().expect("compaction is due");
            let fetched = plan.fetch(0..plan.records(), &log.state, &log.index);
            (plan, fetched)
        };
        // Written after the values were read, before the landing: the newest change of
        // key 15.
        let newer = b"newer".to_vec();
        store
            .commit(Batch::new().put(15, None, newer.clone()))
            .await
            .unwrap();
        {
            let mut log = store.inner.lock_log();
            let Log { index, writer, .. } = &mut *log;
            let mut encoded = Vec::new();
            let at = plan.encode(&fetched, &mut encoded);
            plan.land(&fetched, (&encoded, &at), index, writer).unwrap();
            plan.finish(writer);
        }
        store.inner.delete_doomed();
        assert_eq!(store.get(15).await.unwrap().unwrap().value, newer);
        store.close().await.unwrap();
        drop(store);
        let store = WalStore::open(dir.path(), small_segments()).unwrap();
        assert_eq!(store.get(15).await.unwrap().unwrap().value, newer);
        for id in (10..30).filter(|&id| id != 15) {
            assert_eq!(store.get(id).await.unwrap().unwrap().value, idle(id));
        }
    }

    /// Issue 33: compaction rewrites a segment's live data as several records of a
    /// bounded size, not one record of it all, and a reopened store reads every value
    /// back from them.
    #[tokio::test]
    async fn compaction_rewrites_live_data_as_bounded_records() {
        let dir = tempfile::tempdir().unwrap();
        let config = small_segments();
        let store = WalStore::open(dir.path(), config.clone()).unwrap();
        put_idle(&store).await;
        churn_until_compacted(&store, 1).await;
        let segments: Vec<u64> = {
            let log = store.inner.lock_log();
            log.writer.segments().iter().map(|s| s.number).collect()
        };
        store.close().await.unwrap();
        drop(store);

        let mut compaction_records = Vec::new();
        for &number in &segments {
            let path = segment::path(dir.path(), number);
            let bytes = bytes::Bytes::from(std::fs::read(&path).unwrap());
            let scan = recovery::scan_segment(&path, number, &bytes, false).unwrap();
            compaction_records.extend(
                scan.records
                    .iter()
                    .filter(|r| r.header.kind == record::KIND_COMPACTION)
                    .map(|r| r.header.payload_len),
            );
        }
        assert!(
            compaction_records.len() >= 2,
            "the 20 idle values (2 KiB and more) in one record: {compaction_records:?}"
        );
        // A quarter of the segment's estimated bytes, plus one change's encoding.
        assert!(
            compaction_records.iter().all(|&len| len <= 1024 + 200),
            "{compaction_records:?}"
        );
        let store = WalStore::open(dir.path(), config).unwrap();
        for id in 10..30 {
            assert_eq!(store.get(id).await.unwrap().unwrap().value, idle(id));
        }
    }

    /// A recovered value is copied out of its segment's buffer (into an arena of the
    /// segment's live values, issue 33) and keeps those bytes when compaction rewrites it
    /// forward and deletes its segment: no value in memory comes to point into a buffer
    /// of records, which a few live ones could keep resident (issue 16).
    #[tokio::test]
    async fn recovered_values_keep_their_copy_through_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let config = small_segments();
        let store = WalStore::open(dir.path(), config.clone()).unwrap();
        let idle = vec![1; 100];
        let batch = Batch::new()
            .put(1, None, idle.clone())
            .put(3, None, vec![3; 100]);
        store.commit(batch).await.unwrap();
        store.close().await.unwrap();
        drop(store);

        let store = WalStore::open(dir.path(), config).unwrap();
        let copied = store.inner.lock_log().state.records[&1].value.as_ptr();
        // Churn another procedure until the segment holding the idle ones is compacted.
        churn_until_compacted(&store, 2).await;
        let log = store.inner.lock_log();
        let value = &log.state.records[&1].value;
        assert_eq!(value, &idle);
        assert_eq!(
            value.as_ptr(),
            copied,
            "compaction replaced the copy made at open"
        );
    }

    /// Issue 33: a mostly live segment's recovered values stay in its mapping (`arena.rs`)
    /// until compaction deletes the segment: they are then copied out, keep their bytes,
    /// and nothing maps the deleted file any more, which would keep its space on disk.
    #[tokio::test]
    async fn kept_values_are_copied_out_before_their_segment_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let config = small_segments();
        let store = WalStore::open(dir.path(), config.clone()).unwrap();
        let idle = vec![1; 3000];
        store
            .commit(Batch::new().put(1, None, idle.clone()))
            .await
            .unwrap();
        store.close().await.unwrap();
        drop(store);

        let store = WalStore::open(dir.path(), config).unwrap();
        let path = segment::path(dir.path(), 1);
        let mapped = || {
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            maps.contains(path.to_str().unwrap())
        };
        let (start, end) = {
            let log = store.inner.lock_log();
            let kept: Vec<u64> = log.kept.keys().copied().collect();
            assert_eq!(kept, [1], "the segment is mostly live");
            let mapping = &log.kept[&1];
            (mapping.start, mapping.end)
        };
        let at = || store.inner.lock_log().state.records[&1].value.as_ptr() as usize;
        assert!((start..end).contains(&at()), "the value was copied at open");
        assert!(mapped());

        churn_until_compacted(&store, 2).await;
        assert!(store.inner.lock_log().kept.is_empty());
        assert!(
            !(start..end).contains(&at()),
            "the value still lies in the mapping"
        );
        assert_eq!(store.get(1).await.unwrap().unwrap().value, idle);
        assert!(!mapped(), "the deleted segment is still mapped");
    }
}
