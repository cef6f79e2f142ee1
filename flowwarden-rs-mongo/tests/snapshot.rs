//! The initial snapshot (`start_position = Snapshot`) through the real `mongodb` driver: on the
//! wire-level emulator always, and on a live replica set when `FLOWWARDEN_TEST_MONGODB_URI` is
//! set. The scan's `find` batches, writes made during the scan, a crash mid-scan, mixed `_id`
//! types, the pipeline carried over to the scan, and history lost during the scan.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bson::{doc, oid::ObjectId, Bson, Document};
use flowwarden::{
    change_stream, checkpoint, AnyStream, ChangeContext, FullDocument, HaltReason, HandlerError,
    StartPosition, StreamDefinition, StreamState,
};
use futures::{FutureExt, TryStreamExt};
use support::*;
use tokio::sync::Notify;

/// What a handler saw: (operation type, `_id`, whether it was a snapshot read).
type Seen = (String, Bson, bool);

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

    fn ids(&self, snapshot: bool) -> Vec<i32> {
        self.all()
            .into_iter()
            .filter(|(_, _, s)| *s == snapshot)
            .filter_map(|(_, id, _)| id.as_i32())
            .collect()
    }
}

fn logging(log: &Log) -> Probe {
    let log = log.clone();
    Probe::new(move |ctx| {
        let log = log.clone();
        async move {
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

async fn checkpoint_doc(t: &Target, stream: &str) -> Option<Document> {
    t.coll("_fw_checkpoints")
        .find_one(doc! {"_id": stream})
        .await
        .expect("read checkpoint")
}

/// Waits until the stored checkpoint of `stream` satisfies `pred`.
async fn wait_checkpoint(t: &Target, stream: &str, what: &str, pred: impl Fn(&Document) -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if checkpoint_doc(t, stream).await.is_some_and(|d| pred(&d)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the checkpoint of {stream}: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn completed(d: &Document) -> bool {
    !d.contains_key("snapshotStartToken")
}

scenario!(writes_during_the_scan_end_with_the_projection_equal_to_the_collection);
async fn writes_during_the_scan_end_with_the_projection_equal_to_the_collection(t: &Target) {
    t.insert_ids(1..=10).await;
    let projection: Arc<Mutex<BTreeMap<i32, Document>>> = Arc::default();
    let log = Log::default();
    let probe = {
        let (projection, log, orders) = (projection.clone(), log.clone(), t.coll("orders"));
        Probe::new(move |ctx| {
            let (projection, log, c) = (projection.clone(), log.clone(), orders.clone());
            async move {
                let id = id_of(&ctx);
                if ctx.is_snapshot() && id == Some(5) {
                    // Already scanned: 2, 3, 4; not yet: 7, 8, 9; inserts on both sides.
                    let w = "a write during the scan";
                    c.update_one(doc! {"_id": 2}, doc! {"$set": {"n": 200}})
                        .await
                        .expect(w);
                    c.update_one(doc! {"_id": 8}, doc! {"$set": {"n": 800}})
                        .await
                        .expect(w);
                    c.delete_one(doc! {"_id": 3}).await.expect(w);
                    c.delete_one(doc! {"_id": 9}).await.expect(w);
                    c.insert_one(doc! {"_id": 0, "n": 0}).await.expect(w);
                    c.insert_one(doc! {"_id": 11, "n": 11}).await.expect(w);
                    c.replace_one(doc! {"_id": 4}, doc! {"_id": 4, "replaced": true})
                        .await
                        .expect(w);
                    c.update_one(doc! {"_id": 7}, doc! {"$set": {"n": 700}})
                        .await
                        .expect(w);
                    c.delete_one(doc! {"_id": 7}).await.expect(w);
                }
                let key = id.ok_or_else(|| HandlerError::msg("no integer _id"))?;
                {
                    let mut p = projection.lock().unwrap();
                    if ctx.operation_type().as_str() == "delete" {
                        p.remove(&key);
                    } else if let Some(full) = ctx.document() {
                        p.insert(key, full.clone());
                    }
                }
                log.push(&ctx);
                Ok(())
            }
            .boxed()
        })
    };
    let d = snapshot_def("snap-writes", |d| {
        d.full_document = FullDocument::UpdateLookup
    });
    let rt = start_any_with(t, AnyStream::with_definition(probe, d), |b| b.batch_size(3)).await;
    wait_until("scan reached 5", || log.ids(true).contains(&5)).await;
    t.coll("orders")
        .insert_one(doc! {"_id": 99, "n": 99})
        .await
        .expect("sentinel");
    wait_until("sentinel handled", || log.ids(false).contains(&99)).await;
    rt.shutdown().await;
    let expected: BTreeMap<i32, Document> = t
        .coll("orders")
        .find(doc! {})
        .await
        .expect("find")
        .try_collect::<Vec<_>>()
        .await
        .expect("read")
        .into_iter()
        .map(|d| (d.get_i32("_id").expect("int _id"), d))
        .collect();
    assert_eq!(*projection.lock().unwrap(), expected);
    let scanned = log.ids(true);
    assert!(
        !scanned.contains(&7) && !scanned.contains(&9),
        "{scanned:?}"
    );
    assert!(scanned.contains(&11), "{scanned:?}");
}

scenario!(a_crash_mid_scan_resumes_the_scan);
async fn a_crash_mid_scan_resumes_the_scan(t: &Target) {
    t.insert_ids(1..=10).await;
    let gate = Arc::new(Notify::new());
    let stalled = Arc::new(Mutex::new(false));
    let log = Log::default();
    let probe = {
        let (log, gate, stalled) = (log.clone(), gate.clone(), stalled.clone());
        Probe::new(move |ctx| {
            let (log, gate, stalled) = (log.clone(), gate.clone(), stalled.clone());
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
    let rt = start(t, &probe, d).await;
    wait_until("stalled on 6", || *stalled.lock().unwrap()).await;
    wait_checkpoint(t, "snap-crash", "progress through 5", |c| {
        c.get("snapshotLastId") == Some(&Bson::Int32(5))
    })
    .await;
    rt.handle().crash().await;
    drop(rt);
    assert_eq!(log.ids(true), [1, 2, 3, 4, 5]);

    let log = Log::default();
    let rt = start(t, &logging(&log), d).await;
    wait_until("rest scanned", || log.len() == 5).await;
    wait_checkpoint(t, "snap-crash", "snapshot completed", completed).await;
    t.insert_ids([11]).await;
    wait_until("11 streamed", || log.len() == 6).await;
    rt.shutdown().await;
    assert_eq!(log.ids(true), [6, 7, 8, 9, 10]);
    assert_eq!(log.ids(false), [11]);
}

scenario!(ids_of_mixed_types_are_all_scanned_in_order);
async fn ids_of_mixed_types_are_all_scanned_in_order(t: &Target) {
    let oid = ObjectId::new();
    let c = t.coll("orders");
    for id in [
        Bson::String("b".into()),
        Bson::ObjectId(oid),
        Bson::Int64(10),
        Bson::Document(doc! {"k": 1}),
        Bson::Double(1.5),
        Bson::String("a".into()),
        Bson::Int32(2),
    ] {
        c.insert_one(doc! {"_id": id}).await.expect("insert");
    }
    let log = Log::default();
    let d = snapshot_def("snap-mixed", |_| {});
    // One document per `find`: each batch starts after an `_id` of another type.
    let rt = start_any_with(t, AnyStream::with_definition(logging(&log), d), |b| {
        b.batch_size(1)
    })
    .await;
    wait_until("7 scanned", || log.len() == 7).await;
    wait_checkpoint(t, "snap-mixed", "snapshot completed", completed).await;
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

/// Paid payments, declared with the macros: the pipeline's condition is carried over to the
/// scan's `find`.
#[derive(Clone, Default)]
struct PaidPayments {
    handled: Arc<Mutex<Vec<(i32, bool)>>>,
}

#[change_stream(name = "paid-payments", collection = "payments")]
#[checkpoint(start_position = Snapshot)]
impl PaidPayments {
    #[pipeline]
    fn pipeline() -> Vec<Document> {
        vec![doc! {"$match": {"fullDocument.status": "PAID"}}]
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

scenario!(the_pipeline_is_applied_to_the_scan);
async fn the_pipeline_is_applied_to_the_scan(t: &Target) {
    let c = t.coll("payments");
    for (id, status) in [
        (1, "PAID"),
        (2, "OPEN"),
        (3, "PAID"),
        (4, "OPEN"),
        (5, "PAID"),
    ] {
        c.insert_one(doc! {"_id": id, "status": status})
            .await
            .expect("insert");
    }
    let stream = PaidPayments::default();
    // Two per batch: the second and third `find` combine the condition and the `_id` bound.
    let rt = start_any_with(t, AnyStream::new(stream.clone()), |b| b.batch_size(2)).await;
    let handled = || stream.handled.lock().unwrap().clone();
    wait_until("scan done", || handled().len() == 3).await;
    wait_checkpoint(t, "paid-payments", "snapshot completed", completed).await;
    c.insert_one(doc! {"_id": 6, "status": "PAID"})
        .await
        .expect("insert");
    wait_until("6 streamed", || handled().len() == 4).await;
    let st = rt.handle().status("paid-payments").expect("status");
    rt.shutdown().await;
    assert_eq!(handled(), [(1, true), (3, true), (5, true), (6, false)]);
    assert_eq!(st.counters.received, 4, "the OPEN ones were never read");
}

scenario!(history_lost_during_the_scan_halts, emulator_only: "needs the emulator's oplog truncation");
async fn history_lost_during_the_scan_halts(t: &Target) {
    t.insert_ids(1..=4).await;
    let log = Log::default();
    let (reached, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let probe = {
        let (log, reached, gate) = (log.clone(), reached.clone(), gate.clone());
        Probe::new(move |ctx| {
            let (log, reached, gate) = (log.clone(), reached.clone(), gate.clone());
            async move {
                if ctx.is_snapshot() && id_of(&ctx) == Some(2) {
                    reached.notify_one();
                    gate.notified().await;
                }
                log.push(&ctx);
                Ok(())
            }
            .boxed()
        })
    };
    let d = snapshot_def("snap-lost", |d| d.checkpoint.save_every_n = 1);
    let rt = start(t, &probe, d).await;
    reached.notified().await;
    // Writes elsewhere while the scan is at 2, then the oplog keeps only the newest two: the
    // recorded start is no longer retained.
    t.coll("busy")
        .insert_many((0..5).map(|i| doc! {"_id": i}))
        .await
        .expect("insert");
    t.emu().keep_last_oplog_entries(2);
    gate.notify_one();
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
    let cp = checkpoint_doc(t, "snap-lost").await.expect("checkpoint");
    assert!(cp.contains_key("snapshotLastId"), "progress kept: {cp}");
    assert!(
        !cp.contains_key("lastSeenToken"),
        "never switched to now: {cp}"
    );
    assert!(log.ids(false).is_empty(), "{:?}", log.all());
}
