//! Byte-level damage: a log cut at every byte offset, bits flipped in the middle, and
//! arbitrary bytes, on both backends. Opening must never panic, lose only the
//! unacknowledged tail, and report any other damage as `Corrupt` with file and offset.

mod common;

use std::path::{Path, PathBuf};

use common::{Env, prefix_states, workload};
use procflow_store::{Batch, Loaded, Store, StoreError, WalConfig};
use proptest::prelude::*;

const SEGMENT_HEADER_LEN: usize = 32;
const FIRST_SEGMENT: &str = "segment-0000000000000001.wal";

/// A small one-segment log: its bytes, where its records ended after each commit
/// (element `k` after `k` batches) and the state after each commit.
struct SmallLog {
    bytes: Vec<u8>,
    lengths: Vec<usize>,
    states: Vec<Loaded>,
}

async fn small_log(env: &Env, batches: &[Batch]) -> SmallLog {
    let dir = env.fresh_dir();
    let store = env.open_at(&dir, WalConfig::default()).unwrap();
    let path = dir.join(FIRST_SEGMENT);
    // The records' end, not the file's length: the file is allocated ahead of them.
    let records_end = |store: &procflow_store::WalStore| {
        let stats = store.stats();
        (stats.disk_bytes - stats.ahead_bytes) as usize
    };
    let mut lengths = vec![records_end(&store)];
    for batch in batches {
        store.commit(batch.clone()).await.unwrap();
        lengths.push(records_end(&store));
    }
    store.close().await.unwrap();
    let bytes = env.read(&path);
    let what = env.name;
    assert_eq!(
        bytes.len(),
        lengths[batches.len()],
        "{what}: closed at its records' end"
    );
    SmallLog {
        bytes,
        lengths,
        states: prefix_states(batches).await,
    }
}

/// Writes `bytes` as the only segment of a fresh store directory and opens it.
async fn open_with(env: &Env, bytes: &[u8]) -> (PathBuf, Result<Loaded, StoreError>) {
    let dir = env.fresh_dir();
    let path = dir.join(FIRST_SEGMENT);
    env.put_file(&path, bytes);
    let result = match env.open_at(&dir, WalConfig::default()) {
        Ok(store) => Ok(store.load().await.unwrap()),
        Err(e) => Err(e),
    };
    (path, result)
}

fn assert_corrupt_at(result: Result<Loaded, StoreError>, path: &Path, offset: u64, what: &str) {
    match result {
        Err(StoreError::Corrupt {
            file, offset: at, ..
        }) => {
            assert_eq!(file, path, "{what}");
            assert_eq!(at, offset, "{what}");
        }
        Err(other) => panic!("{what}: expected Corrupt, got {other}"),
        Ok(_) => panic!("{what}: expected Corrupt, opened fine"),
    }
}

#[tokio::test]
async fn cut_at_every_byte_loses_only_the_tail() {
    for env in Env::all() {
        let log = small_log(&env, &workload(6, 8)).await;
        for cut in 0..=log.bytes.len() {
            let what = format!("{}: cut at {cut}", env.name);
            let (path, result) = open_with(&env, &log.bytes[..cut]).await;
            if cut < SEGMENT_HEADER_LEN {
                // Segments are created complete (written aside, synced, renamed).
                assert_corrupt_at(result, &path, 0, &what);
                continue;
            }
            let complete = log.lengths.iter().filter(|&&len| len <= cut).count() - 1;
            assert_eq!(result.unwrap(), log.states[complete], "{what}");
            // The torn tail was cut off on disk.
            assert_eq!(env.read(&path).len(), log.lengths[complete], "{what}");
        }
    }
}

#[tokio::test]
async fn flipped_bits_before_the_last_record_are_reported_as_corrupt() {
    for env in Env::all() {
        let log = small_log(&env, &workload(5, 8)).await;
        let last_record = log.lengths[log.lengths.len() - 2];
        for position in 0..last_record {
            let mut bytes = log.bytes.clone();
            bytes[position] ^= 1 << (position % 8);
            let (path, result) = open_with(&env, &bytes).await;
            let record_start = log
                .lengths
                .iter()
                .rev()
                .find(|&&start| start <= position)
                .map_or(0, |&start| {
                    if position < SEGMENT_HEADER_LEN {
                        0
                    } else {
                        start
                    }
                });
            let what = format!("{}: bit flipped at byte {position}", env.name);
            assert_corrupt_at(result, &path, record_start as u64, &what);
        }
        // Damage in the last record looks exactly like a torn write: it is dropped.
        let mut bytes = log.bytes.clone();
        bytes[last_record + 40] ^= 1;
        let (_, result) = open_with(&env, &bytes).await;
        assert_eq!(result.unwrap(), log.states[log.states.len() - 2]);
    }
}

