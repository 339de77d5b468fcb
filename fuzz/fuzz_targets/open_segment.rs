//! Opening a store whose only segment holds arbitrary bytes must never panic: it either
//! opens (valid records, possibly a torn tail cut off) or reports an error.
#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use procflow_store::io::{IoBackend, SimBackend};
use procflow_store::{WalConfig, WalStore};

fuzz_target!(|data: &[u8]| {
    let sim = SimBackend::new();
    let dir = Path::new("/store");
    sim.create_dir_all(dir).unwrap();
    let file = sim
        .create_file(&dir.join("segment-0000000000000001.wal"))
        .unwrap();
    file.append(data).unwrap();
    let _ = WalStore::open_with_backend(dir, WalConfig::default(), Arc::new(sim));
});
