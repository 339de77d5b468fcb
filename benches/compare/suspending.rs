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
use std::sync::{Arc, Condvar, Mutex};
use tokio::sync::oneshot;

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
    queue: Mutex<(Vec<oneshot::Sender<()>>, bool)>,
    queued: Condvar,
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
            waiting.queue.lock().expect("the queue").1 = true;
            waiting.queued.notify_all();
        }
    }
}

/// Answers everything queued, group by group, as the WAL's committer does, until the
/// store is dropped.
fn answer_until_closed(waiting: &Waiting) {
    loop {
        let group = {
            let mut queue = waiting.queue.lock().expect("the queue");
            while queue.0.is_empty() && !queue.1 {
                queue = waiting.queued.wait(queue).expect("the queue");
            }
            if queue.0.is_empty() {
                return;
            }
            std::mem::take(&mut queue.0)
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
            waiting.queue.lock().expect("the queue").0.push(reply);
            waiting.queued.notify_one();
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
