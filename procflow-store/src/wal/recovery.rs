//! Opening a log: [`scan_segment`] reads one segment's bytes into records and decides
//! where the valid log ends; [`recover`] replays every segment, truncates a torn tail and
//! hands back the state and an open writer.
//!
//! A torn tail — a record cut short by a crash — is expected at the end of the last
//! segment: an incomplete header, an unknown marker, a length running past the end of
//! the file or a checksum mismatch there ends the log, and those bytes were never
//! acknowledged. The same damage followed by a valid record, or anywhere in a closed
//! segment, means acknowledged data would be lost: that is [`StoreError::Corrupt`].
//!
//! Missing data is found by numbering ([`check_segment_numbers`], [`SeqCheck`]): segment
//! numbers go up by one at each roll and compaction deletes only the oldest segment, so
//! the kept segments are numbered without a gap; sequence numbers go up by one at each
//! record, across segments too, and each segment header records the sequence number its
//! first record carries. A missing segment, or a closed one cut short at a record
//! boundary, breaks one of these chains.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::arena::{self, Arenas, Kept, Segment};
use super::compaction::LiveIndex;
use super::index_beside::Notes;
use super::record::{self, HeaderError, RECORD_HEADER_LEN, RECORD_MARKER, RecordHeader};
use super::segment::{self, FIRST_SEQ_UNKNOWN, SEGMENT_HEADER_LEN, TMP_SUFFIX};
use super::verify::{self, Checked};
use super::writer::SegmentInfo;
use crate::error::StoreError;
use crate::io::{IoBackend, LogFile};
use crate::state::{Change, State};
use bytes::Bytes;

/// One valid record found by [`scan_segment`].
#[derive(Debug)]
pub(crate) struct ScannedRecord {
    /// Byte offset of the record in its segment file.
    pub(crate) offset: u64,
    pub(crate) header: RecordHeader,
    /// Its payload, checksum verified, its changes not decoded yet
    /// ([`record::for_each_change`]).
    pub(crate) payload: Bytes,
}

impl ScannedRecord {
    /// Hands `each` the record's changes one by one; a payload that does not decode is
    /// corruption (its checksum held).
    pub(crate) fn for_each_change(
        &self,
        file: &Path,
        each: impl FnMut(Change),
    ) -> Result<(), StoreError> {
        record::for_each_change(&self.payload, each).map_err(|reason| StoreError::Corrupt {
            file: file.to_path_buf(),
            offset: self.offset,
            reason,
        })
    }
}

/// The result of scanning one segment, records collected (tests read it whole).
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct SegmentScan {
    pub(crate) records: Vec<ScannedRecord>,
    /// Bytes up to the end of the last valid record; the file is cut here if shorter.
    pub(crate) valid_len: u64,
    /// Why the log ended before the end of the file, if it did.
    pub(crate) torn: Option<String>,
}

/// Why the bytes at some offset are not a valid record.
enum Invalid {
    /// Damage a crash during the append can leave behind.
    Torn(String),
    /// Checksums hold but the content makes no sense: never a torn write.
    Corrupt(String),
}

/// Reads the record at `offset` in `segment` and checks its checksum; its payload is a
/// slice of `segment`. With `checked`, a record it covers ([`Checked::covers`]) has its
/// payload checksum taken as checked.
fn read_record(
    segment: &Bytes,
    offset: usize,
    checked: Option<&Checked>,
) -> Result<(RecordHeader, Bytes), Invalid> {
    let buf = &segment[offset..];
    let header = match record::decode_header(buf) {
        Ok(header) => header,
        Err(e @ HeaderError::Unsupported(_)) => return Err(Invalid::Corrupt(e.to_string())),
        Err(e) => return Err(Invalid::Torn(e.to_string())),
    };
    // Compare in u64: the length is checked against the bytes really present before
    // anything is sliced or allocated.
    if header.record_len() > buf.len() as u64 {
        return Err(Invalid::Torn(format!(
            "record of {} bytes runs past the end of the file ({} bytes left)",
            header.record_len(),
            buf.len()
        )));
    }
    let start = offset + RECORD_HEADER_LEN;
    let payload = segment.slice(start..start + header.payload_len as usize);
    let end = start + payload.len();
    let covered = checked.is_some_and(|checked| checked.covers(end));
    if !covered && !record::payload_matches(&header, &payload) {
        return Err(Invalid::Torn("record payload checksum mismatch".into()));
    }
    Ok((header, payload))
}

/// The offset of the first valid record at or after `from` that starts a group (any
/// valid record if `all_start_groups`), if any. Everything before such a record was
/// durable when it was written, so damage before it is not a torn write.
fn find_group_start(bytes: &Bytes, from: usize, all_start_groups: bool) -> Option<usize> {
    (from..bytes.len())
        .filter(|&i| bytes[i] == RECORD_MARKER)
        .find(|&i| {
            read_record(bytes, i, None).is_ok_and(|(header, payload)| {
                (all_start_groups || header.starts_group)
                    && record::for_each_change(&payload, drop).is_ok()
            })
        })
}

