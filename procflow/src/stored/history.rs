//! The step history a record keeps: what ran, when, and how it ended.
//!
//! Each stored record carries the newest [`Config::history`](crate::executor::Config)
//! entries (32 by default) and counts the older ones it dropped, so a record's size stays
//! bounded however long the procedure loops or retries. The stored enums below are
//! written by variant index: variants are only ever appended.

use crate::stored::wire::append;
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
    /// An operator bypassed the procedure (see [`Bypass`](crate::operator::Bypass)).
    Bypassed {
        /// Who asked.
        by: String,
        /// Why.
        reason: String,
    },
    /// The procedure ended (its status tells how).
    Ended,
}

/// One entry of the stored history, its time relative to the submit, which takes two or
/// three bytes instead of six (operators see it as an
/// [`operator::HistoryEntry`](crate::operator::HistoryEntry)).
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
/// The entries are kept only as postcard writes them, one after the other: every write
/// of the procedure stores the whole history, which is then a copy of those bytes
/// ([`write_to`](Self::write_to)), and a procedure loaded at start and left waiting holds
/// a tenth of an entry's decoded size (a decoded entry owns a `String` or two). They are
/// decoded only for an operator's view. Serialized, it is
/// the same as a struct of a `Vec` of entries and the count of dropped ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct History {
    /// The kept entries, encoded.
    bytes: Vec<u8>,
    /// Each kept entry's length in `bytes`, oldest first.
    lens: VecDeque<u32>,
    pub(crate) dropped: u64,
}

/// The bytes [`History::append`] reserves for a new history: about six entries.
const FIRST_ROOM: usize = 128;

impl History {
    /// Appends an entry, dropping the oldest ones beyond `keep` (0 keeps none).
    pub(crate) fn push(&mut self, mark: Mark, keep: usize) {
        if keep == 0 {
            // Nothing is kept (`Config::history: 0`): nothing to encode either.
            self.dropped += self.lens.len() as u64 + 1;
            *self = History {
                dropped: self.dropped,
                ..History::default()
            };
            return;
        }
        if self.append(&mark).is_err() {
            // Not expected (a mark is plain data); an entry that cannot be kept counts
            // as dropped rather than failing the step.
            self.dropped += 1;
        }
        if self.lens.len() > keep {
            let excess = self.lens.len() - keep;
            let gone: u32 = self.lens.drain(..excess).sum();
            self.bytes.drain(..gone as usize);
            self.dropped += excess as u64;
        }
    }

    /// Encodes `mark` after the kept entries.
    fn append(&mut self, mark: &Mark) -> postcard::Result<()> {
        if self.lens.is_empty() && self.bytes.capacity() == 0 {
            // Room for a few entries at once: grown from nothing a byte at a time, the
            // buffer reallocated five times in a procedure's first ten steps.
            self.bytes.reserve(FIRST_ROOM);
            self.lens.reserve(FIRST_ROOM / 16);
        }
        let before = self.bytes.len();
        let bytes = append(mark, std::mem::take(&mut self.bytes));
        // On an error the buffer is gone with it: start again, counting the lost ones.
        let bytes = bytes.inspect_err(|_| {
            self.dropped += self.lens.len() as u64;
            self.lens.clear();
        })?;
        self.bytes = bytes;
        let len = self.bytes.len() - before;
        self.lens
            .push_back(u32::try_from(len).map_err(|_| postcard::Error::SerializeBufferFull)?);
        Ok(())
    }

    /// How many entries are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lens.len()
    }

    /// Appends the history's postcard encoding to `out`: the same bytes as serializing
    /// it.
    pub(crate) fn write_to(&self, out: Vec<u8>) -> postcard::Result<Vec<u8>> {
        let mut out = append(&self.lens.len(), out)?;
        out.extend_from_slice(&self.bytes);
        append(&self.dropped, out)
    }

    /// The kept entries, decoded, oldest first.
    pub(crate) fn marks(&self) -> impl Iterator<Item = Mark> + '_ {
        // The bytes were encoded here, or checked entry by entry when decoded.
        self.decode().map_while(Result::ok)
    }

    /// Each kept entry, decoded, oldest first; an error ends the entries.
    fn decode(&self) -> impl Iterator<Item = postcard::Result<Mark>> + '_ {
        let mut rest = self.bytes.as_slice();
        (0..self.lens.len()).map(move |_| {
            let (mark, after) = postcard::take_from_bytes::<Mark>(rest)?;
            rest = after;
            Ok(mark)
        })
    }
}

