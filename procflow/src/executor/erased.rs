//! Procedures of different machines behind one object type, and the registry that rebuilds
//! them from the store by their machine's stable name.

use super::lazy::Lazy;
use super::unreadable::Unreadable;
use crate::codec::{self, CodecError};
use crate::instance::{Instance, Progress};
use crate::locks::{LockKeyError, Locks};
use crate::operator::MachineGraph;
use crate::{Child, Context, Error, Phase, StateMachine};
use futures_util::future::BoxFuture;
use procflow_store::Bytes;
use std::any::TypeId;
use std::collections::HashMap;

/// What one step did, without the machine's state type.
pub(crate) enum DynProgress {
    Moved,
    Spawned(Vec<Child>),
    Suspended {
        event: String,
        timeout: Option<std::time::Duration>,
    },
    Yielded,
    RolledBack,
    Failed(Error),
    Finished,
    /// Nothing ran: the procedure's stored data does not decode (why). It is as it was.
    Unloadable(String),
}

/// One live procedure of any machine whose environment is `E`.
///
/// Everything but [`step`](Self::step) and [`locks`](Self::locks) works on the cursor
/// alone, so it works as well on a procedure whose data is still stored (see
/// [`lazy`](super::lazy)).
pub(crate) trait DynProcedure<E>: Send {
    fn machine(&self) -> &'static str;
    fn state(&self) -> &'static str;
    /// The state whose handler the next step runs: while rolling back, the state it
    /// undoes (not the current one, where the rollback started).
    fn step_state(&self) -> &'static str;
    fn phase(&self) -> &Phase;
    fn steps(&self) -> u64;
    fn completed_len(&self) -> usize;
    fn rollback_floor(&self) -> usize;
    fn past_point_of_no_return(&self) -> bool;
    /// Runs one step, decoding the data first if it is still stored.
    fn step<'a>(&'a mut self, ctx: &'a Context<E>) -> BoxFuture<'a, DynProgress>;
    /// Decodes the data now if it is still stored.
    ///
    /// # Errors
    ///
    /// Why it does not decode; the procedure is left as it was.
    fn decode(&mut self) -> Result<(), CodecError>;
    /// See [`Cursor::fail_forward`](crate::Cursor).
    fn fail_forward(&mut self, error: Error, budget_spent: bool) -> Result<(), Error>;
    fn start_rollback(&mut self, cause: Error);
    /// See [`Cursor::interrupt`](crate::Cursor).
    fn interrupt(&mut self, cause: Error, acted: bool);
    fn fail(&mut self, cause: Error);
    fn encode_into(&self, out: Vec<u8>) -> Result<Vec<u8>, CodecError>;
    /// Drops what it keeps only to write its next record faster (the cursor's lists as
    /// written): it parks.
    fn forget_written(&mut self);
    /// The locks its data declares; `None` while the data is still stored (its envelope
    /// recorded them).
    fn locks(&self) -> Option<Result<Locks, LockKeyError>>;
    /// Its summary for operators (`describe`); `None` while the data is still stored
    /// (its envelope keeps the last one).
    fn describe(&self) -> Option<Option<String>>;
    /// Why this build must neither run nor rewrite it, if so: its snapshot is of a
    /// newer format than this build writes, or its cursor names a state this build does
    /// not know.
    fn read_only(&self) -> Option<String>;
}

