//! The readable record of one procedure, decoded from its stored bytes without the
//! machine's types.

use super::history::{HistoryEntry, entries};
use super::ser;
use crate::codec;
use crate::executor::Status;
use crate::executor::status::status_of;
use crate::locks::restore::may_have_taken;
use crate::locks::{Hold, Lock};
use crate::stored::history::time_of;
use crate::stored::record::{Envelope, Wait};
use crate::{Error, ProcedureId};
use procflow_store::Record;
use serde::{Deserialize, Serialize};
use std::time::SystemTime;

/// What a procedure waits for before its next step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Waiting {
    /// Nothing it declared (it may still wait for a worker, a slot, a lock or a retry).
    Nothing,
    /// These children to end.
    Children(Vec<ProcedureId>),
    /// A wake of `event`, or the time `until`.
    Event {
        /// The event's name.
        event: String,
        /// When it gives up waiting, if it has a timeout.
        #[serde(serialize_with = "ser::opt_ms", deserialize_with = "ser::de_opt_ms")]
        #[serde(rename = "until_ms")]
        until: Option<SystemTime>,
    },
}

/// An operator's bypass (see [`Action::Bypass`](crate::operator::Action::Bypass)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bypass {
    /// Who asked.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When.
    #[serde(serialize_with = "ser::ms", deserialize_with = "ser::de_ms")]
    #[serde(rename = "at_ms")]
    pub at: SystemTime,
}

/// Everything the store says about one procedure.
///
/// It serializes (the CLI's `--json`) with times as milliseconds since the Unix epoch
/// (fields renamed `*_ms`), the status as `{"name": .., ..details}` and errors as their
/// messages.
///
/// Read at rest ([`Catalog`](super::Catalog)) it is as of the procedure's last write:
/// `attempts` and `last_error` are those of a stuck procedure (stored when it becomes
/// stuck), not of every retry, and `status` cannot be
/// [`WaitingForLock`](Status::WaitingForLock). Read from a running executor
/// ([`Executor::record`](crate::executor::Executor::record)) the status, attempts and
/// locks are the live ones.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProcedureRecord {
    /// Its id.
    pub id: ProcedureId,
    /// Its machine's stable name.
    pub machine: String,
    /// The procedure that spawned it.
    pub parent: Option<ProcedureId>,
    /// The procedures it spawned that the store still holds, by id.
    pub children: Vec<ProcedureId>,
    /// The submit's nonce, if it had one.
    pub nonce: Option<String>,
    /// Its status.
    #[serde(serialize_with = "ser::status", deserialize_with = "ser::de_status")]
    pub status: Status,
    /// The current state (the next to run, or the last one once ended).
    pub state: String,
    /// Steps completed, forward and rollback.
    pub steps: u64,
    /// The version of the procedure type that wrote its data
    /// (`#[state_machine(version = ..)]`); 1 for records written before procflow stored it.
    #[serde(default = "first_version")]
    pub data_version: u32,
    /// Failed tries of the current step.
    pub attempts: u32,
    /// The last failure of the current step.
    pub last_error: Option<String>,
    /// The failure that made it roll back (or fail).
    #[serde(
        serialize_with = "ser::opt_error",
        deserialize_with = "ser::de_opt_error"
    )]
    pub cause: Option<Error>,
    /// What it waits for.
    pub waiting: Waiting,
    /// When it was submitted.
    #[serde(serialize_with = "ser::ms", deserialize_with = "ser::de_ms")]
    #[serde(rename = "submitted_ms")]
    pub submitted: SystemTime,
    /// When its record was last written.
    #[serde(serialize_with = "ser::ms", deserialize_with = "ser::de_ms")]
    #[serde(rename = "updated_ms")]
    pub updated: SystemTime,
    /// When it ended.
    #[serde(serialize_with = "ser::opt_ms", deserialize_with = "ser::de_opt_ms")]
    #[serde(rename = "finished_ms")]
    pub finished: Option<SystemTime>,
    /// When it fails if it has not ended (its timeout).
    #[serde(serialize_with = "ser::opt_ms", deserialize_with = "ser::de_opt_ms")]
    #[serde(rename = "deadline_ms")]
    pub deadline: Option<SystemTime>,
    /// The locks it declared.
    pub locks: Vec<Lock>,
    /// How long it holds them.
    pub hold: Hold,
    /// Whether it holds its locks now. At rest: what its record says, which is what a
    /// restart gives back (for a record written before procflow stored it: whether it
    /// has started and no other procedure holds what it needs, as a restart decides).
    pub holds_locks: bool,
    /// Whether it waits for its locks (live only).
    pub waits_for_locks: bool,
    /// The states it entered, in the order it first entered them.
    pub visited: Vec<String>,
    /// The completed states on its rollback stack, oldest first.
    pub completed: Vec<String>,
    /// The newest entries of its step history, oldest first.
    pub history: Vec<HistoryEntry>,
    /// How many older entries were dropped ([`Config::history`](crate::executor::Config)).
    pub history_dropped: u64,
    /// An operator's abort stored and not yet carried out: who asked, and why (from the
    /// store's requests; `None` from [`ProcedureRecord::from_record`] alone).
    pub abort_requested: Option<String>,
    /// Set once an operator bypassed it.
    pub bypass: Option<Bypass>,
    /// The procedure's own summary for operators (its handlers' `describe`), as of its
    /// last write; stored with the record, so it is known without the procedure's type.
    #[serde(default)]
    pub summary: Option<String>,
}

