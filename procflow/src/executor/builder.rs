//! Building an executor and bringing back what the store holds.

use super::Executor;
use super::ahead;
use super::cleanup;
use super::config::Config;
use super::erased::{DynProcedure, Registry};
use super::error::ExecutorError;
use super::hooks::KillHook;
use super::ids::Ids;
use super::inner::{self, Inner, Mode, Table};
use super::lanes::Lanes;
use super::permits::Workers;
use super::requests;
use super::runner::{self, Launch, Resumed};
use super::status::Unloadable;
use super::timers;
use super::wakes::WakeLog;
use crate::locks::Hold;
use crate::locks::LockTable;
use crate::locks::restore::{self, Claim, GiveBack};
use crate::operator::graph::MACHINE_PREFIX;
use crate::stored::record::Wait;
use crate::stored::record::{
    ENVELOPE_VERSION, Envelope, FENCE_KEY, NEXT_ID_KEY, NONCE_PREFIX, records_locks,
};
use crate::{Phase, ProcedureId, StateMachine};
use procflow_store::{Batch, Bytes, Loaded, Record, Store};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize};
use tokio::sync::{Semaphore, watch};
use tokio_util::task::TaskTracker;

/// Configures and starts an [`Executor`]; see [`Executor::builder`].
pub struct ExecutorBuilder<E> {
    store: Arc<dyn Store>,
    env: Arc<E>,
    config: Config,
    registry: Registry<E>,
    hook: Option<Arc<dyn KillHook>>,
    fencing_token: Option<u64>,
    /// Procedures whose abort is requested before any of them runs (crash tests re-ask
    /// for an abort a restart forgot).
    aborted: Vec<u64>,
    /// Whether `start` first checks that every live procedure's data reads.
    check_data: bool,
}

