//! Where recovered values live: copied out of the segment buffer they were read into,
//! side by side in arenas, and the record map they hang from.
//!
//! Decoding makes every value a slice of its segment's buffer, superseded ones included.
//! Once the next segment has been applied too, the values of a segment still live are
//! copied out ([`Arenas::copy_out`]), so its buffer can be reused: left as slices, a few
//! live values kept a whole segment in memory, and after a restart the store held the
//! log's size on disk, about twice its live values (issue 16).
//!
//! The copies go into arenas of up to [`ARENA_BYTES`], not one allocation each: a value
//! of its own cost its allocation's header and rounding and, once shared with the
//! executor, the shared count `Bytes` adds (about 45 bytes per value), and a call to the
//! allocator (issue 33). An arena lives while any of its values does. A procedure that
//! ended in one segment is often deleted in the next: copied at its own segment's end, at
//! 1,000,000 procedures such values left 48 MB of holes in 653 MB of arenas, hence the
//! wait for the next segment. What still dies later is handled at the end of the replay:
//! the values of arenas less than three quarters used are copied again, packed
//! ([`Arenas::finish`]).
//!
//! A full arena's memory may have been made earlier, while the replay waited for the
//! disk ([`Arenas::make_ahead_for`]): fresh memory is slow to come by, and a cold replay
//! has time it would otherwise spend waiting.
//!
//! A mapped segment is judged by [`WINDOW`]s of a mebibyte: the live values of a window
//! that fill at least three quarters of it are not copied at all. They stay slices of
//! the mapping, which is [`Kept`] for as long as any of them lives, and the other
//! windows' pages are let go (`IoBackend::release_mapped`). The copy of a mostly live
//! window cost as much memory (its values, less only the record headers and the few
//! superseded values between them) and more time: fresh pages for the copies (1.4–2.3 µs
//! per 4 KiB on the bench's machine) and the copy, against pages the replay has read
//! into the page cache already. On the restart bench's quick log (one segment, 84 %
//! live) a cold restart took 31–35 ms against 41–51 ms (issue 33). The rule is the one
//! arenas follow at the end of the replay ([`Arenas::finish`]), which applies it to kept
//! windows too: one that later segments left sparse is copied after all. Compaction
//! copies a kept segment's values out before the segment goes (`compaction.rs`), so that
//! no value keeps a deleted file's space.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use crate::store::{ProcId, Record};

/// The most bytes of values one arena holds. A procedure that outlives the others of its
/// arena keeps this much, at most, in memory (and no more than its arena's values at the
/// restart).
const ARENA_BYTES: usize = 256 * 1024;

/// The address ranges of mapped segments whose live values were left where they are,
/// by segment number: the store copies them out when it compacts the segment
/// (`compaction.rs`).
///
/// Ranges, not the mappings: a mapping lives only as long as a value in it does. A range
/// whose mapping went may come to hold other memory; compaction then copies the values
/// found there once more, which costs a copy and changes no value.
pub(crate) type Kept = BTreeMap<u64, Range<usize>>;

/// The bytes of a mapped segment judged together: where the live values of a window
/// fill at least three quarters of it, they stay in the mapping; the others are copied
/// out and the window's pages are let go ([`Segment::windows`]). A value belongs to the
/// window it starts in.
///
/// Why windows, not whole segments: a segment holds a procedure's updates and, later,
/// compaction's rewrite of the live ones, so its dead bytes gather at its start. Judged
/// whole, the restart bench's 39 MB segment, 77 % live, stayed, keeping 9 MB of dead
/// values resident; a 46 MB one, 55 % live, was copied whole, its 26 MB of live values
/// lying side by side at its end included. A mebibyte is a multiple of any page size
/// the store runs on, so a window is whole pages from the mapping's page-aligned start.
pub(crate) const WINDOW: usize = 1 << 20;

/// A segment the replay has read, and what of it is still current.
pub(crate) struct Segment {
    pub(crate) number: u64,
    /// The buffer or mapping it was read into.
    pub(crate) bytes: Bytes,
    /// Mapped: its values may stay where they are.
    mapped: bool,
    /// The ids it put, in order, repeats allowed.
    put: Vec<ProcId>,
    /// The bytes of its values that are still current, by [`WINDOW`].
    live: Vec<usize>,
}

impl Segment {
    pub(crate) fn new(number: u64, bytes: Bytes, mapped: bool) -> Self {
        Segment {
            number,
            live: vec![0; bytes.len().div_ceil(WINDOW)],
            bytes,
            mapped,
            put: Vec::new(),
        }
    }

    /// Procedure `id` now has `value`, a slice of this segment.
    pub(crate) fn put(&mut self, id: ProcId, value: &Bytes) {
        self.put.push(id);
        if let Some(window) = self.window_of(value) {
            self.live[window] += value.len();
        }
    }

