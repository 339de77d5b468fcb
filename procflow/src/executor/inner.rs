//! The state one executor shares between its handle and its procedure tasks.

use super::config::Config;
use super::erased::Registry;
use super::error::ExecutorError;
use super::hooks::{KillHook, StoreWrite, WriteKind, WritePoint};
use super::ids::Ids;
use super::packed::PackedInfo;
use super::permits::Workers;
use super::signal::Signal;
use super::status::{Outcome, ProcedureInfo, Unloadable};
use super::timers::Timers;
use super::wakes::WakeLog;
use super::watched::Watched;
use crate::locks::LockTable;
use crate::stored::record::NEXT_ID_KEY;
use crate::{Error, ProcedureId};
use futures_util::FutureExt;
use procflow_store::{Batch, CommitSlot, Op, Store, StoreError};
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{Notify, Semaphore, oneshot, watch};
use tokio_util::task::TaskTracker;

/// How many ids one reservation in the store covers: one metadata write per block of
/// submits, not per submit.
const ID_BLOCK: u64 = 1024;

/// [`Inner::mode_flag`] values: [`Mode`] only moves forward, running → shutting down →
/// halted (or running → halted).
pub(crate) const RUNNING: u8 = 0;
const SHUTTING_DOWN: u8 = 1;
const HALTED: u8 = 2;

/// A failed [`Inner::commit_outcome`].
#[derive(Debug)]
pub(crate) struct CommitFailure {
    /// Why (the executor halted, unless the store refused the batch).
    pub(crate) error: ExecutorError,
    /// Whether the batch may be in the store all the same: the store's answer was lost
    /// (`StoreError::may_have_applied`), or a kill hook stopped the executor after it.
    pub(crate) may_have_applied: bool,
}

/// A new reservation of ids, to write with the batch that uses the first of them.
pub(crate) struct Reservation {
    /// Held until the batch has landed (or failed): no other reservation races it.
    _gate: tokio::sync::OwnedMutexGuard<()>,
    target: u64,
}

impl Reservation {
    /// The metadata op that makes the reservation durable.
    pub(crate) fn op(&self) -> Op {
        Op::PutMeta {
            key: NEXT_ID_KEY.to_owned(),
            value: self.target.to_le_bytes().to_vec(),
        }
    }

    /// The batch carrying [`op`](Self::op) landed: ids up to the target may be handed out.
    pub(crate) fn confirm<E>(self, inner: &Inner<E>) {
        inner.ids.confirm(self.target);
    }
}

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
    pub(crate) workers: Workers,
    /// Root procedures running at once; the others wait for a permit (the queue).
    pub(crate) running: Semaphore,
    /// Root procedures running or queued for a slot (not dormant, not finished), for
    /// backpressure.
    pub(crate) live_roots: AtomicUsize,
    pub(crate) table: Arc<Mutex<Table>>,
    /// Whether the table's journal notes changes ([`Journal::on_flag`](super::journal::Journal::on_flag)).
    pub(crate) journal_on: Arc<std::sync::atomic::AtomicBool>,
    pub(crate) locks: LockTable,
    /// The ids handed out so far and the durable reservation's end.
    pub(crate) ids: Ids,
    /// Serialises writes of the id reservation, so ids are handed out only under a
    /// durable one.
    pub(crate) id_gate: Arc<tokio::sync::Mutex<()>>,
    /// Wakes a running step may still need (see [`WakeLog`]).
    pub(crate) wake_log: WakeLog,
    pub(crate) mode: watch::Sender<Mode>,
    /// [`Mode`]'s variant as a number, read on every step without the watch's lock.
    pub(crate) mode_flag: AtomicU8,
    pub(crate) hook: Option<Arc<dyn KillHook>>,
    /// Carried by every batch; see [`ExecutorBuilder::fencing_token`](super::ExecutorBuilder::fencing_token).
    pub(crate) fencing_token: Option<u64>,
    /// Writes so far, for the kill hook's [`StoreWrite::index`]; counted only when
    /// there is a hook.
    pub(crate) writes: AtomicU64,
    pub(crate) tasks: TaskTracker,
    /// The tasks that poll the procedures' futures ([`Lanes`](super::lanes::Lanes)),
    /// on the runtime the executor started on: a procedure may be roused from outside
    /// it (a synchronous `abort`).
    pub(crate) lanes: super::lanes::Lanes,
    /// Keys of operator requests this executor has in hand (`false`: being carried out,
    /// or unreadable) or has concluded (`true`) while a poll may still read them from
    /// before their delete: the poll for requests left by other processes skips them.
    pub(crate) requests_seen: Mutex<HashMap<String, bool>>,
    /// When to rouse dormant procedures that wait for a time.
    pub(crate) timers: Arc<Timers>,
    /// The admin's list of the procedures, shared by every admin over this executor.
    #[cfg(feature = "admin")]
    pub(crate) lists: crate::admin::summaries::Cache,
}

