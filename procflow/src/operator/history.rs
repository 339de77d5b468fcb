//! The step history a record keeps: what ran, when, and how it ended.
//!
//! Each stored record carries the newest [`Config::history`](crate::executor::Config)
//! entries (32 by default) and counts the older ones it dropped, so a record's size stays
//! bounded however long the procedure loops or retries. The stored enums below are
//! written by variant index: variants are only ever appended.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::VecDeque;
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
    /// The state's name: borrowed from the machine when the executor notes it (no
    /// allocation per step), owned when read back.
    pub(crate) state: Cow<'static, str>,
    pub(crate) kind: StepKind,
    /// Milliseconds after the procedure's submit.
    pub(crate) after_ms: u64,
    pub(crate) outcome: StepOutcome,
}

/// The newest entries of a procedure's history, oldest first, and how many older ones
/// were dropped to keep the record small.
///
/// Every write of the procedure stores the whole history, so the history keeps its
/// entries encoded as well ([`write_to`](Self::write_to) appends those bytes): a write
/// then costs a copy of the history, not an encoding of each entry.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct History {
    pub(crate) marks: Vec<Mark>,
    pub(crate) dropped: u64,
    #[serde(skip)]
    encoded: Encoded,
}

/// `marks` as postcard writes them, one after the other, and each one's length. Not
/// valid after a decode until the next push rebuilds it (a procedure read at start and
/// never run again is not encoded again).
#[derive(Clone, Debug, Default)]
struct Encoded {
    bytes: Vec<u8>,
    lens: VecDeque<usize>,
    valid: bool,
}

impl PartialEq for History {
    fn eq(&self, other: &Self) -> bool {
        (&self.marks, self.dropped) == (&other.marks, other.dropped)
    }
}

impl Eq for History {}

impl History {
    /// Appends an entry, dropping the oldest ones beyond `keep` (0 keeps none).
    pub(crate) fn push(&mut self, mark: Mark, keep: usize) {
        if keep == 0 {
            // Nothing is kept (`Config::history: 0`): nothing to encode either.
            self.dropped += self.marks.len() as u64 + 1;
            self.marks.clear();
            self.encoded = Encoded::default();
            return;
        }
        if !self.encoded.valid {
            self.encoded = Encoded::default();
            self.encoded.valid = self.marks.iter().all(|m| self.encoded.append(m));
        }
        if self.encoded.valid {
            self.encoded.valid = self.encoded.append(&mark);
        }
        self.marks.push(mark);
        if self.marks.len() > keep {
            let excess = self.marks.len() - keep;
            self.marks.drain(..excess);
            self.dropped += excess as u64;
            let gone: usize = self
                .encoded
                .lens
                .drain(..excess.min(self.encoded.lens.len()))
                .sum();
            self.encoded
                .bytes
                .drain(..gone.min(self.encoded.bytes.len()));
        }
    }

    /// Appends the history's postcard encoding to `out`: the same bytes as serializing
    /// it, from the kept encoding when it is valid.
    pub(crate) fn write_to(&self, out: Vec<u8>) -> postcard::Result<Vec<u8>> {
        if !self.encoded.valid {
            return postcard::to_extend(self, out);
        }
        let mut out = postcard::to_extend(&self.marks.len(), out)?;
        out.extend_from_slice(&self.encoded.bytes);
        postcard::to_extend(&self.dropped, out)
    }

    /// How many bytes [`write_to`](Self::write_to) appends, about.
    pub(crate) fn encoded_len(&self) -> usize {
        self.encoded.bytes.len() + 12
    }

    /// The entries with absolute times, given the submit time.
    pub(crate) fn entries(&self, submitted_ms: u64) -> Vec<HistoryEntry> {
        self.marks
            .iter()
            .map(|mark| HistoryEntry {
                state: mark.state.clone().into_owned(),
                kind: mark.kind,
                at: time_of(submitted_ms.saturating_add(mark.after_ms)),
                outcome: mark.outcome.clone(),
            })
            .collect()
    }
}

impl Encoded {
    /// Encodes `mark` at the end; false if it cannot be (then the kept encoding is not
    /// used).
    fn append(&mut self, mark: &Mark) -> bool {
        let before = self.bytes.len();
        match postcard::to_extend(mark, std::mem::take(&mut self.bytes)) {
            Ok(bytes) => {
                self.bytes = bytes;
                self.lens.push_back(self.bytes.len() - before);
                true
            }
            Err(_) => false,
        }
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
            state: format!("S{n}").into(),
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
        let states: Vec<_> = history.marks.iter().map(|m| m.state.as_ref()).collect();
        assert_eq!(states, ["S2", "S3", "S4"]);
        assert_eq!(history.dropped, 2);
        let entries = history.entries(1_000);
        assert_eq!(entries[0].at, time_of(1_002));

        let mut none = History::default();
        none.push(mark(1), 0);
        assert!(none.marks.is_empty());
        assert_eq!(none.dropped, 1);
    }

    /// The kept encoding writes the bytes serde would, whatever was pushed and dropped,
    /// and after a decode (when it is rebuilt at the next push).
    #[test]
    fn the_kept_encoding_is_the_serialized_form() {
        let outcomes = [
            StepOutcome::Moved,
            StepOutcome::Suspended("go".into()),
            StepOutcome::Retried("boom".into()),
            StepOutcome::Bypassed {
                by: "alice".into(),
                reason: "by hand".into(),
            },
        ];
        let mut history = History::default();
        for n in 0..40u64 {
            let mut mark = mark(n * 1000);
            mark.outcome = outcomes[usize::try_from(n).unwrap() % outcomes.len()].clone();
            history.push(mark, 7);
            let kept = history.write_to(vec![9]).unwrap();
            assert_eq!(
                kept,
                postcard::to_extend(&history, vec![9]).unwrap(),
                "after {n}"
            );
        }
        let decoded: History =
            postcard::from_bytes(&postcard::to_stdvec(&history).unwrap()).unwrap();
        assert_eq!(decoded, history);
        let mut decoded = decoded;
        assert_eq!(
            decoded.write_to(Vec::new()).unwrap(),
            postcard::to_stdvec(&history).unwrap()
        );
        decoded.push(mark(99), 7);
        history.push(mark(99), 7);
        assert_eq!(
            decoded.write_to(Vec::new()).unwrap(),
            postcard::to_stdvec(&history).unwrap()
        );
    }
}
