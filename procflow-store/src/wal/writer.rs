//! The segment writer: appends encoded records to the active segment, rolls to a new
//! segment at [`WalConfig::segment_size`](crate::WalConfig::segment_size), and removes
//! segments compaction has emptied.
//!
//! Records are gathered in memory and reach the file in one `write` per group commit
//! ([`Writer::flush`], which every sync and roll runs first): a group of 200 records is
//! one system call, not 200. Nothing is acknowledged before its flush and sync, so a
//! crash loses only records no commit was answered for.
//!
//! The disk may persist the pages of one `write` in any order, so after a power loss a
//! group can come back with holes. The first record appended after a completed sync is
//! marked as a group start ([`FLAG_GROUP_START`](super::record::FLAG_GROUP_START)):
//! recovery treats damage as a torn tail only if no group start follows it.
//!
//! With durable commits the active segment's space is allocated ahead of its records
//! ([`LogFile::reserve`], [`RESERVE_STEP`] at a time), so a group's `fdatasync` writes
//! its data without a new file length to write as well. The zeros past the last record
//! are cut off when the segment is closed (at a roll, and when the store closes) or,
//! after a crash, by recovery, which reads them as the log's end.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::progress::Progress;
use super::record;
use super::segment::{self, SEGMENT_HEADER_LEN};
use crate::error::StoreError;
use crate::io::{IoBackend, LogFile};
use crate::state::Change;

/// How much of the active segment's space is allocated at a time, ahead of its records
/// (at most up to the segment size). Each step costs one `fdatasync` that commits the
/// new length; a reopened store reads at most this many zeros past the last record.
pub(crate) const RESERVE_STEP: u64 = 4 << 20;

/// A segment file that is part of the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentInfo {
    /// The number in the file name.
    pub(crate) number: u64,
    /// Bytes in the file, header included.
    pub(crate) len: u64,
}

/// The largest buffer of records kept between two flushes. A group of commits fills a
/// few hundred KiB; one large batch can fill far more, and a compaction's record once
/// held a whole segment's live data (93 MB of a WAL holding 126 MB, in the admin bench),
/// which the buffer kept for good before this bound. (Compaction records now hold at
/// most 1 MiB of changes each: `compaction::COMPACTION_RECORD_BYTES`.)
pub(crate) const BUFFER_KEPT: usize = 4 << 20;

/// Appends to the log. All errors are I/O errors after which the log's state on disk is
/// unknown: the caller must poison the store.
pub(crate) struct Writer {
    backend: Arc<dyn IoBackend>,
    dir: PathBuf,
    segment_size: u64,
    sync: bool,
    /// Every segment, oldest first; the last one is active.
    segments: Vec<SegmentInfo>,
    active: Arc<dyn LogFile>,
    /// Records written to the active segment but not yet appended to its file.
    buffer: Vec<u8>,
    /// Bytes were appended to the active segment's file since its last sync.
    unsynced: bool,
    /// The active segment's file may be allocated up to here (at least its records'
    /// end): what was asked, since a failed allocation may have done part of it.
    reserved: u64,
    /// Whether to allocate ahead: durable commits, and no allocation has failed (the
    /// filesystem may not support it, or the disk be full; appends will tell).
    preallocate: bool,
    next_seq: u64,
    /// Records are written at their offset ([`LogFile::write_at`]), some by the
    /// committing threads themselves ([`Writer::take_unwritten`]), and tracked in
    /// `progress` ([`WalConfig::caller_writes`](crate::WalConfig::caller_writes)).
    positional: bool,
    progress: Arc<Progress>,
    /// Where the buffer's first record goes in the active segment, and its sequence
    /// number (meaningful while the buffer holds records).
    buffer_at: u64,
    buffer_seq: u64,
    /// Segments compaction rewrote forward and took out of `segments`, oldest first,
    /// whose files are still to be deleted ([`Writer::doomed`]).
    doomed: Vec<u64>,
    /// A compaction is landing its records, the log's lock let go between its runs.
    compacting: bool,
}