    /// `value` is no longer current: if it lies in this segment, counts it out and
    /// returns `true`.
    pub(crate) fn replaced(&mut self, value: &Bytes) -> bool {
        let window = self.window_of(value);
        if let Some(window) = window {
            self.live[window] -= value.len();
        }
        window.is_some()
    }

    /// The window `value` starts in, if it lies in this segment.
    fn window_of(&self, value: &Bytes) -> Option<usize> {
        let start = self.bytes.as_ptr() as usize;
        lies_in(value, &self.bytes).then(|| (value.as_ptr() as usize - start) / WINDOW)
    }

    /// Window `window`'s offsets in the segment.
    fn window(&self, window: usize) -> Range<usize> {
        window_range(window, self.bytes.len())
    }

    /// The windows whose values stay where they are ([`Arenas::copy_out`]), now that
    /// the segment has been read whole: its windows that are mapped, hold live values
    /// and are not [sparse]. The others' values are copied.
    fn windows(&self) -> Vec<bool> {
        (0..self.live.len())
            .map(|window| self.live[window] > 0 && self.may_stay(window, self.bytes.len()))
            .collect()
    }

    /// Whether window `window` may still stay, the segment's first `read` bytes read: it
    /// would if every byte of it not read yet were a live value. Judged on the bytes
    /// read alone, a window looked sparse until its end whenever its replaced values lay
    /// early.
    fn may_stay(&self, window: usize, read: usize) -> bool {
        let range = self.window(window);
        let unread = range.end.saturating_sub(read.max(range.start));
        self.mapped && !sparse(self.live[window] + unread, range.len())
    }

    /// The bytes of the current values whose copy is certain by now, the segment's first
    /// `read` bytes read: those of the windows that can no longer stay. (Later segments
    /// only take values away.)
    pub(crate) fn certain_copy(&self, read: usize) -> usize {
        (0..self.live.len())
            .filter(|&window| !self.may_stay(window, read))
            .map(|window| self.live[window])
            .sum()
    }
}

/// The arenas made so far that values still use.
#[derive(Default)]
pub(crate) struct Arenas {
    made: Vec<Arc<Memory>>,
    /// Memory for full arenas made while the replay waited for the disk
    /// ([`Arenas::make_ahead`]), not used yet.
    ahead: Vec<memmap2::MmapMut>,
    /// Mapped segments some of whose values were left in place: held while the replay
    /// runs, so that no arena is made in their place meanwhile.
    kept: Vec<KeptSegment>,
    /// The address ranges of the arenas made and of the kept windows, by address, each
    /// with the bytes of its values still current: counted down as the replay replaces
    /// values ([`Arenas::replaced`]), so that its end knows which are sparse without a
    /// walk over every record. Two walks over the quick restart bench's 25,000 records
    /// (a search of these ranges per value, each value a cache miss) were 1.5 ms of a
    /// 15 ms open, most of the time for nothing.
    regions: Vec<Used>,
}

/// A mapped segment some of whose windows stay ([`Segment::windows`]).
struct KeptSegment {
    number: u64,
    bytes: Bytes,
    /// Whether each window still stays.
    stays: Vec<bool>,
}

impl KeptSegment {
    /// The address ranges of its windows, each with whether it stays.
    fn windows(&self) -> impl Iterator<Item = (Range<usize>, bool)> + '_ {
        let start = self.bytes.as_ptr() as usize;
        self.stays.iter().enumerate().map(move |(window, &stays)| {
            let range = window_range(window, self.bytes.len());
            (start + range.start..start + range.end, stays)
        })
    }
}

/// The offsets of window `window` of a segment of `len` bytes (the last one may be
/// shorter).
fn window_range(window: usize, len: usize) -> Range<usize> {
    window * WINDOW..((window + 1) * WINDOW).min(len)
}

impl Arenas {
    /// Makes the memory of one full arena now, for a later copy, unless `bound` bytes
    /// are made ahead already (a segment cannot leave more live values than it put).
    ///
    /// Why ahead: fresh memory costs the kernel's zeroing and mapping of every page,
    /// 1.4–2.3 µs per 4 KiB on the bench's machine, about the speed of reading the log
    /// cold. A cold replay waits for the disk where its decoding overtakes the reads
    /// ahead; making arenas then, rather than when their values are copied, does that
    /// work in time otherwise spent waiting (issue 33). A thread of its own making them
    /// made the replay slower instead (docs/BENCHMARKS.md, stop 46).
    ///
    /// Returns whether it made one.
    fn make_ahead(&mut self, bound: usize) -> bool {
        if (self.ahead.len() + 1) * ARENA_BYTES > bound {
            return false;
        }
        let made = populated(ARENA_BYTES);
        let any = made.is_some();
        self.ahead.extend(made);
        any
    }

