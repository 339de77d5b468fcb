//! Spans per procedure and per step, counters and a step-latency histogram. Own test
//! binary: it installs the process-wide metrics recorder and tracing subscriber.

mod common;

use common::{Bounded, Counter, CounterState, Ledger, TestStore};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use procflow::executor::Outcome;
use std::sync::{Arc, Mutex};
use tracing::span;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};

/// Records the name of every span opened.
#[derive(Clone, Default)]
struct SpanNames(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for SpanNames {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, _: &span::Id, _: LayerContext<'_, S>) {
        self.0
            .lock()
            .unwrap()
            .push(attrs.metadata().name().to_owned());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_counters_and_step_latency() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).unwrap();
    let spans = SpanNames::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(spans.clone()))
        .unwrap();

    let store = TestStore::memory();
    let ledger = Ledger::default();
    let executor = store
        .builder(&ledger)
        .register::<CounterState>()
        .start()
        .await
        .unwrap();
    let ok = executor.submit(Counter::named("ok")).await.unwrap();
    let failing = Counter {
        fail_at: Some(2),
        fatal: true,
        ..Counter::named("bad")
    };
    let bad = executor.submit(failing).await.unwrap();
    assert_eq!(
        executor.wait(ok).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert!(matches!(
        executor.wait(bad).bounded().await.unwrap(),
        Outcome::RolledBack(_)
    ));

    let metrics: Vec<_> = snapshotter.snapshot().into_vec();
    let value = |name: &str| {
        metrics
            .iter()
            .find(|(key, _, _, _)| key.key().name() == name)
            .map(|(_, _, _, value)| value)
    };
    let counter = |name: &str| match value(name) {
        Some(DebugValue::Counter(n)) => Some(*n),
        _ => None,
    };
    assert_eq!(counter("procflow_submitted_total"), Some(2));
    assert_eq!(counter("procflow_succeeded_total"), Some(1));
    assert_eq!(counter("procflow_rolled_back_total"), Some(1));
    assert_eq!(counter("procflow_failed_total"), None);
    // Four steps of `ok`, two of `bad` (the failing one included) and its one rollback step.
    match value("procflow_step_seconds") {
        Some(DebugValue::Histogram(samples)) => assert_eq!(samples.len(), 7),
        other => panic!("no step histogram: {other:?}"),
    }

    let names = spans.0.lock().unwrap().clone();
    assert_eq!(names.iter().filter(|n| *n == "procedure").count(), 2);
    assert_eq!(names.iter().filter(|n| *n == "step").count(), 7);
}