/// Every procedure the executor knows, live or finished (until retention removes it).
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) procs: HashMap<u64, Box<Entry>, foldhash::fast::RandomState>,
    pub(crate) nonces: HashMap<String, u64>,
    /// The nonce each procedure submitted with one has, for retention to delete: beside
    /// the entries, not in them, as few have one (16 bytes less per entry).
    pub(crate) nonce_of: HashMap<u64, Box<str>>,
    /// Nonces whose submit is being persisted: a second submit with the same nonce waits
    /// for the first (told through the `Notify`) instead of making a second procedure.
    pub(crate) pending_nonces: HashMap<String, Arc<Notify>>,
    /// Event name → procedures suspended on it. Hashed with foldhash's quality variant,
    /// seeded per map, not SipHash: a restart registers every dormant procedure's event
    /// here, and SipHash took half of that registration (issue 33). Names may come from
    /// outside the process, so the seeded variant rather than the fast one of `procs`.
    pub(crate) events: HashMap<Box<str>, Waiters, foldhash::quality::RandomState>,
    pub(crate) unloadable: Vec<Unloadable>,
    /// The procedures whose snapshots changed since the admin's list last took them.
    pub(crate) journal: super::journal::Journal,
    /// The procedures a channel was made for by `Executor::subscribe`, for
    /// [`Table::sweep_unwatched`] to drop the channels no one listens to any more.
    pub(crate) watched: Vec<u64>,
    /// Ended procedures by the time they ended (ms since the epoch), earliest first, for
    /// retention (`cleanup.rs`); an entry may be queued more than once, or be revived
    /// since: retention checks its `finished_ms` before it deletes.
    pub(crate) ended: BinaryHeap<Reverse<(u64, u64)>>,
    /// `Config::retention_limit`, and how the cleanup is told the table passed it.
    pub(crate) retention: super::cleanup::Limit,
}

/// How a procedure dealt with an operator's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Done, and durable (or nothing was left to do: it had ended).
    Done,
    /// It cannot do it; why.
    Refused(String),
}

/// A dormant procedure: it cannot run until something it waits for happens (an event,
/// its children, a lock, a time), so it has no task and no running slot; this resumes
/// it, spawning its task again.
///
/// It holds the procedure and the executor (the procedure's `Inner`): the executor
/// drops every parked procedure when it stops, which breaks that cycle.
pub(crate) struct Parked(pub(crate) Box<dyn Sleeper>);

/// What a dormant procedure is, in its table entry, until roused: a parked `Runner`, or
/// a procedure loaded dormant, kept as its stored value (see `runner::dormant`).
pub(crate) trait Sleeper: Send {
    /// Gives the procedure a task again (`entry` is its table entry, out of which it was
    /// just taken).
    fn rouse(self: Box<Self>, entry: &mut Entry);
}

pub(crate) struct Entry {
    pub(crate) info: Watched,
    /// Wakes the procedure's task: its event fired, or one of its children ended (see
    /// [`Entry::rouse`]). Made when first needed ([`Entry::signal`]): a procedure loaded
    /// dormant has no task to wake, and a million of them would pay 112 bytes each (the
    /// `Arc`'s block, the progress cell of `signal.rs` included).
    wake: Option<Arc<Signal>>,
    /// The procedure itself while it is dormant.
    pub(crate) parked: Option<Parked>,
    /// What callers and operators asked of it and wait on, if anything (see [`Asked`]).
    asked: Option<Box<Asked>>,
    /// Wall-clock end, ms since the epoch, for retention.
    pub(crate) finished_ms: Option<u64>,
    /// Its id is in the table's journal, not yet taken (see [`Table::noted`]).
    pub(crate) noted: bool,
}

