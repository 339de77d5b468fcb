//! `crash.rs`'s crash cases on a store whose commits write their own records
//! ([`WalConfig::caller_writes`](procflow_store::WalConfig::caller_writes)): records
//! reach the file out of order, and a crash can leave a range unwritten between two
//! written ones (`caller_gaps.rs` builds such images on purpose).

mod common;

/// Each commit writes its own record; the committer thread only syncs.
const CALLER_WRITES: bool = true;

include!("crash_cases/cases.rs");
