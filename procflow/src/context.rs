//! What a handler sees of the world: its procedure id, the shared environment and the
//! executor's fencing token.

use crate::ProcedureId;
use std::sync::Arc;

/// The context handed to every execute and rollback handler.
///
/// The environment `E` is the value the application shares with all its procedures (a
/// catalog client, a connection pool…); its type is chosen with
/// `#[state_machine(env = MyEnv)]` and defaults to `()`.
///
/// # Examples
///
/// ```
/// use procflow::{Context, ProcedureId};
/// use std::sync::Arc;
///
/// let ctx = Context::new(ProcedureId::new(7), Arc::new(String::from("catalog")));
/// assert_eq!(ctx.id().get(), 7);
/// assert_eq!(ctx.env(), "catalog");
/// ```
#[derive(Debug)]
pub struct Context<E> {
    id: ProcedureId,
    env: Arc<E>,
    fencing_token: Option<u64>,
    attempt: u32,
}

impl<E> Context<E> {
    /// Creates the context of procedure `id`, sharing `env`, without a fencing token.
    #[must_use]
    pub fn new(id: ProcedureId, env: Arc<E>) -> Self {
        Self {
            id,
            env,
            fencing_token: None,
            attempt: 1,
        }
    }

    /// Sets the number [`attempt`](Self::attempt) returns (for a handler's unit tests).
    #[must_use]
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Which try of the current step this is: 1 the first time it runs, 2 on its first
    /// retry after a retryable error, and so on (a rollback step counts its own tries).
    /// Counted by the executor running it: after a restart a step counts from 1 again.
    ///
    /// ```
    /// use procflow::{Context, ProcedureId};
    /// use std::sync::Arc;
    ///
    /// let ctx = Context::new(ProcedureId::new(1), Arc::new(()));
    /// assert_eq!(ctx.attempt(), 1);
    /// // A handler can, say, log louder from the third try on.
    /// assert!(ctx.with_attempt(3).attempt() >= 3);
    /// ```
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    pub(crate) fn set_attempt(&mut self, attempt: u32) {
        self.attempt = attempt;
    }

    /// Sets the fencing token [`fencing_token`](Self::fencing_token) returns.
    #[must_use]
    pub fn with_fencing_token(mut self, token: Option<u64>) -> Self {
        self.fencing_token = token;
        self
    }

    /// The token of the executor running this step, if it was started with one
    /// ([`ExecutorBuilder::fencing_token`](crate::executor::ExecutorBuilder::fencing_token)).
    ///
    /// The store refuses every write of an executor whose token is lower than one it has
    /// seen, so an executor that lost its ownership cannot persist anything. A handler's
    /// own effects on other systems are not covered by that: pass the token along, and
    /// have those systems refuse a request carrying a lower token than one they have
    /// already seen.
    ///
    /// ```
    /// use procflow::{Context, ProcedureId};
    /// use std::sync::{Arc, Mutex};
    ///
    /// /// A downstream system that checks fencing tokens.
    /// #[derive(Default)]
    /// struct Regions { highest: Mutex<u64>, assigned: Mutex<Vec<u32>> }
    ///
    /// impl Regions {
    ///     fn assign(&self, region: u32, token: u64) -> Result<(), String> {
    ///         let mut highest = self.highest.lock().unwrap();
    ///         if token < *highest {
    ///             return Err(format!("fenced: token {token} < {}", *highest));
    ///         }
    ///         *highest = token;
    ///         self.assigned.lock().unwrap().push(region);
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let regions = Arc::new(Regions::default());
    /// let new_owner = Context::new(ProcedureId::new(1), Arc::clone(&regions)).with_fencing_token(Some(8));
    /// let old_owner = Context::new(ProcedureId::new(1), Arc::clone(&regions)).with_fencing_token(Some(7));
    /// // In a handler: `ctx.env().assign(3, ctx.fencing_token().unwrap_or(0))`.
    /// assert!(new_owner.env().assign(3, new_owner.fencing_token().unwrap()).is_ok());
    /// assert!(old_owner.env().assign(3, old_owner.fencing_token().unwrap()).is_err());
    /// assert_eq!(*regions.assigned.lock().unwrap(), [3]);
    /// ```
    #[must_use]
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// The id of the procedure whose step is running.
    #[must_use]
    pub fn id(&self) -> ProcedureId {
        self.id
    }

    /// The shared environment.
    #[must_use]
    pub fn env(&self) -> &E {
        &self.env
    }

    /// The shared environment, as the `Arc` it is held in (to move into a spawned task).
    #[must_use]
    pub fn env_arc(&self) -> &Arc<E> {
        &self.env
    }
}

impl<E> Clone for Context<E> {
    fn clone(&self) -> Self {
        Self {
            id: self.id,
            env: Arc::clone(&self.env),
            fencing_token: self.fencing_token,
            attempt: self.attempt,
        }
    }
}
