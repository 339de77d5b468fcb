//! The lock table: who holds which lock, who waits, and in which order they are granted.

use super::{Lock, LockMode};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
#[cfg(test)]
use std::future::Future;
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard, PoisonError};
#[cfg(test)]
use tokio::sync::oneshot;

/// The locks of all running procedures, and the queue of procedures waiting for theirs.
///
/// An owner is a procedure id. [`acquire`](Self::acquire) grants a procedure's whole
/// declared set at once or parks the calling task until it can; [`request`](Self::request)
/// does the same for a procedure that has no task while it waits, and calls it back once
/// granted; [`release`](Self::release) drops everything an owner holds and grants what
/// became possible.
///
/// A request is granted when none of its locks conflicts with
///
/// - a lock held by another owner, nor
/// - a lock of a request that is still waiting and came earlier (first come, first
///   served: a stream of shared requests cannot starve an exclusive one; a request that
///   conflicts with nothing earlier is granted at once, ahead of unrelated waiters),
///
/// where locks held or awaited by the requester itself or by one of its `ancestors` (the
/// parent, grandparent… in the procedure tree) never count: a child runs on its
/// parent's behalf and may use what the parent holds.
///
/// The table does not hold on to anything across a restart. When it starts, the executor
/// first [`restore`](LockTable::restore)s the locks of every procedure that held locks for
/// life, before any procedure runs; the others queue again as their tasks reach them.
///
/// Hundreds of thousands of procedures may hold locks for life, so held locks are indexed
/// by key and by owner: a request looks only at holders of its own keys, of the keys above
/// them and, for an exclusive lock, of the keys below, and stops at the first holder that
/// is not the requester or one of its ancestors; a release touches only the owner's own
/// locks. Waiting requests are few and are scanned linearly. Everything is under one
/// [`std::sync::Mutex`], never held across an `.await` nor while calling a callback.
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    state: Mutex<State>,
}

/// What a waiting request runs when it is granted.
type OnGrant = Box<dyn FnOnce() + Send>;

#[derive(Debug, Default)]
struct State {
    /// Granted locks.
    held: Held,
    /// Waiting requests, oldest first.
    waiting: VecDeque<Waiter>,
    /// Numbers requests, so a withdrawn one can be found again.
    next_ticket: u64,
}

/// The granted locks, indexed by key for conflict checks and by owner and ticket for
/// giving them back.
#[derive(Debug, Default)]
struct Held {
    /// The holders of every key held at least once (no empty entries: the range of a
    /// key's descendants visits held keys only).
    by_key: BTreeMap<String, KeyHolders>,
    /// Every owner's locks, in the order they were granted (a handful per owner).
    by_owner: HashMap<u64, Vec<Owned>>,
    /// The owner of every ticket that was granted at least one lock.
    by_ticket: HashMap<u64, u64>,
    /// Numbers grants, so [`LockTable::holders`] lists them in the order they happened.
    next_grant: u64,
}

/// The holders of one key, as ticket → owner per mode. A ticket belongs to one owner,
/// and an owner holds a lock once, so an owner appears at most once per mode.
#[derive(Debug, Default)]
struct KeyHolders {
    shared: BTreeMap<u64, u64>,
    exclusive: BTreeMap<u64, u64>,
}

/// A lock as its owner holds it.
#[derive(Debug)]
struct Owned {
    lock: Lock,
    /// The request that was granted this lock.
    ticket: u64,
    /// When it was granted, from [`Held::next_grant`].
    grant: u64,
}

struct Waiter {
    ticket: u64,
    request: Request,
    /// Called once the request has been granted, after the table's mutex is released.
    on_grant: OnGrant,
}

impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("ticket", &self.ticket)
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Request {
    owner: u64,
    ancestors: Vec<u64>,
    locks: Vec<Lock>,
}

impl Request {
    fn new(owner: u64, ancestors: &[u64], locks: &[Lock]) -> Self {
        Self {
            owner,
            ancestors: ancestors.to_vec(),
            locks: locks.to_vec(),
        }
    }

    /// Whether locks of `other` may stand in this request's way.
    fn is_foreign(&self, other: u64) -> bool {
        other != self.owner && !self.ancestors.contains(&other)
    }

    fn conflicts_with(&self, lock: &Lock) -> bool {
        self.locks.iter().any(|mine| mine.conflicts_with(lock))
    }

    /// Whether the request can be granted given the holders and the requests before it.
    fn grantable<'a>(&self, held: &Held, earlier: impl IntoIterator<Item = &'a Waiter>) -> bool {
        let blocked_by_holder = self.locks.iter().any(|lock| held.blocks(self, lock));
        let blocked_by_waiter = || {
            earlier.into_iter().any(|w| {
                self.is_foreign(w.request.owner)
                    && w.request.locks.iter().any(|lock| self.conflicts_with(lock))
            })
        };
        !blocked_by_holder && !blocked_by_waiter()
    }
}

impl KeyHolders {
    fn of_mode(&mut self, mode: LockMode) -> &mut BTreeMap<u64, u64> {
        match mode {
            LockMode::Shared => &mut self.shared,
            LockMode::Exclusive => &mut self.exclusive,
        }
    }

    fn is_empty(&self) -> bool {
        self.shared.is_empty() && self.exclusive.is_empty()
    }
}

impl Held {
    /// Records `lock` as granted to `owner` by request `ticket`, unless `owner` already
    /// holds it.
    fn insert(&mut self, owner: u64, lock: Lock, ticket: u64, grant: u64) {
        let mine = self.by_owner.entry(owner).or_default();
        if mine.iter().any(|owned| owned.lock == lock) {
            return;
        }
        self.by_key
            .entry(lock.key().to_owned())
            .or_default()
            .of_mode(lock.mode())
            .insert(ticket, owner);
        self.by_ticket.insert(ticket, owner);
        mine.push(Owned {
            lock,
            ticket,
            grant,
        });
    }

