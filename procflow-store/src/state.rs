//! The in-memory view of a store's contents, shared by [`MemStore`](crate::MemStore) and
//! [`WalStore`](crate::WalStore): validation of a [`Batch`] and application of its changes.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::error::StoreError;
use crate::store::{Batch, Limits, Loaded, Op, ProcId, Record, RecordInfo};

/// A self-contained change: unlike [`Op::Finish`] it never depends on earlier state, so a
/// log holding only the latest change of every key can be replayed on its own (this is
/// what makes compaction possible). It is also the unit written to the WAL.
///
/// `V` holds the values: [`Bytes`] in the state, `&[u8]` while a record is decoded in
/// place from the segment that holds it ([`Change::share`] then slices that segment).
/// Postcard writes both as a length and the bytes, so the format is the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Change<V = Bytes> {
    /// Insert or replace a whole record.
    Put {
        id: ProcId,
        parent: Option<ProcId>,
        finished: bool,
        value: V,
    },
    /// Remove a record.
    Delete { id: ProcId },
    /// Insert or replace a metadata entry.
    PutMeta { key: String, value: V },
    /// Remove a metadata entry.
    DeleteMeta { key: String },
}

impl Change<&[u8]> {
    /// The same change with its value as a slice of `owner`, the buffer it was decoded
    /// from: no copy, and the buffer lives as long as some value still points into it.
    pub(crate) fn share(self, owner: &Bytes) -> Change {
        match self {
            Change::Put {
                id,
                parent,
                finished,
                value,
            } => Change::Put {
                id,
                parent,
                finished,
                value: owner.slice_ref(value),
            },
            Change::Delete { id } => Change::Delete { id },
            Change::PutMeta { key, value } => Change::PutMeta {
                key,
                value: owner.slice_ref(value),
            },
            Change::DeleteMeta { key } => Change::DeleteMeta { key },
        }
    }
}

/// Which entry of the state a [`Change`] touches.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Key {
    Proc(ProcId),
    Meta(String),
}

impl<V> Change<V> {
    /// `true` for changes that remove their key.
    pub(crate) fn is_removal(&self) -> bool {
        matches!(self, Change::Delete { .. } | Change::DeleteMeta { .. })
    }
}

/// A batch's changes. Nearly every batch is one op (a step's record): its change is kept
/// inline, not in a vector of its own that every commit allocated and freed.
pub(crate) type Changes = SmallVec<[Change; 1]>;

/// A batch that passed validation, turned into self-contained changes.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) changes: Changes,
    pub(crate) fencing_token: Option<u64>,
    /// The batch's op buffer, emptied: the WAL's committer thread hands it back to the
    /// committing task to free (its `Leftovers` say why).
    pub(crate) spent: Vec<Op>,
}

/// What a batch needs of the store's current contents to apply, found by [`resolve`].
#[derive(Debug, Default)]
pub(crate) struct Checks {
    /// Records it finishes without writing them first: they must exist.
    pub(crate) must_exist: Vec<ProcId>,
    /// Metadata keys it creates ([`Op::CreateMeta`]) that no earlier op of the batch
    /// touched: they must not exist.
    pub(crate) must_be_absent: Vec<String>,
}

