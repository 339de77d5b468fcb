//! Compaction: keeping disk use proportional to live state, not history.
//!
//! [`LiveIndex`] remembers, for every live key, the segment holding its latest change
//! and an estimate of that change's size. When closed segments hold more than
//! [`COMPACTION_RATIO`] times the live bytes, [`compact`] walks the closed segments
//! oldest first: the latest changes still sitting in a segment are rewritten forward as
//! `KIND_COMPACTION` records (with the highest fencing token), and the segment leaves the
//! log; its file is deleted once those records are durable, by the thread that compacted
//! after it let the log's lock go ([`Doomed::delete`](super::writer::Doomed::delete)).
//! The committer thread does it all in one hold of the lock ([`compact`]); a commit that
//! writes its own records plans it under the lock and lands it a few records at a time,
//! encoding each few without the lock ([`Plan`]), so that other commits go on between.
//! Only the oldest segment is ever deleted, so a delete's tombstone can only disappear
//! together with every older change of its key.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash};
use std::ops::Range;

use super::arena::{self, Kept};
use super::record::{self, KIND_COMPACTION};
use super::writer::Writer;
use crate::error::StoreError;
use crate::state::{Change, Key, State};
use crate::store::ProcId;

/// Compact once closed segments exceed this many times the live bytes.
pub(crate) const COMPACTION_RATIO: u64 = 2;

/// Per-change bytes added to the value and key in the live-size estimate, covering the
/// encoding of the change and its share of a record header.
const CHANGE_OVERHEAD: u64 = 48;

/// Where the latest change of every live key is.
#[derive(Debug, Default)]
#[cfg_attr(test, derive(PartialEq))]
pub(crate) struct LiveIndex {
    /// Segment and estimated size of each live record's latest change. Records and
    /// metadata are kept apart: a map keyed by [`Key`] took 40 bytes a slot instead of
    /// 24, for every record, and hashed the variant too.
    procs: HashMap<ProcId, Location, foldhash::fast::RandomState>,
    meta: HashMap<String, Location>,
    per_segment: BTreeMap<u64, u64>,
    live_bytes: u64,
}

/// The segment holding a key's latest change, and that change's estimated size.
type Location = (u64, u64);

/// Sets `key`'s location in `map` to `latest`, or removes it if `None`; returns the
/// location replaced. One lookup: `insert` hands back what it replaces.
fn relocate<K: Hash + Eq, S: BuildHasher>(
    map: &mut HashMap<K, Location, S>,
    key: K,
    latest: Option<Location>,
) -> Option<Location> {
    match latest {
        Some(location) => map.insert(key, location),
        None => map.remove(&key),
    }
}

fn estimated_size(change: &Change) -> u64 {
    let payload = match change {
        Change::Put { value, .. } => value.len(),
        Change::PutMeta { key, value } => key.len() + value.len(),
        Change::Delete { .. } | Change::DeleteMeta { .. } => 0,
    };
    CHANGE_OVERHEAD + payload as u64
}

/// A change as the index takes it ([`LiveIndex::take`]): its key, and where its latest
/// change now is, `None` if it removes the key. Made apart from the index, so that a
/// restart's replay can hand its notes to a thread of its own (`index_beside.rs`).
#[derive(Debug)]
pub(crate) struct Note {
    key: NoteKey,
    latest: Option<Location>,
}

#[derive(Debug)]
enum NoteKey {
    Proc(ProcId),
    Meta(String),
}

impl Note {
    /// `change`, written to `segment`.
    pub(crate) fn of(segment: u64, change: &Change) -> Self {
        let latest = (!change.is_removal()).then(|| (segment, estimated_size(change)));
        let key = match change {
            Change::Put { id, .. } | Change::Delete { id } => NoteKey::Proc(*id),
            Change::PutMeta { key, .. } | Change::DeleteMeta { key } => NoteKey::Meta(key.clone()),
        };
        Self { key, latest }
    }
}

impl LiveIndex {
    /// Records that `change`, written to `segment`, is now the latest for its key.
    pub(crate) fn note(&mut self, segment: u64, change: &Change) {
        self.take(Note::of(segment, change));
    }

