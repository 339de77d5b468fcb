//! The value the executor stores for each procedure: an envelope with what the runtime
//! and its operators need (what the procedure waits for, its nonce, its timestamps, its
//! locks, its trouble, its recent history), followed by the procedure's snapshot
//! ([`codec`](crate::codec)).
//!
//! ```text
//! +-------------------------------+----------------------------------------+
//! | Envelope (postcard)           | snapshot (codec: version, machine,     |
//! | version, wait, nonce, times,  | cursor, data), to the end              |
//! | locks, trouble, history, ...  |                                        |
//! +-------------------------------+----------------------------------------+
//! ```
//!
//! Everything in the envelope and the snapshot's header is readable without the
//! machine's types: [`operator`](crate::operator) reads records of any machine, at rest.

use crate::codec::CodecError;
use crate::locks::{Hold, Lock, Locks};
use crate::stored::codec::{MAX_LENGTH_BYTES, take_sized, write_length_before};
use crate::stored::head;
use crate::stored::history::{History, Mark, StepKind, StepOutcome};
use crate::stored::wire::append;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The version byte that starts every envelope. Version 1 (no update time, locks,
/// trouble, requests or history) and version 2 (no record of whether the procedure holds
/// its locks, no length) are still read. From version 3 on, the envelope's length
/// follows the version: a later version appends fields and stays readable, as far as
/// this build knows it, by this build (which then neither runs nor rewrites the record).
pub(crate) const ENVELOPE_VERSION: u8 = 4;

/// The first version whose envelope has a length (and so may be followed, inside that
/// length, by fields a later version appends).
const SIZED_SINCE: u8 = 3;

/// The first envelope version that stores the procedure's summary (`describe`), after
/// the history.
const SUMMARY_SINCE: u8 = 4;

/// The first envelope version that records the procedure's locks.
const LOCKS_SINCE: u8 = 2;

/// Whether a stored value's envelope records the procedure's locks: a version 1 envelope
/// does not, so only the procedure's data can tell them.
pub(crate) fn records_locks(value: &[u8]) -> bool {
    value.first().is_some_and(|&version| version >= LOCKS_SINCE)
}

thread_local! {
    /// The buffer each thread encodes records in; the record is then copied out at its
    /// exact size. Why: a store keeps a value as `Bytes`, which needs an extra header
    /// for a vector with spare capacity (`WalStore::commit` says what that costs), and a
    /// buffer grown per record reallocates: one copy costs less than either.
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The largest [`SCRATCH`] buffer kept between records: one huge record should not pin
/// its size for the thread's life.
const SCRATCH_KEPT: usize = 64 * 1024;

/// Metadata key holding the first procedure id not yet handed out (u64, little endian).
pub(crate) const NEXT_ID_KEY: &str = "procflow/next_id";
/// Metadata key holding the fencing token of the executor that last took the store over
/// (u64, little endian); written with that token as the executor starts.
pub(crate) const FENCE_KEY: &str = "procflow/fence";
/// Metadata key prefix mapping a nonce to its procedure id (u64, little endian).
pub(crate) const NONCE_PREFIX: &str = "procflow/nonce/";

/// What a procedure waits for before its next step. Variants are only appended: their
/// index is on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Wait {
    /// Nothing: it can run.
    Ready,
    /// These children to end.
    Children(Vec<u64>),
    /// The event `name`, or the wall-clock time `until_ms` (ms since the Unix epoch).
    Event { name: String, until_ms: Option<u64> },
}

/// Children a step started: undone (if they succeeded) before the state at `depth - 1` on
/// the rollback stack, the state that spawned them, is undone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Spawn {
    /// The rollback stack's length right after the spawning step.
    pub(crate) depth: usize,
    pub(crate) children: Vec<u64>,
}

/// The failures of the current step, as of the record's last write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Trouble {
    /// Failed tries of the current step.
    pub(crate) attempts: u32,
    /// The last one's error, displayed.
    pub(crate) error: String,
    /// Since when it is stuck past its point of no return (ms since the Unix epoch).
    pub(crate) stuck_since_ms: Option<u64>,
}

/// An operator's bypass: the procedure ended without running its handlers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BypassMark {
    pub(crate) by: String,
    pub(crate) reason: String,
    pub(crate) at_ms: u64,
}

