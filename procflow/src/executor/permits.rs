//! The limit on handlers running at once ([`Config::workers`](super::Config::workers)):
//! a permit taken and given back with one atomic operation each while no one waits, and
//! Tokio's semaphore, first come first served, for those who do.
//!
//! Why not Tokio's semaphore alone: giving a permit back locks its queue of waiters
//! every time, even an empty one, and every step of every procedure gives one back. On
//! two workers that lock and the line of its count went back and forth between the
//! cores: a build without the permit ran a `MemStore` step 6–7 % faster
//! (docs/BENCHMARKS.md, stop 50). Here a permit given back while no one waits is one
//! atomic add on [`Workers::free`].
//!
//! While someone waits, newcomers queue behind them rather than take a permit given
//! back, and a permit given back goes to the queue: a free permit goes to the waiters
//! first, as with Tokio's semaphore alone.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use tokio::sync::Semaphore;

/// See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Workers {
    /// Permits free for the taking without a wait.
    free: AtomicUsize,
    /// Takers in [`Workers::take`]'s wait: while any is, permits given back go to
    /// `queue`.
    waiting: AtomicUsize,
    /// Permits handed to the waiters, in the order they came. A permit may stay here
    /// after its waiter gave up; the next one to wait takes it at once.
    queue: Semaphore,
}

/// A permit of [`Workers`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Permit<'a> {
    workers: &'a Workers,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.workers.give_back();
    }
}

/// A taker counted among the waiting while it waits, and not after.
struct Waiting<'a>(&'a Workers);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, SeqCst);
    }
}

impl Workers {
    /// `permits` permits, all free.
    pub(crate) fn new(permits: usize) -> Self {
        Workers {
            free: AtomicUsize::new(permits),
            waiting: AtomicUsize::new(0),
            queue: Semaphore::new(0),
        }
    }

    /// A permit at once, if one is free and no one waits for one.
    pub(crate) fn try_take(&self) -> Option<Permit<'_>> {
        // `then`, not `then_some`: a `Permit` made and dropped would give one back.
        (self.waiting.load(SeqCst) == 0 && self.take_free()).then(|| Permit { workers: self })
    }

    /// Waits for a permit.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped wait takes no permit and leaves none stranded (one given
    /// to it as it gave up stays in the queue for the next taker that waits).
    pub(crate) async fn take(&self) -> Permit<'_> {
        self.waiting.fetch_add(1, SeqCst);
        let _waiting = Waiting(self);
        // A permit given back before this taker was counted went to `free`; one given
        // back after sees it counted and goes to the queue (`give_back`).
        if self.take_free() {
            return Permit { workers: self };
        }
        match self.queue.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => unreachable!("the workers' queue is never closed"),
        }
        Permit { workers: self }
    }

    fn take_free(&self) -> bool {
        self.free
            .fetch_update(SeqCst, SeqCst, |free| free.checked_sub(1))
            .is_ok()
    }

    /// Gives a permit back: to the waiters if any, else free. It goes to `free` first
    /// and is then moved: a taker counted after the look at `waiting` finds it there.
    fn give_back(&self) {
        self.free.fetch_add(1, SeqCst);
        if self.waiting.load(SeqCst) != 0 && self.take_free() {
            self.queue.add_permits(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use std::sync::Arc;
    use std::time::Duration;

    /// How many permits are out: taken and not given back (those in the queue are not).
    fn held(workers: &Workers, permits: usize) -> usize {
        permits - workers.free.load(SeqCst) - workers.queue.available_permits()
    }

    #[test]
    fn free_permits_are_taken_at_once_and_no_more_than_there_are() {
        let workers = Workers::new(2);
        let first = workers.try_take().expect("a free permit");
        let second = workers.try_take().expect("a free permit");
        assert!(workers.try_take().is_none());
        drop(first);
        let third = workers.try_take().expect("the permit given back");
        assert_eq!(held(&workers, 2), 2);
        drop((second, third));
        assert_eq!(held(&workers, 2), 0);
    }

    /// Many tasks on two threads, taking and giving back one permit of three, each
    /// holding it across a yield: never more than three out at once, and every task
    /// gets its turns (a permit lost on its way to a waiter would hang one).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn under_contention_no_more_than_the_limit_run_and_no_waiter_is_forgotten() {
        const PERMITS: usize = 3;
        let workers = Arc::new(Workers::new(PERMITS));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (workers, running, most) = (workers.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    for _ in 0..200 {
                        let permit = match workers.try_take() {
                            Some(permit) => permit,
                            None => workers.take().await,
                        };
                        let now = running.fetch_add(1, SeqCst) + 1;
                        most.fetch_max(now, SeqCst);
                        tokio::task::yield_now().await;
                        running.fetch_sub(1, SeqCst);
                        drop(permit);
                    }
                })
            })
            .collect();
        let all = futures_util::future::join_all(tasks);
        let done = tokio::time::timeout(Duration::from_secs(60), all).await;
        assert!(
            done.expect("a taker was never given a permit")
                .iter()
                .all(Result::is_ok)
        );
        assert_eq!(most.load(SeqCst), PERMITS);
        assert_eq!(held(&workers, PERMITS), 0);
        assert_eq!(workers.waiting.load(SeqCst), 0);
    }

    #[tokio::test]
    async fn while_someone_waits_a_newcomer_queues_and_the_waiter_gets_the_permit() {
        let workers = Arc::new(Workers::new(1));
        let held_now = workers.try_take().expect("a free permit");
        let waiter = tokio::spawn({
            let workers = workers.clone();
            async move { drop(workers.take().await) }
        });
        while workers.waiting.load(SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        drop(held_now);
        assert!(workers.try_take().is_none(), "a newcomer passed the waiter");
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter got the permit given back")
            .unwrap();
        assert!(workers.try_take().is_some());
    }

    /// A waiter that gives up leaves no permit lost: the one given to it as it went is
    /// taken at once by the next that waits.
    #[tokio::test]
    async fn a_waiter_that_gives_up_strands_no_permit() {
        let workers = Workers::new(1);
        let permit = workers.try_take().expect("a free permit");
        {
            let wait = workers.take();
            let mut wait = std::pin::pin!(wait);
            assert!(wait.as_mut().now_or_never().is_none());
            // Given back while the waiter is counted: it goes to the queue.
            drop(permit);
        }
        assert_eq!(workers.waiting.load(SeqCst), 0);
        assert_eq!(held(&workers, 1), 0);
        let again = tokio::time::timeout(Duration::from_secs(10), workers.take())
            .await
            .expect("the permit left in the queue is taken at once");
        assert!(workers.try_take().is_none());
        drop(again);
        assert!(workers.try_take().is_some());
    }
}
