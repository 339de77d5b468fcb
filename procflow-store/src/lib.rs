//! Storage for procflow: the [`Store`] trait the runtime persists procedures through,
//! [`MemStore`] for tests and [`WalStore`], an embedded write-ahead log.
#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod error;
pub mod io;
mod mem;
mod state;
mod store;
mod wal;

pub use error::StoreError;
pub use mem::MemStore;
pub use store::{Batch, BoxFuture, Limits, Loaded, Op, ProcId, Record, RecordInfo, Store};
pub use wal::{SyncMode, WalConfig, WalStats, WalStore};
