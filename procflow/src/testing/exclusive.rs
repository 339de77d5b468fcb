//! Lock exclusivity, checked where a crash test can break it: at every store write and
//! after every restart, no two procedures hold conflicting locks (a child may hold what
//! its ancestors hold: it runs on their behalf).

use crate::ProcedureId;
use crate::executor::Executor;
use crate::locks::Lock;

/// Two procedures holding conflicting locks at once, neither an ancestor of the other.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{first} holds `{first_lock}` while {second} holds `{second_lock}`: they conflict")]
pub struct LockConflict {
    /// One holder.
    pub first: ProcedureId,
    /// Its lock.
    pub first_lock: Lock,
    /// The other holder.
    pub second: ProcedureId,
    /// Its lock.
    pub second_lock: Lock,
}

/// The first pair of procedures `executor` lets hold conflicting locks right now, if
/// any: what must never happen, through crashes and restarts included.
///
/// Use it in your own tests between steps, or let [`CrashTest`](super::CrashTest) call
/// it at every store write and after every restart.
#[must_use]
pub fn lock_conflict<E: Send + Sync + 'static>(executor: &Executor<E>) -> Option<LockConflict> {
    let parent = |id: ProcedureId| executor.state(id).and_then(|info| info.parent);
    conflict(&executor.held_locks(), parent)
}

/// [`lock_conflict`] over `held`, with each procedure's parent from `parent`.
fn conflict(
    held: &[(ProcedureId, Lock)],
    parent: impl Fn(ProcedureId) -> Option<ProcedureId>,
) -> Option<LockConflict> {
    let descends = |mut id: ProcedureId, from: ProcedureId| {
        // Bounded: a damaged chain must not loop.
        for _ in 0..held.len().max(64) {
            match parent(id) {
                Some(up) if up == from => return true,
                Some(up) => id = up,
                None => return false,
            }
        }
        false
    };
    held.iter().enumerate().find_map(|(i, (a, la))| {
        held[i + 1..].iter().find_map(|(b, lb)| {
            let related = a == b || descends(*a, *b) || descends(*b, *a);
            (!related && la.conflicts_with(lb)).then(|| LockConflict {
                first: *a,
                first_lock: la.clone(),
                second: *b,
                second_lock: lb.clone(),
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> ProcedureId {
        ProcedureId::new(n)
    }

    #[test]
    fn unrelated_holders_of_conflicting_locks_are_found_and_a_lineage_is_not() {
        let x = |key: &str| Lock::exclusive(key).unwrap();
        let s = |key: &str| Lock::shared(key).unwrap();
        // 2 is 1's child, 3 is 2's child: they share 1's locks.
        let parent = |p: ProcedureId| match p.get() {
            2 => Some(id(1)),
            3 => Some(id(2)),
            _ => None,
        };
        let lineage = [
            (id(1), x("stock")),
            (id(2), x("stock")),
            (id(3), x("stock/s4")),
        ];
        assert_eq!(conflict(&lineage, parent), None);
        let readers = [(id(4), s("stock")), (id(5), s("stock"))];
        assert_eq!(conflict(&readers, parent), None);
        let two = [
            (id(1), x("stock")),
            (id(2), x("stock")),
            (id(7), s("stock/s4")),
        ];
        assert_eq!(
            conflict(&two, parent),
            Some(LockConflict {
                first: id(1),
                first_lock: x("stock"),
                second: id(7),
                second_lock: s("stock/s4"),
            })
        );
    }
}
