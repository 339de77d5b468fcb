//! The persisted form of a procedure: a header naming its machine, its data version and
//! its cursor, then its data.
//!
//! ```text
//! version 2 (written):
//! +---------+------------+-----------------+--------------+--------+-----------------+
//! | version | header_len | machine name    | data_version | cursor | procedure data  |
//! | u8 = 2  | varint     | postcard string | varint u32   |        | to the end      |
//! +---------+------------+-----------------+--------------+--------+-----------------+
//!                        |<----------------- header_len bytes ---------------->|
//!
//! version 1 (still read; its data version is 1):
//! +---------+-----------------+--------------+-----------------+
//! | version | machine name    | cursor       | procedure data  |
//! +---------+-----------------+--------------+-----------------+
//! ```
//!
//! The machine name comes first so a registry can read it ([`machine_name`]) without
//! knowing the machine's types. The data version says which version of the procedure
//! type wrote the data, so an older version's data is read through the machine's
//! migration ([`StateMachine::migrate`]) and a newer one's is recognised as newer.
//!
//! The header's length is stored so that a later format can append fields to the header
//! and still be read, as far as this build knows it, by this build: a snapshot of a newer
//! format is read (machine, data version, cursor) and reported as written by a newer
//! build (the split header's `format`), never decoded as data this build would misread.
//! docs/FORMAT.md describes every field.

use crate::cursor::{Glance, Repr};
use crate::stored::wire::{
    MAX_VARINT_BYTES, append, push_str, push_varint, take_str, take_varint, varint,
};
use crate::{Cursor, StateMachine};
use serde::Deserialize;
use std::borrow::Cow;

/// The version byte that starts every snapshot this build writes.
pub const SNAPSHOT_VERSION: u8 = 2;

/// Why a snapshot could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Serializing the procedure data failed.
    #[error("cannot serialize procedure of machine `{machine}`: {source}")]
    Encode {
        /// The machine's stable name.
        machine: &'static str,
        /// postcard's error.
        source: postcard::Error,
    },
    /// The bytes are not a snapshot procflow can read (version 0: not a snapshot).
    #[error(
        "snapshot version {found} is not supported (this procflow reads 1 to {SNAPSHOT_VERSION})"
    )]
    UnsupportedVersion {
        /// The version byte found.
        found: u8,
    },
    /// The snapshot was written by a newer procflow, in a format this build reads only
    /// as far as the runtime needs (machine, data version, cursor): its data is not
    /// decoded, and the procedure is not run or rewritten by this build.
    #[error(
        "written by a newer build: snapshot format {found}, this procflow writes {SNAPSHOT_VERSION}; \
         run a build at least as new"
    )]
    NewerFormat {
        /// The format version found.
        found: u8,
    },
    /// The snapshot belongs to another machine.
    #[error("snapshot is of machine `{found}`, not `{expected}`")]
    WrongMachine {
        /// The machine asked for.
        expected: &'static str,
        /// The machine named in the snapshot.
        found: String,
    },
    /// The snapshot is at (or went through) a state the machine no longer has.
    #[error(
        "`{state}` is not a state of machine `{machine}` (was the variant renamed or removed? \
         a renamed state keeps its old name as `#[alias = \"{state}\"]`)"
    )]
    UnknownState {
        /// The machine's stable name.
        machine: &'static str,
        /// The state name found in the snapshot.
        state: String,
    },
    /// The data was written by a newer version of the procedure type than this build's.
    #[error(
        "written by a newer build: data version {found} of machine `{machine}`, this build \
         reads up to {this_build}; run a build at least as new"
    )]
    NewerDataVersion {
        /// The machine's stable name.
        machine: &'static str,
        /// The data version stored.
        found: u32,
        /// [`StateMachine::DATA_VERSION`] of this build.
        this_build: u32,
    },
    /// The data is of a version this build has no migration for.
    #[error(
        "no migration for data version {version} of machine `{machine}`: this build reads \
         versions {oldest} to its own; add `migrate({version} = OldType)` to the machine"
    )]
    NoMigration {
        /// The machine's stable name.
        machine: &'static str,
        /// The data version stored.
        version: u32,
        /// [`StateMachine::OLDEST_VERSION`] of this build.
        oldest: u32,
    },
    /// The bytes are damaged, or the data no longer matches the procedure type (of its
    /// version: the migration's old type, for an older version).
    #[error("cannot read snapshot of machine `{machine}` (data version {version}): {source}")]
    Decode {
        /// The machine's stable name, or `?` when not even the header could be read.
        machine: String,
        /// The data version stored (0 when not even the header could be read).
        version: u32,
        /// postcard's error (a state name that is no longer a variant shows up here).
        source: postcard::Error,
    },
}

