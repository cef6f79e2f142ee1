//! `AllInstances` streams without a configured instance identity keep one checkpoint under the
//! stream's name. A second live instance must never share it silently (a slow replica that
//! crashes would resume from its faster sibling's position and skip what it had in flight):
//! the checkpoint guard makes the second one halt with `SharedCheckpoint`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bson::Bson;
use flowwarden::{HaltReason, MemoryBackend, StreamState};
use support::*;
use tokio::sync::Notify;

fn runbook_exists(path: &str) -> bool {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
        .is_file()
}

#[tokio::test(start_paused = true)]
async fn a_second_instance_halts_and_a_crashed_ones_in_flight_event_is_not_lost() {
    let backend = MemoryBackend::new();
    let d = def("shared", |_| {});
    // A, the slow replica: blocks in change 2 until it crashes.
    let a = stalling_on(2, Arc::new(Notify::new()));
    let rt_a = start(&backend, &a, d).await;
    insert_ids(&backend, [1, 2]);
    wait_until("A is in change 2", || a.calls().len() == 2).await;

    // B, the fast sibling on the same backend with no identity either: it must not run.
    let b = Probe::default();
    let rt_b = start(&backend, &b, d).await;
    let st = wait_status(&rt_b, "shared", |s| s.halt.is_some()).await;
    let halt = st.halt.unwrap();
    assert_eq!(halt.reason, HaltReason::SharedCheckpoint);
    assert_eq!(st.state, StreamState::Stopped);
    assert!(
        halt.message.contains("FLOWWARDEN_INSTANCE_ID"),
        "{}",
        halt.message
    );
    assert!(runbook_exists(halt.runbook), "{} exists", halt.runbook);
    assert!(b.calls().is_empty(), "the second instance consumed nothing");
    assert_eq!(
        rt_a.handle().status("shared").unwrap().state,
        StreamState::Running
    );

    // A crashes with change 2 in flight; its replacement (a new generated identity) waits for
    // the crashed guard to expire, then resumes from A's checkpoint: 2 is handled, not skipped.
    rt_a.handle().crash().await;
    insert_ids(&backend, [3]);
    let crashed_at = tokio::time::Instant::now();
    let c = Probe::default();
    let rt_c = start(&backend, &c, d).await;
    wait_until("the replacement handled 2 and 3", || {
        let keys = c.handled_keys();
        keys.contains(&Bson::Int32(2)) && keys.contains(&Bson::Int32(3))
    })
    .await;
    let waited = crashed_at.elapsed();
    assert!(
        waited <= Duration::from_secs(30 + 5 + 1),
        "the crashed guard expires within one lease period and a poll, waited {waited:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stored = backend.checkpoint_document("shared").unwrap();
    assert!(
        stored.get_str("owner").is_ok(),
        "the writer is stamped: {stored}"
    );
    rt_b.shutdown().await;
    rt_c.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_graceful_shutdown_frees_the_guard_at_once() {
    let backend = MemoryBackend::new();
    let d = def("handover", |_| {});
    let a = Probe::default();
    let rt_a = start(&backend, &a, d).await;
    insert_ids(&backend, [1]);
    wait_until("A handled 1", || a.handled_keys().len() == 1).await;
    rt_a.shutdown().await;

    let started = tokio::time::Instant::now();
    let b = Probe::default();
    let rt_b = start(&backend, &b, d).await;
    insert_ids(&backend, [2]);
    wait_until("B handled 2", || b.handled_keys() == vec![Bson::Int32(2)]).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no wait for an expired guard: {:?}",
        started.elapsed()
    );
    rt_b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn instances_with_configured_identities_each_run_with_their_own_checkpoint() {
    let backend = MemoryBackend::new();
    let d = def("replicated", |_| {});
    let (a, b) = (Probe::default(), Probe::default());
    let rt_a = start_with(&backend, &a, d, |b| b.instance_id("pod-a")).await;
    let rt_b = start_with(&backend, &b, d, |b| b.instance_id("pod-b")).await;
    insert_ids(&backend, [1, 2]);
    wait_until("both handled both", || {
        a.handled_keys().len() == 2 && b.handled_keys().len() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in ["pod-a", "pod-b"] {
        let stored = backend
            .checkpoint_document(&format!("replicated@{id}"))
            .unwrap();
        assert_eq!(stored.get_str("owner").unwrap(), id);
    }
    assert!(backend.checkpoint_document("replicated").is_none());
    rt_a.shutdown().await;
    rt_b.shutdown().await;
}
