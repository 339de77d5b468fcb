//! [`FsBackend`]: the real file system.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

    fn create_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        let file = options().append(true).create_new(true).open(path)?;
        Ok(Arc::new(FsFile(file)))
    }

    fn open_file(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Arc::new(FsFile(file)))
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

struct FsFile(File);

impl LogFile for FsFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        (&self.0).write_all(buf)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}