/// Reads one segment's records in order, one at a time: recovery applies each as it is
/// read, so no segment's worth of decoded records is ever held at once. (Collected, a
/// 64 MiB segment's records took about a third of its size in small allocations, and
/// their one large list raised the allocator's thresholds for the rest of the process:
/// memory freed after the restart then stayed with the process.)
///
/// Damage ends the log only in the last segment (`is_last`) and only if no valid record
/// follows it.
pub(crate) struct Scanner<'a> {
    file: &'a Path,
    bytes: &'a Bytes,
    is_last: bool,
    /// Version 1 did not mark group starts: any valid record counts as one.
    all_start_groups: bool,
    /// The sequence number the header says the first record carries, or
    /// [`FIRST_SEQ_UNKNOWN`].
    pub(crate) first_seq: u64,
    /// Where the next record starts; once the scan is over, the end of the valid log.
    offset: usize,
    /// Why the log ended before the end of the file, once known.
    torn: Option<String>,
    done: bool,
    /// How far a thread has checked the checksums ahead, if one does.
    checked: Option<&'a Checked>,
}

impl<'a> Scanner<'a> {
    /// Checks the header of segment `number` (its bytes read from `file`).
    pub(crate) fn new(
        file: &'a Path,
        number: u64,
        bytes: &'a Bytes,
        is_last: bool,
    ) -> Result<Self, StoreError> {
        let header =
            segment::check_header(bytes, number).map_err(|reason| StoreError::Corrupt {
                file: file.to_path_buf(),
                offset: 0,
                reason,
            })?;
        Ok(Self {
            file,
            bytes,
            is_last,
            all_start_groups: header.version < 2,
            first_seq: header.first_seq,
            offset: SEGMENT_HEADER_LEN,
            torn: None,
            done: false,
            checked: None,
        })
    }

    /// Takes the records `checked` covers as checked.
    pub(crate) fn checked_by(mut self, checked: &'a Checked) -> Self {
        self.checked = Some(checked);
        self
    }

    /// Bytes up to the end of the last valid record: the file is cut here if shorter.
    /// Final once [`Scanner::next_record`] has returned `None`.
    pub(crate) fn valid_len(&self) -> u64 {
        self.offset as u64
    }

    /// Why the log ended before the end of the file, if it did.
    pub(crate) fn torn(&self) -> Option<&str> {
        self.torn.as_deref()
    }

    fn corrupt(&self, reason: String) -> StoreError {
        StoreError::Corrupt {
            file: self.file.to_path_buf(),
            offset: self.offset as u64,
            reason,
        }
    }

    /// The next valid record, or `None` at the end of the valid log.
    pub(crate) fn next_record(&mut self) -> Result<Option<ScannedRecord>, StoreError> {
        if self.done || self.offset >= self.bytes.len() {
            self.done = true;
            return Ok(None);
        }
        let offset = self.offset;
        match read_record(self.bytes, offset, self.checked) {
            Ok((header, payload)) => {
                // Cannot overflow: the record lies within `bytes`.
                self.offset += header.record_len() as usize;
                Ok(Some(ScannedRecord {
                    offset: offset as u64,
                    header,
                    payload,
                }))
            }
            Err(Invalid::Corrupt(reason)) => Err(self.corrupt(reason)),
            Err(Invalid::Torn(reason)) => {
                if !self.is_last {
                    return Err(self.corrupt(format!("{reason} in a closed segment")));
                }
                // The last group went to disk in one write whose pages the disk may
                // have persisted in any order: damage with only records of that group
                // after it is a torn write. A later group start proves a sync covered it.
                // Zeros to the end are space the writer allocated ahead of its records
                // (`LogFile::reserve`): nothing follows, and checking every byte of it
                // for a record would take a while.
                let unused = self.bytes[offset..].iter().all(|&b| b == 0);
                if let Some(next) = (!unused)
                    .then(|| find_group_start(self.bytes, offset + 1, self.all_start_groups))
                    .flatten()
                {
                    return Err(self.corrupt(format!(
                        "{reason}, but a record written after a sync follows at offset {next}"
                    )));
                }
                self.torn = Some(reason);
                self.done = true;
                Ok(None)
            }
        }
    }
}

/// Scans the bytes of segment `number` (read from `file`) whole: [`Scanner`], collected.
#[cfg(test)]
pub(crate) fn scan_segment(
    file: &Path,
    number: u64,
    bytes: &Bytes,
    is_last: bool,
) -> Result<SegmentScan, StoreError> {
    let mut scanner = Scanner::new(file, number, bytes, is_last)?;
    let mut records = Vec::new();
    while let Some(record) = scanner.next_record()? {
        records.push(record);
    }
    Ok(SegmentScan {
        records,
        valid_len: scanner.valid_len(),
        torn: scanner.torn.take(),
    })
}

/// Everything [`recover`] reconstructed.
pub(crate) struct Recovered {
    pub(crate) state: State,
    /// Mapped segments whose values were left in place (`arena.rs`).
    pub(crate) kept: Kept,
    pub(crate) index: LiveIndex,
    /// Every segment, oldest first; the last one is active.
    pub(crate) segments: Vec<SegmentInfo>,
    pub(crate) active: Arc<dyn LogFile>,
    pub(crate) next_seq: u64,
}

