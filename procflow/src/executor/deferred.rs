//! Snapshots published by a lane's procedures, applied to the table once per poll of
//! the lane, under one lock, instead of once per step.
//!
//! Every step publishes its procedure's snapshot to the table's entry, and the table
//! has one lock. With two workers, the steps of the lanes on one took the lock that
//! the steps on the other took too, hundreds of thousands of times a second: the
//! executor on a `MemStore` at 256 clients ran 1.0–1.25 times as fast in a build
//! that published nothing (on one worker, 1.0–1.04 times), docs/BENCHMARKS.md,
//! "Issue 33 in stop 57".
//!
//! So while a lane polls its procedures ([`Round`]), [`Inner::publish`](super::inner::Inner)
//! keeps a snapshot in the thread's round ([`keep`]) instead of taking the lock; the
//! round applies what it kept when the lane's poll ends, taking the lock once.
//!
//! What keeps it correct:
//! - **Nothing older wins.** Any lock of the same table taken on the thread while the
//!   round keeps snapshots ([`Inner::table`](super::inner::Inner)) applies them first
//!   ([`apply_kept`]). A procedure's end, its suspension, an answer to a request: all
//!   are written under that lock, after the snapshots before them.
//! - **A procedure's snapshots are kept once.** A snapshot replaces the one kept just
//!   before it if both are the same procedure's: a procedure that runs many steps in
//!   one poll (on a `MemStore`) keeps one, not one per step.
//! - **Readers wait a little at most.** Readers on other threads see a step's snapshot
//!   when the lane's poll ends, or after [`APPLY_EVERY`] snapshots kept, whichever is
//!   first: a procedure that runs a thousand steps in one poll is still seen moving.

use super::inner::Table;
use super::packed::PackedInfo;
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

/// Snapshots kept before they are applied in the middle of a round.
const APPLY_EVERY: u32 = 64;

/// What the thread's round keeps.
struct Kept {
    /// The table of the lane being polled on this thread; `None` outside a lane's poll.
    table: Option<Arc<Mutex<Table>>>,
    infos: Vec<PackedInfo>,
    /// Snapshots kept since the last apply, replaced ones included.
    count: u32,
}

thread_local! {
    static KEPT: RefCell<Kept> = const {
        RefCell::new(Kept {
            table: None,
            infos: Vec::new(),
            count: 0,
        })
    };
}

impl Kept {
    fn is_of(&self, table: &Mutex<Table>) -> bool {
        self.table
            .as_ref()
            .is_some_and(|kept| std::ptr::eq(Arc::as_ptr(kept), table))
    }

    /// Applies what it keeps, taking its table's lock.
    fn apply_now(&mut self) {
        if !self.infos.is_empty()
            && let Some(table) = self.table.clone()
        {
            self.apply(&mut lock(&table));
        }
    }

    fn apply(&mut self, table: &mut Table) {
        self.count = 0;
        for info in self.infos.drain(..) {
            table.publish(info);
        }
    }
}

/// A lane's poll: while it lasts, the snapshots published on this thread to its table
/// are kept, and applied when it ends.
pub(crate) struct Round(());

/// Runs `f` on this thread's round; `None` if the thread's round is gone (its
/// thread-locals are being destroyed: then nothing is kept).
fn with_kept<R>(f: impl FnOnce(&mut Kept) -> R) -> Option<R> {
    let run = |cell: &RefCell<Kept>| cell.try_borrow_mut().ok().map(|mut kept| f(&mut kept));
    KEPT.try_with(run).ok().flatten()
}

impl Round {
    pub(crate) fn begin(table: &Arc<Mutex<Table>>) -> Self {
        with_kept(|kept| {
            // Were a lane polled inside another lane's poll (Tokio does not do that), the
            // outer round's snapshots would be applied here, and the rest of its poll
            // would publish at once.
            kept.apply_now();
            kept.table = Some(Arc::clone(table));
        });
        Round(())
    }
}

