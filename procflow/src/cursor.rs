//! Where one procedure stands in its machine: the part of its record the runtime owns.
//!
//! States are persisted by *name*, never by variant index, so reordering the variants of
//! a machine, or adding new ones, keeps every stored procedure readable.

use crate::stored::wire::{append, push_str, push_varint, take_str, take_varint};
use crate::{Error, StateMachine};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;
use std::borrow::Cow;
use std::sync::OnceLock;

/// The life of a procedure, as persisted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Phase {
    /// Executing steps forward.
    Running,
    /// Undoing completed steps, newest first, after `cause`.
    RollingBack {
        /// The failure that started the rollback; reported when it ends.
        cause: Error,
    },
    /// Reached a terminal state.
    Succeeded,
    /// Every completed `#[rollback]` state was undone after `cause`.
    RolledBack {
        /// The original failure.
        cause: Error,
    },
    /// Ended without completing and without a full rollback (a failure past a point of no
    /// return once the retry budget was spent, or a rollback that kept failing).
    Failed {
        /// The original failure.
        cause: Error,
    },
}

impl Phase {
    /// Whether the procedure has ended.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::RolledBack { .. } | Self::Failed { .. }
        )
    }
}

/// The position of a procedure in machine `M`, persisted after every step.
///
/// It holds the current state, the number of steps done, the *rollback stack* (each
/// completed state once, in the order it first completed) and how often each state was
/// entered, which bounds loops at run time (`max_repeats`).
///
/// # Examples
///
/// ```
/// # use procflow::prelude::*;
/// # use procflow::{Cursor, Phase};
/// # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
/// # #[state_machine(procedure = Job)]
/// # enum JobState {
/// #     #[initial] #[transition(to = [Work])] #[rollback] Start,
/// #     #[transition(to = [Done])] Work,
/// #     #[terminal] Done,
/// # }
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Job;
/// # impl JobStateHandlers for Job {
/// #     async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> { Ok(job_state::Start::Work.into()) }
/// #     async fn work(&mut self, _: &Context<()>) -> Step<job_state::Work> { Ok(job_state::Work::Done.into()) }
/// #     async fn rollback_start(&mut self, _: &Context<()>) -> Result<(), Error> { Ok(()) }
/// # }
/// let mut cursor = Cursor::<JobState>::new();
/// cursor.advance(JobState::Work)?;
/// cursor.start_rollback(Error::fatal("disk full"));
/// // Only states with a rollback handler are undone; `Work` failed, `Start` completed.
/// assert_eq!(cursor.pending_rollback(), Some(JobState::Start));
/// cursor.rolled_back();
/// assert!(matches!(cursor.phase(), Phase::RolledBack { .. }));
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone)]
pub struct Cursor<M> {
    state: M,
    steps: u64,
    completed: List<M>,
    entries: List<(M, u32)>,
    phase: Phase,
    /// The two lists as a record writes them, made by the first write and kept up to
    /// date after it ([`Written`]); not part of the cursor's value.
    written: OnceLock<Box<Written>>,
}

/// A [`Cursor`]'s lists as postcard writes their elements, without their counts: every
/// step's record carries them, and writing each state's name again took most of the
/// cursor's share of a step. The methods that push onto a list append here too; the
/// rare ones that change a list otherwise drop it, for the next write to make again.
#[derive(Clone)]
struct Written {
    /// `completed`'s names, each as postcard writes a string.
    completed: Vec<u8>,
    /// `entries`' pairs, each a name and its count.
    entries: Vec<u8>,
}

/// Bytes a written name is given room for ahead: its length and a short name.
const NAME_ROOM: usize = 12;

impl Written {
    fn of<M: StateMachine>(cursor: &Cursor<M>) -> Self {
        // Room for the lists to grow into, as the cursor leaves its lists: grown from
        // nothing, each append of the first steps reallocated.
        let room = Cursor::<M>::room() * NAME_ROOM;
        let mut written = Self {
            completed: Vec::with_capacity(room),
            entries: Vec::with_capacity(room + Cursor::<M>::room()),
        };
        for state in &cursor.completed {
            written.complete(*state);
        }
        for (state, count) in &cursor.entries {
            written.enter(*state, *count);
        }
        written
    }

    fn complete<M: StateMachine>(&mut self, state: M) {
        push_str(&mut self.completed, state.name());
    }