impl<E: Send + Sync + 'static> ExecutorBuilder<E> {
    pub(crate) fn new(store: Arc<dyn Store>, env: Arc<E>) -> Self {
        Self {
            store,
            env,
            config: Config::default(),
            registry: Registry::new(),
            hook: None,
            fencing_token: None,
            aborted: Vec::new(),
            check_data: false,
        }
    }

    /// Makes [`start`](Self::start) check, before it starts anything or writes anything,
    /// that this build can run every live procedure in the store: its machine is
    /// registered, its states are known, and its data decodes (migrating older data
    /// versions). If one cannot, `start` fails with [`ExecutorError::DataCheck`], listing
    /// each by machine and id, and the store is as it was (but for the fencing token, if
    /// one is set): the operator can deploy the previous build again.
    ///
    /// Without the check (the default), such a procedure is found when it is about to run
    /// and is reported stuck there, keeping its locks (see
    /// [`Status::Stuck`](super::Status::Stuck)); the check finds it at the deploy, not
    /// hours later.
    ///
    /// The check decodes each live procedure's data once and drops it before the next:
    /// its memory is bounded by the largest procedure, not the store. What it costs at a
    /// million procedures is in docs/BENCHMARKS.md.
    #[must_use]
    pub fn check_data(mut self, check: bool) -> Self {
        self.check_data = check;
        self
    }

    /// Requests the abort of `id` as the executor starts, before any procedure runs.
    #[cfg(feature = "testing")]
    pub(crate) fn abort_on_start(mut self, id: u64) -> Self {
        self.aborted.push(id);
        self
    }

    /// Lets the executor run (and, after a restart, rebuild) procedures of machine `M`,
    /// found in the store by `M::NAME`.
    #[must_use]
    pub fn register<M: StateMachine<Env = E>>(mut self) -> Self {
        self.registry.register::<M>();
        self
    }

    /// Replaces the configuration (default: [`Config::default`]).
    #[must_use]
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Installs a [`KillHook`], consulted right before and right after every store write.
    /// For crash tests.
    #[must_use]
    pub fn kill_hook(mut self, hook: impl KillHook) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Fences the store for this executor: [`start`](Self::start) first commits `token`
    /// (a metadata write, [`Batch::fencing_token`](procflow_store::Batch)), then loads, and
    /// every later write carries it. From then on the store refuses the writes of any
    /// executor started with a lower token, which stops with [`ExecutorError::Fenced`] at
    /// its next write; and this one stops the same way once an executor with a higher
    /// token starts. Handlers see the token through
    /// [`Context::fencing_token`](crate::Context::fencing_token), to pass on to systems
    /// that can check it.
    ///
    /// Use it when a new executor may take over a store while the old one is still alive
    /// (a failover: the old process paused, not dead): give each owner a larger token than
    /// the last, such as an election's term or the create revision of an etcd leader key.
    ///
    /// # Examples
    ///
    /// ```
    /// # use procflow::prelude::*;
    /// # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
    /// # #[state_machine(procedure = Job)]
    /// # enum JobState { #[initial] #[transition(to = [Done])] Start, #[terminal] Done }
    /// # #[derive(serde::Serialize, serde::Deserialize)]
    /// # struct Job;
    /// # impl JobStateHandlers for Job {
    /// #     async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
    /// #         Ok(job_state::Start::Done.into())
    /// #     }
    /// # }
    /// use procflow::executor::{Executor, ExecutorError};
    /// use procflow_store::MemStore;
    /// use std::sync::Arc;
    ///
    /// # tokio_test_block_on(async {
    /// let store = Arc::new(MemStore::new());
    /// let old = Executor::builder(store.clone(), ())
    ///     .register::<JobState>()
    ///     .fencing_token(1)
    ///     .start()
    ///     .await?;
    /// let new = Executor::builder(store.clone(), ())
    ///     .register::<JobState>()
    ///     .fencing_token(2)
    ///     .start()
    ///     .await?;
    /// // The old owner can no longer write: its submit fails, and it stops.
    /// assert!(old.submit(Job).await.is_err());
    /// assert!(matches!(old.halted(), Some(ExecutorError::Fenced { token: 1, highest: 2 })));
    /// let id = new.submit(Job).await?;
    /// new.wait(id).await?;
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    /// # }
    /// ```
    #[must_use]
    pub fn fencing_token(mut self, token: u64) -> Self {
        self.fencing_token = Some(token);
        self
    }

    /// Loads every procedure from the store and resumes the unfinished ones, each from
    /// its last persisted step (that step runs again).
    ///
    /// A stored procedure whose machine is not registered, or whose record this build
    /// cannot read, is left untouched in the store and reported by
    /// [`Executor::unloadable`] and a log line; it does not stop the start.
    ///
    /// Only the runtime's part of each record is decoded here (status, state, what it
    /// waits for, its locks): a procedure's own data is decoded when it next runs, so a
    /// restart with many dormant or finished procedures does not pay for data it does
    /// not need yet. Data this build can no longer read is found then: the procedure is
    /// reported by [`Executor::unloadable`] and an error log line, and left in the store
    /// as it is, never dropped. (Procedures that have not taken a step yet, and records
    /// written before procflow stored locks in them, are decoded here.)
    ///
    /// From 512 stored procedures on, a second thread decodes records while this one
    /// makes their table entries; that thread ends before `start` returns. The start's
    /// loading runs on the calling task's thread, as one long poll: about 60 ms per
    /// 100,000 live procedures on the benchmarks' 2-vCPU VM, after the store's own open.
    ///
    /// # Errors
    ///
    /// [`ExecutorError::Store`] if the store cannot be read,
    /// [`ExecutorError::Fenced`] if the store has seen a higher fencing token than this
    /// executor's, [`ExecutorError::DuplicateMachine`] if two registered machines share a name,
    /// [`ExecutorError::Metadata`] if the executor's own metadata is damaged,
    /// [`ExecutorError::LockConflict`] if the store says two procedures hold conflicting
    /// locks for life (a damaged store: nothing is started then).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe past the load: dropping the future may leave procedures running.
    pub async fn start(self) -> Result<Executor<E>, ExecutorError> {
        if let Some(name) = self.registry.duplicate {
            return Err(ExecutorError::DuplicateMachine(name));
        }
        if let Some(token) = self.fencing_token {
            fence(self.store.as_ref(), token).await?;
        }
        let loaded = self
            .store
            .load()
            .await
            .map_err(|e| ExecutorError::Store(Arc::new(e)))?;
        if self.check_data {
            check_data(&self.registry, &loaded)?;
        }
        store_graphs(
            self.store.as_ref(),
            &self.registry,
            &loaded,
            self.fencing_token,
        )
        .await?;
        let (mut table, next_id) = table_from(&loaded)?;
        // Before `resume` queues the procedures that ended before the restart.
        table.retention = cleanup::Limit::new(self.config.retention_limit);
        let journal_on = table.journal.on_flag();
        let table = Arc::new(std::sync::Mutex::new(table));
        let inner = Arc::new(Inner {
            workers: Workers::new(self.config.workers.max(1)),
            running: Semaphore::new(self.config.max_running.max(1)),
            live_roots: AtomicUsize::new(0),
            store: self.store,
            env: self.env,
            config: self.config,
            registry: self.registry,
            table: Arc::clone(&table),
            journal_on,
            locks: LockTable::new(),
            // Everything below `next_id` may have been handed out before the restart:
            // the first allocation reserves a new block.
            ids: Ids::new(next_id),
            id_gate: Arc::new(tokio::sync::Mutex::new(())),
            wake_log: WakeLog::default(),
            mode: watch::Sender::new(Mode::Running),
            mode_flag: AtomicU8::new(inner::RUNNING),
            hook: self.hook,
            fencing_token: self.fencing_token,
            writes: AtomicU64::new(0),
            lanes: Lanes::start(&tokio::runtime::Handle::current(), table),
            tasks: TaskTracker::new(),
            requests_seen: std::sync::Mutex::default(),
            timers: Arc::default(),
            #[cfg(feature = "admin")]
            lists: crate::admin::summaries::Cache::default(),
        });
        resume(&inner, &loaded, &self.aborted)?;
        let cleaner = Arc::clone(&inner);
        inner.tasks.spawn(cleanup::run(cleaner));
        inner.tasks.spawn(requests::poll(Arc::clone(&inner)));
        inner.tasks.spawn(timers::run(
            Arc::clone(&inner.timers),
            Arc::downgrade(&inner),
        ));
        Ok(Executor { inner })
    }
}

