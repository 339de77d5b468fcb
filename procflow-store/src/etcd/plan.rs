//! One etcd transaction built from one or more batches.
//!
//! etcd rejects a transaction that names a key twice, so ops are merged per key first:
//! the last write to a key wins, as it would if the batches' ops ran one after another.
//! Concurrent batches join one transaction while it stays within etcd's limits and none
//! of them depends on a key an earlier one writes (see [`Plan::try_add`]).

use std::collections::BTreeMap;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::keys::Keys;
use super::sequence;
use crate::store::ProcId;

/// etcd's default `--max-txn-ops`: the most compares, success ops or failure ops of one
/// transaction.
pub(crate) const MAX_TXN_OPS: usize = 128;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub(crate) const MAX_REQUEST_BYTES: usize = 1_572_864;
/// What one key costs in a request beyond its bytes: protobuf tags, lengths, fields.
const PER_KEY: usize = 16;
/// The request's own framing (header, flags), with room to spare.
const REQUEST_SLACK: usize = 1024;

/// The write a transaction does to one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    Put(Vec<u8>),
    Delete,
}

/// A batch made self-contained: the final write to each key, in op order, the records
/// that must exist for it to apply (the `Finish` of a record it did not write itself),
/// and the metadata keys that must not (its `CreateMeta`s).
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    pub(crate) writes: Vec<(Vec<u8>, Write)>,
    pub(crate) must_exist: Vec<(ProcId, Vec<u8>)>,
    /// The metadata key as the batch named it, and its etcd key.
    pub(crate) must_be_absent: Vec<(String, Vec<u8>)>,
    pub(crate) token: Option<u64>,
    /// What the batch does to the parents the store remembers for live records:
    /// `Some(parent)` for a live record written, `None` for one finished or deleted.
    pub(crate) parents: Vec<(ProcId, Option<Option<ProcId>>)>,
}

/// The transaction being built.
#[derive(Debug)]
pub(crate) struct Plan {
    token: Option<u64>,
    writes: BTreeMap<Vec<u8>, Write>,
    must_exist: BTreeMap<Vec<u8>, ProcId>,
    must_be_absent: BTreeMap<Vec<u8>, String>,
    /// What `writes` and the checks add to the request's encoded size (an upper bound).
    bytes: usize,
}

impl Plan {
    pub(crate) fn new(token: Option<u64>) -> Self {
        Self {
            token,
            writes: BTreeMap::new(),
            must_exist: BTreeMap::new(),
            must_be_absent: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// Adds `batch` if the transaction still fits etcd's limits with it and means the same
    /// as committing the batches one by one; otherwise leaves the plan as it was. Only
    /// what the batch changes is counted: the plan is not copied to try.
    pub(crate) fn try_add(&mut self, batch: &Prepared, keys: &Keys) -> bool {
        let checked = batch.must_exist.iter().map(|(_, key)| key);
        let checked = checked.chain(batch.must_be_absent.iter().map(|(_, key)| key));
        if batch.token != self.token || checked.clone().any(|key| self.writes.contains_key(key)) {
            // A different owner's batch, or one whose check an earlier write would decide.
            return false;
        }
        // The batch's last write to each key replaces whatever the plan writes there.
        let mut last: BTreeMap<&[u8], &Write> = BTreeMap::new();
        for (key, write) in &batch.writes {
            last.insert(key, write);
        }
        let mut bytes = self.bytes;
        let mut new_writes = 0;
        for (&key, &write) in &last {
            bytes += write_bytes(key, write);
            match self.writes.get(key) {
                Some(old) => bytes -= write_bytes(key, old),
                None => new_writes += 1,
            }
        }
        let new_checks: BTreeMap<&[u8], ProcId> = batch
            .must_exist
            .iter()
            .filter(|(_, key)| !self.must_exist.contains_key(key))
            .map(|(id, key)| (key.as_slice(), *id))
            .collect();
        let new_absent: BTreeMap<&[u8], &str> = batch
            .must_be_absent
            .iter()
            .filter(|(_, key)| !self.must_be_absent.contains_key(key))
            .map(|(name, key)| (key.as_slice(), name.as_str()))
            .collect();
        bytes += new_checks.keys().map(|key| check_bytes(key)).sum::<usize>();
        bytes += new_absent.keys().map(|key| check_bytes(key)).sum::<usize>();
        let checks =
            self.must_exist.len() + new_checks.len() + self.must_be_absent.len() + new_absent.len();
        // Every transaction also compares, advances and (failing) reads the writer's
        // sequence key: one more compare, write and failure read.
        let fits = usize::from(self.token.is_some()) + checks < MAX_TXN_OPS
            && self.writes.len() + new_writes < MAX_TXN_OPS
            // The failure branch reads the leader key, the sequence and each checked key.
            && checks + 1 < MAX_TXN_OPS
            && fixed_bytes(keys) + bytes <= MAX_REQUEST_BYTES;
        if !fits {
            return false;
        }
        for (key, write) in last {
            self.writes.insert(key.to_vec(), write.clone());
        }
        for (key, id) in new_checks {
            self.must_exist.insert(key.to_vec(), id);
        }
        for (key, name) in new_absent {
            self.must_be_absent.insert(key.to_vec(), name.to_owned());
        }
        self.bytes = bytes;
        true
    }

    /// The ids whose existence the transaction checks, in the order of its failure
    /// branch's reads.
    pub(crate) fn must_exist(&self) -> impl Iterator<Item = ProcId> + '_ {
        self.must_exist.values().copied()
    }

    /// The metadata keys whose absence the transaction checks, as the batches named
    /// them, in the order of its failure branch's reads (after the records').
    pub(crate) fn must_be_absent(&self) -> impl Iterator<Item = &str> + '_ {
        self.must_be_absent.values().map(String::as_str)
    }