    fn enter<M: StateMachine>(&mut self, state: M, count: u32) {
        push_str(&mut self.entries, state.name());
        push_varint(&mut self.entries, u64::from(count));
    }
}

/// The cursor's value: its lists as written are a copy of what it compares.
impl<M: PartialEq> PartialEq for Cursor<M> {
    fn eq(&self, other: &Self) -> bool {
        self.state == other.state
            && self.steps == other.steps
            && self.completed == other.completed
            && self.entries == other.entries
            && self.phase == other.phase
    }
}

impl<M: Eq> Eq for Cursor<M> {}

impl<M: std::fmt::Debug> std::fmt::Debug for Cursor<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor")
            .field("state", &self.state)
            .field("steps", &self.steps)
            .field("completed", &self.completed)
            .field("entries", &self.entries)
            .field("phase", &self.phase)
            .finish()
    }
}

impl<M: StateMachine> Default for Cursor<M> {
    fn default() -> Self {
        Self::new()
    }
}

/// The most states whose room [`Cursor`]'s lists take at once: a procedure's steps then
/// add to them without reallocating, up to this many states. (Grown one state at a time,
/// the two lists reallocated six times in a ten-state procedure, and at 1,024
/// procedures those reallocations were the second place the workers waited on glibc's
/// arena locks; docs/BENCHMARKS.md, issue 33.)
const ROOM: usize = 16;

/// States a cursor's lists hold in the cursor itself, before they take memory of their
/// own: a machine of this many states or fewer never allocates for them. A restart
/// decoded the two lists of every procedure it loaded: their allocations and frees were
/// about 400 of the 5,950 instructions it spent per procedure (callgrind;
/// docs/BENCHMARKS.md, "Issue 33 in stop 66"). A running procedure kept two blocks more
/// for its life.
const INLINE: usize = 8;

/// A cursor's list: [`INLINE`] states in place, then on the heap.
type List<T> = SmallVec<[T; INLINE]>;

impl<M: StateMachine> Cursor<M> {
    /// A procedure about to run its initial state.
    #[must_use]
    pub fn new() -> Self {
        let mut entries = List::with_capacity(Self::room());
        entries.push((M::INITIAL, 1));
        Self {
            state: M::INITIAL,
            steps: 0,
            completed: List::with_capacity(Self::room()),
            entries,
            phase: Phase::Running,
            written: OnceLock::new(),
        }
    }

    /// Room for every state of the machine in each list, up to [`ROOM`].
    fn room() -> usize {
        M::STATES.len().min(ROOM)
    }

    /// `items` collected with [`room`](Self::room) for the states still to come.
    fn with_room<T>(items: impl Iterator<Item = Result<T, String>>) -> Result<List<T>, String> {
        let mut list = List::with_capacity(Self::room());
        for item in items {
            list.push(item?);
        }
        Ok(list)
    }

    /// The current state: the next one to execute while running.
    #[must_use]
    pub fn state(&self) -> M {
        self.state
    }

    /// How many steps completed (forward and rollback).
    #[must_use]
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The life phase.
    #[must_use]
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Completed states, each once, in the order they first completed.
    #[must_use]
    pub fn completed(&self) -> &[M] {
        &self.completed
    }

    /// How often `state` was entered so far.
    #[must_use]
    pub fn entries(&self, state: M) -> u32 {
        self.entries
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    }

    /// Whether a point of no return (`#[no_rollback]`) was entered: failures from here on
    /// are retried rather than rolled back.
    #[must_use]
    pub fn past_point_of_no_return(&self) -> bool {
        self.state.is_point_of_no_return()
            || self.completed.iter().any(|s| s.is_point_of_no_return())
    }

    /// Records that the current state's step completed and moves to `next`.
    ///
    /// Reaching a terminal state ends the procedure ([`Phase::Succeeded`]).
    ///
    /// # Errors
    ///
    /// [`Error::StepCycle`] if `next` would be re-entered more often than its
    /// `max_repeats`; the current step still counts as completed (its effects happened
    /// and will be rolled back), the state does not move.
    pub fn advance(&mut self, next: M) -> Result<(), Error> {
        self.complete_current();
        let entries = self.entries(next) + 1;
        let repeats = entries - 1;
        if repeats > next.max_repeats() {
            return Err(Error::StepCycle {
                state: next.name().to_owned(),
                repeats,
                max: next.max_repeats(),
            });
        }
        match self.entries.iter_mut().find(|(s, _)| *s == next) {
            Some(slot) => {
                slot.1 = entries;
                self.written.take(); // A count in the middle changed: written again.
            }
            None => {
                self.entries.push((next, entries));
                if let Some(written) = self.written.get_mut() {
                    written.enter(next, entries);
                }
            }
        }
        self.state = next;
        if next.is_terminal() {
            self.phase = Phase::Succeeded;
        }
        Ok(())
    }

