//! An envelope's fields before its history, read by hand for every procedure a restart
//! loads.
//!
//! Through serde the head cost a restart about 1,100 instructions per procedure, for a
//! dozen small fields that nearly always take the same few shapes (issue 33). postcard
//! writes a struct as its fields one after the other with nothing between them, so each
//! field can be read on its own: the plain ones (integers, options, the wait, the hold,
//! the flag) by hand, the rare ones (children spawned, locks, trouble, a bypass) through
//! serde when they are not empty. The reader answers `None` for anything it does not
//! take as postcard would (damaged bytes, an unknown variant): the caller then reads
//! through serde, which says what is wrong. A test holds it to serde on damaged bytes.
//!
//! Writing stays with serde: a hand writer was tried and was not cheaper (postcard
//! writes these fields as tightly; docs/BENCHMARKS.md, stop 50).

use crate::locks::Hold;
use crate::stored::record::{EnvelopeOf, Wait};
use crate::stored::wire::{take_str, take_varint};
use serde::de::DeserializeOwned;

/// The most bytes a varint of a `u32` (an enum's variant index) takes.
const U32_BYTES: usize = 5;
/// The most bytes a varint of a `u64` or a length takes.
const U64_BYTES: usize = 10;

/// Reads an envelope of version `version` from `body`, its body, up to and with its
/// history, read as `H` through serde (a `History`, or `Unread`, which reads nothing).
/// `None` where serde must read it instead.
pub(crate) fn read<H: DeserializeOwned>(
    body: &[u8],
    version: u8,
) -> Option<(EnvelopeOf<H>, &[u8])> {
    let (wait, rest) = take_wait(body)?;
    let (nonce, rest) = take_option(rest, take_string)?;
    let (submitted_ms, rest) = take_varint(rest, U64_BYTES)?;
    let (finished_ms, rest) = take_option(rest, take_u64)?;
    let (deadline_ms, rest) = take_option(rest, take_u64)?;
    let (spawns, rest) = take_unless_empty(rest)?;
    let (updated_ms, rest) = take_varint(rest, U64_BYTES)?;
    let (locks, rest) = take_unless_empty(rest)?;
    let (hold, rest) = take_hold(rest)?;
    let (trouble, rest) = take_unless_none(rest)?;
    let (bypass, rest) = take_unless_none(rest)?;
    let (holds_locks, rest) = take_bool(rest)?;
    let (history, rest) = postcard::take_from_bytes(rest).ok()?;
    let envelope = EnvelopeOf {
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
        holds_locks: Some(holds_locks),
        history,
        summary: None,
    };
    Some((envelope, rest))
}

fn take_wait(bytes: &[u8]) -> Option<(Wait, &[u8])> {
    let (variant, rest) = take_varint(bytes, U32_BYTES)?;
    match variant {
        0 => Some((Wait::Ready, rest)),
        1 => {
            let (count, mut rest) = take_varint(rest, U64_BYTES)?;
            // Each child takes at least a byte: a count past the bytes left is damage,
            // not a reason to reserve room.
            let mut children = Vec::with_capacity(usize::try_from(count).ok()?.min(rest.len()));
            for _ in 0..count {
                let (child, after) = take_varint(rest, U64_BYTES)?;
                children.push(child);
                rest = after;
            }
            Some((Wait::Children(children), rest))
        }
        2 => {
            let (name, rest) = take_string(rest)?;
            let (until_ms, rest) = take_option(rest, take_u64)?;
            Some((Wait::Event { name, until_ms }, rest))
        }
        _ => None,
    }
}

fn take_hold(bytes: &[u8]) -> Option<(Hold, &[u8])> {
    let (variant, rest) = take_varint(bytes, U32_BYTES)?;
    let hold = match variant {
        0 => Hold::ForLife,
        1 => Hold::PerStep,
        _ => return None,
    };
    Some((hold, rest))
}

fn take_u64(bytes: &[u8]) -> Option<(u64, &[u8])> {
    take_varint(bytes, U64_BYTES)
}

fn take_string(bytes: &[u8]) -> Option<(String, &[u8])> {
    let (text, rest) = take_str(bytes)?;
    Some((std::str::from_utf8(text).ok()?.to_owned(), rest))
}

fn take_bool(bytes: &[u8]) -> Option<(bool, &[u8])> {
    match bytes.split_first()? {
        (0, rest) => Some((false, rest)),
        (1, rest) => Some((true, rest)),
        _ => None,
    }
}

fn take_option<T>(
    bytes: &[u8],
    take: impl FnOnce(&[u8]) -> Option<(T, &[u8])>,
) -> Option<(Option<T>, &[u8])> {
    match bytes.split_first()? {
        (0, rest) => Some((None, rest)),
        (1, rest) => take(rest).map(|(value, rest)| (Some(value), rest)),
        _ => None,
    }
}

/// A sequence: empty read by hand, any other through serde.
fn take_unless_empty<T: DeserializeOwned>(bytes: &[u8]) -> Option<(Vec<T>, &[u8])> {
    match bytes.split_first()? {
        (0, rest) => Some((Vec::new(), rest)),
        _ => postcard::take_from_bytes(bytes).ok(),
    }
}

