//! The storage contract: the [`Store`] trait and the types that cross it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::StoreError;
use crate::slot::{CommitIn, CommitSlot};
use bytes::Bytes;

/// A procedure's identifier, unique within one store.
pub type ProcId = u64;

/// A boxed, sendable future, so that [`Store`] stays object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A procedure's persisted record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The procedure's id.
    pub id: ProcId,
    /// The procedure that spawned this one, if any.
    pub parent: Option<ProcId>,
    /// `true` once [`Op::Finish`] has been committed for this procedure.
    pub finished: bool,
    /// Opaque bytes; procflow encodes the procedure's state with postcard. The store and
    /// every [`Loaded`] share these bytes: a clone costs a reference count, not a copy.
    pub value: Bytes,
}

/// A record's metadata without its value, as returned by [`Store::list`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordInfo {
    /// The procedure's id.
    pub id: ProcId,
    /// The procedure that spawned this one, if any.
    pub parent: Option<ProcId>,
    /// `true` once the procedure has finished.
    pub finished: bool,
    /// Length of the record's value in bytes.
    pub value_len: usize,
}

/// One change inside a [`Batch`].
///
/// New kinds of change may be added: a store implemented outside this crate must refuse
/// one it does not know (a `match` with a catch-all arm), never skip it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Insert or replace a live (unfinished) procedure.
    Put {
        /// The procedure's id.
        id: ProcId,
        /// Its parent, if any.
        parent: Option<ProcId>,
        /// Its encoded state.
        value: Vec<u8>,
    },
    /// Mark a procedure finished; `value` holds its outcome and step history. The record
    /// is kept (with its parent) until [`Op::Delete`]. Committing a batch whose `Finish`
    /// names an unknown id fails with [`StoreError::UnknownProcedure`].
    Finish {
        /// The procedure's id.
        id: ProcId,
        /// Its final value.
        value: Vec<u8>,
    },
    /// Remove a procedure (its retention expired). A no-op if the id is unknown.
    Delete {
        /// The procedure's id.
        id: ProcId,
    },
    /// Set a small metadata entry (id high-water mark, nonces, ...).
    PutMeta {
        /// The entry's key.
        key: String,
        /// The entry's value.
        value: Vec<u8>,
    },
    /// Remove a metadata entry. A no-op if the key is unknown.
    DeleteMeta {
        /// The entry's key.
        key: String,
    },
    /// Set a metadata entry that must not exist yet (written create-only): if the key
    /// exists when the batch applies, or an earlier op of the batch sets it, the whole
    /// batch is refused with [`StoreError::MetaExists`] and nothing of it is written. For
    /// entries several processes may write under keys they choose themselves (operators'
    /// requests), so that one never overwrites another's.
    CreateMeta {
        /// The entry's key.
        key: String,
        /// The entry's value.
        value: Vec<u8>,
    },
}

impl Op {
    /// This op's share of [`Batch::payload_bytes`].
    #[must_use]
    pub fn payload_bytes(&self) -> usize {
        match self {
            Op::Put { value, .. } | Op::Finish { value, .. } => value.len(),
            Op::PutMeta { key, value } | Op::CreateMeta { key, value } => key.len() + value.len(),
            Op::DeleteMeta { key } => key.len(),
            Op::Delete { .. } => 0,
        }
    }

    /// The size of this op's value (0 for deletions): what [`Limits::max_value_bytes`]
    /// bounds.
    #[must_use]
    pub fn value_len(&self) -> usize {
        match self {
            Op::Put { value, .. }
            | Op::Finish { value, .. }
            | Op::PutMeta { value, .. }
            | Op::CreateMeta { value, .. } => value.len(),
            Op::Delete { .. } | Op::DeleteMeta { .. } => 0,
        }
    }
}

