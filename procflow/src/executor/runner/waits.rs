//! Waiting — for locks, an event, a retry — and what cuts a wait short.
//!
//! Until a procedure is past its point of no return, an abort request or its deadline
//! ends it wherever it is: at a step boundary, or while it waits for a lock, an event,
//! children or a retry. A running step is never cancelled: it finishes, and the
//! interruption is honoured when it returns. Either way the rollback undoes the current
//! state too when its handler ran ([`Runner::acted`]), since it may have partly acted.

use super::{Exit, Runner, dormant};
use crate::executor::erased::DynProcedure;
use crate::executor::hooks::WriteKind;
use crate::executor::inner::{Asked, Inner, Settled};
use crate::executor::packed::Snapshot;
use crate::executor::status::Status;
use crate::stored::history::{StepKind, StepOutcome};
use crate::stored::record::{Envelope, Wait, now_ms};
use crate::{Error, Phase};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};

impl<E: Send + Sync + 'static> Runner<E> {
    /// Whether an abort or the deadline may still end the procedure by rolling it back:
    /// it runs forward (or its last step ended it, but the end is not recorded yet) and
    /// it is not past a point of no return.
    pub(super) fn may_roll_back(&self) -> bool {
        may_roll_back(self.procedure.as_ref(), &self.envelope)
    }

    /// Why the procedure must stop now, if it must: an abort was asked for, or its
    /// deadline passed.
    /// An operator's bypass interrupts it too, wherever it is, past a point of no return
    /// as well ([`interrupt`](Self::interrupt) then bypasses instead of rolling back).
    pub(super) fn interruption(&self) -> Option<Error> {
        // A look at the table only once the signal says a stop was asked: the table's
        // lock on every step's path was shared by all the workers (`signal.rs`).
        let (bypass, aborted) = if self.wake.may_be_asked_to_stop() {
            self.stop_requests()
        } else {
            (false, None)
        };
        if bypass {
            return Some(Error::fatal("bypassed by an operator"));
        }
        if !self.may_roll_back() {
            if aborted.is_some() && self.procedure.past_point_of_no_return() {
                self.settle_requests(&Settled::Refused(
                    "it is past its point of no return: it cannot roll back (bypass it instead)"
                        .to_owned(),
                ));
            }
            return None;
        }
        aborted.or_else(|| {
            self.envelope
                .deadline_ms
                .is_some_and(|deadline| now_ms() >= deadline)
                .then(|| timed_out(self.procedure.state()))
        })
    }

    /// Whether a bypass was asked, and the abort asked, if any: one look at the table.
    fn stop_requests(&self) -> (bool, Option<Error>) {
        match self.inner.table().procs.get(&self.id) {
            Some(entry) => entry.asked().map_or((false, None), |asked| {
                (asked.bypass_asked(), asked.abort().cloned())
            }),
            None => (false, None),
        }
    }

    /// Starts the rollback after an interruption and persists it.
    pub(super) async fn interrupt(&mut self, cause: Error) -> Result<(), Exit> {
        if self.bypass_requested() {
            return self.bypass_now().await;
        }
        // Queued for its locks: out of the queue (a grant that raced with it, given back).
        self.withdraw_lock_request();
        let state = self.procedure.state();
        tracing::info!(%cause, state, "interrupted; rolling back");
        self.note(
            state,
            StepKind::Control,
            StepOutcome::Interrupted(cause.to_string()),
        );
        self.procedure.interrupt(cause, self.acted);
        self.envelope.wait = Wait::Ready;
        self.succeeded();
        self.persist(WriteKind::Rollback).await?;
        self.settle_requests(&Settled::Done);
        Ok(())
    }

    /// Whether an operator asked to bypass it.
    pub(super) fn bypass_requested(&self) -> bool {
        let table = self.inner.table();
        table
            .procs
            .get(&self.id)
            .and_then(|entry| entry.asked())
            .is_some_and(Asked::bypass_asked)
    }

    /// Ends the procedure as bypassed, without running a handler: records who and why,
    /// writes the end, gives its locks back. Its children are not touched.
    pub(super) async fn bypass_now(&mut self) -> Result<(), Exit> {
        let asked = self
            .inner
            .table()
            .procs
            .get_mut(&self.id)
            .and_then(|entry| entry.take_bypass());
        let Some((by, reason)) = asked else {
            return Ok(());
        };
        tracing::warn!(%by, %reason, state = self.procedure.state(), "bypassed by an operator");
        let state = self.procedure.state();
        let keep = self.inner.config.history;
        self.envelope.bypass(state, &by, &reason, keep);
        self.succeeded();
        self.finish().await?;
        Err(Exit)
    }

    /// Tells the operators' requests waiting on this procedure how they ended.
    pub(super) fn settle_requests(&self, settled: &Settled) {
        settle_requests(&self.inner, self.id, settled);
    }

    /// A timer of the deadline, if the procedure has one that still applies.
    pub(super) fn deadline_timer(&self) -> Option<tokio::time::Sleep> {
        self.deadline_ms().map(|deadline| {
            tokio::time::sleep(Duration::from_millis(deadline.saturating_sub(now_ms())))
        })
    }

    /// Resolves when the deadline passes; never without one.
    pub(super) fn deadline_passes(&self) -> impl Future<Output = ()> + use<E> {
        let timer = self.deadline_timer();
        async move {
            match timer {
                Some(timer) => timer.await,
                None => std::future::pending().await,
            }
        }
    }

    /// A root's wait for a running slot (first come, first served: new submits and
    /// roused dormant procedures alike). An abort or the deadline while it is queued ends
    /// the wait without a slot (`Ok(None)`): the first turn then rolls back. Any other
    /// rouse meanwhile is for its first turn to look at: a wake of its event takes it off
    /// the event's list, children and locks are looked at afresh.
    pub(super) async fn take_slot<'a>(
        &mut self,
        running: &'a Semaphore,
    ) -> Result<Option<SemaphorePermit<'a>>, Exit> {
        let acquire = running.acquire();
        tokio::pin!(acquire);
        loop {
            if self.interruption().is_some() {
                return Ok(None);
            }
            tokio::select! {
                permit = &mut acquire => return Ok(permit.ok()),
                () = self.wake.notified() => {}
                () = self.deadline_passes() => {}
                () = self.inner.stopping() => return Err(Exit),
            }
        }
    }

    /// Whether it holds what it must before its next step: its declared locks, or none.
    pub(super) fn holds_locks(&self) -> bool {
        self.holding
            || self
                .locks
                .as_ref()
                .map_or(true, |locks| locks.locks().is_empty())
    }

    /// Takes the declared locks, or queues for them and parks until they are granted.
    /// Returns whether it holds them now: `false` when it parks, or when an abort or the
    /// deadline interrupted the wait (it is rolling back then).
    pub(super) async fn take_locks(&mut self) -> Result<bool, Exit> {
        if self.holds_locks() {
            return Ok(true);
        }
        if let Some(ticket) = self.lock_ticket {
            return self.await_locks(ticket).await;
        }
        let Ok(locks) = &self.locks else {
            return Ok(true);
        };
        let wanted = locks.locks().to_vec();
        let inner = Arc::downgrade(&self.inner);
        let id = self.id;
        let granted = Box::new(move || {
            if let Some(inner) = inner.upgrade() {
                inner.rouse(id);
            }
        });
        // Queued first come, first served; reported waiting once it is in line.
        match self
            .inner
            .locks
            .request(self.id, &self.ancestors, &wanted, granted)
        {
            None => {
                self.holding = true;
                Ok(true)
            }
            Some(ticket) => {
                self.lock_ticket = Some(ticket);
                self.publish_whole(Snapshot {
                    status: Status::WaitingForLock,
                    ..self.info()
                });
                self.park_until(self.deadline_ms());
                Ok(false)
            }
        }
    }

    /// Roused while queued for its locks: holds them if they were granted, withdraws the
    /// request and rolls back if it was interrupted, else parks again.
    async fn await_locks(&mut self, ticket: u64) -> Result<bool, Exit> {
        if let Some(cause) = self.interruption() {
            self.interrupt(cause).await?;
            return Ok(false);
        }
        if self.inner.locks.is_waiting(ticket) {
            self.park_until(self.deadline_ms());
            return Ok(false);
        }
        self.lock_ticket = None;
        self.holding = true;
        Ok(true)
    }

    /// Withdraws the lock request it queued, if any: out of the queue, or a grant that
    /// raced with the withdrawal given back.
    pub(super) fn withdraw_lock_request(&mut self) {
        if let Some(ticket) = self.lock_ticket.take() {
            self.inner.locks.withdraw(ticket);
        }
    }

    /// Parks until a retry's backoff is over; an abort or the deadline rolls back at once
    /// (see [`await_retry`](Self::await_retry)).
    pub(super) async fn retry_later(&mut self, error: Error, delay: Duration) -> Result<(), Exit> {
        tracing::debug!(%error, attempt = self.attempts, ?delay, "retrying step");
        self.last_error = Some(Box::new(error));
        self.publish();
        self.retry_at = Some(dormant::after(delay));
        self.await_retry().await
    }

    /// Suspended: parked until a wake of its event, its timeout, an abort or the
    /// deadline. The wake-up is persisted before the step runs again, and callers of
    /// `wake` waiting for that are told.
    ///
    /// A wake takes the procedure off its event's list (see [`Inner::wake`]); that is how
    /// a roused procedure tells a wake from an abort or a stale rouse.
    ///
    /// [`Inner::wake`]: crate::executor::inner::Inner::wake
    pub(super) async fn await_event(&mut self) -> Result<(), Exit> {
        let Wait::Event { name, until_ms } = self.envelope.wait.clone() else {
            return Ok(());
        };
        if let Some(cause) = self.interruption() {
            self.inner.table().stop_listening(&name, self.id);
            self.interrupt(cause).await?;
            self.ack_wakes();
            return Ok(());
        }
        let woken = !self.inner.table().is_listening(&name, self.id);
        let timed_out = until_ms.is_some_and(|until| now_ms() >= until);
        if !woken && !timed_out {
            // Out of the admission count first: its status says it waits.
            self.park_until(dormant::earliest(until_ms, self.deadline_ms()));
            self.publish();
            return Ok(());
        }
        self.inner.table().stop_listening(&name, self.id);
        self.envelope.wait = Wait::Ready;
        // Durable: a crash after this runs the step again instead of waiting for an event
        // that already came.
        self.persist(WriteKind::Suspend).await?;
        self.ack_wakes();
        Ok(())
    }

    /// Tells every `wake` caller waiting on this procedure that its wake-up is durable.
    fn ack_wakes(&self) {
        let acks = match self.inner.table().procs.get_mut(&self.id) {
            Some(entry) => entry.take_asked(|asked| &mut asked.wake_acks),
            None => return,
        };
        for ack in acks {
            let _ = ack.send(()); // A caller that stopped waiting does not mind.
        }
    }
}

