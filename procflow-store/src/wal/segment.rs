//! Segment files: naming, the 32-byte segment header, and creating a new segment.
//!
//! Byte layout of the segment header (integers little-endian; see `docs/FORMAT.md`):
//!
//! ```text
//! offset  size  field
//!      0     8  magic, SEGMENT_MAGIC (b"PFLOWWAL")
//!      8     2  format version (u16), FORMAT_VERSION (2); 1 is still read
//!     10     2  reserved, zero
//!     12     8  segment number (u64), equal to the number in the file name
//!     20     8  first sequence number (u64): the one this segment's first record
//!               carries, one more than the previous segment's last; 0 = not recorded
//!               (segments written before this field existed)
//!     28     4  CRC32C of header bytes 0..28
//!     32     -  records (see record.rs), back to back, up to the end of the file
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::StoreError;
use crate::io::{IoBackend, LogFile};

/// First eight bytes of every segment file.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"PFLOWWAL";
/// The on-disk format version this code writes. Version 2 added
/// [`FLAG_GROUP_START`](super::record::FLAG_GROUP_START); a version 1 segment has no
/// such flags, and is read as if every record started a group.
pub(crate) const FORMAT_VERSION: u16 = 2;
/// The oldest format version this code reads.
pub(crate) const OLDEST_READ_VERSION: u16 = 1;

/// What a valid segment header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub(crate) version: u16,
    /// The first sequence number it records, or [`FIRST_SEQ_UNKNOWN`].
    pub(crate) first_seq: u64,
}

const MAGIC_OFFSET: usize = 0;
const VERSION_OFFSET: usize = 8;
const NUMBER_OFFSET: usize = 12;
const FIRST_SEQ_OFFSET: usize = 20;
/// [`FIRST_SEQ_OFFSET`] of a segment that does not record its first sequence number.
pub(crate) const FIRST_SEQ_UNKNOWN: u64 = 0;
const HEADER_CRC_OFFSET: usize = 28;
/// Size of the segment header; the first record starts here.
pub(crate) const SEGMENT_HEADER_LEN: usize = 32;

const SEGMENT_PREFIX: &str = "segment-";
const SEGMENT_SUFFIX: &str = ".wal";
/// Suffix of a segment being created; such files are removed at open.
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// The file name of segment `number`: `segment-<16 hex digits>.wal`.
pub(crate) fn file_name(number: u64) -> String {
    format!("{SEGMENT_PREFIX}{number:016x}{SEGMENT_SUFFIX}")
}

/// The segment number in `name`, if it names a segment.
pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    let hex = name
        .strip_prefix(SEGMENT_PREFIX)?
        .strip_suffix(SEGMENT_SUFFIX)?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// The path of segment `number` in `dir`.
pub(crate) fn path(dir: &Path, number: u64) -> PathBuf {
    dir.join(file_name(number))
}

