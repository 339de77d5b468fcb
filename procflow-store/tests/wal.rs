//! `WalStore` scenarios, each run on the real file system and on the in-memory backend.

mod common;

use std::sync::Arc;

use common::{Env, prefix_states, small_segments, workload};
use procflow_store::{Batch, Bytes, Record, Store, StoreError, SyncMode, WalConfig, WalStore};

#[tokio::test]
async fn passes_the_store_contract() {
    for env in Env::all() {
        let config = WalConfig::default();
        common::contract::run_all(|| {
            Arc::new(env.open_at(&env.fresh_dir(), config.clone()).unwrap()) as Arc<dyn Store>
        })
        .await;
    }
}

#[tokio::test]
async fn reopen_restores_records_meta_and_fencing_token() {
    for env in Env::all() {
        let batches = workload(23, 10);
        let expected = prefix_states(&batches).await;
        let store = env.open(WalConfig::default()).unwrap();
        for batch in &batches {
            store.commit(batch.clone()).await.unwrap();
        }
        store.close().await.unwrap();
        let store = env.open(WalConfig::default()).unwrap();
        assert_eq!(store.load().await.unwrap(), expected[23], "{}", env.name);
        // workload() fenced batch 21 with token 21.
        let err = store
            .commit(Batch::new().with_fencing_token(20))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Fenced {
                    token: 20,
                    highest: 21
                }
            ),
            "{}: {err}",
            env.name
        );
        store
            .commit(Batch::new().with_fencing_token(21))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_second_opener_is_locked_out_until_close() {
    for env in Env::all() {
        let store = env.open(WalConfig::default()).unwrap();
        let err = env.open(WalConfig::default()).unwrap_err();
        assert!(
            matches!(err, StoreError::Locked { .. }),
            "{}: {err}",
            env.name
        );
        assert!(
            err.to_string()
                .contains("another process has the store open")
        );
        store.close().await.unwrap();
        let again = env.open(WalConfig::default()).unwrap();
        drop(again);
        drop(store);
        env.open(WalConfig::default()).unwrap();
    }
}

#[cfg(unix)]
#[tokio::test]
async fn files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::fs();
    let store = env.open(WalConfig::default()).unwrap();
    store
        .commit(Batch::new().put(1, None, vec![]))
        .await
        .unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&env.dir), 0o700);
    for entry in std::fs::read_dir(&env.dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
}

#[tokio::test]
async fn compaction_keeps_disk_use_near_live_data() {
    // Idle data smaller than a segment, and idle data spanning several segments (then
    // rewriting it forward closes segments while compaction runs).
    for (segment, idle) in [(16 * 1024, 8), (4 * 1024, 24)] {
        compaction_keeps_disk_use_near(segment, idle).await;
    }
}

