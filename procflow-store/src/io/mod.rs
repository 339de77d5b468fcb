//! The I/O backend under [`WalStore`](crate::WalStore).
//!
//! Every byte the WAL reads or writes and every fsync goes through an [`IoBackend`], so
//! tests can swap the real filesystem ([`FsBackend`]) for an in-memory one that simulates
//! crashes ([`SimBackend`]) or one that fails the Nth write or sync ([`FaultBackend`]).
//! The procflow runtime can use the same backends to crash-test whole workflows.

mod fault;
mod fs;
mod sim;

use std::any::Any;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use fault::FaultBackend;
pub use fs::FsBackend;
pub use sim::SimBackend;

/// Proof that a store directory is locked; dropping it releases the lock.
pub type DirLock = Box<dyn Any + Send + Sync>;

/// The file system operations the WAL needs.
///
/// Durability contract: data appended to a [`LogFile`] is durable once
/// [`LogFile::sync_data`] returned `Ok`; a created, renamed or removed name is durable
/// once [`IoBackend::sync_dir`] on its directory returned `Ok`. That includes the entry
/// of a directory made by [`IoBackend::create_dir_all`]: it is durable once its parent
/// was synced.
pub trait IoBackend: Send + Sync + 'static {
    /// Creates `dir` and its parents (mode 0700 for new directories where supported).
    /// Returns the directories it created, outermost first, so the caller can sync
    /// their parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// Takes an exclusive lock on `dir`; `Ok(None)` if someone else holds it.
    fn lock_dir(&self, dir: &Path) -> io::Result<Option<DirLock>>;
    /// The names of the files in `dir`.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// The whole content of `path`.
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Replaces the content of `buf` with the whole content of `path`, reusing `buf`'s
    /// memory where it can: the WAL reads every segment at open into one buffer this way,
    /// because filling fresh memory costs a page fault per page. The default calls
    /// [`IoBackend::read_file`].
    fn read_file_into(&self, path: &Path, buf: &mut Vec<u8>) -> io::Result<()> {
        *buf = self.read_file(path)?;
        Ok(())
    }
    /// The whole content of `path`, mapped into memory rather than copied, if the backend
    /// can map files; `Ok(None)` if not (the default), and the caller reads the file.
    ///
    /// The caller must hold the directory's lock ([`IoBackend::lock_dir`]) and read only
    /// bytes within the file's length as long as the mapping lives: a mapped file cut
    /// shorter by someone else makes reading past its new end kill the process (`SIGBUS`).
    fn map_file(&self, path: &Path) -> io::Result<Option<bytes::Bytes>> {
        let _ = path;
        Ok(None)
    }
    /// Says that nothing reads `bytes`, part of a mapping [`IoBackend::map_file`]
    /// returned, any more: the backend may let their pages go from the process's memory
    /// while the rest of the mapping lives on. A read of them afterwards must still
    /// return the file's bytes. The default does nothing.
    ///
    /// The WAL calls it for the parts of a segment it keeps mapped after the open whose
    /// values it copied out (`wal/arena.rs`): they would otherwise stay resident for as
    /// long as the mapping does.
    fn release_mapped(&self, bytes: &[u8]) {
        let _ = bytes;
    }
    /// Creates `path`, which must not exist (mode 0600 where supported), for appending.
    fn create_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>>;
    /// Opens the existing file `path` for appending.
    fn open_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>>;
    /// Renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes `path`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Makes creations, renames and removals in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// A file opened for appending. Shared between writers and the syncer, hence `&self`.
///
/// The *end* of the file is where the next append goes: the file's length when it was
/// opened, then just past the last append. [`LogFile::reserve`] may make the file longer
/// than its end, with zeros past it.
pub trait LogFile: Send + Sync {
    /// Appends all of `buf` at the end of the file.
    fn append(&self, buf: &[u8]) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, leaving the end where it is. Several threads
    /// may write disjoint ranges at once. Only a [`WalStore`](crate::WalStore) opened
    /// with [`WalConfig::caller_writes`](crate::WalConfig::caller_writes) calls it,
    /// always within space [`LogFile::reserve`] allocated or past the file's length. The
    /// default fails with [`io::ErrorKind::Unsupported`], which poisons such a store at
    /// its first commit.
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let _ = (offset, buf);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this backend's files cannot be written at an offset (LogFile::write_at)",
        ))
    }
    /// Makes everything written so far durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Cuts the file to `len` bytes; later appends go after it.
    fn truncate(&self, len: u64) -> io::Result<()>;
    /// Allocates the file's space up to `len` bytes, so that appends up to there need
    /// no allocation and do not change the file's length. The file may become up to
    /// `len` bytes long; the bytes past its end read as zeros until appended over.
    ///
    /// Why: `fdatasync` after an append that grew the file must also write the file's
    /// new length (the inode; on a journaling filesystem, a journal commit); into
    /// allocated space it writes little more than the data. On this project's ext4 that
    /// made a 258-byte append and `fdatasync` about a third faster
    /// (`docs/BENCHMARKS.md`). The WAL reads zeros past a segment's last record as its
    /// end. The file system's backend writes the zeros rather than `fallocate` them, so
    /// that later syncs need not convert unwritten blocks (`fs.rs`, `ZEROS`).
    ///
    /// A hint: the default does nothing, and an error leaves the file as it was or
    /// partly allocated, which appends and recovery handle alike.
    fn reserve(&self, len: u64) -> io::Result<()> {
        let _ = len;
        Ok(())
    }
}
