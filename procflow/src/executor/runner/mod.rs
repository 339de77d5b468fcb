//! One task per live procedure: wait for what it waits for, run a step, persist, repeat.
//!
//! - this module: the loop, one step, and what a step's outcome does to the procedure;
//! - [`waits`]: waiting for locks, events and retries, and what interrupts a wait (an
//!   abort, the procedure's deadline);
//! - [`children`]: starting children, waiting for them, stopping and undoing them;
//! - [`dormant`]: a procedure that waits has no task: it parks until roused;
//! - [`unloadable`]: a procedure whose stored data no longer decodes, found as it is
//!   about to run.

mod children;
mod dormant;
mod unloadable;
mod waits;

use super::erased::{DynProcedure, DynProgress};
use super::error::ExecutorError;
use super::hooks::WriteKind;
use super::inner::{Entry, Inner, Settled, Table};
use super::packed::{PackedInfo, Progress, Snapshot};
use super::permits::Permit;
use super::signal::Signal;
use super::status::{Status, status_of};
use super::wakes::StepStart;
use crate::locks::{Hold, LockKeyError, Locks};
use crate::stored::clock::wall_ms_at;
use crate::stored::history::{StepKind, StepOutcome};
use crate::stored::record::{Envelope, Trouble, Wait, now_ms};
use crate::{Context, Error, Phase, ProcedureId};
use dormant::Reload;
use futures_util::FutureExt;
use procflow_store::{Batch, Bytes, CommitSlot};
use std::cell::Cell;
use std::collections::hash_map;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};
use tracing::Instrument;

/// A stored procedure, decoded.
type Loaded<E> = (Envelope, Box<dyn DynProcedure<E>>);

/// The task stops without touching the store again: the executor is halting or shutting
/// down (the procedure resumes at the next start), or a write was refused (then
/// [`Runner::refused`] says why, and the loop goes on from the last stored step).
pub(crate) struct Exit;

/// What [`launch`] needs to start a procedure's task.
pub(crate) struct Launch<E> {
    pub(crate) id: u64,
    pub(crate) parent: Option<u64>,
    /// Parent, grandparent… (for locks a child may share with its ancestors).
    pub(crate) ancestors: Vec<u64>,
    pub(crate) procedure: Box<dyn DynProcedure<E>>,
    pub(crate) envelope: Envelope,
    /// Whether the current state's handler may have run already (see [`Runner::acted`]).
    pub(crate) acted: bool,
    /// Whether its locks were given back to it already (held for life before a restart).
    pub(crate) holding: bool,
    /// Set when a newer build wrote its record in a format this build reads only in part:
    /// why it is neither run nor rewritten here (see [`unloadable`]).
    pub(crate) newer: Option<Box<str>>,
}

/// Adds the procedure to the table (if it is not there yet) and starts its task.
pub(crate) fn launch<E: Send + Sync + 'static>(inner: &Arc<Inner<E>>, launch: Launch<E>) {
    let wake = insert_entry(inner, &launch);
    start(inner, launch, wake);
}

/// Spawns the task of a procedure whose table entry exists (`wake` is its signal).
fn start<E: Send + Sync + 'static>(inner: &Arc<Inner<E>>, launch: Launch<E>, wake: Arc<Signal>) {
    inner.spawn(task(inner, launch, wake));
}

/// A procedure loaded at start, its entry in the table, to start once every loaded
/// procedure's entry is there ([`Resumed::start`]).
pub(crate) enum Resumed<E> {
    /// Suspended on an event: it parks at once, as its stored value ([`Reload`]); its
    /// decoded parts are dropped already, so that a restart's peak memory is not every
    /// procedure decoded at once.
    Dormant {
        reload: Box<Reload<E>>,
        /// When it is due: its event's timeout or its deadline, the earlier.
        until_ms: Option<u64>,
    },
    /// It runs: it gets a task. (Boxed: most loaded procedures are dormant, and the
    /// list of them is as long as the store.)
    Runnable(Box<Launch<E>>, Arc<Signal>),
}

