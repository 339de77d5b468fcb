//! The persisted form of a procedure: a small header naming its machine, then its data.
//!
//! ```text
//! +---------+-------------------+------------------+----------------------------+
//! | version | machine name      | cursor           | procedure data             |
//! | u8 = 1  | postcard string   | postcard Cursor  | postcard, to the end       |
//! +---------+-------------------+------------------+----------------------------+
//! ```
//!
//! The machine name comes first so a registry can read it ([`machine_name`]) without
//! knowing the machine's types. docs/FORMAT.md describes every field.

use crate::cursor::Repr;
use crate::{Cursor, StateMachine};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The version byte that starts every snapshot.
pub const SNAPSHOT_VERSION: u8 = 1;

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
    /// The bytes are not a snapshot this version of procflow can read.
    #[error(
        "snapshot version {found} is not supported (this procflow reads version {SNAPSHOT_VERSION})"
    )]
    UnsupportedVersion {
        /// The version byte found.
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
        "`{state}` is not a state of machine `{machine}` (was the variant renamed or removed?)"
    )]
    UnknownState {
        /// The machine's stable name.
        machine: &'static str,
        /// The state name found in the snapshot.
        state: String,
    },
    /// The bytes are damaged, or the data no longer matches the procedure type.
    #[error("cannot read snapshot of machine `{machine}`: {source}")]
    Decode {
        /// The machine's stable name, or `?` when not even the header could be read.
        machine: String,
        /// postcard's error (a state name that is no longer a variant shows up here).
        source: postcard::Error,
    },
}

#[derive(Serialize)]
#[serde(bound = "")]
struct Header<'a, M: StateMachine> {
    version: u8,
    machine: &'a str,
    cursor: &'a Cursor<M>,
}

#[derive(Deserialize)]
struct NameOnly<'a> {
    version: u8,
    #[serde(borrow)]
    machine: Cow<'a, str>,
}

/// Writes the snapshot of a procedure of machine `M`.
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
    let bytes = encode_header_into(cursor, out)?;
    postcard::to_extend(procedure, bytes).map_err(error)
}

/// Appends the snapshot of a procedure of machine `M` whose data is still encoded, as
/// [`decode_cursor`] left it: the header, then `data` unchanged. For data postcard wrote,
/// the bytes are those [`encode_into`] would write after decoding it.
///
/// # Errors
///
/// [`CodecError::Encode`] if the header cannot be serialized.
pub(crate) fn encode_stored_into<M: StateMachine>(
    cursor: &Cursor<M>,
    data: &[u8],
    out: Vec<u8>,
) -> Result<Vec<u8>, CodecError> {
    let mut bytes = encode_header_into(cursor, out)?;
    bytes.extend_from_slice(data);
    Ok(bytes)
}

/// Appends the header: version, machine name, cursor.
fn encode_header_into<M: StateMachine>(
    cursor: &Cursor<M>,
    out: Vec<u8>,
) -> Result<Vec<u8>, CodecError> {
    let header = Header {
        version: SNAPSHOT_VERSION,
        machine: M::NAME,
        cursor,
    };
    postcard::to_extend(&header, out).map_err(|source| CodecError::Encode {
        machine: M::NAME,
        source,
    })
}

/// Reads a snapshot of machine `M`.
///
/// # Errors
///
/// [`CodecError`] if the bytes are not a snapshot of `M` this version can read.
pub fn decode<M: StateMachine>(bytes: &[u8]) -> Result<(M::Procedure, Cursor<M>), CodecError> {
    let (cursor, data) = decode_cursor::<M>(bytes)?;
    Ok((decode_data::<M>(data)?, cursor))
}

/// Reads the header of a snapshot of machine `M`: its cursor, and the procedure data
/// after it, left encoded (see [`decode_data`]).
///
/// # Errors
///
/// [`CodecError`] if the header is not one of `M` this version can read.
pub(crate) fn decode_cursor<M: StateMachine>(
    bytes: &[u8],
) -> Result<(Cursor<M>, &[u8]), CodecError> {
    let found = machine_name(bytes)?;
    if found != M::NAME {
        return Err(CodecError::WrongMachine {
            expected: M::NAME,
            found: found.into_owned(),
        });
    }
    let (repr, data) = read_cursor(bytes, M::NAME)?;
    let cursor = Cursor::from_repr(&repr).map_err(|state| CodecError::UnknownState {
        machine: M::NAME,
        state,
    })?;
    Ok((cursor, data))
}

/// Reads the procedure data of machine `M`, as [`decode_cursor`] left it.
///
/// # Errors
///
/// [`CodecError::Decode`] if the bytes are not an `M::Procedure` (damaged, or written by
/// a build whose procedure type differs).
pub(crate) fn decode_data<M: StateMachine>(data: &[u8]) -> Result<M::Procedure, CodecError> {
    postcard::from_bytes(data).map_err(|source| CodecError::Decode {
        machine: M::NAME.to_owned(),
        source,
    })
}

/// The cursor of a snapshot of machine `machine` (read already from its header), with
/// its states as names, and the procedure data after it: what readers without the
/// machine's types ([`operator`](crate::operator)) can see.
pub(crate) fn read_cursor<'a>(
    bytes: &'a [u8],
    machine: &str,
) -> Result<(Repr<'a>, &'a [u8]), CodecError> {
    let error = |source| CodecError::Decode {
        machine: machine.to_owned(),
        source,
    };
    let (_, rest) = postcard::take_from_bytes::<NameOnly<'_>>(bytes).map_err(error)?;
    postcard::take_from_bytes::<Repr<'_>>(rest).map_err(error)
}

/// The stable machine name a snapshot starts with.
///
/// # Errors
///
/// [`CodecError`] if the header cannot be read.
pub fn machine_name(bytes: &[u8]) -> Result<Cow<'_, str>, CodecError> {
    let (header, _) =
        postcard::take_from_bytes::<NameOnly<'_>>(bytes).map_err(|source| CodecError::Decode {
            machine: "?".to_owned(),
            source,
        })?;
    if header.version != SNAPSHOT_VERSION {
        return Err(CodecError::UnsupportedVersion {
            found: header.version,
        });
    }
    Ok(header.machine)
}