/// The runtime's part of a stored procedure.
pub(crate) type Envelope = EnvelopeOf<History>;

/// An envelope read without its history and summary ([`Envelope::decode_head`]).
type EnvelopeHead = EnvelopeOf<Unread>;

/// The history of an [`EnvelopeHead`]: not read. It reads no bytes, so the fields before
/// the history are read and the rest of the body is left as it is.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub(crate) struct Unread;

/// The runtime's part of a stored procedure, its history of type `H`: an [`Envelope`],
/// or an [`EnvelopeHead`] whose history was not read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EnvelopeOf<H> {
    /// The format the record was read in (this build writes [`ENVELOPE_VERSION`]); a
    /// larger one is a record a newer build wrote. Not a field of the body: the version
    /// byte and the body's length come before it.
    #[serde(skip)]
    pub(crate) version: u8,
    pub(crate) wait: Wait,
    pub(crate) nonce: Option<String>,
    /// Wall-clock submit time, ms since the Unix epoch.
    pub(crate) submitted_ms: u64,
    /// Wall-clock end time, once finished.
    pub(crate) finished_ms: Option<u64>,
    /// Wall-clock time after which the procedure fails (rolls back), if it has a timeout.
    pub(crate) deadline_ms: Option<u64>,
    /// Children started and not yet undone, oldest first.
    pub(crate) spawns: Vec<Spawn>,
    // Version 2 from here.
    /// Wall-clock time of this write.
    pub(crate) updated_ms: u64,
    /// The locks it declared (so readers without its types know them) and how long it
    /// holds them.
    pub(crate) locks: Vec<Lock>,
    pub(crate) hold: Hold,
    /// Failures of the current step, if its last try failed.
    pub(crate) trouble: Option<Box<Trouble>>,
    /// Set when an operator bypassed it (it is then finished).
    pub(crate) bypass: Option<Box<BypassMark>>,
    // Version 3 from here.
    /// Whether the procedure held its locks for life when this record was written: a
    /// restart gives them back to exactly these procedures (`locks::restore`). Stored as
    /// a `bool`; `None` only for a record of an older version, which did not say.
    #[serde(with = "stored_bool")]
    pub(crate) holds_locks: Option<bool>,
    /// The last field, and the one serialization leaves out: [`Envelope::encode`]
    /// appends it from the encoding the history keeps (see [`History::write_to`]).
    #[serde(serialize_with = "appended_by_encode")]
    pub(crate) history: H,
    // Version 4 from here: after the history, so written and read by hand.
    /// The procedure's own summary for operators (`describe`), as of this write.
    #[serde(skip)]
    pub(crate) summary: Option<String>,
}

/// Writes nothing (postcard writes no bytes for a unit): `encode_as_is` appends the
/// history after the other fields.
fn appended_by_encode<H, S: serde::Serializer>(_: &H, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_unit()
}

/// [`Envelope::holds_locks`] on disk: a plain `bool` (every record this version writes
/// says), read back as `Some`.
mod stored_bool {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Option<bool>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(value.unwrap_or(false))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
        bool::deserialize(d).map(Some)
    }
}

/// Envelope version 2, as stores written before version 3 hold it: version 3's fields but
/// [`Envelope::holds_locks`].
#[derive(Deserialize)]
struct EnvelopeV2 {
    _version: u8,
    wait: Wait,
    nonce: Option<String>,
    submitted_ms: u64,
    finished_ms: Option<u64>,
    deadline_ms: Option<u64>,
    spawns: Vec<Spawn>,
    updated_ms: u64,
    locks: Vec<Lock>,
    hold: Hold,
    trouble: Option<Box<Trouble>>,
    bypass: Option<Box<BypassMark>>,
    history: History,
}

impl From<EnvelopeV2> for Envelope {
    fn from(v2: EnvelopeV2) -> Self {
        Self {
            version: ENVELOPE_VERSION,
            wait: v2.wait,
            nonce: v2.nonce,
            submitted_ms: v2.submitted_ms,
            finished_ms: v2.finished_ms,
            deadline_ms: v2.deadline_ms,
            spawns: v2.spawns,
            updated_ms: v2.updated_ms,
            locks: v2.locks,
            hold: v2.hold,
            trouble: v2.trouble,
            bypass: v2.bypass,
            holds_locks: None,
            history: v2.history,
            summary: None,
        }
    }
}