    pub(crate) fn token(&self) -> Option<u64> {
        self.token
    }

    /// The transaction: if the leader key is still the one of this token, the writer's
    /// sequence key (`sequence`) holds `expected`, every must-exist record exists and
    /// every must-be-absent key does not, write and advance the sequence; otherwise read
    /// the leader key, the sequence and those keys, so the caller can say which check
    /// failed (see [`sequence`]).
    pub(crate) fn txn(&self, keys: &Keys, sequence: &[u8], expected: u64) -> Txn {
        let mut compares =
            Vec::with_capacity(2 + self.must_exist.len() + self.must_be_absent.len());
        if let Some(token) = self.token {
            compares.push(Compare::create_revision(
                keys.leader(),
                CompareOp::Equal,
                i64::try_from(token).unwrap_or(i64::MAX),
            ));
        }
        compares.push(sequence::compare(sequence, expected));
        let mut failure = vec![
            TxnOp::get(keys.leader(), None),
            TxnOp::get(sequence.to_vec(), None),
        ];
        for key in self.must_exist.keys() {
            compares.push(Compare::version(key.clone(), CompareOp::Greater, 0));
            failure.push(TxnOp::get(
                key.clone(),
                Some(GetOptions::new().with_keys_only()),
            ));
        }
        for key in self.must_be_absent.keys() {
            compares.push(Compare::version(key.clone(), CompareOp::Equal, 0));
            failure.push(TxnOp::get(
                key.clone(),
                Some(GetOptions::new().with_keys_only()),
            ));
        }
        let mut success: Vec<TxnOp> = self
            .writes
            .iter()
            .map(|(key, write)| match write {
                Write::Put(value) => TxnOp::put(key.clone(), value.clone(), None),
                Write::Delete => TxnOp::delete(key.clone(), None),
            })
            .collect();
        success.push(sequence::advance(sequence, expected));
        Txn::new().when(compares).and_then(success).or_else(failure)
    }
}

/// A write's share of the request: its key, its value, their framing.
fn write_bytes(key: &[u8], write: &Write) -> usize {
    let value = match write {
        Write::Put(value) => value.len(),
        Write::Delete => 0,
    };
    key.len() + value + PER_KEY
}

/// A must-exist key's share: it appears twice, in a compare and in a failure get.
fn check_bytes(key: &[u8]) -> usize {
    2 * (key.len() + PER_KEY)
}

/// What every transaction carries: its framing, the leader key in the fencing compare and
/// the failure get, and the writer's sequence key in a compare, a write and a failure get
/// (with its 8-byte value twice).
fn fixed_bytes(keys: &Keys) -> usize {
    let sequence = keys.sequence(0);
    REQUEST_SLACK + check_bytes(&keys.leader()) + 3 * (sequence.len() + PER_KEY) + 16
}

/// The most ops one batch may hold: etcd's 128 per branch, less the fencing compare and
/// the sequence's compare (each op may add a compare, a write, a failure read).
pub(crate) const MAX_BATCH_OPS: usize = MAX_TXN_OPS - 2;

