//! Who holds which lock after a restart: the procedures whose record says so, never a
//! guess that could give one exclusive lock to two of them.
//!
//! A procedure that holds its locks for life keeps them across a restart: nothing else
//! may run under them in the middle of its life. Its record says whether it held them
//! when it was written (`Envelope::holds_locks`), and the executor writes that before the
//! first step that runs under a new grant, so the record never claims less than the
//! procedure may have done under the lock. A restart gives the locks back to exactly
//! those procedures, oldest first, before any procedure runs; everyone else queues again.
//!
//! Two stored holders of conflicting locks cannot come from procflow: it never grants
//! them. If a store says so anyway, nobody gets the lock and the conflict is reported
//! (the executor then refuses to start, naming both).
//!
//! Records written before procflow stored this say nothing. For them the old rule
//! applies (a procedure that has started held its locks), but only where it gives no one
//! a lock someone else holds: such a guess is granted after every stored holder, and only
//! if nothing it needs is held; otherwise it queues like a procedure that holds nothing.

use super::{Lock, LockTable};
use crate::ProcedureId;
use std::collections::HashSet;

/// A live procedure that holds, or may hold, its locks for life, as its record says.
#[derive(Clone, Debug)]
pub(crate) struct Claim {
    pub(crate) owner: u64,
    /// Parent, grandparent…: their locks are the owner's to use.
    pub(crate) ancestors: Vec<u64>,
    pub(crate) locks: Vec<Lock>,
    /// `true`: the record says it holds them. `false`: the record is older than that field
    /// and the procedure has started, so it may have (the guess).
    pub(crate) recorded: bool,
}

/// Two procedures a store says hold conflicting locks for life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conflict {
    /// The holder given its locks back first (the older).
    pub(crate) holder: ProcedureId,
    /// The one that could not be given its locks back.
    pub(crate) claimant: ProcedureId,
    /// The claimant's lock in the holder's way.
    pub(crate) lock: Lock,
}

/// A restart giving locks back, claim by claim in the order of their owners (oldest
/// first: a parent before its children): a recorded holder gets its locks at once, a
/// guess once every recorded holder has ([`finish`](Self::finish)).
pub(crate) struct GiveBack<'t> {
    table: &'t LockTable,
    guesses: Vec<Claim>,
    conflicts: Vec<Conflict>,
}

impl<'t> GiveBack<'t> {
    pub(crate) fn new(table: &'t LockTable) -> Self {
        Self {
            table,
            guesses: Vec::new(),
            conflicts: Vec::new(),
        }
    }

    /// Takes `claim` into account; returns whether its owner holds its locks again now.
    /// A recorded holder that cannot get them is a [`Conflict`] (see
    /// [`finish`](Self::finish)); a guess waits for `finish`.
    pub(crate) fn claim(&mut self, claim: Claim) -> bool {
        if !claim.recorded {
            self.guesses.push(claim);
            return false;
        }
        match self
            .table
            .restore(claim.owner, &claim.ancestors, &claim.locks)
        {
            Ok(()) => true,
            Err((holder, lock)) => {
                self.conflicts.push(Conflict {
                    holder: ProcedureId::new(holder),
                    claimant: ProcedureId::new(claim.owner),
                    lock,
                });
                false
            }
        }
    }

    /// Grants the guesses that conflict with no holder, oldest first. Returns their
    /// owners, and the recorded holders that could not get their locks back (a damaged
    /// store).
    pub(crate) fn finish(self) -> (HashSet<u64>, Vec<Conflict>) {
        let granted = self
            .guesses
            .iter()
            .filter(|c| self.table.restore(c.owner, &c.ancestors, &c.locks).is_ok())
            .map(|c| c.owner)
            .collect();
        (granted, self.conflicts)
    }
}

/// Gives back, in `table`, the locks of every claim that holds them ([`GiveBack`]);
/// returns the owners that hold them, and the conflicts.
pub(crate) fn give_back(
    table: &LockTable,
    claims: impl IntoIterator<Item = Claim>,
) -> (HashSet<u64>, Vec<Conflict>) {
    let mut give_back = GiveBack::new(table);
    let mut holders = HashSet::new();
    for claim in claims {
        let owner = claim.owner;
        if give_back.claim(claim) {
            holders.insert(owner);
        }
    }
    let (guessed, conflicts) = give_back.finish();
    holders.extend(guessed);
    (holders, conflicts)
}