/// An option: `None` read by hand, `Some` through serde.
fn take_unless_none<T: DeserializeOwned>(bytes: &[u8]) -> Option<(Option<T>, &[u8])> {
    match bytes.split_first()? {
        (0, rest) => Some((None, rest)),
        _ => postcard::take_from_bytes(bytes).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::{Lock, Locks};
    use crate::stored::history::{History, Mark, StepKind, StepOutcome};
    use crate::stored::record::{BypassMark, Envelope, Spawn, Trouble};
    use crate::stored::wire::append;
    use std::borrow::Cow;

    /// Envelopes of every shape a head takes: each wait, options set and not, numbers
    /// that take one byte and ten, the rare fields filled.
    fn samples() -> Vec<Envelope> {
        let locks = Locks::new([
            Lock::exclusive("table/a").unwrap(),
            Lock::shared("db").unwrap(),
        ]);
        let mut all = Vec::new();
        let plain = Envelope::new(None, None, &Locks::none());
        all.push(plain.clone());
        let mut full = Envelope::new(
            Some("nonce-ü".into()),
            Some(u64::MAX),
            &locks.clone().per_step(),
        );
        full.wait = Wait::Event {
            name: "event/7".into(),
            until_ms: Some(1_700_000_000_000),
        };
        full.finished_ms = Some(127);
        full.spawns = vec![Spawn {
            depth: 3,
            children: vec![1, 300, u64::MAX],
        }];
        full.trouble = Some(Box::new(Trouble {
            attempts: 70_000,
            error: "disk full".into(),
            stuck_since_ms: Some(128),
        }));
        full.bypass = Some(Box::new(BypassMark {
            by: "ops".into(),
            reason: "stuck".into(),
            at_ms: 5,
        }));
        full.holds_locks = Some(true);
        all.push(full);
        let mut children = Envelope::new(None, Some(0), &locks);
        children.wait = Wait::Children(vec![0, 1, 128, 1 << 40]);
        children.holds_locks = None;
        children.submitted_ms = 0;
        children.updated_ms = u64::MAX;
        all.push(children);
        let mut empty = plain.clone();
        empty.wait = Wait::Children(Vec::new());
        empty.nonce = Some(String::new());
        empty.wait = Wait::Event {
            name: String::new(),
            until_ms: None,
        };
        all.push(empty);
        for envelope in &mut all {
            let mark = Mark {
                state: Cow::Borrowed("Work"),
                kind: StepKind::Execute,
                after_ms: 3,
                outcome: StepOutcome::Moved,
            };
            envelope.history.push(mark, 4);
        }
        all
    }

    /// The head and then the history, as `Envelope::encode` writes a body's start.
    fn body(envelope: &Envelope) -> Vec<u8> {
        let head = append(envelope, Vec::new()).unwrap();
        envelope.history.write_to(head).unwrap()
    }

    #[test]
    fn reads_what_serde_reads() {
        for envelope in samples() {
            let mut bytes = body(&envelope);
            bytes.extend_from_slice(b"after");
            let (read, rest) = read::<History>(&bytes, 4).expect("read by hand");
            let (mut serde, serde_rest) = postcard::take_from_bytes::<Envelope>(&bytes).unwrap();
            serde.version = 4;
            assert_eq!(read, serde);
            assert_eq!(rest, serde_rest);
            assert_eq!(rest, b"after");
        }
    }

    /// Every byte of every sample replaced by values that matter to postcard (option
    /// tags, variant indexes, a varint's continuation bit, bytes that are not UTF-8),
    /// and every sample cut short: what the hand reader takes, serde takes alike, and
    /// what serde refuses, the hand reader leaves to it.
    #[test]
    fn damaged_bytes_are_read_by_hand_only_as_serde_reads_them() {
        let mut checked = 0;
        for envelope in samples() {
            let bytes = body(&envelope);
            let mut damaged: Vec<Vec<u8>> = (0..bytes.len()).map(|n| bytes[..n].to_vec()).collect();
            for at in 0..bytes.len() {
                for value in [
                    0,
                    1,
                    2,
                    3,
                    0x7f,
                    0x80,
                    0xc3,
                    0xff,
                    bytes[at].wrapping_add(1),
                ] {
                    let mut copy = bytes.clone();
                    copy[at] = value;
                    damaged.push(copy);
                }
            }
            for bytes in damaged {
                let serde = postcard::take_from_bytes::<Envelope>(&bytes);
                match (read::<History>(&bytes, 4), serde) {
                    (Some((read, rest)), Ok((mut serde, serde_rest))) => {
                        serde.version = 4;
                        assert_eq!(read, serde, "{bytes:?}");
                        assert_eq!(rest, serde_rest, "{bytes:?}");
                    }
                    (Some(read), Err(error)) => {
                        panic!("read by hand, refused by serde ({error}): {read:?} from {bytes:?}")
                    }
                    (None, _) => {}
                }
                checked += 1;
            }
        }
        assert!(checked > 1_000, "{checked}");
    }

    #[test]
    fn the_envelopes_head_alone_reads_as_before() {
        for envelope in samples() {
            let mut value = Vec::new();
            let encoded = envelope
                .encode_as_is(|mut out| {
                    out.extend_from_slice(b"snapshot");
                    Ok(out)
                })
                .unwrap();
            value.extend_from_slice(&encoded);
            let (head, snapshot) = Envelope::decode_head(&value).unwrap();
            assert_eq!(snapshot, b"snapshot");
            let expected = Envelope {
                history: History::default(),
                summary: None,
                holds_locks: Some(envelope.holds_locks.unwrap_or(false)),
                version: 4,
                ..envelope.clone()
            };
            assert_eq!(head, expected);
            let (whole, _) = Envelope::decode(&value).unwrap();
            assert_eq!(whole.history, envelope.history);
        }
    }
}
