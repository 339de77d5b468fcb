//! The disk's limit: one `write` and one `fdatasync` per step, and what a step costs on
//! the WAL in bytes (so the raw loop writes records of the same size).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Appends `size`-byte records to a new file in `dir`, each followed by `fdatasync`, for
/// `duration`; returns writes per second.
pub fn write_fdatasync_loop(dir: &Path, size: usize, duration: Duration) -> f64 {
    let (writes, elapsed) = RawLog::create(dir, size).run(duration);
    writes as f64 / elapsed.as_secs_f64()
}

/// How far ahead a preallocated raw log allocates its space: as the WAL does
/// (`RESERVE_STEP` in `procflow-store/src/wal/writer.rs`).
const RESERVE_STEP: u64 = 4 << 20;

/// A file the raw loop appends to, removed on drop; it can run in several slices (see
/// `single.rs`), each continuing the same file as one long loop would.
pub struct RawLog {
    path: PathBuf,
    file: File,
    record: Vec<u8>,
    /// Where the next record goes.
    end: u64,
    /// Space is allocated ahead up to here, and how, if the log preallocates.
    reserved: Option<(u64, Ahead)>,
    /// Busy time after each `fdatasync` before the next write (see [`RawLog::preallocated_pausing`]).
    pause: Duration,
}

impl RawLog {
    /// A new, empty file in `dir` for `size`-byte records, which grows with each write.
    pub fn create(dir: &Path, size: usize) -> Self {
        Self::open(dir.join(format!("raw-{size}.log")), size, None)
    }

    /// A new file in `dir` for `size`-byte records whose space is written with zeros
    /// ahead of them, as the WAL's segments are: each `fdatasync` then writes the data
    /// without a new file length, or blocks to convert, as well.
    pub fn preallocated(dir: &Path, size: usize) -> Self {
        Self::open(
            dir.join(format!("raw-{size}-preallocated.log")),
            size,
            Some((0, Ahead::Zeros)),
        )
    }

    /// A new file in `dir` for `size`-byte records whose space is allocated ahead with
    /// `fallocate`, as the WAL's segments were before stop 54: the `ahead` cell sets it
    /// against [`preallocated`](Self::preallocated).
    pub fn fallocated(dir: &Path, size: usize) -> Self {
        Self::open(
            dir.join(format!("raw-{size}-fallocated.log")),
            size,
            Some((0, Ahead::Fallocate)),
        )
    }

    fn open(path: PathBuf, size: usize, reserved: Option<(u64, Ahead)>) -> Self {
        let file = open_empty(&path);
        RawLog {
            path,
            file,
            record: vec![0xA5; size],
            end: 0,
            reserved,
            pause: Duration::ZERO,
        }
    }

    /// A [`preallocated`](Self::preallocated) log kept busy for `pause` after each
    /// `fdatasync` before it writes again, as an executor is while it runs the next
    /// step: the `gap` cell measures what that time between a sync's return and the
    /// next write costs on this disk.
    pub fn preallocated_pausing(dir: &Path, size: usize, pause: Duration) -> Self {
        let path = dir.join(format!(
            "raw-{size}-preallocated-{}ns.log",
            pause.as_nanos()
        ));
        let mut log = Self::open(path, size, Some((0, Ahead::Zeros)));
        log.pause = pause;
        log
    }

    /// Writes records at the end, each followed by `fdatasync`, for `duration`; returns
    /// how many and the time they took.
    pub fn run(&mut self, duration: Duration) -> (u64, Duration) {
        let start = Instant::now();
        let mut writes = 0u64;
        while start.elapsed() < duration {
            let end = self.end + self.record.len() as u64;
            if let Some((reserved, how)) = self.reserved.as_mut().filter(|r| r.0 < end) {
                let from = *reserved;
                *reserved = end.next_multiple_of(RESERVE_STEP);
                match how {
                    Ahead::Zeros => write_zeros(&self.file, from, *reserved),
                    Ahead::Fallocate => {
                        fs4::FileExt::allocate(&self.file, *reserved).expect("fallocate");
                    }
                }
            }
            self.file
                .write_all_at(&self.record, self.end)
                .expect("write");
            self.file.sync_data().expect("fdatasync");
            busy_for(self.pause);
            self.end = end;
            writes += 1;
        }
        (writes, start.elapsed())
    }
}

/// How a raw log allocates its space ahead of its records.
#[derive(Clone, Copy, Debug)]
enum Ahead {
    /// Zeros written, as the WAL does: blocks that later writes overwrite in place.
    Zeros,
    /// `fallocate`: unwritten blocks, which each sync after a write into them converts.
    Fallocate,
}

