//! The trait `#[derive(StateMachine)]` implements, and the metadata it generates.

use crate::locks::{LockKeyError, Locks};
use crate::{Context, Error, Flow};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::future::Future;

/// The bound on re-entries of one state when neither the state nor the machine sets
/// `max_repeats`.
pub const DEFAULT_MAX_REPEATS: u32 = 1_000;

/// What the derive knows about one state, as a `const`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateInfo {
    /// The variant's name; also the state's persisted form.
    pub name: &'static str,
    /// `#[initial]`: where every procedure of this machine starts.
    pub initial: bool,
    /// `#[terminal]`: reaching it ends the procedure successfully.
    pub terminal: bool,
    /// `#[rollback]`: the state has an undo handler.
    pub rollback: bool,
    /// `#[no_rollback]`: a point of no return; once entered, failures are retried
    /// instead of rolled back.
    pub no_rollback: bool,
    /// How often the state may be re-entered before the step fails with
    /// [`Error::StepCycle`].
    pub max_repeats: u32,
    /// The names of the states `#[transition(to = [..])]` declares, in order.
    pub targets: &'static [&'static str],
    /// The state's former names (`#[alias = "Old"]`): stored procedures that name one of
    /// them still load, as this state.
    pub aliases: &'static [&'static str],
}

/// The link from a procedure type to its state machine, so
/// `executor.submit(CreateTable { .. })` needs no turbofish.
///
/// Do not implement it by hand: `#[derive(StateMachine)]` implements it on the type named
/// by `#[state_machine(procedure = ..)]`. A type is the procedure of one machine only: a
/// second machine naming the same type fails to compile (conflicting implementations of
/// `Procedure`), where it used to fail at [`start`](crate::executor::ExecutorBuilder::start)
/// with a duplicate name.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the procedure type of any state machine",
    label = "not named by `#[state_machine(procedure = ..)]`",
    note = "name it on the machine's enum: `#[state_machine(procedure = {Self})]`"
)]
pub trait Procedure: Sized {
    /// The machine whose procedures hold this data. (Deliberately unbounded: the bound
    /// lives on [`StateMachine::Procedure`], so a machine whose handlers are missing gets
    /// one error, not a second one through this impl.)
    type Machine;
}

/// What a handler returns: the future of an `async fn`, `Send` so the executor can run it
/// on any worker. Its own trait only so that a handler written without `async` is told so.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "a handler must be an `async fn` returning `{T}`",
    label = "this returns `{Self}`, not a `Send` future",
    note = "write `async fn name(&mut self, ctx: &Context<..>) -> ..`; if it is already `async`, \
            hold no `Rc` or `RefCell` borrow across an `.await`, so its future is `Send`"
)]
pub trait HandlerFuture<T>: Future<Output = T> + Send {}

impl<F: Future<Output = T> + Send, T> HandlerFuture<T> for F {}

/// What the hidden `rollback_*` method of a state without `#[rollback]` returns, so that
/// a user writing that handler is told to add the attribute (rustc would only say "not a
/// member of trait"). `S` is the state's targets type, which names the state.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "this rollback handler belongs to a state without `#[rollback]`: add `#[rollback]` to the state of `{S}`",
    label = "never called: the state has no `#[rollback]`",
    note = "mark the variant `#[rollback]` on the machine's enum, or remove this handler"
)]
pub trait RollbackUndeclared<S> {}

/// The only implementor of [`RollbackUndeclared`].
#[doc(hidden)]
#[derive(Debug)]
pub struct NoRollback;

impl<S> RollbackUndeclared<S> for NoRollback {}

/// What the runtime needs of a procedure type. The derived impl assumes it (so a type
/// lacking it is not reported again on every use); the derive's probe (`probe.rs`)
/// reports what is missing, once, on the user's `procedure = T`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "the procedure type `{Self}` must be `'static + Send + Serialize + DeserializeOwned`",
    label = "persisted after every step and run on any worker thread",
    note = "derive `serde::Serialize, serde::Deserialize`, own its data (no references) and \
            hold no `Rc` or `RefCell`"
)]
pub trait ProcedureData: Serialize + DeserializeOwned + Send + 'static {}

impl<T: Serialize + DeserializeOwned + Send + 'static> ProcedureData for T {}

