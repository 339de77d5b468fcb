//! What a handler sees of the world: its procedure id and the shared environment.

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
}

impl<E> Context<E> {
    /// Creates the context of procedure `id`, sharing `env`.
    #[must_use]
    pub fn new(id: ProcedureId, env: Arc<E>) -> Self {
        Self { id, env }
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
        }
    }
}