    /// Starts rolling back after `cause`. With nothing to undo the procedure is rolled
    /// back at once.
    pub fn start_rollback(&mut self, cause: Error) {
        self.phase = Phase::RollingBack { cause };
        self.settle_rollback();
    }

    /// What a failure of a forward step means here: `Err` hands the error back to be
    /// retried (retryable with budget left, or past a point of no return); `Ok` means the
    /// rollback has started.
    pub(crate) fn fail_forward(&mut self, error: Error, budget_spent: bool) -> Result<(), Error> {
        let retry = (error.is_retryable() && !budget_spent) || self.past_point_of_no_return();
        if retry {
            return Err(error);
        }
        self.start_rollback(error.into_fatal());
        Ok(())
    }

    /// Starts rolling back after `cause`, undoing the current state too when it has a
    /// rollback handler: it was interrupted (aborted, timed out, or its result could not be
    /// stored) after its handler ran, so it may have partly acted, and undo handlers are
    /// idempotent. `acted` says whether its handler ran since the procedure entered it.
    pub(crate) fn interrupt(&mut self, cause: Error, acted: bool) {
        let state = self.state;
        if acted && state.has_rollback() && !state.is_terminal() && !self.completed.contains(&state)
        {
            self.push_completed(state);
        }
        self.start_rollback(cause);
    }

    /// The next state to undo while rolling back: the newest completed state with a
    /// rollback handler.
    #[must_use]
    pub fn pending_rollback(&self) -> Option<M> {
        if !matches!(self.phase, Phase::RollingBack { .. }) {
            return None;
        }
        self.completed
            .iter()
            .rev()
            .copied()
            .find(|s| s.has_rollback())
    }

    /// How many completed states stay on the rollback stack once the pending rollback step
    /// is done (0 when nothing is left to undo): children spawned above this depth must be
    /// undone first.
    pub(crate) fn rollback_floor(&self) -> usize {
        if !matches!(self.phase, Phase::RollingBack { .. }) {
            return 0;
        }
        self.completed
            .iter()
            .rposition(|s| s.has_rollback())
            .unwrap_or(0)
    }

    /// Records that [`pending_rollback`](Self::pending_rollback) was undone.
    pub fn rolled_back(&mut self) {
        if let Some(at) = self.completed.iter().rposition(|s| s.has_rollback()) {
            self.completed.truncate(at);
            self.written.take();
            self.steps += 1;
        }
        self.settle_rollback();
    }

    /// Ends the procedure as failed, keeping `cause`.
    pub fn fail(&mut self, cause: Error) {
        self.phase = Phase::Failed { cause };
    }

    fn complete_current(&mut self) {
        if !self.completed.contains(&self.state) {
            self.push_completed(self.state);
        }
        self.steps += 1;
    }

    /// Drops the lists as last written: a procedure that parks keeps its cursor, and
    /// they are made again by its next write.
    pub(crate) fn forget_written(&mut self) {
        self.written.take();
    }

    fn push_completed(&mut self, state: M) {
        self.completed.push(state);
        if let Some(written) = self.written.get_mut() {
            written.complete(state);
        }
    }

    fn settle_rollback(&mut self) {
        if self.pending_rollback().is_none() {
            if let Phase::RollingBack { cause } = &self.phase {
                self.phase = Phase::RolledBack {
                    cause: cause.clone(),
                };
            }
        }
    }
}

/// The persisted form: the same fields with states as names.
#[derive(Serialize, Deserialize)]
pub(crate) struct Repr<'a> {
    #[serde(borrow)]
    pub(crate) state: Cow<'a, str>,
    pub(crate) steps: u64,
    #[serde(borrow)]
    pub(crate) completed: Vec<Name<'a>>,
    #[serde(borrow)]
    pub(crate) entries: Vec<(Name<'a>, u32)>,
    pub(crate) phase: Phase,
}

