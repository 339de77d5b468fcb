//! One task per live procedure: wait for what it waits for, run a step, persist, repeat.

use super::erased::{DynProcedure, DynProgress};
use super::error::ExecutorError;
use super::hooks::WriteKind;
use super::inner::{Entry, Inner};
use super::record::{Envelope, Spawn, Wait, now_ms};
use super::status::{ProcedureInfo, Status};
use crate::locks::{Hold, Locks};
use crate::{Child, Context, Error, Phase, ProcedureId};
use futures_util::FutureExt;
use procflow_store::Batch;
use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use tracing::Instrument;

/// The task stops without touching the store again: the executor is halting or shutting
/// down (the procedure resumes at the next start).
pub(crate) struct Exit;

/// What [`launch`] needs to start a procedure's task.
pub(crate) struct Launch<E> {
    pub(crate) id: u64,
    pub(crate) parent: Option<u64>,
    /// Parent, grandparent… (for locks a child may share with its ancestors).
    pub(crate) ancestors: Vec<u64>,
    pub(crate) procedure: Box<dyn DynProcedure<E>>,
    pub(crate) envelope: Envelope,
}

/// Adds the procedure to the table (if it is not there yet) and starts its task.
pub(crate) fn launch<E: Send + Sync + 'static>(inner: &Arc<Inner<E>>, launch: Launch<E>) {
    let wake = insert_entry(inner, &launch);
    start(inner, launch, wake);
}

/// Spawns the task of a procedure whose table entry exists (`wake` is its signal).
pub(crate) fn start<E: Send + Sync + 'static>(
    inner: &Arc<Inner<E>>,
    launch: Launch<E>,
    wake: Arc<Notify>,
) {
    let span = tracing::info_span!(
        "procedure",
        id = launch.id,
        machine = launch.procedure.machine()
    );
    let runner = Runner {
        ctx: Context::new(ProcedureId::new(launch.id), Arc::clone(&inner.env)),
        inner: Arc::clone(inner),
        id: launch.id,
        parent: launch.parent,
        ancestors: launch.ancestors,
        locks: launch.procedure.locks().map_err(Error::fatal_from),
        holding: false,
        procedure: launch.procedure,
        envelope: launch.envelope,
        wake,
        attempts: 0,
        last_error: None,
    };
    inner.tasks.spawn(runner.run().instrument(span));
}

/// The table entry for a procedure, created if missing; returns its wake-up signal.
pub(crate) fn insert_entry<E>(inner: &Inner<E>, launch: &Launch<E>) -> Arc<Notify> {
    let info = launch.info();
    let mut table = inner.table();
    insert_entry_locked(&mut table, launch, info)
}

impl<E> Launch<E> {
    /// The public snapshot of the procedure about to start.
    fn info(&self) -> ProcedureInfo {
        describe(
            self.id,
            self.parent,
            self.procedure.as_ref(),
            &self.envelope,
            None,
        )
    }
}

fn insert_entry_locked<E>(
    table: &mut super::inner::Table,
    launch: &Launch<E>,
    info: ProcedureInfo,
) -> Arc<Notify> {
    let entry = table.procs.entry(launch.id).or_insert_with(|| Entry {
        info: watch::Sender::new(info),
        wake: Arc::new(Notify::new()),
        abort: false,
        nonce: launch.envelope.nonce.clone(),
        finished_ms: launch.envelope.finished_ms,
    });
    Arc::clone(&entry.wake)
}

/// Marks a finished procedure's entry live again (a child revived to roll back).
fn reopen_entry<E>(inner: &Inner<E>, launch: &Launch<E>) {
    let info = launch.info();
    let mut table = inner.table();
    match table.procs.get_mut(&launch.id) {
        Some(entry) => {
            entry.finished_ms = None;
            entry.info.send_replace(info);
        }
        None => drop(insert_entry_locked(&mut table, launch, info)),
    }
}