impl<E: Send + Sync + 'static> Resumed<E> {
    /// `launch`, just loaded from `value`, before its table entry is made: a dormant one,
    /// its decoded parts dropped (it is rebuilt from `value` when roused). `Err` gives
    /// back one that runs: it gets its wake-up signal once its entry is made
    /// ([`runnable`](Self::runnable)).
    pub(crate) fn new(
        inner: &Arc<Inner<E>>,
        launch: Launch<E>,
        value: Bytes,
    ) -> Result<Self, Box<Launch<E>>> {
        let wait = &launch.envelope.wait;
        let until_ms = match wait {
            Wait::Event { until_ms, .. } if parks_at_start(wait, launch.newer.is_some()) => {
                *until_ms
            }
            _ => return Err(Box::new(launch)),
        };
        let procedure = launch.procedure.as_ref();
        let past_point_of_no_return = procedure.past_point_of_no_return();
        let may_roll_back =
            waits::may_roll_back_at(procedure.phase(), past_point_of_no_return, &launch.envelope);
        let until_ms = Self::due(until_ms, may_roll_back, &launch.envelope);
        Ok(Self::Dormant {
            until_ms,
            reload: Reload::of(inner, launch, value),
        })
    }

    /// A procedure loaded dormant at start, read in place rather than loaded (see
    /// `builder::prepare_dormant`): `id`, a child of `parent` if given, its stored
    /// `value` and `envelope`, suspended on an event until `until_ms` if given, running
    /// forward, past a point of no return or not.
    pub(crate) fn glanced(
        inner: &Arc<Inner<E>>,
        (id, parent, ancestors): (u64, Option<u64>, Vec<u64>),
        value: Bytes,
        envelope: &Envelope,
        (until_ms, past_point_of_no_return): (Option<u64>, bool),
    ) -> Self {
        let may_roll_back =
            waits::may_roll_back_at(&Phase::Running, past_point_of_no_return, envelope);
        Self::Dormant {
            until_ms: Self::due(until_ms, may_roll_back, envelope),
            reload: Reload::new(inner, (id, parent, ancestors), value),
        }
    }

    /// When a dormant procedure is due: its event's timeout `until_ms` or its deadline,
    /// the earlier; the deadline only while it `may_roll_back`.
    fn due(until_ms: Option<u64>, may_roll_back: bool, envelope: &Envelope) -> Option<u64> {
        let deadline = envelope.deadline_ms.filter(|_| may_roll_back);
        dormant::earliest(until_ms, deadline)
    }

    /// `launch`, loaded to run, its entry in `table`.
    pub(crate) fn runnable(table: &mut Table, launch: Box<Launch<E>>) -> Self {
        let wake = signal_in(table, launch.id);
        Self::Runnable(launch, wake)
    }

    /// Marks it as holding its locks again (a guess granted once every recorded holder
    /// had its locks back; see `locks::restore`).
    pub(crate) fn set_holding(&mut self) {
        match self {
            Self::Dormant { reload, .. } => reload.set_holding(),
            Self::Runnable(launch, _) => launch.holding = true,
        }
    }

    /// Parks it in `loaded`, its entry made at start and not in the table yet, if it is
    /// dormant; `Err` gives back one that runs. What [`park_now`](Self::park_now) does
    /// once the entry is in the table, done where the entry is made (the start's second
    /// thread), for a procedure whose locks need no settling first.
    pub(crate) fn park_in(self, inner: &Inner<E>, loaded: &mut LoadedEntry) -> Result<(), Self> {
        match self {
            Self::Dormant { reload, until_ms } => reload
                .park_in_new(inner, &mut loaded.entry, until_ms)
                .map_err(|reload| Self::Dormant { reload, until_ms }),
            runnable @ Self::Runnable(..) => Err(runnable),
        }
    }

    /// Parks it now in `table` if it is dormant, as the start loads it: its table entry
    /// was just made, and parking it in a second pass over every loaded procedure found
    /// each entry out of the cache again (13 % of a restart's start, perf). `Err` gives
    /// back what must be started ([`start`](Self::start)) once every procedure is loaded.
    pub(crate) fn park_now(self, inner: &Inner<E>, table: &mut Table) -> Result<(), Self> {
        match self {
            Self::Dormant { reload, until_ms } => reload
                .park_loaded(inner, table, until_ms)
                .map_err(|reload| Self::Dormant { reload, until_ms }),
            runnable @ Self::Runnable(..) => Err(runnable),
        }
    }

    /// Parks it (a wake, an abort or a due time rouses it as it would a task that
    /// parked), or spawns its task.
    pub(crate) fn start(self, inner: &Arc<Inner<E>>) {
        match self {
            Self::Dormant { reload, until_ms } => reload.park(until_ms),
            Self::Runnable(launch, wake) => start(inner, *launch, wake),
        }
    }
}

/// Whether a procedure loaded at start parks at once (as its stored value) rather than
/// getting a task: suspended on an event, unless a newer build wrote its record (it runs
/// at once, to be reported stuck).
pub(crate) fn parks_at_start(wait: &Wait, newer: bool) -> bool {
    matches!(wait, Wait::Event { .. }) && !newer
}

/// A procedure made ready to run, its table entry made: what [`run_when_ready`] runs.
pub(crate) type Ready<E> = (Arc<Inner<E>>, Launch<E>, Arc<Signal>);

/// A task that first makes a procedure ready (`ready`: a submit writes it, a roused
/// dormant one is decoded from its value), then runs it: one task, not two.
///
/// Two futures one after the other (`then`), not one `async fn` awaiting both: the
/// task's future then holds the first one's state or the procedure's, not both. A future
/// keeps room for its arguments, and for every local it moves them into, to its end: as
/// one `async fn`, a submit's task held the submit's data and the `Runner` (twice) beside
/// the running procedure's state for the procedure's whole life, 3,504 bytes; it is 720
/// now (`--cell in-flight:N` of the compare bench, docs/BENCHMARKS.md).
pub(crate) fn run_when_ready<E: Send + Sync + 'static>(
    ready: impl Future<Output = Option<Ready<E>>> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    ready
        .then(|ready| {
            let task = ready.map(|(inner, launch, wake)| task(&inner, launch, wake));
            futures_util::future::OptionFuture::from(task)
        })
        .map(drop)
}

/// A procedure's task.
fn task<E: Send + Sync + 'static>(
    inner: &Arc<Inner<E>>,
    launch: Launch<E>,
    wake: Arc<Signal>,
) -> impl Future<Output = ()> + Send + 'static + use<E> {
    Box::new(Runner::new(inner, launch, wake)).run_in_span()
}

impl<E: Send + Sync + 'static> Runner<E> {
    fn new(inner: &Arc<Inner<E>>, launch: Launch<E>, wake: Arc<Signal>) -> Self {
        // A procedure stored stuck goes on counting its tries, and is reported stuck.
        let trouble = launch.envelope.trouble.as_ref();
        let attempts = trouble.map_or(0, |t| t.attempts);
        let last_error = trouble.map(|t| Box::new(Error::fatal(t.error.clone())));
        let stuck_since = trouble
            .and_then(|t| t.stuck_since_ms)
            .map(crate::stored::history::time_of);
        let locks = launch.locks().map_err(Error::fatal_from);
        let machine = launch.procedure.machine();
        Runner {
            ctx: Context::new(ProcedureId::new(launch.id), Arc::clone(&inner.env))
                .with_fencing_token(inner.fencing_token),
            inner: Arc::clone(inner),
            id: launch.id,
            parent: launch.parent,
            ancestors: launch.ancestors,
            locks,
            holding: launch.holding,
            procedure: launch.procedure,
            envelope: launch.envelope,
            wake,
            attempts,
            last_error,
            ran: ("", StepKind::Execute),
            acted: launch.acted,
            stuck_since,
            stopping_children: None,
            refused: None,
            refusing: false,
            newer: launch.newer,
            parking: None,
            retry_at: None,
            lock_ticket: None,
            step_seconds: metrics::histogram!("procflow_step_seconds", "machine" => machine),
            noted_ms: None,
            step_ended: None,
            published_running: Cell::new(false),
            slot: None,
        }
    }
}

