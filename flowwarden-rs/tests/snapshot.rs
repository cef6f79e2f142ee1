//! The initial snapshot (`start_position = Snapshot`) on the in-memory backend: the scan in
//! `_id` order, writes made during the scan, a crash and a stop mid-scan, history lost during
//! the scan, and a completed snapshot. The scan itself (mixed `_id` types, scan failures,
//! dead-lettered reads, a stream declared with the macros) is in `snapshot_scan.rs`.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, Document};
use flowwarden::{FullDocument, HaltReason, MemoryBackend, OnHistoryLost, StreamState};
use futures::FutureExt;
use support::snapshot::{id_of, logging_probe, snapshot_def, Log};
use support::{def, insert_ids, start, start_with, wait_status, wait_until, Probe};

#[tokio::test(start_paused = true)]
async fn existing_documents_are_read_in_id_order_then_the_stream_goes_on() {
    let backend = MemoryBackend::new();
    // Inserted out of order: the scan reads them by `_id`.
    insert_ids(&backend, [3, 1, 5, 2, 4]);
    let log = Log::default();
    let probe = logging_probe(&log, |_| None);
    let d = snapshot_def("snap-basic", |_| {});
    let rt = start_with(&backend, &probe, d, |b| b.batch_size(2)).await;
    wait_until("5 scanned", || log.len() == 5).await;
    wait_until("snapshot completed", || {
        backend
            .checkpoint_document("snap-basic")
            .is_some_and(|c| !c.contains_key("snapshotStartToken"))
    })
    .await;
    insert_ids(&backend, [6]);
    wait_until("6 streamed", || log.len() == 6).await;
    let st = rt.handle().status("snap-basic").unwrap();
    rt.shutdown().await;
    assert_eq!(log.scanned(), [1, 2, 3, 4, 5]);
    assert_eq!(log.streamed(), [6]);
    assert!(log.all().iter().all(|(op, _, _)| op == "insert"));
    assert_eq!(st.state, StreamState::Running);
    assert_eq!(st.counters.received, 6);
    let cp = backend.checkpoint_document("snap-basic").unwrap();
    for field in ["snapshotLastId", "snapshotScanned", "snapshotStartedAt"] {
        assert!(!cp.contains_key(field), "{field} left in {cp}");
    }
    assert!(cp.contains_key("lastProcessedToken"), "{cp}");
}

/// The projection a handler keeps: every live document by `_id`.
type Projection = Arc<Mutex<BTreeMap<i32, Document>>>;

#[tokio::test(start_paused = true)]
async fn writes_during_the_scan_end_with_the_projection_equal_to_the_collection() {
    let backend = MemoryBackend::new();
    insert_ids(&backend, 1..=10);
    let projection: Projection = Arc::default();
    let log = Log::default();
    let probe = {
        let projection = projection.clone();
        let backend = backend.clone();
        let log = log.clone();
        Probe::new(move |ctx| {
            let projection = projection.clone();
            let backend = backend.clone();
            let log = log.clone();
            async move {
                let id = id_of(&ctx);
                if ctx.is_snapshot() && id == Some(5) {
                    // Halfway through the scan: change documents already scanned (2, 3, 4)
                    // and not yet scanned (7, 8, 9), and insert before and after the cursor.
                    let c = backend.collection("orders");
                    c.update_one(doc! {"_id": 2}, doc! {"$set": {"n": 200}})
                        .unwrap();
                    c.update_one(doc! {"_id": 8}, doc! {"$set": {"n": 800}})
                        .unwrap();
                    c.delete_one(doc! {"_id": 3}).unwrap();
                    c.delete_one(doc! {"_id": 9}).unwrap();
                    c.insert_one(doc! {"_id": 0, "n": 0}).unwrap();
                    c.insert_one(doc! {"_id": 11, "n": 11}).unwrap();
                    c.replace_one(doc! {"_id": 4}, doc! {"_id": 4, "replaced": true})
                        .unwrap();
                    c.update_one(doc! {"_id": 7}, doc! {"$set": {"n": 700}})
                        .unwrap();
                    c.delete_one(doc! {"_id": 7}).unwrap();
                }
                let key = id.expect("an integer _id");
                let mut p = projection.lock().unwrap();
                match ctx.operation_type().as_str() {
                    "delete" => {
                        p.remove(&key);
                    }
                    _ => {
                        if let Some(full) = ctx.document() {
                            p.insert(key, full.clone());
                        }
                    }
                }
                drop(p);
                log.push(&ctx);
                Ok(())
            }
            .boxed()
        })
    };
    let d = snapshot_def("snap-writes", |d| {
        d.full_document = FullDocument::UpdateLookup;
    });
    let rt = start_with(&backend, &probe, d, |b| b.batch_size(3)).await;
    // A sentinel written after everything else: once it is handled, all earlier changes are.
    wait_until("scan reached 5", || log.scanned().contains(&5)).await;
    backend
        .collection("orders")
        .insert_one(doc! {"_id": 99, "n": 99})
        .unwrap();
    wait_until("sentinel handled", || log.streamed().contains(&99)).await;
    rt.shutdown().await;
    let expected: BTreeMap<i32, Document> = backend
        .collection("orders")
        .find(doc! {})
        .unwrap()
        .into_iter()
        .map(|d| (d.get_i32("_id").unwrap(), d))
        .collect();
    assert_eq!(*projection.lock().unwrap(), expected);
    // Deleted before the scan reached them: never read by the scan.
    let scanned = log.scanned();
    assert!(
        !scanned.contains(&7) && !scanned.contains(&9),
        "{scanned:?}"
    );
    // The insert after the cursor was read by the scan and then delivered again by the stream
    // (a duplicate, never a gap).
    assert!(scanned.contains(&11), "{scanned:?}");
    assert!(log.streamed().contains(&11));
}