/// What callers and operators asked of a procedure, until it has acted on it. Rare: one
/// box for all of it, and none in most entries (a million dormant procedures then save
/// its size each).
#[derive(Default)]
pub(crate) struct Asked {
    /// Why the procedure must roll back at its next boundary or wait, if it must: an
    /// abort request, or its parent stopping its children. Set only through
    /// [`Entry::ask_abort`], which raises the signal's flag too: private for that.
    abort: Option<Error>,
    /// An operator's bypass to carry out at the next boundary or wait: who, and why. Set
    /// only through [`Entry::ask_bypass`], for the same reason.
    bypass: Option<(String, String)>,
    /// Callers of `wake` waiting until this procedure has persisted its wake-up.
    pub(crate) wake_acks: Vec<oneshot::Sender<()>>,
    /// Operator requests (abort, bypass) waiting until this procedure has acted on them
    /// durably, or refused them.
    pub(crate) request_acks: Vec<oneshot::Sender<Settled>>,
    /// Callers of `Executor::wait`, told its outcome once it has ended (a sender dropped
    /// with the entry tells them it is gone).
    pub(crate) waits: Vec<oneshot::Sender<Outcome>>,
}

impl Asked {
    /// The abort asked, if any.
    pub(crate) fn abort(&self) -> Option<&Error> {
        self.abort.as_ref()
    }

    /// Whether a bypass was asked.
    pub(crate) fn bypass_asked(&self) -> bool {
        self.bypass.is_some()
    }

    fn is_empty(&self) -> bool {
        self.abort.is_none()
            && self.bypass.is_none()
            && self.wake_acks.is_empty()
            && self.request_acks.is_empty()
            && self.waits.is_empty()
    }
}

impl Entry {
    pub(crate) fn new(info: PackedInfo, finished_ms: Option<u64>) -> Self {
        Entry {
            info: Watched::new(info),
            wake: None,
            parked: None,
            asked: None,
            finished_ms,
            noted: false,
        }
    }

    /// What was asked of it, if anything.
    pub(crate) fn asked(&self) -> Option<&Asked> {
        self.asked.as_deref()
    }

    /// What was asked of it, to ask more. An abort or a bypass goes through
    /// [`ask_abort`](Self::ask_abort) or [`ask_bypass`](Self::ask_bypass) instead, which
    /// also raise its signal's flag.
    pub(crate) fn ask(&mut self) -> &mut Asked {
        self.asked.get_or_insert_with(Box::default)
    }

    /// Asks it to roll back with `cause` at its next boundary or wait (an earlier cause
    /// stays).
    pub(crate) fn ask_abort(&mut self, cause: impl FnOnce() -> Error) {
        self.ask().abort.get_or_insert_with(cause);
        self.raise_stop_flag();
    }

    /// Asks it to be bypassed at its next boundary or wait, by whom and why (an earlier
    /// request stays).
    pub(crate) fn ask_bypass(&mut self, by: impl FnOnce() -> (String, String)) {
        self.ask().bypass.get_or_insert_with(by);
        self.raise_stop_flag();
    }

    /// Takes the abort asked of it, if any.
    pub(crate) fn take_abort(&mut self) -> Option<Error> {
        self.take_asked(|asked| &mut asked.abort)
    }

    /// Takes the bypass asked of it, if any: who, and why.
    pub(crate) fn take_bypass(&mut self) -> Option<(String, String)> {
        self.take_asked(|asked| &mut asked.bypass)
    }

    /// Tells its task, without the table's lock, that a stop was asked (see
    /// [`Signal`]); a signal made later starts with the flag up.
    fn raise_stop_flag(&self) {
        if let Some(wake) = &self.wake {
            wake.ask_to_stop();
        }
    }

    /// Whether an abort or a bypass waits in the entry.
    fn asked_to_stop(&self) -> bool {
        self.asked()
            .is_some_and(|asked| asked.abort().is_some() || asked.bypass_asked())
    }

    /// Takes one thing asked of it (the field `pick` points at), freeing the box once
    /// nothing is left in it.
    pub(crate) fn take_asked<T: Default>(&mut self, pick: impl FnOnce(&mut Asked) -> &mut T) -> T {
        let Some(asked) = self.asked.as_deref_mut() else {
            return T::default();
        };
        let taken = std::mem::take(pick(asked));
        if asked.is_empty() {
            self.asked = None;
        }
        taken
    }

    /// Publishes the procedure's new snapshot, telling its subscribers if it changed;
    /// once it has ended, the callers of `wait` are told how.
    pub(crate) fn publish(&mut self, info: PackedInfo) {
        self.info.send_if_changed(info);
        self.mark_watched();
        if self.asked.is_none() {
            return;
        }
        let Some(outcome) = self.info.borrow().outcome() else {
            return;
        };
        for wait in self.take_asked(|asked| &mut asked.waits) {
            let _ = wait.send(outcome.clone()); // A caller that stopped waiting does not mind.
        }
    }

