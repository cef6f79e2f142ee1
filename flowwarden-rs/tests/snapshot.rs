//! The initial snapshot (`start_position = Snapshot`) on the in-memory backend: the scan in
//! `_id` order, writes made during the scan, a crash and a stop mid-scan, history lost during
//! the scan, scan failures, and a stream declared with the macros.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use flowwarden::port::SourceErrorKind;
use flowwarden::{
    change_stream, checkpoint, ChangeContext, FullDocument, HaltReason, HandlerError,
    MemoryBackend, OnHistoryLost, StartPosition, StreamDefinition, StreamState,
};
use futures::FutureExt;
use support::{def, insert_ids, start, start_with, wait_status, wait_until, Probe};

/// What a handler saw: (operation type, `_id`, whether it was a snapshot read).
type Seen = (String, Bson, bool);

/// A shared record of what the handler saw, in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Seen>>>);

impl Log {
    fn push(&self, ctx: &ChangeContext<Document>) {
        let id = ctx
            .document_key()
            .and_then(|k| k.get("_id").cloned())
            .unwrap_or(Bson::Null);
        self.0
            .lock()
            .unwrap()
            .push((ctx.operation_type().to_string(), id, ctx.is_snapshot()));
    }

    fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The `_id`s (as i32) of the snapshot reads, in order.
    fn scanned(&self) -> Vec<i32> {
        self.all()
            .into_iter()
            .filter(|(_, _, snap)| *snap)
            .filter_map(|(_, id, _)| id.as_i32())
            .collect()
    }

    /// The `_id`s (as i32) of the changes the stream delivered, in order.
    fn streamed(&self) -> Vec<i32> {
        self.all()
            .into_iter()
            .filter(|(_, _, snap)| !*snap)
            .filter_map(|(_, id, _)| id.as_i32())
            .collect()
    }
}

/// A probe that records every successful call in `log`, after `before` ran.
fn logging_probe(
    log: &Log,
    before: impl Fn(&ChangeContext<Document>) -> Option<Duration> + Send + Sync + 'static,
) -> Probe {
    let log = log.clone();
    let before = Arc::new(before);
    Probe::new(move |ctx| {
        let log = log.clone();
        let before = before.clone();
        async move {
            if let Some(pause) = before(&ctx) {
                tokio::time::sleep(pause).await;
            }
            log.push(&ctx);
            Ok(())
        }
        .boxed()
    })
}

fn snapshot_def(
    name: &'static str,
    f: impl FnOnce(&mut StreamDefinition),
) -> &'static StreamDefinition {
    def(name, |d| {
        d.checkpoint.start_position = StartPosition::Snapshot;
        f(d);
    })
}

fn id_of(ctx: &ChangeContext<Document>) -> Option<i32> {
    ctx.document_key()
        .and_then(|k| k.get("_id"))
        .and_then(Bson::as_i32)
}

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