#[tokio::test(start_paused = true)]
async fn a_crash_mid_scan_resumes_the_scan_after_the_last_settled_document() {
    let backend = MemoryBackend::new();
    insert_ids(&backend, 1..=10);
    let gate = Arc::new(tokio::sync::Notify::new());
    let stalled = Arc::new(Mutex::new(false));
    let log = Log::default();
    let probe = {
        let log = log.clone();
        let gate = gate.clone();
        let stalled = stalled.clone();
        Probe::new(move |ctx| {
            let log = log.clone();
            let gate = gate.clone();
            let stalled = stalled.clone();
            async move {
                if id_of(&ctx) == Some(6) {
                    *stalled.lock().unwrap() = true;
                    gate.notified().await;
                }
                log.push(&ctx);
                Ok(())
            }
            .boxed()
        })
    };
    let d = snapshot_def("snap-crash", |d| d.checkpoint.save_every_n = 1);
    let rt = start(&backend, &probe, d).await;
    wait_until("stalled on 6", || *stalled.lock().unwrap()).await;
    wait_until("progress saved through 5", || {
        backend
            .checkpoint_document("snap-crash")
            .is_some_and(|c| c.get("snapshotLastId") == Some(&Bson::Int32(5)))
    })
    .await;
    let cp = backend.checkpoint_document("snap-crash").unwrap();
    assert_eq!(cp.get_i64("snapshotScanned").unwrap(), 5, "{cp}");
    assert!(cp.contains_key("snapshotStartToken"), "{cp}");
    assert!(!cp.contains_key("lastSeenToken"), "{cp}");
    rt.handle().crash().await;
    drop(rt);
    assert_eq!(log.scanned(), [1, 2, 3, 4, 5]);

    let log = Log::default();
    let probe = logging_probe(&log, |_| None);
    let rt = start(&backend, &probe, d).await;
    wait_until("rest scanned", || log.len() == 5).await;
    insert_ids(&backend, [11]);
    wait_until("11 streamed", || log.len() == 6).await;
    rt.shutdown().await;
    assert_eq!(log.scanned(), [6, 7, 8, 9, 10]);
    assert_eq!(log.streamed(), [11]);
}

#[tokio::test(start_paused = true)]
async fn a_graceful_stop_mid_scan_keeps_the_progress() {
    let backend = MemoryBackend::new();
    insert_ids(&backend, 1..=6);
    let log = Log::default();
    let probe = logging_probe(&log, |ctx| {
        (id_of(ctx) == Some(3)).then(|| Duration::from_secs(1))
    });
    // save_every_n = 100: nothing would be saved before the end of the scan but for the stop.
    let d = snapshot_def("snap-stop", |d| d.checkpoint.save_every_n = 100);
    let rt = start(&backend, &probe, d).await;
    wait_until("3 in flight", || {
        probe.calls().iter().any(|c| c.key == Some(Bson::Int32(3)))
    })
    .await;
    rt.shutdown().await;
    assert_eq!(log.scanned(), [1, 2, 3], "the in-flight read finished");
    let cp = backend.checkpoint_document("snap-stop").unwrap();
    assert_eq!(cp.get("snapshotLastId"), Some(&Bson::Int32(3)), "{cp}");

    let log = Log::default();
    let probe = logging_probe(&log, |_| None);
    let rt = start(&backend, &probe, d).await;
    wait_until("rest scanned", || log.len() == 3).await;
    rt.shutdown().await;
    assert_eq!(log.scanned(), [4, 5, 6]);
}

