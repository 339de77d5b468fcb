//! Lanes: a few long-lived tasks, each polling many procedures' futures.
//!
//! A procedure used to be a Tokio task of its own. On a durable store each of its steps
//! ends waiting for an `fdatasync`, and the store's committer thread then wakes it:
//! one wake per step through the runtime's shared queue, the task landing on whichever
//! worker takes it, a parked worker unparked for it, and the blocks the procedure
//! allocated on one worker freed on the other, where glibc takes the other arena's
//! lock. At 1,024 procedures on the write-ahead log the executor ran at a quarter of
//! its speed on a `MemStore`, as slowly with `fdatasync` turned off, and the workers
//! slept on glibc's arena locks in a third of their context switches (docs/BENCHMARKS.md,
//! issue 33).
//!
//! A lane is one task that polls its procedures' futures ([`FuturesUnordered`]). Waking
//! one of them queues it inside the lane and wakes the lane, once until it runs: a group
//! commit that answers a hundred procedures of a lane makes one runtime wake-up, and
//! their steps run one after the other on one worker. The runtime balances whole lanes
//! across its workers ([`LANES_PER_WORKER`] each), so a procedure moves between workers
//! only with its lane.
//!
//! Each poll of a lane is a round of [`deferred`](super::deferred): the snapshots its
//! procedures publish reach the table together when the poll ends.
//!
//! Two things a task had that a lane's procedure has not:
//! - **The cooperative budget.** Tokio makes a task yield after about 128 operations on
//!   its resources. Shared by a whole lane, that budget ran out within a dozen
//!   procedures' steps, after which every procedure polled got `Pending` until the lane
//!   yielded: the executor on a `MemStore` lost a quarter of its speed. Each procedure
//!   is polled [`unconstrained`](tokio::task::unconstrained) instead, and the lane
//!   yields to the runtime after one round of the procedures that were ready, as
//!   [`FuturesUnordered`] does.
//! - **Stealing single procedures.** A step that blocks its thread (which a handler must
//!   not do: `spawn_blocking` is for that) holds up the other procedures of its lane,
//!   where another worker could have taken them from a task's queue.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, Stream};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

use super::deferred::Round;
use super::inner::Table;

/// A procedure's future, or another of the executor's, ready for a lane.
type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Lanes per worker thread of the runtime: enough for the runtime to even out the
/// workers' load by moving whole lanes between them.
///
/// Why 16 and not 4, as it first was: with four, a lane held a quarter of its worker's
/// procedures, and the runtime had eight tasks to balance between two workers. At 16
/// the workers were busier (1.67–1.69 CPUs against 1.55–1.63 on `mem:1024`) and the
/// executor on a `MemStore` ran 1.17–1.35 times as fast at 1,024 clients, 1.01–1.15 at
/// 256, and 1.10–1.17 times with a yield in every step (`yield:1024`); the durable cells
/// stayed within their spread (docs/BENCHMARKS.md, "Issue 33 in stop 55"). More lanes
/// mean fewer procedures answered by one wake of a group commit, which is what lanes
/// are for; 32 per worker gained nothing more on the `MemStore` (1.1 times more on
/// `yield:1024`, nothing on the durable WAL at 64 per worker).
const LANES_PER_WORKER: usize = 16;

/// The lanes of one executor, fed round robin.
pub(crate) struct Lanes {
    senders: Vec<mpsc::UnboundedSender<Job>>,
    next: AtomicUsize,
}

impl Lanes {
    /// Starts [`LANES_PER_WORKER`] lanes per worker thread of `runtime`, for the
    /// procedures of the executor whose table is `table` (each poll of a lane applies its
    /// procedures' snapshots to it at once: [`Round`]).
    pub(crate) fn start(runtime: &tokio::runtime::Handle, table: Arc<Mutex<Table>>) -> Self {
        let workers = runtime.metrics().num_workers().max(1);
        Self::start_n(runtime, workers * LANES_PER_WORKER, &table)
    }

    fn start_n(runtime: &tokio::runtime::Handle, lanes: usize, table: &Arc<Mutex<Table>>) -> Self {
        let senders = (0..lanes.max(1))
            .map(|_| {
                let (sender, jobs) = mpsc::unbounded_channel();
                runtime.spawn(Lane {
                    table: Arc::clone(table),
                    jobs,
                    running: FuturesUnordered::new(),
                    closed: false,
                });
                sender
            })
            .collect();
        Lanes {
            senders,
            next: AtomicUsize::new(0),
        }
    }