    /// Gives back every lock `owner` holds.
    fn remove_owner(&mut self, owner: u64) {
        for owned in self.by_owner.remove(&owner).unwrap_or_default() {
            self.unindex(&owned);
        }
    }

    /// Gives back the locks granted by request `ticket`; the owner keeps the others.
    fn remove_ticket(&mut self, ticket: u64) {
        let Some(owner) = self.by_ticket.get(&ticket).copied() else {
            return;
        };
        let mine = self.by_owner.remove(&owner).unwrap_or_default();
        let (gone, kept): (Vec<_>, Vec<_>) = mine.into_iter().partition(|o| o.ticket == ticket);
        if !kept.is_empty() {
            self.by_owner.insert(owner, kept);
        }
        for owned in &gone {
            self.unindex(owned);
        }
    }

    /// Takes `owned` out of the key and ticket indexes.
    fn unindex(&mut self, owned: &Owned) {
        self.by_ticket.remove(&owned.ticket);
        let key = owned.lock.key();
        if let Some(holders) = self.by_key.get_mut(key) {
            holders.of_mode(owned.lock.mode()).remove(&owned.ticket);
            if holders.is_empty() {
                self.by_key.remove(key);
            }
        }
    }

    /// Whether a lock held by an owner foreign to `request` conflicts with `lock`, one
    /// of the request's locks.
    ///
    /// Each set of holders is searched only up to its first foreign owner: at most the
    /// requester and its ancestors come before it.
    fn blocks(&self, request: &Request, lock: &Lock) -> bool {
        self.blocker(request, lock).is_some()
    }

    /// The first owner foreign to `request` whose held lock conflicts with `lock`, one of
    /// the request's locks, if there is one.
    fn blocker(&self, request: &Request, lock: &Lock) -> Option<u64> {
        let foreign = |holders: &BTreeMap<u64, u64>| {
            holders
                .values()
                .copied()
                .find(|&owner| request.is_foreign(owner))
        };
        let exclusive = lock.mode() == LockMode::Exclusive;
        // The key itself: two shared locks are the only pair that does not conflict.
        let on_key = || {
            let holders = self.by_key.get(lock.key())?;
            foreign(&holders.exclusive)
                .or_else(|| exclusive.then(|| foreign(&holders.shared)).flatten())
        };
        // Keys above it: only exclusive locks cover what is below them.
        let above = || {
            ancestor_keys(lock.key())
                .find_map(|key| self.by_key.get(key).and_then(|h| foreign(&h.exclusive)))
        };
        // Keys below it: an exclusive lock covers them, whatever their mode.
        let below = || {
            if !exclusive {
                return None;
            }
            self.descendants(lock.key())
                .find_map(|h| foreign(&h.exclusive).or_else(|| foreign(&h.shared)))
        };
        on_key().or_else(above).or_else(below)
    }

    /// The holders of the keys strictly below `key`.
    fn descendants(&self, key: &str) -> impl Iterator<Item = &KeyHolders> {
        // They are the keys that start with `key/`, so they sort from `key/` up to
        // `key0` ('0' is the byte after '/'). Nothing else sorts there: a key that
        // differs from `key` in its first `key.len()` bytes sorts below `key/` or above
        // `key0`, one that is `key` or a prefix of it sorts below `key/`.
        let from = format!("{key}/");
        let to = format!("{key}0");
        self.by_key
            .range::<str, _>((Bound::Included(from.as_str()), Bound::Excluded(to.as_str())))
            .map(|(_, holders)| holders)
    }
}

/// The keys strictly above `key`, nearest the root first: `ns` and `ns/t1` for
/// `ns/t1/r7`.
fn ancestor_keys(key: &str) -> impl Iterator<Item = &str> {
    key.match_indices('/').map(move |(i, _)| &key[..i])
}

impl State {
    fn take_ticket(&mut self) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        ticket
    }

    /// Records `request` as granted.
    fn grant(&mut self, ticket: u64, request: Request) {
        let grant = self.held.next_grant;
        self.held.next_grant += 1;
        for lock in request.locks {
            self.held.insert(request.owner, lock, ticket, grant);
        }
    }

    /// Grants, oldest first, every waiting request that can now be granted, and returns
    /// their callbacks, for the caller to call once it has released the mutex.
    ///
    /// One pass suffices: a granted request keeps blocking exactly what it blocked while
    /// waiting, so granting never unblocks a request the pass has already skipped.
    fn grant_waiters(&mut self) -> Vec<OnGrant> {
        let mut granted = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            let candidate = &self.waiting[i];
            if candidate
                .request
                .grantable(&self.held, self.waiting.range(..i))
            {
                let Some(waiter) = self.waiting.remove(i) else {
                    break;
                };
                self.grant(waiter.ticket, waiter.request);
                granted.push(waiter.on_grant);
            } else {
                i += 1;
            }
        }
        granted
    }
}

/// Calls the callbacks of granted requests. Only without the table's mutex: a callback
/// takes other locks, and may call the table again.
fn notify(granted: Vec<OnGrant>) {
    for on_grant in granted {
        on_grant();
    }
}