/// Resolves `ops`, leaving the vector empty, into self-contained changes: a `Finish` becomes a `Put` of the finished
/// record with its parent, taken from an earlier op of the same batch or, for a record the
/// batch has not touched, from `parent_of` (`None`: no such record); a `CreateMeta`
/// becomes a `PutMeta`. Returns the changes and the [`Checks`] left for the store: the
/// records `parent_of` answered for, which must still exist when the changes apply, and
/// the metadata keys created, which must not.
///
/// # Errors
///
/// [`StoreError::UnknownProcedure`] for a `Finish` of a record that does not exist;
/// [`StoreError::MetaExists`] for a `CreateMeta` of a key an earlier op of the batch
/// sets.
pub(crate) fn resolve(
    ops: &mut Vec<Op>,
    mut parent_of: impl FnMut(ProcId) -> Option<Option<ProcId>>,
) -> Result<(Changes, Checks), StoreError> {
    let mut overlay = Overlay::for_ops(ops.len());
    let mut checks = Checks::default();
    let mut changes = Changes::with_capacity(ops.len());
    for op in ops.drain(..) {
        let change = match op {
            Op::Put { id, parent, value } => {
                overlay.insert(id, Some(parent));
                Change::Put {
                    id,
                    parent,
                    finished: false,
                    value: value.into(),
                }
            }
            Op::Finish { id, value } => {
                let parent = match overlay.get(id, &changes) {
                    Some(Some(parent)) => parent,
                    Some(None) => return Err(StoreError::UnknownProcedure(id)),
                    None => {
                        let parent = parent_of(id).ok_or(StoreError::UnknownProcedure(id))?;
                        checks.must_exist.push(id);
                        parent
                    }
                };
                Change::Put {
                    id,
                    parent,
                    finished: true,
                    value: value.into(),
                }
            }
            Op::Delete { id } => {
                overlay.insert(id, None);
                Change::Delete { id }
            }
            Op::PutMeta { key, value } => Change::PutMeta {
                key,
                value: value.into(),
            },
            Op::DeleteMeta { key } => Change::DeleteMeta { key },
            Op::CreateMeta { key, value } => {
                match earlier_meta(&changes, &key) {
                    Some(true) => return Err(StoreError::MetaExists { key }),
                    Some(false) => {} // Deleted earlier in the batch: absent.
                    None => checks.must_be_absent.push(key.clone()),
                }
                Change::PutMeta {
                    key,
                    value: value.into(),
                }
            }
        };
        changes.push(change);
    }
    Ok((changes, checks))
}

/// What the changes so far do to metadata `key`: `Some(true)` if the last one sets it,
/// `Some(false)` if it removes it, `None` if none touches it. A linear search: creates
/// are rare (an operator's request), and a batch holding one is small.
fn earlier_meta(changes: &[Change], key: &str) -> Option<bool> {
    changes.iter().rev().find_map(|change| match change {
        Change::PutMeta { key: k, .. } if k == key => Some(true),
        Change::DeleteMeta { key: k } if k == key => Some(false),
        _ => None,
    })
}

/// The parent of every id a batch has touched so far (`None`: deleted), for its later
/// `Finish` ops. A small batch (a procedure's step is one or two ops) searches its own
/// changes, newest first, instead of building a map: a map allocates on every batch,
/// and the committer thread resolves every batch.
enum Overlay {
    /// Search the changes made so far.
    Scan,
    /// Sized for the batch at once and hashed with foldhash: a round's batch of 512
    /// ops grew a SipHash map through six rehashes, the largest share of its resolve
    /// (docs/BENCHMARKS.md, stop 74).
    Map(HashMap<ProcId, Option<Option<ProcId>>, foldhash::fast::RandomState>),
}

/// Up to this many ops, [`Overlay::Scan`].
const SCANNED_OPS: usize = 16;

impl Overlay {
    fn for_ops(ops: usize) -> Self {
        if ops <= SCANNED_OPS {
            Overlay::Scan
        } else {
            Overlay::Map(HashMap::with_capacity_and_hasher(
                ops,
                foldhash::fast::RandomState::default(),
            ))
        }
    }

    /// Notes that `id` now has `parent` (`None`: deleted); a scan finds it in the change
    /// the caller pushes next.
    fn insert(&mut self, id: ProcId, parent: Option<Option<ProcId>>) {
        if let Overlay::Map(map) = self {
            map.insert(id, parent);
        }
    }

    /// What the batch so far says of `id`: `None` if it has not touched it.
    fn get(&self, id: ProcId, changes: &[Change]) -> Option<Option<Option<ProcId>>> {
        match self {
            Overlay::Map(map) => map.get(&id).copied(),
            Overlay::Scan => changes.iter().rev().find_map(|change| match *change {
                Change::Put {
                    id: touched,
                    parent,
                    ..
                } if touched == id => Some(Some(parent)),
                Change::Delete { id: touched } if touched == id => Some(None),
                _ => None,
            }),
        }
    }
}

/// Records, metadata and the highest fencing token committed.
#[derive(Clone, Debug, Default)]
pub(crate) struct State {
    pub(crate) records: BTreeMap<ProcId, Record>,
    pub(crate) meta: BTreeMap<String, Vec<u8>>,
    pub(crate) highest_token: Option<u64>,
}

