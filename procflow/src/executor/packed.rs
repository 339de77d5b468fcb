//! A procedure's snapshot as its table entry and the admin's list keep it:
//! [`ProcedureInfo`]'s fields in under half its size.
//!
//! An entry lives as long as its procedure, a dormant one's too, and a restart may load
//! a million; the admin's list keeps a row for each of them. `ProcedureInfo` takes 216
//! bytes, most of it room for what few procedures have: a stuck status and an error.
//! The snapshot keeps the other statuses as a one-byte tag (and a suspended one's event
//! name), the times as nanoseconds since the epoch, and boxes the rest: 104 bytes in
//! all. It is packed once per published change and unpacked only for readers
//! (`Executor::state`, `list`, the admin page's rows as it sends them, subscribers).

use super::status::{Outcome, ProcedureInfo, Status, outcome_of};
use crate::stored::history::time_of;
use crate::{Error, ProcedureId};
use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PackedInfo {
    id: ProcedureId,
    /// Its parent, or its own id when it has none: no procedure is its own parent (a
    /// damaged record that says so is marked in `rare`), and an `Option` would take 8
    /// bytes more.
    parent: ProcedureId,
    machine: &'static str,
    state: &'static str,
    steps: u64,
    /// Nanoseconds since the epoch; 0 when `rare` holds the times.
    submitted: u64,
    /// As `submitted`.
    updated: u64,
    /// The event a suspended procedure waits for.
    event: Option<Box<str>>,
    /// What does not fit the fields above. Packing makes it only when needed, so that
    /// two snapshots compare equal exactly when their infos do.
    rare: Option<Box<Rare>>,
    /// The status when `rare` does not hold it.
    plain: Plain,
}

/// The statuses kept without a box.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plain {
    Runnable,
    WaitingChildren,
    WaitingForLock,
    /// Its event is in [`PackedInfo::event`].
    Suspended,
    RollingBack,
    Succeeded,
    RolledBack,
    Failed,
    Bypassed,
}

/// The parts of a snapshot few procedures have.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rare {
    /// Set when the status is not [`Plain`].
    status: Option<Status>,
    error: Option<Error>,
    /// Set only when a time does not fit in 64 bits of nanoseconds since the epoch.
    times: Option<(SystemTime, SystemTime)>,
    /// Its parent is itself: a damaged record, kept as it reads.
    own_parent: bool,
}

impl Plain {
    /// The tag of `status` and, if suspended, its event; `None` if it carries more.
    fn of(status: Status) -> Result<(Self, Option<Box<str>>), Status> {
        let plain = match status {
            Status::Runnable => Self::Runnable,
            Status::WaitingChildren => Self::WaitingChildren,
            Status::WaitingForLock => Self::WaitingForLock,
            Status::Suspended { event } => return Ok((Self::Suspended, Some(event.into()))),
            Status::RollingBack => Self::RollingBack,
            Status::Succeeded => Self::Succeeded,
            Status::RolledBack => Self::RolledBack,
            Status::Failed => Self::Failed,
            Status::Bypassed => Self::Bypassed,
            other => return Err(other),
        };
        Ok((plain, None))
    }

    fn status(self, event: Option<&str>) -> Cow<'static, Status> {
        Cow::Borrowed(match self {
            Self::Runnable => &Status::Runnable,
            Self::WaitingChildren => &Status::WaitingChildren,
            Self::WaitingForLock => &Status::WaitingForLock,
            Self::Suspended => {
                return Cow::Owned(Status::Suspended {
                    event: event.unwrap_or_default().to_owned(),
                });
            }
            Self::RollingBack => &Status::RollingBack,
            Self::Succeeded => &Status::Succeeded,
            Self::RolledBack => &Status::RolledBack,
            Self::Failed => &Status::Failed,
            Self::Bypassed => &Status::Bypassed,
        })
    }
}

/// `time` as nanoseconds since the epoch, if that fits in a `u64` (until the year 2554)
/// and is not 0, which marks times kept in [`Rare`].
#[cfg(test)]
fn nanos(time: SystemTime) -> Option<u64> {
    let since = time.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(since.as_nanos()).ok().filter(|&n| n != 0)
}