impl LockTable {
    /// An empty table.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock, and the state is consistent between
        // statements, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until every lock in `locks` is granted to `owner`.
    ///
    /// `ancestors` are the owner's parent, grandparent… in the procedure tree; their
    /// locks do not stand in the way. Locks the owner already holds are kept (asking
    /// again is harmless); all locks of one owner are given back by
    /// [`release`](Self::release).
    ///
    /// Only the calling task waits, holding none of `locks` until it has all of them.
    /// An owner that waits while holding other locks can still deadlock with another
    /// owner doing the same: declare everything a step needs in one call.
    ///
    /// The returned future borrows only the table (`ancestors` and `locks` are copied),
    /// and does nothing until first polled.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe. If the future is dropped before it completes, the
    /// request leaves the queue (requests behind it are granted if they now can) and
    /// nothing is granted to `owner`; a grant that raced with the drop is undone.
    ///
    /// The executor does not wait in a task: it parks the procedure and
    /// [`request`](Self::request)s with a callback. This future serves the tests.
    #[cfg(test)]
    pub(crate) fn acquire<'a>(
        &'a self,
        owner: u64,
        ancestors: &[u64],
        locks: &[Lock],
    ) -> impl Future<Output = ()> + Send + use<'a> {
        // Copied now, so the future borrows only the table.
        let request = Request::new(owner, ancestors, locks);
        async move {
            // The channel is made only if the request has to wait.
            let mut receiver = None;
            let ticket = self.submit(request, || {
                let (sender, rx) = oneshot::channel();
                receiver = Some(rx);
                Box::new(move || {
                    // If the future is gone, its drop guard withdraws the request,
                    // which gives the grant back.
                    let _ = sender.send(());
                })
            });
            let (Some(ticket), Some(granted)) = (ticket, receiver) else {
                return;
            };
            let mut guard = CancelGuard {
                table: self,
                ticket,
                armed: true,
            };
            // The sender is only dropped unused when the request is withdrawn, which
            // only the guard does.
            let _ = granted.await;
            guard.armed = false;
        }
    }

    /// Grants `locks` to `owner` now (returns `None`, `on_grant` dropped uncalled), or
    /// queues the request and returns its ticket; `on_grant` is called once it is
    /// granted, after the table's mutex is released (never under it: the callback takes
    /// other locks).
    ///
    /// For a procedure that has no task while it waits. The rules are those of
    /// [`acquire`](Self::acquire); [`withdraw`](Self::withdraw) gives up the request
    /// (or its grant), and [`release`](Self::release) gives back all of the owner's locks.
    ///
    /// `on_grant` runs on the thread of the [`release`](Self::release) or
    /// [`withdraw`](Self::withdraw) that granted the request, so it should be quick (wake
    /// the procedure, do not run it) and must not panic: the requests granted after it in
    /// the same call would not be told.
    pub(crate) fn request(
        &self,
        owner: u64,
        ancestors: &[u64],
        locks: &[Lock],
        on_grant: Box<dyn FnOnce() + Send>,
    ) -> Option<u64> {
        self.submit(Request::new(owner, ancestors, locks), || on_grant)
    }

    /// Grants `request` now and returns `None`, or queues it with the callback
    /// `on_grant` makes (only then) and returns its ticket.
    fn submit(&self, request: Request, on_grant: impl FnOnce() -> OnGrant) -> Option<u64> {
        let mut state = self.state();
        let ticket = state.take_ticket();
        if request.grantable(&state.held, &state.waiting) {
            state.grant(ticket, request);
            // Before `on_grant` and what it holds are dropped.
            drop(state);
            return None;
        }
        state.waiting.push_back(Waiter {
            ticket,
            request,
            on_grant: on_grant(),
        });
        Some(ticket)
    }

    /// Whether request `ticket` still waits in the queue (false once granted, possibly
    /// before its callback has run, or withdrawn).
    pub(crate) fn is_waiting(&self, ticket: u64) -> bool {
        self.state().waiting.iter().any(|w| w.ticket == ticket)
    }

    /// Withdraws request `ticket`: out of the queue if it still waits (its callback is
    /// dropped uncalled), its locks given back if it was granted; then grants, oldest
    /// first, every waiting request that can now be granted, and calls their callbacks.
    ///
    /// Locks the owner held before the request, or got from other requests, are kept.
    pub(crate) fn withdraw(&self, ticket: u64) {
        let (withdrawn, granted) = {
            let mut state = self.state();
            let withdrawn = match state.waiting.iter().position(|w| w.ticket == ticket) {
                Some(i) => state.waiting.remove(i),
                None => {
                    state.held.remove_ticket(ticket);
                    None
                }
            };
            (withdrawn, state.grant_waiters())
        };
        // Dropped here, outside the mutex, like every callback.
        drop(withdrawn);
        notify(granted);
    }

    /// Gives `owner` back the locks it held for life before a restart, ahead of every
    /// request not yet made: called while the executor starts, before any procedure runs,
    /// so no one else can be granted a conflicting lock inside the holder's life (see
    /// [`restore`](super::restore) for the rules).
    ///
    /// Only the holders count (no request waits yet). If one of them holds a lock that
    /// conflicts with `locks`, nothing is granted and that holder is returned: two
    /// procedures never hold conflicting locks, not even when a store says they did.
    pub(crate) fn restore(
        &self,
        owner: u64,
        ancestors: &[u64],
        locks: &[Lock],
    ) -> Result<(), (u64, Lock)> {
        let request = Request::new(owner, ancestors, locks);
        let mut state = self.state();
        let conflict = request
            .locks
            .iter()
            .find_map(|lock| Some((state.held.blocker(&request, lock)?, lock.clone())));
        if let Some(conflict) = conflict {
            return Err(conflict);
        }
        let ticket = state.take_ticket();
        state.grant(ticket, request);
        Ok(())
    }

    #[cfg(test)]
    /// Grants every lock in `locks` to `owner` if that is possible right now.
    ///
    /// Same rules as [`acquire`](Self::acquire), and all earlier waiters count as
    /// earlier. Returns false, and queues nothing, when the request would have to wait.
    pub(crate) fn try_acquire(&self, owner: u64, ancestors: &[u64], locks: &[Lock]) -> bool {
        let request = Request::new(owner, ancestors, locks);
        let mut state = self.state();
        if !request.grantable(&state.held, &state.waiting) {
            return false;
        }
        let ticket = state.take_ticket();
        state.grant(ticket, request);
        true
    }

    /// Releases every lock `owner` holds, then grants, oldest first, every waiting
    /// request that can now be granted, and calls their callbacks.
    ///
    /// Requests `owner` is still waiting on are left alone: they belong to a live
    /// [`acquire`](Self::acquire) future or [`request`](Self::request).
    pub(crate) fn release(&self, owner: u64) {
        let granted = {
            let mut state = self.state();
            state.held.remove_owner(owner);
            state.grant_waiters()
        };
        notify(granted);
    }

    /// The `(owner, lock)` pairs held, in the order they were granted.
    pub(crate) fn holders(&self) -> Vec<(u64, Lock)> {
        let mut held: Vec<(u64, u64, Lock)> = {
            let state = self.state();
            let owners = state.held.by_owner.iter();
            owners
                .flat_map(|(&owner, mine)| {
                    mine.iter().map(move |o| (o.grant, owner, o.lock.clone()))
                })
                .collect()
        };
        // Stable: the locks of one grant keep the order they were asked in.
        held.sort_by_key(|&(grant, _, _)| grant);
        held.into_iter()
            .map(|(_, owner, lock)| (owner, lock))
            .collect()
    }

    /// The owners of waiting requests, oldest first.
    pub(crate) fn waiters(&self) -> Vec<u64> {
        let state = self.state();
        state.waiting.iter().map(|w| w.request.owner).collect()
    }
}

