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
        // truncates a torn tail to (`map_file`'s contract). Values it keeps in the
        // mapping after the open lie in records before that length; the writer appends
        // after them and cuts a segment at close only after its last record.
        let map = Arc::new(unsafe { memmap2::MmapOptions::new().map(&file)? });
        let stop = Arc::default();
        populate_ahead(&map, file, Arc::clone(&stop));
        mappings().register(&map, stop);
        Ok(Some(bytes::Bytes::from_owner(SharedMap(map))))
    }

    #[allow(unsafe_code)]
    fn release_mapped(&self, bytes: &[u8]) {
        let Some((map, at, stop)) = mappings().holding(bytes) else {
            return;
        };
        // Whoever releases part of a mapping has read it: its read-ahead has no more use,
        // and would bring released pages back if it was behind.
        *lock(&stop) = true;
        // SAFETY: `MADV_DONTNEED` on a read-only shared mapping of a file only takes the
        // pages out of this process's page tables: the mapping stays, and a later read
        // faults the same bytes in again from the file. (memmap2 marks the advice unsafe
        // because on a private or anonymous mapping it discards what was written there,
        // and nothing is ever written to this one.) A failure (a kernel that refuses the
        // range) only leaves the pages resident.
        #[cfg(unix)]
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, at, bytes.len())
        };
        #[cfg(not(unix))]
        let _ = (map, at);
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

/// A mapped file, shared by its `Bytes` and, weakly, by the thread that populates it.
struct SharedMap(Arc<memmap2::Mmap>);

impl AsRef<[u8]> for SharedMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// The mappings [`FsBackend::map_file`] made that are still alive, for
/// [`IoBackend::release_mapped`] to find the one some bytes lie in (a `Bytes` does not
/// give back the owner it was made from), each with its read-ahead's stop
/// ([`populate_ahead`]). Held weakly; the dead are dropped as new ones come. A WAL keeps
/// a few mapped at most.
#[derive(Default)]
struct Mappings(Vec<(std::sync::Weak<memmap2::Mmap>, Stop)>);

/// Set to stop a mapping's read-ahead, which populates each window under its lock.
type Stop = Arc<Mutex<bool>>;

impl Mappings {
    fn register(&mut self, map: &Arc<memmap2::Mmap>, stop: Stop) {
        self.0.retain(|(map, _)| map.strong_count() > 0);
        self.0.push((Arc::downgrade(map), stop));
    }

    /// The live mapping `bytes` lie in, their offset in it, and its read-ahead's stop.
    fn holding(&self, bytes: &[u8]) -> Option<(Arc<memmap2::Mmap>, usize, Stop)> {
        let start = bytes.as_ptr() as usize;
        self.0.iter().find_map(|(map, stop)| {
            let map = map.upgrade()?;
            let at = start.checked_sub(map.as_ptr() as usize)?;
            (at + bytes.len() <= map.len()).then(|| (map, at, Arc::clone(stop)))
        })
    }
}

fn mappings() -> MutexGuard<'static, Mappings> {
    static MAPPINGS: Mutex<Mappings> = Mutex::new(Mappings(Vec::new()));
    lock(&MAPPINGS)
}

/// `mutex`'s guard; each change under these locks is one assignment, so a panic leaves
/// what they guard whole.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// How much of a mapping one populating request of [`populate_ahead`] covers.
const POPULATE_WINDOW: usize = 2 << 20;

/// Has a thread of its own bring `map` (the mapping of `file`) into memory, in order,
/// so that the disk reads it while the caller decodes the mapping's first pages.
///
/// Why a thread: a `WILLNEED` hint for the whole mapping has Linux read one readahead
/// window of it (8 MiB of a 41 MiB segment on the bench's disk); the rest came in fault
/// by fault, the decoding waiting for each window, so that a cold open took the read's
/// time and the decoding's one after the other. Hints a window long each read it all
/// but wait for their requests to be queued, as long as the read (75 ms for that
/// segment), so not on the caller's thread (issue 33).
///
/// Why `MADV_POPULATE_READ`, window by window, and not reading the file through a
/// buffer, as this thread first did: the read copied every byte once more, on a core
/// the replay's other threads (checksums, the compaction index, the copy-out) share, and
/// left the caller to fault each page of the mapping in. Populated, the pages are in the
/// caller's page tables when it gets there. A warm restart on the bench's log of
/// 1,000,000 procedures took 4–8 % less CPU (2.46–2.56 s against 2.63–2.67 s); cold
/// ones, which wait for the disk, stayed within their spread (docs/BENCHMARKS.md,
/// "Issue 33 in stop 59").
///
/// The thread holds the mapping weakly: once the replay lets go of it, the thread stops
/// at the next window and the file is unmapped. It stops too once `stop` is set (by
/// [`IoBackend::release_mapped`]): it populates each window holding `stop`'s lock, so no
/// window it populates after a release brings released pages back. A window it cannot
/// populate (past an end cut short, a read error) ends it: the replay meets that place
/// itself. A kernel without the advice (before Linux 5.14) has the file read through a
/// buffer instead; if the thread cannot start, faults read the file as they come.
fn populate_ahead(map: &Arc<memmap2::Mmap>, file: File, stop: Stop) {
    let map = Arc::downgrade(map);
    let populate = move || {
        let mut at = 0;
        while let Some(map) = map.upgrade().filter(|map| at < map.len()) {
            let len = POPULATE_WINDOW.min(map.len() - at);
            let stopped = lock(&stop);
            if *stopped {
                return;
            }
            let populated = populate(&map, at, len);
            drop(stopped);
            match populated {
                Ok(()) => at += len,
                Err(e) if e.kind() == io::ErrorKind::InvalidInput && at == 0 => {
                    drop(map);
                    return read_through(file);
                }
                Err(_) => return,
            }
        }
    };
    let _ = std::thread::Builder::new()
        .name("procflow-read-ahead".into())
        .spawn(populate);
}

