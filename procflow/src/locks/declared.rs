//! What a procedure declares: its locks, and how long it holds them.

use super::Lock;
use serde::{Deserialize, Serialize};

/// How long a procedure holds its [`Locks`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Hold {
    /// From before its first step until it ends (rolled back included); re-taken after a
    /// restart before it runs again. HBase's `holdLock = true`.
    #[default]
    ForLife,
    /// Around each step only, released in between (while it waits for children, an event
    /// or a retry).
    PerStep,
}

/// The locks a procedure declares, by overriding the `locks` method of its handler trait.
///
/// Waiting for them parks the procedure without taking a worker; they are granted
/// together (all or nothing) and first come, first served. Child procedures may take locks
/// their ancestors hold.
///
/// The executor records them with the procedure when it is submitted, and a procedure
/// that has started takes them from that record after a restart (its data is decoded
/// only when it next runs): declare them from what the submit sets, not from fields a
/// step changes.
///
/// ```
/// use procflow::locks::{Hold, Lock, Locks};
///
/// let locks = Locks::new([Lock::shared("ns")?, Lock::exclusive("ns/users")?]);
/// assert_eq!(locks.hold(), Hold::ForLife);
/// assert_eq!(locks.per_step().hold(), Hold::PerStep);
/// assert!(Locks::none().locks().is_empty());
/// # Ok::<(), procflow::locks::LockKeyError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Locks {
    locks: Vec<Lock>,
    hold: Hold,
}

impl Locks {
    /// No locks (the default).
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }

    /// These locks, held for the procedure's life.
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> Self {
        Self {
            locks: locks.into_iter().collect(),
            hold: Hold::ForLife,
        }
    }

    /// The same locks, held around each step only.
    #[must_use]
    pub fn per_step(mut self) -> Self {
        self.hold = Hold::PerStep;
        self
    }

    /// The declared locks.
    #[must_use]
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// How long they are held.
    #[must_use]
    pub fn hold(&self) -> Hold {
        self.hold
    }
}