/// The largest payload ([`Batch::payload_bytes`](crate::Batch::payload_bytes)) a batch of
/// at most [`MAX_BATCH_OPS`] ops may carry so that its transaction always fits the request
/// limit: every op may add a key, a compare and a failure get, and a record header.
pub(crate) fn max_batch_bytes(keys: &Keys) -> usize {
    let longest_key = keys.record(u64::MAX).len().max(keys.meta("").len());
    // The op's write, its compare and its failure get.
    let per_op = 3 * (longest_key + PER_KEY) + super::record::MAX_HEADER;
    MAX_REQUEST_BYTES - fixed_bytes(keys) - MAX_BATCH_OPS * per_op
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(writes: &[(&[u8], Write)], must_exist: &[(ProcId, &[u8])]) -> Prepared {
        Prepared {
            writes: writes
                .iter()
                .map(|(k, w)| (k.to_vec(), w.clone()))
                .collect(),
            must_exist: must_exist.iter().map(|(id, k)| (*id, k.to_vec())).collect(),
            must_be_absent: Vec::new(),
            token: Some(1),
            parents: Vec::new(),
        }
    }

    #[test]
    fn the_last_write_to_a_key_wins_and_checks_are_not_decided_by_earlier_writes() {
        let keys = Keys::new("/t");
        let mut plan = Plan::new(Some(1));
        assert!(plan.try_add(&prepared(&[(b"a", Write::Put(vec![1]))], &[]), &keys));
        assert!(plan.try_add(&prepared(&[(b"a", Write::Delete)], &[]), &keys));
        assert_eq!(plan.writes[&b"a".to_vec()], Write::Delete);
        // Its record must exist, but this plan deletes it: commit it on its own.
        assert!(!plan.try_add(&prepared(&[], &[(5, b"a")]), &keys));
        // Its key must be absent, but this plan writes it: on its own too.
        let mut create = prepared(&[(b"a", Write::Put(vec![2]))], &[]);
        create.must_be_absent.push(("a".into(), b"a".to_vec()));
        assert!(!plan.try_add(&create, &keys));
        // A key the plan does not write: it joins, and its absence is checked.
        let mut create = prepared(&[(b"c", Write::Put(vec![2]))], &[]);
        create.must_be_absent.push(("c".into(), b"c".to_vec()));
        assert!(plan.try_add(&create, &keys));
        assert_eq!(plan.must_be_absent().collect::<Vec<_>>(), ["c"]);
        // A second create of it must not join the first: its check would be decided by it.
        assert!(!plan.try_add(&create, &keys));
        // Another owner's batch never joins.
        let mut other = prepared(&[(b"b", Write::Delete)], &[]);
        other.token = Some(2);
        assert!(!plan.try_add(&other, &keys));
        assert_eq!(plan.writes.len(), 2);
    }

    #[test]
    fn a_plan_stops_growing_at_etcds_op_limit() {
        let keys = Keys::new("/t");
        let mut plan = Plan::new(Some(1));
        let mut added = 0;
        while plan.try_add(
            &prepared(&[(&keys.record(added), Write::Delete)], &[]),
            &keys,
        ) {
            added += 1;
        }
        // One write of the 128 advances the writer's sequence.
        assert_eq!(added as usize, MAX_TXN_OPS - 1);
    }

    #[test]
    fn the_byte_limit_is_the_one_docs_format_md_gives() {
        let prefix = "/procflow/orders/abc";
        assert_eq!(prefix.len(), 20);
        assert_eq!(max_batch_bytes(&Keys::new(prefix)), 1_548_011);
    }

    #[test]
    fn a_batch_within_the_limits_always_fits_alone() {
        let keys = Keys::new("/a/rather/long/prefix/for/the/store");
        let budget = max_batch_bytes(&keys);
        let mut batch = prepared(&[], &[]);
        for id in 0..MAX_BATCH_OPS as u64 {
            // A `Finish` of a record written elsewhere: a write, a compare, a failure get.
            let value = vec![0; budget / MAX_BATCH_OPS + super::super::record::MAX_HEADER];
            batch.writes.push((keys.record(id), Write::Put(value)));
            batch.must_exist.push((id, keys.record(id)));
        }
        assert!(Plan::new(Some(1)).try_add(&batch, &keys));
    }
}