fn time(nanos: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(nanos)
}

/// `ms` milliseconds since the epoch as [`nanos`] gives them for that time: the same
/// number without going through a `SystemTime` (a step publishes two).
fn nanos_of_ms(ms: u64) -> Option<u64> {
    ms.checked_mul(1_000_000).filter(|&n| n != 0)
}

/// What a forward step changes in a running procedure's snapshot: the state, the step
/// count and the update time. Kept in the procedure's [`Signal`](super::signal::Signal),
/// not published to its table entry: see `signal.rs` for why, and
/// [`PackedInfo::moved_on`] for how readers apply it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Progress {
    state: &'static str,
    steps: u64,
    /// Nanoseconds since the epoch, as [`PackedInfo`]'s.
    updated: u64,
}

impl Progress {
    /// `snapshot`'s progress, if a snapshot this plain can be kept as one: running
    /// (`Runnable`), without an error, its times in nanoseconds. `None` for anything
    /// else, which is published whole. (A rollback's snapshots carry its cause: they are
    /// always published whole.)
    pub(crate) fn of(snapshot: &Snapshot) -> Option<Self> {
        let plain = matches!(snapshot.status, Status::Runnable) && snapshot.error.is_none();
        let fits = nanos_of_ms(snapshot.submitted_ms).is_some();
        Some(Self {
            state: snapshot.state,
            steps: snapshot.steps,
            updated: nanos_of_ms(snapshot.updated_ms).filter(|_| plain && fits)?,
        })
    }
}

/// A procedure's snapshot as the executor makes it, its times as its record keeps them
/// (ms since the epoch): packed straight into a [`PackedInfo`], with no
/// [`ProcedureInfo`] in between, as every step publishes one.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    pub(crate) id: ProcedureId,
    pub(crate) parent: Option<ProcedureId>,
    pub(crate) machine: &'static str,
    pub(crate) status: Status,
    pub(crate) state: &'static str,
    pub(crate) steps: u64,
    pub(crate) error: Option<Error>,
    pub(crate) submitted_ms: u64,
    pub(crate) updated_ms: u64,
}

#[cfg(test)]
impl PackedInfo {
    /// For tests: procedure `id`, runnable in state `S` of machine `m` after `steps`
    /// steps, submitted and updated at the epoch.
    pub(crate) fn sample(id: u64, steps: u64) -> Self {
        Self::pack(ProcedureInfo {
            id: ProcedureId::new(id),
            parent: None,
            machine: "m",
            status: Status::Runnable,
            state: "S",
            steps,
            error: None,
            submitted: UNIX_EPOCH,
            updated: UNIX_EPOCH,
        })
    }
}

#[cfg(test)]
impl Snapshot {
    /// `info`'s fields, with these times in ms in place of its own.
    fn from_info(info: ProcedureInfo, submitted_ms: u64, updated_ms: u64) -> Self {
        Snapshot {
            id: info.id,
            parent: info.parent,
            machine: info.machine,
            status: info.status,
            state: info.state,
            steps: info.steps,
            error: info.error,
            submitted_ms,
            updated_ms,
        }
    }
}

impl PackedInfo {
    /// Packs `info`. The executor packs [`Snapshot`]s; tests check the two agree.
    #[cfg(test)]
    pub(crate) fn pack(info: ProcedureInfo) -> Self {
        let stamps = nanos(info.submitted).zip(nanos(info.updated));
        let times = (info.submitted, info.updated);
        // The millisecond times are not read: `stamps` and `times` stand for them.
        Self::assemble(Snapshot::from_info(info, 0, 0), stamps, times)
    }

    /// Packs `snapshot`: equal to packing the [`ProcedureInfo`] it describes.
    pub(crate) fn of(snapshot: Snapshot) -> Self {
        let (submitted, updated) = (snapshot.submitted_ms, snapshot.updated_ms);
        let stamps = nanos_of_ms(submitted).zip(nanos_of_ms(updated));
        // Made only where the stamps do not fit: `assemble` keeps them then.
        let times = match stamps {
            Some(_) => (UNIX_EPOCH, UNIX_EPOCH),
            None => (time_of(submitted), time_of(updated)),
        };
        Self::assemble(snapshot, stamps, times)
    }

