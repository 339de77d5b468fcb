//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod contract;
pub mod wrapping;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use procflow_store::io::{FsBackend, IoBackend, SimBackend};
use procflow_store::{Batch, Loaded, MemStore, Store, StoreError, WalConfig, WalStore};

/// Where a store scenario runs: the real file system or the in-memory backend.
pub struct Env {
    pub name: &'static str,
    pub dir: PathBuf,
    pub backend: Arc<dyn IoBackend>,
    sim: Option<SimBackend>,
    _tempdir: Option<tempfile::TempDir>,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Env {
    pub fn fs() -> Env {
        let tempdir = tempfile::tempdir().unwrap();
        Env {
            name: "fs",
            dir: tempdir.path().join("store"),
            backend: Arc::new(FsBackend),
            sim: None,
            _tempdir: Some(tempdir),
        }
    }

    pub fn sim() -> Env {
        Self::on_sim(SimBackend::new())
    }

    pub fn on_sim(sim: SimBackend) -> Env {
        Env {
            name: "sim",
            dir: PathBuf::from("/store"),
            backend: Arc::new(sim.clone()),
            sim: Some(sim),
            _tempdir: None,
        }
    }

    /// Both kinds.
    pub fn all() -> [Env; 2] {
        [Env::fs(), Env::sim()]
    }

    pub fn sim_backend(&self) -> &SimBackend {
        self.sim.as_ref().expect("not a sim env")
    }

    /// A fresh subdirectory name, for tests that need several stores in one env.
    pub fn fresh_dir(&self) -> PathBuf {
        self.dir
            .join(format!("s{}", NEXT.fetch_add(1, Ordering::Relaxed)))
    }

    pub fn open(&self, config: WalConfig) -> Result<WalStore, StoreError> {
        self.open_at(&self.dir, config)
    }

    pub fn open_at(&self, dir: &Path, config: WalConfig) -> Result<WalStore, StoreError> {
        WalStore::open_with_backend(dir, config, self.backend.clone())
    }

    pub fn read(&self, path: &Path) -> Vec<u8> {
        self.backend.read_file(path).unwrap()
    }

    pub fn write(&self, path: &Path, bytes: &[u8]) {
        match &self.sim {
            Some(sim) => sim.set_file(path, bytes.to_vec()).unwrap(),
            None => std::fs::write(path, bytes).unwrap(),
        }
    }

    /// Creates (or replaces) `path` with `bytes`.
    pub fn put_file(&self, path: &Path, bytes: &[u8]) {
        self.backend.create_dir_all(path.parent().unwrap()).unwrap();
        let _ = self.backend.remove_file(path);
        self.backend
            .create_file(path)
            .unwrap()
            .append(bytes)
            .unwrap();
    }

    /// Segment files in the store directory, oldest first.
    pub fn segments(&self) -> Vec<PathBuf> {
        let mut names: Vec<String> = self
            .backend
            .list_dir(&self.dir)
            .unwrap()
            .into_iter()
            .filter(|n| n.starts_with("segment-") && n.ends_with(".wal"))
            .collect();
        names.sort();
        names.into_iter().map(|n| self.dir.join(n)).collect()
    }
}

/// A config with small segments; durable on the simulated backend, where syncs are free.
pub fn small_segments(env: &Env, segment_size: u64) -> WalConfig {
    WalConfig {
        segment_size,
        sync: if env.name == "sim" {
            procflow_store::SyncMode::Durable
        } else {
            procflow_store::SyncMode::NoSync
        },
        ..WalConfig::default()
    }
}

/// A deterministic workload touching every kind of op: puts with parents, finishes,
/// deletes, metadata and fencing tokens. Every batch is valid when applied in order.
pub fn workload(batches: usize, value_len: usize) -> Vec<Batch> {
    let value = |i: usize| vec![i as u8; value_len];
    (0..batches)
        .map(|i| {
            let id = i as u64;
            let batch = match i % 5 {
                0 => Batch::new()
                    .put(id, id.checked_sub(5), value(i))
                    .put_meta("hwm", id.to_le_bytes().to_vec()),
                1 => Batch::new().put(id - 1, None, value(i)),
                2 => Batch::new().finish(id - 2, value(i)).delete_meta("gone"),
                3 => Batch::new().delete(id - 3).put_meta("gone", vec![1]),
                _ => Batch::new()
                    .put(id, None, value(i))
                    .put(id + 1_000_000, Some(id), value(i)),
            };
            if i % 3 == 0 {
                batch.with_fencing_token(id)
            } else {
                batch
            }
        })
        .collect()
}

/// The state after each prefix of `batches`: element `k` is the state after `k` batches.
pub async fn prefix_states(batches: &[Batch]) -> Vec<Loaded> {
    let mem = MemStore::new();
    let mut states = vec![mem.load().await.unwrap()];
    for batch in batches {
        mem.commit(batch.clone()).await.unwrap();
        states.push(mem.load().await.unwrap());
    }
    states
}

/// The `read_only` tests of the shared stores: commits a parent, a child that ends and a
/// metadata entry to `store`, reads them with `read_only`, and checks that it read what
/// `load` reads; then commits a third record and checks that `read_only` sees it (it took
/// no lock the store's writes wait for).
pub async fn reads_what_load_reads<F: Future<Output = Result<Loaded, StoreError>>>(
    store: &dyn Store,
    read_only: impl Fn() -> F,
) {
    let batch = Batch::new()
        .put(1, None, b"parent".to_vec())
        .put(2, Some(1), b"child".to_vec())
        .put_meta("graph/m", b"g".to_vec());
    store.commit(batch).await.unwrap();
    let finish = Batch::new().finish(2, b"child, ended".to_vec());
    store.commit(finish).await.unwrap();

    let read = read_only().await.unwrap();
    let loaded = store.load().await.unwrap();
    let key = |r: &procflow_store::Record| (r.id, r.parent, r.finished, r.value.to_vec());
    let records = |l: &Loaded| l.records.iter().map(key).collect::<Vec<_>>();
    assert_eq!(records(&read), records(&loaded));
    assert_eq!(read.records.len(), 2);
    assert!(read.records[1].finished);
    assert_eq!(read.meta, loaded.meta);
    assert_eq!(read.meta["graph/m"], b"g");
    store
        .commit(Batch::new().put(3, None, vec![]))
        .await
        .unwrap();
    assert_eq!(read_only().await.unwrap().records.len(), 3);
}

/// After a crash at sync `n`: every acknowledged id of a workload whose batches each put
/// `id` and `id + 1_000_000` is among the `found` ids, and no batch is there in part.
pub fn assert_acked_and_whole<'a>(
    found: &std::collections::BTreeSet<u64>,
    acked: impl IntoIterator<Item = &'a u64>,
    n: u64,
) {
    for id in acked {
        assert!(
            found.contains(id),
            "crash at sync {n}: acknowledged {id} lost"
        );
    }
    for id in found.iter().filter(|&&id| id < 1_000_000) {
        assert!(
            found.contains(&(id + 1_000_000)),
            "crash at sync {n}: half a batch"
        );
    }
    assert_eq!(found.len() % 2, 0, "crash at sync {n}: half a batch");
}