    /// Records what `note` says: the latest change of its key.
    pub(crate) fn take(&mut self, note: Note) {
        let Note { key, latest } = note;
        let replaced = match key {
            NoteKey::Proc(id) => relocate(&mut self.procs, id, latest),
            NoteKey::Meta(key) => relocate(&mut self.meta, key, latest),
        };
        if let Some((old_segment, size)) = replaced {
            self.live_bytes -= size;
            if let Some(bytes) = self.per_segment.get_mut(&old_segment) {
                *bytes -= size;
                if *bytes == 0 {
                    self.per_segment.remove(&old_segment);
                }
            }
        }
        if let Some((segment, size)) = latest {
            *self.per_segment.entry(segment).or_default() += size;
            self.live_bytes += size;
        }
    }

    /// Estimated bytes of all live entries.
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Whether `change`'s key has its latest change in `segment`.
    fn is_latest_in(&self, segment: u64, change: &Change) -> bool {
        let location = match change {
            Change::Put { id, .. } | Change::Delete { id } => self.procs.get(id),
            Change::PutMeta { key, .. } | Change::DeleteMeta { key } => self.meta.get(key),
        };
        location.is_some_and(|(s, _)| *s == segment)
    }

    /// Whether `key` has its latest change in `segment`.
    fn holds(&self, segment: u64, key: &Key) -> bool {
        let location = match key {
            Key::Proc(id) => self.procs.get(id),
            Key::Meta(key) => self.meta.get(key),
        };
        location.is_some_and(|(s, _)| *s == segment)
    }

    /// The keys whose latest change is in `segment`, sorted, with that change's
    /// estimated size.
    fn keys_in(&self, segment: u64) -> Vec<(Key, u64)> {
        if !self.per_segment.contains_key(&segment) {
            return Vec::new();
        }
        let procs = self.procs.iter().filter(|(_, (s, _))| *s == segment);
        let meta = self.meta.iter().filter(|(_, (s, _))| *s == segment);
        let mut keys: Vec<(Key, u64)> = procs
            .map(|(id, (_, size))| (Key::Proc(*id), *size))
            .chain(meta.map(|(key, (_, size))| (Key::Meta(key.clone()), *size)))
            .collect();
        keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        keys
    }
}

/// Compacts closed segments, oldest first, while they hold more than
/// [`COMPACTION_RATIO`] times the live bytes. Returns how many segments it took out of
/// the log; none while the files of the last ones are still to be deleted (the caller
/// deletes them once the records are durable: `Inner::delete_doomed`).
///
/// The closed segments are counted afresh before each one: rewriting live changes forward
/// can fill the active segment and close it, and those bytes count too (counting only the
/// segments closed at the start left disk use above the bound until the next commit).
/// Segments closed by this pass hold only rewritten live changes and are not compacted
/// again, which also bounds the pass.
///
/// # Errors
///
/// I/O errors from the writer; the caller must poison the store.
pub(crate) fn compact(
    state: &mut State,
    kept: &mut Kept,
    index: &mut LiveIndex,
    writer: &mut Writer,
) -> Result<usize, StoreError> {
    if writer.deleting() {
        return Ok(0);
    }
    let active_at_start = writer.active_number();
    let mut removed = 0;
    while writer.segments()[0].number <= active_at_start {
        let Some(plan) = plan(state, kept, index, writer) else {
            break;
        };
        for which in (0..plan.records()).map(|run| run..run + 1) {
            let fetched = plan.fetch(which, state, index);
            plan.land_now(&fetched, index, writer)?;
        }
        plan.finish(writer);
        removed += 1;
    }
    Ok(removed)
}

/// The most bytes of changes ([`estimated_size`]) one compaction record carries, beyond
/// its first change. A segment's live data is rewritten as a run of records of about
/// this size rather than one record of it all:
/// - recovery checks a record's checksum before it decodes any of it, so a cold restart
///   read a record of tens of MB from the disk first and decoded it afterwards, where
///   records of a MiB are decoded while the disk reads the next ones (issue 33: 28 MB of
///   the restart bench's 43 MB log was one compaction record);
/// - the record's bytes are held twice while written, once encoded and once in the
///   writer's buffer: a segment's live data twice over, now a MiB (the admin bench's
///   peak fell from 647–694 MB to 489–508 MB).
const COMPACTION_RECORD_BYTES: u64 = 1 << 20;