/// Withdraws the request of an [`LockTable::acquire`] future dropped while waiting.
#[cfg(test)]
struct CancelGuard<'a> {
    table: &'a LockTable,
    ticket: u64,
    armed: bool,
}

#[cfg(test)]
impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.table.withdraw(self.ticket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::{Pin, pin};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    fn s(key: &str) -> Lock {
        Lock::shared(key).unwrap()
    }

    fn x(key: &str) -> Lock {
        Lock::exclusive(key).unwrap()
    }

    /// Polls a future once, for tests that step through the queue deterministically.
    fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(Waker::noop()))
    }

    fn held_by(table: &LockTable, owner: u64) -> Vec<Lock> {
        table
            .holders()
            .into_iter()
            .filter(|(o, _)| *o == owner)
            .map(|(_, lock)| lock)
            .collect()
    }

    /// HBase's example: p1 and p2 need exclusive A, p3 needs exclusive B.
    #[tokio::test]
    async fn same_key_waits_other_key_does_not() {
        let table = LockTable::new();
        table.acquire(1, &[], &[x("A")]).await;

        let mut p2 = pin!(table.acquire(2, &[], &[x("A")]));
        assert!(poll_once(p2.as_mut()).is_pending());
        assert_eq!(table.waiters(), [2]);

        // p3 is not held up by p2 waiting on another key.
        table.acquire(3, &[], &[x("B")]).await;
        assert_eq!(held_by(&table, 3), [x("B")]);
        assert!(held_by(&table, 2).is_empty());

        table.release(1);
        assert!(poll_once(p2.as_mut()).is_ready());
        assert_eq!(table.holders(), [(3, x("B")), (2, x("A"))]);
        assert!(table.waiters().is_empty());
    }

    #[tokio::test]
    async fn exclusive_waiter_is_not_starved_by_shared_requests() {
        let table = LockTable::new();
        table.acquire(1, &[], &[s("t")]).await;

        let mut writer = pin!(table.acquire(2, &[], &[x("t")]));
        assert!(poll_once(writer.as_mut()).is_pending());
        // Compatible with the holder, but queued behind the writer.
        assert!(!table.try_acquire(3, &[], &[s("t")]));
        let mut reader = pin!(table.acquire(3, &[], &[s("t")]));
        assert!(poll_once(reader.as_mut()).is_pending());
        assert_eq!(table.waiters(), [2, 3]);

        table.release(1);
        assert_eq!(table.holders(), [(2, x("t"))]);
        assert!(poll_once(writer.as_mut()).is_ready());
        assert!(poll_once(reader.as_mut()).is_pending());

        table.release(2);
        assert!(poll_once(reader.as_mut()).is_ready());
        assert_eq!(table.holders(), [(3, s("t"))]);
    }

    #[tokio::test]
    async fn release_grants_all_compatible_waiters_in_order() {
        let table = LockTable::new();
        table.acquire(1, &[], &[x("ns")]).await;
        let mut a = pin!(table.acquire(2, &[], &[s("ns/t1")]));
        let mut b = pin!(table.acquire(3, &[], &[s("ns/t1")]));
        let mut c = pin!(table.acquire(4, &[], &[x("ns/t1/r1")]));
        let mut d = pin!(table.acquire(5, &[], &[x("ns/t2")]));
        for f in [a.as_mut(), b.as_mut(), c.as_mut(), d.as_mut()] {
            assert!(poll_once(f).is_pending());
        }
        table.release(1);
        // Shared `ns/t1` does not cover `ns/t1/r1`: everyone fits.
        let owners: Vec<u64> = table.holders().into_iter().map(|(o, _)| o).collect();
        assert_eq!(owners, [2, 3, 4, 5]);
        for f in [a, b, c, d] {
            assert!(poll_once(f).is_ready());
        }
    }

    #[tokio::test]
    async fn release_grants_waiters_behind_a_still_blocked_one() {
        let table = LockTable::new();
        table.acquire(1, &[], &[x("a")]).await;
        table.acquire(2, &[], &[x("b")]).await;
        let mut on_a = pin!(table.acquire(3, &[], &[x("a")]));
        let mut on_b = pin!(table.acquire(4, &[], &[x("b")]));
        assert!(poll_once(on_a.as_mut()).is_pending());
        assert!(poll_once(on_b.as_mut()).is_pending());

        table.release(2);
        assert!(poll_once(on_a.as_mut()).is_pending());
        assert!(poll_once(on_b.as_mut()).is_ready());
        assert_eq!(table.waiters(), [3]);
    }

    #[tokio::test]
    async fn all_or_nothing() {
        let table = LockTable::new();
        table.acquire(1, &[], &[x("a")]).await;

        let mut p2 = pin!(table.acquire(2, &[], &[x("b"), x("a")]));
        assert!(poll_once(p2.as_mut()).is_pending());
        assert!(held_by(&table, 2).is_empty(), "p2 took `b` without `a`");
        // `b` is free, but p2 asked for it first: p3 queues behind p2 (first come,
        // first served), while a request p2 does not conflict with goes through.
        let mut p3 = pin!(table.acquire(3, &[], &[x("b")]));
        assert!(poll_once(p3.as_mut()).is_pending());
        assert!(table.try_acquire(4, &[], &[x("c")]));

        table.release(1);
        assert!(poll_once(p2.as_mut()).is_ready());
        assert_eq!(held_by(&table, 2), [x("b"), x("a")]);
        assert!(poll_once(p3.as_mut()).is_pending());
        table.release(2);
        assert!(poll_once(p3.as_mut()).is_ready());
    }

    #[tokio::test]
    async fn waiter_holds_nothing_of_its_set() {
        let table = LockTable::new();
        table.acquire(1, &[], &[x("a")]).await;
        let mut p3 = pin!(table.acquire(3, &[], &[x("b")]));
        {
            let mut p2 = pin!(table.acquire(2, &[], &[x("b"), x("a")]));
            assert!(poll_once(p2.as_mut()).is_pending());
            assert!(poll_once(p3.as_mut()).is_pending());
            // p2 gives up while `a` is still held.
        }
        // Had p2 taken `b` while waiting for `a`, p3 would still wait; it gets `b` now,
        // while p1 keeps `a`.
        assert!(poll_once(p3.as_mut()).is_ready());
        assert_eq!(table.holders(), [(1, x("a")), (3, x("b"))]);
    }

    #[tokio::test]
    async fn lock_set_blocked_by_two_holders_waits_for_both() {
        let table = LockTable::new();
        table.acquire(1, &[], &[x("a")]).await;
        table.acquire(3, &[], &[x("b")]).await;
        let mut p2 = pin!(table.acquire(2, &[], &[x("b"), x("a")]));
        assert!(poll_once(p2.as_mut()).is_pending());

        table.release(1);
        assert!(poll_once(p2.as_mut()).is_pending());
        assert!(held_by(&table, 2).is_empty(), "took `a` without `b`");
        table.release(3);
        assert!(poll_once(p2.as_mut()).is_ready());
    }

    #[tokio::test]
    async fn child_uses_the_locks_of_its_ancestors() {
        let table = LockTable::new();
        let (parent, child, grandchild, stranger) = (1, 2, 3, 4);
        table.acquire(parent, &[], &[x("ns/t1")]).await;

        assert!(table.try_acquire(child, &[parent], &[x("ns/t1/r1")]));
        table.acquire(child, &[parent], &[x("ns/t1")]).await;
        assert!(table.try_acquire(grandchild, &[child, parent], &[x("ns/t1/r2")]));
        // Siblings and strangers are not covered.
        assert!(!table.try_acquire(5, &[parent], &[s("ns/t1/r1")]));
        let mut other = pin!(table.acquire(stranger, &[], &[s("ns/t1/r3")]));
        assert!(poll_once(other.as_mut()).is_pending());

        table.release(grandchild);
        table.release(child);
        assert!(poll_once(other.as_mut()).is_pending());
        table.release(parent);
        assert!(poll_once(other.as_mut()).is_ready());
    }

    #[tokio::test]
    async fn child_is_not_queued_behind_its_parents_waiting_request() {
        let table = LockTable::new();
        table.acquire(1, &[], &[s("ns")]).await;
        let mut parent = pin!(table.acquire(2, &[], &[x("ns")]));
        assert!(poll_once(parent.as_mut()).is_pending());

        // A child's request conflicts with its parent's waiting one: ignored.
        assert!(table.try_acquire(3, &[2], &[s("ns/t1")]));
        // A stranger's is queued behind the parent.
        assert!(!table.try_acquire(4, &[], &[s("ns/t1")]));
    }

    #[tokio::test]
    async fn dropped_waiter_leaves_the_queue() {
        let table = LockTable::new();
        table.acquire(1, &[], &[s("t")]).await;
        let timed_out =
            tokio::time::timeout(Duration::from_millis(10), table.acquire(2, &[], &[x("t")])).await;
        assert!(timed_out.is_err());
        assert!(table.waiters().is_empty());
        assert!(held_by(&table, 2).is_empty());
        // Nobody is queued on `t` any more: a reader gets in next to the holder.
        assert!(table.try_acquire(3, &[], &[s("t")]));
    }

    #[tokio::test]
    async fn dropping_a_waiter_grants_the_requests_behind_it() {
        let table = Arc::new(LockTable::new());
        table.acquire(1, &[], &[s("t")]).await;
        let writer = tokio::spawn({
            let table = Arc::clone(&table);
            async move { table.acquire(2, &[], &[x("t")]).await }
        });
        let reader = tokio::spawn({
            let table = Arc::clone(&table);
            async move { table.acquire(3, &[], &[s("t")]).await }
        });
        for _ in 0..1000 {
            if table.waiters().len() == 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(table.waiters(), [2, 3]);

        writer.abort();
        assert!(writer.await.unwrap_err().is_cancelled());
        tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the reader was not granted after the writer left")
            .unwrap();
        assert!(table.waiters().is_empty());
        assert_eq!(table.holders(), [(1, s("t")), (3, s("t"))]);
    }

    #[tokio::test]
    async fn grant_racing_with_drop_is_undone() {
        let table = LockTable::new();
        table.acquire(1, &[], &[x("t")]).await;
        {
            let mut waiter = pin!(table.acquire(2, &[], &[x("t")]));
            assert!(poll_once(waiter.as_mut()).is_pending());
            table.release(1);
            assert_eq!(held_by(&table, 2), [x("t")]);
            // Dropped before it could see the grant.
        }
        assert!(table.holders().is_empty());
    }

    #[tokio::test]
    async fn reacquiring_a_held_lock_is_harmless() {
        let table = LockTable::new();
        table.acquire(1, &[], &[x("t"), x("t")]).await;
        table.acquire(1, &[], &[x("t")]).await;
        assert_eq!(table.holders(), [(1, x("t"))]);
        table.release(1);
        assert!(table.holders().is_empty());
        table.acquire(1, &[], &[]).await;
        assert!(table.holders().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_acquirers_exclude_each_other() {
        const TASKS: u64 = 50;
        const ROUNDS: usize = 20;
        let table = Arc::new(LockTable::new());
        let inside = Arc::new(AtomicBool::new(false));
        let counter = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for owner in 0..TASKS {
            let (table, inside, counter) = (
                Arc::clone(&table),
                Arc::clone(&inside),
                Arc::clone(&counter),
            );
            // Alternate between the table and the namespace above it: all conflict.
            let lock = if owner % 2 == 0 { x("ns/t1") } else { x("ns") };
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    table.acquire(owner, &[], &[s("other"), lock.clone()]).await;
                    assert!(!inside.swap(true, Ordering::SeqCst), "two owners inside");
                    // A read-modify-write that loses updates without mutual exclusion.
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    table.release(owner);
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(counter.load(Ordering::SeqCst), TASKS as usize * ROUNDS);
        assert!(table.holders().is_empty());
        assert!(table.waiters().is_empty());
    }

    #[test]
    fn lock_table_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<LockTable>();
    }

    /// A callback that counts its calls and checks it is not called under the table's
    /// mutex.
    fn counting_callback(table: &Arc<LockTable>, calls: &Arc<AtomicUsize>) -> OnGrant {
        let (table, calls) = (Arc::clone(table), Arc::clone(calls));
        Box::new(move || {
            assert!(
                table.state.try_lock().is_ok(),
                "called under the table's mutex"
            );
            // Would deadlock under the mutex.
            let _ = table.holders();
            calls.fetch_add(1, Ordering::SeqCst);
        })
    }

    fn calls(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }

    #[test]
    fn release_calls_back_once_outside_the_mutex() {
        let table = Arc::new(LockTable::new());
        let granted = Arc::new(AtomicUsize::new(0));
        assert!(table.try_acquire(1, &[], &[x("t")]));
        let ticket = table
            .request(2, &[], &[x("t")], counting_callback(&table, &granted))
            .expect("`t` is held");
        assert!(table.is_waiting(ticket));
        assert_eq!(table.waiters(), [2]);
        assert_eq!(calls(&granted), 0);

        table.release(1);
        assert_eq!(calls(&granted), 1);
        assert!(!table.is_waiting(ticket));
        assert_eq!(table.holders(), [(2, x("t"))]);

        table.release(2);
        assert_eq!(calls(&granted), 1);
        assert_eq!(Arc::strong_count(&granted), 1, "the callback was kept");
        assert!(table.holders().is_empty());
    }

    #[test]
    fn immediate_grant_drops_the_callback_uncalled() {
        let table = Arc::new(LockTable::new());
        let granted = Arc::new(AtomicUsize::new(0));
        let ticket = table.request(1, &[], &[x("t")], counting_callback(&table, &granted));
        assert_eq!(ticket, None);
        assert_eq!(table.holders(), [(1, x("t"))]);
        assert!(table.waiters().is_empty());
        assert_eq!(Arc::strong_count(&granted), 1, "the callback was kept");
        table.release(1);
        assert_eq!(calls(&granted), 0);
    }

    #[test]
    fn withdrawing_a_waiting_request_lets_the_next_one_in() {
        let table = Arc::new(LockTable::new());
        let (writer_granted, reader_granted) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        assert!(table.try_acquire(1, &[], &[s("t")]));
        let writer = table
            .request(
                2,
                &[],
                &[x("t")],
                counting_callback(&table, &writer_granted),
            )
            .expect("`t` is held shared");
        // Compatible with the holder, but queued behind the writer.
        let reader = table
            .request(
                3,
                &[],
                &[s("t")],
                counting_callback(&table, &reader_granted),
            )
            .expect("queued behind the writer");
        assert!(table.is_waiting(writer));
        assert!(table.is_waiting(reader));

        table.withdraw(writer);
        assert!(!table.is_waiting(writer));
        assert!(!table.is_waiting(reader));
        assert_eq!(calls(&reader_granted), 1);
        assert_eq!(calls(&writer_granted), 0);
        assert_eq!(
            Arc::strong_count(&writer_granted),
            1,
            "the callback was kept"
        );
        assert!(table.waiters().is_empty());
        assert_eq!(table.holders(), [(1, s("t")), (3, s("t"))]);

        // Withdrawing again, or a ticket never issued, changes nothing.
        table.withdraw(writer);
        table.withdraw(1000);
        assert_eq!(table.holders(), [(1, s("t")), (3, s("t"))]);
    }

    #[test]
    fn withdrawing_a_granted_request_gives_back_only_its_locks() {
        let table = Arc::new(LockTable::new());
        let (granted, next_granted) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        assert!(table.try_acquire(1, &[], &[x("t")]));
        assert!(table.try_acquire(2, &[], &[x("kept")]));
        let ticket = table
            .request(
                2,
                &[],
                &[x("t"), s("u"), x("kept")],
                counting_callback(&table, &granted),
            )
            .expect("`t` is held");
        let next = table
            .request(3, &[], &[x("u")], counting_callback(&table, &next_granted))
            .expect("queued behind the shared `u`");

        table.release(1);
        assert_eq!(calls(&granted), 1);
        assert!(table.is_waiting(next));
        assert_eq!(table.holders(), [(2, x("kept")), (2, x("t")), (2, s("u"))]);

        // `kept` was held before the request: it stays.
        table.withdraw(ticket);
        assert_eq!(calls(&next_granted), 1);
        assert!(!table.is_waiting(next));
        assert_eq!(table.holders(), [(2, x("kept")), (3, x("u"))]);
    }

    #[test]
    fn keys_that_sort_among_descendants_are_not_below() {
        let table = LockTable::new();
        // Between `a` and `a/…`, or just after, but not below `a`.
        for (owner, key) in [(1, "a.b"), (2, "a0"), (3, "a-/b"), (4, "ab/c"), (5, "b/a")] {
            assert!(table.try_acquire(owner, &[], &[x(key)]), "{key}");
        }
        assert!(table.try_acquire(6, &[], &[x("a")]));
        table.release(6);

        // A descendant, however deep, is below.
        assert!(table.try_acquire(7, &[], &[s("a/b/c/d")]));
        assert!(!table.try_acquire(8, &[], &[x("a")]));
        assert!(!table.try_acquire(8, &[], &[x("a/b")]));
        assert!(table.try_acquire(8, &[], &[s("a"), x("a/b/c/d/e"), x("a/b/c/e")]));
        // And an exclusive ancestor, however high, covers it.
        assert!(!table.try_acquire(9, &[], &[s("a0/a/b")]));
        assert!(table.try_acquire(9, &[2], &[s("a0/a/b")]));
    }

    /// The table's rules written out plainly: a request against every holder and every
    /// earlier waiter, lock against lock; waiters granted one at a time, the oldest
    /// grantable first, until none is (which also checks that one pass is enough).
    #[derive(Default)]
    struct Model {
        /// `(owner, lock, ticket)`, in the order granted.
        held: Vec<(u64, Lock, u64)>,
        /// `(ticket, owner, ancestors, locks)`, oldest first.
        waiting: VecDeque<(u64, u64, Vec<u64>, Vec<Lock>)>,
        next_ticket: u64,
    }

    impl Model {
        /// Whether a holder, or one of the first `earlier` waiters, blocks the request.
        fn blocked(&self, owner: u64, ancestors: &[u64], locks: &[Lock], earlier: usize) -> bool {
            let foreign = |other: u64| other != owner && !ancestors.contains(&other);
            let conflicts = |lock: &Lock| locks.iter().any(|mine| mine.conflicts_with(lock));
            let by_holder = self
                .held
                .iter()
                .any(|(other, lock, _)| foreign(*other) && conflicts(lock));
            let by_waiter = self
                .waiting
                .iter()
                .take(earlier)
                .any(|(_, other, _, theirs)| foreign(*other) && theirs.iter().any(conflicts));
            by_holder || by_waiter
        }

        fn grant(&mut self, ticket: u64, owner: u64, locks: &[Lock]) {
            for lock in locks {
                if !self.held.iter().any(|(o, l, _)| *o == owner && l == lock) {
                    self.held.push((owner, lock.clone(), ticket));
                }
            }
        }

        fn take_ticket(&mut self) -> u64 {
            self.next_ticket += 1;
            self.next_ticket - 1
        }

        fn request(&mut self, owner: u64, ancestors: &[u64], locks: &[Lock]) -> Option<u64> {
            let ticket = self.take_ticket();
            if self.blocked(owner, ancestors, locks, self.waiting.len()) {
                let request = (ticket, owner, ancestors.to_vec(), locks.to_vec());
                self.waiting.push_back(request);
                Some(ticket)
            } else {
                self.grant(ticket, owner, locks);
                None
            }
        }

        /// A restore looks at the holders only, and grants nothing on a conflict.
        fn restore(&mut self, owner: u64, ancestors: &[u64], locks: &[Lock]) -> bool {
            let ok = !self.blocked(owner, ancestors, locks, 0);
            if ok {
                let ticket = self.take_ticket();
                self.grant(ticket, owner, locks);
            }
            ok
        }

        /// Returns the tickets granted, in order.
        fn release(&mut self, owner: u64) -> Vec<u64> {
            self.held.retain(|(o, _, _)| *o != owner);
            self.grant_waiters()
        }

        /// Returns the tickets granted, in order.
        fn withdraw(&mut self, ticket: u64) -> Vec<u64> {
            match self.waiting.iter().position(|w| w.0 == ticket) {
                Some(i) => drop(self.waiting.remove(i)),
                None => self.held.retain(|(_, _, t)| *t != ticket),
            }
            self.grant_waiters()
        }

        fn grant_waiters(&mut self) -> Vec<u64> {
            let mut granted = Vec::new();
            let grantable = |model: &Self, i: usize| {
                let (_, owner, ancestors, locks) = &model.waiting[i];
                !model.blocked(*owner, ancestors, locks, i)
            };
            while let Some(i) = (0..self.waiting.len()).find(|&i| grantable(self, i)) {
                let (ticket, owner, _, locks) = self.waiting.remove(i).unwrap();
                self.grant(ticket, owner, &locks);
                granted.push(ticket);
            }
            granted
        }

        fn holders(&self) -> Vec<(u64, Lock)> {
            self.held.iter().map(|(o, l, _)| (*o, l.clone())).collect()
        }

        fn waiters(&self) -> Vec<u64> {
            self.waiting.iter().map(|w| w.1).collect()
        }
    }

    /// A random key of one to three segments, some of which sort between a key and its
    /// descendants (`a.` and `a0` next to `a/…`).
    fn random_key(rng: &mut fastrand::Rng) -> String {
        const SEGMENTS: [&str; 4] = ["a", "a0", "a.", "b"];
        let depth = rng.usize(1..=3);
        let segments: Vec<&str> = (0..depth)
            .map(|_| SEGMENTS[rng.usize(..SEGMENTS.len())])
            .collect();
        segments.join("/")
    }

    /// `(ancestors, locks)` of a random request by `owner` among `owners`.
    fn random_request(rng: &mut fastrand::Rng, owner: u64, owners: u64) -> (Vec<u64>, Vec<Lock>) {
        let ancestors = (0..rng.usize(..=2))
            .map(|_| rng.u64(..owners))
            .filter(|&a| a != owner)
            .collect();
        let locks = (0..rng.usize(..=3))
            .map(|_| {
                let key = random_key(rng);
                if rng.bool() { s(&key) } else { x(&key) }
            })
            .collect();
        (ancestors, locks)
    }

    /// The indexed table decides like the linear rules, over random requests, restores,
    /// releases and withdrawals.
    #[test]
    fn index_agrees_with_the_linear_rules() {
        const OWNERS: u64 = 6;
        let (mut queued, mut called_back, mut restore_conflicts) = (0, 0, 0);
        for seed in 0..200 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let table = LockTable::new();
            let mut model = Model::default();
            let log = Arc::new(Mutex::new(Vec::new()));
            for step in 0..200 {
                let context = format!("seed {seed}, step {step}");
                let owner = rng.u64(..OWNERS);
                let expected = match rng.u8(..20) {
                    0..=7 => {
                        let (ancestors, locks) = random_request(&mut rng, owner, OWNERS);
                        let on_grant: OnGrant = {
                            let (log, ticket) = (Arc::clone(&log), model.next_ticket);
                            Box::new(move || log.lock().unwrap().push(ticket))
                        };
                        let ticket = table.request(owner, &ancestors, &locks, on_grant);
                        let expected = model.request(owner, &ancestors, &locks);
                        assert_eq!(ticket, expected, "{context}");
                        queued += usize::from(ticket.is_some());
                        Vec::new()
                    }
                    8 => {
                        let (ancestors, locks) = random_request(&mut rng, owner, OWNERS);
                        let restored = table.restore(owner, &ancestors, &locks);
                        if let Err((holder, lock)) = &restored {
                            // The one it names holds a lock in the way.
                            assert!(holder != &owner && !ancestors.contains(holder));
                            let held = model.holders();
                            assert!(
                                held.iter()
                                    .any(|(o, l)| o == holder && l.conflicts_with(lock)),
                                "{context}"
                            );
                        }
                        let ok = restored.is_ok();
                        assert_eq!(ok, model.restore(owner, &ancestors, &locks), "{context}");
                        restore_conflicts += usize::from(!ok);
                        Vec::new()
                    }
                    9..=14 => {
                        table.release(owner);
                        model.release(owner)
                    }
                    _ => {
                        // A waiting request half of the time, else any ticket (granted,
                        // withdrawn, or not issued yet).
                        let ticket = match rng.choice(&model.waiting) {
                            Some(waiter) if rng.bool() => waiter.0,
                            _ => rng.u64(..=model.next_ticket),
                        };
                        table.withdraw(ticket);
                        model.withdraw(ticket)
                    }
                };
                let granted = std::mem::take(&mut *log.lock().unwrap());
                assert_eq!(granted, expected, "{context}");
                called_back += granted.len();
                assert_eq!(table.holders(), model.holders(), "{context}");
                assert_eq!(table.waiters(), model.waiters(), "{context}");
                // Every waiting ticket, and one that may not wait.
                let ticket = rng.u64(..=model.next_ticket);
                let waiting = model.waiting.iter().any(|w| w.0 == ticket);
                assert_eq!(table.is_waiting(ticket), waiting, "{context}, {ticket}");
                for (ticket, ..) in &model.waiting {
                    assert!(table.is_waiting(*ticket), "{context}, {ticket}");
                }
            }
            // Emptied, the table keeps nothing behind in its indexes.
            for ticket in 0..model.next_ticket {
                table.withdraw(ticket);
            }
            for owner in 0..OWNERS {
                table.release(owner);
            }
            let state = table.state();
            assert!(state.waiting.is_empty(), "seed {seed}");
            let held = &state.held;
            assert!(held.by_key.is_empty(), "seed {seed}: {:?}", held.by_key);
            assert!(held.by_owner.is_empty(), "seed {seed}: {:?}", held.by_owner);
            assert!(
                held.by_ticket.is_empty(),
                "seed {seed}: {:?}",
                held.by_ticket
            );
        }
        // The random requests did wait and get granted, not only pass.
        assert!(queued > 1000, "{queued}");
        assert!(called_back > 1000, "{called_back}");
        assert!(restore_conflicts > 100, "{restore_conflicts}");
    }

    /// A hundred thousand procedures holding locks for life, like accounts under a
    /// shared `acct`: each request looks at the holders of its own keys and of the keys
    /// above, not at every holder.
    #[test]
    fn a_hundred_thousand_holders() {
        const OWNERS: u64 = 100_000;
        let account = |n: u64| x(&format!("acct/{n}"));
        let table = Arc::new(LockTable::new());
        for n in 0..OWNERS {
            let locks = [s("acct"), account(n)];
            // Half restored after a restart, half acquired.
            if n % 2 == 0 {
                assert!(table.restore(n, &[], &locks).is_ok(), "{n}");
            } else {
                assert!(
                    poll_once(pin!(table.acquire(n, &[], &locks))).is_ready(),
                    "{n}"
                );
            }
        }

        // One account's writer waits for that account's holder only.
        let (one_granted, all_granted) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let writer = OWNERS;
        let one = table
            .request(
                writer,
                &[],
                &[account(7)],
                counting_callback(&table, &one_granted),
            )
            .expect("owner 7 holds the account");
        // Readers of all accounts are not held up by them.
        assert!(table.try_acquire(OWNERS + 1, &[], &[s("acct")]));
        // A writer of all accounts waits for every holder on and below `acct`.
        let all = table
            .request(
                OWNERS + 2,
                &[],
                &[x("acct")],
                counting_callback(&table, &all_granted),
            )
            .expect("`acct` and the accounts are held");

        table.release(7);
        assert_eq!(calls(&one_granted), 1);
        assert!(!table.is_waiting(one));
        assert!(held_by(&table, writer).contains(&account(7)));

        for n in (0..=OWNERS + 1).filter(|&n| n != writer) {
            table.release(n);
        }
        // The account's writer still holds one lock below `acct`.
        assert!(table.is_waiting(all));
        assert_eq!(calls(&all_granted), 0);
        assert_eq!(table.holders(), [(writer, account(7))]);

        table.release(writer);
        assert_eq!(calls(&all_granted), 1);
        assert_eq!(table.holders(), [(OWNERS + 2, x("acct"))]);
        table.release(OWNERS + 2);
        assert!(table.holders().is_empty());
        assert!(table.waiters().is_empty());
    }
}
