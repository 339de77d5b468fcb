//! Work shared with a second thread, a few chunks ahead of the thread that uses it.
//!
//! A restart makes a table entry for every stored procedure, one after the other, under
//! the table's lock and in id order (the order the procedures took their locks in). What
//! goes into each entry does not need that order: decoding the record's envelope and
//! head, packing its snapshot, and dropping what a dormant procedure does not keep. On
//! one thread those took about two thirds of the executor's start, with the machine's
//! other cores idle, the store's replay being over (docs/BENCHMARKS.md, "Issue 33 in
//! stop 58").
//!
//! [`map`] cuts the items into chunks. A scoped thread makes chunk after chunk, up to
//! [`CHUNKS_AHEAD`] ahead of the caller, which consumes them in order. The caller makes
//! a chunk itself when no thread has taken it yet, and makes a later one while the
//! second thread still makes the one it needs, rather than wait. So at most
//! `2 * CHUNKS_AHEAD + 1` chunks' worth of made items exist at once, where making them
//! all first would hold every one.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Items per chunk: large enough that handing a chunk over costs little against making
/// it (a few µs against about 150), small enough that the caller starts soon.
const CHUNK: usize = 256;

/// Chunks the second thread may have taken and the caller not consumed yet, at most.
/// Eight, not three: once a dormant procedure's entry was made whole on the second
/// thread (stop 66), the caller's own work per item fell below the second thread's, and
/// with three chunks of room the second thread waited for it while the caller made
/// chunks too; the quick restart log's start took 7 % less with eight (medians of ten
/// warm restarts, docs/BENCHMARKS.md, "Issue 33 in stop 66"). At about 100 bytes a made
/// item, seventeen chunks are 435 KB.
const CHUNKS_AHEAD: usize = 8;

/// Below this many items the work is done on the calling thread alone: a thread costs
/// about 50 µs to start, as much as a few hundred items.
const THREADED_FROM: usize = 2 * CHUNK;

/// Calls `each(item, make(item))` for every item of `items`, in order. From
/// [`THREADED_FROM`] items on, `make` runs on a second thread as well, ahead of `each`
/// on this one; below, or if the thread cannot start, all of it runs here. Returns when
/// every item was consumed. A panic in `make` on the second thread is raised here.
pub(crate) fn map<T, U, M, F>(items: &[T], make: M, mut each: F)
where
    T: Sync,
    U: Send,
    M: Fn(&T) -> U + Sync,
    F: FnMut(&T, U),
{
    if items.len() < THREADED_FROM {
        return items.iter().for_each(|item| each(item, make(item)));
    }
    let chunks: Vec<&[T]> = items.chunks(CHUNK).collect();
    let shared = Shared::new(chunks.len());
    std::thread::scope(|scope| {
        let maker = std::thread::Builder::new()
            .name("procflow-start".into())
            .spawn_scoped(scope, || shared.make_ahead(&chunks, &make));
        // Done here, or a panic here: a second thread waiting for room must stop, or
        // the scope would wait for it forever.
        let done = GiveUpOnDrop(&shared);
        if maker.is_err() {
            shared.give_up(); // No second thread: every chunk is made here.
        }
        for (at, chunk) in chunks.iter().enumerate() {
            let made = match shared.take(at, &chunks, &make) {
                Some(made) => made,
                None => chunk.iter().map(&make).collect(),
            };
            for (item, made) in chunk.iter().zip(made) {
                each(item, made);
            }
        }
        drop(done);
        if let Ok(Err(panic)) = maker.map(|maker| maker.join()) {
            std::panic::resume_unwind(panic);
        }
    });
}

/// What the two threads share: which chunks are taken, and those made, in order.
struct Shared<U> {
    state: Mutex<State<U>>,
    /// Signalled when a chunk is made, when the caller consumes one, and at the end.
    changed: Condvar,
}

struct State<U> {
    chunks: usize,
    /// The first chunk no thread has taken yet.
    next: usize,
    /// The chunk the caller consumes next.
    consumed: usize,
    /// The chunks the second thread took and the caller has not consumed, by number:
    /// `None` while it makes one.
    made: VecDeque<(usize, Option<Vec<U>>)>,
    /// The caller no longer waits for the second thread: it panicked, or never started,
    /// or the caller is done.
    given_up: bool,
}