/// The bound on one compaction record's changes for segments of `segment_size`: a
/// quarter of a segment at most, so small segments (tests use 1 KiB ones) rewrite their
/// live data as several records too, and records fill segments evenly.
fn record_bound(segment_size: u64) -> u64 {
    COMPACTION_RECORD_BYTES.min(segment_size / 4)
}

/// Splits changes of estimated `sizes` into runs of at least one change and at most
/// `bound` estimated bytes beyond their first, as ranges of indexes; no changes make one
/// empty run. Compaction writes a record per run, and at least one: it carries the
/// store's fencing token, which the compacted segment's records may have been the last
/// to carry.
fn runs(sizes: &[u64], bound: u64) -> Vec<Range<usize>> {
    if sizes.is_empty() {
        // One record, empty (a `Vec` of the one range `0..0`).
        return std::iter::once(0..0).collect();
    }
    let mut runs = Vec::new();
    let mut start = 0;
    while start < sizes.len() {
        let mut size = sizes[start];
        let len = 1 + sizes[start + 1..]
            .iter()
            .take_while(|&&next| {
                size += next;
                size <= bound
            })
            .count();
        runs.push(start..start + len);
        start += len;
    }
    runs
}

/// The compaction of the oldest closed segment, planned under the log's lock
/// ([`plan`]): the latest changes still in it, their values shared with the state, and
/// the runs they are written in. Its records are encoded with or without the lock
/// ([`Plan::encode`]) and landed in the log under it ([`Plan::land`]), a few runs at a
/// time if the caller lets the lock go between them; [`Plan::finish`] then takes the
/// segment out of the log ([`Writer::doom_oldest`]): its file is deleted once the
/// records are durable.
///
/// Why several records are as safe as one: the segment is deleted only once all of them
/// are durable. A crash before that leaves the segment in place, and whichever of its
/// copies reached the disk carry the same values as the segment (only a key's latest
/// change is rewritten), so replaying them changes nothing.
///
/// Why a change may be dropped at landing: between the plan and the landing, with the
/// lock let go, a commit may have written a newer change of its key; that one is then
/// the latest, and the copy would bring the older value back after it. A run with such
/// a change is encoded again, under the lock, without it.
///
/// The values in memory stay as they are, but for those recovery left in the segment's
/// mapping ([`Kept`]): they get copies of their own first, so that the store does not
/// keep a deleted file's space, nor its pages, for as long as they live. Making the
/// others slices of the record just written would only let a few of them keep that
/// whole record resident once the rest are superseded.
pub(crate) struct Plan {
    segment: u64,
    /// The keys whose latest change was in the segment when planned, sorted.
    keys: Vec<Key>,
    /// Each record's keys, as a range of `keys`.
    runs: Vec<Range<usize>>,
    /// The highest fencing token when planned, which the records carry: at least every
    /// token the segment's records carry.
    token: Option<u64>,
}

/// The changes of some of a plan's runs, read from the state under the log's lock
/// ([`Plan::fetch`]): what they are encoded from and landed as.
pub(crate) struct Fetched {
    changes: Vec<Change>,
    /// Each record's changes, as a range of `changes`.
    runs: Vec<Range<usize>>,
}

/// Plans the compaction of the oldest closed segment if closed segments hold more than
/// [`COMPACTION_RATIO`] times the live bytes; none while another plan is landing.
///
/// The caller plans none either while the files of segments an earlier pass took out
/// are still to be deleted ([`Writer::deleting`]): whoever deletes them checked that
/// their records are durable, which says nothing of a later pass's.
pub(crate) fn plan(
    state: &mut State,
    kept: &mut Kept,
    index: &LiveIndex,
    writer: &mut Writer,
) -> Option<Plan> {
    if writer.compacting() {
        return None;
    }
    let segments = writer.segments();
    let closed = &segments[..segments.len() - 1];
    let closed_bytes: u64 = closed.iter().map(|s| s.len).sum();
    let segment = closed.first()?.number;
    if closed_bytes <= COMPACTION_RATIO * index.live_bytes() {
        return None;
    }
    let (keys, sizes): (Vec<Key>, Vec<u64>) = index.keys_in(segment).into_iter().unzip();
    if let Some(mapping) = kept.remove(&segment) {
        let ids = keys.iter().filter_map(|key| match key {
            Key::Proc(id) => Some(*id),
            Key::Meta(_) => None,
        });
        arena::copy_out_of(&mut state.records, ids.collect(), mapping);
    }
    let runs = runs(&sizes, record_bound(writer.segment_size()));
    writer.set_compacting(true);
    Some(Plan {
        segment,
        keys,
        runs,
        token: state.highest_token,
    })
}