impl From<EnvelopeHead> for Envelope {
    /// The envelope with an empty history and no summary.
    fn from(head: EnvelopeHead) -> Self {
        let EnvelopeOf {
            version,
            wait,
            nonce,
            submitted_ms,
            finished_ms,
            deadline_ms,
            spawns,
            updated_ms,
            locks,
            hold,
            trouble,
            bypass,
            holds_locks,
            history: Unread,
            summary,
        } = head;
        Self {
            version,
            wait,
            nonce,
            submitted_ms,
            finished_ms,
            deadline_ms,
            spawns,
            updated_ms,
            locks,
            hold,
            trouble,
            bypass,
            holds_locks,
            history: History::default(),
            summary,
        }
    }
}

/// Envelope version 1, as stores written before version 2 hold it.
#[derive(Deserialize)]
struct EnvelopeV1 {
    _version: u8,
    wait: Wait,
    nonce: Option<String>,
    submitted_ms: u64,
    finished_ms: Option<u64>,
    deadline_ms: Option<u64>,
    spawns: Vec<Spawn>,
}

impl From<EnvelopeV1> for Envelope {
    fn from(v1: EnvelopeV1) -> Self {
        Self {
            wait: v1.wait,
            nonce: v1.nonce,
            submitted_ms: v1.submitted_ms,
            finished_ms: v1.finished_ms,
            deadline_ms: v1.deadline_ms,
            spawns: v1.spawns,
            updated_ms: v1.finished_ms.unwrap_or(v1.submitted_ms),
            holds_locks: None,
            ..Self::new(None, None, &Locks::none())
        }
    }
}

impl Envelope {
    pub(crate) fn new(nonce: Option<String>, deadline_ms: Option<u64>, locks: &Locks) -> Self {
        let now = now_ms();
        Self {
            version: ENVELOPE_VERSION,
            wait: Wait::Ready,
            nonce,
            submitted_ms: now,
            finished_ms: None,
            deadline_ms,
            spawns: Vec::new(),
            updated_ms: now,
            locks: locks.locks().to_vec(),
            hold: locks.hold(),
            trouble: None,
            bypass: None,
            holds_locks: Some(false),
            history: History::default(),
            summary: None,
        }
    }

    /// The locks recorded at submit: those the procedure declared, held as it said.
    pub(crate) fn declared_locks(&self) -> Locks {
        let locks = Locks::new(self.locks.iter().cloned());
        match self.hold {
            Hold::ForLife => locks,
            Hold::PerStep => locks.per_step(),
        }
    }

    /// Appends an entry to the history, keeping the newest `keep`.
    pub(crate) fn note(
        &mut self,
        state: &'static str,
        kind: StepKind,
        outcome: StepOutcome,
        keep: usize,
    ) -> u64 {
        self.note_at(state, kind, outcome, keep, now_ms())
    }

    /// [`note`](Self::note), the entry's time `now` (ms since the Unix epoch), which it
    /// returns.
    pub(crate) fn note_at(
        &mut self,
        state: &'static str,
        kind: StepKind,
        outcome: StepOutcome,
        keep: usize,
        now: u64,
    ) -> u64 {
        let mark = Mark {
            state: Cow::Borrowed(state),
            kind,
            after_ms: now.saturating_sub(self.submitted_ms),
            outcome,
        };
        self.history.push(mark, keep);
        now
    }

    /// Marks the procedure bypassed and finished, without running anything.
    pub(crate) fn bypass(&mut self, state: &'static str, by: &str, reason: &str, keep: usize) {
        let now = now_ms();
        let outcome = StepOutcome::Bypassed {
            by: by.to_owned(),
            reason: reason.to_owned(),
        };
        self.note(state, StepKind::Control, outcome, keep);
        self.bypass = Some(Box::new(BypassMark {
            by: by.to_owned(),
            reason: reason.to_owned(),
            at_ms: now,
        }));
        self.finished_ms = Some(now);
        self.wait = Wait::Ready;
    }

