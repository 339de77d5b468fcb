//! Hierarchical shared/exclusive locks on entity keys.
//!
//! A procedure declares the entities it works on as [`Lock`]s: a `/`-separated key
//! (`"ns"`, `"ns/t1"`, `"ns/t1/r7"`) and a [`LockMode`]. Keys form a tree, and a lock on
//! a key covers everything below it when, and only when, it is exclusive:
//!
//! | held \ requested | shared `ns/t1` | exclusive `ns/t1` | shared `ns/t1/r1` | exclusive `ns/t1/r1` |
//! |---|---|---|---|---|
//! | shared `ns/t1` | ok | conflict | ok | ok |
//! | exclusive `ns/t1` | conflict | conflict | conflict | conflict |
//!
//! So a procedure that creates a table in `ns` takes shared `ns` (the namespace must not
//! be dropped meanwhile, other tables may be created next to it) and exclusive `ns/t1`;
//! dropping the namespace takes exclusive `ns` and waits for all of them.
//!
//! Prefixes are taken segment by segment: `ns/t1` is above `ns/t1/r7`, not above
//! `ns/t10`.
//!
//! The executor keeps the locks of all running procedures in one table. A procedure
//! gets its whole declared set at once or waits holding none of it, so two procedures
//! never each hold half of what the other needs; waiting parks the procedure's task, not
//! a worker thread; requests on a key are served first come, first served, so a writer
//! is not starved by a stream of readers; and a child procedure may use the locks its
//! parent holds (it runs on the parent's behalf) instead of deadlocking on them.
//!
//! # Examples
//!
//! ```
//! use procflow::locks::{Lock, LockMode};
//!
//! let namespace = Lock::shared("ns")?;
//! let table = Lock::exclusive("ns/t1")?;
//! let region = Lock::shared("ns/t1/r7")?;
//!
//! assert_eq!(table.key(), "ns/t1");
//! assert_eq!(table.mode(), LockMode::Exclusive);
//!
//! // A shared lock on a namespace lets procedures work on different tables in it...
//! assert!(!namespace.conflicts_with(&table));
//! // ...but an exclusive lock on a table covers its regions,
//! assert!(table.conflicts_with(&region));
//! // and not a table whose name merely starts the same way.
//! assert!(!table.conflicts_with(&Lock::exclusive("ns/t10")?));
//!
//! // Keys are checked when the lock is made.
//! assert!(Lock::shared("ns//t1").is_err());
//! # Ok::<(), procflow::locks::LockKeyError>(())
//! ```

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use tokio::sync::oneshot;

/// How a [`Lock`] shares its key with other procedures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockMode {
    /// Others may hold shared locks on the same key and any lock below it. Use it for
    /// entities that must keep existing while the procedure runs (the namespace of a
    /// table being created).
    Shared,
    /// Nobody else may hold any lock on the key or below it, and no exclusive lock
    /// above it. Use it for entities the procedure changes.
    Exclusive,
}

/// A lock a procedure declares: a hierarchical key and a [`LockMode`].
///
/// Made with [`Lock::shared`], [`Lock::exclusive`] or [`Lock::new`], which check the key;
/// a deserialized lock is checked the same way.
///
/// # Examples
///
/// ```
/// use procflow::locks::Lock;
///
/// let locks = [Lock::shared("ns")?, Lock::exclusive("ns/t1")?];
/// assert_eq!(locks[1].to_string(), "exclusive ns/t1");
/// # Ok::<(), procflow::locks::LockKeyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "LockRepr")]
pub struct Lock {
    key: String,
    mode: LockMode,
}

/// The unchecked form [`Lock`] is deserialized through.
#[derive(Deserialize)]
struct LockRepr {
    key: String,
    mode: LockMode,
}

impl TryFrom<LockRepr> for Lock {
    type Error = LockKeyError;

    fn try_from(repr: LockRepr) -> Result<Self, Self::Error> {
        Lock::new(repr.key, repr.mode)
    }
}

impl Lock {
    /// A lock on `key` in the given mode.
    ///
    /// # Errors
    ///
    /// [`LockKeyError`] when `key` is not one or more non-empty segments separated by
    /// single `/`s (empty, leading or trailing `/`, or `//`).
    pub fn new(key: impl Into<String>, mode: LockMode) -> Result<Self, LockKeyError> {
        let key = key.into();
        validate_key(&key)?;
        Ok(Self { key, mode })
    }

