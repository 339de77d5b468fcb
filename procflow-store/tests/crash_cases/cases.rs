// The crash cases of `crash.rs` (committer thread writes) and `crash_caller_writes.rs`
// (each commit writes its own record), included by both with `CALLER_WRITES` set.

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{Env, prefix_states, workload};
use procflow_store::io::{FaultBackend, IoBackend, SimBackend};
use procflow_store::{Batch, CommitSlot, Loaded, Store, StoreError, SyncMode, WalConfig, WalStore};

fn config() -> WalConfig {
    // Small segments, so crashes also hit segment rolls and compaction.
    WalConfig {
        segment_size: 1024,
        sync: SyncMode::Durable,
        caller_writes: CALLER_WRITES,
        ..WalConfig::default()
    }
}

/// Commits `batches` in order until one fails; returns how many were acknowledged.
async fn run(store: &WalStore, batches: &[Batch]) -> usize {
    for (i, batch) in batches.iter().enumerate() {
        if store.commit(batch.clone()).await.is_err() {
            return i;
        }
    }
    store.close().await.ok();
    batches.len()
}

/// The reopened state must be the state after every acknowledged batch, plus at most the
/// one batch in flight — never a part of a batch.
fn assert_prefix(states: &[Loaded], acked: usize, loaded: &Loaded, what: &str) -> usize {
    (acked..=(acked + 1).min(states.len() - 1))
        .find(|&k| states[k] == *loaded)
        .unwrap_or_else(|| {
            panic!(
                "{what}: state is not the one after {acked} or {} batches",
                acked + 1
            )
        })
}

/// After recovery the store accepts the rest of the workload and ends in the same state.
async fn finish_workload(store: WalStore, batches: &[Batch], applied: usize, states: &[Loaded]) {
    for batch in &batches[applied..] {
        store.commit(batch.clone()).await.unwrap();
    }
    assert_eq!(&store.load().await.unwrap(), states.last().unwrap());
}

#[tokio::test]
async fn every_crash_point_keeps_acknowledged_commits() {
    let batches = workload(30, 100);
    let states = prefix_states(&batches).await;

    let counting = Env::sim();
    let acked = run(&counting.open(config()).unwrap(), &batches).await;
    assert_eq!(acked, batches.len());
    let syncs = counting.sim_backend().sync_count();
    assert!(syncs > batches.len() as u64, "only {syncs} syncs");
    // The workload rolled segments and compaction deleted the first one.
    let first = counting.segments()[0].clone();
    assert!(
        !first.ends_with("segment-0000000000000001.wal"),
        "{}",
        first.display()
    );

    for n in 1..=syncs {
        let env = Env::on_sim(SimBackend::crash_at_sync(n));
        let acked = match env.open(config()) {
            Ok(store) => run(&store, &batches).await,
            Err(_) => 0,
        };
        assert!(env.sim_backend().has_crashed(), "sync {n} never happened");
        let image = Env::on_sim(env.sim_backend().crash_image());
        let store = image
            .open(config())
            .unwrap_or_else(|e| panic!("crash at sync {n}: reopen failed: {e}"));
        let loaded = store.load().await.unwrap();
        let applied = assert_prefix(&states, acked, &loaded, &format!("crash at sync {n}"));
        finish_workload(store, &batches, applied, &states).await;
    }
}

/// Issue 33: compaction rewrites a segment's live data as several records written one
/// after the other and synced once. Power fails at every sync of a workload that rolls
/// and compacts, the disk having written back all but one page of what was written since
/// each file's last sync, for each such page in turn: a compaction's records come back
/// with a hole, later ones intact after it. The store reopens to an acknowledged state
/// every time and finishes the workload.
#[tokio::test]
async fn compaction_records_with_holes_are_a_torn_tail() {
    const PAGE: usize = 64;
    let batches = workload(30, 100);
    let states = prefix_states(&batches).await;
    let counting = Env::sim();
    run(&counting.open(config()).unwrap(), &batches).await;
    let syncs = counting.sim_backend().sync_count();
    let (mut holed, mut compacting) = (0, 0);
    for n in 1..=syncs {
        // Segments of 1 KiB, allocated ahead up to their size: 16 pages hold any record.
        for lost in 0..(2 * 1024 / PAGE) {
            let env = Env::on_sim(SimBackend::crash_at_sync(n));
            let acked = match env.open(config()) {
                Ok(store) => run(&store, &batches).await,
                Err(_) => 0,
            };
            let sim = env.sim_backend();
            let clean = sim.crash_image();
            let image = sim.crash_image_with_pages(PAGE, |_, page| page != lost);
            if env_files(&clean) != env_files(&image) {
                holed += 1;
                compacting += usize::from(compaction_pending(sim, &clean));
            }
            let what = format!("crash at sync {n}, page {lost} lost");
            let store = Env::on_sim(image)
                .open(config())
                .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
            let loaded = store.load().await.unwrap();
            let applied = assert_prefix(&states, acked, &loaded, &what);
            finish_workload(store, &batches, applied, &states).await;
        }
    }
    assert!(holed > 0, "no image had pages written back");
    assert!(compacting > 0, "no hole in a compaction's records");
}

