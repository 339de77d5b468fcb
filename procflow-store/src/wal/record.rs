//! Encoding of one log record: a 32-byte header and a postcard payload.
//!
//! Byte layout (integers little-endian; documented in prose in `docs/FORMAT.md`):
//!
//! ```text
//! offset  size  field
//!      0     1  marker, RECORD_MARKER (0xB7)
//!      1     1  kind: KIND_BATCH (1) or KIND_COMPACTION (2)
//!      2     1  flags: FLAG_FENCING_TOKEN (bit 0), FLAG_GROUP_START (bit 1); others zero
//!      3     1  reserved, zero
//!      4     4  payload length in bytes (u32)
//!      8     8  sequence number (u64), strictly increasing through the log
//!     16     8  fencing token (u64); zero unless FLAG_FENCING_TOKEN is set
//!     24     4  CRC32C of the payload
//!     28     4  CRC32C of header bytes 0..28
//!     32     n  payload: postcard encoding of the record's changes
//! ```
//!
//! One record holds one whole batch, so a batch is atomic: a record is either entirely
//! valid or ignored (torn tail) or reported (corruption).

use crate::error::StoreError;
use crate::state::Change;
use bytes::Bytes;

/// First byte of every record.
pub(crate) const RECORD_MARKER: u8 = 0xB7;
/// Kind of a record written for one committed [`Batch`](crate::Batch).
pub(crate) const KIND_BATCH: u8 = 1;
/// Kind of a record written by compaction, carrying live entries forward.
pub(crate) const KIND_COMPACTION: u8 = 2;
/// Flag bit: the fencing-token field holds a token.
pub(crate) const FLAG_FENCING_TOKEN: u8 = 0b0000_0001;
/// Flag bit: the record starts a group written after everything before it in its
/// segment was made durable, so damage before it is never a torn write.
pub(crate) const FLAG_GROUP_START: u8 = 0b0000_0010;

const MARKER_OFFSET: usize = 0;
const KIND_OFFSET: usize = 1;
const FLAGS_OFFSET: usize = 2;
const RESERVED_OFFSET: usize = 3;
const LEN_OFFSET: usize = 4;
const SEQ_OFFSET: usize = 8;
const TOKEN_OFFSET: usize = 16;
const PAYLOAD_CRC_OFFSET: usize = 24;
const HEADER_CRC_OFFSET: usize = 28;
/// Size of the record header; the payload follows it.
pub(crate) const RECORD_HEADER_LEN: usize = 32;

/// The decoded, checksum-verified header of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub(crate) kind: u8,
    pub(crate) payload_len: u32,
    pub(crate) seq: u64,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) payload_crc: u32,
    /// [`FLAG_GROUP_START`] is set.
    pub(crate) starts_group: bool,
}

impl RecordHeader {
    /// Total size of the record on disk.
    pub(crate) fn record_len(&self) -> u64 {
        RECORD_HEADER_LEN as u64 + u64::from(self.payload_len)
    }
}

/// Why bytes are not a valid record header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// Fewer than [`RECORD_HEADER_LEN`] bytes are left.
    Short,
    /// The first byte is not [`RECORD_MARKER`].
    UnknownMarker(u8),
    /// The header checksum does not match.
    Checksum,
    /// The checksum matches but a field holds a value this version does not know: the
    /// record was written deliberately, by a newer or broken writer.
    Unsupported(String),
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Short => write!(f, "incomplete record header"),
            HeaderError::UnknownMarker(b) => write!(f, "unknown record marker {b:#04x}"),
            HeaderError::Checksum => write!(f, "record header checksum mismatch"),
            HeaderError::Unsupported(what) => write!(f, "unsupported record header: {what}"),
        }
    }
}

fn u32_at(buf: &[u8], offset: usize) -> u32 {
    let mut bytes = [0; 4];
    bytes.copy_from_slice(&buf[offset..offset + 4]);
    u32::from_le_bytes(bytes)
}

fn u64_at(buf: &[u8], offset: usize) -> u64 {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&buf[offset..offset + 8]);
    u64::from_le_bytes(bytes)
}

