//! The step history a record keeps: what ran, when, and how it ended.
//!
//! Each stored record carries the newest [`Config::history`](crate::executor::Config)
//! entries (32 by default) and counts the older ones it dropped, so a record's size stays
//! bounded however long the procedure loops or retries. The stored enums below are
//! written by variant index: variants are only ever appended.

use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Who ran an entry of the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum StepKind {
    /// A state's forward handler.
    Execute,
    /// A state's rollback handler.
    Rollback,
    /// Not a handler: the executor (an abort, a timeout, the end) or an operator (a bypass).
    Control,
}

/// How an entry of the history ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum StepOutcome {
    /// The forward step completed: the procedure moved to its next state.
    Moved,
    /// The step started this many children.
    Spawned(u32),
    /// The step suspended on this event.
    Suspended(String),
    /// The step failed with a retryable error (or past a point of no return) and will run
    /// again.
    Retried(String),
    /// The step failed for good: the procedure rolls back (or, past a point of no return,
    /// is stuck).
    Failed(String),
    /// The rollback step completed: the state is undone.
    Undone,
    /// An abort or the deadline stopped the procedure: it rolls back with this cause.
    Interrupted(String),
    /// An operator bypassed the procedure (see [`Bypass`](super::Bypass)).
    Bypassed {
        /// Who asked.
        by: String,
        /// Why.
        reason: String,
    },
    /// The procedure ended (its status tells how).
    Ended,
}

/// One entry of a procedure's step history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// The state it concerns.
    pub state: String,
    /// Forward step, rollback step, or the executor's or an operator's doing.
    pub kind: StepKind,
    /// When it ended.
    #[serde(
        serialize_with = "super::ser::ms",
        deserialize_with = "super::ser::de_ms"
    )]
    #[serde(rename = "at_ms")]
    pub at: SystemTime,
    /// How it ended.
    pub outcome: StepOutcome,
}

/// The stored form of a [`HistoryEntry`]: its time relative to the submit, which takes
/// two or three bytes instead of six.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Mark {
    pub(crate) state: String,
    pub(crate) kind: StepKind,
    /// Milliseconds after the procedure's submit.
    pub(crate) after_ms: u64,
    pub(crate) outcome: StepOutcome,
}

/// The newest entries of a procedure's history, oldest first, and how many older ones
/// were dropped to keep the record small.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct History {
    pub(crate) marks: Vec<Mark>,
    pub(crate) dropped: u64,
}

impl History {
    /// Appends an entry, dropping the oldest ones beyond `keep` (0 keeps none).
    pub(crate) fn push(&mut self, mark: Mark, keep: usize) {
        self.marks.push(mark);
        if self.marks.len() > keep {
            let excess = self.marks.len() - keep;
            self.marks.drain(..excess);
            self.dropped += excess as u64;
        }
    }

    /// The entries with absolute times, given the submit time.
    pub(crate) fn entries(&self, submitted_ms: u64) -> Vec<HistoryEntry> {
        self.marks
            .iter()
            .map(|mark| HistoryEntry {
                state: mark.state.clone(),
                kind: mark.kind,
                at: time_of(submitted_ms.saturating_add(mark.after_ms)),
                outcome: mark.outcome.clone(),
            })
            .collect()
    }
}

/// A stored wall-clock time (ms since the Unix epoch) as a [`SystemTime`].
pub(crate) fn time_of(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(n: u64) -> Mark {
        Mark {
            state: format!("S{n}"),
            kind: StepKind::Execute,
            after_ms: n,
            outcome: StepOutcome::Moved,
        }
    }

    #[test]
    fn history_keeps_the_newest_entries_and_counts_the_dropped() {
        let mut history = History::default();
        for n in 0..5 {
            history.push(mark(n), 3);
        }
        let states: Vec<_> = history.marks.iter().map(|m| m.state.as_str()).collect();
        assert_eq!(states, ["S2", "S3", "S4"]);
        assert_eq!(history.dropped, 2);
        let entries = history.entries(1_000);
        assert_eq!(entries[0].at, time_of(1_002));

        let mut none = History::default();
        none.push(mark(1), 0);
        assert!(none.marks.is_empty());
        assert_eq!(none.dropped, 1);
    }
}
