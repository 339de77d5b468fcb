//! Hierarchical shared/exclusive locks on entity keys.
//!
//! A procedure declares the entities it works on as [`Lock`]s: a `/`-separated key
//! (`"ns"`, `"ns/t1"`, `"ns/t1/r7"`) and a [`LockMode`]. Keys form a tree, and a lock on
//! a key covers everything below it when, and only when, it is exclusive:
//!
//! | held \ requested | shared `ns/t1` | exclusive `ns/t1` | shared `ns/t1/r1` | exclusive `ns/t1/r1` |
//! |---|---|---|---|---|
//! | shared `ns/t1` | ok | conflict | ok | ok |
//! | exclusive `ns/t1` | conflict | conflict | conflict | conflict |
//!
//! So a procedure that creates a table in `ns` takes shared `ns` (the namespace must not
//! be dropped meanwhile, other tables may be created next to it) and exclusive `ns/t1`;
//! dropping the namespace takes exclusive `ns` and waits for all of them.
//!
//! Prefixes are taken segment by segment: `ns/t1` is above `ns/t1/r7`, not above
//! `ns/t10`.
//!
//! The executor keeps the locks of all live procedures in one table. A procedure
//! gets its whole declared set at once or waits holding none of it, so two procedures
//! never each hold half of what the other needs; a waiting procedure is dormant (no task,
//! no worker) until its grant rouses it; requests on a key are served first come, first served, so a writer
//! is not starved by a stream of readers; and a child procedure may use the locks its
//! parent holds (it runs on the parent's behalf) instead of deadlocking on them.
//!
//! # Examples
//!
//! ```
//! use procflow::locks::{Lock, LockMode};
//!
//! let namespace = Lock::shared("ns")?;
//! let table = Lock::exclusive("ns/t1")?;
//! let region = Lock::shared("ns/t1/r7")?;
//!
//! assert_eq!(table.key(), "ns/t1");
//! assert_eq!(table.mode(), LockMode::Exclusive);
//!
//! // A shared lock on a namespace lets procedures work on different tables in it...
//! assert!(!namespace.conflicts_with(&table));
//! // ...but an exclusive lock on a table covers its regions,
//! assert!(table.conflicts_with(&region));
//! // and not a table whose name merely starts the same way.
//! assert!(!table.conflicts_with(&Lock::exclusive("ns/t10")?));
//!
//! // Keys are checked when the lock is made.
//! assert!(Lock::shared("ns//t1").is_err());
//! # Ok::<(), procflow::locks::LockKeyError>(())
//! ```

mod declared;
mod key;
pub(crate) mod restore;
mod table;

pub use declared::{Hold, Locks};
pub use key::{Lock, LockKeyError, LockMode};
pub(crate) use table::LockTable;