/// Encodes the header of segment `number`, whose first record will carry `first_seq`.
pub(crate) fn encode_header(number: u64, first_seq: u64) -> [u8; SEGMENT_HEADER_LEN] {
    let mut header = [0; SEGMENT_HEADER_LEN];
    header[MAGIC_OFFSET..MAGIC_OFFSET + 8].copy_from_slice(&SEGMENT_MAGIC);
    header[VERSION_OFFSET..VERSION_OFFSET + 2].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[NUMBER_OFFSET..NUMBER_OFFSET + 8].copy_from_slice(&number.to_le_bytes());
    header[FIRST_SEQ_OFFSET..FIRST_SEQ_OFFSET + 8].copy_from_slice(&first_seq.to_le_bytes());
    let crc = crc32c::crc32c(&header[..HEADER_CRC_OFFSET]);
    header[HEADER_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Checks that `bytes` start with a valid header for segment `number` and returns what
/// it says; `Err` says why not.
pub(crate) fn check_header(bytes: &[u8], number: u64) -> Result<SegmentHeader, String> {
    if bytes.len() < SEGMENT_HEADER_LEN {
        return Err(format!("segment header truncated to {} bytes", bytes.len()));
    }
    if bytes[MAGIC_OFFSET..MAGIC_OFFSET + 8] != SEGMENT_MAGIC {
        return Err("not a procflow WAL segment (bad magic)".into());
    }
    let mut crc = [0; 4];
    crc.copy_from_slice(&bytes[HEADER_CRC_OFFSET..SEGMENT_HEADER_LEN]);
    if crc32c::crc32c(&bytes[..HEADER_CRC_OFFSET]) != u32::from_le_bytes(crc) {
        return Err("segment header checksum mismatch".into());
    }
    let version = u16::from_le_bytes([bytes[VERSION_OFFSET], bytes[VERSION_OFFSET + 1]]);
    if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(format!(
            "unsupported format version {version} (this build reads \
             {OLDEST_READ_VERSION} to {FORMAT_VERSION})"
        ));
    }
    let found = read_u64(bytes, NUMBER_OFFSET);
    if found != number {
        return Err(format!(
            "header names segment {found} but the file name says {number}"
        ));
    }
    Ok(SegmentHeader {
        version,
        first_seq: read_u64(bytes, FIRST_SEQ_OFFSET),
    })
}

fn read_u64(bytes: &[u8], offset: usize) -> u64 {
    let mut field = [0; 8];
    field.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(field)
}

/// Creates segment `number`, whose first record will carry `first_seq`, in `dir`
/// atomically: the header is written to a temporary
/// file, made durable, renamed into place, and the rename made durable (unless `sync` is
/// false). Returns the file opened for appending.
pub(crate) fn create(
    backend: &dyn IoBackend,
    dir: &Path,
    number: u64,
    first_seq: u64,
    sync: bool,
) -> Result<Arc<dyn LogFile>, StoreError> {
    let final_path = path(dir, number);
    let tmp_path = dir.join(format!("{}{TMP_SUFFIX}", file_name(number)));
    let file = backend
        .create_file(&tmp_path)
        .map_err(|e| StoreError::io("creating a segment", &tmp_path, e))?;
    file.append(&encode_header(number, first_seq))
        .map_err(|e| StoreError::io("writing a segment header", &tmp_path, e))?;
    if sync {
        file.sync_data()
            .map_err(|e| StoreError::io("syncing a new segment", &tmp_path, e))?;
    }
    backend
        .rename(&tmp_path, &final_path)
        .map_err(|e| StoreError::io("renaming a new segment", &final_path, e))?;
    if sync {
        backend
            .sync_dir(dir)
            .map_err(|e| StoreError::io("syncing the store directory", dir, e))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in [0, 1, 0xdead_beef, u64::MAX] {
            assert_eq!(parse_file_name(&file_name(n)), Some(n));
        }
        assert_eq!(parse_file_name("segment-1.wal"), None);
        assert_eq!(parse_file_name("segment-000000000000000g.wal"), None);
        assert_eq!(parse_file_name("LOCK"), None);
    }

    /// The constants and offsets here are the ones docs/FORMAT.md states.
    #[test]
    fn constants_match_format_md() {
        let doc = include_str!("../../../docs/FORMAT.md");
        let magic = std::str::from_utf8(&SEGMENT_MAGIC).unwrap();
        let expected = [
            format!("| {MAGIC_OFFSET} | 8 | magic `SEGMENT_MAGIC` = ASCII `{magic}`"),
            format!(
                "| {VERSION_OFFSET} | 2 | format version, u16, `FORMAT_VERSION` = {FORMAT_VERSION}"
            ),
            format!("| {NUMBER_OFFSET} | 8 | segment number"),
            format!("| {FIRST_SEQ_OFFSET} | 8 | first sequence number"),
            format!("| {HEADER_CRC_OFFSET} | 4 | CRC32C of bytes 0..{HEADER_CRC_OFFSET}"),
            format!("from offset {SEGMENT_HEADER_LEN} (`SEGMENT_HEADER_LEN`)"),
            format!("`{SEGMENT_PREFIX}<n>{SEGMENT_SUFFIX}`"),
            format!("`{SEGMENT_PREFIX}<n>{SEGMENT_SUFFIX}{TMP_SUFFIX}`"),
        ];
        for line in expected {
            assert!(doc.contains(&line), "docs/FORMAT.md lacks {line:?}");
        }
    }

    #[test]
    fn header_round_trip_and_checks() {
        let header = encode_header(5, 42);
        let expected = SegmentHeader {
            version: FORMAT_VERSION,
            first_seq: 42,
        };
        assert_eq!(check_header(&header, 5), Ok(expected));
        assert!(check_header(&header, 6).unwrap_err().contains("file name"));
        assert!(check_header(&header[..31], 5).is_err());
        for bit in 0..SEGMENT_HEADER_LEN * 8 {
            let mut damaged = header;
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(check_header(&damaged, 5).is_err(), "bit {bit} undetected");
        }
    }
}