/// Encodes one record alone (the writer appends records with [`append`]). Fails with
/// [`StoreError::TooLarge`] if the payload does not fit the 32-bit length field.
#[cfg(test)]
pub(crate) fn encode(
    kind: u8,
    seq: u64,
    fencing_token: Option<u64>,
    changes: &[Change],
) -> Result<Vec<u8>, StoreError> {
    let payload_len = payload_len(changes)?;
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + payload_len as usize);
    append(&mut out, kind, seq, fencing_token, changes, payload_len);
    Ok(out)
}

/// The length of `changes`' payload, as [`append`] writes it; [`StoreError::TooLarge`]
/// if it does not fit the 32-bit length field.
pub(crate) fn payload_len(changes: &[Change]) -> Result<u32, StoreError> {
    let len = varint_len(changes.len() as u64) + changes.iter().map(change_len).sum::<usize>();
    u32::try_from(len).map_err(|_| StoreError::TooLarge {
        what: "encoded batch bytes",
        size: len,
        limit: u32::MAX as usize,
    })
}

/// Appends one whole record of `changes` to `out`, where the writer gathers a group's
/// records: written in place, with no buffer of its own to copy from. `payload_len` is
/// [`payload_len`]'s answer for the same changes.
///
/// The payload is the bytes postcard writes for `changes` (a test holds the two to the
/// same bytes; recovery reads them back through postcard). Written by hand because
/// postcard, appending through `Extend`, wrote each value byte by byte: on the WAL's
/// committer thread at 1,024 procedures that and the copy of each record into the
/// writer's buffer were 6 % of the process's CPU samples (docs/BENCHMARKS.md, stop 57).
pub(crate) fn append(
    out: &mut Vec<u8>,
    kind: u8,
    seq: u64,
    fencing_token: Option<u64>,
    changes: &[Change],
    payload_len: u32,
) {
    let start = out.len();
    out.reserve(RECORD_HEADER_LEN + payload_len as usize);
    // The header's room, filled in once the payload is written and its checksum known.
    out.resize(start + RECORD_HEADER_LEN, 0);
    push_varint(out, changes.len() as u64);
    for change in changes {
        push_change(out, change);
    }
    debug_assert_eq!(out.len() - start, RECORD_HEADER_LEN + payload_len as usize);
    let record = &mut out[start..];
    let payload_crc = crc32c::crc32c(&record[RECORD_HEADER_LEN..]);
    record[MARKER_OFFSET] = RECORD_MARKER;
    record[KIND_OFFSET] = kind;
    record[FLAGS_OFFSET] = if fencing_token.is_some() {
        FLAG_FENCING_TOKEN
    } else {
        0
    };
    record[RESERVED_OFFSET] = 0;
    record[LEN_OFFSET..LEN_OFFSET + 4].copy_from_slice(&payload_len.to_le_bytes());
    record[SEQ_OFFSET..SEQ_OFFSET + 8].copy_from_slice(&seq.to_le_bytes());
    let token = fencing_token.unwrap_or(0);
    record[TOKEN_OFFSET..TOKEN_OFFSET + 8].copy_from_slice(&token.to_le_bytes());
    record[PAYLOAD_CRC_OFFSET..PAYLOAD_CRC_OFFSET + 4].copy_from_slice(&payload_crc.to_le_bytes());
    seal_header(record);
}

/// A change as postcard writes the enum: its variant's index, then its fields in order
/// (an option as 0, or 1 and the value; a flag as 0 or 1; bytes and strings as their
/// length and themselves).
fn push_change(out: &mut Vec<u8>, change: &Change) {
    match change {
        Change::Put {
            id,
            parent,
            finished,
            value,
        } => {
            out.push(PUT);
            push_varint(out, *id);
            match parent {
                None => out.push(0),
                Some(parent) => {
                    out.push(1);
                    push_varint(out, *parent);
                }
            }
            out.push(u8::from(*finished));
            push_bytes(out, value);
        }
        Change::Delete { id } => {
            out.push(DELETE);
            push_varint(out, *id);
        }
        Change::PutMeta { key, value } => {
            out.push(PUT_META);
            push_bytes(out, key.as_bytes());
            push_bytes(out, value);
        }
        Change::DeleteMeta { key } => {
            out.push(DELETE_META);
            push_bytes(out, key.as_bytes());
        }
    }
}

