//! Test support: the shared probe handler (`flowwarden-testkit`), and helpers to run it on the
//! in-memory backend.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use flowwarden::{AnyStream, MemoryBackend, Runtime, StreamDefinition, StreamStatus};

pub use flowwarden_testkit::Probe;

pub mod snapshot;

/// A probe whose handler blocks in the change of `_id` `id` until `gate` is notified (a long
/// pause: a slow or frozen instance), then succeeds; every other change succeeds at once.
pub fn stalling_on(id: i32, gate: Arc<tokio::sync::Notify>) -> Probe {
    use futures::FutureExt;
    Probe::new(move |ctx| {
        let gate = gate.clone();
        async move {
            if ctx.document_key() == Some(&doc! {"_id": id}) {
                gate.notified().await;
            }
            Ok(())
        }
        .boxed()
    })
}

/// A definition for the probe with test-friendly defaults (no jitter, delays from 100 ms),
/// adjusted by `f`.
pub fn def(name: &'static str, f: impl FnOnce(&mut StreamDefinition)) -> &'static StreamDefinition {
    flowwarden_testkit::probe_def(name, 100, f)
}

/// Starts a runtime running only `probe` as `def`, on `backend`.
pub async fn start(
    backend: &MemoryBackend,
    probe: &Probe,
    def: &'static StreamDefinition,
) -> Runtime {
    start_with(backend, probe, def, |b| b).await
}

pub use flowwarden_testkit::init_logs;

pub async fn start_with(
    backend: &MemoryBackend,
    probe: &Probe,
    def: &'static StreamDefinition,
    configure: impl FnOnce(flowwarden::Builder) -> flowwarden::Builder,
) -> Runtime {
    init_logs();
    let b = flowwarden::builder()
        .discover(false)
        .any_stream(AnyStream::with_definition(probe.clone(), def))
        .backend(backend.clone())
        .seed(7)
        .max_await(Duration::from_millis(200))
        .shutdown_timeout(Duration::from_secs(5));
    let rt = configure(b).start().await.expect("runtime starts");
    // A stream without a checkpoint starts at "now": wait until its cursor is open (or it
    // halted) before the test writes anything.
    wait_status(&rt, def.name, |s| {
        s.state != flowwarden::StreamState::Starting
    })
    .await;
    rt
}

/// Waits (in virtual or real time, bounded) until the stream's status satisfies `pred`.
pub async fn wait_status(
    rt: &Runtime,
    name: &str,
    pred: impl Fn(&StreamStatus) -> bool,
) -> StreamStatus {
    flowwarden_testkit::wait_status_within(rt, name, Duration::from_secs(60), pred).await
}

/// Waits until `cond` holds, polling (bounded).
pub async fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    flowwarden_testkit::wait_until_within(what, Duration::from_secs(60), cond).await
}

/// The `_data` of the stored lastSeen / lastProcessed tokens of a stream.
pub fn stored_tokens(backend: &MemoryBackend, stream: &str) -> (Option<String>, Option<String>) {
    let Some(d) = backend.checkpoint_document(stream) else {
        return (None, None);
    };
    let get = |f: &str| {
        d.get_document(f)
            .ok()
            .and_then(|t| t.get_str("_data").ok())
            .map(str::to_owned)
    };
    (get("lastSeenToken"), get("lastProcessedToken"))
}

/// Inserts `{_id: i, n: i}` for each i.
pub fn insert_ids(backend: &MemoryBackend, ids: impl IntoIterator<Item = i32>) {
    let c = backend.collection("orders");
    for i in ids {
        c.insert_one(doc! {"_id": i, "n": i}).unwrap();
    }
}

/// The token `_data` of oplog entry `seq` on the in-memory backend.
pub fn token_of(seq: u64) -> String {
    format!("{seq:016X}")
}
