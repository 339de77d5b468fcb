//! The error a step returns, and how the runtime treats it.

use serde::{Deserialize, Serialize};
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

type Cause = Arc<dyn StdError + Send + Sync + 'static>;

/// Why a step (or a rollback step) did not complete.
///
/// The variant decides what the runtime does next:
///
/// | variant | before a point of no return | after one (`#[no_rollback]`) |
/// |---|---|---|
/// | [`Retryable`](Error::Retryable) | retried with backoff; when the step's budget is spent it counts as fatal | retried |
/// | [`Fatal`](Error::Fatal) | the procedure rolls back | retried |
/// | [`StepCycle`](Error::StepCycle) | the procedure rolls back | retried |
///
/// Only the message (and the step-cycle fields) survive a restart: the wrapped cause is
/// kept in memory for [`source`](std::error::Error::source) chains and downcasting, and
/// is not persisted.
///
/// # Examples
///
/// ```
/// use procflow::{Error, ResultExt};
///
/// fn read_layout() -> Result<String, Error> {
///     // `?` on any std error, choosing how the runtime should treat it:
///     let text = std::fs::read_to_string("/definitely/not/here").retryable()?;
///     Ok(text)
/// }
///
/// let err = read_layout().unwrap_err();
/// assert!(err.is_retryable());
/// assert!(Error::fatal("table name is empty").is_fatal());
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub enum Error {
    /// A transient failure (a timeout, a lost connection): run the step again later.
    Retryable {
        /// What went wrong, for people.
        message: String,
        /// The wrapped error, when there was one (not persisted).
        cause: Option<Cause>,
    },
    /// A permanent failure: roll the procedure back (or, past a point of no return,
    /// retry).
    Fatal {
        /// What went wrong, for people.
        message: String,
        /// The wrapped error, when there was one (not persisted).
        cause: Option<Cause>,
    },
    /// A state was entered more often than its `max_repeats` bound: the machine is
    /// looping without progress.
    StepCycle {
        /// The name of the state entered once too often.
        state: String,
        /// How often it was re-entered (entries after the first).
        repeats: u32,
        /// Its bound.
        max: u32,
    },
}

impl Error {
    /// A transient failure described by `message`.
    pub fn retryable(message: impl fmt::Display) -> Self {
        Self::Retryable {
            message: message.to_string(),
            cause: None,
        }
    }

    /// A permanent failure described by `message`.
    pub fn fatal(message: impl fmt::Display) -> Self {
        Self::Fatal {
            message: message.to_string(),
            cause: None,
        }
    }

    /// Wraps `cause` as a transient failure; its `Display` becomes the message.
    pub fn retryable_from(cause: impl StdError + Send + Sync + 'static) -> Self {
        Self::Retryable {
            message: cause.to_string(),
            cause: Some(Arc::new(cause)),
        }
    }

    /// Wraps `cause` as a permanent failure; its `Display` becomes the message.
    pub fn fatal_from(cause: impl StdError + Send + Sync + 'static) -> Self {
        Self::Fatal {
            message: cause.to_string(),
            cause: Some(Arc::new(cause)),
        }
    }

    /// Whether the runtime may run the step again before giving up.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Retryable { .. })
    }

    /// Whether the failure is permanent (fatal or a step cycle).
    #[must_use]
    pub fn is_fatal(&self) -> bool {
        !self.is_retryable()
    }

    /// The wrapped error, for downcasting, when the error was built from one and has not
    /// been through the store.
    #[must_use]
    pub fn cause(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        match self {
            Self::Retryable { cause, .. } | Self::Fatal { cause, .. } => cause.as_deref(),
            Self::StepCycle { .. } => None,
        }
    }

    /// The same error, turned fatal (a retry budget was spent).
    #[must_use]
    pub fn into_fatal(self) -> Self {
        match self {
            Self::Retryable { message, cause } => Self::Fatal { message, cause },
            other => other,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retryable { message, .. } | Self::Fatal { message, .. } => f.write_str(message),
            Self::StepCycle {
                state,
                repeats,
                max,
            } => write!(
                f,
                "step cycle: state `{state}` was re-entered {repeats} times, over its bound of \
                 {max} (raise `max_repeats` if the loop is intended)"
            ),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retryable { message, .. } => f.debug_tuple("Retryable").field(message).finish(),
            Self::Fatal { message, .. } => f.debug_tuple("Fatal").field(message).finish(),
            Self::StepCycle {
                state,
                repeats,
                max,
            } => f
                .debug_struct("StepCycle")
                .field("state", state)
                .field("repeats", repeats)
                .field("max", max)
                .finish(),
        }
    }
}

// `Display` already shows the cause's message, so the chain continues with the cause's
// own source rather than repeating the cause itself.
impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        let cause: &(dyn StdError + 'static) = self.cause()?;
        cause.source()
    }
}

