//! Crash consistency (after redb's `tests/crash_consistency.rs`): a workload runs once to
//! count syncs, then for every `n` it runs again on a simulated disk that loses power at
//! sync `n`, and the store is reopened from what was durable. A second family fails the
//! `n`th write or sync instead and checks the store poisons itself and recovers.

mod common;

/// Batches are written by the committer thread (the default).
const CALLER_WRITES: bool = false;

include!("crash_cases/cases.rs");

/// Issue 12, point 14, for the committer thread's one `write` per group (a store whose
/// commits write their own records is covered by `caller_gaps.rs`).
/// Power fails during a group's sync, and the disk had written a
/// later page of the group's one `write` but not the first. The hole is in data never
/// acknowledged, so the store opens with what was acknowledged instead of refusing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p14_a_lost_early_page_of_an_unsynced_group_is_a_torn_tail() {
    let dir = std::path::Path::new("/store");
    let config = WalConfig {
        segment_size: 1 << 20,
        ..config()
    };
    let syncs_at_open = {
        let probe = SimBackend::new();
        drop(WalStore::open_with_backend(dir, config.clone(), Arc::new(probe.clone())).unwrap());
        probe.sync_count()
    };
    // Sync 1 after open is A's group; sync 2, [B1, B2]'s, is lost with the power.
    let sim = SimBackend::crash_at_sync(syncs_at_open + 2);
    let store =
        Arc::new(WalStore::open_with_backend(dir, config.clone(), Arc::new(sim.clone())).unwrap());
    sim.set_sync_delay(std::time::Duration::from_millis(200));
    let commit = |id: u64, len: usize| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .commit(Batch::new().put(id, None, vec![id as u8; len]))
                .await
        })
    };
    let a = commit(1, 10);
    // B1 and B2 queue while A's sync runs, so they form the next group.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (b1, b2) = (commit(2, 5000), commit(3, 5000));
    a.await.unwrap().unwrap();
    assert!(b1.await.unwrap().is_err() && b2.await.unwrap().is_err());
    assert!(sim.has_crashed());

    // The group starts right after A, in page 0; B2 lies wholly in pages 1 and 2.
    let segment = dir.join("segment-0000000000000001.wal");
    let image = sim.crash_image_with_pages(4096, |path, page| !(path == segment && page == 0));
    let holed = image.file(&segment).unwrap();
    // B2's value (5,000 bytes of 3) came back; the page B1 starts in did not.
    let b2_kept = holed.windows(5000).any(|w| w.iter().all(|&b| b == 3));
    assert!(b2_kept, "the later pages were not kept");
    let store = WalStore::open_with_backend(dir, config, Arc::new(image)).unwrap();
    let ids: Vec<u64> = store.list().await.unwrap().iter().map(|r| r.id).collect();
    assert_eq!(ids, [1]);
}