/// A snapshot split into its parts, without the machine's types.
pub(crate) struct Split<'a> {
    /// The snapshot's format version: newer than [`SNAPSHOT_VERSION`] for a snapshot a
    /// newer build wrote (read as far as this build knows the header).
    pub(crate) format: u8,
    pub(crate) machine: Cow<'a, str>,
    pub(crate) data_version: u32,
    pub(crate) cursor: Repr<'a>,
    /// The procedure's data, as stored.
    pub(crate) data: &'a [u8],
}

/// The start of every header, versions 1 and 2: enough to name the machine.
#[derive(Deserialize)]
struct Version1Start<'a> {
    version: u8,
    #[serde(borrow)]
    machine: Cow<'a, str>,
}

/// What follows the length of a version 2 (or later) header.
#[derive(Deserialize)]
struct HeaderStart<'a> {
    #[serde(borrow)]
    machine: Cow<'a, str>,
    data_version: u32,
    #[serde(borrow)]
    cursor: Repr<'a>,
}

/// Writes the snapshot of a procedure of machine `M`, at its current data version.
///
/// # Errors
///
/// [`CodecError::Encode`] if the procedure data cannot be serialized.
pub fn encode<M: StateMachine>(
    procedure: &M::Procedure,
    cursor: &Cursor<M>,
) -> Result<Vec<u8>, CodecError> {
    encode_into(procedure, cursor, Vec::with_capacity(64))
}

/// Appends the snapshot of a procedure of machine `M` to `out` (a record may start with
/// a header of its own).
///
/// # Errors
///
/// [`CodecError::Encode`] if the procedure data cannot be serialized.
pub fn encode_into<M: StateMachine>(
    procedure: &M::Procedure,
    cursor: &Cursor<M>,
    out: Vec<u8>,
) -> Result<Vec<u8>, CodecError> {
    let error = |source| CodecError::Encode {
        machine: M::NAME,
        source,
    };
    // One buffer: the data follows the header without a length prefix of its own.
    let bytes = encode_header_into(cursor, M::DATA_VERSION, out)?;
    append(procedure, bytes).map_err(error)
}

/// Appends the snapshot of a procedure of machine `M` whose data is still encoded, as
/// [`decode_cursor`] left it: the header, with the data's own version, then `data`
/// unchanged. For data postcard wrote, the bytes are those [`encode_into`] would write
/// after decoding it (at the data's version: data of another version is rewritten as it
/// was, never relabelled).
///
/// # Errors
///
/// [`CodecError::Encode`] if the header cannot be serialized.
pub(crate) fn encode_stored_into<M: StateMachine>(
    cursor: &Cursor<M>,
    data_version: u32,
    data: &[u8],
    out: Vec<u8>,
) -> Result<Vec<u8>, CodecError> {
    let mut bytes = encode_header_into(cursor, data_version, out)?;
    bytes.extend_from_slice(data);
    Ok(bytes)
}

