//! One call of `apply` (one transaction) built from one or more batches.
//!
//! A batch is first made self-contained ([`Prepared::from_ops`]): the last write of each
//! key, in op order, and what must hold for it to apply. A `Finish` of a record the
//! batch did not write is done in place (`finished` and `value` set, the stored parent
//! kept), after a check that the record exists: no read before the commit. Concurrent
//! batches then join one transaction while it stays within a size cap and none of them
//! checks a key an earlier one writes ([`Group::try_add`]), as on etcd; their writes are
//! merged, borrowed, as it is sent ([`Plan::of`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::error::StoreError;
use crate::store::{Op, ProcId};

/// The most keys one transaction writes, and the most value bytes it carries, when
/// batches are grouped. A single batch over them still goes, alone.
const GROUP_KEYS: usize = 8192;
const GROUP_BYTES: usize = 16 << 20;

/// The final write of one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RecordWrite {
    /// The whole row.
    Put {
        parent: Option<i64>,
        finished: bool,
        value: Vec<u8>,
    },
    /// `finished` set and the value replaced; the stored parent kept.
    Finish {
        value: Vec<u8>,
    },
    Delete,
}

/// The final write of one metadata key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MetaWrite {
    Put(Vec<u8>),
    Delete,
}

/// A batch made self-contained.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    pub(crate) token: Option<i64>,
    pub(crate) records: BTreeMap<i64, RecordWrite>,
    pub(crate) meta: BTreeMap<String, MetaWrite>,
    /// Records that must exist before the batch: those it finishes without writing first.
    pub(crate) must_exist: BTreeSet<i64>,
    /// Metadata keys it creates (`CreateMeta`) without touching them first.
    pub(crate) must_be_absent: BTreeSet<String>,
    /// Value bytes, for the group's size cap.
    pub(crate) bytes: usize,
}

/// `id` as PostgreSQL's `bigint`.
pub(crate) fn sql_id(id: ProcId) -> Result<i64, StoreError> {
    i64::try_from(id).map_err(|_| StoreError::Encoding {
        reason: format!("procedure id {id} does not fit PostgreSQL's bigint (at most 2^63 - 1)"),
    })
}

impl Prepared {
    /// Resolves `ops` in order.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownProcedure`] for a `Finish` of a record deleted earlier in the
    /// batch; [`StoreError::MetaExists`] for a `CreateMeta` of a key an earlier op sets;
    /// [`StoreError::Encoding`] for an id over `i64::MAX`.
    pub(crate) fn from_ops(ops: Vec<Op>, token: Option<u64>) -> Result<Self, StoreError> {
        let mut prepared = Prepared {
            token: token.map(sql_id).transpose()?,
            ..Prepared::default()
        };
        for op in ops {
            prepared.bytes += op.payload_bytes();
            prepared.add(op)?;
        }
        Ok(prepared)
    }

    fn add(&mut self, op: Op) -> Result<(), StoreError> {
        match op {
            Op::Put { id, parent, value } => {
                let write = RecordWrite::Put {
                    parent: parent.map(sql_id).transpose()?,
                    finished: false,
                    value,
                };
                self.records.insert(sql_id(id)?, write);
            }
            Op::Finish { id, value } => {
                let key = sql_id(id)?;
                let write = match self.records.remove(&key) {
                    Some(RecordWrite::Put { parent, .. }) => RecordWrite::Put {
                        parent,
                        finished: true,
                        value,
                    },
                    Some(RecordWrite::Finish { .. }) => RecordWrite::Finish { value },
                    Some(RecordWrite::Delete) => return Err(StoreError::UnknownProcedure(id)),
                    None => {
                        self.must_exist.insert(key);
                        RecordWrite::Finish { value }
                    }
                };
                self.records.insert(key, write);
            }
            Op::Delete { id } => {
                self.records.insert(sql_id(id)?, RecordWrite::Delete);
            }
            Op::PutMeta { key, value } => {
                self.meta.insert(key, MetaWrite::Put(value));
            }
            Op::DeleteMeta { key } => {
                self.meta.insert(key, MetaWrite::Delete);
            }
            Op::CreateMeta { key, value } => {
                match self.meta.get(&key) {
                    Some(MetaWrite::Put(_)) => return Err(StoreError::MetaExists { key }),
                    // Deleted earlier in the batch: absent.
                    Some(MetaWrite::Delete) => {}
                    None => {
                        self.must_be_absent.insert(key.clone());
                    }
                }
                self.meta.insert(key, MetaWrite::Put(value));
            }
        }
        Ok(())
    }
}

/// Which batches may share one transaction: the keys the batches let in so far write.
/// Only keys are kept; the writes themselves are merged, without a copy, when the
/// transaction is sent ([`Plan::of`]).
#[derive(Debug, Default)]
pub(crate) struct Group {
    token: Option<i64>,
    records: BTreeSet<i64>,
    meta: BTreeSet<String>,
    bytes: usize,
}

impl Group {
    /// A group of `first` alone.
    pub(crate) fn of(first: &Prepared) -> Self {
        let mut group = Group {
            token: first.token,
            ..Group::default()
        };
        group.note(first);
        group
    }

