//! The log reader against hostile input, in every `cargo test` (the cargo-fuzz target
//! `fuzz/fuzz_targets/open_segment.rs` goes further but CI does not run it).
//!
//! A corpus is generated here from real logs: valid logs of one and several segments,
//! each cut at every byte, with every bit flipped, with header fields set to edge values
//! and their checksums recomputed (so the damage gets past the checksums), and with
//! segments removed, duplicated or renumbered. Then a bounded number of random logs.
//! Opening any of them must give a state or `StoreError::Corrupt`, never a panic (or
//! any other error: the simulated disk does not fail).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{Env, workload};
use procflow_store::io::{IoBackend, SimBackend};
use procflow_store::{Batch, Store, StoreError, SyncMode, WalConfig, WalStore};
use proptest::prelude::*;

/// The layout of docs/FORMAT.md, as far as these tests edit it.
mod layout {
    pub const SEGMENT_HEADER_LEN: usize = 32;
    pub const SEGMENT_VERSION: usize = 8;
    pub const SEGMENT_NUMBER: usize = 12;
    pub const SEGMENT_FIRST_SEQ: usize = 20;
    pub const SEGMENT_CRC: usize = 28;
    pub const RECORD_HEADER_LEN: usize = 32;
    pub const RECORD_KIND: usize = 1;
    pub const RECORD_FLAGS: usize = 2;
    pub const RECORD_LEN: usize = 4;
    pub const RECORD_SEQ: usize = 8;
    pub const RECORD_PAYLOAD_CRC: usize = 24;
    pub const RECORD_CRC: usize = 28;
}
use layout::*;

/// A store directory's segment files: number → bytes.
type Log = BTreeMap<u64, Vec<u8>>;

const DIR: &str = "/store";

fn segment_path(number: u64) -> PathBuf {
    Path::new(DIR).join(format!("segment-{number:016x}.wal"))
}

fn config(segment_size: u64) -> WalConfig {
    WalConfig {
        segment_size,
        sync: SyncMode::Durable,
        ..WalConfig::default()
    }
}

/// Runs `batches` on a fresh simulated store and returns its segment files.
async fn real_log(batches: &[Batch], segment_size: u64) -> Log {
    let env = Env::on_sim(SimBackend::new());
    let store = env.open(config(segment_size)).unwrap();
    for batch in batches {
        store.commit(batch.clone()).await.unwrap();
    }
    store.close().await.unwrap();
    env.segments()
        .into_iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_str().unwrap();
            let hex = &name["segment-".len()..name.len() - ".wal".len()];
            (u64::from_str_radix(hex, 16).unwrap(), env.read(&path))
        })
        .collect()
}

/// Opens a store holding exactly `log`; panics (failing the test) only if the reader
/// does, or if it reports anything but a state or corruption.
fn open(log: &Log, what: &str) {
    let sim = SimBackend::new();
    sim.create_dir_all(Path::new(DIR)).unwrap();
    for (&number, bytes) in log {
        let file = sim.create_file(&segment_path(number)).unwrap();
        file.append(bytes).unwrap();
    }
    match WalStore::open_with_backend(DIR, config(1024), Arc::new(sim)) {
        Ok(_) | Err(StoreError::Corrupt { .. }) => {}
        Err(other) => panic!("{what}: unexpected error {other}"),
    }
}