/// Appends the header: version, its length, machine name, data version, cursor. Written
/// by hand, the bytes postcard writes for a struct of those three fields (see
/// [`Cursor::write_into`]).
fn encode_header_into<M: StateMachine>(
    cursor: &Cursor<M>,
    data_version: u32,
    mut out: Vec<u8>,
) -> Result<Vec<u8>, CodecError> {
    out.push(SNAPSHOT_VERSION);
    let start = out.len();
    // One byte of room for the length: a header under 128 bytes, the usual one, then
    // needs no bytes moved after it is written.
    out.push(0);
    push_str(&mut out, M::NAME);
    push_varint(&mut out, u64::from(data_version));
    let mut out = cursor
        .write_into(out)
        .map_err(|source| CodecError::Encode {
            machine: M::NAME,
            source,
        })?;
    let len = out.len() - start - 1;
    match u8::try_from(len) {
        Ok(len) if len < 0x80 => out[start] = len,
        _ => {
            out.remove(start);
            insert_length(&mut out, start);
        }
    }
    Ok(out)
}

/// Inserts, at `start`, the length of everything after it as a varint: the header is
/// written first and measured after (it is a few dozen bytes: moving them costs less
/// than serializing twice).
pub(crate) fn insert_length(out: &mut Vec<u8>, start: usize) {
    let (bytes, n) = varint((out.len() - start) as u64);
    out.splice(start..start, bytes[..n].iter().copied());
}

/// The most bytes a length takes as a varint.
pub(crate) const MAX_LENGTH_BYTES: usize = MAX_VARINT_BYTES;

/// Writes the length of everything in `out` from `body` on as a varint just before
/// `body`, into room left there ([`MAX_LENGTH_BYTES`] at least); returns where the
/// length starts. Unlike [`insert_length`], nothing after it moves.
pub(crate) fn write_length_before(out: &mut [u8], body: usize) -> usize {
    let (bytes, n) = varint((out.len() - body) as u64);
    let start = body - n;
    out[start..body].copy_from_slice(&bytes[..n]);
    start
}

/// Splits off a varint length and the `len` bytes after it: `(those bytes, the rest)`.
pub(crate) fn take_sized(bytes: &[u8]) -> postcard::Result<(&[u8], &[u8])> {
    let (len, rest) = postcard::take_from_bytes::<u64>(bytes)?;
    let len = usize::try_from(len).map_err(|_| postcard::Error::DeserializeBadVarint)?;
    if len > rest.len() {
        return Err(postcard::Error::DeserializeUnexpectedEnd);
    }
    Ok(rest.split_at(len))
}

/// Reads a snapshot of machine `M`, its data migrated from its version if older.
///
/// # Errors
///
/// [`CodecError`] if the bytes are not a snapshot of `M` this version can read.
pub fn decode<M: StateMachine>(bytes: &[u8]) -> Result<(M::Procedure, Cursor<M>), CodecError> {
    let (cursor, split) = decode_cursor::<M>(bytes)?;
    if split.format > SNAPSHOT_VERSION {
        return Err(CodecError::NewerFormat {
            found: split.format,
        });
    }
    Ok((decode_data::<M>(split.data_version, split.data)?, cursor))
}

/// Reads the header of a snapshot of machine `M`: its cursor, and what follows it (the
/// data left encoded: see [`decode_data`]).
///
/// # Errors
///
/// [`CodecError`] if the header is not one of `M` this version can read.
pub(crate) fn decode_cursor<M: StateMachine>(
    bytes: &[u8],
) -> Result<(Cursor<M>, Tail<'_>), CodecError> {
    if let Some(read) = read_cursor::<M>(bytes) {
        return Ok(read);
    }
    // Version 1, or something [`read_cursor`] does not read: serde reads it, and says
    // what is wrong with it.
    let split = split(bytes)?;
    if split.machine != M::NAME {
        return Err(CodecError::WrongMachine {
            expected: M::NAME,
            found: split.machine.into_owned(),
        });
    }
    let cursor = Cursor::from_repr(&split.cursor).map_err(|state| CodecError::UnknownState {
        machine: M::NAME,
        state,
    })?;
    let tail = Tail {
        format: split.format,
        data_version: split.data_version,
        data: split.data,
    };
    Ok((cursor, tail))
}

