//! The committer: one thread per store that turns queued batches into durable records.
//!
//! [`Store::commit`](crate::Store::commit) puts its batch on the [`Queue`] with a
//! oneshot reply and awaits the reply; [`Store::commit_in`](crate::Store::commit_in)
//! puts it there with the caller's [`CommitSlot`] and awaits the answer in the slot
//! (`slot.rs` says why). The thread takes everything queued, appends each
//! batch as one record (prepared in queue order, so a batch sees every batch before it),
//! makes the whole group durable with one `fdatasync` and then answers every commit of
//! the group. Commits that arrive during that fsync form the next group: that is the
//! group commit.
//!
//! Why a thread of its own: the first version ran every commit on a thread of Tokio's
//! blocking pool that then parked on a condition variable until some commit's fsync
//! covered it. At 256 commits in flight that made 256 parked threads and a `notify_all`
//! herd per fsync; two cores spent two thirds of their time in futex calls and the disk
//! saw 480 fsyncs a second (docs/BENCHMARKS.md). One thread and one oneshot per commit
//! cost one task wake-up per commit.
//!
//! Why the same thread syncs the group it wrote, though its CPU work and the disk then
//! take turns: a second thread that ran each group's `fdatasync` while this one encoded
//! the next made the groups half as large, so each commit carried twice the syncs and
//! hand-offs, on cores already busy. It was no faster at 1,024 procedures, 15 % slower
//! for commits alone at 1,024 writers and a quarter slower at 16 procedures
//! (docs/BENCHMARKS.md, stop 52).
//!
//! Why this thread encodes, checks and applies the batches, though each was just made
//! on a worker whose cache still holds it: a build in which each commit did that on its
//! own thread, under the log's lock, and only queued for the flush and `fdatasync`
//! here, ran `wal:1024` at 0.81–0.86 times the speed of this one. The committer spent
//! 0.3 µs less per commit and the workers 1.2 µs more: they waited for the log's lock
//! and for each other's allocator arenas, and the faster committer synced smaller
//! groups: 5,466 `fdatasync`s in a quick cell against 2,270 (docs/BENCHMARKS.md, stop 55).
//!
//! A commit that is the only one in flight, with nothing queued or being served, skips
//! the thread ([`Inner::serve_inline`], [`WalConfig::inline_lone_commit`](crate::WalConfig::inline_lone_commit)):
//! its caller writes and syncs it, and the committer thread waits meanwhile. For one
//! procedure at a time the two hand-offs between threads cost about a sixth of its
//! steps/s, as much as the spinning below could not win back.
//!
//! The thread frees nothing the committing tasks allocated: a batch's op buffer and the
//! values its changes replace go back with the answer ([`Leftovers`]), and the queue's
//! vector is reused. glibc frees a block under the lock of the arena it came from, so
//! the thread freeing what Tokio's workers allocate stalls on their arenas' locks, and
//! they on its frees: at 1,024 procedures in flight the thread blocked on those locks
//! 2.7 times as often as in `fdatasync` (docs/BENCHMARKS.md).
//!
//! When the queue is empty the thread spins for [`SPIN`] before it sleeps: a procedure's
//! next step usually arrives within microseconds, sooner than a sleeping thread wakes.
//! Not on a single CPU ([`spinning_helps`]): there the spinner only delays the thread it
//! waits for.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::early::Early;
use super::{Inner, Log, record};
use crate::error::StoreError;
use crate::slot::{Answer, CommitSlot, Leftovers};
use crate::state::Prepared;
use crate::store::{Batch, Limits};

/// The largest queue vector kept for the next group, in requests: one burst should not
/// pin its size in memory for good.
const SPARE_KEPT: usize = 1 << 14;

/// How long the idle thread polls the queue before it sleeps on the condition variable.
const SPIN: Duration = Duration::from_micros(100);

/// Whether busy-waiting can pay off here: only if another CPU can run what is waited for
/// meanwhile. On one CPU (`taskset -c 0`) spinning made a single procedure 6 times
/// slower.
pub(crate) fn spinning_helps() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)
}

/// The channel a committing task waits on for its answer.
pub(crate) type Channel = oneshot::Sender<Answer>;

/// Where a commit's answer goes.
pub(crate) enum Reply {
    /// To the task waiting on the channel.
    Channel(Channel),
    /// Back to the caller of [`serve`]: a commit served inline, on the thread of the
    /// task that waits for it, needs no channel to it (nor the channel's allocation).
    Caller,
    /// Into the slot the commit was queued with ([`Inner::commit_in`]).
    Slot(SlotReply),
}