    /// [`make_ahead`](Self::make_ahead) for about `time`, or until `bound`.
    pub(crate) fn make_ahead_for(&mut self, time: std::time::Duration, bound: usize) {
        let until = std::time::Instant::now() + time;
        while self.make_ahead(bound) && std::time::Instant::now() < until {}
    }

    /// `value` is no longer current: if it lies in an arena or a kept window, counts it
    /// out there and returns `true`.
    pub(crate) fn replaced(&mut self, value: &Bytes) -> bool {
        let Some(at) = find(&self.regions, value) else {
            return false;
        };
        let region = &mut self.regions[at];
        debug_assert!(region.live >= value.len(), "a value counted in its region");
        region.live = region.live.saturating_sub(value.len());
        true
    }

    /// Gives each record `segment` put whose value still lies in it a copy of its value,
    /// packed in new arenas, but for values in the windows that stay
    /// ([`Segment::windows`]): those are left where they are, and the segment is kept.
    /// `release` is told of each window of a kept segment that no value lies in any more.
    /// Arenas none of whose values are live any more are let go. Returns the segment's
    /// bytes.
    pub(crate) fn copy_out(
        &mut self,
        records: &mut BTreeMap<ProcId, Record>,
        segment: Segment,
        release: &dyn Fn(&[u8]),
    ) -> Bytes {
        let stays = segment.windows();
        let Segment {
            number,
            bytes,
            put,
            live,
            ..
        } = segment;
        let kept = KeptSegment {
            number,
            bytes: bytes.clone(),
            stays,
        };
        let staying: Vec<Range<usize>> = kept.windows().filter_map(staying).collect();
        let region = address_range(&bytes);
        let moves = |value: &Bytes| {
            in_region(value, &region) && !staying.iter().any(|window| in_region(value, window))
        };
        for arena in copy_values(records, put, moves, &mut self.ahead) {
            self.regions.push(Used {
                live: arena.values,
                ..Used::of(arena.memory.bytes())
            });
            self.made.push(arena.memory);
        }
        // Only this list holds them: every value in them was superseded or deleted.
        self.made.retain(|arena| Arc::strong_count(arena) > 1);
        self.regions.retain(|region| region.live > 0);
        if !staying.is_empty() {
            release_windows(&kept, |_| true, release);
            let windows = kept.windows().enumerate().filter(|(_, (_, stays))| *stays);
            self.regions
                .extend(windows.map(|(window, (range, _))| Used {
                    live: live[window],
                    ..Used::at(&range)
                }));
            self.kept.push(kept);
        }
        self.regions.sort_unstable_by_key(|region| region.start);
        bytes
    }

    /// Copies the values of arenas and kept windows less than three quarters used into
    /// new arenas, packed, so that the dead parts of the old ones are freed (a kept
    /// window's pages through `release`). Called once the replay is over; returns the
    /// kept segments that stay.
    pub(crate) fn finish(
        mut self,
        records: &mut BTreeMap<ProcId, Record>,
        release: &dyn Fn(&[u8]),
    ) -> Kept {
        let regions = self.regions;
        // A region with no value left holds nothing to move.
        if regions
            .iter()
            .any(|region| region.live > 0 && region.sparse())
        {
            let moved = records
                .values_mut()
                .filter(|record| {
                    find(&regions, &record.value).is_some_and(|at| regions[at].sparse())
                })
                .collect();
            // The old arenas go as their last values move.
            drop(self.made);
            pack_beside(moved, &mut self.ahead);
        }
        let mut kept = Kept::new();
        for mut segment in self.kept {
            let now_sparse = |window: &Range<usize>| {
                find_at(&regions, window.start).is_none_or(|at| regions[at].sparse())
            };
            let left: Vec<bool> = segment
                .windows()
                .map(|(w, stays)| stays && !now_sparse(&w))
                .collect();
            let was = std::mem::replace(&mut segment.stays, left);
            release_windows(&segment, |window| was[window], release);
            if segment.stays.iter().any(|&stays| stays) {
                kept.insert(segment.number, address_range(&segment.bytes));
            }
        }
        kept
    }
}

/// A window's range if it stays.
fn staying((window, stays): (Range<usize>, bool)) -> Option<Range<usize>> {
    stays.then_some(window)
}

/// Tells `release` of each window of `segment` that does not stay and `was_kept` says
/// held values until now: no value lies in it any more, and its pages need not stay in
/// memory.
fn release_windows(
    segment: &KeptSegment,
    was_kept: impl Fn(usize) -> bool,
    release: &dyn Fn(&[u8]),
) {
    let start = segment.bytes.as_ptr() as usize;
    for (window, (range, stays)) in segment.windows().enumerate() {
        if !stays && was_kept(window) {
            release(&segment.bytes[range.start - start..range.end - start]);
        }
    }
}

