//! The attributes of `#[derive(StateMachine)]`, each with an example.
//!
//! The derive goes on a fieldless, non-generic enum whose variants are the states, which
//! also derives `Clone, Copy, Debug, PartialEq, Eq`: write
//! `#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]`. The runtime copies,
//! compares and logs states; missing derives are one error naming all five. The procedure
//! type must be `'static + Send + Serialize + DeserializeOwned`; what it lacks is one error
//! on `procedure = T`. The derive generates, next to the enum `FooState`:
//!
//! - `trait FooStateHandlers`: one `async fn snake_case_state(&mut self, ctx)` per
//!   non-terminal state and one `async fn rollback_snake_case_state` per `#[rollback]`
//!   state, to implement on the procedure type. A missing method is rustc's "not all
//!   trait items implemented" on your `impl`.
//! - `mod foo_state` (or the name given by `module = ".."`): one enum per non-terminal
//!   state, holding exactly the states its `#[transition]` declares. The handler of state `A` returns
//!   [`Step<foo_state::A>`](crate::Step); any other target does not compile.
//! - `impl StateMachine for FooState`: metadata consts and the dispatch the runtime calls.
//! - `impl Procedure for T` on the `procedure = T` type, so
//!   `executor.submit(T { .. })` infers the machine.
//!
//! Generated names are valid in every edition: a state `Gen` gets handler `r#gen`, `Crate`
//! gets `crate_`, and a raw `r#type` gets `r#type` (stored and drawn as `type`).
//!
//! The generated `FooStateHandlers` and `foo_state` live next to the enum. If another item
//! there already has one of these names (your own `mod foo_state`, or a second machine
//! `FOOState` whose snake case is also `foo_state`), rustc reports "the name `foo_state` is
//! defined multiple times"; give the generated module another name with
//! `#[state_machine(module = "foo_steps")]`.
//!
//! # On the enum: `#[state_machine(..)]`
//!
//! | key | required | meaning |
//! |---|---|---|
//! | `procedure = Type` | yes | the struct holding the procedure's data (`Serialize + Deserialize + Send`), which implements the handlers |
//! | `name = "text"` | no | the stable type name written to the store; default: the procedure type's name. Changing it orphans stored procedures |
//! | `env = Type` | no | the environment handlers receive through [`Context::env`](crate::Context::env); default `()` |
//! | `max_repeats = N` | no | how often any state may be re-entered before the step fails with [`Error::StepCycle`](crate::Error::StepCycle); default [`DEFAULT_MAX_REPEATS`](crate::DEFAULT_MAX_REPEATS) |
//! | `module = "name"` | no | the name of the generated targets module; default: the enum's name in snake case (`foo_state`). Use it when that name is taken |
//! | `crate = "path"` | no | where generated code finds procflow when it is re-exported by another crate (`crate = "my_sdk::procflow"`). A renamed dependency needs nothing: the name is read from your `Cargo.toml` |
//! | `version = N` | no | the data version of the procedure type this build writes, stored in every record; default 1. Bump it when the stored form changes (see the README's "Upgrading your procedures") |
//! | `migrate(1 = OldV1, 2 = OldV2)` | from `version = 2` on | for each older data version, the type its records are read as (`Deserialize`, with `impl From<Old> for Procedure`): one for every version from `oldest` to `version - 1`, or it does not compile |
//! | `oldest = K` | no | the oldest data version this build reads (default 1): versions below it need no migration, and their records are reported by the start check |
//! | `show_data = false` | no | the admin API and page do not show the procedure's data (default: shown, as JSON, from the last write) |
//! | `redact = ["password", "card.number"]` | no | fields of the data the admin shows as `"[redacted]"`: names, or dotted paths into nested structs, maps and lists. The stored data is unchanged |
//!
//! Besides its handlers, the handler trait has two methods with defaults: `locks` (the
//! locks a procedure takes, see [`locks`](crate::locks)) and `describe`, a short summary
//! for operators (`"table users, 4 regions"`) stored with the record at every write, so
//! that `procflow show --store` prints it without the procedure's type. A state named
//! `Locks` or `Describe` would collide with them and does not compile.
//!
//! ```
//! use procflow::prelude::*;
//!
//! struct Catalog { tables: std::sync::Mutex<Vec<String>> }
//!
//! #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state_machine(procedure = DropTable, name = "drop_table", env = Catalog, max_repeats = 10)]
//! enum DropTableState {
//!     #[initial] #[transition(to = [Dropped])] Drop,
//!     #[terminal] Dropped,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct DropTable { table: String }
//!
//! impl DropTableStateHandlers for DropTable {
//!     async fn drop(&mut self, ctx: &Context<Catalog>) -> Step<drop_table_state::Drop> {
//!         ctx.env().tables.lock().unwrap().retain(|t| *t != self.table);
//!         Ok(drop_table_state::Drop::Dropped.into())
//!     }
//! }
//!
//! assert_eq!(DropTableState::NAME, "drop_table");
//! assert_eq!(DropTableState::Drop.max_repeats(), 10);
//! ```
//!
//! ## Data versions and migrations
//!
//! ```
//! use procflow::prelude::*;
//!
//! #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state_machine(procedure = Resize, version = 2, migrate(1 = ResizeV1))]
//! enum ResizeState {
//!     #[initial] #[transition(to = [Done])] Apply,
//!     #[terminal] Done,
//! }
//!
//! /// Version 2 added `unit`.
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Resize { table: String, size: u64, unit: String }
//!
//! /// Version 1, as its records hold it.
//! #[derive(serde::Deserialize)]
//! struct ResizeV1 { table: String, size: u64 }
//!
//! impl From<ResizeV1> for Resize {
//!     fn from(v1: ResizeV1) -> Self {
//!         Resize { table: v1.table, size: v1.size, unit: "GiB".into() }
//!     }
//! }
//!
//! impl ResizeStateHandlers for Resize {
//!     async fn apply(&mut self, _: &Context<()>) -> Step<resize_state::Apply> {
//!         Ok(resize_state::Apply::Done.into())
//!     }
//! }
//!
//! # mod v1 {
//! #     use procflow::prelude::*;
//! #     #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #     #[state_machine(procedure = Resize, name = "Resize")]
//! #     pub enum ResizeState { #[initial] #[transition(to = [Done])] Apply, #[terminal] Done }
//! #     #[derive(serde::Serialize, serde::Deserialize)]
//! #     pub struct Resize { pub table: String, pub size: u64 }
//! #     impl ResizeStateHandlers for Resize {
//! #         async fn apply(&mut self, _: &Context<()>) -> Step<resize_state::Apply> {
//! #             Ok(resize_state::Apply::Done.into())
//! #         }
//! #     }
//! # }
//! // A record version 1 (`mod v1`, hidden here) wrote...
//! let stored = procflow::codec::encode::<v1::ResizeState>(
//!     &v1::Resize { table: "users".into(), size: 8 },
//!     &procflow::Cursor::new(),
//! )?;
//! // ...is read by version 2 through the migration.
//! let (resize, _) = procflow::codec::decode::<ResizeState>(&stored)?;
//! assert_eq!((resize.size, resize.unit.as_str()), (8, "GiB"));
//! # Ok::<(), procflow::codec::CodecError>(())
//! ```
//!
//! # On a variant
//!
//! ## `#[initial]`
//!
//! The state every procedure starts in; exactly one, and it cannot be terminal.
//!
//! ## `#[terminal]`
//!
//! Reaching it ends the procedure successfully. At least one; a terminal state has no
//! handler, no `#[transition]`, no `#[rollback]`.
//!
//! ## `#[transition(to = [A, B])]`
//!
//! The states this state's step may move to. Every non-terminal state has one; each
//! target must be a variant, listed once. Every state must be reachable from the initial
//! state, and from every state a terminal state must be reachable: a loop needs an exit.
//!
//! ```
//! use procflow::prelude::*;
//!
//! #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state_machine(procedure = Poll)]
//! enum PollState {
//!     #[initial] #[transition(to = [Check])] Start,
//!     // A loop is fine as long as it has an exit.
//!     #[transition(to = [Check, Ready])] Check,
//!     #[terminal] Ready,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Poll { tries: u32 }
//!
//! impl PollStateHandlers for Poll {
//!     async fn start(&mut self, _: &Context<()>) -> Step<poll_state::Start> {
//!         Ok(poll_state::Start::Check.into())
//!     }
//!     async fn check(&mut self, _: &Context<()>) -> Step<poll_state::Check> {
//!         self.tries += 1;
//!         // `poll_state::Check::Start` would not compile: `Check` cannot go back to `Start`.
//!         Ok(if self.tries < 3 { poll_state::Check::Check } else { poll_state::Check::Ready }.into())
//!     }
//! }
//! # assert_eq!(PollState::EDGES.len(), 3);
//! ```
//!
//! ## `#[rollback]`
//!
//! The state has an undo handler, `rollback_<state>`. When a later step fails, the
//! completed `#[rollback]` states are undone newest first. (The state whose step failed
//! is not undone: a failing step must leave nothing behind, or clean up before it returns
//! its error.)
//!
//! ## `#[no_rollback]`
//!
//! A point of no return: once the procedure enters this state, failures of this state and
//! of the states after it are retried with backoff instead of rolled back (what came
//! before cannot be undone once this state may have acted). A retryable failure is retried
//! within the step's budget and reported `Runnable`; a fatal one, or a spent budget, makes
//! the procedure [`Status::Stuck`](crate::executor::Status::Stuck): still retried, with
//! capped backoff, and visible to `state`, `subscribe` and the `procflow_stuck_total`
//! counter until the step succeeds or an operator acts. An abort or timeout no longer
//! applies. Mark the *first* irreversible state; cannot be combined with `#[rollback]`.
//!
//! Here a failure of `Debit` rolls back; once `Credit` is entered, failures of `Credit`
//! are retried (and `Stuck` if fatal).
//!
//! ```
//! use procflow::prelude::*;
//!
//! #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state_machine(procedure = Transfer)]
//! enum TransferState {
//!     #[initial] #[transition(to = [Credit])] #[rollback] Debit,
//!     #[transition(to = [Done])] #[no_rollback] Credit,
//!     #[terminal] Done,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Transfer { cents: u64 }
//!
//! impl TransferStateHandlers for Transfer {
//!     async fn debit(&mut self, _: &Context<()>) -> Step<transfer_state::Debit> {
//!         Ok(transfer_state::Debit::Credit.into())
//!     }
//!     async fn rollback_debit(&mut self, _: &Context<()>) -> Result<(), Error> {
//!         Ok(()) // refund
//!     }
//!     async fn credit(&mut self, _: &Context<()>) -> Step<transfer_state::Credit> {
//!         Ok(transfer_state::Credit::Done.into())
//!     }
//! }
//! assert!(TransferState::Debit.has_rollback());
//! assert!(TransferState::Credit.is_point_of_no_return());
//! ```
//!
//! ## `#[alias = "OldName"]`
//!
//! The state's former name: stored procedures that name it (their current state, their
//! rollback stack) load as this state, and are stored under the new name when next
//! written. Repeat it for several former names. An alias may not be a state's name or
//! another state's alias.
//!
//! ```
//! use procflow::prelude::*;
//!
//! #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state_machine(procedure = Job)]
//! enum JobState {
//!     #[initial] #[alias = "Prepare"] #[transition(to = [Done])] Plan,
//!     #[terminal] Done,
//! }
//! # #[derive(serde::Serialize, serde::Deserialize)]
//! # struct Job;
//! # impl JobStateHandlers for Job {
//! #     async fn plan(&mut self, _: &Context<()>) -> Step<job_state::Plan> {
//! #         Ok(job_state::Plan::Done.into())
//! #     }
//! # }
//! assert_eq!(JobState::from_name("Prepare"), Some(JobState::Plan));
//! ```
//!
//! ## `#[max_repeats = N]`
//!
//! How often this state may be re-entered (entries after the first) before the step
//! that moves into it fails with [`Error::StepCycle`](crate::Error::StepCycle), which
//! rolls the procedure back. Overrides the enum's `max_repeats`.
//!
//! ```
//! use procflow::prelude::*;
//! use procflow::{Phase, Stepper};
//!
//! #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state_machine(procedure = Spin)]
//! enum SpinState {
//!     #[initial] #[transition(to = [Spin, Done])] #[max_repeats = 3] Spin,
//!     #[terminal] Done,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Spin;
//!
//! impl SpinStateHandlers for Spin {
//!     async fn spin(&mut self, _: &Context<()>) -> Step<spin_state::Spin> {
//!         Ok(spin_state::Spin::Spin.into()) // never makes progress
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let mut run = Stepper::<SpinState>::new(Spin, ());
//! let Phase::RolledBack { cause } = run.run().await else { panic!() };
//! assert_eq!(cause, &Error::StepCycle { state: "Spin".into(), repeats: 4, max: 3 });
//! # });
//! ```