async fn compaction_keeps_disk_use_near(segment: u64, idle: u64) {
    const VALUE: usize = 512;
    for env in Env::all() {
        let store = env.open(small_segments(&env, segment)).unwrap();
        // A few procedures that never change...
        for id in 0..idle {
            store
                .commit(Batch::new().put(id, None, vec![id as u8; VALUE]))
                .await
                .unwrap();
        }
        // ...and heavy churn from others: created, stepped, finished, deleted.
        for round in 0..600u64 {
            let id = 100 + round % 20;
            let batch = match round / 20 % 3 {
                0 => Batch::new().put(id, Some(1), vec![round as u8; VALUE]),
                1 => Batch::new().finish(id, vec![round as u8; VALUE]),
                _ => Batch::new()
                    .delete(id)
                    .put_meta("hwm", round.to_le_bytes().to_vec()),
            };
            store.commit(batch).await.unwrap();
            let stats = store.stats();
            let loaded = store.load().await.unwrap();
            // Live data: the live values and metadata, plus the 48 bytes per entry that
            // its framing on disk takes (what `WalStats::live_bytes` counts).
            let live: u64 = loaded
                .records
                .iter()
                .map(|r| r.value.len() as u64 + 48)
                .chain(
                    loaded
                        .meta
                        .iter()
                        .map(|(k, v)| (k.len() + v.len()) as u64 + 48),
                )
                .sum();
            assert_eq!(stats.live_bytes, live, "{}: round {round}", env.name);
            assert!(
                stats.disk_bytes <= 2 * live + segment,
                "{}: round {round}: {} disk bytes for {live} live bytes ({stats:?})",
                env.name,
                stats.disk_bytes
            );
        }
        let expected = store.load().await.unwrap();
        store.close().await.unwrap();
        let reopened = env.open(small_segments(&env, segment)).unwrap();
        assert_eq!(reopened.load().await.unwrap(), expected, "{}", env.name);
        let stats = reopened.stats();
        assert!(
            stats.disk_bytes <= 2 * stats.live_bytes + segment,
            "{}: {stats:?}",
            env.name
        );
        assert_eq!(env.segments().len(), stats.segments);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commits_share_fsyncs() {
    for env in Env::all() {
        if env.name == "sim" {
            env.sim_backend()
                .set_sync_delay(std::time::Duration::from_millis(2));
        }
        let store = Arc::new(env.open(WalConfig::default()).unwrap());
        let mut tasks = Vec::new();
        for writer in 0..32u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..10 {
                    store
                        .commit(Batch::new().put(writer * 100 + i, None, vec![1; 64]))
                        .await
                        .unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let stats = store.stats();
        assert_eq!(stats.commits, 320);
        // On the real file system fsync may be nearly free (tmpfs), so sharing is only
        // asserted where syncs take time.
        if env.name == "sim" {
            assert!(stats.group_syncs * 2 < stats.commits, "{stats:?}");
        }
        store.close().await.unwrap();
        let store = env.open(WalConfig::default()).unwrap();
        assert_eq!(store.list().await.unwrap().len(), 320, "{}", env.name);
    }
}

#[tokio::test]
async fn torn_tail_is_truncated_and_the_log_goes_on() {
    for env in Env::all() {
        let store = env.open(WalConfig::default()).unwrap();
        store
            .commit(Batch::new().put(1, None, vec![1; 100]))
            .await
            .unwrap();
        store
            .commit(Batch::new().put(2, None, vec![2; 100]))
            .await
            .unwrap();
        store.close().await.unwrap();
        drop(store);
        let segment = &env.segments()[0];
        let bytes = env.read(segment);
        env.write(segment, &bytes[..bytes.len() - 50]);
        let store = env.open(WalConfig::default()).unwrap();
        assert_eq!(store.list().await.unwrap().len(), 1, "{}", env.name);
        store
            .commit(Batch::new().put(3, None, vec![3]))
            .await
            .unwrap();
        store.close().await.unwrap();
        drop(store);
        let store = env.open(WalConfig::default()).unwrap();
        let ids: Vec<u64> = store.list().await.unwrap().iter().map(|r| r.id).collect();
        assert_eq!(ids, [1, 3], "{}", env.name);
    }
}

#[tokio::test]
async fn no_sync_mode_still_persists_across_clean_close() {
    for env in Env::all() {
        let config = WalConfig {
            sync: SyncMode::NoSync,
            ..WalConfig::default()
        };
        let store = env.open(config.clone()).unwrap();
        store
            .commit(Batch::new().put(1, None, vec![7]))
            .await
            .unwrap();
        store.close().await.unwrap();
        drop(store);
        let store = env.open(config).unwrap();
        assert_eq!(
            store.get(1).await.unwrap(),
            Some(Record {
                id: 1,
                parent: None,
                finished: false,
                value: vec![7].into()
            })
        );
        assert_eq!(store.stats().group_syncs, 0);
    }
}

#[tokio::test]
async fn large_batches_get_their_own_segment() {
    for env in Env::all() {
        let config = small_segments(&env, 4096);
        let store = env.open(config.clone()).unwrap();
        store
            .commit(Batch::new().put(1, None, vec![1; 100]))
            .await
            .unwrap();
        store
            .commit(Batch::new().put(2, None, vec![2; 10_000]))
            .await
            .unwrap();
        store
            .commit(Batch::new().put(3, None, vec![3; 100]))
            .await
            .unwrap();
        store.close().await.unwrap();
        drop(store);
        let store = WalStore::open_with_backend(
            &env.dir,
            config,
            match env.name {
                "sim" => Arc::new(env.sim_backend().clone()),
                _ => Arc::new(procflow_store::io::FsBackend),
            },
        )
        .unwrap();
        assert_eq!(store.get(2).await.unwrap().unwrap().value.len(), 10_000);
        assert_eq!(store.list().await.unwrap().len(), 3);
    }
}

#[tokio::test]
async fn fencing_token_survives_compaction_of_its_segment() {
    for env in Env::all() {
        let config = small_segments(&env, 2048);
        let store = env.open(config.clone()).unwrap();
        store
            .commit(
                Batch::new()
                    .put(1, None, vec![1; 10])
                    .with_fencing_token(50),
            )
            .await
            .unwrap();
        for round in 0..200u64 {
            store
                .commit(Batch::new().put(2, None, vec![round as u8; 300]))
                .await
                .unwrap();
        }
        store.close().await.unwrap();
        drop(store);
        assert!(
            !env.segments()[0].ends_with("segment-0000000000000001.wal"),
            "{}: the first segment was not compacted away",
            env.name
        );
        let store = env.open(config).unwrap();
        let err = store
            .commit(Batch::new().with_fencing_token(49))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Fenced {
                    token: 49,
                    highest: 50
                }
            ),
            "{}: {err}",
            env.name
        );
        assert_eq!(store.get(1).await.unwrap().unwrap().value, vec![1; 10]);
    }
}

/// Polls `future` to completion on this thread, with no async runtime anywhere.
fn block_on_without_runtime<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

#[test]
fn commit_and_close_need_no_async_runtime() {
    for env in Env::all() {
        let dir = env.fresh_dir();
        let store = env.open_at(&dir, WalConfig::default()).unwrap();
        block_on_without_runtime(store.commit(Batch::new().put(7, None, b"seven".to_vec())))
            .unwrap();
        block_on_without_runtime(store.close()).unwrap();
        let err =
            block_on_without_runtime(store.commit(Batch::new().put(8, None, vec![]))).unwrap_err();
        assert!(matches!(err, StoreError::Closed), "{}: {err}", env.name);
        drop(store);
        let store = env.open_at(&dir, WalConfig::default()).unwrap();
        let record = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(store.get(7))
            .unwrap();
        assert_eq!(record.unwrap().value, &b"seven"[..], "{}", env.name);
    }
}

#[tokio::test]
async fn a_dropped_commit_future_still_commits_before_the_store_is_dropped() {
    for env in Env::all() {
        let dir = env.fresh_dir();
        let store = env.open_at(&dir, WalConfig::default()).unwrap();
        // Polled once (which queues the batch), then dropped without waiting.
        {
            let commit = store.commit(Batch::new().put(1, None, b"queued".to_vec()));
            let mut commit = std::pin::pin!(commit);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let _ = commit.as_mut().poll(&mut cx);
        }
        drop(store);
        let store = env.open_at(&dir, WalConfig::default()).unwrap();
        assert_eq!(
            store.get(1).await.unwrap().map(|r| r.value),
            Some(Bytes::from_static(b"queued")),
            "{}",
            env.name
        );
    }
}

/// Records the directory calls of the real file system backend.
struct DirCalls {
    fs: procflow_store::io::FsBackend,
    calls: std::sync::Mutex<Vec<String>>,
}

impl procflow_store::io::IoBackend for DirCalls {
    fn create_dir_all(&self, dir: &std::path::Path) -> std::io::Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("create {}", dir.display()));
        self.fs.create_dir_all(dir)
    }
    fn lock_dir(
        &self,
        dir: &std::path::Path,
    ) -> std::io::Result<Option<procflow_store::io::DirLock>> {
        self.fs.lock_dir(dir)
    }
    fn list_dir(&self, dir: &std::path::Path) -> std::io::Result<Vec<String>> {
        self.fs.list_dir(dir)
    }
    fn read_file(&self, path: &std::path::Path) -> std::io::Result<Vec<u8>> {
        self.fs.read_file(path)
    }
    fn create_file(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<Arc<dyn procflow_store::io::LogFile>> {
        self.fs.create_file(path)
    }
    fn open_file(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<Arc<dyn procflow_store::io::LogFile>> {
        self.fs.open_file(path)
    }
    fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        self.fs.rename(from, to)
    }
    fn remove_file(&self, path: &std::path::Path) -> std::io::Result<()> {
        self.fs.remove_file(path)
    }
    fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("sync {}", dir.display()));
        self.fs.sync_dir(dir)
    }
}