    /// A receiver of the procedure's outcome, if it has not ended yet: `Err` holds it if
    /// it has.
    pub(crate) fn await_outcome(&mut self) -> Result<oneshot::Receiver<Outcome>, Outcome> {
        if let Some(outcome) = self.info.borrow().outcome() {
            return Err(outcome);
        }
        let (sender, receiver) = oneshot::channel();
        let waits = &mut self.ask().waits;
        // Callers that stopped waiting (a `wait` under a timeout, called again and again)
        // must not pile up.
        waits.retain(|wait| !wait.is_closed());
        waits.push(sender);
        Ok(receiver)
    }

    /// Something the procedure may wait for happened: resumes it if it is dormant, else
    /// tells its task (a permit the task finds before it would park).
    ///
    /// Called under the table's lock, as parking happens under it: no rouse falls between
    /// a task's last look and its parking.
    pub(crate) fn rouse(&mut self) {
        match self.parked.take() {
            Some(Parked(sleeper)) => sleeper.rouse(self),
            // Made if need be: the permit waits for a task not started yet (a procedure
            // loaded at start, roused before it parks).
            None => self.signal().notify_one(),
        }
    }

    /// The signal that wakes the procedure's task (see [`Entry::rouse`]), and tells it
    /// that a stop was asked.
    pub(crate) fn signal(&mut self) -> Arc<Signal> {
        let asked_to_stop = self.asked_to_stop();
        let watched = self.info.drop_unwatched();
        let wake = (self.wake).get_or_insert_with(|| Arc::new(Signal::new(asked_to_stop, watched)));
        Arc::clone(wake)
    }

    /// The procedure's current snapshot: the one published to the entry, moved on by
    /// the steps its task kept as progress since (see `signal.rs`).
    pub(crate) fn snapshot(&self) -> Cow<'_, PackedInfo> {
        let published = self.info.borrow();
        let progress = self.wake.as_ref().and_then(|wake| wake.progress());
        match progress.and_then(|progress| published.moved_on(&progress)) {
            Some(moved) => Cow::Owned(moved),
            None => Cow::Borrowed(published),
        }
    }

    /// Tells the task whether someone subscribed to the snapshots (a channel is kept,
    /// once one whose receivers are all gone is dropped); returns it.
    fn mark_watched(&mut self) -> bool {
        let watched = self.info.drop_unwatched();
        if let Some(wake) = &self.wake {
            wake.set_watched(watched);
        }
        watched
    }

    /// Whether the procedure was roused since its task last looked: takes the permit.
    pub(crate) fn take_permit(&self) -> bool {
        let permit = self
            .wake
            .as_ref()
            .map(|wake| wake.notified().now_or_never());
        permit.flatten().is_some()
    }
}

/// The procedures suspended on one event.
///
/// A set, not a list: with many procedures on one event, joining and leaving must not
/// scan the others (that made a restart of 500,000 suspended procedures quadratic). But
/// most events have one waiter (an event per account, per request), and a one-element
/// `BTreeSet` allocates a node of eleven slots: about 130 bytes per dormant procedure.
#[derive(Debug)]
pub(crate) enum Waiters {
    One(u64),
    /// Boxed: the map's slots (up to half of them spare) stay 16 bytes, not 32.
    #[allow(clippy::box_collection)]
    Many(Box<BTreeSet<u64>>),
}

impl Waiters {
    fn insert(&mut self, id: u64) {
        match self {
            Waiters::One(only) if *only == id => {}
            Waiters::One(only) => *self = Waiters::Many(Box::new(BTreeSet::from([*only, id]))),
            Waiters::Many(set) => drop(set.insert(id)),
        }
    }

    fn contains(&self, id: u64) -> bool {
        match self {
            Waiters::One(only) => *only == id,
            Waiters::Many(set) => set.contains(&id),
        }
    }

    /// Takes `id` off; `true` if none is left.
    fn remove(&mut self, id: u64) -> bool {
        match self {
            Waiters::One(only) => *only == id,
            Waiters::Many(set) => {
                set.remove(&id);
                set.is_empty()
            }
        }
    }

    /// Every waiter, in id order.
    pub(crate) fn into_ids(self) -> Vec<u64> {
        match self {
            Waiters::One(only) => vec![only],
            Waiters::Many(set) => set.into_iter().collect(),
        }
    }
}

