//! The files of compacted segments: deleted only once the records that carry their live
//! changes forward are durable, after the log's lock is let go (stop 75), oldest first.
//! A crash before the deletion leaves the segment in place, and the store reopens to
//! what it acknowledged; a failed deletion poisons the store, as it did under the lock.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::wrapping::WrapFiles;
use procflow_store::io::{IoBackend, SimBackend};
use procflow_store::{Batch, Loaded, Store, StoreError, SyncMode, WalConfig, WalStore};

const DIR: &str = "/store";

/// Segments of 4 KiB on the simulated disk, durable: a few commits roll and compact.
fn config(caller_writes: bool) -> WalConfig {
    WalConfig {
        segment_size: 4096,
        sync: SyncMode::Durable,
        caller_writes,
        ..WalConfig::default()
    }
}

/// Twenty values that never change, then puts of 1,000 bytes to one procedure until
/// `done` says so (or 300 commits); the state after each commit, acknowledged.
async fn churn(store: &WalStore, done: impl Fn() -> bool) -> Result<Vec<Loaded>, StoreError> {
    let mut acked = Vec::new();
    for id in 10..30 {
        store
            .commit(Batch::new().put(id, None, vec![id as u8; 100]))
            .await?;
        acked.push(store.load().await?);
    }
    for n in 0..300u32 {
        if done() {
            break;
        }
        store
            .commit(Batch::new().put(1, None, vec![n as u8; 1000]))
            .await?;
        acked.push(store.load().await?);
    }
    Ok(acked)
}

fn segment_files(backend: &dyn IoBackend) -> Vec<String> {
    let mut names: Vec<String> = backend
        .list_dir(Path::new(DIR))
        .unwrap()
        .into_iter()
        .filter(|name| name.starts_with("segment-") && name.ends_with(".wal"))
        .collect();
    names.sort();
    names
}

/// Power fails as the first compacted segment's file is deleted: just before (the
/// compaction's records are durable, the segment is out of the log's list, its file is
/// still on the disk), or just after. The store reopens from that disk to a state it
/// acknowledged, with every idle value: before, reading the old segment like any
/// other; after, from the compaction's records, which had to be durable first.
#[tokio::test]
async fn a_crash_before_a_compacted_segment_is_deleted_reopens_to_what_was_acknowledged() {
    for (caller_writes, after) in [(false, false), (true, false), (false, true), (true, true)] {
        let sim = SimBackend::new();
        let image: Arc<Mutex<Option<(PathBuf, SimBackend)>>> = Arc::default();
        let on_remove = {
            let (sim, image) = (sim.clone(), image.clone());
            Arc::new(move |path: &Path| {
                let mut image = image.lock().unwrap();
                if image.is_none() {
                    if after {
                        // The store's own removal then finds it gone, as when a close
                        // deleted it first.
                        sim.remove_file(path)?;
                        sim.sync_dir(Path::new(DIR))?;
                    }
                    *image = Some((path.to_path_buf(), sim.crash_image()));
                }
                Ok(())
            })
        };
        let backend = WrapFiles::watching_removes(Arc::new(sim.clone()), on_remove);
        let store = WalStore::open_with_backend(DIR, config(caller_writes), backend).unwrap();
        let acked = churn(&store, || image.lock().unwrap().is_some())
            .await
            .unwrap();
        store.close().await.unwrap();
        let (removed, disk) = image
            .lock()
            .unwrap()
            .take()
            .expect("a segment was compacted");
        let name = removed.file_name().unwrap().to_str().unwrap().to_owned();
        assert_eq!(
            segment_files(&disk).contains(&name),
            !after,
            "caller_writes {caller_writes}: the crash came before {name} was deleted, or after"
        );
        let reopened = WalStore::open_with_backend(DIR, config(caller_writes), Arc::new(disk))
            .expect("reopens with the compacted segment still there");
        let state = reopened.load().await.unwrap();
        assert!(
            acked.contains(&state),
            "caller_writes {caller_writes}, after {after}: reopened to a state never acknowledged"
        );
        for id in 10..30 {
            let record = reopened.get(id).await.unwrap().expect("an idle value");
            assert_eq!(record.value, vec![id as u8; 100]);
        }
    }
}

/// Every compacted segment's file is gone once the store is closed, and what is left
/// on the disk is what the store counts.
#[tokio::test]
async fn a_closed_store_keeps_no_compacted_segment_file() {
    for caller_writes in [false, true] {
        let sim = SimBackend::new();
        let removed: Arc<Mutex<Vec<PathBuf>>> = Arc::default();
        let on_remove = {
            let removed = removed.clone();
            Arc::new(move |path: &Path| {
                removed.lock().unwrap().push(path.to_path_buf());
                Ok(())
            })
        };
        let backend = WrapFiles::watching_removes(Arc::new(sim.clone()), on_remove);
        let store = WalStore::open_with_backend(DIR, config(caller_writes), backend).unwrap();
        churn(&store, || removed.lock().unwrap().len() >= 3)
            .await
            .unwrap();
        let disk_bytes = store.stats().disk_bytes;
        store.close().await.unwrap();
        let removed = removed.lock().unwrap().clone();
        assert!(
            removed.len() >= 3,
            "caller_writes {caller_writes}: {removed:?}"
        );
        assert!(
            removed.windows(2).all(|pair| pair[0] < pair[1]),
            "oldest first: {removed:?}"
        );
        let files = segment_files(&sim);
        for path in &removed {
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(!files.iter().any(|f| f == name), "{name} is still there");
        }
        let on_disk: u64 = files
            .iter()
            .map(|name| sim.file(&Path::new(DIR).join(name)).unwrap().len() as u64)
            .sum();
        assert!(
            on_disk <= disk_bytes,
            "caller_writes {caller_writes}: {on_disk} bytes on the disk, {disk_bytes} counted"
        );
    }
}

/// A deletion that fails poisons the store, which then refuses commits; the disk
/// still reopens to what was acknowledged.
#[tokio::test]
async fn a_failed_deletion_poisons_the_store_and_loses_nothing() {
    for caller_writes in [false, true] {
        let sim = SimBackend::new();
        let on_remove = Arc::new(|_: &Path| Err(std::io::Error::other("the disk said no")));
        let backend = WrapFiles::watching_removes(Arc::new(sim.clone()), on_remove);
        let store = WalStore::open_with_backend(DIR, config(caller_writes), backend).unwrap();
        let mut acked = Vec::new();
        let mut refused = None;
        for n in 0..300u32 {
            let batch = Batch::new().put(1 + u64::from(n % 30), None, vec![n as u8; 300]);
            match store.commit(batch).await {
                Ok(()) => acked.push(store.load().await.unwrap()),
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let refused = refused.expect("a compaction's deletion failed");
        assert!(
            matches!(refused, StoreError::Poisoned | StoreError::Io { .. }),
            "caller_writes {caller_writes}: {refused}"
        );
        assert!(matches!(
            store.commit(Batch::new().put(99, None, vec![])).await,
            Err(StoreError::Poisoned | StoreError::Io { .. })
        ));
        drop(store);
        let reopened =
            WalStore::open_with_backend(DIR, config(caller_writes), Arc::new(sim.restart_image()))
                .unwrap();
        let state = reopened.load().await.unwrap();
        assert_eq!(Some(&state), acked.last(), "caller_writes {caller_writes}");
    }
}
