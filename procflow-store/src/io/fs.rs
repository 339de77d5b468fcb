//! [`FsBackend`]: the real file system.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{DirLock, IoBackend, LogFile};

/// The name of the lock file inside a store directory.
const LOCK_FILE: &str = "LOCK";

/// [`IoBackend`] on the real file system: `fdatasync` for files, `fsync` of the directory
/// for names, an advisory `flock` on `<dir>/LOCK` for the directory lock.
#[derive(Clone, Copy, Debug, Default)]
pub struct FsBackend;

fn options() -> OpenOptions {
    let mut options = OpenOptions::new();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
}

impl IoBackend for FsBackend {
    fn create_dir_all(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        // One level at a time, outermost first, to learn which ones are new.
        let missing: Vec<&Path> = dir
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && fs::metadata(a).is_err())
            .collect();
        let mut builder = fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        let mut created = Vec::new();
        for new in missing.into_iter().rev() {
            match builder.create(new) {
                Ok(()) => created.push(new.to_path_buf()),
                // Someone else made it meanwhile: theirs to make durable.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && new.is_dir() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(created)
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<Option<DirLock>> {
        let file = options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))?;
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => Ok(Some(Box::new(file))),
            Err(fs4::TryLockError::WouldBlock) => Ok(None),
            Err(fs4::TryLockError::Error(e)) => Err(e),
        }
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn read_file_into(&self, path: &Path, buf: &mut Vec<u8>) -> io::Result<()> {
        let mut file = File::open(path)?;
        buf.clear();
        file.read_to_end(buf)?;
        Ok(())
    }

    #[allow(unsafe_code)]
    fn map_file(&self, path: &Path) -> io::Result<Option<bytes::Bytes>> {
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            // Nothing to map (and a zero-length mapping is an error).
            return Ok(Some(bytes::Bytes::new()));
        }
        // SAFETY: the mapping is read-only and shared: it stays valid while the file is
        // changed, but reading past the file's end after it was cut shorter raises
        // `SIGBUS`. The WAL maps segments only while it holds the directory's lock, so no
        // other procflow process writes them, and it reads only up to the length it
        // truncates a torn tail to (`map_file`'s contract).
        let map = unsafe { memmap2::MmapOptions::new().map(&file)? };
        read_ahead(file);
        Ok(Some(bytes::Bytes::from_owner(map)))
    }

    fn create_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        let file = options().write(true).create_new(true).open(path)?;
        FsFile::shared(file)
    }

    fn open_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        FsFile::shared(OpenOptions::new().write(true).open(path)?)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// How much of the file one read of [`read_ahead`] takes: the kernel's readahead, not
/// this, sets the size of the disk's reads.
const READ_AHEAD_CHUNK: usize = 64 * 1024;

/// Has a thread of its own read `file` through, in order, so that the disk reads it into
/// the page cache while the caller decodes the mapping's first pages.
///
/// Why a thread: a `WILLNEED` hint for the whole mapping, what this replaces, has Linux
/// read one readahead window of it (8 MiB of a 41 MiB segment on the bench's disk); the
/// rest came in fault by fault, the decoding waiting for each window, so that a cold
/// open took the read's time and the decoding's one after the other. Hints a window
/// long each read it all but wait for their requests to be queued, as long as the read
/// (75 ms for that segment), so not on the caller's thread. On the bench's log of
/// 50,000 procedures the cold open went from 0.069–0.071 s to 0.052–0.058 s, the
/// decoding now waiting only where it overtakes the disk (issue 33). If the thread
/// cannot start, faults read the file as they come, as before.
fn read_ahead(mut file: File) {
    let read = move || {
        let mut chunk = vec![0; READ_AHEAD_CHUNK];
        while matches!(file.read(&mut chunk), Ok(n) if n > 0) {}
    };
    let _ = std::thread::Builder::new()
        .name("procflow-read-ahead".into())
        .spawn(read);
}

/// What [`LogFile::reserve`] writes ahead of a segment's records, a megabyte at a time.
///
/// Why zeros written, not space allocated with `fallocate`: ext4 (and XFS) mark
/// `fallocate`d blocks unwritten, so every `fdatasync` after a group's write into them
/// had to convert those blocks to written: a change to the file's extent tree that the
/// sync also writes to the disk (through the journal, on a file system that has one).
/// Blocks holding written zeros are overwritten in place, and the sync writes the data
/// alone. On this project's VM the durable WAL under the executor ran 1.31–1.40 times as
/// fast at 16 procedures and 1.66–1.82 at 64 (docs/BENCHMARKS.md, "Issue 33 in stop
/// 54"). A reader sees the same bytes either way: zeros past the last record, which
/// recovery reads as the end. The cost: the log's space is written twice, zeros first.
///
/// Zero-initialized, so it takes no space in the binary and reading it maps the kernel's
/// zero page.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// A file written at its end, which it tracks itself: not opened for appending
/// (`O_APPEND`), which writes at the file's length and so past reserved space.
struct FsFile {
    file: File,
    /// Where the next append goes. Appends come one at a time from the store's writer;
    /// the lock only makes sharing the file with the syncer safe.
    end: Mutex<u64>,
}

impl FsFile {
    fn shared(file: File) -> io::Result<Arc<dyn LogFile>> {
        let end = Mutex::new(file.metadata()?.len());
        Ok(Arc::new(FsFile { file, end }))
    }

    fn end(&self) -> MutexGuard<'_, u64> {
        self.end.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl LogFile for FsFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        let mut end = self.end();
        write_all_at(&self.file, buf, *end)?;
        *end += buf.len() as u64;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        let mut end = self.end();
        self.file.set_len(len)?;
        *end = len;
        Ok(())
    }

    /// Writes zeros from the file's end up to `len`, rather than `fallocate`: see
    /// [`ZEROS`].
    fn reserve(&self, len: u64) -> io::Result<()> {
        let mut at = self.file.metadata()?.len();
        while at < len {
            let n = usize::try_from(len - at).map_or(ZEROS.len(), |n| n.min(ZEROS.len()));
            write_all_at(&self.file, &ZEROS[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }
}

#[cfg(unix)]
fn write_all_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
}

#[cfg(not(unix))]
fn write_all_at(mut file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(buf)
}
