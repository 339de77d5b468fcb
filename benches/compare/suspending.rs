//! `MemStore`s whose commits suspend their caller, as a durable store's do, without a
//! disk:
//! - `--cell yield:N` ([`Suspending::yielding`]): the commit yields to the scheduler once
//!   before it applies the batch. On a plain `MemStore` a commit never suspends, so a
//!   procedure runs its ten steps in one poll, its state in the cache throughout; on a
//!   durable store every step waits while the other procedures run theirs. This is the
//!   second case at the cheapest suspension Tokio has: what interleaving alone costs
//!   the executor (docs/BENCHMARKS.md, "Issue 33 in stop 44").
//! - `--cell answered:N` ([`Suspending::answered`]): the commit applies the batch, then
//!   waits for an answer from a thread of its own, sent in groups as the WAL's committer
//!   answers: the WAL's hand-off with nothing else of it (no encoding, no file, no
//!   `fdatasync`). Against `wal:N` it shows what the durable WAL costs beyond its
//!   hand-off; against `yield:N`, what being answered from another thread costs beyond
//!   suspending (docs/BENCHMARKS.md, "Issue 33 in stop 52").

use procflow_store::{
    Batch, BoxFuture, Limits, Loaded, MemStore, ProcId, Record, RecordInfo, Store, StoreError,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long the answering thread polls an empty queue before it sleeps: the WAL
/// committer's `SPIN`.
const SPIN: Duration = Duration::from_micros(100);

/// A `MemStore` whose commits suspend: through a yield, or waiting for an answering
/// thread.
pub struct Suspending {
    store: MemStore,
    /// The answering thread's queue; `None`: commits yield instead.
    answering: Option<Arc<Waiting>>,
}

/// Replies waiting for the answering thread, and whether the store is gone.
#[derive(Default)]
struct Waiting {
    queue: Mutex<Queue>,
    queued: Condvar,
    /// Replies were pushed since the thread last took them: what its spin polls, without
    /// the lock.
    pending: AtomicBool,
}

/// What the answering thread takes, under [`Waiting`]'s lock.
#[derive(Default)]
struct Queue {
    replies: Vec<oneshot::Sender<()>>,
    closed: bool,
    /// The thread waits on the condition variable: a push must notify it. As the WAL's
    /// queue does, so that a commit makes no system call while the thread is awake.
    sleeping: bool,
}

impl Waiting {
    fn push(&self, reply: oneshot::Sender<()>) {
        let mut queue = self.queue.lock().expect("the queue");
        queue.replies.push(reply);
        self.pending.store(true, Ordering::Release);
        if queue.sleeping {
            queue.sleeping = false;
            self.queued.notify_one();
        }
    }
}

impl Suspending {
    /// Commits yield to the scheduler once, then apply.
    pub fn yielding() -> Self {
        Suspending {
            store: MemStore::new(),
            answering: None,
        }
    }

    /// Commits apply, then wait for the answering thread, which this starts.
    pub fn answered() -> Self {
        let waiting = Arc::new(Waiting::default());
        let theirs = Arc::clone(&waiting);
        std::thread::Builder::new()
            .name("answering".into())
            .spawn(move || answer_until_closed(&theirs))
            .expect("start the answering thread");
        Suspending {
            store: MemStore::new(),
            answering: Some(waiting),
        }
    }
}

impl Drop for Suspending {
    fn drop(&mut self) {
        if let Some(waiting) = &self.answering {
            waiting.queue.lock().expect("the queue").closed = true;
            waiting.queued.notify_all();
        }
    }
}

/// Answers everything queued, group by group, as the WAL's committer does, until the
/// store is dropped. Like the committer, it polls an empty queue for [`SPIN`] before it
/// sleeps.
fn answer_until_closed(waiting: &Waiting) {
    loop {
        let spin_until = Instant::now() + SPIN;
        while !waiting.pending.load(Ordering::Acquire) && Instant::now() < spin_until {
            std::hint::spin_loop();
        }
        let group = {
            let mut queue = waiting.queue.lock().expect("the queue");
            while queue.replies.is_empty() && !queue.closed {
                queue.sleeping = true;
                queue = waiting.queued.wait(queue).expect("the queue");
            }
            queue.sleeping = false;
            waiting.pending.store(false, Ordering::Release);
            if queue.replies.is_empty() {
                return;
            }
            std::mem::take(&mut queue.replies)
        };
        for reply in group {
            let _ = reply.send(());
        }
    }
}

impl Store for Suspending {
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let Some(waiting) = &self.answering else {
                tokio::task::yield_now().await;
                return self.store.commit(batch).await;
            };
            let applied = self.store.commit(batch).await;
            let (reply, answer) = oneshot::channel();
            waiting.push(reply);
            let _ = answer.await;
            applied
        })
    }

    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        self.store.load()
    }

    fn get(&self, id: ProcId) -> BoxFuture<'_, Result<Option<Record>, StoreError>> {
        self.store.get(id)
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<RecordInfo>, StoreError>> {
        self.store.list()
    }

    fn meta(&self, prefix: &str) -> BoxFuture<'_, Result<BTreeMap<String, Vec<u8>>, StoreError>> {
        self.store.meta(prefix)
    }

    fn limits(&self) -> Limits {
        self.store.limits()
    }

    fn close(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.store.close()
    }
}