impl<U> Shared<U> {
    fn new(chunks: usize) -> Self {
        Self {
            state: Mutex::new(State {
                chunks,
                next: 0,
                consumed: 0,
                made: VecDeque::new(),
                given_up: false,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<U>> {
        // A panic while holding this lock leaves its state whole: each change is one
        // assignment.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The second thread: takes the next chunk while it is at most [`CHUNKS_AHEAD`]
    /// ahead of the caller, makes it, and hands it over. If it panics, the caller makes
    /// the rest.
    fn make_ahead<T>(&self, chunks: &[&[T]], make: &(impl Fn(&T) -> U + Sync)) {
        // If it panics, the caller must not wait for the chunk it was making. (Once it
        // returns, every chunk it took is made: giving up then changes nothing.)
        let _done = GiveUpOnDrop(self);
        loop {
            let at = {
                let mut state = self.lock();
                while !state.given_up
                    && state.next < state.chunks
                    && state.next >= state.consumed + CHUNKS_AHEAD
                {
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                if state.given_up || state.next == state.chunks {
                    break;
                }
                let at = state.next;
                state.next += 1;
                state.made.push_back((at, None));
                at
            };
            let made: Vec<U> = chunks[at].iter().map(make).collect();
            Self::put(&mut self.lock(), at, made);
            self.changed.notify_all();
        }
    }

    /// The caller, for chunk `at`: the chunk once made, or `None` if no thread took it
    /// yet (now the caller's to make) or its maker panicked. While the second thread
    /// makes it, the caller makes a later one, so that neither thread waits for the
    /// other (the caller's own work per item is about half of making one).
    fn take<T>(
        &self,
        at: usize,
        chunks: &[&[T]],
        make: &(impl Fn(&T) -> U + Sync),
    ) -> Option<Vec<U>> {
        let mut state = self.lock();
        state.consumed = at + 1;
        self.changed.notify_all(); // Room for the second thread to take another.
        loop {
            match state.made.front_mut() {
                Some((chunk, made)) if *chunk == at => {
                    if let Some(made) = made.take() {
                        state.made.pop_front();
                        return Some(made);
                    }
                    if state.given_up {
                        state.made.pop_front();
                        return None; // Its maker is gone.
                    }
                }
                // Not taken: the caller's.
                _ => {
                    state.next = state.next.max(at + 1);
                    return None;
                }
            }
            if state.next < state.chunks && state.next < state.consumed + 2 * CHUNKS_AHEAD {
                let later = state.next;
                state.next += 1;
                state.made.push_back((later, None));
                drop(state);
                let made = chunks[later].iter().map(make).collect();
                state = self.lock();
                Self::put(&mut state, later, made);
                continue;
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Chunk `at`, taken by one of the threads, is `made`.
    fn put(state: &mut State<U>, at: usize, made: Vec<U>) {
        if let Some((_, slot)) = state.made.iter_mut().find(|(chunk, _)| *chunk == at) {
            *slot = Some(made);
        }
    }

    /// Tells both threads to stop waiting for the other.
    fn give_up(&self) {
        self.lock().given_up = true;
        self.changed.notify_all();
    }
}

/// Gives up ([`Shared::give_up`]) when dropped: a thread that ends, or panics, leaves
/// the other waiting for nothing.
struct GiveUpOnDrop<'a, U>(&'a Shared<U>);

impl<U> Drop for GiveUpOnDrop<'_, U> {
    fn drop(&mut self) {
        self.0.give_up();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// Each item is consumed once, in order, with what was made of it, on either side
    /// of the threshold and across chunks.
    #[test]
    fn every_item_is_consumed_in_order_with_its_own_result() {
        for len in [0, 1, THREADED_FROM - 1, THREADED_FROM, 10 * CHUNK + 17] {
            let items: Vec<u64> = (0..len as u64).collect();
            let mut seen = Vec::new();
            map(&items, |&n| n * 3 + 1, |&n, made| seen.push((n, made)));
            let expected: Vec<_> = items.iter().map(|&n| (n, n * 3 + 1)).collect();
            assert_eq!(seen, expected, "{len} items");
        }
    }

    /// From the threshold on, the second thread makes some of the items (all of them
    /// when the caller is slower); below it, none.
    #[test]
    fn many_items_are_made_on_a_second_thread_too() {
        let here = std::thread::current().id();
        for (len, elsewhere) in [(THREADED_FROM - 1, false), (8 * CHUNK, true)] {
            let items = vec![(); len];
            let others = Cell::new(0);
            map(
                &items,
                |_| std::thread::current().id() != here,
                |_, other| {
                    others.set(others.get() + usize::from(other));
                    // The caller is slow: the second thread keeps ahead.
                    std::thread::sleep(Duration::from_micros(20));
                },
            );
            assert_eq!(others.get() > 0, elsewhere, "{len} items: {others:?}");
        }
    }

    /// The caller makes what the second thread has not taken: with a second thread
    /// that makes slowly, the caller makes most chunks itself.
    #[test]
    fn the_caller_makes_what_is_not_taken_yet() {
        let here = std::thread::current().id();
        let items = vec![(); 16 * CHUNK];
        let mine = Cell::new(0);
        map(
            &items,
            |_| {
                let other = std::thread::current().id() != here;
                if other {
                    std::thread::sleep(Duration::from_micros(50));
                }
                other
            },
            |_, other| mine.set(mine.get() + usize::from(!other)),
        );
        assert!(
            mine.get() > 8 * CHUNK,
            "{} of {} made here",
            mine.get(),
            items.len()
        );
    }

    /// Neither thread makes more than a few chunks ahead of what the caller consumes,
    /// however slow the caller.
    #[test]
    fn nothing_is_made_more_than_a_few_chunks_ahead() {
        let made = AtomicUsize::new(0);
        let items = vec![(); 20 * CHUNK];
        let mut most_ahead = 0;
        let mut consumed = 0;
        map(
            &items,
            |_| made.fetch_add(1, Ordering::SeqCst),
            |_, _| {
                consumed += 1;
                most_ahead = most_ahead.max(made.load(Ordering::SeqCst) - consumed);
                if consumed % 16 == 0 {
                    std::thread::sleep(Duration::from_micros(50));
                }
            },
        );
        // The chunks taken ahead (by either thread) and the one being consumed.
        assert!(
            most_ahead <= (2 * CHUNKS_AHEAD + 1) * CHUNK,
            "{most_ahead} items made ahead"
        );
    }

    /// While the second thread makes the chunk the caller needs next, the caller makes
    /// later ones rather than wait: here the second thread holds its first chunk until
    /// the caller made two more.
    #[test]
    fn the_caller_makes_later_chunks_while_it_waits() {
        let here = std::thread::current().id();
        let items = vec![(); 16 * CHUNK];
        let holding = AtomicBool::new(false);
        let made_meanwhile = AtomicUsize::new(0);
        let released = AtomicBool::new(false);
        map(
            &items,
            |_| {
                if std::thread::current().id() == here {
                    if holding.load(Ordering::SeqCst) {
                        made_meanwhile.fetch_add(1, Ordering::SeqCst);
                    }
                } else if !holding.swap(true, Ordering::SeqCst) {
                    let until = Instant::now() + Duration::from_secs(5);
                    while made_meanwhile.load(Ordering::SeqCst) < 2 * CHUNK
                        && Instant::now() < until
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let meanwhile = made_meanwhile.load(Ordering::SeqCst);
                    released.store(meanwhile >= 2 * CHUNK, Ordering::SeqCst);
                }
            },
            |_, _| {
                // The caller is slow at first, so that the second thread takes a chunk.
                if !holding.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_micros(20));
                }
            },
        );
        assert!(released.load(Ordering::SeqCst), "the caller waited instead");
    }

    /// A panic on the caller's side ends `map` with that panic, while the second thread
    /// waits for room: it is told to stop, and the scope does not wait for it forever.
    #[test]
    fn a_panic_on_the_callers_side_does_not_leave_the_second_thread_waiting() {
        let (ended, end) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let items = vec![(); 16 * CHUNK];
            let mut consumed = 0;
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                map(
                    &items,
                    |_| (),
                    |_, _| {
                        consumed += 1;
                        // Slow enough for the second thread to fill its room first.
                        std::thread::sleep(Duration::from_micros(20));
                        assert!(consumed < CHUNK, "a bug while making an entry");
                    },
                )
            }));
            let _ = ended.send(run.is_err());
        });
        let panicked = end.recv_timeout(Duration::from_secs(30));
        assert_eq!(panicked, Ok(true), "map ended with the caller's panic");
    }

    /// A panic on the second thread is raised on the caller's, after every item was
    /// consumed: the caller makes what the second thread did not.
    #[test]
    fn a_panic_on_the_second_thread_reaches_the_caller() {
        let here = std::thread::current().id();
        let items: Vec<usize> = (0..THREADED_FROM * 4).collect();
        let consumed = AtomicUsize::new(0);
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            map(
                &items,
                |&n| {
                    let other = std::thread::current().id() != here;
                    assert!(!other, "a record that cannot be made");
                    n
                },
                |_, _| {
                    consumed.fetch_add(1, Ordering::SeqCst);
                    // The caller is slow: the second thread takes chunks.
                    std::thread::sleep(Duration::from_micros(10));
                },
            )
        }));
        let panic = run.expect_err("the second thread's panic is raised");
        let message = panic.downcast_ref::<&str>().copied().unwrap_or_default();
        assert_eq!(message, "a record that cannot be made");
        assert_eq!(consumed.load(Ordering::SeqCst), items.len());
    }
}
