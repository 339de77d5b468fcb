//! Model-based test: random batch sequences applied to `MemStore` (the model) and to
//! `WalStore` with tiny segments (so rolls and compaction happen constantly), reopening
//! the WAL at random points, its commits written by the committer thread or by the
//! committing thread (`WalConfig::caller_writes`). After every step both must hold the
//! same data.

mod common;

use common::Env;
use procflow_store::{Batch, MemStore, Op, Store, SyncMode, WalConfig};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Commit(Vec<Op>, Option<u64>),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0..12u64;
    let value = proptest::collection::vec(any::<u8>(), 0..80);
    prop_oneof![
        4 => (id.clone(), proptest::option::of(0..12u64), value.clone())
            .prop_map(|(id, parent, value)| Op::Put { id, parent, value }),
        2 => (id.clone(), value.clone()).prop_map(|(id, value)| Op::Finish { id, value }),
        2 => id.prop_map(|id| Op::Delete { id }),
        1 => (0..3u8, value.clone()).prop_map(|(k, value)| Op::PutMeta { key: format!("m{k}"), value }),
        1 => (0..3u8, value).prop_map(|(k, value)| Op::CreateMeta { key: format!("m{k}"), value }),
        1 => (0..3u8).prop_map(|k| Op::DeleteMeta { key: format!("m{k}") }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => (proptest::collection::vec(op(), 0..4), proptest::option::of(0..20u64))
            .prop_map(|(ops, token)| Step::Commit(ops, token)),
        1 => Just(Step::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn wal_store_behaves_like_mem_store(
        steps in proptest::collection::vec(step(), 1..60),
        segment_size in prop_oneof![Just(200u64), Just(700), Just(64 << 10)],
        caller_writes in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let env = Env::sim();
            let config = WalConfig {
                segment_size,
                sync: SyncMode::Durable,
                caller_writes,
                ..WalConfig::default()
            };
            let model = MemStore::new();
            let mut wal = env.open(config.clone()).unwrap();
            for step in steps {
                match step {
                    Step::Commit(ops, token) => {
                        let batch = Batch { ops, fencing_token: token };
                        let expected = model.commit(batch.clone()).await;
                        let actual = wal.commit(batch).await;
                        prop_assert_eq!(
                            expected.map_err(|e| e.to_string()),
                            actual.map_err(|e| e.to_string())
                        );
                    }
                    Step::Reopen => {
                        drop(wal);
                        wal = env.open(config.clone()).unwrap();
                    }
                }
                prop_assert_eq!(model.load().await.unwrap(), wal.load().await.unwrap());
            }
            drop(wal);
            let wal = env.open(config).unwrap();
            prop_assert_eq!(model.load().await.unwrap(), wal.load().await.unwrap());
            Ok(())
        })?;
    }
}
