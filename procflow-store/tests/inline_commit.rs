//! A commit alone in flight is written and synced on its caller's thread
//! (`WalConfig::inline_lone_commit`); others go through the committer thread. These tests
//! watch which thread appends each record, and check that mixing the two paths keeps
//! every acknowledged commit, in order, across a crash.

mod common;

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wrapping::{Wrap, WrapFiles};
use procflow_store::io::{IoBackend, LogFile, SimBackend};
use procflow_store::{Batch, Bytes, Store, WalConfig, WalStore};

/// The committer thread's name.
const COMMITTER: &str = "procflow-wal";

/// A backend whose files note the name of the thread making each append.
struct Watched {
    inner: SimBackend,
    appenders: Arc<Mutex<Vec<String>>>,
}

impl Watched {
    fn new(inner: SimBackend) -> Self {
        Watched {
            inner,
            appenders: Arc::default(),
        }
    }

    /// The threads of the appends so far, and forgets them.
    fn take_appenders(&self) -> Vec<String> {
        std::mem::take(&mut self.appenders.lock().unwrap())
    }
}

struct WatchedFile {
    inner: Arc<dyn LogFile>,
    appenders: Arc<Mutex<Vec<String>>>,
}

impl LogFile for WatchedFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        let name = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned();
        self.appenders.lock().unwrap().push(name);
        self.inner.append(buf)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
}

impl Watched {
    /// The backend to open a store on.
    fn backend(&self) -> Arc<dyn IoBackend> {
        let appenders = self.appenders.clone();
        let wrap: Wrap = Arc::new(move |file| {
            Arc::new(WatchedFile {
                inner: file,
                appenders: appenders.clone(),
            })
        });
        WrapFiles::around(Arc::new(self.inner.clone()), wrap)
    }
}

fn dir() -> &'static Path {
    Path::new("/store")
}

/// Opens a store on `backend`, commits one batch alone and returns the threads that
/// appended its record.
async fn lone_commit_appenders(inline: bool) -> Vec<String> {
    let backend = Watched::new(SimBackend::new());
    let config = WalConfig {
        inline_lone_commit: inline,
        ..WalConfig::default()
    };
    let store = WalStore::open_with_backend(dir(), config, backend.backend()).unwrap();
    backend.take_appenders();
    store
        .commit(Batch::new().put(1, None, b"one".to_vec()))
        .await
        .unwrap();
    let appenders = backend.take_appenders();
    store.close().await.unwrap();
    appenders
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_commit_is_written_on_its_callers_thread() {
    let appenders = lone_commit_appenders(true).await;
    assert_eq!(appenders.len(), 1, "{appenders:?}");
    assert_ne!(appenders[0], COMMITTER, "{appenders:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_inline_lone_commit_off_the_committer_writes_it() {
    assert_eq!(lone_commit_appenders(false).await, [COMMITTER]);
}

/// A current-thread runtime's one thread runs every task: it is never blocked for a sync.
#[tokio::test(flavor = "current_thread")]
async fn on_a_current_thread_runtime_the_committer_writes_it() {
    assert_eq!(lone_commit_appenders(true).await, [COMMITTER]);
}

/// A multi-thread runtime with one worker is no different: blocking that worker for a
/// sync would hold up every other task.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn on_a_runtime_with_one_worker_the_committer_writes_it() {
    assert_eq!(lone_commit_appenders(true).await, [COMMITTER]);
}

/// Many writers on a runtime with one worker thread, on a disk whose syncs take time:
/// their commits are grouped. A commit that held the only worker (served inline, or
/// polling for its answer) stayed alone in flight, and so did the next: one sync per
/// commit, every other writer waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn on_one_worker_concurrent_commits_share_their_syncs() {
    const WRITERS: u64 = 32;
    const COMMITS: u64 = 20;
    let sim = SimBackend::new();
    let store = Arc::new(
        WalStore::open_with_backend(dir(), WalConfig::default(), Arc::new(sim.clone())).unwrap(),
    );
    sim.set_sync_delay(Duration::from_micros(200));
    let before = store.stats();
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let store = store.clone();
            tokio::spawn(async move {
                for n in 1..=COMMITS {
                    let batch = Batch::new().put(writer, None, n.to_le_bytes().to_vec());
                    store.commit(batch).await.unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let after = store.stats();
    let commits = after.commits - before.commits;
    let syncs = after.group_syncs - before.group_syncs;
    assert_eq!(commits, WRITERS * COMMITS);
    assert!(
        syncs * 4 <= commits,
        "{syncs} syncs for {commits} commits: commits did not share their syncs"
    );
}

/// Writers that sometimes commit alone (served inline) and sometimes together (through
/// the committer), on a disk whose syncs take time; then a power loss. Every commit that
/// was acknowledged is recovered, and each key holds its writer's last acknowledged value:
/// the two paths never reordered or lost a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_and_queued_commits_mix_without_losing_an_acknowledged_one() {
    const WRITERS: u64 = 4;
    const COMMITS: u64 = 150;
    let sim = SimBackend::new();
    let backend = Watched::new(sim.clone());
    let config = WalConfig {
        // Small segments: rolls happen on both paths too.
        segment_size: 4096,
        ..WalConfig::default()
    };
    let store = Arc::new(WalStore::open_with_backend(dir(), config, backend.backend()).unwrap());
    sim.set_sync_delay(Duration::from_micros(200));
    backend.take_appenders();
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let store = store.clone();
        writers.push(tokio::spawn(async move {
            for n in 1..=COMMITS {
                let batch = Batch::new().put(writer, None, n.to_le_bytes().to_vec());
                store.commit(batch).await.unwrap();
                // Writers drift apart, so some commits find the store to themselves.
                let pause = (writer * 7 + n * 13) % 5;
                tokio::time::sleep(Duration::from_micros(pause * 300)).await;
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let appenders = backend.take_appenders();
    let inline = appenders.iter().filter(|t| *t != COMMITTER).count();
    let queued = appenders.len() - inline;
    assert!(
        inline > 0 && queued > 0,
        "both paths must have served: {inline} inline, {queued} through the committer"
    );

    // The power fails: only what was synced survives. Every commit above was answered.
    let image = sim.crash_image();
    drop(store);
    let store = WalStore::open_with_backend(dir(), WalConfig::default(), Arc::new(image)).unwrap();
    for writer in 0..WRITERS {
        let record = store.get(writer).await.unwrap().expect("a writer's record");
        assert_eq!(record.value, Bytes::from(COMMITS.to_le_bytes().to_vec()));
    }
}