impl Drop for Round {
    fn drop(&mut self) {
        with_kept(|kept| {
            kept.apply_now();
            kept.table = None;
        });
    }
}

/// Keeps `info` for the end of this thread's round, if it is a round of `table`; else
/// hands it back, to be published now.
pub(crate) fn keep(table: &Mutex<Table>, info: PackedInfo) -> Result<(), PackedInfo> {
    let mut info = Some(info);
    with_kept(|kept| {
        if !kept.is_of(table) {
            return;
        }
        let Some(info) = info.take() else { return };
        match kept.infos.last_mut() {
            Some(last) if last.id() == info.id() => *last = info,
            _ => kept.infos.push(info),
        }
        kept.count += 1;
        if kept.count >= APPLY_EVERY {
            kept.apply(&mut lock(table));
        }
    });
    info.map_or(Ok(()), Err)
}

/// Applies what this thread's round of `table` keeps into `locked`, the table just
/// locked: every lock of the table calls it, so that what is done under the lock comes
/// after the snapshots published before.
pub(crate) fn apply_kept(table: &Mutex<Table>, locked: &mut Table) {
    with_kept(|kept| {
        if !kept.infos.is_empty() && kept.is_of(table) {
            kept.apply(locked);
        }
    });
}

fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    // As `Inner::table`: a panic under the lock leaves nothing worse than a stop would.
    table
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::inner::Entry;

    fn info(id: u64, steps: u64) -> PackedInfo {
        PackedInfo::sample(id, steps)
    }

    /// A table with procedures 1 and 2, at step 0.
    fn table() -> Arc<Mutex<Table>> {
        let mut table = Table::default();
        for id in [1, 2] {
            let entry = Entry::new(info(id, 0), None);
            table.procs.insert(id, Box::new(entry));
        }
        Arc::new(Mutex::new(table))
    }

    fn steps(table: &Mutex<Table>, id: u64) -> u64 {
        lock(table).procs[&id].info.borrow().steps()
    }

    #[test]
    fn a_round_keeps_snapshots_until_it_ends() {
        let table = table();
        assert!(keep(&table, info(1, 1)).is_err(), "outside a round");
        let round = Round::begin(&table);
        assert!(keep(&table, info(1, 2)).is_ok());
        assert!(keep(&table, info(2, 1)).is_ok());
        assert_eq!(steps(&table, 1), 0, "kept, not applied yet");
        let other = self::table();
        assert!(keep(&other, info(1, 5)).is_err(), "another table's");
        drop(round);
        assert_eq!((steps(&table, 1), steps(&table, 2)), (2, 1));
        assert!(keep(&table, info(1, 3)).is_err(), "the round is over");
    }

    /// What is done under the lock after a kept snapshot is not undone by it: the lock
    /// applies what the thread's round kept first.
    #[test]
    fn the_lock_applies_what_was_kept_first() {
        let table = table();
        let round = Round::begin(&table);
        keep(&table, info(1, 1)).unwrap();
        {
            let mut locked = lock(&table);
            apply_kept(&table, &mut locked);
            assert_eq!(locked.procs[&1].info.borrow().steps(), 1);
            locked.publish(info(1, 2));
        }
        drop(round);
        assert_eq!(steps(&table, 1), 2, "the older snapshot did not win");
    }

    /// A procedure's snapshots in a row are kept once; a long run of them is applied on
    /// the way, not only at the round's end.
    #[test]
    fn a_procedures_snapshots_are_kept_once_and_applied_on_the_way() {
        let table = table();
        let _round = Round::begin(&table);
        for step in 1..APPLY_EVERY as u64 {
            keep(&table, info(1, step)).unwrap();
        }
        KEPT.with_borrow(|kept| assert_eq!(kept.infos.len(), 1));
        assert_eq!(steps(&table, 1), 0);
        keep(&table, info(1, 100)).unwrap();
        assert_eq!(steps(&table, 1), 100, "applied at {APPLY_EVERY} kept");
        KEPT.with_borrow(|kept| assert!(kept.infos.is_empty()));
    }
}
