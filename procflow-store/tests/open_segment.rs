//! The log reader against damaged and arbitrary segments, in every test run (issue 12,
//! point 16). The cargo-fuzz target `fuzz/fuzz_targets/open_segment.rs` explores further;
//! this runs the same harness on a corpus built here — a real segment, every prefix of
//! it, every single-bit flip of it — and on bounded random inputs (proptest).
//!
//! Opening must never panic. A prefix of a valid segment is a torn tail: it opens, with
//! the records wholly inside the prefix.

use procflow_store::io::{IoBackend, SimBackend};
use procflow_store::{Batch, Store, WalConfig, WalStore};
use proptest::prelude::*;
use std::path::Path;
use std::sync::{Arc, OnceLock};

const DIR: &str = "/store";

/// A segment written by a real store: its file name and bytes, and the records it holds.
struct Segment {
    name: String,
    bytes: Vec<u8>,
    records: usize,
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Runtime::new().unwrap())
}

/// Writes a few batches (puts, a finish, a delete, metadata) and reads the segment back.
fn valid_segment() -> &'static Segment {
    static SEGMENT: OnceLock<Segment> = OnceLock::new();
    SEGMENT.get_or_init(|| {
        let sim = Arc::new(SimBackend::new());
        let dir = Path::new(DIR);
        let store =
            WalStore::open_with_backend(dir, WalConfig::default(), Arc::clone(&sim) as _).unwrap();
        runtime().block_on(async {
            for id in 1..=4u64 {
                let batch = Batch::new()
                    .put(id, None, vec![u8::try_from(id).unwrap(); 20])
                    .put_meta("next", id.to_le_bytes().to_vec());
                store.commit(batch).await.unwrap();
            }
            store
                .commit(Batch::new().finish(2, vec![9; 5]).delete(3))
                .await
                .unwrap();
            store.close().await.unwrap();
        });
        drop(store);
        let name = sim
            .list_dir(dir)
            .unwrap()
            .into_iter()
            .find(|name| name.ends_with(".wal"))
            .expect("a segment");
        let bytes = sim.read_file(&dir.join(&name)).unwrap();
        Segment {
            name,
            bytes,
            records: 3, // 1, 2 (finished), 4; 3 deleted
        }
    })
}

/// Opens a store whose only segment holds `data`: the number of records it holds, or
/// the error. Never panics (that is what is tested).
fn open(data: &[u8]) -> Result<usize, String> {
    let sim = SimBackend::new();
    let dir = Path::new(DIR);
    sim.create_dir_all(dir).unwrap();
    let file = sim.create_file(&dir.join(&valid_segment().name)).unwrap();
    file.append(data).unwrap();
    let store = WalStore::open_with_backend(dir, WalConfig::default(), Arc::new(sim))
        .map_err(|e| e.to_string())?;
    let loaded = runtime()
        .block_on(store.load())
        .map_err(|e| e.to_string())?;
    Ok(loaded.records.len())
}

#[test]
fn p16_the_valid_segment_opens_with_all_its_records() {
    assert_eq!(open(&valid_segment().bytes), Ok(valid_segment().records));
}

/// A segment is created with its header atomically (written, synced, renamed into
/// place), so a shorter file is corruption naming the file; from the header on, any cut is
/// a torn tail.
#[test]
fn p16_every_prefix_of_a_segment_opens_as_a_torn_tail() {
    let segment = valid_segment();
    let header = (0..=segment.bytes.len())
        .find(|&len| open(&segment.bytes[..len]).is_ok())
        .expect("the whole segment opens");
    assert!(header > 0 && header <= 64, "a header of {header} bytes");
    for len in 0..header {
        let error = open(&segment.bytes[..len]).unwrap_err();
        assert!(error.contains(&segment.name), "{len}: {error}");
    }
    let mut records = Vec::new();
    for len in header..=segment.bytes.len() {
        let held = open(&segment.bytes[..len])
            .unwrap_or_else(|e| panic!("a prefix of {len} bytes is a torn tail, not {e}"));
        records.push(held);
    }
    // Records appear as whole batches come into the prefix, up to all of them.
    assert_eq!(records.first(), Some(&0));
    assert_eq!(records.last(), Some(&segment.records));
    assert!(records.iter().all(|&held| held <= 4), "{records:?}");
}

#[test]
fn p16_every_single_bit_flip_opens_or_errs_without_panicking() {
    let segment = valid_segment();
    for at in 0..segment.bytes.len() {
        for bit in 0..8 {
            let mut bytes = segment.bytes.clone();
            bytes[at] ^= 1 << bit;
            // Either outcome is fine here: a flip in the last record is a torn tail, one
            // before it is corruption. A panic is not.
            let _ = open(&bytes);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn p16_arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = open(&data);
    }

    #[test]
    fn p16_a_damaged_real_segment_never_panics(
        cuts in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        keep in any::<prop::sample::Index>(),
    ) {
        let mut bytes = valid_segment().bytes.clone();
        for (at, value) in cuts {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        let keep = keep.index(bytes.len() + 1);
        let _ = open(&bytes[..keep]);
    }
}
