//! Commit slots: where a queued commit's answer comes back, one commit after another.
//!
//! [`Store::commit`](crate::Store::commit) returns a boxed future, and the write-ahead
//! log's commit waits on a oneshot channel for its committer thread's answer. So each
//! commit allocated the future's box (424 bytes), the channel (224 bytes) and the batch's
//! op list (224 bytes) on a worker thread, and freed them after its group's `fdatasync`,
//! when a thousand other procedures' steps had run in between. Blocks freed out of order
//! like that overflow glibc's per-thread cache and take its slow path, and half of them
//! are freed on the other worker, under the lock of the arena they came from. At 1,024
//! procedures on the log, `malloc` and `free` took about a sixth of the workers' time and
//! their arena locks a fourteenth (docs/BENCHMARKS.md, issue 33 in stop 67).
//!
//! A procedure commits one batch at a time, so one place serves all its answers: a
//! [`CommitSlot`], made with the procedure. [`Store::commit_in`](crate::Store::commit_in)
//! queues a batch with its slot and returns a [`CommitIn`] that waits on the slot; the
//! store writes the answer there. The slot keeps the batch's op list too, emptied, for
//! the next batch ([`CommitSlot::batch`]). Nothing is allocated per commit.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

use crate::error::StoreError;
use crate::store::{Batch, BoxFuture, Op};

/// Where the answers of one caller's commits come back, made once and used for each
/// commit (see [`Store::commit_in`](crate::Store::commit_in)).
///
/// One commit at a time: a slot keeps only the answer of the last commit queued with it.
/// If the wait for an earlier one was dropped, that commit still completes (as a dropped
/// [`Store::commit`](crate::Store::commit) does), and its answer is discarded.
///
/// ```
/// use std::sync::Arc;
/// use procflow_store::{CommitSlot, MemStore, Store};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemStore::new();
/// let slot = Arc::new(CommitSlot::new());
/// for step in 0..3u8 {
///     let batch = slot.batch().put(1, None, vec![step]);
///     store.commit_in(batch, &slot).await.unwrap();
/// }
/// assert_eq!(store.get(1).await.unwrap().unwrap().value, &[2][..]);
/// # });
/// ```
#[derive(Debug, Default)]
pub struct CommitSlot {
    state: Mutex<SlotState>,
}

#[derive(Debug, Default)]
struct SlotState {
    /// The number of the last commit queued with this slot: answers to earlier ones are
    /// not kept.
    latest: u64,
    answer: Option<Answer>,
    /// The task waiting for the answer to `latest`.
    waker: Option<Waker>,
    /// The last answered batch's op list, emptied, for the next batch.
    spare_ops: Vec<Op>,
}

impl CommitSlot {
    /// An empty slot.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch (no fencing token) whose op list is the one the last answered
    /// commit handed back, if the store hands them back: building it then allocates
    /// nothing.
    pub fn batch(&self) -> Batch {
        Batch {
            ops: std::mem::take(&mut self.lock().spare_ops),
            fencing_token: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, SlotState> {
        // Nothing panics while the slot is locked; tolerate poisoning anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a number for a commit about to be queued with this slot; an answer still
    /// held (of a commit whose wait was dropped) is discarded.
    pub(crate) fn next_ticket(&self) -> u64 {
        let (ticket, stale) = {
            let mut state = self.lock();
            state.latest += 1;
            state.waker = None;
            (state.latest, state.answer.take())
        };
        // Freed outside the lock.
        drop(stale);
        ticket
    }

    /// Hands `answer` to the commit numbered `ticket`, and wakes its task. An answer to
    /// a commit that is no longer the latest is dropped.
    pub(crate) fn answer(&self, ticket: u64, answer: Answer) {
        let (waker, unwanted) = {
            let mut state = self.lock();
            if state.latest == ticket {
                state.answer = Some(answer);
                (state.waker.take(), None)
            } else {
                (None, Some(answer))
            }
        };
        drop(unwanted);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The answer to the commit numbered `ticket`, or `Pending` (and `cx` woken when it
    /// comes). The answer's op list is kept for the next batch; the values it carries
    /// are freed here, on the waiting task's thread.
    fn poll_answer(&self, ticket: u64, cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        let answer = {
            let mut state = self.lock();
            if state.latest != ticket {
                // Another commit was queued with this slot since: this one's answer will
                // never be kept. Only misuse (two commits at once) gets here.
                return Poll::Ready(Err(StoreError::Poisoned));
            }
            match state.answer.take() {
                Some(mut answer) => {
                    state.spare_ops = std::mem::take(&mut answer.leftovers.ops);
                    answer
                }
                None => {
                    match &mut state.waker {
                        Some(waker) if waker.will_wake(cx.waker()) => {}
                        slot => *slot = Some(cx.waker().clone()),
                    }
                    return Poll::Pending;
                }
            }
        };
        Poll::Ready(answer.result)
    }
}

/// A commit's outcome, and what its batch left for the committing task to free.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) result: Result<(), StoreError>,
    /// Dropped with the answer, on the thread that receives it (its op list kept in a
    /// slot, for the next batch).
    pub(crate) leftovers: Leftovers,
}

impl Answer {
    pub(crate) fn new(result: Result<(), StoreError>, leftovers: Leftovers) -> Self {
        Answer { result, leftovers }
    }

    /// The answer of a commit its server failed to answer, which only a panic while
    /// serving can cause: that poisoned the store.
    pub(crate) fn poisoned() -> Self {
        Answer::new(Err(StoreError::Poisoned), Leftovers::default())
    }
}

/// What a written batch leaves behind: its op list, emptied, and the values its changes
/// replaced or removed. The committing task frees them (or reuses the list), not the
/// thread that wrote the batch: see `wal/committer.rs`.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    pub(crate) ops: Vec<Op>,
    /// A step replaces one value; a batch rarely more than two.
    pub(crate) values: [Option<Bytes>; 2],
    pub(crate) more: Vec<Bytes>,
}

impl Leftovers {
    pub(crate) fn keep(&mut self, value: Bytes) {
        match self.values.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(value),
            None => self.more.push(value),
        }
    }
}

/// The future of [`Store::commit_in`](crate::Store::commit_in): the commit's outcome.
///
/// # Cancel safety
///
/// As for [`Store::commit`](crate::Store::commit): dropping it does not cancel the
/// commit, which completes in the background and may or may not become durable. Its
/// answer is then discarded when the slot's next commit is queued. A commit may start
/// before the first poll ([`WalStore`](crate::WalStore) queues it when `commit_in`
/// returns), so dropping it unpolled may or may not commit the batch either.
#[must_use = "a commit's outcome says whether it is durable"]
pub struct CommitIn<'a> {
    how: How<'a>,
}

enum How<'a> {
    /// A store without slots, or a commit that takes the store's own way.
    Future(BoxFuture<'a, Result<(), StoreError>>),
    /// Queued with a slot, under this ticket.
    Slot { slot: &'a CommitSlot, ticket: u64 },
    /// Answered already; `None` once taken.
    Ready(Option<Result<(), StoreError>>),
}

impl<'a> CommitIn<'a> {
    /// Waits for `future`, a commit's: what a store without slots returns.
    pub fn from_future(future: BoxFuture<'a, Result<(), StoreError>>) -> Self {
        CommitIn {
            how: How::Future(future),
        }
    }

    /// Waits for the answer to the commit numbered `ticket`, queued with `slot`.
    pub(crate) fn in_slot(slot: &'a CommitSlot, ticket: u64) -> Self {
        CommitIn {
            how: How::Slot { slot, ticket },
        }
    }

    /// A commit answered before it was queued (it was refused).
    pub(crate) fn ready(result: Result<(), StoreError>) -> Self {
        CommitIn {
            how: How::Ready(Some(result)),
        }
    }
}

impl Future for CommitIn<'_> {
    type Output = Result<(), StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().how {
            How::Future(future) => future.as_mut().poll(cx),
            How::Slot { slot, ticket } => slot.poll_answer(*ticket, cx),
            How::Ready(result) => Poll::Ready(result.take().expect("polled after completion")),
        }
    }
}