    /// Runs `job` on the next lane. Callable from any thread. A job sent while the
    /// runtime shuts down is dropped, as a task spawned then would be.
    pub(crate) fn run(&self, job: impl Future<Output = ()> + Send + 'static) {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len();
        let job: Job = Box::pin(tokio::task::unconstrained(job));
        // Refused only once the lane's task is gone, with its runtime.
        let _ = self.senders[at].send(job);
    }
}

/// One lane's task. It ends once every sender is dropped and its last job has.
struct Lane {
    /// Its executor's table.
    table: Arc<Mutex<Table>>,
    jobs: mpsc::UnboundedReceiver<Job>,
    running: FuturesUnordered<Isolated>,
    /// Every sender is gone: no more jobs come.
    closed: bool,
}

impl Future for Lane {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let lane = &mut *self;
        // The snapshots its procedures publish in this poll go to the table together.
        let _round = Round::begin(&lane.table);
        while !lane.closed {
            match lane.jobs.poll_recv(cx) {
                Poll::Ready(Some(job)) => lane.running.push(Isolated(job)),
                Poll::Ready(None) => lane.closed = true,
                Poll::Pending => break,
            }
        }
        loop {
            // `FuturesUnordered` returns `Pending` (and wakes this task) after polling
            // each ready job once: the lane then yields to the runtime's other tasks.
            match Pin::new(&mut lane.running).poll_next(cx) {
                Poll::Ready(Some(())) => {}
                Poll::Ready(None) if lane.closed => return Poll::Ready(()),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// A job whose panic ends it alone, not its lane, as a task's panic ended that task.
struct Isolated(Job);

impl Future for Isolated {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let job = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| job.poll(cx))) {
            Ok(poll) => poll,
            Err(panic) => {
                let message = crate::executor::runner::panic_message(panic.as_ref());
                tracing::error!(%message, "a procedure's task panicked; it has stopped");
                Poll::Ready(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;
    use tokio::sync::oneshot;

    /// A job that panics ends; the other jobs of its lane go on and finish.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_job_stops_alone() {
        let lanes = Lanes::start_n(&tokio::runtime::Handle::current(), 1, &Arc::default());
        let (done, finished) = oneshot::channel();
        let (go, gate) = oneshot::channel::<()>();
        lanes.run(async move {
            gate.await.unwrap();
            done.send(()).unwrap();
        });
        lanes.run(async { panic!("a bug in a procedure's future") });
        tokio::task::yield_now().await;
        go.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), finished)
            .await
            .expect("the other job finished")
            .unwrap();
    }

    /// A job that keeps yielding does not keep the others of its lane from running.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_yielding_job_does_not_starve_its_lane() {
        let lanes = Lanes::start_n(&tokio::runtime::Handle::current(), 1, &Arc::default());
        let flag = Arc::new(AtomicBool::new(false));
        let (done, finished) = oneshot::channel();
        let seen = Arc::clone(&flag);
        lanes.run(async move {
            while !seen.load(Ordering::Acquire) {
                tokio::task::yield_now().await;
            }
            done.send(()).unwrap();
        });
        lanes.run(async move { flag.store(true, Ordering::Release) });
        tokio::time::timeout(Duration::from_secs(5), finished)
            .await
            .expect("the flag was set by the second job")
            .unwrap();
    }

    /// A job is not held to the cooperative budget of its lane's task: past 128
    /// operations in one poll, its resources still answer at once instead of making it
    /// wait for the lane to yield.
    #[tokio::test(flavor = "current_thread")]
    async fn jobs_are_not_held_to_the_lanes_budget() {
        use futures_util::FutureExt;
        let lanes = Lanes::start_n(&tokio::runtime::Handle::current(), 1, &Arc::default());
        let (done, answered) = oneshot::channel();
        lanes.run(async move {
            let semaphore = tokio::sync::Semaphore::new(1);
            let answered = (0..300)
                .take_while(|_| semaphore.acquire().now_or_never().is_some())
                .count();
            done.send(answered).unwrap();
        });
        assert_eq!(answered.await.unwrap(), 300);
    }

    /// Dropped, the lanes end once their jobs have: no task is left behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lanes_end_after_their_last_job() {
        let handle = tokio::runtime::Handle::current();
        let before = handle.metrics().num_alive_tasks();
        let lanes = Lanes::start_n(&handle, 3, &Arc::default());
        let (go, gate) = oneshot::channel::<()>();
        lanes.run(async move {
            let _ = gate.await;
        });
        drop(lanes);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            handle.metrics().num_alive_tasks(),
            before + 1,
            "the lane with a job runs on; the others ended"
        );
        go.send(()).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while handle.metrics().num_alive_tasks() > before {
            assert!(tokio::time::Instant::now() < deadline, "a lane did not end");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