impl Serialize for History {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut history = serializer.serialize_struct("History", 2)?;
        history.serialize_field("marks", &Marks(self))?;
        history.serialize_field("dropped", &self.dropped)?;
        history.end()
    }
}

/// The entries of a [`History`], serialized as a sequence.
struct Marks<'a>(&'a History);

impl Serialize for Marks<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let mut seq = serializer.serialize_seq(Some(self.0.lens.len()))?;
        for mark in self.0.decode() {
            seq.serialize_element(&mark.map_err(S::Error::custom)?)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for History {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The serialized form; the entries are encoded again one by one as they are
        /// read, never held decoded together.
        #[derive(Deserialize)]
        #[serde(rename = "History")]
        struct Repr {
            #[serde(deserialize_with = "encode_marks")]
            marks: History,
            dropped: u64,
        }
        let Repr { mut marks, dropped } = Repr::deserialize(deserializer)?;
        marks.dropped = dropped;
        Ok(marks)
    }
}

/// Reads a sequence of entries into a [`History`]'s encoded form.
fn encode_marks<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<History, D::Error> {
    struct Entries;
    impl<'de> serde::de::Visitor<'de> for Entries {
        type Value = History;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a sequence of history entries")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<History, A::Error> {
            let mut history = History {
                lens: VecDeque::with_capacity(seq.size_hint().unwrap_or(0)),
                ..History::default()
            };
            while let Some(mark) = seq.next_element::<Mark>()? {
                history.append(&mark).map_err(serde::de::Error::custom)?;
            }
            // A procedure read at start may wait long: no spare room.
            history.bytes.shrink_to_fit();
            Ok(history)
        }
    }
    deserializer.deserialize_seq(Entries)
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
        let states: Vec<_> = history.marks().map(|m| m.state).collect();
        assert_eq!(states, ["S2", "S3", "S4"]);
        assert_eq!(history.dropped, 2);
        assert_eq!(history.marks().next().map(|m| m.after_ms), Some(2));

        let mut none = History::default();
        none.push(mark(1), 0);
        assert_eq!(none.len(), 0);
        assert_eq!(none.dropped, 1);
    }

    /// The serialized form of the history as it was when it kept its entries decoded.
    #[derive(Serialize)]
    struct Decoded {
        marks: Vec<Mark>,
        dropped: u64,
    }

    fn decoded(history: &History) -> Decoded {
        Decoded {
            marks: history.marks().collect(),
            dropped: history.dropped,
        }
    }

    /// The kept encoding writes the bytes serde writes for a vector of entries and the
    /// dropped count, whatever was pushed and dropped, and after a decode.
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
            let reference = postcard::to_extend(&decoded(&history), vec![9]).unwrap();
            assert_eq!(kept, reference, "after {n}");
            assert_eq!(postcard::to_extend(&history, vec![9]).unwrap(), reference);
        }
        assert_eq!(history.len(), 7);
        let bytes = postcard::to_stdvec(&history).unwrap();
        let mut decoded: History = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(decoded, history);
        assert_eq!(decoded.write_to(Vec::new()).unwrap(), bytes);
        decoded.push(mark(99), 7);
        history.push(mark(99), 7);
        assert_eq!(
            decoded.write_to(Vec::new()).unwrap(),
            postcard::to_stdvec(&history).unwrap()
        );
        let states: Vec<_> = decoded.marks().map(|m| m.state.into_owned()).collect();
        assert_eq!(states.last().map(String::as_str), Some("S99"));
    }

    /// Entries that do not decode fail the history's decode: they are never kept.
    #[test]
    fn a_damaged_entry_fails_the_decode() {
        let mut history = History::default();
        history.push(mark(1), 4);
        let mut bytes = postcard::to_stdvec(&history).unwrap();
        // The entry's state name claims more bytes than there are.
        bytes[1] = 200;
        assert!(postcard::from_bytes::<History>(&bytes).is_err());
    }
}
