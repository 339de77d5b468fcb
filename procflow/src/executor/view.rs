//! The executor's live view of what it stores: the records of [`operator`](crate::operator)
//! with the status, trouble and locks only the running executor knows.

use super::error::ExecutorError;
use super::{Executor, Status};
use crate::ProcedureId;
#[cfg(feature = "admin")]
use crate::operator::graph::MACHINE_PREFIX;
use crate::operator::{Catalog, ProcedureRecord};
use std::collections::HashSet;
use std::sync::Arc;

impl<E: Send + Sync + 'static> Executor<E> {
    /// Every procedure in the store, as [`Catalog::load`] reads it, with the live status,
    /// trouble and locks of those this executor runs.
    ///
    /// # Errors
    ///
    /// [`ExecutorError::Store`] if the store cannot be read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn catalog(&self) -> Result<Catalog, ExecutorError> {
        let mut catalog = Catalog::load(self.inner.store.as_ref())
            .await
            .map_err(|e| ExecutorError::Store(Arc::new(e)))?;
        let live = self.live_locks();
        for record in catalog.records_mut() {
            self.overlay(record, &live);
        }
        Ok(catalog)
    }

    /// Procedure `id`'s record ([`ProcedureRecord`]), live. `None` if the store does not
    /// hold it.
    ///
    /// # Errors
    ///
    /// [`ExecutorError::Store`] if the store cannot be read, [`ExecutorError::Metadata`]
    /// if the record cannot be decoded.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn record(&self, id: ProcedureId) -> Result<Option<ProcedureRecord>, ExecutorError> {
        let stored = self.inner.store.get(id.get()).await;
        let Some(stored) = stored.map_err(|e| ExecutorError::Store(Arc::new(e)))? else {
            return Ok(None);
        };
        let mut record =
            ProcedureRecord::from_record(&stored).map_err(|reason| ExecutorError::Metadata {
                key: format!("procedure #{id}: {reason}"),
            })?;
        record.children = {
            let table = self.inner.table();
            let children = table.procs.iter().filter_map(|(child, entry)| {
                (entry.info.borrow().parent == Some(id)).then_some(ProcedureId::new(*child))
            });
            children.collect()
        };
        record.children.sort();
        self.overlay(&mut record, &self.live_locks());
        Ok(Some(record))
    }

    /// Procedure `id`'s record with its machine's graph, as a one-record [`Catalog`] (to
    /// draw its diagram): two reads by key, never the whole store. `None` if the store
    /// does not hold it.
    #[cfg(feature = "admin")]
    pub(crate) async fn one(&self, id: ProcedureId) -> Result<Option<Catalog>, ExecutorError> {
        let Some(record) = self.record(id).await? else {
            return Ok(None);
        };
        let key = format!("{MACHINE_PREFIX}{}", record.machine);
        let graph = self.inner.store.meta(&key).await;
        let graph = graph.map_err(|e| ExecutorError::Store(Arc::new(e)))?;
        // The prefix also matches a machine whose name extends this one's: `of_one` keeps
        // the graph of this machine only.
        Ok(Some(Catalog::of_one(record, &graph)))
    }

    /// Holders and waiters in the lock table.
    fn live_locks(&self) -> (HashSet<u64>, HashSet<u64>) {
        let holders = self.inner.locks.holders().into_iter().map(|(id, _)| id);
        (
            holders.collect(),
            self.inner.locks.waiters().into_iter().collect(),
        )
    }

    /// Replaces what the store cannot know with what the executor knows now.
    fn overlay(
        &self,
        record: &mut ProcedureRecord,
        (holders, waiters): &(HashSet<u64>, HashSet<u64>),
    ) {
        let id = record.id.get();
        let info = match self.inner.table().procs.get(&id) {
            Some(entry) => entry.info.borrow().clone(),
            None => return,
        };
        if let Status::Stuck {
            attempts, error, ..
        } = &info.status
        {
            record.attempts = *attempts;
            record.last_error = Some(error.to_string());
        }
        record.status = info.status;
        record.holds_locks = holders.contains(&id);
        record.waits_for_locks = waiters.contains(&id);
    }
}
