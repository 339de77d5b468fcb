//! [`SimBackend`]: an in-memory file system that simulates crashes.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::{DirLock, IoBackend, LogFile};

/// An in-memory [`IoBackend`] that keeps two images of every file and directory: the
/// *live* image gets every write, the *durable* image only what a completed sync made
/// durable (file data at [`LogFile::sync_data`], names at [`IoBackend::sync_dir`]).
///
/// A crash test runs a workload once to count syncs with [`SimBackend::sync_count`], then
/// for every `n` runs it again on a backend built with [`SimBackend::crash_at_sync`]`(n)`:
/// the `n`th sync fails without taking effect and every later operation fails, as if the
/// machine had lost power. [`SimBackend::crash_image`] then yields a backend holding only
/// the durable image, to reopen the store from. A new directory's entry is durable once
/// its parent was synced; a file is in the crash image only if every directory above it
/// is.
#[derive(Clone, Default)]
pub struct SimBackend {
    fs: Arc<Mutex<SimFs>>,
}

#[derive(Clone, Default)]
struct SimFs {
    inodes: Vec<Inode>,
    live: BTreeMap<PathBuf, usize>,
    durable: BTreeMap<PathBuf, usize>,
    dirs: BTreeSet<PathBuf>,
    /// The directories whose entry in their parent is durable.
    durable_dirs: BTreeSet<PathBuf>,
    locks: BTreeSet<PathBuf>,
    syncs: u64,
    crash_at: Option<u64>,
    crashed: bool,
    sync_delay: Duration,
}

#[derive(Clone, Default)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Syncs begun on the file, and the number of the latest whose snapshot is
    /// `durable`.
    syncs_begun: u64,
    synced_from: u64,
}

fn crashed() -> io::Error {
    io::Error::other("simulated crash")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} does not exist", path.display()),
    )
}

impl SimFs {
    /// Whether every directory above `path` has a durable entry (a root has none to
    /// lose).
    fn reachable_after_crash(&self, path: &Path) -> bool {
        path.ancestors()
            .skip(1)
            .all(|dir| dir.parent().is_none() || self.durable_dirs.contains(dir))
    }

    fn check(&self) -> io::Result<()> {
        if self.crashed { Err(crashed()) } else { Ok(()) }
    }

    /// Counts a sync; `Err` if this is the sync to crash at (or we already crashed).
    fn begin_sync(&mut self) -> io::Result<()> {
        self.check()?;
        self.syncs += 1;
        if self.crash_at == Some(self.syncs) {
            self.crashed = true;
            return Err(crashed());
        }
        Ok(())
    }
}

impl SimBackend {
    /// An empty file system.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty file system that crashes at its `n`th sync (counting from 1).
    pub fn crash_at_sync(n: u64) -> Self {
        let backend = Self::new();
        backend.lock().crash_at = Some(n);
        backend
    }

    fn lock(&self) -> MutexGuard<'_, SimFs> {
        self.fs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes every file sync take `delay`, like a real disk, so that concurrent commits
    /// have a chance to share it. Default: no delay.
    pub fn set_sync_delay(&self, delay: Duration) {
        self.lock().sync_delay = delay;
    }

    /// How many syncs (file and directory) were attempted so far.
    pub fn sync_count(&self) -> u64 {
        self.lock().syncs
    }

    /// `true` once the simulated crash happened.
    pub fn has_crashed(&self) -> bool {
        self.lock().crashed
    }

    /// A new backend holding only the durable image, as a machine would find its disk
    /// after a power loss. Locks are not carried over.
    pub fn crash_image(&self) -> SimBackend {
        let fs = self.lock();
        let dirs: BTreeSet<PathBuf> = fs
            .durable_dirs
            .iter()
            .filter(|dir| fs.reachable_after_crash(dir))
            .cloned()
            .collect();
        let mut image = SimFs {
            durable_dirs: dirs.clone(),
            dirs,
            ..SimFs::default()
        };
        for (path, &inode) in &fs.durable {
            if !fs.reachable_after_crash(path) {
                continue;
            }
            let data = fs.inodes[inode].durable.clone();
            image.inodes.push(Inode {
                live: data.clone(),
                durable: data,
                ..Inode::default()
            });
            let id = image.inodes.len() - 1;
            image.live.insert(path.clone(), id);
            image.durable.insert(path.clone(), id);
        }
        SimBackend {
            fs: Arc::new(Mutex::new(image)),
        }
    }

    /// Like [`SimBackend::crash_image`], but the disk had also written back some of the
    /// data written since each file's last sync, in no particular order: the unsynced
    /// part of a file (from the first byte where its live and durable images differ:
    /// appends, and writes over space allocated ahead) is cut into `page_size` pages (at
    /// file offsets that are multiples of `page_size`), and `keep(path, page)` says
    /// whether page number `page` reached the disk. A page that did not reads as it was
    /// synced (zeros past the synced length); the file keeps its live length if a page
    /// past its synced length was kept.
    ///
    /// # Panics
    ///
    /// If `page_size` is zero.
    pub fn crash_image_with_pages(
        &self,
        page_size: usize,
        mut keep: impl FnMut(&Path, usize) -> bool,
    ) -> SimBackend {
        assert!(page_size > 0, "page size zero");
        let image = self.crash_image();
        let fs = self.lock();
        let mut out = image.lock();
        for (path, &inode) in &fs.durable {
            let Some(&target) = out.live.get(path) else {
                continue;
            };
            let data = written_back(&fs.inodes[inode], page_size, |page| keep(path, page));
            out.inodes[target] = Inode {
                live: data.clone(),
                durable: data,
                ..Inode::default()
            };
        }
        drop(out);
        image
    }