impl Table {
    /// Queues procedure `id`, which ended at `finished_ms` (if it has), for retention.
    /// Past [`Config::retention_limit`](super::Config::retention_limit), tells the cleanup.
    pub(crate) fn ended_at(&mut self, id: u64, finished_ms: Option<u64>) {
        if let Some(at) = finished_ms {
            self.ended.push(Reverse((at, id)));
            self.retention.check(self.ended.len());
        }
    }

    /// Publishes procedure `id`'s new snapshot to its entry, if it still has one (see
    /// [`Entry::publish`]), noting the change for the admin's list.
    pub(crate) fn publish(&mut self, info: PackedInfo) {
        let id = info.id().get();
        if let Some(entry) = self.procs.get_mut(&id) {
            entry.publish(info);
            self.noted(id);
        }
    }

    /// Notes that procedure `id`'s entry was added, changed or removed (for the admin's
    /// list: see [`Journal`](super::journal::Journal)).
    /// An entry is noted once until a list takes it (its `noted` flag, cleared as the
    /// list reads it), so a busy procedure's thousand steps are one id in the journal.
    pub(crate) fn noted(&mut self, id: u64) {
        if !self.journal.is_on() {
            return;
        }
        let already =
            (self.procs.get_mut(&id)).is_some_and(|e| std::mem::replace(&mut e.noted, true));
        if !already {
            self.journal.note(id, self.procs.len());
        }
    }

    /// Removes procedure `id`'s entry and its nonce, noting the change for the admin's
    /// list. Returns the entry, if there was one.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Box<Entry>> {
        let entry = self.procs.remove(&id);
        self.nonce_of.remove(&id);
        self.noted(id);
        entry
    }

    /// A receiver of procedure `id`'s snapshots, if it is in the table
    /// (`Executor::subscribe`); a channel made for it is noted for
    /// [`Table::sweep_unwatched`].
    pub(crate) fn subscribe(
        &mut self,
        id: u64,
    ) -> Option<tokio::sync::watch::Receiver<ProcedureInfo>> {
        let entry = self.procs.get_mut(&id)?;
        // The channel starts from the snapshot as it is now, progress included.
        if let Cow::Owned(moved) = entry.snapshot() {
            entry.info.send_replace(moved);
        }
        let (receiver, made) = entry.info.subscribe();
        entry.mark_watched();
        if made {
            self.watched.push(id);
        }
        Some(receiver)
    }

    /// Drops the channels of the procedures in [`Table::watched`] whose receivers are all
    /// gone (see `watched.rs`), and forgets those procedures. A pass over the subscribed
    /// procedures only, not the table.
    ///
    /// A procedure is noted again each time a channel is made for it, and a channel
    /// dropped at a change is made again by the next subscriber: without the dedup, one
    /// that is watched on and off while it lives would be noted once per channel.
    pub(crate) fn sweep_unwatched(&mut self) {
        self.watched.sort_unstable();
        self.watched.dedup();
        let procs = &mut self.procs;
        self.watched
            .retain(|id| procs.get_mut(id).is_some_and(|entry| entry.mark_watched()));
    }

    /// Makes room for `additional` more procedures at once (a start loading every
    /// stored one): grown by doubling instead, the map leaves each smaller table behind
    /// as free memory the process keeps.
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.procs.reserve(additional);
    }

    /// Registers procedure `id` as suspended on `event`.
    pub(crate) fn listen(&mut self, event: &str, id: u64) {
        match self.events.get_mut(event) {
            Some(waiting) => waiting.insert(id),
            None => drop(self.events.insert(event.into(), Waiters::One(id))),
        }
    }

    /// [`listen`](Self::listen), the event's name already boxed (made on another
    /// thread at start).
    pub(crate) fn listen_boxed(&mut self, event: Box<str>, id: u64) {
        // One hash of the name and one probe, not two of each.
        match self.events.entry(event) {
            std::collections::hash_map::Entry::Occupied(waiting) => waiting.into_mut().insert(id),
            std::collections::hash_map::Entry::Vacant(room) => drop(room.insert(Waiters::One(id))),
        }
    }

    /// Room on the event map for `waiting` more procedures suspended on events, taken at
    /// once: grown by doubling, the map hashed every name again at each growth, a third of
    /// the start at 1,000,000 procedures each waiting on an event of its own.
    pub(crate) fn reserve_events(&mut self, waiting: usize) {
        self.events.reserve(waiting);
    }

    /// Gives back the room [`Table::reserve_events`] took if most of it went unused (a
    /// map keeps its room).
    pub(crate) fn fit_events(&mut self) {
        if self.events.len() <= self.events.capacity() / 2 {
            self.events.shrink_to_fit();
        }
    }

    /// Whether procedure `id` is registered as suspended on `event` (a wake of `event`
    /// takes it off).
    pub(crate) fn is_listening(&self, event: &str, id: u64) -> bool {
        self.events
            .get(event)
            .is_some_and(|waiting| waiting.contains(id))
    }

    /// Unregisters procedure `id` from `event`.
    pub(crate) fn stop_listening(&mut self, event: &str, id: u64) {
        if let Some(waiting) = self.events.get_mut(event)
            && waiting.remove(id)
        {
            self.events.remove(event);
        }
    }
}