/// Fails if the kept segments are not numbered contiguously: a segment is missing.
fn check_segment_numbers(dir: &Path, numbers: &[u64]) -> Result<(), StoreError> {
    for pair in numbers.windows(2) {
        if pair[1] != pair[0] + 1 {
            let missing = pair[0] + 1;
            return Err(StoreError::Corrupt {
                file: segment::path(dir, missing),
                offset: 0,
                reason: format!(
                    "segment {missing} is missing between segments {} and {}",
                    pair[0], pair[1]
                ),
            });
        }
    }
    Ok(())
}

/// Checks that sequence numbers run on by one through the whole log.
#[derive(Default)]
struct SeqCheck {
    /// The sequence number the next record must carry, once known.
    expected: Option<u64>,
    /// The segment read before the current one, and its length, for error messages.
    previous: Option<(PathBuf, u64)>,
}

impl SeqCheck {
    /// A segment starts; its header says its first record carries `first_seq`.
    fn segment(&mut self, path: &Path, first_seq: u64) -> Result<(), StoreError> {
        if first_seq == FIRST_SEQ_UNKNOWN {
            return Ok(());
        }
        if first_seq == u64::MAX {
            return Err(exhausted(path, 0));
        }
        if let (Some(expected), Some((previous, len))) = (self.expected, &self.previous)
            && first_seq != expected
        {
            // The header is checksummed, so the segment before it lost its last records.
            return Err(StoreError::Corrupt {
                file: previous.clone(),
                offset: *len,
                reason: format!(
                    "segment ends before sequence number {expected}, but the next segment \
                     ({}) starts at {first_seq}: records are missing",
                    path.display()
                ),
            });
        }
        self.expected = Some(first_seq);
        Ok(())
    }

    /// A record at `offset` of `path` carries `seq`.
    fn record(&mut self, path: &Path, offset: u64, seq: u64) -> Result<(), StoreError> {
        if let Some(expected) = self.expected
            && seq != expected
        {
            let reason = if seq < expected {
                format!("sequence number {seq} does not follow {}", expected - 1)
            } else {
                format!("sequence number {seq} where {expected} was expected: records are missing")
            };
            return Err(StoreError::Corrupt {
                file: path.to_path_buf(),
                offset,
                reason,
            });
        }
        // A log never gets near 2^64 records: such a number is damage, and the next
        // record could not be numbered.
        self.expected = Some(seq.checked_add(1).ok_or_else(|| exhausted(path, offset))?);
        Ok(())
    }

    /// A segment ended `len` bytes long.
    fn end_segment(&mut self, path: &Path, len: u64) {
        self.previous = Some((path.to_path_buf(), len));
    }
}

fn exhausted(path: &Path, offset: u64) -> StoreError {
    StoreError::Corrupt {
        file: path.to_path_buf(),
        offset,
        reason: format!(
            "sequence number {} leaves none for the next record",
            u64::MAX
        ),
    }
}

fn io_err(context: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |e| StoreError::io(context, path, e)
}

/// Replays the log in `dir`: removes half-created segments, scans every segment, checks
/// that no segment or record is missing, truncates a torn tail (durably when `sync`), creates
/// the first segment of a new log, and opens the active segment for appending. With `map`,
/// segments are mapped rather than read where the backend can (the caller holds the
/// directory's lock: `WalConfig::map_segments`).
pub(crate) fn recover(
    backend: &dyn IoBackend,
    dir: &Path,
    sync: bool,
    map: bool,
) -> Result<Recovered, StoreError> {
    let names = backend
        .list_dir(dir)
        .map_err(io_err("listing the store directory", dir))?;
    let mut removed_tmp = false;
    let mut numbers = Vec::new();
    for name in names {
        if let Some(number) = segment::parse_file_name(&name) {
            numbers.push(number);
        } else if name
            .strip_suffix(TMP_SUFFIX)
            .and_then(segment::parse_file_name)
            .is_some()
        {
            let path = dir.join(&name);
            backend
                .remove_file(&path)
                .map_err(io_err("removing a half-created segment", &path))?;
            removed_tmp = true;
        }
    }
    if removed_tmp && sync {
        backend
            .sync_dir(dir)
            .map_err(io_err("syncing the store directory", dir))?;
    }
    numbers.sort_unstable();
    check_segment_numbers(dir, &numbers)?;
    let Some(&last_number) = numbers.last() else {
        let active = segment::create(backend, dir, 1, 1, sync)?;
        return Ok(Recovered {
            state: State::default(),
            kept: Kept::new(),
            index: LiveIndex::default(),
            segments: vec![SegmentInfo {
                number: 1,
                len: SEGMENT_HEADER_LEN as u64,
            }],
            active,
            next_seq: 1,
        });
    };
    let replayed = replay(backend, dir, &numbers, map, |path, valid_len| {
        let file = backend
            .open_file(path)
            .map_err(io_err("opening a segment", path))?;
        file.truncate(valid_len)
            .map_err(io_err("truncating a torn tail", path))?;
        if sync {
            file.sync_data()
                .map_err(io_err("syncing a truncated segment", path))?;
        }
        Ok(())
    })?;
    let Replayed {
        applied:
            Applied {
                state,
                kept,
                segments,
                next_seq,
            },
        index,
    } = replayed;
    let path = segment::path(dir, last_number);
    let active = backend
        .open_file(&path)
        .map_err(io_err("opening the active segment", &path))?;
    if sync {
        // What was read may still be only in the page cache (the process, not the
        // machine, crashed). The next group's first record will claim that everything
        // before it is durable, so make it so.
        active
            .sync_data()
            .map_err(io_err("syncing the active segment", &path))?;
    }
    Ok(Recovered {
        state,
        kept,
        index,
        segments,
        active,
        next_seq,
    })
}

