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

    /// A fresh metadata key: ordered by time, then by a random 64-bit tag. Written
    /// create-only ([`Batch::create_meta`]), so of two writers that pick one key (the same
    /// millisecond, the same tag), one is refused and picks another, never overwrites.
    /// (Keys used to end in the process id: two containers, both pid 1, collided.)
    pub(crate) fn new_key(&self) -> String {
        format!(
            "{REQUEST_PREFIX}{:016x}-{:016x}",
            self.at_ms,
            fastrand::u64(..)
        )
    }

    /// The batch that stores this request under a fresh key, create-only; and the key.
    pub(crate) fn store(&self) -> (String, Batch) {
        let key = self.new_key();
        let batch = Batch::new().create_meta(key.clone(), self.encode());
        (key, batch)
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
/// The request is written create-only under a fresh key: two processes leaving requests
/// at once (even in the same millisecond) never overwrite each other's.
///
/// # Errors
///
/// The store's. One for which [`StoreError::may_have_applied`] holds leaves the request
/// possibly stored: the executor carries it out if so (an abort or bypass twice is
/// harmless; a second wake is a spurious wake).
///
/// # Cancel safety
///
/// As the store's `commit`: a dropped call may or may not have stored the request.
pub async fn leave_request(store: &dyn Store, request: &Request) -> Result<String, StoreError> {
    let mut tries = 0;
    loop {
        let (key, batch) = request.store();
        match store.commit(batch).await {
            Ok(()) => return Ok(key),
            // Another writer took this key: take another.
            Err(StoreError::MetaExists { .. }) if tries < KEY_TRIES => tries += 1,
            Err(error) => return Err(error),
        }
    }
}

/// How often a request picks a new key when its key is taken: a 64-bit random tag makes
/// even one collision unlikely.
pub(crate) const KEY_TRIES: u32 = 8;

/// The requests a store holds, oldest first, with their keys; unreadable ones with why.
pub(crate) fn stored<'a>(
    meta: &'a std::collections::BTreeMap<String, Vec<u8>>,
) -> impl Iterator<Item = (&'a str, Result<Request, String>)> + 'a {
    meta.range(REQUEST_PREFIX.to_owned()..)
        .take_while(|(key, _)| key.starts_with(REQUEST_PREFIX))
        .map(|(key, value)| (key.as_str(), Request::decode(value)))
}
