//! A stream reading a cursor that answers from memory (the in-memory backend) reads it on its
//! own task: these tests check that such a stream still shares its thread.

mod support;

use flowwarden::MemoryBackend;
use support::*;

/// On a single-threaded runtime, a stream working through a backlog with a handler that never
/// waits yields now and then: another task on the thread runs while the backlog is handled,
/// not only after it. (A stream that never gave the thread back would take the 5,000 events in
/// one poll.)
#[tokio::test]
async fn a_busy_stream_reading_from_memory_lets_other_tasks_on_its_thread_run() {
    const BACKLOG: u64 = 5_000;
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = start(&backend, &probe, def("busy", |_| {})).await;
    insert_ids(&backend, 0..BACKLOG as i32);
    let handle = rt.handle();
    let mut observed = Vec::new();
    loop {
        tokio::task::yield_now().await;
        let handled = handle.status("busy").expect("stream").counters.handled;
        observed.push(handled);
        if handled >= BACKLOG {
            break;
        }
    }
    assert!(
        observed.iter().any(|&n| n > 0 && n < BACKLOG),
        "this task ran only before or after the backlog was handled: {observed:?}"
    );
    rt.shutdown().await;
}
