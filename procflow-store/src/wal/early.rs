//! A batch checked and encoded before the log's lock, by a commit that writes its own
//! record ([`WalConfig::caller_writes`]): under the lock only what needs the log is
//! left (`committer::write_early`).
//!
//! Why: with caller writes the log's lock is what the committing threads queue on, and
//! encoding a record and resolving its batch were about a quarter of what a commit did
//! under it (docs/BENCHMARKS.md, stop 74). Neither needs the log for a batch that does
//! not finish a procedure: its changes follow from its ops alone, and so do its
//! record's payload and the payload's checksum. Only the header's sequence number (and
//! the group-start flag) are the log's to give, and the header has a checksum of its
//! own, so the record is encoded with any number and renumbered under the lock.
//!
//! A batch with an [`Op::Finish`] is left for the lock (`Early::Late`): its change
//! carries the procedure's parent, read from the store's contents.
//!
//! [`WalConfig::caller_writes`]: crate::WalConfig::caller_writes

use std::ops::Range;

use super::record;
use crate::error::StoreError;
use crate::state::{Prepared, resolve};
use crate::store::{Batch, Limits, Op};

/// A batch as it reaches the log's lock.
#[derive(Debug)]
pub(super) enum Early {
    /// Checked and encoded as far as it can be without the log: what is left are the
    /// checks against the store's contents, which come first, then the outcome: its
    /// record, in the caller's buffer, or a refusal that needed nothing of the store
    /// (reported only if those checks pass, as the committer orders its checks).
    Checked(Left, Result<Encoded, StoreError>),
    /// Left to be prepared under the lock, as the committer prepares a batch.
    Late(Batch),
}

/// The checks of a batch that need the store's contents.
#[derive(Debug, Default)]
pub(super) struct Left {
    /// The batch's fencing token: refused if older than the highest committed.
    pub(super) fencing_token: Option<u64>,
    /// Metadata keys the batch creates: refused if one exists.
    pub(super) must_be_absent: Vec<String>,
}

/// A batch resolved into its changes, its record encoded but not numbered.
#[derive(Debug)]
pub(super) struct Encoded {
    pub(super) prepared: Prepared,
    /// Where its record is in the buffer it was encoded into.
    pub(super) record: Range<usize>,
}

/// Checks and resolves `batch` and appends its record to `out` where it can be done
/// before the log's lock.
pub(super) fn encode(batch: Batch, out: &mut Vec<u8>) -> Early {
    if batch.ops.iter().any(|op| matches!(op, Op::Finish { .. })) {
        return Early::Late(batch);
    }
    // The committer's order: the limits, the token, the batch's own consistency, the
    // keys it creates, the record's size.
    if let Err(e) = Limits::default().check(&batch) {
        return Early::Checked(Left::default(), Err(e));
    }
    let mut left = Left {
        fencing_token: batch.fencing_token,
        must_be_absent: Vec::new(),
    };
    let mut spent = batch.ops;
    // No `Finish`: nothing asks for a parent.
    let (changes, checks) = match resolve(&mut spent, |_| None) {
        Ok(resolved) => resolved,
        Err(e) => return Early::Checked(left, Err(e)),
    };
    debug_assert!(checks.must_exist.is_empty());
    left.must_be_absent = checks.must_be_absent;
    let payload_len = match record::payload_len(&changes) {
        Ok(len) => len,
        Err(e) => return Early::Checked(left, Err(e)),
    };
    let start = out.len();
    record::append(
        out,
        record::KIND_BATCH,
        0,
        batch.fencing_token,
        &changes,
        payload_len,
    );
    let prepared = Prepared {
        changes,
        fencing_token: batch.fencing_token,
        spent,
    };
    Early::Checked(
        left,
        Ok(Encoded {
            prepared,
            record: start..out.len(),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(early: Early) -> (Left, Result<Encoded, StoreError>) {
        match early {
            Early::Checked(left, outcome) => (left, outcome),
            Early::Late(batch) => panic!("left for the lock: {batch:?}"),
        }
    }

    #[test]
    fn a_record_encoded_early_and_renumbered_is_the_record_the_log_would_write() {
        let batch = Batch::new()
            .with_fencing_token(4)
            .put(7, Some(1), b"seven".to_vec())
            .put_meta("m", b"v".to_vec())
            .put(8, None, vec![0; 300]);
        let mut out = b"an earlier record".to_vec();
        let (left, outcome) = encoded(encode(batch, &mut out));
        assert_eq!(left.fencing_token, Some(4));
        let early = outcome.expect("encoded");
        assert_eq!(early.record.start, b"an earlier record".len());
        assert_eq!(early.record.end, out.len());
        record::renumber(&mut out[early.record.clone()], 42);
        let whole = record::encode(record::KIND_BATCH, 42, Some(4), &early.prepared.changes)
            .expect("encodes");
        assert_eq!(&out[early.record], &whole[..]);
        assert!(early.prepared.spent.is_empty(), "the ops were resolved");
    }

    #[test]
    fn a_batch_that_finishes_a_procedure_is_left_for_the_lock() {
        let batch = Batch::new()
            .put(1, None, b"a".to_vec())
            .finish(2, b"done".to_vec());
        let mut out = Vec::new();
        assert!(matches!(encode(batch, &mut out), Early::Late(_)));
        assert!(out.is_empty(), "nothing encoded");
    }

    #[test]
    fn a_refusal_found_early_keeps_the_checks_that_come_before_it() {
        let batch = Batch::new()
            .with_fencing_token(3)
            .create_meta("k", b"1".to_vec())
            .create_meta("k", b"2".to_vec());
        let mut out = Vec::new();
        let (left, outcome) = encoded(encode(batch, &mut out));
        assert!(matches!(outcome, Err(StoreError::MetaExists { key }) if key == "k"));
        // A stale token is reported first under the lock, as the committer orders it.
        assert_eq!(left.fencing_token, Some(3));
        assert!(out.is_empty(), "nothing encoded");
    }

    #[test]
    fn the_keys_a_batch_creates_are_left_to_check_against_the_store() {
        let batch = Batch::new().create_meta("new", b"1".to_vec());
        let mut out = Vec::new();
        let (left, outcome) = encoded(encode(batch, &mut out));
        assert!(outcome.is_ok());
        assert_eq!(left.must_be_absent, vec!["new".to_owned()]);
    }
}
