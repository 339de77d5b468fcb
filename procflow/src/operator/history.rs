//! A procedure's step history as operators see it: each entry with its absolute time.

use crate::stored::history::{History, StepKind, StepOutcome, time_of};
use serde::{Deserialize, Serialize};
use std::time::SystemTime;

/// One entry of a procedure's step history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// The state it concerns.
    pub state: String,
    /// Forward step, rollback step, or the executor's or an operator's doing.
    pub kind: StepKind,
    /// When it ended.
    #[serde(
        serialize_with = "crate::operator::ser::ms",
        deserialize_with = "crate::operator::ser::de_ms"
    )]
    #[serde(rename = "at_ms")]
    pub at: SystemTime,
    /// How it ended.
    pub outcome: StepOutcome,
}

/// The entries of a stored history with absolute times, given the submit time.
pub(crate) fn entries(history: &History, submitted_ms: u64) -> Vec<HistoryEntry> {
    history
        .marks()
        .map(|mark| HistoryEntry {
            state: mark.state.into_owned(),
            kind: mark.kind,
            at: time_of(submitted_ms.saturating_add(mark.after_ms)),
            outcome: mark.outcome,
        })
        .collect()
}
