//! Lag against the retained history on the in-memory backend, in virtual time: lag is the
//! newest history time minus the settled position's time, 0 when caught up; an idle and a
//! 99.9%-filtered stream show none; a stuck one shows its lag, then stalls, and readiness
//! fails for it.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bson::Bson;
use flowwarden::{LagConfig, LagStatus, MemoryBackend, Runtime, StreamState};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::*;

fn sampling(stall_after_secs: u64) -> LagConfig {
    LagConfig {
        interval: Duration::from_secs(1),
        stall_after: Duration::from_secs(stall_after_secs),
        headroom_warn_fraction: 0.2,
    }
}

async fn start_sampled(
    backend: &MemoryBackend,
    probe: &Probe,
    name: &'static str,
    stall_after_secs: u64,
) -> Runtime {
    start_with(backend, probe, def(name, |_| {}), |b| {
        b.lag_sampling(sampling(stall_after_secs))
    })
    .await
}

/// The next lag sample taken after now (the sampler runs every second).
async fn next_sample(rt: &Runtime, name: &str) -> LagStatus {
    flowwarden_testkit::next_lag_sample_within(rt, name, Duration::from_secs(60)).await
}

/// A sample taken once `settle` of virtual time has passed, so everything in flight is read.
async fn sample_after(rt: &Runtime, name: &str, settle: Duration) -> LagStatus {
    tokio::time::sleep(settle).await;
    next_sample(rt, name).await
}