/// The table entry for a procedure, created if missing; returns its wake-up signal.
pub(crate) fn insert_entry<E>(inner: &Inner<E>, launch: &Launch<E>) -> Arc<Signal> {
    let info = launch.info();
    let mut table = inner.table();
    insert_entry_locked(&mut table, launch, || PackedInfo::of(info)).signal()
}

/// The table entry of a procedure loaded at start, made whole apart from the table (on
/// the start's second thread), and what the table notes beside it: see
/// [`insert_loaded`].
///
/// Whole, a dormant one parked in it already ([`Resumed::park_in`]): the thread that
/// puts entries in the table then reads a pointer, not the entry. Made there, each
/// entry's parts crossed from the thread that made them to the one that wrote them into
/// it (perf: that thread spent 39 % of its samples of a restart's start in making
/// entries, 23 % since; docs/BENCHMARKS.md, "Issue 33 in stop 66").
pub(crate) struct LoadedEntry {
    id: u64,
    entry: Box<Entry>,
    nonce: Option<Box<str>>,
    finished_ms: Option<u64>,
    /// The event it is to be registered on, if any.
    event: Option<Box<str>>,
}

impl LoadedEntry {
    /// The entry of `launch`, registered on `event` if given.
    pub(crate) fn of<E>(launch: &Launch<E>, event: Option<Box<str>>) -> Self {
        Self::new(launch.info(), &launch.envelope, event)
    }

    /// The entry of the procedure `info` shows, stored with `envelope`, registered on
    /// `event` if given.
    pub(crate) fn new(info: Snapshot, envelope: &Envelope, event: Option<Box<str>>) -> Self {
        let finished_ms = envelope.finished_ms;
        Self {
            id: info.id.get(),
            entry: Box::new(Entry::new(PackedInfo::of(info), finished_ms)),
            nonce: envelope.nonce.as_deref().map(Into::into),
            finished_ms,
            event,
        }
    }
}

/// Puts the entry of a procedure loaded at start in `table`, unless one is there
/// already; registers it on its event if it has one, and asks it to abort if `aborted`.
/// A procedure that gets a task gets its wake-up signal then ([`Resumed::runnable`]).
pub(crate) fn insert_loaded(table: &mut Table, loaded: LoadedEntry, aborted: bool) {
    let LoadedEntry {
        id,
        entry,
        nonce,
        finished_ms,
        event,
    } = loaded;
    let entry = insert_entry_parts(table, id, || nonce, finished_ms, || entry);
    if aborted {
        entry.ask_abort(|| crate::Error::fatal("aborted on request"));
    }
    if let Some(event) = event {
        table.listen_boxed(event, id);
    }
}

impl<E> Launch<E> {
    /// The locks it declares: its data's, or, while its data is still stored, those its
    /// envelope recorded when it was submitted (`builder::must_decode_now` says when
    /// the envelope cannot be used, and the data is decoded at start instead).
    pub(crate) fn locks(&self) -> Result<Locks, LockKeyError> {
        let recorded = || Ok(self.envelope.declared_locks());
        self.procedure.locks().unwrap_or_else(recorded)
    }

    /// The snapshot of the procedure about to start.
    fn info(&self) -> Snapshot {
        describe(
            self.id,
            self.parent,
            self.procedure.as_ref(),
            &self.envelope,
            None,
        )
    }
}

fn insert_entry_locked<'t, E>(
    table: &'t mut Table,
    launch: &Launch<E>,
    info: impl FnOnce() -> PackedInfo,
) -> &'t mut Entry {
    let nonce = || launch.envelope.nonce.as_deref().map(Into::into);
    let finished_ms = launch.envelope.finished_ms;
    let entry = || Box::new(Entry::new(info(), finished_ms));
    insert_entry_parts(table, launch.id, nonce, finished_ms, entry)
}

/// Procedure `id`'s table entry, made (with `info`) if missing; its nonce noted if it
/// was.
fn insert_entry_parts(
    table: &mut Table,
    id: u64,
    nonce: impl FnOnce() -> Option<Box<str>>,
    finished_ms: Option<u64>,
    entry: impl FnOnce() -> Box<Entry>,
) -> &mut Entry {
    table.noted(id);
    table.ended_at(id, finished_ms);
    let Table {
        procs, nonce_of, ..
    } = table;
    // Boxed: the map's spare slots (a hash map is up to half empty) then cost a pointer
    // each, not a whole entry.
    match procs.entry(id) {
        hash_map::Entry::Occupied(made) => made.into_mut(),
        hash_map::Entry::Vacant(room) => {
            if let Some(nonce) = nonce() {
                nonce_of.insert(id, nonce);
            }
            room.insert(entry())
        }
    }
}

/// The signal that wakes procedure `id`'s task (see [`Entry::signal`]); one linked to
/// nothing if its entry is gone (the task then finds it gone at its first look).
pub(crate) fn signal_of<E>(inner: &Inner<E>, id: u64) -> Arc<Signal> {
    signal_in(&mut inner.table(), id)
}

