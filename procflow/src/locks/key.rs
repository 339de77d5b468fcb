//! A lock: a `/`-separated key and a mode, and when two locks conflict.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How a [`Lock`] shares its key with other procedures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockMode {
    /// Others may hold shared locks on the same key and any lock below it. Use it for
    /// entities that must keep existing while the procedure runs (the namespace of a
    /// table being created).
    Shared,
    /// Nobody else may hold any lock on the key or below it, and no exclusive lock
    /// above it. Use it for entities the procedure changes.
    Exclusive,
}

/// A lock a procedure declares: a hierarchical key and a [`LockMode`].
///
/// Made with [`Lock::shared`], [`Lock::exclusive`] or [`Lock::new`], which check the key;
/// a deserialized lock is checked the same way.
///
/// # Examples
///
/// ```
/// use procflow::locks::Lock;
///
/// let locks = [Lock::shared("ns")?, Lock::exclusive("ns/t1")?];
/// assert_eq!(locks[1].to_string(), "exclusive ns/t1");
/// # Ok::<(), procflow::locks::LockKeyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "LockRepr")]
pub struct Lock {
    key: String,
    mode: LockMode,
}

/// The unchecked form [`Lock`] is deserialized through.
#[derive(Deserialize)]
struct LockRepr {
    key: String,
    mode: LockMode,
}

impl TryFrom<LockRepr> for Lock {
    type Error = LockKeyError;

    fn try_from(repr: LockRepr) -> Result<Self, Self::Error> {
        Lock::new(repr.key, repr.mode)
    }
}

impl Lock {
    /// A lock on `key` in the given mode.
    ///
    /// # Errors
    ///
    /// [`LockKeyError`] when `key` is not one or more non-empty segments separated by
    /// single `/`s (empty, leading or trailing `/`, or `//`).
    pub fn new(key: impl Into<String>, mode: LockMode) -> Result<Self, LockKeyError> {
        let key = key.into();
        validate_key(&key)?;
        Ok(Self { key, mode })
    }

    /// A [`Shared`](LockMode::Shared) lock on `key`.
    ///
    /// # Errors
    ///
    /// [`LockKeyError`] when `key` is malformed; see [`Lock::new`].
    pub fn shared(key: impl Into<String>) -> Result<Self, LockKeyError> {
        Self::new(key, LockMode::Shared)
    }

    /// An [`Exclusive`](LockMode::Exclusive) lock on `key`.
    ///
    /// # Errors
    ///
    /// [`LockKeyError`] when `key` is malformed; see [`Lock::new`].
    pub fn exclusive(key: impl Into<String>) -> Result<Self, LockKeyError> {
        Self::new(key, LockMode::Exclusive)
    }

    /// The key, such as `"ns/t1"`.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether the lock is shared or exclusive.
    #[must_use]
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// Whether two different procedures could not hold `self` and `other` at once.
    ///
    /// True when both are on the same key and at least one is exclusive, or when one key
    /// is strictly above the other and the lock on the upper key is exclusive. The
    /// relation is symmetric.
    #[must_use]
    pub fn conflicts_with(&self, other: &Lock) -> bool {
        if self.key == other.key {
            self.mode == LockMode::Exclusive || other.mode == LockMode::Exclusive
        } else if is_ancestor(&self.key, &other.key) {
            self.mode == LockMode::Exclusive
        } else if is_ancestor(&other.key, &self.key) {
            other.mode == LockMode::Exclusive
        } else {
            false
        }
    }
}

impl fmt::Display for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            LockMode::Shared => "shared",
            LockMode::Exclusive => "exclusive",
        };
        write!(f, "{mode} {}", self.key)
    }
}

/// Whether `upper` is a strict ancestor of `lower`, segment by segment.
fn is_ancestor(upper: &str, lower: &str) -> bool {
    lower.len() > upper.len() && lower.starts_with(upper) && lower.as_bytes()[upper.len()] == b'/'
}

