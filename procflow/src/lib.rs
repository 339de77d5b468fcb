//! Durable, typed state machines: multi-step operations that survive process crashes,
//! roll back on failure and are checked by the compiler.
//!
//! You describe the steps of an operation ("create a table", "move a region") as an enum
//! and derive [`StateMachine`]. The derive checks the machine at compile time (exactly one
//! initial state, every state reachable, every loop has an exit…), generates a handler
//! trait with one `async fn` per step, and gives each step a return type that admits only
//! the states it declared: returning any other state does not compile.
//!
//! # Example
//!
//! ```
//! use procflow::prelude::*;
//! use procflow::{Phase, Stepper};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state_machine(procedure = CreateTable)]
//! enum CreateTableState {
//!     #[initial] #[transition(to = [WriteLayout])]            Prepare,
//!     #[transition(to = [AddToMeta])] #[rollback]             WriteLayout,
//!     #[transition(to = [AssignRegions])] #[rollback]         AddToMeta,
//!     #[transition(to = [Created])]                           AssignRegions,
//!     #[terminal]                                             Created,
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct CreateTable { name: String, log: Vec<String> }
//!
//! impl CreateTableStateHandlers for CreateTable {
//!     async fn prepare(&mut self, _ctx: &Context<()>) -> Step<create_table_state::Prepare> {
//!         if self.name.is_empty() {
//!             return Err(Error::fatal("a table needs a name"));
//!         }
//!         Ok(create_table_state::Prepare::WriteLayout.into())
//!     }
//!     async fn write_layout(&mut self, _ctx: &Context<()>) -> Step<create_table_state::WriteLayout> {
//!         self.log.push(format!("layout of {}", self.name));
//!         Ok(create_table_state::WriteLayout::AddToMeta.into())
//!     }
//!     async fn add_to_meta(&mut self, _ctx: &Context<()>) -> Step<create_table_state::AddToMeta> {
//!         self.log.push("meta".into());
//!         Ok(create_table_state::AddToMeta::AssignRegions.into())
//!     }
//!     async fn assign_regions(&mut self, _ctx: &Context<()>) -> Step<create_table_state::AssignRegions> {
//!         Err(Error::fatal("no region server is up"))
//!     }
//!     async fn rollback_write_layout(&mut self, _ctx: &Context<()>) -> Result<(), Error> {
//!         self.log.push("undo layout".into());
//!         Ok(())
//!     }
//!     async fn rollback_add_to_meta(&mut self, _ctx: &Context<()>) -> Result<(), Error> {
//!         self.log.push("undo meta".into());
//!         Ok(())
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let table = CreateTable { name: "users".into(), log: vec![] };
//! let mut run = Stepper::<CreateTableState>::new(table, ());
//! // `assign_regions` fails: the completed steps are undone, newest first.
//! assert!(matches!(run.run().await, Phase::RolledBack { .. }));
//! assert_eq!(run.procedure().log, ["layout of users", "meta", "undo meta", "undo layout"]);
//! # });
//! ```
//!
//! [`Stepper`] runs a procedure in memory; the executor (persisting every step to a
//! `procflow-store` store and resuming after a crash) builds on the same types.
//!
//! # Modules
//!
//! - [`attributes`]: every attribute of the derive, with an example each.
//! - [`codec`]: the persisted form of a procedure.
//! - [`mod@diagram`]: a Mermaid picture of a machine.

#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

pub mod attributes;
pub mod codec;
mod context;
mod cursor;
pub mod diagram;
mod error;
pub mod executor;
mod flow;
mod id;
mod instance;
pub mod locks;
mod machine;
mod stepper;

pub use context::Context;
pub use cursor::{Cursor, Phase};
pub use diagram::mermaid;
pub use error::{Error, ResultExt};
pub use flow::{Child, Flow, Step};
pub use id::ProcedureId;
pub use machine::{DEFAULT_MAX_REPEATS, StateInfo, StateMachine};
pub use stepper::{StepReport, Stepper};

/// Derives [`StateMachine`] for an enum of states; see [`attributes`] for every attribute.
pub use procflow_derive::StateMachine;

/// What a procedure's module needs: `use procflow::prelude::*;`.
pub mod prelude {
    pub use crate::locks::{Lock, Locks};
    pub use crate::{Child, Context, Error, Flow, ResultExt, StateMachine, Step};
}

/// Paths the generated code uses. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::locks::{LockKeyError, Locks};
    pub use crate::{Context, DEFAULT_MAX_REPEATS, Error, Flow, StateInfo, StateMachine, Step};
}