/// The public snapshot of a procedure.
pub(crate) fn describe<E>(
    id: u64,
    parent: Option<u64>,
    procedure: &dyn DynProcedure<E>,
    envelope: &Envelope,
    last_error: Option<&Error>,
) -> ProcedureInfo {
    // The end is reported once it is recorded (`finished_ms` is set by the `Finish`
    // write): until then a procedure whose last step ended it is still finishing.
    let ended = envelope.finished_ms.is_some();
    let (status, cause) = match (procedure.phase(), &envelope.wait) {
        (_, Wait::Children(_)) if !ended => (Status::WaitingChildren, None),
        (_, Wait::Event { name, .. }) if !ended => (
            Status::Suspended {
                event: name.clone(),
            },
            None,
        ),
        (Phase::Running, _) => (Status::Runnable, None),
        (Phase::RollingBack { cause }, _) => (Status::RollingBack, Some(cause)),
        (Phase::Succeeded, _) if !ended => (Status::Runnable, None),
        (Phase::RolledBack { cause } | Phase::Failed { cause }, _) if !ended => {
            (Status::RollingBack, Some(cause))
        }
        (Phase::Succeeded, _) => (Status::Succeeded, None),
        (Phase::RolledBack { cause }, _) => (Status::RolledBack, Some(cause)),
        (Phase::Failed { cause }, _) => (Status::Failed, Some(cause)),
    };
    ProcedureInfo {
        id: ProcedureId::new(id),
        parent: parent.map(ProcedureId::new),
        machine: procedure.machine(),
        status,
        state: procedure.state(),
        steps: procedure.steps(),
        error: cause.or(last_error).cloned(),
    }
}

struct Runner<E> {
    inner: Arc<Inner<E>>,
    id: u64,
    parent: Option<u64>,
    /// Parent, grandparent…: a child may take locks they hold.
    ancestors: Vec<u64>,
    /// What it declared (or why that failed), and whether it holds them now.
    locks: Result<Locks, Error>,
    holding: bool,
    procedure: Box<dyn DynProcedure<E>>,
    envelope: Envelope,
    ctx: Context<E>,
    wake: Arc<Notify>,
    /// Failures of the current step in a row.
    attempts: u32,
    /// The last error of a step being retried, for observers.
    last_error: Option<Error>,
}