/// The reply to a commit queued with a [`CommitSlot`]: dropped unanswered (the committer
/// thread died, or the queue was stopped), it answers `Poisoned`, as a dropped channel
/// does, so the commit does not wait forever.
pub(crate) struct SlotReply {
    slot: Option<Arc<CommitSlot>>,
    ticket: u64,
}

impl SlotReply {
    pub(crate) fn new(slot: Arc<CommitSlot>, ticket: u64) -> Self {
        SlotReply {
            slot: Some(slot),
            ticket,
        }
    }

    fn send(mut self, answer: Answer) {
        if let Some(slot) = self.slot.take() {
            slot.answer(self.ticket, answer);
        }
    }

    /// Drops the reply without answering: its commit was never queued, and its caller
    /// is told why.
    pub(crate) fn defuse(mut self) {
        self.slot = None;
    }
}

impl Drop for SlotReply {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.answer(self.ticket, Answer::poisoned());
        }
    }
}

/// What the committer thread is asked to do, in order.
pub(crate) enum Request {
    /// Append the batch and answer once it is durable.
    Commit(Batch, Reply),
    /// Refuse later commits, make everything before durable, release the directory lock.
    Close(Channel),
}

/// Requests waiting for the committer thread.
pub(crate) struct Queue {
    state: Mutex<QueueState>,
    wake: Condvar,
    /// `state.requests.len()`, readable without the lock while the thread spins.
    queued: AtomicUsize,
    /// How long the idle thread spins before it sleeps.
    spin: Duration,
}

#[derive(Default)]
struct QueueState {
    requests: Vec<Request>,
    /// The vector of the last group served, empty, to queue into next: pushes do not
    /// allocate, and the committer thread frees no vector the workers grew.
    spare: Vec<Request>,
    /// The thread waits on the condition variable: a push must notify it.
    sleeping: bool,
    /// No more requests are taken (after a close, a drop or the thread's death).
    stopped: bool,
    /// A commit is being served on its caller's thread ([`Inner::serve_inline`]): the
    /// committer thread must not start a group until it ends.
    inline: bool,
    /// The committer thread is serving a group it took: no commit may be served inline.
    serving: bool,
}

impl Queue {
    pub(crate) fn new(spin: bool) -> Self {
        Queue {
            state: Mutex::default(),
            wake: Condvar::new(),
            queued: AtomicUsize::new(0),
            spin: if spin { SPIN } else { Duration::ZERO },
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // Nothing panics while the queue is locked; tolerate poisoning anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `request`, or hands it back if the committer has stopped.
    pub(crate) fn push(&self, request: Request) -> Result<(), Request> {
        let mut state = self.lock();
        if state.stopped {
            return Err(request);
        }
        state.requests.push(request);
        self.queued.store(state.requests.len(), Ordering::Release);
        if state.sleeping {
            state.sleeping = false;
            self.wake.notify_one();
        }
        Ok(())
    }

    /// The committer thread has answered the group [`Queue::take`] gave it, and hands
    /// back its vector, emptied.
    fn served(&self, group: Vec<Request>) {
        debug_assert!(group.is_empty());
        let mut state = self.lock();
        state.serving = false;
        if group.capacity() > state.spare.capacity() && group.capacity() <= SPARE_KEPT {
            state.spare = group;
        }
    }

    /// Stops taking requests; those already queued are still served.
    pub(crate) fn stop(&self) {
        self.lock().stopped = true;
        self.wake.notify_one();
    }

    /// Everything queued, waiting for something if the queue is empty or a commit is
    /// served inline; `None` once the queue is stopped and empty. Marks the committer
    /// as serving: [`Queue::served`] ends that.
    fn take(&self) -> Option<Vec<Request>> {
        let spin_until = Instant::now() + self.spin;
        while self.queued.load(Ordering::Acquire) == 0 && Instant::now() < spin_until {
            std::hint::spin_loop();
        }
        let mut state = self.lock();
        while state.requests.is_empty() || state.inline {
            if state.stopped && state.requests.is_empty() {
                return None;
            }
            state.sleeping = true;
            state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.sleeping = false;
        state.serving = true;
        self.queued.store(0, Ordering::Release);
        let spare = std::mem::take(&mut state.spare);
        Some(std::mem::replace(&mut state.requests, spare))
    }
}

impl Inner {
    /// Commits `batch` on the calling thread, if nothing is queued or being served: a
    /// lone commit's write and `fdatasync` without the two hand-offs between threads,
    /// and with no channel for its answer, which this returns. Hands the batch back if
    /// it must queue instead.
    pub(crate) fn serve_inline(&self, batch: Batch) -> Result<Answer, Batch> {
        {
            let mut state = self.queue.lock();
            // Records must go to the log in queue order: only an empty queue and an idle
            // committer leave this one next.
            if state.stopped || state.inline || state.serving || !state.requests.is_empty() {
                return Err(batch);
            }
            state.inline = true;
        }
        let _end = EndInline(self);
        let request = Request::Commit(batch, Reply::Caller);
        // `serve` answers every commit it is given; a panic unwinds past this.
        Ok(serve(self, std::iter::once(request)).unwrap_or_else(Answer::poisoned))
    }
}

/// Ends an inline serve, also when it panics (which poisons the store, as a panic of
/// the committer thread does), and lets the committer thread serve what queued
/// meanwhile.
struct EndInline<'a>(&'a Inner);

impl Drop for EndInline<'_> {
    fn drop(&mut self) {
        self.0.poison_if_panicking();
        let mut state = self.0.queue.lock();
        state.inline = false;
        if state.sleeping && !state.requests.is_empty() {
            state.sleeping = false;
            self.0.queue.wake.notify_one();
        }
    }
}

/// Starts the committer thread of `inner`.
pub(crate) fn spawn(inner: Arc<Inner>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("procflow-wal".into())
        .spawn(move || run(&inner))
}

fn run(inner: &Inner) {
    // If serving a group panics, the guard stops the queue and drops every waiting
    // request: their commits get `Poisoned` instead of waiting forever.
    let _guard = StopOnExit(inner);
    while let Some(mut group) = inner.queue.take() {
        // Only commits served inline reply to the caller.
        let _ = serve(inner, group.drain(..));
        inner.queue.served(group);
    }
}

struct StopOnExit<'a>(&'a Inner);

