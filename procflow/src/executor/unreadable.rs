//! A stored procedure whose cursor this build cannot read: it names a state the machine no
//! longer has (removed, or renamed without an alias) or that a newer build added.
//!
//! It keeps its place, as a procedure whose data does not decode does: its locks (its
//! envelope recorded them) and its table entry, its parent waiting for it. It is
//! reported stuck and is neither run nor rewritten: acting on it would need its states.
//! A build that knows them (the deploy rolled forward, or an alias added) runs it.

use super::erased::{DynProcedure, DynProgress};
use crate::codec::CodecError;
use crate::cursor::Repr;
use crate::locks::{LockKeyError, Locks};
use crate::{Context, Error, Phase};
use futures_util::future::BoxFuture;
use procflow_store::Bytes;
use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// What the runtime knows of a procedure whose cursor names an unknown state.
pub(crate) struct Unreadable {
    machine: &'static str,
    state: &'static str,
    phase: Phase,
    steps: u64,
    completed: usize,
    /// The snapshot as stored (never rewritten by this build: see [`Self::read_only`]).
    snapshot: Bytes,
    why: String,
}

impl Unreadable {
    /// The procedure stored as `snapshot`, whose cursor `repr` names a state machine
    /// `machine` does not have (`error` says which).
    pub(crate) fn new(
        machine: &'static str,
        repr: &Repr<'_>,
        snapshot: Bytes,
        error: &CodecError,
    ) -> Self {
        Self {
            machine,
            state: intern(&repr.state),
            phase: repr.phase.clone(),
            steps: repr.steps,
            completed: repr.completed.len(),
            snapshot,
            why: format!(
                "{error}; it may have been written by a newer build: this build neither runs \
                 nor rewrites it"
            ),
        }
    }
}

/// State names of unreadable procedures, for the `&'static str` the runtime reports:
/// one allocation per distinct name, however many procedures are at it.
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let names = names.get_or_insert_with(HashSet::new);
    if let Some(&known) = names.get(name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

impl<E> DynProcedure<E> for Unreadable {
    fn machine(&self) -> &'static str {
        self.machine
    }
    fn state(&self) -> &'static str {
        self.state
    }
    fn step_state(&self) -> &'static str {
        self.state
    }
    fn phase(&self) -> &Phase {
        &self.phase
    }
    fn steps(&self) -> u64 {
        self.steps
    }
    fn completed_len(&self) -> usize {
        self.completed
    }
    fn rollback_floor(&self) -> usize {
        0
    }
    /// Unknown: nothing may roll it back (an abort is refused, no deadline interrupts it).
    fn past_point_of_no_return(&self) -> bool {
        true
    }
    fn step<'a>(&'a mut self, _: &'a Context<E>) -> BoxFuture<'a, DynProgress> {
        let why = self.why.clone();
        Box::pin(async move { DynProgress::Unloadable(why) })
    }
    fn decode(&mut self) -> Result<(), CodecError> {
        Err(CodecError::UnknownState {
            machine: self.machine,
            state: self.state.to_owned(),
        })
    }
    // The runner writes nothing of it and acts on none of it ([`Self::read_only`]); these
    // leave it as it is.
    fn fail_forward(&mut self, error: Error, _: bool) -> Result<(), Error> {
        Err(error)
    }
    fn start_rollback(&mut self, _: Error) {}
    fn interrupt(&mut self, _: Error, _: bool) {}
    fn fail(&mut self, _: Error) {}
    fn encode_into(&self, mut out: Vec<u8>) -> Result<Vec<u8>, CodecError> {
        out.extend_from_slice(&self.snapshot);
        Ok(out)
    }
    fn forget_written(&mut self) {}
    fn locks(&self) -> Option<Result<Locks, LockKeyError>> {
        None
    }
    fn describe(&self) -> Option<Option<String>> {
        None
    }
    fn read_only(&self) -> Option<String> {
        Some(self.why.clone())
    }
}