    /// A new backend holding the live image, made fully durable, as a restarted process
    /// would find it after the operating system flushed everything. Locks are not
    /// carried over.
    pub fn restart_image(&self) -> SimBackend {
        let mut fs = self.lock().clone();
        fs.locks.clear();
        fs.crashed = false;
        fs.crash_at = None;
        fs.durable = fs.live.clone();
        fs.durable_dirs = fs.dirs.clone();
        for inode in &mut fs.inodes {
            inode.durable = inode.live.clone();
        }
        SimBackend {
            fs: Arc::new(Mutex::new(fs)),
        }
    }

    /// The live content of `path`, if it exists.
    pub fn file(&self, path: &Path) -> Option<Vec<u8>> {
        let fs = self.lock();
        fs.live
            .get(path)
            .map(|&inode| fs.inodes[inode].live.clone())
    }

    /// Replaces the content of the existing file `path` in both images (to inject damage).
    pub fn set_file(&self, path: &Path, data: Vec<u8>) -> io::Result<()> {
        let mut fs = self.lock();
        let inode = *fs.live.get(path).ok_or_else(|| not_found(path))?;
        fs.inodes[inode] = Inode {
            live: data.clone(),
            durable: data,
            ..Inode::default()
        };
        Ok(())
    }
}

/// What a power loss leaves of `inode` when the pages `keep` selects of its unsynced
/// appends were written back.
fn written_back(inode: &Inode, page_size: usize, mut keep: impl FnMut(usize) -> bool) -> Vec<u8> {
    let (live, durable) = (&inode.live, &inode.durable);
    // After a truncation below the synced length the durable image is all there is.
    if live.len() < durable.len() {
        return durable.clone();
    }
    // Unsynced writes start where the two images part: past the synced length for an
    // append, or inside it where records were written over space allocated ahead
    // (zeros in the durable image).
    let from = live.iter().zip(durable).take_while(|(a, b)| a == b).count();
    if from == live.len() {
        return durable.clone();
    }
    let mut data = live.clone();
    let mut kept_past_durable = false;
    for page in from / page_size..live.len().div_ceil(page_size) {
        let start = (page * page_size).max(from);
        let end = ((page + 1) * page_size).min(live.len());
        if keep(page) {
            kept_past_durable |= end > durable.len();
        } else {
            for (at, byte) in data[start..end].iter_mut().enumerate() {
                *byte = durable.get(start + at).copied().unwrap_or(0);
            }
        }
    }
    if !kept_past_durable {
        data.truncate(durable.len());
    }
    data
}

struct SimLock {
    fs: Arc<Mutex<SimFs>>,
    dir: PathBuf,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut fs = self.fs.lock().unwrap_or_else(|e| e.into_inner());
        fs.locks.remove(&self.dir);
    }
}

struct SimFile {
    fs: Arc<Mutex<SimFs>>,
    inode: usize,
    /// Where the next append goes (the file's length when opened); space reserved past
    /// it holds zeros, in the live image and, once synced, in the durable one.
    end: Mutex<usize>,
}

impl SimFile {
    fn shared(fs: Arc<Mutex<SimFs>>, inode: usize, end: usize) -> Arc<dyn LogFile> {
        let end = Mutex::new(end);
        Arc::new(SimFile { fs, inode, end })
    }

    fn lock(&self) -> MutexGuard<'_, SimFs> {
        self.fs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn end(&self) -> MutexGuard<'_, usize> {
        self.end.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl LogFile for SimFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        let mut end = self.end();
        let mut fs = self.lock();
        fs.check()?;
        let live = &mut fs.inodes[self.inode].live;
        let stop = *end + buf.len();
        if live.len() < stop {
            live.resize(stop, 0);
        }
        live[*end..stop].copy_from_slice(buf);
        *end = stop;
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut fs = self.lock();
        fs.check()?;
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let live = &mut fs.inodes[self.inode].live;
        let stop = start + buf.len();
        if live.len() < stop {
            live.resize(stop, 0);
        }
        live[start..stop].copy_from_slice(buf);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let (snapshot, begun, delay) = {
            let mut fs = self.lock();
            fs.begin_sync()?;
            let inode = &mut fs.inodes[self.inode];
            inode.syncs_begun += 1;
            (inode.live.clone(), inode.syncs_begun, fs.sync_delay)
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut fs = self.lock();
        fs.check()?;
        // Two syncs of one file can overlap (a store whose commits write their own
        // records syncs on two threads): one that began later saw everything the
        // earlier one did, and a real disk never takes back what a sync made durable.
        let inode = &mut fs.inodes[self.inode];
        if begun > inode.synced_from {
            inode.durable = snapshot;
            inode.synced_from = begun;
        }
        Ok(())
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        // The end before the file system, as `append` takes them.
        let mut end = self.end();
        let mut fs = self.lock();
        fs.check()?;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        fs.inodes[self.inode].live.resize(len, 0);
        *end = len;
        Ok(())
    }