impl Drop for StopOnExit<'_> {
    fn drop(&mut self) {
        self.0.poison_if_panicking();
        let mut state = self.0.queue.lock();
        state.stopped = true;
        state.requests.clear();
    }
}

/// One group: write every request's record, make them durable together, answer.
/// Returns the answer of the commit that replies to the caller ([`Reply::Caller`]), if
/// one did.
fn serve(inner: &Inner, group: impl ExactSizeIterator<Item = Request>) -> Option<Answer> {
    // One inline: a commit served on its caller's thread allocates no list.
    let mut written: SmallVec<[(Reply, Leftovers); 1]> = SmallVec::with_capacity(group.len());
    let mut close: Option<Channel> = None;
    let mut here = None;
    let outcome = {
        let mut log = inner.lock_log();
        let mut outcome = Ok(());
        for request in group {
            match request {
                Request::Commit(batch, reply) => {
                    match write(inner, &mut log, batch) {
                        Ok(leftovers) => written.push((reply, leftovers)),
                        Err(Fault::Refused(e)) => answer(inner, reply, Err(e), &mut here),
                        Err(Fault::Io(e)) => {
                            // The record may be half on disk: nothing more is written
                            // (the store is poisoned, so `write` refuses the rest of the
                            // group). Every later request is still answered: a dropped
                            // reply would leave its commit to guess what happened.
                            answer(inner, reply, Err(e), &mut here);
                            outcome = Err(StoreError::Poisoned);
                        }
                    }
                }
                Request::Close(reply) => {
                    log.closed = true;
                    close = Some(reply);
                }
            }
        }
        if outcome.is_ok() && !written.is_empty() {
            outcome = log
                .compact()
                .and_then(|_| log.writer.flush())
                .map_err(|e| inner.poison(e));
        }
        outcome
    };
    let outcome = outcome.and_then(|()| sync(inner, !written.is_empty()));
    let synced = outcome.is_ok();
    finish(inner, written, close, outcome, &mut here);
    if synced {
        // After the answers: the group's sync made compaction's records durable, and
        // no commit waits for the segments' files to go.
        inner.delete_doomed();
    }
    here
}

/// Why a request was not written.
pub(super) enum Fault {
    /// The batch is invalid or the store refuses it; the log is unchanged.
    Refused(StoreError),
    /// Writing failed; the store is poisoned.
    Io(StoreError),
}

/// Appends `batch` as one record and applies it to the in-memory state.
pub(super) fn write(inner: &Inner, log: &mut Log, batch: Batch) -> Result<Leftovers, Fault> {
    writable(inner, log)?;
    let prepared = log
        .state
        .prepare(batch, &Limits::default())
        .map_err(Fault::Refused)?;
    let payload_len = record::payload_len(&prepared.changes).map_err(Fault::Refused)?;
    let segment = log
        .writer
        .append(
            record::KIND_BATCH,
            prepared.fencing_token,
            &prepared.changes,
            payload_len,
        )
        .map_err(|e| Fault::Io(inner.poison(e)))?;
    Ok(apply(inner, log, segment, prepared))
}