/// A list of [`Op`]s applied atomically: after a crash either every op of the batch is
/// visible or none is.
///
/// Ops apply in order, so a batch may `Put` a procedure and `Finish` it.
///
/// # Examples
///
/// ```
/// use procflow_store::Batch;
///
/// let batch = Batch::new()
///     .put(1, None, b"state".to_vec())
///     .put_meta("next_id", 2u64.to_le_bytes().to_vec())
///     .with_fencing_token(7);
/// assert_eq!(batch.ops.len(), 2);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// The ops, applied in order.
    pub ops: Vec<Op>,
    /// If set, the store rejects the batch with [`StoreError::Fenced`] when it has already
    /// committed a higher token. The highest token survives reopening the store.
    pub fencing_token: Option<u64>,
}

impl Batch {
    /// An empty batch without a fencing token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `op`.
    pub fn push(&mut self, op: Op) -> &mut Self {
        self.ops.push(op);
        self
    }

    /// Sets the fencing token.
    #[must_use]
    pub fn with_fencing_token(mut self, token: u64) -> Self {
        self.fencing_token = Some(token);
        self
    }

    /// What [`Limits::max_batch_bytes`] counts: the bytes of every op's value, plus the
    /// key of every metadata op.
    #[must_use]
    pub fn payload_bytes(&self) -> usize {
        self.ops.iter().map(Op::payload_bytes).sum()
    }

    /// Appends an [`Op::Put`].
    #[must_use]
    pub fn put(mut self, id: ProcId, parent: Option<ProcId>, value: Vec<u8>) -> Self {
        self.ops.push(Op::Put { id, parent, value });
        self
    }

    /// Appends an [`Op::Finish`].
    #[must_use]
    pub fn finish(mut self, id: ProcId, value: Vec<u8>) -> Self {
        self.ops.push(Op::Finish { id, value });
        self
    }

    /// Appends an [`Op::Delete`].
    #[must_use]
    pub fn delete(mut self, id: ProcId) -> Self {
        self.ops.push(Op::Delete { id });
        self
    }

    /// Appends an [`Op::PutMeta`].
    #[must_use]
    pub fn put_meta(mut self, key: impl Into<String>, value: Vec<u8>) -> Self {
        self.ops.push(Op::PutMeta {
            key: key.into(),
            value,
        });
        self
    }

    /// Appends an [`Op::CreateMeta`]: the batch applies only if `key` does not exist.
    #[must_use]
    pub fn create_meta(mut self, key: impl Into<String>, value: Vec<u8>) -> Self {
        self.ops.push(Op::CreateMeta {
            key: key.into(),
            value,
        });
        self
    }

    /// Appends an [`Op::DeleteMeta`].
    #[must_use]
    pub fn delete_meta(mut self, key: impl Into<String>) -> Self {
        self.ops.push(Op::DeleteMeta { key: key.into() });
        self
    }
}

/// Everything a store holds, as returned by [`Store::load`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Live and finished records, sorted by id.
    pub records: Vec<Record>,
    /// All metadata entries.
    pub meta: BTreeMap<String, Vec<u8>>,
}

/// Size limits a store imposes on one batch; `None` means unbounded.
///
/// The etcd store says 126 ops (etcd's 128 per transaction, less the fencing and the
/// sequence compares) and about 1.5 MiB of values and metadata keys per batch (etcd's
/// request limit, less the room its own keys and framing take).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// The most ops one [`Batch`] may hold.
    pub max_ops_per_batch: Option<usize>,
    /// The largest value (of a record or metadata entry) in bytes.
    pub max_value_bytes: Option<usize>,
    /// The most bytes one batch may carry: the sum of its ops' values and metadata keys
    /// (see [`Batch::payload_bytes`]).
    pub max_batch_bytes: Option<usize>,
}