impl<E: Send + Sync + 'static> Runner<E> {
    async fn run(mut self) {
        let inner = Arc::clone(&self.inner);
        // Only root procedures take a running slot: a child runs on its root's behalf, so a
        // full executor can never wait on children that cannot start.
        let _slot = if self.parent.is_none() {
            tokio::select! {
                permit = inner.running.acquire() => permit.ok(),
                () = inner.stopping() => return,
            }
        } else {
            None
        };
        // Locks held for life are held while the procedure waits too: take them before
        // anything else, also when it resumes suspended after a restart.
        let for_life = matches!(&self.locks, Ok(locks) if locks.hold() == Hold::ForLife);
        if !for_life || self.take_locks().await.is_ok() {
            while self.turn().await.is_ok() {}
        }
        self.release_locks();
    }

    /// One turn of the loop: finish, wait, or run one step.
    async fn turn(&mut self) -> Result<(), Exit> {
        if !self.inner.is_running() {
            return Err(Exit);
        }
        // Waits first: a step that spawned children has already moved to the state after
        // them, which may be terminal; the procedure ends only once they have.
        match &self.envelope.wait {
            Wait::Ready => {}
            Wait::Children(_) => return self.await_children().await,
            Wait::Event { .. } => return self.await_event().await,
        }
        if let Some(spawn) = self.spawn_to_undo() {
            return self.undo_children(spawn).await;
        }
        if self.procedure.phase().is_finished() {
            self.finish().await?;
            return Err(Exit);
        }
        if self.at_boundary() {
            return self.persist(WriteKind::Rollback).await;
        }
        if let (Err(error), Phase::Running) = (&self.locks, self.procedure.phase()) {
            // The procedure cannot say what it locks: it must not run a forward step.
            let error = error.clone();
            return self.on_failure(error).await;
        }
        self.take_locks().await?;
        let progress = self.run_step().await?;
        if self.inner.is_halted() {
            // Killed while the step ran: its effect happened, its result is not persisted.
            return Err(Exit);
        }
        let result = self.after_step(progress).await;
        if matches!(&self.locks, Ok(locks) if locks.hold() == Hold::PerStep) {
            self.release_locks();
        }
        result
    }

    /// Waits (parked, without a worker) until the declared locks are granted.
    async fn take_locks(&mut self) -> Result<(), Exit> {
        let Ok(locks) = &self.locks else {
            return Ok(());
        };
        if self.holding || locks.locks().is_empty() {
            return Ok(());
        }
        let acquire = self
            .inner
            .locks
            .acquire(self.id, &self.ancestors, locks.locks());
        tokio::pin!(acquire);
        // Poll once first: that queues the request (or grants it), so a procedure reported
        // waiting is already in line, first come, first served.
        let granted = tokio::select! {
            biased;
            () = &mut acquire => true,
            () = std::future::ready(()) => false,
        };
        if !granted {
            self.inner.publish(ProcedureInfo {
                status: Status::WaitingForLock,
                ..self.info()
            });
            tokio::select! {
                () = &mut acquire => {}
                () = self.inner.stopping() => return Err(Exit),
            }
        }
        self.holding = true;
        Ok(())
    }

    fn release_locks(&mut self) {
        if self.holding {
            self.inner.locks.release(self.id);
            self.holding = false;
        }
    }

    async fn after_step(&mut self, progress: DynProgress) -> Result<(), Exit> {
        match progress {
            DynProgress::Moved => {
                self.succeeded();
                if self.procedure.phase().is_finished() {
                    // The step reached a terminal state: the next turn writes it together
                    // with the end (`Finish`), one durable write instead of two. A crash
                    // before that write runs this last step again, as for any step.
                    return Ok(());
                }
                self.persist(WriteKind::Step).await
            }
            DynProgress::Spawned(children) => {
                self.succeeded();
                self.spawn(children).await
            }
            DynProgress::Suspended { event, timeout } => {
                self.succeeded();
                let until_ms = timeout.map(|t| now_ms().saturating_add(millis(t)));
                // Listen before anyone can see the procedure suspended, so a `wake` sent as
                // soon as it is reported is not lost.
                self.listen(&event);
                self.envelope.wait = Wait::Event {
                    name: event,
                    until_ms,
                };
                self.persist(WriteKind::Suspend).await
            }
            DynProgress::Yielded => {
                tokio::task::yield_now().await;
                Ok(())
            }
            DynProgress::RolledBack => {
                self.succeeded();
                self.persist(WriteKind::Rollback).await
            }
            DynProgress::Failed(error) => self.on_failure(error).await,
            DynProgress::Finished => Ok(()),
        }
    }

    fn succeeded(&mut self) {
        self.attempts = 0;
        self.last_error = None;
    }

    /// Runs the current step on a worker, catching panics and enforcing the deadline.
    async fn run_step(&mut self) -> Result<DynProgress, Exit> {
        let permit = tokio::select! {
            permit = self.inner.workers.acquire() => permit.map_err(|_| Exit)?,
            () = self.inner.stopping() => return Err(Exit),
        };
        let state = self.procedure.state();
        let machine = self.procedure.machine();
        let deadline = self.deadline();
        let started = Instant::now();
        let span = tracing::info_span!("step", state, steps = self.procedure.steps());
        let step = AssertUnwindSafe(self.procedure.step(&self.ctx))
            .catch_unwind()
            .instrument(span);
        let outcome = match deadline {
            Some(left) => tokio::time::timeout(left, step)
                .await
                .unwrap_or_else(|_| Ok(DynProgress::Failed(timed_out(state)))),
            None => step.await,
        };
        drop(permit);
        metrics::histogram!("procflow_step_seconds", "machine" => machine)
            .record(started.elapsed().as_secs_f64());
        Ok(outcome.unwrap_or_else(|panic| {
            let message = panic_message(panic.as_ref());
            tracing::error!(state, %message, "step panicked");
            DynProgress::Failed(Error::fatal(format!("step `{state}` panicked: {message}")))
        }))
    }

    /// Time left before the procedure's deadline, when it has one and can still roll back.
    fn deadline(&self) -> Option<Duration> {
        let deadline = self.envelope.deadline_ms?;
        let forward = matches!(self.procedure.phase(), Phase::Running);
        (forward && !self.procedure.past_point_of_no_return())
            .then(|| Duration::from_millis(deadline.saturating_sub(now_ms())))
    }

    /// At a step boundary: starts the rollback if an abort was asked for or the deadline
    /// passed, where rollback is still allowed. Returns whether it did.
    fn at_boundary(&mut self) -> bool {
        if !matches!(self.procedure.phase(), Phase::Running)
            || self.procedure.past_point_of_no_return()
        {
            return false;
        }
        let aborted = self
            .inner
            .table()
            .procs
            .get(&self.id)
            .is_some_and(|entry| entry.abort);
        let cause = if aborted {
            Error::fatal("aborted on request")
        } else if self.envelope.deadline_ms.is_some_and(|d| now_ms() >= d) {
            timed_out(self.procedure.state())
        } else {
            return false;
        };
        self.procedure.start_rollback(cause);
        true
    }

    async fn on_failure(&mut self, error: Error) -> Result<(), Exit> {
        self.attempts += 1;
        let config = &self.inner.config;
        if let Phase::RollingBack { cause } = self.procedure.phase() {
            if self.attempts >= config.rollback_retry.max_attempts {
                tracing::error!(%error, "rollback step keeps failing; giving up");
                let cause = cause.clone();
                self.procedure.fail(cause);
                self.attempts = 0;
                return Ok(());
            }
            let delay = config.rollback_retry.delay(self.attempts);
            return self.retry_later(error, delay).await;
        }
        let spent = self.attempts >= config.retry.max_attempts;
        let delay = config.retry.delay(self.attempts);
        match self.procedure.fail_forward(error, spent) {
            Ok(()) => {
                tracing::info!(cause = ?self.procedure.phase(), "rolling back");
                self.succeeded();
                if self.procedure.phase().is_finished() {
                    return Ok(()); // Nothing to undo: the next turn finishes.
                }
                self.persist(WriteKind::Rollback).await
            }
            Err(error) => self.retry_later(error, delay).await,
        }
    }

    async fn retry_later(&mut self, error: Error, delay: Duration) -> Result<(), Exit> {
        tracing::debug!(%error, attempt = self.attempts, ?delay, "retrying step");
        self.last_error = Some(error);
        self.publish();
        tokio::select! {
            () = tokio::time::sleep(delay) => Ok(()),
            () = self.inner.stopping() => Err(Exit),
        }
    }

    /// Persists the step's children together with this procedure, then starts them.
    async fn spawn(&mut self, children: Vec<Child>) -> Result<(), Exit> {
        if let Some(child) = children
            .iter()
            .find(|c| !self.inner.registry.contains(c.machine()))
        {
            let error = Error::fatal(format!(
                "child machine `{}` is not registered with this executor",
                child.machine()
            ));
            return self.on_failure(error).await;
        }
        // The children are written in one batch with this step (plus an id reservation).
        if let Some(limit) = self.inner.store.limits().max_ops_per_batch
            && children.len() + 2 > limit
        {
            let error = Error::fatal(format!(
                "a step may start at most {} children on this store (one atomic batch holds \
                 {limit} operations); {} were asked for",
                limit.saturating_sub(2),
                children.len()
            ));
            return self.on_failure(error).await;
        }
        let count = u64::try_from(children.len()).unwrap_or(u64::MAX);
        let (ids, reservation) = self.inner.allocate_ids(count);
        self.envelope.wait = Wait::Children(ids.clone());
        self.envelope.spawns.push(Spawn {
            depth: self.procedure.completed_len(),
            children: ids.clone(),
        });
        let mut batch = Batch::new();
        batch.ops.extend(reservation);
        let mut batch = batch.put(self.id, self.parent, self.encode()?);
        let child_envelope = Envelope::new(None, None);
        let mut launches = Vec::with_capacity(children.len());
        for (child, id) in children.iter().zip(&ids) {
            let value = child_envelope
                .encode(|mut out| {
                    out.extend_from_slice(child.snapshot());
                    Ok(out)
                })
                .map_err(|_| Exit)?;
            batch = batch.put(*id, Some(self.id), value);
            let procedure = self
                .inner
                .registry
                .load(child.snapshot())
                .map_err(|_| Exit)?;
            let mut ancestors = vec![self.id];
            ancestors.extend(&self.ancestors);
            launches.push(Launch {
                id: *id,
                parent: Some(self.id),
                ancestors,
                procedure,
                envelope: child_envelope.clone(),
            });
        }
        self.commit(WriteKind::Spawn, batch).await?;
        // Entries first, so the parent never looks for a child that is not in the table.
        for launch in &launches {
            insert_entry(&self.inner, launch);
        }
        for child in launches {
            launch(&self.inner, child);
        }
        self.publish();
        Ok(())
    }

    async fn await_children(&mut self) -> Result<(), Exit> {
        let Wait::Children(ids) = &self.envelope.wait else {
            return Ok(());
        };
        self.publish();
        if self.undoing() {
            return self.await_children_undone().await;
        }
        let verdict = children_verdict(&self.inner, ids);
        match verdict {
            None => {
                tokio::select! {
                    () = self.wake.notified() => Ok(()),
                    () = self.inner.stopping() => Err(Exit),
                }
            }
            Some(Ok(())) => {
                self.envelope.wait = Wait::Ready;
                Ok(())
            }
            Some(Err(cause)) => {
                self.envelope.wait = Wait::Ready;
                self.procedure.start_rollback(cause);
                self.persist(WriteKind::Rollback).await
            }
        }
    }

    /// Whether the procedure is undoing its work (children included) and has not ended.
    fn undoing(&self) -> bool {
        match self.procedure.phase() {
            Phase::RollingBack { .. } => true,
            Phase::RolledBack { .. } => self.envelope.finished_ms.is_none(),
            _ => false,
        }
    }

    /// The newest spawn whose children must be undone before the next rollback step.
    fn spawn_to_undo(&self) -> Option<usize> {
        if !self.undoing() {
            return None;
        }
        let floor = self.procedure.rollback_floor();
        let newest = self.envelope.spawns.iter().rposition(|s| s.depth > floor)?;
        Some(newest)
    }

    /// Revives the spawn's children that succeeded, in rollback, atomically with this
    /// procedure now waiting for them; children that failed already undid themselves.
    async fn undo_children(&mut self, spawn: usize) -> Result<(), Exit> {
        let spawn = self.envelope.spawns.remove(spawn);
        let cause = match self.procedure.phase() {
            Phase::RollingBack { cause } | Phase::RolledBack { cause } => cause.clone(),
            _ => return Ok(()),
        };
        let mut batch = Batch::new();
        let mut revived = Vec::new();
        for id in spawn.children {
            let succeeded = self
                .inner
                .table()
                .procs
                .get(&id)
                .is_some_and(|entry| entry.info.borrow().status == Status::Succeeded);
            if !succeeded {
                continue;
            }
            let Some(mut child) = self.revive(id, &cause).await? else {
                continue;
            };
            let value = child
                .envelope
                .encode(|out| child.procedure.encode_into(out))
                .map_err(|_| Exit)?;
            batch = batch.put(id, Some(self.id), value);
            child.ancestors = std::iter::once(self.id)
                .chain(self.ancestors.iter().copied())
                .collect();
            revived.push(child);
        }
        if !revived.is_empty() {
            self.envelope.wait = Wait::Children(revived.iter().map(|c| c.id).collect());
        }
        let batch = batch.put(self.id, self.parent, self.encode()?);
        self.commit(WriteKind::Rollback, batch).await?;
        for child in revived {
            reopen_entry(&self.inner, &child);
            launch(&self.inner, child);
        }
        self.publish();
        Ok(())
    }

    /// A finished child, read back from the store and set to roll back after `cause`.
    async fn revive(&mut self, id: u64, cause: &Error) -> Result<Option<Launch<E>>, Exit> {
        let record = match self.inner.store.get(id).await {
            Ok(Some(record)) => record,
            Ok(None) => return Ok(None),
            Err(error) => {
                self.inner
                    .halt(super::ExecutorError::Store(Arc::new(error)));
                return Err(Exit);
            }
        };
        let Ok((mut envelope, snapshot)) = Envelope::decode(&record.value) else {
            tracing::warn!(child = id, "cannot read child to roll it back; skipped");
            return Ok(None);
        };
        let Ok(mut procedure) = self.inner.registry.load(snapshot) else {
            tracing::warn!(child = id, "cannot load child to roll it back; skipped");
            return Ok(None);
        };
        procedure.start_rollback(cause.clone());
        envelope.finished_ms = None;
        envelope.wait = Wait::Ready;
        Ok(Some(Launch {
            id,
            parent: Some(self.id),
            ancestors: Vec::new(),
            procedure,
            envelope,
        }))
    }

    /// While undoing: waits until every revived child has ended. A child whose rollback
    /// failed leaves the work half undone: this procedure ends failed too.
    async fn await_children_undone(&mut self) -> Result<(), Exit> {
        let Wait::Children(ids) = &self.envelope.wait else {
            return Ok(());
        };
        let ended: Option<bool> = {
            let table = self.inner.table();
            let mut all_rolled_back = true;
            let mut pending = false;
            for id in ids {
                match table.procs.get(id).map(|e| e.info.borrow().status.clone()) {
                    Some(Status::RolledBack) => {}
                    Some(Status::Failed) => all_rolled_back = false,
                    Some(_) => pending = true,
                    None => all_rolled_back = false,
                }
            }
            (!pending).then_some(all_rolled_back)
        };
        match ended {
            None => tokio::select! {
                () = self.wake.notified() => Ok(()),
                () = self.inner.stopping() => Err(Exit),
            },
            Some(all_rolled_back) => {
                self.envelope.wait = Wait::Ready;
                if !all_rolled_back {
                    if let Phase::RollingBack { cause } | Phase::RolledBack { cause } =
                        self.procedure.phase()
                    {
                        let cause = cause.clone();
                        self.procedure.fail(cause);
                    }
                }
                Ok(())
            }
        }
    }

    async fn await_event(&mut self) -> Result<(), Exit> {
        let Wait::Event { name, until_ms } = self.envelope.wait.clone() else {
            return Ok(());
        };
        self.listen(&name);
        self.publish();
        let timer = async {
            match until_ms {
                Some(until) => {
                    tokio::time::sleep(Duration::from_millis(until.saturating_sub(now_ms()))).await;
                }
                None => std::future::pending().await,
            }
        };
        let woken = tokio::select! {
            () = self.wake.notified() => true,
            () = timer => true,
            () = self.inner.stopping() => false,
        };
        self.stop_listening(&name);
        if !woken {
            return Err(Exit);
        }
        self.envelope.wait = Wait::Ready;
        // The wake-up is durable once persisted: a crash after this runs the step again
        // instead of waiting for an event that already came.
        self.persist(WriteKind::Suspend).await
    }

    fn stop_listening(&self, event: &str) {
        let mut table = self.inner.table();
        if let Some(waiting) = table.events.get_mut(event) {
            waiting.remove(&self.id);
            if waiting.is_empty() {
                table.events.remove(event);
            }
        }
    }

    /// Registers the procedure as waiting for `event` (once).
    fn listen(&self, event: &str) {
        let mut table = self.inner.table();
        match table.events.get_mut(event) {
            Some(waiting) => drop(waiting.insert(self.id)),
            None => drop(
                table
                    .events
                    .insert(event.to_owned(), BTreeSet::from([self.id])),
            ),
        }
    }

    async fn finish(&mut self) -> Result<(), Exit> {
        self.envelope.finished_ms = Some(now_ms());
        self.envelope.wait = Wait::Ready;
        let value = self.encode()?;
        self.commit(WriteKind::Finish, Batch::new().finish(self.id, value))
            .await?;
        self.release_locks();
        let info = self.info();
        let counter = match info.status {
            Status::Succeeded => "procflow_succeeded_total",
            Status::RolledBack => "procflow_rolled_back_total",
            _ => "procflow_failed_total",
        };
        metrics::counter!(counter, "machine" => info.machine).increment(1);
        tracing::info!(status = ?info.status, steps = info.steps, "procedure finished");
        // The slot is free before anyone can see the end: a caller woken by `wait` may
        // submit at once.
        if self.parent.is_none() {
            self.inner.live_roots.fetch_sub(1, Ordering::AcqRel);
        }
        let mut table = self.inner.table();
        if let Some(entry) = table.procs.get_mut(&self.id) {
            entry.finished_ms = self.envelope.finished_ms;
            entry.info.send_replace(info);
        }
        if let Some(parent) = self.parent.and_then(|parent| table.procs.get(&parent)) {
            parent.wake.notify_one();
        }
        Ok(())
    }

    async fn persist(&mut self, kind: WriteKind) -> Result<(), Exit> {
        let value = self.encode()?;
        self.commit(kind, Batch::new().put(self.id, self.parent, value))
            .await?;
        self.publish();
        Ok(())
    }

    // `&mut self`: a shared `&Runner` is not `Send` (the boxed procedure is not `Sync`).
    async fn commit(&mut self, kind: WriteKind, batch: Batch) -> Result<(), Exit> {
        match self.inner.commit(self.id, kind, batch).await {
            Ok(()) => Ok(()),
            Err(ExecutorError::Rejected(error)) => {
                // Its new state cannot be stored: stop it at its last persisted step
                // (where a restart would resume it) and say so, rather than run on
                // unpersisted.
                tracing::error!(%error, "procedure state refused by the store; procedure stopped");
                self.inner.publish(ProcedureInfo {
                    status: Status::Failed,
                    error: Some(Error::fatal(format!(
                        "cannot persist this procedure: {error}"
                    ))),
                    ..self.info()
                });
                Err(Exit)
            }
            Err(_) => Err(Exit),
        }
    }

    fn encode(&self) -> Result<Vec<u8>, Exit> {
        self.envelope
            .encode(|out| self.procedure.encode_into(out))
            .map_err(|error| {
                // The data cannot be written, so the step cannot be made durable: stop this
                // procedure where it is rather than run steps that would be lost.
                tracing::error!(%error, "cannot persist procedure; it stays at its last persisted step");
                Exit
            })
    }

    fn info(&self) -> ProcedureInfo {
        describe(
            self.id,
            self.parent,
            self.procedure.as_ref(),
            &self.envelope,
            self.last_error.as_ref(),
        )
    }

    fn publish(&self) {
        self.inner.publish(self.info());
    }
}

/// `None` while some child runs; `Ok` when all succeeded; the first failure otherwise
/// (its original error, which the parent keeps).
fn children_verdict<E>(inner: &Inner<E>, ids: &[u64]) -> Option<Result<(), Error>> {
    let table = inner.table();
    let mut pending = false;
    for id in ids {
        let Some(entry) = table.procs.get(id) else {
            return Some(Err(Error::fatal(format!(
                "child #{id} could not be loaded"
            ))));
        };
        let info = entry.info.borrow();
        match info.status {
            Status::Succeeded => {}
            Status::RolledBack | Status::Failed => {
                let error = info.error.clone();
                return Some(Err(
                    error.unwrap_or_else(|| Error::fatal(format!("child #{id} failed")))
                ));
            }
            _ => pending = true,
        }
    }
    (!pending).then_some(Ok(()))
}

fn timed_out(state: &str) -> Error {
    Error::fatal(format!("procedure timed out (in step `{state}`)"))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}