/// [`write()`] for a batch checked and encoded before the log's lock was taken
/// (`early.rs`): what is left is what needs the log, its checks against the store's
/// contents, its sequence number and its apply. `encoded` holds its record.
pub(super) fn write_early(
    inner: &Inner,
    log: &mut Log,
    early: Early,
    encoded: &[u8],
) -> Result<Leftovers, Fault> {
    let (left, outcome) = match early {
        Early::Late(batch) => return write(inner, log, batch),
        Early::Checked(left, outcome) => (left, outcome),
    };
    writable(inner, log)?;
    let early = log
        .state
        .check_token(left.fencing_token)
        .and_then(|()| log.state.check_absent(left.must_be_absent))
        .and(outcome)
        .map_err(Fault::Refused)?;
    let segment = log
        .writer
        .append_encoded(&encoded[early.record])
        .map_err(|e| Fault::Io(inner.poison(e)))?;
    Ok(apply(inner, log, segment, early.prepared))
}

/// Refuses every batch once the store is closed or poisoned.
fn writable(inner: &Inner, log: &Log) -> Result<(), Fault> {
    if log.closed {
        return Err(Fault::Refused(StoreError::Closed));
    }
    if inner.is_poisoned() {
        return Err(Fault::Refused(StoreError::Poisoned));
    }
    Ok(())
}

/// Applies a batch whose record was appended to `segment`, and counts it.
fn apply(inner: &Inner, log: &mut Log, segment: u64, prepared: Prepared) -> Leftovers {
    log.state.observe_token(prepared.fencing_token);
    let mut leftovers = Leftovers {
        ops: prepared.spent,
        ..Leftovers::default()
    };
    for change in prepared.changes {
        log.index.note(segment, &change);
        if let Some(replaced) = log.state.apply(change) {
            leftovers.keep(replaced);
        }
    }
    inner.commits.fetch_add(1, Ordering::Relaxed);
    leftovers
}

