//! Procedures of different machines behind one object type, and the registry that rebuilds
//! them from the store by their machine's stable name.

use crate::codec::{self, CodecError};
use crate::instance::{Instance, Progress};
use crate::locks::{LockKeyError, Locks};
use crate::operator::MachineGraph;
use crate::{Child, Context, Error, Phase, StateMachine};
use futures_util::future::BoxFuture;
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
}

/// One live procedure of any machine whose environment is `E`.
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
    fn step<'a>(&'a mut self, ctx: &'a Context<E>) -> BoxFuture<'a, DynProgress>;
    /// See [`Instance::fail_forward`].
    fn fail_forward(&mut self, error: Error, budget_spent: bool) -> Result<(), Error>;
    fn start_rollback(&mut self, cause: Error);
    /// See [`Cursor::interrupt`](crate::Cursor).
    fn interrupt(&mut self, cause: Error, acted: bool);
    fn fail(&mut self, cause: Error);
    fn encode_into(&self, out: Vec<u8>) -> Result<Vec<u8>, CodecError>;
    fn locks(&self) -> Result<Locks, LockKeyError>;
}

impl<M: StateMachine> DynProcedure<M::Env> for Instance<M> {
    fn machine(&self) -> &'static str {
        M::NAME
    }
    fn state(&self) -> &'static str {
        self.cursor.state().name()
    }
    fn step_state(&self) -> &'static str {
        let undoing = self.cursor.pending_rollback();
        undoing.unwrap_or_else(|| self.cursor.state()).name()
    }
    fn phase(&self) -> &Phase {
        self.cursor.phase()
    }
    fn steps(&self) -> u64 {
        self.cursor.steps()
    }
    fn completed_len(&self) -> usize {
        self.cursor.completed().len()
    }
    fn rollback_floor(&self) -> usize {
        self.cursor.rollback_floor()
    }
    fn past_point_of_no_return(&self) -> bool {
        self.cursor.past_point_of_no_return()
    }
    fn step<'a>(&'a mut self, ctx: &'a Context<M::Env>) -> BoxFuture<'a, DynProgress> {
        Box::pin(async move {
            match Instance::step(self, ctx).await {
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
    fn fail_forward(&mut self, error: Error, budget_spent: bool) -> Result<(), Error> {
        Instance::fail_forward(self, error, budget_spent)
    }
    fn start_rollback(&mut self, cause: Error) {
        self.cursor.start_rollback(cause);
    }
    fn interrupt(&mut self, cause: Error, acted: bool) {
        self.cursor.interrupt(cause, acted);
    }
    fn fail(&mut self, cause: Error) {
        self.cursor.fail(cause);
    }
    fn encode_into(&self, out: Vec<u8>) -> Result<Vec<u8>, CodecError> {
        codec::encode_into(&self.procedure, &self.cursor, out)
    }
    fn locks(&self) -> Result<Locks, LockKeyError> {
        M::locks(&self.procedure)
    }
}

type Loader<E> = fn(&[u8]) -> Result<Box<dyn DynProcedure<E>>, CodecError>;

fn load<M: StateMachine>(snapshot: &[u8]) -> Result<Box<dyn DynProcedure<M::Env>>, CodecError> {
    let (procedure, cursor) = codec::decode::<M>(snapshot)?;
    Ok(Box::new(Instance { procedure, cursor }))
}

/// The machines an executor can run, by stable name.
pub(crate) struct Registry<E> {
    loaders: HashMap<&'static str, (TypeId, Loader<E>)>,
    /// A name registered twice by different machines; reported when the executor starts.
    pub(crate) duplicate: Option<&'static str>,
    /// The graph of each machine, stored for tools that lack the machines' types.
    pub(crate) graphs: Vec<MachineGraph>,
}

impl<E: Send + Sync + 'static> Registry<E> {
    pub(crate) fn new() -> Self {
        Self {
            loaders: HashMap::new(),
            duplicate: None,
            graphs: Vec::new(),
        }
    }

    pub(crate) fn register<M: StateMachine<Env = E>>(&mut self) {
        let entry = (TypeId::of::<M>(), load::<M> as Loader<E>);
        if let Some((previous, _)) = self.loaders.insert(M::NAME, entry) {
            // Registering the same machine twice is harmless; two machines, one name is not.
            if previous != TypeId::of::<M>() {
                self.duplicate.get_or_insert(M::NAME);
            }
            return;
        }
        self.graphs.push(MachineGraph::of::<M>());
    }

    pub(crate) fn contains(&self, machine: &str) -> bool {
        self.loaders.contains_key(machine)
    }

    /// Rebuilds a procedure from its snapshot.
    ///
    /// # Errors
    ///
    /// A message naming the machine when it is not registered or its snapshot cannot be
    /// read.
    pub(crate) fn load(
        &self,
        snapshot: &[u8],
    ) -> Result<Box<dyn DynProcedure<E>>, (String, String)> {
        let machine = codec::machine_name(snapshot)
            .map_err(|e| ("?".to_owned(), e.to_string()))?
            .into_owned();
        let Some((_, loader)) = self.loaders.get(machine.as_str()) else {
            let reason = format!("machine `{machine}` is not registered with this executor");
            return Err((machine, reason));
        };
        loader(snapshot).map_err(|e| (machine, e.to_string()))
    }
}