/// Populates `len` bytes of `map` from `at`: `EINVAL` where the kernel has no
/// `MADV_POPULATE_READ`.
#[cfg(target_os = "linux")]
fn populate(map: &memmap2::Mmap, at: usize, len: usize) -> io::Result<()> {
    map.advise_range(memmap2::Advice::PopulateRead, at, len)
}

#[cfg(not(target_os = "linux"))]
fn populate(_: &memmap2::Mmap, _: usize, _: usize) -> io::Result<()> {
    Err(io::ErrorKind::InvalidInput.into())
}

/// How much of the file one read of [`read_through`] takes: the kernel's readahead, not
/// this, sets the size of the disk's reads.
const READ_AHEAD_CHUNK: usize = 64 * 1024;

/// Reads `file` through, in order, into the page cache, where the mapping cannot be
/// populated.
fn read_through(mut file: File) {
    let mut chunk = vec![0; READ_AHEAD_CHUNK];
    while matches!(file.read(&mut chunk), Ok(n) if n > 0) {}
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
        lock(&self.end)
    }
}

impl LogFile for FsFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        let mut end = self.end();
        write_all_at(&self.file, buf, *end)?;
        *end += buf.len() as u64;
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        write_all_at(&self.file, buf, offset)
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The resident size, in kB, of this process's mapping that starts at `start`, as
    /// `/proc/self/smaps` tells it.
    fn resident_kb(start: usize) -> u64 {
        let smaps = fs::read_to_string("/proc/self/smaps").unwrap();
        let header = format!("{start:x}-");
        let mut lines = smaps.lines().skip_while(|line| !line.starts_with(&header));
        lines
            .find_map(|line| line.strip_prefix("Rss:"))
            .and_then(|rss| rss.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("the mapping is listed")
    }

    /// Waits until the mapping at `start` has at least `kb` resident.
    fn wait_resident(start: usize, kb: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let resident = resident_kb(start);
            if resident >= kb {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{resident} kB of the mapping's {kb} kB resident after 10 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Released bytes of a mapping leave this process's memory, the rest stays, and
    /// reading them again gives the file's bytes.
    #[test]
    fn released_parts_of_a_mapping_leave_memory_and_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        let len = 8 << 20;
        fs::write(&path, vec![7u8; len]).unwrap();
        let bytes = FsBackend.map_file(&path).unwrap().expect("mapped");
        let start = bytes.as_ptr() as usize;
        wait_resident(start, (len >> 10) as u64);
        FsBackend.release_mapped(&bytes[2 << 20..6 << 20]);
        let resident = resident_kb(start);
        assert_eq!(resident, 4 << 10, "the 4 MiB not released");
        assert!(bytes.iter().all(|&byte| byte == 7));
        // Bytes that are not a mapping's are left alone.
        FsBackend.release_mapped(&vec![7u8; 4096]);
    }

    /// A release stops the mapping's read-ahead: released pages are not brought back by
    /// a read-ahead that was behind. (Released right after the mapping is made, the end
    /// of a 64 MiB file is far ahead of the thread.)
    #[test]
    fn a_release_stops_the_read_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        let len = 64 << 20;
        fs::write(&path, vec![7u8; len]).unwrap();
        let bytes = FsBackend.map_file(&path).unwrap().expect("mapped");
        let start = bytes.as_ptr() as usize;
        FsBackend.release_mapped(&bytes[48 << 20..]);
        // Until the thread is done: the resident size stays the same for 200 ms.
        let mut resident = resident_kb(start);
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = resident_kb(start);
            if now == resident {
                break;
            }
            resident = now;
        }
        assert!(
            resident <= 48 << 10,
            "{resident} kB resident: the release came back"
        );
        assert!(bytes.iter().all(|&byte| byte == 7));
    }

    /// A mapped segment comes into the mapping ahead of the caller: a thread populates
    /// it, so its pages are resident in this process before anything here reads them
    /// (read through a buffer instead, they would be in the page cache only).
    #[test]
    fn a_mapped_file_is_populated_ahead_of_its_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        let len = 8 << 20;
        fs::write(&path, vec![7u8; len]).unwrap();
        let bytes = FsBackend.map_file(&path).unwrap().expect("mapped");
        wait_resident(bytes.as_ptr() as usize, (len >> 10) as u64);
        assert!(bytes.iter().all(|&byte| byte == 7));
    }
}