#[tokio::test(start_paused = true)]
async fn history_lost_during_the_scan_halts_whatever_on_history_lost_says() {
    let backend = MemoryBackend::with_retention(20);
    insert_ids(&backend, 1..=4);
    let log = Log::default();
    let probe = {
        let backend = backend.clone();
        let log = log.clone();
        Probe::new(move |ctx| {
            let backend = backend.clone();
            let log = log.clone();
            async move {
                if ctx.is_snapshot() && id_of(&ctx) == Some(2) {
                    // A busy collection elsewhere pushes the recorded start out of history.
                    let busy = backend.collection("busy");
                    for i in 0..50 {
                        busy.insert_one(doc! {"_id": i}).unwrap();
                    }
                }
                log.push(&ctx);
                Ok(())
            }
            .boxed()
        })
    };
    let d = snapshot_def("snap-lost", |d| {
        d.checkpoint.on_history_lost = OnHistoryLost::ResumeFromNow;
        d.checkpoint.save_every_n = 1;
    });
    let rt = start(&backend, &probe, d).await;
    let st = wait_status(&rt, "snap-lost", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    let halt = st.halt.expect("halted");
    assert_eq!(halt.reason, HaltReason::HistoryLost);
    assert_eq!(halt.runbook, "docs/runbooks/history-lost.md");
    assert!(
        halt.message.contains("snap-lost") && halt.message.contains("initial snapshot"),
        "{}",
        halt.message
    );
    assert_eq!(st.state, StreamState::HistoryLost);
    let cp = backend.checkpoint_document("snap-lost").unwrap();
    assert!(cp.contains_key("snapshotLastId"), "progress kept: {cp}");
    assert!(
        !cp.contains_key("lastSeenToken"),
        "never switched to now: {cp}"
    );
    assert!(log.streamed().is_empty(), "{:?}", log.all());
}

#[tokio::test(start_paused = true)]
async fn a_completed_snapshot_is_not_repeated_and_an_existing_stream_does_not_scan() {
    let backend = MemoryBackend::new();
    insert_ids(&backend, 1..=3);
    let log = Log::default();
    let d = snapshot_def("snap-once", |_| {});
    let rt = start(&backend, &logging_probe(&log, |_| None), d).await;
    wait_until("scanned", || log.len() == 3).await;
    wait_until("snapshot completed", || {
        backend
            .checkpoint_document("snap-once")
            .is_some_and(|c| !c.contains_key("snapshotStartToken"))
    })
    .await;
    rt.shutdown().await;

    let log = Log::default();
    let rt = start(&backend, &logging_probe(&log, |_| None), d).await;
    insert_ids(&backend, [4]);
    wait_until("4 streamed", || log.len() == 1).await;
    rt.shutdown().await;
    assert_eq!(log.streamed(), [4]);
    assert!(log.scanned().is_empty());

    // A stream that already streamed (from Latest) and is switched to Snapshot keeps its
    // position: the snapshot is only for a stream without a checkpoint.
    let latest = def("snap-switch", |_| {});
    let log = Log::default();
    let rt = start(&backend, &logging_probe(&log, |_| None), latest).await;
    insert_ids(&backend, [5]);
    wait_until("5 streamed", || log.len() == 1).await;
    rt.shutdown().await;
    let switched = snapshot_def("snap-switch", |_| {});
    let log = Log::default();
    let rt = start(&backend, &logging_probe(&log, |_| None), switched).await;
    insert_ids(&backend, [6]);
    wait_until("6 streamed", || log.len() == 1).await;
    rt.shutdown().await;
    assert_eq!(log.all(), [("insert".to_string(), Bson::Int32(6), false)]);
}

/// Found by the fault simulation (invariant 14, seed 134 shrunk to one insert): on an in-memory
/// backend whose oplog was still empty when the snapshot recorded its start (position 0, whose
/// time is the backend's creation), the history check before a scan batch compared that start
/// with the oldest retained entry's write time (or "now", with no entry), found it older, and
/// halted `HistoryLost` although nothing had been dropped. Here the backend exists for a while
/// before the stream starts, and a document is inserted while the start is being stored (a
/// slow checkpoint write), so the scan reads it and checks the history again after it.
#[tokio::test(start_paused = true)]
async fn a_snapshot_that_starts_on_an_empty_oplog_is_not_halted_for_lost_history() {
    let backend = MemoryBackend::new();
    tokio::time::sleep(Duration::from_secs(10)).await;
    backend
        .faults()
        .set_checkpoint_save_delay(Some(Duration::from_secs(1)));
    let writer = {
        let backend = backend.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            insert_ids(&backend, [1]);
            backend.faults().set_checkpoint_save_delay(None);
        })
    };
    let log = Log::default();
    let probe = logging_probe(&log, |_| Some(Duration::from_secs(1)));
    let d = snapshot_def("snap-empty", |_| {});
    let rt = start_with(&backend, &probe, d, |b| b.batch_size(1)).await;
    writer.await.unwrap();
    let halted = || {
        rt.handle()
            .status("snap-empty")
            .is_some_and(|s| s.halt.is_some())
    };
    wait_until("1 scanned and streamed, or a halt", || {
        log.len() == 2 || halted()
    })
    .await;
    insert_ids(&backend, [2]);
    wait_until("2 streamed, or a halt", || log.len() == 3 || halted()).await;
    let st = rt.handle().status("snap-empty").unwrap();
    rt.shutdown().await;
    assert!(st.halt.is_none(), "{:?}", st.halt);
    assert_eq!(st.state, StreamState::Running);
    // 1 was inserted after the recorded start: read by the scan, then delivered by the stream
    // (a duplicate, never a gap); 2 after the scan.
    assert_eq!(log.scanned(), [1]);
    assert_eq!(log.streamed(), [1, 2]);
}
