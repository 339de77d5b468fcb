//! Storage for procflow: the [`Store`] trait the runtime persists procedures through,
//! [`MemStore`] for tests and [`WalStore`], an embedded write-ahead log.
#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod error;
mod mem;
mod state;
mod store;

pub use error::StoreError;
pub use mem::MemStore;
pub use store::{Batch, BoxFuture, Limits, Loaded, Op, ProcId, Record, RecordInfo, Store};
