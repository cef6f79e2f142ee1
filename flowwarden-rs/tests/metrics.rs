//! Metrics reach the `metrics` facade under their documented names.

mod support;

use std::time::Duration;

use bson::Bson;
use flowwarden::MemoryBackend;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::*;

fn counter(snapshot: &[(String, u64)], name: &str) -> u64 {
    snapshot
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .sum()
}

#[test]
fn counters_and_the_resume_fallback_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let backend = MemoryBackend::new();
            let d = def("metered", |_| {});
            // Handle 1; filter out 2..=5 so only the seen token moves past them.
            let probe = Probe::default().with_filter(|ctx| {
                ctx.document_key().and_then(|k| k.get("_id")) == Some(&Bson::Int32(1))
            });
            let rt = start(&backend, &probe, d).await;
            insert_ids(&backend, 1..=5);
            wait_status(&rt, "metered", |s| s.counters.filtered == 4).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            rt.shutdown().await;
            // The processed token (1) falls out of the window; the seen token (5) does not.
            insert_ids(&backend, [6]);
            backend.faults().truncate_history(3);
            let probe = Probe::default();
            let rt = start(&backend, &probe, d).await;
            wait_until("6 handled", || probe.successes().len() == 1).await;
            rt.shutdown().await;
        });
    });
    let snapshot: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(v) => Some((key.key().name().to_owned(), v)),
            _ => None,
        })
        .collect();
    assert_eq!(counter(&snapshot, "flowwarden.events.received"), 6);
    assert_eq!(counter(&snapshot, "flowwarden.events.handled"), 2);
    assert_eq!(counter(&snapshot, "flowwarden.events.filtered"), 4);
    assert_eq!(
        counter(&snapshot, "flowwarden.stream.resume.fallback_to_seen"),
        1
    );
    assert_eq!(
        counter(&snapshot, "flowwarden.stream.resume.history_lost"),
        0
    );
    assert!(counter(&snapshot, "flowwarden.checkpoint.saved") >= 2);
}
