//! An election among candidates in one process: for tests, examples, and several
//! executors of one process that share a store.

use super::election::{Election, ElectionError, Term};
use procflow_store::BoxFuture;
use std::sync::Arc;
use tokio::sync::watch;

/// Who leads, as every candidate sees it.
#[derive(Clone, Debug, Default)]
struct State {
    /// (candidate, its address, its term).
    leader: Option<(u64, String, Term)>,
    /// The last token handed out.
    last_token: u64,
}

/// An in-process election: each [`candidate`](Self::candidate) is one member of an
/// executor group. Terms get tokens 1, 2, 3…; [`depose`](Self::depose) ends the current
/// term as a lost lease would.
///
/// # Examples
///
/// ```
/// use procflow::group::{Election, LocalElection};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let election = LocalElection::new();
/// let a = election.candidate("10.0.0.1:7000");
/// let b = election.candidate("10.0.0.2:7000");
/// let term = a.campaign().await.unwrap();
/// assert_eq!(term.token, 1);
/// assert_eq!(b.leader().await.unwrap().as_deref(), Some("10.0.0.1:7000"));
/// a.resign(term).await.unwrap();
/// assert_eq!(b.campaign().await.unwrap().token, 2);
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct LocalElection {
    state: Arc<watch::Sender<State>>,
}

impl Default for LocalElection {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalElection {
    /// An election nobody leads yet.
    #[must_use]
    pub fn new() -> Self {
        Self {
            state: Arc::new(watch::Sender::new(State::default())),
        }
    }

    /// A new candidate advertising `address`.
    #[must_use]
    pub fn candidate(&self, address: impl Into<String>) -> LocalCandidate {
        LocalCandidate {
            election: self.clone(),
            id: next_candidate_id(),
            address: address.into(),
        }
    }

    /// Ends the current term, as if its leader had lost its lease.
    pub fn depose(&self) {
        self.state.send_modify(|state| state.leader = None);
    }

    /// The current term's token, if someone leads.
    #[must_use]
    pub fn current(&self) -> Option<Term> {
        self.state
            .borrow()
            .leader
            .as_ref()
            .map(|(_, _, term)| *term)
    }
}

/// Candidates of every election get distinct ids, so one can never be taken for another.
fn next_candidate_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One member of a [`LocalElection`].
#[derive(Clone, Debug)]
pub struct LocalCandidate {
    election: LocalElection,
    id: u64,
    address: String,
}

impl LocalCandidate {
    fn leads(&self, state: &State, term: Term) -> bool {
        matches!(&state.leader, Some((id, _, t)) if *id == self.id && *t == term)
    }
}

impl Election for LocalCandidate {
    fn campaign(&self) -> BoxFuture<'_, Result<Term, ElectionError>> {
        Box::pin(async move {
            let mut changes = self.election.state.subscribe();
            loop {
                let mut won = None;
                self.election.state.send_if_modified(|state| {
                    if state.leader.is_some() {
                        return false;
                    }
                    state.last_token += 1;
                    let term = Term {
                        token: state.last_token,
                    };
                    state.leader = Some((self.id, self.address.clone(), term));
                    won = Some(term);
                    true
                });
                if let Some(term) = won {
                    return Ok(term);
                }
                changes
                    .changed()
                    .await
                    .map_err(|_| ElectionError::new("the election is gone"))?;
            }
        })
    }

    fn lost(&self, term: Term) -> BoxFuture<'_, ElectionError> {
        Box::pin(async move {
            let mut changes = self.election.state.subscribe();
            // The sender lives as long as this candidate's election: `wait_for` ends.
            let _ = changes.wait_for(|state| !self.leads(state, term)).await;
            ElectionError::new(format!("term {} ended (resigned or deposed)", term.token))
        })
    }

    fn resign(&self, term: Term) -> BoxFuture<'_, Result<(), ElectionError>> {
        Box::pin(async move {
            self.election.state.send_if_modified(|state| {
                let leads = self.leads(state, term);
                if leads {
                    state.leader = None;
                }
                leads
            });
            Ok(())
        })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<String>, ElectionError>> {
        let leader = self
            .election
            .state
            .borrow()
            .leader
            .as_ref()
            .map(|(_, address, _)| address.clone());
        Box::pin(async move { Ok(leader) })
    }
}