    /// Lets `batch` in if the group stays within its cap and means the same as committing
    /// the batches one by one: the same owner's, and no check of it decided by an earlier
    /// batch's write. Otherwise leaves the group as it was.
    pub(crate) fn try_add(&mut self, batch: &Prepared) -> bool {
        let decided = batch.must_exist.iter().any(|id| self.records.contains(id))
            || batch.must_be_absent.iter().any(|k| self.meta.contains(k));
        let fits = self.records.len() + self.meta.len() + batch.records.len() + batch.meta.len()
            <= GROUP_KEYS
            && self.bytes + batch.bytes <= GROUP_BYTES;
        if batch.token != self.token || decided || !fits {
            return false;
        }
        self.note(batch);
        true
    }

    fn note(&mut self, batch: &Prepared) {
        self.records.extend(batch.records.keys().copied());
        self.meta.extend(batch.meta.keys().cloned());
        self.bytes += batch.bytes;
    }
}

/// One transaction: the writes of a group's batches merged key by key, the last one
/// winning, as if they ran one after another; borrowed from the batches.
#[derive(Debug, Default)]
pub(crate) struct Plan<'a> {
    pub(crate) token: Option<i64>,
    pub(crate) records: BTreeMap<i64, &'a RecordWrite>,
    pub(crate) meta: BTreeMap<&'a str, &'a MetaWrite>,
    pub(crate) must_exist: BTreeSet<i64>,
    pub(crate) must_be_absent: BTreeSet<&'a str>,
}

impl<'a> Plan<'a> {
    /// The plan of `batches`, in order (a [`Group`]'s: one owner's, none checking what an
    /// earlier one writes).
    pub(crate) fn of(batches: impl IntoIterator<Item = &'a Prepared>) -> Self {
        let mut plan = Plan::default();
        for batch in batches {
            plan.token = batch.token;
            plan.records
                .extend(batch.records.iter().map(|(id, w)| (*id, w)));
            plan.meta
                .extend(batch.meta.iter().map(|(k, w)| (k.as_str(), w)));
            plan.must_exist.extend(batch.must_exist.iter().copied());
            plan.must_be_absent
                .extend(batch.must_be_absent.iter().map(String::as_str));
        }
        plan
    }

    /// The one record this plan writes, if it writes one record, with a whole row, and
    /// nothing else: a procedure's step.
    pub(crate) fn single_put(&self) -> Option<(i64, &'a RecordWrite)> {
        let checks = self.must_exist.len() + self.must_be_absent.len() + self.meta.len();
        match self.records.iter().next() {
            Some((&id, write @ RecordWrite::Put { .. }))
                if self.records.len() == 1 && checks == 0 =>
            {
                Some((id, *write))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Batch;

    fn prepared(batch: Batch) -> Prepared {
        Prepared::from_ops(batch.ops, batch.fencing_token).unwrap()
    }

    #[test]
    fn a_finish_without_a_put_is_done_in_place_and_checked() {
        let batch = prepared(Batch::new().finish(3, vec![1]).put(4, Some(3), vec![2]));
        assert_eq!(batch.must_exist, BTreeSet::from([3]));
        assert_eq!(batch.records[&3], RecordWrite::Finish { value: vec![1] });
        let batch = prepared(Batch::new().put(3, Some(1), vec![]).finish(3, vec![1]));
        assert!(batch.must_exist.is_empty());
        let finished = RecordWrite::Put {
            parent: Some(1),
            finished: true,
            value: vec![1],
        };
        assert_eq!(batch.records[&3], finished);
    }

    #[test]
    fn refusals_found_inside_the_batch() {
        let deleted = Batch::new().delete(3).finish(3, vec![]);
        let error = Prepared::from_ops(deleted.ops, None).unwrap_err();
        assert!(matches!(error, StoreError::UnknownProcedure(3)), "{error}");
        let twice = Batch::new().put_meta("k", vec![]).create_meta("k", vec![]);
        let error = Prepared::from_ops(twice.ops, None).unwrap_err();
        assert!(matches!(error, StoreError::MetaExists { .. }), "{error}");
        let huge = Batch::new().put(u64::MAX, None, vec![]);
        let error = Prepared::from_ops(huge.ops, None).unwrap_err();
        assert!(error.to_string().contains("bigint"), "{error}");
    }

    #[test]
    fn a_batch_whose_check_an_earlier_write_decides_waits_for_the_next_transaction() {
        let mut group = Group::of(&prepared(Batch::new().put(1, None, vec![])));
        assert!(!group.try_add(&prepared(Batch::new().finish(1, vec![]))));
        assert!(group.try_add(&prepared(Batch::new().finish(2, vec![]))));
        let fenced = prepared(Batch::new().put(5, None, vec![]).with_fencing_token(3));
        assert!(!group.try_add(&fenced));
        let first = prepared(Batch::new().put_meta("req/a", vec![]));
        let mut group = Group::of(&first);
        assert!(!group.try_add(&prepared(Batch::new().create_meta("req/a", vec![]))));
        let second = prepared(Batch::new().create_meta("req/b", vec![]));
        assert!(group.try_add(&second));
        let plan = Plan::of([&first, &second]);
        assert_eq!(plan.must_be_absent, BTreeSet::from(["req/b"]));
        assert_eq!(plan.meta.len(), 2);
    }
}