/// Makes the flushed records durable: the group's one `fdatasync`. The log lock is not
/// held, so reads go on meanwhile; only this thread writes, so the file cannot change.
fn sync(inner: &Inner, wrote: bool) -> Result<(), StoreError> {
    if !wrote || !inner.durable() {
        return Ok(());
    }
    let file = inner.lock_log().writer.active();
    file.sync_data().map_err(|e| {
        // Only this thread rolls segments: the active one is still the one synced.
        let path = inner.lock_log().writer.active_path();
        inner.poison(StoreError::io("syncing a segment", path, e))
    })?;
    inner.lock_log().writer.note_synced();
    inner.group_syncs.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Answers the group's commits and its close, if any; the answer of a commit that
/// replies to the caller goes to `here`.
fn finish(
    inner: &Inner,
    written: SmallVec<[(Reply, Leftovers); 1]>,
    close: Option<Channel>,
    outcome: Result<(), StoreError>,
    here: &mut Option<Answer>,
) {
    let failed = outcome.is_err();
    let mut error = outcome.err();
    for (reply, leftovers) in written {
        // The first commit gets the real error, the others learn the store is poisoned.
        let result = match error.take() {
            Some(e) => Err(e),
            None if failed => Err(StoreError::Poisoned),
            None => Ok(()),
        };
        send(inner, reply, result, leftovers, here);
    }
    if let Some(reply) = close {
        let result = if inner.is_poisoned() {
            Err(StoreError::Poisoned)
        } else {
            // A closed store's files end at their last record.
            let closed = {
                let writer = &mut inner.lock_log().writer;
                writer.close_active().and_then(|()| writer.delete_doomed())
            };
            closed.map_err(|e| inner.poison(e))
        };
        drop(inner.lock_log().lock.take());
        inner.queue.stop();
        answer(inner, Reply::Channel(reply), result, here);
    }
}

fn answer(inner: &Inner, reply: Reply, result: Result<(), StoreError>, here: &mut Option<Answer>) {
    send(inner, reply, result, Leftovers::default(), here);
}

fn send(
    inner: &Inner,
    reply: Reply,
    result: Result<(), StoreError>,
    leftovers: Leftovers,
    here: &mut Option<Answer>,
) {
    let answer = Answer::new(result, leftovers);
    match reply {
        // Its wait holds no count of its own (see `Inner::commit_in`).
        Reply::Slot(reply) => {
            inner.in_flight.fetch_sub(1, Ordering::AcqRel);
            reply.send(answer);
        }
        // The committer may have given up waiting (a dropped future): nothing to tell,
        // and the leftovers are freed here.
        Reply::Channel(channel) => {
            let _ = channel.send(answer);
        }
        Reply::Caller => *here = Some(answer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::CommitIn;
    use crate::wal::open_unsynced;
    use crate::{Store, WalStore};

    /// Commits `batch` through the queue, as a commit that is not alone does, and
    /// returns the whole answer.
    async fn answer_of(store: &WalStore, batch: Batch) -> Answer {
        let (reply, answer) = oneshot::channel();
        let pushed = (store.inner.queue).push(Request::Commit(batch, Reply::Channel(reply)));
        assert!(pushed.is_ok(), "the committer has stopped");
        answer.await.expect("an answer")
    }

    /// The committer thread hands back the batch's op buffer and the values its changes
    /// replaced or removed, for the committing task to free: it frees nothing the
    /// workers allocated.
    #[tokio::test]
    async fn the_answer_carries_what_the_batch_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_unsynced(dir.path());
        let kept = |answer: &Answer| -> Vec<Vec<u8>> {
            let leftovers = &answer.leftovers;
            let inline = leftovers.values.iter().flatten();
            inline.chain(&leftovers.more).map(|b| b.to_vec()).collect()
        };

        let first = answer_of(&store, Batch::new().put(1, None, vec![1; 8])).await;
        assert!(first.result.is_ok());
        assert!(kept(&first).is_empty(), "a new record replaces nothing");
        assert!(first.leftovers.ops.is_empty());
        assert!(
            first.leftovers.ops.capacity() >= 1,
            "the op buffer came back"
        );

        let batch = Batch::new()
            .put(1, None, vec![2; 8])
            .put(2, None, vec![3; 8])
            .put(2, None, vec![4; 8])
            .put(2, None, vec![5; 8]);
        let second = answer_of(&store, batch).await;
        assert!(second.result.is_ok());
        assert_eq!(kept(&second), [vec![1; 8], vec![3; 8], vec![4; 8]]);

        let third = answer_of(&store, Batch::new().delete(1).delete(7)).await;
        assert_eq!(kept(&third), [vec![2; 8]]);
        store.close().await.unwrap();
    }

    /// A commit queued with a slot is answered there, and hands its op list back for
    /// the next batch; one whose reply is dropped unanswered (the committer thread died,
    /// or the queue was cleared) learns that the store is poisoned.
    #[tokio::test]
    async fn a_slot_gets_its_answer_or_learns_of_a_dropped_reply() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_unsynced(dir.path());
        let slot = Arc::new(CommitSlot::new());
        for step in 0..3u8 {
            let batch = slot.batch().put(1, None, vec![step; 8]);
            let ticket = slot.next_ticket();
            let reply = Reply::Slot(SlotReply::new(Arc::clone(&slot), ticket));
            store.inner.in_flight.fetch_add(1, Ordering::AcqRel);
            assert!(
                store
                    .inner
                    .queue
                    .push(Request::Commit(batch, reply))
                    .is_ok()
            );
            CommitIn::in_slot(&slot, ticket).await.unwrap();
            assert_eq!(store.inner.in_flight.load(Ordering::Acquire), 0);
            assert!(slot.batch().ops.capacity() >= 1, "the op list came back");
        }
        let record = store.get(1).await.unwrap().unwrap();
        assert_eq!(record.value, vec![2u8; 8]);

        let ticket = slot.next_ticket();
        drop(SlotReply::new(Arc::clone(&slot), ticket));
        let answer = CommitIn::in_slot(&slot, ticket).await;
        assert!(matches!(answer, Err(StoreError::Poisoned)), "{answer:?}");
        store.close().await.unwrap();
    }

    /// The queue fills the vector of the group served before, so pushes do not allocate
    /// once groups have reached their size.
    #[test]
    fn the_queue_reuses_the_vector_of_the_last_group() {
        let queue = Queue::new(false);
        let push = |n: u64| {
            for id in 0..n {
                let (reply, _) = oneshot::channel();
                let request = Request::Commit(Batch::new().delete(id), Reply::Channel(reply));
                assert!(queue.push(request).is_ok());
            }
        };
        push(100);
        let mut group = queue.take().expect("a group");
        let capacity = group.capacity();
        group.clear();
        queue.served(group);
        push(100);
        let group = queue.take().expect("a group");
        assert_eq!(group.len(), 100);
        assert_eq!(
            group.capacity(),
            capacity,
            "the served vector was not reused"
        );
    }
}
