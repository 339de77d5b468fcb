//! What operators see and do: every procedure's readable record, its machine's graph and
//! its path on it, and requests (abort, wake, bypass) that survive a crash.
//!
//! Everything here reads stored bytes without the machines' types, so a tool that knows
//! none of them (the `procflow` CLI, the admin page) can show any store: an executor
//! stores the graph of every machine it runs next to the procedures.
//!
//! # Examples
//!
//! ```
//! # use procflow::prelude::*;
//! # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! # #[state_machine(procedure = Job)]
//! # enum JobState { #[initial] #[transition(to = [Done])] Start, #[terminal] Done }
//! # #[derive(serde::Serialize, serde::Deserialize)]
//! # struct Job;
//! # impl JobStateHandlers for Job {
//! #     async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
//! #         Ok(job_state::Start::Done.into())
//! #     }
//! # }
//! use procflow::executor::{Executor, Status};
//! use procflow::operator::Catalog;
//! use procflow_store::MemStore;
//! use std::sync::Arc;
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = Arc::new(MemStore::new());
//! let executor = Executor::builder(store.clone(), ()).register::<JobState>().start().await?;
//! let id = executor.submit(Job).await?;
//! executor.wait(id).await?;
//! executor.shutdown().await?;
//!
//! // At rest, without `JobState`:
//! let catalog = Catalog::load(store.as_ref()).await?;
//! let record = catalog.get(id).unwrap();
//! assert_eq!((record.machine.as_str(), record.state.as_str()), ("Job", "Done"));
//! assert_eq!(record.status, Status::Succeeded);
//! assert!(catalog.diagram(id).unwrap().contains("class Done current"));
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod catalog;
pub(crate) mod graph;
mod history;
mod record;
pub(crate) mod ser;
pub(crate) mod svg;

pub use crate::stored::history::{StepKind, StepOutcome};
pub use crate::stored::requests::{Action, Request, leave_request};
pub use catalog::Catalog;
pub use graph::{MachineGraph, PathOnGraph, StateNode};
pub use history::HistoryEntry;
pub use record::{Bypass, ProcedureRecord, Waiting};