/// Where `bytes` lie in memory.
fn address_range(bytes: &[u8]) -> Range<usize> {
    let start = bytes.as_ptr() as usize;
    start..start + bytes.len()
}

/// Gives each record of `ids` whose value lies in `segment` (a kept one's range) a copy
/// of it, packed in new arenas: the segment is about to be deleted.
pub(crate) fn copy_out_of(
    records: &mut BTreeMap<ProcId, Record>,
    ids: Vec<ProcId>,
    segment: Range<usize>,
) {
    // The arenas live on in their values.
    let moves = |value: &Bytes| in_region(value, &segment);
    copy_values(records, ids, moves, &mut Vec::new());
}

/// Gives each record of `ids` (in any order, repeats allowed) whose value `moves` a copy
/// of it, packed in new arenas, and returns them. A record put again since, or deleted,
/// has a value elsewhere, which does not move.
fn copy_values(
    records: &mut BTreeMap<ProcId, Record>,
    mut ids: Vec<ProcId>,
    moves: impl Fn(&Bytes) -> bool,
    ahead: &mut Vec<memmap2::MmapMut>,
) -> Vec<Filled> {
    ids.sort_unstable();
    ids.dedup();
    let values = in_order(records, &ids)
        .filter(|record| moves(&record.value))
        .collect();
    pack_beside(values, ahead)
}

/// The records of `ids` (sorted, distinct) that `records` has, in id order: one walk over
/// the map's range of them rather than a search per id. Replay's searches were a fifth
/// of the copying's time (issue 33).
fn in_order<'a>(
    records: &'a mut BTreeMap<ProcId, Record>,
    ids: &'a [ProcId],
) -> impl Iterator<Item = &'a mut Record> {
    let range = match (ids.first(), ids.last()) {
        (Some(&first), Some(&last)) => records.range_mut(first..=last),
        _ => records.range_mut(1..1),
    };
    let mut wanted = ids.iter().peekable();
    range.filter_map(move |(id, record)| {
        while wanted.next_if(|&&w| w < *id).is_some() {}
        wanted.next_if_eq(&id).map(|_| record)
    })
}

/// Whether `value` is a non-empty slice of `buffer` (an empty one holds on to nothing).
fn lies_in(value: &Bytes, buffer: &Bytes) -> bool {
    in_region(value, &address_range(buffer))
}

/// Whether `value` is non-empty and starts within `region`.
fn in_region(value: &Bytes, region: &Range<usize>) -> bool {
    !value.is_empty() && region.contains(&(value.as_ptr() as usize))
}

/// An arena's address range, and the bytes of live values in it.
struct Used {
    start: usize,
    len: usize,
    live: usize,
}

impl Used {
    fn of(bytes: &[u8]) -> Self {
        Used::at(&address_range(bytes))
    }

    fn at(range: &Range<usize>) -> Self {
        Used {
            start: range.start,
            len: range.len(),
            live: 0,
        }
    }

    fn sparse(&self) -> bool {
        sparse(self.live, self.len)
    }
}

/// Less than three quarters of `len` bytes is live: the values are worth copying
/// together, so that the rest is freed.
fn sparse(live: usize, len: usize) -> bool {
    live * 4 < len * 3
}

/// The index of the arena `value` lies in, if any (`arenas` sorted by address).
fn find(arenas: &[Used], value: &Bytes) -> Option<usize> {
    if value.is_empty() {
        return None;
    }
    find_at(arenas, value.as_ptr() as usize)
}

/// The index of the region address `at` lies in, if any (`regions` sorted by address).
fn find_at(arenas: &[Used], at: usize) -> Option<usize> {
    let index = arenas
        .partition_point(|arena| arena.start <= at)
        .checked_sub(1)?;
    (at < arenas[index].start + arenas[index].len).then_some(index)
}

/// [`pack`], on two threads when there is enough to copy: the copy reads values the
/// replay last touched long ago, and one core copied them at about 4 GB/s, bound by
/// waiting for memory (the end of a replay on the restart bench: 7 ms for 25 MB, where a
/// second thread copying the other half made it 4). Where no thread can start, one packs
/// all.
fn pack_beside(mut values: Vec<&mut Record>, ahead: &mut Vec<memmap2::MmapMut>) -> Vec<Filled> {
    let total: usize = values.iter().map(|record| record.value.len()).sum();
    if total < PACK_BESIDE_FROM {
        return pack(values, ahead);
    }
    // Split where half the bytes are, each half taking half the memory made ahead.
    let mut sum = 0;
    let half = values
        .iter()
        .position(|record| {
            sum += record.value.len();
            sum >= total / 2
        })
        .map_or(values.len(), |at| at + 1);
    // Behind a lock only to be taken back if the thread cannot start.
    let second = std::sync::Mutex::new(Some((
        values.split_off(half),
        ahead.split_off(ahead.len() / 2),
    )));
    // The second half packed, with what is left of its memory, by whichever thread
    // takes it first.
    let pack_second = || {
        let taken = second.lock().unwrap_or_else(|e| e.into_inner()).take();
        taken.map(|(values, mut ahead)| (pack(values, &mut ahead), ahead))
    };
    std::thread::scope(|scope| {
        let other = std::thread::Builder::new()
            .name("procflow-copy".into())
            .spawn_scoped(scope, pack_second);
        let mut made = pack(values, ahead);
        let (made_second, mut ahead_second) = match other {
            // `pack` only copies and allocates: it cannot panic but by a bug.
            Ok(other) => other.join().expect("the copying thread does not panic"),
            Err(_) => None,
        }
        .or_else(pack_second)
        .unwrap_or_default();
        made.extend(made_second);
        ahead.append(&mut ahead_second);
        made
    })
}