impl std::fmt::Debug for CommitIn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match &self.how {
            How::Future(_) => "future",
            How::Slot { .. } => "slot",
            How::Ready(_) => "ready",
        };
        f.debug_struct("CommitIn").field("how", &how).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// Counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn answered(ops_capacity: usize) -> Answer {
        let leftovers = Leftovers {
            ops: Vec::with_capacity(ops_capacity),
            ..Leftovers::default()
        };
        Answer::new(Ok(()), leftovers)
    }

    /// The wait is woken by its answer, gets it once, and the answer's op list is kept
    /// for the next batch.
    #[test]
    fn an_answer_wakes_its_wait_and_leaves_its_op_list() {
        let slot = CommitSlot::new();
        let wakes = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let ticket = slot.next_ticket();
        let mut wait = CommitIn::in_slot(&slot, ticket);
        assert!(Pin::new(&mut wait).poll(&mut cx).is_pending());
        slot.answer(ticket, answered(8));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert!(matches!(
            Pin::new(&mut wait).poll(&mut cx),
            Poll::Ready(Ok(()))
        ));
        let batch = slot.batch();
        assert!(batch.ops.is_empty());
        assert_eq!(batch.ops.capacity(), 8, "the answered batch's op list");
        assert_eq!(slot.batch().ops.capacity(), 0, "given out once");
    }

    /// The answer to a commit whose wait was dropped does not answer the next commit
    /// queued with the slot, whichever comes first.
    #[test]
    fn a_stale_answer_never_answers_the_next_commit() {
        let slot = CommitSlot::new();
        let waker = Waker::from(Arc::new(Count::default()));
        let mut cx = Context::from_waker(&waker);

        // Answered before the next commit is queued: discarded when it is.
        let first = slot.next_ticket();
        slot.answer(
            first,
            Answer::new(Err(StoreError::Closed), Leftovers::default()),
        );
        let second = slot.next_ticket();
        let mut wait = CommitIn::in_slot(&slot, second);
        assert!(Pin::new(&mut wait).poll(&mut cx).is_pending());

        // Answered after: dropped on arrival.
        let third = slot.next_ticket();
        slot.answer(
            second,
            Answer::new(Err(StoreError::Closed), Leftovers::default()),
        );
        let mut wait = CommitIn::in_slot(&slot, third);
        assert!(Pin::new(&mut wait).poll(&mut cx).is_pending());
        slot.answer(third, answered(0));
        assert!(matches!(
            Pin::new(&mut wait).poll(&mut cx),
            Poll::Ready(Ok(()))
        ));
    }

    /// A wait polled again with another task's waker wakes that task.
    #[test]
    fn the_last_waker_is_the_one_woken() {
        let slot = CommitSlot::new();
        let (one, two) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let ticket = slot.next_ticket();
        let mut wait = CommitIn::in_slot(&slot, ticket);
        for count in [&one, &two] {
            let waker = Waker::from(Arc::clone(count));
            assert!(
                Pin::new(&mut wait)
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
        }
        slot.answer(ticket, answered(0));
        assert_eq!(one.0.load(Ordering::SeqCst), 0);
        assert_eq!(two.0.load(Ordering::SeqCst), 1);
    }
}