/// [`signal_of`], in a table already locked.
fn signal_in(table: &mut Table, id: u64) -> Arc<Signal> {
    table
        .procs
        .get_mut(&id)
        .map_or_else(Arc::default, |entry| entry.signal())
}

/// The public snapshot of a procedure.
pub(crate) fn describe<E>(
    id: u64,
    parent: Option<u64>,
    procedure: &dyn DynProcedure<E>,
    envelope: &Envelope,
    last_error: Option<&Error>,
) -> Snapshot {
    let place = Place {
        machine: procedure.machine(),
        state: procedure.state(),
        steps: procedure.steps(),
        phase: procedure.phase(),
    };
    describe_at(id, parent, &place, envelope, last_error)
}

/// Where a procedure is, as a snapshot shows it: read from its loaded procedure, or
/// glanced at in its stored value.
pub(crate) struct Place<'a> {
    pub(crate) machine: &'static str,
    pub(crate) state: &'static str,
    pub(crate) steps: u64,
    pub(crate) phase: &'a Phase,
}

/// [`describe`], for a procedure at `place`.
pub(crate) fn describe_at(
    id: u64,
    parent: Option<u64>,
    place: &Place<'_>,
    envelope: &Envelope,
    last_error: Option<&Error>,
) -> Snapshot {
    let (status, cause) = status_of(place.phase, envelope);
    Snapshot {
        id: ProcedureId::new(id),
        parent: parent.map(ProcedureId::new),
        machine: place.machine,
        status,
        state: place.state,
        steps: place.steps,
        error: cause.or(last_error).cloned(),
        submitted_ms: envelope.submitted_ms,
        updated_ms: envelope.updated_ms,
    }
}

struct Runner<E> {
    inner: Arc<Inner<E>>,
    id: u64,
    parent: Option<u64>,
    /// Parent, grandparent…: a child may take locks they hold.
    ancestors: Vec<u64>,
    /// What it declared (or why that failed), and whether it holds them now.
    locks: Result<Locks, Error>,
    holding: bool,
    procedure: Box<dyn DynProcedure<E>>,
    envelope: Envelope,
    ctx: Context<E>,
    wake: Arc<Signal>,
    /// Failures of the current step in a row.
    attempts: u32,
    /// The state whose handler ran last, and which handler (for its history entry).
    ran: (&'static str, StepKind),
    /// The last error of a step being retried, for observers.
    last_error: Option<Box<Error>>,
    /// Whether the current state's handler ran since the procedure entered it, so it may
    /// have partly acted: an abort or timeout then undoes it too. After a restart this is
    /// not known, and assumed (undo handlers are idempotent; undoing is the safe side).
    acted: bool,
    /// Past a point of no return, since when the current step keeps failing.
    stuck_since: Option<SystemTime>,
    /// Why the children of the current spawn are being stopped (one of them failed, or
    /// this procedure was aborted or timed out while they ran).
    stopping_children: Option<Box<Error>>,
    /// A write the store refused: the procedure went back to its last stored step, and
    /// the next turn fails that step with this error.
    refused: Option<Box<Error>>,
    /// Whether the rollback started after a refused write is being stored (a second
    /// refusal then keeps the procedure stuck instead of looping).
    refusing: bool,
    /// Set by a wait that cannot end yet: park at the end of the turn, until roused or
    /// (if given) that wall-clock time in ms. See [`dormant`].
    parking: Option<Option<u64>>,
    /// When the retry of a failed step is due (wall clock, ms).
    retry_at: Option<u64>,
    /// The lock request it waits on, queued in the lock table.
    lock_ticket: Option<u64>,
    /// `procflow_step_seconds` of its machine, taken from the recorder when the runner
    /// is made: the macro with a label builds its key in a new `Vec` and hashes it, and
    /// did so at every step.
    step_seconds: metrics::Histogram,
    /// When [`note`](Self::note) last read the clock, for the next write's time: one
    /// clock read a step instead of two.
    noted_ms: Option<u64>,
    /// When the step that just ran ended, until its outcome is noted: the history
    /// entry's time, read off this rather than off the wall clock (`stored::clock`).
    step_ended: Option<Instant>,
    /// Whether its last whole publication was of it running without an error, so that
    /// the steps after it may be kept as progress ([`publish_step`](Self::publish_step));
    /// `false` once something else published.
    published_running: Cell<bool>,
    /// A newer build wrote its record (see [`Launch::newer`]): it is stuck, and this build
    /// writes nothing of it.
    newer: Option<Box<str>>,
    /// Where the store's answers to its writes come back ([`Store::commit_in`]), made at
    /// its first write: a step's commit then allocates nothing for its answer.
    slot: Option<Arc<CommitSlot>>,
}

impl<E: Send + Sync + 'static> Runner<E> {
    /// The procedure's task: turns until it ends, the executor stops, or it parks.
    ///
    /// Boxed (see [`run_when_ready`]): passed by value, the `Runner` (608 bytes) sat in
    /// the task's future twice, as the argument and as the local it is moved into. A
    /// parked `Runner` sleeps in the same box.
    async fn run(mut self: Box<Self>) {
        let inner = Arc::clone(&self.inner);
        loop {
            // Only root procedures take a running slot: a child runs on its root's behalf,
            // so a full executor can never wait on children that cannot start.
            // A root aborted, or whose deadline passes, while it is queued rolls back at
            // once, without a slot: both end a procedure wherever it waits (an abort of a
            // queued procedure must not wait for the running ones, which may never end).
            let slot = if self.parent.is_none() {
                match self.take_slot(&inner.running).await {
                    Ok(slot) => slot,
                    Err(Exit) => return,
                }
            } else {
                None
            };
            let until = loop {
                let turned = self.turn().await;
                if let Some(until) = self.parking.take() {
                    break until;
                }
                if turned.is_err() && (self.refused.is_none() || !inner.is_running()) {
                    self.release_locks();
                    return;
                }
            };
            // Dormant: no slot, no task, until roused. Roused already: look again.
            drop(slot);
            // Counted out by `park_until`.
            match self.park_counted_out(until) {
                Ok(()) => return,
                Err(runner) => self = runner,
            }
        }
    }