/// The start check (see [`ExecutorBuilder::check_data`]): every live record loads, with
/// its data decoded, one at a time.
///
/// # Errors
///
/// [`ExecutorError::DataCheck`] with every live record that does not.
fn check_data<E: Send + Sync + 'static>(
    registry: &Registry<E>,
    loaded: &Loaded,
) -> Result<(), ExecutorError> {
    let mut unreadable = Vec::new();
    for record in loaded.records.iter().filter(|r| !r.finished) {
        if let Err((machine, reason)) = check_record(registry, &record.value) {
            unreadable.push(Unloadable {
                id: ProcedureId::new(record.id),
                machine,
                reason,
            });
        }
    }
    if unreadable.is_empty() {
        tracing::info!("start check: every live procedure reads");
        return Ok(());
    }
    tracing::error!(
        count = unreadable.len(),
        "start check: live procedures this build cannot run"
    );
    Err(ExecutorError::DataCheck { unreadable })
}

/// Whether this build can run the procedure stored as `value`: the machine's name and
/// why not, if not. Its decoded data is dropped on return.
fn check_record<E: Send + Sync + 'static>(
    registry: &Registry<E>,
    value: &Bytes,
) -> Result<(), (String, String)> {
    let (envelope, snapshot) =
        Envelope::decode(value).map_err(|reason| ("?".to_owned(), reason))?;
    let snapshot = value.slice(value.len() - snapshot.len()..);
    let mut procedure = registry.load_lazy(&snapshot)?;
    if let Some(why) = newer_than_this_build(&envelope, procedure.as_ref()) {
        return Err((procedure.machine().to_owned(), why));
    }
    procedure
        .decode()
        .map_err(|error| (procedure.machine().to_owned(), error.to_string()))
}

/// Takes the store over with `token` before loading it: once this write is in, the store
/// refuses every write of a previous owner, so the load below sees all it will ever write.
async fn fence(store: &dyn Store, token: u64) -> Result<(), ExecutorError> {
    let batch = Batch::new()
        .put_meta(FENCE_KEY, token.to_le_bytes().to_vec())
        .with_fencing_token(token);
    store.commit(batch).await.map_err(ExecutorError::from_store)
}