impl Plan {
    /// The number of records it writes.
    pub(crate) fn records(&self) -> usize {
        self.runs.len()
    }

    /// Reads the latest changes of runs `which`'s keys from `state`, under the log's
    /// lock; a key whose latest change is no longer in the segment is left out.
    pub(crate) fn fetch(&self, which: Range<usize>, state: &State, index: &LiveIndex) -> Fetched {
        let mut changes = Vec::new();
        let runs = self.runs[which]
            .iter()
            .map(|run| {
                let start = changes.len();
                let keys = self.keys[run.clone()].iter();
                let live = keys.filter(|key| index.holds(self.segment, key));
                changes.extend(live.filter_map(|key| state.current(key)));
                start..changes.len()
            })
            .collect();
        Fetched { changes, runs }
    }

    /// Appends the records of `fetched` to `out`, whole, numbered 0 (the log numbers
    /// them as it lands them); returns where each is. Needs no lock.
    pub(crate) fn encode(&self, fetched: &Fetched, out: &mut Vec<u8>) -> Vec<Range<usize>> {
        fetched
            .runs
            .iter()
            .map(|run| {
                let changes = &fetched.changes[run.clone()];
                let start = out.len();
                // Runs are bounded far below 4 GiB (`record_bound`).
                let payload_len = record::payload_len(changes).expect("a bounded run");
                record::append(out, KIND_COMPACTION, 0, self.token, changes, payload_len);
                start..out.len()
            })
            .collect()
    }

    /// Lands `fetched` in the log, its records in `encoded` at `at` ([`encode`]), each
    /// flushed to the file as it lands: the writer's buffer holds one record, not the
    /// segment's live data.
    ///
    /// [`encode`]: Plan::encode
    pub(crate) fn land(
        &self,
        fetched: &Fetched,
        (encoded, at): (&[u8], &[Range<usize>]),
        index: &mut LiveIndex,
        writer: &mut Writer,
    ) -> Result<(), StoreError> {
        for (run, bytes) in fetched.runs.iter().zip(at) {
            let changes = &fetched.changes[run.clone()];
            let stale = |change: &&Change| !index.is_latest_in(self.segment, change);
            if changes.iter().any(|c| stale(&c)) {
                let fresh: Vec<Change> = changes.iter().filter(|c| !stale(c)).cloned().collect();
                self.land_run(&fresh, index, writer)?;
            } else {
                let landed = writer.append_encoded(&encoded[bytes.clone()])?;
                note_all(index, landed, changes);
                debug_assert!(landed > self.segment);
                writer.flush()?;
            }
        }
        Ok(())
    }

    /// Lands `fetched` in the same hold of the log's lock that fetched it, each run
    /// encoded straight into the writer's buffer: nothing can have changed since the
    /// fetch, and encoding each run apart first ([`land`](Plan::land)'s way) cost one
    /// more copy of the segment's live data under the lock.
    pub(crate) fn land_now(
        &self,
        fetched: &Fetched,
        index: &mut LiveIndex,
        writer: &mut Writer,
    ) -> Result<(), StoreError> {
        for run in &fetched.runs {
            self.land_run(&fetched.changes[run.clone()], index, writer)?;
        }
        Ok(())
    }

    /// Appends `changes` as one compaction record, notes them in the index, and flushes
    /// it to the file.
    fn land_run(
        &self,
        changes: &[Change],
        index: &mut LiveIndex,
        writer: &mut Writer,
    ) -> Result<(), StoreError> {
        let payload_len = record::payload_len(changes)?;
        let landed = writer.append(KIND_COMPACTION, self.token, changes, payload_len)?;
        note_all(index, landed, changes);
        debug_assert!(landed > self.segment);
        writer.flush()
    }

