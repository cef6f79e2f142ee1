//! Lag against the oplog window through the real driver: the window read from
//! `local.oplog.rs` (or `serverStatus`), the position time decoded from event and post-batch
//! tokens, lag 0 for an idle and a 99.9%-filtered stream, the lag of a stuck one, and unknown
//! lag (with the reason) without the privileges to read the window.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson};
use flowwarden::{AnyStream, LagConfig, LagStatus, Runtime};
use futures::FutureExt;
use support::*;

fn sampling() -> LagConfig {
    LagConfig {
        interval: Duration::from_millis(200),
        stall_after: Duration::from_secs(300),
        headroom_warn_fraction: 0.2,
    }
}

async fn start_sampled(t: &Target, probe: &Probe, name: &'static str) -> Runtime {
    let stream = AnyStream::with_definition(probe.clone(), def(name, |_| {}));
    start_any_with(t, stream, |b| b.lag_sampling(sampling())).await
}

/// The first lag sample taken after now.
async fn next_sample(rt: &Runtime, name: &str) -> LagStatus {
    flowwarden_testkit::next_lag_sample_within(rt, name, Duration::from_secs(20)).await
}

/// A sample once the stream has had time to read everything written so far.
async fn settled_sample(rt: &Runtime, name: &str) -> LagStatus {
    tokio::time::sleep(Duration::from_millis(600)).await;
    next_sample(rt, name).await
}

