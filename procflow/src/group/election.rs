//! The election an executor group runs: who leads, with which fencing token.

use procflow_store::BoxFuture;
use std::fmt;

/// One leadership of one candidate. Its `token` is the fencing token: larger than the
/// token of every earlier term of the same election.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    /// The fencing token, given to the leader's executor
    /// ([`ExecutorBuilder::fencing_token`](crate::executor::ExecutorBuilder::fencing_token)).
    pub token: u64,
}

/// Why an election call failed (the service behind it is unreachable, say).
#[derive(Debug, thiserror::Error)]
#[error("election: {message}")]
pub struct ElectionError {
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ElectionError {
    /// An error with a message only.
    #[must_use]
    pub fn new(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            source: None,
        }
    }

    /// An error caused by `source`.
    #[must_use]
    pub fn with_source(
        message: impl fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: message.to_string(),
            source: Some(Box::new(source)),
        }
    }
}

/// One candidate's view of a leader election, as an [`ExecutorGroup`](super::ExecutorGroup)
/// uses it. Object safe: the group holds an `Arc<dyn Election>`.
///
/// An implementation must guarantee that terms' tokens only grow, and that the store
/// refuses a batch carrying an older term's token once a newer term has written (for
/// `MemStore` and `WalStore` this follows from the tokens growing; an etcd store compares
/// the leader key's create revision in every transaction). It should end a term (make
/// [`lost`](Self::lost) resolve) *before* another candidate can win, e.g. when a lease
/// keep-alive is missed, well before the lease expires; fencing covers the rest.
pub trait Election: Send + Sync + 'static {
    /// Waits until this candidate leads, and returns its term.
    ///
    /// Cancel safety: dropping the future gives up the campaign; a term won just before
    /// is resigned by the implementation or ends on its own (a lease not kept alive).
    fn campaign(&self) -> BoxFuture<'_, Result<Term, ElectionError>>;

    /// Resolves once `term` is over for this candidate (resigned, deposed, or its lease
    /// lost), with why; the group stops the leader's executor with this reason
    /// ([`ExecutorError::LeadershipLost`](crate::executor::ExecutorError::LeadershipLost)).
    fn lost(&self, term: Term) -> BoxFuture<'_, ElectionError>;

    /// Ends `term`, so another candidate can win. A no-op if it is already over.
    fn resign(&self, term: Term) -> BoxFuture<'_, Result<(), ElectionError>>;

    /// The address the current leader advertises, if one leads.
    fn leader(&self) -> BoxFuture<'_, Result<Option<String>, ElectionError>>;
}

/// Why term `token` of an election on `service` ended, once the task keeping it says so
/// on `lost` (`None`: not a term this candidate holds): [`Election::lost`] of the
/// elections whose terms a background task keeps alive.
#[cfg(any(feature = "etcd", all(feature = "postgres", unix)))]
pub(crate) async fn term_over(
    service: &str,
    token: u64,
    lost: Option<tokio::sync::watch::Receiver<Option<String>>>,
) -> ElectionError {
    let reason = match lost {
        Some(mut lost) => match lost.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "the lease keeper is gone".to_owned(),
        },
        None => "not a term of this candidate (resigned?)".to_owned(),
    };
    ElectionError::new(format!("{service} term {token}: {reason}"))
}
