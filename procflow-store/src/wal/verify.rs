//! Checksums verified ahead: while recovery replays a segment, a thread of its own
//! checks the segment's payload checksums in front of it, so that the replay checks only
//! the records the thread has not reached.
//!
//! Why: a checksum is the first read of each byte of the log, and computing it took about
//! a third of a warm replay's time on the restart bench (perf: `crc32c` at 6.3 % of a
//! restart's samples against 17.9 % for the whole replay), most of it waiting for memory,
//! on one core while the other had little to do. The replay itself reads only the
//! records' headers and keys; their values are read once more, when the live ones are
//! copied out.
//!
//! Nothing is trusted that was not checked: a record counts as checked only if the
//! thread reached its end by the same walk the replay makes (each record starting where
//! the one before ended, from the segment's first record), and found its header and
//! payload checksums right. The replay checks every record past that point itself, so a
//! damaged record is found, and reported, exactly as without the thread; the thread
//! stops at the first record it cannot read and leaves it to the replay.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::record::{self, RECORD_HEADER_LEN};

/// How far a segment's records are checked, shared with the thread checking them.
pub(crate) struct Checked {
    /// The end of the last record checked, or the first record's start.
    end: AtomicUsize,
    /// Set once the replay is done with the segment: the thread stops.
    stop: AtomicBool,
}

impl Checked {
    /// Nothing checked yet; the first record starts at `start`.
    fn starting_at(start: usize) -> Self {
        Self {
            end: AtomicUsize::new(start),
            stop: AtomicBool::new(false),
        }
    }

    /// Whether the record ending at `end` has its checksums checked.
    pub(crate) fn covers(&self, end: usize) -> bool {
        // Acquire: pairs with the thread's Release, after which it read the record.
        end <= self.end.load(Ordering::Acquire)
    }
}

/// Runs `replay` on this thread while another checks the checksums of the records of
/// `segment` from `first` (where its first record starts) on. The other thread is
/// stopped and joined before this returns: nothing of `segment` is read after. If no
/// thread can be started, `replay` runs alone and checks every record itself.
pub(crate) fn beside<R>(segment: &[u8], first: usize, replay: impl FnOnce(&Checked) -> R) -> R {
    let checked = Checked::starting_at(first);
    if segment.len() < CHECK_BESIDE_FROM {
        // Starting a thread costs more than checking a small segment.
        return replay(&checked);
    }
    std::thread::scope(|scope| {
        let ahead = std::thread::Builder::new()
            .name("procflow-check-ahead".into())
            .spawn_scoped(scope, || check_ahead(segment, first, &checked));
        let result = replay(&checked);
        checked.stop.store(true, Ordering::Relaxed);
        if let Ok(ahead) = ahead {
            // It only reads and computes: it cannot panic but by a bug, which this
            // surfaces.
            ahead.join().expect("the checksum thread does not panic");
        }
        result
    })
}

/// The smallest segment whose checksums a thread of their own checks: a thread takes
/// tens of microseconds to start, about as long as checking 64 KiB.
const CHECK_BESIDE_FROM: usize = 1 << 20;

/// Walks the records of `segment` from `offset`, as the replay does, publishing the end of
/// each one whose checksums hold; stops at the first that does not (the replay reports
/// it), at the end, or when told to.
fn check_ahead(segment: &[u8], mut offset: usize, checked: &Checked) {
    while !checked.stop.load(Ordering::Relaxed) {
        let Some(end) = check_one(segment, offset) else {
            return;
        };
        offset = end;
        checked.end.store(end, Ordering::Release);
    }
}

/// The end of the record at `offset` in `segment` if its header and payload checksums
/// hold, `None` if not (or if there is no record there).
fn check_one(segment: &[u8], offset: usize) -> Option<usize> {
    let buf = segment.get(offset..)?;
    let header = record::decode_header(buf).ok()?;
    let len = usize::try_from(header.record_len()).ok()?;
    let payload = buf.get(RECORD_HEADER_LEN..len)?;
    record::payload_matches(&header, payload).then_some(offset + len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Change;
    use crate::wal::record::KIND_BATCH;

    /// `count` records, one after the other, as a segment holds them past its header
    /// (here from offset 0).
    fn records(count: u64) -> Vec<u8> {
        let mut log = Vec::new();
        for seq in 1..=count {
            let change = Change::Put {
                id: seq,
                parent: None,
                finished: false,
                value: bytes::Bytes::from(vec![seq as u8; 100]),
            };
            log.extend(record::encode(KIND_BATCH, seq, None, &[change]).unwrap());
        }
        log
    }

    #[test]
    fn the_thread_checks_every_record_of_a_sound_log() {
        let log = records(50);
        let checked = Checked::starting_at(0);
        check_ahead(&log, 0, &checked);
        assert!(checked.covers(log.len()));
        assert!(!checked.covers(log.len() + 1));
    }

    /// A payload byte changed in the 20th record: the thread stops before it, and nothing
    /// from it on counts as checked, the later sound records included.
    #[test]
    fn the_thread_stops_before_a_damaged_record() {
        let mut log = records(50);
        let ends: Vec<usize> = std::iter::successors(Some(0), |&at| check_one(&log, at))
            .skip(1)
            .collect();
        assert_eq!(ends.len(), 50);
        let (start, end) = (ends[18], ends[19]);
        log[end - 1] ^= 0x55;
        let checked = Checked::starting_at(0);
        check_ahead(&log, 0, &checked);
        assert!(checked.covers(start));
        assert!(!checked.covers(end));
        assert!(!checked.covers(log.len()));
    }

    /// The replay runs while the thread checks; both read the same bytes, and the thread
    /// is gone once `beside` returns.
    #[test]
    fn beside_runs_the_replay_and_joins_the_thread() {
        let log = records(12_000);
        assert!(log.len() >= CHECK_BESIDE_FROM);
        let seen = beside(&log, 0, |checked| {
            while !checked.covers(log.len()) {
                std::thread::yield_now();
            }
            checked.end.load(Ordering::Acquire)
        });
        assert_eq!(seen, log.len());
    }

    /// A small segment gets no thread: the replay checks every record itself.
    #[test]
    fn a_small_segment_is_checked_by_the_replay_alone() {
        let log = records(50);
        let covered = beside(&log, 0, |checked| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            checked.covers(check_one(&log, 0).unwrap())
        });
        assert!(!covered);
    }
}
