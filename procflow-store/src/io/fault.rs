//! [`FaultBackend`]: fails the Nth write or sync.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{DirLock, IoBackend, LogFile};

/// An [`IoBackend`] wrapper whose `n`th write or sync (counting appends, truncations,
/// reservations, file syncs and directory syncs together, from 1) fails; all other
/// operations pass through to the inner backend. A failing append first writes half of
/// its buffer, like a short write on a full disk; a failing sync or reservation does
/// nothing.
///
/// Run a workload once with `FaultBackend::new(inner, u64::MAX)` and read
/// [`FaultBackend::operations`] to learn how many faults to inject.
#[derive(Clone)]
pub struct FaultBackend {
    inner: Arc<dyn IoBackend>,
    counter: Arc<Counter>,
}

struct Counter {
    operations: AtomicU64,
    fail_at: u64,
}

impl Counter {
    /// Counts one operation; `true` if it must fail.
    fn tick(&self) -> bool {
        self.operations.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at
    }
}

fn injected() -> io::Error {
    io::Error::other("injected fault")
}

impl FaultBackend {
    /// Wraps `inner`, failing its `fail_at`th write or sync.
    pub fn new(inner: Arc<dyn IoBackend>, fail_at: u64) -> Self {
        FaultBackend {
            inner,
            counter: Arc::new(Counter {
                operations: AtomicU64::new(0),
                fail_at,
            }),
        }
    }

    /// How many writes and syncs were attempted so far.
    pub fn operations(&self) -> u64 {
        self.counter.operations.load(Ordering::SeqCst)
    }

    fn wrap(&self, file: Arc<dyn LogFile>) -> Arc<dyn LogFile> {
        Arc::new(FaultFile {
            inner: file,
            counter: self.counter.clone(),
        })
    }
}

struct FaultFile {
    inner: Arc<dyn LogFile>,
    counter: Arc<Counter>,
}

impl LogFile for FaultFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        if self.counter.tick() {
            self.inner.append(&buf[..buf.len() / 2])?;
            return Err(injected());
        }
        self.inner.append(buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.counter.tick() {
            self.inner.write_at(offset, &buf[..buf.len() / 2])?;
            return Err(injected());
        }
        self.inner.write_at(offset, buf)
    }

    fn sync_data(&self) -> io::Result<()> {
        if self.counter.tick() {
            return Err(injected());
        }
        self.inner.sync_data()
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        if self.counter.tick() {
            return Err(injected());
        }
        self.inner.truncate(len)
    }

    fn reserve(&self, len: u64) -> io::Result<()> {
        if self.counter.tick() {
            return Err(injected());
        }
        self.inner.reserve(len)
    }
}

impl IoBackend for FaultBackend {
    fn create_dir_all(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        self.inner.create_dir_all(dir)
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<Option<DirLock>> {
        self.inner.lock_dir(dir)
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(dir)
    }

    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.inner.read_file(path)
    }

    fn read_file_into(&self, path: &Path, buf: &mut Vec<u8>) -> io::Result<()> {
        self.inner.read_file_into(path, buf)
    }

    fn map_file(&self, path: &Path) -> io::Result<Option<bytes::Bytes>> {
        self.inner.map_file(path)
    }

    fn release_mapped(&self, bytes: &[u8]) {
        self.inner.release_mapped(bytes);
    }

    fn create_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        Ok(self.wrap(self.inner.create_file(path)?))
    }

    fn open_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        Ok(self.wrap(self.inner.open_file(path)?))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        if self.counter.tick() {
            return Err(injected());
        }
        self.inner.sync_dir(dir)
    }
}
