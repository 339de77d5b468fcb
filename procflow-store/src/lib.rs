//! Storage for procflow: the [`Store`] trait through which the runtime persists every
//! procedure's state after each step, [`MemStore`] for tests and [`WalStore`], an embedded
//! write-ahead log and the default store.
//!
//! A store holds [`Record`]s (one per procedure, live or finished) and small metadata
//! entries. The runtime changes them with [`Batch`]es of [`Op`]s, each applied atomically
//! and durable when [`Store::commit`] returns. A batch may carry a fencing token so that a
//! process that lost ownership of the store cannot overwrite its successor's work.
//!
//! # Examples
//!
//! Open a [`WalStore`] in a directory, commit, and find the data again after reopening:
//!
//! ```
//! use procflow_store::{Batch, Store, WalConfig, WalStore};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let dir = tempfile::tempdir()?;
//! let store = WalStore::open(dir.path(), WalConfig::default())?;
//! store
//!     .commit(
//!         Batch::new()
//!             .put(1, None, b"create table: step 1".to_vec())
//!             .put_meta("next_id", 2u64.to_le_bytes().to_vec()),
//!     )
//!     .await?;
//! store.commit(Batch::new().finish(1, b"created".to_vec())).await?;
//! store.close().await?;
//!
//! let store = WalStore::open(dir.path(), WalConfig::default())?;
//! let loaded = store.load().await?;
//! assert!(loaded.records[0].finished);
//! assert_eq!(loaded.records[0].value, &b"created"[..]);
//! assert_eq!(loaded.meta["next_id"], 2u64.to_le_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # }
//! ```
//!
//! # Testing against failures
//!
//! [`WalStore::open_with_backend`] runs the log on any [`io::IoBackend`]:
//! [`io::SimBackend`] simulates power loss at any sync, [`io::FaultBackend`] fails the
//! Nth write or sync. The on-disk format is described in `docs/FORMAT.md`.
#![warn(missing_docs)]
#![deny(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod io;
mod local_port;
mod mem;
#[cfg(all(feature = "postgres", unix))]
pub mod postgres;
#[cfg(any(feature = "etcd", all(feature = "postgres", unix)))]
mod server_log;
mod slot;
mod state;
mod store;
mod wal;

/// The type of [`Record::value`]: cloning one shares its bytes instead of copying them.
pub use bytes::Bytes;
pub use error::StoreError;
pub use local_port::free_local_port;
pub use mem::MemStore;
pub use slot::{CommitIn, CommitSlot};
pub use store::{Batch, BoxFuture, Limits, Loaded, Op, ProcId, Record, RecordInfo, Store};
pub use wal::{SyncMode, WalConfig, WalStats, WalStore};