/// The offsets of the records of a valid segment.
fn record_offsets(segment: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut offset = SEGMENT_HEADER_LEN;
    while offset + RECORD_HEADER_LEN <= segment.len() {
        offsets.push(offset);
        offset += RECORD_HEADER_LEN + read_u32(segment, offset + RECORD_LEN) as usize;
    }
    offsets
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn put(bytes: &mut [u8], at: usize, field: &[u8]) {
    bytes[at..at + field.len()].copy_from_slice(field);
}

/// Recomputes the checksum at `crc_at` over `bytes[start..crc_at]`, so an edited field
/// passes it.
fn reseal(bytes: &mut [u8], start: usize, crc_at: usize) {
    let crc = crc32c::crc32c(&bytes[start..crc_at]);
    put(bytes, crc_at, &crc.to_le_bytes());
}

/// Every log that differs from `log` by one edit of a header field, with checksums
/// recomputed: the damage checksums cannot see.
fn field_edits(log: &Log) -> Vec<(String, Log)> {
    let mut out = Vec::new();
    for (&number, segment) in log {
        let mut edit_segment = |what: String, edit: &dyn Fn(&mut Vec<u8>)| {
            let mut edited = log.clone();
            edit(edited.get_mut(&number).unwrap());
            out.push((format!("segment {number}: {what}"), edited));
        };
        for first_seq in [0, 1, 2, u64::MAX - 1, u64::MAX] {
            edit_segment(format!("first seq {first_seq}"), &|s| {
                put(s, SEGMENT_FIRST_SEQ, &first_seq.to_le_bytes());
                reseal(s, 0, SEGMENT_CRC);
            });
        }
        // A segment from before first sequence numbers were recorded, whose first record
        // carries the last sequence number there is.
        edit_segment("legacy header, first record seq u64::MAX".into(), &|s| {
            put(s, SEGMENT_FIRST_SEQ, &0u64.to_le_bytes());
            reseal(s, 0, SEGMENT_CRC);
            if let Some(&at) = record_offsets(s).first() {
                put(s, at + RECORD_SEQ, &u64::MAX.to_le_bytes());
                reseal(s, at, at + RECORD_CRC);
            }
        });
        for version in [0u16, 2, u16::MAX] {
            edit_segment(format!("version {version}"), &|s| {
                put(s, SEGMENT_VERSION, &version.to_le_bytes());
                reseal(s, 0, SEGMENT_CRC);
            });
        }
        edit_segment("number mismatch".into(), &|s| {
            put(s, SEGMENT_NUMBER, &(number + 1).to_le_bytes());
            reseal(s, 0, SEGMENT_CRC);
        });
        for at in record_offsets(segment) {
            let seq = u64::from_le_bytes(
                segment[at + RECORD_SEQ..at + RECORD_SEQ + 8]
                    .try_into()
                    .unwrap(),
            );
            for new_seq in [0, seq.wrapping_sub(1), seq + 1, u64::MAX - 1, u64::MAX] {
                edit_segment(format!("record at {at}: seq {new_seq}"), &|s| {
                    put(s, at + RECORD_SEQ, &new_seq.to_le_bytes());
                    reseal(s, at, at + RECORD_CRC);
                });
            }
            for len in [0u32, 1, u32::MAX, u32::MAX / 2] {
                edit_segment(format!("record at {at}: length {len}"), &|s| {
                    put(s, at + RECORD_LEN, &len.to_le_bytes());
                    reseal(s, at, at + RECORD_CRC);
                });
            }
            for (field, value) in [(RECORD_KIND, 0u8), (RECORD_KIND, 3), (RECORD_FLAGS, 0xFF)] {
                edit_segment(format!("record at {at}: byte {field} = {value}"), &|s| {
                    s[at + field] = value;
                    reseal(s, at, at + RECORD_CRC);
                });
            }
            // Payloads that pass their checksum but claim huge counts and lengths.
            for payload in [
                &[0xFF; 10][..],
                &[0x01, 0x00, 0x01, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F][..],
            ] {
                edit_segment(format!("record at {at}: payload {payload:02x?}"), &|s| {
                    let len = read_u32(s, at + RECORD_LEN) as usize;
                    let end = at + RECORD_HEADER_LEN + len;
                    let mut record = s[at..at + RECORD_HEADER_LEN].to_vec();
                    record.extend_from_slice(payload);
                    put(
                        &mut record,
                        RECORD_LEN,
                        &(payload.len() as u32).to_le_bytes(),
                    );
                    let crc = crc32c::crc32c(payload);
                    put(&mut record, RECORD_PAYLOAD_CRC, &crc.to_le_bytes());
                    reseal(&mut record, 0, RECORD_CRC);
                    s.splice(at..end, record);
                });
            }
        }
    }
    out
}

/// Every log that differs from `log` in which segment files exist.
fn file_edits(log: &Log) -> Vec<(String, Log)> {
    let mut out = Vec::new();
    let last = *log.keys().last().unwrap();
    for &number in log.keys() {
        let mut without = log.clone();
        without.remove(&number);
        if !without.is_empty() {
            out.push((format!("segment {number} removed"), without));
        }
        let mut copied = log.clone();
        copied.insert(last + 1, log[&number].clone());
        out.push((format!("segment {number} copied after the last"), copied));
        let mut moved = log.clone();
        let bytes = moved.remove(&number).unwrap();
        moved.insert(u64::MAX - number, bytes);
        out.push((format!("segment {number} renumbered"), moved));
    }
    out
}

/// The valid logs the corpus starts from: empty, one segment, several segments with
/// compaction records.
async fn valid_logs() -> Vec<(String, Log)> {
    let churn: Vec<Batch> = (0..40u8)
        .map(|i| Batch::new().put(u64::from(i % 3), None, vec![i; 150]))
        .collect();
    vec![
        ("empty".into(), real_log(&[], 1 << 20).await),
        (
            "one segment".into(),
            real_log(&workload(6, 8), 1 << 20).await,
        ),
        ("compacted".into(), real_log(&churn, 512).await),
    ]
}

/// Issue 12, point 16: the corpus — valid logs, cut at every byte, every bit flipped,
/// header fields at edge values behind valid checksums, segments missing or renumbered.
#[tokio::test]
async fn p16_the_reader_never_panics_on_the_corpus() {
    let mut opened = 0;
    for (name, log) in valid_logs().await {
        open(&log, &name);
        for (what, edited) in field_edits(&log).into_iter().chain(file_edits(&log)) {
            open(&edited, &format!("{name}, {what}"));
            opened += 1;
        }
        // Byte-level damage in the first and the last segment.
        let first = *log.keys().next().unwrap();
        let last = *log.keys().last().unwrap();
        for number in [first, last] {
            let bytes = &log[&number];
            for cut in 0..bytes.len() {
                let mut edited = log.clone();
                edited.insert(number, bytes[..cut].to_vec());
                open(&edited, &format!("{name}, segment {number} cut at {cut}"));
            }
            for bit in 0..bytes.len() * 8 {
                let mut edited = log.clone();
                edited.get_mut(&number).unwrap()[bit / 8] ^= 1 << (bit % 8);
                open(
                    &edited,
                    &format!("{name}, segment {number} bit {bit} flipped"),
                );
            }
            opened += bytes.len() * 9;
        }
    }
    assert!(opened > 1000, "the corpus shrank to {opened} logs");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Issue 12, point 16: random logs of up to three segments, each a valid header
    /// (most of the time) followed by random bytes, some of them record markers.
    #[test]
    fn p16_the_reader_never_panics_on_random_logs(
        segments in proptest::collection::vec(
            (any::<bool>(), proptest::collection::vec(
                prop_oneof![Just(0xB7u8), any::<u8>()], 0..300)),
            1..=3,
        ),
        first in 1u64..4,
    ) {
        let template = runtime().block_on(real_log(&[], 1 << 20));
        let header = &template[&1][..SEGMENT_HEADER_LEN];
        let mut log = Log::new();
        for (i, (valid_header, tail)) in segments.into_iter().enumerate() {
            let number = first + i as u64;
            let mut bytes = Vec::new();
            if valid_header {
                bytes.extend_from_slice(header);
                put(&mut bytes, SEGMENT_NUMBER, &number.to_le_bytes());
                reseal(&mut bytes, 0, SEGMENT_CRC);
            }
            bytes.extend(tail);
            log.insert(number, bytes);
        }
        open(&log, "random log");
    }
}