/// Stores the graph of every registered machine whose stored graph differs (or is
/// missing), so that tools without the machines' types can draw them.
async fn store_graphs<E: Send + Sync + 'static>(
    store: &dyn Store,
    registry: &Registry<E>,
    loaded: &Loaded,
    token: Option<u64>,
) -> Result<(), ExecutorError> {
    let mut batch = Batch::new();
    for graph in &registry.graphs {
        let key = format!("{MACHINE_PREFIX}{}", graph.name);
        // A graph is names and flags: it always serializes.
        let value = postcard::to_stdvec(graph).unwrap_or_default();
        if loaded.meta.get(&key) != Some(&value) {
            batch = batch.put_meta(key, value);
        }
    }
    if batch.ops.is_empty() {
        return Ok(());
    }
    batch.fencing_token = token;
    store.commit(batch).await.map_err(ExecutorError::from_store)
}

/// The nonces from the store's metadata, and the next id to hand out: past the stored
/// reservation and every stored id.
fn table_from(loaded: &Loaded) -> Result<(Table, u64), ExecutorError> {
    let read_u64 = |key: &str, bytes: &[u8]| {
        <[u8; 8]>::try_from(bytes)
            .map(u64::from_le_bytes)
            .map_err(|_| ExecutorError::Metadata {
                key: key.to_owned(),
            })
    };
    let reserved = match loaded.meta.get(NEXT_ID_KEY) {
        Some(bytes) => read_u64(NEXT_ID_KEY, bytes)?,
        None => 1,
    };
    let max_id = loaded.records.iter().map(|r| r.id).max().unwrap_or(0);
    let next_id = reserved.max(max_id + 1);
    let mut nonces = HashMap::new();
    for (key, value) in loaded.meta.range(NONCE_PREFIX.to_owned()..) {
        let Some(nonce) = key.strip_prefix(NONCE_PREFIX) else {
            break;
        };
        nonces.insert(nonce.to_owned(), read_u64(key, value)?);
    }
    let table = Table {
        nonces,
        ..Table::default()
    };
    Ok((table, next_id))
}

/// Rebuilds every stored procedure; starts the unfinished ones.
///
/// Before any task starts, everything a task would otherwise set up on its own first run
/// is in place, so nothing depends on the order tasks are polled in: every entry is in
/// the table (a parent finds its children), every suspended procedure is registered on
/// its event (a `wake` right after the start reaches it), and every procedure whose record
/// says it holds its locks for life holds them again (no one else is granted a
/// conflicting lock first; see [`restore`]). Operators' requests left in the store are
/// handed to their procedures then too.
///
/// # Errors
///
/// [`ExecutorError::LockConflict`] if two recorded holders conflict: no task has started.
fn resume<E: Send + Sync + 'static>(
    inner: &Arc<Inner<E>>,
    loaded: &Loaded,
    aborted: &[u64],
) -> Result<(), ExecutorError> {
    // Oldest first: the order they took their locks in before the restart. Also how a
    // parent is found (by binary search: a map of every record's parent cost a restart
    // of a million procedures tens of MB it kept afterwards, freed but not returned).
    let mut records: Vec<&Record> = loaded.records.iter().collect();
    records.sort_unstable_by_key(|record| record.id);
    let parent_of = |id: u64| {
        let at = records.binary_search_by_key(&id, |record| record.id).ok()?;
        records[at].parent
    };
    // Sized once: grown by doubling, it left its smaller copies behind as free memory.
    let unfinished = records.iter().filter(|r| !r.finished).count();
    let mut live = Vec::with_capacity(unfinished);
    // One lock for the whole load: no task runs yet, and nothing else can reach the
    // table before the start returns. Taken per record (twice for a dormant one), each
    // release waited for the record's writes to the table, which miss the cache: perf
    // put half of the start's own time there at 500,000 live procedures, and the start
    // took 6 % less without them (docs/BENCHMARKS.md, "Issue 33 in stop 59").
    let mut table = inner.table();
    table.reserve(records.len());
    // Recorded holders get their locks back as they come, guesses (records older than
    // the field) after all of them; `guessed` says where those are in `live`.
    let mut give_back = GiveBack::new(&inner.locks);
    let mut guessed = HashMap::new();
    let mut roots = 0;
    // Room on the event map for every live procedure, given back below if most did not
    // wait on an event (`Table::reserve_events`).
    table.reserve_events(unfinished);
    // Each record is made ready on a second thread, ahead of its table entry made here.
    let prepared = |record: &&Record| prepare(inner, record, parent_of);
    ahead::map(&records, prepared, |&record, prepared| {
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(why) => return unloadable(&mut table, record.id, why),
        };
        runner::insert_loaded(&mut table, prepared.entry, aborted.contains(&record.id));
        let Some(resumed) = prepared.resumed else {
            return; // Finished.
        };
        let (mut guess, mut holding) = (false, false);
        if let Some(claim) = prepared.claim {
            guess = !claim.recorded;
            holding = give_back.claim(*claim);
        }
        let mut resumed = resumed.unwrap_or_else(|launch| Resumed::runnable(&mut table, launch));
        if holding {
            resumed.set_holding();
        }
        let id = record.id;
        // A dormant one parks, unless its locks are a guess still to settle. No task
        // runs yet.
        let resumed = if guess {
            Err(resumed)
        } else {
            resumed.park_now(inner, &mut table)
        };
        if let Err(resumed) = resumed {
            if guess {
                guessed.insert(id, live.len());
            }
            // Counted as running: a dormant one leaves the count as it parks.
            roots += usize::from(prepared.root);
            live.push(resumed);
        }
    });
    table.fit_events();
    drop(table);
    let (granted, conflicts) = give_back.finish();
    if let Some(conflict) = conflicts.into_iter().next() {
        return Err(ExecutorError::LockConflict {
            holder: conflict.holder,
            claimant: conflict.claimant,
            lock: conflict.lock,
        });
    }
    for id in granted {
        if let Some(&index) = guessed.get(&id) {
            live[index].set_holding();
        }
    }
    inner
        .live_roots
        .store(roots, std::sync::atomic::Ordering::Release);
    tracing::info!(
        live = live.len(),
        total = loaded.records.len(),
        "executor resuming procedures"
    );
    requests::carry_out_stored(inner, &loaded.meta);
    for resumed in live {
        resumed.start(inner);
    }
    Ok(())
}