impl State {
    /// Validates `batch` against `limits`, the fencing token and the current records, and
    /// resolves it into changes. Nothing is modified.
    pub(crate) fn prepare(&self, batch: Batch, limits: &Limits) -> Result<Prepared, StoreError> {
        limits.check(&batch)?;
        self.check_token(batch.fencing_token)?;
        let records = &self.records;
        let mut spent = batch.ops;
        let (changes, checks) = resolve(&mut spent, |id| records.get(&id).map(|r| r.parent))?;
        self.check_absent(checks.must_be_absent)?;
        Ok(Prepared {
            changes,
            fencing_token: batch.fencing_token,
            spent,
        })
    }

    /// Refuses a batch whose fencing token is older than the highest committed.
    pub(crate) fn check_token(&self, token: Option<u64>) -> Result<(), StoreError> {
        match (token, self.highest_token) {
            (Some(token), Some(highest)) if token < highest => {
                Err(StoreError::Fenced { token, highest })
            }
            _ => Ok(()),
        }
    }

    /// Refuses a batch that creates a metadata key that exists ([`Checks::must_be_absent`]).
    pub(crate) fn check_absent(&self, must_be_absent: Vec<String>) -> Result<(), StoreError> {
        match must_be_absent
            .into_iter()
            .find(|key| self.meta.contains_key(key))
        {
            Some(key) => Err(StoreError::MetaExists { key }),
            None => Ok(()),
        }
    }

    /// Raises the highest fencing token to `token`.
    pub(crate) fn observe_token(&mut self, token: Option<u64>) {
        if let Some(token) = token {
            self.highest_token = Some(self.highest_token.map_or(token, |h| h.max(token)));
        }
    }

    /// Applies one change; returns the value it replaced or removed, if any, for the
    /// caller to free where it chooses.
    pub(crate) fn apply(&mut self, change: Change) -> Option<Bytes> {
        let replaced = match change {
            Change::Put {
                id,
                parent,
                finished,
                value,
            } => {
                let record = Record {
                    id,
                    parent,
                    finished,
                    value,
                };
                self.records.insert(id, record)
            }
            Change::Delete { id } => self.records.remove(&id),
            Change::PutMeta { key, value } => {
                self.meta.insert(key, value.to_vec());
                None
            }
            Change::DeleteMeta { key } => {
                self.meta.remove(&key);
                None
            }
        };
        replaced.map(|record| record.value)
    }

    /// The current change that recreates `key`, if the key exists.
    pub(crate) fn current(&self, key: &Key) -> Option<Change> {
        match key {
            Key::Proc(id) => self.records.get(id).map(|r| Change::Put {
                id: r.id,
                parent: r.parent,
                finished: r.finished,
                value: r.value.clone(),
            }),
            Key::Meta(key) => self.meta.get(key).map(|value| Change::PutMeta {
                key: key.clone(),
                value: Bytes::copy_from_slice(value),
            }),
        }
    }

    pub(crate) fn load(&self) -> Loaded {
        Loaded {
            records: self.records.values().cloned().collect(),
            meta: self.meta.clone(),
        }
    }

    pub(crate) fn get(&self, id: ProcId) -> Option<Record> {
        self.records.get(&id).cloned()
    }