impl ProcedureRecord {
    /// Decodes a stored record.
    ///
    /// # Errors
    ///
    /// Why the bytes cannot be read (a damaged record, or one written by a newer
    /// procflow).
    pub fn from_record(record: &Record) -> Result<Self, String> {
        Self::read(record).map(|(read, _)| read)
    }

    /// [`from_record`](Self::from_record), and whether `holds_locks` is a guess: the
    /// record is older than the field that says, and the procedure has started, so it
    /// may hold them. A [`Catalog`](super::Catalog) settles guesses as a restart does
    /// (`locks::restore`).
    pub(crate) fn read(record: &Record) -> Result<(Self, bool), String> {
        let (envelope, snapshot) = Envelope::decode(&record.value)?;
        let split = codec::split(snapshot).map_err(|e| e.to_string())?;
        let (machine, cursor, data_version) = (split.machine, split.cursor, split.data_version);
        let (mut status, cause) = status_of(&cursor.phase, &envelope);
        let trouble = envelope.trouble.as_ref();
        if let Some((trouble, since)) = trouble.and_then(|t| Some((t, t.stuck_since_ms?))) {
            if !status.is_finished() {
                status = Status::Stuck {
                    error: Error::fatal(trouble.error.clone()),
                    since: time_of(since),
                    attempts: trouble.attempts,
                };
            }
        }
        let may_hold =
            envelope.hold == Hold::ForLife && !envelope.locks.is_empty() && !status.is_finished();
        let guessed = envelope.holds_locks.is_none()
            && may_have_taken(
                cursor.steps,
                envelope.wait != Wait::Ready,
                matches!(cursor.phase, crate::Phase::Running),
            );
        let holds_locks = may_hold && (envelope.holds_locks == Some(true) || guessed);
        let read = Self {
            id: ProcedureId::new(record.id),
            machine: machine.into_owned(),
            parent: record.parent.map(ProcedureId::new),
            children: Vec::new(),
            nonce: envelope.nonce.clone(),
            state: cursor.state.clone().into_owned(),
            steps: cursor.steps,
            data_version,
            attempts: trouble.map_or(0, |t| t.attempts),
            last_error: trouble.map(|t| t.error.clone()),
            cause: cause.cloned(),
            status,
            waiting: waiting(&envelope.wait),
            submitted: time_of(envelope.submitted_ms),
            updated: time_of(envelope.updated_ms),
            finished: envelope.finished_ms.map(time_of),
            deadline: envelope.deadline_ms.map(time_of),
            locks: envelope.locks.clone(),
            hold: envelope.hold,
            holds_locks,
            waits_for_locks: false,
            visited: cursor
                .entries
                .iter()
                .map(|(s, _)| s.0.to_string())
                .collect(),
            completed: cursor.completed.iter().map(|s| s.0.to_string()).collect(),
            history: entries(&envelope.history, envelope.submitted_ms),
            history_dropped: envelope.history.dropped,
            abort_requested: None,
            bypass: envelope.bypass.as_ref().map(|b| Bypass {
                by: b.by.clone(),
                reason: b.reason.clone(),
                at: time_of(b.at_ms),
            }),
            summary: envelope.summary.clone(),
        };
        Ok((read, holds_locks && guessed))
    }
}

fn waiting(wait: &Wait) -> Waiting {
    match wait {
        Wait::Ready => Waiting::Nothing,
        Wait::Children(ids) => {
            Waiting::Children(ids.iter().copied().map(ProcedureId::new).collect())
        }
        Wait::Event { name, until_ms } => Waiting::Event {
            event: name.clone(),
            until: until_ms.map(time_of),
        },
    }
}

/// The data version of a record whose JSON does not say (an older admin API).
fn first_version() -> u32 {
    1
}