/// The bytes [`push_change`] writes for `change`.
fn change_len(change: &Change) -> usize {
    let bytes_len = |bytes: &[u8]| varint_len(bytes.len() as u64) + bytes.len();
    // The variant's index is one byte.
    1 + match change {
        Change::Put {
            id, parent, value, ..
        } => varint_len(*id) + 1 + parent.map_or(0, varint_len) + 1 + bytes_len(value),
        Change::Delete { id } => varint_len(*id),
        Change::PutMeta { key, value } => bytes_len(key.as_bytes()) + bytes_len(value),
        Change::DeleteMeta { key } => bytes_len(key.as_bytes()),
    }
}

/// The variants' indexes, in [`Change`]'s order.
const PUT: u8 = 0;
const DELETE: u8 = 1;
const PUT_META: u8 = 2;
const DELETE_META: u8 = 3;

fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    push_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// An unsigned integer as postcard writes it: seven bits a byte, lowest first, the top
/// bit set on every byte but the last.
fn push_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The bytes [`push_varint`] writes for `value`.
fn varint_len(value: u64) -> usize {
    let bits = 64 - (value | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Decodes and verifies the header at the start of `buf`.
pub(crate) fn decode_header(buf: &[u8]) -> Result<RecordHeader, HeaderError> {
    let Some(&marker) = buf.first() else {
        return Err(HeaderError::Short);
    };
    if marker != RECORD_MARKER {
        return Err(HeaderError::UnknownMarker(marker));
    }
    if buf.len() < RECORD_HEADER_LEN {
        return Err(HeaderError::Short);
    }
    if crc32c::crc32c(&buf[..HEADER_CRC_OFFSET]) != u32_at(buf, HEADER_CRC_OFFSET) {
        return Err(HeaderError::Checksum);
    }
    let kind = buf[KIND_OFFSET];
    if kind != KIND_BATCH && kind != KIND_COMPACTION {
        return Err(HeaderError::Unsupported(format!("kind {kind}")));
    }
    let flags = buf[FLAGS_OFFSET];
    if flags & !(FLAG_FENCING_TOKEN | FLAG_GROUP_START) != 0 || buf[RESERVED_OFFSET] != 0 {
        return Err(HeaderError::Unsupported(format!("flags {flags:#04x}")));
    }
    let token = u64_at(buf, TOKEN_OFFSET);
    Ok(RecordHeader {
        kind,
        payload_len: u32_at(buf, LEN_OFFSET),
        seq: u64_at(buf, SEQ_OFFSET),
        fencing_token: (flags & FLAG_FENCING_TOKEN != 0).then_some(token),
        payload_crc: u32_at(buf, PAYLOAD_CRC_OFFSET),
        starts_group: flags & FLAG_GROUP_START != 0,
    })
}

/// Sets [`FLAG_GROUP_START`] in the encoded record starting `record` and reseals its
/// header checksum. Done by the writer, which alone knows where groups start.
pub(crate) fn mark_group_start(record: &mut [u8]) {
    record[FLAGS_OFFSET] |= FLAG_GROUP_START;
    seal_header(record);
}

/// Gives a whole record that [`append`] wrote, with whatever sequence number, the
/// sequence number `seq`: a record encoded before the log numbered it
/// (`wal/early.rs`). Its payload and the payload's checksum stay as they are.
pub(crate) fn renumber(record: &mut [u8], seq: u64) {
    record[SEQ_OFFSET..SEQ_OFFSET + 8].copy_from_slice(&seq.to_le_bytes());
    seal_header(record);
}

/// Writes the checksum of the header's other fields into the header.
fn seal_header(record: &mut [u8]) {
    let header_crc = crc32c::crc32c(&record[..HEADER_CRC_OFFSET]);
    record[HEADER_CRC_OFFSET..RECORD_HEADER_LEN].copy_from_slice(&header_crc.to_le_bytes());
}

/// `true` if `payload` matches the checksum in `header`.
pub(crate) fn payload_matches(header: &RecordHeader, payload: &[u8]) -> bool {
    crc32c::crc32c(payload) == header.payload_crc
}

/// Decodes a checksum-verified payload, handing `each` its changes one by one. The values
/// are slices of `payload`, not copies, and no list of the changes is made: decoding
/// allocates nothing per value or record (recovery copies out only the values still
/// live at the end of their segment). On an error, the changes before it were handed
/// over already.
pub(crate) fn for_each_change(payload: &Bytes, mut each: impl FnMut(Change)) -> Result<(), String> {
    let undecodable = |e: postcard::Error| format!("undecodable payload: {e}");
    // A sequence is its length, as a varint like a `usize`'s, then its elements.
    let (count, mut rest) = postcard::take_from_bytes::<usize>(payload).map_err(undecodable)?;
    for _ in 0..count {
        let (change, after) =
            postcard::take_from_bytes::<Change<&[u8]>>(rest).map_err(undecodable)?;
        each(change.share(payload));
        rest = after;
    }
    match rest {
        [] => Ok(()),
        rest => Err(format!("{} trailing bytes after the payload", rest.len())),
    }
}

/// Decodes a checksum-verified payload whole: [`for_each_change`], collected.
#[cfg(test)]
pub(crate) fn decode_payload(payload: &Bytes) -> Result<Vec<Change>, String> {
    let mut changes = Vec::new();
    for_each_change(payload, |change| changes.push(change))?;
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Change> {
        vec![
            Change::Put {
                id: 7,
                parent: Some(1),
                finished: false,
                value: Bytes::from_static(b"hello"),
            },
            Change::DeleteMeta { key: "k".into() },
        ]
    }

    #[test]
    fn round_trip() {
        let bytes = encode(KIND_BATCH, 42, Some(9), &sample()).unwrap();
        let header = decode_header(&bytes).unwrap();
        assert_eq!(header.kind, KIND_BATCH);
        assert_eq!(header.seq, 42);
        assert_eq!(header.fencing_token, Some(9));
        assert_eq!(header.record_len(), bytes.len() as u64);
        let payload = Bytes::copy_from_slice(&bytes[RECORD_HEADER_LEN..]);
        assert!(payload_matches(&header, &payload));
        assert_eq!(decode_payload(&payload).unwrap(), sample());

        let bytes = encode(KIND_COMPACTION, 1, None, &[]).unwrap();
        assert_eq!(decode_header(&bytes).unwrap().fencing_token, None);
    }

    /// The hand-written payload is postcard's, byte for byte, for every variant and for
    /// integers and lengths of each varint width.
    #[test]
    fn the_payload_is_postcards() {
        let widths = [0, 1, 127, 128, 16_383, 16_384, 1 << 35, u64::MAX];
        let mut changes = Vec::new();
        for (at, &n) in widths.iter().enumerate() {
            let value = Bytes::from(vec![at as u8; (n % 300) as usize]);
            changes.push(Change::Put {
                id: n,
                parent: (at % 2 == 1).then_some(widths[widths.len() - 1 - at]),
                finished: at % 3 == 0,
                value: value.clone(),
            });
            changes.push(Change::Delete { id: n });
            let key = "k".repeat((n % 200) as usize);
            changes.push(Change::PutMeta {
                key: key.clone(),
                value,
            });
            changes.push(Change::DeleteMeta { key });
        }
        for count in [0, 1, 4, changes.len()] {
            let run = &changes[..count];
            let bytes = encode(KIND_BATCH, 3, None, run).unwrap();
            let payload = &bytes[RECORD_HEADER_LEN..];
            assert_eq!(
                payload,
                postcard::to_stdvec(run).unwrap(),
                "{count} changes"
            );
            assert_eq!(payload_len(run).unwrap() as usize, payload.len());
        }
        let mut long = vec![Change::Delete { id: 1 }; 200];
        long.push(Change::Delete { id: 2 });
        let bytes = encode(KIND_BATCH, 3, None, &long).unwrap();
        assert_eq!(
            &bytes[RECORD_HEADER_LEN..],
            postcard::to_stdvec(&long).unwrap()
        );
    }

    /// A record appended after others is the same record as one encoded alone.
    #[test]
    fn a_record_appended_to_a_buffer_is_the_same_record() {
        let mut buffer = vec![7; 5];
        let len = payload_len(&sample()).unwrap();
        append(&mut buffer, KIND_BATCH, 42, Some(9), &sample(), len);
        assert_eq!(buffer[..5], [7; 5]);
        assert_eq!(
            buffer[5..],
            encode(KIND_BATCH, 42, Some(9), &sample()).unwrap()
        );
    }

    #[test]
    fn every_header_bit_is_checked() {
        let bytes = encode(KIND_BATCH, 42, Some(9), &sample()).unwrap();
        for bit in 0..RECORD_HEADER_LEN * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_header(&damaged).is_err(), "bit {bit} undetected");
        }
    }

    /// Pins the payload encoding documented in docs/FORMAT.md.
    #[test]
    fn payload_encoding_matches_format_md() {
        let changes = [
            Change::Put {
                id: 1,
                parent: Some(2),
                finished: true,
                value: Bytes::from_static(&[9]),
            },
            Change::Delete { id: 300 },
            Change::PutMeta {
                key: "k".into(),
                value: Bytes::new(),
            },
            Change::DeleteMeta { key: "k".into() },
        ];
        let bytes = encode(KIND_BATCH, 1, None, &changes).unwrap();
        assert_eq!(
            &bytes[RECORD_HEADER_LEN..],
            [
                4, // four changes
                0, 1, 1, 2, 1, 1, 9, // Put
                1, 0xac, 0x02, // Delete 300
                2, 1, b'k', 0, // PutMeta
                3, 1, b'k', // DeleteMeta
            ]
        );
        assert_eq!(bytes[..4], [RECORD_MARKER, KIND_BATCH, 0, 0]);
        assert_eq!(bytes[4..8], 18u32.to_le_bytes());
    }

    /// The constants and offsets here are the ones docs/FORMAT.md states.
    #[test]
    fn constants_match_format_md() {
        let doc = include_str!("../../../docs/FORMAT.md");
        let expected = [
            format!("marker `RECORD_MARKER` = `0x{RECORD_MARKER:02X}`"),
            format!("`KIND_BATCH` = {KIND_BATCH}"),
            format!("`KIND_COMPACTION` = {KIND_COMPACTION}"),
            format!(
                "bit {} `FLAG_FENCING_TOKEN`",
                FLAG_FENCING_TOKEN.trailing_zeros()
            ),
            format!(
                "bit {} `FLAG_GROUP_START`",
                FLAG_GROUP_START.trailing_zeros()
            ),
            format!("`RECORD_HEADER_LEN` = {RECORD_HEADER_LEN}"),
            format!("| {MARKER_OFFSET} | 1 | marker"),
            format!("| {KIND_OFFSET} | 1 | kind"),
            format!("| {FLAGS_OFFSET} | 1 | flags"),
            format!("| {RESERVED_OFFSET} | 1 | reserved"),
            format!("| {LEN_OFFSET} | 4 | payload length"),
            format!("| {SEQ_OFFSET} | 8 | sequence number"),
            format!("| {TOKEN_OFFSET} | 8 | fencing token"),
            format!("| {PAYLOAD_CRC_OFFSET} | 4 | CRC32C of the payload"),
            format!(
                "| {HEADER_CRC_OFFSET} | 4 | CRC32C of bytes 0..{HEADER_CRC_OFFSET} of this header"
            ),
            format!("| {RECORD_HEADER_LEN} | n | payload"),
        ];
        for line in expected {
            assert!(doc.contains(&line), "docs/FORMAT.md lacks {line:?}");
        }
    }

    #[test]
    fn garbage_payload_is_an_error_not_a_panic() {
        let decode = |bytes: &[u8]| decode_payload(&Bytes::copy_from_slice(bytes));
        assert!(decode(&[0xff; 16]).is_err());
        assert!(decode(&[]).is_err());
        assert_eq!(decode(&[0]).unwrap(), vec![]);
    }
}
