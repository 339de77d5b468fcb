//! Submitting a procedure: cancel safe, one procedure per nonce, ids never reused.
//!
//! The caller's future does the parts that leave nothing behind when dropped (encoding,
//! claiming the nonce, taking an id); the write and the start happen in a task of the
//! executor, which a dropped caller does not cancel. So a submit either never happened or
//! runs to its end, and a nonce always finds the one procedure it made.

use super::SubmitOptions;
use super::error::{ExecutorError, SubmitError};
use super::hooks::WriteKind;
use super::inner::{Inner, Reservation};
use super::lazy::Lazy;
use super::runner::{self, Launch};
use crate::instance::Instance;
use crate::stored::record::{Envelope, NONCE_PREFIX, now_ms};
use crate::{Cursor, ProcedureId, StateMachine};
use procflow_store::Batch;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::{Notify, oneshot};

/// See [`Executor::submit_with`](super::Executor::submit_with).
pub(super) async fn submit<M, E>(
    inner: &Arc<Inner<E>>,
    procedure: M::Procedure,
    options: SubmitOptions,
) -> Result<ProcedureId, SubmitError>
where
    M: StateMachine<Env = E>,
    E: Send + Sync + 'static,
{
    inner.running()?;
    if !inner.registry.contains(M::NAME) {
        return Err(SubmitError::NotRegistered(M::NAME));
    }
    let instance = Instance::<M> {
        procedure,
        cursor: Cursor::new(),
    };
    let deadline_ms = options
        .timeout
        .map(|t| now_ms().saturating_add(u64::try_from(t.as_millis()).unwrap_or(u64::MAX)));
    let locks = M::locks(&instance.procedure).unwrap_or_default();
    let mut envelope = Envelope::new(options.nonce.clone(), deadline_ms, &locks);
    envelope.summary = M::describe(&instance.procedure);
    let value = envelope
        .encode(|out| crate::codec::encode_into(&instance.procedure, &instance.cursor, out))?;
    let claim = match &options.nonce {
        Some(nonce) => match claim_nonce(inner, nonce).await? {
            Claimed::Existing(id) => return Ok(ProcedureId::new(id)),
            Claimed::Mine(claim) => Some(claim),
        },
        None => None,
    };
    let (ids, reservation) = inner.allocate_ids(1).await;
    admit(inner)?;
    // Nothing is awaited from here to the spawn: the procedure counted in by `admit` is
    // always either written and started, or counted out again, by the task.
    let new = Box::new(New {
        id: ids[0],
        reservation,
        value,
        envelope,
        procedure: Box::new(Lazy::from(instance)),
        claim,
        machine: M::NAME,
    });
    let (reply, written) = oneshot::channel();
    inner.spawn(persist_and_run(Arc::clone(inner), new, reply));
    // No answer: the runtime is going away with the task.
    written
        .await
        .unwrap_or(Err(SubmitError::Executor(ExecutorError::ShutDown)))
}

/// A submitted procedure on its way to the store. Boxed: its room would stay in the
/// task's future for the procedure's whole life (an argument's room outlives its move).
struct New<E> {
    id: u64,
    reservation: Option<Reservation>,
    value: Vec<u8>,
    envelope: Envelope,
    procedure: Box<dyn super::erased::DynProcedure<E>>,
    claim: Option<NonceClaim<E>>,
    machine: &'static str,
}

/// Writes the procedure (with its nonce), answers the submit, and goes on as the
/// procedure's task; counts the procedure out if the write fails.
fn persist_and_run<E: Send + Sync + 'static>(
    inner: Arc<Inner<E>>,
    new: Box<New<E>>,
    reply: oneshot::Sender<Result<ProcedureId, SubmitError>>,
) -> impl Future<Output = ()> + Send + 'static {
    runner::run_when_ready(persist(inner, new, reply))
}