/// What a procedure loaded at start claims of its locks: for one that holds them for
/// life, whether its record says it holds them, or, for a record older than that field,
/// a guess if it has started. `None`: it holds nothing (it queues as it runs).
fn claim_of<E>(launch: &Launch<E>) -> Option<Claim> {
    let locks = launch.locks().ok()?;
    if locks.hold() != Hold::ForLife || locks.locks().is_empty() {
        return None;
    }
    let recorded = match launch.envelope.holds_locks {
        Some(holds) => holds,
        None if has_started(launch.procedure.as_ref(), &launch.envelope) => false,
        None => return None,
    };
    if launch.envelope.holds_locks == Some(false) {
        return None;
    }
    Some(Claim {
        owner: launch.id,
        ancestors: launch.ancestors.clone(),
        locks: locks.locks().to_vec(),
        recorded,
    })
}

/// Whether a procedure has started: it took a step, waits, or rolls back
/// ([`restore::may_have_taken`]).
fn has_started<E>(procedure: &dyn DynProcedure<E>, envelope: &Envelope) -> bool {
    restore::may_have_taken(
        procedure.steps(),
        envelope.wait != Wait::Ready,
        matches!(procedure.phase(), crate::Phase::Running),
    )
}

/// Whether a live procedure's data is decoded at start rather than when it next runs:
/// when only its data can say which locks it holds (an envelope of version 1 does not
/// record them), or when it has not started (its locks are checked before its first
/// step, and it runs at once anyway).
fn must_decode_now<E>(
    finished: bool,
    value: &[u8],
    procedure: &dyn DynProcedure<E>,
    envelope: &Envelope,
) -> bool {
    !finished && (!records_locks(value) || !has_started(procedure, envelope))
}

/// How much of a stored envelope [`launch_stored`] reads.
#[derive(Clone, Copy)]
pub(crate) enum Read {
    /// All of it: the procedure is about to run.
    Whole,
    /// At start: without its history and summary if it is finished or stays dormant
    /// (neither is written again before it is read whole: a dormant procedure reads its
    /// value again when roused).
    AtStart,
}

