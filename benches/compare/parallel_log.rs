//! `--cell batch-par:N --duties`: the rounds of `compare/hand_batch.rs` on a log that the
//! rounds append to themselves, in parallel, and that one thread only syncs: the bound of
//! a write-ahead log with no serial part but its `fdatasync` (docs/BENCHMARKS.md, "Issue
//! 33 in stop 73").
//!
//! Each task of rounds applies its round's batch to a `MemStore` (the in-memory state a
//! log keeps, as the WAL's committer applies it), frames the round's records (length,
//! crc32c, id, value) into a buffer of its own, reserves the next range of the file with
//! one atomic add and writes the buffer there with one `pwrite`, on its own thread. The
//! sync thread syncs whatever is written without a gap before it and publishes that
//! position; a round waits until the position passes its range. Nothing waits on another
//! task's write but the sync.
//!
//! A bench, not a log: no recovery reads the file, and the space is written with zeros
//! ahead for the whole cell (as the raw loop into preallocated space, `compare/raw.rs`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::watch;

/// Where the written bytes end without a gap, and the ranges written past a gap.
#[derive(Default)]
struct Written {
    upto: u64,
    past_gap: BTreeMap<u64, u64>,
    /// The sync thread sleeps: an append that moves `upto` wakes it.
    idle: bool,
}

/// A file appended to by many threads at once and synced by one.
pub struct ParallelLog {
    file: File,
    capacity: u64,
    reserved: AtomicU64,
    written: Mutex<Written>,
    wake: Condvar,
    durable: watch::Sender<u64>,
    stop: AtomicBool,
    syncs: AtomicU64,
}

impl ParallelLog {
    /// A log in `dir` of `capacity` bytes, written with zeros and synced first, and its
    /// sync thread.
    pub fn create(dir: &Path, capacity: u64) -> Arc<Self> {
        std::fs::create_dir_all(dir).expect("create the cell's directory");
        let mut file = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.join("parallel.log"))
            .expect("create the parallel log");
        let zeros = vec![0; 4 << 20];
        let mut left = capacity;
        while left > 0 {
            let chunk = left.min(zeros.len() as u64) as usize;
            file.write_all(&zeros[..chunk]).expect("write zeros ahead");
            left -= chunk as u64;
        }
        file.sync_all().expect("sync the zeros");
        let log = Arc::new(ParallelLog {
            file,
            capacity,
            reserved: AtomicU64::new(0),
            written: Mutex::new(Written::default()),
            wake: Condvar::new(),
            durable: watch::Sender::new(0),
            stop: AtomicBool::new(false),
            syncs: AtomicU64::new(0),
        });
        let syncing = Arc::clone(&log);
        std::thread::Builder::new()
            .name("parallel-sync".into())
            .spawn(move || syncing.sync_loop())
            .expect("start the sync thread");
        log
    }

    /// Writes `bytes` at the next free range; returns where the range ends.
    pub fn append(&self, bytes: &[u8]) -> u64 {
        let len = bytes.len() as u64;
        let start = self.reserved.fetch_add(len, Ordering::Relaxed);
        assert!(
            start + len <= self.capacity,
            "the parallel log is full: its capacity is sized for the cell's time"
        );
        self.file.write_all_at(bytes, start).expect("pwrite");
        let mut written = self.written.lock().expect("written");
        if start == written.upto {
            written.upto = start + len;
            let Written { upto, past_gap, .. } = &mut *written;
            while let Some(end) = past_gap.remove(upto) {
                *upto = end;
            }
            if written.idle {
                written.idle = false;
                self.wake.notify_one();
            }
        } else {
            written.past_gap.insert(start, start + len);
        }
        start + len
    }

    /// Waits until every byte before `end` is durable.
    pub async fn durable(&self, end: u64) {
        let mut position = self.durable.subscribe();
        position
            .wait_for(|durable| *durable >= end)
            .await
            .expect("the sync thread keeps the sender");
    }

    /// The `fdatasync` calls made.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Stops the sync thread (it ends within a millisecond).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    fn sync_loop(&self) {
        let mut synced = 0;
        while !self.stop.load(Ordering::Relaxed) {
            let target = {
                let mut written = self.written.lock().expect("written");
                if written.upto == synced {
                    written.idle = true;
                    let (written, _) = self
                        .wake
                        .wait_timeout(written, Duration::from_millis(1))
                        .expect("written");
                    written.upto
                } else {
                    written.upto
                }
            };
            if target == synced {
                continue;
            }
            self.file.sync_data().expect("fdatasync");
            self.syncs.fetch_add(1, Ordering::Relaxed);
            synced = target;
            self.durable.send_replace(target);
        }
    }
}

/// Appends one record's frame to `out`: length, crc32c of the value, id, value.
pub fn frame(out: &mut Vec<u8>, id: u64, value: &[u8]) {
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(value).to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(value);
}