/// What an older data version's type needs to migrate (`migrate(1 = OldType)`): to read
/// what that version stored, and to become the current procedure type.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot migrate stored data to `{New}`: it must be `Deserialize` and convert into `{New}`",
    label = "the type older records are read as",
    note = "derive `serde::Deserialize` on it (with the fields that version stored, in their order) \
            and write `impl From<{Self}> for {New}`"
)]
pub trait MigratesTo<New>: DeserializeOwned + Into<New> {}

impl<Old: DeserializeOwned + Into<New>, New> MigratesTo<New> for Old {}

/// Reads `data`, stored by an older version as an `Old`, and converts it: what the
/// derive's `migrate(version = Old)` generates for that version.
#[doc(hidden)]
pub fn migrate_from<Old: MigratesTo<New>, New>(data: &[u8]) -> Result<New, postcard::Error> {
    postcard::from_bytes::<Old>(data).map(Into::into)
}

/// A state machine whose procedures procflow can run, persist and roll back.
///
/// Do not implement it by hand: `#[derive(StateMachine)]` generates the implementation
/// together with the handler trait and the typed targets, and checks the machine at
/// compile time. See the [crate docs](crate) for the attributes.
///
/// The metadata consts describe the machine for tools (and for the runtime):
///
/// ```
/// # use procflow::prelude::*;
/// # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
/// # #[state_machine(procedure = Job)]
/// # enum JobState {
/// #     #[initial] #[transition(to = [Done])] Start,
/// #     #[terminal] Done,
/// # }
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct Job;
/// # impl JobStateHandlers for Job {
/// #     async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
/// #         Ok(job_state::Start::Done.into())
/// #     }
/// # }
/// assert_eq!(JobState::NAME, "Job");
/// assert_eq!(JobState::INITIAL, JobState::Start);
/// assert_eq!(JobState::EDGES, &[(JobState::Start, JobState::Done)]);
/// assert_eq!(JobState::from_name("Done"), Some(JobState::Done));
/// assert!(JobState::Done.is_terminal());
/// ```
pub trait StateMachine: Copy + Eq + Debug + Send + Sync + 'static {
    /// The procedure's data: persisted after every step, handed to every handler. Linked
    /// back to this machine, so generic code over `M` can submit `M::Procedure`.
    type Procedure: Procedure<Machine = Self> + Serialize + DeserializeOwned + Send + 'static;
    /// The environment shared by all procedures of an executor (`()` by default).
    type Env: Send + Sync + 'static;

    /// The stable type name written to the store (`name = ".."`, default: the procedure
    /// type's name). Changing it orphans procedures already stored.
    const NAME: &'static str;
    /// The `#[initial]` state.
    const INITIAL: Self;
    /// Every state, in declaration order.
    const STATES: &'static [Self];
    /// The metadata of every state, parallel to [`STATES`](Self::STATES).
    const INFO: &'static [StateInfo];
    /// The `#[terminal]` states.
    const TERMINALS: &'static [Self];
    /// Every declared transition, `(from, to)`.
    const EDGES: &'static [(Self, Self)];
    /// The version of the procedure data's stored form this build writes
    /// (`#[state_machine(version = N)]`, default 1). Every record stores the version of
    /// its data, and data of an older version is read through [`migrate`](Self::migrate).
    /// Bump it whenever the stored form of [`Procedure`](Self::Procedure) changes (a field
    /// added, removed or reordered, an enum variant inserted): see the README's
    /// "Upgrading your procedures".
    const DATA_VERSION: u32 = 1;
    /// The oldest data version this build reads (`oldest = K`, default 1). Every version
    /// from it to `DATA_VERSION - 1` has a migration; records older than it cannot be
    /// read (the start check reports them).
    const OLDEST_VERSION: u32 = 1;
    /// Whether operators' tools (the admin API and page) may show the procedure's data as
    /// JSON (`#[state_machine(show_data = false)]` hides it, for data that is secret as a
    /// whole). Default: shown.
    const SHOW_DATA: bool = true;
    /// Fields of the procedure's data that operators' tools show as `"[redacted]"`
    /// (`#[state_machine(redact = ["password", "credentials.token"])]`: a field name, or a
    /// dotted path into nested structs and maps). The stored data is not changed.
    const REDACTED: &'static [&'static str] = &[];

    /// The position of `self` in [`STATES`](Self::STATES).
    fn index(self) -> usize;

    /// Runs the execute handler of state `self`.
    ///
    /// # Errors
    ///
    /// Whatever the handler returns; [`Error::Fatal`] for a terminal state, which has no
    /// handler.
    fn execute_from_state<'a>(
        self,
        procedure: &'a mut Self::Procedure,
        ctx: &'a Context<Self::Env>,
    ) -> impl Future<Output = Result<Flow<Self>, Error>> + Send + 'a;

    /// Runs the rollback handler of state `self`; `Ok(())` at once for a state without
    /// `#[rollback]`.
    ///
    /// # Errors
    ///
    /// Whatever the handler returns.
    fn rollback_state<'a>(
        self,
        procedure: &'a mut Self::Procedure,
        ctx: &'a Context<Self::Env>,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a;

    /// Reads `data`, stored at data version `version` (older than
    /// [`DATA_VERSION`](Self::DATA_VERSION)), as the current procedure type: through the
    /// type `#[state_machine(migrate(version = OldType))]` names for that version, which
    /// converts into the procedure type. `None` when there is no migration for `version`.
    /// Generated by the derive.
    ///
    /// # Errors
    ///
    /// postcard's, when the bytes are not an `OldType`.
    fn migrate(version: u32, data: &[u8]) -> Option<Result<Self::Procedure, postcard::Error>> {
        let _ = (version, data);
        None
    }

    /// The locks `procedure` takes (its handler trait's `locks`; none by default).
    ///
    /// # Errors
    ///
    /// An invalid lock key; the executor then fails the procedure before its first step.
    fn locks(procedure: &Self::Procedure) -> Result<Locks, LockKeyError> {
        let _ = procedure;
        Ok(Locks::none())
    }

    /// A short summary of `procedure` for operators (its handler trait's `describe`;
    /// none by default), stored with its record at every write so that tools without the
    /// procedure's type (`procflow show --store`) can print it.
    #[must_use]
    fn describe(procedure: &Self::Procedure) -> Option<String> {
        let _ = procedure;
        None
    }

    /// The metadata of `self`.
    #[must_use]
    fn info(self) -> &'static StateInfo {
        &Self::INFO[self.index()]
    }

    /// The variant's name, which is also its persisted form.
    #[must_use]
    fn name(self) -> &'static str {
        self.info().name
    }

    /// The state called `name`, or that was (`#[alias = ".."]`), if the machine has one.
    #[must_use]
    fn from_name(name: &str) -> Option<Self> {
        Self::from_name_bytes(name.as_bytes())
    }

    /// [`from_name`](Self::from_name) for a name's bytes as stored, not checked to be
    /// UTF-8 first (a byte string equal to a name is one): a restart looks up every
    /// state a cursor names. The derive writes it as one `match` on the bytes, which
    /// compiles to a comparison of the length and a word or two per name; this default
    /// searches [`INFO`](Self::INFO), a `memcmp` call per name of the same length (a
    /// tenth of a restart's start, perf: docs/BENCHMARKS.md, "Issue 33 in stop 66").
    #[doc(hidden)]
    #[must_use]
    fn from_name_bytes(name: &[u8]) -> Option<Self> {
        state_named(name)
    }

    /// Whether reaching `self` ends the procedure successfully.
    #[must_use]
    fn is_terminal(self) -> bool {
        self.info().terminal
    }

    /// Whether `self` has a rollback handler.
    #[must_use]
    fn has_rollback(self) -> bool {
        self.info().rollback
    }

    /// Whether `self` is a point of no return (`#[no_rollback]`).
    #[must_use]
    fn is_point_of_no_return(self) -> bool {
        self.info().no_rollback
    }

    /// How often `self` may be re-entered.
    #[must_use]
    fn max_repeats(self) -> u32 {
        self.info().max_repeats
    }

    /// A Mermaid `stateDiagram-v2` of the machine (see [`mermaid`](crate::mermaid)).
    #[must_use]
    fn mermaid() -> String {
        crate::diagram::mermaid::<Self>()
    }
}

/// The state of `M` whose name, or one of whose aliases, is `name`'s bytes: the default
/// of [`StateMachine::from_name_bytes`], for machines not derived.
pub(crate) fn state_named<M: StateMachine>(name: &[u8]) -> Option<M> {
    let named = |state: &M| {
        let info = state.info();
        info.name.as_bytes() == name || info.aliases.iter().any(|alias| alias.as_bytes() == name)
    };
    M::STATES.iter().copied().find(named)
}