/// Rebuilds the stored procedure `id` from its value, its data left encoded unless
/// [`must_decode_now`] says otherwise. Called at start for every record, and again when
/// a procedure parked as its stored value is roused (see `runner::dormant`).
///
/// # Errors
///
/// The machine's name (`?` if unreadable) and why, when the value cannot be loaded.
pub(crate) fn launch_stored<E: Send + Sync + 'static>(
    inner: &Inner<E>,
    id: u64,
    parent: Option<u64>,
    ancestors: Vec<u64>,
    value: &Bytes,
    finished: bool,
    read: Read,
) -> Result<Launch<E>, (String, String)> {
    let decode = match read {
        Read::Whole => Envelope::decode,
        Read::AtStart => Envelope::decode_head,
    };
    let (mut envelope, snapshot) = decode(value).map_err(|reason| ("?".to_owned(), reason))?;
    // The data stays encoded until the procedure runs (see `lazy`); the snapshot is the
    // value's tail, shared with the store.
    let snapshot = value.slice(value.len() - snapshot.len()..);
    let mut procedure = inner.registry.load_lazy(&snapshot)?;
    if must_decode_now(finished, value, procedure.as_ref(), &envelope) {
        // Data this build cannot decode: if the envelope says which locks it declared,
        // the procedure loads all the same and is found stuck as it is about to run (see
        // `runner::unloadable`); if not, nothing can say what it locks.
        if let Err(error) = procedure.decode() {
            if !records_locks(value) {
                return Err((procedure.machine().to_owned(), error.to_string()));
            }
        }
    }
    // The state after a spawn runs once its children end: it has not run yet. Otherwise
    // it is not known whether the current state's handler ran before the crash.
    let acted = !matches!(envelope.wait, Wait::Children(_));
    let newer = newer_than_this_build(&envelope, procedure.as_ref()).map(Into::into);
    if matches!(read, Read::AtStart)
        && !finished
        && !runner::parks_at_start(&envelope.wait, newer.is_some())
    {
        // It runs now: its next record carries its history, read whole.
        envelope = Envelope::decode(value)
            .map_err(|reason| (procedure.machine().to_owned(), reason))?
            .0;
    }
    Ok(Launch {
        newer,
        id,
        parent,
        ancestors,
        procedure,
        envelope,
        acted,
        holding: false,
    })
}

/// Why a record is newer than this build, if it is: a newer build wrote its envelope or
/// its snapshot in a format this build reads only in part.
fn newer_than_this_build<E>(
    envelope: &Envelope,
    procedure: &dyn DynProcedure<E>,
) -> Option<String> {
    if envelope.version > ENVELOPE_VERSION {
        return Some(format!(
            "written by a newer build: envelope format {}, this procflow writes {ENVELOPE_VERSION}; \
             run a build at least as new",
            envelope.version
        ));
    }
    procedure.read_only()
}

/// A stored procedure made ready ([`prepare`]) for what a restart does with it under
/// the table's lock: its entry, its locks' claim, and parking or starting it.
struct Prepared<E> {
    entry: runner::LoadedEntry,
    /// Boxed, as few have one: each made item crosses from one thread to the other.
    claim: Option<Box<Claim>>,
    /// It has no parent.
    root: bool,
    /// A dormant one (`Ok`) or one that runs (`Err`); `None` if it finished, or if it is
    /// parked in its entry already.
    resumed: Option<Result<Resumed<E>, Box<Launch<E>>>>,
}

