//! Compaction: keeping disk use proportional to live state, not history.
//!
//! [`LiveIndex`] remembers, for every live key, the segment holding its latest change
//! and an estimate of that change's size. When closed segments hold more than
//! [`COMPACTION_RATIO`] times the live bytes, [`compact`] walks the closed segments
//! oldest first: the latest changes still sitting in a segment are rewritten forward as
//! `KIND_COMPACTION` records (with the highest fencing token), and the segment leaves the
//! log; its file is deleted once those records are durable, by the thread that compacted
//! after it let the log's lock go ([`Doomed::delete`](super::writer::Doomed::delete)).
//! Only the oldest segment is ever deleted, so a delete's tombstone can only disappear
//! together with every older change of its key.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash};

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

    /// The keys whose latest change is in `segment`, sorted.
    fn keys_in(&self, segment: u64) -> Vec<Key> {
        if !self.per_segment.contains_key(&segment) {
            return Vec::new();
        }
        let procs = self.procs.iter().filter(|(_, (s, _))| *s == segment);
        let meta = self.meta.iter().filter(|(_, (s, _))| *s == segment);
        let mut keys: Vec<Key> = procs
            .map(|(id, _)| Key::Proc(*id))
            .chain(meta.map(|(key, _)| Key::Meta(key.clone())))
            .collect();
        keys.sort_unstable();
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
    let active_at_start = writer.active_number();
    let mut removed = 0;
    if writer.deleting() {
        // The last compaction's files are being deleted (`Doomed::delete`): they go
        // first, in order.
        return Ok(0);
    }
    loop {
        let segments = writer.segments();
        let closed = &segments[..segments.len() - 1];
        let closed_bytes: u64 = closed.iter().map(|s| s.len).sum();
        let Some(oldest) = closed.first().map(|s| s.number) else {
            break;
        };
        if oldest > active_at_start || closed_bytes <= COMPACTION_RATIO * index.live_bytes() {
            break;
        }
        rewrite_forward(state, kept, index, writer, oldest)?;
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

/// Splits `changes` into runs of at least one change and at most `bound` estimated
/// bytes beyond their first; no changes make one empty run. Compaction writes a record
/// per run, and at least one: it carries the store's fencing token, which the
/// compacted segment's records may have been the last to carry.
fn runs(changes: &[Change], bound: u64) -> impl Iterator<Item = &[Change]> {
    let mut rest = changes;
    let mut empty = changes.is_empty().then_some(changes);
    std::iter::from_fn(move || {
        if let Some(none) = empty.take() {
            return Some(none);
        }
        let (first, after) = rest.split_first()?;
        let mut size = estimated_size(first);
        let len = 1 + after
            .iter()
            .take_while(|change| {
                size += estimated_size(change);
                size <= bound
            })
            .count();
        let (run, tail) = rest.split_at(len);
        rest = tail;
        Some(run)
    })
}

/// Rewrites the latest changes still in `segment` as records at the end of the log
/// ([`COMPACTION_RECORD_BYTES`] each), and takes the segment out of the log
/// ([`Writer::doom_oldest`]): its file is deleted once they are durable.
///
/// Why several records are as safe as one: the segment is deleted only once all of them
/// are durable. A crash before that leaves the segment in place, and whichever of its
/// copies reached the disk carry the same values as the segment (only a key's latest
/// change is rewritten), so replaying them changes nothing. The records are one group
/// (no sync between them, so only the first can start a group): damage in one of them
/// with others after it is still a torn tail.
///
/// The values in memory stay as they are, but for those recovery left in the segment's
/// mapping ([`Kept`]): they get copies of their own first, so that the store does not
/// keep a deleted file's space, nor its pages, for as long as they live. Making the
/// others slices of the record just written would only let a few of them keep that
/// whole record resident once the rest are superseded.
fn rewrite_forward(
    state: &mut State,
    kept: &mut Kept,
    index: &mut LiveIndex,
    writer: &mut Writer,
    segment: u64,
) -> Result<(), StoreError> {
    let keys = index.keys_in(segment);
    if let Some(mapping) = kept.remove(&segment) {
        let ids = keys.iter().filter_map(|key| match key {
            Key::Proc(id) => Some(*id),
            Key::Meta(_) => None,
        });
        arena::copy_out_of(&mut state.records, ids.collect(), mapping);
    }
    let changes: Vec<Change> = keys.iter().filter_map(|key| state.current(key)).collect();
    for run in runs(&changes, record_bound(writer.segment_size())) {
        let payload_len = record::payload_len(run)?;
        let landed = writer.append(KIND_COMPACTION, state.highest_token, run, payload_len)?;
        // To the file now: the buffer holds one record, not the segment's live data.
        writer.flush()?;
        for change in run {
            index.note(landed, change);
        }
    }
    debug_assert_eq!(writer.segments()[0].number, segment);
    writer.doom_oldest();
    Ok(())
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
        let sizes: Vec<Vec<u64>> = runs(&changes, 2 * (CHANGE_OVERHEAD + 100))
            .map(|run| run.iter().map(estimated_size).collect())
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
        let ids: Vec<Change> = runs(&changes, 1).flatten().cloned().collect();
        assert_eq!(ids, changes);
        assert_eq!(
            runs(&[], 1).collect::<Vec<_>>(),
            [&[] as &[Change]],
            "one empty record"
        );
        assert_eq!(record_bound(1 << 30), COMPACTION_RECORD_BYTES);
        assert_eq!(record_bound(4096), 1024);
    }

    #[test]
    fn index_follows_the_latest_change_of_each_key() {
        let mut index = LiveIndex::default();
        index.note(1, &put(1, 100));
        index.note(1, &put(2, 10));
        assert_eq!(index.live_bytes(), 2 * CHANGE_OVERHEAD + 110);
        index.note(2, &put(1, 50));
        assert_eq!(index.keys_in(1), vec![Key::Proc(2)]);
        assert_eq!(index.keys_in(2), vec![Key::Proc(1)]);
        index.note(3, &Change::Delete { id: 2 });
        assert!(index.keys_in(1).is_empty());
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
        assert_eq!(index.keys_in(3), vec![Key::Proc(7), Key::Meta("k".into())]);
        index.note(4, &meta("k"));
        assert_eq!(index.keys_in(4), vec![Key::Meta("k".into())]);
        assert_eq!(index.live_bytes(), 3 * CHANGE_OVERHEAD + 50 + 6);
        index.note(4, &Change::DeleteMeta { key: "k".into() });
        assert!(index.keys_in(4).is_empty());
        assert_eq!(index.live_bytes(), 2 * CHANGE_OVERHEAD + 50);
    }
}
