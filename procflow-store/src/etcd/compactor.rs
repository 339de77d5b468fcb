//! Compaction: etcd keeps every revision of every key until it is compacted, and every
//! step of every procedure writes one. Left alone, its database grows to the space quota
//! (2 GiB by default) and etcd then refuses every write (`mvcc: database space exceeded`)
//! until an operator compacts, defragments and disarms the alarm.
//!
//! So a store that writes compacts what it no longer needs, on a time window: every
//! [`Compaction::every`] it notes the revision its last transaction created, and it
//! compacts etcd's history up to the revision it noted [`Compaction::retain`] ago. The
//! history kept is what watches and paged loads may still ask for: a store never compacts
//! past the revision a load of its own reads at ([`Pins`]), and a load of another process
//! that finds its revision compacted starts again (`EtcdStore::load`).
//!
//! Only a store that writes compacts (its own revisions are what it samples): in an
//! executor group that is the leader's. Compaction is cluster-wide in etcd: it also drops
//! the history of keys outside this store's prefix.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use super::Shared;

/// How an [`EtcdStore`](super::EtcdStore) compacts etcd's history
/// ([`EtcdConfig::compaction`](super::EtcdConfig::compaction)).
///
/// The default compacts every minute and keeps the last five minutes of history, like
/// etcd's own `--auto-compaction-mode periodic --auto-compaction-retention 5m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compaction {
    every: Option<Duration>,
    retain: Duration,
}

impl Compaction {
    /// Every `every`, compacts the history older than `retain` (both at least 1 ms for
    /// `every`; `retain` may be zero: then each compaction keeps only the latest revision
    /// this store had written).
    #[must_use]
    pub fn new(every: Duration, retain: Duration) -> Self {
        Self {
            every: Some(every.max(Duration::from_millis(1))),
            retain,
        }
    }

    /// Never compacts: etcd's own auto-compaction, or an operator, must.
    #[must_use]
    pub fn off() -> Self {
        Self {
            every: None,
            retain: Duration::ZERO,
        }
    }

    /// How often the store compacts; `None` if it never does.
    #[must_use]
    pub fn every(&self) -> Option<Duration> {
        self.every
    }

    /// How much history each compaction keeps.
    #[must_use]
    pub fn retain(&self) -> Duration {
        self.retain
    }
}

impl Default for Compaction {
    fn default() -> Self {
        Self::new(Duration::from_secs(60), Duration::from_secs(300))
    }
}

/// The revisions loads of this store read at: the compactor stays at or below the
/// lowest.
#[derive(Default)]
pub(crate) struct Pins {
    revisions: Mutex<Vec<i64>>,
    /// The revision this store's latest transaction created (0 before the first).
    pub(crate) written: AtomicI64,
}

impl Pins {
    /// Pins the revision a load starting now will read at or above, until the guard is
    /// dropped (also when the load's future is).
    pub(crate) fn pin(&self) -> Pin<'_> {
        let revision = self.written.load(Ordering::SeqCst);
        self.lock().push(revision);
        Pin {
            pins: self,
            revision,
        }
    }

    /// Notes a revision this store's transaction created.
    pub(crate) fn wrote(&self, revision: i64) {
        self.written.fetch_max(revision, Ordering::SeqCst);
    }

    fn lowest(&self) -> Option<i64> {
        self.lock().iter().copied().min()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<i64>> {
        self.revisions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A load's pin; see [`Pins::pin`].
pub(crate) struct Pin<'a> {
    pins: &'a Pins,
    revision: i64,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let mut revisions = self.pins.lock();
        if let Some(at) = revisions.iter().position(|&r| r == self.revision) {
            revisions.swap_remove(at);
        }
    }
}

/// Compacts on `policy` until the store is gone.
pub(crate) async fn run(shared: Weak<Shared>, policy: Compaction) {
    let Some(every) = policy.every else { return };
    let mut samples = VecDeque::new();
    let mut compacted = 0;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        let written = shared.pins.written.load(Ordering::SeqCst);
        if written > 0 {
            samples.push_back((now, written));
        }
        let Some(due) = due(&mut samples, now, policy.retain) else {
            continue;
        };
        let target = shared.pins.lowest().map_or(due, |pinned| pinned.min(due));
        if target <= compacted {
            continue;
        }
        match compact(&shared, target).await {
            Ok(()) => compacted = target,
            Err(error) => {
                tracing::warn!(%error, revision = target, "could not compact etcd's history");
            }
        }
    }
}

/// The newest sampled revision at least `retain` old, dropping the samples older than
/// it (they will never be due again).
fn due(samples: &mut VecDeque<(Instant, i64)>, now: Instant, retain: Duration) -> Option<i64> {
    let old_enough = samples
        .iter()
        .rposition(|(at, _)| now.saturating_duration_since(*at) >= retain)?;
    samples.drain(..old_enough);
    samples.front().map(|&(_, revision)| revision)
}

/// Compacts etcd's history up to `revision`; a history already compacted further (by
/// another store, or etcd's auto-compaction) is no error.
async fn compact(shared: &Shared, revision: i64) -> Result<(), crate::StoreError> {
    let result = shared
        .call("compacting etcd's history", |mut kv| async move {
            kv.compact(revision, None).await
        })
        .await;
    match result {
        Ok(_) => Ok(()),
        Err(error) if super::is_compacted(&error) => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_is_the_newest_sample_at_least_retain_old() {
        let start = Instant::now();
        let at = |s| start + Duration::from_secs(s);
        let mut samples: VecDeque<_> = [(at(0), 10), (at(60), 20), (at(120), 30)].into();
        assert_eq!(due(&mut samples, at(100), Duration::from_secs(300)), None);
        assert_eq!(
            due(&mut samples, at(330), Duration::from_secs(300)),
            Some(10)
        );
        assert_eq!(
            due(&mut samples, at(400), Duration::from_secs(300)),
            Some(20)
        );
        assert_eq!(samples.len(), 2, "the sample before the due one is dropped");
        assert_eq!(due(&mut samples, at(120), Duration::ZERO), Some(30));
        assert_eq!(samples.len(), 1);
    }

    #[test]
    fn a_pin_holds_until_dropped_and_the_lowest_wins() {
        let pins = Pins::default();
        pins.wrote(7);
        let first = pins.pin();
        pins.wrote(9);
        let second = pins.pin();
        assert_eq!(pins.lowest(), Some(7));
        drop(first);
        assert_eq!(pins.lowest(), Some(9));
        drop(second);
        assert_eq!(pins.lowest(), None);
    }
}
