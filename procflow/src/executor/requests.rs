//! Carrying out operators' requests ([`Request`]): stored first, acted on by the
//! procedures' own tasks, deleted once what they asked for is durable. See
//! [`stored::requests`](crate::stored::requests) for the life of a stored request.

use super::Executor;
use super::error::ExecutorError;
use super::hooks::WriteKind;
use super::inner::{Inner, Settled};
use crate::stored::requests::{self, Action, KEY_TRIES, REQUEST_PREFIX, Request};
use crate::{Error, ProcedureId};
use procflow_store::{Batch, StoreError};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::oneshot;

/// What became of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Handled {
    /// Done and durable, for this many procedures (0: nothing was left to do — the
    /// procedure had ended, or no procedure waited for the event).
    Done {
        /// Procedures it acted on.
        procedures: usize,
    },
    /// The procedure cannot do it (an abort past a point of no return); why.
    Refused(String),
}

impl<E: Send + Sync + 'static> Executor<E> {
    /// Carries out an operator's request durably: the request is stored first, so a
    /// crash before it is done leaves it for the next start, and it is deleted once
    /// done. Returns once it is done (an abort: once the rollback has started and is
    /// stored; a wake: once every woken procedure stored its wake-up; a bypass: once the
    /// bypassed procedures' ends are stored).
    ///
    /// # Errors
    ///
    /// [`ExecutorError::NotFound`] for a procedure the executor does not know (the
    /// request is dropped); the executor's stop reason if it stops first (the request
    /// stays stored and is carried out at the next start).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe once stored: dropping the future only stops the waiting; the request
    /// goes on. Dropped before it is stored, it never happened.
    ///
    /// # Examples
    ///
    /// ```
    /// # use procflow::prelude::*;
    /// # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
    /// # #[state_machine(procedure = Job)]
    /// # enum JobState { #[initial] #[transition(to = [Done])] Wait, #[terminal] Done }
    /// # #[derive(serde::Serialize, serde::Deserialize)]
    /// # struct Job;
    /// # impl JobStateHandlers for Job {
    /// #     async fn wait(&mut self, _: &Context<()>) -> Step<job_state::Wait> {
    /// #         Ok(Flow::suspend("never"))
    /// #     }
    /// # }
    /// use procflow::executor::{Executor, Handled, Outcome};
    /// use procflow::operator::{Action, Request};
    /// use procflow_store::MemStore;
    /// use std::sync::Arc;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let executor = Executor::builder(Arc::new(MemStore::new()), ())
    ///     .register::<JobState>()
    ///     .start()
    ///     .await?;
    /// let id = executor.submit(Job).await?;
    /// let bypass = Action::Bypass { id: id.get(), recursive: false };
    /// let handled = executor.request(Request::new(bypass, "alice", "waits for a retired host")).await?;
    /// assert_eq!(handled, Handled::Done { procedures: 1 });
    /// assert_eq!(executor.wait(id).await?, Outcome::Bypassed);
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn request(&self, request: Request) -> Result<Handled, ExecutorError> {
        self.inner.running()?;
        if let Some(id) = request.target() {
            if !self.inner.table().procs.contains_key(&id.get()) {
                return Err(ExecutorError::NotFound(id));
            }
        }
        let target = request.target().map_or(0, ProcedureId::get);
        let mut tries = 0;
        let key = loop {
            let (key, stored) = request.store();
            // Seen before it is stored: the poll must not hand it over a second time.
            self.inner.requests_seen().insert(key.clone(), false);
            let committed = self
                .inner
                .commit(target, WriteKind::Request, stored, None)
                .await;
            match committed {
                Ok(()) => break key,
                Err(error) => {
                    self.inner.requests_seen().remove(&key);
                    let taken = matches!(&error, ExecutorError::Rejected(refused)
                        if matches!(**refused, StoreError::MetaExists { .. }));
                    if !taken || tries >= KEY_TRIES {
                        return Err(error);
                    }
                    tries += 1; // Another writer took this key: take another.
                }
            }
        };
        // Carried out by a task of the executor: a dropped caller does not cancel it.
        let (reply, done) = oneshot::channel();
        let inner = Arc::clone(&self.inner);
        self.inner.tasks.spawn(async move {
            let _ = reply.send(carry_out(&inner, key, request).await);
        });
        done.await.unwrap_or(Err(ExecutorError::ShutDown))
    }
}