/// A state's name in a [`Repr`]'s lists, borrowed from the bytes it is read from where
/// they allow it. Serde borrows a `Cow<str>` only as a field of its own, never inside a
/// `Vec`: as list elements, every name was a new `String`, a fifth of a restart's
/// decoding of cursors (issue 33). A newtype is written as its content: the bytes are
/// the same.
#[derive(Serialize, Deserialize)]
pub(crate) struct Name<'a>(#[serde(borrow)] pub(crate) Cow<'a, str>);

/// Written field by field as a `Repr` would be, without building one: the cursor is
/// encoded on every step, and a `Repr` costs two vectors to allocate and drop each time.
/// A unit test checks the bytes are the same.
impl<M: StateMachine> Serialize for Cursor<M> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut repr = serializer.serialize_struct("Repr", 5)?;
        repr.serialize_field("state", self.state.name())?;
        repr.serialize_field("steps", &self.steps)?;
        repr.serialize_field("completed", &Names(&self.completed))?;
        repr.serialize_field("entries", &Entries(&self.entries))?;
        repr.serialize_field("phase", &self.phase)?;
        repr.end()
    }
}

/// States as the sequence of their names.
struct Names<'a, M>(&'a [M]);

impl<M: StateMachine> Serialize for Names<'_, M> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|state| state.name()))
    }
}

/// Rollback entries as `(name, count)` pairs.
struct Entries<'a, M>(&'a [(M, u32)]);

impl<M: StateMachine> Serialize for Entries<'_, M> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|(state, n)| (state.name(), *n)))
    }
}

impl<M: StateMachine> Cursor<M> {
    /// Appends the bytes postcard writes for the cursor (its [`Serialize`] impl), written
    /// by hand from the lists as last written ([`Written`]): every step's record carries
    /// the cursor, whose lists name each state the procedure went through, and serde's
    /// path took about a sixth of a `MemStore` step's instructions for them (callgrind,
    /// the bench's ten-step machine). A test in `tests/persisted_form.rs` holds the
    /// snapshot to serde's bytes after every kind of change to the lists.
    pub(crate) fn write_into(&self, mut out: Vec<u8>) -> postcard::Result<Vec<u8>> {
        let written = self.written.get_or_init(|| Box::new(Written::of(self)));
        push_str(&mut out, self.state.name());
        push_varint(&mut out, self.steps);
        push_varint(&mut out, self.completed.len() as u64);
        out.extend_from_slice(&written.completed);
        push_varint(&mut out, self.entries.len() as u64);
        out.extend_from_slice(&written.entries);
        append(&self.phase, out)
    }

    /// Reads a cursor as [`write_into`](Self::write_into) writes it, by hand: a restart
    /// reads the cursor of every procedure, and through serde each name was checked to
    /// be UTF-8, borrowed into a list of names and then looked up. Here the stored bytes
    /// are compared with the machine's names, a list is read straight into states, and
    /// what follows the cursor is left alone. `None` for anything else, a name that is
    /// not a state of `M` included: the caller then reads it through [`Repr`], which says
    /// what is wrong (a test holds the two to the same cursors).
    pub(crate) fn read_from(bytes: &[u8]) -> Option<Self> {
        let mut completed = List::with_capacity(Self::room());
        let mut entries = List::with_capacity(Self::room());
        let (state, steps, rest) = walk::<M>(
            bytes,
            |state| completed.push(state),
            |state, times| entries.push((state, times)),
        )?;
        let (phase, _) = postcard::take_from_bytes::<Phase>(rest).ok()?;
        Some(Self {
            state,
            steps,
            completed,
            entries,
            phase,
            written: OnceLock::new(),
        })
    }

    /// What a restart needs to know of a procedure it loads dormant, read from a cursor
    /// as [`read_from`](Self::read_from) reads it, nothing kept: its state, its steps, and
    /// whether it is past a point of no return. `None` unless it runs forward
    /// ([`Phase::Running`]) and [`read_from`](Self::read_from) would read it.
    pub(crate) fn glance(bytes: &[u8]) -> Option<Glance<M>> {
        let mut past_point_of_no_return = false;
        let (state, steps, rest) = walk::<M>(
            bytes,
            |state| past_point_of_no_return |= state.is_point_of_no_return(),
            |_, _| {},
        )?;
        // `Phase::Running`, as postcard writes it: its variant's index, 0.
        if rest.first() != Some(&0) {
            return None;
        }
        Some(Glance {
            state,
            steps,
            past_point_of_no_return: past_point_of_no_return || state.is_point_of_no_return(),
        })
    }