    /// A [`Shared`](LockMode::Shared) lock on `key`.
    ///
    /// # Errors
    ///
    /// [`LockKeyError`] when `key` is malformed; see [`Lock::new`].
    pub fn shared(key: impl Into<String>) -> Result<Self, LockKeyError> {
        Self::new(key, LockMode::Shared)
    }

    /// An [`Exclusive`](LockMode::Exclusive) lock on `key`.
    ///
    /// # Errors
    ///
    /// [`LockKeyError`] when `key` is malformed; see [`Lock::new`].
    pub fn exclusive(key: impl Into<String>) -> Result<Self, LockKeyError> {
        Self::new(key, LockMode::Exclusive)
    }

    /// The key, such as `"ns/t1"`.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether the lock is shared or exclusive.
    #[must_use]
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// Whether two different procedures could not hold `self` and `other` at once.
    ///
    /// True when both are on the same key and at least one is exclusive, or when one key
    /// is strictly above the other and the lock on the upper key is exclusive. The
    /// relation is symmetric.
    #[must_use]
    pub fn conflicts_with(&self, other: &Lock) -> bool {
        if self.key == other.key {
            self.mode == LockMode::Exclusive || other.mode == LockMode::Exclusive
        } else if is_ancestor(&self.key, &other.key) {
            self.mode == LockMode::Exclusive
        } else if is_ancestor(&other.key, &self.key) {
            other.mode == LockMode::Exclusive
        } else {
            false
        }
    }
}

impl fmt::Display for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            LockMode::Shared => "shared",
            LockMode::Exclusive => "exclusive",
        };
        write!(f, "{mode} {}", self.key)
    }
}

/// Whether `upper` is a strict ancestor of `lower`, segment by segment.
fn is_ancestor(upper: &str, lower: &str) -> bool {
    lower.len() > upper.len() && lower.starts_with(upper) && lower.as_bytes()[upper.len()] == b'/'
}

