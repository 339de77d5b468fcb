//! Which procedures' snapshots changed since the admin's list last took them, so that a
//! list over a million procedures is brought up to date by reading the few that changed,
//! not the whole table.
//!
//! The table notes every id whose entry it adds, changes or removes, under the lock it
//! holds for the change anyway: a push onto a vector, once per entry until the list takes
//! it (the entry's `noted` flag, which the list clears as it reads the entry; a busy
//! procedure's thousand steps are then one id, and the journal holds at most one id per
//! procedure, plus the removed ones). Nothing is noted until a list first
//! takes the table whole ([`Journal::restart`]), so an executor whose admin nobody reads
//! pays one branch per change. A journal nobody takes stops growing at
//! [`Journal::note`]'s bound and asks the next list to take the table whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// See the [module docs](self).
#[derive(Default)]
pub(crate) struct Journal {
    /// The ids noted since the last take; `None` while no list reads them, or once
    /// they outgrew their bound.
    ids: Option<Vec<u64>>,
    /// Whether `ids` is `Some`, readable without the table's lock: while ids are noted,
    /// every step publishes its snapshot whole, so that its id is noted (see
    /// `signal.rs`).
    on: Arc<AtomicBool>,
}

/// Ids a journal holds, beyond twice its table's size, before it gives up (a small
/// table, whose whole read is cheap anyway, still gets this many).
const AT_LEAST: usize = 1 << 16;

/// What a list must read to be current.
#[cfg(feature = "admin")]
pub(crate) enum Noted {
    /// The whole table: nothing was noted since it was last taken whole, or too much.
    Everything,
    /// These procedures (sorted, once each); the others are as the list last took them.
    Ids(Vec<u64>),
}

impl Journal {
    /// Notes that procedure `id`'s snapshot changed, in a table of `procedures`. An id
    /// is noted once per entry until taken, but a removed one again: a churning table
    /// notes each procedure about twice (added, removed). Past `2 × procedures +`
    /// [`AT_LEAST`] ids since the last take, reading them would cost more than reading
    /// the table: the journal stops and frees them.
    pub(crate) fn note(&mut self, id: u64, procedures: usize) {
        if let Some(ids) = &mut self.ids {
            if ids.len() < 2 * procedures + AT_LEAST {
                ids.push(id);
            } else {
                self.set(None);
            }
        }
    }

    /// Whether ids are being noted.
    pub(crate) fn is_on(&self) -> bool {
        self.ids.is_some()
    }

    /// [`is_on`](Self::is_on), to read without the table's lock.
    pub(crate) fn on_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.on)
    }

    fn set(&mut self, ids: Option<Vec<u64>>) {
        self.on.store(ids.is_some(), Ordering::Release);
        self.ids = ids;
    }

    /// Starts noting afresh: the table is being taken whole.
    #[cfg(feature = "admin")]
    pub(crate) fn restart(&mut self) {
        self.set(Some(Vec::new()));
    }

    /// What was noted since the last take; noting goes on.
    #[cfg(feature = "admin")]
    pub(crate) fn take(&mut self) -> Noted {
        match &mut self.ids {
            Some(ids) => Noted::Ids(std::mem::take(ids)),
            None => Noted::Everything,
        }
    }
}

#[cfg(all(test, feature = "admin"))]
mod tests {
    use super::*;

    fn ids(noted: Noted) -> Option<Vec<u64>> {
        match noted {
            Noted::Everything => None,
            Noted::Ids(ids) => Some(ids),
        }
    }

    #[test]
    fn nothing_is_noted_until_a_list_takes_the_table_whole() {
        let mut journal = Journal::default();
        journal.note(1, 10);
        assert_eq!(ids(journal.take()), None);
        journal.restart();
        journal.note(2, 10);
        journal.note(3, 10);
        assert_eq!(ids(journal.take()), Some(vec![2, 3]));
        assert_eq!(
            ids(journal.take()),
            Some(vec![]),
            "noting goes on after a take"
        );
    }

    #[test]
    fn a_journal_nobody_takes_gives_up_at_its_bound() {
        let mut journal = Journal::default();
        journal.restart();
        for id in 0..=(AT_LEAST + 20) as u64 {
            journal.note(id, 10);
        }
        assert_eq!(
            ids(journal.take()),
            None,
            "the next list reads the table whole"
        );
        journal.note(1, 10);
        assert_eq!(
            ids(journal.take()),
            None,
            "and nothing is noted until it has"
        );
    }
}