    /// One turn of the loop: finish, wait, or run one step.
    async fn turn(&mut self) -> Result<(), Exit> {
        if !self.inner.is_running() {
            return Err(Exit);
        }
        if let Some(why) = self.newer.clone() {
            self.stuck_newer(&why);
            return Ok(());
        }
        // The paths off the plain step loop are boxed: the task's future (one allocation
        // per procedure, moved when spawned) stays the size the loop needs.
        if let Some(error) = self.refused.take() {
            return Box::pin(self.fail_refused(*error)).await;
        }
        if self.retry_at.is_some() {
            return Box::pin(self.await_retry()).await;
        }
        // Waits first: a step that spawned children has already moved to the state after
        // them, which may be terminal; the procedure ends only once they have.
        match &self.envelope.wait {
            Wait::Ready => {}
            Wait::Children(_) => return Box::pin(self.await_children()).await,
            Wait::Event { .. } => return Box::pin(self.await_event()).await,
        }
        if let Some(spawn) = self.spawn_to_undo() {
            return Box::pin(self.undo_children(spawn)).await;
        }
        if let Some(cause) = self.interruption() {
            return Box::pin(self.interrupt(cause)).await;
        }
        if self.procedure.phase().is_finished() {
            self.finish().await?;
            return Err(Exit);
        }
        if let (Err(error), Phase::Running) = (&self.locks, self.procedure.phase()) {
            // The procedure cannot say what it locks: it must not run a forward step.
            let error = error.clone();
            return Box::pin(self.on_failure(error)).await;
        }
        if !self.holds_locks() && !Box::pin(self.take_locks()).await? {
            return Ok(()); // Interrupted while waiting: it is rolling back now.
        }
        if self.grant_unrecorded() {
            // One write per grant, before anything runs under it: a restart gives the
            // locks back to the procedures whose record says they hold them, and to no
            // one else (`locks::restore`).
            return self.persist(WriteKind::Lock).await;
        }
        let progress = self.run_step().await?;
        if self.inner.is_halted() {
            // Killed while the step ran: its effect happened, its result is not persisted.
            return Err(Exit);
        }
        let result = match progress {
            Some(progress) => self.after_step(progress).await,
            None => Box::pin(self.interrupt(waits::timed_out(self.procedure.state()))).await,
        };
        // Only what noted this step took its end as its time.
        self.step_ended = None;
        if matches!(&self.locks, Ok(locks) if locks.hold() == Hold::PerStep) {
            self.release_locks();
        }
        result
    }

    /// Whether it holds its declared locks for life now (not per step, not none).
    fn holds_for_life(&self) -> bool {
        self.holding
            && matches!(&self.locks, Ok(locks) if locks.hold() == Hold::ForLife && !locks.locks().is_empty())
    }

    /// Whether it holds its locks for life and its last record does not say so yet.
    fn grant_unrecorded(&self) -> bool {
        self.holds_for_life() && self.envelope.holds_locks != Some(true)
    }

    /// Gives back the locks it holds, and withdraws a request it queued.
    fn release_locks(&mut self) {
        self.withdraw_lock_request();
        if self.holding {
            self.inner.locks.release(self.id);
            self.holding = false;
        }
    }