/// Runs until the executor stops: every `Config::request_poll`, carries out the requests
/// another process left in the store since the last look.
pub(super) async fn poll<E: Send + Sync + 'static>(inner: Arc<Inner<E>>) {
    let Some(every) = inner.config.request_poll else {
        return;
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = inner.stopping() => return,
        }
        match inner.store.meta(REQUEST_PREFIX).await {
            Ok(meta) => {
                // A concluded request is forgotten once a read no longer finds it: a read
                // from before its delete must not carry it out again.
                let mut seen = inner.requests_seen();
                seen.retain(|key, concluded| !*concluded || meta.contains_key(key));
                drop(seen);
                carry_out_stored(&inner, &meta);
            }
            Err(error) => {
                tracing::warn!(%error, "operator requests could not be read; trying again")
            }
        }
    }
}

/// Carries out every request left in the store that is not in hand already. Called at
/// start after every procedure is in the table and before any task runs (a bypassed
/// procedure must not run a step first), then by [`poll`].
pub(super) fn carry_out_stored<E: Send + Sync + 'static>(
    inner: &Arc<Inner<E>>,
    meta: &BTreeMap<String, Vec<u8>>,
) {
    for (key, request) in requests::stored(meta) {
        if inner
            .requests_seen()
            .insert(key.to_owned(), false)
            .is_some()
        {
            continue;
        }
        let request = match request {
            Ok(request) => request,
            Err(reason) => {
                tracing::warn!(key, %reason, "operator request cannot be read; left in the store");
                continue;
            }
        };
        tracing::info!(key, action = ?request.action, by = %request.by, "carrying out a stored operator request");
        let pending = hand_to_procedures(inner, &request);
        let task_inner = Arc::clone(inner);
        let key = key.to_owned();
        inner.tasks.spawn(async move {
            if let Err(error) = conclude(&task_inner, key, request, pending).await {
                tracing::warn!(%error, "stored operator request not carried out");
            }
        });
    }
}

/// Hands the request to the procedures concerned, waits until they have acted on it
/// durably, and deletes it.
async fn carry_out<E: Send + Sync + 'static>(
    inner: &Arc<Inner<E>>,
    key: String,
    request: Request,
) -> Result<Handled, ExecutorError> {
    let pending = hand_to_procedures(inner, &request);
    conclude(inner, key, request, pending).await
}

/// What the procedures will tell once they acted on a request.
enum Pending {
    Woken(Vec<oneshot::Receiver<()>>),
    Marked(Vec<oneshot::Receiver<Settled>>),
}

/// Marks the procedures concerned (and wakes them), without waiting.
fn hand_to_procedures<E>(inner: &Inner<E>, request: &Request) -> Pending {
    match &request.action {
        Action::Wake(event) => Pending::Woken(inner.wake(event)),
        Action::Abort(id) => {
            let cause = Error::fatal(format!("aborted by {}: {}", request.by, request.reason));
            Pending::Marked(hand_over(inner, &[*id], |entry| {
                entry.ask_abort(|| cause.clone());
            }))
        }
        Action::Bypass { id, recursive } => {
            let mut ids = if *recursive {
                descendants(inner, *id)
            } else {
                Vec::new()
            };
            ids.push(*id);
            let asked = (request.by.clone(), request.reason.clone());
            Pending::Marked(hand_over(inner, &ids, |entry| {
                entry.ask_bypass(|| asked.clone());
            }))
        }
    }
}