/// The error a procedure whose deadline passed rolls back with.
pub(super) fn timed_out(state: &str) -> Error {
    Error::fatal(format!("procedure timed out (in step `{state}`)"))
}

/// Tells the operators' requests waiting on procedure `id` how they ended.
pub(super) fn settle_requests<E>(inner: &Inner<E>, id: u64, settled: &Settled) {
    let acks = match inner.table().procs.get_mut(&id) {
        Some(entry) => entry.take_asked(|asked| &mut asked.request_acks),
        None => return,
    };
    for ack in acks {
        let _ = ack.send(settled.clone()); // A caller that stopped waiting does not mind.
    }
}

/// Whether an abort or the deadline may still end `procedure` by rolling it back (see
/// [`Runner::may_roll_back`]).
pub(super) fn may_roll_back<E>(procedure: &dyn DynProcedure<E>, envelope: &Envelope) -> bool {
    may_roll_back_at(
        procedure.phase(),
        procedure.past_point_of_no_return(),
        envelope,
    )
}

/// [`may_roll_back`], for a procedure in `phase`, past a point of no return or not.
pub(super) fn may_roll_back_at(
    phase: &Phase,
    past_point_of_no_return: bool,
    envelope: &Envelope,
) -> bool {
    let forward = match phase {
        Phase::Running => true,
        Phase::Succeeded => envelope.finished_ms.is_none(),
        _ => false,
    };
    forward && !past_point_of_no_return
}
