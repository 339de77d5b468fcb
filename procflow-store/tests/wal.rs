//! `WalStore` scenarios, each run on the real file system and on the in-memory backend.

mod common;

use std::sync::Arc;

use common::{Env, prefix_states, small_segments, workload};
use procflow_store::io::IoBackend;
use procflow_store::{Batch, Bytes, Record, Store, StoreError, SyncMode, WalConfig, WalStore};

#[tokio::test]
async fn passes_the_store_contract() {
    for env in Env::all() {
        let config = WalConfig::default();
        common::contract::run_all(|| async {
            common::contract::Subject::counting(Arc::new(
                env.open_at(&env.fresh_dir(), config.clone()).unwrap(),
            ))
        })
        .await;
    }
}

/// The same with commits that write their own records (`WalConfig::caller_writes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_store_contract_with_caller_writes() {
    for env in Env::all() {
        let config = WalConfig {
            caller_writes: true,
            ..WalConfig::default()
        };
        common::contract::run_all(|| async {
            common::contract::Subject::counting(Arc::new(
                env.open_at(&env.fresh_dir(), config.clone()).unwrap(),
            ))
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

/// Commits a put of `len` bytes, each the id, per `(id, len)`, one batch each.
async fn put_each<const N: usize>(store: &WalStore, puts: [(u64, usize); N]) {
    for (id, len) in puts {
        store
            .commit(Batch::new().put(id, None, vec![id as u8; len]))
            .await
            .unwrap();
    }
}

/// Also with segments read rather than mapped (`map_segments`; the simulated backend
/// cannot map, so it reads either way): a mapped torn segment is cut while mapped, and the
/// writer then appends to it.
#[tokio::test]
async fn torn_tail_is_truncated_and_the_log_goes_on() {
    for map_segments in [true, false] {
        let config = WalConfig {
            map_segments,
            ..WalConfig::default()
        };
        for env in Env::all() {
            let store = env.open(config.clone()).unwrap();
            put_each(&store, [(1, 100), (2, 100)]).await;
            store.close().await.unwrap();
            drop(store);
            let segment = &env.segments()[0];
            let bytes = env.read(segment);
            env.write(segment, &bytes[..bytes.len() - 50]);
            let store = env.open(config.clone()).unwrap();
            let name = format!("{}, map_segments {map_segments}", env.name);
            let loaded = store.load().await.unwrap();
            assert_eq!(loaded.records.len(), 1, "{name}");
            assert_eq!(loaded.records[0].value, vec![1; 100], "{name}");
            store
                .commit(Batch::new().put(3, None, vec![3]))
                .await
                .unwrap();
            store.close().await.unwrap();
            drop(store);
            let store = env.open(config.clone()).unwrap();
            let ids: Vec<u64> = store.list().await.unwrap().iter().map(|r| r.id).collect();
            assert_eq!(ids, [1, 3], "{name}");
        }
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
        put_each(&store, [(1, 100), (2, 10_000), (3, 100)]).await;
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

/// The fencing token survives the compaction of the segment its batch is in, whether
/// that segment still holds a live value or none: compaction writes a record even for
/// a segment with nothing live left, to carry the token forward.
#[tokio::test]
async fn fencing_token_survives_compaction_of_its_segment() {
    for with_value in [true, false] {
        for env in Env::all() {
            let config = small_segments(&env, 2048);
            let store = env.open(config.clone()).unwrap();
            let batch = if with_value {
                Batch::new().put(1, None, vec![1; 10])
            } else {
                Batch::new()
            };
            store.commit(batch.with_fencing_token(50)).await.unwrap();
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
                "{} (a value kept: {with_value}): {err}",
                env.name
            );
            let kept = store
                .get(1)
                .await
                .unwrap()
                .map(|record| record.value.to_vec());
            assert_eq!(kept, with_value.then(|| vec![1; 10]));
        }
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

/// `commit_all` answers each batch in order, with and without `caller_writes`: a batch
/// the store refuses (a finish of a procedure that does not exist) changes nothing and
/// holds back none of the others, which are all there after a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_all_answers_each_batch_and_a_refusal_holds_back_no_other() {
    for caller_writes in [false, true] {
        for env in Env::all() {
            let config = WalConfig {
                caller_writes,
                ..WalConfig::default()
            };
            let dir = env.fresh_dir();
            let store = env.open_at(&dir, config.clone()).unwrap();
            let outcomes = store
                .commit_all(vec![
                    Batch::new().put(1, None, b"one".to_vec()),
                    Batch::new().finish(99, b"never".to_vec()),
                    Batch::new().put(2, Some(1), b"two".to_vec()),
                    Batch::new().finish(1, b"done".to_vec()),
                ])
                .await;
            let what = format!("{}, caller_writes {caller_writes}", env.name);
            assert_eq!(outcomes.len(), 4, "{what}");
            assert!(
                outcomes[0].is_ok() && outcomes[2].is_ok() && outcomes[3].is_ok(),
                "{what}: {outcomes:?}"
            );
            assert!(
                matches!(outcomes[1], Err(StoreError::UnknownProcedure(99))),
                "{what}: {outcomes:?}"
            );
            assert!(store.commit_all(Vec::new()).await.is_empty(), "{what}");
            store.close().await.unwrap();
            drop(store);

            let store = env.open_at(&dir, config).unwrap();
            let records = store.list().await.unwrap();
            let found: Vec<(u64, bool)> = records.iter().map(|r| (r.id, r.finished)).collect();
            assert_eq!(found, [(1, true), (2, false)], "{what}");
        }
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

/// Issue 12, point 13: a commit alone in flight, polling for its answer, gets the store's
/// error when its group fails to write — it must never panic. The group is [A, B]: A's
/// write fails (its segment roll cannot sync), B is the lone commit waiting.
#[tokio::test]
async fn p13_lone_commit_gets_an_error_not_a_panic_when_its_group_fails() {
    use procflow_store::io::{FaultBackend, IoBackend, SimBackend};
    use std::time::Duration;

    let config = WalConfig {
        segment_size: 256,
        // Long enough that B is still polling when the committer gives up on it.
        spin_wait: Duration::from_secs(30),
        ..WalConfig::default()
    };
    let dir = std::path::Path::new("/store");
    let big = || vec![7; 300];
    // Dry run: how many writes and syncs opening the store costs.
    let opened = {
        let probe = FaultBackend::new(Arc::new(SimBackend::new()), u64::MAX);
        drop(WalStore::open_with_backend(dir, config.clone(), Arc::new(probe.clone())).unwrap());
        probe.operations()
    };
    let sim = SimBackend::new();
    // X costs the allocation of its segment's space, an append and a sync; A then rolls
    // the full segment, whose first step, a sync of the old segment, fails.
    let fault = FaultBackend::new(Arc::new(sim.clone()), opened + 4);
    let backend: Arc<dyn IoBackend> = Arc::new(fault);
    let store = WalStore::open_with_backend(dir, config, backend).unwrap();
    // X's sync is slow, so A and B queue behind it and form the next group.
    sim.set_sync_delay(Duration::from_millis(300));
    poll_once_then_drop(store.commit(Batch::new().put(1, None, big()))).await;
    poll_once_then_drop(store.commit(Batch::new().put(2, None, big()))).await;
    // X and A were dropped: B is the only commit in flight, so it polls.
    let b = store.commit(Batch::new().put(3, None, big())).await;
    assert!(
        matches!(b, Err(StoreError::Poisoned | StoreError::Io { .. })),
        "{b:?}"
    );
}

/// Polls `future` once (enough to queue a commit) and drops it.
async fn poll_once_then_drop<F: std::future::Future>(future: F) {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        assert!(
            future.as_mut().poll(cx).is_pending(),
            "finished before its slow sync"
        );
        std::task::Poll::Ready(())
    })
    .await;
}

/// Commits 12 procedures of 100 bytes each into segments of 512 bytes (several records
/// per segment, none compacted: all stay live), closes the store and returns the
/// segment files.
async fn several_closed_segments(env: &Env) -> Vec<std::path::PathBuf> {
    let store = env.open(small_segments(env, 512)).unwrap();
    for id in 0..12 {
        store
            .commit(Batch::new().put(id, None, vec![id as u8; 100]))
            .await
            .unwrap();
    }
    store.close().await.unwrap();
    drop(store);
    let segments = env.segments();
    assert!(segments.len() >= 4, "{}: {segments:?}", env.name);
    segments
}

/// The offsets at which a segment file's records start, and where they end (segment
/// header: 32 bytes; record: 32-byte header with the payload length at offset 4, then
/// the payload), up to the first byte that starts no record (zeros allocated ahead) or
/// the end of the file.
fn records(bytes: &[u8]) -> (Vec<usize>, usize) {
    let mut starts = Vec::new();
    let mut offset = 32;
    while offset + 32 <= bytes.len() && bytes[offset] != 0 {
        starts.push(offset);
        let len = u32::from_le_bytes(bytes[offset + 4..offset + 8].try_into().unwrap());
        offset += 32 + len as usize;
    }
    (starts, offset)
}

/// The offset of the last record in a segment file.
fn last_record_offset(bytes: &[u8]) -> usize {
    records(bytes).0.last().copied().unwrap_or(32)
}

/// Where a segment file's records end.
fn records_end(bytes: &[u8]) -> usize {
    records(bytes).1
}

fn assert_corrupt_naming(err: StoreError, file: &std::path::Path, env: &Env) {
    match err {
        StoreError::Corrupt { file: named, .. } => assert_eq!(named, file, "{}", env.name),
        other => panic!(
            "{}: expected Corrupt naming {file:?}, got {other}",
            env.name
        ),
    }
}

/// Issue 12, point 12: deleting a segment from the middle of the log drops acknowledged
/// records; the open must fail and name the missing file.
#[tokio::test]
async fn p12_a_missing_middle_segment_is_corruption() {
    for env in Env::all() {
        let segments = several_closed_segments(&env).await;
        let middle = &segments[1];
        match env.name {
            "sim" => env.sim_backend().remove_file(middle).unwrap(),
            _ => std::fs::remove_file(middle).unwrap(),
        }
        let err = env.open(small_segments(&env, 512)).unwrap_err();
        assert_corrupt_naming(err, middle, &env);
    }
}

/// Issue 12, point 12: cutting a closed segment's last record off at a record boundary
/// leaves a well-formed file; the open must still see the records are missing.
#[tokio::test]
async fn p12_a_closed_segment_cut_at_a_record_boundary_is_corruption() {
    for env in Env::all() {
        let segments = several_closed_segments(&env).await;
        // Every closed segment, including the one just before the active segment.
        for closed in &segments[..segments.len() - 1] {
            let bytes = env.read(closed);
            env.write(closed, &bytes[..last_record_offset(&bytes)]);
            let err = env.open(small_segments(&env, 512)).unwrap_err();
            assert_corrupt_naming(err, closed, &env);
            env.write(closed, &bytes);
        }
        // Undamaged again, it opens.
        env.open(small_segments(&env, 512)).unwrap();
    }
}

/// Issue 12, point 12: a segment cut short whose successor holds no record yet (a roll
/// just happened) is found by the successor's header, which names its first sequence
/// number.
#[tokio::test]
async fn p12_a_shortened_segment_before_an_empty_active_one_is_corruption() {
    for env in Env::all() {
        let segments = several_closed_segments(&env).await;
        let last = segments.last().unwrap();
        let before = &segments[segments.len() - 2];
        // Leave the active segment with its header only, and shorten the one before.
        let active = env.read(last);
        env.write(last, &active[..32]);
        let bytes = env.read(before);
        env.write(before, &bytes[..last_record_offset(&bytes)]);
        let err = env.open(small_segments(&env, 512)).unwrap_err();
        assert_corrupt_naming(err, before, &env);
    }
}

#[tokio::test]
async fn read_only_sees_an_open_store_and_changes_nothing() {
    for env in Env::all() {
        let empty = WalStore::read_only_with_backend(env.fresh_dir(), env.backend.as_ref());
        assert!(
            matches!(empty, Err(StoreError::NotAStore { .. })),
            "{}: {empty:?}",
            env.name
        );
        let dir = env.dir.clone();
        // Small segments, so that compaction runs and the log has several files.
        let store = env.open(small_segments(&env, 4096)).unwrap();
        for batch in workload(40, 200) {
            store.commit(batch).await.unwrap();
        }
        // The writer holds the lock; the reader needs none and sees what it committed.
        let seen = WalStore::read_only_with_backend(&dir, env.backend.as_ref()).unwrap();
        assert_eq!(seen, store.load().await.unwrap(), "{}", env.name);
        store.close().await.unwrap();
        drop(store);

        // A torn tail (a record being appended) is not seen, and left as it is.
        let last = env.segments().pop().unwrap();
        let bytes = env.read(&last);
        env.write(&last, &bytes[..bytes.len() - 7]);
        let seen = WalStore::read_only_with_backend(&dir, env.backend.as_ref()).unwrap();
        assert_eq!(env.read(&last).len(), bytes.len() - 7, "{}", env.name);
        let store = env.open_at(&dir, small_segments(&env, 4096)).unwrap();
        assert_eq!(seen, store.load().await.unwrap(), "{}", env.name);
    }
}

/// With durable commits the active segment's space is allocated ahead of its records
/// (`LogFile::reserve`, 4 MiB at a time): the file is longer than its records, zeros
/// past them. Dropped without a close (as by a crash) the zeros stay, and the store
/// reopens with every record and appends right after the last one; closed, its segment
/// ends at its last record.
#[tokio::test]
async fn the_active_segment_is_allocated_ahead_and_cut_at_close() {
    for env in Env::all() {
        let what = env.name;
        let batches = workload(12, 40);
        let expected = prefix_states(&batches).await;
        let config = WalConfig::default();
        let store = env.open(config.clone()).unwrap();
        for batch in &batches[..6] {
            store.commit(batch.clone()).await.unwrap();
        }
        let segment = env.segments()[0].clone();
        let bytes = env.read(&segment);
        assert_eq!(bytes.len(), 4 << 20, "{what}: allocated ahead");
        let end = records_end(&bytes);
        let stats = store.stats();
        assert_eq!(stats.disk_bytes, 4 << 20, "{what}: the file, counted whole");
        assert_eq!(end as u64, stats.disk_bytes - stats.ahead_bytes, "{what}");
        assert!(bytes[end..].iter().all(|&b| b == 0), "{what}: zeros past");
        drop(store);
        assert_eq!(
            env.read(&segment).len(),
            4 << 20,
            "{what}: not cut by a drop"
        );

        let store = env.open(config.clone()).unwrap();
        assert_eq!(store.load().await.unwrap(), expected[6], "{what}");
        for batch in &batches[6..] {
            store.commit(batch.clone()).await.unwrap();
        }
        let bytes = env.read(&segment);
        let stats = store.stats();
        assert_eq!(
            records_end(&bytes) as u64,
            stats.disk_bytes - stats.ahead_bytes,
            "{what}"
        );
        store.close().await.unwrap();
        let bytes = env.read(&segment);
        assert_eq!(bytes.len(), records_end(&bytes), "{what}: cut at close");
        drop(store);
        let store = env.open(config).unwrap();
        assert_eq!(store.load().await.unwrap(), expected[12], "{what}");
    }
}

/// The space allocated ahead is written zeros, not `fallocate`d space: on ext4 (and
/// XFS) `fallocate` leaves unwritten extents, which `SEEK_HOLE` reports as a hole, and
/// every sync after a write into them converts them, writing the extent tree too. Run
/// on the real file system only (the in-memory backend has no blocks).
#[tokio::test]
async fn the_space_ahead_is_written_not_a_hole() {
    let env = Env::fs();
    let store = env.open(WalConfig::default()).unwrap();
    store
        .commit(Batch::new().put(1, None, vec![7; 300]))
        .await
        .unwrap();
    let segment = env.segments()[0].clone();
    let file = std::fs::File::open(&segment).unwrap();
    let len = file.metadata().unwrap().len();
    assert_eq!(len, 4 << 20, "allocated ahead");
    let hole = rustix::fs::seek(&file, rustix::fs::SeekFrom::Hole(0)).unwrap();
    assert_eq!(
        hole, len,
        "the first hole is at the file's end, not at {hole}"
    );
    store.close().await.unwrap();
}

/// A segment is cut at its last record before the next one starts: recovery reads
/// anything after the records of a closed segment, zeros too, as corruption.
#[tokio::test]
async fn a_rolled_segment_ends_at_its_last_record() {
    for env in Env::all() {
        let what = env.name;
        // Segments of several filesystem blocks, so that there is space to allocate.
        let config = WalConfig {
            segment_size: 16 << 10,
            ..WalConfig::default()
        };
        let store = env.open(config.clone()).unwrap();
        for id in 0..30 {
            store
                .commit(Batch::new().put(id, None, vec![id as u8; 2000]))
                .await
                .unwrap();
        }
        let segments = env.segments();
        assert!(segments.len() >= 3, "{what}: {segments:?}");
        let (active, closed) = segments.split_last().unwrap();
        for segment in closed {
            let bytes = env.read(segment);
            assert_eq!(bytes.len(), records_end(&bytes), "{what}: {segment:?}");
        }
        let bytes = env.read(active);
        assert_eq!(
            bytes.len(),
            16 << 10,
            "{what}: allocated up to the segment size"
        );
        assert!(records_end(&bytes) < 16 << 10, "{what}");
        drop(store);
        let store = env.open(config).unwrap();
        assert_eq!(store.load().await.unwrap().records.len(), 30, "{what}");
    }
}

/// Opening maps the segments, and only the mostly live ones are still mapped once
/// `open` returns (`WalConfig::map_segments`): the values of the others were copied out,
/// and `WalStats::mapped_segments` counts those left. A value left pointing into a mostly
/// dead segment's mapping would keep the whole segment resident for it.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn only_mostly_live_segments_stay_mapped_after_open() {
    let env = Env::fs();
    let config = WalConfig {
        segment_size: 64 << 10,
        ..WalConfig::default()
    };
    let store = env.open(config.clone()).unwrap();
    for id in 0..200u64 {
        store
            .commit(Batch::new().put(id % 50, None, vec![id as u8; 1000]))
            .await
            .unwrap();
    }
    store.close().await.unwrap();
    drop(store);
    let segments = env.segments();
    assert!(segments.len() >= 2, "{segments:?}");
    let store = env.open(config).unwrap();
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded.records.len(), 50);
    for record in &loaded.records {
        let last = (150..200u64).find(|id| id % 50 == record.id).unwrap();
        assert_eq!(record.value, vec![last as u8; 1000]);
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mapped = |segment: &std::path::PathBuf| {
        let name = segment.file_name().unwrap().to_str().unwrap();
        maps.lines()
            .any(|line| line.ends_with(name) && line.contains(env.dir.to_str().unwrap()))
    };
    // The first segments hold only values put again later; the last, the last 50.
    assert!(
        !mapped(&segments[0]),
        "a dead segment is still mapped:\n{maps}"
    );
    assert!(
        mapped(segments.last().unwrap()),
        "the live segment was copied:\n{maps}"
    );
    let count = segments.iter().filter(|segment| mapped(segment)).count();
    assert_eq!(count, store.stats().mapped_segments, "{maps}");
}

/// A segment whose first mebibytes hold only values put again later keeps its live
/// part mapped and lets the dead part go: its values read back whole, the store counts
/// it as mapped, and the mapping's resident size is about its live part, not the
/// segment's (`WalConfig::map_segments`; windows in `wal/arena.rs`).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_segment_mapped_after_open_keeps_only_its_live_windows_resident() {
    let env = Env::fs();
    let config = WalConfig {
        segment_size: 64 << 20,
        ..WalConfig::default()
    };
    let store = env.open(config.clone()).unwrap();
    // Three passes over 1,000 procedures of 1,000 bytes: the first two are dead.
    for pass in 0..3u64 {
        for id in 0..1000u64 {
            let value = vec![(id + pass) as u8; 1000];
            store
                .commit(Batch::new().put(id, None, value))
                .await
                .unwrap();
        }
    }
    store.close().await.unwrap();
    drop(store);
    let segments = env.segments();
    assert_eq!(segments.len(), 1, "{segments:?}");
    let store = env.open(config).unwrap();
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded.records.len(), 1000);
    for record in &loaded.records {
        assert_eq!(record.value, vec![(record.id + 2) as u8; 1000]);
    }
    assert_eq!(
        store.stats().mapped_segments,
        1,
        "its live part stays mapped"
    );
    let name = segments[0].file_name().unwrap().to_str().unwrap();
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut lines = smaps.lines().skip_while(|line| !line.ends_with(name));
    let resident_kb: u64 = lines
        .find_map(|line| line.strip_prefix("Rss:"))
        .and_then(|rss| rss.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("the segment is mapped");
    let file_kb = std::fs::metadata(&segments[0]).unwrap().len() >> 10;
    // The live values take about 1 MB, in at most two windows of 1 MiB.
    assert!(
        resident_kb <= 2048,
        "{resident_kb} kB of the {file_kb} kB segment resident"
    );
}
