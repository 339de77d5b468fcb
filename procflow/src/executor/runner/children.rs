//! Children: started with the step that asks for them, waited for, stopped and undone.
//!
//! A parent whose child fails (or that is aborted or times out while its children run)
//! does not roll back at once: it asks the children still running to stop (they are
//! aborted at their next step boundary and roll themselves back), waits until every
//! child of the spawn has ended, and only then starts its own rollback. That rollback
//! undoes the children that succeeded before it undoes the state that spawned them.

use super::{Exit, Launch, Runner, insert_entry, launch};
use crate::executor::hooks::WriteKind;
use crate::executor::inner::{Inner, Reservation, Table};
use crate::executor::packed::PackedInfo;
use crate::executor::status::Status;
use crate::stored::record::{Envelope, Spawn, Wait};
use crate::{Child, Error, Phase};
use procflow_store::Batch;

/// Where the children of one spawn stand.
struct Verdict {
    /// Still live.
    pending: Vec<u64>,
    /// The first failure among those that ended (its original error, which the parent
    /// keeps).
    failure: Option<Error>,
}

impl<E: Send + Sync + 'static> Runner<E> {
    /// Persists the step's children together with this procedure, then starts them.
    pub(super) async fn spawn(&mut self, children: Vec<Child>) -> Result<(), Exit> {
        if let Some(error) = self.spawn_refusal(&children) {
            return self.on_failure(error).await;
        }
        let count = u64::try_from(children.len()).unwrap_or(u64::MAX);
        let (ids, reservation) = self.inner.allocate_ids(count).await;
        self.envelope.wait = Wait::Children(ids.clone());
        self.envelope.spawns.push(Spawn {
            depth: self.procedure.completed_len(),
            children: ids.clone(),
        });
        let mut batch = Batch::new();
        batch.ops.extend(reservation.as_ref().map(Reservation::op));
        let mut batch = batch.put(self.id, self.parent, self.encode().await?);
        let mut launches = Vec::with_capacity(children.len());
        for (child, id) in children.iter().zip(&ids) {
            let procedure = self
                .inner
                .registry
                .load(child.snapshot())
                .map_err(|_| Exit)?;
            let locks = procedure.locks().and_then(Result::ok).unwrap_or_default();
            let mut envelope = Envelope::new(None, None, &locks);
            envelope.summary = procedure.describe().flatten();
            let value = envelope
                .encode(|mut out| {
                    out.extend_from_slice(child.snapshot());
                    Ok(out)
                })
                .map_err(|_| Exit)?;
            batch = batch.put(*id, Some(self.id), value);
            launches.push(Launch {
                id: *id,
                parent: Some(self.id),
                ancestors: self.lineage(),
                procedure,
                envelope,
                acted: false,
                holding: false,
                newer: None,
            });
        }
        self.commit(WriteKind::Spawn, batch).await?;
        if let Some(reservation) = reservation {
            reservation.confirm(&self.inner);
        }
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

    /// Why these children cannot be started here, if they cannot.
    fn spawn_refusal(&self, children: &[Child]) -> Option<Error> {
        if let Some(child) = children
            .iter()
            .find(|c| !self.inner.registry.contains(c.machine()))
        {
            return Some(Error::fatal(format!(
                "child machine `{}` is not registered with this executor",
                child.machine()
            )));
        }
        // The children are written in one batch with this step (and an id reservation).
        let limit = self.inner.store.limits().max_ops_per_batch?;
        (children.len() + 2 > limit).then(|| {
            Error::fatal(format!(
                "a step may start at most {} children on this store (one atomic batch holds \
                 {limit} operations); {} were asked for",
                limit.saturating_sub(2),
                children.len()
            ))
        })
    }

    /// This procedure and its ancestors: the ancestors of its children.
    fn lineage(&self) -> Vec<u64> {
        std::iter::once(self.id)
            .chain(self.ancestors.iter().copied())
            .collect()
    }

    /// Waits until every child of the spawn has ended. A failure of one of them (or an
    /// abort or the deadline of this procedure) stops the others first.
    pub(super) async fn await_children(&mut self) -> Result<(), Exit> {
        let Wait::Children(ids) = &self.envelope.wait else {
            return Ok(());
        };
        let ids = ids.clone();
        self.publish();
        if self.bypass_requested() {
            return self.bypass_now().await; // Its children go on.
        }
        if self.undoing() {
            return self.await_children_undone(&ids).await;
        }
        let verdict = verdict(&self.inner.table(), &ids);
        let cause = self
            .stopping_children
            .as_deref()
            .cloned()
            .or(verdict.failure)
            .or_else(|| self.interruption());
        if verdict.pending.is_empty() {
            self.envelope.wait = Wait::Ready;
            self.stopping_children = None;
            let Some(cause) = cause else {
                return Ok(());
            };
            // The state after the children has not run: only completed states are undone.
            self.procedure.start_rollback(cause);
            return self.persist(WriteKind::Rollback).await;
        }
        match cause {
            Some(cause) => {
                if self.stopping_children.is_none() {
                    tracing::info!(%cause, children = ?verdict.pending, "stopping the children still running");
                    stop_children(&self.inner, &verdict.pending, &cause);
                    self.stopping_children = Some(Box::new(cause));
                }
                // Roused as each of them ends.
                self.park_until(None);
                Ok(())
            }
            None => {
                self.park_until(self.deadline_ms());
                Ok(())
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
    pub(super) fn spawn_to_undo(&self) -> Option<usize> {
        if !self.undoing() {
            return None;
        }
        let floor = self.procedure.rollback_floor();
        let newest = self.envelope.spawns.iter().rposition(|s| s.depth > floor)?;
        Some(newest)
    }

    /// Revives the spawn's children that succeeded, in rollback, atomically with this
    /// procedure now waiting for them; children that rolled back already undid
    /// themselves. A child that cannot be found or read is waited for too: the wait then
    /// ends this procedure failed, naming it.
    pub(super) async fn undo_children(&mut self, spawn: usize) -> Result<(), Exit> {
        let spawn = self.envelope.spawns.remove(spawn);
        let cause = match self.procedure.phase() {
            Phase::RollingBack { cause } | Phase::RolledBack { cause } => cause.clone(),
            _ => return Ok(()),
        };
        let mut batch = Batch::new();
        let mut revived = Vec::new();
        let mut waits = Vec::new();
        for id in spawn.children {
            let status = self
                .inner
                .table()
                .procs
                .get(&id)
                .map(|entry| entry.info.borrow().status().into_owned());
            match status {
                Some(Status::Succeeded) => {}
                Some(_) => continue, // It rolled back (or failed to) on its own.
                None => {
                    tracing::error!(child = id, "child to undo is not in the executor");
                    waits.push(id);
                    continue;
                }
            }
            waits.push(id);
            let Some(mut child) = self.revive(id, &cause).await? else {
                continue;
            };
            let value = child
                .envelope
                .encode(|out| child.procedure.encode_into(out))
                .map_err(|_| Exit)?;
            batch = batch.put(id, Some(self.id), value);
            child.ancestors = self.lineage();
            revived.push(child);
        }
        if !waits.is_empty() {
            self.envelope.wait = Wait::Children(waits);
        }
        let batch = batch.put(self.id, self.parent, self.encode().await?);
        self.commit(WriteKind::Rollback, batch).await?;
        for child in revived {
            reopen_entry(&self.inner, &child);
            launch(&self.inner, child);
        }
        self.publish();
        Ok(())
    }

    /// A finished child, read back from the store and set to roll back after `cause`;
    /// `None` (logged) when it cannot be read.
    async fn revive(&mut self, id: u64, cause: &Error) -> Result<Option<Launch<E>>, Exit> {
        let read = self.read_back(id).await?.map(|parts| {
            // Decoded now: a child whose data no longer decodes is reported here, and its
            // parent fails naming it, rather than once its rollback step runs.
            parts.and_then(|(envelope, mut procedure)| match procedure.decode() {
                Ok(()) => Ok((envelope, procedure)),
                Err(error) => Err(error.to_string()),
            })
        });
        let (mut envelope, mut procedure) = match read {
            Some(Ok(parts)) => parts,
            Some(Err(reason)) => {
                tracing::error!(child = id, %reason, "child to undo cannot be read");
                return Ok(None);
            }
            None => {
                tracing::error!(child = id, "child to undo is not in the store");
                return Ok(None);
            }
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
            acted: false,
            holding: false,
            newer: None,
        }))
    }

    /// While undoing: waits until every revived child has ended. A child whose rollback
    /// failed leaves the work half undone: this procedure ends failed too, as it does,
    /// naming the child, when a child to undo could not be found or read.
    async fn await_children_undone(&mut self, ids: &[u64]) -> Result<(), Exit> {
        let mut pending = false;
        let mut rollback_failed = false;
        let mut missing = Vec::new();
        {
            let table = self.inner.table();
            for &id in ids {
                match table
                    .procs
                    .get(&id)
                    .map(|e| e.info.borrow().status().into_owned())
                {
                    Some(Status::RolledBack) => {}
                    Some(Status::Failed) => rollback_failed = true,
                    // Never revived: it could not be read back.
                    Some(Status::Succeeded) | None => missing.push(id),
                    Some(_) => pending = true,
                }
            }
        }
        if pending {
            self.park_until(None);
            return Ok(());
        }
        self.envelope.wait = Wait::Ready;
        let (Phase::RollingBack { cause } | Phase::RolledBack { cause }) = self.procedure.phase()
        else {
            return Ok(());
        };
        let cause = cause.clone();
        if !missing.is_empty() {
            let ids: Vec<String> = missing.iter().map(|id| format!("#{id}")).collect();
            self.procedure.fail(Error::fatal(format!(
                "rollback incomplete: child {} cannot be found to undo it (rolling back \
                 after: {cause})",
                ids.join(", ")
            )));
        } else if rollback_failed {
            self.procedure.fail(cause);
        }
        Ok(())
    }
}

/// Where the children `ids` stand.
fn verdict(table: &Table, ids: &[u64]) -> Verdict {
    let mut verdict = Verdict {
        pending: Vec::new(),
        failure: None,
    };
    for &id in ids {
        let Some(entry) = table.procs.get(&id) else {
            verdict
                .failure
                .get_or_insert_with(|| Error::fatal(format!("child #{id} could not be loaded")));
            continue;
        };
        let info = entry.info.borrow();
        match &*info.status() {
            // A bypassed child lets its parent go on (HBCK2's bypass).
            Status::Succeeded | Status::Bypassed => {}
            Status::RolledBack | Status::Failed => {
                let error = info.error().cloned();
                verdict.failure.get_or_insert_with(|| {
                    error.unwrap_or_else(|| Error::fatal(format!("child #{id} failed")))
                });
            }
            _ => verdict.pending.push(id),
        }
    }
    verdict
}

/// Asks the children still running to stop: each rolls back at its next step boundary
/// (or wait) with `cause`, the failure that stops their parent. A child past its point
/// of no return cannot roll back and runs to its end.
fn stop_children<E>(inner: &Inner<E>, ids: &[u64], cause: &Error) {
    let mut table = inner.table();
    for id in ids {
        if let Some(entry) = table.procs.get_mut(id) {
            entry.ask_abort(|| cause.clone());
            entry.rouse();
        }
    }
}

/// Marks a finished procedure's entry live again (a child revived to roll back).
fn reopen_entry<E>(inner: &Inner<E>, launch: &Launch<E>) {
    let info = launch.info();
    let mut table = inner.table();
    match table.procs.get_mut(&launch.id) {
        Some(entry) => {
            entry.finished_ms = None;
            entry.take_abort();
            entry.info.send_replace(PackedInfo::of(info));
            table.noted(launch.id);
        }
        None => drop(super::insert_entry_locked(&mut table, launch, || {
            PackedInfo::of(info)
        })),
    }
}
