//! `MongoApplied` (feature `dedup`) through the real driver on the emulator: a redelivered event
//! is applied once across a crash, records expire, and `_fw_applied` has its TTL index.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Document};
use flowwarden::dedup::{AppliedStore, Idempotency};
use flowwarden_rs_mongo::{MongoApplied, APPLIED, APPLIED_TTL_INDEX};
use futures::TryStreamExt;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_event_is_applied_once_across_a_crash() {
    let t = Target::emulator().await;
    let d = def("mongo-deduped", |d| {
        d.checkpoint.save_every_n = 1_000;
        d.checkpoint.save_interval_secs = 0;
    });
    let dedup = Idempotency::new(MongoApplied::new(&t.backend), Duration::from_secs(3_600));
    let effects = Arc::new(Mutex::new(Vec::new()));
    let probe = flowwarden_testkit::applying_once(&dedup, &effects);
    let rt = start(&t, &probe, d).await;
    t.insert_ids([1, 2]).await;
    wait_until("2 handled", || probe.successes().len() == 2).await;
    rt.handle().crash().await;

    // A new process: a new Idempotency over the same collection.
    let dedup = Idempotency::new(MongoApplied::new(&t.backend), Duration::from_secs(3_600));
    let again = flowwarden_testkit::applying_once(&dedup, &effects);
    let rt = start(&t, &again, d).await;
    wait_until("2 redelivered and settled", || again.successes().len() == 2).await;
    rt.shutdown().await;
    assert_eq!(
        *effects.lock().unwrap(),
        ids(&[1, 2]),
        "each effect applied once"
    );

    let indexes: Vec<Document> = t
        .backend
        .client()
        .database(t.backend.database())
        .collection::<Document>(APPLIED)
        .list_indexes()
        .await
        .expect("indexes")
        .try_collect::<Vec<_>>()
        .await
        .expect("listed")
        .into_iter()
        .map(|m| bson::to_document(&m).expect("index model"))
        .collect();
    let ttl = indexes
        .iter()
        .find(|i| i.get_str("name").ok() == Some(APPLIED_TTL_INDEX))
        .unwrap_or_else(|| panic!("no TTL index among {indexes:?}"));
    assert_eq!(
        ttl.get_document("key").ok(),
        Some(&doc! {"expiresAt": 1}),
        "{ttl}"
    );
    assert_eq!(ttl.get_i32("expireAfterSeconds").ok(), Some(0), "{ttl}");
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_record_no_longer_skips() {
    let t = Target::emulator().await;
    let store = MongoApplied::new(&t.backend);
    assert!(!store.contains("s:1").await.expect("reads"));
    store
        .record("s:1", Duration::from_millis(50))
        .await
        .expect("writes");
    store
        .record("s:2", Duration::from_secs(3_600))
        .await
        .expect("writes");
    assert!(store.contains("s:1").await.expect("reads"));
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(!store.contains("s:1").await.expect("reads"), "expired");
    assert!(
        store.contains("s:2").await.expect("reads"),
        "still recorded"
    );
    t.finish().await;
}