    /// Writes the envelope, stamped with the time of this write, and appends the snapshot
    /// bytes `encode_snapshot` produces into the same buffer. The value returned has no
    /// spare capacity ([`SCRATCH`] says why).
    pub(crate) fn encode(
        &mut self,
        encode_snapshot: impl FnOnce(Vec<u8>) -> Result<Vec<u8>, CodecError>,
    ) -> Result<Vec<u8>, CodecError> {
        self.updated_ms = now_ms();
        self.encode_as_is(encode_snapshot)
    }

    /// [`encode`](Self::encode) without touching the update time.
    pub(crate) fn encode_as_is(
        &self,
        encode_snapshot: impl FnOnce(Vec<u8>) -> Result<Vec<u8>, CodecError>,
    ) -> Result<Vec<u8>, CodecError> {
        let failed = |source| CodecError::Encode {
            machine: "(envelope)",
            source,
        };
        // The version and the body's length go before the body, which is written first:
        // room is left for them, so that the body (the history with it, most of a
        // record) is not moved to make room once its length is known.
        let mut scratch = SCRATCH.take();
        scratch.resize(1 + MAX_LENGTH_BYTES, 0);
        let body = scratch.len();
        let out = append(self, scratch).map_err(failed)?;
        let out = self.history.write_to(out).map_err(failed)?;
        let mut out = append(&self.summary, out).map_err(failed)?;
        let version_at = write_length_before(&mut out, body) - 1;
        out[version_at] = ENVELOPE_VERSION;
        let mut out = encode_snapshot(out)?;
        let value = out[version_at..].to_vec();
        if out.capacity() <= SCRATCH_KEPT {
            out.clear();
            SCRATCH.set(out);
        }
        Ok(value)
    }

    /// Splits a stored value into its envelope and snapshot.
    pub(crate) fn decode(bytes: &[u8]) -> Result<(Self, &[u8]), String> {
        match bytes.first() {
            Some(1) => {
                let (v1, snapshot) =
                    postcard::take_from_bytes::<EnvelopeV1>(bytes).map_err(unreadable)?;
                Ok((v1.into(), snapshot))
            }
            Some(2) => {
                let (v2, snapshot) =
                    postcard::take_from_bytes::<EnvelopeV2>(bytes).map_err(unreadable)?;
                Ok((v2.into(), snapshot))
            }
            // This build's version, or a later one, which appends to the fields it knows.
            // A sized envelope: this build's version, an older sized one, or a later one,
            // which appends to the fields this build knows.
            Some(&version) if version >= SIZED_SINCE => {
                let mut parts = take_sized_envelope::<History>(bytes)?;
                if version >= SUMMARY_SINCE {
                    parts.envelope.summary =
                        postcard::take_from_bytes(parts.rest).map_err(unreadable)?.0;
                }
                Ok((parts.envelope, parts.snapshot))
            }
            Some(version) => Err(format!(
                "envelope version {version} is not supported (this procflow reads 1 to {ENVELOPE_VERSION})"
            )),
            None => Err("empty record".to_owned()),
        }
    }
}

impl Envelope {
    /// [`decode`](Self::decode) without the history and the summary (empty and `None`):
    /// what a restart needs of a procedure that stays dormant, which decodes its stored
    /// value again, whole, when it is roused. Reading a history entry by entry cost
    /// about a fifth of the executor's start (docs/BENCHMARKS.md). An envelope of
    /// version 1 or 2, unsized, is decoded whole.
    pub(crate) fn decode_head(bytes: &[u8]) -> Result<(Self, &[u8]), String> {
        match bytes.first() {
            Some(&version) if version >= SIZED_SINCE => {
                let parts = take_sized_envelope::<Unread>(bytes)?;
                Ok((parts.envelope.into(), parts.snapshot))
            }
            _ => Self::decode(bytes),
        }
    }
}

/// A sized envelope read up to its history ([`take_sized_envelope`]).
struct SizedParts<'a, H> {
    /// Its fields, the history read as `H`, the version set.
    envelope: EnvelopeOf<H>,
    /// What follows in the body: the summary, or the history itself when it was not read.
    rest: &'a [u8],
    /// The snapshot after the body.
    snapshot: &'a [u8],
}

