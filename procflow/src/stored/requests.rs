//! Operators' requests — abort, wake, bypass — stored before they are acted on, so a
//! crash does not lose them, and so another process can leave them for an executor.
//!
//! A request is a metadata entry under `procflow/request/`. An executor acts on it
//! (at once if it is running, or as it starts) and deletes it once what it asked for is
//! durable: the rollback's first write, the woken procedures' wake-up, the bypass's end.
//! A crash in between leaves the entry, and the next start acts on it again; each
//! action is idempotent (an abort of a procedure already rolling back, a bypass of an
//! ended one, change nothing; a second wake is a spurious wake, which suspended steps
//! must tolerate anyway).

use procflow_store::{Batch, Store, StoreError};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use crate::ProcedureId;
use crate::stored::history::time_of;
use crate::stored::record::now_ms;

/// Metadata key prefix of stored requests.
pub(crate) const REQUEST_PREFIX: &str = "procflow/request/";

/// What an operator asks for. Variants are only appended: their index is stored (the
/// names are JSON's: `{"abort": 3}`, `{"wake": "go"}`, `{"bypass": {"id": 3, ..}}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Action {
    /// Roll the procedure back (see [`Executor::abort`](crate::executor::Executor::abort)
    /// for where it is honoured). Refused past a point of no return.
    Abort(u64),
    /// Wake every procedure suspended on this event.
    Wake(String),
    /// End the procedure as bypassed without running any more of its handlers (HBCK2's
    /// `bypass`): for a procedure stuck past its point of no return, or one an operator
    /// has repaired by hand. Its locks are released and nothing is undone. With
    /// `recursive`, its live descendants are bypassed too (deepest first); otherwise they
    /// go on, and a parent waiting for a bypassed child goes on as if it had succeeded.
    Bypass {
        /// The procedure.
        id: u64,
        /// Its live descendants too.
        recursive: bool,
    },
}

/// A request with who made it and why, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// What is asked.
    pub action: Action,
    /// Who asks (recorded in the procedure's history for a bypass).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When it was made, ms since the Unix epoch.
    at_ms: u64,
}

impl Request {
    /// A request made now.
    pub fn new(action: Action, by: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            action,
            by: by.into(),
            reason: reason.into(),
            at_ms: now_ms(),
        }
    }

    /// When it was made.
    #[must_use]
    pub fn at(&self) -> SystemTime {
        time_of(self.at_ms)
    }

    /// The procedure it targets, if it targets one.
    #[must_use]
    pub fn target(&self) -> Option<ProcedureId> {
        match self.action {
            Action::Abort(id) | Action::Bypass { id, .. } => Some(ProcedureId::new(id)),
            Action::Wake(_) => None,
        }
    }

    /// A fresh metadata key: time-ordered, unique across processes.
    pub(crate) fn new_key(&self) -> String {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        format!(
            "{REQUEST_PREFIX}{:016x}-{:08x}-{seq}",
            self.at_ms,
            std::process::id()
        )
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        // Strings and integers always serialize.
        postcard::to_stdvec(self).unwrap_or_default()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        postcard::from_bytes(bytes).map_err(|e| format!("unreadable request: {e}"))
    }
}

/// Stores `request` in `store` for the executor that runs on it, and returns its key.
/// For a process that is not that executor: the CLI on a stopped store, or any process
/// on a shared (etcd) store. A running executor acts on requests through
/// [`Executor::request`](crate::executor::Executor::request) instead.
///
/// # Errors
///
/// The store's.
///
/// # Cancel safety
///
/// As the store's `commit`: a dropped call may or may not have stored the request.
pub async fn leave_request(store: &dyn Store, request: &Request) -> Result<String, StoreError> {
    let key = request.new_key();
    store
        .commit(Batch::new().put_meta(key.clone(), request.encode()))
        .await?;
    Ok(key)
}

/// The requests a store holds, oldest first, with their keys; unreadable ones with why.
pub(crate) fn stored<'a>(
    meta: &'a std::collections::BTreeMap<String, Vec<u8>>,
) -> impl Iterator<Item = (&'a str, Result<Request, String>)> + 'a {
    meta.range(REQUEST_PREFIX.to_owned()..)
        .take_while(|(key, _)| key.starts_with(REQUEST_PREFIX))
        .map(|(key, value)| (key.as_str(), Request::decode(value)))
}
