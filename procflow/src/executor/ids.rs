//! Procedure ids: handed out from a block the store has reserved, without the table lock.
//!
//! An id is handed out only below the durable reservation (`procflow/next_id` in the
//! store's metadata), or together with a new reservation that travels in the batch of
//! its first use ([`Reservation`](super::inner::Reservation)), while the executor's id
//! gate keeps any other new reservation out until that batch has landed. A restart
//! starts past both the reservation and every stored id, so no id is handed out twice.
//!
//! Why atomics and not the table lock: every submit takes an id, and the caller that
//! submits is often one a procedure's end has just woken, while that procedure still
//! holds the table lock to finish. One procedure at a time on the WAL, the submit slept
//! on that lock on every other procedure: 1,521 futex calls in a two-second `wal:1` cell,
//! 38 with the atomics (docs/BENCHMARKS.md, issue 33 in stop 56).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// The id counter and the end of the durable reservation.
#[derive(Debug)]
pub(crate) struct Ids {
    /// The next id to hand out.
    next: AtomicU64,
    /// The first id the durable reservation does not cover. Only grows.
    reserved: AtomicU64,
}

impl Ids {
    /// A counter at `next`, with no id reserved from there on: everything below `next`
    /// may have been handed out before a restart.
    pub(crate) fn new(next: u64) -> Self {
        Ids {
            next: AtomicU64::new(next),
            reserved: AtomicU64::new(next),
        }
    }

    /// `n` ids the durable reservation covers, if it still covers that many.
    pub(crate) fn take_reserved(&self, n: u64) -> Option<Range<u64>> {
        let mut first = self.next.load(Ordering::Acquire);
        loop {
            let end = first.checked_add(n)?;
            // Read after `next`: a reservation seen here covers every id below it, and
            // it never shrinks, so the range stays covered if the exchange succeeds.
            if end > self.reserved.load(Ordering::Acquire) {
                return None;
            }
            match self
                .next
                .compare_exchange_weak(first, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(first..end),
                Err(now) => first = now,
            }
        }
    }

    /// `n` ids whether reserved or not, and the reservation to write with the batch
    /// that uses them: `block` more ids past them. Called only under the id gate, which
    /// is held until that batch has landed.
    pub(crate) fn take_beyond(&self, n: u64, block: u64) -> (Range<u64>, u64) {
        let first = self
            .next
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |first| {
                Some(first.saturating_add(n))
            })
            .unwrap_or_else(|first| first);
        let end = first.saturating_add(n);
        (first..end, end.saturating_add(block))
    }

    /// A reservation up to `target` is durable: ids below it may be handed out.
    pub(crate) fn confirm(&self, target: u64) {
        self.reserved.fetch_max(target, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    /// A fresh counter hands out nothing until a reservation is confirmed, then exactly
    /// the ids it covers.
    #[test]
    fn only_reserved_ids_are_taken_without_a_reservation() {
        let ids = Ids::new(10);
        assert_eq!(ids.take_reserved(1), None);
        let (taken, target) = ids.take_beyond(2, 3);
        assert_eq!((taken, target), (10..12, 15));
        assert_eq!(ids.take_reserved(1), None, "not confirmed yet");
        ids.confirm(target);
        assert_eq!(ids.take_reserved(2), Some(12..14));
        assert_eq!(ids.take_reserved(2), None, "only 14 is left below 15");
        assert_eq!(ids.take_reserved(1), Some(14..15));
        assert_eq!(ids.take_reserved(1), None, "nothing is left below 15");
    }

    /// A confirmation older than the current reservation does not shrink it.
    #[test]
    fn a_reservation_never_shrinks() {
        let ids = Ids::new(10);
        ids.confirm(20);
        ids.confirm(12);
        assert_eq!(ids.take_reserved(5), Some(10..15));
    }

    /// Ids taken from several threads at once are all distinct and all reserved.
    #[test]
    fn ids_taken_concurrently_are_distinct_and_reserved() {
        let ids = Arc::new(Ids::new(1));
        ids.confirm(1 + 40_000);
        let takers: Vec<_> = (0..4)
            .map(|_| {
                let ids = Arc::clone(&ids);
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    while let Some(range) = ids.take_reserved(1) {
                        mine.extend(range);
                    }
                    mine
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for taker in takers {
            for id in taker.join().unwrap() {
                assert!(id < 40_001, "id {id} is past the reservation");
                assert!(seen.insert(id), "id {id} was handed out twice");
            }
        }
        assert_eq!(seen.len(), 40_000, "every reserved id was handed out");
    }
}
