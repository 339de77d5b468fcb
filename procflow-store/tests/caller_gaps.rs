//! Gaps in a log whose commits write their own records
//! ([`WalConfig::caller_writes`]): a commit takes its range under the log's lock and
//! writes it after, so a later commit's record can reach the file while an earlier range
//! is still unwritten. These tests hold one commit's write on purpose, then check that
//! nothing past the gap is acknowledged, that a crash image with the gap reopens to what
//! was acknowledged (the records past the gap cut off, never read again), and that a roll
//! waits for the gap to be filled.

mod common;

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wrapping::{Wrap, WrapFiles};
use procflow_store::io::{IoBackend, LogFile, SimBackend};
use procflow_store::{Batch, Store, StoreError, WalConfig, WalStore};

/// A [`SimBackend`] whose next positional write, once armed, waits until released.
#[derive(Clone)]
struct Holding {
    sim: SimBackend,
    gate: Arc<Gate>,
    /// Files without [`LogFile::write_at`] (the trait's default).
    plain_files: bool,
}

struct Gate {
    armed: AtomicBool,
    /// Told when the held write has begun.
    entered: Mutex<Option<mpsc::Sender<()>>>,
    /// The held write waits for a message here.
    release: Mutex<Option<mpsc::Receiver<()>>>,
}

impl Holding {
    fn new(sim: SimBackend) -> Self {
        Holding {
            sim,
            gate: Arc::new(Gate {
                armed: AtomicBool::new(false),
                entered: Mutex::new(None),
                release: Mutex::new(None),
            }),
            plain_files: false,
        }
    }

    /// Holds the next `write_at`: returns a receiver told when it begins and a sender
    /// that lets it go on.
    fn arm(&self) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (entered_tx, entered_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        *self.gate.entered.lock().unwrap() = Some(entered_tx);
        *self.gate.release.lock().unwrap() = Some(release_rx);
        self.gate.armed.store(true, Ordering::SeqCst);
        (entered_rx, release_tx)
    }

    /// The backend to open a store on.
    fn backend(&self) -> Arc<dyn IoBackend> {
        let (plain, gate) = (self.plain_files, self.gate.clone());
        let wrap: Wrap = Arc::new(move |file| -> Arc<dyn LogFile> {
            if plain {
                return Arc::new(PlainFile { inner: file });
            }
            Arc::new(HoldingFile {
                inner: file,
                gate: gate.clone(),
            })
        });
        WrapFiles::around(Arc::new(self.sim.clone()), wrap)
    }
}

struct HoldingFile {
    inner: Arc<dyn LogFile>,
    gate: Arc<Gate>,
}

impl LogFile for HoldingFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        self.inner.append(buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.gate.armed.swap(false, Ordering::SeqCst) {
            let entered = self.gate.entered.lock().unwrap().take().unwrap();
            let release = self.gate.release.lock().unwrap().take().unwrap();
            entered.send(()).unwrap();
            // A dropped sender releases too.
            let _ = release.recv();
        }
        self.inner.write_at(offset, buf)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn truncate(&self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
    fn reserve(&self, len: u64) -> io::Result<()> {
        self.inner.reserve(len)
    }
}

/// A file that implements only what a `LogFile` must.
struct PlainFile {
    inner: Arc<dyn LogFile>,
}

impl LogFile for PlainFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        self.inner.append(buf)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn truncate(&self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
}

fn dir() -> &'static Path {
    Path::new("/store")
}

fn config(segment_size: u64) -> WalConfig {
    WalConfig {
        segment_size,
        caller_writes: true,
        ..WalConfig::default()
    }
}

fn put(id: u64, len: usize) -> Batch {
    Batch::new().put(id, None, vec![id as u8; len])
}

/// Commits `batch` on a thread of its own (its write may be held, blocking the thread).
fn commit_on_thread(
    store: &Arc<WalStore>,
    batch: Batch,
) -> std::thread::JoinHandle<Result<(), StoreError>> {
    let store = store.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(store.commit(batch))
    })
}

async fn ids(store: &WalStore) -> Vec<u64> {
    store.list().await.unwrap().iter().map(|r| r.id).collect()
}

