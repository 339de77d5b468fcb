//! [`WalConfig`]: how a [`WalStore`](crate::WalStore) writes.

use std::time::Duration;

/// When [`Store::commit`](crate::Store::commit) considers a batch durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SyncMode {
    /// `commit` returns after the batch's record reached the disk with `fdatasync`
    /// (shared among concurrent commits). The default.
    #[default]
    Durable,
    /// Never fsync: `commit` returns once the record is handed to the operating system.
    /// A crash of the machine can lose acknowledged batches (a crash of the process
    /// cannot). For tests and benchmarks only.
    NoSync,
}

/// Configuration of a [`WalStore`](crate::WalStore).
///
/// # Examples
///
/// ```
/// use procflow_store::{SyncMode, WalConfig};
///
/// let config = WalConfig { segment_size: 8 << 20, ..WalConfig::default() };
/// assert_eq!(config.sync, SyncMode::Durable);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalConfig {
    /// Size in bytes at which the active segment file is closed and a new one started;
    /// also the granularity at which disk space is reclaimed by compaction. A batch
    /// larger than this gets a segment of its own. Default: 64 MiB.
    pub segment_size: u64,
    /// When a commit counts as durable. Default: [`SyncMode::Durable`].
    pub sync: SyncMode,
    /// Whether a commit that is the only one in flight, with the committer thread idle,
    /// is written and synced on the calling thread instead. That saves the two hand-offs
    /// between threads (to the committer and back), which cost one procedure at a time
    /// about a sixth of its steps/s on the machine of docs/BENCHMARKS.md. The price: the
    /// calling thread, a Tokio worker, is blocked for one `write` and `fdatasync` (a
    /// fraction of a millisecond on an SSD, longer on a slow disk), and tasks queued on
    /// it wait for another worker to steal them. Never done on a runtime with one worker
    /// thread (current-thread, or multi-thread with `worker_threads(1)`), whose one thread
    /// runs everything. `false`: every commit goes through the committer thread.
    /// Default: `true`.
    pub inline_lone_commit: bool,
    /// How long a commit that is the only one in flight, and not served inline (see
    /// [`inline_lone_commit`](Self::inline_lone_commit)), polls for its answer before it
    /// sleeps. Waking a sleeping Tokio worker thread takes tens of microseconds, a good
    /// part of an `fdatasync`; polling keeps one worker busy instead, only while a single
    /// commit is in flight, never where the process may use only one CPU, and never on a
    /// runtime with one worker thread, whose other tasks would wait. It polls
    /// in bursts of up to 200 µs that hold its worker thread, yielding to other tasks
    /// between bursts. Zero: always sleep. Default: 500 µs.
    pub spin_wait: Duration,
    /// Whether opening the store maps its segment files into memory to read them
    /// (`mmap`, on the file system backend) instead of copying them into the process
    /// with `read`: on the restart bench of docs/BENCHMARKS.md the log opened in about
    /// half the time, the copy and a page fault per 4 KiB of fresh memory saved. The
    /// price: a disk error while a segment is read is then a `SIGBUS` that ends the
    /// process, not a [`StoreError::Io`](crate::StoreError::Io) from `open`; and another
    /// process cutting a segment short while it is read (only possible against the
    /// directory's lock) does the same. Only the opening process, holding the lock, maps:
    /// the read-only reader (`procflow` admin's offline view) always reads.
    ///
    /// The mebibytes of a segment whose live values fill three quarters of them or more
    /// stay mapped after the open, their values slices of the mapping rather than copies
    /// (a cold restart of the bench's quick log took about 30 % less time); the pages of
    /// the segment's other mebibytes leave the process's memory. So a disk error when one of
    /// those pages is read back later, after the kernel dropped it from the page cache,
    /// is a `SIGBUS` too; and a dormant procedure loaded from such a segment keeps the
    /// segment's file mapped, and its space on disk once compaction deletes it, until
    /// the procedure runs or ends. `false`: always `read`, and copy every value. Default:
    /// `true`.
    pub map_segments: bool,
    /// Whether each commit writes its own record, on the committing thread, while the
    /// committer thread only syncs. A commit then takes the log's lock to check its
    /// batch, take its sequence number and file range and apply it to the in-memory
    /// state, writes the record at its range after letting go of the lock (so writes of
    /// several threads overlap), and waits until the sync thread has synced every record
    /// up to and including its own. No commit is acknowledged past a range another
    /// thread has yet to write: a crash there leaves a gap, which recovery reads as the
    /// log's torn end (docs/FORMAT.md, "Groups and the durable offset").
    ///
    /// Why it exists: it is the log the sharded runner of docs/DESIGN.md needs, where
    /// a thread that steps many procedures writes their records together
    /// ([`WalStore::commit_all`](crate::WalStore::commit_all)) and no thread hands each
    /// record to another. For one commit at a time from many tasks it is not faster
    /// than the committer thread (one `write` per commit rather than per group;
    /// docs/BENCHMARKS.md, stop 74). Needs a backend whose files support
    /// [`LogFile::write_at`](crate::io::LogFile::write_at) (the file system's and the
    /// simulated one do). [`inline_lone_commit`](Self::inline_lone_commit) and
    /// [`spin_wait`](Self::spin_wait) do not apply. A commit blocks its thread while it
    /// waits for the log's lock and writes, and, when its record rolls the segment or
    /// compaction is due, for the syncs that takes (as the committer thread does).
    /// Default: `false`.
    pub caller_writes: bool,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            segment_size: 64 << 20,
            sync: SyncMode::Durable,
            inline_lone_commit: true,
            spin_wait: Duration::from_micros(500),
            map_segments: true,
            caller_writes: false,
        }
    }
}