/// What follows a snapshot's cursor.
pub(crate) struct Tail<'a> {
    /// The snapshot's format (see [`Split::format`]).
    pub(crate) format: u8,
    pub(crate) data_version: u32,
    /// The procedure's data, as stored.
    pub(crate) data: &'a [u8],
}

/// [`decode_cursor`] by hand, for a header of version 2 or later naming `M`: a restart
/// reads one per procedure. `None` for anything else.
fn read_cursor<M: StateMachine>(bytes: &[u8]) -> Option<(Cursor<M>, Tail<'_>)> {
    let (cursor, tail) = cursor_bytes::<M>(bytes)?;
    Some((Cursor::read_from(cursor)?, tail))
}

/// What a restart needs of a snapshot of `M` it loads dormant ([`Cursor::glance`]),
/// for a header [`read_cursor`] reads and a format this build writes. `None` for
/// anything else: the caller then loads the snapshot whole.
pub(crate) fn glance<M: StateMachine>(bytes: &[u8]) -> Option<Glance<M>> {
    let (cursor, tail) = cursor_bytes::<M>(bytes)?;
    if tail.format > SNAPSHOT_VERSION {
        return None;
    }
    Cursor::glance(cursor)
}

/// A snapshot's cursor bytes (with whatever follows them in its header) and its tail,
/// for a header of version 2 or later naming `M`.
fn cursor_bytes<M: StateMachine>(bytes: &[u8]) -> Option<(&[u8], Tail<'_>)> {
    let format = *bytes.first()?;
    if format < 2 {
        return None;
    }
    let (header, data) = take_sized(&bytes[1..]).ok()?;
    let (machine, rest) = take_str(header)?;
    if machine != M::NAME.as_bytes() {
        return None;
    }
    let (data_version, rest) = take_varint(rest, 5)?;
    let data_version = u32::try_from(data_version).ok()?;
    // Fields a later format appends to the header are past what this build reads.
    let tail = Tail {
        format,
        data_version,
        data,
    };
    Some((rest, tail))
}

/// Reads the procedure data of machine `M` stored at `version`: this build's own version
/// directly, an older one through [`StateMachine::migrate`].
///
/// # Errors
///
/// [`CodecError::NewerDataVersion`] for a version newer than this build's;
/// [`CodecError::NoMigration`] for one it has no migration for; [`CodecError::Decode`] if
/// the bytes are not what that version wrote.
pub(crate) fn decode_data<M: StateMachine>(
    version: u32,
    data: &[u8],
) -> Result<M::Procedure, CodecError> {
    let failed = |source| CodecError::Decode {
        machine: M::NAME.to_owned(),
        version,
        source,
    };
    if version == M::DATA_VERSION {
        return postcard::from_bytes(data).map_err(failed);
    }
    if version > M::DATA_VERSION {
        return Err(CodecError::NewerDataVersion {
            machine: M::NAME,
            found: version,
            this_build: M::DATA_VERSION,
        });
    }
    let no_migration = || CodecError::NoMigration {
        machine: M::NAME,
        version,
        oldest: M::OLDEST_VERSION,
    };
    if version < M::OLDEST_VERSION {
        return Err(no_migration());
    }
    match M::migrate(version, data) {
        Some(migrated) => migrated.map_err(failed),
        None => Err(no_migration()),
    }
}

