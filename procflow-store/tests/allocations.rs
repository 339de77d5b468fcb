//! What a `MemStore` commit allocates, counted by dhat's heap profiler in its testing
//! mode.
//!
//! A step on the executor commits one batch of one op, and a step on a `MemStore` costs
//! about two microseconds: each `malloc` and `free` in it is a measurable share, and a
//! block freed on another worker takes that worker's allocator lock.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use procflow_store::{Batch, MemStore, Store};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// Blocks allocated so far in the process (this file holds one test, so no other test
/// allocates meanwhile).
fn allocations() -> u64 {
    dhat::HeapStats::get().total_blocks
}

/// Commits `batch` and polls the answer once: a `MemStore` answers at once.
fn commit_now(store: &MemStore, batch: Batch) {
    let mut answer = pin!(store.commit(batch));
    let mut cx = Context::from_waker(Waker::noop());
    match answer.as_mut().poll(&mut cx) {
        Poll::Ready(result) => result.expect("the commit succeeds"),
        Poll::Pending => panic!("a MemStore commit answers at once"),
    }
}

/// A commit that replaces a record allocates nothing inside the store: its change is
/// kept inline, the value (of exact capacity, as the executor encodes them) becomes the
/// record's `Bytes` as it is, and the box of the answer holds nothing. It was two
/// allocations: the vector of changes and the boxed answer.
#[test]
fn a_commit_that_replaces_a_record_allocates_nothing_in_the_store() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let store = MemStore::new();
    commit_now(&store, Batch::new().put(1, None, vec![1; 200]));
    for round in 0..100u8 {
        let batch = Batch::new().put(1, None, vec![round; 200]);
        let before = allocations();
        commit_now(&store, batch);
        let made = allocations() - before;
        assert_eq!(made, 0, "round {round}: the commit allocated {made} times");
    }
}