/// Whether `sim` lost, in the crash that left `durable`, the start of a compaction
/// record (its marker, then its kind): bytes that were written but not synced. (The
/// durable file can be the longer one: space is allocated ahead, as zeros.)
fn compaction_pending(sim: &SimBackend, durable: &SimBackend) -> bool {
    let dir = std::path::Path::new("/store");
    // The crashed backend lists nothing any more; the image lists what it kept.
    let names = durable.list_dir(dir).unwrap_or_default();
    names.iter().any(|name| {
        let live = sim.file(&dir.join(name)).unwrap_or_default();
        let kept = durable.file(&dir.join(name)).unwrap_or_default();
        live.windows(2)
            .enumerate()
            .any(|(at, w)| w == [0xB7, 2] && kept.get(at..at + 2) != Some(w))
    })
}

/// The contents of every file of `sim`'s store.
fn env_files(sim: &SimBackend) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new("/store");
    // An image of a crash before the directory was durable has none.
    let mut names = sim.list_dir(dir).unwrap_or_default();
    names.sort();
    names
        .iter()
        .filter_map(|name| sim.file(&dir.join(name)))
        .collect()
}

/// Half the writers commit with `commit`, half with `commit_in` and a slot each (as the
/// executor's procedures do), so that commits queued with slots are among those a crash
/// cuts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_survive_crashes() {
    const WRITERS: u64 = 8;
    const PER_WRITER: u64 = 6;
    // The acknowledged ids, and how many commits the slots answered.
    let workload = |store: Arc<WalStore>| async move {
        // Each round's commits start together, so that they overlap and queue.
        let start = Arc::new(tokio::sync::Barrier::new(WRITERS as usize));
        let tasks: Vec<_> = (0..WRITERS)
            .map(|w| {
                let store = store.clone();
                let start = start.clone();
                tokio::spawn(async move {
                    let slot = (w % 2 == 1).then(|| Arc::new(CommitSlot::new()));
                    let mut acked = Vec::new();
                    let mut in_slot = 0;
                    let mut failed = false;
                    for i in 0..PER_WRITER {
                        // A writer whose commit failed still meets the others here.
                        start.wait().await;
                        if failed {
                            continue;
                        }
                        let id = w * 100 + i;
                        let batch = slot.as_ref().map_or_else(Batch::new, |s| s.batch());
                        // An op list handed back: the last commit was queued with the slot.
                        in_slot += usize::from(batch.ops.capacity() > 0);
                        let batch = batch.put(id, None, vec![w as u8; 50]).put(
                            id + 1_000_000,
                            Some(id),
                            vec![i as u8; 50],
                        );
                        let committed = match &slot {
                            Some(slot) => store.commit_in(batch, slot).await,
                            None => store.commit(batch).await,
                        };
                        if committed.is_err() {
                            failed = true;
                            continue;
                        }
                        acked.push(id);
                    }
                    (acked, in_slot)
                })
            })
            .collect();
        let mut acked = BTreeSet::new();
        let mut in_slot = 0;
        for task in tasks {
            let (ids, slotted) = task.await.unwrap();
            acked.extend(ids);
            in_slot += slotted;
        }
        (acked, in_slot)
    };
    // Syncs that take a while: a commit served inline holds its thread through one, and
    // the commits of the other thread meanwhile queue.
    let slow = |sim: &SimBackend| sim.set_sync_delay(std::time::Duration::from_micros(300));
    let counting = Env::sim();
    slow(counting.sim_backend());
    let (_, mut in_slot) = workload(Arc::new(counting.open(config()).unwrap())).await;
    let syncs = counting.sim_backend().sync_count();
    // Concurrency makes the sync count vary between runs; crash at each count seen once.
    for n in 1..=syncs {
        let env = Env::on_sim(SimBackend::crash_at_sync(n));
        slow(env.sim_backend());
        let acked = match env.open(config()) {
            Ok(store) => {
                let (acked, slotted) = workload(Arc::new(store)).await;
                in_slot += slotted;
                acked
            }
            Err(_) => BTreeSet::new(),
        };
        let image = Env::on_sim(env.sim_backend().crash_image());
        let store = image.open(config()).unwrap();
        let ids: BTreeSet<u64> = store.list().await.unwrap().iter().map(|r| r.id).collect();
        common::assert_acked_and_whole(&ids, &acked, n);
    }
    // Commits that write their own records have no answer to put in a slot.
    assert!(
        CALLER_WRITES || in_slot > 0,
        "no commit was queued with its slot in any run"
    );
}