/// Waits until the procedures acted, then deletes the stored request. Concluded, it
/// stays seen until a poll no longer reads it; failed, it is forgotten (the executor
/// stops, or a later poll carries it out again).
async fn conclude<E: Send + Sync + 'static>(
    inner: &Arc<Inner<E>>,
    key: String,
    request: Request,
    pending: Pending,
) -> Result<Handled, ExecutorError> {
    let concluded = settle_and_delete(inner, key.clone(), request, pending).await;
    let mut seen = inner.requests_seen();
    if concluded.is_ok() {
        seen.insert(key, true);
    } else {
        seen.remove(&key);
    }
    concluded
}

async fn settle_and_delete<E: Send + Sync + 'static>(
    inner: &Arc<Inner<E>>,
    key: String,
    request: Request,
    pending: Pending,
) -> Result<Handled, ExecutorError> {
    let target = request.target().map_or(0, ProcedureId::get);
    let handled = match pending {
        Pending::Woken(acks) => {
            let procedures = acks.len();
            for ack in acks {
                wait_for(inner, ack).await?;
            }
            Handled::Done { procedures }
        }
        Pending::Marked(acks) => settle_all(inner, acks).await?,
    };
    if target != 0 && !inner.table().procs.contains_key(&target) {
        tracing::warn!(key, "operator request names an unknown procedure; dropped");
    }
    inner
        .commit(
            target,
            WriteKind::Request,
            Batch::new().delete_meta(key),
            None,
        )
        .await?;
    tracing::info!(action = ?request.action, by = %request.by, reason = %request.reason, ?handled, "operator request done");
    Ok(handled)
}

/// Marks each live procedure of `ids` with `mark` and wakes it; returns one receiver per
/// procedure marked, told when it acted.
fn hand_over<E>(
    inner: &Inner<E>,
    ids: &[u64],
    mark: impl Fn(&mut super::inner::Entry),
) -> Vec<oneshot::Receiver<Settled>> {
    let mut table = inner.table();
    let mut acks = Vec::new();
    for id in ids {
        let Some(entry) = table.procs.get_mut(id) else {
            continue;
        };
        if entry.info.borrow().is_finished() {
            continue;
        }
        mark(entry);
        let (ack, acked) = oneshot::channel();
        entry.ask().request_acks.push(ack);
        entry.rouse();
        acks.push(acked);
    }
    acks
}

async fn settle_all<E>(
    inner: &Inner<E>,
    acks: Vec<oneshot::Receiver<Settled>>,
) -> Result<Handled, ExecutorError> {
    let mut procedures = 0;
    let mut refused = None;
    for ack in acks {
        match wait_for(inner, ack).await? {
            Settled::Done => procedures += 1,
            Settled::Refused(why) => refused = Some(why),
        }
    }
    Ok(match refused {
        Some(why) => Handled::Refused(why),
        None => Handled::Done { procedures },
    })
}

/// Waits for one procedure to act, or for the executor to stop (the request then stays
/// in the store for the next start).
async fn wait_for<E, T>(inner: &Inner<E>, ack: oneshot::Receiver<T>) -> Result<T, ExecutorError> {
    tokio::select! {
        acked = ack => acked.map_err(|_| inner.running().err().unwrap_or(ExecutorError::ShutDown)),
        () = inner.stopping() => Err(inner.running().err().unwrap_or(ExecutorError::ShutDown)),
    }
}

/// The live descendants of `id`, deepest first.
fn descendants<E>(inner: &Inner<E>, id: u64) -> Vec<u64> {
    let table = inner.table();
    let mut children: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (&child, entry) in &table.procs {
        if let Some(parent) = entry.info.borrow().parent() {
            children.entry(parent.get()).or_default().push(child);
        }
    }
    let mut order = Vec::new();
    let mut stack = vec![id];
    while let Some(at) = stack.pop() {
        for &child in children.get(&at).into_iter().flatten() {
            if !order.contains(&child) {
                order.push(child);
                stack.push(child);
            }
        }
    }
    order.reverse();
    order.retain(|id| {
        table
            .procs
            .get(id)
            .is_some_and(|e| !e.info.borrow().is_finished())
    });
    order
}
