//! Every procedure a store holds, readable without the machines' types.

use super::graph::{MACHINE_PREFIX, MachineGraph, PathOnGraph};
use super::record::ProcedureRecord;
use crate::ProcedureId;
use crate::locks::Lock;
use crate::locks::LockTable;
use crate::locks::restore::{Claim, ancestors, give_back};
use crate::stored::history::StepOutcome;
use crate::stored::requests::{self, Action, Request};
use procflow_store::{Loaded, Store, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::collections::{HashMap, HashSet};

/// What a store holds, for operators: every procedure's [`ProcedureRecord`], the graph of
/// every machine an executor ran on it, and the operators' requests not yet carried out.
///
/// Built from a store at rest (`Catalog::load`), or from what
/// [`WalStore::read_only`](procflow_store::WalStore::read_only) reads while an executor
/// runs. A running executor gives its live view with
/// [`Executor::catalog`](crate::executor::Executor::catalog).
///
/// It serializes (the admin API's `/api/catalog`) as `{"records", "unreadable",
/// "machines", "requests"}`, and reads back from that JSON (`procflow --url`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Catalog {
    records: Vec<ProcedureRecord>,
    unreadable: Vec<(ProcedureId, String)>,
    machines: BTreeMap<String, MachineGraph>,
    requests: Vec<(String, Request)>,
}