/// The bytes of values worth a second thread copying half of them: four arenas.
const PACK_BESIDE_FROM: usize = 4 * ARENA_BYTES;

/// Copies `values` into new arenas, side by side in the given order, and points the
/// records at the copies; returns the arenas.
fn pack(mut values: Vec<&mut Record>, ahead: &mut Vec<memmap2::MmapMut>) -> Vec<Filled> {
    let mut made = Vec::new();
    let mut rest = values.as_mut_slice();
    while !rest.is_empty() {
        // At least one value, however large; then as many as fit.
        let mut len = rest[0].value.len();
        let mut count = 1;
        while let Some(next) = rest.get(count).map(|record| record.value.len()) {
            if len + next > ARENA_BYTES {
                break;
            }
            len += next;
            count += 1;
        }
        let (group, after) = rest.split_at_mut(count);
        made.push(fill_arena(group, fresh(len, ahead)));
        rest = after;
    }
    made
}

/// Memory for an arena whose values take `len` bytes: memory made ahead if `len` fills
/// most of it (the last arena of a copy is often small, and would waste the rest), else
/// made now.
fn fresh(len: usize, ahead: &mut Vec<memmap2::MmapMut>) -> Memory {
    if len > ARENA_BYTES / 4 * 3 && len <= ARENA_BYTES {
        if let Some(map) = ahead.pop() {
            return Memory::Mapped(map);
        }
    }
    // A small arena is zeroed before it is filled: one `calloc`, next to the copy.
    populated(len).map_or_else(|| Memory::Heap(vec![0; len]), Memory::Mapped)
}

/// An arena just filled, and the bytes of the values in it.
struct Filled {
    memory: Arc<Memory>,
    values: usize,
}

/// An arena in `memory` holding the values of `group`, which become slices of it.
fn fill_arena(group: &mut [&mut Record], mut memory: Memory) -> Filled {
    let mut free = memory.bytes_mut();
    for record in group.iter() {
        let (into, rest) = free.split_at_mut(record.value.len());
        into.copy_from_slice(&record.value);
        free = rest;
    }
    let memory = Arc::new(memory);
    let arena = Bytes::from_owner(Owner(Arc::clone(&memory)));
    let mut at = 0;
    for record in group.iter_mut() {
        let end = at + record.value.len();
        record.value = arena.slice(at..end);
        at = end;
    }
    Filled { memory, values: at }
}

/// An arena's bytes.
///
/// Values hold it as [`Bytes`] made from an [`Owner`]; the list of arenas holds a second
/// `Arc`, whose count says when no value uses it any more (a `Bytes` made from an owner
/// never reports itself unique).
enum Memory {
    /// Anonymous memory of its own ([`populated`]).
    Mapped(memmap2::MmapMut),
    Heap(Vec<u8>),
}

impl Memory {
    fn bytes(&self) -> &[u8] {
        match self {
            Memory::Mapped(map) => map,
            Memory::Heap(vec) => vec,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Memory::Mapped(map) => map,
            Memory::Heap(vec) => vec,
        }
    }
}

/// What the values' [`Bytes`] keep alive.
struct Owner(Arc<Memory>);

impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// The smallest arena worth a mapping of its own.
const MAPPED_FROM: usize = 64 * 1024;

/// Fresh memory of `len` bytes for an arena, its pages already in, if it is large enough
/// to be mapped and the system maps it (it limits a process's mappings).
///
/// Why mapped, and populated: an arena is fresh memory, and filling it faulted its pages
/// in one by one, 4 KiB at a time; a mapping populated when made takes them in one call.
/// The faults were about a third of the copying's time (issue 33).
fn populated(len: usize) -> Option<memmap2::MmapMut> {
    if len < MAPPED_FROM {
        return None;
    }
    memmap2::MmapOptions::new()
        .len(len)
        .populate()
        .map_anon()
        .ok()
}

