//! postcard's bytes: appended to a vector that may already hold bytes, and read by hand.
//!
//! `postcard::to_extend` writes through `Extend<u8>`: one `extend` of a one-byte array
//! per byte, each with its own check for room. A record is written byte by byte for
//! most of its fields (a procedure's `Vec<u8>` data is a sequence of single bytes to
//! serde), and on a `MemStore` step those checks were a tenth of the executor's time.
//! Pushing directly, as postcard's own `to_allocvec` does, writes the same bytes.
//!
//! The parts written on every step whose shape is fixed (a snapshot's header and its
//! cursor) skip serde altogether: [`push_varint`] and [`push_str`] write postcard's
//! bytes for an integer and a string, and a unit test holds each writer to serde's
//! bytes. [`take_varint`] and [`take_str`] read them back, for the cursor a restart
//! reads of every procedure; they answer `None` for anything postcard would not read,
//! and their callers then read through serde, which says what is wrong.

use postcard::ser_flavors::Flavor;
use serde::Serialize;

/// Appends `value`'s postcard encoding to `out`: the bytes `postcard::to_extend` would
/// append.
pub(crate) fn append<T: Serialize + ?Sized>(value: &T, out: Vec<u8>) -> postcard::Result<Vec<u8>> {
    postcard::serialize_with_flavor(value, Appending(out))
}

/// Appends `value` as postcard writes every unsigned integer: seven bits a byte, the
/// lowest first, the top bit set on every byte but the last.
#[inline]
pub(crate) fn push_varint(out: &mut Vec<u8>, value: u64) {
    if value < 0x80 {
        // Counts, lengths and names' lengths: nearly always one byte.
        out.push(value as u8);
    } else {
        push_long_varint(out, value);
    }
}

/// [`push_varint`] for a value of two bytes or more.
#[cold]
fn push_long_varint(out: &mut Vec<u8>, value: u64) {
    let (bytes, len) = varint(value);
    out.extend_from_slice(&bytes[..len]);
}

/// The most bytes a varint takes (a `u64`'s 64 bits, seven a byte).
pub(crate) const MAX_VARINT_BYTES: usize = 10;

/// `value` as [`push_varint`] writes it: its bytes and how many of them are used, for
/// a caller that puts them somewhere other than the end of a vector.
pub(crate) fn varint(mut value: u64) -> ([u8; MAX_VARINT_BYTES], usize) {
    let mut bytes = [0u8; MAX_VARINT_BYTES];
    let mut len = 0;
    while value >= 0x80 {
        bytes[len] = (value as u8) | 0x80;
        value >>= 7;
        len += 1;
    }
    bytes[len] = value as u8;
    (bytes, len + 1)
}

/// Appends `text` as postcard writes a string: its length, then its bytes.
#[inline]
pub(crate) fn push_str(out: &mut Vec<u8>, text: &str) {
    push_varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

/// Reads an unsigned integer of at most `max_bytes` bytes (5 for a `u32`, 10 for a
/// `u64` or a length), as [`push_varint`] writes it; `None` if it is longer, or does not
/// fit in 64 bits.
#[inline]
pub(crate) fn take_varint(bytes: &[u8], max_bytes: usize) -> Option<(u64, &[u8])> {
    let mut value = 0;
    for (at, &byte) in bytes.iter().enumerate().take(max_bytes) {
        let bits = u64::from(byte & 0x7f);
        let shift = 7 * at as u32;
        if shift == 63 && bits > 1 {
            return None;
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            return Some((value, &bytes[at + 1..]));
        }
    }
    None
}

/// Reads a string's bytes, as [`push_str`] writes them (not checked to be UTF-8).
#[inline]
pub(crate) fn take_str(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = take_varint(bytes, 10)?;
    let len = usize::try_from(len).ok()?;
    (len <= rest.len()).then(|| rest.split_at(len))
}

/// The flavor [`append`] writes through.
struct Appending(Vec<u8>);

impl Flavor for Appending {
    type Output = Vec<u8>;

    #[inline(always)]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    #[inline(always)]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_the_bytes_to_extend_appends() {
        #[derive(Serialize)]
        struct Sample<'a> {
            name: &'a str,
            count: u64,
            data: Vec<u8>,
            pairs: Vec<(&'a str, u32)>,
            maybe: Option<i32>,
        }
        let sample = Sample {
            name: "Seven",
            count: 300,
            data: (0..=255).collect(),
            pairs: vec![("One", 1), ("Two", 70_000)],
            maybe: Some(-5),
        };
        let prefix = vec![9, 8, 7];
        assert_eq!(
            append(&sample, prefix.clone()).unwrap(),
            postcard::to_extend(&sample, prefix).unwrap()
        );
    }

    #[test]
    fn varints_and_strings_are_postcards() {
        let values = [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ];
        for value in values {
            let mut out = vec![5];
            push_varint(&mut out, value);
            assert_eq!(
                out,
                postcard::to_extend(&value, vec![5]).unwrap(),
                "{value}"
            );
        }
        for text in [
            "",
            "One",
            &"x".repeat(127),
            &"y".repeat(128),
            &"z".repeat(20_000),
        ] {
            let mut out = vec![5];
            push_str(&mut out, text);
            assert_eq!(out, postcard::to_extend(text, vec![5]).unwrap());
        }
    }

    #[test]
    fn what_is_written_reads_back_and_what_postcard_refuses_is_none() {
        for value in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            push_varint(&mut out, value);
            out.push(42);
            assert_eq!(take_varint(&out, 10), Some((value, &[42][..])), "{value}");
        }
        let mut out = Vec::new();
        push_str(&mut out, "Seven");
        assert_eq!(take_str(&out), Some((&b"Seven"[..], &[][..])));
        // Longer than allowed, unfinished, past 64 bits, a string past the end.
        assert_eq!(take_varint(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01], 5), None);
        assert_eq!(take_varint(&[0x80, 0x80], 10), None);
        let mut past = vec![0xff; 9];
        past.push(0x02);
        assert_eq!(take_varint(&past, 10), None);
        assert!(postcard::from_bytes::<u64>(&past).is_err());
        assert_eq!(take_str(&[5, b'S', b'e']), None);
    }
}