    async fn after_step(&mut self, progress: DynProgress) -> Result<(), Exit> {
        let outcome = match &progress {
            DynProgress::Moved => Some(StepOutcome::Moved),
            DynProgress::Spawned(children) => Some(StepOutcome::Spawned(
                u32::try_from(children.len()).unwrap_or(u32::MAX),
            )),
            DynProgress::Suspended { event, .. } => Some(StepOutcome::Suspended(event.clone())),
            DynProgress::RolledBack => Some(StepOutcome::Undone),
            DynProgress::Yielded
            | DynProgress::Failed(_)
            | DynProgress::Finished
            | DynProgress::Unloadable(_) => None,
        };
        if let Some(outcome) = outcome {
            let (state, kind) = self.ran;
            self.note(state, kind, outcome);
        }
        match progress {
            DynProgress::Moved => {
                self.succeeded();
                self.acted = false;
                if self.procedure.phase().is_finished() {
                    // The step reached a terminal state: the next turn writes it together
                    // with the end (`Finish`), one durable write instead of two. A crash
                    // before that write runs this last step again, as for any step.
                    return Ok(());
                }
                self.persist(WriteKind::Step).await
            }
            DynProgress::Spawned(children) => {
                self.succeeded();
                self.acted = false;
                Box::pin(self.spawn(children)).await
            }
            DynProgress::Suspended { event, timeout } => {
                // `run_step` registered it as waiting for `event` already.
                self.succeeded();
                let until_ms = timeout.map(|t| {
                    now_ms().saturating_add(u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
                });
                self.envelope.wait = Wait::Event {
                    name: event,
                    until_ms,
                };
                // Stored, not published: `await_event` publishes it suspended once it has
                // left the admission count, so that a caller who sees it waiting can
                // submit at once (`Config::queue_capacity` no longer counts it).
                self.store(WriteKind::Suspend).await
            }
            DynProgress::Yielded => {
                tokio::task::yield_now().await;
                Ok(())
            }
            DynProgress::RolledBack => {
                self.succeeded();
                self.persist(WriteKind::Rollback).await
            }
            DynProgress::Failed(error) => Box::pin(self.on_failure(error)).await,
            DynProgress::Finished => Ok(()),
            DynProgress::Unloadable(reason) => {
                self.stuck_undecodable(&reason);
                Ok(())
            }
        }
    }

    fn succeeded(&mut self) {
        self.attempts = 0;
        self.last_error = None;
        self.stuck_since = None;
        self.envelope.trouble = None;
    }

    /// Appends an entry to the stored history (written with the next write), at the end
    /// of the step that just ran if one did, else now.
    fn note(&mut self, state: &'static str, kind: StepKind, outcome: StepOutcome) {
        let keep = self.inner.config.history;
        let at = self.step_ended.map_or_else(now_ms, wall_ms_at);
        self.noted_ms = Some(self.envelope.note_at(state, kind, outcome, keep, at));
    }

    /// Which handler runs now: the rollback handler while rolling back.
    fn kind(&self) -> StepKind {
        match self.procedure.phase() {
            Phase::RollingBack { .. } => StepKind::Rollback,
            _ => StepKind::Execute,
        }
    }

    /// Runs the current step on a worker, catching panics. `None`: the procedure's deadline
    /// passed while it ran, and the step was cancelled (its future dropped at its next
    /// `.await`, as a crash would stop it); the caller rolls back, undoing this state too.
    /// An abort request never cancels a step: it is honoured when the step returns.
    async fn run_step(&mut self) -> Result<Option<DynProgress>, Exit> {
        let permit = worker_permit(&self.inner).await?;
        // A wait that ended as the executor began to stop (a lock released by a task that
        // exited, a worker freed) must not start a step: `select!` picks among ready
        // branches at random, so the stop may have lost the race.
        if !self.inner.is_running() {
            return Err(Exit);
        }
        let state = self.procedure.state();
        // The history names the state whose handler ran: the undone one for a rollback.
        self.ran = (self.procedure.step_state(), self.kind());
        let started = Instant::now();
        let start = self.inner.wake_log.begin_step();
        // From here on the state may have acted, whatever the step returns.
        self.acted = true;
        let deadline = self.deadline_timer();
        // `attempts` counts this step's failed tries so far.
        self.ctx.set_attempt(self.attempts.saturating_add(1));
        let span = tracing::info_span!("step", state, steps = self.procedure.steps());
        let step = AssertUnwindSafe(self.procedure.step(&self.ctx))
            .catch_unwind()
            .instrument(span);
        let outcome = match deadline {
            // Without a deadline nothing can cancel the step: no timer to race it with.
            None => Some(step.await),
            Some(deadline) => tokio::select! {
                outcome = step => Some(outcome),
                () = deadline => None,
            },
        };
        drop(permit);
        let ended = Instant::now();
        self.step_seconds.record((ended - started).as_secs_f64());
        self.step_ended = Some(ended);
        let Some(outcome) = outcome else {
            tracing::warn!(state, "deadline passed while the step ran; step cancelled");
            self.inner.wake_log.end_step(start);
            return Ok(None);
        };
        let progress = outcome.unwrap_or_else(|panic| {
            let message = panic_message(panic.as_ref());
            tracing::error!(state, %message, "step panicked");
            DynProgress::Failed(Error::fatal(format!("step `{state}` panicked: {message}")))
        });
        let progress = self.suspend_unless_woken(progress, start);
        self.inner.wake_log.end_step(start);
        Ok(Some(progress))
    }

    /// A step that suspends on an event that was woken while it ran runs again instead
    /// of waiting (the wake is not lost); otherwise it is registered as waiting, before
    /// anyone can see it suspended.
    fn suspend_unless_woken(&self, progress: DynProgress, start: StepStart) -> DynProgress {
        let DynProgress::Suspended { event, .. } = &progress else {
            return progress;
        };
        // Under the table's lock, as `wake` records and notifies: no wake falls between
        // the check and the registration.
        let mut table = self.inner.table();
        if self.inner.wake_log.woken_since(event, start) {
            tracing::debug!(event, "woken while the step ran; running it again");
            return DynProgress::Yielded;
        }
        table.listen(event, self.id);
        progress
    }

    async fn on_failure(&mut self, error: Error) -> Result<(), Exit> {
        self.attempts += 1;
        let (state, kind) = (self.procedure.state(), self.kind());
        let config = &self.inner.config;
        if let Phase::RollingBack { cause } = self.procedure.phase() {
            if self.attempts >= config.rollback_retry.max_attempts {
                tracing::error!(%error, "rollback step keeps failing; giving up");
                let cause = cause.clone();
                self.note(state, kind, StepOutcome::Failed(error.to_string()));
                self.procedure.fail(cause);
                self.attempts = 0;
                self.envelope.trouble = None;
                return Ok(());
            }
            let delay = config.rollback_retry.delay(self.attempts);
            self.note(state, kind, StepOutcome::Retried(error.to_string()));
            return self.retry_later(error, delay).await;
        }
        let spent = self.attempts >= config.retry.max_attempts;
        let delay = config.retry.delay(self.attempts);
        let shown = error.to_string();
        match self.procedure.fail_forward(error, spent) {
            Ok(()) => {
                self.note(state, kind, StepOutcome::Failed(shown));
                tracing::info!(cause = ?self.procedure.phase(), "rolling back");
                self.succeeded();
                if self.procedure.phase().is_finished() {
                    return Ok(()); // Nothing to undo: the next turn finishes.
                }
                self.persist(WriteKind::Rollback).await
            }
            Err(error) => {
                self.note(state, kind, StepOutcome::Retried(shown));
                if (!error.is_retryable() || spent) && self.become_stuck(&error) {
                    // Only past a point of no return does a fatal error come back here.
                    // Stored, so that operators see it stuck from outside the process.
                    self.persist(WriteKind::Step).await?;
                }
                self.retry_later(error, delay).await
            }
        }
    }

    /// The step failed for good and the procedure cannot roll back (past a point of no
    /// return, or its rollback cannot be stored): it is retried (capped backoff) and
    /// reported [`Status::Stuck`] until it succeeds or an operator acts. Returns whether
    /// it became stuck just now.
    fn become_stuck(&mut self, error: &Error) -> bool {
        if self.stuck_since.is_some() {
            return false;
        }
        let since = SystemTime::now();
        self.stuck_since = Some(since);
        self.envelope.trouble = Some(Box::new(Trouble {
            attempts: self.attempts,
            error: error.to_string(),
            stuck_since_ms: Some(now_ms()),
        }));
        tracing::error!(%error, state = self.procedure.state(), "procedure stuck; it waits for a retry or an operator");
        metrics::counter!("procflow_stuck_total", "machine" => self.procedure.machine())
            .increment(1);
        true
    }

    /// The store refused a write: the procedure is back at its last stored step. Its
    /// current step fails with `error`, as a fatal step error does, except that the
    /// state is undone too (it acted; only its result could not be stored).
    ///
    /// If even that cannot be stored (the rollback's record is refused too), the
    /// procedure is kept as it is stored: reported [`Status::Stuck`], it runs the step
    /// again after a backoff, until the store takes it or an operator acts.
    async fn fail_refused(&mut self, error: Error) -> Result<(), Exit> {
        if std::mem::take(&mut self.refusing) {
            self.attempts += 1;
            // Not stored: the store refuses this procedure's writes.
            self.become_stuck(&error);
            let delay = self.inner.config.retry.delay(self.attempts);
            return self.retry_later(error, delay).await;
        }
        if !self.may_roll_back() {
            return self.on_failure(error).await;
        }
        self.refusing = true;
        self.procedure.interrupt(error, true);
        self.persist(WriteKind::Rollback).await?;
        self.refusing = false;
        Ok(())
    }

    async fn finish(&mut self) -> Result<(), Exit> {
        self.envelope.finished_ms = Some(now_ms());
        self.envelope.wait = Wait::Ready;
        self.envelope.trouble = None;
        if self.envelope.bypass.is_none() {
            let state = self.procedure.state();
            self.note(state, StepKind::Control, StepOutcome::Ended);
        }
        let value = self.encode().await?;
        self.commit(WriteKind::Finish, Batch::new().finish(self.id, value))
            .await?;
        self.release_locks();
        let info = self.info();
        let counter = match info.status {
            Status::Succeeded => "procflow_succeeded_total",
            Status::RolledBack => "procflow_rolled_back_total",
            Status::Bypassed => "procflow_bypassed_total",
            _ => "procflow_failed_total",
        };
        metrics::counter!(counter, "machine" => info.machine).increment(1);
        tracing::info!(status = ?info.status, steps = info.steps, "procedure finished");
        // The slot is free before anyone can see the end: a caller woken by `wait` may
        // submit at once.
        self.leave_admission();
        self.published_elsewhere();
        let mut table = self.inner.table();
        if let Some(entry) = table.procs.get_mut(&self.id) {
            entry.finished_ms = self.envelope.finished_ms;
            entry.publish(PackedInfo::of(info));
            table.noted(self.id);
            table.ended_at(self.id, self.envelope.finished_ms);
        }
        if let Some(parent) = self.parent.and_then(|parent| table.procs.get_mut(&parent)) {
            parent.rouse();
        }
        drop(table);
        // An abort that arrived too late, or the bypass that ended it: settled.
        self.settle_requests(&Settled::Done);
        Ok(())
    }

    /// Stores the procedure's record and publishes its new status.
    async fn persist(&mut self, kind: WriteKind) -> Result<(), Exit> {
        self.store(kind).await?;
        self.publish_step();
        Ok(())
    }

    /// Stores the procedure's record.
    async fn store(&mut self, kind: WriteKind) -> Result<(), Exit> {
        let value = self.encode().await?;
        let batch = self.slot().map_or_else(Batch::new, |slot| slot.batch());
        self.commit(kind, batch.put(self.id, self.parent, value))
            .await
    }

    /// The procedure's commit slot, made on first use, if its store answers in slots.
    fn slot(&mut self) -> Option<&Arc<CommitSlot>> {
        if self.slot.is_none() && self.inner.store.uses_commit_slots() {
            self.slot = Some(Arc::default());
        }
        self.slot.as_ref()
    }

    // `&mut self`: a shared `&Runner` is not `Send` (the boxed procedure is not `Sync`).
    async fn commit(&mut self, kind: WriteKind, batch: Batch) -> Result<(), Exit> {
        self.slot();
        // The slot borrowed, not cloned: a clone's count would cross between the cores
        // each step (the store holds a clone while the commit is queued).
        let committed = (self.inner)
            .commit(self.id, kind, batch, self.slot.as_ref())
            .await;
        match committed {
            Ok(()) => Ok(()),
            Err(ExecutorError::Rejected(error)) => {
                self.reload_after_refusal(format!("the store refused it: {error}"))
                    .await?;
                Err(Exit)
            }
            Err(_) => Err(Exit),
        }
    }

    /// The store refused this procedure's new state (too large): nothing of the write
    /// happened. Goes back to the last stored step, the one a restart would resume, and
    /// leaves the failure for the next turn ([`Runner::refused`]): the procedure ends
    /// durably (rolled back) or, past a point of no return, is stuck; it never looks
    /// ended while it lives on in the store.
    async fn reload_after_refusal(&mut self, why: String) -> Result<(), Exit> {
        tracing::error!(%why, "procedure state cannot be stored; back to its last stored step");
        let (mut envelope, procedure) = match self.read_back(self.id).await? {
            Some(Ok(parts)) => parts,
            Some(Err(reason)) => {
                self.inner.halt(ExecutorError::Metadata {
                    key: format!("procedure #{} cannot be read back: {reason}", self.id),
                });
                return Err(Exit);
            }
            None => {
                self.inner.halt(ExecutorError::Metadata {
                    key: format!("procedure #{} is missing from the store", self.id),
                });
                return Err(Exit);
            }
        };
        // Whatever it waited for then is over: it went on to the step that was refused.
        envelope.wait = Wait::Ready;
        self.envelope = envelope;
        self.procedure = procedure;
        self.acted = true;
        self.refused = Some(Box::new(Error::fatal(format!(
            "this procedure's new state cannot be stored ({why})"
        ))));
        Ok(())
    }

    /// Procedure `id` as the store holds it, its data left encoded until it runs: `None`
    /// if it is not there, the reason if it cannot be read. A store failure halts the
    /// executor.
    async fn read_back(&mut self, id: u64) -> Result<Option<Result<Loaded<E>, String>>, Exit> {
        let record = match self.inner.store.get(id).await {
            Ok(Some(record)) => record,
            Ok(None) => return Ok(None),
            Err(error) => {
                self.inner.halt(ExecutorError::Store(Arc::new(error)));
                return Err(Exit);
            }
        };
        let loaded = Envelope::decode(&record.value).and_then(|(envelope, snapshot)| {
            // The data stays encoded until the procedure runs (see `lazy`): data that no
            // longer decodes leaves this procedure unloadable instead of stopping the
            // executor.
            let snapshot = record.value.slice(record.value.len() - snapshot.len()..);
            let procedure = self
                .inner
                .registry
                .load_lazy(&snapshot)
                .map_err(|(_, reason)| reason)?;
            Ok((envelope, procedure))
        });
        Ok(Some(loaded))
    }

    /// The stored form of the procedure. Data that cannot be serialized cannot be made
    /// durable: the procedure goes back to its last stored step, as for a refused write.
    async fn encode(&mut self) -> Result<Vec<u8>, Exit> {
        // What a restart gives back: a finished procedure holds nothing (it gives its
        // locks back right after this write).
        self.envelope.holds_locks =
            Some(self.holds_for_life() && self.envelope.finished_ms.is_none());
        if let Some(summary) = self.procedure.describe() {
            self.envelope.summary = summary;
        }
        // The write's time is the step's end, when `note` read the clock already.
        let encoded = match self.noted_ms.take() {
            Some(now) => {
                self.envelope.updated_ms = now;
                self.envelope
                    .encode_as_is(|out| self.procedure.encode_into(out))
            }
            None => self.envelope.encode(|out| self.procedure.encode_into(out)),
        };
        match encoded {
            Ok(value) => Ok(value),
            Err(error) => {
                self.reload_after_refusal(error.to_string()).await?;
                Err(Exit)
            }
        }
    }

    fn info(&self) -> Snapshot {
        let mut info = describe(
            self.id,
            self.parent,
            self.procedure.as_ref(),
            &self.envelope,
            self.last_error.as_deref(),
        );
        if let (Some(since), Some(error)) = (self.stuck_since, &self.last_error) {
            info.status = Status::Stuck {
                error: Error::clone(error),
                since,
                attempts: self.attempts,
            };
        }
        info
    }

    /// Publishes the procedure's snapshot whole to its table entry.
    fn publish(&self) {
        self.publish_whole(self.info());
    }

    fn publish_whole(&self, info: Snapshot) {
        self.published_running.set(Progress::of(&info).is_some());
        self.wake.keep_progress(None);
        self.inner.publish(PackedInfo::of(info));
    }

    /// Publishes a step's snapshot: as progress, kept in the signal, if the procedure
    /// runs without an error now and did at its last whole publication (so that only the
    /// state, the step count and the time changed), and no one needs to be told of each
    /// change (`signal.rs` says why); whole otherwise.
    fn publish_step(&self) {
        let info = self.info();
        let progress = Progress::of(&info).filter(|_| {
            self.published_running.get()
                && !self.wake.is_watched()
                && !self.inner.journal_on.load(Ordering::Acquire)
        });
        match progress {
            Some(progress) => {
                self.wake.keep_progress(Some(progress));
                super::watched::changed();
            }
            None => self.publish_whole(info),
        }
    }

    /// Another path published the snapshot whole (or ended the procedure): the next step
    /// publishes whole too.
    fn published_elsewhere(&self) {
        self.published_running.set(false);
        self.wake.keep_progress(None);
    }
}

/// A permit of the executor's workers (`Config::workers`), or `Exit` if the executor
/// stops first. Taken at once when one is free: waiting for one and for the stop is a
/// race of two futures, on every step's path. A free permit is no one else's: while
/// someone waits, permits given back go to the waiters (`permits.rs`).
async fn worker_permit<E>(inner: &Inner<E>) -> Result<Permit<'_>, Exit> {
    match inner.workers.try_take() {
        Some(permit) => Ok(permit),
        None => tokio::select! {
            permit = inner.workers.take() => Ok(permit),
            () = inner.stopping() => Err(Exit),
        },
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// The size of what `make` returns, without calling it: for a function that returns a
/// future, the size of that future's state, which the compiler fixes.
#[cfg(test)]
pub(crate) fn output_size<A, R>(_make: impl FnOnce(A) -> R) -> usize {
    size_of::<R>()
}

/// What a task of the executor may cost a procedure in flight, for the whole of its life.
#[cfg(test)]
pub(crate) const SMALL_TASK: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    /// A procedure's task holds its state while it waits, not a second copy of its
    /// `Runner` (608 bytes) beside it: passed to an `async fn` by value, it was both
    /// the argument and the local it was moved into.
    #[test]
    fn a_procedures_task_is_small() {
        let size = output_size(|(inner, launch, wake): Ready<()>| task(&inner, launch, wake));
        assert!(size <= SMALL_TASK, "a procedure's task is {size} bytes");
    }
}