/// Two errors are equal when they would be equal after a trip through the store: the
/// in-memory cause is not compared.
impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        Persisted::from(self) == Persisted::from(other)
    }
}

impl Eq for Error {}

/// The persisted form of [`Error`]. Variants are only ever appended: their index is on
/// disk (docs/FORMAT.md).
#[derive(Serialize, Deserialize, PartialEq)]
enum Persisted<'a> {
    Retryable(&'a str),
    Fatal(&'a str),
    StepCycle {
        state: &'a str,
        repeats: u32,
        max: u32,
    },
}

impl<'a> From<&'a Error> for Persisted<'a> {
    fn from(error: &'a Error) -> Self {
        match error {
            Error::Retryable { message, .. } => Self::Retryable(message),
            Error::Fatal { message, .. } => Self::Fatal(message),
            Error::StepCycle {
                state,
                repeats,
                max,
            } => Self::StepCycle {
                state,
                repeats: *repeats,
                max: *max,
            },
        }
    }
}

impl Serialize for Error {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Persisted::from(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Error {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        enum Owned {
            Retryable(String),
            Fatal(String),
            StepCycle {
                state: String,
                repeats: u32,
                max: u32,
            },
        }
        Ok(match Owned::deserialize(deserializer)? {
            Owned::Retryable(message) => Self::Retryable {
                message,
                cause: None,
            },
            Owned::Fatal(message) => Self::Fatal {
                message,
                cause: None,
            },
            Owned::StepCycle {
                state,
                repeats,
                max,
            } => Self::StepCycle {
                state,
                repeats,
                max,
            },
        })
    }
}

/// Turns any `Result<T, E: std::error::Error>` into a step result, choosing how the
/// runtime treats the failure.
///
/// ```
/// use procflow::{Error, ResultExt};
///
/// let parsed: Result<u32, Error> = "12x".parse::<u32>().fatal();
/// assert_eq!(parsed.unwrap_err().to_string(), "invalid digit found in string");
/// ```
pub trait ResultExt<T> {
    /// A failure is transient: retry the step.
    ///
    /// # Errors
    ///
    /// [`Error::Retryable`] wrapping the original error.
    fn retryable(self) -> Result<T, Error>;

    /// A failure is permanent: roll back.
    ///
    /// # Errors
    ///
    /// [`Error::Fatal`] wrapping the original error.
    fn fatal(self) -> Result<T, Error>;
}

impl<T, E: StdError + Send + Sync + 'static> ResultExt<T> for Result<T, E> {
    fn retryable(self) -> Result<T, Error> {
        self.map_err(Error::retryable_from)
    }

    fn fatal(self) -> Result<T, Error> {
        self.map_err(Error::fatal_from)
    }
}

/// Never implemented: it exists so that `?` on an error that is not a procflow [`Error`]
/// says how to classify it, instead of rustc's "couldn't convert the error".
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`?` cannot tell whether `{Self}` is worth retrying: use `.retryable()?` or `.fatal()?`",
    label = "classify this error: `.retryable()?` runs the step again, `.fatal()?` rolls the procedure back",
    note = "both come from `procflow::ResultExt` (in `procflow::prelude`)"
)]
pub trait ClassifyWithRetryableOrFatal {}

/// Only for the message above: the bound is never met, so `?` never converts an error
/// implicitly. (`Error` itself is not `ClassifyWithRetryableOrFatal`, so this does not
/// overlap with `From<T> for T`.)
impl<E: StdError + ClassifyWithRetryableOrFatal> From<E> for Error {
    fn from(error: E) -> Self {
        Error::fatal(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("outer")
        }
    }
    impl StdError for Outer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn source_chain_skips_the_cause_already_displayed() {
        let err = Error::fatal_from(Outer(std::io::Error::other("disk gone")));
        assert_eq!(err.to_string(), "outer");
        assert_eq!(err.source().unwrap().to_string(), "disk gone");
        assert!(err.cause().unwrap().downcast_ref::<Outer>().is_some());
    }

    #[test]
    fn persisted_form_round_trips_without_the_cause() {
        for err in [
            Error::retryable_from(std::io::Error::other("timeout")),
            Error::fatal("no such table"),
            Error::StepCycle {
                state: "Poll".into(),
                repeats: 11,
                max: 10,
            },
        ] {
            let bytes = postcard::to_allocvec(&err).unwrap();
            let back: Error = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back, err);
            assert!(back.cause().is_none());
            assert_eq!(back.to_string(), err.to_string());
        }
    }

    #[test]
    fn spent_retry_budget_turns_fatal_and_keeps_the_message() {
        let err = Error::retryable("flaky").into_fatal();
        assert!(err.is_fatal());
        assert_eq!(err.to_string(), "flaky");
    }
}
