//! The executor's live view of what it stores: the records of [`operator`](crate::operator)
//! with the status, trouble and locks only the running executor knows.

use super::error::ExecutorError;
#[cfg(feature = "admin")]
use super::packed::PackedInfo;
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
        let Some(mut record) = self.record_alone(id).await? else {
            return Ok(None);
        };
        record.children = {
            let table = self.inner.table();
            let children = table.procs.iter().filter_map(|(child, entry)| {
                (entry.info.borrow().parent() == Some(id)).then_some(ProcedureId::new(*child))
            });
            children.collect()
        };
        record.children.sort();
        Ok(Some(record))
    }

    /// [`record`](Self::record) without its children (finding them scans the table).
    pub(crate) async fn record_alone(
        &self,
        id: ProcedureId,
    ) -> Result<Option<ProcedureRecord>, ExecutorError> {
        Ok(self.stored_record(id).await?.map(|(record, _)| record))
    }

    /// [`record_alone`](Self::record_alone), with the procedure's data as the admin
    /// shows it (decoded from the same read).
    #[cfg(feature = "admin")]
    pub(crate) async fn record_and_data(
        &self,
        id: ProcedureId,
    ) -> Result<Option<(ProcedureRecord, crate::admin::data::Shown)>, ExecutorError> {
        let Some((record, stored)) = self.stored_record(id).await? else {
            return Ok(None);
        };
        let shown = match crate::stored::record::Envelope::decode(&stored.value) {
            Ok((_, snapshot)) => self.inner.registry.shown(snapshot),
            Err(why) => crate::admin::data::Shown::Not(why),
        };
        Ok(Some((record, shown)))
    }

    /// Procedure `id`'s record, read by key, with the stored record it came from.
    async fn stored_record(
        &self,
        id: ProcedureId,
    ) -> Result<Option<(ProcedureRecord, procflow_store::Record)>, ExecutorError> {
        let stored = self.inner.store.get(id.get()).await;
        let Some(stored) = stored.map_err(|e| ExecutorError::Store(Arc::new(e)))? else {
            return Ok(None);
        };
        let mut record =
            ProcedureRecord::from_record(&stored).map_err(|reason| ExecutorError::Metadata {
                key: format!("procedure #{id}: {reason}"),
            })?;
        self.overlay(&mut record, &self.live_locks());
        Ok(Some((record, stored)))
    }

    /// The admin's list of the procedures (one per executor: it reads the journal).
    #[cfg(feature = "admin")]
    pub(crate) fn lists(&self) -> &crate::admin::summaries::Cache {
        &self.inner.lists
    }

    /// How many procedure snapshots have changed in this process so far: a list built at
    /// this count is current while it stays the same.
    #[cfg(feature = "admin")]
    pub(crate) fn changes(&self) -> u64 {
        super::watched::changes()
    }

    /// Procedure `id`'s record with its machine's graph, as a one-record [`Catalog`] (to
    /// draw its diagram): two reads by key, never the whole store. `None` if the store
    /// does not hold it.
    #[cfg(feature = "admin")]
    pub(crate) async fn one(&self, id: ProcedureId) -> Result<Option<Catalog>, ExecutorError> {
        let Some(record) = self.record_alone(id).await? else {
            return Ok(None);
        };
        let key = format!("{MACHINE_PREFIX}{}", record.machine);
        let graph = self.inner.store.meta(&key).await;
        let graph = graph.map_err(|e| ExecutorError::Store(Arc::new(e)))?;
        // The prefix also matches a machine whose name extends this one's: `of_one` keeps
        // the graph of this machine only.
        Ok(Some(Catalog::of_one(record, &graph)))
    }

    /// What a list needs to be current, from memory: every procedure's snapshot, or
    /// only those of the procedures that changed since the last call (see
    /// [`Journal`](super::journal::Journal)). Taken a few thousand entries at a time, so
    /// that steps (which need the same table) are never held up for long, however many
    /// procedures there are; a procedure that changes meanwhile appears as it was or as
    /// it is, and is noted for the next call either way.
    ///
    /// One reader only: two lists taking turns would each miss what the other took.
    #[cfg(feature = "admin")]
    pub(crate) fn snapshot_changes(&self, whole: bool) -> Taken {
        let noted = {
            let mut table = self.inner.table();
            if whole {
                super::journal::Noted::Everything
            } else {
                table.journal.take()
            }
        };
        match noted {
            super::journal::Noted::Everything => Taken::Everything(self.snapshot_whole()),
            super::journal::Noted::Ids(mut ids) => {
                ids.sort_unstable();
                ids.dedup();
                Taken::Changed(self.infos_of(&ids))
            }
        }
    }

    /// Every procedure's snapshot, by id; noting starts afresh.
    #[cfg(feature = "admin")]
    fn snapshot_whole(&self) -> Vec<PackedInfo> {
        let mut ids: Vec<u64> = {
            let mut table = self.inner.table();
            table.journal.restart();
            table.procs.keys().copied().collect()
        };
        ids.sort_unstable();
        let infos = self.infos_of(&ids);
        infos.into_iter().filter_map(|(_, info)| info).collect()
    }

    /// Procedures `ids`' snapshots (`None` for those gone), a few thousand per lock; each
    /// read clears its entry's `noted` flag, so its next change is noted again.
    #[cfg(feature = "admin")]
    fn infos_of(&self, ids: &[u64]) -> Vec<(u64, Option<PackedInfo>)> {
        let mut all = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(4096) {
            let mut table = self.inner.table();
            let mut info = |id: &u64| {
                let entry = table.procs.get_mut(id)?;
                entry.noted = false;
                Some(entry.snapshot().into_owned())
            };
            all.extend(chunk.iter().map(|id| (*id, info(id))));
        }
        all
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
            Some(entry) => entry.snapshot().unpack(),
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

/// What [`Executor::snapshot_changes`] read.
#[cfg(feature = "admin")]
pub(crate) enum Taken {
    /// Every procedure's snapshot, by id.
    Everything(Vec<PackedInfo>),
    /// The procedures that changed, by id, each with its snapshot or `None` if it is gone.
    Changed(Vec<(u64, Option<PackedInfo>)>),
}