/// Reads a sized envelope's fields up to its history, read as `H`.
fn take_sized_envelope<H: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<SizedParts<'_, H>, String> {
    let (body, snapshot) = take_sized(&bytes[1..]).map_err(unreadable)?;
    let (envelope, rest) = match head::read::<H>(body, bytes[0]) {
        Some(read) => read,
        None => {
            // What the hand reader does not take: serde reads it, or says what is wrong.
            let (mut envelope, rest) =
                postcard::take_from_bytes::<EnvelopeOf<H>>(body).map_err(unreadable)?;
            envelope.version = bytes[0];
            (envelope, rest)
        }
    };
    Ok(SizedParts {
        envelope,
        rest,
        snapshot,
    })
}

fn unreadable(e: postcard::Error) -> String {
    format!("unreadable envelope: {e}")
}

/// Milliseconds since the Unix epoch, for the timestamps that must survive a restart.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stored::codec::insert_length;

    #[test]
    fn envelope_round_trips_and_leaves_the_snapshot() {
        let locks = Locks::new([Lock::exclusive("ns/t1").unwrap()]);
        let mut envelope = Envelope::new(Some("req-1".into()), Some(5), &locks);
        envelope.note("Prepare", StepKind::Execute, StepOutcome::Moved, 8);
        envelope.wait = Wait::Event {
            name: "region-open".into(),
            until_ms: Some(9),
        };
        let bytes = envelope
            .encode(|mut out| {
                out.extend_from_slice(b"snapshot");
                Ok(out)
            })
            .unwrap();
        let (back, rest) = Envelope::decode(&bytes).unwrap();
        assert_eq!(back, envelope);
        assert_eq!(rest, b"snapshot");
        assert!(Envelope::decode(&bytes[..3]).is_err());
    }

    /// The head is the envelope but for its history and summary, and leaves the same
    /// snapshot.
    #[test]
    fn the_head_is_the_envelope_without_history_or_summary() {
        let locks = Locks::new([Lock::exclusive("ns/t1").unwrap()]);
        let mut envelope = Envelope::new(Some("req-2".into()), Some(7), &locks);
        envelope.note("Prepare", StepKind::Execute, StepOutcome::Moved, 8);
        envelope.note(
            "Wait",
            StepKind::Execute,
            StepOutcome::Suspended("go".into()),
            8,
        );
        envelope.summary = Some("moving region 7".into());
        envelope.wait = Wait::Event {
            name: "go".into(),
            until_ms: None,
        };
        let bytes = envelope
            .encode(|mut out| {
                out.extend_from_slice(b"snapshot");
                Ok(out)
            })
            .unwrap();
        let (head, rest) = Envelope::decode_head(&bytes).unwrap();
        assert_eq!(rest, b"snapshot");
        assert_eq!(head.history, History::default());
        assert_eq!(head.summary, None);
        let whole = Envelope {
            history: History::default(),
            summary: None,
            ..envelope
        };
        assert_eq!(head, whole);
        assert!(Envelope::decode_head(&bytes[..3]).is_err());
    }

    #[test]
    fn the_locks_recorded_at_submit_read_back_as_declared() {
        let locks = Locks::new([
            Lock::exclusive("ns/t1").unwrap(),
            Lock::shared("ns").unwrap(),
        ]);
        for locks in [locks.clone(), locks.per_step()] {
            let mut envelope = Envelope::new(None, None, &locks);
            let bytes = envelope.encode(Ok).unwrap();
            let (back, _) = Envelope::decode(&bytes).unwrap();
            assert_eq!(back.declared_locks(), locks);
            assert!(records_locks(&bytes));
        }
        // Version 1 recorded none: only the data can tell.
        assert!(!records_locks(&[1, 0]));
        assert!(!records_locks(&[]));
    }

    #[test]
    fn version_1_envelopes_are_still_read() {
        // Version 1's fields, as a release before version 2 wrote them.
        let v1 = (
            1u8,
            Wait::Ready,
            Some("n"),
            1_000u64,
            Some(2_000u64),
            None::<u64>,
        );
        let mut bytes = postcard::to_stdvec(&v1).unwrap();
        bytes.push(0); // no spawns
        bytes.extend_from_slice(b"snapshot");
        let (envelope, rest) = Envelope::decode(&bytes).unwrap();
        assert_eq!(envelope.version, ENVELOPE_VERSION);
        assert_eq!(envelope.nonce.as_deref(), Some("n"));
        assert_eq!(envelope.finished_ms, Some(2_000));
        assert_eq!(envelope.updated_ms, 2_000);
        assert_eq!(envelope.history.len(), 0);
        assert_eq!(rest, b"snapshot");
        assert!(Envelope::decode(&[0, 0]).unwrap_err().contains("version 0"));
    }

    /// A later build's envelope appends fields to its body: this build reads the fields
    /// it knows, says which version it read, and finds the snapshot after the body.
    #[test]
    fn a_newer_envelope_is_read_as_far_as_this_build_knows_it() {
        let mut envelope = Envelope::new(Some("n".into()), None, &Locks::none());
        envelope.holds_locks = Some(true);
        let mut bytes = envelope.encode(Ok).unwrap();
        let (body, _) = take_sized(&bytes[1..]).unwrap();
        let mut body = body.to_vec();
        body.extend_from_slice(&[0xAB, 0xCD]); // The next version's new fields.
        let mut newer = vec![ENVELOPE_VERSION + 1];
        newer.extend_from_slice(&body);
        insert_length(&mut newer, 1);
        newer.extend_from_slice(b"snapshot");
        let (read, rest) = Envelope::decode(&newer).unwrap();
        assert_eq!(read.version, ENVELOPE_VERSION + 1);
        assert_eq!(read.nonce.as_deref(), Some("n"));
        assert_eq!(read.holds_locks, Some(true));
        assert_eq!(rest, b"snapshot");
        bytes.extend_from_slice(b"snapshot");
        assert_eq!(
            Envelope::decode(&bytes).unwrap().0.version,
            ENVELOPE_VERSION
        );
    }

    /// Version 4 stores the procedure's summary after the history; a version 3 envelope
    /// (the same body without it) reads as having none.
    #[test]
    fn the_summary_round_trips_and_a_version_3_envelope_has_none() {
        let mut envelope = Envelope::new(None, None, &Locks::none());
        envelope.note("Prepare", StepKind::Execute, StepOutcome::Moved, 8);
        envelope.summary = Some("table users, 4 regions".into());
        let bytes = envelope.encode(Ok).unwrap();
        assert_eq!(Envelope::decode(&bytes).unwrap().0, envelope);

        envelope.summary = None;
        let bytes = envelope.encode(Ok).unwrap();
        let (body, _) = take_sized(&bytes[1..]).unwrap();
        assert_eq!(body.last(), Some(&0), "`None`, the body's last byte");
        let mut v3 = vec![3u8];
        v3.extend_from_slice(&body[..body.len() - 1]);
        insert_length(&mut v3, 1);
        v3.extend_from_slice(b"snapshot");
        let (read, rest) = Envelope::decode(&v3).unwrap();
        assert_eq!(
            (read.version, read.summary, rest),
            (3, None, &b"snapshot"[..])
        );
        assert_eq!(read.history, envelope.history);
    }

    #[test]
    fn version_2_envelopes_are_read_as_not_saying_whether_they_hold_their_locks() {
        let lock = Lock::exclusive("ns/t1").unwrap();
        let mut history = History::default();
        history.push(
            Mark {
                state: "Prepare".into(),
                kind: StepKind::Execute,
                after_ms: 5,
                outcome: StepOutcome::Moved,
            },
            8,
        );
        // Version 2's fields, as a release before version 3 wrote them.
        let v2 = (
            (2u8, Wait::Ready, None::<String>, 1_000u64, None::<u64>),
            (
                None::<u64>,
                Vec::<Spawn>::new(),
                1_500u64,
                vec![lock.clone()],
            ),
            (Hold::ForLife, None::<Trouble>, None::<BypassMark>, &history),
        );
        let mut bytes = postcard::to_stdvec(&v2).unwrap();
        bytes.extend_from_slice(b"snapshot");
        let (envelope, rest) = Envelope::decode(&bytes).unwrap();
        assert_eq!(rest, b"snapshot");
        assert_eq!(
            envelope.holds_locks, None,
            "a version 2 record does not say"
        );
        assert_eq!(envelope.locks, [lock]);
        assert_eq!(envelope.updated_ms, 1_500);
        assert_eq!(envelope.history, history);
        // Written again, it says, as a `bool`.
        let mut again = envelope;
        again.holds_locks = Some(true);
        let bytes = again.encode(Ok).unwrap();
        assert_eq!(Envelope::decode(&bytes).unwrap().0.holds_locks, Some(true));
    }
}