    /// `info`'s fields with its times as `stamps` (nanoseconds), or as `times` where
    /// they do not fit.
    fn assemble(
        info: Snapshot,
        stamps: Option<(u64, u64)>,
        times: (SystemTime, SystemTime),
    ) -> Self {
        let (plain, event, status) = match Plain::of(info.status) {
            Ok((plain, event)) => (plain, event, None),
            // Unread while `rare` holds the status.
            Err(status) => (Plain::Runnable, None, Some(status)),
        };
        let own_parent = info.parent == Some(info.id);
        let rare = (status.is_some() || info.error.is_some() || stamps.is_none() || own_parent)
            .then(|| {
                Box::new(Rare {
                    status,
                    error: info.error,
                    times: stamps.is_none().then_some(times),
                    own_parent,
                })
            });
        let (submitted, updated) = stamps.unwrap_or_default();
        Self {
            id: info.id,
            parent: info.parent.unwrap_or(info.id),
            machine: info.machine,
            state: info.state,
            steps: info.steps,
            submitted,
            updated,
            event,
            rare,
            plain,
        }
    }

    /// This snapshot moved on by `progress`: `None` unless this one is of a running
    /// procedure without an error (as every kept progress is) and `progress` is further
    /// on (more steps), so that applying it never mixes a newer status with older
    /// progress or the other way round.
    pub(crate) fn moved_on(&self, progress: &Progress) -> Option<Self> {
        let running = self.rare.is_none() && self.plain == Plain::Runnable;
        (running && progress.steps > self.steps).then(|| Self {
            state: progress.state,
            steps: progress.steps,
            updated: progress.updated,
            ..self.clone()
        })
    }

    /// The [`ProcedureInfo`] it was packed from.
    pub(crate) fn unpack(&self) -> ProcedureInfo {
        let (submitted, updated) = self.times();
        ProcedureInfo {
            id: self.id(),
            parent: self.parent(),
            machine: self.machine(),
            status: self.status().into_owned(),
            state: self.state(),
            steps: self.steps(),
            error: self.error().cloned(),
            submitted,
            updated,
        }
    }