impl Limits {
    /// Checks `batch` against every limit: [`StoreError::TooLarge`] names the first one
    /// it exceeds.
    ///
    /// # Errors
    ///
    /// [`StoreError::TooLarge`].
    pub fn check(&self, batch: &Batch) -> Result<(), StoreError> {
        exceeds("ops per batch", batch.ops.len(), self.max_ops_per_batch)?;
        let largest = batch.ops.iter().map(Op::value_len).max().unwrap_or(0);
        exceeds("value bytes", largest, self.max_value_bytes)?;
        exceeds("batch bytes", batch.payload_bytes(), self.max_batch_bytes)
    }
}

fn exceeds(what: &'static str, size: usize, limit: Option<usize>) -> Result<(), StoreError> {
    match limit {
        Some(limit) if size > limit => Err(StoreError::TooLarge { what, size, limit }),
        _ => Ok(()),
    }
}

/// Durable storage for procedures. Object safe: the runtime holds an `Arc<dyn Store>`.
///
/// Implementations: [`MemStore`](crate::MemStore) (in memory, for tests) and
/// [`WalStore`](crate::WalStore) (an embedded write-ahead log, the default).
pub trait Store: Send + Sync + 'static {
    /// Applies `batch` atomically and returns once it is durable (per the store's sync
    /// mode). Concurrent calls are allowed and share fsyncs (group commit).
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`], [`StoreError::TooLarge`], [`StoreError::UnknownProcedure`],
    /// [`StoreError::MetaExists`] reject the batch without changing anything. Errors for
    /// which [`StoreError::may_have_applied`] holds ([`StoreError::Io`],
    /// [`StoreError::Poisoned`]) mean the batch may or may not be durable: only a later
    /// read can tell.
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<(), StoreError>>;

    /// [`commit`](Self::commit) for a caller that commits one batch after another and
    /// waits for each, such as a procedure's steps: the answer comes back through
    /// `slot`, made once for all of them, so a commit allocates nothing for it, and the
    /// batch's op list is kept in the slot for the next one ([`CommitSlot::batch`]).
    /// A slot serves one commit at a time.
    ///
    /// The default commits with [`commit`](Self::commit). [`WalStore`](crate::WalStore)
    /// queues the batch for its committer thread with the slot.
    ///
    /// # Errors
    ///
    /// As for [`commit`](Self::commit).
    fn commit_in<'a>(&'a self, batch: Batch, slot: &'a Arc<CommitSlot>) -> CommitIn<'a> {
        let _ = slot;
        CommitIn::from_future(self.commit(batch))
    }

    /// Whether [`commit_in`](Self::commit_in) answers through its slot: if not (the
    /// default), a caller need not make slots, and commits with
    /// [`commit`](Self::commit).
    fn uses_commit_slots(&self) -> bool {
        false
    }

    /// Everything: live and finished records, and all metadata.
    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>>;

    /// One record, live or finished.
    fn get(&self, id: ProcId) -> BoxFuture<'_, Result<Option<Record>, StoreError>>;

    /// Every record's metadata, sorted by id.
    fn list(&self) -> BoxFuture<'_, Result<Vec<RecordInfo>, StoreError>>;

    /// The metadata entries whose keys start with `prefix`, by key: what another process
    /// may have left for this one (an operator's request on a shared store). The default
    /// reads everything with [`load`](Self::load); the stores of this crate read only the
    /// range.
    fn meta(&self, prefix: &str) -> BoxFuture<'_, Result<BTreeMap<String, Vec<u8>>, StoreError>> {
        let prefix = prefix.to_owned();
        Box::pin(async move { Ok(with_prefix(&self.load().await?.meta, &prefix)) })
    }

    /// The limits batches must respect.
    fn limits(&self) -> Limits;

    /// Flushes everything and stops accepting writes; later commits fail with
    /// [`StoreError::Closed`].
    fn close(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// The entries of `meta` whose keys start with `prefix`.
pub(crate) fn with_prefix(
    meta: &BTreeMap<String, Vec<u8>>,
    prefix: &str,
) -> BTreeMap<String, Vec<u8>> {
    let range = meta.range(prefix.to_owned()..);
    range
        .take_while(|(key, _)| key.starts_with(prefix))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}