/// What reading the whole log gives.
struct Replayed {
    applied: Applied,
    index: LiveIndex,
}

/// What applying the segments gives.
struct Applied {
    state: State,
    kept: Kept,
    segments: Vec<SegmentInfo>,
    next_seq: u64,
}

/// Reads segments `numbers` (sorted, contiguous) in order and applies their records;
/// calls `torn(path, valid_len)` for a segment whose tail is torn (only the last one can
/// be: any other damage is [`StoreError::Corrupt`]). With `map`, segments are mapped
/// ([`IoBackend::map_file`]) where the backend can: only bytes before the valid end are
/// read once `torn` has cut a segment there. Values point into a mapping after the
/// replay only where its segment is [`Kept`] (`arena.rs`), and only into records before
/// that end: the writer appends after them, and cuts a segment at close only after its
/// last record.
///
/// The compaction index is built beside, on a thread of its own (`index_beside.rs`).
fn replay(
    backend: &dyn IoBackend,
    dir: &Path,
    numbers: &[u64],
    map: bool,
    torn: impl FnMut(&Path, u64) -> Result<(), StoreError>,
) -> Result<Replayed, StoreError> {
    std::thread::scope(|scope| {
        let mut notes = Notes::start(scope);
        let applied = apply(backend, dir, numbers, map, torn, &mut notes)?;
        Ok(Replayed {
            applied,
            index: notes.finish(),
        })
    })
}

/// [`replay`]'s reading and applying of the segments, each change noted in `notes`;
/// returns the state, the segments kept mapped, the segments read and the next sequence
/// number.
fn apply(
    backend: &dyn IoBackend,
    dir: &Path,
    numbers: &[u64],
    map: bool,
    mut torn: impl FnMut(&Path, u64) -> Result<(), StoreError>,
    notes: &mut Notes<'_>,
) -> Result<Applied, StoreError> {
    let mut state = State::default();
    let mut segments = Vec::with_capacity(numbers.len());
    let mut seqs = SeqCheck::default();
    let mut arenas = Arenas::default();
    // The pages of a kept segment's windows whose values were copied out.
    let release = |bytes: &[u8]| backend.release_mapped(bytes);
    let last_number = numbers.last().copied().unwrap_or(0);
    // Segments are read into two buffers in turn, whose memory is mapped once: a fresh
    // buffer per segment costs a page fault per 4 KiB read. Two, because a segment's live
    // values are copied out only once the next segment has been applied: a procedure
    // that ended in one segment is often deleted in the next, and its value, copied,
    // would have left a hole in an arena (`arena.rs`).
    let mut buffer = Vec::new();
    // The segment before this one.
    let mut previous: Option<Segment> = None;
    // Each segment is mapped while the one before is decoded (the first before the loop):
    // mapping has a thread read the file ahead (`FsBackend`), so the disk reads it meanwhile.
    // `None` where the backend cannot map: the segment is read when its turn comes.
    let map_ahead = |at: usize| match numbers.get(at).filter(|_| map) {
        Some(&number) => map_segment(backend, &segment::path(dir, number)),
        None => Ok(None),
    };
    let mut ahead = map_ahead(0)?;
    for (at, &number) in numbers.iter().enumerate() {
        let path = segment::path(dir, number);
        let (bytes, mapped) = match ahead.take() {
            Some(mapped) => (mapped, true),
            None => (read_segment(backend, &path, &mut buffer)?, false),
        };
        ahead = map_ahead(at + 1)?;
        // The records this segment puts: their values are slices of its bytes.
        let mut current = Segment::new(number, bytes, mapped);
        let bytes = current.bytes.clone();
        let mut pace = Pace::default();
        // A thread checks the checksums ahead of the replay (`verify.rs`).
        let scanned = verify::beside(&bytes, SEGMENT_HEADER_LEN, |checked| {
            let last = number == last_number;
            let mut scan = Scanner::new(&path, number, &bytes, last)?.checked_by(checked);
            seqs.segment(&path, scan.first_seq)?;
            while let Some(record) = scan.next_record()? {
                seqs.record(&path, record.offset, record.header.seq)?;
                state.observe_token(record.header.fencing_token);
                record.for_each_change(&path, |change| {
                    if let Change::Put { id, value, .. } = &change {
                        current.put(*id, value);
                    }
                    notes.note(number, &change);
                    if let Some(replaced) = state.apply(change) {
                        // Counted out where it lies: in one of these two segments, or
                        // in an arena or a kept window (an older segment's values).
                        let _ = current.replaced(&replaced)
                            || previous.as_mut().is_some_and(|p| p.replaced(&replaced))
                            || arenas.replaced(&replaced);
                    }
                })?;
                if let Some(waited) = pace.waited(record.header.record_len()) {
                    // About as long as the decoding waited: the disk reads on meanwhile.
                    // No more than the copies of this segment's and the last one's values
                    // would take, nor than the log's live values so far (on the restart
                    // bench's log, arenas made for every value put were 60 % more than
                    // were filled); nothing for a segment that may yet stay.
                    let read = usize::try_from(record.offset + record.header.record_len());
                    let ahead = current.certain_copy(read.unwrap_or(usize::MAX))
                        + previous
                            .as_ref()
                            .map_or(0, |p| p.certain_copy(p.bytes.len()));
                    let live = usize::try_from(notes.live_bytes()).unwrap_or(usize::MAX);
                    arenas.make_ahead_for(waited, ahead.min(live));
                    pace.restart(); // The time it took is not the disk's.
                }
            }
            Ok::<_, StoreError>((scan.valid_len(), scan.torn().is_some()))
        });
        drop(bytes);
        let (valid_len, was_torn) = scanned?;
        if let Some(previous) = previous.replace(current) {
            buffer = reclaim(arenas.copy_out(&mut state.records, previous, &release));
        }
        if was_torn {
            torn(&path, valid_len)?;
        }
        seqs.end_segment(&path, valid_len);
        segments.push(SegmentInfo {
            number,
            len: valid_len,
        });
    }
    if let Some(previous) = previous {
        arenas.copy_out(&mut state.records, previous, &release);
    }
    let kept = arenas.finish(&mut state.records, &release);
    state.records = arena::repack(std::mem::take(&mut state.records));
    Ok(Applied {
        state,
        kept,
        segments,
        next_seq: seqs.expected.unwrap_or(1),
    })
}

