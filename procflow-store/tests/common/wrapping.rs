//! [`WrapFiles`]: a backend whose files are another backend's, wrapped, for tests that
//! watch or hold what a store writes.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use procflow_store::io::{DirLock, IoBackend, LogFile};

/// What a test puts around each file the store creates or opens.
pub type Wrap = Arc<dyn Fn(Arc<dyn LogFile>) -> Arc<dyn LogFile> + Send + Sync>;

/// What a test does before the store removes a file: an error fails the removal.
pub type OnRemove = Arc<dyn Fn(&Path) -> io::Result<()> + Send + Sync>;

/// `inner`'s files through `wrap`, its removals after `on_remove`; everything else is
/// `inner`'s.
pub struct WrapFiles {
    inner: Arc<dyn IoBackend>,
    wrap: Wrap,
    on_remove: Option<OnRemove>,
}

impl WrapFiles {
    pub fn around(inner: Arc<dyn IoBackend>, wrap: Wrap) -> Arc<dyn IoBackend> {
        Arc::new(WrapFiles {
            inner,
            wrap,
            on_remove: None,
        })
    }

    /// `inner`, with `on_remove` called before every removal of a file.
    pub fn watching_removes(inner: Arc<dyn IoBackend>, on_remove: OnRemove) -> Arc<dyn IoBackend> {
        Arc::new(WrapFiles {
            inner,
            wrap: Arc::new(|file| file),
            on_remove: Some(on_remove),
        })
    }
}

impl IoBackend for WrapFiles {
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
    fn create_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        self.inner.create_file(path).map(|f| (self.wrap)(f))
    }
    fn open_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        self.inner.open_file(path).map(|f| (self.wrap)(f))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        if let Some(on_remove) = &self.on_remove {
            on_remove(path)?;
        }
        self.inner.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}
