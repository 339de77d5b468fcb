//! The error type shared by every [`Store`](crate::Store).

use std::io;
use std::path::PathBuf;

use crate::store::ProcId;

/// What can go wrong when talking to a [`Store`](crate::Store).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An I/O operation failed.
    #[error("I/O error while {context} ({}): {source}", path.display())]
    Io {
        /// What the store was doing, e.g. `"syncing segment"`.
        context: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Stored bytes are damaged in a way that is not a torn tail: data after them would
    /// otherwise be silently dropped, so the store refuses to open.
    #[error("corrupt store file {} at byte offset {offset}: {reason}", file.display())]
    Corrupt {
        /// The damaged file.
        file: PathBuf,
        /// Byte offset of the first damaged record or header in `file`.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// Another process (or another store in this process) has the store directory open.
    #[error("another process has the store open (lock held on {})", dir.display())]
    Locked {
        /// The store directory.
        dir: PathBuf,
    },
    /// The directory holds no store (no log segment) to read.
    #[error("{} holds no procflow store (no segment-*.wal file)", dir.display())]
    NotAStore {
        /// The directory.
        dir: PathBuf,
    },
    /// A previous write or fsync failed, so the log's durable state is unknown; reopen the
    /// store to recover from what is on disk.
    #[error("the store is poisoned by an earlier failed write or fsync; reopen it")]
    Poisoned,
    /// The batch carried a stale fencing token: a newer owner has taken over the store.
    /// `MemStore` and `WalStore` refuse a token lower than the highest committed; the etcd
    /// store refuses any token but the current leader key's create revision (`highest` is
    /// then that revision, or 0 while no one leads).
    #[error("fenced: batch token {token} is stale; the store's owner token is {highest}")]
    Fenced {
        /// The token of the rejected batch.
        token: u64,
        /// The highest token committed so far.
        highest: u64,
    },
    /// The batch exceeds one of the store's [`Limits`](crate::Limits).
    #[error("batch too large: {what} is {size}, the limit is {limit}")]
    TooLarge {
        /// Which limit was exceeded, e.g. `"ops per batch"`.
        what: &'static str,
        /// The size of the offending item.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The store has been closed with [`Store::close`](crate::Store::close).
    #[error("the store is closed")]
    Closed,
    /// A batch could not be encoded for the log.
    #[error("cannot encode the batch: {reason}")]
    Encoding {
        /// What the encoder reported.
        reason: String,
    },
    /// [`Op::Finish`](crate::Op::Finish) named a procedure the store does not hold.
    #[error("unknown procedure {0}")]
    UnknownProcedure(ProcId),
    /// [`Op::CreateMeta`](crate::Op::CreateMeta) named a metadata key that exists.
    #[error("metadata key `{key}` exists already (written create-only)")]
    MetaExists {
        /// The key.
        key: String,
    },
}

impl StoreError {
    /// Whether the batch of a [`Store::commit`](crate::Store::commit) that failed with
    /// this error may nevertheless have been applied, and be durable: its outcome is
    /// unknown (an I/O error or timeout after the write left, a failed `fsync`, a poisoned
    /// log). Every other error is a refusal: nothing of the batch was written.
    ///
    /// A caller that must not do something twice retries such a write only in a way that
    /// is idempotent (procflow's `submit` with the same nonce), or reads first.
    #[must_use]
    pub fn may_have_applied(&self) -> bool {
        matches!(self, StoreError::Io { .. } | StoreError::Poisoned)
    }

    /// A copy of this error, for the members of a group commit that share one result
    /// (errors are not `Clone`: an `io::Error` is copied as its kind and message).
    ///
    /// Every variant is copied as itself, with no catch-all: a member given another
    /// variant would be told something else than the others, such as a refusal that
    /// changed nothing (`Encoding`) where the outcome is unknown (`Poisoned`).
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            StoreError::Io {
                context,
                path,
                source,
            } => StoreError::Io {
                context,
                path: path.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
            StoreError::Corrupt {
                file,
                offset,
                reason,
            } => StoreError::Corrupt {
                file: file.clone(),
                offset: *offset,
                reason: reason.clone(),
            },
            StoreError::Locked { dir } => StoreError::Locked { dir: dir.clone() },
            StoreError::NotAStore { dir } => StoreError::NotAStore { dir: dir.clone() },
            StoreError::Poisoned => StoreError::Poisoned,
            StoreError::Fenced { token, highest } => StoreError::Fenced {
                token: *token,
                highest: *highest,
            },
            StoreError::TooLarge { what, size, limit } => StoreError::TooLarge {
                what,
                size: *size,
                limit: *limit,
            },
            StoreError::Closed => StoreError::Closed,
            StoreError::Encoding { reason } => StoreError::Encoding {
                reason: reason.clone(),
            },
            StoreError::UnknownProcedure(id) => StoreError::UnknownProcedure(*id),
            StoreError::MetaExists { key } => StoreError::MetaExists { key: key.clone() },
        }
    }

    pub(crate) fn io(context: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StoreError::Io {
            context,
            path: path.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_happened_and_where() {
        let cases = [
            (
                StoreError::io("syncing a segment", "/s/x.wal", io::Error::other("EIO")),
                "I/O error while syncing a segment (/s/x.wal): EIO",
            ),
            (
                StoreError::Corrupt {
                    file: "/s/x.wal".into(),
                    offset: 96,
                    reason: "record payload checksum mismatch".into(),
                },
                "corrupt store file /s/x.wal at byte offset 96: record payload checksum mismatch",
            ),
            (
                StoreError::Locked { dir: "/s".into() },
                "another process has the store open (lock held on /s)",
            ),
            (
                StoreError::Fenced {
                    token: 3,
                    highest: 4,
                },
                "fenced: batch token 3 is stale; the store's owner token is 4",
            ),
            (
                StoreError::TooLarge {
                    what: "ops per batch",
                    size: 129,
                    limit: 128,
                },
                "batch too large: ops per batch is 129, the limit is 128",
            ),
            (StoreError::UnknownProcedure(7), "unknown procedure 7"),
            (
                StoreError::MetaExists { key: "k".into() },
                "metadata key `k` exists already (written create-only)",
            ),
            (StoreError::Closed, "the store is closed"),
        ];
        for (error, message) in cases {
            assert_eq!(error.to_string(), message);
        }
        assert!(StoreError::Poisoned.to_string().contains("reopen"));
    }

    #[test]
    fn only_io_and_poison_leave_the_outcome_unknown() {
        assert!(StoreError::io("x", "/s", io::Error::other("timeout")).may_have_applied());
        assert!(StoreError::Poisoned.may_have_applied());
        for refusal in [
            StoreError::Fenced {
                token: 1,
                highest: 2,
            },
            StoreError::UnknownProcedure(1),
            StoreError::MetaExists { key: "k".into() },
            StoreError::Closed,
        ] {
            assert!(!refusal.may_have_applied(), "{refusal}");
        }
    }

    /// A group commit's members each get a copy of one error: the same variant, the
    /// same message, the same answer to whether the batch may have applied.
    #[cfg(any(feature = "etcd", feature = "postgres"))]
    #[test]
    fn a_duplicate_is_the_same_error() {
        let every = [
            StoreError::io("writing", "/s/x.wal", io::Error::other("disk gone")),
            StoreError::Corrupt {
                file: "/s/x.wal".into(),
                offset: 96,
                reason: "checksum".into(),
            },
            StoreError::Locked { dir: "/s".into() },
            StoreError::NotAStore { dir: "/s".into() },
            StoreError::Poisoned,
            StoreError::Fenced {
                token: 3,
                highest: 4,
            },
            StoreError::TooLarge {
                what: "ops per batch",
                size: 129,
                limit: 128,
            },
            StoreError::Closed,
            StoreError::Encoding {
                reason: "bad".into(),
            },
            StoreError::UnknownProcedure(7),
            StoreError::MetaExists { key: "k".into() },
        ];
        for error in every {
            let copy = error.duplicate();
            assert_eq!(
                std::mem::discriminant(&copy),
                std::mem::discriminant(&error),
                "{error}"
            );
            assert_eq!(copy.to_string(), error.to_string());
            assert_eq!(copy.may_have_applied(), error.may_have_applied(), "{error}");
        }
    }

    #[test]
    fn errors_can_cross_threads_and_be_boxed() {
        fn check<T: std::error::Error + Send + Sync + 'static>() {}
        check::<StoreError>();
    }
}