/// Tells, every [`Pace::EVERY`] bytes of records, whether decoding them waited for the
/// disk: a page of the mapping not read yet stops the decoding for the disk's time,
/// hundreds of µs, where decoding as many bytes from memory takes tens. The replay then
/// makes arenas' memory ahead ([`Arenas::make_ahead_for`]) while the disk goes on reading.
///
/// Counted in bytes, not records: a record of a MiB (a compaction's) waits for the disk
/// while its checksum is computed, as long as a thousand small ones do.
struct Pace {
    bytes: u64,
    since: std::time::Instant,
}

impl Pace {
    /// Bytes of records between two looks at the clock: about 64 records of the bench's
    /// procedures (a look costs about as much as a record).
    const EVERY: u64 = 96 * 1024;
    /// About as long as decoding `EVERY` bytes from memory takes at the slowest (85 µs
    /// for compaction records on the bench's machine, which decodes them at about 1.1
    /// GB/s), and shorter than a read from the disk. A look that finds the decoding
    /// itself slower only makes arenas earlier than needed, within the same bound.
    const WAITED: std::time::Duration = std::time::Duration::from_micros(100);

    /// How long the records since the last look took, if they waited; `len` is the
    /// record just decoded.
    fn waited(&mut self, len: u64) -> Option<std::time::Duration> {
        self.bytes += len;
        if self.bytes < Self::EVERY {
            return None;
        }
        self.bytes = 0;
        let now = std::time::Instant::now();
        let took = now.duration_since(self.since);
        self.since = now;
        (took > Self::WAITED).then_some(took)
    }

    /// Starts the next look's count afresh.
    fn restart(&mut self) {
        *self = Self::default();
    }
}

impl Default for Pace {
    fn default() -> Self {
        Self {
            bytes: 0,
            since: std::time::Instant::now(),
        }
    }
}

/// Segment `path`'s bytes, read into `buffer`'s memory.
fn read_segment(
    backend: &dyn IoBackend,
    path: &Path,
    buffer: &mut Vec<u8>,
) -> Result<Bytes, StoreError> {
    backend
        .read_file_into(path, buffer)
        .map_err(io_err("reading a segment", path))?;
    Ok(Bytes::from(std::mem::take(buffer)))
}

/// Segment `path` mapped, if the backend can map files.
fn map_segment(backend: &dyn IoBackend, path: &Path) -> Result<Option<Bytes>, StoreError> {
    backend
        .map_file(path)
        .map_err(io_err("mapping a segment", path))
}

/// The allocation behind `bytes`, emptied, for the next segment: no copy once no value
/// points into it. A slice still alive elsewhere would make this a fresh, empty buffer
/// instead, which is slower but still correct.
fn reclaim(bytes: Bytes) -> Vec<u8> {
    // Not `Bytes::clear`, which lets go of a `Vec`'s allocation, nor `Vec::from(bytes)`,
    // which moves the whole content onto itself.
    match bytes.try_into_mut() {
        Ok(mut unique) => {
            unique.clear();
            Vec::from(unique)
        }
        Err(_) => Vec::new(),
    }
}