    /// Every run landed: takes the segment out of the log.
    pub(crate) fn finish(self, writer: &mut Writer) {
        debug_assert_eq!(writer.segments()[0].number, self.segment);
        writer.doom_oldest();
        writer.set_compacting(false);
    }
}

fn note_all(index: &mut LiveIndex, segment: u64, changes: &[Change]) {
    for change in changes {
        index.note(segment, change);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(id: u64, len: usize) -> Change {
        Change::Put {
            id,
            parent: None,
            finished: false,
            value: vec![0; len].into(),
        }
    }

    /// Runs hold at least one change, and more only while their estimated bytes beyond
    /// the first stay within the bound; together they are the changes, in order.
    #[test]
    fn runs_are_bounded_and_keep_every_change_in_order() {
        let changes: Vec<Change> = [100, 100, 100, 1000, 10, 10]
            .iter()
            .enumerate()
            .map(|(id, &len)| put(id as u64, len))
            .collect();
        let each: Vec<u64> = changes.iter().map(estimated_size).collect();
        let sizes: Vec<Vec<u64>> = runs(&each, 2 * (CHANGE_OVERHEAD + 100))
            .into_iter()
            .map(|run| each[run].to_vec())
            .collect();
        let (small, large, tiny) = (
            CHANGE_OVERHEAD + 100,
            CHANGE_OVERHEAD + 1000,
            CHANGE_OVERHEAD + 10,
        );
        assert_eq!(
            sizes,
            vec![
                vec![small, small],
                vec![small],
                vec![large],
                vec![tiny, tiny]
            ],
            "a change larger than the bound makes a record of its own"
        );
        let indexes: Vec<usize> = runs(&each, 1).into_iter().flatten().collect();
        assert_eq!(indexes, (0..changes.len()).collect::<Vec<_>>());
        let empty = runs(&[], 1);
        assert!(
            empty.len() == 1 && empty[0].is_empty(),
            "one empty record: {empty:?}"
        );
        assert_eq!(record_bound(1 << 30), COMPACTION_RECORD_BYTES);
        assert_eq!(record_bound(4096), 1024);
    }

    /// The keys of [`LiveIndex::keys_in`], without their sizes.
    fn keys(index: &LiveIndex, segment: u64) -> Vec<Key> {
        index
            .keys_in(segment)
            .into_iter()
            .map(|(key, _)| key)
            .collect()
    }

    #[test]
    fn index_follows_the_latest_change_of_each_key() {
        let mut index = LiveIndex::default();
        index.note(1, &put(1, 100));
        index.note(1, &put(2, 10));
        assert_eq!(index.live_bytes(), 2 * CHANGE_OVERHEAD + 110);
        index.note(2, &put(1, 50));
        assert_eq!(keys(&index, 1), vec![Key::Proc(2)]);
        assert_eq!(keys(&index, 2), vec![Key::Proc(1)]);
        index.note(3, &Change::Delete { id: 2 });
        assert!(keys(&index, 1).is_empty());
        assert_eq!(index.live_bytes(), CHANGE_OVERHEAD + 50);
        index.note(
            3,
            &Change::DeleteMeta {
                key: "absent".into(),
            },
        );
        assert_eq!(index.live_bytes(), CHANGE_OVERHEAD + 50);
        // Metadata is indexed beside the records, and sorts after them.
        let meta = |key: &str| Change::PutMeta {
            key: key.into(),
            value: vec![0; 5].into(),
        };
        index.note(3, &meta("k"));
        index.note(3, &put(7, 0));
        assert_eq!(keys(&index, 3), vec![Key::Proc(7), Key::Meta("k".into())]);
        index.note(4, &meta("k"));
        assert_eq!(keys(&index, 4), vec![Key::Meta("k".into())]);
        assert_eq!(index.live_bytes(), 3 * CHANGE_OVERHEAD + 50 + 6);
        index.note(4, &Change::DeleteMeta { key: "k".into() });
        assert!(keys(&index, 4).is_empty());
        assert_eq!(index.live_bytes(), 2 * CHANGE_OVERHEAD + 50);
    }
}