impl<M: StateMachine> DynProcedure<M::Env> for Lazy<M> {
    fn machine(&self) -> &'static str {
        M::NAME
    }
    fn state(&self) -> &'static str {
        self.cursor().state().name()
    }
    fn step_state(&self) -> &'static str {
        let cursor = self.cursor();
        cursor
            .pending_rollback()
            .unwrap_or_else(|| cursor.state())
            .name()
    }
    fn phase(&self) -> &Phase {
        self.cursor().phase()
    }
    fn steps(&self) -> u64 {
        self.cursor().steps()
    }
    fn completed_len(&self) -> usize {
        self.cursor().completed().len()
    }
    fn rollback_floor(&self) -> usize {
        self.cursor().rollback_floor()
    }
    fn past_point_of_no_return(&self) -> bool {
        self.cursor().past_point_of_no_return()
    }
    fn step<'a>(&'a mut self, ctx: &'a Context<M::Env>) -> BoxFuture<'a, DynProgress> {
        Box::pin(async move {
            let instance = match self.decoded() {
                Ok(instance) => instance,
                Err(error) => return DynProgress::Unloadable(error.to_string()),
            };
            match Instance::step(instance, ctx).await {
                Progress::Moved { .. } => DynProgress::Moved,
                Progress::Spawned(children) => DynProgress::Spawned(children),
                Progress::Suspended { event, timeout } => DynProgress::Suspended { event, timeout },
                Progress::Yielded => DynProgress::Yielded,
                Progress::RolledBack(_) => DynProgress::RolledBack,
                Progress::Failed(error) => DynProgress::Failed(error),
                Progress::Finished => DynProgress::Finished,
            }
        })
    }
    fn decode(&mut self) -> Result<(), CodecError> {
        self.decoded().map(drop)
    }
    fn fail_forward(&mut self, error: Error, budget_spent: bool) -> Result<(), Error> {
        self.cursor_mut().fail_forward(error, budget_spent)
    }
    fn start_rollback(&mut self, cause: Error) {
        self.cursor_mut().start_rollback(cause);
    }
    fn interrupt(&mut self, cause: Error, acted: bool) {
        self.cursor_mut().interrupt(cause, acted);
    }
    fn fail(&mut self, cause: Error) {
        self.cursor_mut().fail(cause);
    }
    fn encode_into(&self, out: Vec<u8>) -> Result<Vec<u8>, CodecError> {
        Lazy::encode_into(self, out)
    }
    fn forget_written(&mut self) {
        self.cursor_mut().forget_written();
    }
    fn locks(&self) -> Option<Result<Locks, LockKeyError>> {
        self.procedure().map(M::locks)
    }
    fn describe(&self) -> Option<Option<String>> {
        self.procedure().map(M::describe)
    }
    fn read_only(&self) -> Option<String> {
        Lazy::newer_format(self).map(|newer| newer.to_string())
    }
}

/// Rebuilds a procedure of one machine from its snapshot, data decoded.
type Loader<E> = fn(&[u8]) -> Result<Box<dyn DynProcedure<E>>, CodecError>;
/// Rebuilds a procedure of one machine from its snapshot, data left encoded.
type LazyLoader<E> = fn(&Bytes) -> Result<Box<dyn DynProcedure<E>>, CodecError>;

fn load<M: StateMachine>(snapshot: &[u8]) -> Result<Box<dyn DynProcedure<M::Env>>, CodecError> {
    let (procedure, cursor) = codec::decode::<M>(snapshot)?;
    Ok(Box::new(Lazy::from(Instance { procedure, cursor })))
}

/// The stored procedure, its data left encoded; one whose cursor names a state this
/// build does not know is loaded all the same, to keep its place ([`Unreadable`]).
fn load_lazy<M: StateMachine>(
    snapshot: &Bytes,
) -> Result<Box<dyn DynProcedure<M::Env>>, CodecError> {
    match Lazy::<M>::stored(snapshot) {
        Ok(lazy) => Ok(Box::new(lazy)),
        Err(error @ CodecError::UnknownState { .. }) => {
            let split = codec::split(snapshot)?;
            Ok(Box::new(Unreadable::new(
                M::NAME,
                &split.cursor,
                snapshot.clone(),
                &error,
            )))
        }
        Err(error) => Err(error),
    }
}

/// What a restart needs of a procedure it loads dormant ([`codec::glance`]), for a
/// snapshot of one machine.
type Glancer = fn(&[u8]) -> Option<Glanced>;

/// What [`Registry::glance`] reads of a snapshot, the machine's types erased.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Glanced {
    /// The machine's registered name.
    pub(crate) machine: &'static str,
    /// The current state's name.
    pub(crate) state: &'static str,
    pub(crate) steps: u64,
    pub(crate) past_point_of_no_return: bool,
}

fn glance<M: StateMachine>(snapshot: &[u8]) -> Option<Glanced> {
    let glance = codec::glance::<M>(snapshot)?;
    Some(Glanced {
        machine: M::NAME,
        state: glance.state.name(),
        steps: glance.steps,
        past_point_of_no_return: glance.past_point_of_no_return,
    })
}

/// What the registry keeps per machine name.
struct Machine<E> {
    /// Its stable name, as registered.
    name: &'static str,
    /// Which type registered the name (one name, two machines is an error).
    type_id: TypeId,
    load: Loader<E>,
    load_lazy: LazyLoader<E>,
    glance: Glancer,
    /// Its data as the admin shows it.
    #[cfg(feature = "admin")]
    shown: fn(&[u8]) -> crate::admin::data::Shown,
}