/// Whether a procedure whose record does not say whether it holds its locks may hold
/// them: it has started (taken a step, waits, or is past running forward). The rule of
/// records older than the field; [`give_back`] grants such a guess only without conflict.
pub(crate) fn may_have_taken(steps: u64, waits: bool, running: bool) -> bool {
    steps > 0 || waits || !running
}

/// The parent, grandparent… of `id`, `parent_of` giving each record's parent (a damaged
/// chain that loops is cut where it comes back).
pub(crate) fn ancestors(id: u64, parent_of: impl Fn(u64) -> Option<u64>) -> Vec<u64> {
    let mut ancestors = Vec::new();
    let mut at = parent_of(id);
    while let Some(parent) = at {
        if parent == id || ancestors.contains(&parent) {
            break;
        }
        ancestors.push(parent);
        at = parent_of(parent);
    }
    ancestors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(owner: u64, ancestors: &[u64], key: &str, recorded: bool) -> Claim {
        Claim {
            owner,
            ancestors: ancestors.to_vec(),
            locks: vec![Lock::exclusive(key).unwrap()],
            recorded,
        }
    }

    fn restore(table: &LockTable, claims: &[Claim]) -> (Vec<u64>, Vec<Conflict>) {
        let (holders, conflicts) = give_back(table, claims.iter().cloned());
        let mut holders: Vec<u64> = holders.into_iter().collect();
        holders.sort_unstable();
        (holders, conflicts)
    }

    #[test]
    fn recorded_holders_get_their_locks_back_and_a_child_shares_its_parents() {
        let table = LockTable::new();
        let claims = [
            claim(1, &[], "stock/s4", true),
            claim(2, &[1], "stock/s4", true),
            claim(3, &[], "stock/s5", true),
        ];
        let (holders, conflicts) = restore(&table, &claims);
        assert_eq!(holders, [1, 2, 3]);
        assert!(conflicts.is_empty());
    }

    #[test]
    fn two_recorded_holders_of_one_exclusive_lock_are_a_conflict_and_only_one_holds() {
        let table = LockTable::new();
        let claims = [
            claim(4, &[], "stock/s4", true),
            claim(9, &[], "stock/s4", true),
        ];
        let (holders, conflicts) = restore(&table, &claims);
        assert_eq!(holders, [4]);
        assert_eq!(
            conflicts,
            [Conflict {
                holder: ProcedureId::new(4),
                claimant: ProcedureId::new(9),
                lock: Lock::exclusive("stock/s4").unwrap(),
            }]
        );
        let owners: Vec<u64> = table.holders().into_iter().map(|(o, _)| o).collect();
        assert_eq!(owners, [4], "never two holders");
    }

    /// The bug of issue 29: an older record guessed to hold (a revived child, or one
    /// stopped while queued) next to the real holder. The guess yields, whatever the ids.
    #[test]
    fn a_guess_never_takes_a_lock_a_recorded_holder_has() {
        for (guess, holder) in [(3, 8), (8, 3)] {
            let table = LockTable::new();
            let mut claims = vec![
                claim(guess, &[], "stock/s4", false),
                claim(holder, &[], "stock/s4", true),
            ];
            claims.sort_by_key(|c| c.owner);
            let (holders, conflicts) = restore(&table, &claims);
            assert_eq!(holders, [holder]);
            assert!(conflicts.is_empty(), "a guess is no conflict");
        }
        // Two guesses: the older gets it, the other queues.
        let table = LockTable::new();
        let claims = [
            claim(3, &[], "stock/s4", false),
            claim(8, &[], "stock/s4", false),
        ];
        assert_eq!(restore(&table, &claims).0, [3]);
    }

    #[test]
    fn only_started_procedures_may_have_taken_their_locks() {
        assert!(!may_have_taken(0, false, true));
        assert!(may_have_taken(1, false, true));
        assert!(may_have_taken(0, true, true));
        assert!(may_have_taken(0, false, false));
    }
}