    pub(crate) fn list(&self) -> Vec<RecordInfo> {
        self.records
            .values()
            .map(|r| RecordInfo {
                id: r.id,
                parent: r.parent,
                finished: r.finished,
                value_len: r.value.len(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with(batch: Batch) -> State {
        let mut state = State::default();
        let prepared = state.prepare(batch, &Limits::default()).unwrap();
        state.observe_token(prepared.fencing_token);
        for change in prepared.changes {
            state.apply(change);
        }
        state
    }

    #[test]
    fn finish_keeps_parent_and_needs_a_known_id() {
        let state = state_with(Batch::new().put(1, Some(9), vec![1]).finish(1, vec![2]));
        assert_eq!(
            state.get(1),
            Some(Record {
                id: 1,
                parent: Some(9),
                finished: true,
                value: vec![2].into()
            })
        );
        let err = state
            .prepare(Batch::new().finish(2, vec![]), &Limits::default())
            .unwrap_err();
        assert!(matches!(err, StoreError::UnknownProcedure(2)));
        let err = state
            .prepare(Batch::new().delete(1).finish(1, vec![]), &Limits::default())
            .unwrap_err();
        assert!(matches!(err, StoreError::UnknownProcedure(1)));
    }

    /// A batch's `Finish` sees the batch's own earlier ops whether it is small (the
    /// changes are searched) or large (a map is kept): the same answers both ways.
    #[test]
    fn finish_sees_earlier_ops_of_small_and_large_batches() {
        let state = state_with(Batch::new().put(7, Some(70), vec![]));
        let padded = |batch: Batch, pad: usize| {
            (0..pad).fold(batch, |batch, n| batch.put_meta(format!("pad{n}"), vec![]))
        };
        for pad in [0, SCANNED_OPS] {
            let parent_after = |batch: Batch| {
                let prepared = state.prepare(padded(batch, pad), &Limits::default())?;
                let finished = prepared.changes.iter().rev().find_map(|c| match c {
                    Change::Put {
                        parent,
                        finished: true,
                        ..
                    } => Some(*parent),
                    _ => None,
                });
                Ok::<_, StoreError>(finished.expect("a finished put"))
            };
            let ops = pad + 2;
            // Put then Finish in the batch: the batch's parent, not the stored one.
            let got = parent_after(Batch::new().put(7, Some(71), vec![]).finish(7, vec![]));
            assert_eq!(got.unwrap(), Some(71), "{ops} ops");
            // Only the stored record: its parent.
            let got = parent_after(Batch::new().put(8, None, vec![]).finish(7, vec![]));
            assert_eq!(got.unwrap(), Some(70), "{ops} ops");
            // Deleted earlier in the batch: unknown, though the store has it.
            let got = parent_after(Batch::new().delete(7).finish(7, vec![]));
            assert!(
                matches!(got, Err(StoreError::UnknownProcedure(7))),
                "{ops} ops"
            );
            // Deleted, then put again: the new parent.
            let batch = Batch::new()
                .delete(7)
                .put(7, None, vec![])
                .finish(7, vec![]);
            assert_eq!(parent_after(batch).unwrap(), None, "{ops} ops");
        }
    }

    #[test]
    fn create_meta_refuses_a_key_that_exists_and_writes_nothing() {
        let state = state_with(Batch::new().put_meta("r/1", vec![1]));
        let limits = Limits::default();
        let err = state
            .prepare(
                Batch::new()
                    .put(3, None, vec![])
                    .create_meta("r/1", vec![2]),
                &limits,
            )
            .unwrap_err();
        assert!(matches!(err, StoreError::MetaExists { key } if key == "r/1"));
        // Set earlier in the same batch: exists too.
        let err = state
            .prepare(
                Batch::new()
                    .put_meta("r/2", vec![])
                    .create_meta("r/2", vec![]),
                &limits,
            )
            .unwrap_err();
        assert!(matches!(err, StoreError::MetaExists { key } if key == "r/2"));
        // Deleted earlier in the batch, or never there: created, as a plain put.
        let prepared = state
            .prepare(
                Batch::new().delete_meta("r/1").create_meta("r/1", vec![3]),
                &limits,
            )
            .unwrap();
        assert!(matches!(
            prepared.changes.last(),
            Some(Change::PutMeta { key, value }) if key == "r/1" && value[..] == [3]
        ));
        assert!(
            state
                .prepare(Batch::new().create_meta("r/3", vec![]), &limits)
                .is_ok()
        );
    }

    #[test]
    fn fencing_rejects_lower_tokens_only() {
        let state = state_with(Batch::new().with_fencing_token(5));
        let limits = Limits::default();
        assert!(
            state
                .prepare(Batch::new().with_fencing_token(5), &limits)
                .is_ok()
        );
        assert!(state.prepare(Batch::new(), &limits).is_ok());
        let err = state
            .prepare(Batch::new().with_fencing_token(4), &limits)
            .unwrap_err();
        assert!(matches!(
            err,
            StoreError::Fenced {
                token: 4,
                highest: 5
            }
        ));
    }

    #[test]
    fn limits_are_enforced() {
        let limits = Limits {
            max_ops_per_batch: Some(1),
            max_value_bytes: Some(2),
            max_batch_bytes: None,
        };
        let state = State::default();
        let err = state
            .prepare(Batch::new().delete(1).delete(2), &limits)
            .unwrap_err();
        assert!(matches!(
            err,
            StoreError::TooLarge {
                size: 2,
                limit: 1,
                ..
            }
        ));
        let err = state
            .prepare(Batch::new().put_meta("k", vec![0; 3]), &limits)
            .unwrap_err();
        assert!(matches!(
            err,
            StoreError::TooLarge {
                size: 3,
                limit: 2,
                ..
            }
        ));
    }
}
