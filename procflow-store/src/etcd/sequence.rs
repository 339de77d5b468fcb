//! Exactly-once transactions: each store instance (a *writer*) numbers its transactions
//! in a key of its own, and each transaction applies only at the number it expects.
//!
//! A transaction whose answer is lost may still be in flight: forwarded by a follower, or
//! stuck in a slow link. Resent, or followed by later transactions of the same writer,
//! it could otherwise land late and overwrite them: the fencing compare holds for the
//! whole term. So every transaction compares the writer's sequence key with the number
//! it expects and advances it: a late copy finds a larger number and fails its compare,
//! having written nothing.
//!
//! The same number tells an unknown outcome apart. A transaction that failed its compare
//! while the key holds `expected + 1` had been applied by an earlier attempt (a resend):
//! it is applied. One whose answer was lost altogether is *settled*: a transaction that
//! advances the key from `expected` to `expected + 1` and writes nothing else. If it
//! applies, the lost one never will (it expected `expected`), and the batch can be sent
//! again; if it finds `expected + 1`, the lost one had applied. Only a settle whose own
//! answer is lost leaves the outcome unknown.
//!
//! Why one key per writer, not per store: other processes write to the same store (an
//! operator's request left by `procflow` on a running group), and their transactions
//! must not be taken for ours. A writer's key is created when the store connects, at a
//! random number, and deleted when the store is closed. Every transaction compares the
//! key's *value*, and etcd fails a value compare on a missing key: so a late copy that
//! arrives after the close cannot apply either. (Had the first transaction compared "the
//! key does not exist yet", the close would re-open that door.)

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse};

/// What a writer knows of its sequence key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sequence {
    /// The key holds this number.
    At(u64),
    /// An outcome was lost and could not be settled: read the key before the next
    /// transaction.
    Unknown,
}

/// A writer's first number: random and far from `u64::MAX`, so that numbers of
/// different writers (and of the same writer id, should one ever repeat) do not meet.
pub(crate) fn start() -> u64 {
    fastrand::u64(1..1 << 62)
}

/// The transaction that creates the writer's key at `start`; its failure branch reads
/// the key, so that a resend of it can tell its own earlier attempt (the key holds
/// `start`) from another writer's key.
pub(crate) fn create(key: &[u8], start: u64) -> Txn {
    Txn::new()
        .when([Compare::version(key.to_vec(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.to_vec(), encode(start), None)])
        .or_else([TxnOp::get(key.to_vec(), None)])
}

/// The compare that makes a transaction apply only at `expected`.
pub(crate) fn compare(key: &[u8], expected: u64) -> Compare {
    Compare::value(key.to_vec(), CompareOp::Equal, encode(expected))
}

/// The write that advances the key past `expected`.
pub(crate) fn advance(key: &[u8], expected: u64) -> TxnOp {
    TxnOp::put(key.to_vec(), encode(expected + 1), None)
}

/// The number a stored value holds (`None` for a missing key or another value).
pub(crate) fn decode(value: Option<&[u8]>) -> Option<u64> {
    value.and_then(|bytes| <[u8; 8]>::try_from(bytes).ok().map(u64::from_le_bytes))
}

/// The number a failure branch's read of the key found.
pub(crate) fn read(response: Option<TxnOpResponse>) -> Option<u64> {
    match response? {
        TxnOpResponse::Get(get) => decode(get.kvs().first().map(KeyValue::value)),
        _ => None,
    }
}

fn encode(n: u64) -> Vec<u8> {
    n.to_le_bytes().to_vec()
}

/// How a transaction that failed its compares went, given the sequence number the
/// failure branch read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The key holds `expected`: this transaction did not apply; the failed compare is
    /// one of its own checks (fencing, a record that must exist, a key that must not).
    Refused,
    /// The key holds `expected + 1`: an earlier attempt of this very transaction applied.
    AppliedBefore,
    /// The key holds something else: the writer's view of its key is wrong.
    Lost,
}

pub(crate) fn verdict(expected: u64, found: Option<u64>) -> Verdict {
    match found {
        Some(n) if n == expected => Verdict::Refused,
        Some(n) if n == expected + 1 => Verdict::AppliedBefore,
        _ => Verdict::Lost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_transaction_is_told_by_the_number_it_left() {
        assert_eq!(verdict(4, Some(4)), Verdict::Refused);
        assert_eq!(verdict(4, Some(5)), Verdict::AppliedBefore);
        assert_eq!(verdict(4, Some(7)), Verdict::Lost);
        assert_eq!(verdict(4, decode(None)), Verdict::Lost);
        assert_eq!(decode(Some(&9u64.to_le_bytes())), Some(9));
        assert_eq!(decode(Some(b"bad")), None);
    }
}