/// The machines an executor can run, by stable name.
pub(crate) struct Registry<E> {
    /// By the name's bytes: a snapshot's name is looked up as stored, not first checked
    /// to be UTF-8. Hashed with foldhash: the names are the program's own, and a restart
    /// looks one up per procedure (std's SipHash was about 200 instructions of it).
    machines: HashMap<&'static [u8], Machine<E>, foldhash::fast::RandomState>,
    /// A name registered twice by different machines; reported when the executor starts.
    pub(crate) duplicate: Option<&'static str>,
    /// The graph of each machine, stored for tools that lack the machines' types.
    pub(crate) graphs: Vec<MachineGraph>,
}

impl<E: Send + Sync + 'static> Registry<E> {
    pub(crate) fn new() -> Self {
        Self {
            machines: HashMap::default(),
            duplicate: None,
            graphs: Vec::new(),
        }
    }

    pub(crate) fn register<M: StateMachine<Env = E>>(&mut self) {
        let machine = Machine {
            name: M::NAME,
            type_id: TypeId::of::<M>(),
            load: load::<M>,
            load_lazy: load_lazy::<M>,
            glance: glance::<M>,
            #[cfg(feature = "admin")]
            shown: crate::admin::data::shown::<M>,
        };
        if let Some(previous) = self.machines.insert(M::NAME.as_bytes(), machine) {
            // Registering the same machine twice is harmless; two machines, one name is not.
            if previous.type_id != TypeId::of::<M>() {
                self.duplicate.get_or_insert(M::NAME);
            }
            return;
        }
        self.graphs.push(MachineGraph::of::<M>());
    }

    pub(crate) fn contains(&self, machine: &str) -> bool {
        self.machines.contains_key(machine.as_bytes())
    }

    /// Rebuilds a procedure from its snapshot.
    ///
    /// # Errors
    ///
    /// The machine's name (`?` if unreadable) and a message when it is not registered or
    /// its snapshot cannot be read.
    pub(crate) fn load(
        &self,
        snapshot: &[u8],
    ) -> Result<Box<dyn DynProcedure<E>>, (String, String)> {
        let (name, machine) = self.machine_of(snapshot)?;
        (machine.load)(snapshot).map_err(|e| (name.to_owned(), e.to_string()))
    }

    /// Rebuilds a procedure from its snapshot, leaving its data encoded until it runs
    /// (see [`lazy`](super::lazy)).
    ///
    /// # Errors
    ///
    /// As [`load`](Self::load), for the snapshot's header: data that no longer decodes is
    /// found when the procedure next runs.
    pub(crate) fn load_lazy(
        &self,
        snapshot: &Bytes,
    ) -> Result<Box<dyn DynProcedure<E>>, (String, String)> {
        let (name, machine) = self.machine_of(snapshot)?;
        (machine.load_lazy)(snapshot).map_err(|e| (name.to_owned(), e.to_string()))
    }

    /// What a restart needs of a snapshot it loads dormant, read in place: `None` if
    /// its machine is not registered or [`codec::glance`] does not read it (the
    /// snapshot is then loaded whole, which says why).
    pub(crate) fn glance(&self, snapshot: &[u8]) -> Option<Glanced> {
        let name = codec::read_machine_name(snapshot)?;
        (self.machines.get(name)?.glance)(snapshot)
    }

    /// A stored snapshot's data as the admin shows it.
    #[cfg(feature = "admin")]
    pub(crate) fn shown(&self, snapshot: &[u8]) -> crate::admin::data::Shown {
        match self.machine_of(snapshot) {
            Ok((_, machine)) => (machine.shown)(snapshot),
            Err((_, why)) => crate::admin::data::Shown::Not(why),
        }
    }

    /// The registered machine a snapshot names, with its name.
    fn machine_of(&self, snapshot: &[u8]) -> Result<(&'static str, &Machine<E>), (String, String)> {
        // Read by hand from a snapshot of this build's layout (a restart does it once per
        // procedure); any other goes through serde, which says what is wrong with it.
        let read = codec::read_machine_name(snapshot).and_then(|name| self.machines.get(name));
        if let Some(machine) = read {
            return Ok((machine.name, machine));
        }
        let name = codec::machine_name(snapshot).map_err(|e| ("?".to_owned(), e.to_string()))?;
        // The registered name, not a copy of the stored one: no allocation per record.
        match self.machines.get(name.as_bytes()) {
            Some(machine) => Ok((machine.name, machine)),
            None => {
                let reason = format!("machine `{name}` is not registered with this executor");
                Err((name.into_owned(), reason))
            }
        }
    }
}