impl<E> Inner<E> {
    /// See [`Inner::requests_seen`].
    pub(crate) fn requests_seen(&self) -> MutexGuard<'_, HashMap<String, bool>> {
        self.requests_seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave the table half-updated in a way that
        // matters more than stopping every procedure would.
        let mut table = self
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Snapshots this thread's lane kept come before whatever is done under the lock.
        super::deferred::apply_kept(&self.table, &mut table);
        table
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode.borrow().clone()
    }

    pub(crate) fn is_halted(&self) -> bool {
        self.mode_flag.load(Ordering::Acquire) == HALTED
    }

    /// Why the executor halted, if it did. Reads the watch only then: it is checked
    /// around every store write.
    pub(crate) fn halt_reason(&self) -> Option<ExecutorError> {
        if !self.is_halted() {
            return None;
        }
        match &*self.mode.borrow() {
            Mode::Halted(reason) => Some(reason.clone()),
            _ => None,
        }
    }

    /// `Ok` while the executor runs, else why it does not.
    pub(crate) fn running(&self) -> Result<(), ExecutorError> {
        match self.mode() {
            Mode::Running => Ok(()),
            Mode::ShuttingDown => Err(ExecutorError::ShutDown),
            Mode::Halted(reason) => Err(reason),
        }
    }

    /// Wakes every procedure suspended on `event` (see `Executor::wake`); returns one
    /// receiver per woken procedure, told once it has persisted its wake-up.
    pub(crate) fn wake(&self, event: &str) -> Vec<oneshot::Receiver<()>> {
        let mut table = self.table();
        // Under the table's lock, as a step that ends by suspending checks the log and
        // registers: a wake cannot fall between the two.
        self.wake_log.wake(event);
        let waiting = table.events.remove(event).map(Waiters::into_ids);
        let waiting = waiting.unwrap_or_default();
        let mut acks = Vec::with_capacity(waiting.len());
        for id in waiting {
            if let Some(entry) = table.procs.get_mut(&id) {
                let (ack, acked) = oneshot::channel();
                entry.ask().wake_acks.push(ack);
                entry.rouse();
                acks.push(acked);
            }
        }
        acks
    }

    /// Rouses procedure `id` (see [`Entry::rouse`]).
    pub(crate) fn rouse(&self, id: u64) {
        if let Some(entry) = self.table().procs.get_mut(&id) {
            entry.rouse();
        }
    }

    /// Drops every dormant procedure: the executor stopped, they resume at the next
    /// start. Each holds the executor, so this also lets it be freed.
    pub(crate) fn drop_parked(&self) {
        let parked: Vec<Parked> = self
            .table()
            .procs
            .values_mut()
            .filter_map(|entry| entry.parked.take())
            .collect();
        // Outside the table's lock: dropping a procedure runs the user's `Drop`.
        drop(parked);
    }

    /// Runs a procedure's future (or another of the executor's) on one of its lanes,
    /// tracked for shutdown; callable from anywhere.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.lanes.run(self.tasks.track_future(task));
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
        // No procedure parks once the mode has left running (it looks under the lock).
        self.drop_parked();
    }

    /// Stops taking new work; returns whether the executor was running.
    pub(crate) fn begin_shutdown(&self) -> bool {
        let was_running = self.mode.send_if_modified(|mode| {
            let running = matches!(mode, Mode::Running);
            if running {
                *mode = Mode::ShuttingDown;
                self.mode_flag.store(SHUTTING_DOWN, Ordering::Release);
            }
            running
        });
        // Dormant procedures have nothing in flight: they resume at the next start.
        self.drop_parked();
        was_running
    }

    /// Hands out `n` fresh ids. When they run past the durable reservation in the store,
    /// also returns a [`Reservation`]: commit its op in the batch that uses the ids, then
    /// [`confirm`](Reservation::confirm) it. Until then every other allocation past the
    /// durable reservation waits, so reservations land in order and an id is never handed
    /// out twice, also across restarts and refused batches. Ids of a batch that did not
    /// land are skipped, never reused: no one saw them.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call hands out nothing.
    pub(crate) async fn allocate_ids(&self, n: u64) -> (Vec<u64>, Option<Reservation>) {
        if let Some(ids) = self.ids.take_reserved(n) {
            return (ids.collect(), None);
        }
        let gate = Arc::clone(&self.id_gate).lock_owned().await;
        if let Some(ids) = self.ids.take_reserved(n) {
            return (ids.collect(), None);
        }
        let (ids, target) = self.ids.take_beyond(n, ID_BLOCK);
        let reservation = Reservation {
            _gate: gate,
            target,
        };
        (ids.collect(), Some(reservation))
    }

    /// Commits `batch`, consulting the kill hook right before and right after.
    ///
    /// # Errors
    ///
    /// The reason the executor halted: killed here or earlier, or this store write failed
    /// (which halts the executor).
    ///
    /// With a `slot`, the store's answer comes back through it ([`Store::commit_in`]): a
    /// procedure's steps, one commit at a time.
    pub(crate) async fn commit(
        &self,
        procedure: u64,
        kind: WriteKind,
        batch: Batch,
        slot: Option<&Arc<CommitSlot>>,
    ) -> Result<(), ExecutorError> {
        self.commit_outcome(procedure, kind, batch, slot)
            .await
            .map_err(|failed| failed.error)
    }

    /// [`commit`](Self::commit), telling a failure that wrote nothing from one after which
    /// the batch may be in the store all the same.
    pub(crate) async fn commit_outcome(
        &self,
        procedure: u64,
        kind: WriteKind,
        batch: Batch,
        slot: Option<&Arc<CommitSlot>>,
    ) -> Result<(), CommitFailure> {
        let refused = |error| CommitFailure {
            error,
            may_have_applied: false,
        };
        if let Some(reason) = self.halt_reason() {
            return Err(refused(reason));
        }
        // Counted only for a kill hook, the one reader: both workers adding to one
        // atomic on every step moved its cache line between the cores each time.
        let index = match self.hook {
            Some(_) => self.writes.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
        let write = |point| StoreWrite {
            procedure: ProcedureId::new(procedure),
            kind,
            point,
            index,
        };
        self.kill_at(&write(WritePoint::Before)).map_err(refused)?;
        let batch = Batch {
            fencing_token: self.fencing_token,
            ..batch
        };
        let committed = match slot {
            Some(slot) => self.store.commit_in(batch, slot).await,
            None => self.store.commit(batch).await,
        };
        match committed {
            Ok(()) => {}
            // A refused batch changed nothing: only its procedure (or request) is affected.
            Err(error @ (StoreError::TooLarge { .. } | StoreError::MetaExists { .. })) => {
                return Err(refused(ExecutorError::Rejected(Arc::new(error))));
            }
            Err(error) => {
                let may_have_applied = error.may_have_applied();
                let error = ExecutorError::from_store(error);
                self.halt(error.clone());
                return Err(CommitFailure {
                    error,
                    may_have_applied,
                });
            }
        }
        // Killed after the write: it is in the store, as after a crash right after it.
        self.kill_at(&write(WritePoint::After))
            .map_err(|error| CommitFailure {
                error,
                may_have_applied: true,
            })
    }

    fn kill_at(&self, write: &StoreWrite) -> Result<(), ExecutorError> {
        // (Before the write: nothing of it is stored. After: all of it.)
        if self.hook.as_ref().is_some_and(|hook| hook.kill(write)) {
            self.halt(ExecutorError::Killed);
        }
        self.halt_reason().map_or(Ok(()), Err)
    }

    /// Publishes a procedure's new snapshot to its subscribers, if it changed: nothing is
    /// woken for a snapshot they have already seen (a resumed procedure republishes the
    /// one its entry was created with).
    ///
    /// Inside a lane's poll the snapshot is kept, and applied with the others of the
    /// poll under one lock at its end ([`deferred`](super::deferred)).
    pub(crate) fn publish(&self, info: PackedInfo) {
        if let Err(info) = super::deferred::keep(&self.table, info) {
            self.table().publish(info);
        }
    }

    /// Resolves when the mode leaves `Running`.
    pub(crate) async fn stopping(&self) {
        let mut mode = self.mode.subscribe();
        // An error means the sender is gone: the executor is being dropped.
        let _ = mode.wait_for(|mode| !matches!(mode, Mode::Running)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64) -> Box<Entry> {
        Box::new(Entry::new(
            PackedInfo::pack(ProcedureInfo {
                id: crate::ProcedureId::new(id),
                parent: None,
                machine: "m",
                status: super::super::Status::Runnable,
                state: "S",
                steps: 0,
                error: None,
                submitted: std::time::SystemTime::now(),
                updated: std::time::SystemTime::now(),
            }),
            None,
        ))
    }

    /// A procedure's task learns of an abort or a bypass from its signal, without the
    /// table's lock: the flag is up whether the request came before the signal was made
    /// or after. A caller waiting for the outcome asks nothing that stops it.
    #[test]
    fn the_signal_tells_a_stop_was_asked_whenever_it_was() {
        let mut early = entry(1);
        early.ask_abort(|| Error::fatal("aborted"));
        assert!(early.signal().may_be_asked_to_stop(), "asked before");

        let mut late = entry(2);
        let signal = late.signal();
        assert!(!signal.may_be_asked_to_stop());
        late.ask_bypass(|| ("operator".into(), "stuck".into()));
        assert!(signal.may_be_asked_to_stop(), "asked after");

        let mut waited = entry(3);
        let signal = waited.signal();
        assert!(waited.await_outcome().is_ok());
        assert!(!signal.may_be_asked_to_stop(), "a wait is no stop");
        waited.ask_abort(|| Error::fatal("aborted"));
        assert!(signal.may_be_asked_to_stop());
    }

    /// The sweep drops the channels no one listens to, keeps those with receivers, and
    /// forgets procedures that are gone; what it forgot a new subscriber notes again.
    #[test]
    fn the_sweep_drops_only_the_channels_no_one_listens_to() {
        let mut table = Table::default();
        for id in 1..=3 {
            table.procs.insert(id, entry(id));
        }
        let kept = table.subscribe(1).unwrap();
        drop(table.subscribe(2));
        drop(table.subscribe(3));
        table.remove(3);
        table.sweep_unwatched();
        assert_eq!(table.watched, [1]);
        let has_channel =
            |table: &mut Table, id| table.procs.get_mut(&id).unwrap().info.drop_unwatched();
        assert!(has_channel(&mut table, 1), "a receiver is left");
        assert!(!has_channel(&mut table, 2), "its channel was dropped");
        drop(kept);
        table.sweep_unwatched();
        assert!(table.watched.is_empty());
        drop(table.subscribe(2));
        assert_eq!(table.watched, [2], "a new channel is noted again");
        assert!(table.subscribe(4).is_none(), "no procedure, no channel");
    }

    /// Room taken for many waiters is given back when few came, and kept when most did.
    #[test]
    fn room_for_waiters_is_given_back_when_unused() {
        let mut table = Table::default();
        table.reserve_events(1000);
        table.listen("a", 1);
        table.fit_events();
        assert!(table.events.capacity() < 100, "{}", table.events.capacity());
        assert!(table.is_listening("a", 1));
        table.reserve_events(1000);
        for id in 0..900 {
            table.listen(&format!("e{id}"), id);
        }
        let room = table.events.capacity();
        table.fit_events();
        assert_eq!(table.events.capacity(), room);
    }

    /// The registry keeps one waiter without a set, and grows and shrinks like a set.
    #[test]
    fn an_event_registry_behaves_as_a_set_of_waiters() {
        let mut table = Table::default();
        table.listen("a", 7);
        table.listen("a", 7);
        assert!(matches!(table.events["a"], Waiters::One(7)));
        assert!(table.is_listening("a", 7) && !table.is_listening("a", 8));
        // Leaving an event one is not on changes nothing.
        table.stop_listening("a", 8);
        assert!(table.is_listening("a", 7));
        table.listen("a", 3);
        table.listen("a", 9);
        assert!(table.is_listening("a", 3) && table.is_listening("a", 9));
        table.stop_listening("a", 7);
        assert!(!table.is_listening("a", 7) && table.is_listening("a", 3));
        table.stop_listening("a", 3);
        table.stop_listening("a", 9);
        assert!(
            table.events.is_empty(),
            "the last to leave removes the event"
        );
        table.listen("b", 5);
        table.stop_listening("b", 5);
        assert!(table.events.is_empty());
        table.listen("c", 4);
        table.listen("c", 2);
        let ids = table.events.remove("c").map(Waiters::into_ids);
        assert_eq!(ids, Some(vec![2, 4]), "in id order");
    }
}
