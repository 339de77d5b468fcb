//! The compaction index of a restart, built on a thread of its own while the replay
//! applies the log.
//!
//! A restart's replay notes every change it applies in the [`LiveIndex`]: a hash map
//! insert or removal per change, missing the cache once the log holds more keys than it
//! fits. That was about a tenth of `WalStore::open` at 100,000 live procedures, on the
//! replay's thread, while the machine's other core was mostly idle (docs/BENCHMARKS.md,
//! "Issue 33 in stop 58"). [`Notes`] hands the notes over in batches instead, in the
//! replay's order, to a scoped thread that builds the index; the replay waits for it
//! only at its end. The notes' order is the index's meaning (the latest change of each
//! key wins), so there is one such thread and one channel, in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::{Scope, ScopedJoinHandle};

use super::compaction::{LiveIndex, Note};
use crate::state::Change;

/// Notes handed over at once: few enough that the index thread starts early, many
/// enough that a hand-over (a few µs) is a small share of making them.
const BATCH: usize = 4096;

/// Batches sent and not yet taken by the index thread, at most: the replay runs at most
/// this far ahead before it waits.
const BATCHES_AHEAD: usize = 8;

/// Where the replay's notes go: to the index thread, or, if it could not start, into an
/// index kept here.
pub(crate) struct Notes<'scope> {
    batch: Vec<Note>,
    to: Target<'scope>,
}

enum Target<'scope> {
    Thread {
        sender: SyncSender<Vec<Note>>,
        thread: ScopedJoinHandle<'scope, LiveIndex>,
        /// The index's live bytes as of the last batch it took.
        live_bytes: Arc<AtomicU64>,
    },
    Here(LiveIndex),
}

impl<'scope> Notes<'scope> {
    /// Starts the index thread in `scope`; the notes stay on this thread if it cannot
    /// start.
    pub(crate) fn start<'env>(scope: &'scope Scope<'scope, 'env>) -> Self {
        let (sender, batches) = sync_channel(BATCHES_AHEAD);
        let live_bytes = Arc::new(AtomicU64::new(0));
        let published = Arc::clone(&live_bytes);
        let thread = std::thread::Builder::new()
            .name("procflow-index".into())
            .spawn_scoped(scope, move || build(&batches, &published));
        let to = match thread {
            Ok(thread) => Target::Thread {
                sender,
                thread,
                live_bytes,
            },
            Err(_) => Target::Here(LiveIndex::default()),
        };
        Self {
            batch: Vec::with_capacity(BATCH),
            to,
        }
    }

    /// Notes that `change`, written to `segment`, is now the latest for its key.
    pub(crate) fn note(&mut self, segment: u64, change: &Change) {
        match &mut self.to {
            Target::Here(index) => index.note(segment, change),
            Target::Thread { .. } => {
                self.batch.push(Note::of(segment, change));
                if self.batch.len() == BATCH {
                    self.send();
                }
            }
        }
    }

    /// The index's estimated live bytes. With the index thread, as of the last batch it
    /// took: it lags the replay by what is in flight, a few batches at most.
    pub(crate) fn live_bytes(&self) -> u64 {
        match &self.to {
            Target::Here(index) => index.live_bytes(),
            Target::Thread { live_bytes, .. } => live_bytes.load(Ordering::Relaxed),
        }
    }

    /// The index of every change noted, once the index thread took them all. A panic on
    /// the index thread is raised here.
    pub(crate) fn finish(mut self) -> LiveIndex {
        self.send();
        match self.to {
            Target::Here(index) => index,
            Target::Thread { sender, thread, .. } => {
                drop(sender); // The thread's last batch: it returns the index.
                thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            }
        }
    }

    fn send(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        if let Target::Thread { sender, .. } = &self.to {
            let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
            // Refused only if the thread panicked: `finish` raises that panic.
            let _ = sender.send(batch);
        }
    }
}

/// The index thread: takes the batches in order until the replay's side is dropped.
fn build(batches: &Receiver<Vec<Note>>, live_bytes: &AtomicU64) -> LiveIndex {
    let mut index = LiveIndex::default();
    for batch in batches {
        for note in batch {
            index.take(note);
        }
        live_bytes.store(index.live_bytes(), Ordering::Relaxed);
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ProcId;

    /// Puts, deletes, and metadata over several segments, many keys written again.
    fn changes() -> Vec<(u64, Change)> {
        let mut changes = Vec::new();
        for n in 0..(3 * BATCH as u64 + 17) {
            let id: ProcId = n % 1000;
            let segment = 1 + n / 2000;
            let change = match n % 7 {
                0 => Change::Delete { id },
                1 => Change::PutMeta {
                    key: format!("k{}", n % 13),
                    value: vec![0; (n % 5) as usize].into(),
                },
                2 => Change::DeleteMeta {
                    key: format!("k{}", n % 11),
                },
                _ => Change::Put {
                    id,
                    parent: None,
                    finished: n % 3 == 0,
                    value: vec![1; (n % 300) as usize].into(),
                },
            };
            changes.push((segment, change));
        }
        changes
    }

    /// The index built on the thread is the one built by noting the same changes here.
    #[test]
    fn the_index_built_beside_is_the_index_built_here() {
        let changes = changes();
        let mut here = LiveIndex::default();
        for (segment, change) in &changes {
            here.note(*segment, change);
        }
        let beside = std::thread::scope(|scope| {
            let mut notes = Notes::start(scope);
            assert!(matches!(notes.to, Target::Thread { .. }));
            for (segment, change) in &changes {
                notes.note(*segment, change);
            }
            notes.finish()
        });
        assert_eq!(beside, here);
        assert!(here.live_bytes() > 0);
    }

    /// Without a thread, the notes go into an index kept here.
    #[test]
    fn without_a_thread_the_index_is_built_here() {
        let changes = changes();
        let mut here = LiveIndex::default();
        let mut notes = Notes {
            batch: Vec::new(),
            to: Target::Here(LiveIndex::default()),
        };
        for (segment, change) in &changes {
            here.note(*segment, change);
            notes.note(*segment, change);
            assert_eq!(notes.live_bytes(), here.live_bytes());
        }
        assert_eq!(notes.finish(), here);
    }

    /// The live bytes the replay reads are the index's as of a batch taken: never more
    /// than a few batches behind, and exact at the end.
    #[test]
    fn the_live_bytes_follow_the_batches_taken() {
        let changes = changes();
        std::thread::scope(|scope| {
            let mut notes = Notes::start(scope);
            for (segment, change) in &changes[..BATCH] {
                notes.note(*segment, change);
            }
            // One full batch sent: the thread publishes its live bytes once it took it.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while notes.live_bytes() == 0 && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
            let mut first = LiveIndex::default();
            for (segment, change) in &changes[..BATCH] {
                first.note(*segment, change);
            }
            assert_eq!(notes.live_bytes(), first.live_bytes());
            let index = notes.finish();
            assert!(index.live_bytes() > 0);
        });
    }
}