impl Catalog {
    /// Reads everything `store` holds.
    ///
    /// # Errors
    ///
    /// The store's.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn load(store: &dyn Store) -> Result<Self, StoreError> {
        Ok(Self::from_loaded(&store.load().await?))
    }

    /// A catalog of one record and its machine's graph (stored under `graph_meta`, the
    /// entries of one machine's graph key): what drawing one procedure needs, read by id
    /// rather than with the whole store.
    #[cfg(feature = "admin")]
    pub(crate) fn of_one(record: ProcedureRecord, graph_meta: &BTreeMap<String, Vec<u8>>) -> Self {
        let mut catalog = Self::default();
        for value in graph_meta.values() {
            if let Ok(graph) = postcard::from_bytes::<MachineGraph>(value)
                && graph.name == record.machine
            {
                catalog.machines.insert(graph.name.clone(), graph);
            }
        }
        catalog.records.push(record);
        catalog
    }

    /// Decodes what a store returned from `load`.
    #[must_use]
    pub fn from_loaded(loaded: &Loaded) -> Self {
        let mut catalog = Self::default();
        let mut guessed = HashSet::new();
        for record in &loaded.records {
            match ProcedureRecord::read(record) {
                Ok((read, guess)) => {
                    if guess {
                        guessed.insert(read.id.get());
                    }
                    catalog.records.push(read);
                }
                Err(reason) => catalog
                    .unreadable
                    .push((ProcedureId::new(record.id), reason)),
            }
        }
        if !guessed.is_empty() {
            catalog.settle_guesses(&guessed);
        }
        let mut children: BTreeMap<ProcedureId, Vec<ProcedureId>> = BTreeMap::new();
        for record in &catalog.records {
            if let Some(parent) = record.parent {
                children.entry(parent).or_default().push(record.id);
            }
        }
        for record in &mut catalog.records {
            record.children = children.remove(&record.id).unwrap_or_default();
        }
        let graphs = loaded.meta.range(MACHINE_PREFIX.to_owned()..);
        for (key, value) in graphs.take_while(|(key, _)| key.starts_with(MACHINE_PREFIX)) {
            if let Ok(graph) = postcard::from_bytes::<MachineGraph>(value) {
                catalog.machines.insert(graph.name.clone(), graph);
            } else {
                tracing::warn!(key, "stored machine graph cannot be read");
            }
        }
        for (key, request) in requests::stored(&loaded.meta) {
            if let Ok(request) = request {
                catalog.requests.push((key.to_owned(), request));
            }
        }
        for (_, request) in &catalog.requests {
            let Action::Abort(id) = &request.action else {
                continue;
            };
            if let Ok(at) = catalog.records.binary_search_by_key(id, |r| r.id.get()) {
                let asked = format!("by {}: {}", request.by, request.reason);
                catalog.records[at].abort_requested = Some(asked);
            }
        }
        catalog
    }

    /// Settles the lock holders of records older than the field that says: as a restart
    /// does, a guess holds only what no recorded holder (nor an older guess) holds.
    fn settle_guesses(&mut self, guessed: &HashSet<u64>) {
        let parents: HashMap<u64, Option<u64>> = self
            .records
            .iter()
            .map(|r| (r.id.get(), r.parent.map(ProcedureId::get)))
            .collect();
        let claims = self.records.iter().filter(|r| r.holds_locks).map(|r| {
            let owner = r.id.get();
            Claim {
                owner,
                ancestors: ancestors(owner, |id| parents.get(&id).copied().flatten()),
                locks: r.locks.clone(),
                recorded: !guessed.contains(&owner),
            }
        });
        let (holders, _) = give_back(&LockTable::new(), claims);
        for record in &mut self.records {
            if guessed.contains(&record.id.get()) {
                record.holds_locks = holders.contains(&record.id.get());
            }
        }
    }

    /// Every readable procedure, by id.
    #[must_use]
    pub fn records(&self) -> &[ProcedureRecord] {
        &self.records
    }

    /// Procedure `id`.
    #[must_use]
    pub fn get(&self, id: ProcedureId) -> Option<&ProcedureRecord> {
        let at = self.records.binary_search_by_key(&id, |r| r.id).ok()?;
        self.records.get(at)
    }

    /// Mutable access, for the executor's live view.
    pub(crate) fn records_mut(&mut self) -> &mut [ProcedureRecord] {
        &mut self.records
    }

    /// Stored procedures that cannot be read, with why.
    #[must_use]
    pub fn unreadable(&self) -> &[(ProcedureId, String)] {
        &self.unreadable
    }

    /// The graph of machine `name`, if an executor that runs it stored it.
    #[must_use]
    pub fn machine(&self, name: &str) -> Option<&MachineGraph> {
        self.machines.get(name)
    }

    /// Operators' requests stored and not yet carried out, oldest first.
    #[must_use]
    pub fn pending_requests(&self) -> &[(String, Request)] {
        &self.requests
    }

    /// The locks held, by procedure: what live procedures that hold their locks for life
    /// hold (at rest: what they take back first at the next start).
    #[must_use]
    pub fn held_locks(&self) -> Vec<(ProcedureId, Lock)> {
        let holders = self.records.iter().filter(|r| r.holds_locks);
        holders
            .flat_map(|r| r.locks.iter().map(|lock| (r.id, lock.clone())))
            .collect()
    }

    /// Procedure `id`'s way through its machine: where it is, where it went, what it
    /// undid and has still to undo.
    #[must_use]
    pub fn path(&self, id: ProcedureId) -> Option<PathOnGraph> {
        let record = self.get(id)?;
        let graph = self.machine(&record.machine);
        let has_rollback = |state: &str| {
            graph.is_none_or(|g| g.states.iter().any(|s| s.name == state && s.rollback))
        };
        let mut undone: Vec<String> = record
            .history
            .iter()
            .filter(|entry| entry.outcome == StepOutcome::Undone)
            .map(|entry| entry.state.clone())
            .collect();
        undone.dedup();
        let to_undo = if record.status == crate::executor::Status::RollingBack {
            let pending = record.completed.iter().rev();
            pending.filter(|s| has_rollback(s)).cloned().collect()
        } else {
            Vec::new()
        };
        let visited = record.visited.iter();
        Some(PathOnGraph {
            current: record.state.clone(),
            visited: visited.filter(|s| **s != record.state).cloned().collect(),
            undone,
            to_undo,
        })
    }

    /// Procedure `id`'s machine as a Mermaid diagram with its path drawn on it
    /// ([`MachineGraph::mermaid_with`]); `None` if the procedure or its machine's graph
    /// is not in the store.
    #[must_use]
    pub fn diagram(&self, id: ProcedureId) -> Option<String> {
        let record = self.get(id)?;
        let graph = self.machine(&record.machine)?;
        Some(graph.mermaid_with(&self.path(id)?))
    }

    /// Procedure `id`'s machine drawn as SVG with its path on it
    /// ([`MachineGraph::svg_with`]); `None` as for [`diagram`](Self::diagram).
    #[must_use]
    pub fn svg(&self, id: ProcedureId) -> Option<String> {
        let record = self.get(id)?;
        let graph = self.machine(&record.machine)?;
        Some(graph.svg_with(&self.path(id)?))
    }
}