/// Rebuilds a stored procedure and readies what its table entry needs; a dormant one's
/// (or a finished one's) decoded parts are dropped here already. It takes no lock and
/// changes nothing: a restart runs it on a second thread ([`ahead`]), so that what it
/// allocates and frees is allocated and freed there. (Freed on the thread that makes the
/// entries, glibc's arena lock went back and forth between the two threads, and the
/// start took twice as long as on one thread.)
///
/// # Errors
///
/// The machine's name (`?` if unreadable) and why, when the value cannot be loaded.
fn prepare<E: Send + Sync + 'static>(
    inner: &Arc<Inner<E>>,
    record: &Record,
    parent_of: impl Fn(u64) -> Option<u64>,
) -> Result<Prepared<E>, (String, String)> {
    // Its own parent is in the record: no search for it, and none at all for a root (a
    // search per record was a tenth of a start of roots, each a cache miss).
    let parent_of = |id| {
        if id == record.id {
            record.parent
        } else {
            parent_of(id)
        }
    };
    let ancestors = || restore::ancestors(record.id, parent_of);
    if let Some(dormant) = prepare_dormant(inner, record, ancestors) {
        return Ok(dormant);
    }
    let launch = launch_stored(
        inner,
        record.id,
        record.parent,
        ancestors(),
        &record.value,
        record.finished,
        Read::AtStart,
    )?;
    // A record this build does not rewrite cannot store a wake-up: it is left off its
    // event, so a wake neither counts it nor is lost on it (the build that reads it
    // waits on its event again).
    let event = match (&launch.envelope.wait, &launch.newer) {
        (Wait::Event { name, .. }, None) if !record.finished => Some(name.as_str().into()),
        _ => None,
    };
    let mut entry = runner::LoadedEntry::of(&launch, event);
    if record.finished {
        return Ok(Prepared {
            entry,
            claim: None,
            root: false,
            resumed: None,
        });
    }
    let claim = claim_of(&launch).map(Box::new);
    let root = launch.parent.is_none();
    let resumed = match Resumed::new(inner, launch, record.value.clone()) {
        // A dormant one whose locks need no settling parks in its entry here: the
        // thread that puts the entries in the table then has nothing left to do with it.
        Ok(dormant) if claim.is_none() => dormant.park_in(inner, &mut entry).err().map(Ok),
        resumed => Some(resumed),
    };
    Ok(Prepared {
        entry,
        claim,
        root,
        resumed,
    })
}

/// [`prepare`], the short way, for what a restart loads most: a procedure suspended on
/// an event, running forward and holding no locks for life, in a record this build
/// wrote. Its stored value is read in place ([`Registry::glance`]), where loading it
/// built the procedure, its cursor and its envelope only to drop them (callgrind: 5,550
/// instructions per procedure, a fifth of them that; docs/BENCHMARKS.md, "Issue 33 in
/// stop 66"). It makes what [`prepare`] makes of such a record, which
/// `tests/restart_dormant.rs` checks through what the executor shows and does. `None`
/// for any other record, and for one the glance does not read: [`prepare`] loads those
/// whole, which also says what is wrong with one.
fn prepare_dormant<E: Send + Sync + 'static>(
    inner: &Arc<Inner<E>>,
    record: &Record,
    ancestors: impl FnOnce() -> Vec<u64>,
) -> Option<Prepared<E>> {
    if record.finished || !records_locks(&record.value) {
        return None;
    }
    let (mut envelope, snapshot) = Envelope::decode_head(&record.value).ok()?;
    let Wait::Event { until_ms, .. } = envelope.wait else {
        return None;
    };
    let locks = envelope.declared_locks();
    if envelope.version > ENVELOPE_VERSION
        || (locks.hold() == Hold::ForLife && !locks.locks().is_empty())
    {
        return None;
    }
    let glanced = inner.registry.glance(snapshot)?;
    let place = runner::Place {
        machine: glanced.machine,
        state: glanced.state,
        steps: glanced.steps,
        phase: &Phase::Running,
    };
    let info = runner::describe_at(record.id, record.parent, &place, &envelope, None);
    // The event's name moves from the envelope, dropped here, to the table.
    let Wait::Event { name, .. } = std::mem::replace(&mut envelope.wait, Wait::Ready) else {
        return None;
    };
    let mut entry = runner::LoadedEntry::new(info, &envelope, Some(name.into_boxed_str()));
    let lineage = (record.id, record.parent, ancestors());
    let due = (until_ms, glanced.past_point_of_no_return);
    let dormant = Resumed::glanced(inner, lineage, record.value.clone(), &envelope, due);
    Some(Prepared {
        claim: None,
        root: record.parent.is_none(),
        resumed: dormant.park_in(inner, &mut entry).err().map(Ok),
        entry,
    })
}

/// Notes that the stored procedure `id` cannot be loaded, and why.
fn unloadable(table: &mut Table, id: u64, (machine, reason): (String, String)) {
    tracing::warn!(id, %machine, %reason, "procedure cannot be loaded; left in the store");
    table.unloadable.push(Unloadable {
        id: ProcedureId::new(id),
        machine,
        reason,
    });
}