    /// Resolves the names of a persisted cursor; `Err` carries a name that is not a state
    /// of `M` (a variant renamed or removed since the procedure was stored).
    pub(crate) fn from_repr(repr: &Repr<'_>) -> Result<Self, String> {
        let state = |name: &str| M::from_name(name).ok_or_else(|| name.to_owned());
        Ok(Self {
            state: state(&repr.state)?,
            steps: repr.steps,
            completed: Self::with_room(repr.completed.iter().map(|n| state(&n.0)))?,
            entries: Self::with_room(
                repr.entries
                    .iter()
                    .map(|(n, count)| Ok((state(&n.0)?, *count))),
            )?,
            phase: repr.phase.clone(),
            written: OnceLock::new(),
        })
    }
}

/// A cursor's fields up to its phase, as [`Cursor::read_from`] reads them: its state
/// and steps, each state of its completed list handed to `completed` and each of its
/// entries to `entry`; and the bytes after them. `None` if they do not read.
fn walk<M: StateMachine>(
    bytes: &[u8],
    mut completed: impl FnMut(M),
    mut entry: impl FnMut(M, u32),
) -> Option<(M, u64, &[u8])> {
    let (state, rest) = take_state::<M>(bytes)?;
    let (steps, rest) = take_varint(rest, 10)?;
    let (count, mut rest) = take_varint(rest, 10)?;
    for _ in 0..count {
        let (state, after) = take_state::<M>(rest)?;
        completed(state);
        rest = after;
    }
    let (count, mut rest) = take_varint(rest, 10)?;
    for _ in 0..count {
        let (state, after) = take_state::<M>(rest)?;
        let (times, after) = take_varint(after, 5)?;
        entry(state, u32::try_from(times).ok()?);
        rest = after;
    }
    Some((state, steps, rest))
}

/// What [`Cursor::glance`] reads.
pub(crate) struct Glance<M> {
    pub(crate) state: M,
    pub(crate) steps: u64,
    /// See [`Cursor::past_point_of_no_return`].
    pub(crate) past_point_of_no_return: bool,
}

/// Reads a state's name and finds the state it names (or once named: an alias).
fn take_state<M: StateMachine>(bytes: &[u8]) -> Option<(M, &[u8])> {
    let (name, rest) = take_str(bytes)?;
    Some((M::from_name_bytes(name)?, rest))
}

impl<'de, M: StateMachine> Deserialize<'de> for Cursor<M> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let repr = Repr::deserialize(deserializer)?;
        Self::from_repr(&repr).map_err(|name| {
            D::Error::custom(format_args!(
                "`{name}` is not a state of machine `{}` (was the variant renamed or removed?)",
                M::NAME
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A [`Repr`] read from bytes borrows the names in its lists, and the newtype around
    /// them leaves the bytes as plain strings write them.
    #[test]
    fn a_repr_read_from_bytes_borrows_its_names() {
        let name = |n: &'static str| Name(Cow::Borrowed(n));
        let repr = Repr {
            state: Cow::Borrowed("Third"),
            steps: 3,
            completed: vec![name("First")],
            entries: vec![(name("First"), 1), (name("Second"), 2)],
            phase: Phase::Running,
        };
        let bytes = postcard::to_stdvec(&repr).unwrap();

        #[derive(Serialize)]
        struct Plain<'a> {
            state: &'a str,
            steps: u64,
            completed: Vec<&'a str>,
            entries: Vec<(&'a str, u32)>,
            phase: Phase,
        }
        let plain = Plain {
            state: "Third",
            steps: 3,
            completed: vec!["First"],
            entries: vec![("First", 1), ("Second", 2)],
            phase: Phase::Running,
        };
        assert_eq!(bytes, postcard::to_stdvec(&plain).unwrap());

        let read: Repr<'_> = postcard::from_bytes(&bytes).unwrap();
        let borrowed = |n: &Name<'_>| matches!(n.0, Cow::Borrowed(_));
        assert!(read.completed.iter().all(borrowed));
        assert!(read.entries.iter().all(|(n, _)| borrowed(n)));
        assert_eq!(read.entries[1].0.0, "Second");
    }
}
