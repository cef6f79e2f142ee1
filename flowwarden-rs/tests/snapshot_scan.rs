//! The initial snapshot's scan on the in-memory backend: `_id`s of mixed types in MongoDB's
//! order, scan failures, a failing read dead-lettered, and a stream declared with the macros
//! (its pipeline carried over to the scan, its filter applied).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use flowwarden::port::SourceErrorKind;
use flowwarden::{
    change_stream, checkpoint, ChangeContext, HaltReason, HandlerError, MemoryBackend,
};
use futures::FutureExt;
use support::snapshot::{id_of, logging_probe, snapshot_def, Log};
use support::{insert_ids, start, start_with, wait_status, wait_until, Probe};

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
