//! Compaction: keeping disk use proportional to live state, not history.
//!
//! [`LiveIndex`] remembers, for every live key, the segment holding its latest change
//! and an estimate of that change's size. When closed segments hold more than
//! [`COMPACTION_RATIO`] times the live bytes, [`compact`] walks the closed segments
//! oldest first: the latest changes still sitting in a segment are rewritten forward as
//! one `KIND_COMPACTION` record (with the highest fencing token), synced, and the segment
//! is deleted. Only the oldest segment is ever deleted, so a delete's tombstone can only
//! disappear together with every older change of its key.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash};

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

impl LiveIndex {
    /// Records that `change`, written to `segment`, is now the latest for its key.
    pub(crate) fn note(&mut self, segment: u64, change: &Change) {
        let latest = (!change.is_removal()).then(|| (segment, estimated_size(change)));
        let replaced = match change {
            Change::Put { id, .. } | Change::Delete { id } => {
                relocate(&mut self.procs, *id, latest)
            }
            Change::PutMeta { key, .. } | Change::DeleteMeta { key } => {
                relocate(&mut self.meta, key.clone(), latest)
            }
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
/// [`COMPACTION_RATIO`] times the live bytes. Returns how many segments were removed.
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
    state: &State,
    index: &mut LiveIndex,
    writer: &mut Writer,
) -> Result<usize, StoreError> {
    let active_at_start = writer.active_number();
    let mut removed = 0;
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
        rewrite_forward(state, index, writer, oldest)?;
        removed += 1;
    }
    Ok(removed)
}

/// Rewrites the latest changes still in `segment` as one record at the end of the log,
/// makes that durable, and deletes the segment.
///
/// The values in memory stay as they are: each owns its bytes (recovery copies them out
/// of the segments it reads), so none keeps a deleted segment's file in memory. Making
/// them slices of the record just written would only let a few of them keep that whole
/// record resident once the rest are superseded.
fn rewrite_forward(
    state: &State,
    index: &mut LiveIndex,
    writer: &mut Writer,
    segment: u64,
) -> Result<(), StoreError> {
    let changes: Vec<Change> = index
        .keys_in(segment)
        .iter()
        .filter_map(|key| state.current(key))
        .collect();
    let bytes = record::encode(
        KIND_COMPACTION,
        writer.next_seq(),
        state.highest_token,
        &changes,
    )?;
    let landed = writer.write(&bytes)?;
    for change in &changes {
        index.note(landed, change);
    }
    writer.sync_active()?;
    writer.remove_segment(segment)?;
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
