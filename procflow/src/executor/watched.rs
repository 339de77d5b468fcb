//! A procedure's public snapshot, with a watch channel only once someone subscribes.
//!
//! Every table entry holds its procedure's [`ProcedureInfo`]. A `tokio::sync::watch`
//! channel costs about 530 bytes (its shared state has nine `Notify`s), more than half
//! a dormant procedure's own footprint; most procedures are never subscribed to while
//! they wait. So the entry keeps the snapshot itself, and makes the channel when the
//! first subscriber asks (`Executor::subscribe`), from then on sending every
//! change through it. The API mirrors `watch::Sender`'s, so callers read the same. The
//! snapshot is kept packed (see [`PackedInfo`]).
//!
//! A channel whose receivers have all gone is dropped: at the next change, or by the
//! retention pass's sweep ([`Table::sweep_unwatched`](super::inner::Table)) for a
//! procedure that does not change again, such as one that parked for good. Without that,
//! every procedure ever subscribed to kept its channel for life: 540 bytes each, 54 MB
//! for the 100,000 the admin bench watches until they park.

use super::packed::PackedInfo;
use super::status::ProcedureInfo;
#[cfg(feature = "admin")]
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::watch;

/// Counts every change of every snapshot in the process (a new procedure, a new
/// snapshot, one gone): a list that remembers the count it was built at knows, with one
/// load, whether it may still be current. Shared by the executors of a process, so one's
/// changes make another's lists rebuild needlessly, never miss a change. Counted only
/// with the `admin` feature, whose lists use it.
#[cfg(feature = "admin")]
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// See [`CHANGES`].
#[cfg(feature = "admin")]
pub(crate) fn changes() -> u64 {
    CHANGES.load(Ordering::Acquire)
}

/// Counts one change of a snapshot (see [`CHANGES`]; nothing without the `admin` feature).
pub(crate) fn changed() {
    #[cfg(feature = "admin")]
    CHANGES.fetch_add(1, Ordering::Release);
}

/// See the [module docs](self).
pub(crate) struct Watched {
    current: PackedInfo,
    channel: Option<watch::Sender<ProcedureInfo>>,
}

impl Watched {
    pub(crate) fn new(info: PackedInfo) -> Self {
        changed();
        Self {
            current: info,
            channel: None,
        }
    }

    /// The current snapshot.
    pub(crate) fn borrow(&self) -> &PackedInfo {
        &self.current
    }

    /// A receiver of every later snapshot, seeing the current one as seen, and whether
    /// the channel was made for it (to be swept once its receivers are gone).
    pub(crate) fn subscribe(&mut self) -> (watch::Receiver<ProcedureInfo>, bool) {
        let made = self.channel.is_none();
        let current = &self.current;
        let channel = (self.channel).get_or_insert_with(|| watch::Sender::new(current.unpack()));
        (channel.subscribe(), made)
    }

    /// Drops the channel if no receiver is left; whether one is still kept.
    pub(crate) fn drop_unwatched(&mut self) -> bool {
        if self
            .channel
            .as_ref()
            .is_some_and(|channel| channel.receiver_count() == 0)
        {
            self.channel = None;
        }
        self.channel.is_some()
    }

    /// Replaces the snapshot and tells the subscribers.
    pub(crate) fn send_replace(&mut self, info: PackedInfo) {
        self.send(info, |_, _| true);
    }

    /// Replaces the snapshot if it changed, telling the subscribers only then.
    pub(crate) fn send_if_changed(&mut self, info: PackedInfo) {
        self.send(info, |current, new| current != new);
    }

    /// Replaces the snapshot if `replace` says so, telling the subscribers then.
    fn send(&mut self, packed: PackedInfo, replace: impl FnOnce(&PackedInfo, &PackedInfo) -> bool) {
        if !replace(&self.current, &packed) {
            return;
        }
        self.drop_unwatched();
        if let Some(channel) = &self.channel {
            channel.send_replace(packed.unpack());
        }
        self.current = packed;
        changed();
    }
}

#[cfg(feature = "admin")]
impl Drop for Watched {
    fn drop(&mut self) {
        changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(steps: u64) -> PackedInfo {
        PackedInfo::sample(1, steps)
    }

    #[test]
    fn a_subscriber_sees_the_snapshot_it_joined_at_and_every_change_after() {
        let mut watched = Watched::new(info(0));
        watched.send_replace(info(1));
        let (mut rx, made) = watched.subscribe();
        assert!(made);
        assert_eq!(rx.borrow_and_update().steps, 1);
        watched.send_if_changed(info(1));
        assert!(
            !rx.has_changed().unwrap(),
            "an unchanged snapshot is not sent"
        );
        watched.send_if_changed(info(2));
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().steps, 2);
        assert_eq!(watched.borrow().unpack().steps, 2);
        // A second subscriber shares the channel.
        let (second, made) = watched.subscribe();
        assert!(!made);
        assert_eq!(second.borrow().steps, 2);
    }

    #[test]
    fn subscribers_see_the_channel_close_when_the_entry_goes() {
        let mut watched = Watched::new(info(0));
        let (rx, _) = watched.subscribe();
        drop(watched);
        assert!(rx.has_changed().is_err());
    }

    #[test]
    fn a_channel_whose_receivers_are_gone_is_dropped_and_made_again_when_asked() {
        let mut watched = Watched::new(info(0));
        let (rx, _) = watched.subscribe();
        assert!(
            watched.drop_unwatched(),
            "a receiver is left: the channel stays"
        );
        drop(rx);
        assert!(
            !watched.drop_unwatched(),
            "no receiver is left: the channel goes"
        );
        let (mut rx, made) = watched.subscribe();
        assert!(made, "a new subscriber gets a new channel");
        assert_eq!(rx.borrow_and_update().steps, 0);
        drop(rx);
        // A change with nobody listening drops it too, and is kept all the same.
        watched.send_replace(info(1));
        assert!(watched.channel.is_none());
        assert_eq!(watched.borrow().unpack().steps, 1);
    }
}
