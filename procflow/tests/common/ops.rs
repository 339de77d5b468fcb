//! A machine for the operator tests (`operator.rs`, `cli.rs`): it takes a lock, waits
//! for an event, then crosses a point of no return that can be made to fail for good.

use procflow::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// What the handlers did, and which jobs may go on past `Wait`.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<(Vec<String>, Vec<String>)>>);

impl Log {
    pub fn push(&self, event: String) {
        self.0.lock().unwrap().0.push(event);
    }
    pub fn events(&self) -> Vec<String> {
        self.0.lock().unwrap().0.clone()
    }
    pub fn count(&self, event: &str) -> usize {
        self.events().iter().filter(|e| *e == event).count()
    }
    /// Lets job `name` past `Wait` (its condition; a wake makes it look again).
    pub fn let_go(&self, name: &str) {
        self.0.lock().unwrap().1.push(name.to_owned());
    }
    fn may_go(&self, name: &str) -> bool {
        self.0.lock().unwrap().1.iter().any(|n| n == name)
    }
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job, name = "job", env = Log)]
pub enum JobState {
    #[initial]
    #[transition(to = [Wait])]
    #[rollback]
    Reserve,
    #[transition(to = [Commit])]
    Wait,
    #[transition(to = [Done])]
    #[no_rollback]
    Commit,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
pub struct Job {
    pub name: String,
    /// An exclusive lock held for life.
    pub lock: Option<String>,
    /// `Commit` fails fatally: past the point of no return, the job is stuck.
    pub fail_commit: bool,
}

impl Job {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            lock: None,
            fail_commit: false,
        }
    }
    pub fn locking(mut self, key: &str) -> Self {
        self.lock = Some(key.to_owned());
        self
    }
    pub fn failing_commit(mut self) -> Self {
        self.fail_commit = true;
        self
    }
}

impl JobStateHandlers for Job {
    async fn reserve(&mut self, ctx: &Context<Log>) -> Step<job_state::Reserve> {
        ctx.env().push(format!("reserve {}", self.name));
        Ok(job_state::Reserve::Wait.into())
    }
    async fn rollback_reserve(&mut self, ctx: &Context<Log>) -> Result<(), Error> {
        ctx.env().push(format!("undo reserve {}", self.name));
        Ok(())
    }
    async fn wait(&mut self, ctx: &Context<Log>) -> Step<job_state::Wait> {
        if ctx.env().may_go(&self.name) {
            return Ok(job_state::Wait::Commit.into());
        }
        Ok(Flow::suspend(format!("go-{}", self.name)))
    }
    async fn commit(&mut self, ctx: &Context<Log>) -> Step<job_state::Commit> {
        ctx.env().push(format!("commit {}", self.name));
        if self.fail_commit {
            return Err(Error::fatal("the region server refuses the commit"));
        }
        Ok(job_state::Commit::Done.into())
    }
    fn locks(&self) -> Result<Locks, LockKeyError> {
        let locks = self.lock.iter().map(Lock::exclusive);
        Ok(Locks::new(locks.collect::<Result<Vec<_>, _>>()?))
    }
}