    /// Its status; made afresh only for a suspended procedure.
    pub(crate) fn status(&self) -> Cow<'_, Status> {
        self.status_with(self.event.as_deref())
    }

    /// Its status, with `event` for a suspended one's.
    fn status_with(&self, event: Option<&str>) -> Cow<'_, Status> {
        match self.rare.as_ref().and_then(|rare| rare.status.as_ref()) {
            Some(status) => Cow::Borrowed(status),
            None => self.plain.status(event),
        }
    }

    /// Its status without a suspended one's event, which allocates nothing: for what
    /// does not read the event.
    fn status_shape(&self) -> Cow<'_, Status> {
        self.status_with(None)
    }

    /// Whether the procedure has ended (as [`Status::is_finished`]).
    pub(crate) fn is_finished(&self) -> bool {
        self.status_shape().is_finished()
    }

    /// Its status's name, as [`Status::name`].
    #[cfg(feature = "admin")]
    pub(crate) fn status_name(&self) -> &'static str {
        self.status_shape().name()
    }

    /// The event it is suspended on, if it is.
    #[cfg(feature = "admin")]
    pub(crate) fn event(&self) -> Option<&str> {
        self.event.as_deref()
    }

    pub(crate) fn id(&self) -> ProcedureId {
        self.id
    }

    pub(crate) fn machine(&self) -> &'static str {
        self.machine
    }

    pub(crate) fn state(&self) -> &'static str {
        self.state
    }

    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }

    pub(crate) fn parent(&self) -> Option<ProcedureId> {
        let own = self.rare.as_ref().is_some_and(|rare| rare.own_parent);
        (self.parent != self.id || own).then_some(self.parent)
    }

    pub(crate) fn error(&self) -> Option<&Error> {
        self.rare.as_ref().and_then(|rare| rare.error.as_ref())
    }

    /// When it was submitted, and when its record was last written.
    pub(crate) fn times(&self) -> (SystemTime, SystemTime) {
        match self.rare.as_ref().and_then(|rare| rare.times) {
            Some(times) => times,
            None => (time(self.submitted), time(self.updated)),
        }
    }

    /// How the procedure ended, once it has (as [`ProcedureInfo::outcome`]).
    pub(crate) fn outcome(&self) -> Option<Outcome> {
        outcome_of(&self.status_shape(), self.error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(status: Status, error: Option<Error>, at: SystemTime) -> ProcedureInfo {
        ProcedureInfo {
            id: ProcedureId::new(7),
            parent: Some(ProcedureId::new(3)),
            machine: "m",
            status,
            state: "S",
            steps: 4,
            error,
            submitted: at,
            updated: at + Duration::from_nanos(1_234_567),
        }
    }

    fn now() -> SystemTime {
        SystemTime::now()
    }

    /// A snapshot as the executor makes one: `status`, `steps` steps, updated at
    /// `updated_ms`.
    fn snapshot(status: Status, steps: u64, updated_ms: u64) -> Snapshot {
        Snapshot {
            id: ProcedureId::new(7),
            parent: None,
            machine: "m",
            status,
            state: "S",
            steps,
            error: None,
            submitted_ms: 1_000,
            updated_ms,
        }
    }

    /// The progress of a running procedure's step to `state`, `steps` steps done.
    fn progress(state: &'static str, steps: u64) -> Progress {
        Progress::of(&Snapshot {
            state,
            ..snapshot(Status::Runnable, steps, 2_000 + steps)
        })
        .unwrap()
    }

    #[test]
    fn progress_moves_a_running_snapshot_on() {
        let published = PackedInfo::of(snapshot(Status::Runnable, 2, 1_500));
        let moved = published.moved_on(&progress("T", 5)).unwrap();
        assert_eq!(
            moved,
            PackedInfo::of(Snapshot {
                state: "T",
                ..snapshot(Status::Runnable, 5, 2_005)
            })
        );
    }

    #[test]
    fn progress_never_mixes_statuses_nor_goes_back() {
        let published = PackedInfo::of(snapshot(Status::Runnable, 5, 1_500));
        // Older or as old: the snapshot published since is newer.
        assert_eq!(published.moved_on(&progress("T", 5)), None);
        assert_eq!(published.moved_on(&progress("T", 4)), None);
        // Published under another status since: the publication is newer.
        let rolling = PackedInfo::of(snapshot(Status::RollingBack, 5, 1_500));
        assert_eq!(rolling.moved_on(&progress("T", 9)), None);
        let suspended = PackedInfo::of(snapshot(Status::Suspended { event: "e".into() }, 5, 1_500));
        assert_eq!(suspended.moved_on(&progress("T", 9)), None);
        let failing = PackedInfo::of(Snapshot {
            error: Some(Error::retryable("busy")),
            ..snapshot(Status::Runnable, 5, 1_500)
        });
        assert_eq!(failing.moved_on(&progress("T", 9)), None);
    }

    #[test]
    fn only_plain_snapshots_are_kept_as_progress() {
        assert!(Progress::of(&snapshot(Status::Runnable, 1, 2_000)).is_some());
        let suspended = snapshot(Status::Suspended { event: "e".into() }, 1, 2_000);
        assert!(Progress::of(&suspended).is_none());
        assert!(Progress::of(&snapshot(Status::Succeeded, 1, 2_000)).is_none());
        assert!(Progress::of(&snapshot(Status::RollingBack, 1, 2_000)).is_none());
        let with_error = Snapshot {
            error: Some(Error::retryable("busy")),
            ..snapshot(Status::Runnable, 1, 2_000)
        };
        assert!(Progress::of(&with_error).is_none());
        // A time that does not fit nanoseconds would be kept apart by the snapshot.
        assert!(Progress::of(&snapshot(Status::Runnable, 1, 0)).is_none());
    }

    #[test]
    fn it_is_under_half_a_procedure_info() {
        assert_eq!(size_of::<PackedInfo>(), 104);
        assert!(
            size_of::<PackedInfo>() * 2 <= size_of::<ProcedureInfo>(),
            "{} bytes against {}",
            size_of::<PackedInfo>(),
            size_of::<ProcedureInfo>()
        );
    }

    #[test]
    fn every_kind_of_info_unpacks_to_itself() {
        let far = UNIX_EPOCH + Duration::from_secs(600 * 365 * 86_400); // Past 2554.
        let cases = [
            info(Status::Runnable, None, now()),
            info(Status::Succeeded, None, now()),
            info(Status::RolledBack, Some(Error::fatal("boom")), now()),
            info(Status::Suspended { event: "e".into() }, None, now()),
            info(
                Status::Stuck {
                    error: Error::retryable("again"),
                    since: now(),
                    attempts: 3,
                },
                Some(Error::fatal("first")),
                now(),
            ),
            info(Status::Runnable, None, UNIX_EPOCH),
            ProcedureInfo {
                parent: None,
                ..info(Status::Failed, None, now())
            },
            ProcedureInfo {
                parent: Some(ProcedureId::new(7)), // Its own id: damaged, kept as it reads.
                ..info(Status::Runnable, None, now())
            },
            info(Status::Runnable, None, UNIX_EPOCH - Duration::from_secs(5)),
            info(Status::Runnable, None, far),
        ];
        for case in cases {
            let packed = PackedInfo::pack(case.clone());
            assert_eq!(packed.unpack(), case);
            assert_eq!(*packed.status(), case.status);
            assert_eq!(packed.is_finished(), case.status.is_finished());
            assert_eq!(packed.error(), case.error.as_ref());
            assert_eq!(packed.outcome(), case.outcome());
            assert_eq!(packed.parent(), case.parent);
            #[cfg(feature = "admin")]
            assert_eq!(packed.status_name(), case.status.name());
            #[cfg(feature = "admin")]
            assert_eq!(
                packed.event().is_some(),
                packed.status_name() == "suspended"
            );
            assert_eq!(packed.clone(), packed);
        }
    }

    /// A snapshot made from a record's times packs as the `ProcedureInfo` with those
    /// times does, at the edges where nanoseconds stop fitting too.
    #[test]
    fn a_snapshot_packs_as_its_procedure_info() {
        let fits = u64::MAX / 1_000_000;
        for ms in [0, 1, 1_700_000_000_000, fits, fits + 1, u64::MAX] {
            for (status, error) in [
                (Status::Runnable, None),
                (Status::Suspended { event: "e".into() }, None),
                (Status::RolledBack, Some(Error::fatal("boom"))),
            ] {
                let info = ProcedureInfo {
                    submitted: time_of(ms),
                    updated: time_of(1),
                    ..info(status, error, UNIX_EPOCH)
                };
                let packed = PackedInfo::of(Snapshot::from_info(info.clone(), ms, 1));
                assert_eq!(packed, PackedInfo::pack(info.clone()), "{ms}");
                assert_eq!(packed.unpack(), info, "{ms}");
            }
        }
    }

    #[test]
    fn the_common_case_needs_no_box_and_equal_infos_pack_equal() {
        let at = now();
        let plain = PackedInfo::pack(info(Status::WaitingForLock, None, at));
        assert!(plain.rare.is_none());
        let suspended = Status::Suspended { event: "e".into() };
        assert!(PackedInfo::pack(info(suspended, None, at)).rare.is_none());
        assert_eq!(
            plain,
            PackedInfo::pack(info(Status::WaitingForLock, None, at))
        );
        assert_ne!(plain, PackedInfo::pack(info(Status::Runnable, None, at)));
        let failed = info(Status::Failed, Some(Error::fatal("x")), at);
        assert_eq!(PackedInfo::pack(failed.clone()), PackedInfo::pack(failed));
        assert_ne!(
            PackedInfo::pack(info(Status::Failed, Some(Error::fatal("x")), at)),
            PackedInfo::pack(info(Status::Failed, Some(Error::fatal("y")), at))
        );
    }
}