    fn reserve(&self, len: u64) -> io::Result<()> {
        let mut fs = self.lock();
        fs.check()?;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        let live = &mut fs.inodes[self.inode].live;
        if live.len() < len {
            live.resize(len, 0);
        }
        Ok(())
    }
}

impl IoBackend for SimBackend {
    fn create_dir_all(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut fs = self.lock();
        fs.check()?;
        let mut created = Vec::new();
        for ancestor in dir.ancestors() {
            if fs.dirs.insert(ancestor.to_path_buf()) {
                if ancestor.parent().is_none() {
                    // A root has no parent entry to lose.
                    fs.durable_dirs.insert(ancestor.to_path_buf());
                } else {
                    created.push(ancestor.to_path_buf());
                }
            }
        }
        created.reverse();
        Ok(created)
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<Option<DirLock>> {
        let mut fs = self.lock();
        fs.check()?;
        if !fs.locks.insert(dir.to_path_buf()) {
            return Ok(None);
        }
        Ok(Some(Box::new(SimLock {
            fs: self.fs.clone(),
            dir: dir.to_path_buf(),
        })))
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let fs = self.lock();
        fs.check()?;
        if !fs.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        Ok(fs
            .live
            .keys()
            .filter(|path| path.parent() == Some(dir))
            .filter_map(|path| path.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.file(path).ok_or_else(|| not_found(path))
    }

    fn create_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        let mut fs = self.lock();
        fs.check()?;
        if fs.live.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} already exists", path.display()),
            ));
        }
        if !path.parent().is_some_and(|dir| fs.dirs.contains(dir)) {
            return Err(not_found(path));
        }
        fs.inodes.push(Inode::default());
        let inode = fs.inodes.len() - 1;
        fs.live.insert(path.to_path_buf(), inode);
        Ok(SimFile::shared(self.fs.clone(), inode, 0))
    }

    fn open_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        let fs = self.lock();
        fs.check()?;
        let inode = *fs.live.get(path).ok_or_else(|| not_found(path))?;
        Ok(SimFile::shared(
            self.fs.clone(),
            inode,
            fs.inodes[inode].live.len(),
        ))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut fs = self.lock();
        fs.check()?;
        let inode = fs.live.remove(from).ok_or_else(|| not_found(from))?;
        fs.live.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut fs = self.lock();
        fs.check()?;
        fs.live
            .remove(path)
            .map(drop)
            .ok_or_else(|| not_found(path))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut fs = self.lock();
        fs.begin_sync()?;
        let in_dir = |path: &PathBuf| path.parent() == Some(dir);
        let live: Vec<(PathBuf, usize)> = fs
            .live
            .iter()
            .filter(|(path, _)| in_dir(path))
            .map(|(path, &inode)| (path.clone(), inode))
            .collect();
        fs.durable.retain(|path, _| !in_dir(path));
        fs.durable.extend(live);
        let subdirs: Vec<PathBuf> = fs.dirs.iter().filter(|d| in_dir(d)).cloned().collect();
        fs.durable_dirs.extend(subdirs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inode(durable: &[u8], live: &[u8]) -> Inode {
        Inode {
            live: live.to_vec(),
            durable: durable.to_vec(),
            ..Inode::default()
        }
    }

    /// Appended pages reach the disk or not, each on its own; the file keeps its live
    /// length only if a page past the synced length was kept.
    #[test]
    fn appended_pages_are_kept_or_zeros() {
        let file = inode(b"ab", b"abcdefgh");
        assert_eq!(written_back(&file, 2, |page| page != 2), b"abcd\0\0gh");
        assert_eq!(written_back(&file, 2, |_| false), b"ab");
        assert_eq!(written_back(&file, 3, |page| page == 0), b"abc\0\0\0\0\0");
    }

    /// Records written over space allocated ahead (synced zeros) are unsynced too: a
    /// page not written back reads as its synced zeros, and the file keeps its length.
    #[test]
    fn pages_written_over_allocated_space_are_unsynced() {
        let file = inode(b"ab\0\0\0\0\0\0", b"abcdefgh");
        assert_eq!(written_back(&file, 2, |page| page != 1), b"ab\0\0efgh");
        assert_eq!(written_back(&file, 2, |_| false), b"ab\0\0\0\0\0\0");
        assert_eq!(
            written_back(&inode(b"ab\0\0", b"abcdef"), 2, |page| page == 1),
            b"abcd"
        );
    }

    /// A file cut below its synced length keeps its synced image.
    #[test]
    fn a_truncated_file_keeps_its_synced_image() {
        let file = inode(b"abcdef", b"abc");
        assert_eq!(written_back(&file, 2, |_| true), b"abcdef");
    }
}