#[tokio::test]
async fn damage_in_a_closed_segment_is_corrupt_even_at_its_end() {
    for env in Env::all() {
        let config = WalConfig {
            segment_size: 512,
            ..WalConfig::default()
        };
        let store = env.open(config.clone()).unwrap();
        for id in 0..10 {
            store
                .commit(Batch::new().put(id, None, vec![1; 100]))
                .await
                .unwrap();
        }
        store.close().await.unwrap();
        drop(store);
        let segments = env.segments();
        assert!(segments.len() > 2, "{}", env.name);
        let bytes = env.read(&segments[0]);
        env.write(&segments[0], &bytes[..bytes.len() - 1]);
        let err = env.open(config).unwrap_err();
        match err {
            StoreError::Corrupt { file, reason, .. } => {
                assert_eq!(file, segments[0]);
                assert!(reason.contains("closed segment"), "{reason}");
            }
            other => panic!("{}: {other}", env.name),
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Arbitrary bytes, with or without a valid segment header in front, never panic.
    #[test]
    fn arbitrary_segment_bytes_never_panic(
        valid_header in any::<bool>(),
        tail in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let env = Env::sim();
        let mut bytes = Vec::new();
        if valid_header {
            let log = runtime().block_on(small_log(&env, &[]));
            bytes.extend(log.bytes);
        }
        bytes.extend(tail);
        let (_, result) = runtime().block_on(open_with(&env, &bytes));
        match result {
            Ok(loaded) => prop_assert!(valid_header && loaded.records.is_empty()),
            Err(StoreError::Corrupt { .. }) => {}
            Err(other) => prop_assert!(false, "unexpected error {other}"),
        }
    }

    /// A real log with random bytes overwritten opens to a state it really had, or
    /// reports corruption.
    #[test]
    fn mutated_logs_open_to_a_real_state_or_report_corruption(
        mutations in proptest::collection::vec((any::<usize>(), 1..=255u8), 1..4),
    ) {
        let env = Env::sim();
        let rt = runtime();
        let log = rt.block_on(small_log(&env, &workload(6, 8)));
        let mut bytes = log.bytes.clone();
        for (position, xor) in mutations {
            let len = bytes.len();
            bytes[position % len] ^= xor;
        }
        let (_, result) = rt.block_on(open_with(&env, &bytes));
        match result {
            Ok(loaded) => prop_assert!(log.states.contains(&loaded)),
            Err(StoreError::Corrupt { .. }) => {}
            Err(other) => prop_assert!(false, "unexpected error {other}"),
        }
    }

    /// A log cut anywhere and followed by garbage keeps every complete record.
    #[test]
    fn garbage_after_a_cut_is_a_torn_tail(
        cut in any::<usize>(),
        garbage in proptest::collection::vec(any::<u8>(), 0..100),
    ) {
        let env = Env::sim();
        let rt = runtime();
        let log = rt.block_on(small_log(&env, &workload(6, 8)));
        let cut = SEGMENT_HEADER_LEN + cut % (log.bytes.len() - SEGMENT_HEADER_LEN + 1);
        let mut bytes = log.bytes[..cut].to_vec();
        bytes.extend(garbage);
        let (_, result) = rt.block_on(open_with(&env, &bytes));
        // Complete: every byte of the record is there. Garbage that happens to repeat the
        // bytes the cut removed completes a record again (cut one byte short of a record
        // ending in 1, garbage [1]: proptest found it).
        let complete = log
            .lengths
            .iter()
            .filter(|&&len| bytes.get(..len) == Some(&log.bytes[..len]))
            .count()
            - 1;
        prop_assert_eq!(result.unwrap(), log.states[complete].clone());
    }
}