#[tokio::test(start_paused = true)]
async fn an_idle_stream_has_no_lag_however_old_its_last_event() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = start_sampled(&backend, &probe, "idle", 300).await;
    insert_ids(&backend, 1..=3);
    wait_until("3 handled", || probe.successes().len() == 3).await;
    // Ten quiet minutes: the last event's age grows, the stream is not behind.
    tokio::time::sleep(Duration::from_secs(600)).await;
    let lag = next_sample(&rt, "idle").await;
    assert!(lag.known, "{lag:?}");
    assert!(lag.caught_up, "{lag:?}");
    assert_eq!(lag.lag_seconds, Some(0.0));
    assert!(!lag.stalled);
    // The window spans the retained entries (written within the first second).
    assert!(lag.window_seconds.is_some_and(|w| w < 2.0), "{lag:?}");
    assert_eq!(lag.headroom_seconds, lag.window_seconds);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_filters_out_almost_everything_is_caught_up_not_behind() {
    let backend = MemoryBackend::new();
    // 99.9% rejected by the client-side filter: only every 1000th document is handled.
    let probe = Probe::default().with_filter(|ctx| {
        ctx.document_key()
            .and_then(|k| k.get("_id"))
            .and_then(Bson::as_i32)
            .is_some_and(|id| id % 1000 == 0)
    });
    let rt = start_sampled(&backend, &probe, "filtered", 300).await;
    let orders = backend.collection("orders");
    // 3,000 writes over 50 minutes; the last handled one (3000) is the newest, but the one
    // before (2000) is 17 minutes older than the writes that followed it.
    for minute in 0..50 {
        for i in 0..60 {
            let id = minute * 60 + i + 1;
            orders.insert_one(bson::doc! {"_id": id}).unwrap();
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    // One more rejected write: the handled events are now all older than the newest entry.
    orders.insert_one(bson::doc! {"_id": 3001}).unwrap();
    wait_status(&rt, "filtered", |s| s.counters.received == 3001).await;
    let lag = sample_after(&rt, "filtered", Duration::from_secs(3)).await;
    assert_eq!(probe.successes().len(), 3);
    assert!(lag.known && lag.caught_up, "{lag:?}");
    assert_eq!(lag.lag_seconds, Some(0.0), "{lag:?}");
    // The settled position is the newest entry, filtered or not.
    assert_eq!(lag.position_time, lag.newest_time, "{lag:?}");
    let window = lag.window_seconds.expect("window");
    assert!((2_900.0..=3_000.0).contains(&window), "{lag:?}");
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stuck_stream_shows_its_lag_then_stalls_and_recovers_when_it_moves() {
    let backend = MemoryBackend::new();
    let gate = Arc::new(tokio::sync::Notify::new());
    let probe = stalling_on(2, gate.clone());
    let rt = start_sampled(&backend, &probe, "stuck", 120).await;
    insert_ids(&backend, [1]);
    wait_until("1 handled", || probe.successes().len() == 1).await;
    tokio::time::sleep(Duration::from_secs(100)).await;
    // 2 blocks the stream; 3 is written 100 s after 1.
    insert_ids(&backend, [2]);
    tokio::time::sleep(Duration::from_secs(100)).await;
    insert_ids(&backend, [3]);
    let lag = sample_after(&rt, "stuck", Duration::from_secs(2)).await;
    assert!(lag.known && !lag.caught_up, "{lag:?}");
    // Settled: 1 (t = 0); newest: 3 (t = 200, plus the few milliseconds the test waited for 1).
    let behind = lag.lag_seconds.expect("lag");
    assert!((200.0..201.0).contains(&behind), "{lag:?}");
    let window = lag.window_seconds.expect("window");
    assert_eq!(lag.headroom_seconds, Some(window - behind));
    assert!(!lag.stalled, "not yet past stall_after: {lag:?}");
    assert_eq!(
        rt.handle().status("stuck").unwrap().state,
        StreamState::Running
    );

    // Two minutes without progress while behind: stalled.
    let s = wait_status(&rt, "stuck", |s| s.lag.as_ref().is_some_and(|l| l.stalled)).await;
    assert_eq!(s.state, StreamState::Running);
    assert!(s.lag.as_ref().and_then(|l| l.behind_since).is_some());

    // Released, it handles 2 and 3, catches up and is no longer stalled.
    gate.notify_one();
    wait_until("3 handled", || probe.successes().len() == 3).await;
    let lag = sample_after(&rt, "stuck", Duration::from_secs(3)).await;
    assert!(!lag.stalled && lag.caught_up, "{lag:?}");
    assert_eq!(lag.lag_seconds, Some(0.0));
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stream_before_its_first_read_has_unknown_lag_never_zero() {
    let backend = MemoryBackend::new();
    insert_ids(&backend, 1..=2);
    // Disabled auto start: the stream never reads, so there is no position to measure.
    let probe = Probe::default();
    let d = def("unread", |d| d.auto_start = false);
    let rt = start_with(&backend, &probe, d, |b| b.lag_sampling(sampling(300))).await;
    let lag = next_sample(&rt, "unread").await;
    assert!(!lag.known, "{lag:?}");
    assert_eq!(lag.lag_seconds, None);
    assert!(lag.unknown_reason.is_some());
    assert!(lag.window_seconds.is_some(), "the window is known: {lag:?}");
    rt.shutdown().await;
}

type Gauges = Vec<(String, Vec<(String, String)>, f64)>;

fn gauge(snapshot: &Gauges, name: &str) -> Option<f64> {
    snapshot
        .iter()
        .find(|(n, labels, _)| {
            n == name && labels.iter().any(|(k, v)| k == "stream" && v == "gauged")
        })
        .map(|(_, _, v)| *v)
}

#[test]
fn the_lag_gauges_carry_lag_window_headroom_and_known() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let gauges = |s: &metrics_util::debugging::Snapshotter| -> Gauges {
        s.snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Gauge(v) => Some((
                    key.key().name().to_owned(),
                    key.key()
                        .labels()
                        .map(|l| (l.key().to_owned(), l.value().to_owned()))
                        .collect(),
                    v.into_inner(),
                )),
                _ => None,
            })
            .collect()
    };
    let stuck = metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let backend = MemoryBackend::new();
            let gate = Arc::new(tokio::sync::Notify::new());
            let probe = stalling_on(2, gate.clone());
            let rt = start_sampled(&backend, &probe, "gauged", 300).await;
            insert_ids(&backend, [1]);
            wait_until("1 handled", || probe.successes().len() == 1).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
            insert_ids(&backend, [2, 3]);
            let lag = sample_after(&rt, "gauged", Duration::from_secs(2)).await;
            let stuck = (lag, gauges(&snapshotter));
            gate.notify_one();
            rt.shutdown().await;
            stuck
        })
    });
    let (lag, snapshot) = stuck;
    let lag_seconds = gauge(&snapshot, "flowwarden.stream.lag_seconds").expect("lag gauge");
    assert!((30.0..31.0).contains(&lag_seconds), "{snapshot:?}");
    assert_eq!(Some(lag_seconds), lag.lag_seconds);
    assert_eq!(
        gauge(&snapshot, "flowwarden.oplog.window_seconds"),
        lag.window_seconds
    );
    // Only entries 1..=3 were written: the window is what the stream is behind.
    assert_eq!(
        gauge(&snapshot, "flowwarden.stream.headroom_seconds"),
        Some(lag.window_seconds.expect("window") - lag_seconds)
    );
    assert_eq!(gauge(&snapshot, "flowwarden.stream.lag_known"), Some(1.0));
}
