//! `--cell answered:N`: the executor on a `MemStore` whose commits wait for an answer
//! from a thread of its own, sent in groups, as the WAL's committer answers: the WAL's
//! hand-off with nothing else of it (no encoding, no file, no `fdatasync`). Against
//! `wal:N` it shows what the durable WAL costs beyond its hand-off; against `yield:N`,
//! what being answered from another thread costs beyond suspending
//! (docs/BENCHMARKS.md, "Issue 33 in stop 52").

use procflow_store::{
    Batch, BoxFuture, Limits, Loaded, MemStore, ProcId, Record, RecordInfo, Store, StoreError,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use tokio::sync::oneshot;

/// Replies waiting for the answering thread, and whether the store is gone.
#[derive(Default)]
struct Waiting {
    queue: Mutex<(Vec<oneshot::Sender<()>>, bool)>,
    queued: Condvar,
}

/// A `MemStore` whose commits apply at once, then wait for the answering thread.
pub struct Answered {
    store: MemStore,
    waiting: Arc<Waiting>,
}

impl Default for Answered {
    fn default() -> Self {
        let waiting = Arc::new(Waiting::default());
        let theirs = Arc::clone(&waiting);
        std::thread::Builder::new()
            .name("answering".into())
            .spawn(move || answer_until_closed(&theirs))
            .expect("start the answering thread");
        Answered {
            store: MemStore::new(),
            waiting,
        }
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        self.waiting.queue.lock().expect("the queue").1 = true;
        self.waiting.queued.notify_all();
    }
}

/// Answers everything queued, group by group, as the WAL's committer does.
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

impl Store for Answered {
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let applied = self.store.commit(batch).await;
            let (reply, answer) = oneshot::channel();
            self.waiting.queue.lock().expect("the queue").0.push(reply);
            self.waiting.queued.notify_one();
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
