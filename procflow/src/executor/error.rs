//! What can go wrong when talking to the executor.

use crate::ProcedureId;
use crate::codec::CodecError;
use procflow_store::StoreError;
use std::sync::Arc;

/// Why the executor could not start, answer, or keep running.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorError {
    /// The store failed. The executor stops at the first store failure rather than run
    /// steps it cannot persist; nothing it acknowledged is lost. Restart it once the store
    /// is healthy.
    #[error("store failure, executor stopped: {0}")]
    Store(Arc<StoreError>),
    /// The store refused one write (a value or batch over its limits): nothing was
    /// written, the store is healthy and the executor goes on. A submit refused so
    /// returns this error; a running procedure whose new state is refused goes back to
    /// its last stored step and rolls back from there (or, if even that cannot be stored,
    /// stays live as [`Status::Stuck`](super::Status::Stuck)).
    #[error("the store refused the write: {0}")]
    Rejected(Arc<StoreError>),
    /// The store refused a write because a newer owner, started with a higher fencing
    /// token ([`ExecutorBuilder::fencing_token`](super::ExecutorBuilder::fencing_token)),
    /// has taken it over. The executor stopped at once: nothing more of it is persisted,
    /// and the new owner resumes its procedures. Returned by `start` too, when the store
    /// has already seen a higher token.
    #[error(
        "fenced: this executor's token {token} is stale (the store's owner token is {highest}); a newer executor owns the store"
    )]
    Fenced {
        /// This executor's token.
        token: u64,
        /// The highest token the store has seen.
        highest: u64,
    },
    /// A kill hook (or [`Executor::kill`](super::Executor::kill)) stopped the executor.
    #[error("executor was killed")]
    Killed,
    /// The executor led an [executor group](crate::group) and the group's term ended (its
    /// lease could not be kept alive, say): the group stopped it at once, as a kill would,
    /// and a new leader resumes its procedures.
    #[error("leadership lost, executor stopped: {0}")]
    LeadershipLost(Arc<crate::group::ElectionError>),
    /// The executor was shut down before the procedure ended; it resumes at the next start.
    #[error("executor is shut down")]
    ShutDown,
    /// No procedure with this id is known (never submitted, or past its retention).
    #[error("no procedure {0}")]
    NotFound(ProcedureId),
    /// Two registered machines share a stable name.
    #[error("two machines are registered under the name `{0}`; give one a `name = \"..\"`")]
    DuplicateMachine(&'static str),
    /// The store says two live procedures hold conflicting locks for life. procflow never
    /// grants that, so the store was damaged (altered by hand, or records lost); the
    /// executor does not start rather than let both run under one lock. Nothing was
    /// written.
    #[error(
        "the store is damaged: procedures {holder} and {claimant} both hold locks for life that \
         conflict (`{lock}` of {claimant}); procflow never grants that, so the executor does \
         not start rather than let both run under it"
    )]
    LockConflict {
        /// The one given its locks back first (the older).
        holder: ProcedureId,
        /// The one whose lock conflicts with the holder's.
        claimant: ProcedureId,
        /// The claimant's lock in the holder's way.
        lock: crate::locks::Lock,
    },
    /// The start check ([`ExecutorBuilder::check_data`](super::ExecutorBuilder::check_data))
    /// found live procedures this build cannot run: a machine not registered, a state
    /// removed (or renamed without an alias), a data version with no migration, or a
    /// record a newer build wrote. Nothing was started and nothing written: deploy the
    /// previous build again, or fix this one (a migration, an alias, a registration).
    #[error("{}", unreadable_message(.unreadable))]
    DataCheck {
        /// Every live procedure found unreadable, by id.
        unreadable: Vec<super::Unloadable>,
    },
    /// The executor's own metadata in the store cannot be read.
    #[error("cannot read the executor metadata `{key}` in the store")]
    Metadata {
        /// The metadata key.
        key: String,
    },
}

/// "3 live procedures cannot be run by this build (...): machine `order`: #3, #7: why".
fn unreadable_message(unreadable: &[super::Unloadable]) -> String {
    use std::collections::BTreeMap;
    let mut by_cause: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
    for u in unreadable {
        by_cause
            .entry((u.machine.as_str(), u.reason.as_str()))
            .or_default()
            .push(u.id.to_string());
    }
    let causes: Vec<String> = by_cause
        .into_iter()
        .map(|((machine, reason), ids)| {
            let shown: Vec<&str> = ids.iter().take(10).map(String::as_str).collect();
            let more = ids.len().saturating_sub(shown.len());
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("machine `{machine}`: {}{more}: {reason}", shown.join(", "))
        })
        .collect();
    format!(
        "the start check found {} live procedure(s) this build cannot run; nothing was \
         started or written (deploy the previous build again, or add the migration, alias \
         or registration this one lacks): {}",
        unreadable.len(),
        causes.join("; ")
    )
}

impl ExecutorError {
    /// A failed store call: [`Fenced`](Self::Fenced) when a newer owner has taken the
    /// store over, else [`Store`](Self::Store).
    pub(crate) fn from_store(error: StoreError) -> Self {
        match error {
            StoreError::Fenced { token, highest } => Self::Fenced { token, highest },
            error => Self::Store(Arc::new(error)),
        }
    }
}

/// Why a submit was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The procedure's machine was not registered with this executor.
    #[error("machine `{0}` is not registered: call `register::<{0}State>()` on the builder")]
    NotRegistered(&'static str),
    /// `max_running` procedures are live and `queue_capacity` more are queued.
    #[error("the executor is full ({live} procedures live or queued); retry later")]
    QueueFull {
        /// How many root procedures are live or queued.
        live: usize,
    },
    /// The procedure data cannot be serialized.
    #[error(transparent)]
    Encode(#[from] CodecError),
    /// The executor is not running (shut down, killed, or stopped by a store failure):
    /// nothing was stored.
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    /// The procedure **may have been stored**: the store's answer to its write was lost
    /// (a timeout, a connection cut after the request left, a failed `fsync` after the
    /// write), so the executor cannot tell, and it stopped (`source`). This is not a
    /// refusal: if it was stored, it runs after the next start.
    ///
    /// Retry with the **same nonce** ([`SubmitOptions::nonce`](super::SubmitOptions::nonce))
    /// on a running executor: it returns the procedure's id if the first write landed,
    /// and submits it if not, so the work runs once. Without a nonce a retry may run it
    /// twice; look for the procedure first (`id`) instead.
    #[error(
        "the procedure may have been stored as {id} (the store's answer was lost: {source}); \
         retry the submit with the same nonce, which finds it if it was stored"
    )]
    MaybeStored {
        /// The id it was written under, if the write landed.
        id: ProcedureId,
        /// Why the executor cannot tell.
        source: ExecutorError,
    },
}