fn validate_key(key: &str) -> Result<(), LockKeyError> {
    let problem = if key.is_empty() {
        Some("it is empty")
    } else if key.starts_with('/') {
        Some("it starts with `/`")
    } else if key.ends_with('/') {
        Some("it ends with `/`")
    } else if key.contains("//") {
        Some("it has an empty segment (`//`)")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(LockKeyError {
            key: key.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

/// A lock key that is not a `/`-separated path of non-empty segments.
///
/// Returned by [`Lock::new`], [`Lock::shared`] and [`Lock::exclusive`].
///
/// # Examples
///
/// ```
/// use procflow::locks::Lock;
///
/// let err = Lock::exclusive("/ns/t1").unwrap_err();
/// assert_eq!(err.key(), "/ns/t1");
/// assert!(err.to_string().contains("starts with `/`"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid lock key `{key}`: {problem}; a lock key is one or more non-empty segments \
     separated by `/`, such as `ns`, `ns/t1` or `ns/t1/r7`"
)]
pub struct LockKeyError {
    key: String,
    problem: &'static str,
}

impl LockKeyError {
    /// The rejected key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// The locks of all running procedures, and the queue of procedures waiting for theirs.
///
/// An owner is a procedure id. [`acquire`](Self::acquire) grants a procedure's whole
/// declared set at once or parks the calling task until it can; [`release`](Self::release)
/// drops everything an owner holds and grants what became possible.
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
/// The implementation scans holders and waiters linearly under one [`std::sync::Mutex`]
/// (never held across an `.await`); that is cheap for the tens to thousands of
/// procedures an executor runs at once.
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Granted locks, in the order they were granted.
    held: Vec<Held>,
    /// Waiting requests, oldest first.
    waiting: VecDeque<Waiter>,
    /// Numbers requests, so a cancelled one can be found again.
    next_ticket: u64,
}

#[derive(Debug)]
struct Held {
    owner: u64,
    lock: Lock,
    /// The request that was granted this lock.
    ticket: u64,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    request: Request,
    /// Told when the request has been granted.
    granted: oneshot::Sender<()>,
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
    fn grantable<'a>(&self, held: &[Held], earlier: impl IntoIterator<Item = &'a Waiter>) -> bool {
        let blocked_by_holder = held
            .iter()
            .any(|h| self.is_foreign(h.owner) && self.conflicts_with(&h.lock));
        let blocked_by_waiter = || {
            earlier.into_iter().any(|w| {
                self.is_foreign(w.request.owner)
                    && w.request.locks.iter().any(|lock| self.conflicts_with(lock))
            })
        };
        !blocked_by_holder && !blocked_by_waiter()
    }
}

impl State {
    fn take_ticket(&mut self) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        ticket
    }

    /// Records `request` as granted.
    fn grant(&mut self, ticket: u64, request: Request) {
        for lock in request.locks {
            let already = self
                .held
                .iter()
                .any(|h| h.owner == request.owner && h.lock == lock);
            if !already {
                self.held.push(Held {
                    owner: request.owner,
                    lock,
                    ticket,
                });
            }
        }
    }

    /// Grants, oldest first, every waiting request that can now be granted.
    ///
    /// One pass suffices: a granted request keeps blocking exactly what it blocked while
    /// waiting, so granting never unblocks a request the pass has already skipped.
    fn grant_waiters(&mut self) {
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
                // If the acquire future is gone, its drop guard (waiting for this
                // mutex) finds the grant by ticket and undoes it.
                let _ = waiter.granted.send(());
            } else {
                i += 1;
            }
        }
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
    pub(crate) fn acquire<'a>(
        &'a self,
        owner: u64,
        ancestors: &[u64],
        locks: &[Lock],
    ) -> impl Future<Output = ()> + Send + use<'a> {
        // Copied now, so the future borrows only the table.
        let request = Request::new(owner, ancestors, locks);
        async move {
            let (ticket, granted) = {
                let mut state = self.state();
                let ticket = state.take_ticket();
                if request.grantable(&state.held, &state.waiting) {
                    state.grant(ticket, request);
                    return;
                }
                let (tx, rx) = oneshot::channel();
                state.waiting.push_back(Waiter {
                    ticket,
                    request,
                    granted: tx,
                });
                (ticket, rx)
            };
            let mut guard = CancelGuard {
                table: self,
                ticket,
                armed: true,
            };
            // The sender is only dropped after sending: it lives in the queue until
            // then, and the queue lives as long as `self`.
            let _ = granted.await;
            guard.armed = false;
        }
    }

    /// Gives `owner` back the locks it held for life before a restart, ahead of every
    /// request not yet made: called while the executor starts, before any procedure runs,
    /// so no one else can be granted a conflicting lock inside the holder's life.
    ///
    /// Holders never conflicted before the crash, so none should now; if the store says
    /// otherwise (two holders of one exclusive lock), the grant still happens and the
    /// conflict is returned, for the caller to report.
    pub(crate) fn restore(&self, owner: u64, ancestors: &[u64], locks: &[Lock]) -> bool {
        let request = Request::new(owner, ancestors, locks);
        let mut state = self.state();
        let conflict = !request.grantable(&state.held, &state.waiting);
        let ticket = state.take_ticket();
        state.grant(ticket, request);
        !conflict
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
    /// request that can now be granted.
    ///
    /// Requests `owner` is still waiting on are left alone: they belong to a live
    /// [`acquire`](Self::acquire) future.
    pub(crate) fn release(&self, owner: u64) {
        let mut state = self.state();
        state.held.retain(|h| h.owner != owner);
        state.grant_waiters();
    }

    /// The `(owner, lock)` pairs held, in the order they were granted.
    pub(crate) fn holders(&self) -> Vec<(u64, Lock)> {
        let state = self.state();
        state
            .held
            .iter()
            .map(|h| (h.owner, h.lock.clone()))
            .collect()
    }

    /// The owners of waiting requests, oldest first.
    pub(crate) fn waiters(&self) -> Vec<u64> {
        let state = self.state();
        state.waiting.iter().map(|w| w.request.owner).collect()
    }

    /// Withdraws request `ticket`: out of the queue if it still waits, its locks given
    /// back if it was granted.
    fn cancel(&self, ticket: u64) {
        let mut state = self.state();
        if let Some(i) = state.waiting.iter().position(|w| w.ticket == ticket) {
            state.waiting.remove(i);
        } else {
            state.held.retain(|h| h.ticket != ticket);
        }
        state.grant_waiters();
    }
}

/// Withdraws the request of an [`LockTable::acquire`] future dropped while waiting.
struct CancelGuard<'a> {
    table: &'a LockTable,
    ticket: u64,
    armed: bool,
}

impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.table.cancel(self.ticket);
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

    /// Asserts `a` and `b` conflict (or not) in both directions.
    fn assert_conflict(a: &Lock, b: &Lock, expected: bool) {
        assert_eq!(a.conflicts_with(b), expected, "{a} vs {b}");
        assert_eq!(b.conflicts_with(a), expected, "{b} vs {a}");
    }

    #[test]
    fn conflict_matrix() {
        // Same key.
        assert_conflict(&s("ns/t1"), &s("ns/t1"), false);
        assert_conflict(&s("ns/t1"), &x("ns/t1"), true);
        assert_conflict(&x("ns/t1"), &x("ns/t1"), true);
        // Exclusive ancestor covers every descendant.
        assert_conflict(&x("ns/t1"), &s("ns/t1/r1"), true);
        assert_conflict(&x("ns/t1"), &x("ns/t1/r1"), true);
        assert_conflict(&x("ns"), &s("ns/t1/r1"), true);
        // Shared ancestor lets descendants be locked in any mode.
        assert_conflict(&s("ns"), &x("ns/t1"), false);
        assert_conflict(&s("ns"), &s("ns/t1"), false);
        assert_conflict(&s("ns/t1"), &x("ns/t1/r1"), false);
        // Siblings, and keys that only share a string prefix.
        assert_conflict(&x("ns/t1"), &x("ns/t2"), false);
        assert_conflict(&x("ns/t1"), &x("ns/t10"), false);
        assert_conflict(&x("ns/t1"), &x("ns/t10/r1"), false);
        assert_conflict(&x("ns"), &x("ns2"), false);
    }

    #[test]
    fn invalid_keys_are_rejected() {
        for key in ["", "/", "/ns", "ns/", "ns//t1", "//"] {
            let err = Lock::shared(key).expect_err(key);
            assert_eq!(err.key(), key);
            assert!(err.to_string().contains("such as `ns`"), "{err}");
            assert!(Lock::exclusive(key).is_err(), "{key}");
        }
        for key in ["ns", "ns/t1", "ns/t1/r7", "a b/c-d.e"] {
            assert_eq!(Lock::shared(key).unwrap().key(), key);
        }
        assert!(
            Lock::shared("ns//t1")
                .unwrap_err()
                .to_string()
                .contains("empty segment")
        );
    }

    #[test]
    fn deserializing_checks_the_key() {
        let lock = x("ns/t1");
        let bytes = postcard::to_allocvec(&lock).unwrap();
        assert_eq!(postcard::from_bytes::<Lock>(&bytes).unwrap(), lock);

        #[derive(Serialize)]
        struct Raw<'a> {
            key: &'a str,
            mode: LockMode,
        }
        let bad = postcard::to_allocvec(&Raw {
            key: "ns/",
            mode: LockMode::Shared,
        })
        .unwrap();
        assert!(postcard::from_bytes::<Lock>(&bad).is_err());
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
}

/// How long a procedure holds its [`Locks`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Hold {
    /// From before its first step until it ends (rolled back included); re-taken after a
    /// restart before it runs again. HBase's `holdLock = true`.
    #[default]
    ForLife,
    /// Around each step only, released in between (while it waits for children, an event
    /// or a retry).
    PerStep,
}

/// The locks a procedure declares, by overriding the `locks` method of its handler trait.
///
/// Waiting for them parks the procedure without taking a worker; they are granted
/// together (all or nothing) and first come, first served. Child procedures may take locks
/// their ancestors hold.
///
/// ```
/// use procflow::locks::{Hold, Lock, Locks};
///
/// let locks = Locks::new([Lock::shared("ns")?, Lock::exclusive("ns/users")?]);
/// assert_eq!(locks.hold(), Hold::ForLife);
/// assert_eq!(locks.per_step().hold(), Hold::PerStep);
/// assert!(Locks::none().locks().is_empty());
/// # Ok::<(), procflow::locks::LockKeyError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Locks {
    locks: Vec<Lock>,
    hold: Hold,
}

impl Locks {
    /// No locks (the default).
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }

    /// These locks, held for the procedure's life.
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> Self {
        Self {
            locks: locks.into_iter().collect(),
            hold: Hold::ForLife,
        }
    }

    /// The same locks, held around each step only.
    #[must_use]
    pub fn per_step(mut self) -> Self {
        self.hold = Hold::PerStep;
        self
    }

    /// The declared locks.
    #[must_use]
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// How long they are held.
    #[must_use]
    pub fn hold(&self) -> Hold {
        self.hold
    }
}
