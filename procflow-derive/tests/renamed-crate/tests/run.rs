//! Runs the machines of this crate, compiled against procflow renamed to `pf`.

use pf::StateMachine;
use pf::executor::{Executor, Outcome};
use pf::store::MemStore;
use procflow_renamed_crate_test::{Count, CountState, Words, WordsState};
use std::sync::Arc;

#[tokio::test]
async fn renamed_dependency_and_reserved_names_run() {
    let executor = Executor::builder(Arc::new(MemStore::new()), ())
        .register::<CountState>()
        .register::<WordsState>()
        .start()
        .await
        .unwrap();
    let count = executor.submit(Count { value: 41 }).await.unwrap();
    let words = executor.submit(Words::default()).await.unwrap();
    assert_eq!(executor.wait(count).await.unwrap(), Outcome::Succeeded);
    assert_eq!(executor.wait(words).await.unwrap(), Outcome::Succeeded);
    executor.shutdown().await.unwrap();
}

#[test]
fn stored_names_have_no_raw_prefix() {
    let names: Vec<&str> = WordsState::INFO.iter().map(|info| info.name).collect();
    assert_eq!(names, ["Gen", "type", "Crate", "Move", "Done"]);
    assert_eq!(WordsState::INFO[0].targets, ["type"]);
    assert_eq!(WordsState::from_name("type"), Some(WordsState::r#type));
    assert!(!pf::mermaid::<WordsState>().contains("r#"));
}