/// Issue 12, point 15: the store directory's own entry is made durable in its parent
/// right after the directory is created.
#[tokio::test]
async fn p15_creating_the_store_syncs_its_parent_directory() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("store");
    let backend = Arc::new(DirCalls {
        fs: procflow_store::io::FsBackend,
        calls: std::sync::Mutex::new(Vec::new()),
    });
    let config = WalConfig {
        sync: SyncMode::Durable,
        ..WalConfig::default()
    };
    let store = WalStore::open_with_backend(&dir, config, backend.clone()).unwrap();
    store.close().await.unwrap();
    let calls = backend.calls.lock().unwrap().clone();
    let created = calls
        .iter()
        .position(|c| *c == format!("create {}", dir.display()))
        .expect("the directory is created");
    let synced = calls
        .iter()
        .position(|c| *c == format!("sync {}", parent.path().display()));
    assert!(
        synced.is_some_and(|synced| synced > created),
        "the parent is not synced after the store directory is created: {calls:?}"
    );
}

/// A closed store of many small segments, every record the same size (a put of 100
/// bytes to ids below 128), all live (no compaction). Returns the segment files in order.
async fn closed_store_of_segments(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let config = WalConfig {
        segment_size: 1024,
        sync: SyncMode::NoSync,
        ..WalConfig::default()
    };
    let store = WalStore::open(dir, config).unwrap();
    for id in 1..=60u64 {
        let batch = Batch::new().put(id, None, vec![7; 100]);
        store.commit(batch).await.unwrap();
    }
    store.close().await.unwrap();
    drop(store);
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "wal"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 4, "{segments:?}");
    segments
}

