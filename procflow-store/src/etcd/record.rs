//! A record's etcd value: a small header, then the procedure's bytes.
//!
//! ```text
//! byte 0     format version, 1
//! byte 1     flags: 1 = finished, 2 = has a parent
//! 8 bytes    the parent's id, little endian (only with flag 2)
//! the rest   the record's value
//! ```

use crate::store::{ProcId, Record};
use bytes::Bytes;

const VERSION: u8 = 1;
const FINISHED: u8 = 1;
const HAS_PARENT: u8 = 2;
/// The longest header: version, flags, parent.
pub(crate) const MAX_HEADER: usize = 10;

/// The header and `value` of a record, as stored.
pub(crate) fn encode(parent: Option<ProcId>, finished: bool, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_HEADER + value.len());
    let flags = if finished { FINISHED } else { 0 } | if parent.is_some() { HAS_PARENT } else { 0 };
    out.extend_from_slice(&[VERSION, flags]);
    if let Some(parent) = parent {
        out.extend_from_slice(&parent.to_le_bytes());
    }
    out.extend_from_slice(value);
    out
}

/// The record `id` stored as `bytes`, or why it cannot be read.
pub(crate) fn decode(id: ProcId, bytes: Vec<u8>) -> Result<Record, String> {
    let bytes = Bytes::from(bytes);
    let (&version, rest) = bytes.split_first().ok_or("empty value")?;
    if version != VERSION {
        return Err(format!("unknown record format version {version}"));
    }
    let (&flags, rest) = rest.split_first().ok_or("no flags byte")?;
    if flags & !(FINISHED | HAS_PARENT) != 0 {
        return Err(format!("unknown flags {flags:#04x}"));
    }
    let (parent, rest) = if flags & HAS_PARENT != 0 {
        let (parent, rest) = rest.split_at_checked(8).ok_or("truncated parent id")?;
        let parent = u64::from_le_bytes(parent.try_into().expect("8 bytes"));
        (Some(parent), rest)
    } else {
        (None, rest)
    };
    Ok(Record {
        id,
        parent,
        finished: flags & FINISHED != 0,
        value: bytes.slice_ref(rest),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_named() {
        for (parent, finished) in [(None, false), (Some(u64::MAX), true)] {
            let record = decode(3, encode(parent, finished, b"state")).unwrap();
            assert_eq!((record.parent, record.finished), (parent, finished));
            assert_eq!(record.value, &b"state"[..]);
        }
        assert!(decode(1, vec![]).unwrap_err().contains("empty"));
        assert!(decode(1, vec![9, 0]).unwrap_err().contains("version 9"));
        assert!(decode(1, vec![1, 2, 0]).unwrap_err().contains("truncated"));
        assert!(decode(1, vec![1, 8]).unwrap_err().contains("flags"));
    }
}