/// Whether `bytes` holds `len` bytes of `value` in a row (a record's value).
fn holds(bytes: &[u8], value: u8, len: usize) -> bool {
    bytes.windows(len).any(|w| w.iter().all(|&b| b == value))
}

/// Waits until the live file at `path` holds `len` bytes of `value` in a row.
fn wait_until_written(sim: &SimBackend, path: &Path, value: u8, len: usize) {
    for _ in 0..2_000 {
        if sim
            .file(path)
            .is_some_and(|bytes| holds(&bytes, value, len))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("the record of {value} never reached the file");
}

/// A commit whose record is written past a range still unwritten is not acknowledged,
/// though its record is on the file and the sync thread runs. Power fails with the
/// disk holding that record and zeros for the gap: the store reopens to what was
/// acknowledged, the record past the gap cut off, and a record appended after the
/// reopen is not followed by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_past_a_gap_is_never_acknowledged_and_is_cut_at_reopen() {
    let backend = Holding::new(SimBackend::new());
    let sim = backend.sim.clone();
    let store =
        Arc::new(WalStore::open_with_backend(dir(), config(1 << 20), backend.backend()).unwrap());
    store.commit(put(1, 100)).await.unwrap();

    let (entered, release) = backend.arm();
    let held = commit_on_thread(&store, put(2, 300));
    entered.recv().unwrap();
    let past_gap = commit_on_thread(&store, put(3, 300));
    let segment = dir().join("segment-0000000000000001.wal");
    wait_until_written(&sim, &segment, 3, 300);
    // Time for a wrong acknowledgement: the sync thread syncs what the third commit
    // asked for, and the durable position must stay before the gap.
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !past_gap.is_finished(),
        "a record past a gap was acknowledged"
    );

    // Power fails now, with every page written back: the gap is zeros, the record of
    // 3 lies past it.
    let image = sim.crash_image_with_pages(4096, |_, _| true);
    let bytes = image.file(&segment).unwrap();
    assert!(
        holds(&bytes, 3, 300) && !holds(&bytes, 2, 300),
        "not a gap image"
    );

    release.send(()).unwrap();
    held.join().unwrap().unwrap();
    past_gap.join().unwrap().unwrap();
    store.close().await.unwrap();

    let reopened = WalStore::open_with_backend(dir(), config(1 << 20), Arc::new(image.clone()))
        .unwrap_or_else(|e| panic!("a gap image must reopen: {e}"));
    assert_eq!(ids(&reopened).await, [1]);
    reopened.commit(put(4, 50)).await.unwrap();
    reopened.close().await.unwrap();
    let bytes = image.file(&segment).unwrap();
    assert!(
        !holds(&bytes, 3, 300),
        "the record past the gap is still in the file"
    );
    let again = WalStore::open_with_backend(dir(), config(1 << 20), Arc::new(image)).unwrap();
    assert_eq!(ids(&again).await, [1, 4]);
}

/// A commit that rolls the segment while an earlier range of it is unwritten waits for
/// that write: a closed segment never holds a gap. Both commits end once the held write
/// goes on, and a reopen (after a crash, from what was synced) finds every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_waits_for_the_ranges_of_the_segment_it_closes() {
    let backend = Holding::new(SimBackend::new());
    let sim = backend.sim.clone();
    let store =
        Arc::new(WalStore::open_with_backend(dir(), config(4096), backend.backend()).unwrap());
    store.commit(put(1, 1000)).await.unwrap();

    let (entered, release) = backend.arm();
    let held = commit_on_thread(&store, put(2, 1000));
    entered.recv().unwrap();
    // Does not fit in the first segment: its append rolls.
    let rolling = commit_on_thread(&store, put(3, 3000));
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !rolling.is_finished(),
        "the roll did not wait for the held write"
    );
    release.send(()).unwrap();
    held.join().unwrap().unwrap();
    rolling.join().unwrap().unwrap();
    assert!(store.stats().segments >= 2, "{:?}", store.stats());

    let image = sim.crash_image();
    drop(store);
    let reopened = WalStore::open_with_backend(dir(), config(4096), Arc::new(image)).unwrap();
    assert_eq!(ids(&reopened).await, [1, 2, 3]);
}