fn corrupt_file(result: Result<WalStore, StoreError>) -> std::path::PathBuf {
    match result {
        Err(StoreError::Corrupt { file, .. }) => file,
        Err(other) => panic!("expected corruption, got {other}"),
        Ok(_) => panic!("a store that lost acknowledged records opened cleanly"),
    }
}

/// Issue 12, point 12: a segment deleted from the middle of the log is corruption naming
/// the missing file, not a log that silently lacks its records.
#[tokio::test]
async fn p12_a_missing_middle_segment_is_corruption_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let segments = closed_store_of_segments(dir.path()).await;
    std::fs::remove_file(&segments[1]).unwrap();
    let file = corrupt_file(WalStore::open(dir.path(), WalConfig::default()));
    assert_eq!(file, segments[1]);
}

/// Issue 12, point 12: a closed segment cut short at a record boundary (its last record
/// gone, every remaining record valid) is corruption: the next segment's first record
/// does not follow.
#[tokio::test]
async fn p12_a_closed_segment_cut_at_a_record_boundary_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let segments = closed_store_of_segments(dir.path()).await;
    // Every record has the same size: measure one in a store of its own.
    let len = |path: &std::path::Path| std::fs::metadata(path).unwrap().len();
    let record = {
        let other = tempfile::tempdir().unwrap();
        let store = WalStore::open(other.path(), WalConfig::default()).unwrap();
        let segment = other.path().join("segment-0000000000000001.wal");
        let empty = len(&segment);
        store
            .commit(Batch::new().put(1, None, vec![7; 100]))
            .await
            .unwrap();
        store.close().await.unwrap();
        len(&segment) - empty
    };
    let victim = &segments[1];
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(victim)
        .unwrap();
    file.set_len(len(victim) - record).unwrap();
    drop(file);
    let file = corrupt_file(WalStore::open(dir.path(), WalConfig::default()));
    assert_eq!(
        &file, &segments[2],
        "reported where the records stop following"
    );
}