#[tokio::test]
async fn every_failed_write_or_sync_poisons_and_loses_nothing_acknowledged() {
    let batches = workload(25, 100);
    let states = prefix_states(&batches).await;
    let dir = std::path::Path::new("/store");

    let counting = FaultBackend::new(Arc::new(SimBackend::new()), u64::MAX);
    let store = WalStore::open_with_backend(dir, config(), Arc::new(counting.clone())).unwrap();
    assert_eq!(run(&store, &batches).await, batches.len());
    let operations = counting.operations();

    for n in 1..=operations {
        let sim = SimBackend::new();
        let faulty = FaultBackend::new(Arc::new(sim.clone()), n);
        let acked = match WalStore::open_with_backend(dir, config(), Arc::new(faulty)) {
            Ok(store) => {
                let acked = run(&store, &batches).await;
                if acked < batches.len() {
                    let err = store.commit(Batch::new().delete(0)).await.unwrap_err();
                    assert!(matches!(err, StoreError::Poisoned), "fault {n}: {err}");
                }
                acked
            }
            Err(e) => {
                assert!(matches!(e, StoreError::Io { .. }), "fault {n}: {e}");
                0
            }
        };
        for (image, what) in [
            (sim.restart_image(), "restart"),
            (sim.crash_image(), "crash"),
        ] {
            let env = Env::on_sim(image);
            let store = env
                .open(config())
                .unwrap_or_else(|e| panic!("fault {n}, {what}: reopen failed: {e}"));
            let loaded = store.load().await.unwrap();
            let what = format!("fault {n}, {what}");
            let applied = assert_prefix(&states, acked, &loaded, &what);
            finish_workload(store, &batches, applied, &states).await;
        }
    }
}

#[tokio::test]
async fn a_failed_fsync_is_reported_to_the_committer() {
    let sim = SimBackend::new();
    let dir = std::path::Path::new("/store");
    // Count the syncs of opening, then fail the first group-commit sync after it.
    let counting = FaultBackend::new(Arc::new(sim.clone()), u64::MAX);
    drop(WalStore::open_with_backend(dir, config(), Arc::new(counting.clone())).unwrap());
    let opened = counting.operations();

    let sim = SimBackend::new();
    // Operation opened+1 allocates the segment's space ahead, opened+2 is the append,
    // opened+3 its sync.
    let faulty = FaultBackend::new(Arc::new(sim.clone()), opened + 3);
    let store = WalStore::open_with_backend(dir, config(), Arc::new(faulty)).unwrap();
    let err = store
        .commit(Batch::new().put(1, None, vec![1]))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert!(err.to_string().contains("syncing a segment"), "{err}");
    let err = store
        .commit(Batch::new().put(2, None, vec![2]))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Poisoned), "{err}");
    drop(store);
    let store = Env::on_sim(sim.restart_image()).open(config()).unwrap();
    store
        .commit(Batch::new().put(3, None, vec![3]))
        .await
        .unwrap();
}

/// Allocating a segment's space ahead is a hint: when it fails (a full disk) the commit
/// goes on, and the store stops asking.
#[tokio::test]
async fn a_failed_allocation_ahead_is_not_an_error() {
    let dir = std::path::Path::new("/store");
    let counting = FaultBackend::new(Arc::new(SimBackend::new()), u64::MAX);
    drop(WalStore::open_with_backend(dir, config(), Arc::new(counting.clone())).unwrap());
    let opened = counting.operations();

    let sim = SimBackend::new();
    // Operation opened+1 is the first commit's allocation of the segment's space.
    let faulty = FaultBackend::new(Arc::new(sim.clone()), opened + 1);
    let store = WalStore::open_with_backend(dir, config(), Arc::new(faulty.clone())).unwrap();
    for id in 0..20 {
        store
            .commit(Batch::new().put(id, None, vec![1; 100]))
            .await
            .unwrap();
    }
    // Not asked again, also for the segments rolled to since.
    let stats = store.stats();
    assert!(stats.segments > 1, "{stats:?}");
    assert_eq!(stats.ahead_bytes, 0, "{stats:?}");
    drop(store);
    let store = Env::on_sim(sim.crash_image()).open(config()).unwrap();
    assert_eq!(store.load().await.unwrap().records.len(), 20);
}

/// Issue 12, point 15: creating the store directory makes its entry durable in its
/// parent. Without that fsync a power loss takes the new directory, with every
/// acknowledged commit in it, away.
#[tokio::test]
async fn p15_a_new_store_directory_survives_power_loss() {
    let sim = SimBackend::new();
    let dir = std::path::Path::new("/data/new/store");
    let store = WalStore::open_with_backend(dir, config(), Arc::new(sim.clone())).unwrap();
    store
        .commit(Batch::new().put(1, None, b"acked".to_vec()))
        .await
        .unwrap();
    let image = sim.crash_image();
    drop(store);
    let store = WalStore::open_with_backend(dir, config(), Arc::new(image)).unwrap();
    let record = store.get(1).await.unwrap();
    assert_eq!(
        record.map(|r| r.value.to_vec()),
        Some(b"acked".to_vec()),
        "the acknowledged commit was lost with the directory"
    );
}

/// Issue 12, point 15: the parent directory sync is the first sync at open, and its
/// failure fails the open (a store whose directory may vanish is not opened).
#[test]
fn p15_a_failed_parent_directory_sync_fails_the_open() {
    let fault = FaultBackend::new(Arc::new(SimBackend::new()), 1);
    let err = WalStore::open_with_backend("/data/store", config(), Arc::new(fault)).unwrap_err();
    assert!(
        err.to_string().contains("syncing the parent directory"),
        "{err}"
    );
}