/// Reads the log as it is, beside a writer that may be appending to it and compacting
/// it, without the directory's lock and without changing a byte: a torn tail is where
/// the writer is appending, and is left alone. A segment compaction removes while it is
/// read makes it read again, a few times.
///
/// # Errors
///
/// [`StoreError::NotAStore`] if `dir` holds no segment; [`StoreError::Corrupt`] and
/// [`StoreError::Io`] as for opening.
pub(crate) fn read_only(backend: &dyn IoBackend, dir: &Path) -> Result<State, StoreError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match read_once(backend, dir) {
            Err(StoreError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound && attempt < 5 => {}
            Err(StoreError::Corrupt { .. }) if attempt < 3 => {}
            result => return result,
        }
    }
}

fn read_once(backend: &dyn IoBackend, dir: &Path) -> Result<State, StoreError> {
    let not_a_store = || StoreError::NotAStore {
        dir: dir.to_path_buf(),
    };
    let names = match backend.list_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_a_store()),
        listed => listed.map_err(io_err("listing the store directory", dir))?,
    };
    let mut numbers: Vec<u64> = names
        .iter()
        .filter_map(|name| segment::parse_file_name(name))
        .collect();
    if numbers.is_empty() {
        return Err(not_a_store());
    }
    numbers.sort_unstable();
    check_segment_numbers(dir, &numbers)?;
    Ok(replay(backend, dir, &numbers, false, |_, _| Ok(()))?
        .applied
        .state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ProcId;
    use crate::wal::record::KIND_BATCH;

    /// A segment of `records` records, each its own group (synced before the next).
    fn log(records: usize) -> Vec<u8> {
        let mut bytes = segment::encode_header(1, 1).to_vec();
        for seq in 1..=records as u64 {
            let change = Change::Delete { id: seq };
            let mut record = record::encode(KIND_BATCH, seq, None, &[change]).unwrap();
            record::mark_group_start(&mut record);
            bytes.extend(record);
        }
        bytes
    }

    /// Issue 12, point 14: damage followed only by records of its own group (written in
    /// the same unsynced `write`) is a torn tail; followed by a group start, corruption.
    #[test]
    fn p14_damage_inside_the_last_group_is_a_torn_tail() {
        let mut bytes = log(1);
        let synced = bytes.len();
        // One group of three records: only the first is marked.
        for seq in 2..=4u64 {
            let change = Change::Delete { id: seq };
            let mut record = record::encode(KIND_BATCH, seq, None, &[change]).unwrap();
            if seq == 2 {
                record::mark_group_start(&mut record);
            }
            bytes.extend(record);
        }
        // The group's first page was lost, its later ones written.
        let mut holed = bytes.clone();
        holed[synced..synced + 40].fill(0);
        let torn = scan(&holed, true).unwrap();
        assert_eq!(torn.records.len(), 1);
        assert_eq!(torn.valid_len, synced as u64);
        // Damage before the synced group start is still corruption.
        let mut damaged = bytes.clone();
        damaged[SEGMENT_HEADER_LEN + RECORD_HEADER_LEN] ^= 1;
        assert!(matches!(
            scan(&damaged, true),
            Err(StoreError::Corrupt { .. })
        ));
    }

    fn scan(bytes: &[u8], is_last: bool) -> Result<SegmentScan, StoreError> {
        scan_segment(Path::new("seg"), 1, &Bytes::copy_from_slice(bytes), is_last)
    }

    #[test]
    fn clean_log_scans_fully() {
        let bytes = log(3);
        let scan = scan(&bytes, true).unwrap();
        assert_eq!(scan.records.len(), 3);
        assert_eq!(scan.valid_len, bytes.len() as u64);
        assert!(scan.torn.is_none());
    }

    #[test]
    fn torn_tail_is_cut_at_the_last_valid_record() {
        let full = log(3);
        let two = log(2).len();
        for cut in two + 1..full.len() {
            let scan = scan(&full[..cut], true).unwrap();
            assert_eq!(scan.records.len(), 2, "cut at {cut}");
            assert_eq!(scan.valid_len, two as u64);
        }
        // Trailing zeros, as a file extended by a crash may show.
        let mut zeros = full.clone();
        zeros.extend([0; 100]);
        assert_eq!(scan(&zeros, true).unwrap().records.len(), 3);
    }

    #[test]
    fn damage_before_valid_records_is_corruption() {
        let mut bytes = log(3);
        let second = log(1).len();
        bytes[second + RECORD_HEADER_LEN + 1] ^= 1;
        let err = scan(&bytes, true).unwrap_err();
        match err {
            StoreError::Corrupt { offset, reason, .. } => {
                assert_eq!(offset, second as u64);
                assert!(reason.contains("checksum"), "{reason}");
            }
            other => panic!("{other}"),
        }
        // In a closed segment even a torn-looking tail is corruption.
        let bytes = log(3);
        assert!(matches!(
            scan(&bytes[..bytes.len() - 1], false),
            Err(StoreError::Corrupt { .. })
        ));
    }

    /// Writes segment `number` in the format before the header recorded its first
    /// sequence number, holding records `seqs`.
    fn write_old_segment(
        sim: &crate::io::SimBackend,
        number: u64,
        seqs: std::ops::RangeInclusive<u64>,
    ) {
        let mut bytes = segment::encode_header(number, FIRST_SEQ_UNKNOWN).to_vec();
        for seq in seqs {
            let change = Change::Delete { id: seq };
            bytes.extend(record::encode(KIND_BATCH, seq, None, &[change]).unwrap());
        }
        let path = segment::path(Path::new("/store"), number);
        sim.create_dir_all(Path::new("/store")).unwrap();
        sim.create_file(&path).unwrap().append(&bytes).unwrap();
    }

    /// Issue 12, point 12: segments written before the header recorded a first sequence
    /// number (0 there) still open, and their records are still checked for gaps.
    #[test]
    fn p12_segments_without_a_first_sequence_number_still_open() {
        let dir = Path::new("/store");
        let sim = crate::io::SimBackend::new();
        write_old_segment(&sim, 1, 1..=3);
        write_old_segment(&sim, 2, 4..=5);
        assert_eq!(recover(&sim, dir, true, true).unwrap().next_seq, 6);
        // A record missing between them is still found.
        let sim = crate::io::SimBackend::new();
        write_old_segment(&sim, 1, 1..=2);
        write_old_segment(&sim, 2, 4..=5);
        let Err(StoreError::Corrupt { file, reason, .. }) = recover(&sim, dir, true, true) else {
            panic!("a missing record went unnoticed");
        };
        assert_eq!(file, segment::path(dir, 2));
        assert!(reason.contains("missing"), "{reason}");
    }

    /// Writes segment `number` of a store in `dir` on `backend`: one record per batch of
    /// `batches`, numbered from `first_seq`, each starting a group.
    fn write_segment(
        backend: &dyn IoBackend,
        dir: &Path,
        number: u64,
        first_seq: u64,
        batches: &[Vec<Change>],
    ) {
        let mut bytes = segment::encode_header(number, first_seq).to_vec();
        for (seq, changes) in (first_seq..).zip(batches) {
            let mut record = record::encode(KIND_BATCH, seq, None, changes).unwrap();
            record::mark_group_start(&mut record);
            bytes.extend(record);
        }
        backend.create_dir_all(dir).unwrap();
        let file = backend.create_file(&segment::path(dir, number)).unwrap();
        file.append(&bytes).unwrap();
    }

    fn put(id: ProcId, value: &[u8]) -> Change {
        Change::Put {
            id,
            parent: None,
            finished: false,
            value: Bytes::copy_from_slice(value),
        }
    }

    /// The pace looks at the clock once every `EVERY` bytes of records, and tells how
    /// long they took when it is longer than decoding them from memory takes; one large
    /// record counts as much as many small ones.
    #[test]
    fn the_pace_tells_a_wait_for_the_disk() {
        let mut pace = Pace::default();
        std::thread::sleep(std::time::Duration::from_millis(2));
        for _ in 1..Pace::EVERY / 1024 {
            assert_eq!(pace.waited(1024), None, "not a look yet");
        }
        let waited = pace.waited(1024).expect("the records waited");
        assert!(waited >= std::time::Duration::from_millis(2));
        pace.restart();
        assert_eq!(pace.bytes, 0);
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(
            pace.waited(Pace::EVERY).is_some(),
            "one record of EVERY bytes"
        );
    }

    /// Issue 16: a recovered value is copied out of a segment that was read, or that is
    /// mostly dead. As a slice of the segment it was read from, it kept that whole
    /// segment in memory, superseded records and all. Issue 33: the copies of one
    /// segment's live values are packed side by side in one arena, in id order, with
    /// nothing between them (in the segment, record headers and superseded values lay
    /// between). Also: reading a shorter segment into the buffer a longer one used leaves
    /// every value intact. On both backends (the real one reuses the buffer's memory),
    /// with the real one's mapping turned off.
    #[test]
    fn recovered_values_are_copied_out_side_by_side() {
        let long = vec![7; 5000];
        let first = [
            vec![put(1, b"superseded"), put(2, &long)],
            vec![put(1, b"one"), put(3, b"deleted later")],
            vec![Change::Delete { id: 3 }, put(4, b"moved on")],
        ];
        let second = [vec![put(4, b"four"), put(5, b"five")]];
        let temp = tempfile::tempdir().unwrap();
        let sim = crate::io::SimBackend::new();
        let backends: [(&dyn IoBackend, &Path); 2] = [
            (&crate::io::FsBackend, temp.path()),
            (&sim, Path::new("/store")),
        ];
        for (backend, dir) in backends {
            write_segment(backend, dir, 1, 1, &first);
            write_segment(backend, dir, 2, 4, &second);
            let recovered = recover(backend, dir, false, false).unwrap();
            assert!(recovered.kept.is_empty(), "nothing was mapped");
            let state = recovered.state;
            let values: Vec<(ProcId, &[u8])> = state
                .records
                .iter()
                .map(|(id, record)| (*id, &record.value[..]))
                .collect();
            let expected: [(ProcId, &[u8]); 4] =
                [(1, b"one"), (2, &long), (4, b"four"), (5, b"five")];
            assert_eq!(values, expected);
            assert!(
                adjacent(&state, 1, 2),
                "segment 1's live values are not packed"
            );
            assert!(
                adjacent(&state, 4, 5),
                "segment 2's live values are not packed"
            );
        }
    }

    /// Whether the values of `a` and `b` lie side by side in memory.
    fn adjacent(state: &State, a: ProcId, b: ProcId) -> bool {
        let (a, b) = (&state.records[&a].value, &state.records[&b].value);
        a.as_ptr().wrapping_add(a.len()) == b.as_ptr()
    }

    /// Issue 33: a mapped segment whose live values fill three quarters of it or more
    /// keeps them where they are, slices of its mapping, and is [`Kept`] under its
    /// number; a mostly dead one's values are copied out, packed. A kept segment that
    /// later segments leave mostly dead is copied out at the end after all.
    #[test]
    fn a_mostly_live_mapped_segment_keeps_its_values_in_place() {
        let long = vec![7; 5000];
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let backend = crate::io::FsBackend;
        // Segment 1: 5,000 + 3 live bytes of about 5,100. Segment 2: 8 of about 100.
        write_segment(&backend, dir, 1, 1, &[vec![put(1, b"one"), put(2, &long)]]);
        write_segment(
            &backend,
            dir,
            2,
            2,
            &[vec![put(4, b"four"), put(5, b"five")]],
        );
        let recovered = recover(&backend, dir, false, true).unwrap();
        let kept: Vec<u64> = recovered.kept.keys().copied().collect();
        assert_eq!(kept, [1], "only the mostly live segment is kept");
        let mapping = &recovered.kept[&1];
        let records = &recovered.state.records;
        for id in [1, 2] {
            assert!(
                lies_in(&records[&id].value, mapping),
                "value {id} was copied"
            );
        }
        assert_eq!(&records[&2].value[..], &long[..]);
        assert!(
            !adjacent(&recovered.state, 1, 2),
            "a record header lies between"
        );
        assert!(
            adjacent(&recovered.state, 4, 5),
            "segment 2's values are not packed"
        );
        drop(recovered);

        // A third segment deletes the long value: segment 1 is now mostly dead.
        write_segment(&backend, dir, 3, 3, &[vec![Change::Delete { id: 2 }]]);
        let recovered = recover(&backend, dir, false, true).unwrap();
        assert!(
            recovered.kept.is_empty(),
            "segment 1 is kept though mostly dead"
        );
        assert_eq!(&recovered.state.records[&1].value[..], b"one");
    }

    /// Whether `value` lies within `mapping`.
    fn lies_in(value: &Bytes, mapping: &std::ops::Range<usize>) -> bool {
        let at = value.as_ptr() as usize;
        at >= mapping.start && at + value.len() <= mapping.end
    }

    /// The buffer a segment was read into comes back for the next one, emptied, with its
    /// memory: no copy, no new allocation. While a slice of it lives elsewhere it cannot.
    #[test]
    fn reclaim_keeps_the_allocation_only_when_nothing_points_into_it() {
        // `Bytes` holds a full `Vec` and a partly filled one differently: try both.
        let full = vec![1; 64];
        let mut partly = Vec::with_capacity(128);
        partly.resize(64, 1);
        for buffer in [full, partly] {
            let (at, capacity) = (buffer.as_ptr(), buffer.capacity());
            let bytes = Bytes::from(buffer);
            drop(bytes.slice(1..3));
            let back = reclaim(bytes);
            assert!(back.is_empty());
            assert_eq!((back.as_ptr(), back.capacity()), (at, capacity));
        }
        let bytes = Bytes::from(vec![1; 64]);
        let value = bytes.slice(1..3);
        assert_eq!(reclaim(bytes).capacity(), 0);
        assert_eq!(value, [1, 1][..]);
    }

    /// Issue 12, point 14: a version 1 segment, which marks no group starts, still opens,
    /// under version 1's rule: damage before any valid record is corruption.
    #[test]
    fn p14_version_1_segments_are_read_with_the_old_rule() {
        let mut bytes = segment::encode_header(1, FIRST_SEQ_UNKNOWN).to_vec();
        bytes[8..10].copy_from_slice(&1u16.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..28]);
        bytes[28..32].copy_from_slice(&crc.to_le_bytes());
        for seq in 1..=3u64 {
            let change = Change::Delete { id: seq };
            bytes.extend(record::encode(KIND_BATCH, seq, None, &[change]).unwrap());
        }
        assert_eq!(scan(&bytes, true).unwrap().records.len(), 3);
        bytes[SEGMENT_HEADER_LEN + 1] ^= 1;
        assert!(matches!(
            scan(&bytes, true),
            Err(StoreError::Corrupt { offset: 32, .. })
        ));
    }
}