/// The same map in full nodes. Replay inserts ids in about ascending order and deletes
/// ended ones, which leaves a B-tree's leaves about 60 % full (7 of 11 entries measured
/// after workload 6's restart). `append` onto a non-empty map merges both in order into
/// nodes it fills completely (but the right edge), freeing each old node as it is read:
/// the new nodes take the old ones' place, and no list of every entry is made, as
/// `collect` would. About 45 bytes less per live record for as long as the store is open.
pub(crate) fn repack(mut records: BTreeMap<ProcId, Record>) -> BTreeMap<ProcId, Record> {
    let mut packed = BTreeMap::new();
    if let Some((id, record)) = records.pop_first() {
        packed.insert(id, record);
        packed.append(&mut records);
    }
    packed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bytes` as a segment that was read, not mapped, and put `ids`: its values are
    /// always copied.
    fn unmapped(bytes: &Bytes, ids: Vec<ProcId>) -> Segment {
        Segment {
            put: ids,
            ..Segment::new(1, bytes.clone(), false)
        }
    }

    /// A segment's buffer holding a value of `len` bytes per id (each byte the id), and
    /// the records, whose values are slices of it, as decoding leaves them.
    fn segment(
        ids: std::ops::RangeInclusive<ProcId>,
        len: usize,
    ) -> (Bytes, BTreeMap<ProcId, Record>) {
        let buffer = Bytes::from(
            ids.clone()
                .flat_map(|id| vec![id as u8; len])
                .collect::<Vec<u8>>(),
        );
        let records = ids
            .enumerate()
            .map(|(at, id)| (id, record(id, buffer.slice(at * len..(at + 1) * len))))
            .collect();
        (buffer, records)
    }

    fn address(records: &BTreeMap<ProcId, Record>, id: ProcId) -> usize {
        records[&id].value.as_ptr() as usize
    }

    fn intact(records: &BTreeMap<ProcId, Record>) -> bool {
        records
            .values()
            .all(|r| r.value.iter().all(|&b| b == r.id as u8))
    }

    /// Values are copied out of the segment's buffer, packed side by side, at most
    /// `ARENA_BYTES` per arena, each keeping its bytes; the buffer is then free.
    #[test]
    fn copies_are_packed_in_arenas_of_bounded_size() {
        let len = ARENA_BYTES / 4;
        let (buffer, mut map) = segment(1..=10, len);
        let mut arenas = Arenas::default();
        arenas.copy_out(
            &mut map,
            unmapped(&buffer, (1..=10).rev().collect()),
            &|_| {},
        );
        assert_eq!(arenas.made.len(), 3, "4 + 4 + 2 values");
        assert_eq!(address(&map, 1) + len, address(&map, 2));
        assert!(intact(&map));
        assert!(buffer.is_unique(), "a value still points into the segment");
    }

    /// A copy of more than [`PACK_BESIDE_FROM`] is split between two threads: every value
    /// is copied, each half side by side in id order, each half into its share of the
    /// memory made ahead.
    #[test]
    fn a_large_copy_is_shared_by_two_threads() {
        let len = ARENA_BYTES / 4;
        let mut arenas = Arenas::default();
        for _ in 0..6 {
            assert!(arenas.make_ahead(usize::MAX));
        }
        let ahead: Vec<usize> = arenas.ahead.iter().map(|m| m.as_ptr() as usize).collect();
        let (buffer, mut map) = segment(1..=40, len);
        arenas.copy_out(
            &mut map,
            unmapped(&buffer, (1..=40).rev().collect()),
            &|_| {},
        );
        assert!(intact(&map));
        assert!(buffer.is_unique(), "a value still points into the segment");
        assert_eq!(arenas.made.len(), 10, "full arenas of four values each");
        assert!(arenas.ahead.is_empty(), "both halves used their share");
        for id in (1..40).filter(|id| id % 4 != 0) {
            assert_eq!(address(&map, id) + len, address(&map, id + 1), "id {id}");
        }
        assert!(ahead.contains(&address(&map, 1)), "the first half's share");
        assert!(
            ahead.contains(&address(&map, 21)),
            "the second half's share"
        );
    }

    /// Memory made ahead, up to the bound, becomes the full arenas of the next copy; a
    /// small arena is made to its own size; nothing made ahead is left once used.
    #[test]
    fn memory_made_ahead_becomes_the_full_arenas() {
        let mut arenas = Arenas::default();
        assert!(arenas.make_ahead(2 * ARENA_BYTES));
        assert!(arenas.make_ahead(2 * ARENA_BYTES));
        assert!(!arenas.make_ahead(2 * ARENA_BYTES), "past the bound");
        let ahead: Vec<usize> = arenas.ahead.iter().map(|m| m.as_ptr() as usize).collect();
        let len = ARENA_BYTES / 4;
        let (buffer, mut map) = segment(1..=9, len);
        arenas.copy_out(&mut map, unmapped(&buffer, (1..=9).collect()), &|_| {});
        assert!(intact(&map));
        assert!(buffer.is_unique(), "a value still points into the segment");
        assert!(arenas.ahead.is_empty(), "both were used");
        assert!(ahead.contains(&address(&map, 1)), "ids 1-4 fill one");
        assert!(ahead.contains(&address(&map, 5)), "ids 5-8 fill the other");
        assert!(
            !ahead.contains(&address(&map, 9)),
            "a small arena of its own"
        );
        assert_eq!(arenas.made.len(), 3);
    }

    /// A value put again by a later segment (no longer in this buffer) is not copied.
    #[test]
    fn only_values_still_in_the_buffer_are_copied() {
        let (buffer, mut map) = segment(1..=3, 10);
        let later = Bytes::from(vec![2; 10]);
        map.get_mut(&2).unwrap().value = later.clone();
        let mut arenas = Arenas::default();
        arenas.copy_out(&mut map, unmapped(&buffer, vec![1, 2, 3]), &|_| {});
        assert_eq!(map[&2].value.as_ptr(), later.as_ptr());
        assert_eq!(
            address(&map, 1) + 10,
            address(&map, 3),
            "1 and 3 packed together"
        );
        assert!(intact(&map));
    }

    /// An arena whose values all died is let go at the next segment; at the end, the
    /// values of an arena less than three quarters used move to a new one, packed, and
    /// those of a full one stay where they are.
    #[test]
    fn dead_arenas_are_dropped_and_sparse_ones_repacked_at_the_end() {
        let len = ARENA_BYTES / 4;
        let (buffer, mut map) = segment(1..=12, len);
        let mut arenas = Arenas::default();
        arenas.copy_out(&mut map, unmapped(&buffer, (1..=12).collect()), &|_| {});
        assert_eq!(arenas.made.len(), 3);
        // Arena 1 (ids 1-4) dies whole, arena 2 (5-8) keeps one value, arena 3 stays full.
        remove(&mut map, &mut arenas, [1, 2, 3, 4, 5, 6, 7]);
        arenas.copy_out(&mut map, unmapped(&Bytes::new(), Vec::new()), &|_| {});
        assert_eq!(arenas.made.len(), 2, "the dead arena is let go");
        let (sparse, full) = (address(&map, 8), address(&map, 9));
        let old: Vec<_> = arenas.made.iter().map(Arc::downgrade).collect();
        arenas.finish(&mut map, &|_| {});
        assert_ne!(address(&map, 8), sparse, "the sparse arena's value moved");
        assert_eq!(address(&map, 9), full, "the full arena's values stay");
        let kept = old.iter().filter(|arena| arena.upgrade().is_some()).count();
        assert_eq!(kept, 1, "the sparse arena is gone, the full one stays");
        assert!(intact(&map));
    }

    /// A segment counts the bytes of its values still current, by window: a value put
    /// adds in the window it starts in, one replaced that lies in it takes away there,
    /// one lying elsewhere does not. A window stays if mapped and three quarters live; a
    /// read segment's never does.
    #[test]
    fn a_segment_counts_its_current_values_by_window() {
        let bytes = Bytes::from(vec![0; 2 * WINDOW + 100]);
        let at = |window: usize, offset: usize, len: usize| {
            bytes.slice(window * WINDOW + offset..window * WINDOW + offset + len)
        };
        let quarter = WINDOW / 4;
        let mut segment = Segment::new(1, bytes.clone(), true);
        segment.put(1, &at(0, 0, 2 * quarter));
        segment.put(2, &at(0, 2 * quarter, quarter));
        segment.put(3, &at(1, 0, 2 * quarter));
        segment.put(4, &at(2, 0, 80));
        assert_eq!(
            segment.windows(),
            [true, false, true],
            "3/4, 1/2 and 4/5 live"
        );
        assert!(
            !segment.replaced(&Bytes::from(vec![0; 40])),
            "a value elsewhere"
        );
        assert!(segment.replaced(&at(2, 0, 80)));
        assert_eq!(
            segment.windows(),
            [true, false, false],
            "nothing live in the last"
        );
        assert_eq!(segment.certain_copy(bytes.len()), 2 * quarter);
        // The second window read to 3/4 or less could still be 3/4 live.
        assert_eq!(segment.certain_copy(WINDOW + 3 * quarter), 0);
        assert_eq!(segment.certain_copy(WINDOW + 3 * quarter + 1), 2 * quarter);
        let mut read = Segment::new(2, bytes.clone(), false);
        read.put(1, &at(0, 0, WINDOW));
        assert_eq!(
            read.windows(),
            [false, false, false],
            "a segment read, not mapped"
        );
        assert_eq!(
            read.certain_copy(0),
            WINDOW,
            "its copy is certain from the start"
        );
    }

    /// A mapped segment keeps the values of its windows three quarters live in place and
    /// copies the others', releasing their windows; at the end, a kept window that later
    /// changes left sparse is copied and released too, and a segment with no window
    /// left stays no longer.
    #[test]
    fn mostly_live_windows_stay_and_the_others_are_copied_and_released() {
        let bytes = Bytes::from(vec![7; 3 * WINDOW]);
        let value = |window: usize, n: usize| {
            let len = WINDOW / 8;
            bytes.slice(window * WINDOW + n * len..window * WINDOW + (n + 1) * len)
        };
        // Window 0: 2 of 8 eighths live; window 1: 8 of 8; window 2: 7 of 8.
        let live: Vec<(ProcId, Bytes)> = (0..2)
            .map(|n| value(0, n))
            .chain((0..8).map(|n| value(1, n)))
            .chain((0..7).map(|n| value(2, n)))
            .enumerate()
            .map(|(id, value)| (id as ProcId + 1, value))
            .collect();
        let mut map: BTreeMap<ProcId, Record> = (live.iter().cloned())
            .map(|(id, value)| (id, record(id, value)))
            .collect();
        let mut segment = Segment::new(1, bytes.clone(), true);
        for (id, value) in &live {
            segment.put(*id, value);
        }
        let released = std::cell::RefCell::new(Vec::new());
        let release = |part: &[u8]| {
            let start = part.as_ptr() as usize - bytes.as_ptr() as usize;
            released.borrow_mut().push(start..start + part.len());
        };
        let mut arenas = Arenas::default();
        arenas.copy_out(&mut map, segment, &release);
        let in_window = |map: &BTreeMap<ProcId, Record>, id: ProcId| {
            let at = map[&id].value.as_ptr() as usize;
            let start = bytes.as_ptr() as usize;
            (start..start + bytes.len())
                .contains(&at)
                .then(|| (at - start) / WINDOW)
        };
        assert_eq!(
            (in_window(&map, 1), in_window(&map, 2)),
            (None, None),
            "copied"
        );
        assert!(
            (3..=17).all(|id| in_window(&map, id).is_some()),
            "left in place"
        );
        assert_eq!(released.borrow()[..], [0..WINDOW; 1], "the sparse window");
        assert!(map.values().all(|r| r.value.iter().all(|&b| b == 7)));
        // Window 2 loses three values: 4 of 8 eighths live.
        remove(&mut map, &mut arenas, 11..=13);
        let kept = arenas.finish(&mut map, &release);
        assert_eq!(
            in_window(&map, 14),
            None,
            "copied once its window turned sparse"
        );
        assert_eq!(in_window(&map, 3), Some(1), "a full window stays");
        assert_eq!(*released.borrow(), [0..WINDOW, 2 * WINDOW..3 * WINDOW]);
        assert_eq!(kept.len(), 1, "one window of it stays");
        assert!(map.values().all(|r| r.value.iter().all(|&b| b == 7)));
        // A kept segment whose values all go by the end stays no longer, and its window
        // is released then.
        let full = Bytes::from(vec![9; WINDOW]);
        let mut map = BTreeMap::new();
        let mut segment = Segment::new(2, full.clone(), true);
        for id in 1..=8 {
            let value = full.slice((id - 1) * WINDOW / 8..id * WINDOW / 8);
            segment.put(id as ProcId, &value);
            map.insert(id as ProcId, record(id as ProcId, value));
        }
        let gone = std::cell::Cell::new(0);
        let count = |part: &[u8]| gone.set(gone.get() + part.len());
        let mut arenas = Arenas::default();
        arenas.copy_out(&mut map, segment, &count);
        assert_eq!(gone.get(), 0, "a full window stays");
        remove(&mut map, &mut arenas, 1..=8);
        assert!(arenas.finish(&mut map, &count).is_empty(), "nothing stays");
        assert_eq!(gone.get(), WINDOW, "its window is released");
    }

    fn record(id: ProcId, value: Bytes) -> Record {
        Record {
            id,
            parent: None,
            finished: false,
            value,
        }
    }

    /// Removes `ids` from `map` as the replay does: each value counted out where it lies.
    fn remove(
        map: &mut BTreeMap<ProcId, Record>,
        arenas: &mut Arenas,
        ids: impl IntoIterator<Item = ProcId>,
    ) {
        for id in ids {
            let record = map.remove(&id).expect("a record to remove");
            arenas.replaced(&record.value);
        }
    }

    /// Rebuilt from its entries in order, the map keeps every entry.
    #[test]
    fn repack_keeps_every_record() {
        let (_, mut map) = segment(1..=250, 1);
        map.retain(|id, _| id % 3 != 0);
        let before: Vec<ProcId> = map.keys().copied().collect();
        let after: Vec<ProcId> = repack(map).keys().copied().collect();
        assert_eq!(before, after);
    }
}