/// Writes zeros over `from..to` of `file`, as the WAL reserves its segments' space:
/// blocks written ahead are overwritten in place, so a `fdatasync` writes the data
/// alone (`fallocate`d blocks would be converted from unwritten to written at each
/// sync, which then writes the file's extent tree too: `procflow-store/src/io/fs.rs`,
/// `ZEROS`).
fn write_zeros(file: &File, from: u64, to: u64) {
    let zeros = vec![0; 1 << 20];
    let mut at = from;
    while at < to {
        let n = usize::try_from(to - at).map_or(zeros.len(), |n| n.min(zeros.len()));
        file.write_all_at(&zeros[..n], at)
            .expect("write zeros ahead");
        at += n as u64;
    }
}

/// Writes/s of the raw loop of `size`-byte records into space written with zeros ahead
/// and into `fallocate`d space, taking turns for `rounds` rounds of `slice` each (this
/// disk's speed drifts from second to second): the `ahead` cell.
pub fn ahead_rates(dir: &Path, size: usize, slice: Duration, rounds: u32) -> (f64, f64) {
    let mut zeros = RawLog::preallocated(dir, size);
    let mut fallocated = RawLog::fallocated(dir, size);
    let (z, f) = take_turns(&mut zeros, &mut fallocated, slice, rounds);
    let rate = |(writes, took): (u64, Duration)| writes as f64 / took.as_secs_f64();
    (rate(z), rate(f))
}

/// Runs `a` and `b` in turns, `slice` each, for `rounds` rounds; returns each one's
/// writes and the time they took, summed.
pub fn take_turns(
    a: &mut RawLog,
    b: &mut RawLog,
    slice: Duration,
    rounds: u32,
) -> ((u64, Duration), (u64, Duration)) {
    let add = |total: (u64, Duration), (writes, took): (u64, Duration)| {
        (total.0 + writes, total.1 + took)
    };
    let (mut a_total, mut b_total) = ((0, Duration::ZERO), (0, Duration::ZERO));
    for _ in 0..rounds {
        a_total = add(a_total, a.run(slice));
        b_total = add(b_total, b.run(slice));
    }
    (a_total, b_total)
}

/// Spins for `pause` (nothing if zero): CPU time, not a sleep, as a step would spend it.
fn busy_for(pause: Duration) {
    if pause.is_zero() {
        return;
    }
    let start = Instant::now();
    while start.elapsed() < pause {
        std::hint::spin_loop();
    }
}

/// Creates `path` empty (or empties it) for appending.
fn open_empty(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .expect("open the raw log")
}

impl Drop for RawLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The sizes of the records in a WAL directory, in log order (docs/FORMAT.md: a 32-byte
/// segment header, then records of a 32-byte header whose bytes 4..8 hold the payload
/// length, followed by the payload).
pub fn wal_record_sizes(dir: &Path) -> Vec<usize> {
    const SEGMENT_HEADER_LEN: usize = 32;
    const RECORD_HEADER_LEN: usize = 32;
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .expect("read the WAL directory")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "wal"))
        .collect();
    segments.sort();
    let mut sizes = Vec::new();
    for segment in segments {
        let bytes = std::fs::read(&segment).expect("read a segment");
        let mut at = SEGMENT_HEADER_LEN;
        while at + RECORD_HEADER_LEN <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
            let size = RECORD_HEADER_LEN + len as usize;
            sizes.push(size);
            at += size;
        }
    }
    sizes
}

/// The file system holding `path`, from `/proc/self/mounts`: (mount point, type, source).
pub fn file_system(path: &Path) -> Option<(String, String, String)> {
    let path = path.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let source = fields.next()?;
            let target = fields.next()?;
            let kind = fields.next()?;
            Some((target.to_owned(), kind.to_owned(), source.to_owned()))
        })
        .filter(|(target, _, _)| path.starts_with(target))
        .max_by_key(|(target, _, _)| target.len())
}

/// [`write_fdatasync_loop`] from one tokio task, each write+fdatasync on tokio's blocking
/// pool (as `WalStore` runs its commits): the raw loop plus two thread hand-offs per write.
pub async fn write_fdatasync_on_blocking_pool(dir: &Path, size: usize, duration: Duration) -> f64 {
    let path = dir.join(format!("raw-pool-{size}.log"));
    let file = std::sync::Arc::new(open_empty(&path));
    let record = std::sync::Arc::new(vec![0xA5; size]);
    let start = Instant::now();
    let mut writes = 0u64;
    while start.elapsed() < duration {
        let (file, record) = (file.clone(), record.clone());
        tokio::task::spawn_blocking(move || {
            (&*file).write_all(&record).expect("write");
            file.sync_data().expect("fdatasync");
        })
        .await
        .expect("blocking write");
        writes += 1;
    }
    let rate = writes as f64 / start.elapsed().as_secs_f64();
    std::fs::remove_file(&path).expect("remove the raw log");
    rate
}