/// Records taken out of the writer's buffer to be written by the caller, without the
/// log's lock ([`Writer::take_unwritten`]).
pub(crate) struct Unwritten {
    pub(crate) file: Arc<dyn LogFile>,
    pub(crate) offset: u64,
    /// The records' sequence numbers: `seqs.0..seqs.1`.
    pub(crate) seqs: (u64, u64),
    /// The active segment's number: its path, for an error message, is made only then.
    pub(crate) segment: u64,
}

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        backend: Arc<dyn IoBackend>,
        dir: &Path,
        segment_size: u64,
        sync: bool,
        segments: Vec<SegmentInfo>,
        active: Arc<dyn LogFile>,
        next_seq: u64,
        positional: bool,
        progress: Arc<Progress>,
    ) -> Self {
        debug_assert!(!segments.is_empty());
        // Recovery cut the active segment at its last record.
        let reserved = segments[segments.len() - 1].len;
        if positional {
            let number = segments[segments.len() - 1].number;
            progress.set_active(active.clone(), segment::path(dir, number));
        }
        Writer {
            backend,
            dir: dir.to_path_buf(),
            segment_size,
            sync,
            segments,
            active,
            buffer: Vec::new(),
            // Recovery synced the active segment.
            unsynced: false,
            reserved,
            preallocate: sync,
            next_seq,
            positional,
            progress,
            doomed: Vec::new(),
            compacting: false,
            buffer_at: reserved,
            buffer_seq: next_seq,
        }
    }

    /// The sequence number the next record gets.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The room its buffer of records keeps.
    #[cfg(test)]
    pub(crate) fn buffer_capacity(&self) -> usize {
        self.buffer.capacity()
    }

    /// The size at which the active segment rolls.
    pub(crate) fn segment_size(&self) -> u64 {
        self.segment_size
    }

    pub(crate) fn segments(&self) -> &[SegmentInfo] {
        &self.segments
    }

    /// The number of the active segment.
    pub(crate) fn active_number(&self) -> u64 {
        self.active_info().number
    }

    fn active_info(&self) -> SegmentInfo {
        self.segments[self.segments.len() - 1]
    }

    /// The active segment's file.
    pub(crate) fn active(&self) -> Arc<dyn LogFile> {
        self.active.clone()
    }

    /// The active segment's path, for error messages.
    pub(crate) fn active_path(&self) -> PathBuf {
        segment::path(&self.dir, self.active_info().number)
    }

    /// Appends the record of `changes` (`payload_len` bytes of payload, as
    /// [`record::payload_len`] gave), carrying the next sequence number,
    /// rolling first if it would overflow the active segment. The record is written
    /// straight into the buffer of the group. Returns the segment it landed in.
    pub(crate) fn append(
        &mut self,
        kind: u8,
        fencing_token: Option<u64>,
        changes: &[Change],
        payload_len: u32,
    ) -> Result<u64, StoreError> {
        let len = record::RECORD_HEADER_LEN + payload_len as usize;
        self.append_with(len, |buffer, seq| {
            record::append(buffer, kind, seq, fencing_token, changes, payload_len);
        })
    }

    /// Appends a whole record encoded before it had its sequence number (`early.rs`),
    /// as [`append`](Self::append) does: it is copied into the group's buffer and given
    /// the next sequence number there.
    pub(crate) fn append_encoded(&mut self, encoded: &[u8]) -> Result<u64, StoreError> {
        self.append_with(encoded.len(), |buffer, seq| {
            let start = buffer.len();
            buffer.extend_from_slice(encoded);
            record::renumber(&mut buffer[start..], seq);
        })
    }

    /// Appends the record of `len` bytes that `write` puts at the end of the group's
    /// buffer with the sequence number it is given.
    fn append_with(
        &mut self,
        len: usize,
        write: impl FnOnce(&mut Vec<u8>, u64),
    ) -> Result<u64, StoreError> {
        let len = len as u64;
        let active = self.active_info();
        if active.len > SEGMENT_HEADER_LEN as u64 && active.len + len > self.segment_size {
            self.roll()?;
        }
        let seq = self.next_seq;
        // "Every byte before my offset was synced" (docs/FORMAT.md): with records
        // written by other threads, only the durable position can say that.
        let starts_group = if self.positional {
            self.sync && self.progress.durable() == seq
        } else {
            self.sync && self.buffer.is_empty() && !self.unsynced
        };
        if self.buffer.is_empty() {
            self.buffer_at = self.active_info().len;
            self.buffer_seq = seq;
        }
        if self.positional {
            // Allocated before the range is handed out: the zeros written ahead must
            // never land on a record another thread wrote.
            self.reserve_for(self.buffer_at + self.buffer.len() as u64 + len);
        }
        write(&mut self.buffer, seq);
        debug_assert_eq!(
            self.buffer_at + self.buffer.len() as u64,
            self.active_info().len + len
        );
        if starts_group {
            record::mark_group_start(&mut self.buffer);
        }
        let last = self.segments.len() - 1;
        self.segments[last].len += len;
        self.next_seq += 1;
        Ok(self.segments[last].number)
    }

    /// Appends the buffered records to the active segment's file.
    pub(crate) fn flush(&mut self) -> Result<(), StoreError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        self.reserve_for(self.active_info().len);
        let written = if self.positional {
            self.active.write_at(self.buffer_at, &self.buffer)
        } else {
            self.active.append(&self.buffer)
        };
        written.map_err(|e| StoreError::io("appending a record", self.active_path(), e))?;
        if self.positional {
            // Every flush is followed by this lock holder's `sync_active`.
            self.progress
                .mark_written_quietly(self.buffer_seq, self.next_seq);
        }
        self.buffer.clear();
        if self.buffer.capacity() > BUFFER_KEPT {
            self.buffer = Vec::new();
        }
        self.unsynced = true;
        Ok(())
    }

    /// Hands the buffered records to the caller to write (`into`, emptied, becomes the
    /// next buffer): the caller writes them at [`Unwritten::offset`] without the log's
    /// lock and then marks them written in the progress. Positional writers only.
    pub(crate) fn take_unwritten(&mut self, into: &mut Vec<u8>) -> Option<Unwritten> {
        debug_assert!(self.positional && into.is_empty());
        if self.buffer.is_empty() {
            return None;
        }
        std::mem::swap(&mut self.buffer, into);
        Some(Unwritten {
            file: self.active.clone(),
            offset: self.buffer_at,
            seqs: (self.buffer_seq, self.next_seq),
            segment: self.active_number(),
        })
    }

    /// The active segment's file was synced after the last [`Writer::flush`] (by the
    /// committer, which syncs without holding the log).
    pub(crate) fn note_synced(&mut self) {
        self.unsynced = false;
    }

    /// Allocates the active segment's space past `end`, its records' end, if it is not
    /// yet: up to the next multiple of [`RESERVE_STEP`], within the segment size.
    fn reserve_for(&mut self, end: u64) {
        if !self.preallocate || end <= self.reserved {
            return;
        }
        let reserved = end
            .next_multiple_of(RESERVE_STEP)
            .min(self.segment_size)
            .max(end);
        // A hint: where the space is not allocated, appends grow the file as they would
        // have without it, and what was allocated is zeros that recovery reads as the
        // end (and the roll cuts, as `reserved` says there may be some).
        if self.active.reserve(reserved).is_err() {
            self.preallocate = false;
        }
        self.reserved = reserved;
    }

    /// The active segment's bytes allocated ahead of its records, as far as known.
    pub(crate) fn ahead(&self) -> u64 {
        self.reserved.saturating_sub(self.active_info().len)
    }

    /// Makes the active segment durable and ending at its last record, as a segment
    /// must before it is closed (at a roll: recovery reads damage, zeros included, in a
    /// closed segment as corruption) or left (when the store closes).
    pub(crate) fn close_active(&mut self) -> Result<(), StoreError> {
        self.sync_active()?;
        let end = self.active_info().len;
        if self.reserved <= end {
            return Ok(());
        }
        self.active
            .truncate(end)
            .and_then(|()| self.active.sync_data())
            .map_err(|e| {
                StoreError::io("cutting a segment's reserved space", self.active_path(), e)
            })?;
        self.reserved = end;
        Ok(())
    }

    /// Closes the active segment, then starts the next one.
    fn roll(&mut self) -> Result<(), StoreError> {
        self.close_active()?;
        let number = self.active_info().number + 1;
        // `next_seq` is still the sequence number of the record that caused the roll.
        self.active = segment::create(
            self.backend.as_ref(),
            &self.dir,
            number,
            self.next_seq,
            self.sync,
        )?;
        // `create` synced the header (or, without sync, nothing is ever a group start).
        self.unsynced = false;
        if self.positional {
            self.progress
                .set_active(self.active.clone(), segment::path(&self.dir, number));
        }
        self.reserved = SEGMENT_HEADER_LEN as u64;
        self.segments.push(SegmentInfo {
            number,
            len: SEGMENT_HEADER_LEN as u64,
        });
        Ok(())
    }

    /// Makes everything written so far durable (in [`SyncMode::NoSync`](crate::SyncMode),
    /// hands it to the operating system).
    pub(crate) fn sync_active(&mut self) -> Result<(), StoreError> {
        self.flush()?;
        if self.positional {
            // Records other threads are writing must be on the file before the sync
            // that makes them durable: the callers write without this lock, so they
            // finish.
            self.progress.wait_written(self.next_seq)?;
        }
        if self.sync {
            self.active
                .sync_data()
                .map_err(|e| StoreError::io("syncing a segment", self.active_path(), e))?;
            self.unsynced = false;
        }
        if self.positional {
            self.progress.publish_durable(self.next_seq);
        }
        Ok(())
    }

    /// Takes the oldest segment, whose live changes compaction rewrote forward, out of
    /// the log: its file is deleted later ([`Doomed::delete`]), once those records are
    /// durable, by the thread that compacted after it let the log's lock go.
    pub(crate) fn doom_oldest(&mut self) {
        debug_assert!(
            self.segments.len() > 1,
            "the active segment is never doomed"
        );
        let oldest = self.segments.remove(0);
        self.doomed.push(oldest.number);
    }

    /// Segments whose files are to be deleted, oldest first, if any; `None` while
    /// there are none.
    pub(crate) fn doomed(&self) -> Option<Doomed> {
        (!self.doomed.is_empty()).then(|| Doomed {
            backend: self.backend.clone(),
            dir: self.dir.clone(),
            sync: self.sync,
            numbers: self.doomed.clone(),
        })
    }

    /// The files of `doomed` are deleted: compaction may doom more.
    pub(crate) fn forget_doomed(&mut self, doomed: &Doomed) {
        self.doomed
            .retain(|number| !doomed.numbers.contains(number));
    }

    /// Deletes the doomed segments' files now, for a store that closes: its records
    /// are durable.
    pub(crate) fn delete_doomed(&mut self) -> Result<(), StoreError> {
        if let Some(doomed) = self.doomed() {
            doomed.delete()?;
            self.forget_doomed(&doomed);
        }
        Ok(())
    }

    /// Marks a compaction's plan as landing (`compaction::Plan`): no other is planned.
    pub(crate) fn set_compacting(&mut self, compacting: bool) {
        self.compacting = compacting;
    }

    /// Whether a compaction's plan is landing.
    pub(crate) fn compacting(&self) -> bool {
        self.compacting
    }

    /// Whether a doomed segment's file is still to be deleted. Compaction waits for
    /// it: the files go in order, each deletion durable before the next, so that no
    /// crash leaves an older segment beside a gap.
    pub(crate) fn deleting(&self) -> bool {
        !self.doomed.is_empty()
    }
}

/// The files of segments compaction took out of the log ([`Writer::doom_oldest`]).
pub(crate) struct Doomed {
    backend: Arc<dyn IoBackend>,
    dir: PathBuf,
    sync: bool,
    numbers: Vec<u64>,
}

impl Doomed {
    /// Deletes the files, oldest first, each deletion made durable before the next.
    /// Only once the records that carry their live changes forward are durable: until
    /// then a crash must find them, and replaying one is harmless (its changes are
    /// older than, or the same as, those the log holds after it). Deleted in order, a
    /// crash cannot leave an older segment beside a gap.
    pub(crate) fn delete(&self) -> Result<(), StoreError> {
        for &number in &self.numbers {
            let path = segment::path(&self.dir, number);
            match self.backend.remove_file(&path) {
                // A store's close deletes them too (`Writer::delete_doomed`), maybe first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                removed => {
                    removed.map_err(|e| StoreError::io("removing a compacted segment", &path, e))?
                }
            }
            if self.sync {
                self.backend
                    .sync_dir(&self.dir)
                    .map_err(|e| StoreError::io("syncing the store directory", &self.dir, e))?;
            }
        }
        Ok(())
    }
}