/// Writes the procedure (with its nonce) and answers the submit: what its task runs
/// next, or `None` (counted out) if the write failed.
async fn persist<E: Send + Sync + 'static>(
    inner: Arc<Inner<E>>,
    new: Box<New<E>>,
    reply: oneshot::Sender<Result<ProcedureId, SubmitError>>,
) -> Option<runner::Ready<E>> {
    let New {
        id,
        reservation,
        value,
        envelope,
        procedure,
        claim,
        machine,
    } = *new;
    let mut batch = Batch::new();
    batch.ops.extend(reservation.as_ref().map(Reservation::op));
    if let Some(nonce) = &envelope.nonce {
        batch = batch.put_meta(format!("{NONCE_PREFIX}{nonce}"), id.to_le_bytes().to_vec());
    }
    let batch = batch.put(id, None, value);
    if let Err(failed) = inner
        .commit_outcome(id, WriteKind::Submit, batch, None)
        .await
    {
        inner.live_roots.fetch_sub(1, Ordering::AcqRel);
        let error = if failed.may_have_applied {
            SubmitError::MaybeStored {
                id: ProcedureId::new(id),
                source: failed.error,
            }
        } else {
            SubmitError::Executor(failed.error)
        };
        let _ = reply.send(Err(error));
        return None;
    }
    if let Some(reservation) = reservation {
        reservation.confirm(&inner);
    }
    metrics::counter!("procflow_submitted_total", "machine" => machine).increment(1);
    let launch = Launch {
        newer: None,
        id,
        parent: None,
        ancestors: Vec::new(),
        procedure,
        envelope,
        acted: false,
        holding: false,
    };
    let wake = runner::insert_entry(&inner, &launch);
    // The nonce names the procedure once it can be waited for.
    if let Some(mut claim) = claim {
        claim.id = Some(id);
    }
    // A caller that stopped waiting does not mind: a nonce finds the procedure again.
    let _ = reply.send(Ok(ProcedureId::new(id)));
    Some((inner, launch, wake))
}

/// Counts a new root procedure in, or refuses it when the queue is full.
fn admit<E>(inner: &Inner<E>) -> Result<(), SubmitError> {
    let limit = inner
        .config
        .max_running
        .saturating_add(inner.config.queue_capacity);
    inner
        .live_roots
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
            (live < limit).then_some(live + 1)
        })
        .map(drop)
        .map_err(|live| SubmitError::QueueFull { live })
}

enum Claimed<E> {
    /// The nonce already names this procedure.
    Existing(u64),
    /// This submit makes the nonce's procedure.
    Mine(NonceClaim<E>),
}

/// A nonce being submitted. Dropped, it records the procedure's id under the nonce (if
/// it was made) and lets the submits waiting on the nonce look again.
struct NonceClaim<E> {
    inner: Arc<Inner<E>>,
    nonce: String,
    id: Option<u64>,
}

impl<E> Drop for NonceClaim<E> {
    fn drop(&mut self) {
        let mut table = self.inner.table();
        if let Some(id) = self.id {
            table.nonces.insert(self.nonce.clone(), id);
        }
        if let Some(done) = table.pending_nonces.remove(&self.nonce) {
            done.notify_waiters();
        }
    }
}

/// The procedure `nonce` names, or the right to make it; waits while another submit
/// with the same nonce is being persisted.
async fn claim_nonce<E>(inner: &Arc<Inner<E>>, nonce: &str) -> Result<Claimed<E>, SubmitError> {
    loop {
        let done = {
            let mut table = inner.table();
            if let Some(&id) = table.nonces.get(nonce) {
                return Ok(Claimed::Existing(id));
            }
            match table.pending_nonces.get(nonce) {
                Some(done) => Arc::clone(done),
                None => {
                    table
                        .pending_nonces
                        .insert(nonce.to_owned(), Arc::new(Notify::new()));
                    return Ok(Claimed::Mine(NonceClaim {
                        inner: Arc::clone(inner),
                        nonce: nonce.to_owned(),
                        id: None,
                    }));
                }
            }
        };
        let mut notified = pin!(done.notified());
        notified.as_mut().enable();
        // Still pending once registered? Then the other submit has not ended yet.
        let pending = inner
            .table()
            .pending_nonces
            .get(nonce)
            .is_some_and(|current| Arc::ptr_eq(current, &done));
        if pending {
            tokio::select! {
                () = notified => {}
                () = inner.stopping() => inner.running()?,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::runner::{SMALL_TASK, output_size};

    /// A submit's task holds the write's state, then the running procedure's, never both
    /// side by side (as one `async fn` it was 3,504 bytes for the procedure's whole life).
    #[test]
    fn a_submits_task_is_small() {
        type Args = (
            Arc<Inner<()>>,
            Box<New<()>>,
            oneshot::Sender<Result<ProcedureId, SubmitError>>,
        );
        let size = output_size(|(inner, new, reply): Args| persist_and_run(inner, new, reply));
        assert!(size <= SMALL_TASK, "a submit's task is {size} bytes");
    }
}