/// Rounds of batches committed together from several threads (as the shards of
/// docs/DESIGN.md would), power failing at every sync in turn: every batch of an
/// acknowledged round is in the reopened store, and no batch is there in part.
#[test]
fn rounds_from_several_threads_survive_a_crash_at_every_sync() {
    const THREADS: u64 = 3;
    const ROUNDS: u64 = 6;
    const PER_ROUND: u64 = 4;
    // The acknowledged ids of every thread's rounds.
    let workload = |store: Arc<WalStore>| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    let mut acked = Vec::new();
                    for round in 0..ROUNDS {
                        let ids: Vec<u64> = (0..PER_ROUND)
                            .map(|i| t * 10_000 + round * 100 + i)
                            .collect();
                        let batches = ids
                            .iter()
                            .map(|&id| {
                                Batch::new().put(id, None, vec![t as u8; 40]).put(
                                    id + 1_000_000,
                                    Some(id),
                                    vec![round as u8; 40],
                                )
                            })
                            .collect();
                        let outcomes = runtime.block_on(store.commit_all(batches));
                        if outcomes.iter().any(Result::is_err) {
                            break;
                        }
                        acked.extend(ids);
                    }
                    acked
                })
            })
            .collect();
        let acked: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        acked
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let counting = SimBackend::new();
    let store = WalStore::open_with_backend(dir(), config(2048), Arc::new(counting.clone()));
    let acked = workload(Arc::new(store.unwrap()));
    assert_eq!(acked.len() as u64, THREADS * ROUNDS * PER_ROUND);
    let syncs = counting.sync_count();
    for n in 1..=syncs {
        let sim = SimBackend::crash_at_sync(n);
        let acked = match WalStore::open_with_backend(dir(), config(2048), Arc::new(sim.clone())) {
            Ok(store) => workload(Arc::new(store)),
            Err(_) => Vec::new(),
        };
        let image = sim.crash_image();
        let store = WalStore::open_with_backend(dir(), config(2048), Arc::new(image))
            .unwrap_or_else(|e| panic!("crash at sync {n}: reopen failed: {e}"));
        let found = runtime.block_on(ids(&store)).into_iter().collect();
        common::assert_acked_and_whole(&found, &acked, n);
    }
}

/// A backend whose files cannot write at an offset fails the first commit with an
/// error that says so, and poisons the store; nothing was acknowledged.
#[tokio::test]
async fn a_backend_without_positional_writes_fails_the_first_commit_clearly() {
    let mut backend = Holding::new(SimBackend::new());
    backend.plain_files = true;
    let store = WalStore::open_with_backend(dir(), config(1 << 20), backend.backend()).unwrap();
    let err = store.commit(put(1, 10)).await.unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert!(err.to_string().contains("LogFile::write_at"), "{err}");
    let err = store.commit(put(2, 10)).await.unwrap_err();
    assert!(matches!(err, StoreError::Poisoned), "{err}");
}

/// A commit whose future is dropped after its first poll has written its record; the
/// store dropped right after still syncs it before its sync thread ends, so a power
/// loss then keeps it, as the committer thread's queued commits are kept. The second
/// record is written while the sync thread is in a slow sync of the first, so that the
/// store's drop reaches the thread before it looked for more to sync.
#[tokio::test]
async fn a_dropped_commit_is_synced_before_the_store_is_dropped() {
    let sim = SimBackend::new();
    let store = WalStore::open_with_backend(dir(), config(1 << 20), Arc::new(sim.clone())).unwrap();
    store.commit(put(1, 10)).await.unwrap();
    sim.set_sync_delay(Duration::from_millis(200));
    let poll_once_then_drop = |batch: Batch| {
        let commit = store.commit(batch);
        let mut commit = std::pin::pin!(commit);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let _ = std::future::Future::poll(commit.as_mut(), &mut cx);
    };
    poll_once_then_drop(put(2, 10));
    // The sync of 2 has begun (its image taken) and lasts 200 ms.
    std::thread::sleep(Duration::from_millis(50));
    poll_once_then_drop(put(3, 10));
    drop(store);
    let image = sim.crash_image();
    let store = WalStore::open_with_backend(dir(), config(1 << 20), Arc::new(image)).unwrap();
    assert_eq!(ids(&store).await, [1, 2, 3]);
}