fn validate_key(key: &str) -> Result<(), LockKeyError> {
    let problem = if key.is_empty() {
        Some("it is empty")
    } else if key.starts_with('/') {
        Some("it starts with `/`")
    } else if key.ends_with('/') {
        Some("it ends with `/`")
    } else if key.contains("//") {
        Some("it has an empty segment (`//`)")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(LockKeyError {
            key: key.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

/// A lock key that is not a `/`-separated path of non-empty segments.
///
/// Returned by [`Lock::new`], [`Lock::shared`] and [`Lock::exclusive`].
///
/// # Examples
///
/// ```
/// use procflow::locks::Lock;
///
/// let err = Lock::exclusive("/ns/t1").unwrap_err();
/// assert_eq!(err.key(), "/ns/t1");
/// assert!(err.to_string().contains("starts with `/`"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid lock key `{key}`: {problem}; a lock key is one or more non-empty segments \
     separated by `/`, such as `ns`, `ns/t1` or `ns/t1/r7`"
)]
pub struct LockKeyError {
    key: String,
    problem: &'static str,
}

impl LockKeyError {
    /// The rejected key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(key: &str) -> Lock {
        Lock::shared(key).unwrap()
    }

    fn x(key: &str) -> Lock {
        Lock::exclusive(key).unwrap()
    }

    /// Asserts `a` and `b` conflict (or not) in both directions.
    fn assert_conflict(a: &Lock, b: &Lock, expected: bool) {
        assert_eq!(a.conflicts_with(b), expected, "{a} vs {b}");
        assert_eq!(b.conflicts_with(a), expected, "{b} vs {a}");
    }

    #[test]
    fn conflict_matrix() {
        // Same key.
        assert_conflict(&s("ns/t1"), &s("ns/t1"), false);
        assert_conflict(&s("ns/t1"), &x("ns/t1"), true);
        assert_conflict(&x("ns/t1"), &x("ns/t1"), true);
        // Exclusive ancestor covers every descendant.
        assert_conflict(&x("ns/t1"), &s("ns/t1/r1"), true);
        assert_conflict(&x("ns/t1"), &x("ns/t1/r1"), true);
        assert_conflict(&x("ns"), &s("ns/t1/r1"), true);
        // Shared ancestor lets descendants be locked in any mode.
        assert_conflict(&s("ns"), &x("ns/t1"), false);
        assert_conflict(&s("ns"), &s("ns/t1"), false);
        assert_conflict(&s("ns/t1"), &x("ns/t1/r1"), false);
        // Siblings, and keys that only share a string prefix.
        assert_conflict(&x("ns/t1"), &x("ns/t2"), false);
        assert_conflict(&x("ns/t1"), &x("ns/t10"), false);
        assert_conflict(&x("ns/t1"), &x("ns/t10/r1"), false);
        assert_conflict(&x("ns"), &x("ns2"), false);
    }

    #[test]
    fn invalid_keys_are_rejected() {
        for key in ["", "/", "/ns", "ns/", "ns//t1", "//"] {
            let err = Lock::shared(key).expect_err(key);
            assert_eq!(err.key(), key);
            assert!(err.to_string().contains("such as `ns`"), "{err}");
            assert!(Lock::exclusive(key).is_err(), "{key}");
        }
        for key in ["ns", "ns/t1", "ns/t1/r7", "a b/c-d.e"] {
            assert_eq!(Lock::shared(key).unwrap().key(), key);
        }
        assert!(
            Lock::shared("ns//t1")
                .unwrap_err()
                .to_string()
                .contains("empty segment")
        );
    }

    #[test]
    fn deserializing_checks_the_key() {
        let lock = x("ns/t1");
        let bytes = postcard::to_allocvec(&lock).unwrap();
        assert_eq!(postcard::from_bytes::<Lock>(&bytes).unwrap(), lock);

        #[derive(Serialize)]
        struct Raw<'a> {
            key: &'a str,
            mode: LockMode,
        }
        let bad = postcard::to_allocvec(&Raw {
            key: "ns/",
            mode: LockMode::Shared,
        })
        .unwrap();
        assert!(postcard::from_bytes::<Lock>(&bad).is_err());
    }
}
