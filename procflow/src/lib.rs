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
//! use procflow::executor::{Executor, Outcome};
//! use procflow::prelude::*;
//! use procflow::store::MemStore;
//! use serde::{Deserialize, Serialize};
//! use std::sync::{Arc, Mutex};
//!
//! #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state_machine(procedure = CreateTable, env = Catalog)]
//! enum CreateTableState {
//!     #[initial] #[transition(to = [WriteLayout])]            Prepare,
//!     #[transition(to = [AddToMeta])] #[rollback]             WriteLayout,
//!     #[transition(to = [AssignRegions])] #[rollback]         AddToMeta,
//!     #[transition(to = [Created])]                           AssignRegions,
//!     #[terminal]                                             Created,
//! }
//!
//! /// What the handlers act on, shared by every procedure of the executor.
//! #[derive(Default)]
//! struct Catalog { log: Mutex<Vec<String>> }
//!
//! impl Catalog {
//!     fn record(&self, what: String) { self.log.lock().unwrap().push(what) }
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct CreateTable { name: String, servers: u32 }
//!
//! impl CreateTableStateHandlers for CreateTable {
//!     async fn prepare(&mut self, _: &Context<Catalog>) -> Step<create_table_state::Prepare> {
//!         if self.name.is_empty() {
//!             return Err(Error::fatal("a table needs a name"));
//!         }
//!         Ok(create_table_state::Prepare::WriteLayout.into())
//!     }
//!     async fn write_layout(&mut self, ctx: &Context<Catalog>) -> Step<create_table_state::WriteLayout> {
//!         ctx.env().record(format!("layout {}", self.name));
//!         Ok(create_table_state::WriteLayout::AddToMeta.into())
//!     }
//!     async fn add_to_meta(&mut self, ctx: &Context<Catalog>) -> Step<create_table_state::AddToMeta> {
//!         ctx.env().record(format!("meta {}", self.name));
//!         Ok(create_table_state::AddToMeta::AssignRegions.into())
//!     }
//!     async fn assign_regions(&mut self, _: &Context<Catalog>) -> Step<create_table_state::AssignRegions> {
//!         if self.servers == 0 {
//!             return Err(Error::fatal("no region server is up"));
//!         }
//!         Ok(create_table_state::AssignRegions::Created.into())
//!     }
//!     async fn rollback_write_layout(&mut self, ctx: &Context<Catalog>) -> Result<(), Error> {
//!         ctx.env().record(format!("undo layout {}", self.name));
//!         Ok(())
//!     }
//!     async fn rollback_add_to_meta(&mut self, ctx: &Context<Catalog>) -> Result<(), Error> {
//!         ctx.env().record(format!("undo meta {}", self.name));
//!         Ok(())
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! // Every step is persisted to the store before the next one runs (use a `WalStore` to
//! // survive the process; `MemStore` keeps this example self-contained).
//! let executor = Executor::builder(Arc::new(MemStore::new()), Catalog::default())
//!     .register::<CreateTableState>()
//!     .start()
//!     .await?;
//!
//! let users = executor.submit(CreateTable { name: "users".into(), servers: 3 }).await?;
//! assert_eq!(executor.wait(users).await?, Outcome::Succeeded);
//!
//! // `assign_regions` fails: the completed steps are undone, newest first.
//! let logs = executor.submit(CreateTable { name: "logs".into(), servers: 0 }).await?;
//! assert_eq!(executor.wait(logs).await?, Outcome::RolledBack(Error::fatal("no region server is up")));
//! executor.shutdown().await?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! A machine can also be run in memory, one step at a time, with [`Stepper`] (handy in
//! unit tests of handlers).
//!
//! # Modules
//!
//! - [`attributes`]: every attribute of the derive, with an example each.
//! - [`executor`]: runs procedures durably; [`store`] holds the stores it persists to.
//! - [`locks`]: entity locks procedures declare.
//! - [`codec`]: the persisted form of a procedure.
//! - [`mod@diagram`]: a Mermaid picture of a machine.
//! - [`operator`]: what operators see and do — readable records, diagrams with a
//!   procedure's path, durable abort/wake/bypass requests.
//! - `admin` (feature `admin`): the admin API and page of a running executor. The
//!   `procflow` binary (feature `cli`) shows and acts on a store or an admin API.

#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

#[cfg(feature = "admin")]
pub mod admin;
pub mod attributes;
mod context;
mod cursor;
pub mod diagram;
mod error;
pub mod executor;
mod flow;
pub mod group;
mod id;
mod instance;
pub mod locks;
mod machine;
pub mod operator;
mod probe;
mod stepper;
mod stored;
#[cfg(feature = "testing")]
pub mod testing;

pub use context::Context;
pub use cursor::{Cursor, Phase};
pub use diagram::mermaid;
#[doc(hidden)]
pub use error::ClassifyWithRetryableOrFatal;
pub use error::{Error, ResultExt};
pub use flow::{Child, Flow, Step};
pub use id::ProcedureId;
pub use machine::{DEFAULT_MAX_REPEATS, Procedure, StateInfo, StateMachine};
#[doc(hidden)]
pub use machine::{
    HandlerFuture, MigratesTo, NoRollback, ProcedureData, RollbackUndeclared, migrate_from,
};
pub use stepper::{StepReport, Stepper};
pub use stored::codec;

/// Derives [`StateMachine`] for an enum of states; see [`attributes`] for every attribute.
pub use procflow_derive::StateMachine;

/// The stores procedures are persisted to (the `procflow-store` crate).
pub use procflow_store as store;

/// What a procedure's module needs: `use procflow::prelude::*;`.
pub mod prelude {
    pub use crate::locks::{Lock, LockKeyError, Locks};
    pub use crate::{Child, Context, Error, Flow, ProcedureId, ResultExt, StateMachine, Step};
}

/// Paths the generated code uses. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::locks::{LockKeyError, Locks};
    pub use crate::{
        Context, DEFAULT_MAX_REPEATS, Error, Flow, HandlerFuture, NoRollback, Procedure,
        ProcedureData, RollbackUndeclared, StateInfo, StateMachine, Step, migrate_from,
    };
    /// postcard's error, in the signature of a generated `migrate`.
    pub use postcard::Error as PostcardError;
    /// The probes behind "this enum lacks some derives" (one error naming all five).
    pub mod probe {
        pub use crate::probe::*;
    }
}