/// Splits a snapshot into its parts, with its states as names: what readers without the
/// machine's types ([`operator`](crate::operator)) can see.
///
/// # Errors
///
/// [`CodecError`] if the header cannot be read.
pub(crate) fn split(bytes: &[u8]) -> Result<Split<'_>, CodecError> {
    let failed = |machine: &str, source| CodecError::Decode {
        machine: machine.to_owned(),
        version: 0,
        source,
    };
    match bytes.first().copied() {
        Some(1) => {
            let (start, rest) = postcard::take_from_bytes::<Version1Start<'_>>(bytes)
                .map_err(|e| failed("?", e))?;
            let (cursor, data) = postcard::take_from_bytes::<Repr<'_>>(rest)
                .map_err(|e| failed(&start.machine, e))?;
            Ok(Split {
                format: 1,
                machine: start.machine,
                data_version: 1,
                cursor,
                data,
            })
        }
        Some(format) if format >= 2 => {
            let (header, data) = take_sized(&bytes[1..]).map_err(|e| failed("?", e))?;
            // Fields a later format appends to the header are past what this build reads.
            let (start, _) =
                postcard::take_from_bytes::<HeaderStart<'_>>(header).map_err(|e| failed("?", e))?;
            Ok(Split {
                format,
                machine: start.machine,
                data_version: start.data_version,
                cursor: start.cursor,
                data,
            })
        }
        Some(found) => Err(CodecError::UnsupportedVersion { found }),
        None => Err(failed("?", postcard::Error::DeserializeUnexpectedEnd)),
    }
}

/// The machine name's bytes in a snapshot of version 2 or later, read by hand (see
/// [`read_cursor`]); `None` for any other, which [`machine_name`] reads.
pub(crate) fn read_machine_name(bytes: &[u8]) -> Option<&[u8]> {
    if *bytes.first()? < 2 {
        return None;
    }
    let (header, _) = take_sized(&bytes[1..]).ok()?;
    Some(take_str(header)?.0)
}

/// The stable machine name a snapshot starts with.
///
/// # Errors
///
/// [`CodecError`] if the header cannot be read.
pub fn machine_name(bytes: &[u8]) -> Result<Cow<'_, str>, CodecError> {
    let failed = |source| CodecError::Decode {
        machine: "?".to_owned(),
        version: 0,
        source,
    };
    match bytes.first().copied() {
        Some(1) => {
            let (start, _) =
                postcard::take_from_bytes::<Version1Start<'_>>(bytes).map_err(failed)?;
            debug_assert_eq!(start.version, 1);
            Ok(start.machine)
        }
        Some(format) if format >= 2 => {
            let (header, _) = take_sized(&bytes[1..]).map_err(failed)?;
            let (machine, _) = postcard::take_from_bytes::<Cow<'_, str>>(header).map_err(failed)?;
            Ok(machine)
        }
        Some(found) => Err(CodecError::UnsupportedVersion { found }),
        None => Err(failed(postcard::Error::DeserializeUnexpectedEnd)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_is_inserted_as_a_varint() {
        for len in [0usize, 1, 127, 128, 300, 70_000] {
            let mut out = vec![9u8];
            out.extend(std::iter::repeat_n(7u8, len));
            insert_length(&mut out, 1);
            let (body, rest) = take_sized(&out[1..]).unwrap();
            assert_eq!(body.len(), len);
            assert!(rest.is_empty());
            assert_eq!(out[0], 9);
        }
        assert!(take_sized(&[5, 1, 2]).is_err(), "a length past the end");
    }

    /// A length written into room left before the body reads back as the one inserted
    /// would, the body unmoved.
    #[test]
    fn a_length_written_before_the_body_is_the_inserted_one() {
        for len in [0usize, 1, 127, 128, 300, 70_000] {
            let mut inserted = vec![7u8; len];
            insert_length(&mut inserted, 0);
            let mut written = vec![0u8; MAX_LENGTH_BYTES];
            written.extend(std::iter::repeat_n(7u8, len));
            let start = write_length_before(&mut written, MAX_LENGTH_BYTES);
            assert_eq!(written[start..], inserted[..]);
        }
    }
}