#[tokio::test(start_paused = true)]
async fn ids_of_mixed_types_are_scanned_in_mongodb_order_without_a_gap() {
    let backend = MemoryBackend::new();
    let oid = ObjectId::new();
    let c = backend.collection("orders");
    for id in [
        Bson::String("b".into()),
        Bson::ObjectId(oid),
        Bson::Int64(10),
        Bson::Document(doc! {"k": 1}),
        Bson::Double(1.5),
        Bson::String("a".into()),
        Bson::Int32(2),
    ] {
        c.insert_one(doc! {"_id": id}).unwrap();
    }
    let log = Log::default();
    let d = snapshot_def("snap-mixed", |_| {});
    // One document per batch: every batch boundary crosses or stays in a type bracket.
    let rt = start_with(&backend, &logging_probe(&log, |_| None), d, |b| {
        b.batch_size(1)
    })
    .await;
    wait_until("7 scanned", || log.len() == 7).await;
    rt.shutdown().await;
    let ids: Vec<Bson> = log.all().into_iter().map(|(_, id, _)| id).collect();
    assert_eq!(
        ids,
        [
            Bson::Double(1.5),
            Bson::Int32(2),
            Bson::Int64(10),
            Bson::String("a".into()),
            Bson::String("b".into()),
            Bson::Document(doc! {"k": 1}),
            Bson::ObjectId(oid),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_transient_scan_failure_is_retried_and_a_fatal_one_halts() {
    let backend = MemoryBackend::new();
    insert_ids(&backend, 1..=4);
    backend
        .faults()
        .fail_next_scans(2, SourceErrorKind::Resumable, "connection reset");
    let log = Log::default();
    let d = snapshot_def("snap-flaky", |d| d.restart.max_attempts = 5);
    let rt = start_with(&backend, &logging_probe(&log, |_| None), d, |b| {
        b.batch_size(2)
    })
    .await;
    wait_until("4 scanned", || log.len() == 4).await;
    rt.shutdown().await;
    assert_eq!(log.scanned(), [1, 2, 3, 4], "each document once");

    let backend = MemoryBackend::new();
    insert_ids(&backend, 1..=4);
    backend
        .faults()
        .fail_next_scans(1, SourceErrorKind::Fatal, "not authorized to find");
    let log = Log::default();
    let d = snapshot_def("snap-denied", |_| {});
    let rt = start(&backend, &logging_probe(&log, |_| None), d).await;
    let st = wait_status(&rt, "snap-denied", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    let halt = st.halt.unwrap();
    assert_eq!(halt.reason, HaltReason::SourceFatal);
    assert_eq!(halt.runbook, "docs/runbooks/source-fatal.md");
    assert!(
        halt.message.contains("snap-denied") && halt.message.contains("not authorized"),
        "{}",
        halt.message
    );
    assert!(log.all().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_failing_snapshot_read_is_retried_then_dead_lettered_and_the_scan_goes_on() {
    let backend = MemoryBackend::new();
    insert_ids(&backend, 1..=3);
    let log = Log::default();
    let probe = {
        let log = log.clone();
        Probe::new(move |ctx| {
            let log = log.clone();
            async move {
                if id_of(&ctx) == Some(2) {
                    return Err(HandlerError::msg("projection store refused"));
                }
                log.push(&ctx);
                Ok(())
            }
            .boxed()
        })
    };
    let d = snapshot_def("snap-poison", |_| {});
    let rt = start(&backend, &probe, d).await;
    wait_until("1 and 3 scanned", || log.len() == 2).await;
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    let st = rt.handle().status("snap-poison").unwrap();
    rt.shutdown().await;
    assert_eq!(log.scanned(), [1, 3]);
    assert_eq!(
        probe
            .calls()
            .iter()
            .filter(|c| c.key == Some(Bson::Int32(2)))
            .count(),
        3
    );
    assert_eq!(st.counters.dead_lettered, 1);
    assert_eq!(dead.len(), 1);
    let r = &dead[0];
    assert_eq!(r.stream, "snap-poison");
    assert_eq!(r.error_chain, ["projection store refused"]);
    assert_eq!(r.event.get_bool("snapshot"), Ok(true), "{}", r.event);
    assert_eq!(
        r.event.get_document("fullDocument").unwrap(),
        &doc! {"_id": 2, "n": 2}
    );
}

/// A projection of paid payments of at least 10, declared with the macros.
#[derive(Clone, Default)]
struct Paid {
    handled: Arc<Mutex<Vec<(i32, bool)>>>,
}

#[change_stream(collection = "payments")]
#[checkpoint(start_position = Snapshot)]
impl Paid {
    #[pipeline]
    fn pipeline() -> Vec<Document> {
        vec![doc! {"$match": {"fullDocument.status": "PAID"}}]
    }

    #[filter]
    fn big_enough(&self, ctx: &ChangeContext<Document>) -> bool {
        ctx.document()
            .and_then(|d| d.get_i32("amount").ok())
            .is_some_and(|a| a >= 10)
    }

    #[on_insert]
    async fn paid(&self, ctx: &ChangeContext<Document>) -> Result<(), HandlerError> {
        let id = ctx
            .document_key()
            .and_then(|k| k.get_i32("_id").ok())
            .ok_or_else(|| HandlerError::msg("no integer _id"))?;
        self.handled.lock().unwrap().push((id, ctx.is_snapshot()));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_macro_stream_scans_with_its_pipeline_and_filter_then_streams() {
    let backend = MemoryBackend::new();
    let c = backend.collection("payments");
    c.insert_one(doc! {"_id": 1, "status": "PAID", "amount": 50})
        .unwrap();
    c.insert_one(doc! {"_id": 2, "status": "OPEN", "amount": 50})
        .unwrap();
    c.insert_one(doc! {"_id": 3, "status": "PAID", "amount": 5})
        .unwrap();
    c.insert_one(doc! {"_id": 4, "status": "PAID", "amount": 20})
        .unwrap();
    let stream = Paid::default();
    let rt = flowwarden::builder()
        .discover(false)
        .stream(stream.clone())
        .backend(backend.clone())
        .max_await(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let handled = || stream.handled.lock().unwrap().clone();
    wait_until("scan done", || handled().len() == 2).await;
    wait_until("snapshot completed", || {
        backend
            .checkpoint_document("paid")
            .is_some_and(|c| !c.contains_key("snapshotStartToken"))
    })
    .await;
    c.insert_one(doc! {"_id": 5, "status": "PAID", "amount": 30})
        .unwrap();
    wait_until("5 streamed", || handled().len() == 3).await;
    let st = rt.handle().status("paid").unwrap();
    rt.shutdown().await;
    assert_eq!(handled(), [(1, true), (4, true), (5, false)]);
    // 2 is left out by the scan's query (the pipeline carried over); 3 by the filter.
    assert_eq!(st.counters.received, 4);
    assert_eq!(st.counters.filtered, 1);
}