/// Idle after its events, and with only other collections written: caught up, lag 0, the
/// position time taken from the post-batch tokens (newer than its own last event).
async fn idle_and_filtered_streams_are_caught_up(t: &Target) {
    // 99.9% of the watched collection's writes rejected by the client-side filter.
    let probe = Probe::default().with_filter(|ctx| {
        ctx.document_key()
            .and_then(|k| k.get("_id"))
            .and_then(Bson::as_i32)
            .is_some_and(|id| id % 1000 == 0)
    });
    let rt = start_sampled(t, &probe, "lag_filtered").await;
    let docs: Vec<_> = (1..=2000).map(|i| doc! {"_id": i}).collect();
    t.coll("orders").insert_many(docs).await.expect("inserts");
    // Received is counted before the event is handled: wait for the last one to settle too.
    wait_status(&rt, "lag_filtered", |s| {
        s.counters.received == 2000 && s.counters.handled + s.counters.filtered == 2000
    })
    .await;
    assert_eq!(probe.successes().len(), 2);
    // Writes elsewhere move the oplog's newest entry; the stream sees none of them.
    if let Some(emu) = t.emu.as_ref() {
        emu.advance_clock(Duration::from_secs(120));
    } else {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    t.coll("elsewhere")
        .insert_one(doc! {"_id": 1})
        .await
        .expect("insert");
    let lag = settled_sample(&rt, "lag_filtered").await;
    assert!(lag.known, "{lag:?}");
    assert!(lag.caught_up, "{lag:?}");
    assert_eq!(lag.lag_seconds, Some(0.0), "{lag:?}");
    assert!(!lag.stalled);
    let window = lag.window_seconds.expect("the window is read");
    assert!(window >= 0.0, "{lag:?}");
    assert_eq!(lag.headroom_seconds, Some(window), "{lag:?}");
    if t.emu.is_some() {
        // The position is a post-batch token past the write elsewhere: its decoded time is
        // 120 s after the stream's own last event (the newest entry may be newer still: the
        // runtime's own checkpoint writes are oplog entries too).
        assert!(lag.position_time <= lag.newest_time, "{lag:?}");
        let last_event = rt
            .handle()
            .status("lag_filtered")
            .and_then(|s| s.last_event_at);
        let gap = lag
            .position_time
            .zip(last_event)
            .map(|(p, e)| (p.timestamp_millis() - e.timestamp_millis()) / 1000);
        assert!(
            gap.is_some_and(|g| (118..=121).contains(&g)),
            "{gap:?} {lag:?}"
        );
    }
    rt.shutdown().await;
}

mod idle_and_filtered {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn emulator() {
        let t = Target::emulator().await;
        super::idle_and_filtered_streams_are_caught_up(&t).await;
        t.finish().await;
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn live() {
        let Some(t) = Target::live("lag_idle_and_filtered").await else {
            return;
        };
        super::idle_and_filtered_streams_are_caught_up(&t).await;
        t.finish().await;
    }
}

/// A probe whose handler waits on `gate` in the change of `_id` 2.
fn stuck_on_2(gate: Arc<tokio::sync::Notify>) -> Probe {
    Probe::new(move |ctx| {
        let gate = gate.clone();
        async move {
            if ctx.document_key() == Some(&doc! {"_id": 2}) {
                gate.notified().await;
            }
            Ok(())
        }
        .boxed()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_stream_lags_by_the_server_time_written_since_its_position() {
    let t = Target::emulator().await;
    let emu = t.emu();
    let gate = Arc::new(tokio::sync::Notify::new());
    let probe = stuck_on_2(gate.clone());
    let rt = start_sampled(&t, &probe, "lag_stuck").await;
    t.insert_ids([1]).await;
    wait_until("1 handled", || probe.successes().len() == 1).await;
    // 2 blocks the handler; the server's clock then moves 300 s and 3 is written.
    t.insert_ids([2]).await;
    emu.advance_clock(Duration::from_secs(300));
    t.insert_ids([3]).await;
    let lag = settled_sample(&rt, "lag_stuck").await;
    assert!(lag.known && !lag.caught_up, "{lag:?}");
    let behind = lag.lag_seconds.expect("lag");
    // Settled: 1; newest: 3, 300 s of server time later (cluster times have 1 s resolution).
    assert!((299.0..=302.0).contains(&behind), "{lag:?}");
    let window = lag.window_seconds.expect("window");
    assert!(window >= behind, "{lag:?}");
    assert_eq!(lag.headroom_seconds, Some(window - behind));
    // The position's time is decoded from event 1's token: its clusterTime.
    assert_eq!(
        lag.oldest_time.map(|o| o <= lag.position_time.unwrap_or(o)),
        Some(true),
        "{lag:?}"
    );
    // Drop the oldest entries: the window shrinks to what is behind, headroom to about 0.
    emu.keep_last_oplog_entries(2);
    let lag = settled_sample(&rt, "lag_stuck").await;
    assert!(lag.headroom_seconds.is_some_and(|h| h <= 1.0), "{lag:?}");
    gate.notify_one();
    wait_until("3 handled", || probe.successes().len() == 3).await;
    let lag = settled_sample(&rt, "lag_stuck").await;
    assert_eq!(lag.lag_seconds, Some(0.0), "{lag:?}");
    rt.shutdown().await;
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_privileges_to_read_the_window_lag_is_unknown_and_says_why() {
    let t = Target::emulator().await;
    let emu = t.emu();
    emu.deny_oplog_reads(true);
    // serverStatus alone is enough.
    let probe = Probe::default();
    let rt = start_sampled(&t, &probe, "lag_status_only").await;
    t.insert_ids([1]).await;
    wait_until("1 handled", || probe.successes().len() == 1).await;
    let lag = settled_sample(&rt, "lag_status_only").await;
    assert!(lag.known, "serverStatus reports the window: {lag:?}");
    rt.shutdown().await;

    emu.deny_server_status(true);
    let probe = Probe::default();
    let rt = start_sampled(&t, &probe, "lag_unknown").await;
    t.insert_ids([2]).await;
    wait_until("2 handled", || probe.successes().len() == 1).await;
    let lag = settled_sample(&rt, "lag_unknown").await;
    assert!(!lag.known, "{lag:?}");
    assert_eq!(lag.lag_seconds, None);
    assert_eq!(lag.window_seconds, None);
    let why = lag.unknown_reason.expect("a reason");
    assert!(
        why.contains("local.oplog.rs") && why.contains("clusterMonitor"),
        "{why}"
    );
    // The stream itself runs on.
    assert_eq!(
        rt.handle().status("lag_unknown").map(|s| s.state),
        Some(flowwarden::StreamState::Running)
    );
    rt.shutdown().await;
    t.finish().await;
}
